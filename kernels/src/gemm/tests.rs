//! Differential tests of the GEMM against a naive triple loop accumulated in f64, for every
//! kernel this CPU supports, at sizes around the register tile and the cache blocks, with
//! transposed, strided and reversed operands.
//!
//! Tolerance: a dot product of length `k` summed in f32 (in any order, FMA or not) is within
//! `k · ε · Σ_p |a_ip · b_pj|` of the exact value (ε = 2⁻²³, the standard γ_k bound with room to
//! spare); the test allows that plus 1e-30 for sums of zeros.

use super::*;

/// The sizes every dimension is tried at: around the micro-tiles (4, 6, 16, 64) and blocks.
const SIZES: [usize; 14] = [0, 1, 2, 3, 5, 15, 16, 17, 31, 33, 63, 65, 127, 129];

/// How an operand is laid out in its buffer.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Row-major, contiguous.
    RowMajor,
    /// Stored as its transpose (column-major), seen through a transposed view.
    Transposed,
    /// Every other column of a wider row-major matrix, after an offset of 7.
    Strided,
    /// Rows in reverse order (a negative row stride).
    Reversed,
}

const LAYOUTS: [Layout; 4] = [
    Layout::RowMajor,
    Layout::Transposed,
    Layout::Strided,
    Layout::Reversed,
];

/// Deterministic values in [-1, 1) (the Winograd tests draw theirs here too).
pub(super) fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A buffer holding a `rows × cols` matrix in `layout`, with the offset and strides to view it.
fn operand(rows: usize, cols: usize, layout: Layout, seed: u64) -> (Vec<f32>, i64, [i64; 2]) {
    let (r, c) = (rows as i64, cols as i64);
    match layout {
        Layout::RowMajor => (values(rows * cols, seed), 0, [c, 1]),
        Layout::Transposed => (values(rows * cols, seed), 0, [1, r]),
        Layout::Strided => (values(7 + rows * (2 * cols + 1), seed), 7, [2 * c + 1, 2]),
        Layout::Reversed => (values(rows * cols, seed), (r - 1).max(0) * c, [-c, 1]),
    }
}

/// Element `(i, j)` of a view, read through its strides directly.
fn element(data: &[f32], offset: i64, strides: [i64; 2], i: usize, j: usize) -> f64 {
    data[(offset + i as i64 * strides[0] + j as i64 * strides[1]) as usize] as f64
}

/// Computes `a · b` with `kernel` on `threads` threads into a NaN-filled output and compares
/// every element with the f64 triple loop.
fn check(kernel: Kernel, [m, k, n]: [usize; 3], layouts: [Layout; 2], threads: usize) {
    let context = format!("{kernel:?} {m}x{k}x{n} {layouts:?} on {threads} threads");
    check_product([m, k, n], layouts, n, &context, |a, b, c| {
        sgemm_with(kernel, a, b, c, threads).unwrap()
    });
}

/// Runs `multiply` on `a` and `b` (`m × k` and `k × n` in `layouts`) into a NaN-filled output
/// whose rows are `ldc` apart, and compares every element with the f64 triple loop (and the
/// elements past each row's `n` with NaN: a product writes only its own columns).
fn check_product(
    [m, k, n]: [usize; 3],
    layouts: [Layout; 2],
    ldc: usize,
    context: &str,
    multiply: impl FnOnce(&MatrixRef, &MatrixRef, &mut MatrixMut),
) {
    let (a_data, a_offset, a_strides) = operand(m, k, layouts[0], (m * 1000 + k) as u64);
    let (b_data, b_offset, b_strides) = operand(k, n, layouts[1], (k * 1000 + n + 7) as u64);
    let a = MatrixRef::new(&a_data, a_offset, [m, k], a_strides, "a").unwrap();
    let b = MatrixRef::new(&b_data, b_offset, [k, n], b_strides, "b").unwrap();
    let mut c_data = vec![f32::NAN; m * ldc];
    let mut c = MatrixMut::new(&mut c_data, [m, n], ldc).unwrap();
    multiply(&a, &b, &mut c);
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut magnitude) = (0f64, 0f64);
            for p in 0..k {
                let x = element(&a_data, a_offset, a_strides, i, p)
                    * element(&b_data, b_offset, b_strides, p, j);
                exact += x;
                magnitude += x.abs();
            }
            let found = c_data[i * ldc + j] as f64;
            let tolerance = k as f64 * f32::EPSILON as f64 * magnitude + 1e-30;
            assert!(
                (found - exact).abs() <= tolerance,
                "{context}: c[{i}, {j}] = {found}, expected {exact} within {tolerance}"
            );
        }
        assert!(
            c_data[i * ldc + n..(i + 1) * ldc]
                .iter()
                .all(|v| v.is_nan()),
            "{context}: wrote past its columns"
        );
    }
}

fn supported_kernels() -> Vec<Kernel> {
    let kernels: Vec<Kernel> = Kernel::ALL
        .into_iter()
        .filter(|k| k.is_supported())
        .collect();
    assert!(kernels.contains(&Kernel::Portable));
    kernels
}

#[test]
fn every_kernel_matches_the_naive_product_at_every_odd_size() {
    for kernel in supported_kernels() {
        for m in SIZES {
            for k in SIZES {
                for n in SIZES {
                    check(kernel, [m, k, n], [Layout::RowMajor; 2], 1);
                }
            }
        }
    }
}

#[test]
fn transposed_strided_and_reversed_operands_are_read_through_their_strides() {
    for kernel in supported_kernels() {
        for a_layout in LAYOUTS {
            for b_layout in LAYOUTS {
                for m in [0, 1, 5, 17, 65] {
                    for k in [0, 1, 16, 33] {
                        for n in [1, 15, 65, 129] {
                            check(kernel, [m, k, n], [a_layout, b_layout], 1);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn sizes_past_one_cache_block_in_every_dimension() {
    // m crosses MC = 264 (two blocks, the second with a short micro-panel); k crosses the
    // depth blocks (`Kernel::kc`: at most 128 to 512 deep, by kernel and L2 size) several
    // times with a short last block, or once by one.
    for kernel in supported_kernels() {
        check(kernel, [301, 600, 130], [Layout::RowMajor; 2], 1);
        check(kernel, [265, 129, 65], [Layout::Transposed; 2], 1);
        check(
            kernel,
            [70, 1100, 67],
            [Layout::RowMajor, Layout::Transposed],
            2,
        );
        check(
            kernel,
            [13, 513, 70],
            [Layout::Strided, Layout::RowMajor],
            1,
        );
        check(
            kernel,
            [7, 257, 65],
            [Layout::Transposed, Layout::RowMajor],
            1,
        );
    }
}

#[test]
fn depth_blocks_are_equal_within_the_maximum_and_cover_k() {
    for kernel in Kernel::ALL {
        let most = kernel.kc(1 << 20);
        assert!((16..=512).contains(&most), "{kernel:?}: {most}");
        for k in (1..3000).chain([4096, 4097, 11008]) {
            let kc = kernel.kc(k);
            let blocks = k.div_ceil(kc);
            assert!(kc >= 1 && kc <= most, "{kernel:?} k {k}: kc {kc}");
            // The fewest blocks of at most `most`, none of them empty.
            assert_eq!(blocks, k.div_ceil(most), "{kernel:?} k {k}: kc {kc}");
            assert!((blocks - 1) * kc < k, "{kernel:?} k {k}: kc {kc}");
        }
    }
}

#[test]
fn results_are_the_same_bits_on_any_number_of_threads() {
    // Rows split (tall a), columns split (short a), and streamed; k over several depth blocks.
    for kernel in supported_kernels() {
        for [m, k, n] in [[203, 1100, 90], [5, 1100, 700], [61, 700, 333]] {
            let a_data = values(m * k, 3);
            let b_data = values(k * n, 4);
            let a = MatrixRef::row_major(&a_data, m, k).unwrap();
            let b = MatrixRef::new(&b_data, 0, [k, n], [1, k as i64], "b").unwrap();
            let run = |threads: usize, streamed: bool| {
                let mut out = vec![f32::NAN; m * n];
                let mut c = MatrixMut::row_major(&mut out, m, n).unwrap();
                if streamed {
                    multiply_streaming(kernel, &a, &b, &mut c, threads).unwrap();
                } else {
                    let packed = PackedB::lazy(&b, kernel).unwrap();
                    multiply_parallel(&a, &packed, &mut c, threads).unwrap();
                }
                bits(&out)
            };
            let one = run(1, false);
            // 5 and 8 threads: more threads than depth blocks, so the streamed path packs `a`
            // in runs of micro-panels.
            for threads in [1, 2, 3, 5, 8] {
                for streamed in [false, true] {
                    assert!(
                        run(threads, streamed) == one,
                        "{kernel:?} {m}x{k}x{n}, {threads} threads, streamed {streamed}"
                    );
                }
            }
        }
    }
}

#[test]
fn threads_split_rows_or_columns_without_changing_the_result() {
    for kernel in supported_kernels() {
        for threads in [2, 3] {
            // Enough rows: split by rows (with a ragged last part).
            check(
                kernel,
                [203, 70, 90],
                [Layout::RowMajor, Layout::Transposed],
                threads,
            );
            // Few rows and many columns: split by columns.
            check(kernel, [5, 70, 700], [Layout::RowMajor; 2], threads);
            check(kernel, [1, 3, 1], [Layout::RowMajor; 2], threads);
        }
    }
}

#[test]
fn a_batch_of_products_at_offsets_into_one_buffer() {
    // Attention's [2, 3, 17, 8] @ [2, 3, 8, 17]: each matrix of the batch is a view at an offset
    // into the same buffer, as `run_matmul` hands them over; here the second operand is the
    // transpose of a [2, 3, 17, 8] tensor.
    let (batch, m, k, n) = (6, 17, 8, 17);
    let a_data = values(batch * m * k, 1);
    let b_data = values(batch * n * k, 2);
    let mut c_data = vec![f32::NAN; batch * m * n];
    for kernel in supported_kernels() {
        for (index, c_part) in c_data.chunks_exact_mut(m * n).enumerate() {
            let a = MatrixRef::new(&a_data, (index * m * k) as i64, [m, k], [k as i64, 1], "a");
            let b = MatrixRef::new(&b_data, (index * n * k) as i64, [k, n], [1, k as i64], "b");
            let mut c = MatrixMut::row_major(c_part, m, n).unwrap();
            sgemm_with(kernel, &a.unwrap(), &b.unwrap(), &mut c, 1).unwrap();
        }
        for index in 0..batch {
            for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
                let exact: f64 = (0..k)
                    .map(|p| {
                        a_data[index * m * k + i * k + p] as f64
                            * b_data[index * n * k + j * k + p] as f64
                    })
                    .sum();
                let found = c_data[index * m * n + i * n + j] as f64;
                assert!(
                    (found - exact).abs() <= k as f64 * 1e-6,
                    "{kernel:?} {index} {i} {j}"
                );
            }
        }
    }
}

#[test]
fn views_reaching_outside_their_buffer_are_refused_once_up_front() {
    let data = vec![0f32; 12];
    assert!(MatrixRef::new(&data, 0, [3, 4], [4, 1], "a").is_ok());
    assert_eq!(
        MatrixRef::new(&data, 1, [3, 4], [4, 1], "a").unwrap_err(),
        GemmError::OutOfBounds {
            what: "a",
            low: 1,
            high: 12,
            len: 12
        }
    );
    assert!(MatrixRef::new(&data, -1, [3, 4], [4, 1], "a").is_err());
    assert!(MatrixRef::new(&data, 8, [3, 4], [-4, 1], "a").is_ok());
    // An empty view reads nothing, wherever it points.
    assert!(MatrixRef::new(&data, 100, [0, 4], [4, 1], "a").is_ok());
    let mut out = vec![0f32; 11];
    assert!(MatrixMut::row_major(&mut out, 3, 4).is_err());
    assert!(MatrixMut::new(&mut out, [3, 3], 4).is_ok());
}

#[test]
fn mismatched_shapes_are_an_error() {
    let data = vec![1f32; 64];
    let a = MatrixRef::row_major(&data, 2, 3).unwrap();
    let b = MatrixRef::row_major(&data, 4, 5).unwrap();
    let mut out = vec![0f32; 10];
    let mut c = MatrixMut::row_major(&mut out, 2, 5).unwrap();
    assert_eq!(
        sgemm(&a, &b, &mut c, 1).unwrap_err(),
        GemmError::Shape {
            a: [2, 3],
            b: [4, 5],
            c: [2, 5]
        }
    );
}

/// The bits of `values`, to compare results exactly.
fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// An `x · wᵀ` product of `m × k` by `k × n` (`a` row-major, `b` the transpose of a row-major
/// `[n, k]`, from `seed` and `seed + 1`): `a`'s and `b`'s values, and the packed path's product
/// on one thread, which every other path must match bit for bit.
fn linear_layer_product(kernel: Kernel, [m, k, n]: [usize; 3], seed: u64) -> [Vec<f32>; 3] {
    let (a_data, _, _) = operand(m, k, Layout::RowMajor, seed);
    let (b_data, _, _) = operand(n, k, Layout::RowMajor, seed + 1);
    let a = MatrixRef::row_major(&a_data, m, k).unwrap();
    let b = MatrixRef::row_major(&b_data, n, k).unwrap().t();
    let mut expected = vec![f32::NAN; m * n];
    let mut c = MatrixMut::row_major(&mut expected, m, n).unwrap();
    multiply_parallel(&a, &PackedB::lazy(&b, kernel).unwrap(), &mut c, 1).unwrap();
    [a_data, b_data, expected]
}

/// `c = a · b` through [`multiply_streaming`] and through [`PackedB`] and [`multiply_parallel`],
/// into NaN-filled outputs: the same bits, and both within the tolerance of [`check`] (which
/// goes through `sgemm_with`, whichever path it picks).
fn check_streaming(kernel: Kernel, [m, k, n]: [usize; 3], layouts: [Layout; 2], threads: usize) {
    check(kernel, [m, k, n], layouts, threads);
    let (a_data, a_offset, a_strides) = operand(m, k, layouts[0], (m * 1000 + k) as u64);
    let (b_data, b_offset, b_strides) = operand(k, n, layouts[1], (k * 1000 + n + 7) as u64);
    let a = MatrixRef::new(&a_data, a_offset, [m, k], a_strides, "a").unwrap();
    let b = MatrixRef::new(&b_data, b_offset, [k, n], b_strides, "b").unwrap();
    let mut streamed = vec![f32::NAN; m * n];
    let mut c = MatrixMut::row_major(&mut streamed, m, n).unwrap();
    multiply_streaming(kernel, &a, &b, &mut c, threads).unwrap();
    let mut packed = vec![f32::NAN; m * n];
    let mut c = MatrixMut::row_major(&mut packed, m, n).unwrap();
    multiply_parallel(&a, &PackedB::lazy(&b, kernel).unwrap(), &mut c, threads).unwrap();
    assert!(
        bits(&streamed) == bits(&packed),
        "{kernel:?} {m}x{k}x{n} {layouts:?} on {threads} threads: streamed and packed differ"
    );
    // Streamed over a `b` packed beforehand (a frozen weight), whole or not yet.
    for prepacked in [
        PackedB::pack(&b, kernel, threads).unwrap(),
        PackedB::lazy(&b, kernel).unwrap(),
    ] {
        let mut out = vec![f32::NAN; m * n];
        let mut c = MatrixMut::row_major(&mut out, m, n).unwrap();
        multiply_streaming_packed(&a, &prepacked, &mut c, threads).unwrap();
        assert!(
            bits(&out) == bits(&packed),
            "{kernel:?} {m}x{k}x{n} {layouts:?} on {threads} threads: streamed over packed b \
             and packed differ"
        );
    }
}

#[test]
fn streaming_matches_the_packed_path_bit_for_bit_at_tail_sizes_and_odd_strides() {
    // Sizes around the register tile (6 or 4 rows, 16 or 64 columns) and a depth block, every
    // layout of either operand, 1 to 3 threads (fewer panels than threads included).
    for kernel in supported_kernels() {
        for a_layout in LAYOUTS {
            for b_layout in LAYOUTS {
                for [m, k, n] in [
                    [0, 5, 70],
                    [3, 0, 70],
                    [1, 1, 1],
                    [5, 17, 65],
                    [7, 129, 130],
                    [13, 257, 200],
                    // Several depth blocks at any block size (up to 512 deep).
                    [9, 1100, 70],
                ] {
                    for threads in [1, 2, 3, 7] {
                        check_streaming(kernel, [m, k, n], [a_layout, b_layout], threads);
                    }
                }
            }
        }
        // The MLP's short `a` against a wide transposed `b`, with tails in every dimension.
        check_streaming(
            kernel,
            [61, 300, 333],
            [Layout::RowMajor, Layout::Transposed],
            2,
        );
    }
}

#[test]
fn streamed_panels_in_groups_through_the_depth_blocks_give_the_same_bits() {
    // Every depth block of a group of panels before the next group: any group size (1, one
    // not dividing the panels, more than a piece has) gives the bits of the packed path, on 1
    // and 2 threads, with `b` packed per block or beforehand.
    for kernel in supported_kernels() {
        let [m, k, n] = [13, 1100, 7 * kernel.nr() - 5];
        let [a_data, b_data, expected] = linear_layer_product(kernel, [m, k, n], 5);
        let a = MatrixRef::row_major(&a_data, m, k).unwrap();
        let b = MatrixRef::row_major(&b_data, n, k).unwrap().t();
        let prepacked = PackedB::pack(&b, kernel, 1).unwrap();
        for group in [1, 2, 3, 100] {
            for threads in [1, 2] {
                for source in [BlockSource::Pack(&b), BlockSource::Packed(&prepacked)] {
                    let mut out = vec![f32::NAN; m * n];
                    let mut c = MatrixMut::row_major(&mut out, m, n).unwrap();
                    stream(kernel, &a, source, &mut c, threads, Some(group), None).unwrap();
                    assert!(
                        bits(&out) == bits(&expected),
                        "{kernel:?}, groups of {group} panels, {threads} threads"
                    );
                }
            }
        }
    }
}

#[test]
fn both_operands_shared_give_the_packed_paths_bits_for_any_cut() {
    // Cuts in rows only, panels only and both (uneven ones, one piece, more pieces than
    // threads), `b` packed lazily by the pieces or beforehand, with tails in every dimension
    // and several depth blocks: every tile sums what the packed path sums, in its order.
    for kernel in supported_kernels() {
        let [m, k, n] = [37, 1100, 5 * kernel.nr() - 3];
        let [a_data, b_data, expected] = linear_layer_product(kernel, [m, k, n], 7);
        let a = MatrixRef::row_major(&a_data, m, k).unwrap();
        let b = MatrixRef::row_major(&b_data, n, k).unwrap().t();
        let tiles = [kernel.mr(), kernel.nr()];
        for (row_groups, panel_groups) in [(1, 1), (7, 1), (1, 5), (3, 2), (7, 5)] {
            let split = ProductSplit::with_groups([m, n], tiles, row_groups, panel_groups);
            for threads in [1, 2, 3] {
                for lazy in [true, false] {
                    let packed = if lazy {
                        PackedB::lazy(&b, kernel).unwrap()
                    } else {
                        PackedB::pack(&b, kernel, threads).unwrap()
                    };
                    let mut out = vec![f32::NAN; m * n];
                    let mut c = MatrixMut::row_major(&mut out, m, n).unwrap();
                    multiply_shared(&a, &packed, &mut c, &split, threads).unwrap();
                    assert!(
                        bits(&out) == bits(&expected),
                        "{kernel:?}, {row_groups} x {panel_groups} pieces, {threads} threads, \
                         lazy {lazy}"
                    );
                }
            }
        }
        // A cut of another product is an error, not a wrong answer.
        let other = ProductSplit::with_groups([m + 1, n], tiles, 2, 2);
        let packed = PackedB::lazy(&b, kernel).unwrap();
        let mut out = vec![0f32; m * n];
        let mut c = MatrixMut::row_major(&mut out, m, n).unwrap();
        assert!(matches!(
            multiply_shared(&a, &packed, &mut c, &other, 2),
            Err(GemmError::Shape { .. })
        ));
    }
}

#[test]
fn a_cut_with_both_operands_shared_evens_out_171_micro_panels_on_64_threads() {
    // The LLaMA block's projections, [1024 x 512] · [512 x 512], on 64 threads: the packed
    // path's cut leaves some threads 3 micro-panels of rows and others 2; with nothing packed
    // per piece the cut goes in two dimensions and the slowest thread's share is within 4% of
    // the mean. On 2 threads either cut is even.
    let ([m, n, k], tiles) = ([1024, 512, 512], [6, 64]);
    let mean = |threads: usize| (m * n * k / threads) as f64;
    let slowest = |shared: Shared, threads: usize| {
        let split = ProductSplit::choose([m, n, k], tiles, threads, shared);
        split.slowest_thread(k, threads) as f64 / mean(threads)
    };
    assert!(slowest(Shared::B, 64) > 1.1, "{}", slowest(Shared::B, 64));
    assert!(
        slowest(Shared::Neither, 64) < 1.04,
        "{}",
        slowest(Shared::Neither, 64)
    );
    assert!(slowest(Shared::B, 2) < 1.01 && slowest(Shared::Neither, 2) < 1.01);
}

#[test]
fn streamed_panels_go_in_groups_once_packed_a_outgrows_l2() {
    const M: usize = 1 << 20;
    // (case, rows, k, kc, nr, L2, panels per group)
    let cases = [
        // The MLP's up projection: 258 × 1024 packed (1 MiB) fits 1.5 MiB, one panel at a time.
        ("MLP up, 2 MiB L2", 258, 1024, 512, 64, Some(2 * M), 1),
        // Its down projection, 4 MiB of `a`: 1.5 MiB less a 516 KiB block of `a` and a 128 KiB
        // block of `b`, over 64.5 KiB of `c` per panel.
        ("MLP down, 2 MiB L2", 258, 4096, 512, 64, Some(2 * M), 13),
        // On 1 MiB the 768 KiB left room for one panel's tile beside the blocks.
        ("MLP down, 1 MiB L2", 258, 4096, 512, 64, Some(M), 1),
        (
            "MLP down, 1 MiB L2, 128 deep",
            258,
            4096,
            128,
            64,
            Some(M),
            9,
        ),
        // No room beside the blocks: still one panel at a time, never zero.
        ("tall, 1 MiB L2", 1024, 4096, 512, 64, Some(M), 1),
        ("unknown L2", 258, 4096, 512, 64, None, 1),
    ];
    for (case, rows, k, kc, nr, l2, expected) in cases {
        assert_eq!(panels_per_group(rows, k, kc, nr, l2), expected, "{case}");
    }
}

#[test]
fn packed_micro_panels_of_a_hold_every_value_in_place() {
    // Rows of 6 (the AVX-512 interleave when the CPU has it) and of 4, at depths around 16,
    // from a wider row-major matrix at an offset, with a short last micro-panel.
    let (rows, cols) = (13, 75);
    let data = values(rows * cols + 3, 9);
    let a = MatrixRef::new(&data, 3, [rows, cols], [cols as i64, 1], "a").unwrap();
    for mr in [6, 4] {
        for depth in [0..1, 0..15, 1..17, 2..34, 5..75, 0..64] {
            let kc = depth.len();
            let mut out = vec![f32::NAN; rows.div_ceil(mr) * mr * kc];
            pack::pack_a(&a, 0..rows, depth.clone(), mr, &mut out);
            for (r, panel) in out.chunks_exact(mr * kc).enumerate() {
                for p in 0..kc {
                    for i in 0..mr {
                        let row = r * mr + i;
                        let want = if row < rows {
                            data[3 + row * cols + depth.start + p]
                        } else {
                            0.0
                        };
                        assert_eq!(
                            panel[p * mr + i].to_bits(),
                            want.to_bits(),
                            "mr {mr} depth {depth:?}: row {row}, column {p}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn packed_panels_of_a_transposed_b_hold_every_value_in_place() {
    // A column-contiguous `b` (`x · wᵀ`'s `wᵀ`) from a wider buffer at an offset, at depths
    // around the 8 × 8 and 16 × 16 register transposes (the AVX2 and AVX-512 packers where the
    // CPU has them), with a partial last panel; panels of 8, 16 and 64 columns.
    let n = 37;
    for k in [1, 7, 8, 9, 15, 16, 17, 40] {
        let ld = k + 3;
        let data = values(n * ld + 5, 4);
        let b = MatrixRef::new(&data, 5, [k, n], [1, ld as i64], "b").unwrap();
        for nr in [8, 16, 64] {
            let panels = n.div_ceil(nr);
            let mut out = vec![f32::NAN; panels * k * nr];
            pack::pack_b(&b, nr, 0, &mut out);
            for (q, panel) in out.chunks_exact(k * nr).enumerate() {
                for p in 0..k {
                    for j in 0..nr {
                        let column = q * nr + j;
                        let want = if column < n {
                            data[5 + column * ld + p]
                        } else {
                            0.0
                        };
                        assert_eq!(
                            panel[p * nr + j].to_bits(),
                            want.to_bits(),
                            "k {k} nr {nr}: row {p}, column {column}"
                        );
                    }
                }
            }
        }
    }
}

/// A packing buffer the allocator cannot give (4 TiB) is a typed error, not an abort, and the
/// pool still serves an ordinary request afterwards.
#[test]
fn a_packing_buffer_too_large_to_allocate_is_out_of_memory() {
    match AlignedBuffer::take(1 << 40, "b") {
        Err(GemmError::OutOfMemory { bytes, what }) => {
            assert_eq!((bytes, what), (4 << 40, "b"));
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("a 4 TiB packing buffer was allocated"),
    }
    let mut buffer = AlignedBuffer::take(100, "b").unwrap();
    assert_eq!(buffer.as_mut_slice().len(), 100);
    give_back(buffer);
}

#[test]
fn the_depth_blocking_follows_the_cache_sizes_of_known_cpus() {
    const K: usize = 1 << 10;
    const M: usize = 1 << 20;
    // (CPU, L1d, L2 per core, the deepest block of `a` for the AVX-512 kernel)
    let cpus = [
        // A 48 KiB L1d holds a 128-deep panel of `b`: it stays there, unless the L2 holds
        // 2 MiB.
        ("Zen 5", Some(48 * K), Some(M), 128),
        ("Ice Lake-SP", Some(48 * K), Some(M + M / 4), 128),
        ("Zen 5, L2 unknown", Some(48 * K), None, 128),
        ("Sapphire Rapids", Some(48 * K), Some(2 * M), 512),
        // A 32 KiB L1d does not: as deep as the block of `a` and a panel fit 2/3 of L2.
        ("Zen 4", Some(32 * K), Some(M), 512),
        ("Skylake-SP", Some(32 * K), Some(M), 512),
        ("Zen 4c (L2 1 MiB), L1d unknown", None, Some(M), 512),
        ("a 512 KiB L2", Some(32 * K), Some(512 * K), 256),
        ("a 256 KiB L2", Some(32 * K), Some(256 * K), 128),
        ("unknown caches", None, None, 256),
    ];
    for (cpu, l1d, l2, expected) in cpus {
        let kc = avx512_kc_max_for(l1d, l2);
        assert_eq!(kc, expected, "{cpu}");
        // The block of `a` and one panel of `b` fit two thirds of L2 (unless at the least).
        if let (Some(l2), true) = (l2, kc > 128) {
            assert!((MC + kernel_avx512::NR) * kc * 4 <= l2 * 2 / 3, "{cpu}");
        }
    }
}

#[test]
fn the_avx2_depth_blocking_follows_the_cache_sizes_of_known_cpus() {
    const K: usize = 1 << 10;
    // (CPU, L1d, L2 per core, the deepest block of `a` for the AVX2 kernel)
    let cpus = [
        ("Haswell / Skylake client", Some(32 * K), Some(256 * K), 128),
        ("Zen 2 / Zen 3", Some(32 * K), Some(512 * K), 192),
        (
            "an AVX2 core with 1 MiB of L2",
            Some(32 * K),
            Some(1024 * K),
            256,
        ),
        (
            "a 48 KiB L1d and 2 MiB of L2",
            Some(48 * K),
            Some(2048 * K),
            384,
        ),
        ("L2 unknown", Some(32 * K), None, KC),
        ("unknown caches", None, None, KC),
    ];
    for (cpu, l1d, l2, expected) in cpus {
        let kc = avx2_kc_max_for(l1d, l2);
        assert_eq!(kc, expected, "{cpu}");
        // One panel of `b` fits half of L1 and the block of `a` half of L2 (unless at the
        // least).
        if let (Some(l1), Some(l2), true) = (l1d, l2, kc > KC) {
            assert!(kc * kernel_avx2::NR * 4 <= l1 / 2, "{cpu}");
            assert!(MC * kc * 4 <= l2 / 2, "{cpu}");
        }
    }
}

#[test]
fn short_products_stream_while_a_depth_block_of_a_fits_three_quarters_of_l2() {
    const K: usize = 1024;
    const M: usize = K * K;
    // (CPU, L2 per core, rows, depth block, streams): the AVX-512 kernel's 6 rows per panel.
    let cases = [
        // The MLP: 258 rows (whole 6-row panels) of a 512-deep block, 516 KiB.
        ("Sapphire Rapids, MLP", Some(2 * M), 256, 512, true),
        ("Sapphire Rapids, LLaMA", Some(2 * M), 1024, 512, false),
        ("Zen 5, LLaMA", Some(M), 1024, 128, true),
        ("Zen 4, MLP", Some(M), 256, 512, true),
        ("Zen 4, LLaMA", Some(M), 1024, 512, false),
        ("unknown L2", None, 1024, 512, true),
    ];
    for (cpu, l2, rows, kc, streams) in cases {
        assert_eq!(streamed_a_fits(rows, 6, kc, l2), streams, "{cpu}");
    }
}

#[test]
fn subnormal_operands_are_read_as_zeros_of_their_sign() {
    // Every value of every fourth row of `a` (column of `b`) subnormal, and every fifth value
    // elsewhere, of either sign (a row of subnormals alone gives a product that is subnormal,
    // not zero, unless they are read as zeros): the product has the bits of the product of
    // the operands with those values replaced by zeros of their sign, on every path (packed,
    // streamed) and kernel, row-major or transposed.
    let [m, k, n] = [13, 70, 37];
    // `rows × cols` values laid out by `strides`, and the same with subnormals zeroed.
    let operand = |rows: usize, cols: usize, strides: [i64; 2], seed: u64, by_row: bool| {
        let normal = values(rows * cols, seed);
        let (mut data, mut zeroed) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
        for i in 0..rows {
            for j in 0..cols {
                let flat = i * cols + j;
                let at = (i as i64 * strides[0] + j as i64 * strides[1]) as usize;
                let line = if by_row { i } else { j };
                if line.is_multiple_of(4) || flat.is_multiple_of(5) {
                    let tiny = f32::from_bits(1 + (flat as u32 * 7919) % 0x007f_ffff);
                    (data[at], zeroed[at]) = if flat.is_multiple_of(3) {
                        (-tiny, -0.0)
                    } else {
                        (tiny, 0.0)
                    };
                } else {
                    (data[at], zeroed[at]) = (normal[flat], normal[flat]);
                }
            }
        }
        (data, zeroed)
    };
    for kernel in supported_kernels() {
        for (a_strides, b_strides) in [
            ([k as i64, 1], [n as i64, 1]),
            ([1, m as i64], [1, k as i64]),
        ] {
            let (a_data, a_zeroed) = operand(m, k, a_strides, 1, true);
            let (b_data, b_zeroed) = operand(k, n, b_strides, 2, false);
            let product = |a: &[f32], b: &[f32], streamed: bool| {
                let a = MatrixRef::new(a, 0, [m, k], a_strides, "a").unwrap();
                let b = MatrixRef::new(b, 0, [k, n], b_strides, "b").unwrap();
                let mut out = vec![f32::NAN; m * n];
                let mut c = MatrixMut::row_major(&mut out, m, n).unwrap();
                if streamed {
                    multiply_streaming(kernel, &a, &b, &mut c, 1).unwrap();
                } else {
                    sgemm_with(kernel, &a, &b, &mut c, 1).unwrap();
                }
                out
            };
            for streamed in [false, true] {
                assert_eq!(
                    bits(&product(&a_data, &b_data, streamed)),
                    bits(&product(&a_zeroed, &b_zeroed, streamed)),
                    "{kernel:?} strides {a_strides:?} {b_strides:?} streamed {streamed}"
                );
            }
        }
    }
}

#[test]
fn spread_prefetches_ask_for_every_line_once_evenly_over_the_steps() {
    let base = std::ptr::null::<f32>().wrapping_add(1 << 20);
    // (runs, lines per run, run stride, steps): fewer lines than steps, as many, more, none.
    for (runs, lines, stride, steps) in [
        (3, 32, 1024, 512),
        (48, 4, -4096, 43),
        (64, 33, 4096, 128),
        (0, 32, 1024, 512),
        (5, 1, 7, 1),
    ] {
        let mut spread = Spread::new(
            Lines {
                base,
                runs,
                run_stride: stride,
                lines,
            },
            steps,
        );
        let mut asked = Vec::new();
        let mut per_step = Vec::new();
        for _ in 0..steps {
            let due = spread.tick();
            per_step.push(due);
            asked.extend((0..due).map(|_| spread.next_line()));
        }
        let expected: Vec<*const f32> = (0..runs)
            .flat_map(|r| (0..lines).map(move |l| (r, l)))
            .map(|(r, l)| base.wrapping_offset(r as isize * stride + 16 * l as isize))
            .collect();
        assert_eq!(asked, expected, "{runs} × {lines} lines over {steps} steps");
        // Evenly: per step, the floor or the ceiling of the average.
        let (low, high) = ((runs * lines) / steps, (runs * lines).div_ceil(steps));
        assert!(
            per_step.iter().all(|&d| d == low || d == high),
            "{runs} × {lines} lines over {steps} steps: {per_step:?}"
        );
    }
}

#[test]
fn the_source_lines_of_a_block_are_shared_out_among_its_tiles() {
    // A row-major `b` (rows contiguous) and a transposed one (columns contiguous), 100 × 150:
    // every line of panel 1's rows 16..80 (columns 64..128) is asked for by exactly one of 7
    // parts.
    let data = values(100 * 150, 3);
    for transposed in [false, true] {
        let (strides, shape) = if transposed {
            ([1, 100], [100, 150])
        } else {
            ([150, 1], [100, 150])
        };
        let b = MatrixRef::new(&data, 0, shape, strides, "b").unwrap();
        let mut asked = Vec::new();
        for part in 0..7 {
            let lines = source_lines(&b, 64, 1, 16..80).part(part, 7);
            for r in 0..lines.runs {
                for l in 0..lines.lines {
                    let offset = r as isize * lines.run_stride + 16 * l as isize;
                    asked.push(lines.base.wrapping_offset(offset) as usize);
                }
            }
        }
        let start = data.as_ptr() as usize;
        let mut expected = Vec::new();
        if transposed {
            // Columns 64..128, each a run of rows 16..80: 4 lines of 16 values.
            for j in 64..128 {
                for p in (16..80).step_by(16) {
                    expected.push(start + (j * 100 + p) * 4);
                }
            }
        } else {
            // Rows 16..80, each a run of columns 64..128.
            for p in 16..80 {
                for j in (64..128).step_by(16) {
                    expected.push(start + (p * 150 + j) * 4);
                }
            }
        }
        assert_eq!(asked, expected, "transposed: {transposed}");
    }
}

#[test]
fn a_packed_block_is_prefetched_once_over_its_tiles_and_an_unpacked_one_from_its_source() {
    // `b` 300 × 150, packed for the portable kernel (its `kc` is at most 128, so 3 depth
    // blocks): each of 7 parts asks for its own run of block (1, 1)'s packed lines, together
    // every line of the block exactly once, inside the packed buffer.
    let data = values(300 * 150, 5);
    let b = MatrixRef::new(&data, 0, [300, 150], [150, 1], "b").unwrap();
    let kernel = Kernel::Portable;
    let lazy = PackedB::lazy(&b, kernel).unwrap();
    let unpacked: Vec<_> = lazy.next_lines(1, 1).parts(7).collect();
    let from_source: Vec<_> = (0..7)
        .map(|part| source_lines(&b, kernel.nr(), 1, lazy.block_rows(1)).part(part, 7))
        .collect();
    for (l, s) in unpacked.iter().zip(&from_source) {
        assert_eq!(
            (l.base, l.runs, l.run_stride, l.lines),
            (s.base, s.runs, s.run_stride, s.lines)
        );
    }
    let packed = PackedB::pack(&b, kernel, 1).unwrap();
    let block = packed.block(1, 1);
    let (start, len) = (block.as_ptr() as usize, block.len());
    let mut asked = Vec::new();
    for part in 0..7 {
        let lines = packed.next_lines(1, 1).part(part, 7);
        for r in 0..lines.runs {
            for l in 0..lines.lines {
                let offset = r as isize * lines.run_stride + 16 * l as isize;
                asked.push(lines.base.wrapping_offset(offset) as usize);
            }
        }
    }
    let expected: Vec<usize> = (0..len.div_ceil(16)).map(|l| start + 64 * l).collect();
    assert_eq!(asked, expected);
}

#[test]
fn a_weight_read_in_place_gives_the_packed_paths_bits() {
    // `c = a · wᵀ` with `w` read in place (its rows broadcast, `aᵀ` packed): the bits of the
    // packed path, with tails in every dimension (rows of `a` past a panel of 64, columns of `c`
    // past a micro-panel of 6, several depth blocks and groups of micro-panels), on 1 to 3
    // threads, and with rows of `a` and of `w` apart by more than their length.
    if !Kernel::Avx512.is_supported() {
        return;
    }
    let kernel = Kernel::Avx512;
    for [m, k, n] in [
        [1, 1, 1],
        [5, 17, 7],
        [64, 33, 256],
        [65, 600, 263],
        [130, 1100, 521],
        [200, 513, 1201],
    ] {
        let [a_data, b_data, expected] = linear_layer_product(kernel, [m, k, n], 11);
        let a = MatrixRef::row_major(&a_data, m, k).unwrap();
        let b = MatrixRef::row_major(&b_data, n, k).unwrap().t();
        for threads in [1, 2, 3] {
            let mut out = vec![f32::NAN; m * n];
            let mut c = MatrixMut::row_major(&mut out, m, n).unwrap();
            multiply_weight_rows(kernel, &a, &b, &mut c, threads).unwrap();
            assert!(
                bits(&out) == bits(&expected),
                "{m}x{k}x{n} on {threads} threads: w in place and packed differ"
            );
        }
        // `w`'s rows in reverse order (a negative distance between `b`'s columns), or `b` not
        // column-contiguous: refused, never read.
        let reversed =
            MatrixRef::new(&b_data, ((n - 1) * k) as i64, [k, n], [1, -(k as i64)], "b").unwrap();
        let row_major = MatrixRef::row_major(&b_data, k, n).unwrap();
        for b in [reversed, row_major] {
            let mut out = vec![f32::NAN; m * n];
            let mut c = MatrixMut::row_major(&mut out, m, n).unwrap();
            if k > 1 || n > 1 {
                assert!(matches!(
                    multiply_weight_rows(kernel, &a, &b, &mut c, 2),
                    Err(GemmError::Unsupported(_))
                ));
            }
        }
        // Rows padded: `a` and `w` views of wider matrices (3 values more per row), `c` too.
        let padded = |data: &[f32], rows: usize| -> Vec<f32> {
            data.chunks(k)
                .take(rows)
                .flat_map(|row| row.iter().copied().chain([f32::NAN; 3]))
                .collect()
        };
        let (a_wide, b_wide) = (padded(&a_data, m), padded(&b_data, n));
        let a = MatrixRef::new(&a_wide, 0, [m, k], [k as i64 + 3, 1], "a").unwrap();
        let b = MatrixRef::new(&b_wide, 0, [k, n], [1, k as i64 + 3], "b").unwrap();
        let mut out = vec![f32::NAN; m * (n + 2)];
        let mut c = MatrixMut::new(&mut out, [m, n], n + 2).unwrap();
        multiply_weight_rows(kernel, &a, &b, &mut c, 2).unwrap();
        for i in 0..m {
            assert!(
                bits(&out[i * (n + 2)..][..n]) == bits(&expected[i * n..][..n]),
                "{m}x{k}x{n}, padded rows: row {i} differs"
            );
            assert!(out[i * (n + 2) + n..][..2.min(out.len() - i * (n + 2) - n)]
                .iter()
                .all(|v| v.is_nan()));
        }
    }
}

#[test]
fn lines_parts_are_the_parts_one_by_one() {
    let base = std::ptr::null::<f32>().wrapping_add(1 << 20);
    for (runs, parts) in [(0, 5), (1, 7), (7, 7), (13, 4), (100, 44), (3, 1), (64, 22)] {
        let whole = Lines {
            base,
            runs,
            run_stride: -48,
            lines: 2,
        };
        let each: Vec<_> = whole
            .parts(parts)
            .map(|l| (l.base, l.runs, l.run_stride, l.lines))
            .collect();
        let expected: Vec<_> = (0..parts)
            .map(|p| whole.part(p, parts))
            .map(|l| (l.base, l.runs, l.run_stride, l.lines))
            .collect();
        assert_eq!(each, expected, "{runs} runs in {parts} parts");
        assert_eq!(each.iter().map(|l| l.1).sum::<usize>(), runs);
    }
}

/// The vector kernels this CPU has, which the few-rows path runs on.
fn few_rows_kernels() -> Vec<Kernel> {
    supported_kernels()
        .into_iter()
        .filter(|k| matches!(k, Kernel::Avx512 | Kernel::Avx2))
        .collect()
}

/// `multiply_few_rows` against the f64 triple loop (the tolerance of `check`), `a` and `b` in
/// the given layouts, into rows of `c` wider than its columns (the kernels must keep to their
/// `n` columns).
fn check_few_rows(kernel: Kernel, [m, k, n]: [usize; 3], layouts: [Layout; 2], threads: usize) {
    let context = format!("{kernel:?} {m}x{k}x{n} {layouts:?} on {threads} threads");
    check_product([m, k, n], layouts, n + 3, &context, |a, b, c| {
        let b_strides = [b.row_stride as i64, b.col_stride as i64];
        assert!(prefers_few_rows(kernel, [m, k, n], b_strides), "{context}");
        multiply_few_rows(kernel, a, b, c, threads).unwrap()
    });
}

#[test]
fn few_rows_match_the_naive_product_in_both_layouts_of_b() {
    for kernel in few_rows_kernels() {
        for m in [1, 2, 3, 4, 5, 7, 8, 11, FEW_ROWS] {
            // Depths past `K_RUN` (256), which more than one pass of rows takes in runs.
            for k in [1, 7, 8, 15, 16, 17, 64, 100, 257, 600] {
                for n in [1, 3, 4, 5, 17, 64, 65, 130] {
                    // `b` by columns (a weight read transposed) and by rows.
                    for b in [Layout::Transposed, Layout::RowMajor] {
                        check_few_rows(kernel, [m, k, n], [Layout::RowMajor, b], 1);
                    }
                }
            }
        }
    }
}

#[test]
fn few_rows_read_a_through_its_strides() {
    for kernel in few_rows_kernels() {
        for a in LAYOUTS {
            for b in [Layout::Transposed, Layout::RowMajor] {
                check_few_rows(kernel, [5, 33, 70], [a, b], 2);
            }
        }
    }
}

#[test]
fn few_rows_give_the_same_bits_on_any_number_of_threads() {
    // 1 MiB of `b`: enough to split across up to 4 threads.
    for kernel in few_rows_kernels() {
        for b_layout in [Layout::Transposed, Layout::RowMajor] {
            let [m, k, n] = [3, 256, 1000];
            let (a_data, _, a_strides) = operand(m, k, Layout::RowMajor, 1);
            let (b_data, _, b_strides) = operand(k, n, b_layout, 2);
            let a = MatrixRef::new(&a_data, 0, [m, k], a_strides, "a").unwrap();
            let b = MatrixRef::new(&b_data, 0, [k, n], b_strides, "b").unwrap();
            let mut first: Option<Vec<u32>> = None;
            for threads in [1, 2, 3, 7, 64] {
                assert!(few_rows_pieces(kernel, [m, k, n], b_strides, threads).len() <= 4);
                let mut c_data = vec![f32::NAN; m * n];
                let mut c = MatrixMut::row_major(&mut c_data, m, n).unwrap();
                multiply_few_rows(kernel, &a, &b, &mut c, threads).unwrap();
                match &first {
                    None => first = Some(bits(&c_data)),
                    Some(one) => assert_eq!(&bits(&c_data), one, "{kernel:?} on {threads} threads"),
                }
            }
        }
    }
}

#[test]
fn few_rows_pieces_are_even_and_cover_the_product() {
    for kernel in few_rows_kernels() {
        for b_strides in [[1, 512], [4096, 1]] {
            let shape = [1, 512, 4096];
            for threads in [1, 2, 16, 64] {
                let pieces = few_rows_pieces(kernel, shape, b_strides, threads);
                // 8 MiB of `b`: one piece per 256 KiB, at most one per thread.
                assert_eq!(
                    pieces.len(),
                    threads.min(32),
                    "{kernel:?} {b_strides:?} {threads}"
                );
                assert_eq!(pieces.iter().sum::<u64>(), 512 * 4096);
                let (low, high) = (pieces.iter().min().unwrap(), pieces.iter().max().unwrap());
                assert!(*high as f64 <= *low as f64 * 1.15, "{pieces:?}");
            }
        }
    }
}

#[test]
fn few_rows_refuse_what_they_do_not_take() {
    let (a_data, _, a_strides) = operand(FEW_ROWS + 1, 8, Layout::RowMajor, 1);
    let (b_data, b_offset, b_strides) = operand(8, 8, Layout::Strided, 2);
    // Neither of `b`'s strides is 1.
    assert!(!prefers_few_rows(Kernel::detect(), [2, 8, 8], b_strides));
    assert!(!prefers_few_rows(Kernel::Portable, [2, 8, 8], [8, 1]));
    assert!(!prefers_few_rows(
        Kernel::detect(),
        [FEW_ROWS + 1, 8, 8],
        [8, 1]
    ));
    let b = MatrixRef::new(&b_data, b_offset, [8, 8], b_strides, "b").unwrap();
    let a = MatrixRef::new(&a_data, 0, [2, 8], a_strides, "a").unwrap();
    let mut c_data = vec![0f32; 2 * 8];
    let mut c = MatrixMut::row_major(&mut c_data, 2, 8).unwrap();
    for kernel in supported_kernels() {
        assert!(matches!(
            multiply_few_rows(kernel, &a, &b, &mut c, 1),
            Err(GemmError::Unsupported(_))
        ));
    }
    // Too many rows of `a`.
    let a = MatrixRef::new(&a_data, 0, [FEW_ROWS + 1, 8], a_strides, "a").unwrap();
    let b = MatrixRef::new(&b_data[..64], 0, [8, 8], [8, 1], "b").unwrap();
    let mut c_data = vec![0f32; (FEW_ROWS + 1) * 8];
    let mut c = MatrixMut::row_major(&mut c_data, FEW_ROWS + 1, 8).unwrap();
    assert!(multiply_few_rows(Kernel::detect(), &a, &b, &mut c, 1).is_err());
}

#[test]
fn few_rows_in_runs_of_k_sum_as_one_pass() {
    // With more rows than one pass holds, `k` goes in runs with the accumulators kept between
    // them: each row's bits are those of the same row in a product of that row alone.
    for kernel in few_rows_kernels() {
        for b_layout in [Layout::Transposed, Layout::RowMajor] {
            let [m, k, n] = [11, 600, 70];
            let (a_data, _, a_strides) = operand(m, k, Layout::RowMajor, 3);
            let (b_data, _, b_strides) = operand(k, n, b_layout, 4);
            let b = MatrixRef::new(&b_data, 0, [k, n], b_strides, "b").unwrap();
            let product = |rows: std::ops::Range<usize>| {
                let offset = (rows.start * k) as i64;
                let a = MatrixRef::new(&a_data, offset, [rows.len(), k], a_strides, "a").unwrap();
                let mut c_data = vec![f32::NAN; rows.len() * n];
                let mut c = MatrixMut::row_major(&mut c_data, rows.len(), n).unwrap();
                multiply_few_rows(kernel, &a, &b, &mut c, 1).unwrap();
                bits(&c_data)
            };
            let all = product(0..m);
            for i in [0, 5, 10] {
                assert_eq!(
                    product(i..i + 1),
                    all[i * n..][..n],
                    "{kernel:?} {b_layout:?} row {i}"
                );
            }
        }
    }
}
