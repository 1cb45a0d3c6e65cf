//! Our own single-precision GEMM: `c = a · b` on strided views, with packed panels, cache
//! blocking and register-blocked micro-kernels written with `std::arch`.
//!
//! The structure is GotoBLAS/BLIS's:
//! - `b` (k × n) is packed once per call into panels of `nr` columns ([`PackedB`]), each panel
//!   holding all `k` rows, `nr` values per row, the last panel padded with zeros. One packing is
//!   shared by every row tile and thread of the call (the caller packs, then hands `&PackedB`
//!   to each thread).
//! - `a` is packed per block of at most `MC` rows and `KC` columns into micro-panels of `mr` rows, `mr`
//!   values per column, the last micro-panel padded with zeros. The block stays in L2.
//! - For each block, each panel of `b` (`KC × nr` values, streamed through L1 and reused by every
//!   micro-panel of the block) and each micro-panel of `a`, the micro-kernel computes an
//!   `mr × nr` tile of `c` in registers and writes (first `KC` block) or adds (later blocks) it.
//!
//! Micro-kernels ([`Kernel`]): AVX-512 (6 × 64: 24 zmm accumulators, 4 loads of `b` and 6
//! broadcasts of `a` per step of `k`), AVX2 + FMA (6 × 16: 12 ymm accumulators), and a portable
//! one (4 × 16 on plain arrays, which the compiler vectorizes for the baseline target). The best
//! one the CPU supports is detected once at run time; tests may force any supported one.
//!
//! Safety: the only unsafe code is in the packing routines and the micro-kernels, and it rests
//! on bounds checked once per call: [`MatrixRef::new`] proves every element of a view inside
//! its slice, [`MatrixMut::new`] proves the output rows inside theirs, and the packed buffers are
//! sized here from the same shapes the loops run over.

mod kernel_avx2;
mod kernel_avx512;
mod kernel_portable;
mod pack;
#[cfg(test)]
mod tests;

use std::sync::{Mutex, OnceLock};
use thiserror::Error;

/// Columns of `a` (rows of `b`) per packed block: the `b` micro-panel of one block
/// (`KC · nr` values, 64 KiB for the AVX-512 kernel) is reused from L1/L2 by every micro-panel
/// of `a`, and the `a` micro-panel (`KC · mr` values) stays in L1.
const KC: usize = 256;
/// Most rows of `a` per packed block: `MC · KC` values (264 KiB) stay in L2 (1 MiB per core
/// on Zen 5) while every panel of `b` passes by. The rows are split into blocks of equal size
/// (whole micro-panels), so no small last block streams all of `b` for little work.
const MC: usize = 264;

#[derive(Debug, Error, PartialEq)]
pub enum GemmError {
    #[error("gemm: the {what} view reaches outside its buffer (elements {low}..={high} of {len})")]
    OutOfBounds {
        what: &'static str,
        low: i64,
        high: i64,
        len: usize,
    },
    #[error("gemm: shapes do not match: a is {a:?}, b is {b:?}, c is {c:?}")]
    Shape {
        a: [usize; 2],
        b: [usize; 2],
        c: [usize; 2],
    },
    #[error("gemm: the {0:?} kernel needs CPU features this machine lacks")]
    Unsupported(Kernel),
    #[error("gemm: b was packed for the {packed:?} kernel, not {wanted:?}")]
    KernelMismatch { packed: Kernel, wanted: Kernel },
}

/// A micro-kernel family. Each computes an `mr × nr` tile of `c` from packed panels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512F, 6 × 64.
    Avx512,
    /// AVX2 and FMA, 6 × 16.
    Avx2,
    /// Plain Rust, 4 × 16.
    Portable,
}

impl Kernel {
    /// Every kernel, widest first.
    pub const ALL: [Kernel; 3] = [Kernel::Avx512, Kernel::Avx2, Kernel::Portable];

    /// The widest kernel this CPU supports, detected on the first call.
    pub fn detect() -> Kernel {
        static DETECTED: OnceLock<Kernel> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            Kernel::ALL
                .into_iter()
                .find(|k| k.is_supported())
                .unwrap_or(Kernel::Portable)
        })
    }

    /// Whether this CPU has the features the kernel is compiled for.
    pub fn is_supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 | Kernel::Avx2 => false,
            Kernel::Portable => true,
        }
    }

    /// Rows of the register tile.
    pub fn mr(self) -> usize {
        match self {
            Kernel::Avx512 => kernel_avx512::MR,
            Kernel::Avx2 => kernel_avx2::MR,
            Kernel::Portable => kernel_portable::MR,
        }
    }

    /// Columns of the register tile (the width of a packed panel of `b`).
    pub fn nr(self) -> usize {
        match self {
            Kernel::Avx512 => kernel_avx512::NR,
            Kernel::Avx2 => kernel_avx2::NR,
            Kernel::Portable => kernel_portable::NR,
        }
    }

    /// `c[0..rows, 0..cols] (+)= a_panel · b_panel` over `kc` steps, see [`TileArgs`].
    ///
    /// # Safety
    /// The kernel is supported by this CPU, and `args` satisfies [`TileArgs`]' invariants for
    /// this kernel's `mr` and `nr`.
    #[inline]
    unsafe fn tile(self, args: &TileArgs) {
        match self {
            // SAFETY: the caller guarantees the features and the pointers' extents.
            Kernel::Avx512 => unsafe { kernel_avx512::tile(args) },
            Kernel::Avx2 => unsafe { kernel_avx2::tile(args) },
            Kernel::Portable => unsafe { kernel_portable::tile(args) },
        }
    }
}

/// The operands of one micro-kernel call.
///
/// Invariants (the caller's): `a` points to `kc · mr` readable values (a packed micro-panel,
/// value `(i, p)` at `p · mr + i`), `b` to `kc · nr` readable values (value `(p, j)` at
/// `p · nr + j`), `1 ≤ rows ≤ mr`, `1 ≤ cols ≤ nr`, and `c + i · ldc + j` is writable for every
/// `i < rows`, `j < cols`, touched by no other thread during the call and overlapping neither
/// panel. With `accumulate` the tile is added to `c`, else it overwrites `c` (whatever `c` held,
/// NaN included).
pub(crate) struct TileArgs {
    pub kc: usize,
    pub a: *const f32,
    pub b: *const f32,
    pub c: *mut f32,
    pub ldc: usize,
    pub rows: usize,
    pub cols: usize,
    pub accumulate: bool,
}

/// A read-only strided matrix: element `(i, j)` is `data[offset + i · row_stride + j · col_stride]`,
/// every one of them inside `data` (checked by [`MatrixRef::new`]).
#[derive(Clone, Copy, Debug)]
pub struct MatrixRef<'a> {
    data: &'a [f32],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

impl<'a> MatrixRef<'a> {
    /// A view of `data`, checked once: every element of the `rows × cols` view lies inside it.
    pub fn new(
        data: &'a [f32],
        offset: i64,
        [rows, cols]: [usize; 2],
        [row_stride, col_stride]: [i64; 2],
        what: &'static str,
    ) -> Result<Self, GemmError> {
        if rows > 0 && cols > 0 {
            let (mut low, mut high) = (offset, offset);
            for (n, s) in [(rows, row_stride), (cols, col_stride)] {
                let span = (n - 1) as i64 * s;
                if span < 0 {
                    low += span;
                } else {
                    high += span;
                }
            }
            if low < 0 || high >= data.len() as i64 {
                return Err(GemmError::OutOfBounds {
                    what,
                    low,
                    high,
                    len: data.len(),
                });
            }
        }
        Ok(MatrixRef {
            data,
            // An empty view never reads: any offset will do.
            offset: offset.max(0) as usize,
            rows,
            cols,
            row_stride: row_stride as isize,
            col_stride: col_stride as isize,
        })
    }

    /// A row-major `rows × cols` matrix in the first `rows · cols` values of `data`.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Result<Self, GemmError> {
        Self::new(data, 0, [rows, cols], [cols as i64, 1], "row-major")
    }

    /// Rows `start..end` of this view.
    pub fn rows(&self, start: usize, end: usize) -> MatrixRef<'a> {
        assert!(start <= end && end <= self.rows, "rows {start}..{end} of {}", self.rows);
        MatrixRef {
            // An empty view never reads, so it keeps the old offset.
            offset: if start == end || self.cols == 0 {
                self.offset
            } else {
                (self.offset as isize + start as isize * self.row_stride) as usize
            },
            rows: end - start,
            ..*self
        }
    }

    /// The transposed view (no data moves).
    pub fn t(&self) -> MatrixRef<'a> {
        MatrixRef {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..*self
        }
    }

    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }
}

/// An output matrix with unit column stride: element `(i, j)` is `data[i · row_stride + j]`,
/// every one inside `data` (checked by [`MatrixMut::new`]).
#[derive(Debug)]
pub struct MatrixMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a> MatrixMut<'a> {
    /// A `rows × cols` output whose rows start `row_stride` values apart in `data`.
    pub fn new(
        data: &'a mut [f32],
        [rows, cols]: [usize; 2],
        row_stride: usize,
    ) -> Result<Self, GemmError> {
        if rows > 0 && cols > 0 && (row_stride < cols || (rows - 1) * row_stride + cols > data.len())
        {
            return Err(GemmError::OutOfBounds {
                what: "output",
                low: 0,
                high: ((rows - 1) * row_stride + cols) as i64 - 1,
                len: data.len(),
            });
        }
        Ok(MatrixMut {
            data,
            rows,
            cols,
            row_stride,
        })
    }

    /// A contiguous row-major `rows × cols` output.
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Result<Self, GemmError> {
        Self::new(data, [rows, cols], cols)
    }

    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// Splits off rows `0..at` (returned) from rows `at..` (kept in `self`).
    fn split_rows(&mut self, at: usize) -> MatrixMut<'a> {
        assert!(at <= self.rows);
        let data = std::mem::take(&mut self.data);
        let split = (at * self.row_stride).min(data.len());
        let (head, tail) = data.split_at_mut(split);
        self.data = tail;
        self.rows -= at;
        MatrixMut {
            data: head,
            rows: at,
            cols: self.cols,
            row_stride: self.row_stride,
        }
    }
}

/// `b` packed for one kernel: `ceil(n / nr)` panels, panel `q` holding values
/// `(p, q · nr + j)` at `q · k · nr + p · nr + j` for `p < k`, `j < nr` (zeros past column `n`).
/// The buffer comes from a pool and returns to it when dropped, so repeated calls of the same
/// size neither allocate nor fault pages in.
pub struct PackedB {
    kernel: Kernel,
    k: usize,
    n: usize,
    buffer: AlignedBuffer,
}

impl PackedB {
    /// Packs `b` for `kernel`, splitting the panels across `threads` threads (1: this one).
    pub fn pack(b: &MatrixRef, kernel: Kernel, threads: usize) -> Result<PackedB, GemmError> {
        if !kernel.is_supported() {
            return Err(GemmError::Unsupported(kernel));
        }
        let [k, n] = b.shape();
        let nr = kernel.nr();
        let panels = n.div_ceil(nr);
        let panel_len = k * nr;
        let mut buffer = AlignedBuffer::take(panels * panel_len);
        let values = buffer.as_mut_slice();
        let threads = threads.clamp(1, panels.max(1));
        if threads == 1 || panel_len == 0 {
            pack::pack_b(b, nr, 0, values);
        } else {
            // Contiguous runs of whole panels, one per thread.
            let per_thread = panels.div_ceil(threads);
            let chunks: Vec<Mutex<&mut [f32]>> = values
                .chunks_mut(per_thread * panel_len)
                .map(Mutex::new)
                .collect();
            minductor_runtime::threads::for_each_chunk(chunks.len(), |t| {
                let mut chunk = chunks[t].lock().unwrap_or_else(|p| p.into_inner());
                pack::pack_b(b, nr, t * per_thread, &mut chunk);
            });
        }
        Ok(PackedB {
            kernel,
            k,
            n,
            buffer,
        })
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    pub fn shape(&self) -> [usize; 2] {
        [self.k, self.n]
    }
}

/// `c = a · b` on the calling thread, `b` packed.
pub fn multiply(a: &MatrixRef, b: &PackedB, c: &mut MatrixMut) -> Result<(), GemmError> {
    check_shapes(a, b, c)?;
    let panels = b.n.div_ceil(b.kernel.nr());
    // SAFETY: shapes were checked to agree; `c` is borrowed uniquely for the whole call and
    // its extent was checked by `MatrixMut::new`.
    unsafe { multiply_panels(a, b, c.data.as_mut_ptr(), c.row_stride, 0..panels) };
    Ok(())
}

/// `c = a · b` on `threads` threads, `b` packed: rows are split across threads when there are
/// enough of them for every thread to get a few register tiles, else columns.
pub fn multiply_parallel(
    a: &MatrixRef,
    b: &PackedB,
    c: &mut MatrixMut,
    threads: usize,
) -> Result<(), GemmError> {
    check_shapes(a, b, c)?;
    let (m, mr, nr) = (a.rows, b.kernel.mr(), b.kernel.nr());
    let panels = b.n.div_ceil(nr);
    let threads = threads.max(1);
    if threads == 1 || m * panels <= 1 {
        return multiply(a, b, c);
    }
    if m >= threads * 4 * mr || panels < threads {
        // Rows: whole micro-panels per thread, the last thread taking the remainder.
        let chunks = threads.min(m.div_ceil(mr));
        let per_thread = m.div_ceil(mr).div_ceil(chunks) * mr;
        let mut parts = Vec::new();
        let mut start = 0;
        while start < m {
            let end = (start + per_thread).min(m);
            parts.push((start, Mutex::new(c.split_rows(end - start))));
            start = end;
        }
        minductor_runtime::threads::for_each_chunk(parts.len(), |t| {
            let (start, part) = &parts[t];
            let mut part = part.lock().unwrap_or_else(|p| p.into_inner());
            let rows = part.rows;
            multiply(&a.rows(*start, start + rows), b, &mut part).expect("shapes checked above");
        });
        return Ok(());
    }
    // Columns: contiguous runs of panels per thread.
    let chunks = threads.min(panels);
    let c_pointer = SharedOutput(c.data.as_mut_ptr());
    let row_stride = c.row_stride;
    minductor_runtime::threads::for_each_chunk(chunks, |t| {
        let range = panels * t / chunks..panels * (t + 1) / chunks;
        // SAFETY: shapes were checked to agree and `c` (borrowed uniquely for this whole call)
        // holds every element of the output; each thread writes only the columns of its own
        // panels, disjoint from every other thread's.
        unsafe { multiply_panels(a, b, c_pointer.get(), row_stride, range) };
    });
    Ok(())
}

/// `c = a · b` for row-major `c`, packing `b` for the detected kernel, on `threads` threads.
pub fn sgemm(
    a: &MatrixRef,
    b: &MatrixRef,
    c: &mut MatrixMut,
    threads: usize,
) -> Result<(), GemmError> {
    sgemm_with(Kernel::detect(), a, b, c, threads)
}

/// [`sgemm`] with the given kernel (an error if this CPU does not support it).
pub fn sgemm_with(
    kernel: Kernel,
    a: &MatrixRef,
    b: &MatrixRef,
    c: &mut MatrixMut,
    threads: usize,
) -> Result<(), GemmError> {
    let packed = PackedB::pack(b, kernel, threads)?;
    multiply_parallel(a, &packed, c, threads)
}

/// The output pointer handed to the column-splitting threads.
#[derive(Clone, Copy)]
struct SharedOutput(*mut f32);
// SAFETY: the threads write disjoint columns of the output (see `multiply_parallel`), which
// outlives them.
unsafe impl Send for SharedOutput {}
unsafe impl Sync for SharedOutput {}

impl SharedOutput {
    /// A method, so closures capture the whole `Send + Sync` wrapper rather than its field.
    fn get(self) -> *mut f32 {
        self.0
    }
}

fn check_shapes(a: &MatrixRef, b: &PackedB, c: &MatrixMut) -> Result<(), GemmError> {
    if a.cols != b.k || c.rows != a.rows || c.cols != b.n {
        return Err(GemmError::Shape {
            a: a.shape(),
            b: b.shape(),
            c: c.shape(),
        });
    }
    Ok(())
}

/// `c[:, columns of panels] = a · b[:, columns of panels]`.
///
/// # Safety
/// `a.cols == b.k`; `c + i · ldc + j` is writable for every `i < a.rows`, `j < b.n` with `j` in
/// the given panels' columns, and no other thread touches those elements during the call.
unsafe fn multiply_panels(
    a: &MatrixRef,
    b: &PackedB,
    c: *mut f32,
    ldc: usize,
    panels: std::ops::Range<usize>,
) {
    let kernel = b.kernel;
    let (m, k, n, mr, nr) = (a.rows, b.k, b.n, kernel.mr(), kernel.nr());
    if m == 0 || panels.is_empty() {
        return;
    }
    if k == 0 {
        for i in 0..m {
            let start = panels.start * nr;
            let end = (panels.end * nr).min(n);
            // SAFETY: row `i`, columns `start..end` are the caller's (see above).
            unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc + start), end - start) }
                .fill(0.0);
        }
        return;
    }
    let packed_b = b.buffer.as_slice();
    // Equal blocks of whole micro-panels, at most MC rows each.
    let mc_block = m.div_ceil(m.div_ceil(MC)).div_ceil(mr) * mr;
    PACKED_A.with(|cell| {
        let mut packed_a = cell.take();
        for row in (0..m).step_by(mc_block) {
            let mc = mc_block.min(m - row);
            let micro_panels = mc.div_ceil(mr);
            for depth in (0..k).step_by(KC) {
                let kc = KC.min(k - depth);
                packed_a.reserve(micro_panels * mr * kc);
                let a_block = &mut packed_a.as_mut_slice()[..micro_panels * mr * kc];
                pack::pack_a(a, row..row + mc, depth..depth + kc, mr, a_block);
                for panel in panels.clone() {
                    let cols = nr.min(n - panel * nr);
                    let b_panel = &packed_b[panel * k * nr + depth * nr..][..kc * nr];
                    for micro in 0..micro_panels {
                        let rows = mr.min(mc - micro * mr);
                        let args = TileArgs {
                            kc,
                            a: a_block[micro * mr * kc..][..mr * kc].as_ptr(),
                            b: b_panel.as_ptr(),
                            // SAFETY: row `row + micro·mr` < m, column `panel·nr` < n: inside
                            // the caller's output (see above).
                            c: unsafe { c.add((row + micro * mr) * ldc + panel * nr) },
                            ldc,
                            rows,
                            cols,
                            accumulate: depth > 0,
                        };
                        // SAFETY: `PackedB::pack` checked the kernel is supported; the panels
                        // are slices of `kc·mr` and `kc·nr` values; `rows ≤ mr` and
                        // `cols ≤ nr` stay inside `m × n`, whose elements in these panels'
                        // columns the caller gave to this call alone.
                        unsafe { kernel.tile(&args) };
                    }
                }
            }
        }
        cell.set(packed_a);
    });
}

thread_local! {
    /// Each thread's buffer for packed blocks of `a`, kept between calls.
    static PACKED_A: std::cell::Cell<AlignedBuffer> = const { std::cell::Cell::new(AlignedBuffer::new()) };
}

/// A 64-byte aligned run of f32 values: whole cache lines, aligned zmm loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A growable buffer of f32 values starting on a cache line, zero-initialized when grown.
#[derive(Default)]
struct AlignedBuffer {
    lines: Vec<Line>,
    len: usize,
}

/// Packed-`b` buffers waiting for the next call (at most [`POOL_BUFFERS`]).
static POOL: Mutex<Vec<AlignedBuffer>> = Mutex::new(Vec::new());
const POOL_BUFFERS: usize = 4;

impl AlignedBuffer {
    const fn new() -> Self {
        AlignedBuffer {
            lines: Vec::new(),
            len: 0,
        }
    }

    /// A buffer of `len` values from the pool (the smallest one large enough), or a new one.
    fn take(len: usize) -> Self {
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let best = (0..pool.len())
            .filter(|&i| pool[i].lines.len() * 16 >= len)
            .min_by_key(|&i| pool[i].lines.len());
        let mut buffer = match best {
            Some(i) => pool.swap_remove(i),
            None => pool.pop().unwrap_or_default(),
        };
        drop(pool);
        buffer.reserve(len);
        buffer.len = len;
        buffer
    }

    /// Makes room for `len` values and sets the length to it.
    fn reserve(&mut self, len: usize) {
        let lines = len.div_ceil(16);
        if self.lines.len() < lines {
            self.lines = vec![Line([0.0; 16]); lines];
        }
        self.len = len;
    }

    fn as_slice(&self) -> &[f32] {
        // SAFETY: `lines` holds `lines.len() · 16` initialized f32 values (`Line` is
        // `repr(C)` over `[f32; 16]`, without padding), and `len` never exceeds that.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const f32, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut f32, self.len) }
    }
}

impl Drop for PackedB {
    fn drop(&mut self) {
        let buffer = std::mem::take(&mut self.buffer);
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < POOL_BUFFERS {
            pool.push(buffer);
        } else if let Some(smallest) = (0..pool.len()).min_by_key(|&i| pool[i].lines.len()) {
            if pool[smallest].lines.len() < buffer.lines.len() {
                pool[smallest] = buffer;
            }
        }
    }
}
