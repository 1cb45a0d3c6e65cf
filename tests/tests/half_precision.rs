//! Kernels over f16 and bf16 tensors: their loads and stores contiguous along a stage's loop are
//! converted a block at a time by the kernel library's routines, and a half-precision
//! operation's rounding in a chain of f32 operations is a math block (`lower/blocks.rs`,
//! `minductor_kernels::convert`). Each graph runs at lengths that end blocks short (1, 17, 257,
//! 1000) and cross a sum's block of 1024 (1030), against the interpreter within one rounding of
//! the half type (it computes in f64 and rounds once per operation, the kernels in f32), and
//! bit for bit across 1, 2 and 3 threads.

use minductor::{compile, interpret, DType, Graph, Tensor, Traced, Tracer};
use minductor_tests::{hashed_values, Tolerance};

/// `f` of `x: [3, n]` of `dtype`, with `x`'s values the hashed ones rounded to `dtype`.
fn graph(dtype: DType, n: usize, f: fn(&Traced, DType) -> Vec<Traced>) -> (Graph, Vec<Tensor>) {
    let tracer = Tracer::new();
    let x = tracer.input("x", dtype, &[3, n]);
    let values = hashed_values(&[3, n], 5).to_f64_vec();
    (
        tracer.finish(&f(&x, dtype)).unwrap(),
        vec![Tensor::from_f64(dtype, &[3, n], &values).unwrap()],
    )
}

/// Half an ulp of `dtype` at 1, relative (the interpreter and the kernels may round a value
/// near a tie apart), twice over for the operations' rounding of each other's results.
fn tolerance(dtype: DType) -> Tolerance {
    Tolerance::close(match dtype {
        DType::F16 => 2.0 * 2f64.powi(-10),
        _ => 2.0 * 2f64.powi(-7),
    })
}

fn check(f: fn(&Traced, DType) -> Vec<Traced>, what: &str) {
    for dtype in [DType::F16, DType::BF16] {
        for n in [1, 17, 257, 1000, 1030] {
            let (graph, inputs) = graph(dtype, n, f);
            let context = format!("{what}, {dtype:?}, n = {n}\n{graph}");
            let compiled = compile(&graph).unwrap();
            let got = minductor_tests::assert_same_bits_on_threads(
                &compiled,
                &inputs,
                &[1, 2, 3],
                &context,
            );
            let want = interpret(&graph, &inputs).unwrap();
            minductor_tests::assert_allclose(&got, &want, tolerance(dtype), &context);
        }
    }
}

/// Pointwise chains in the half type: each operation rounds (a math block of its own), loads
/// and stores convert, `tanh` and `gelu` are math blocks reading converted values.
#[test]
fn pointwise_chains_in_half_precision() {
    check(|x, _| vec![x * 2.0], "x * 2");
    check(|x, _| vec![(x * 3.0 + 1.0).tanh() - x], "tanh(3x + 1) - x");
    check(|x, _| vec![(x * 2.0 + 1.0).gelu(), x.abs()], "gelu, abs");
}

/// Row reductions over half-precision rows (softmax, layer norm, a sum to f32), and a half
/// result of an f32 computation.
#[test]
fn reductions_over_half_precision_rows() {
    check(|x, _| vec![x.softmax(-1)], "softmax");
    check(
        |x, _| {
            let n = x.shape()[1];
            vec![x.layer_norm(&[n], None, None, 1e-5)]
        },
        "layer norm",
    );
    check(
        |x, dtype| {
            let f = x.cast(DType::F32);
            vec![f.sum(&[-1], false), (f.exp() * 0.5).cast(dtype)]
        },
        "sum in f32, exp to half",
    );
}
