//! Where tensor storage comes from: small buffers from the global allocator, large ones (at
//! least [`HUGE_MIN_BYTES`]) on Linux from their own anonymous mapping, aligned to 2 MiB and
//! marked `MADV_HUGEPAGE`, so that the kernel may back them with transparent huge pages.
//!
//! Why: a compiled step sweeping a buffer of tens of MiB touches a new 4 KiB page every 64
//! cache lines, and the second-level TLB of a core covers about 12 MiB of 4 KiB pages (3072
//! entries on Zen 4), so the sweeps of large activations and weights walk page tables. With
//! `THP=madvise` (the common distribution default, and this development machine's) only
//! regions that ask get huge pages; glibc's `malloc` does not ask. Measured on the development
//! machine (Zen 4) over the whole suite, `minductor bench --threads 1,2 --rounds 3`, two runs
//! with `MINDUCTOR_HUGE_PAGES=0` alternated with two without (2026-11-27):
//! `pointwise_gelu_16m` (64 MiB in, 64 out) 9.38-9.61 → 7.50-7.73 ms at 1 thread and
//! 6.32-6.83 → 5.75-6.03 at 2, `layernorm_4096x1024` 1.20-1.21 → 1.06-1.09 and 0.72-0.74 →
//! 0.61-0.64, every other workload within 3% either way. PyTorch's CPU allocator has the same
//! switch, off by default (`THP_MEM_ALLOC_ENABLE`); here it is on, and
//! `MINDUCTOR_HUGE_PAGES=0` turns it off.
//!
//! Memory: the mapping is the buffer's size rounded up to 4 KiB (the slack taken to align it is
//! unmapped again), and the kernel falls back to 4 KiB pages wherever it has no huge page, so a
//! buffer costs what it did. A fresh mapping reads as zeros, as `alloc_zeroed` gives.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::tensor::BUFFER_ALIGN;

/// Buffers at least this large get a mapping of their own (two huge pages: below that the
/// unaligned tail would be most of the buffer).
pub const HUGE_MIN_BYTES: usize = 4 << 20;

/// Whether buffers of `bytes` bytes get a mapping of their own (see the module documentation).
fn mapped(bytes: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        bytes >= HUGE_MIN_BYTES
            && *ON.get_or_init(|| !std::env::var("MINDUCTOR_HUGE_PAGES").is_ok_and(|v| v == "0"))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = bytes;
        false
    }
}

/// `bytes` (> 0) zero bytes aligned to at least [`BUFFER_ALIGN`], or `None` when there is no
/// memory for them or `bytes` is too large for any allocation. Freed by [`deallocate`] with
/// the same `bytes`.
pub(crate) fn allocate_zeroed(bytes: usize) -> Option<NonNull<u8>> {
    debug_assert!(bytes > 0);
    if mapped(bytes) {
        #[cfg(target_os = "linux")]
        return map(bytes);
    }
    let layout = Layout::from_size_align(bytes, BUFFER_ALIGN).ok()?;
    // SAFETY: the layout has a non-zero size.
    NonNull::new(unsafe { alloc_zeroed(layout) })
}

/// Frees a block [`allocate_zeroed`] returned for `bytes`.
///
/// # Safety
/// `block` came from `allocate_zeroed(bytes)`, and no one uses it any more.
pub(crate) unsafe fn deallocate(block: NonNull<u8>, bytes: usize) {
    if mapped(bytes) {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: the caller's contract: `block` starts a mapping `map(bytes)` made, of
            // `bytes` rounded up to the page.
            unsafe { libc::munmap(block.as_ptr().cast(), page_rounded(bytes)) };
            return;
        }
    }
    // SAFETY: the caller's contract: allocated above with this layout (which was valid then).
    unsafe {
        dealloc(
            block.as_ptr(),
            Layout::from_size_align_unchecked(bytes, BUFFER_ALIGN),
        )
    }
}

#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

/// `bytes` rounded up to the 4 KiB page (no overflow: `bytes` fit a `Layout`, so it is at most
/// `isize::MAX`).
#[cfg(target_os = "linux")]
fn page_rounded(bytes: usize) -> usize {
    bytes.next_multiple_of(4096)
}

/// A fresh anonymous mapping of `bytes` rounded up to the page, starting on a 2 MiB boundary,
/// marked `MADV_HUGEPAGE`.
#[cfg(target_os = "linux")]
fn map(bytes: usize) -> Option<NonNull<u8>> {
    if bytes > isize::MAX as usize - 2 * HUGE_PAGE {
        return None;
    }
    let len = page_rounded(bytes);
    let total = len + HUGE_PAGE;
    // SAFETY: a new private anonymous mapping; it aliases nothing.
    let start = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if start == libc::MAP_FAILED {
        return None;
    }
    let at = start as usize;
    let aligned = at.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (aligned - at, total - (aligned - at) - len);
    // SAFETY: both ranges are page-aligned parts of the mapping just made that the buffer
    // (`aligned..aligned + len`) does not use; unmapping them leaves the buffer mapped.
    unsafe {
        if head > 0 {
            libc::munmap(start, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
        // A hint: without huge pages (THP off, or none free) the buffer keeps 4 KiB pages.
        libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    NonNull::new(aligned as *mut u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small and large blocks are zero, aligned, writable to their last byte, and freed.
    #[test]
    fn blocks_are_zeroed_aligned_and_writable() {
        for bytes in [
            1,
            4096,
            HUGE_MIN_BYTES - 1,
            HUGE_MIN_BYTES,
            HUGE_MIN_BYTES + 12_345,
        ] {
            let block = allocate_zeroed(bytes).expect("memory for a test block");
            assert_eq!(block.as_ptr() as usize % BUFFER_ALIGN, 0);
            // SAFETY: the block holds `bytes` bytes and is ours alone until freed below.
            unsafe {
                let data = std::slice::from_raw_parts_mut(block.as_ptr(), bytes);
                assert!(data.iter().all(|&b| b == 0), "{bytes} bytes not zeroed");
                data[0] = 1;
                data[bytes - 1] = 2;
                deallocate(block, bytes);
            }
        }
        #[cfg(target_os = "linux")]
        if mapped(HUGE_MIN_BYTES) {
            let block = allocate_zeroed(HUGE_MIN_BYTES).expect("memory for a test block");
            assert_eq!(
                block.as_ptr() as usize % HUGE_PAGE,
                0,
                "a large block starts a huge page"
            );
            // SAFETY: as above.
            unsafe { deallocate(block, HUGE_MIN_BYTES) };
        }
    }

    /// A size no mapping can have is `None`, not a panic.
    #[test]
    fn an_impossible_size_is_none() {
        assert!(allocate_zeroed(isize::MAX as usize).is_none());
        assert!(allocate_zeroed(usize::MAX - 4095).is_none());
    }
}
