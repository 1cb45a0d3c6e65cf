//! Our own single-precision GEMM: `c = a · b` on strided views, with packed panels, cache
//! blocking and register-blocked micro-kernels written with `std::arch`.
//!
//! The structure is GotoBLAS/BLIS's:
//! - `b` (k × n) is packed once per call into panels of `nr` columns ([`PackedB`]), each panel
//!   holding all `k` rows, `nr` values per row, the last panel padded with zeros. One packing is
//!   shared by every row tile and thread of the call (the caller packs, then hands `&PackedB`
//!   to each thread).
//! - `a` is packed per block of at most `MC` rows and `kc` columns into micro-panels of `mr`
//!   rows, `mr` values per column, the last micro-panel padded with zeros. The block stays in
//!   L2. The depth `kc` of the blocks is [`Kernel::kc`]: `k` split into equal blocks no deeper
//!   than the kernel's maximum (for AVX-512, derived from the L2 size read at run time).
//! - For each block, each panel of `b` (`kc × nr` values, streamed from L2 and reused by every
//!   micro-panel of the block) and each micro-panel of `a`, the micro-kernel computes an
//!   `mr × nr` tile of `c` in registers and writes (first depth block) or adds (later blocks)
//!   it.
//!
//! A short `a` (few rows for all of `b`) is streamed instead ([`multiply_streaming`]): all of
//! `a` is packed, the threads split the panels of `b`, and each block of a panel is packed into
//! a per-thread buffer (L2) right before every micro-panel of `a` uses it, so packed `b` never
//! round-trips to memory.
//!
//! Micro-kernels ([`Kernel`]): AVX-512 (6 × 64: 24 zmm accumulators, 4 loads of `b` and 6
//! broadcasts of `a` per step of `k`), AVX2 + FMA (6 × 16: 12 ymm accumulators), and a portable
//! one (4 × 16 on plain arrays, which the compiler vectorizes for the baseline target). The best
//! one the CPU supports is detected once at run time; tests may force any supported one.
//!
//! Convolutions run as an implicit GEMM ([`multiply_im2col`], `implicit.rs`), or, for 3×3
//! windows of stride 1, as Winograd F(2×2, 3×3) ([`multiply_winograd`], `winograd.rs`) on the
//! same micro-kernels.
//!
//! Safety: the only unsafe code is in the packing routines, the Winograd transforms and the
//! micro-kernels, and it rests on bounds checked once per call: [`MatrixRef::new`] proves every
//! element of a view inside its slice, [`MatrixMut::new`] proves the output rows inside theirs,
//! and the packed buffers are sized here from the same shapes the loops run over.

mod few_rows;
mod implicit;
mod kernel_avx2;
mod kernel_avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) use kernel_avx512::transpose16;
mod kernel_portable;
mod pack;
mod split;
#[cfg(test)]
mod tests;
mod weight_rows;
mod winograd;

use crate::scratch::{FirstError, ScratchError};
pub use few_rows::{
    few_rows_pieces, few_rows_threads, multiply_few_rows, prefers as prefers_few_rows,
    set_few_rows, FEW_ROWS,
};
pub use implicit::{check_im2col, multiply_im2col, multiply_im2col_columns, Im2colRef, PackedA};
pub use split::{
    image_parts, product_threads, unit_runs, ProductSplit, Shared, PARALLEL_FLOPS_THRESHOLD,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use thiserror::Error;
pub use weight_rows::{
    multiply_weight_rows, pieces as weight_rows_pieces, prefers as prefers_weight_rows,
};
pub use winograd::{
    check_winograd, is_winograd_window, multiply_winograd, multiply_winograd_tiles,
    prefers_winograd, winograd_tile_count, winograd_transform_pays_off, ConvAlgorithm,
    WinogradWeight,
};

/// Columns of `a` (rows of `b`) per packed block for the AVX2 and portable kernels (their `b`
/// micro-panel, `KC · 16` values, 8 KiB, stays in L1 while the micro-panels of `a` pass by),
/// and for the AVX-512 kernel when its `b` panel fits in L1 (see [`avx512_kc_max`]).
const KC: usize = 128;
/// Most rows of `a` per packed block: `MC · KC` values stay in L2 while every panel of `b`
/// passes by. The rows are split into blocks of equal size (whole micro-panels), so no small
/// last block streams all of `b` for little work.
const MC: usize = 264;

/// The most columns of `a` per packed block for the AVX-512 kernel, from the cache sizes:
/// - if the L1 data cache holds a 128-deep `b` panel (`128 · nr` values, 32 KiB) in two thirds
///   of itself (48 KiB or more) and the L2 is under 2 MiB (Zen 5), 128: the panel stays in L1
///   while the micro-panels of `a` pass by (measured on Zen 5, MLP GEMMs on 2 threads: 128
///   gave ~460 GFLOP/s, 192 ~445, 256 ~425, 384 ~440);
/// - with 2 MiB of L2 or more (Intel's server cores since Sapphire Rapids, 48 KiB L1 too), the
///   rule below: measured on a Xeon of family 6 model 207 at 1 thread, blocks of 256, 384 and
///   512 beat 128 on every product of `gemm_shapes` (the best of three alternated runs each,
///   `MINDUCTOR_GEMM_KC`), by 2-25%: [2048x2048]·[2048x512] 33.4 → 28.8-29.7 ms,
///   [2048x512]·[512x1536] 23.8 → 20.9-22.1, [1024x1408]·[1408x512] 11.3 → 9.7-9.9,
///   [256x1024]·[1024x4096] 16.4 → 15.2-15.4; at 2 threads they tied;
/// - else (the panel streams from L2 whatever its depth, as on Zen 4's 32 KiB L1) the deepest
///   block for which the block of `a` (`MC · kc` values) and one panel of `b` (`kc · nr`) take
///   at most two thirds of L2, in multiples of 64, between 128 and 512: every block's tile of
///   `c` is read and written once per block of `k`, so the deeper the block the less `c`
///   traffic. Measured on Zen 4 (L1d 32 KiB, L2 1 MiB: 512 here), one thread, `gemm_shapes`
///   multiply: 128 → 512 raised [256x1024]·[1024x4096] from 94 to 106 GFLOP/s,
///   [2048x512]·[512x1536] from 101 to 107, 1024³ from 96 to 102; [2048x2048]·[2048x512]
///   stayed at 95-98.
fn avx512_kc_max() -> usize {
    static KC_MAX: OnceLock<usize> = OnceLock::new();
    *KC_MAX.get_or_init(|| avx512_kc_max_for(crate::cache::l1d_bytes(), crate::cache::l2_bytes()))
}

/// [`avx512_kc_max`] for a core whose L1 data and L2 caches hold these many bytes (when known).
fn avx512_kc_max_for(l1d: Option<usize>, l2: Option<usize>) -> usize {
    let panel_bytes = KC * kernel_avx512::NR * std::mem::size_of::<f32>();
    if l1d.is_some_and(|l1| l1 * 2 / 3 >= panel_bytes) && l2.is_none_or(|l2| l2 < 2 << 20) {
        return KC;
    }
    match l2 {
        Some(l2) => {
            let values = l2 * 2 / 3 / std::mem::size_of::<f32>();
            (values / (MC + kernel_avx512::NR) / 64 * 64).clamp(128, 512)
        }
        None => 256,
    }
}

/// The most columns of `a` per packed block for the AVX2 kernel, from the cache sizes: the
/// deepest block, in multiples of 64 between 128 and 512, for which one panel of `b`
/// (`kc · 16` values) takes at most half of L1 (it stays there while the micro-panels of `a`
/// pass by) and a block of `a` (`MC · kc`) at most half of L2. Every depth block reads and
/// writes each tile of `c` once, so the deeper the block the less `c` traffic. On a core with
/// 32 KiB of L1 and 256 KiB of L2 (Intel's AVX2 cores) this is the 128 it always was; with
/// 512 KiB of L2 (Zen 2 and 3) 192. Measured on Zen 3 (EPYC, family 25 model 1), one thread,
/// `gemm_shapes` multiply, best of three alternated runs (`MINDUCTOR_GEMM_KC`) of 128, 192 and
/// 256: [256x1024]·[1024x4096] 79 / 84 / 85 GFLOP/s, [2048x512]·[512x1536] 82 / 84 / 80,
/// [1024x1408]·[1408x512] 78 / 79 / 78, [2048x2048]·[2048x512] 71 / 76 / 78; the kernel alone
/// (`gemm_kernel`) runs at 88-90 from 128 to 256 and falls to 69 at 384.
fn avx2_kc_max() -> usize {
    static KC_MAX: OnceLock<usize> = OnceLock::new();
    *KC_MAX.get_or_init(|| avx2_kc_max_for(crate::cache::l1d_bytes(), crate::cache::l2_bytes()))
}

/// [`avx2_kc_max`] for a core whose L1 data and L2 caches hold these many bytes (when known:
/// else [`KC`]).
fn avx2_kc_max_for(l1d: Option<usize>, l2: Option<usize>) -> usize {
    let (Some(l1), Some(l2)) = (l1d, l2) else {
        return KC;
    };
    let values = |bytes: usize| bytes / 2 / std::mem::size_of::<f32>();
    let by_l1 = values(l1) / kernel_avx2::NR;
    let by_l2 = values(l2) / MC;
    (by_l1.min(by_l2) / 64 * 64).clamp(KC, 512)
}

/// `MINDUCTOR_GEMM_PACKED_PREFETCH=0`: no prefetch of packed blocks (measurements).
fn packed_prefetch_off() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var("MINDUCTOR_GEMM_PACKED_PREFETCH").is_ok_and(|v| v == "0"))
}

/// `MINDUCTOR_GEMM_WEIGHT_ROWS=0`: never read a weight in place ([`multiply_weight_rows`]), for
/// comparisons.
fn weight_rows_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !std::env::var("MINDUCTOR_GEMM_WEIGHT_ROWS").is_ok_and(|v| v == "0"))
}

/// `MINDUCTOR_GEMM_KC=n` overrides the most columns of `a` per packed block (measurements).
fn kc_override() -> Option<usize> {
    static FORCED: OnceLock<Option<usize>> = OnceLock::new();
    *FORCED.get_or_init(|| {
        std::env::var("MINDUCTOR_GEMM_KC")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&v| v > 0)
    })
}

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
    #[error("gemm: the im2col window ({window}) does not fit a {h}x{w} input")]
    Window {
        window: minductor_ir::Window2d,
        h: usize,
        w: usize,
    },
    #[error("gemm: b was packed for the {packed:?} kernel, not {wanted:?}")]
    KernelMismatch { packed: Kernel, wanted: Kernel },
    #[error("gemm: no memory for {bytes} bytes of packed {what}")]
    OutOfMemory { bytes: usize, what: &'static str },
    /// Checking mode (`crate::scratch::CheckScratch`) found a write outside a scratch buffer.
    #[error("gemm: {0}")]
    BufferCheck(String),
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

    /// Columns of `a` (rows of `b`) per packed block of a product of depth `k`: `k` split into
    /// the fewest blocks of at most the kernel's maximum (see [`avx512_kc_max`]), of equal
    /// size rounded up to a multiple of 16 (the last one shorter). Every path of every thread
    /// count blocks a product the same way, so the order of its sums never changes.
    pub fn kc(self, k: usize) -> usize {
        let most = kc_override().unwrap_or(match self {
            Kernel::Avx512 => avx512_kc_max(),
            Kernel::Avx2 => avx2_kc_max(),
            Kernel::Portable => KC,
        });
        let blocks = k.div_ceil(most).max(1);
        k.div_ceil(blocks).next_multiple_of(16).min(most).max(1)
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
    /// Lines to ask the caches for while the tile runs, spread over its steps of `k` (the
    /// portable kernel, a fallback, ignores them).
    pub prefetch: Lines,
}

/// Lines of memory to prefetch into L2: `lines` lines of 16 values from `base`, then as many
/// from `base + run_stride`, and so on, `runs` runs in all. Prefetches are hints: the
/// addresses need not lie inside any buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lines {
    pub base: *const f32,
    pub runs: usize,
    pub run_stride: isize,
    pub lines: usize,
}

impl Lines {
    pub const NONE: Lines = Lines {
        base: std::ptr::null(),
        runs: 0,
        run_stride: 0,
        lines: 0,
    };

    /// Part `part` of `parts`: runs `runs · part / parts .. runs · (part + 1) / parts` (what
    /// [`Lines::parts`] gives, one by one; the tests check the two agree).
    #[cfg(test)]
    pub fn part(self, part: usize, parts: usize) -> Lines {
        let parts = parts.max(1);
        let (start, end) = (self.runs * part / parts, self.runs * (part + 1) / parts);
        self.runs_from(start, end.saturating_sub(start))
    }

    /// Parts `0, 1, .., parts - 1` in order, each as [`Lines::part`] gives it, with one division
    /// for all of them: they are asked for once per micro-tile, where a division or two each
    /// (tens of cycles) showed in the profile of the loop around the tiles.
    pub fn parts(self, parts: usize) -> impl Iterator<Item = Lines> {
        let parts = parts.max(1);
        let (step, extra) = (self.runs / parts, self.runs % parts);
        // `runs · part = parts · start + rest`, `rest < parts`.
        let (mut start, mut rest) = (0, 0);
        (0..parts).map(move |_| {
            let from = start;
            start += step;
            rest += extra;
            if rest >= parts {
                rest -= parts;
                start += 1;
            }
            self.runs_from(from, start - from)
        })
    }

    /// `runs` of these runs from run `first` on.
    fn runs_from(self, first: usize, runs: usize) -> Lines {
        if runs == 0 {
            return Lines::NONE;
        }
        Lines {
            // A prefetch address need not lie inside any buffer (see above).
            base: self.base.wrapping_offset(first as isize * self.run_stride),
            runs,
            ..self
        }
    }
}

/// Steps of `k` per [`Spread::step`] in the micro-kernels.
const SPREAD_CHUNK: usize = 8;

/// A micro-kernel's loop over its `kc` steps of `k`: `in_chunks!(lines, kc, |count| run)`
/// evaluates `run` with `count` steps to take, the prefetches of `lines` issued between the
/// runs, outside the loop of FMAs (whose scalar bookkeeping would take issue slots from the FMA
/// ports: ~4% on `gemm_shapes`' `train dw` when it was done at every step):
/// - nothing to prefetch: one run of all the steps;
/// - at most one line per [`SPREAD_CHUNK`] steps (a tile's share of a packed block: 8 lines
///   over 176 steps on AVX2): one line, then `kc / lines` steps, as many times as there are
///   lines, then the steps left over. No bookkeeping beyond the loop's count and the next
///   address.
/// - more lines: runs of [`SPREAD_CHUNK`] steps, each after the lines due by then ([`Spread`]).
///
/// With the due lines counted before every run of 8 steps (the last case, for all tiles),
/// tiles with a prefetch ran at 0.86-0.88 of the rate of tiles without in `gemm_kernel 192 44 8`
/// on Zen 3 (family 25 model 1), one thread, in alternated runs; in this form at 0.94-1.02.
///
/// A macro, not a function taking a closure: the closure is not compiled with the kernel's
/// target features, so the kernel's steps were not inlined into it and its accumulators went
/// through memory.
macro_rules! in_chunks {
    ($lines:expr, $kc:expr, |$count:ident| $run:expr) => {{
        let (lines, kc): (super::Lines, usize) = ($lines, $kc);
        let total = lines.runs * lines.lines;
        if total == 0 {
            let $count = kc;
            $run;
        } else if total * super::SPREAD_CHUNK <= kc {
            // `total ≤ kc / 8` and `kc` is at most a few thousand: both fit in 32 bits, whose
            // division is the quick one.
            let every = (kc as u32 / total as u32) as usize;
            let mut next = super::LineWalk::new(lines);
            for _ in 0..total {
                super::prefetch_line(next.line());
                let $count = every;
                $run;
            }
            let $count = kc - every * total;
            $run;
        } else {
            let mut prefetch = super::Spread::new(lines, kc.div_ceil(super::SPREAD_CHUNK));
            let mut step = 0;
            while step < kc {
                prefetch.step();
                let $count = super::SPREAD_CHUNK.min(kc - step);
                $run;
                step += $count;
            }
        }
    }};
}
use in_chunks;

/// `$count` steps of `k` of a micro-kernel's tile: `acc[i] += a[i] · b` for the next `MR`
/// values of the `a` panel and `NR` of the `b` panel, moving both pointers on; `UNROLL` steps
/// per pass, then the rest one at a time (the same sums in the same order either way). `step!`,
/// `MR`, `NR` and `UNROLL` are the invoking kernel's (each vector kernel has its own, with its
/// measurement). The caller guarantees that `$a` and `$b` point to `$count · MR` and `$count ·
/// NR` readable values of their panels. A macro, as `in_chunks!`, so that the steps are compiled
/// with the kernel's target features and its accumulators stay in registers.
macro_rules! steps {
    ($acc:expr, $a:expr, $b:expr, $count:expr) => {{
        let mut left: usize = $count;
        while left >= UNROLL {
            step!($acc, $a, $b);
            step!($acc, $a.add(MR), $b.add(NR));
            step!($acc, $a.add(2 * MR), $b.add(2 * NR));
            step!($acc, $a.add(3 * MR), $b.add(3 * NR));
            $a = $a.add(UNROLL * MR);
            $b = $b.add(UNROLL * NR);
            left -= UNROLL;
        }
        for _ in 0..left {
            step!($acc, $a, $b);
            $a = $a.add(MR);
            $b = $b.add(NR);
        }
    }};
}
use steps;

/// Issues the prefetches of a [`Lines`] evenly over a loop of `steps` steps: at each step, those
/// whose turn has come (`runs · lines / steps` per step on average).
pub(crate) struct Spread {
    walk: LineWalk,
    /// Prefetches in all, and those issued so far.
    total: usize,
    issued: usize,
    steps: usize,
    /// Grows by `total` each step; every `steps` of it is one prefetch due.
    credit: usize,
}

/// The lines of a [`Lines`] one after the other: run by run, each run's lines in order.
pub(crate) struct LineWalk {
    lines: Lines,
    /// The next line: run `run`, line `line` of it.
    run: usize,
    line: usize,
}

impl LineWalk {
    #[inline(always)]
    pub fn new(lines: Lines) -> LineWalk {
        LineWalk {
            lines,
            run: 0,
            line: 0,
        }
    }

    /// The address of the next line (`wrapping_offset` forms it without claiming it lies in
    /// any allocation), advancing past it.
    #[inline(always)]
    pub fn line(&mut self) -> *const f32 {
        let offset = self.run as isize * self.lines.run_stride + self.line as isize * 16;
        self.line += 1;
        if self.line == self.lines.lines {
            self.line = 0;
            self.run += 1;
        }
        self.lines.base.wrapping_offset(offset)
    }
}

impl Spread {
    #[inline(always)]
    pub fn new(lines: Lines, steps: usize) -> Spread {
        Spread {
            walk: LineWalk::new(lines),
            total: lines.runs * lines.lines,
            issued: 0,
            steps: steps.max(1),
            credit: 0,
        }
    }

    /// Called once per step of the loop: issues the prefetches due at this step.
    #[inline(always)]
    pub fn step(&mut self) {
        for _ in 0..self.tick() {
            prefetch_line(self.next_line());
        }
    }

    /// Advances one step; returns how many prefetches are due at it.
    #[inline(always)]
    fn tick(&mut self) -> usize {
        if self.issued == self.total {
            return 0;
        }
        self.credit += self.total;
        let mut due = 0;
        // (No division: at most one prefetch is due per step unless there are more lines than
        // steps.)
        while self.credit >= self.steps && self.issued < self.total {
            self.credit -= self.steps;
            self.issued += 1;
            due += 1;
        }
        due
    }

    /// The address of the next line, advancing past it.
    #[inline(always)]
    fn next_line(&mut self) -> *const f32 {
        self.walk.line()
    }
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
        assert!(
            start <= end && end <= self.rows,
            "rows {start}..{end} of {}",
            self.rows
        );
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

    /// The distances between rows and between columns, in values.
    pub fn strides(&self) -> [i64; 2] {
        [self.row_stride as i64, self.col_stride as i64]
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
        if rows > 0
            && cols > 0
            && (row_stride < cols || (rows - 1) * row_stride + cols > data.len())
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
}

/// `b` packed for one kernel: `ceil(n / nr)` panels, panel `q` holding values
/// `(p, q · nr + j)` at `q · k · nr + p · nr + j` for `p < k`, `j < nr` (zeros past column `n`).
///
/// Packing is lazy, one depth block ([`Kernel::kc`] rows) of one panel at a time, by the threads
/// that need it: each claims runs of [`PACK_ROWS`] rows of the block until none is left, then
/// waits for the runs others claimed (on many cores, the threads that all start on one panel
/// pack it together instead of one packing while the rest wait); so the packing of a large `b`
/// is spread over the whole product,
/// and the reads of `b` it needs are prefetched while the micro-kernels run on the block before
/// (`multiply_panels`). Every block is packed exactly once per `PackedB`, shared by every tile
/// and thread. The buffer comes from a pool and returns to it when dropped, so repeated calls of
/// the same size neither allocate nor fault pages in.
pub struct PackedB<'a> {
    kernel: Kernel,
    k: usize,
    n: usize,
    source: MatrixRef<'a>,
    /// Owns the packed values; accessed only through `base` (below) after construction.
    buffer: AlignedBuffer,
    /// The start of `buffer`'s `panels · k · nr` values.
    base: *mut f32,
    /// For block `(panel, depth)` at `panel · blocks + depth`: the runs of [`PACK_ROWS`] rows
    /// claimed (low 16 bits) and packed (high 16 bits). A run's values are written only by the
    /// thread whose compare-and-swap claimed it, and the block is read only after all its runs
    /// were seen packed (each packer's release increment, one acquire load).
    states: Vec<AtomicU32>,
    /// Depth blocks per panel: `ceil(k / kc)`, `kc` = [`Kernel::kc`].
    blocks: usize,
    /// The depth block's rows, [`Kernel::kc`] of `k` (read for every tile; computed once).
    kc: usize,
}

/// Rows of `b` per run a thread claims when packing a block of [`PackedB`] (16 KiB of packed
/// AVX-512 values): a 512-deep block is 8 runs.
const PACK_ROWS: usize = 64;

/// The runs claimed (`state & CLAIMED`) and packed (`state >> PACKED_SHIFT`) of a block state.
const CLAIMED: u32 = 0xffff;
const PACKED_SHIFT: u32 = 16;

// SAFETY: the packed values are shared under the protocol of `states` (each block written by
// one thread before any thread reads it); the rest is read-only.
unsafe impl Send for PackedB<'_> {}
unsafe impl Sync for PackedB<'_> {}

impl<'a> PackedB<'a> {
    /// `b` ready to be packed for `kernel` as the products need it.
    pub fn lazy(b: &MatrixRef<'a>, kernel: Kernel) -> Result<PackedB<'a>, GemmError> {
        if !kernel.is_supported() {
            return Err(GemmError::Unsupported(kernel));
        }
        let [k, n] = b.shape();
        let panels = n.div_ceil(kernel.nr());
        let kc = kernel.kc(k);
        let blocks = k.div_ceil(kc);
        let mut buffer = AlignedBuffer::take(panels * k * kernel.nr(), "b")?;
        let base = buffer.as_mut_slice().as_mut_ptr();
        Ok(PackedB {
            kernel,
            k,
            n,
            source: *b,
            buffer,
            base,
            states: (0..panels * blocks).map(|_| AtomicU32::new(0)).collect(),
            blocks,
            kc,
        })
    }

    /// Packs all of `b` for `kernel` now, splitting the panels across `threads` threads.
    pub fn pack(
        b: &MatrixRef<'a>,
        kernel: Kernel,
        threads: usize,
    ) -> Result<PackedB<'a>, GemmError> {
        let packed = Self::lazy(b, kernel)?;
        let panels = packed.panels();
        let threads = threads.clamp(1, panels.max(1));
        let pack_panels = |range: std::ops::Range<usize>| {
            for panel in range {
                for depth in 0..packed.blocks {
                    packed.block(panel, depth);
                }
            }
        };
        if threads == 1 {
            pack_panels(0..panels);
        } else {
            minductor_runtime::threads::for_each_chunk(threads, |t| {
                pack_panels(panels * t / threads..panels * (t + 1) / threads)
            });
        }
        Ok(packed)
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    pub fn shape(&self) -> [usize; 2] {
        [self.k, self.n]
    }

    fn panels(&self) -> usize {
        self.n.div_ceil(self.kernel.nr())
    }

    /// The rows of depth block number `depth`.
    fn block_rows(&self, depth: usize) -> std::ops::Range<usize> {
        let kc = self.kc;
        depth * kc..(depth * kc + kc).min(self.k)
    }

    /// Whether block `(panel, depth)` is still to be packed by someone.
    fn is_empty(&self, panel: usize, depth: usize) -> bool {
        self.states[panel * self.blocks + depth].load(Ordering::Relaxed) & CLAIMED == 0
    }

    /// The packed block `(panel, depth)`: `kc · nr` values, `kc` its rows. Packs the runs of
    /// it no thread has claimed yet, then waits until the runs others claimed are packed.
    fn block(&self, panel: usize, depth: usize) -> &[f32] {
        let nr = self.kernel.nr();
        let rows = self.block_rows(depth);
        let at = panel * self.k * nr + rows.start * nr;
        let len = rows.len() * nr;
        // Runs of `PACK_ROWS` rows (8 of a 512-deep block), longer if a block were so deep (a
        // forced `MINDUCTOR_GEMM_KC`) that their count would not fit its 16 bits.
        let run_rows = PACK_ROWS.max(rows.len().div_ceil(CLAIMED as usize));
        let runs = rows.len().div_ceil(run_rows) as u32;
        let state = &self.states[panel * self.blocks + depth];
        let mut seen = state.load(Ordering::Acquire);
        while seen & CLAIMED < runs {
            let run = seen & CLAIMED;
            match state.compare_exchange_weak(seen, seen + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    let first = rows.start + run as usize * run_rows;
                    let end = (first + run_rows).min(rows.end);
                    // SAFETY: rows `first..end` of the block are its values
                    // `(first - rows.start) · nr ..` of `len`, inside the buffer (`at + len ≤
                    // panels · k · nr`); this thread's compare-and-swap claimed run `run`, so it
                    // alone writes them, and no thread reads the block before every run is
                    // counted packed (below).
                    let values = unsafe {
                        std::slice::from_raw_parts_mut(
                            self.base.add(at + (first - rows.start) * nr),
                            (end - first) * nr,
                        )
                    };
                    pack::pack_b(&self.source.rows(first, end), nr, panel, values);
                    seen =
                        state.fetch_add(1 << PACKED_SHIFT, Ordering::AcqRel) + (1 << PACKED_SHIFT);
                }
                Err(now) => seen = now,
            }
        }
        let mut spins = 0u32;
        while seen >> PACKED_SHIFT < runs {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            seen = state.load(Ordering::Acquire);
        }
        // SAFETY: every run of the block was counted packed, seen with acquire ordering after
        // each packer's release (the counts' read-modify-writes form one release sequence), so
        // no thread writes it any more; it lies inside the buffer (see above).
        unsafe { std::slice::from_raw_parts(self.base.add(at), len) }
    }

    /// The lines the micro-kernels should prefetch for block `(panel, depth)`, read next, to be
    /// shared out among the tiles that run before it ([`Lines::parts`]): its source's (see
    /// [`source_lines`]) if the block is still to be packed, else the packed block's own.
    ///
    /// A packed block left unprefetched came from L3 or memory in the first tile that read it:
    /// `kc · nr` values (32 KiB) at once, for a panel that then serves only `MC / mr` (44)
    /// tiles. Measured on Zen 5 (family 26 model 2), one thread, `gemm_shapes`' multiply with `b`
    /// packed beforehand, medians of 6 alternated runs against `MINDUCTOR_GEMM_PACKED_PREFETCH=0`:
    /// [256x1024]·[1024x4096] 14.17 → 13.22 ms, [256x4096]·[4096x1024] 12.66 → 11.55, train's
    /// dx 11.91 → 11.42, [2048x2048]·[2048x512] 24.33 → 23.77; [2048x512]·[512x1536] even.
    /// Lazily packed (`b` packed by the first row block, read packed by the others) it moved
    /// each product by -3% to +5%.
    fn next_lines(&self, panel: usize, depth: usize) -> Lines {
        let rows = self.block_rows(depth);
        if self.is_empty(panel, depth) {
            return source_lines(&self.source, self.kernel.nr(), panel, rows);
        }
        if packed_prefetch_off() {
            return Lines::NONE;
        }
        let nr = self.kernel.nr();
        let at = panel * self.k * nr + rows.start * nr;
        Lines {
            // A prefetch address need not be inside the buffer (see `Lines`), but this one is:
            // the start of the block's `rows.len() · nr` values, one run per line of them.
            base: self.base.wrapping_add(at),
            runs: (rows.len() * nr).div_ceil(16),
            run_stride: 16,
            lines: 1,
        }
    }
}

/// The lines of `b` that panel `panel` (of width `nr`) packs from rows `rows`, if its rows or
/// its columns are contiguous in memory (else none): a run per row, or (a linear layer's
/// transposed weight) a run per column, to be shared out by runs ([`Lines::parts`]).
///
/// The micro-kernels ask for these lines spread over their steps (`in_chunks!`) while they
/// run on the block before. Asked for in one burst before each tile instead, they filled the
/// core's line-fill buffers and stalled it: measured on a Xeon of family 6 model 207, the MLP
/// workload at one thread, paired runs, ~32.5 ms in bursts, ~31.4 with no prefetch at all,
/// ~30.6 spread.
fn source_lines(
    source: &MatrixRef,
    nr: usize,
    panel: usize,
    rows: std::ops::Range<usize>,
) -> Lines {
    let first = panel * nr;
    let width = nr.min(source.cols - first);
    let (runs, run_stride, lines) = if source.col_stride == 1 {
        (rows.len(), source.row_stride, width.div_ceil(16))
    } else if source.row_stride == 1 {
        (width, source.col_stride, rows.len().div_ceil(16))
    } else {
        return Lines::NONE;
    };
    if runs == 0 {
        return Lines::NONE;
    }
    Lines {
        base: source.data[source.at(rows.start, first)..].as_ptr(),
        runs,
        run_stride,
        lines,
    }
}

/// Hints that the line holding `value` will be read soon (into L2).
#[inline(always)]
fn prefetch_line(value: *const f32) {
    crate::cache::prefetch_line(value, crate::cache::Level::L2);
}

/// `c = a · b` on the calling thread, `b` packed (or packed here as needed).
pub fn multiply(a: &MatrixRef, b: &PackedB, c: &mut MatrixMut) -> Result<(), GemmError> {
    multiply_from(a, b, c, 0)
}

/// [`multiply`] visiting the panels of `b` from `first_panel` on (wrapping around): threads
/// multiplying other rows by the same lazily packed `b` should start at different panels, so
/// each packs its own share first instead of waiting for the other.
pub fn multiply_from(
    a: &MatrixRef,
    b: &PackedB,
    c: &mut MatrixMut,
    first_panel: usize,
) -> Result<(), GemmError> {
    check_shapes(a, b, c)?;
    let panels = b.panels();
    // SAFETY: shapes were checked to agree; `c` is borrowed uniquely for the whole call and
    // its extent was checked by `MatrixMut::new`.
    unsafe {
        multiply_panels(
            a,
            b,
            c.data.as_mut_ptr(),
            c.row_stride,
            0..panels,
            first_panel,
        )
    }
}

/// `c = a · b` on `threads` threads, `b` packed: the output is cut into rows and columns of
/// tiles by [`ProductSplit::choose`] (each piece packing its own rows of `a`).
pub fn multiply_parallel(
    a: &MatrixRef,
    b: &PackedB,
    c: &mut MatrixMut,
    threads: usize,
) -> Result<(), GemmError> {
    let split = b.split(a.rows, threads);
    multiply_split(a, b, c, &split)
}

impl PackedB<'_> {
    /// How a product of `m` rows of `a` by this `b` splits on `threads` threads.
    pub fn split(&self, m: usize, threads: usize) -> ProductSplit {
        let kernel = self.kernel;
        ProductSplit::choose(
            [m, self.n, self.k],
            [kernel.mr(), kernel.nr()],
            threads,
            Shared::B,
        )
    }
}

/// `c = a · b` by the pieces of `split` (of `a.rows × b.n`), run across the threads.
pub fn multiply_split(
    a: &MatrixRef,
    b: &PackedB,
    c: &mut MatrixMut,
    split: &ProductSplit,
) -> Result<(), GemmError> {
    check_shapes(a, b, c)?;
    if split.pieces() <= 1 {
        return multiply(a, b, c);
    }
    let panels = b.panels();
    let c_pointer = SharedOutput(c.data.as_mut_ptr());
    let row_stride = c.row_stride;
    let failed = FirstError::new();
    minductor_runtime::threads::for_each_chunk(split.pieces(), |p| {
        let rows = split.rows(p);
        let range = split.panels(p);
        // Rows of another group start at another panel, so lazily packed blocks are packed by
        // whichever group gets there first instead of all waiting for one.
        let group = p / split.panel_groups;
        let rotation = range.len() * group / split.row_groups;
        if rows.is_empty() {
            return;
        }
        debug_assert!(range.end <= panels);
        // SAFETY: shapes were checked to agree and `c` (borrowed uniquely for this whole call)
        // holds every element of the output; the pieces of `split` cover disjoint rows ×
        // columns, so each element is written by one piece, on one thread.
        failed.record(unsafe {
            multiply_panels(
                &a.rows(rows.start, rows.end),
                b,
                c_pointer.get().add(rows.start * row_stride),
                row_stride,
                range,
                rotation,
            )
        });
    });
    failed.into_result()
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
    if prefers_streaming(kernel, a.rows, b.cols, a.cols, threads) {
        return multiply_streaming(kernel, a, b, c, threads);
    }
    let packed = PackedB::lazy(b, kernel)?;
    multiply_parallel(a, &packed, c, threads)
}

/// Whether [`multiply_streaming`] should compute a product of `m` rows, `n` columns on
/// `threads` threads (rather than [`PackedB`] and [`multiply_parallel`]): when `a` is short,
/// every packed block of `b` serves few rows, so writing all of packed `b` to memory and
/// reading it back costs as much as a large part of the multiply (measured on the MLP's
/// `[256, 1024] · [1024, 4096]`, Zen 4, 2 threads: packing alone took ~14% of the multiply's
/// time); streaming packs each block of `b` into a per-thread buffer (L2) right before all rows use it. It needs
/// enough panels of `b` for every thread to get a few, and a depth block of packed `a` small
/// enough to stay in L2 while the panels pass by ([`streamed_a_fits`]).
pub fn prefers_streaming(kernel: Kernel, m: usize, n: usize, k: usize, threads: usize) -> bool {
    if let Some(forced) = streaming_override() {
        return forced;
    }
    m <= STREAMING_ROWS
        && n >= threads.max(1) * 4 * kernel.nr()
        && streamed_a_fits(m, kernel.mr(), kernel.kc(k), crate::cache::l2_bytes())
}

/// Whether one depth block of `a` packed whole (`ceil(m / mr) · mr · kc` values; every thread
/// streams all of it once per panel of `b`) takes at most three quarters of an L2 of `l2` bytes
/// (unknown: yes), leaving room for the block of `b` and the tiles of `c`. Past that, each panel
/// re-reads it from L3. Measured on an Intel Xeon of family 6 model
/// 167 (2 MiB L2, `kc` 512), `gemm_shapes` at 2 threads, streaming against `b` packed lazily by
/// the row blocks: at 1024 rows (a 2 MiB block) streaming lost on every shape,
/// [1024x1408]·[1408x512] 5.19 against 4.65 ms, 1024³ 7.26 against 6.80,
/// [1024x512]·[512x256] 0.95 against 0.87; at 256 rows (the MLP's 512 KiB block) it won,
/// [256x1024]·[1024x4096] 6.83 against 7.83. At 1 thread the two were within 2%. In the LLaMA
/// block (`minductor report`, 2 threads) the down projection went from 5.8-5.9 ms streamed to
/// 4.7-4.9 packed, and the block from 22.4-23.2 to 20.7-21.7 ms; at 1 thread it was even.
fn streamed_a_fits(m: usize, mr: usize, kc: usize, l2: Option<usize>) -> bool {
    let block = m.div_ceil(mr) * mr * kc * std::mem::size_of::<f32>();
    l2.is_none_or(|l2| block <= l2 / 4 * 3)
}

/// Most rows of `a` for which [`prefers_streaming`] holds. Measured (Zen 4, 2 threads, CPU
/// time): at 1024 rows streaming is as fast as the packed path or faster ([1024x512]x[512x512]ᵀ
/// 2.9-3.2 ms both, [1024x512]x[512x1408]ᵀ 7.1-8.0 vs 7.9-8.3, 1024³ 10.5-10.9 vs 11.5-12.1);
/// taller `a`s were not measured, and all of `a` packed stops fitting the L3.
const STREAMING_ROWS: usize = 1024;

/// `MINDUCTOR_GEMM_STREAM=0` or `=1` forces [`prefers_streaming`]'s answer (for comparisons).
fn streaming_override() -> Option<bool> {
    static FORCED: OnceLock<Option<bool>> = OnceLock::new();
    *FORCED.get_or_init(|| match std::env::var("MINDUCTOR_GEMM_STREAM").as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    })
}

/// `c = a · b` on `threads` threads for a short `a`: all of `a` is packed first (its depth
/// blocks split across the threads), then each thread takes a run of panels of `b` and,
/// for each depth block of a panel, packs the block into a buffer of its own (in L2)
/// and runs every micro-panel of `a` over it, prefetching the source of the next block as it
/// goes. The output tile of a panel (`m × nr`) stays in L2 across the blocks.
///
/// Every tile sums the same products in the same order as [`multiply_parallel`] does (same
/// packed values, same depth blocks), so the result is the same bits, for any thread count.
pub fn multiply_streaming(
    kernel: Kernel,
    a: &MatrixRef,
    b: &MatrixRef,
    c: &mut MatrixMut,
    threads: usize,
) -> Result<(), GemmError> {
    stream(kernel, a, BlockSource::Pack(b), c, threads, None, None)
}

/// [`multiply_streaming`] with `b` packed beforehand (a constant weight packed once): the same
/// loop order, each depth block of a panel read from `b` instead of packed, so every tile sums
/// the same products in the same order (the same bits) as [`multiply_streaming`] and
/// [`multiply_parallel`].
pub fn multiply_streaming_packed(
    a: &MatrixRef,
    b: &PackedB,
    c: &mut MatrixMut,
    threads: usize,
) -> Result<(), GemmError> {
    stream(b.kernel, a, BlockSource::Packed(b), c, threads, None, None)
}

/// `c = a · b` cut by `split`, both operands packed once and shared by every piece: all of `a`
/// packed first (its depth blocks split across the `threads`, as [`multiply_streaming`] does),
/// `b` block by block by whichever piece reaches a block first (or beforehand); each piece then
/// runs its rows × panels packing nothing of its own. Since a finer cut packs nothing more, the
/// cut can give every thread an equal share where the packed path's cannot: on 64 threads a
/// product of 1024 rows (171 micro-panels) and 8 panels cuts into 171 row pieces, 3 for some
/// threads and 2 for others (the slowest thread 1.125 times the mean), while both operands
/// shared it cuts in two dimensions (see [`Shared::Neither`]).
///
/// The same packed values, depth blocks and order of sums as [`multiply_parallel`] and
/// [`multiply_streaming`]: the same bits, for any cut.
pub fn multiply_shared(
    a: &MatrixRef,
    b: &PackedB,
    c: &mut MatrixMut,
    split: &ProductSplit,
    threads: usize,
) -> Result<(), GemmError> {
    if split.shape() != [a.rows, b.n] {
        return Err(GemmError::Shape {
            a: a.shape(),
            b: b.shape(),
            c: c.shape(),
        });
    }
    stream(
        b.kernel,
        a,
        BlockSource::Packed(b),
        c,
        threads,
        None,
        Some(split),
    )
}

/// Where [`stream_panels`] gets each depth block of a panel of `b`.
#[derive(Clone, Copy)]
enum BlockSource<'r, 'a> {
    /// Packed into the thread's buffer right before its use.
    Pack(&'r MatrixRef<'a>),
    /// Already packed (or packed on first use, by whichever thread gets to it first).
    Packed(&'r PackedB<'a>),
}

impl BlockSource<'_, '_> {
    fn shape(&self) -> [usize; 2] {
        match self {
            BlockSource::Pack(b) => b.shape(),
            BlockSource::Packed(b) => b.shape(),
        }
    }
}

/// How [`multiply_streaming`] splits an `m × n × k` product on `threads` threads.
pub fn streaming_split(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
) -> ProductSplit {
    ProductSplit::choose([m, n, k], [kernel.mr(), kernel.nr()], threads, Shared::A)
}

/// [`multiply_streaming`], [`multiply_streaming_packed`] and [`multiply_shared`]; `group`
/// forces the panels per group of [`stream_panels`] (tests), else [`panels_per_group`] chooses
/// from the L2's size; `split` is the cut of the product (else [`streaming_split`]'s, of
/// `a.rows × b.cols`: the caller checks a given one is).
fn stream(
    kernel: Kernel,
    a: &MatrixRef,
    b: BlockSource,
    c: &mut MatrixMut,
    threads: usize,
    group: Option<usize>,
    split: Option<&ProductSplit>,
) -> Result<(), GemmError> {
    if !kernel.is_supported() {
        return Err(GemmError::Unsupported(kernel));
    }
    if trivial_product(a, b.shape(), c)? {
        return Ok(());
    }
    let ([m, k], n) = (a.shape(), c.cols);
    let mr = kernel.mr();
    let threads = threads.max(1);
    let kc_block = kernel.kc(k);
    let padded_m = m.div_ceil(mr) * mr;
    // Block `d` (columns `d·kc ..`) of packed `a` holds `padded_m · kc` values from
    // `d · kc · padded_m` on: the layout of `implicit::PackedA`.
    let mut packed_a = AlignedBuffer::take(padded_m * k, "a")?;
    {
        // Packed in units of (depth block, run of micro-panels): each depth block cut into as
        // many runs as it takes to give every thread a unit, so that on many cores a product
        // of few depth blocks (the MLP's: 2) does not wait for two threads to pack all of `a`.
        let depth_blocks = k.div_ceil(kc_block);
        let micro_panels = padded_m / mr;
        let runs = threads.div_ceil(depth_blocks).clamp(1, micro_panels.max(1));
        // (depth block, rows of `a`, their packed values)
        type Unit<'v> = (usize, std::ops::Range<usize>, &'v mut [f32]);
        let mut units: Vec<Mutex<Unit>> = Vec::new();
        for (d, block) in packed_a
            .as_mut_slice()
            .chunks_mut(padded_m * kc_block)
            .enumerate()
        {
            let kc = kc_block.min(k - d * kc_block);
            let mut rest = block;
            for run in 0..runs {
                let (start, end) = (micro_panels * run / runs, micro_panels * (run + 1) / runs);
                let (unit, tail) = rest.split_at_mut((end - start) * mr * kc);
                rest = tail;
                units.push(Mutex::new((d, start * mr..(end * mr).min(m), unit)));
            }
        }
        let chunks = threads.min(units.len());
        let pack_units = |t: usize| {
            let first = units.len() * t / chunks;
            let end = units.len() * (t + 1) / chunks;
            for unit in &units[first..end] {
                let mut unit = unit.lock().unwrap_or_else(|p| p.into_inner());
                // Every run holds at least one micro-panel (`runs ≤ micro_panels`), whose first
                // row is below `m`.
                let (d, rows, values) = &mut *unit;
                let depth = *d * kc_block..(*d * kc_block + kc_block).min(k);
                pack::pack_a(a, rows.clone(), depth, mr, values);
            }
        };
        // (One chunk runs on this thread.)
        minductor_runtime::threads::for_each_chunk(chunks, pack_units);
    }
    let split = split
        .copied()
        .unwrap_or_else(|| streaming_split(kernel, m, n, k, threads));
    let c_pointer = SharedOutput(c.data.as_mut_ptr());
    let ldc = c.row_stride;
    let packed = packed_a.as_slice();
    let failed = FirstError::new();
    let run = |p: usize| {
        let rows = split.rows(p);
        let micro_panels = rows.start / mr..rows.end.div_ceil(mr);
        let group = group.unwrap_or_else(|| {
            let rows = micro_panels.len() * mr;
            panels_per_group(rows, k, kc_block, kernel.nr(), crate::cache::l2_bytes())
        });
        // SAFETY: `kernel` is supported (checked above); shapes agree (checked above); `c`
        // (borrowed uniquely for this whole call, its extent checked by `MatrixMut::new`)
        // holds every output element, and the pieces of `split` write disjoint rows ×
        // columns.
        failed.record(unsafe {
            stream_panels(
                kernel,
                packed,
                b,
                c_pointer.get(),
                ldc,
                m,
                micro_panels,
                split.panels(p),
                group,
            )
        })
    };
    if split.pieces() == 1 {
        run(0);
    } else {
        minductor_runtime::threads::for_each_chunk(split.pieces(), run);
    }
    let checked = packed_a.check("packed a");
    give_back(packed_a);
    failed.into_result()?;
    Ok(checked?)
}

/// Checks that `c = a · b` (`b` of `b_shape`) has matching shapes, and computes it if it is
/// trivial: nothing when `c` is empty, zeros when the depth is 0. `Ok(true)` when done.
fn trivial_product(
    a: &MatrixRef,
    b_shape: [usize; 2],
    c: &mut MatrixMut,
) -> Result<bool, GemmError> {
    let ([m, k], [k_b, n]) = (a.shape(), b_shape);
    if k != k_b || c.rows != m || c.cols != n {
        return Err(GemmError::Shape {
            a: a.shape(),
            b: b_shape,
            c: c.shape(),
        });
    }
    if k == 0 {
        for i in 0..m {
            c.data[i * c.row_stride..][..n].fill(0.0);
        }
    }
    Ok(m == 0 || n == 0 || k == 0)
}

thread_local! {
    /// Each thread's buffer for one packed depth block of `b` (`kc · nr` values) in
    /// [`multiply_streaming`], kept between calls.
    static B_BLOCK: std::cell::Cell<AlignedBuffer> = const { std::cell::Cell::new(AlignedBuffer::new()) };
}

/// Panels of `b` that [`stream_panels`] takes through every depth block together, for a piece
/// of `rows` rows (whole micro-panels) of a product of depth `k` in blocks of `kc`, on a core
/// whose L2 holds `l2` bytes (unknown: 1).
///
/// If all of the piece's packed `a` fits in three quarters of L2 (the MLP's up projection,
/// 1 MiB at depth 1024), 1: each panel's tile of `c` stays in L1 and L2 across the depth
/// blocks while `a` stays in L2. Otherwise every panel would read all of `a` again from L3
/// (the MLP's down projection: 4 MiB at depth 4096, read 8 times per thread at 2 threads).
/// Then the panels go in groups, depth block by depth block: one depth block of `a` is read
/// once per group from L3 and the group's tiles of `c` (`rows · nr` values per panel) stay in
/// L2 between the blocks, as many as fit beside the block of `a` and one block of `b`. The
/// sums of every tile are the same, in the same order.
fn panels_per_group(rows: usize, k: usize, kc: usize, nr: usize, l2: Option<usize>) -> usize {
    let Some(l2) = l2 else { return 1 };
    let bytes = std::mem::size_of::<f32>();
    let budget = l2 / 4 * 3;
    if rows * k * bytes <= budget {
        return 1;
    }
    let (a_block, b_block, c_panel) = (rows * kc * bytes, kc * nr * bytes, rows * nr * bytes);
    (budget.saturating_sub(a_block + b_block) / c_panel.max(1)).max(1)
}

/// `c[rows of micro_panels, columns of panels] = a · b[.., columns of panels]`, `a` packed
/// whole (see [`multiply_streaming`]), each block of `b` packed here just before it is used.
/// The panels go `group` at a time through all depth blocks (see [`panels_per_group`]).
///
/// # Safety
/// `kernel` is supported; `packed_a` holds `a` (`m` rows, `b.rows` columns) packed for it in
/// the layout [`multiply_streaming`] describes; `micro_panels` lies within `0..ceil(m / mr)`;
/// `c + i · ldc + j` is writable for every row `i < m` of the given micro-panels and every
/// `j < b.cols` in the given panels' columns, and no other thread touches those elements during
/// the call.
#[allow(clippy::too_many_arguments)]
unsafe fn stream_panels(
    kernel: Kernel,
    packed_a: &[f32],
    b: BlockSource,
    c: *mut f32,
    ldc: usize,
    m: usize,
    micro_panels: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    group: usize,
) -> Result<(), GemmError> {
    let ([k, n], mr, nr) = (b.shape(), kernel.mr(), kernel.nr());
    let padded_m = m.div_ceil(mr) * mr;
    let first_micro = micro_panels.start;
    let micro_panels = micro_panels.len();
    let kc_block = kernel.kc(k);
    B_BLOCK.with(|cell| {
        let mut block = cell.take();
        if let Err(e) = block.prepare(kc_block * nr, "b block") {
            cell.set(block);
            return Err(e.into());
        }
        let values = block.as_mut_slice();
        let blocks = panels.clone().step_by(group.max(1)).flat_map(|first| {
            let group = first..(first + group.max(1)).min(panels.end);
            (0..k)
                .step_by(kc_block)
                .flat_map(move |depth| group.clone().map(move |panel| (panel, depth)))
        });
        let mut blocks = blocks.peekable();
        while let Some((panel, depth)) = blocks.next() {
            let cols = nr.min(n - panel * nr);
            let kc = kc_block.min(k - depth);
            let b_block: &[f32] = match b {
                BlockSource::Pack(b) => {
                    let b_block = &mut values[..kc * nr];
                    pack::pack_b(&b.rows(depth, depth + kc), nr, panel, b_block);
                    b_block
                }
                // The same depth blocks: `PackedB` splits `k` by the same `kernel.kc(k)`.
                BlockSource::Packed(b) => b.block(panel, depth / kc_block),
            };
            // The block after this one (its source is prefetched while this one runs).
            let next = blocks.peek().copied();
            let a_block = &packed_a[depth * padded_m..][..padded_m * kc];
            let a_block = &a_block[first_micro * mr * kc..][..micro_panels * mr * kc];
            let next_lines = match (next, b) {
                (Some((next_panel, next_depth)), BlockSource::Pack(b)) => {
                    let rows = next_depth..(next_depth + kc_block).min(k);
                    source_lines(b, nr, next_panel, rows)
                }
                _ => Lines::NONE,
            };
            let tiles = a_block
                .chunks_exact(mr * kc)
                .zip(next_lines.parts(micro_panels));
            for (r, (a_panel, prefetch)) in tiles.enumerate() {
                let r = first_micro + r;
                let args = TileArgs {
                    kc,
                    a: a_panel.as_ptr(),
                    b: b_block.as_ptr(),
                    // SAFETY: row `r·mr < m`, column `panel·nr < n`: the caller's.
                    c: unsafe { c.add(r * mr * ldc + panel * nr) },
                    ldc,
                    rows: mr.min(m - r * mr),
                    cols,
                    accumulate: depth > 0,
                    prefetch,
                };
                // SAFETY: the kernel is supported; the panels are slices of `kc·mr` and
                // `kc·nr` values; `rows ≤ mr`, `cols ≤ nr` stay inside `m × n`, whose
                // elements in these panels' columns the caller gave to this call alone.
                unsafe { kernel.tile(&args) };
            }
        }
        let checked = block.check("b block");
        cell.set(block);
        Ok(checked?)
    })
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
/// The panels are visited starting at `panels.start + rotation` (wrapping around), so threads
/// working on other rows of the same `b` start on blocks of their own and pack different ones.
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
    rotation: usize,
) -> Result<(), GemmError> {
    let kernel = b.kernel;
    let (m, k, n, mr, nr) = (a.rows, b.k, b.n, kernel.mr(), kernel.nr());
    if m == 0 || panels.is_empty() {
        return Ok(());
    }
    if k == 0 {
        for i in 0..m {
            let start = panels.start * nr;
            let end = (panels.end * nr).min(n);
            // SAFETY: row `i`, columns `start..end` are the caller's (see above).
            unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc + start), end - start) }
                .fill(0.0);
        }
        return Ok(());
    }
    let order: Vec<usize> = (0..panels.len())
        .map(|i| panels.start + (i + rotation) % panels.len())
        .collect();
    // Equal blocks of whole micro-panels, at most MC rows each.
    let mc_block = m.div_ceil(m.div_ceil(MC)).div_ceil(mr) * mr;
    let kc_block = kernel.kc(k);
    PACKED_A.with(|cell| {
        let mut packed_a = cell.take();
        for row in (0..m).step_by(mc_block) {
            let mc = mc_block.min(m - row);
            let micro_panels = mc.div_ceil(mr);
            for depth in (0..k).step_by(kc_block) {
                let kc = kc_block.min(k - depth);
                // Checked (in checking mode) before it is laid out again for the next block.
                let prepared = packed_a
                    .check("packed a")
                    .and_then(|()| packed_a.prepare(micro_panels * mr * kc, "packed a"));
                if let Err(e) = prepared {
                    cell.set(packed_a);
                    return Err(e.into());
                }
                let a_block = &mut packed_a.as_mut_slice()[..micro_panels * mr * kc];
                pack::pack_a(a, row..row + mc, depth..depth + kc, mr, a_block);
                let block = depth / kc_block;
                for (i, &panel) in order.iter().enumerate() {
                    let cols = nr.min(n - panel * nr);
                    let b_panel = b.block(panel, block);
                    // The block this loop needs next, or the first of the next depth.
                    let next = match order.get(i + 1) {
                        Some(&next) => Some((next, block)),
                        None => (block + 1 < b.blocks).then_some((order[0], block + 1)),
                    };
                    // Shared out among this panel's tiles (whether the next block is packed
                    // yet is asked once, here).
                    let next_lines =
                        next.map_or(Lines::NONE, |(panel, block)| b.next_lines(panel, block));
                    for (micro, prefetch) in next_lines.parts(micro_panels).enumerate() {
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
                            prefetch,
                        };
                        // SAFETY: `PackedB::lazy` checked the kernel is supported; the panels
                        // are slices of `kc·mr` and `kc·nr` values; `rows ≤ mr` and
                        // `cols ≤ nr` stay inside `m × n`, whose elements in these panels'
                        // columns the caller gave to this call alone.
                        unsafe { kernel.tile(&args) };
                    }
                }
            }
        }
        let checked = packed_a.check("packed a");
        cell.set(packed_a);
        Ok(checked?)
    })
}

thread_local! {
    /// Each thread's buffer for packed blocks of `a`, kept between calls.
    static PACKED_A: std::cell::Cell<AlignedBuffer> = const { std::cell::Cell::new(AlignedBuffer::new()) };
}

/// The kernels' scratch buffer type (cache-line aligned, fallible, guarded in checking mode).
pub(crate) use crate::scratch::Scratch as AlignedBuffer;

impl From<ScratchError> for GemmError {
    fn from(e: ScratchError) -> Self {
        match e {
            ScratchError::OutOfMemory { bytes, what } => GemmError::OutOfMemory { bytes, what },
            e @ ScratchError::Overwritten { .. } => GemmError::BufferCheck(e.to_string()),
        }
    }
}

/// Packed-`b` buffers waiting for the next call (at most [`POOL_BUFFERS`]).
static POOL: Mutex<Vec<AlignedBuffer>> = Mutex::new(Vec::new());
const POOL_BUFFERS: usize = 4;

impl AlignedBuffer {
    /// A buffer of `len` values from the pool (the smallest one large enough), or a new one;
    /// `OutOfMemory` (naming `what`) if a new one cannot be allocated.
    fn take(len: usize, what: &'static str) -> Result<Self, GemmError> {
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let best = (0..pool.len())
            .filter(|&i| pool[i].capacity() >= len)
            .min_by_key(|&i| pool[i].capacity());
        let mut buffer = match best {
            Some(i) => pool.swap_remove(i),
            None => pool.pop().unwrap_or_default(),
        };
        drop(pool);
        buffer.prepare(len, what)?;
        Ok(buffer)
    }
}

impl Drop for PackedB<'_> {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.buffer));
    }
}

/// Returns a buffer to the pool (if it has room, or the buffer is larger than its smallest).
fn give_back(buffer: AlignedBuffer) {
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    if pool.len() < POOL_BUFFERS {
        pool.push(buffer);
    } else if let Some(smallest) = (0..pool.len()).min_by_key(|&i| pool[i].capacity()) {
        if pool[smallest].capacity() < buffer.capacity() {
            pool[smallest] = buffer;
        }
    }
}

/// Runs the macro-kernel's loops `reps` times on packed operands of the given sizes (values
/// arbitrary): for every panel of `b` (`kc · nr` values), every micro-panel of `a` (`mr · kc`)
/// adds its tile into a `micro_panels · mr × panels · nr` output. For measuring the
/// micro-kernel and the blocking apart from packing (examples only): returns how much `clock`
/// advanced over the loops alone (the operands' allocation and filling, which at one or two
/// repetitions took as long as the loops, are outside it).
#[doc(hidden)]
pub fn bench_macro_kernel(
    kernel: Kernel,
    kc: usize,
    micro_panels: usize,
    panels: usize,
    reps: usize,
    prefetch: bool,
    clock: impl Fn() -> f64,
) -> Result<f64, GemmError> {
    if !kernel.is_supported() {
        return Err(GemmError::Unsupported(kernel));
    }
    let (mr, nr) = (kernel.mr(), kernel.nr());
    let mut a = AlignedBuffer::new();
    a.prepare(micro_panels * mr * kc, "a")?;
    let mut b = AlignedBuffer::new();
    b.prepare(panels * kc * nr, "b")?;
    let (m, n) = (micro_panels * mr, panels * nr);
    let mut c = vec![0f32; m * n];
    for (i, v) in a.as_mut_slice().iter_mut().enumerate() {
        *v = (i % 7) as f32 * 0.125;
    }
    for (i, v) in b.as_mut_slice().iter_mut().enumerate() {
        *v = (i % 5) as f32 * 0.125;
    }
    let (a, b) = (a.as_slice(), b.as_slice());
    let start = clock();
    for _ in 0..reps {
        for (q, b_panel) in b.chunks_exact(kc * nr).enumerate() {
            // With `prefetch`, the next panel's lines shared out among the tiles, as the
            // products ask for the next packed block (`multiply_panels`).
            let next = Lines {
                base: b[(q + 1) % panels * kc * nr..].as_ptr(),
                runs: if prefetch { (kc * nr).div_ceil(16) } else { 0 },
                run_stride: 16,
                lines: 1,
            };
            let tiles = a.chunks_exact(kc * mr).zip(next.parts(micro_panels));
            for (r, (a_panel, prefetch)) in tiles.enumerate() {
                let args = TileArgs {
                    kc,
                    a: a_panel.as_ptr(),
                    b: b_panel.as_ptr(),
                    c: c[r * mr * n + q * nr..].as_mut_ptr(),
                    ldc: n,
                    rows: mr,
                    cols: nr,
                    accumulate: true,
                    prefetch,
                };
                // SAFETY: the kernel is supported; the panels hold `kc·mr` and `kc·nr`
                // values; the tile (rows `r·mr ..+ mr`, columns `q·nr ..+ nr`) is inside `c`.
                unsafe { kernel.tile(&args) };
            }
        }
    }
    let seconds = clock() - start;
    std::hint::black_box(&c);
    Ok(seconds)
}
