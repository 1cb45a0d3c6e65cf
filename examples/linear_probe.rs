//! Times one GEMM of the MLP workload, `[256, 1024] @ w`, with `w` row-major (`[1024, 4096]`)
//! and as a linear layer's transposed weight (`x @ wᵀ`, `w: [4096, 1024]`), whose panels are
//! packed from columns: `cargo run --release --example linear_probe -- [threads]` (default 2).
//! `MINDUCTOR_PACK_GATHER=1` packs those columns with AVX-512 gathers instead of transposes.

use minductor::{compile, trace, DType, Tensor};
use std::time::Instant;

/// Median wall time of 15 calls after 3 warm-up calls, in ms.
fn median_ms(f: &dyn Fn()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut times: Vec<f64> = (0..15)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2);
    minductor::set_num_threads(threads)?;
    let (m, k, n) = (256usize, 1024usize, 4096usize);
    let fill = |shape: &[usize]| {
        let count: usize = shape.iter().product();
        let values = (0..count)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        Tensor::from_vec(shape, values)
    };
    let row_major = trace(|t| {
        let x = t.input("x", DType::F32, &[m, k]);
        let w = t.input("w", DType::F32, &[k, n]);
        vec![x.matmul(&w)]
    })?;
    let linear = trace(|t| {
        let x = t.input("x", DType::F32, &[m, k]);
        let w = t.input("w", DType::F32, &[n, k]);
        vec![x.linear(&w, None)]
    })?;
    let (x, w, w_t) = (fill(&[m, k])?, fill(&[k, n])?, fill(&[n, k])?);
    let (row_major, linear) = (compile(&row_major)?, compile(&linear)?);
    let mflop = 2.0 * (m * k * n) as f64 / 1e6;
    for _ in 0..2 {
        let a = median_ms(&|| drop(row_major.call(&[x.clone(), w.clone()]).unwrap()));
        let b = median_ms(&|| drop(linear.call(&[x.clone(), w_t.clone()]).unwrap()));
        println!(
            "{threads} threads: x @ w {a:.2} ms ({:.0} GFLOP/s), x @ wᵀ {b:.2} ms ({:.0} GFLOP/s)",
            mflop / a,
            mflop / b
        );
    }
    Ok(())
}
