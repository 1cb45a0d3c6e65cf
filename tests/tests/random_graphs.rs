//! Randomized differential testing (STYLE 10): random graphs of pointwise ops, reductions, row
//! ops, views, `arange`, masks and scans, compiled with the full pipeline and compared with the reference interpreter;
//! proptest shrinks any failure to the smallest graph and shape.

use minductor::{compile, interpret, DType, Tensor, Traced, Tracer};
use minductor_tests::{compare_outputs, Tolerance};
use proptest::prelude::*;

/// One shape-preserving step applied to the running value `v` (with a second input `y` that
/// broadcasts against it).
#[derive(Clone, Copy, Debug)]
enum Step {
    Tanh,
    ExpOfTanh,
    LogAbsPlusOne,
    SqrtAbs,
    Sigmoid,
    Sin,
    Neg,
    AddY,
    MulY,
    DivAbsYPlusOne,
    MaxY,
    WhereGreater,
    Softmax(usize),
    SubRowMax(usize),
    MulRowMean(usize),
    TransposeRoundTrip,
    ReshapeRoundTrip,
    Gelu,
    /// `+ 0.1 · arange` along a dim (the `iota` index expression, broadcast).
    AddArange(usize),
    /// A scaled running sum along a dim (the scan stage).
    CumSum(usize),
    /// `triu(1)` of the last two dims (identity on 1-d values).
    Triu,
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Tanh),
        Just(Step::ExpOfTanh),
        Just(Step::LogAbsPlusOne),
        Just(Step::SqrtAbs),
        Just(Step::Sigmoid),
        Just(Step::Sin),
        Just(Step::Neg),
        Just(Step::AddY),
        Just(Step::MulY),
        Just(Step::DivAbsYPlusOne),
        Just(Step::MaxY),
        Just(Step::WhereGreater),
        (0usize..3).prop_map(Step::Softmax),
        (0usize..3).prop_map(Step::SubRowMax),
        (0usize..3).prop_map(Step::MulRowMean),
        Just(Step::TransposeRoundTrip),
        Just(Step::ReshapeRoundTrip),
        Just(Step::Gelu),
        (0usize..3).prop_map(Step::AddArange),
        (0usize..3).prop_map(Step::CumSum),
        Just(Step::Triu),
    ]
}

fn apply(step: Step, v: &Traced, y: &Traced) -> Traced {
    let rank = v.rank();
    let dim = |d: usize| (d % rank) as isize;
    match step {
        Step::Tanh => v.tanh(),
        Step::ExpOfTanh => v.tanh().exp(),
        Step::LogAbsPlusOne => (v.abs() + 1.0).log(),
        Step::SqrtAbs => (v.abs() + 1.0).sqrt(), // +1: sqrt near 0 amplifies last-ulp differences
        Step::Sigmoid => v.sigmoid(),
        Step::Sin => v.sin(),
        Step::Neg => -v,
        Step::AddY => v + y,
        Step::MulY => v * y,
        Step::DivAbsYPlusOne => v / (y.abs() + 1.0),
        Step::MaxY => v.maximum(y),
        Step::WhereGreater => v.gt(y).where_(v, &(y * 0.5)),
        Step::Softmax(d) => v.softmax(dim(d)),
        Step::SubRowMax(d) => v - v.amax(&[dim(d)], true),
        Step::MulRowMean(d) => v * v.mean(&[dim(d)], true),
        Step::TransposeRoundTrip => (v.transpose(0, -1) * 2.0).transpose(0, -1),
        Step::ReshapeRoundTrip => {
            let shape: Vec<isize> = v.shape().iter().map(|&d| d as isize).collect();
            (v.reshape(&[-1]) + 0.25).reshape(&shape)
        }
        Step::Gelu => v.gelu(),
        Step::AddArange(d) => {
            let d = dim(d) as usize;
            let n = v.shape()[d];
            let mut column = vec![1isize; rank];
            column[d] = n as isize;
            v + v.tracer().arange(n, DType::F32).reshape(&column) * 0.1
        }
        Step::CumSum(d) => (v * 0.1).cumsum(dim(d)),
        Step::Triu if rank >= 2 => v.triu(1),
        Step::Triu => v.clone(),
    }
}

fn data(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let values = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 250.0) - 2.0)
        .collect();
    Tensor::from_vec(shape, values).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn compiled_equals_reference(
        shape in prop::collection::vec(1usize..24, 1..4),
        broadcast_first in any::<bool>(),
        steps in prop::collection::vec(step_strategy(), 1..7),
        reduce_at_end in any::<bool>(),
    ) {
        let mut y_shape = shape.clone();
        if broadcast_first {
            y_shape[0] = 1;
        }
        let tracer = Tracer::new();
        let x = tracer.input("x", DType::F32, &shape);
        let y = tracer.input("y", DType::F32, &y_shape);
        let mut v = x.clone();
        for &s in &steps {
            v = apply(s, &v, &y);
        }
        let mut outputs = vec![v.clone()];
        if reduce_at_end {
            outputs.push(v.sum(&[-1], false));
        }
        let graph = tracer.finish(&outputs).unwrap();
        let inputs = [data(&shape, 1), data(&y_shape, 2)];
        let want = interpret(&graph, &inputs).unwrap();
        let got = compile(&graph).unwrap().call(&inputs).unwrap();
        let compared = compare_outputs(&got, &want, Tolerance::close(2e-5), &graph.to_string());
        prop_assert!(compared.is_ok(), "{}", compared.unwrap_err());
    }
}
