//! The demo: trace a small MLP, compile it, check it against eager, and time both.
//!
//! `cargo run --release --example mlp_demo`

use minductor::{compile_with, trace, Backend, DType, Tensor};
use std::time::{Duration, Instant};

fn random(shape: &[usize], scale: f32, seed: u64) -> Tensor {
    // A small xorshift generator: the demo needs no randomness crate.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(shape, data).expect("shape matches data")
}

fn median_time(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn main() {
    let (batch, width, hidden) = (64, 512, 2048);
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[batch, width]);
        let w1 = t.input("w1", DType::F32, &[hidden, width]);
        let b1 = t.input("b1", DType::F32, &[hidden]);
        let w2 = t.input("w2", DType::F32, &[width, hidden]);
        let b2 = t.input("b2", DType::F32, &[width]);
        let h = x.layer_norm(&[width], None, None, 1e-5);
        let y = h.linear(&w1, Some(&b1)).gelu().linear(&w2, Some(&b2));
        vec![(&x + &y).softmax(-1)]
    })
    .expect("the MLP is well-typed");
    println!("traced graph:\n{graph}\n");

    let inputs = vec![
        random(&[batch, width], 1.0, 1),
        random(&[hidden, width], 0.05, 2),
        random(&[hidden], 0.1, 3),
        random(&[width, hidden], 0.05, 4),
        random(&[width], 0.1, 5),
    ];
    let eager = compile_with(&graph, Backend::Eager).expect("eager compiles");
    let compiled = compile_with(&graph, Backend::Inductor).expect("inductor compiles");
    if let Some(program) = &compiled.artifacts().program {
        println!("kernel program:\n{program}");
    }

    let want = eager.call(&inputs).expect("eager runs");
    let got = compiled.call(&inputs).expect("compiled runs");
    let max_err = want[0]
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(got[0].to_vec::<f32>().unwrap())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let eager_time = median_time(21, || {
        eager.call(&inputs).unwrap();
    });
    let compiled_time = median_time(21, || {
        compiled.call(&inputs).unwrap();
    });
    println!("MLP [{batch}x{width}] -> {hidden} -> {width}, layer_norm, gelu, residual, softmax");
    println!(
        "max |compiled - eager|  {max_err:.3e}  ({})",
        if max_err < 1e-5 { "match" } else { "MISMATCH" }
    );
    println!(
        "compile time            {:.2} ms",
        compiled.compile_time().as_secs_f64() * 1e3
    );
    println!(
        "eager    median of 21   {:.3} ms",
        eager_time.as_secs_f64() * 1e3
    );
    println!(
        "compiled median of 21   {:.3} ms",
        compiled_time.as_secs_f64() * 1e3
    );
    println!(
        "speedup                 {:.2}x",
        eager_time.as_secs_f64() / compiled_time.as_secs_f64()
    );
    if max_err >= 1e-5 {
        std::process::exit(1);
    }
}
