//! Packing: copies of `a` and `b` through their strides into the layouts the micro-kernels
//! read with unit stride. Reads go through checked slices (one check per contiguous run), except
//! the AVX-512 gathers of a transposed `b`, which rest on `MatrixRef::new`'s check.
//!
//! Every value these packers store that is subnormal is stored as a zero of its sign
//! ([`flushed`], and in registers by the AVX-512 and AVX2 packers, `kernel_avx512::flushed16`
//! and `kernel_avx2::flushed8`): the
//! products read subnormal operands as zero, as a CPU's "denormals are zero" mode would. (A
//! convolution's im2col columns and Winograd transforms are packed elsewhere, unflushed; a
//! linear layer's weight read in place, `weight_rows.rs`, is not packed at all.) Intel cores
//! take a microcode assist of about a hundred cycles for each FMA with a
//! subnormal operand: a backward pass's gradient with 1.4% subnormals (a GELU's derivative far
//! in its tail) ran its weight-gradient product 3-4x slower (`train dw` of `gemm_shapes`,
//! 4096x256x1024, one thread on a Xeon of family 6 model 207: 20.7 ms against 62.4 ms). A
//! subnormal's share of a sum is below 1.2e-38 times the other factor.

use super::{kernel_avx2, kernel_avx512, Kernel, MatrixRef};
use std::ops::Range;

impl MatrixRef<'_> {
    /// Index into `data` of element `(i, j)`, which must be inside the view.
    #[inline]
    pub(super) fn at(&self, i: usize, j: usize) -> usize {
        debug_assert!(i < self.rows && j < self.cols);
        (self.offset as isize + i as isize * self.row_stride + j as isize * self.col_stride)
            as usize
    }
}

/// Packs panels `first_panel, first_panel + 1, …` of `b` (`k × n`) into `out`, which holds a
/// whole number of panels of `k · nr` values: value `(p, j)` of panel `q` goes to
/// `q · k · nr + p · nr + j - q · nr`; columns past `n` are zeros.
pub(super) fn pack_b(b: &MatrixRef, nr: usize, first_panel: usize, out: &mut [f32]) {
    let [k, n] = b.shape();
    let panel_len = k * nr;
    if panel_len == 0 {
        return;
    }
    for (q, panel) in out.chunks_exact_mut(panel_len).enumerate() {
        let first = (first_panel + q) * nr;
        let width = nr.min(n - first);
        if b.col_stride == 1 {
            // Rows of `b` are contiguous: one copy per row.
            for (p, row) in panel.chunks_exact_mut(nr).enumerate() {
                let start = b.at(p, first);
                copy_flushed(&mut row[..width], &b.data[start..start + width]);
                row[width..].fill(0.0);
            }
        } else if b.row_stride == 1 && gather_columns(b, nr) {
            // Columns are contiguous (a transposed operand): AVX-512 transposes 16 × 16 blocks
            // in registers (`MINDUCTOR_PACK_GATHER=1`: gathers whole rows instead).
            let column_stride = b.col_stride as usize;
            // SAFETY: AVX-512F is present, `nr` is a multiple of 16 and `15 · column_stride`
            // fits in i32 (`gather_columns`); the panel holds `k · nr` values; and
            // every element `(p, first + j)`, `p < k`, `j < width`, is inside the view, which
            // `MatrixRef::new` checked lies inside `data`.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                let start = b.at(0, first);
                if gather_packing() {
                    kernel_avx512::pack_columns(b.data, start, column_stride, k, width, nr, panel)
                } else {
                    kernel_avx512::pack_columns_transposed(
                        b.data,
                        start,
                        column_stride,
                        k,
                        width,
                        nr,
                        panel,
                    )
                }
            };
        } else if b.row_stride == 1 && avx2_transposes(b, nr) {
            // Columns are contiguous (a transposed operand): AVX2 transposes 8 × 8 blocks in
            // registers. (Measured on Zen 3, one thread, `gemm_shapes`: the MLP's 1024 × 4096
            // weight packed in 6-8 ms one value at a time.)
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 is present (`avx2_transposes`); the rest is checked by the packer.
            unsafe {
                kernel_avx2::pack_columns_transposed(
                    b.data,
                    b.at(0, first),
                    b.col_stride as usize,
                    k,
                    width,
                    nr,
                    panel,
                )
            };
        } else if b.row_stride == 1 {
            // Columns are contiguous (a transposed operand): read runs of each column, 64 rows
            // at a time, so the rows being written (64 · nr values) stay in L1.
            for rows in (0..k).step_by(64) {
                let height = 64.min(k - rows);
                for j in 0..width {
                    let start = b.at(rows, first + j);
                    for (p, &value) in b.data[start..start + height].iter().enumerate() {
                        panel[(rows + p) * nr + j] = flushed(value);
                    }
                }
            }
            for row in panel.chunks_exact_mut(nr) {
                row[width..].fill(0.0);
            }
        } else {
            for (p, row) in panel.chunks_exact_mut(nr).enumerate() {
                for (j, value) in row[..width].iter_mut().enumerate() {
                    *value = flushed(b.data[b.at(p, first + j)]);
                }
                row[width..].fill(0.0);
            }
        }
    }
}

/// `x`, or a zero of its sign if `x` is subnormal (see the module doc): a value whose exponent
/// bits are all zero keeps only its sign bit. Branch-free, so loops over it vectorize.
#[inline(always)]
pub(super) fn flushed(x: f32) -> f32 {
    const EXPONENT: u32 = 0x7f80_0000;
    const SIGN: u32 = 0x8000_0000;
    let bits = x.to_bits();
    f32::from_bits(if bits & EXPONENT == 0 {
        bits & SIGN
    } else {
        bits
    })
}

/// Copies `src` into `dst` (of the same length) through [`flushed`].
fn copy_flushed(dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F is present (`avx512`).
        unsafe { copy_flushed_avx512(dst, src) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 is present (`avx2`).
        unsafe { copy_flushed_avx2(dst, src) };
        return;
    }
    copy_flushed_portable(dst, src);
}

/// [`copy_flushed`] compiled for AVX2 (the loop vectorizes to 8 lanes).
///
/// # Safety
/// The CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_flushed_avx2(dst: &mut [f32], src: &[f32]) {
    copy_flushed_portable(dst, src);
}

/// [`copy_flushed`] compiled for AVX-512F (the loop vectorizes to 16 lanes).
///
/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy_flushed_avx512(dst: &mut [f32], src: &[f32]) {
    copy_flushed_portable(dst, src);
}

#[inline(always)]
fn copy_flushed_portable(dst: &mut [f32], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = flushed(s);
    }
}

/// How many micro-panels ahead the AVX-512 packing of `a` prefetches its rows: the rows of a
/// block are short runs (`kc` values) of rows `k` apart, six at a time, which the hardware
/// prefetchers do not follow.
const AHEAD: usize = 2;

/// Packs the block `rows × depth` of `a` into micro-panels of `mr` rows: value `(i, p)` of
/// micro-panel `r` goes to `r · mr · kc + p · mr + i`; rows past the block are zeros. `out`
/// holds exactly `ceil(rows.len() / mr) · mr · kc` values.
pub(super) fn pack_a(
    a: &MatrixRef,
    rows: Range<usize>,
    depth: Range<usize>,
    mr: usize,
    out: &mut [f32],
) {
    let kc = depth.len();
    debug_assert_eq!(out.len(), rows.len().div_ceil(mr) * mr * kc);
    for (r, panel) in out.chunks_exact_mut(mr * kc).enumerate() {
        let first = rows.start + r * mr;
        let height = mr.min(rows.end - first);
        #[cfg(target_arch = "x86_64")]
        if a.col_stride == 1 && height == mr && mr == kernel_avx512::MR && kc > 0 && avx512() {
            // Rows of `a` are contiguous and the micro-panel full: interleave them 16 columns
            // at a time in registers.
            let starts: [usize; kernel_avx512::MR] =
                std::array::from_fn(|i| a.at(first + i, depth.start));
            // The rows of the micro-panel packed `AHEAD` after this one (the block's last row
            // past its end), whose lines are prefetched meanwhile.
            let ahead: [usize; kernel_avx512::MR] = std::array::from_fn(|i| {
                a.at((first + AHEAD * mr + i).min(rows.end - 1), depth.start)
            });
            // SAFETY: AVX-512F is present (`avx512`); the panel holds `kc · 6` values; row
            // `first + i`'s run of `kc` values from `starts[i]` is inside the view, which
            // `MatrixRef::new` checked lies inside `a.data`.
            unsafe { kernel_avx512::pack_rows6(a.data, starts, ahead, kc, panel) };
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if a.col_stride == 1 && height == mr && mr == kernel_avx2::MR && kc > 0 && avx2() {
            // Rows of `a` are contiguous and the micro-panel full: interleave them 8 columns at
            // a time in registers.
            let starts: [usize; kernel_avx2::MR] =
                std::array::from_fn(|i| a.at(first + i, depth.start));
            // SAFETY: AVX2 is present (`avx2`); the rest is checked by the packer.
            unsafe { kernel_avx2::pack_rows6(a.data, starts, kc, panel) };
            continue;
        }
        if a.col_stride == 1 {
            // Rows of `a` are contiguous: read each row's run once.
            for i in 0..height {
                let start = a.at(first + i, depth.start);
                for (p, &value) in a.data[start..start + kc].iter().enumerate() {
                    panel[p * mr + i] = flushed(value);
                }
            }
            if height < mr {
                for column in panel.chunks_exact_mut(mr) {
                    column[height..].fill(0.0);
                }
            }
        } else if a.row_stride == 1 && height == mr && mr == kernel_avx512::MR && avx512() {
            // Columns are contiguous (a transposed operand, a backward pass's `dYᵀ`) and the
            // micro-panel full: each column's 6 values by one masked load and store (a copy per
            // column, 6 values long, took 6-7% of the train step's weight-gradient products).
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512F is present (`avx512`); the panel holds `kc · 6` values; column
            // `depth.start + p`'s 6 values from `a.at(first, depth.start + p)` (rows `first ..
            // first + 6`, unit stride) are inside the view, which `MatrixRef::new` checked lies
            // inside `a.data`, for every `p < kc`.
            unsafe {
                let start = a.at(first, depth.start);
                kernel_avx512::pack_columns6(a.data, start, a.col_stride as usize, kc, panel)
            };
        } else if a.row_stride == 1 {
            // Columns are contiguous (a transposed operand): one copy per column.
            for (p, column) in panel.chunks_exact_mut(mr).enumerate() {
                let start = a.at(first, depth.start + p);
                copy_flushed(&mut column[..height], &a.data[start..start + height]);
                column[height..].fill(0.0);
            }
        } else {
            for (p, column) in panel.chunks_exact_mut(mr).enumerate() {
                for (i, value) in column[..height].iter_mut().enumerate() {
                    *value = flushed(a.data[a.at(first + i, depth.start + p)]);
                }
                column[height..].fill(0.0);
            }
        }
    }
}

/// Whether a column-contiguous `b` is packed with AVX-512 gathers or transposes: panels a
/// multiple of 16 wide, AVX-512F present, and the offsets of 16 columns within an `i32`.
fn gather_columns(b: &MatrixRef, nr: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && nr.is_multiple_of(16)
        && Kernel::Avx512.is_supported()
        && b.col_stride > 0
        && (b.col_stride as i64) * 15 <= i32::MAX as i64
}

/// Whether a column-contiguous `b` is packed with AVX2 transposes: panels a multiple of 8
/// wide, AVX2 present (and not AVX-512, whose packers come first), columns a positive stride
/// apart.
fn avx2_transposes(b: &MatrixRef, nr: usize) -> bool {
    cfg!(target_arch = "x86_64") && nr.is_multiple_of(8) && avx2() && b.col_stride > 0
}

/// Whether AVX2 is present (detected once).
fn avx2() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| Kernel::Avx2.is_supported())
}

/// Whether column-contiguous panels are packed with gathers (`MINDUCTOR_PACK_GATHER=1`, for
/// comparisons) rather than 16 × 16 register transposes.
fn gather_packing() -> bool {
    static GATHER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GATHER.get_or_init(|| std::env::var("MINDUCTOR_PACK_GATHER").is_ok_and(|v| v == "1"))
}

/// Whether AVX-512F is present (detected once).
fn avx512() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| Kernel::Avx512.is_supported())
}
