//! Compiled against the reference interpreter over many shapes: odd sizes exercise vector tails,
//! reductions over every axis exercise strided loops, views exercise index arithmetic.

use minductor::internals::kernel_ir::Step;
use minductor::{compile, interpret, trace, DType, Graph, Tensor, Traced};
use minductor_tests::wide_sine_values;
use minductor_tests::Tolerance;

/// Compiles `graph` and compares each output with the interpreter's within `tol` (relative to
/// max(1, |want|)).
fn check(graph: &Graph, inputs: &[Tensor], tol: f64, what: &str) {
    let want = interpret(graph, inputs).unwrap();
    let got = compile(graph)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .call(inputs)
        .unwrap();
    minductor_tests::assert_allclose(
        &got,
        &want,
        Tolerance::close(tol),
        &format!("{what}\n{graph}"),
    );
}

fn build(shapes: &[&[usize]], f: impl FnOnce(&[Traced]) -> Vec<Traced>) -> (Graph, Vec<Tensor>) {
    minductor_tests::build_graph(shapes, wide_sine_values, f)
}

const SIZES: [usize; 6] = [1, 3, 4, 5, 17, 66];

#[test]
fn pointwise_chains_at_every_tail_length() {
    for &n in &SIZES {
        for &m in &[1, 2, 7] {
            let (g, inputs) = build(&[&[m, n], &[n]], |i| {
                let (x, b) = (&i[0], &i[1]);
                vec![
                    ((x * 0.5 + b).tanh() - x.sigmoid()).maximum(&(x * x).sqrt().log()),
                    x.gt(b),
                ]
            });
            check(&g, &inputs, 2e-6, &format!("pointwise {m}x{n}"));
        }
    }
}

#[test]
fn reductions_over_every_axis() {
    for &n in &SIZES {
        for axes in [&[0isize][..], &[1], &[2], &[0, 2], &[]] {
            let (g, inputs) = build(&[&[3, n, 5]], |i| {
                let x = &i[0];
                vec![
                    x.sum(axes, false),
                    x.amax(axes, true),
                    x.mean(axes, true),
                    x.amin(axes, false),
                ]
            });
            check(&g, &inputs, 1e-5, &format!("reduce {axes:?} of 3x{n}x5"));
        }
    }
}

#[test]
fn row_kernels_along_every_dim() {
    for &n in &SIZES {
        for dim in 0..3isize {
            let (g, inputs) = build(&[&[2, n, 6]], |i| {
                let x = &i[0];
                vec![
                    x.softmax(dim),
                    x.log_softmax(dim),
                    x.var(&[dim], true, false),
                ]
            });
            check(&g, &inputs, 1e-5, &format!("softmax dim {dim} of 2x{n}x6"));
        }
    }
}

#[test]
fn views_composed_with_compute() {
    for &n in &SIZES {
        let (g, inputs) = build(&[&[4, n], &[n, 4]], |i| {
            let (x, y) = (&i[0], &i[1]);
            let t = (x * 2.0).transpose(0, 1) + y;
            let r = t.reshape(&[-1]).reshape(&[4, n as isize]);
            let s = r.slice(1, Some(0), None, 2).exp();
            vec![
                s,
                Traced::cat(&[&t, y], 1).sum(&[1], false),
                x.reshape(&[n as isize, 4]).permute(&[1, 0]),
            ]
        });
        check(&g, &inputs, 1e-5, &format!("views n={n}"));
    }
}

#[test]
fn half_precision_round_trips() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F16, &[37]);
        let y = t.input("y", DType::BF16, &[37]);
        vec![
            (&x * 1.5).exp(),
            y.cast(DType::F32).softmax(0).cast(DType::BF16),
            x.cast(DType::BF16),
        ]
    })
    .unwrap();
    let x = Tensor::from_f64(
        DType::F16,
        &[37],
        &(0..37).map(|i| i as f64 * 0.1 - 1.5).collect::<Vec<_>>(),
    )
    .unwrap();
    let y = Tensor::from_f64(
        DType::BF16,
        &[37],
        &(0..37).map(|i| (i as f64).cos()).collect::<Vec<_>>(),
    )
    .unwrap();
    check(&graph, &[x, y], 1e-2, "f16/bf16");
}

#[test]
fn results_are_bitwise_equal_for_any_thread_count() {
    // Large enough to be split across threads: row kernels, a 1-D pointwise kernel tiled into
    // rows, GEMMs split by row blocks with fused epilogues, and a batched GEMM split by batch.
    // The row reductions and the GEMM's inner products combine in a fixed order.
    let (g, inputs) = build(&[&[512, 300], &[300], &[300, 200], &[1 << 16]], |i| {
        let (x, b, w, v) = (&i[0], &i[1], &i[2], &i[3]);
        let batched = x.reshape(&[4, 128, 300]).matmul(w);
        vec![
            (x + b).softmax(-1),
            x.sum(&[1], false),
            (x * 2.0).gelu(),
            (x.matmul(w) * 0.5).gelu(),
            batched.softmax(-1),
            (v * 0.25).gelu(),
        ]
    });
    let compiled = compile(&g).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let epilogues = program
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Matmul(m) if m.epilogue.is_some()))
        .count();
    assert_eq!(
        epilogues, 2,
        "both GEMMs carry their consumer as an epilogue\n{program}"
    );
    minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], "threads");
    check(&g, &inputs, 1e-4, "threaded rows");
}

#[test]
fn a_product_cut_for_many_threads_with_both_operands_shared_keeps_the_bits() {
    // A LLaMA projection, [1024, 512] · [512, 512]ᵀ with a bias-and-GELU epilogue: on 64
    // threads its 171 micro-panels of rows do not divide evenly, and the product runs with both
    // operands packed once and shared (`gemm::multiply_shared`), cut in two dimensions, the
    // epilogue after. The bits are those of one thread, and the slowest thread's share is
    // within 5% of the mean (the packed path's was 1.125 times it).
    let (g, inputs) = build(&[&[1024, 512], &[512, 512], &[512]], |i| {
        let (x, w, b) = (&i[0], &i[1], &i[2]);
        vec![(x.matmul(&w.transpose(0, 1)) + b).gelu()]
    });
    let compiled = compile(&g).unwrap();
    let partition = compiled.partition(&inputs, 64).unwrap();
    let gemm = partition
        .iter()
        .max_by_key(|p| p.total())
        .expect("the program has steps");
    assert!(
        gemm.pieces.len() >= 64 && gemm.schedule_overhead(64) < 1.05,
        "{}: {} pieces, schedule {:.3} at 64 threads",
        gemm.name,
        gemm.pieces.len(),
        gemm.schedule_overhead(64)
    );
    minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[64, 2], "shared operands");
    check(&g, &inputs, 1e-4, "shared operands");
}

#[test]
fn unrolled_loops_at_every_length_around_the_unroll_factor() {
    // The innermost loop runs 4 vectors of 4 lanes per iteration, then single vectors, then a
    // scalar tail: every length from 0 to 40 crosses each of those boundaries. Reductions keep
    // one accumulator per unrolled vector, strided loads exercise the per-slot lane offsets.
    for n in 0..=40usize {
        let (g, inputs) = build(&[&[3, n], &[n], &[n, 3]], |i| {
            let (x, b, y) = (&i[0], &i[1], &i[2]);
            let mut outputs = vec![
                (x * 0.5 + b).gelu(),
                x.sum(&[1], false),
                x + y.transpose(0, 1),
                y.sum(&[0], false),
            ];
            if n > 0 {
                // Max, min and the normalizations are not defined over an empty dim.
                outputs.extend([
                    x.amax(&[1], true),
                    x.amin(&[1], false),
                    (x + b).softmax(-1),
                    x.layer_norm(&[n], Some(b), Some(b), 1e-5),
                ]);
            }
            outputs
        });
        check(&g, &inputs, 1e-5, &format!("unrolled 3x{n}"));
    }
}

#[test]
fn max_and_min_propagate_nan_from_every_position() {
    // A NaN in any lane of any unrolled vector, the single-vector loop or the scalar tail makes
    // the row's max and min NaN, as in the reference.
    for n in [5usize, 20, 37] {
        for pos in 0..n {
            let graph = trace(|t| {
                let x = t.input("x", DType::F32, &[2, n]);
                vec![x.amax(&[1], false), x.amin(&[1], true), x.softmax(-1)]
            })
            .unwrap();
            let data: Vec<f32> = (0..2 * n)
                .map(|i| {
                    if i == pos {
                        f32::NAN
                    } else {
                        (i as f32 * 0.7).sin()
                    }
                })
                .collect();
            let x = Tensor::from_vec(&[2, n], data).unwrap();
            check(&graph, &[x], 1e-5, &format!("NaN at {pos} of 2x{n}"));
        }
    }
}

#[test]
fn recycled_output_blocks_are_fully_overwritten_and_never_shared() {
    // Outputs of 1 MiB and more come from a cache of freed blocks; every element must be written
    // again, and a block the caller still holds must not be handed out.
    let n = 1 << 19;
    let (g, _) = build(&[&[n]], |i| vec![(&i[0] * 0.5).gelu(), i[0].exp()]);
    let compiled = compile(&g).unwrap();
    let first_inputs = [wide_sine_values(&[n], 1)];
    let want_first = interpret(&g, &first_inputs).unwrap();
    let held = compiled.call(&first_inputs).unwrap();
    for round in 0..4 {
        // Alternate inputs, so a recycled block holds the other round's values.
        let inputs = [wide_sine_values(&[n], 2 + round % 2)];
        let want = interpret(&g, &inputs).unwrap();
        let got = compiled.call(&inputs).unwrap();
        minductor_tests::assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-5),
            &format!("round {round}"),
        );
    }
    // The outputs held across those calls still hold the first call's values.
    minductor_tests::assert_allclose(&held, &want_first, Tolerance::close(1e-5), "held outputs");
}

/// `gelu` and `silu` go to one math routine each when nothing else uses their inner values
/// (`codegen_cpu::lower`, composites), and stay separate operations when something does: both
/// forms, at lengths around the block size and the routines' register widths.
#[test]
fn gelu_and_silu_composites_with_and_without_shared_inner_values() {
    for &n in &[1, 15, 16, 17, 31, 33, 255, 256, 257, 1000] {
        let (g, inputs) = build(&[&[2, n], &[n]], |i| {
            let (x, b) = (&i[0], &i[1]);
            let h = x * 1.7 + b;
            vec![h.gelu(), x.silu(), (&h * 0.5).gelu() + 1.0]
        });
        check(&g, &inputs, 1e-5, &format!("composites alone, n = {n}"));
        let (g, inputs) = build(&[&[2, n]], |i| {
            let x = &i[0] * 1.3;
            // The erf of gelu's argument and the sigmoid of silu's are also outputs.
            let erf = (&x * std::f64::consts::FRAC_1_SQRT_2).erf();
            vec![x.gelu(), erf, x.silu(), x.sigmoid()]
        });
        check(
            &g,
            &inputs,
            1e-5,
            &format!("composites sharing inner values, n = {n}"),
        );
    }
}

#[test]
fn short_and_stacked_linear_layers_stream_with_the_same_bits_on_any_thread_count() {
    // Products short enough to be streamed (`gemm::prefers_streaming`: at most 1024 rows, at
    // least 4 panels of 64 columns per thread for up to 3 threads, and a depth block of `a` far
    // inside L2): a 2-D linear layer with a
    // fused epilogue, and the same weight over a batch of sequences (one stacked product), with
    // tails in every dimension (70 rows, 33 inputs, 800 outputs).
    let (g, inputs) = build(&[&[3, 70, 33], &[800, 33], &[800]], |i| {
        let (x, w, b) = (&i[0], &i[1], &i[2]);
        vec![
            x.reshape(&[210, 33]).linear(w, Some(b)).gelu(),
            x.linear(w, None) * 0.5,
        ]
    });
    let compiled = compile(&g).unwrap();
    minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], "threads");
    check(&g, &inputs, 1e-4, "streamed linear layers");
}

#[test]
fn linear_layers_reading_their_weight_in_place_match_the_interpreter_on_any_thread_count() {
    // Products whose weight is read in place (`gemm::prefers_weight_rows` on AVX-512: at least
    // 64 rows, at least 4 times as many outputs as rows, all of `aᵀ` packed inside L2), a 2-D
    // layer with a fused epilogue and the same weight over a stacked batch, with tails in every
    // dimension (65 and 130 rows, 37 inputs, 6·100 + 3 outputs); elsewhere the same graphs take
    // the other paths and must match just the same.
    let (g, inputs) = build(&[&[2, 65, 37], &[603, 37], &[603]], |i| {
        let (x, w, b) = (&i[0], &i[1], &i[2]);
        vec![
            x.reshape(&[130, 37]).linear(w, Some(b)).gelu(),
            x.linear(w, None) * 0.5,
        ]
    });
    let compiled = compile(&g).unwrap();
    minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], "threads");
    check(&g, &inputs, 1e-4, "linear layers reading w in place");
}

#[test]
fn products_of_few_rows_match_the_interpreter_on_any_thread_count() {
    // At most `gemm::FEW_ROWS` rows of `a` read `b` in place (`gemm::multiply_few_rows`): a
    // linear layer (`b` = `wᵀ`, its columns contiguous) with a fused epilogue, `x @ w` of a
    // weight stored `[k, n]` (rows contiguous), and a stacked batch of 2 × 3 rows, with tails in
    // every dimension (129 inputs, 1300 outputs) and 670 KB of `b` (two pieces, one per 256 KiB);
    // 13 rows take the packed path, with the same results.
    for rows in [1, 3, 5, 12, 13] {
        let (g, inputs) = build(
            &[
                &[rows, 129],
                &[1300, 129],
                &[1300],
                &[129, 1300],
                &[2, 3, 129],
            ],
            |i| {
                let (x, w, b, v, s) = (&i[0], &i[1], &i[2], &i[3], &i[4]);
                vec![
                    x.linear(w, Some(b)).gelu(),
                    x.matmul(v) * 0.5,
                    s.linear(w, None),
                ]
            },
        );
        let compiled = compile(&g).unwrap();
        minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], "threads");
        check(&g, &inputs, 1e-4, &format!("products of {rows} rows"));
    }
}

#[test]
fn batches_of_products_of_few_rows_match_the_interpreter_on_any_thread_count() {
    // A batch of matrices of at most `gemm::FEW_ROWS` rows, each with its own `b` (a decoder's
    // scores against its keys, `q · kᵀ`, and their values, `p · v`): each matrix reads its `b`
    // in place, by columns and by rows.
    for rows in [1, 2, 7, 12] {
        let (g, inputs) = build(
            &[&[3, 4, rows, 40], &[3, 4, 50, 40], &[3, 4, 40, 50]],
            |i| {
                let (q, k, v) = (&i[0], &i[1], &i[2]);
                vec![q.matmul(&k.transpose(2, 3)), q.matmul(v) * 0.5]
            },
        );
        let compiled = compile(&g).unwrap();
        minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], "threads");
        check(&g, &inputs, 1e-4, &format!("batches of {rows} rows"));
    }
}
