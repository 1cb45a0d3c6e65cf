//! The `eager_then_compile` stance and `Jit::disable`, counted through `JitStats` and checked
//! against the reference interpreter on a static trace of the same function.

use minductor::{interpret, jit, trace, with_stance, Backend, DType, Stance, Tensor, Traced};
use minductor_tests::ramp_from_one;
use minductor_tests::{assert_allclose, Tolerance};

fn body(x: &[Traced]) -> Vec<Traced> {
    vec![(x[0].exp() * 2.0 - &x[0]).softmax(-1).tanh()]
}

/// `body` traced with the input's static shape and interpreted.
fn reference(x: &Tensor) -> Vec<Tensor> {
    let graph = trace(|t| body(&[t.input("x", DType::F32, x.shape())])).unwrap();
    interpret(&graph, std::slice::from_ref(x)).unwrap()
}

#[test]
fn stance_names_parse_back() {
    for stance in [
        Stance::Default,
        Stance::ForceEager,
        Stance::EagerOnRecompile,
        Stance::FailOnRecompile,
        Stance::EagerThenCompile,
    ] {
        assert_eq!(stance.name().parse::<Stance>().unwrap(), stance);
    }
    let err = "eager_then_never".parse::<Stance>().unwrap_err();
    assert!(err.contains("eager_then_compile"), "{err}");
}

#[test]
fn eager_then_compile_runs_each_new_signature_eagerly_once() {
    let f = jit(body).backend(Backend::Inductor).input_names(&["x"]);
    let call =
        |x: &Tensor| with_stance(Stance::EagerThenCompile, || f.call(std::slice::from_ref(x)));
    let counts = || {
        let s = f.stats();
        (s.calls, s.stance_eager_calls, s.compiles, s.cache_hits)
    };
    let x4 = ramp_from_one(&[4, 16], 0.1);
    // First call of [4, 16]: eager, bit for bit the interpreter's.
    let out = call(&x4).unwrap();
    assert_allclose(&out, &reference(&x4), Tolerance::EXACT, "eager first call");
    assert_eq!(counts(), (1, 1, 0, 0));
    assert_eq!(f.cache_entries(), 0);
    // Second call: compiled.
    let out = call(&x4).unwrap();
    assert_allclose(&out, &reference(&x4), Tolerance::close(1e-4), "compiled");
    assert_eq!(counts(), (2, 1, 1, 0));
    // Third: a cache hit.
    call(&x4).unwrap();
    assert_eq!(counts(), (3, 1, 1, 1));
    // A new batch size: eager once; the compile after it already knows dim 0 varies and makes
    // it symbolic (no static compile for size 7).
    let x7 = ramp_from_one(&[7, 16], 0.2);
    let out = call(&x7).unwrap();
    assert_allclose(&out, &reference(&x7), Tolerance::EXACT, "eager new size");
    assert_eq!(counts(), (4, 2, 1, 1));
    let out = call(&x7).unwrap();
    assert_allclose(
        &out,
        &reference(&x7),
        Tolerance::close(1e-4),
        "compiled new size",
    );
    let stats = f.stats();
    assert_eq!(
        (stats.compiles, stats.symbolic_compiles),
        (2, 1),
        "{stats:?}"
    );
    // A size the symbolic entry's guards accept runs compiled at once: no eager call.
    let x11 = ramp_from_one(&[11, 16], 0.3);
    let out = call(&x11).unwrap();
    assert_allclose(
        &out,
        &reference(&x11),
        Tolerance::close(1e-4),
        "symbolic hit",
    );
    assert_eq!(counts(), (6, 2, 2, 2));
    // Outside the stance, a miss compiles on its first call.
    let x3 = ramp_from_one(&[3, 5], 0.4);
    f.call(std::slice::from_ref(&x3)).unwrap();
    assert_eq!(counts(), (7, 2, 3, 2));
}

#[test]
fn a_disabled_function_never_compiles_under_any_stance() {
    let f = jit(body).input_names(&["x"]).disable();
    assert!(f.options().disabled);
    let mut calls = 0;
    for stance in [
        Stance::Default,
        Stance::FailOnRecompile,
        Stance::EagerThenCompile,
        Stance::EagerOnRecompile,
    ] {
        for shape in [[2usize, 8], [5, 8], [2, 8]] {
            let x = ramp_from_one(&shape, shape[0] as f32);
            let out = with_stance(stance, || f.call(std::slice::from_ref(&x))).unwrap();
            assert_allclose(&out, &reference(&x), Tolerance::EXACT, stance.name());
            calls += 1;
        }
    }
    let stats = f.stats();
    assert_eq!(stats.compiles, 0, "{stats:?}");
    assert_eq!(stats.disabled_calls, calls);
    assert_eq!(stats.eager_fallbacks(), calls);
    assert_eq!((stats.cache_hits, stats.recompiles.len()), (0, 0));
    assert_eq!(f.cache_entries(), 0);
}
