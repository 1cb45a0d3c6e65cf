//! GFLOP/s of the fused attention routine alone, on `[batch, heads, t, e]` operands laid out
//! contiguously (attention_8x256x512's by default: 8 × 8 heads, 256 queries and keys, width 64;
//! no mask): the median over 15 calls of the process's CPU time per thread, after one warm-up
//! call. `THREADS` (default 1), `CAUSAL=1`, and `SHAPE=batch,heads,t,e` change the case;
//! `PROJECTED=1` reads q, k and v from one `[batch, t, 3, heads, e]` buffer, as a transformer
//! block's attention reads them from its fused projection (rows `3 · heads · e` apart):
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
    let values = |count: usize, seed: usize| -> Vec<f32> {
        (0..count)
            .map(|i| ((i * 2654435761 + seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    };
    let projected = std::env::var("PROJECTED").is_ok_and(|v| v == "1");
    // q, k and v: three buffers `[batch, heads, t, e]`, or views of one `[batch, t, 3, heads,
    // e]` at offsets 0, `heads · e` and `2 · heads · e`.
    let (data, offsets, strides) = if projected {
        let row = (3 * heads * e) as i64;
        let strides = [t as i64 * row, e as i64, row, 1];
        let at = (heads * e) as i64;
        (vec![values(3 * n, 1)], [0, at, 2 * at], strides)
    } else {
        let strides = [(heads * t * e) as i64, (t * e) as i64, e as i64, 1];
        (
            vec![values(n, 1), values(n, 2), values(n, 3)],
            [0; 3],
            strides,
        )
    };
    let operand = |i: usize| &data[i.min(data.len() - 1)][..];
    fn view<'a>(data: &'a [f32], offset: i64, strides: &'a [i64]) -> View<'a, f32> {
        View {
            data,
            offset,
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
            view(operand(0), offsets[0], &strides),
            view(operand(1), offsets[1], &strides),
            view(operand(2), offsets[2], &strides),
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
            "attention [{batch}, {heads}, {t}, {e}]{}{} on {threads} threads: {:.3} ms ({:.1} GFLOP/s)",
            if causal { " causal" } else { "" },
            if projected { " projected" } else { "" },
            median * 1e3,
            flops / median / 1e9
        );
    }
}
