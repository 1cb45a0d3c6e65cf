use minductor_codegen_cpu::gemm::*;
use minductor_ir::Window2d;
use std::time::Instant;
fn main() {
    let (m, c, h, w) = (64, 64, 56, 56);
    let window = Window2d {
        kernel: [3, 3],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
    };
    let k = c * 9;
    let n = h * w;
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
    // `IMAGES=n`: cycle through n images and outputs (as a batch does: inputs not in cache).
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
    let flops = 2.0 * (m * k * n) as f64;
    for _ in 0..3 {
        let mut s = f64::MAX;
        for round in 0..50 {
            let image = round % images;
            let xi = Im2colRef::new(&x, image * c * h * w, c, [h, w], window).unwrap();
            let t = Instant::now();
            let mut o = MatrixMut::row_major(&mut outs[image], m, n).unwrap();
            multiply_im2col(&packed, &xi, &mut o).unwrap();
            s = s.min(t.elapsed().as_secs_f64());
        }
        println!(
            "implicit: {:.3} ms/image  {:.1} GFLOP/s",
            s * 1e3,
            flops / s / 1e9
        );
    }
    // Materialized b, the plain path.
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
    let b_ref = MatrixRef::row_major(&b, k, n).unwrap();
    for _ in 0..2 {
        let mut s = f64::MAX;
        for _ in 0..30 {
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
}
