//! Reductions over a non-innermost axis (column sums, `softmax(dim=0)`, a mean over the middle
//! axis of a 3-D tensor) run in the outer-reduction loop order (`LoopOrder::OuterReduction`,
//! `codegen_cpu/src/lower/outer.rs`): the contiguous last outer loop is vectorised in groups of
//! columns and the reduced rows loop inside. Compared against the reference interpreter at column
//! counts around the group sizes (32 and 4 columns: every tail), against f64 sums for accuracy,
//! and across thread counts bit for bit.

use minductor::internals::kernel_ir::{LoopOrder, Program, Step};
use minductor::{compile, interpret, trace, DType, Graph, Tensor, Traced};
use minductor_tests::wide_sine_values;
use minductor_tests::Tolerance;
use minductor_tools::workloads::uniform;

fn build(shapes: &[&[usize]], f: impl FnOnce(&[Traced]) -> Vec<Traced>) -> (Graph, Vec<Tensor>) {
    minductor_tests::build_graph(shapes, wide_sine_values, f)
}

/// How many kernel steps of `program` run in the outer-reduction order.
fn outer_kernels(program: &Program) -> usize {
    program
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Kernel(k) if k.order == LoopOrder::OuterReduction))
        .count()
}

/// Compiles `graph`, checks that at least `min_outer` kernels run in the outer-reduction order,
/// and compares each output with the interpreter's within `tol` (relative to max(1, |want|)).
fn check(graph: &Graph, inputs: &[Tensor], tol: f64, min_outer: usize, what: &str) {
    let want = interpret(graph, inputs).unwrap();
    let compiled = compile(graph).unwrap_or_else(|e| panic!("{what}: {e}"));
    let program = compiled.artifacts().program.clone().unwrap();
    assert!(
        outer_kernels(&program) >= min_outer,
        "{what}: expected {min_outer} outer-reduction kernels\n{program}"
    );
    // The program text says the order and parses back to the same program.
    let text = program.to_string();
    if min_outer > 0 {
        assert!(text.contains("order=outer_reduction"), "{what}\n{text}");
    }
    let parsed: Program = text
        .parse()
        .unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
    assert_eq!(parsed, program, "{what}: round trip");
    let got = compiled.call(inputs).unwrap();
    minductor_tests::assert_allclose(
        &got,
        &want,
        Tolerance::close(tol),
        &format!("{what}\n{graph}\n{program}"),
    );
}

/// Column counts around the group sizes (32 columns, then 4, then single columns).
const COLUMNS: [usize; 9] = [1, 3, 4, 5, 17, 31, 33, 66, 71];
const ROWS: [usize; 5] = [1, 2, 7, 65, 130];

#[test]
fn column_reductions_at_every_tail_length() {
    for &n in &COLUMNS {
        for &m in &ROWS {
            let (g, inputs) = build(&[&[m, n]], |i| {
                let x = &i[0];
                vec![
                    x.sum(&[0], false),
                    x.mean(&[0], true),
                    x.amax(&[0], false),
                    x.amin(&[0], true),
                    (x * x).sum(&[0], true),
                ]
            });
            // [m, 1] (one column) reads contiguously along the rows: the inner order.
            let min_outer = usize::from(n > 1 && m > 1);
            check(&g, &inputs, 2e-5, min_outer, &format!("columns of {m}x{n}"));
        }
    }
}

#[test]
fn arg_reductions_over_dim_0() {
    for &n in &COLUMNS {
        for &m in &[1, 5, 66] {
            let (g, inputs) = build(&[&[m, n]], |i| {
                let x = &i[0];
                vec![
                    x.argmax(0, false),
                    x.argmin(0, true),
                    (x * 2.0).amax(&[0], true),
                ]
            });
            let min_outer = usize::from(n > 1 && m > 1);
            check(&g, &inputs, 0.0, min_outer, &format!("argmax of {m}x{n}"));
        }
    }
}

#[test]
fn softmax_and_log_softmax_over_dim_0() {
    for &n in &COLUMNS {
        for &m in &[1, 3, 66, 130] {
            let (g, inputs) = build(&[&[m, n], &[n]], |i| {
                let (x, b) = (&i[0], &i[1]);
                vec![(x + b).softmax(0), x.log_softmax(0)]
            });
            let min_outer = usize::from(n > 1 && m > 1);
            check(
                &g,
                &inputs,
                1e-5,
                min_outer,
                &format!("softmax dim 0 of {m}x{n}"),
            );
        }
    }
}

/// Functions that math blocks compute (nested: `exp(tanh)`, and the composite `gelu`) inside
/// outer-order stages: whole column groups run them in blocks of rows (short last blocks,
/// blocks inside a sum's 64-row blocks), narrower groups and single columns inline.
#[test]
fn math_functions_over_dim_0() {
    for &n in &[32, 33, 70, 96] {
        for &m in &[1, 7, 8, 9, 65, 130] {
            let (g, inputs) = build(&[&[m, n]], |i| {
                let x = &i[0];
                vec![
                    x.tanh().exp().sum(&[0], false),
                    (x.gelu() - x.amax(&[0], true)).softmax(0),
                ]
            });
            let min_outer = usize::from(m > 1);
            check(
                &g,
                &inputs,
                1e-5,
                min_outer,
                &format!("functions over dim 0 of {m}x{n}"),
            );
        }
    }
}

/// softmax over the columns, then row ops on its result (a row softmax, a row sum).
#[test]
fn softmax_dim_0_followed_by_row_ops() {
    for &(m, n) in &[(7, 33), (64, 130), (5, 3)] {
        let (g, inputs) = build(&[&[m, n]], |i| {
            let p = i[0].softmax(0);
            vec![p.softmax(1), p.sum(&[1], true), (&p * 3.0).log_softmax(-1)]
        });
        check(
            &g,
            &inputs,
            1e-5,
            1,
            &format!("softmax dim 0 then rows of {m}x{n}"),
        );
    }
}

/// `softmax(dim=0)` read by a row softmax is realized whole (one outer-order kernel with its
/// max, sum and division), then the row softmax is one kernel: two kernels, not one per
/// reduction and pointwise value (the realize cascade).
#[test]
fn softmax_dim_0_then_dim_1_is_two_kernels() {
    for &(m, n) in &[(64, 130), (3, 5)] {
        let (g, inputs) = build(&[&[m, n]], |i| vec![i[0].softmax(0).softmax(1)]);
        check(
            &g,
            &inputs,
            1e-5,
            1,
            &format!("softmax(0).softmax(1) of {m}x{n}"),
        );
        let program = minductor_tests::compiled_program(&g);
        let kernels = program
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Kernel(_)))
            .count();
        assert_eq!(kernels, 2, "{program}");
    }
}

#[test]
fn reductions_over_the_middle_axis_of_3d() {
    for &n in &[1, 5, 33] {
        for &c in &[1, 4, 17, 37] {
            let (g, inputs) = build(&[&[3, n, c]], |i| {
                let x = &i[0];
                vec![
                    x.sum(&[1], false),
                    x.mean(&[1], true),
                    x.amax(&[1], false),
                    x.var(&[1], true, false),
                    x.softmax(1),
                ]
            });
            let min_outer = usize::from(n > 1 && c > 1);
            check(
                &g,
                &inputs,
                1e-5,
                min_outer,
                &format!("middle axis of 3x{n}x{c}"),
            );
        }
    }
}

/// `[1, N]` over dim 0 (one row per column: the outer order, a copy) and `[N, 1]` over dim 0
/// (one contiguous column: the inner order), with keepdim.
#[test]
fn one_row_and_one_column() {
    for &n in &[1, 3, 33, 1000] {
        let (g, inputs) = build(&[&[1, n]], |i| {
            let x = &i[0];
            vec![x.sum(&[0], true), x.mean(&[0], false), x.softmax(0)]
        });
        check(&g, &inputs, 1e-6, usize::from(n > 1), &format!("1x{n}"));
        let (g, inputs) = build(&[&[n, 1]], |i| {
            let x = &i[0];
            vec![x.sum(&[0], true), x.mean(&[0], false), x.softmax(0)]
        });
        check(&g, &inputs, 1e-5, 0, &format!("{n}x1"));
    }
}

/// Column sums and means of uniform values against f64 sums: long columns (a million rows)
/// keep the accuracy of one 64-row block (a single accumulator per column is off by ~1e-5
/// relative here).
#[test]
fn long_column_sums_are_accurate() {
    let (m, n) = (1 << 20, 3);
    let x = uniform(&[m, n], 0.0, 1.0, 7);
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[m, n]);
        vec![x.sum(&[0], false), x.mean(&[0], true)]
    })
    .unwrap();
    let compiled = compile(&graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    assert!(outer_kernels(&program) >= 1, "{program}");
    let out = compiled.call(std::slice::from_ref(&x)).unwrap();
    let values = x.to_f64_vec();
    let sums = out[0].to_f64_vec();
    let means = out[1].to_f64_vec();
    for c in 0..n {
        let exact: f64 = (0..m).map(|r| values[r * n + c]).sum();
        let rel = ((sums[c] - exact) / exact).abs();
        assert!(
            rel <= 2e-7,
            "column {c}: {} vs f64 {exact} ({rel:e})",
            sums[c]
        );
        let rel = ((means[c] - exact / m as f64) / (exact / m as f64)).abs();
        assert!(rel <= 2e-7, "mean of column {c}: {} ({rel:e})", means[c]);
    }
}

/// A bias gradient's shape: `[4096, 256]` column sums against f64.
#[test]
fn bias_gradient_column_sums_against_f64() {
    let (m, n) = (4096, 257);
    let x = uniform(&[m, n], -1.0, 1.0, 3);
    let graph = trace(|t| vec![t.input("x", DType::F32, &[m, n]).sum(&[0], false)]).unwrap();
    let out = compile(&graph)
        .unwrap()
        .call(std::slice::from_ref(&x))
        .unwrap();
    let values = x.to_f64_vec();
    let sums = out[0].to_f64_vec();
    for c in 0..n {
        let exact: f64 = (0..m).map(|r| values[r * n + c]).sum();
        let scale: f64 = (0..m).map(|r| values[r * n + c].abs()).sum();
        assert!(
            (sums[c] - exact).abs() <= 1e-6 * scale,
            "column {c}: {} vs f64 {exact}",
            sums[c]
        );
    }
}

/// Infinities and NaN anywhere in a column: sums give inf / NaN, max and min NaN, in vector
/// lanes and in the single-column tail alike.
#[test]
fn columns_keep_infinities_and_nan() {
    let (m, n) = (200, 37);
    for (row, col, v) in [
        (0, 0, f32::NAN),
        (199, 36, f32::NAN),
        (70, 5, f32::INFINITY),
        (130, 34, f32::NEG_INFINITY),
        (64, 17, f32::NAN),
    ] {
        let mut data = wide_sine_values(&[m, n], 1).to_vec::<f32>().unwrap();
        data[row * n + col] = v;
        let x = Tensor::from_vec(&[m, n], data).unwrap();
        let graph = trace(|t| {
            let x = t.input("x", DType::F32, &[m, n]);
            vec![
                x.sum(&[0], false),
                x.amax(&[0], false),
                x.amin(&[0], false),
                x.argmax(0, false),
            ]
        })
        .unwrap();
        check(&graph, &[x], 1e-5, 1, &format!("{v} at ({row}, {col})"));
    }
}

/// The runtime splits the columns across threads at any column, so a column may be a vector lane
/// with one thread and a single-column tail with another: the results are the same bits.
#[test]
fn column_reductions_are_bitwise_equal_for_any_thread_count() {
    let (g, inputs) = build(&[&[300, 1001], &[5, 333, 101]], |i| {
        let (x, y) = (&i[0], &i[1]);
        vec![
            x.sum(&[0], false),
            x.softmax(0),
            x.amax(&[0], true),
            (x * x).mean(&[0], false),
            x.argmax(0, false),
            y.softmax(1),
            y.var(&[1], true, false),
        ]
    });
    let compiled = compile(&g).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    assert!(outer_kernels(&program) >= 3, "{program}");
    let one = minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], "threads");
    let want = interpret(&g, &inputs).unwrap();
    minductor_tests::assert_allclose(&one, &want, Tolerance::close(1e-5), "against the reference");
}

/// The verifier refuses the outer-reduction order where it does not apply: a kernel without
/// outer loops (a full reduction) and a scan.
#[test]
fn verifier_refuses_the_outer_order_without_outer_loops_or_with_a_scan() {
    for graph in [
        trace(|t| vec![t.input("x", DType::F32, &[8, 5]).sum(&[0, 1], false)]).unwrap(),
        trace(|t| vec![t.input("x", DType::F32, &[8, 5]).cumsum(0)]).unwrap(),
    ] {
        let program = minductor_tests::compiled_program(&graph);
        let mut bad = program.clone();
        let mut changed = false;
        for step in &mut bad.steps {
            if let Step::Kernel(k) = step {
                if k.outer.is_empty()
                    || k.stages.iter().any(|s| {
                        matches!(
                            s.action,
                            minductor::internals::kernel_ir::StageAction::Scan(_)
                        )
                    })
                {
                    k.order = LoopOrder::OuterReduction;
                    changed = true;
                }
            }
        }
        assert!(changed, "{program}");
        let err = minductor::internals::kernel_ir::verify_program(&bad, &[]).unwrap_err();
        assert!(
            err.to_string().contains("order"),
            "unexpected error {err} for\n{bad}"
        );
    }
}
