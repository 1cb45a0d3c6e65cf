//! Quick timing of the compiled gelu / softmax / layer_norm workloads with 1 and 2 rayon threads,
//! as a fraction of this machine's copy bandwidth (each input read once, each output written once).
//!
//! `cargo run --release -p minductor-benches --example kernel_speed [-- REPEATS]`
//!
//! gelu 16M runs on a [4096, 4096] view of its inputs so that its kernel has an outer loop to
//! split across threads.

use minductor::{compile, trace, DType, Graph, Tensor};
use minductor_benches::{layer_norm, softmax, values};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn min(v: &[f64]) -> f64 {
    v.iter().cloned().fold(f64::INFINITY, f64::min)
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

/// Bytes per second of a 64 MB copy split in `threads` halves (read + write bytes).
fn copy_bandwidth(threads: usize, repeats: usize) -> f64 {
    let n = (64 << 20) / 4;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    let pool = pool(threads);
    let chunk = n.div_ceil(threads);
    let times = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            pool.install(|| {
                rayon::scope(|s| {
                    for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                        s.spawn(move |_| d.copy_from_slice(c));
                    }
                })
            });
            t.elapsed().as_secs_f64()
        })
        .collect();
    std::hint::black_box(&dst);
    2.0 * (n * 4) as f64 / median(times)
}

fn gelu_2d(rows: usize, cols: usize) -> (Graph, Vec<Tensor>) {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[rows, cols]);
        let w = t.input("w", DType::F32, &[rows, cols]);
        let b = t.input("b", DType::F32, &[rows, cols]);
        vec![(&x * &w + &b).gelu()]
    })
    .expect("well-typed");
    let s = [rows, cols];
    (graph, vec![values(&s, 1), values(&s, 2), values(&s, 3)])
}

fn bytes(inputs: &[Tensor], outputs: &[Tensor]) -> f64 {
    inputs
        .iter()
        .chain(outputs)
        .map(|t| (t.numel() * t.dtype().size_bytes()) as f64)
        .sum()
}

fn main() {
    let repeats: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(21);
    let copy = copy_bandwidth(2, repeats);
    println!(
        "copy bandwidth (64 MB, 2 threads, median of {repeats}): {:.2} GB/s",
        copy / 1e9
    );
    let workloads = [
        ("pointwise_gelu_16m (4096x4096)", gelu_2d(4096, 4096)),
        ("softmax_4096x1024", softmax(4096, 1024)),
        ("layernorm_4096x1024", layer_norm(4096, 1024)),
    ];
    println!(
        "{:<32} {:>8} {:>10} {:>8} {:>10} {:>8}",
        "workload", "1t ms", "1t GB/s", "1t frac", "2t GB/s", "2t frac"
    );
    // KERNEL_SPEED_ONLY=softmax restricts the run to workloads whose name contains it.
    let only = std::env::var("KERNEL_SPEED_ONLY").unwrap_or_default();
    for (name, (graph, inputs)) in workloads {
        if !name.contains(&only) {
            continue;
        }
        let compiled = compile(&graph).expect("compiles");
        let out = compiled.call(&inputs).expect("runs");
        let moved = bytes(&inputs, &out);
        let mut cells = Vec::new();
        for threads in [1, 2] {
            let pool = pool(threads);
            let times: Vec<f64> = (0..repeats)
                .map(|_| {
                    let t = Instant::now();
                    let out = pool.install(|| compiled.call(&inputs).expect("runs"));
                    let dt = t.elapsed().as_secs_f64();
                    drop(out);
                    dt
                })
                .collect();
            let fastest = min(&times);
            let m = median(times);
            cells.push((m * 1e3, moved / m / 1e9, moved / m / copy, fastest * 1e3));
        }
        // What a fresh output costs before any kernel runs: allocation and first touch of each
        // page (the runtime allocates its outputs on every call).
        let out_elems: usize = out.iter().map(|t| t.numel()).sum();
        let fresh_output = median(
            (0..repeats)
                .map(|_| {
                    let t = Instant::now();
                    let mut v = vec![0f32; out_elems];
                    for x in v.iter_mut().step_by(1024) {
                        *x = 1.0;
                    }
                    std::hint::black_box(&v);
                    t.elapsed().as_secs_f64()
                })
                .collect(),
        );
        println!(
            "{:<32} {:>8.2} {:>10.2} {:>7.0}% | 2t {:>6.2} ms {:>8.2} {:>7.0}% | min 1t {:.2} ms, 2t {:.2} ms | fresh output {:.2} ms",
            name,
            cells[0].0,
            cells[0].1,
            cells[0].2 * 100.0,
            cells[1].0,
            cells[1].1,
            cells[1].2 * 100.0,
            cells[0].3,
            cells[1].3,
            fresh_output * 1e3
        );
    }
}
