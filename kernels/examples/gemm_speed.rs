//! GFLOP/s of our GEMM (detected kernel) on the MLP's shapes, on 1 and 2 threads, packing and
//! multiplying timed apart:
//! `cargo run --release -p minductor-codegen-cpu --example gemm_speed`.

use minductor_kernels::gemm::{multiply_parallel, Kernel, MatrixMut, MatrixRef, PackedB};
use std::time::Instant;

fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..11)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let shapes = [
        [256, 1024, 4096],
        [256, 4096, 1024],
        [128, 1024, 4096],
        [64, 1024, 4096],
    ];
    let kernel = Kernel::detect();
    for threads in [1, 2] {
        minductor_runtime::threads::set_num_threads(threads).unwrap();
        for [m, k, n] in shapes {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.01).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut c = vec![0f32; m * n];
            let a = MatrixRef::row_major(&a, m, k).unwrap();
            // `b` transposed (as a backward pass's `dY @ W^T` reads it) when asked.
            let b = if std::env::args().any(|a| a == "--transposed-b") {
                MatrixRef::new(&b, 0, [k, n], [1, k as i64], "b").unwrap()
            } else {
                MatrixRef::row_major(&b, k, n).unwrap()
            };
            let pack = median(|| drop(PackedB::pack(&b, kernel, threads).unwrap()));
            let packed = PackedB::pack(&b, kernel, threads).unwrap();
            let mul = median(|| {
                let mut out = MatrixMut::row_major(&mut c, m, n).unwrap();
                multiply_parallel(&a, &packed, &mut out, threads).unwrap();
            });
            let flop = 2.0 * (m * k * n) as f64;
            println!(
                "{kernel:?} threads {threads} {m}x{k}x{n}: pack {:.2} ms, multiply {:.2} ms = {:.1} GFLOP/s, together {:.1} GFLOP/s",
                pack * 1e3, mul * 1e3, flop / mul / 1e9, flop / (mul + pack) / 1e9
            );
        }
    }
}
