//! Times a linear layer `x @ wᵀ + b` (`w: [4096, 1024]`, the MLP workload's first layer)
//! compiled as usual (the weight a call input, packed at every call) and frozen (`compile_frozen`:
//! the weight a constant, packed once at compile time), for a few batch sizes, and checks that
//! both give the same values: `cargo run --release --example frozen_linear -- [threads]`
//! (default 2). The two are timed alternately, so the machine's load hits both alike.

use minductor::{compile, compile_frozen, trace, DType, Tensor};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2);
    minductor::set_num_threads(threads)?;
    let (k, n) = (1024usize, 4096usize);
    let fill = |shape: &[usize]| {
        let count: usize = shape.iter().product();
        let values = (0..count)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        Tensor::from_vec(shape, values)
    };
    let (w, b) = (fill(&[n, k])?, fill(&[n])?);
    println!("linear [m, {k}] @ [{n}, {k}]ᵀ + b, {threads} threads: median of 21 calls each");
    println!(
        "{:>6} {:>12} {:>12} {:>8}",
        "m", "weight ms", "frozen ms", "ratio"
    );
    for m in [1usize, 16, 64, 256, 2048] {
        let graph = trace(|t| {
            let x = t.input("x", DType::F32, &[m, k]);
            let w = t.input("w", DType::F32, &[n, k]);
            let b = t.input("b", DType::F32, &[n]);
            vec![x.linear(&w, Some(&b))]
        })?;
        let x = fill(&[m, k])?;
        let plain = compile(&graph)?;
        let frozen = compile_frozen(&graph, &[("w", w.clone()), ("b", b.clone())])?;
        let all = [x.clone(), w.clone(), b.clone()];
        let just_x = [x];
        let want = plain.call(&all)?;
        let got = frozen.call(&just_x)?;
        let (want, got) = (want[0].to_vec::<f32>()?, got[0].to_vec::<f32>()?);
        let worst = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "frozen and unfrozen differ by {worst}");
        let (mut a, mut f) = (Vec::new(), Vec::new());
        for round in 0..24 {
            let started = Instant::now();
            plain.call(&all)?;
            let plain_ms = started.elapsed().as_secs_f64() * 1e3;
            let started = Instant::now();
            frozen.call(&just_x)?;
            let frozen_ms = started.elapsed().as_secs_f64() * 1e3;
            if round >= 3 {
                a.push(plain_ms);
                f.push(frozen_ms);
            }
        }
        a.sort_by(f64::total_cmp);
        f.sort_by(f64::total_cmp);
        let (a, f) = (a[a.len() / 2], f[f.len() / 2]);
        println!("{m:>6} {a:>12.3} {f:>12.3} {:>7.2}x", a / f);
    }
    Ok(())
}
