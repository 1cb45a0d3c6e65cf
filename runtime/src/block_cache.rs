//! The output block cache: large freed output blocks, kept for the next call's outputs of the
//! same size (a caching allocator, in small, like PyTorch's). A fresh allocation of tens of MiB
//! costs a page fault per 4 KiB on first write, which for a bandwidth-bound kernel is as much
//! time again as the kernel.
//!
//! Only blocks made by `Storage::for_overwrite` (whose every byte the next owner overwrites) of
//! at least [`CACHE_MIN_BYTES`] enter the cache, up to a total of [`block_cache_limit`] bytes
//! (1 GiB unless [`set_block_cache_limit`] says otherwise); beyond it, dropped blocks are freed.
//! Reuse is exact-size. [`release_cached_blocks`] frees everything the cache holds.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Blocks at least this large are cached when dropped.
pub const CACHE_MIN_BYTES: usize = 1 << 20;

static LIMIT: AtomicUsize = AtomicUsize::new(1 << 30);

struct BlockCache {
    /// `(bytes, block)` of every cached block; each was allocated with `BUFFER_ALIGN`.
    blocks: Vec<(usize, NonNull<u8>)>,
    /// Sum of the cached blocks' sizes, never above the limit.
    bytes: usize,
}

// SAFETY: the cache owns plain heap blocks no one else references.
unsafe impl Send for BlockCache {}

static CACHE: Mutex<BlockCache> = Mutex::new(BlockCache {
    blocks: Vec::new(),
    bytes: 0,
});

fn lock() -> std::sync::MutexGuard<'static, BlockCache> {
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Frees `block` of `bytes` bytes.
///
/// # Safety
/// `block` was allocated by `pages::allocate_zeroed(bytes)`, and no one uses it any more.
unsafe fn free(bytes: usize, block: NonNull<u8>) {
    // SAFETY: the caller's contract.
    unsafe { crate::pages::deallocate(block, bytes) }
}

/// The most bytes the cache holds.
pub fn block_cache_limit() -> usize {
    LIMIT.load(Ordering::Relaxed)
}

/// Sets the most bytes the cache holds (0 disables it), freeing blocks beyond it.
pub fn set_block_cache_limit(bytes: usize) {
    LIMIT.store(bytes, Ordering::Relaxed);
    let mut cache = lock();
    while cache.bytes > bytes {
        let Some((b, block)) = cache.blocks.pop() else {
            break;
        };
        cache.bytes -= b;
        // SAFETY: cached blocks are owned by the cache alone and were allocated with `b` bytes.
        unsafe { free(b, block) };
    }
}

/// Frees every block the cache holds.
pub fn release_cached_blocks() {
    let mut cache = lock();
    for (bytes, block) in cache.blocks.drain(..) {
        // SAFETY: cached blocks are owned by the cache alone and were allocated with `bytes`.
        unsafe { free(bytes, block) };
    }
    cache.bytes = 0;
}

/// A cached block of exactly `bytes` bytes, taken out of the cache.
pub(crate) fn take(bytes: usize) -> Option<NonNull<u8>> {
    let mut cache = lock();
    let i = cache.blocks.iter().position(|&(b, _)| b == bytes)?;
    let (_, block) = cache.blocks.swap_remove(i);
    cache.bytes -= bytes;
    Some(block)
}

/// Keeps `block` for a later `take`, or gives it back when the cache is full.
pub(crate) fn give(bytes: usize, block: NonNull<u8>) -> Option<NonNull<u8>> {
    let mut cache = lock();
    if cache.bytes + bytes > block_cache_limit() {
        return Some(block);
    }
    cache.blocks.push((bytes, block));
    cache.bytes += bytes;
    None
}
