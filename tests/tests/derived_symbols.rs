//! Derived symbols: dims whose extent is a size expression over input symbols (`s0 + 1` of a
//! `cat` with a KV cache, `2*s0` of a flatten, `s0 + -1` of `x[:, 1:]`). One symbolic graph
//! serves every size; each result is compared with the reference interpreter on a static trace
//! of the same function.

use minductor::{compile, interpret, jit, load_bytes, trace, DType, Graph, Tensor, Traced, Tracer};
use minductor::{Dim, SymId, TensorType};
use minductor_tests::Tolerance;

fn ramp(shape: &[usize], seed: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| ((i as f32) * 0.61 + seed).sin() * 2.0)
        .collect();
    Tensor::from_vec(shape, data).unwrap()
}

/// The reference result: `f` traced with the inputs' static shapes and interpreted.
fn reference(f: &dyn Fn(&[Traced]) -> Vec<Traced>, inputs: &[Tensor]) -> Vec<Tensor> {
    let graph = trace(|t| {
        let xs: Vec<Traced> = inputs
            .iter()
            .enumerate()
            .map(|(i, x)| t.input(&format!("in{i}"), x.dtype(), x.shape()))
            .collect();
        f(&xs)
    })
    .unwrap();
    interpret(&graph, inputs).unwrap()
}

/// One decode step of single-head-group attention with a KV cache: the new key and value rows
/// are appended to the caches (`[1, 2, s0, 8]` → `[1, 2, s0 + 1, 8]`), the query attends to all
/// of them, and the grown caches are returned.
fn decode_step(x: &[Traced]) -> Vec<Traced> {
    let (past_k, past_v, q, k, v) = (&x[0], &x[1], &x[2], &x[3], &x[4]);
    let k_all = Traced::cat(&[past_k, k], 2);
    let v_all = Traced::cat(&[past_v, v], 2);
    let scores = q.matmul(&k_all.transpose(-2, -1)) / 8f64.sqrt();
    let out = scores.softmax(-1).matmul(&v_all);
    vec![out, k_all, v_all]
}

fn decode_inputs(length: usize) -> Vec<Tensor> {
    let seed = length as f32;
    vec![
        ramp(&[1, 2, length, 8], seed),
        ramp(&[1, 2, length, 8], seed + 1.0),
        ramp(&[1, 2, 1, 8], seed + 2.0),
        ramp(&[1, 2, 1, 8], seed + 3.0),
        ramp(&[1, 2, 1, 8], seed + 4.0),
    ]
}

#[test]
fn kv_cache_decode_compiles_once_for_every_length() {
    let f = jit(decode_step).input_names(&["past_k", "past_v", "q", "k", "v"]);
    for length in 1..=12 {
        let inputs = decode_inputs(length);
        let got = f.call(&inputs).unwrap();
        assert_eq!(got[1].shape(), &[1, 2, length + 1, 8], "length {length}");
        assert_eq!(got[2].shape(), &[1, 2, length + 1, 8], "length {length}");
        minductor_tests::assert_allclose(
            &got,
            &reference(&decode_step, &inputs),
            Tolerance::close(1e-5),
            &format!("cache length {length}"),
        );
    }
    let stats = f.stats();
    assert_eq!(stats.dynamic_fallbacks, Vec::<String>::new());
    assert_eq!(
        (stats.compiles, stats.symbolic_compiles),
        (2, 1),
        "{stats:?}"
    );
    // explain shows the grown caches' size as an expression of the cache length.
    let explanation = f.explain(&decode_inputs(5)).unwrap().to_string();
    assert!(
        explanation.contains("derived sizes: s0 + 1 (first from cat %5)"),
        "{explanation}"
    );
    assert!(
        explanation.contains("f32[1, 2, s0 + 1, 8]"),
        "{explanation}"
    );
}

type Body = dyn Fn(&[Traced]) -> Vec<Traced>;

/// Traces `f` over inputs of `shapes` in which `0` stands for the symbolic size `s0` (or
/// `size` when given), followed by static `weights`.
fn build(size: Option<usize>, shapes: &[&[usize]], weights: &[&[usize]], f: &Body) -> Graph {
    let tracer = Tracer::new();
    let mut inputs: Vec<Traced> = shapes
        .iter()
        .enumerate()
        .map(|(i, dims)| {
            let shape = dims
                .iter()
                .map(|&n| match (n, size) {
                    (0, None) => Dim::Sym(SymId(0)),
                    (0, Some(s)) => Dim::Static(s),
                    (n, _) => Dim::Static(n),
                })
                .collect();
            tracer.input_typed(&format!("in{i}"), TensorType::new(DType::F32, shape))
        })
        .collect();
    for (i, w) in weights.iter().enumerate() {
        inputs.push(tracer.input(&format!("w{i}"), DType::F32, w));
    }
    let outputs = f(&inputs);
    tracer.finish(&outputs).unwrap()
}

/// One symbolic compile, checked at sizes 1..=19, 64 and 257 against the interpreter on the
/// static graph (1e-5, absolute + relative). Returns the symbolic graph.
fn check_every_size(shapes: &[&[usize]], weights: &[&[usize]], f: &Body) -> Graph {
    let graph = build(None, shapes, weights, f);
    let symbolic = compile(&graph).unwrap();
    for size in (1..=19).chain([64, 257]) {
        let inputs: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, dims)| {
                let shape: Vec<usize> = dims
                    .iter()
                    .map(|&n| if n == 0 { size } else { n })
                    .collect();
                ramp(&shape, i as f32)
            })
            .chain(weights.iter().map(|w| ramp(w, 7.0)))
            .collect();
        let want = interpret(&build(Some(size), shapes, weights, f), &inputs).unwrap();
        let got = symbolic.call(&inputs).unwrap();
        minductor_tests::assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-5),
            &format!("size {size}"),
        );
    }
    graph
}

#[test]
fn cat_of_two_symbolic_tensors_is_twice_the_symbol() {
    let graph = check_every_size(&[&[3, 0, 5], &[3, 0, 5]], &[], &|x| {
        let both = Traced::cat(&[&x[0], &(&x[1] * 2.0)], 1);
        vec![both.softmax(1), both.sum(&[1], false)]
    });
    assert!(graph.to_string().contains("f32[3, 2*s0, 5]"), "{graph}");
}

#[test]
fn cat_with_a_static_row_and_the_same_derived_dim_broadcasts() {
    // Two ops deriving `s0 + 1` get one symbol, so their results add elementwise.
    let graph = check_every_size(&[&[0, 4], &[1, 4]], &[], &|x| {
        let a = Traced::cat(&[&x[0], &x[1]], 0);
        let b = Traced::cat(&[&x[0].exp(), &x[1]], 0);
        vec![(&a + &b).relu()]
    });
    assert!(graph.to_string().contains("f32[s0 + 1, 4]"), "{graph}");
}

#[test]
fn flatten_linear_and_reshape_back_stay_symbolic() {
    let graph = check_every_size(&[&[2, 0, 8]], &[&[6, 8], &[6]], &|x| {
        let flat = x[0].flatten(0, 1);
        let y = flat.linear(&x[1], Some(&x[2])).gelu();
        vec![y.reshape(&[2, -1, 6]), flat.reshape(&[-1, 4])]
    });
    let text = graph.to_string();
    assert!(text.contains("f32[2*s0, 6]"), "{text}");
    assert!(text.contains("f32[2, s0, 6]"), "{text}");
    assert!(text.contains("f32[4*s0, 4]"), "{text}");
}

#[test]
fn a_shape_mismatch_with_a_derived_dim_is_a_type_error() {
    // `s0 + 1` rows against `s0` rows (or 5) cannot broadcast, as for two different symbols.
    let tracer = Tracer::new();
    let x = tracer.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Sym(SymId(0)), Dim::Static(4)].into_iter().collect(),
        ),
    );
    let row = tracer.input("row", DType::F32, &[1, 4]);
    let grown = Traced::cat(&[&x, &row], 0);
    let err = tracer.finish(&[&grown + &x]).unwrap_err().to_string();
    assert!(err.contains("[s0 + 1, 4] and [s0, 4]"), "{err}");
}

#[test]
fn derived_dims_print_and_parse_back() {
    let tracer = Tracer::new();
    let x = tracer.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Static(2), Dim::Sym(SymId(0)), Dim::Static(8)]
                .into_iter()
                .collect(),
        ),
    );
    let grown = Traced::cat(&[&x, &x.slice(1, Some(-1), None, 1)], 1);
    let graph = tracer
        .finish(&[grown.flatten(0, 1).exp(), x.flatten(0, 1)])
        .unwrap();
    let text = graph.to_string();
    assert!(text.contains("f32[2, s0 + 1, 8]"), "{text}");
    assert!(text.contains("reshape[[2*s0 + 2, 8]]"), "{text}");
    let parsed: Graph = text.parse().unwrap();
    parsed.verify().unwrap();
    assert_eq!(parsed, graph);
    assert_eq!(parsed.to_string(), text);
}

#[test]
fn slicing_from_a_start_keeps_the_dim_symbolic() {
    let graph = check_every_size(&[&[3, 0, 5]], &[], &|x| {
        let tail = x[0].slice(1, Some(1), None, 1);
        vec![tail.exp(), tail.sum(&[1], false)]
    });
    assert!(graph.to_string().contains("f32[3, s0 - 1, 5]"), "{graph}");
}

#[test]
fn pad_and_shifted_slices_of_a_symbolic_dim() {
    // A three-tap moving sum: pad by one on each side (`s0 + 2`), then add the three windows,
    // each `s0` long again.
    let graph = check_every_size(&[&[3, 0]], &[], &|x| {
        let padded = x[0].pad(&[1, 1], 0.5);
        let left = padded.slice(1, None, Some(-2), 1);
        let middle = padded.slice(1, Some(1), Some(-1), 1);
        let right = padded.slice(1, Some(2), None, 1);
        vec![&(&left + &middle) + &right, padded]
    });
    let text = graph.to_string();
    assert!(text.contains("f32[3, s0 + 2]"), "{text}");
    assert!(text.contains("slice[dim=1, 1:end-1:1]"), "{text}");
}

#[test]
fn a_cache_length_that_disagrees_with_its_symbol_is_a_typed_error() {
    let compiled = compile(&symbolic_decode_graph()).unwrap();
    let mut inputs = decode_inputs(5);
    inputs[1] = ramp(&[1, 2, 6, 8], 0.0);
    let err = compiled.call(&inputs).unwrap_err();
    assert!(
        matches!(err, minductor::RuntimeError::Shape { .. }),
        "{err:?}"
    );
    // Under `jit` the guards see the disagreement: the call fails with a shape error too.
    let f = jit(decode_step);
    for length in [3, 4] {
        f.call(&decode_inputs(length)).unwrap();
    }
    let err = f.call(&inputs).unwrap_err().to_string();
    assert!(err.contains("matmul"), "{err}");
}

/// The decode step traced with a symbolic cache length `s0` shared by both caches.
fn symbolic_decode_graph() -> Graph {
    trace(|t| {
        let cache = |name: &str| {
            t.input_typed(
                name,
                TensorType::new(
                    DType::F32,
                    [
                        Dim::Static(1),
                        Dim::Static(2),
                        Dim::Sym(SymId(0)),
                        Dim::Static(8),
                    ]
                    .into_iter()
                    .collect(),
                ),
            )
        };
        let mut x = vec![cache("past_k"), cache("past_v")];
        x.extend(["q", "k", "v"].map(|n| t.input(n, DType::F32, &[1, 2, 1, 8])));
        decode_step(&x)
    })
    .unwrap()
}

#[test]
fn a_saved_artifact_with_derived_dims_loads_and_computes_the_same() {
    let compiled = compile(&symbolic_decode_graph()).unwrap();
    let dir = std::env::temp_dir().join(format!("minductor-derived-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("decode.mind");
    compiled.save(&path).unwrap();
    let loaded = load_bytes(&std::fs::read(&path).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(loaded.artifacts().program, compiled.artifacts().program);
    for length in [2, 7, 33] {
        let inputs = decode_inputs(length);
        minductor_tests::assert_allclose(
            &loaded.call(&inputs).unwrap(),
            &compiled.call(&inputs).unwrap(),
            Tolerance::close(0.0),
            &format!("loaded, cache length {length}"),
        );
    }
}

/// A graph break between the `cat` and its users: the segment after it takes the grown cache
/// (a value of derived size) as an input.
#[test]
fn a_graph_break_after_a_cat_matches_eager() {
    let step = &|x: &[Traced]| -> Vec<Traced> {
        let grown = Traced::cat(&[&x[0], &x[1]], 1);
        let total = grown.sum(&[], false).item();
        let scale = if total > 0.0 { 2.0 } else { -3.0 };
        vec![(&grown * scale).softmax(1)]
    };
    for backend in [minductor::Backend::Inductor, minductor::Backend::Eager] {
        graph_break_after_a_cat(&step, backend);
    }
}

fn graph_break_after_a_cat(step: &Body, backend: minductor::Backend) {
    let f = jit(step).backend(backend).input_names(&["cache", "row"]);
    // The reference: static traces, run op by op by the interpreter.
    let eager = jit(step)
        .backend(minductor::Backend::Eager)
        .dynamic(Some(false))
        .recompile_limit(64);
    for length in 1..=9 {
        let inputs = vec![ramp(&[3, length, 4], length as f32), ramp(&[3, 1, 4], 0.5)];
        let got = f.call(&inputs).unwrap();
        assert_eq!(got[0].shape(), &[3, length + 1, 4]);
        minductor_tests::assert_allclose(
            &got,
            &eager.call(&inputs).unwrap(),
            Tolerance::close(1e-5),
            &format!("length {length}"),
        );
    }
    let stats = f.stats();
    assert_eq!(stats.dynamic_fallbacks, Vec::<String>::new(), "{stats:?}");
    assert!(stats.symbolic_compiles >= 1, "{stats:?}");
}

/// A plain `compile` has no guards: sizes for which a derived dim would be negative (`s0 - 2` at
/// `s0 = 1`) are a typed error when the call binds them, and `s0 = 2` gives an empty result.
#[test]
fn a_negative_derived_size_is_a_typed_error() {
    let tracer = Tracer::new();
    let x = tracer.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Static(3), Dim::Sym(SymId(0))].into_iter().collect(),
        ),
    );
    let inner = x.slice(1, Some(1), Some(-1), 1).exp();
    let graph = tracer.finish(&[inner]).unwrap();
    assert!(graph.to_string().contains("f32[3, s0 - 2]"), "{graph}");
    let compiled = compile(&graph).unwrap();
    let err = compiled.call(&[ramp(&[3, 1], 0.0)]).unwrap_err();
    assert!(
        matches!(&err, minductor::RuntimeError::Shape { expected, .. } if expected.contains("s0 - 2")),
        "{err:?}"
    );
    let empty = compiled.call(&[ramp(&[3, 2], 0.0)]).unwrap();
    assert_eq!(empty[0].shape(), &[3, 0]);
}

/// The decode step through `scaled_dot_product_attention`: one fused attention step reads keys
/// and values of the derived length `s0 + 1` (no scores buffer), at every cache length.
#[test]
fn fused_attention_over_a_grown_cache() {
    let step = |x: &[Traced]| -> Vec<Traced> {
        let k_all = Traced::cat(&[&x[0], &x[3]], 2);
        let v_all = Traced::cat(&[&x[1], &x[4]], 2);
        vec![x[2].scaled_dot_product_attention(&k_all, &v_all, None, false)]
    };
    let shapes: [&[usize]; 5] = [
        &[1, 2, 0, 8],
        &[1, 2, 0, 8],
        &[1, 2, 1, 8],
        &[1, 2, 1, 8],
        &[1, 2, 1, 8],
    ];
    let graph = check_every_size(&shapes, &[], &step);
    let compiled = compile(&graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let attention: Vec<_> = program
        .steps
        .iter()
        .filter_map(|s| match s {
            minductor::internals::kernel_ir::Step::Attention(a) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(attention.len(), 1, "{program}");
    assert_eq!(attention[0].k.shape[2].to_string(), "s0 + 1", "{program}");
}

/// Gradients through a cat along a symbolic dim (each operand's rows of the gradient: `0:end-1`
/// and `end-1:end-0`) and through `pad` and slices from a start to the end (the gradient
/// between zeros, `s0 - 1` of them in one case). The interpreter has no `grad`: each size is
/// compared with a static compile of the same function (1e-5).
#[test]
fn gradients_through_cat_pad_and_slices_of_a_symbolic_dim() {
    let f = |x: &[Traced]| -> Vec<Traced> {
        let grown = Traced::cat(&[&x[0], &x[1]], 1);
        let padded = x[0].pad(&[1, 2], 0.25);
        let shifted = &padded.slice(1, Some(1), Some(-2), 1) * &padded.slice(1, Some(3), None, 1);
        let last = grown.slice(1, Some(-1), None, 1);
        let loss = (&grown * &grown.sin()).sum(&[], false)
            + shifted.sum(&[], false)
            + (&last * 3.0).sum(&[], false);
        let mut out = loss.grad(&[&x[0], &x[1]]);
        out.push(loss);
        out
    };
    let shapes: [&[usize]; 2] = [&[3, 0], &[3, 1]];
    let symbolic = compile(&build(None, &shapes, &[], &f)).unwrap();
    for size in (1..=19).chain([64]) {
        let inputs = vec![ramp(&[3, size], 0.3), ramp(&[3, 1], 1.7)];
        let want = compile(&build(Some(size), &shapes, &[], &f))
            .unwrap()
            .call(&inputs)
            .unwrap();
        let got = symbolic.call(&inputs).unwrap();
        minductor_tests::assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-5),
            &format!("size {size}"),
        );
    }
}
