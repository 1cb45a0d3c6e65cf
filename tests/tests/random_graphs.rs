//! Randomized differential testing (STYLE 10): random graphs of pointwise ops, reductions, row
//! ops, views, `arange`, masks, scans, matmuls, `cat` with stepped slices, `index_select`,
//! integer scans and reductions (fallback steps), f16/bf16 inputs and bool outputs, at sizes on
//! both sides of the threading threshold, compiled with the full pipeline and compared with the
//! reference interpreter (output count, shapes, dtypes and values); proptest shrinks any failure
//! to the smallest graph and shape. Two more properties compile each graph once with a symbolic
//! dim (`Dim::Sym`) and call it at two sizes, each compared with the interpreter on a static
//! trace at that size: the batch dim, and one dim at any position.
//!
//! CI runs 128 cases; a campaign runs more: `PROPTEST_CASES=100000 cargo test --release -p
//! minductor-tests --test random_graphs`.

use minductor::{compile, compile_frozen, interpret, DType, Tensor, Traced, Tracer};
use minductor::{Dim, SymId, TensorType};
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
    Silu,
    /// `v @ (w / n)` with the square weight input (last dim `n`): a GEMM step.
    Matmul,
    /// `cat([v, v / 2], d)` then every other element along `d`: a cat and a stepped slice.
    CatStepped(usize),
    /// `index_select` along `d` at reversed positions (an i64 index computed in the graph).
    Reverse(usize),
    /// `+ 0.01 · cumsum(x > y)` along `d` in i64: an integer scan, a fallback step.
    CountGreater(usize),
    /// `+ 0.1 · amax(trunc(3x))` along `d` in i64: an integer reduction, a fallback step.
    IntegerRowMax(usize),
    /// `+ 0.01 · sum(x > y)` along `d` in i64: an integer reduction, a fallback step.
    IntegerRowSum(usize),
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
        Just(Step::Silu),
        Just(Step::Matmul),
        (0usize..3).prop_map(Step::CatStepped),
        (0usize..3).prop_map(Step::Reverse),
        (0usize..3).prop_map(Step::CountGreater),
        (0usize..3).prop_map(Step::IntegerRowMax),
        (0usize..3).prop_map(Step::IntegerRowSum),
    ]
}

/// Applies `step` to `v`; `x` is the graph's first input, `y` the second, `w` the square weight.
fn apply(step: Step, v: &Traced, x: &Traced, y: &Traced, w: &Traced) -> Traced {
    let rank = v.rank();
    let dim = |d: usize| (d % rank) as isize;
    match step {
        Step::Tanh => v.tanh(),
        Step::ExpOfTanh => v.tanh().exp(),
        Step::LogAbsPlusOne => (v.abs() + 1.0).log(),
        Step::SqrtAbs => (v.abs() + 1.0).sqrt(), // +1: sqrt near 0 amplifies last-ulp differences
        Step::Sigmoid => v.sigmoid(),
        // A bounded argument (|4·tanh v| < 4, past sin's first range reduction): sin of a large
        // argument turns a last-ulp difference of it (an FMA contraction upstream, which the
        // op-by-op reference rounds twice) into an absolute error of that ulp (3e-5 at 270).
        Step::Sin => (v.tanh() * 4.0).sin(),
        Step::Neg => -v,
        Step::AddY => v + y,
        Step::MulY => v * y,
        Step::DivAbsYPlusOne => v / (y.abs() + 1.0),
        Step::MaxY => v.maximum(y),
        // The condition compares inputs: one of computed values flips at near-ties, where the
        // interpreter's f64 and the kernels' f32 round differently (a false alarm, not a bug).
        Step::WhereGreater => x.gt(y).where_(v, &(y * 0.5)),
        Step::Softmax(d) => v.softmax(dim(d)),
        // Scaled by the row's largest magnitude: `v − max v` cancels, so its error is relative
        // to |v| (an ulp of 200 is 1.5e-5), not to the (small) result.
        Step::SubRowMax(d) => {
            let axes = [dim(d)];
            (v - v.amax(&axes, true)) / (v.abs().amax(&axes, true) + 1.0)
        }
        // Scaled by 1 + |mean|: a product with the mean squares magnitudes, and a later GEMM or
        // `− max` then cancels terms whose rounding is relative to them, not to the result.
        Step::MulRowMean(d) => {
            let mean = v.mean(&[dim(d)], true);
            v * &mean / (mean.abs() + 1.0)
        }
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
        Step::Silu => v.silu(),
        Step::Matmul => {
            let n = w.shape()[0];
            v.matmul(&(w * (1.0 / n as f64)))
        }
        Step::CatStepped(d) => {
            let d = dim(d);
            // Halves, not negations: rows of `v` and `−v` sum to exactly 0, and a row mean or
            // sum of that cancels to rounding noise larger than any tolerance of zero.
            Traced::cat(&[v, &(v * 0.5)], d).slice(d, None, None, 2)
        }
        Step::Reverse(d) => {
            let d = dim(d);
            let n = v.shape()[d as usize];
            let positions = v.tracer().arange(n, DType::I64);
            v.index_select(d, &(positions * -1.0 + (n as f64 - 1.0)))
        }
        // The integer values come from the inputs (a comparison or truncation of computed values
        // flips at near-ties, where the interpreter's f64 and the kernels' f32 round
        // differently); `3x` is one f32 multiply, rounded alike by both.
        Step::CountGreater(d) => {
            v + x.gt(y).cast(DType::I64).cumsum(dim(d)).cast(DType::F32) * 0.01
        }
        Step::IntegerRowMax(d) => {
            v + (x * 3.0)
                .cast(DType::I64)
                .amax(&[dim(d)], true)
                .cast(DType::F32)
                * 0.1
        }
        Step::IntegerRowSum(d) => {
            v + x
                .gt(y)
                .cast(DType::I64)
                .sum(&[dim(d)], true)
                .cast(DType::F32)
                * 0.01
        }
    }
}

/// Whether `step` can be traced when dim 0 of a rank-`rank` value is symbolic: it must not read
/// that dim's size as a number (`shape()`), which a plain trace cannot answer.
fn symbolic_safe(step: Step, rank: usize) -> bool {
    let along_first = |d: usize| d.is_multiple_of(rank);
    match step {
        // These read `v.shape()`, every dim of it.
        Step::ReshapeRoundTrip | Step::AddArange(_) | Step::Reverse(_) | Step::Triu => false,
        Step::CatStepped(d) => !along_first(d),
        // A transposed value puts the symbol inside a buffer if it is realized (before a GEMM,
        // say), which `fuse` refuses (strides are numbers); `jit` falls back to static shapes
        // for such graphs.
        Step::TransposeRoundTrip => false,
        _ => true,
    }
}

fn data(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let values = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 250.0) - 2.0)
        .collect();
    Tensor::from_vec(shape, values).unwrap()
}

/// The sums over the last dim of `v` and of `|v|`, by the reference interpreter (in f64).
fn row_sums(v: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let tracer = Tracer::new();
    let input = tracer.input("v", v.dtype(), v.shape());
    let wide = input.cast(DType::F64);
    let sums = [wide.sum(&[-1], false), wide.abs().sum(&[-1], false)];
    let graph = tracer.finish(&sums).unwrap();
    let out = interpret(&graph, std::slice::from_ref(v)).unwrap();
    (out[0].to_f64_vec(), out[1].to_f64_vec())
}

/// Compares `got` with `want` (counts, shapes, dtypes, values within 2e-5), except output
/// `sum` (the row sum of output 0), which is checked against the exact (f64) sum of the values
/// the compiled graph returned, not of the reference's, with a tolerance that grows with the
/// sum of their magnitudes: where a row cancels (a row minus its maximum, a row of mixed signs),
/// last-ulp differences of `v` that pass their own comparison, and an f32 sum's own rounding
/// (about u·Σ|v|, as PyTorch's), exceed any fixed tolerance of a near-zero result. `v` itself
/// is compared with the reference, so the two comparisons still check every step.
fn compare_with_row_sum(
    got: &[Tensor],
    mut want: Vec<Tensor>,
    sum: Option<usize>,
    context: &str,
) -> Result<(), String> {
    if let Some(i) = sum.filter(|&i| i < got.len() && i < want.len()) {
        if got[i].shape() != want[i].shape() || got[i].dtype() != want[i].dtype() {
            return Err(format!(
                "{context}\noutput {i}: {:?} {:?}, expected {:?} {:?}",
                got[i].dtype(),
                got[i].shape(),
                want[i].dtype(),
                want[i].shape()
            ));
        }
        let (exact, magnitude) = row_sums(&got[0]);
        let found = got[i].to_f64_vec();
        for (k, ((&g, &s), &m)) in found.iter().zip(&exact).zip(&magnitude).enumerate() {
            let tolerance = 2e-5 * (1.0 + s.abs()) + 1e-6 * m;
            if !((g - s).abs() <= tolerance || (g.is_nan() && s.is_nan())) {
                return Err(format!(
                    "{context}\nrow sum {k}: {g}, exact sum of the compiled values {s} \
                     (±{tolerance})"
                ));
            }
        }
        want[i] = got[i].clone();
    }
    compare_outputs(got, &want, Tolerance::close(2e-5), context)
}

/// Shapes: mostly small (every tail length), sometimes above the threading threshold (2^15
/// elements), where kernels split their outer loop across threads.
fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        8 => prop::collection::vec(1usize..24, 1..4),
        1 => (1usize..4, 90usize..200, 100usize..180).prop_map(|(a, b, c)| vec![a, b, c]),
        1 => (200usize..300, 130usize..260).prop_map(|(a, b)| vec![a, b]),
    ]
}

/// 128 cases, or `PROPTEST_CASES` for a campaign.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn compiled_equals_reference(
        shape in shape_strategy(),
        broadcast_first in any::<bool>(),
        steps in prop::collection::vec(step_strategy(), 1..7),
        reduce_at_end in any::<bool>(),
        compare_at_end in any::<bool>(),
        half_inputs in prop_oneof![Just(None), Just(Some(DType::F16)), Just(Some(DType::BF16))],
        freeze_y_and_w in any::<bool>(),
    ) {
        let mut y_shape = shape.clone();
        if broadcast_first {
            y_shape[0] = 1;
        }
        let n = *shape.last().unwrap();
        let tracer = Tracer::new();
        let x = tracer.input("x", DType::F32, &shape);
        let y = tracer.input("y", DType::F32, &y_shape);
        let w = tracer.input("w", DType::F32, &[n, n]);
        // Rounding the inputs (exactly as the interpreter does) exercises the conversions
        // without amplifying last-ulp differences of later steps into half-precision ulps.
        let mut v = match half_inputs {
            Some(dt) => x.cast(dt).cast(DType::F32),
            None => x.clone(),
        };
        for &s in &steps {
            v = apply(s, &v, &x, &y, &w);
        }
        let mut outputs = vec![v.clone()];
        if reduce_at_end {
            outputs.push(v.sum(&[-1], false));
        }
        if compare_at_end {
            // Of the inputs: a comparison of computed values flips at near-ties, where the
            // interpreter's f64 and the kernels' f32 round differently.
            outputs.push(x.gt(&y));
        }
        let graph = tracer.finish(&outputs).unwrap();
        let inputs = [data(&shape, 1), data(&y_shape, 2), data(&[n, n], 3)];
        let want = interpret(&graph, &inputs).unwrap();
        // Frozen, `y` and `w` are constants: what depends on them only is computed at compile
        // time, and a GEMM reading `w` reads it packed once.
        let got = if freeze_y_and_w {
            let constants = [("y", inputs[1].clone()), ("w", inputs[2].clone())];
            compile_frozen(&graph, &constants).unwrap().call(&inputs[..1]).unwrap()
        } else {
            compile(&graph).unwrap().call(&inputs).unwrap()
        };
        let sum = reduce_at_end.then_some(1);
        let compared = compare_with_row_sum(&got, want, sum, &graph.to_string());
        prop_assert!(compared.is_ok(), "{}", compared.unwrap_err());
    }
}

/// The graph of `steps` over `x: [batch, rest…]`, `y` (dim 0 of size 1 if `broadcast_first`)
/// and `w: [n, n]`; `batch` is a symbol when `None`.
fn batch_graph(
    batch: Option<usize>,
    rest: &[usize],
    broadcast_first: bool,
    steps: &[Step],
) -> minductor::Graph {
    let first = match batch {
        Some(b) => Dim::Static(b),
        None => Dim::Sym(SymId(0)),
    };
    let typed = |first: Dim| {
        let shape = std::iter::once(first)
            .chain(rest.iter().map(|&d| Dim::Static(d)))
            .collect();
        TensorType::new(DType::F32, shape)
    };
    let n = *rest.last().unwrap();
    let tracer = Tracer::new();
    let x = tracer.input_typed("x", typed(first));
    let y_first = if broadcast_first {
        Dim::Static(1)
    } else {
        first
    };
    let y = tracer.input_typed("y", typed(y_first));
    let w = tracer.input("w", DType::F32, &[n, n]);
    let mut v = x.clone();
    for &s in steps {
        v = apply(s, &v, &x, &y, &w);
    }
    let outputs = [v.clone(), v.sum(&[-1], false)];
    tracer.finish(&outputs).unwrap()
}

/// 32 cases, or `PROPTEST_CASES / 4` for a campaign.
fn symbolic_cases() -> u32 {
    (cases() / 4).max(1)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: symbolic_cases(), ..ProptestConfig::default() })]

    #[test]
    fn symbolic_batch_compiled_once_equals_reference_at_two_sizes(
        rest in prop::collection::vec(1usize..20, 1..3),
        sizes in (1usize..40, 1usize..40),
        broadcast_first in any::<bool>(),
        steps in prop::collection::vec(step_strategy(), 1..6),
    ) {
        let rank = rest.len() + 1;
        let steps: Vec<Step> = steps
            .into_iter()
            .map(|s| if symbolic_safe(s, rank) { s } else { Step::Tanh })
            .collect();
        let symbolic = batch_graph(None, &rest, broadcast_first, &steps);
        let compiled = compile(&symbolic).unwrap();
        let n = *rest.last().unwrap();
        for batch in [sizes.0, sizes.1] {
            let mut shape = vec![batch];
            shape.extend(&rest);
            let mut y_shape = shape.clone();
            if broadcast_first {
                y_shape[0] = 1;
            }
            let inputs = [data(&shape, 1), data(&y_shape, 2), data(&[n, n], 3)];
            let graph = batch_graph(Some(batch), &rest, broadcast_first, &steps);
            let want = interpret(&graph, &inputs).unwrap();
            let got = compiled.call(&inputs).unwrap();
            let context = format!("batch {batch}\n{symbolic}");
            let compared = compare_with_row_sum(&got, want, Some(1), &context);
            prop_assert!(compared.is_ok(), "{}", compared.unwrap_err());
        }
    }
}

/// `apply` for a value with a symbolic dim: steps that read sizes as numbers are written with
/// `dims()` (an arange of the dim, reshapes with `-1`, a fixed GEMM scale, a `cat` along the
/// symbolic dim split back by a reshape, whose sizes are derived: `2*s0`) or replaced by `tanh`
/// (a reshape round trip, `index_select` at reversed positions).
fn apply_symbolic(
    step: Step,
    v: &Traced,
    x: &Traced,
    y: &Traced,
    w: &Traced,
    symbolic: usize,
) -> Traced {
    let rank = v.rank();
    match step {
        Step::ReshapeRoundTrip | Step::Reverse(_) => v.tanh(),
        Step::CatStepped(d) if d % rank == symbolic => {
            // `cat([v, v / 2], d)` along the symbolic dim has the derived size `2*s0`; a
            // reshape splits it back into `[2, s0]` and a sum over the 2 gives `1.5 * v`.
            let d = d % rank;
            let grown = Traced::cat(&[v, &(v * 0.5)], d as isize);
            let mut split: Vec<isize> = Vec::new();
            for (i, dim) in v.dims().iter().enumerate() {
                if i == d {
                    split.extend([2, -1]);
                } else {
                    split.push(dim.size() as isize);
                }
            }
            grown.reshape(&split).sum(&[d as isize], false)
        }
        Step::AddArange(d) => {
            let d = d % rank;
            let mut column = vec![1isize; rank];
            column[d] = -1;
            let positions = v.tracer().arange_of(v.dims()[d].clone(), DType::F32);
            v + positions.reshape(&column) * 0.1
        }
        Step::Matmul => v.matmul(&(w * (1.0 / 24.0))),
        other => apply(other, v, x, y, w),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases() / 4, ..ProptestConfig::default() })]

    /// One dim (any position) symbolic: one compile, called at two sizes of it, each compared
    /// with the interpreter on a static trace of the same steps at that size.
    #[test]
    fn compiled_with_a_symbolic_dim_equals_reference(
        shape in prop::collection::vec(1usize..24, 1..4),
        symbolic_at in 0usize..3,
        sizes in (2usize..40, 2usize..40),
        broadcast_first in any::<bool>(),
        steps in prop::collection::vec(step_strategy(), 1..7),
        reduce_at_end in any::<bool>(),
    ) {
        use minductor::{Dim, SymId, TensorType};
        let symbolic = symbolic_at % shape.len();
        // The graph's types with the symbolic dim as `s0`, or as the number `size`.
        let build = |size: Option<usize>| {
            let dim = |d: usize, n: usize| match (d == symbolic, size) {
                (false, _) => Dim::Static(n),
                (true, Some(s)) => Dim::Static(s),
                (true, None) => Dim::Sym(SymId(0)),
            };
            let x_shape: Vec<Dim> = shape.iter().enumerate().map(|(d, &n)| dim(d, n)).collect();
            let mut y_shape = x_shape.clone();
            if broadcast_first {
                y_shape[0] = Dim::Static(1);
            }
            let last = *x_shape.last().unwrap();
            let tracer = Tracer::new();
            let typed = |dims: Vec<Dim>| TensorType::new(DType::F32, dims.into_iter().collect());
            let x = tracer.input_typed("x", typed(x_shape));
            let y = tracer.input_typed("y", typed(y_shape));
            let w = tracer.input_typed("w", typed(vec![last, last]));
            let mut v = x.clone();
            for &s in &steps {
                v = apply_symbolic(s, &v, &x, &y, &w, symbolic);
            }
            let mut outputs = vec![v.clone()];
            if reduce_at_end {
                outputs.push(v.sum(&[-1], false));
            }
            tracer.finish(&outputs).unwrap()
        };
        let compiled = compile(&build(None)).unwrap();
        for size in [sizes.0, sizes.1] {
            let mut x_shape = shape.clone();
            x_shape[symbolic] = size;
            let mut y_shape = x_shape.clone();
            if broadcast_first {
                y_shape[0] = 1;
            }
            let n = *x_shape.last().unwrap();
            let inputs = [data(&x_shape, 1), data(&y_shape, 2), data(&[n, n], 3)];
            let graph = build(Some(size));
            let want = interpret(&graph, &inputs).unwrap();
            let got = compiled.call(&inputs).unwrap();
            let sum = reduce_at_end.then_some(1);
            let compared = compare_with_row_sum(&got, want, sum, &graph.to_string());
            prop_assert!(compared.is_ok(), "s0 = {size}: {}", compared.unwrap_err());
        }
    }
}
