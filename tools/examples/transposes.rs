//! Graphs that read transposed views, compiled, with the median of 21 calls each (after 3
//! warm-up calls): `x.t()` materialized and `x.t() * 2` against `x * 2` on the same shapes, a
//! layer norm over the channels of an NCHW tensor seen as NHWC, `softmax(x.t())`, and `x.t()`
//! of f16, bf16 and i64 tensors (each element size has its own routine).
//! `cargo run --release -p minductor-tools --example transposes -- [THREADS]` (1 by default).
//! These are the kernels `passes/src/split_transposes.rs` and `codegen_cpu/src/lower/transpose.rs`
//! change; `MINDUCTOR_MATH_BLOCKS=avx2` (or `0`) runs the transpose routine's AVX2 (portable)
//! form.

use minductor::{trace, DType, Graph, Tensor, Traced};

/// Median milliseconds of 21 calls of `graph` on `inputs`, after 3 warm-up calls.
fn median_ms(graph: &Graph, inputs: &[Tensor]) -> Result<f64, Box<dyn std::error::Error>> {
    minductor_tools::bench::median_call_ms(graph, inputs, 21)
}

/// A tensor of `shape` with values in [0, 1).
fn values(shape: &[usize]) -> Result<Tensor, Box<dyn std::error::Error>> {
    let n = shape.iter().product();
    let data = (0..n).map(|i| (i % 1000) as f32 / 1000.0).collect();
    Ok(Tensor::from_vec(shape, data)?)
}

/// `f` of one f32 input of `shape`.
fn unary(shape: &[usize], f: fn(&Traced) -> Traced) -> Result<Graph, Box<dyn std::error::Error>> {
    Ok(trace(|t| vec![f(&t.input("x", DType::F32, shape))])?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads = match std::env::args().nth(1) {
        Some(t) => t.parse()?,
        None => 1,
    };
    minductor::set_num_threads(threads)?;
    println!("{threads} thread(s), median ms of 21 calls");
    for (m, n) in [
        (2048, 2048),
        (2000, 2000),
        (4000, 1008),
        (512, 512),
        (64, 4096),
    ] {
        let x = [values(&[m, n])?];
        let mut typed = String::new();
        let data: Vec<f64> = (0..m * n).map(|i| (i % 1000) as f64).collect();
        for dtype in [DType::F16, DType::BF16, DType::I64] {
            let graph = trace(|t| vec![t.input("x", dtype, &[m, n]).transpose(0, 1)])?;
            let ms = median_ms(&graph, &[Tensor::from_f64(dtype, &[m, n], &data)?])?;
            typed += &format!("  {dtype:?} x.t() {ms:.3}");
        }
        let copy = median_ms(&unary(&[m, n], |x| x.transpose(0, 1))?, &x)?;
        let scaled = median_ms(&unary(&[m, n], |x| x.transpose(0, 1) * 2.0)?, &x)?;
        let plain = median_ms(&unary(&[m, n], |x| x.clone() * 2.0)?, &x)?;
        let softmax = median_ms(&unary(&[m, n], |x| x.transpose(0, 1).softmax(-1))?, &x)?;
        println!(
            "{m}x{n}: x.t() {copy:.3}  x.t()*2 {scaled:.3}  x*2 {plain:.3}  \
             softmax(x.t()) {softmax:.3}{typed}"
        );
    }
    for (b, c, h, w) in [(8, 64, 32, 32), (4, 256, 16, 16)] {
        let graph = trace(|t| {
            let x = t.input("x", DType::F32, &[b, c, h, w]);
            let weight = t.input("w", DType::F32, &[c]);
            let bias = t.input("b", DType::F32, &[c]);
            vec![x
                .permute(&[0, 2, 3, 1])
                .layer_norm(&[c], Some(&weight), Some(&bias), 1e-5)]
        })?;
        let inputs = [values(&[b, c, h, w])?, values(&[c])?, values(&[c])?];
        let ms = median_ms(&graph, &inputs)?;
        println!("layer_norm of [{b}, {c}, {h}, {w}] seen as NHWC: {ms:.3}");
    }
    Ok(())
}
