//! Derived symbols: dims whose extent is a size expression over input symbols (`s0 + 1` of a
//! `cat` with a KV cache, `2*s0` of a flatten, `s0 + -1` of `x[:, 1:]`). One symbolic graph
//! serves every size; each result is compared with the reference interpreter on a static trace
//! of the same function.

use minductor::ir::{Dim, SymId, TensorType};
use minductor::{compile, interpret, jit, trace, DType, Graph, Tensor, Traced, Tracer};
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
}
