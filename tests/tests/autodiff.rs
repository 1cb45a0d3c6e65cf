//! Gradients checked against central finite differences through the reference interpreter, for
//! every differentiable prim and composite, on random graphs (proptest), and compiled (inductor)
//! against eager; plus the bad-input contract of `grad`.
//!
//! The check: for `f` traced over f64 inputs, the loss is `Σ f(x)·w` for a fixed random `w`. Its
//! gradient from `grad` (eager: the joint graph interpreted, in f64) must match
//! `(L(x + h·e_j) − L(x − h·e_j)) / 2h` for every element `j` of every float input, where `f` is
//! interpreted in f64 and the weighted sum taken in f64 outside the graph, within
//! `1e-5 + 1e-5·|g|`, with h = 1e-6·(1 + |x_j|) (rounding error about 1e-10, truncation about
//! 1e-12). The same graph in f32 then runs on aot_eager and inductor against eager.

use minductor::PartitionOptions;
use minductor::{
    compile_with, interpret, Backend, CompileOptions, ConvOptions, CrossEntropyOptions, DType,
    Tensor, Traced, Tracer,
};
use minductor_tests::{assert_allclose, Tolerance};
use proptest::prelude::*;

/// An input of a gradient check: name, dtype, shape and the range its values are drawn from.
#[derive(Clone, Debug)]
struct Spec {
    name: &'static str,
    dtype: DType,
    shape: Vec<usize>,
    low: f32,
    high: f32,
    /// Values a permutation of evenly spaced points in `low..high` (no near-ties for max/min).
    distinct: bool,
}

fn distinct_input(name: &'static str, shape: &[usize], low: f32, high: f32) -> Spec {
    Spec {
        distinct: true,
        ..f32_input(name, shape, low, high)
    }
}

fn f32_input(name: &'static str, shape: &[usize], low: f32, high: f32) -> Spec {
    Spec {
        name,
        dtype: DType::F32,
        shape: shape.to_vec(),
        low,
        high,
        distinct: false,
    }
}

fn index_input(name: &'static str, shape: &[usize], classes: usize) -> Spec {
    Spec {
        name,
        dtype: DType::I64,
        shape: shape.to_vec(),
        low: 0.0,
        high: classes as f32,
        distinct: false,
    }
}

fn values(spec: &Spec, seed: u64) -> Tensor {
    let t = minductor_tools::workloads::uniform(&spec.shape, spec.low, spec.high, seed);
    if spec.distinct {
        // Rank the random values and map rank r to low + (r + 0.5)·(high − low)/n.
        let v = t.to_vec::<f32>().unwrap();
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
        let mut out = vec![0f32; v.len()];
        let step = (spec.high - spec.low) / v.len() as f32;
        for (rank, &i) in order.iter().enumerate() {
            out[i] = spec.low + (rank as f32 + 0.5) * step;
        }
        return Tensor::from_vec(&spec.shape, out).unwrap();
    }
    match spec.dtype {
        DType::I64 => {
            let v: Vec<i64> = t
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|&x| (x.floor() as i64).clamp(0, spec.high as i64 - 1))
                .collect();
            Tensor::from_vec(&spec.shape, v).unwrap()
        }
        _ => t,
    }
}

fn floats(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

/// The inputs of `specs`, float ones in `float` (drawn in f32, so both precisions see the
/// same values).
fn inputs_in(specs: &[Spec], float: DType) -> Vec<Tensor> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let t = values(s, 17 + i as u64);
            if s.dtype.is_float() {
                Tensor::from_f64(float, &s.shape, &t.to_f64_vec()).unwrap()
            } else {
                t
            }
        })
        .collect()
}

/// `f` over `specs` with float inputs in `float`: alone (for finite differences), and as the
/// joint graph `[Σ f·w, d/d each float input]` with a weight input `w` last.
fn trace_in(
    name: &str,
    specs: &[Spec],
    float: DType,
    f: &impl Fn(&[Traced]) -> Traced,
) -> (minductor::Graph, minductor::Graph) {
    let declare = |t: &Tracer| -> Vec<Traced> {
        specs
            .iter()
            .map(|s| {
                let dtype = if s.dtype.is_float() { float } else { s.dtype };
                t.input(s.name, dtype, &s.shape)
            })
            .collect()
    };
    let forward = {
        let t = Tracer::new();
        let xs = declare(&t);
        let y = f(&xs);
        t.finish(&[y]).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let out_shape: Vec<usize> = forward.ty(forward.outputs()[0]).static_sizes().unwrap();
    let joint = {
        let t = Tracer::new();
        let xs = declare(&t);
        let w = t.input("w", float, &out_shape);
        let loss = (f(&xs) * &w).sum(&[], false);
        let targets: Vec<&Traced> = specs
            .iter()
            .zip(&xs)
            .filter(|(s, _)| s.dtype.is_float())
            .map(|(_, x)| x)
            .collect();
        let mut outs = vec![loss.clone()];
        outs.extend(loss.grad(&targets));
        t.finish(&outs).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    (forward, joint)
}

/// Checks the gradient of `Σ f(inputs)·w` with respect to every float input: in f64, eager (the
/// joint graph interpreted) against central finite differences of the interpreted `f`; in f32,
/// aot_eager and inductor against eager.
fn check(name: &str, specs: &[Spec], f: impl Fn(&[Traced]) -> Traced) {
    let (forward, joint) = trace_in(name, specs, DType::F64, &f);
    let inputs = inputs_in(specs, DType::F64);
    let out_shape: Vec<usize> = forward.ty(forward.outputs()[0]).static_sizes().unwrap();
    let weights32 = minductor_tools::workloads::uniform(&out_shape, -1.0, 1.0, 99);
    let weights = Tensor::from_f64(DType::F64, &out_shape, &weights32.to_f64_vec()).unwrap();
    let weight_values = floats(&weights);
    let loss_of = |inputs: &[Tensor]| -> f64 {
        let y = floats(&interpret(&forward, inputs).unwrap()[0]);
        y.iter().zip(&weight_values).map(|(a, b)| a * b).sum()
    };
    let wrt: Vec<usize> = (0..specs.len())
        .filter(|&i| specs[i].dtype.is_float())
        .collect();
    let mut all = inputs.clone();
    all.push(weights);
    let eager = compile_with(&joint, Backend::Eager)
        .unwrap()
        .call(&all)
        .unwrap_or_else(|e| panic!("{name}: eager: {e}"));
    for (k, &i) in wrt.iter().enumerate() {
        let grad = floats(&eager[1 + k]);
        let x = floats(&inputs[i]);
        for j in 0..x.len() {
            let h = 1e-6 * (1.0 + x[j].abs());
            let at = |delta: f64| {
                let mut moved = inputs.clone();
                let mut v = x.clone();
                v[j] += delta;
                moved[i] = Tensor::from_f64(DType::F64, &specs[i].shape, &v).unwrap();
                loss_of(&moved)
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            let tolerance = 1e-5 + 1e-5 * numeric.abs().max(grad[j].abs());
            assert!(
                (numeric - grad[j]).abs() <= tolerance,
                "{name}: d loss / d {}[{j}]: autodiff {} vs finite differences {numeric}",
                specs[i].name,
                grad[j]
            );
        }
    }
    // The same gradients compiled, in f32, against eager.
    let (_, joint32) = trace_in(name, specs, DType::F32, &f);
    let mut all32 = inputs_in(specs, DType::F32);
    all32.push(weights32);
    let eager32 = compile_with(&joint32, Backend::Eager)
        .unwrap()
        .call(&all32)
        .unwrap_or_else(|e| panic!("{name}: eager f32: {e}"));
    for backend in [Backend::AotEager, Backend::Inductor] {
        let got = compile_with(&joint32, backend)
            .unwrap_or_else(|e| panic!("{name}: {backend:?}: {e}"))
            .call(&all32)
            .unwrap_or_else(|e| panic!("{name}: {backend:?}: {e}"));
        assert_allclose(
            &got,
            &eager32,
            Tolerance::close(1e-4),
            &format!("{}: {:?}", name, backend),
        );
    }
}

const S: &[usize] = &[3, 5];

#[test]
fn unary_prims() {
    let x = |low, high| vec![f32_input("x", S, low, high)];
    check("neg", &x(-2.0, 2.0), |i| -&i[0]);
    check("abs", &x(0.2, 2.0), |i| i[0].abs());
    check("abs_negative", &x(-2.0, -0.2), |i| i[0].abs());
    check("exp", &x(-2.0, 2.0), |i| i[0].exp());
    check("log", &x(0.3, 3.0), |i| i[0].log());
    check("sqrt", &x(0.3, 3.0), |i| i[0].sqrt());
    check("rsqrt", &x(0.3, 3.0), |i| i[0].rsqrt());
    check("sin", &x(-3.0, 3.0), |i| i[0].sin());
    check("cos", &x(-3.0, 3.0), |i| i[0].cos());
    check("tanh", &x(-2.0, 2.0), |i| i[0].tanh());
    check("erf", &x(-2.0, 2.0), |i| i[0].erf());
    check("sigmoid", &x(-3.0, 3.0), |i| i[0].sigmoid());
}

#[test]
fn binary_prims_with_broadcasting() {
    let ab = |b_shape: &[usize], low: f32| {
        vec![
            f32_input("a", S, low, 2.0),
            f32_input("b", b_shape, 0.5, 2.0),
        ]
    };
    for b_shape in [&[3usize, 5][..], &[5], &[3, 1], &[]] {
        check("add", &ab(b_shape, -2.0), |i| &i[0] + &i[1]);
        check("sub", &ab(b_shape, -2.0), |i| &i[0] - &i[1]);
        check("mul", &ab(b_shape, -2.0), |i| &i[0] * &i[1]);
        check("div", &ab(b_shape, -2.0), |i| &i[0] / &i[1]);
        check("pow", &ab(b_shape, 0.5), |i| i[0].pow(&i[1]));
    }
    // Inputs drawn from disjoint ranges, so the comparisons have no ties within the step.
    let apart = vec![
        distinct_input("a", S, -2.0, -1.0),
        distinct_input("b", S, 1.0, 2.0),
    ];
    check("maximum", &apart, |i| {
        i[0].maximum(&i[1]) + i[1].maximum(&i[0]) * 2.0
    });
    check("minimum", &apart, |i| {
        i[0].minimum(&i[1]) + i[1].minimum(&i[0]) * 2.0
    });
    let mixed = vec![f32_input("a", S, -2.0, 2.0), f32_input("b", S, -2.0, 2.0)];
    check("where", &mixed, |i| {
        i[0].gt(0.3).where_(&(&i[0] * &i[1]), &i[1].sin())
    });
    check("pow_scalar", &[f32_input("x", S, 0.5, 2.0)], |i| {
        i[0].pow(1.7)
    });
}

#[test]
fn casts_pass_the_gradient_through() {
    // Rounding to f16 is a step function; its gradient, as in PyTorch, is the identity.
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[3]);
    let y = x.cast(DType::F16).cast(DType::F32) * 3.0;
    let g = y.sum(&[], false).grad(&[&x]);
    let graph = t.finish(&g).unwrap();
    let xs = Tensor::from_vec(&[3], vec![0.1f32, 1.0 / 3.0, -7.7]).unwrap();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(std::slice::from_ref(&xs))
            .unwrap();
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![3., 3., 3.],
            "{backend:?}"
        );
    }
}

#[test]
fn reductions() {
    let x = vec![distinct_input("x", &[2, 3, 4], -2.0, 2.0)];
    for dims in [&[0isize][..], &[1], &[2], &[0, 2], &[]] {
        for keepdim in [false, true] {
            check("sum", &x, |i| i[0].sum(dims, keepdim).sin());
            check("amax", &x, |i| i[0].amax(dims, keepdim));
            check("amin", &x, |i| i[0].amin(dims, keepdim));
            check("mean", &x, |i| i[0].mean(dims, keepdim).exp());
        }
    }
    check("var", &x, |i| i[0].var(&[-1], true, false));
}

#[test]
fn amax_splits_the_gradient_between_ties() {
    // Rows with repeated maxima: PyTorch's amax gives each tied element an equal share.
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[2, 3]);
    let g = x.amax(&[1], false).sum(&[], false).grad(&[&x]);
    let graph = t.finish(&g).unwrap();
    let input = Tensor::from_vec(&[2, 3], vec![1f32, 3., 3., 2., 0., 1.]).unwrap();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(std::slice::from_ref(&input))
            .unwrap();
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![0., 0.5, 0.5, 1., 0., 0.],
            "{backend:?}"
        );
    }
}

#[test]
fn views() {
    let x = vec![f32_input("x", &[2, 3, 4], -2.0, 2.0)];
    check("reshape", &x, |i| i[0].reshape(&[6, 4]).sin());
    check("permute", &x, |i| i[0].permute(&[2, 0, 1]).sin() * 1.5);
    check("transpose", &x, |i| i[0].transpose(1, 2).exp());
    check("expand", &[f32_input("x", &[3, 1], -2.0, 2.0)], |i| {
        i[0].expand(&[2, 3, 4]).sin()
    });
    for (start, end, step) in [(0, 4, 1), (1, 4, 2), (0, 3, 3), (1, 2, 1)] {
        check("slice", &x, |i| {
            i[0].slice(2, Some(start), Some(end), step).sin()
        });
    }
    check(
        "cat",
        &[
            f32_input("a", &[2, 3], -2.0, 2.0),
            f32_input("b", &[2, 2], -2.0, 2.0),
        ],
        |i| Traced::cat(&[&i[0], &i[1], &i[0]], 1).sin(),
    );
}

#[test]
fn gathers_and_scatters() {
    // Indices repeat: their gradients accumulate.
    let specs = vec![
        index_input("idx", &[4, 3], 5),
        f32_input("table", &[5, 2], -2.0, 2.0),
    ];
    check("embedding", &specs, |i| i[0].embedding(&i[1]).sin());
    let specs = vec![
        f32_input("x", &[4, 6], -2.0, 2.0),
        index_input("idx", &[4, 3], 6),
    ];
    check("gather_dim1", &specs, |i| i[0].gather(1, &i[1]).exp());
    let specs = vec![
        f32_input("x", &[4, 6], -2.0, 2.0),
        index_input("idx", &[2, 6], 4),
    ];
    check("gather_dim0", &specs, |i| i[0].gather(0, &i[1]).exp());
}

#[test]
fn matmuls() {
    check(
        "matmul_2d",
        &[
            f32_input("a", &[3, 4], -1.0, 1.0),
            f32_input("b", &[4, 5], -1.0, 1.0),
        ],
        |i| i[0].matmul(&i[1]).sin(),
    );
    check(
        "matmul_batched_broadcast",
        &[
            f32_input("a", &[2, 1, 3, 4], -1.0, 1.0),
            f32_input("b", &[3, 4, 2], -1.0, 1.0),
        ],
        |i| i[0].matmul(&i[1]).tanh(),
    );
    check(
        "matmul_vector",
        &[
            f32_input("a", &[3, 4], -1.0, 1.0),
            f32_input("v", &[4], -1.0, 1.0),
        ],
        |i| i[0].matmul(&i[1]).exp(),
    );
    check(
        "linear",
        &[
            f32_input("x", &[3, 4], -1.0, 1.0),
            f32_input("w", &[5, 4], -1.0, 1.0),
            f32_input("b", &[5], -1.0, 1.0),
        ],
        |i| i[0].linear(&i[1], Some(&i[2])).gelu(),
    );
}

#[test]
fn composites() {
    let x = vec![f32_input("x", &[3, 6], -2.0, 2.0)];
    check("softmax", &x, |i| i[0].softmax(-1));
    check("softmax_dim0", &x, |i| i[0].softmax(0));
    check("log_softmax", &x, |i| i[0].log_softmax(1));
    check("gelu", &x, |i| i[0].gelu());
    check("gelu_tanh", &x, |i| i[0].gelu_tanh());
    check("silu", &x, |i| i[0].silu());
    check(
        "relu_away_from_zero",
        &[f32_input("x", &[3, 6], 0.2, 2.0)],
        |i| i[0].relu(),
    );
    check("reciprocal", &[f32_input("x", &[3, 6], 0.5, 2.0)], |i| {
        i[0].reciprocal()
    });
    check(
        "layer_norm",
        &[
            f32_input("x", &[3, 6], -2.0, 2.0),
            f32_input("g", &[6], 0.5, 1.5),
            f32_input("b", &[6], -1.0, 1.0),
        ],
        |i| i[0].layer_norm(&[6], Some(&i[1]), Some(&i[2]), 1e-5),
    );
    check(
        "mse_loss",
        &[
            f32_input("x", &[3, 6], -2.0, 2.0),
            f32_input("t", &[3, 6], -2.0, 2.0),
        ],
        |i| i[0].mse_loss(&i[1]).reshape(&[1]),
    );
    let ce = vec![
        f32_input("logits", &[5, 4], -2.0, 2.0),
        index_input("y", &[5], 4),
    ];
    check("cross_entropy", &ce, |i| {
        i[0].cross_entropy(&i[1]).reshape(&[1])
    });
    check("cross_entropy_smoothed", &ce, |i| {
        i[0].cross_entropy_with(
            &i[1],
            CrossEntropyOptions {
                label_smoothing: 0.1,
                ..Default::default()
            },
        )
        .reshape(&[1])
    });
    check("nll_loss", &ce, |i| {
        i[0].log_softmax(1).nll_loss(&i[1]).reshape(&[1])
    });
}

/// Found by the random graphs: a kernel stored one value in place of the buffer that another of
/// its stored values still loaded, after the load had been deferred (a math block handed over
/// `sin(u)` without evaluating `u`): every stored value is now computed before any store.
#[test]
fn stores_in_place_wait_for_every_value_of_their_stage() {
    let specs = [
        f32_input("x", &[2, 3], -1.5, 1.5),
        f32_input("y", &[3], -1.5, 1.5),
    ];
    check("matmul_sin_softmax0", &specs, |i| {
        let x = &i[0];
        let m = x.matmul(&x.transpose(0, 1)).matmul(x) * 0.1;
        (m.sin() * &i[1]).softmax(0)
    });
}

#[test]
fn layers_of_real_models() {
    let x = vec![f32_input("x", &[3, 5], -2.0, 2.0)];
    check("cumsum_last", &x, |i| i[0].cumsum(-1));
    check("cumsum_first", &x, |i| i[0].cumsum(0));
    check("triu", &x, |i| i[0].triu(1));
    check("tril", &x, |i| i[0].tril(0));
    check("repeat_interleave", &x, |i| i[0].repeat_interleave(2, 0));
    check(
        "max_with_indices",
        &[distinct_input("x", &[3, 5], -2.0, 2.0)],
        |i| i[0].max_dim(1, false).0,
    );
    let images = [
        f32_input("x", &[2, 4, 5, 6], -1.0, 1.0),
        f32_input("w", &[6, 2, 3, 3], -0.5, 0.5),
        f32_input("b", &[6], -1.0, 1.0),
    ];
    check("conv2d", &images, |i| {
        let options = ConvOptions::default().padding(1).stride(2).groups(2);
        i[0].conv2d(&i[1], Some(&i[2]), options)
    });
    check(
        "conv2d_depthwise",
        &[images[0].clone(), f32_input("w", &[4, 1, 3, 3], -0.5, 0.5)],
        |i| i[0].conv2d(&i[1], None, ConvOptions::default().padding(1).groups(4)),
    );
    check(
        "max_pool2d",
        &[distinct_input("x", &[1, 2, 5, 5], -1.0, 1.0)],
        |i| i[0].max_pool2d(3, 2, 1),
    );
    let qkv = [
        f32_input("q", &[1, 2, 4, 3], -1.0, 1.0),
        f32_input("k", &[1, 2, 4, 3], -1.0, 1.0),
        f32_input("v", &[1, 2, 4, 3], -1.0, 1.0),
    ];
    check("causal_attention", &qkv, |i| {
        i[0].scaled_dot_product_attention(&i[1], &i[2], None, true)
    });
}

#[test]
fn cross_entropy_ignores_ignore_index_and_smooths_like_pytorch() {
    // Two rows, three classes; the second row is ignored. Row 0: logits (1, 2, 3), target 2.
    // log_softmax = x − log(e + e² + e³); PyTorch's loss is the mean over non-ignored rows of
    // (1 − ε)·nll + ε/C·(−Σ log p).
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[2, 3]);
    let y = t.input("y", DType::I64, &[2]);
    let options = CrossEntropyOptions {
        ignore_index: -100,
        label_smoothing: 0.2,
    };
    let loss = x.cross_entropy_with(&y, options);
    let graph = t.finish(&[loss]).unwrap();
    let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
    let logp = [1.0 - lse, 2.0 - lse, 3.0 - lse];
    let want = 0.8 * -logp[2] + 0.2 / 3.0 * -(logp[0] + logp[1] + logp[2]);
    let xs = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 7., -1., 0.5]).unwrap();
    let ys = Tensor::from_vec(&[2], vec![2i64, -100]).unwrap();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(&[xs.clone(), ys.clone()])
            .unwrap();
        let got = out[0].to_f64_vec()[0];
        assert!((got - want).abs() < 1e-6, "{backend:?}: {got} vs {want}");
    }
}

#[test]
fn second_derivative() {
    // d/dx Σ (d/dx Σ x³) = d/dx Σ 3x² = 6x.
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[4]);
    let first = (&x * &x * &x).sum(&[], false).grad(&[&x]);
    let second = first[0].sum(&[], false).grad(&[&x]);
    let graph = t.finish(&second).unwrap();
    let xs = Tensor::from_vec(&[4], vec![1f32, -2., 0.5, 3.]).unwrap();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(std::slice::from_ref(&xs))
            .unwrap();
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![6., -12., 3., 18.],
            "{backend:?}"
        );
    }
}

#[test]
fn detach_and_unused_values_get_zero_gradients() {
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[3]);
    let unused = t.input("unused", DType::F32, &[2]);
    let loss = (&x * &x.detach()).sum(&[], false);
    let g = loss.grad(&[&x, &unused]);
    let graph = t.finish(&g).unwrap();
    let xs = Tensor::from_vec(&[3], vec![1f32, 2., 3.]).unwrap();
    let us = Tensor::from_vec(&[2], vec![5f32, 6.]).unwrap();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(&[xs.clone(), us.clone()])
            .unwrap();
        // The detached factor is a constant: d(x·c)/dx = c = x.
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![1., 2., 3.],
            "{backend:?}"
        );
        assert_eq!(out[1].to_vec::<f32>().unwrap(), vec![0., 0.], "{backend:?}");
    }
}

#[test]
fn explicit_output_gradients() {
    // grad_with: the vector-Jacobian product of y = x² with v is 2·x·v.
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[3]);
    let v = t.input("v", DType::F32, &[3]);
    let y = &x * &x;
    let g = y.grad_with(&v, &[&x]);
    let graph = t.finish(&g).unwrap();
    let xs = Tensor::from_vec(&[3], vec![1f32, 2., 3.]).unwrap();
    let vs = Tensor::from_vec(&[3], vec![1f32, 0.5, -1.]).unwrap();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(&[xs.clone(), vs.clone()])
            .unwrap();
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![2., 2., -6.],
            "{backend:?}"
        );
    }
}

#[test]
fn bad_gradient_requests_are_trace_errors_naming_the_value() {
    let err = minductor::trace(|t| {
        let x = t.input("x", DType::F32, &[3]);
        let idx = t.input("idx", DType::I64, &[3]);
        (&x * 2.0).sum(&[], false).grad(&[&x, &idx])
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("input `idx` (i64[3])") && err.contains("floating-point"),
        "{err}"
    );

    let err = minductor::trace(|t| {
        let x = t.input("x", DType::F32, &[3]);
        (&x * 2.0).grad(&[&x])
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("not a scalar") && err.contains("grad_with"),
        "{err}"
    );

    let err = minductor::trace(|t| {
        let x = t.input("x", DType::F32, &[3]);
        let v = t.input("v", DType::F32, &[4]);
        (&x * 2.0).grad_with(&v, &[&x])
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("input `v` (f32[4])"), "{err}");

    let err = minductor::trace(|t| {
        let mask = t.input("mask", DType::Bool, &[3]);
        let x = t.input("x", DType::F32, &[3]);
        mask.cast(DType::I64).sum(&[], false).grad(&[&x])
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("cannot differentiate") && err.contains("i64"),
        "{err}"
    );
}

#[test]
fn the_partitioner_saves_gemm_outputs_and_recomputes_pointwise_chains() {
    // The MLP's train step: the forward GEMM outputs and the gelu a backward GEMM reads are
    // saved; the bias add and the gelu pieces its derivative needs are recomputed.
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[8, 16]);
    let tt = t.input("t", DType::F32, &[8, 16]);
    let w1 = t.input("w1", DType::F32, &[32, 16]);
    let b1 = t.input("b1", DType::F32, &[32]);
    let w2 = t.input("w2", DType::F32, &[16, 32]);
    let b2 = t.input("b2", DType::F32, &[16]);
    let loss = x
        .linear(&w1, Some(&b1))
        .gelu()
        .linear(&w2, Some(&b2))
        .mse_loss(&tt);
    let mut outs = vec![loss.clone()];
    outs.extend(loss.grad(&[&w1, &b1, &w2, &b2]));
    let graph = t.finish(&outs).unwrap();
    let compiled = compile_with(&graph, Backend::Inductor).unwrap();
    let partition = compiled
        .artifacts()
        .partition
        .as_ref()
        .expect("a joint graph is partitioned");
    let saved: Vec<(&str, Vec<usize>)> = partition
        .saved
        .iter()
        .map(|s| (s.op.as_str(), s.ty.static_sizes().unwrap()))
        .collect();
    assert!(saved.contains(&("matmul", vec![8, 32])), "{partition}");
    assert!(saved.contains(&("matmul", vec![8, 16])), "{partition}");
    assert_eq!(
        partition.saved_bytes(),
        (8 * 32 * 2 + 8 * 16) * 4,
        "{partition}"
    );
    assert!(
        partition
            .recomputed
            .iter()
            .any(|&id| partition.graph.node(id).op.name() == "erf"),
        "{partition}"
    );
    // A tighter budget saves less and recomputes GEMMs in the backward instead.
    let tight = minductor::compile_with_options(
        &graph,
        CompileOptions {
            backend: Backend::Inductor,
            partition: PartitionOptions {
                activation_memory_budget: 0.0,
            },
            ..CompileOptions::default()
        },
    )
    .unwrap();
    let tight_partition = tight.artifacts().partition.as_ref().unwrap();
    assert!(
        tight_partition.saved_bytes() < partition.saved_bytes(),
        "{tight_partition}"
    );
    let inputs: Vec<Tensor> = [[8, 16], [8, 16]]
        .iter()
        .map(|s| s.to_vec())
        .chain([vec![32, 16], vec![32], vec![16, 32], vec![16]])
        .enumerate()
        .map(|(i, s)| minductor_tools::workloads::uniform(&s, -1.0, 1.0, i as u64))
        .collect();
    let want = compile_with(&graph, Backend::Eager)
        .unwrap()
        .call(&inputs)
        .unwrap();
    for c in [&compiled, &tight] {
        assert_allclose(
            &c.call(&inputs).unwrap(),
            &want,
            Tolerance::close(1e-4),
            &format!("{}: {:?}", "partitioned", Backend::Inductor),
        );
    }
}

/// A smooth shape-preserving step for random differentiated graphs.
#[derive(Clone, Copy, Debug)]
enum Step {
    Tanh,
    Sin,
    Sigmoid,
    ExpTanh,
    LogOnePlusSquare,
    MulY,
    AddY,
    DivOnePlusYSquare,
    Softmax(usize),
    LayerNorm,
    SubMean(usize),
    Transpose,
    SliceCat,
    MatmulSquare,
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Tanh),
        Just(Step::Sin),
        Just(Step::Sigmoid),
        Just(Step::ExpTanh),
        Just(Step::LogOnePlusSquare),
        Just(Step::MulY),
        Just(Step::AddY),
        Just(Step::DivOnePlusYSquare),
        (0usize..2).prop_map(Step::Softmax),
        Just(Step::LayerNorm),
        (0usize..2).prop_map(Step::SubMean),
        Just(Step::Transpose),
        Just(Step::SliceCat),
        Just(Step::MatmulSquare),
    ]
}

fn apply(step: Step, v: &Traced, y: &Traced) -> Traced {
    let n = v.shape()[1];
    match step {
        Step::Tanh => v.tanh(),
        Step::Sin => v.sin(),
        Step::Sigmoid => v.sigmoid(),
        Step::ExpTanh => v.tanh().exp(),
        Step::LogOnePlusSquare => (v * v + 1.0).log(),
        Step::MulY => v * y,
        Step::AddY => v + y,
        Step::DivOnePlusYSquare => v / (y * y + 1.0),
        Step::Softmax(d) => v.softmax(d as isize),
        // A large eps keeps the normalisation well-conditioned for finite differences.
        Step::LayerNorm => v.layer_norm(&[n], None, None, 0.1),
        Step::SubMean(d) => v - v.mean(&[d as isize], true),
        Step::Transpose => v.transpose(0, 1).transpose(0, 1) * 0.5,
        Step::SliceCat => Traced::cat(
            &[&v.slice(1, Some(1), None, 1), &v.slice(1, None, Some(1), 1)],
            1,
        ),
        Step::MatmulSquare => v.matmul(&v.transpose(0, 1)).matmul(v) * 0.1,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_graphs_differentiate_like_finite_differences(
        steps in proptest::collection::vec(step_strategy(), 1..5),
        rows in 1usize..4,
        cols in 2usize..5,
    ) {
        let specs = vec![
            f32_input("x", &[rows, cols], -1.5, 1.5),
            f32_input("y", &[cols], -1.5, 1.5),
        ];
        let label = format!("{steps:?} on [{rows}, {cols}]");
        check(&label, &specs, |i| {
            steps.iter().fold(i[0].clone(), |v, &s| apply(s, &v, &i[1]))
        });
    }
}

#[test]
fn jit_compiles_gradients_with_guards_and_a_dynamic_batch() {
    // A train-step-like function under jit: the batch size varies, the parameters do not.
    let step = |i: &[Traced]| {
        let (x, t, w, b) = (&i[0], &i[1], &i[2], &i[3]);
        let loss = x.linear(w, Some(b)).tanh().mse_loss(t);
        let mut out = vec![loss.clone()];
        out.extend(loss.grad(&[w, b]));
        out
    };
    let f = minductor::jit(step).input_names(&["x", "t", "w", "b"]);
    for batch in [2usize, 3, 5, 8, 13] {
        let inputs = vec![
            minductor_tools::workloads::uniform(&[batch, 6], -1.0, 1.0, batch as u64),
            minductor_tools::workloads::uniform(&[batch, 4], -1.0, 1.0, 100 + batch as u64),
            minductor_tools::workloads::uniform(&[4, 6], -1.0, 1.0, 7),
            minductor_tools::workloads::uniform(&[4], -1.0, 1.0, 8),
        ];
        let got = f.call(&inputs).unwrap();
        let graph = minductor::trace(|t| {
            let xs: Vec<Traced> = ["x", "t", "w", "b"]
                .iter()
                .zip(&inputs)
                .map(|(n, v)| t.input(n, DType::F32, v.shape()))
                .collect();
            step(&xs)
        })
        .unwrap();
        let want = compile_with(&graph, Backend::Eager)
            .unwrap()
            .call(&inputs)
            .unwrap();
        assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-4),
            &format!("{}: {:?}", "jit train step", Backend::Inductor),
        );
    }
    let stats = f.stats();
    // The first size compiles static; the second recompiles with a symbolic batch, which then
    // serves every later size.
    assert_eq!(stats.compiles, 2, "{stats:?}");
    assert_eq!(stats.symbolic_compiles, 1, "{stats:?}");
}

/// `erf`'s derivative `2/√π·exp(−x²)` is 0 in f32 where `exp(−x²)` would be subnormal (`−x²`
/// below `ERF_GRAD_FLOOR`, |x| > 9.3454), as PyTorch's GELU derivative gives, and the normal
/// value elsewhere, eager and compiled alike; f64 keeps the plain rule. Through `gelu` (whose
/// compiled derivative is a row routine where the CPU has them) the derivative at such a
/// negative `x` is 0 too, eager and compiled.
#[test]
fn erf_derivative_is_zero_where_its_exp_would_be_subnormal() {
    let floor = minductor::internals::passes::ERF_GRAD_FLOOR as f32;
    // |x| = 9.345 gives −x² = −87.33 (kept), 9.3455 gives −87.34 (flushed).
    let xs = [
        0.5, -3.0, 9.3, -9.345, 9.3455, -9.36, 10.0, -13.5, 14.0, 1e3,
    ];
    let gradient = |dtype: DType, gelu: bool, backend: Backend| -> Vec<f64> {
        let t = Tracer::new();
        let x = t.input("x", dtype, &[xs.len()]);
        // gelu(x·√2) differentiates erf at x.
        let y = if gelu {
            x.mul(std::f64::consts::SQRT_2).gelu()
        } else {
            x.erf()
        };
        let grad = y.sum(&[], false).grad(&[&x]).remove(0);
        let graph = t.finish(&[grad]).unwrap();
        let input = Tensor::from_f64(dtype, &[xs.len()], &xs).unwrap();
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(std::slice::from_ref(&input))
            .unwrap();
        out[0].to_f64_vec()
    };
    for backend in [Backend::Eager, Backend::Inductor] {
        for dtype in [DType::F32, DType::F64] {
            let got = gradient(dtype, false, backend);
            for (&x, &g) in xs.iter().zip(&got) {
                let flushed = dtype == DType::F32 && -((x * x) as f32) < floor;
                let want = 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp();
                let what = format!("erf' {dtype:?} {backend:?} at {x}: {g:e}");
                if flushed {
                    assert_eq!(g.to_bits(), 0, "{what}, not +0");
                } else {
                    // Normal in f32 (or f64's own exp, 0 only past its range).
                    assert!((g - want).abs() <= 1e-5 * want, "{what}, want {want:e}");
                    assert!(g > 0.0 || want < 1e-300, "{what}");
                }
            }
        }
        let got = gradient(DType::F32, true, backend);
        for (&x, &g) in xs.iter().zip(&got) {
            if x < 0.0 && -((x * x) as f32) < floor {
                assert_eq!(g, 0.0, "gelu' {backend:?} at {x}: {g:e}, not 0");
            }
        }
    }
}
