//! A linear layer's product `c = a · wᵀ` with the weight `w` read in place: computed as
//! `cᵀ = w · aᵀ`, the AVX-512 kernel broadcasting from `MR` rows of `w` (each row a contiguous
//! run along `k`) against `aᵀ` packed in panels of `NR` rows of `a`, each tile stored back
//! transposed ([`super::kernel_avx512::tile_weight_rows`]).
//!
//! Why: the other paths need `b = wᵀ` in panels of `NR` columns, `k` deep, which for a weight
//! stored `[n, k]` means transposing all of it on every call (`pack_columns_transposed`: 6% of a
//! one-thread profile of the MLP workload, a 16 MiB weight per product). Here only `a` is packed,
//! `m · k` values, which is small where this path is taken (a short `a`, [`prefers`]).
//!
//! Every element of `c` sums the same products in the same order as [`super::multiply_streaming`]
//! and [`super::multiply_parallel`] do (the same depth blocks, `fma(w, a, acc) = fma(a, w, acc)`,
//! the blocks added to `c` in order), so the bits are theirs for any thread count, except where
//! `w` holds subnormal values: the packers store those as zeros, this path multiplies them as
//! they are (a subnormal's share of a sum is below 1.2e-38 times the other factor).

use super::kernel_avx512::{tile_weight_rows, RowsTileArgs, MR, NR};
use super::{AlignedBuffer, GemmError, Kernel, MatrixMut, MatrixRef, PackedB, SharedOutput};
use crate::scratch::FirstError;

/// Whether [`multiply_weight_rows`] should compute `a · b` of `m × k` by `k × n` with `kernel`,
/// `a`'s columns `a_col_stride` apart and `b`'s rows and columns `b_strides` apart: `b` is a
/// weight read transposed (row stride 1, its columns runs of `k`), `a`'s rows are contiguous,
/// the kernel is the AVX-512 one, `a` is short beside `w` (`a` packed transposed is at most a
/// quarter of the values of `w`, so its packing costs at most a quarter of what `w`'s would),
/// and all of `aᵀ` packed fits in three quarters of L2, where every group of micro-panels
/// reads it. Measured on an Intel Xeon of family 6 model 167 (2 MiB L2), `gemm_shapes`,
/// alternated runs against the streamed path: the MLP's up projection [256x1024]·[1024x4096]
/// (1 MiB of `aᵀ`) 11.0-11.2 against 11.6-11.8 ms at one thread and 5.4-5.7 against 5.5-6.0
/// at two; its down projection [256x4096]·[4096x1024] (4 MiB, past the L2) lost at two
/// threads, 5.7-6.1 against 5.6-6.1, and is left to the streamed path.
///
/// The answer depends on the shapes and the cache sizes, never on the thread count, so the
/// bits of a product are the same on any number of threads.
pub fn prefers(
    kernel: Kernel,
    [m, k, n]: [usize; 3],
    a_col_stride: i64,
    [b_row_stride, b_col_stride]: [i64; 2],
) -> bool {
    let packed_a_bytes = m.div_ceil(NR) * NR * k * std::mem::size_of::<f32>();
    kernel == Kernel::Avx512
        && super::weight_rows_enabled()
        && b_row_stride == 1
        && b_col_stride >= k as i64
        && a_col_stride == 1
        && m >= NR
        && m * 4 <= n
        && k > 0
        && crate::cache::l2_bytes().is_none_or(|l2| packed_a_bytes <= l2 / 4 * 3)
}

/// The micro-panels of `w` (`MR` columns of `c` each, of `n`) that thread `t` of `threads`
/// computes: an even share, whole micro-panels.
fn share(n: usize, t: usize, threads: usize) -> std::ops::Range<usize> {
    let micro_panels = n.div_ceil(MR);
    micro_panels * t / threads..micro_panels * (t + 1) / threads
}

/// The multiply-adds of each thread's piece of an `m × k × n` product on `threads` threads
/// (the partition report).
pub fn pieces([m, k, n]: [usize; 3], threads: usize) -> Vec<u64> {
    let threads = threads.max(1);
    (0..threads)
        .map(|t| {
            let micro = share(n, t, threads);
            let columns = (micro.end * MR).min(n).saturating_sub(micro.start * MR);
            (m * k * columns) as u64
        })
        .collect()
}

/// `c = a · b` for `b` a weight read transposed (see the module), on `threads` threads: `aᵀ`
/// packed first (its panels split across the threads), then each thread takes a run of the
/// micro-panels of `w` (`MR` of its rows, `MR` columns of `c`) and, a group of them at a time,
/// runs every depth block of them against every panel of `aᵀ`. `Unsupported` unless `kernel`
/// is the AVX-512 one on a CPU that has it and `b`'s columns are contiguous runs (row stride 1)
/// at a positive distance from one another.
pub fn multiply_weight_rows(
    kernel: Kernel,
    a: &MatrixRef,
    b: &MatrixRef,
    c: &mut MatrixMut,
    threads: usize,
) -> Result<(), GemmError> {
    // (Rows of `w` must follow one another forwards: the kernel steps from one to the next.)
    if kernel != Kernel::Avx512 || !kernel.is_supported() || b.row_stride != 1 || b.col_stride <= 0
    {
        return Err(GemmError::Unsupported(kernel));
    }
    if super::trivial_product(a, b.shape(), c)? {
        return Ok(());
    }
    let ([m, k], n) = (a.shape(), c.cols);
    let threads = threads.max(1);
    // `aᵀ`, `k × m`: element `(p, r)` is `a[r][p]`.
    let a_t = MatrixRef {
        data: a.data,
        offset: a.offset,
        rows: k,
        cols: m,
        row_stride: a.col_stride,
        col_stride: a.row_stride,
    };
    let packed = PackedB::pack(&a_t, kernel, threads)?;
    let (panels, blocks, kc_block) = (m.div_ceil(NR), packed.blocks, kernel.kc(k));
    let Group {
        micro_panels: group,
        stride,
    } = group(m, crate::cache::l2_bytes());
    let c_pointer = SharedOutput(c.data.as_mut_ptr());
    let ldc = c.row_stride;
    let ldw = b.col_stride as usize;
    let failed = FirstError::new();
    let run = |t: usize| {
        let mine = share(n, t, threads);
        failed.record(STAGING.with(|cell| {
            let mut staging = cell.take();
            if let Err(e) = staging.prepare(m * stride, "staged tiles") {
                cell.set(staging);
                return Err(e.into());
            }
            let staged = staging.as_mut_slice();
            // Groups of equal size (no short last group reading all of `aᵀ` for little work).
            let groups = mine.len().div_ceil(group).max(1);
            let group = mine.len().div_ceil(groups).max(1);
            let mut first = mine.start;
            while first < mine.end {
                let end = (first + group).min(mine.end);
                let (j_first, width) = (first * MR, (end * MR).min(n) - first * MR);
                for depth in 0..blocks {
                    let p0 = depth * kc_block;
                    let kc = kc_block.min(k - p0);
                    for micro in first..end {
                        let j0 = micro * MR;
                        for panel in 0..panels {
                            let r0 = panel * NR;
                            let args = RowsTileArgs {
                                kc,
                                // Row `j0` of `w` from depth `p0`: element `(p0, j0)` of `b`.
                                w: b.data[b.at(p0, j0)..].as_ptr(),
                                ldw,
                                b: packed.block(panel, depth).as_ptr(),
                                c: staged[r0 * stride + (j0 - j_first)..].as_mut_ptr(),
                                ldc: stride,
                                rows: MR.min(n - j0),
                                cols: NR.min(m - r0),
                                accumulate: depth > 0,
                            };
                            // SAFETY: AVX-512F is present (checked above). Rows `j0 .. j0 +
                            // rows` of `w` hold `kc` values each from `p0` (element `(p0 + p,
                            // j0 + i)` of `b`, at `b.at(p0, j0) + i · ldw + p`, inside the view
                            // `MatrixRef::new` checked); the block holds `kc · NR` values; the
                            // staged rows `r0 .. r0 + cols < m`, columns `j0 - j_first .. + rows
                            // ≤ width ≤ stride` lie inside this thread's `m · stride` values.
                            unsafe { tile_weight_rows(&args) };
                        }
                    }
                }
                for r in 0..m {
                    // SAFETY: row `r < m`, columns `j_first .. j_first + width ≤ n` of `c`
                    // (checked by `MatrixMut::new`), which only this thread writes (the
                    // columns of its own micro-panels).
                    let row = unsafe {
                        std::slice::from_raw_parts_mut(
                            c_pointer.get().add(r * ldc + j_first),
                            width,
                        )
                    };
                    row.copy_from_slice(&staged[r * stride..][..width]);
                }
                first = end;
            }
            let checked = staging.check("staged tiles");
            cell.set(staging);
            Ok(checked?)
        }));
    };
    if threads == 1 {
        run(0);
    } else {
        minductor_runtime::threads::for_each_chunk(threads, run);
    }
    failed.into_result()
}

thread_local! {
    /// Each thread's tiles of `c` for one group of micro-panels in [`multiply_weight_rows`], kept
    /// between calls.
    static STAGING: std::cell::Cell<AlignedBuffer> =
        const { std::cell::Cell::new(AlignedBuffer::new()) };
}

/// How [`multiply_weight_rows`] groups the micro-panels of `w`.
struct Group {
    /// Micro-panels taken through every depth block together.
    micro_panels: usize,
    /// Values per row of the staging buffer their tiles of `c` go to.
    stride: usize,
}

/// The groups for `a` of `m` rows on a core whose L2 holds `l2` bytes (unknown: 1 MiB): as
/// many micro-panels as keep their tiles of `c` (`m` rows of `MR` values each) in a quarter of
/// the L2 beside a depth block of `aᵀ`. The tiles are staged in rows of their own rather than
/// written to `c`: a tile's 64 rows of `c` are `ldc` apart, which for a power-of-two width
/// (the MLP's 4096) puts all of them in one set of the L1 cache, and its stores evicted one
/// another (measured: `gemm_shapes`, one thread, [256x1024]·[1024x4096] ran at the speed of the
/// streamed path, [256x1000]·[1000x4000] 7% faster). The staging rows are an odd number of
/// cache lines long, so that they spread over the sets.
fn group(m: usize, l2: Option<usize>) -> Group {
    let l2 = l2.unwrap_or(1 << 20);
    let values = l2 / 4 / std::mem::size_of::<f32>() / m.max(1);
    let micro_panels = (values.saturating_sub(32) / MR).max(1);
    let stride = (micro_panels * MR).div_ceil(32) * 32 + 16;
    Group {
        micro_panels,
        stride,
    }
}
