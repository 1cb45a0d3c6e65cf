//! Kernels over short rows (layer norms, softmaxes and RMS norms over 1 to 256 features),
//! with row counts that leave every remainder of the runtime's pieces, against the interpreter
//! and bit for bit across thread counts.

use minductor::{compile, interpret, Graph, Tensor};
use minductor_tests::{wide_sine_values, Tolerance};

fn check(graph: &Graph, inputs: &[Tensor], context: &str) {
    let compiled = compile(graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let context = format!("{context}\n{program}");
    let got = minductor_tests::assert_same_bits_on_threads(&compiled, inputs, &[1, 2, 3], &context);
    let want = interpret(graph, inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(2e-5), &context);
}

#[test]
fn short_row_norms_and_softmaxes_match_the_interpreter() {
    for (rows, n) in [
        (1, 64),
        (2, 64),
        (7, 33),
        (8191, 64),
        (100, 256),
        (1000, 17),
    ] {
        let (graph, inputs) =
            minductor_tests::build_graph(&[&[rows, n], &[n], &[n]], wide_sine_values, |i| {
                let x = &i[0];
                let rms = x * &((x * x).mean(&[-1], true) + 1e-6).rsqrt() * &i[1];
                vec![
                    x.layer_norm(&[n], Some(&i[1]), Some(&i[2]), 1e-5),
                    x.softmax(-1),
                    rms,
                ]
            });
        check(&graph, &inputs, &format!("{rows}x{n}"));
    }
}

/// A batch of short rows under two outer loops (`[b, t, n]`): the runtime flattens both.
#[test]
fn short_rows_under_two_outer_loops_match_the_interpreter() {
    for (b, t, n) in [(3, 37, 48), (2, 1, 100), (5, 64, 64)] {
        let (graph, inputs) = minductor_tests::build_graph(&[&[b, t, n]], wide_sine_values, |i| {
            vec![(i[0].softmax(-1) * 3.0).layer_norm(&[n], None, None, 1e-5)]
        });
        check(&graph, &inputs, &format!("{b}x{t}x{n}"));
    }
}

/// Below `SHORT_ROW` a row stage without a function (a sum, a maximum, a scaled or affine
/// store) keeps the 4-lane loop, where a call of its routine costs more than the row; a stage
/// with one (a softmax's `exp`) keeps the routine. At `SHORT_ROW` every stage of a softmax and
/// a layer norm's sums call their routines. (The values at these lengths are checked above.)
#[test]
fn short_rows_call_a_routine_only_for_a_function() {
    use minductor::internals::codegen_cpu::lower::SHORT_ROW;
    use minductor::internals::kernels::math::block::{block_isa, BlockIsa};
    let Some(isa) = block_isa() else {
        return; // No routines on this CPU: every stage is a loop.
    };
    let wide = Some(match isa {
        BlockIsa::Avx512 => 512,
        BlockIsa::Avx2 => 256,
    });
    let bits = |n: usize, softmax: bool| {
        let (graph, _) = minductor_tests::build_graph(&[&[8, n]], wide_sine_values, |i| {
            if softmax {
                vec![i[0].softmax(-1)]
            } else {
                vec![i[0].layer_norm(&[n], None, None, 1e-5)]
            }
        });
        let program = minductor_tests::compiled_program(&graph);
        (
            minductor_tests::kernel_stage_bits(&program),
            program.to_string(),
        )
    };
    let short = SHORT_ROW - 1;
    // A softmax: its maximum, its sum of `exp(x - max)` (stored), its scaled store.
    let (softmax, text) = bits(short, true);
    assert_eq!(softmax, vec![Some(128), wide, Some(128)], "{text}");
    let (norm, text) = bits(short, false);
    assert!(norm.iter().all(|&b| b == Some(128)), "{norm:?}\n{text}");
    let (at_limit, text) = bits(SHORT_ROW, true);
    assert_eq!(at_limit, vec![wide; 3], "{text}");
    // A layer norm's two sums (its affine store follows the CPU and the cache: see
    // `row_kernels_vs_cranelift.rs`).
    let (at_limit, text) = bits(SHORT_ROW, false);
    assert_eq!(at_limit[..2], [wide, wide], "{text}");
}
