//! Times one image of a 3x3 convolution on one thread: the implicit GEMM, Winograd F(2x2, 3x3)
//! and a GEMM over a materialized im2col. `SHAPE=c,k,h,w` (default 64,64,56,56),
//! `IMAGES=n`: cycle through n images and outputs (as a batch does: inputs not in cache).
use minductor_ir::Window2d;
use minductor_kernels::gemm::*;
use std::time::Instant;
fn main() {
    let shape: Vec<usize> = std::env::var("SHAPE")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect())
        .filter(|v: &Vec<usize>| v.len() == 4)
        .unwrap_or(vec![64, 64, 56, 56]);
    let (c, m, h, w) = (shape[0], shape[1], shape[2], shape[3]);
    let window = Window2d {
        kernel: [3, 3],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
    };
    let k = c * 9;
    let n = h * w;
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
    let images: usize = std::env::var("IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let x: Vec<f32> = (0..images * c * h * w)
        .map(|i| (i % 5) as f32 * 0.1)
        .collect();
    let mut outs = vec![vec![0f32; m * n]; images];
    let mut out = vec![0f32; m * n];
    let kernel = Kernel::detect();
    let a_ref = MatrixRef::row_major(&a, m, k).unwrap();
    let packed = PackedA::pack(&a_ref, kernel).unwrap();
    let transformed = WinogradWeight::transform(&a_ref, kernel).unwrap();
    let (mut transform_time, mut pack_time) = (f64::MAX, f64::MAX);
    for _ in 0..20 {
        let t = Instant::now();
        let _ = WinogradWeight::transform(&a_ref, kernel).unwrap();
        transform_time = transform_time.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let _ = PackedA::pack(&a_ref, kernel).unwrap();
        pack_time = pack_time.min(t.elapsed().as_secs_f64());
    }
    println!(
        "weight: transformed and packed in {:.3} ms, packed for the implicit GEMM in {:.3} ms",
        transform_time * 1e3,
        pack_time * 1e3
    );
    let flops = 2.0 * (m * k * n) as f64;
    let rounds = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or((200_000_000.0 / flops).clamp(5.0, 2000.0) as usize);
    println!(
        "{c} -> {m} channels, {h}x{w}; auto picks winograd: {}",
        prefers_winograd(ConvAlgorithm::Auto, kernel, &window, c, [h, w])
    );
    // `ONLY=winograd` or `ONLY=implicit` times just that one (for a profiler).
    let only = std::env::var("ONLY").ok();
    for _ in 0..3 {
        for winograd in [false, true] {
            let name = if winograd { "winograd" } else { "implicit" };
            if only.as_deref().is_some_and(|o| o != name) {
                continue;
            }
            let mut s = f64::MAX;
            for round in 0..rounds {
                let image = round % images;
                let xi = Im2colRef::new(&x, image * c * h * w, c, [h, w], window).unwrap();
                let t = Instant::now();
                let mut o = MatrixMut::row_major(&mut outs[image], m, n).unwrap();
                if winograd {
                    multiply_winograd(&transformed, &xi, &mut o).unwrap();
                } else {
                    multiply_im2col(&packed, &xi, &mut o).unwrap();
                }
                s = s.min(t.elapsed().as_secs_f64());
            }
            println!(
                "{}: {:.3} ms/image  {:.1} GFLOP/s (direct-equivalent)",
                name,
                s * 1e3,
                flops / s / 1e9
            );
        }
    }
    if only.is_some() {
        return;
    }
    // Materialized b, the plain path.
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
    let b_ref = MatrixRef::row_major(&b, k, n).unwrap();
    let mut s = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        let mut o = MatrixMut::row_major(&mut out, m, n).unwrap();
        sgemm(&a_ref, &b_ref, &mut o, 1).unwrap();
        s = s.min(t.elapsed().as_secs_f64());
    }
    println!(
        "sgemm materialized: {:.3} ms/image  {:.1} GFLOP/s",
        s * 1e3,
        flops / s / 1e9
    );
}
