//! Workloads shared by the criterion benches (and, later, the harness binary).

use minductor::{trace, DType, Graph, Tensor};

/// Deterministic values in [-2, 2).
pub fn values(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| {
            (((i as u64).wrapping_mul(2654435761).wrapping_add(seed * 97) % 1000) as f32 / 250.0)
                - 2.0
        })
        .collect();
    Tensor::from_vec(shape, data).expect("shape matches data")
}

/// `gelu(x * w + b)` (erf form) over `n` elements.
pub fn pointwise_gelu(n: usize) -> (Graph, Vec<Tensor>) {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[n]);
        let w = t.input("w", DType::F32, &[n]);
        let b = t.input("b", DType::F32, &[n]);
        vec![(&x * &w + &b).gelu()]
    })
    .expect("well-typed");
    (
        graph,
        vec![values(&[n], 1), values(&[n], 2), values(&[n], 3)],
    )
}

/// Softmax over the last dim of a `rows x cols` matrix.
pub fn softmax(rows: usize, cols: usize) -> (Graph, Vec<Tensor>) {
    let graph =
        trace(|t| vec![t.input("x", DType::F32, &[rows, cols]).softmax(-1)]).expect("well-typed");
    (graph, vec![values(&[rows, cols], 1)])
}

/// Affine layer_norm over the last dim, eps 1e-5.
pub fn layer_norm(rows: usize, cols: usize) -> (Graph, Vec<Tensor>) {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[rows, cols]);
        let g = t.input("g", DType::F32, &[cols]);
        let b = t.input("b", DType::F32, &[cols]);
        vec![x.layer_norm(&[cols], Some(&g), Some(&b), 1e-5)]
    })
    .expect("well-typed");
    (
        graph,
        vec![
            values(&[rows, cols], 1),
            values(&[cols], 2),
            values(&[cols], 3),
        ],
    )
}
