//! GFLOP/s of the fused attention routine alone, on `[batch, heads, t, e]` operands laid out
//! contiguously (attention_8x256x512's by default: 8 × 8 heads, 256 queries and keys, width 64;
//! no mask): the median over 15 calls of the process's CPU time per thread, after one warm-up
//! call. `THREADS` (default 1), `CAUSAL=1`, and `SHAPE=batch,heads,t,e` change the case:
//! `cargo run --release -p minductor-kernels --example attention_speed [-- rounds]`.

use minductor_kernels::attention::{attention, AttentionShape, AttentionTiling};
use minductor_kernels::scatter::View;

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::process_cpu_seconds;

fn main() {
    let shape: Vec<usize> = std::env::var("SHAPE")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .filter(|v: &Vec<usize>| v.len() == 4)
        .unwrap_or(vec![8, 8, 256, 64]);
    let [batch, heads, t, e] = [shape[0], shape[1], shape[2], shape[3]];
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let causal = std::env::var("CAUSAL").is_ok_and(|v| v == "1");
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    minductor_runtime::threads::set_num_threads(threads).unwrap();
    let n = batch * heads * t * e;
    let values = |seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 2654435761 + seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    };
    let (q, k, v) = (values(1), values(2), values(3));
    let strides = [(heads * t * e) as i64, (t * e) as i64, e as i64, 1];
    fn view<'a>(data: &'a [f32], strides: &'a [i64]) -> View<'a, f32> {
        View {
            data,
            offset: 0,
            strides,
        }
    }
    let batch_dims = [batch, heads];
    let shape = AttentionShape {
        batch: &batch_dims,
        t,
        s: t,
        e,
        ev: e,
        group: 1,
        scale: 1.0 / (e as f32).sqrt(),
        causal,
    };
    let mut out = vec![0f32; n];
    let mut call = || {
        attention(
            view(&q, &strides),
            view(&k, &strides),
            view(&v, &strides),
            None,
            &shape,
            AttentionTiling::DEFAULT,
            &mut out,
        )
        .unwrap()
    };
    // q·kᵀ and p·v (a causal mask skips about half of both).
    let flops = 4.0 * (batch * heads * t * t * e) as f64 / if causal { 2.0 } else { 1.0 };
    for _ in 0..rounds {
        call();
        let mut times: Vec<f64> = (0..15)
            .map(|_| {
                let cpu = process_cpu_seconds();
                call();
                (process_cpu_seconds() - cpu) / threads as f64
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "attention [{batch}, {heads}, {t}, {e}]{} on {threads} threads: {:.3} ms ({:.1} GFLOP/s)",
            if causal { " causal" } else { "" },
            median * 1e3,
            flops / median / 1e9
        );
    }
}
