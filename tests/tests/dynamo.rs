//! `jit` (Dynamo's part): guards and recompiles, automatic dynamic shapes, the recompile limit,
//! stances, graph breaks, fullgraph, custom backends and explain. Every result is compared with
//! the reference interpreter on a static trace of the same function: exactly for the `eager`
//! backend, within 1e-4 (absolute + relative) for inductor's polynomial math.

use minductor::TensorType;
use minductor::{
    interpret, jit, reference_executable, set_stance, trace, with_stance, Backend, CompileError,
    CompiledFn, DType, Graph, JitBackend, JitError, Stance, Tensor, Traced,
};
use minductor_tests::Tolerance;
use std::sync::{Arc, Mutex};

fn data(shape: &[usize], seed: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|i| ((i as f32 + 1.0) * 0.37 + seed).sin())
        .collect();
    Tensor::from_vec(shape, values).unwrap()
}

/// The reference result: `f` traced with the inputs' static shapes and interpreted.
fn reference(
    f: &dyn Fn(&[Traced]) -> Vec<Traced>,
    names: &[&str],
    inputs: &[Tensor],
) -> Vec<Tensor> {
    let graph = trace(|t| {
        let xs: Vec<Traced> = inputs
            .iter()
            .zip(names)
            .map(|(x, n)| t.input(n, x.dtype(), x.shape()))
            .collect();
        f(&xs)
    })
    .unwrap();
    interpret(&graph, inputs).unwrap()
}

#[track_caller]
fn assert_close(got: &[Tensor], want: &[Tensor], tolerance: f64) {
    minductor_tests::assert_allclose(got, want, Tolerance::close(tolerance), "jit");
}

fn mlp_like(x: &[Traced]) -> Vec<Traced> {
    vec![(&x[0] * 2.0 + 1.0).gelu().softmax(-1)]
}

#[test]
fn guard_failure_names_input_dim_expected_and_got() {
    let f = jit(mlp_like)
        .backend(Backend::Eager)
        .dynamic(Some(false))
        .input_names(&["x"]);
    f.call(&[data(&[256, 8], 0.0)]).unwrap();
    f.call(&[data(&[128, 8], 0.0)]).unwrap();
    let stats = f.stats();
    assert_eq!(stats.compiles, 2);
    assert_eq!(
        stats.recompiles,
        vec!["input x, dim 0: expected 256, got 128"]
    );
    // dtype and contiguity guards recompile too, and say so.
    f.call(&[data(&[8, 128], 0.0).permute(&[1, 0]).unwrap()])
        .unwrap();
    let stats = f.stats();
    assert_eq!(stats.compiles, 3);
    assert!(
        stats.recompiles[1].contains("input x: expected contiguous, got strides [1, 128]"),
        "{}",
        stats.recompiles[1]
    );
}

#[test]
fn static_sweep_recompiles_once_per_size() {
    let f = jit(mlp_like)
        .backend(Backend::Eager)
        .dynamic(Some(false))
        .recompile_limit(64)
        .input_names(&["x"]);
    for batch in 2..12 {
        let x = data(&[batch, 16], batch as f32);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        assert_close(&out, &reference(&mlp_like, &["x"], &[x]), 0.0);
    }
    let stats = f.stats();
    assert_eq!(stats.compiles, 10);
    assert_eq!(stats.recompiles.len(), 9);
    assert_eq!(stats.symbolic_compiles, 0);
    assert_eq!(stats.cache_hits, 0);
    // Hits for every size seen.
    for batch in 2..12 {
        f.call(&[data(&[batch, 16], 0.5)]).unwrap();
    }
    assert_eq!(f.stats().cache_hits, 10);
    assert_eq!(f.stats().compiles, 10);
}

/// Automatic dynamic: the first recompile over a batch-size sweep compiles the batch dim
/// symbolic; every later size hits the cache. Sizes 0 and 1 are specialized.
fn automatic_dynamic_sweep(backend: Backend, tolerance: f64) {
    let f = jit(mlp_like).backend(backend).input_names(&["x"]);
    for batch in 2..12 {
        let x = data(&[batch, 16], batch as f32);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        assert_close(&out, &reference(&mlp_like, &["x"], &[x]), tolerance);
    }
    let stats = f.stats();
    assert_eq!(stats.dynamic_fallbacks, Vec::<String>::new());
    assert_eq!(stats.compiles, 2, "{stats:?}");
    assert_eq!(stats.symbolic_compiles, 1);
    assert_eq!(stats.recompiles, vec!["input x, dim 0: expected 2, got 3"]);
    assert_eq!(stats.cache_hits, 8);
    // Size 1 fails the symbolic guard (s0 >= 2) and gets its own static graph.
    let one = data(&[1, 16], 0.0);
    let out = f.call(std::slice::from_ref(&one)).unwrap();
    assert_close(
        &out,
        &reference(&mlp_like, &["x"], std::slice::from_ref(&one)),
        tolerance,
    );
    let stats = f.stats();
    assert_eq!(stats.compiles, 3);
    assert!(
        stats.recompiles[1].contains("expected size >= 2"),
        "{:?}",
        stats.recompiles
    );
    let explanation = f.explain(&[one]).unwrap();
    assert!(
        explanation
            .dynamic
            .iter()
            .any(|d| d.contains("size 1 specialized (sizes 0 and 1 are always specialized)")),
        "{explanation}"
    );
}

#[test]
fn automatic_dynamic_sweep_eager() {
    automatic_dynamic_sweep(Backend::Eager, 0.0);
}

#[test]
fn automatic_dynamic_sweep_inductor() {
    automatic_dynamic_sweep(Backend::Inductor, 1e-4);
}

/// Whatever the inductor backend supports today, a sweep is correct at every size; a symbolic
/// compile it refuses falls back to a static specialization with the reason recorded.
#[test]
fn automatic_dynamic_on_inductor_is_correct_or_falls_back_with_reason() {
    let f = jit(mlp_like).input_names(&["x"]).recompile_limit(64);
    for batch in [2usize, 3, 4, 5, 7, 9] {
        let x = data(&[batch, 16], batch as f32);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        assert_close(&out, &reference(&mlp_like, &["x"], &[x]), 1e-4);
    }
    let stats = f.stats();
    if stats.symbolic_compiles == 0 {
        assert!(!stats.dynamic_fallbacks.is_empty());
        assert!(
            stats.dynamic_fallbacks[0].contains("does not support symbolic dims"),
            "{:?}",
            stats.dynamic_fallbacks
        );
    } else {
        assert_eq!(stats.compiles, 2);
    }
}

#[test]
fn dynamic_true_is_symbolic_from_the_first_compile_and_duck_sizes_equal_dims() {
    let add = |x: &[Traced]| vec![(&x[0] + &x[1]).relu()];
    let f = jit(add)
        .backend("eager".parse::<JitBackend>().unwrap())
        .dynamic(Some(true))
        .input_names(&["x", "y"]);
    for n in [3usize, 5, 8] {
        let inputs = [data(&[n, 4], 0.0), data(&[n, 4], 1.0)];
        let out = f.call(&inputs).unwrap();
        assert_close(&out, &reference(&add, &["x", "y"], &inputs), 0.0);
    }
    let stats = f.stats();
    assert_eq!(
        (stats.compiles, stats.symbolic_compiles, stats.cache_hits),
        (1, 1, 2)
    );
    // x and y share s0 (and s1 for the 4s): unequal sizes fail the tie.
    let err = f.call(&[data(&[3, 4], 0.0), data(&[5, 4], 0.0)]);
    assert!(err.is_err(), "x + y of [3, 4] and [5, 4] cannot broadcast");
    let reason = &f.stats().recompiles[0];
    assert!(
        reason.contains("input y, dim 0: expected the size of input x, dim 0"),
        "{reason}"
    );
}

#[test]
fn reading_a_symbolic_size_specializes_it() {
    let mean0 = |x: &[Traced]| {
        let n = x[0].shape()[0];
        vec![x[0].sum(&[0], false) / n as f64]
    };
    let f = jit(mean0)
        .backend(Backend::Eager)
        .dynamic(Some(true))
        .input_names(&["x"]);
    let x = data(&[6, 3], 0.0);
    let out = f.call(std::slice::from_ref(&x)).unwrap();
    assert_close(&out, &reference(&mean0, &["x"], &[x]), 0.0);
    let stats = f.stats();
    assert_eq!(stats.symbolic_compiles, 0);
    assert!(
        stats.dynamic_fallbacks[0]
            .contains("input x, dim 0 (s0): Rust code read it as a number at"),
        "{:?}",
        stats.dynamic_fallbacks
    );
    // Dim 0 is static from now on: a new size recompiles (correctly) rather than reusing.
    let x = data(&[4, 3], 0.0);
    let out = f.call(std::slice::from_ref(&x)).unwrap();
    assert_close(&out, &reference(&mean0, &["x"], &[x]), 0.0);
    assert_eq!(f.stats().compiles, 2);
}

#[test]
fn recompile_limit_falls_back_to_eager() {
    let f = jit(mlp_like)
        .backend(Backend::AotEager)
        .dynamic(Some(false))
        .recompile_limit(2)
        .input_names(&["x"]);
    for batch in 2..7 {
        let x = data(&[batch, 8], 0.0);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        assert_close(&out, &reference(&mlp_like, &["x"], &[x]), 1e-5);
    }
    let stats = f.stats();
    assert_eq!(stats.compiles, 2);
    assert_eq!(stats.limit_fallbacks, 3);
    assert_eq!(stats.eager_fallbacks(), 3);
    assert_eq!(f.cache_entries(), 2);
    // Cached sizes still hit.
    f.call(&[data(&[3, 8], 0.0)]).unwrap();
    assert_eq!(f.stats().cache_hits, 1);
}

#[test]
fn stances_force_eager_eager_on_recompile_fail_on_recompile() {
    let f = jit(mlp_like)
        .backend(Backend::Inductor)
        .dynamic(Some(false))
        .input_names(&["x"]);
    let x4 = data(&[4, 8], 0.0);
    let want4 = reference(&mlp_like, &["x"], std::slice::from_ref(&x4));

    // force_eager: nothing is compiled, results are the interpreter's.
    let out = with_stance(Stance::ForceEager, || f.call(std::slice::from_ref(&x4))).unwrap();
    assert_close(&out, &want4, 0.0);
    assert_eq!((f.stats().compiles, f.stats().stance_eager_calls), (0, 1));
    assert_eq!(minductor::current_stance(), Stance::Default);

    // A first compile is not a recompile: fail_on_recompile allows it.
    let out = with_stance(Stance::FailOnRecompile, || {
        f.call(std::slice::from_ref(&x4))
    })
    .unwrap();
    assert_close(&out, &want4, 1e-4);
    assert_eq!(f.stats().compiles, 1);

    // eager_on_recompile: a miss runs eagerly, a hit still uses the compiled code.
    let x5 = data(&[5, 8], 0.0);
    let out = with_stance(Stance::EagerOnRecompile, || {
        f.call(std::slice::from_ref(&x5))
    })
    .unwrap();
    assert_close(
        &out,
        &reference(&mlp_like, &["x"], std::slice::from_ref(&x5)),
        0.0,
    );
    with_stance(Stance::EagerOnRecompile, || {
        f.call(std::slice::from_ref(&x4))
    })
    .unwrap();
    let stats = f.stats();
    assert_eq!(
        (stats.compiles, stats.cache_hits, stats.stance_eager_calls),
        (1, 1, 2)
    );

    // fail_on_recompile: a miss is an error naming the failed guard.
    let guard = set_stance(Stance::FailOnRecompile);
    let err = f.call(&[data(&[6, 8], 0.0)]).unwrap_err();
    drop(guard);
    assert!(matches!(err, JitError::RecompileForbidden { .. }));
    assert!(
        err.to_string()
            .contains("input x, dim 0: expected 4, got 6"),
        "{err}"
    );
    assert_eq!(f.stats().compiles, 1);

    // The stance is restored after a panic inside the scope.
    let caught = std::panic::catch_unwind(|| {
        with_stance(Stance::ForceEager, || panic!("inside the scope"));
    });
    assert!(caught.is_err());
    assert_eq!(minductor::current_stance(), Stance::Default);
}

/// `y = exp(x) * 2; s = y.sum().item(); if s > 0 { relu(y * 3) + x } else { y - x }`.
fn branchy(x: &[Traced]) -> Vec<Traced> {
    let y = x[0].exp() * 2.0 - 2.5;
    let s = y.sum(&[], false).item();
    if s > 0.0 {
        vec![(&y * 3.0).relu() + &x[0], y.clone()]
    } else {
        vec![&y - &x[0], y.clone()]
    }
}

/// The same function in plain Rust on the data.
fn branchy_by_hand(x: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let x = x.to_f64_vec();
    let y: Vec<f64> = x
        .iter()
        .map(|v| (v.exp() * 2.0 - 2.5) as f32 as f64)
        .collect();
    let s: f64 = y.iter().sum();
    let first = if s > 0.0 {
        y.iter()
            .zip(&x)
            .map(|(y, x)| (y * 3.0).max(0.0) + x)
            .collect()
    } else {
        y.iter().zip(&x).map(|(y, x)| y - x).collect()
    };
    (first, y)
}

#[test]
fn graph_break_in_the_middle_matches_eager() {
    let f = jit(branchy).input_names(&["x"]);
    let input = |seed: f32, scale: f32| {
        let x = data(&[4, 32], seed);
        let values = x.to_vec::<f32>().unwrap();
        Tensor::from_vec(
            &[4, 32],
            values.iter().map(|v| v * scale + scale * 0.5).collect(),
        )
        .unwrap()
    };
    for (seed, scale) in [(0.0f32, 1.0f32), (0.3, -1.0)] {
        let x = input(seed, scale);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let eager = with_stance(Stance::ForceEager, || f.call(std::slice::from_ref(&x))).unwrap();
        assert_close(&out, &eager, 1e-4);
        let (first, y) = branchy_by_hand(&x);
        for (got, want) in out[0].to_f64_vec().iter().zip(&first) {
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
        for (got, want) in out[1].to_f64_vec().iter().zip(&y) {
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
    }
    let stats = f.stats();
    // Two paths: the graph before the break is compiled once and reused by the second path.
    assert_eq!(stats.graph_breaks, 2);
    assert_eq!(stats.compiles, 3, "{stats:?}");
    assert_eq!(stats.recompiles.len(), 1, "{stats:?}");
    assert!(
        stats.recompiles[0].contains("item() at"),
        "{:?}",
        stats.recompiles
    );
    // The same input again is a full cache hit: no tracing, no compile.
    let x = input(0.0, 1.0);
    let before = f.stats();
    let out = f.call(std::slice::from_ref(&x)).unwrap();
    let after = f.stats();
    assert_eq!(after.cache_hits, before.cache_hits + 1);
    assert_eq!(after.compiles, before.compiles);
    let (first, _) = branchy_by_hand(&x);
    for (got, want) in out[0].to_f64_vec().iter().zip(&first) {
        assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()));
    }
    // A new break value taking a branch already compiled re-traces `f` but compiles nothing.
    let x = input(0.1, 1.0);
    let out = f.call(std::slice::from_ref(&x)).unwrap();
    let stats = f.stats();
    assert_eq!((stats.compiles, stats.break_retraces), (3, 1), "{stats:?}");
    let (first, _) = branchy_by_hand(&x);
    for (got, want) in out[0].to_f64_vec().iter().zip(&first) {
        assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()));
    }
}

#[test]
fn graph_break_values_count_against_the_recompile_limit_only_when_they_compile() {
    let input = |seed: f32, scale: f32| {
        let values = data(&[2, 8], seed).to_vec::<f32>().unwrap();
        Tensor::from_vec(
            &[2, 8],
            values.iter().map(|v| v * scale + scale * 0.5).collect(),
        )
        .unwrap()
    };
    let f = jit(branchy)
        .backend(Backend::AotEager)
        .recompile_limit(1)
        .input_names(&["x"]);
    for (seed, scale) in [(0.0, 1.0), (0.0, -1.0), (0.2, 1.0), (0.2, -1.0)] {
        let x = input(seed, scale);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let (first, y) = branchy_by_hand(&x);
        let want = [
            Tensor::from_f64(DType::F32, &[2, 8], &first).unwrap(),
            Tensor::from_f64(DType::F32, &[2, 8], &y).unwrap(),
        ];
        assert_close(&out, &want, 1e-5);
    }
    let stats = f.stats();
    // The positive branch is compiled once (graph before the break + branch); the negative one
    // would need a compile past the limit, so those calls run eagerly; the second positive value
    // reuses the compiled branch.
    assert_eq!(stats.compiles, 2, "{stats:?}");
    assert_eq!(stats.limit_fallbacks, 2);
    assert_eq!(stats.break_retraces, 1);
}

#[test]
fn fullgraph_turns_a_break_into_an_error_at_the_call_site() {
    let line = line!() + 3;
    let f = jit(|x: &[Traced]| {
        let y = x[0].exp();
        if y.sum(&[], false).item() > 0.0 {
            vec![y]
        } else {
            vec![x[0].clone()]
        }
    })
    .fullgraph(true)
    .backend(Backend::Eager);
    let err = f.call(&[data(&[2, 2], 0.0)]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&format!("{}:{line}:", file!())), "{text}");
    assert!(text.contains("graph break in fullgraph mode"), "{text}");
    assert!(matches!(err, JitError::Trace(_)));
    // item() in a plain trace is a trace error, not a panic.
    let plain = trace(|t| {
        let x = t.input("x", DType::F32, &[1]);
        let _ = x.item();
        vec![x]
    });
    assert!(plain.unwrap_err().to_string().contains("item()"));
}

#[test]
fn custom_backend_receives_the_captured_graph_and_input_types() {
    type Seen = Vec<(Graph, Vec<TensorType>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = seen.clone();
    let backend = move |graph: &Graph, types: &[TensorType]| -> Result<CompiledFn, CompileError> {
        record.lock().unwrap().push((graph.clone(), types.to_vec()));
        Ok(reference_executable(graph))
    };
    let model = |x: &[Traced]| vec![x[0].linear(&x[1], Some(&x[2])).relu()];
    let f = jit(model)
        .backend(JitBackend::custom(backend))
        .input_names(&["x", "w", "b"]);
    let inputs = [data(&[3, 5], 0.0), data(&[4, 5], 1.0), data(&[4], 2.0)];
    let out = f.call(&inputs).unwrap();
    assert_close(&out, &reference(&model, &["x", "w", "b"], &inputs), 0.0);
    let expected = trace(|t| {
        let x = t.input("x", DType::F32, &[3, 5]);
        let w = t.input("w", DType::F32, &[4, 5]);
        let b = t.input("b", DType::F32, &[4]);
        model(&[x, w, b])
    })
    .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, expected);
    assert_eq!(
        seen[0].1,
        inputs.iter().map(|t| t.tensor_type()).collect::<Vec<_>>()
    );
}

#[test]
fn explain_reports_graphs_breaks_ops_guards() {
    let f = jit(branchy).input_names(&["x"]).backend(Backend::Eager);
    let explanation = f.explain(&[data(&[4, 8], 0.0)]).unwrap();
    assert_eq!(explanation.graph_count(), 2);
    assert_eq!(explanation.graph_break_count(), 1);
    assert!(explanation.breaks[0].location.starts_with(file!()));
    assert!(explanation.breaks[0]
        .reason
        .starts_with("item() reads a tensor's value"));
    // Graph 0: exp, mul, sub, reduce_sum; graph 1 (positive branch): mul, relu, add.
    assert_eq!(explanation.graphs[0].op_counts.get("exp"), Some(&1));
    assert_eq!(explanation.graphs[0].op_counts.get("reduce_sum"), Some(&1));
    let text = explanation.to_string();
    for needle in [
        "Graph count: 2",
        "Graph break count: 1",
        "Break reasons:",
        "input x: dtype f32, shape [4, 8], contiguous",
        "Graph 0:",
        "Graph 1:",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
    // explain does not touch the cache.
    assert_eq!(f.cache_entries(), 0);
    assert_eq!(f.stats().compiles, 0);
}

#[test]
fn wrong_inputs_are_errors_not_panics() {
    let f = jit(|x: &[Traced]| vec![&x[0] + &x[1]]).backend(Backend::Eager);
    let err = f.call(&[data(&[2, 3], 0.0), data(&[4], 0.0)]).unwrap_err();
    assert!(err.to_string().contains("cannot broadcast"), "{err}");
}

#[test]
fn specializing_one_dim_keeps_the_others_symbolic() {
    // layer_norm reads its normalized dim as a number: with everything symbolic, only that dim
    // is specialized and the batch dim stays symbolic.
    let norm = |x: &[Traced]| vec![x[0].layer_norm(&[16], None, None, 1e-5)];
    let f = jit(norm)
        .backend(Backend::Eager)
        .dynamic(Some(true))
        .input_names(&["x"]);
    for batch in [3usize, 5, 9] {
        let x = data(&[batch, 16], batch as f32);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        assert_close(&out, &reference(&norm, &["x"], &[x]), 0.0);
    }
    let stats = f.stats();
    assert_eq!(
        (stats.compiles, stats.symbolic_compiles, stats.cache_hits),
        (1, 1, 2)
    );
    assert_eq!(stats.dynamic_fallbacks.len(), 1);
    assert!(
        stats.dynamic_fallbacks[0].starts_with("specialized input x, dim 1 (s1)"),
        "{:?}",
        stats.dynamic_fallbacks
    );
}

/// Ops whose shape rules meet symbolic dims (views, cat, bmm, normalization, reductions): over a
/// batch sweep each either stays symbolic or falls back to a static specialization with a
/// recorded reason; results are always the interpreter's and nothing panics.
#[test]
fn symbolic_sweep_over_view_ops_is_correct_either_way() {
    type Model = fn(&[Traced]) -> Vec<Traced>;
    let models: [(&str, Model); 6] = [
        ("reshape", |x| vec![x[0].reshape(&[-1, 16]).relu()]),
        ("expand", |x| {
            vec![x[0].sum(&[2], true).expand(&[-1, -1, 4]) * 0.5]
        }),
        ("slice", |x| vec![x[0].slice(0, Some(1), None, 1).exp()]),
        ("cat", |x| {
            vec![Traced::cat(&[&x[0], &x[0]], 0).sum(&[0], false)]
        }),
        ("bmm", |x| vec![x[0].bmm(&x[0].transpose(1, 2)).softmax(-1)]),
        ("layer_norm_mean", |x| {
            vec![x[0].layer_norm(&[4], None, None, 1e-5).mean(&[0, 1], false)]
        }),
    ];
    for (name, model) in models {
        for backend in [Backend::Eager, Backend::Inductor] {
            let f = jit(model)
                .backend(backend)
                .input_names(&["x"])
                .recompile_limit(64);
            for batch in [2usize, 3, 5, 8] {
                let x = data(&[batch, 4, 4], batch as f32);
                let out = f
                    .call(std::slice::from_ref(&x))
                    .unwrap_or_else(|e| panic!("{name} on {backend:?}, batch {batch}: {e}"));
                let tolerance = if backend == Backend::Eager { 0.0 } else { 1e-4 };
                assert_close(&out, &reference(&model, &["x"], &[x]), tolerance);
            }
            let stats = f.stats();
            assert!(stats.compiles <= 4, "{name}: {stats:?}");
            if stats.symbolic_compiles == 0 {
                assert!(!stats.dynamic_fallbacks.is_empty(), "{name}: {stats:?}");
            }
            println!(
                "{name} on {}: compiles {}, symbolic {}, fallbacks {:?}",
                backend.name(),
                stats.compiles,
                stats.symbolic_compiles,
                stats.dynamic_fallbacks.first()
            );
        }
    }
}

#[test]
fn jit_functions_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let f = jit(mlp_like as fn(&[Traced]) -> Vec<Traced>).backend(Backend::Eager);
    send_sync(&f);
    let x = data(&[3, 8], 0.0);
    let want = reference(&mlp_like, &["arg0"], std::slice::from_ref(&x));
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| assert_close(&f.call(std::slice::from_ref(&x)).unwrap(), &want, 0.0));
        }
    });
    assert_eq!(f.stats().calls, 2);
    assert_eq!(f.stats().compiles, 1);
}

#[test]
fn graph_breaks_under_automatic_dynamic_shapes() {
    let f = jit(branchy).backend(Backend::Eager).input_names(&["x"]);
    for (batch, scale) in [
        (2usize, 1.0f32),
        (3, 1.0),
        (4, -1.0),
        (5, 1.0),
        (6, -1.0),
        (7, 1.0),
    ] {
        let values = data(&[batch, 8], batch as f32).to_vec::<f32>().unwrap();
        let x = Tensor::from_vec(
            &[batch, 8],
            values.iter().map(|v| v * scale + scale * 0.5).collect(),
        )
        .unwrap();
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let (first, y) = branchy_by_hand(&x);
        let want = [
            Tensor::from_f64(DType::F32, &[batch, 8], &first).unwrap(),
            Tensor::from_f64(DType::F32, &[batch, 8], &y).unwrap(),
        ];
        assert_close(&out, &want, 1e-6);
    }
    let stats = f.stats();
    // Static graph pair at batch 2; at batch 3 the symbolic graph before the break and the
    // positive branch; the negative branch once (batch 4); batches 5, 6, 7 re-trace only.
    assert_eq!(stats.compiles, 5, "{stats:?}");
    assert_eq!(stats.symbolic_compiles, 3, "{stats:?}");
    assert_eq!(stats.break_retraces, 3, "{stats:?}");
    assert_eq!(stats.recompiles.len(), 2, "{stats:?}");
    assert_eq!(f.cache_entries(), 2);
}
