//! Products of a few rows, `c = a · b` with `a` of at most [`FEW_ROWS`] rows, `b` read in place:
//! a language model decoding one token at a time multiplies one row (or one per sequence of a
//! small batch) by every weight.
//!
//! Why not the packed path: it moves all of `b` into panels before multiplying (for a weight
//! stored `[n, k]`, a transposition), and its micro-kernel computes `MR = 6` rows whatever `a`
//! has. With one row, each value of `b` is used once, so packing it costs as much as the
//! product, and both are a stream over `b`: on a Zen 4 core, `[1, 512] · [512, 2048]` (a 4 MiB
//! weight, in L3) took 0.22 ms, 41% of it transposing the weight and most of the rest in the
//! micro-kernel's prefetches (a product of one micro-panel gives its one tile all the lines of
//! the next block), where reading the weight once at L3 speed takes a fraction of that. Here
//! `b` is read once, in place, in the order it is stored:
//! - `b`'s columns contiguous (a weight `w` read as `wᵀ`, as `linear` does): each element of
//!   `c` is a dot product of a row of `a` and a column of `b`, computed for [`COLUMNS`] columns
//!   and up to four rows of `a` at once (each value of `b` loaded once for all of them), each
//!   in vector lanes summed at the end in a fixed order (`dots`);
//! - `b`'s rows contiguous (`x @ w` of a weight stored `[k, n]`): each row of `c` is a sum over
//!   `k` of `a[i][p] · b[p][..]`, for a block of columns at a time down all of `b`'s rows
//!   (`axpys`), one fused multiply-add per step, in `k`'s order.
//!
//! With more rows than one pass of registers holds (4 on AVX-512, 2 on AVX2), each block of
//! columns takes `k` in runs of [`K_RUN`], every group of rows over each run in turn, so the
//! run's values of `b` and of `a` are read from L1 after the first group (without the runs,
//! 16 rows at depth 4096 read them from L2 and ran at 0.6 of the packed path's rate).
//!
//! Measured on a Zen 4 (2 vCPUs), `linear → gelu → linear` of `rows` rows through
//! 512 → 2048 → 512 (8 MiB of weights) and 1024 → 4096 → 1024 (32 MiB), medians of alternated
//! rounds in one process against the packed path (`cargo run --release -p minductor-tools
//! --example decode_shapes`), µs:
//!
//! | rows | 1 thread 512/2048 | 1024/4096 | 2 threads 512/2048 | 1024/4096 |
//! |---|---|---|---|---|
//! | 1 | 113 vs 450 | 1021 vs 2191 | 61 vs 451 | 396 vs 1057 |
//! | 4 | 186 vs 511 | 1631 vs 2215 | 99 vs 268 | 736 vs 1129 |
//! | 12 | 562 vs 796 | 2775 vs 3239 | 299 vs 390 | 1431 vs 1673 |
//!
//! At 16 to 32 rows the packed path wins at 1024/4096 (0.92-0.98x at 1 and 2 threads) and the
//! two are within 0.91-1.16x at 512/2048, hence [`FEW_ROWS`] = 12.
//!
//! The threads split the columns, each an even share of whole blocks. Each element of `c` is
//! computed by one thread in an order fixed by the shapes, so results are the same bits on any
//! number of threads; they are not the packed path's (which sums in other orders), and whether
//! a product takes this path depends on its shapes only ([`prefers`]).

use super::{GemmError, Kernel, MatrixMut, MatrixRef, SharedOutput};

/// The most rows of `a` a product may have to take this path.
pub const FEW_ROWS: usize = 12;

/// Columns of `b` the dot-product form computes at once.
const COLUMNS: usize = 4;

/// Steps of `k` the dot-product form takes for all the rows of `a` before the next ones, when
/// they are more than one pass holds (a multiple of every register's lanes): the run's values
/// of up to 12 rows of `a` (12 KiB) and of a block of `b`'s columns stay in L1 between the
/// passes.
const K_RUN: usize = 256;

/// Vector registers of `b` the rows form loads per step of `k` (its block is this many
/// registers of columns wide).
const ROW_REGISTERS: usize = 4;

/// Bytes of `b` per piece of a product's split (fewer bytes: one thread): a piece must read
/// enough of `b` to pay for handing it to another thread (a few microseconds).
const PARALLEL_BYTES: usize = 256 << 10;

/// Whether [`multiply_few_rows`] should compute `a · b` of `m × k` by `k × n` with `kernel`:
/// `a` has at most [`FEW_ROWS`] rows, `b`'s columns or rows are contiguous, and the kernel is a
/// vector one (the portable kernel's CPUs keep the packed path). Shapes and strides only,
/// never the thread count.
pub fn prefers(
    kernel: Kernel,
    [m, k, n]: [usize; 3],
    [b_row_stride, b_col_stride]: [i64; 2],
) -> bool {
    matches!(kernel, Kernel::Avx512 | Kernel::Avx2)
        && enabled()
        && (1..=FEW_ROWS).contains(&m)
        && k > 0
        && n > 0
        && layout([b_row_stride as isize, b_col_stride as isize]).is_some()
}

/// 0: not yet read from `MINDUCTOR_GEMM_FEW_ROWS`; 1: on; 2: off.
static ENABLED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether products of few rows take this path: `MINDUCTOR_GEMM_FEW_ROWS=0` turns it off (for
/// comparisons), and so does [`set_few_rows`]`(false)`.
fn enabled() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    match ENABLED.load(Relaxed) {
        0 => {
            let on = !std::env::var("MINDUCTOR_GEMM_FEW_ROWS").is_ok_and(|v| v == "0");
            ENABLED.store(if on { 1 } else { 2 }, Relaxed);
            on
        }
        state => state == 1,
    }
}

/// Turns the path on or off for products planned from now on, in this process (benchmarks
/// that compare it with the packed path in one process).
pub fn set_few_rows(enabled: bool) {
    ENABLED.store(
        if enabled { 1 } else { 2 },
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// How `b` is read: by columns (each a contiguous run along `k`) or by rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Columns,
    Rows,
}

fn layout([row_stride, col_stride]: [isize; 2]) -> Option<Layout> {
    if row_stride == 1 && col_stride > 0 {
        Some(Layout::Columns)
    } else if col_stride == 1 && row_stride > 0 {
        Some(Layout::Rows)
    } else {
        None
    }
}

/// The threads that products of few rows reading `b_bytes` bytes of `b` in all run on, of
/// `threads`: one per [`PARALLEL_BYTES`] (their cost is reading `b`, not their multiply-adds).
pub fn few_rows_threads(b_bytes: usize, threads: usize) -> usize {
    threads.min(b_bytes / PARALLEL_BYTES).max(1)
}

/// How a product of `k × n` of `b`, read in `layout`, splits on `threads` threads: units of
/// `width` columns (a dot-product block, or the rows form's block), in `pieces` even shares,
/// one per [`PARALLEL_BYTES`] of `b` and at most one per unit. The executor
/// ([`multiply_few_rows`]) and the partition report ([`few_rows_pieces`]) both cut by it.
struct Cut {
    width: usize,
    n: usize,
    units: usize,
    pieces: usize,
}

impl Cut {
    fn new(kernel: Kernel, layout: Layout, [k, n]: [usize; 2], threads: usize) -> Cut {
        let width = match layout {
            Layout::Columns => COLUMNS,
            Layout::Rows => ROW_REGISTERS * if kernel == Kernel::Avx512 { 16 } else { 8 },
        };
        let units = n.div_ceil(width);
        let b_bytes = k * n * std::mem::size_of::<f32>();
        let pieces = few_rows_threads(b_bytes, threads.max(1)).min(units);
        Cut {
            width,
            n,
            units,
            pieces,
        }
    }

    /// The columns of piece `t`: an even share of the units.
    fn columns(&self, t: usize) -> std::ops::Range<usize> {
        let (first, end) = (
            self.units * t / self.pieces,
            self.units * (t + 1) / self.pieces,
        );
        (first * self.width).min(self.n)..(end * self.width).min(self.n)
    }
}

/// The multiply-adds of each piece of an `m × k × n` product on `threads` threads (the
/// partition report), `b`'s strides as for [`prefers`].
pub fn few_rows_pieces(
    kernel: Kernel,
    [m, k, n]: [usize; 3],
    b_strides: [i64; 2],
    threads: usize,
) -> Vec<u64> {
    let Some(layout) = layout([b_strides[0] as isize, b_strides[1] as isize]) else {
        return vec![(m * k * n) as u64];
    };
    let cut = Cut::new(kernel, layout, [k, n], threads);
    (0..cut.pieces)
        .map(|t| (m * k * cut.columns(t).len()) as u64)
        .collect()
}

/// `c = a · b` for `a` of at most [`FEW_ROWS`] rows (see the module), on up to `threads`
/// threads. `Unsupported` unless `kernel` is a vector kernel the CPU has and `b`'s columns or
/// rows are contiguous.
pub fn multiply_few_rows(
    kernel: Kernel,
    a: &MatrixRef,
    b: &MatrixRef,
    c: &mut MatrixMut,
    threads: usize,
) -> Result<(), GemmError> {
    let layout = layout([b.row_stride, b.col_stride]);
    let (Some(layout), true) = (layout, kernel.is_supported()) else {
        return Err(GemmError::Unsupported(kernel));
    };
    if !matches!(kernel, Kernel::Avx512 | Kernel::Avx2) || a.rows > FEW_ROWS {
        return Err(GemmError::Unsupported(kernel));
    }
    if super::trivial_product(a, b.shape(), c)? {
        return Ok(());
    }
    let ([m, k], n) = (a.shape(), c.cols);
    // `a`'s rows, each contiguous along `k` (copied so when its columns are apart).
    let at = |i: usize, p: usize| {
        (a.offset as isize + i as isize * a.row_stride + p as isize * a.col_stride) as usize
    };
    let copied: Vec<f32> = match a.col_stride {
        1 => Vec::new(),
        _ => (0..m)
            .flat_map(|i| (0..k).map(move |p| a.data[at(i, p)]))
            .collect(),
    };
    // Rows past `m` repeat the last one (never read).
    let a_rows: [*const f32; FEW_ROWS] = std::array::from_fn(|i| {
        let i = i.min(m - 1);
        match a.col_stride {
            1 => a.data[at(i, 0)..].as_ptr(),
            _ => copied[i * k..].as_ptr(),
        }
    });
    let cut = Cut::new(kernel, layout, [k, n], threads);
    let args = Args {
        a: a_rows,
        m,
        k,
        b: b.data[b.offset..].as_ptr(),
        ldb: match layout {
            Layout::Columns => b.col_stride,
            Layout::Rows => b.row_stride,
        },
        c: SharedOutput(c.data.as_mut_ptr()),
        ldc: c.row_stride,
    };
    #[cfg(not(target_arch = "x86_64"))]
    return Err(GemmError::Unsupported(kernel));
    #[cfg(target_arch = "x86_64")]
    let run = |t: usize| {
        let columns = cut.columns(t);
        // SAFETY: the kernel's instruction set is the CPU's (checked above); `args` describes
        // `a`'s rows (`m` rows of `k` values each), `b`'s `k × n` view (checked inside its
        // slice by `MatrixRef::new`, read at `b + p · row_stride + j · col_stride`) and `c`'s
        // `m × n` output rows (checked by `MatrixMut::new`); each piece writes only its own
        // columns of `c`, so no element is written by two threads.
        unsafe {
            match (kernel, layout) {
                (Kernel::Avx512, Layout::Columns) => x86::dots_avx512(&args, columns),
                (Kernel::Avx512, Layout::Rows) => x86::axpys_avx512(&args, columns),
                (_, Layout::Columns) => x86::dots_avx2(&args, columns),
                (_, Layout::Rows) => x86::axpys_avx2(&args, columns),
            }
        }
    };
    #[cfg(target_arch = "x86_64")]
    {
        if cut.pieces > 1 {
            minductor_runtime::threads::for_each_chunk(cut.pieces, run);
        } else {
            run(0);
        }
        Ok(())
    }
}

/// What the kernels read: `a`'s `m` rows (the pointers past `m` repeat the last row, never
/// read), `k` values each; `b` from its first element, each of its columns (dots) or rows
/// (axpys) `ldb` values after the one before; `c`'s rows `ldc` apart.
struct Args {
    a: [*const f32; FEW_ROWS],
    m: usize,
    k: usize,
    b: *const f32,
    ldb: isize,
    c: SharedOutput,
    ldc: usize,
}

// SAFETY: the pointers are read by every thread and written only at the columns of `c` each
// thread was given (see `multiply_few_rows`); the buffers outlive the call.
unsafe impl Sync for Args {}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Args, COLUMNS, FEW_ROWS, K_RUN, ROW_REGISTERS};
    use std::arch::x86_64::*;

    /// One register of f32 lanes and the few operations the kernels need. Every method is
    /// `#[inline(always)]`, so it is compiled inside the `#[target_feature]` entry that calls
    /// it, whose caller vouches for the CPU.
    trait Vector: Copy {
        const LANES: usize;
        unsafe fn zero() -> Self;
        /// The `n < LANES` first values from `p` (the other lanes zero) if `n < LANES`, else
        /// `LANES` values.
        unsafe fn load(p: *const f32, n: usize) -> Self;
        unsafe fn splat(x: f32) -> Self;
        /// `a · b + c`, rounded once.
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
        /// Stores the first `min(n, LANES)` lanes.
        unsafe fn store(p: *mut f32, v: Self, n: usize);
        /// The lanes' sum: halves added pairwise down to one lane (a fixed order).
        unsafe fn sum(self) -> f32;
        /// The lanes' sums of four registers, stored to `p[0..4]`: within each 128-bit
        /// quarter, lanes 0 + 2 and 1 + 3, then those two; then the quarters, halves added
        /// pairwise (a fixed order, with a third of the steps of four [`Vector::sum`]s).
        unsafe fn sum4(v: [Self; 4], p: *mut f32);
    }

    #[derive(Clone, Copy)]
    struct Zmm(__m512);

    impl Vector for Zmm {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Zmm(_mm512_setzero_ps())
        }
        #[inline(always)]
        unsafe fn load(p: *const f32, n: usize) -> Self {
            if n >= 16 {
                Zmm(_mm512_loadu_ps(p))
            } else {
                Zmm(_mm512_maskz_loadu_ps(((1u32 << n) - 1) as u16, p))
            }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Zmm(_mm512_set1_ps(x))
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Zmm(_mm512_fmadd_ps(a.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self, n: usize) {
            if n >= 16 {
                _mm512_storeu_ps(p, v.0)
            } else {
                _mm512_mask_storeu_ps(p, ((1u32 << n) - 1) as u16, v.0)
            }
        }
        #[inline(always)]
        unsafe fn sum(self) -> f32 {
            let half = _mm256_add_ps(
                _mm512_castps512_ps256(self.0),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0))),
            );
            Ymm(half).sum()
        }
        #[inline(always)]
        unsafe fn sum4(v: [Self; 4], p: *mut f32) {
            let quarters = quarter_sums(v.map(|v| v.0));
            let half = _mm256_add_ps(
                _mm512_castps512_ps256(quarters),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(quarters))),
            );
            let q = _mm_add_ps(
                _mm256_castps256_ps128(half),
                _mm256_extractf128_ps::<1>(half),
            );
            _mm_storeu_ps(p, q)
        }
    }

    /// Each 128-bit quarter of the result holds the four registers' sums of that quarter's
    /// lanes, register `r` in lane `r` (lanes 0 + 2 and 1 + 3 added, then those two).
    #[inline(always)]
    unsafe fn quarter_sums(v: [__m512; 4]) -> __m512 {
        let pair = |a: __m512, b: __m512| {
            _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
        };
        let (t0, t1) = (
            _mm512_castps_pd(pair(v[0], v[1])),
            _mm512_castps_pd(pair(v[2], v[3])),
        );
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t1)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t1)),
        )
    }

    #[derive(Clone, Copy)]
    struct Ymm(__m256);

    /// Lane masks for `_mm256_maskload_ps`: the first `n` lanes of `MASKS[8 - n..]`.
    const MASKS: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

    impl Vector for Ymm {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Ymm(_mm256_setzero_ps())
        }
        #[inline(always)]
        unsafe fn load(p: *const f32, n: usize) -> Self {
            if n >= 8 {
                Ymm(_mm256_loadu_ps(p))
            } else {
                let mask = _mm256_loadu_si256(MASKS[8 - n..].as_ptr() as *const __m256i);
                Ymm(_mm256_maskload_ps(p, mask))
            }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Ymm(_mm256_set1_ps(x))
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Ymm(_mm256_fmadd_ps(a.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self, n: usize) {
            if n >= 8 {
                _mm256_storeu_ps(p, v.0)
            } else {
                let mask = _mm256_loadu_si256(MASKS[8 - n..].as_ptr() as *const __m256i);
                _mm256_maskstore_ps(p, mask, v.0)
            }
        }
        #[inline(always)]
        unsafe fn sum(self) -> f32 {
            let q = _mm_add_ps(
                _mm256_castps256_ps128(self.0),
                _mm256_extractf128_ps::<1>(self.0),
            );
            let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
            let s = _mm_add_ss(d, _mm_movehdup_ps(d));
            _mm_cvtss_f32(s)
        }
        #[inline(always)]
        unsafe fn sum4(v: [Self; 4], p: *mut f32) {
            let pair = |a: __m256, b: __m256| {
                _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b))
            };
            let (t0, t1) = (
                _mm256_castps_pd(pair(v[0].0, v[1].0)),
                _mm256_castps_pd(pair(v[2].0, v[3].0)),
            );
            let quarters = _mm256_add_ps(
                _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t1)),
                _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t1)),
            );
            let q = _mm_add_ps(
                _mm256_castps256_ps128(quarters),
                _mm256_extractf128_ps::<1>(quarters),
            );
            _mm_storeu_ps(p, q)
        }
    }

    /// Steps `p0..p1` (`p0` a multiple of the lanes) of `c[i][j] = Σ_p a[i][p] · b[p][j]` for
    /// the `M` rows of `a` from `first` and the `J` columns of `b` from `column`, `b`'s columns
    /// contiguous, into `partial` (row `i`'s at `partial[first + i]`): lane `l` of each
    /// accumulator sums the values at `p ≡ l` (mod lanes) in order. However `0..k` is cut into
    /// such steps, the accumulators hold the same values after the last.
    ///
    /// # Safety
    /// As for [`dots`]; `first + M ≤ m`, `p1 ≤ k`.
    #[inline(always)]
    unsafe fn dot_steps<V: Vector, const M: usize, const J: usize>(
        args: &Args,
        first: usize,
        column: usize,
        (p0, p1): (usize, usize),
        partial: &mut [[V; COLUMNS]; FEW_ROWS],
    ) {
        let a: [*const f32; M] = std::array::from_fn(|i| args.a[first + i]);
        let b: [*const f32; J] =
            std::array::from_fn(|j| args.b.offset((column + j) as isize * args.ldb));
        let mut acc: [[V; J]; M] =
            std::array::from_fn(|i| std::array::from_fn(|j| partial[first + i][j]));
        let mut p = p0;
        while p < p1 {
            let n = p1 - p;
            let bv: [V; J] = std::array::from_fn(|j| V::load(b[j].add(p), n));
            for i in 0..M {
                let av = V::load(a[i].add(p), n);
                for j in 0..J {
                    acc[i][j] = V::fma(av, bv[j], acc[i][j]);
                }
            }
            p += V::LANES;
        }
        for (i, row) in acc.iter().enumerate() {
            partial[first + i][..J].copy_from_slice(row);
        }
    }

    /// The dot-product form over `columns` (whole [`COLUMNS`] blocks but at the end of `c`),
    /// `ROWS` rows of `a` at a time. With more rows than that, each block of columns takes `k`
    /// in runs of [`K_RUN`], every group of rows in turn over each run, so that the run's
    /// values of `b` and of all the rows of `a` stay in L1 (read once from memory), the
    /// accumulators kept between runs: the same sums as in one pass.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set; `args` holds `a`'s `m` rows of `k` values, `b`'s
    /// columns `ldb` apart from `b` (each `k` contiguous values) for every column of
    /// `columns ⊆ 0..n`, and `c`'s rows, whose elements in `columns` no other thread touches.
    #[inline(always)]
    unsafe fn dots<V: Vector, const ROWS: usize>(args: &Args, columns: std::ops::Range<usize>) {
        let (m, k) = (args.m, args.k);
        let run = if m <= ROWS { k } else { K_RUN };
        // Only the first `m` rows are used (zeroing all of it for every block of 4 columns
        // took a third of a one-row `q · kᵀ` against 512 keys).
        let mut partial = [[V::zero(); COLUMNS]; FEW_ROWS];
        let mut j = columns.start;
        while j < columns.end {
            let block = (columns.end - j).min(COLUMNS);
            for row in partial.iter_mut().take(m) {
                *row = [V::zero(); COLUMNS];
            }
            for p0 in (0..k).step_by(run) {
                let steps = (p0, (p0 + run).min(k));
                let mut first = 0;
                while first < m {
                    let rows = (m - first).min(ROWS);
                    macro_rules! steps {
                        ($($m:literal),*) => {
                            match (rows, block) {
                                $(($m, COLUMNS) => {
                                    dot_steps::<V, $m, COLUMNS>(args, first, j, steps, &mut partial)
                                }
                                ($m, _) => dot_steps::<V, $m, 1>(args, first, j, steps, &mut partial),)*
                                _ => unreachable!("at most ROWS ≤ FEW_ROWS rows"),
                            }
                        };
                    }
                    if ROWS == 4 {
                        steps!(1, 2, 3, 4);
                    } else {
                        steps!(1, 2);
                    }
                    first += rows;
                }
            }
            let width = if block == COLUMNS { COLUMNS } else { 1 };
            for (i, row) in partial.iter().enumerate().take(m) {
                let c = args.c.get().add(i * args.ldc + j);
                if width == COLUMNS {
                    V::sum4(*row, c);
                } else {
                    *c = row[0].sum();
                }
            }
            j += width;
        }
    }

    /// Steps `p0..p1` of `c[i][column..column + width] = Σ_p a[i][p] · b[p][column..]` for the
    /// `M` rows of `a` from `first`, `b`'s rows contiguous, into `partial` (as [`dot_steps`]):
    /// one fused multiply-add per step of `p`, in order.
    ///
    /// # Safety
    /// As for [`axpys`]; `first + M ≤ m`, `p1 ≤ k`, `width ≤ ROW_REGISTERS · LANES`.
    #[inline(always)]
    unsafe fn axpy_steps<V: Vector, const M: usize>(
        args: &Args,
        first: usize,
        (column, width): (usize, usize),
        (p0, p1): (usize, usize),
        partial: &mut [[V; ROW_REGISTERS]; FEW_ROWS],
    ) {
        let a: [*const f32; M] = std::array::from_fn(|i| args.a[first + i]);
        let mut acc: [[V; ROW_REGISTERS]; M] = std::array::from_fn(|i| partial[first + i]);
        let registers = width.div_ceil(V::LANES);
        let mut row = args.b.add(column).offset(p0 as isize * args.ldb);
        for p in p0..p1 {
            if width == ROW_REGISTERS * V::LANES {
                let bv: [V; ROW_REGISTERS] =
                    std::array::from_fn(|r| V::load(row.add(r * V::LANES), V::LANES));
                for i in 0..M {
                    let av = V::splat(*a[i].add(p));
                    for r in 0..ROW_REGISTERS {
                        acc[i][r] = V::fma(av, bv[r], acc[i][r]);
                    }
                }
            } else {
                // The last block of `c`'s columns: `registers` registers, the last one partial.
                let bv: [V; ROW_REGISTERS] = std::array::from_fn(|r| match r < registers {
                    true => V::load(row.add(r * V::LANES), width - r * V::LANES),
                    false => V::zero(),
                });
                for (i, acc) in acc.iter_mut().enumerate() {
                    let av = V::splat(*a[i].add(p));
                    for (acc, b) in acc.iter_mut().zip(&bv).take(registers) {
                        *acc = V::fma(av, *b, *acc);
                    }
                }
            }
            row = row.offset(args.ldb);
        }
        partial[first..first + M].copy_from_slice(&acc);
    }

    /// The rows form over `columns` (whole blocks of `ROW_REGISTERS · LANES` but at the end),
    /// `ROWS` rows of `a` at a time, `k` in runs of [`K_RUN`] with more rows than that (as
    /// [`dots`]: each run's rows of the block of `b` read from memory once).
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set; `args` holds `a`'s `m` rows of `k` values, `b`'s
    /// `k` rows `ldb` apart from `b` (each contiguous over every column of `columns ⊆ 0..n`),
    /// and `c`'s rows, whose elements in `columns` no other thread touches.
    #[inline(always)]
    unsafe fn axpys<V: Vector, const ROWS: usize>(args: &Args, columns: std::ops::Range<usize>) {
        let (m, k) = (args.m, args.k);
        let run = if m <= ROWS { k } else { K_RUN };
        let mut partial = [[V::zero(); ROW_REGISTERS]; FEW_ROWS];
        let mut j = columns.start;
        while j < columns.end {
            let width = (columns.end - j).min(ROW_REGISTERS * V::LANES);
            for row in partial.iter_mut().take(m) {
                *row = [V::zero(); ROW_REGISTERS];
            }
            for p0 in (0..k).step_by(run) {
                let steps = (p0, (p0 + run).min(k));
                let mut first = 0;
                while first < m {
                    let rows = (m - first).min(ROWS);
                    let block = (j, width);
                    match rows {
                        1 => axpy_steps::<V, 1>(args, first, block, steps, &mut partial),
                        2 => axpy_steps::<V, 2>(args, first, block, steps, &mut partial),
                        3 => axpy_steps::<V, 3>(args, first, block, steps, &mut partial),
                        _ => axpy_steps::<V, 4>(args, first, block, steps, &mut partial),
                    }
                    first += rows;
                }
            }
            let registers = width.div_ceil(V::LANES);
            for (i, acc) in partial.iter().enumerate().take(m) {
                let c = args.c.get().add(i * args.ldc + j);
                for (r, v) in acc.iter().enumerate().take(registers) {
                    V::store(c.add(r * V::LANES), *v, width - r * V::LANES);
                }
            }
            j += width;
        }
    }

    // Rows of `a` per pass: AVX-512 has 32 registers (4 rows × 4 columns of accumulators, 4 of
    // `b`, 4 of `a`), AVX2 16 (2 × 4, 4, 2).
    const _: () = assert!(FEW_ROWS >= 4 && COLUMNS == 4);

    /// # Safety
    /// As for [`dots`], on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    pub(super) unsafe fn dots_avx512(args: &Args, columns: std::ops::Range<usize>) {
        dots::<Zmm, 4>(args, columns)
    }

    /// # Safety
    /// As for [`dots`], on a CPU with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dots_avx2(args: &Args, columns: std::ops::Range<usize>) {
        dots::<Ymm, 2>(args, columns)
    }

    /// # Safety
    /// As for [`axpys`], on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    pub(super) unsafe fn axpys_avx512(args: &Args, columns: std::ops::Range<usize>) {
        axpys::<Zmm, 4>(args, columns)
    }

    /// # Safety
    /// As for [`axpys`], on a CPU with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpys_avx2(args: &Args, columns: std::ops::Range<usize>) {
        axpys::<Ymm, 2>(args, columns)
    }
}
