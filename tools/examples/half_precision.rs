//! Kernels over f16 and bf16 tensors against the same graphs in f32, compiled, median of 21
//! calls each (after 3 warm-up calls): `x * 2`, `gelu(x * 2 + 1)`, a row softmax and a layer
//! norm, on 2048 × 2048. `cargo run --release -p minductor-tools --example half_precision --
//! [THREADS]` (1 by default); `MINDUCTOR_MATH_BLOCKS=0` converts inline instead of with the
//! kernel library's routines (`kernels/src/convert.rs`).

use minductor::{trace, DType, Graph, Tensor, Traced};

/// A graph of one input, by name.
type Unary = (&'static str, fn(&Traced) -> Traced);

/// Median milliseconds of 21 calls of `graph` on `inputs`, after 3 warm-up calls.
fn median_ms(graph: &Graph, inputs: &[Tensor]) -> Result<f64, Box<dyn std::error::Error>> {
    minductor_tools::bench::median_call_ms(graph, inputs, 21)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads = match std::env::args().nth(1) {
        Some(t) => t.parse()?,
        None => 1,
    };
    minductor::set_num_threads(threads)?;
    println!("{threads} thread(s), median ms of 21 calls, [2048, 2048]");
    let (m, n) = (2048, 2048);
    let graphs: [Unary; 4] = [
        ("x * 2", |x| x * 2.0),
        ("gelu(x * 2 + 1)", |x| (x * 2.0 + 1.0).gelu()),
        ("softmax", |x| x.softmax(-1)),
        ("layer_norm", |x| x.layer_norm(&[2048], None, None, 1e-5)),
    ];
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let values: Vec<f64> = (0..m * n)
            .map(|i| ((i % 1000) as f64 - 500.0) / 100.0)
            .collect();
        let x = [Tensor::from_f64(dtype, &[m, n], &values)?];
        let mut line = format!("{dtype:?}:");
        for (name, f) in graphs {
            let graph = trace(|t| vec![f(&t.input("x", dtype, &[m, n]))])?;
            line += &format!("  {name} {:.3}", median_ms(&graph, &x)?);
        }
        println!("{line}");
    }
    Ok(())
}
