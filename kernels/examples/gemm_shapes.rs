//! GFLOP/s of our GEMM (detected kernel) on the suite's linear-layer shapes (`x · wᵀ`, `b`
//! column-contiguous unless `--row-major-b`; `a` row-major unless `--transposed-a`) on
//! `THREADS` threads (default 2): `b` packed
//! alone, the multiply with `b` packed beforehand, lazily packed `b` and the multiply together
//! (`multiply_parallel`), and `multiply_streaming`. Times are medians of CPU time per thread
//! (wall time with `WALL=1`). `SHAPES=name,name` keeps the shapes whose names contain one of
//! them, `MODES=multiply,streaming` (for example) the given measurements; `COLD=1` evicts
//! every operand from the caches before each timed call (writing 96 MiB), as in a program;
//! the operands are tensors' storage, huge pages where the kernel has them (`SMALL_PAGES=1`:
//! plain vectors):
//! `cargo run --release -p minductor-kernels --example gemm_shapes [-- rounds]`.

use minductor_kernels::gemm::{
    multiply_parallel, multiply_streaming, multiply_weight_rows, prefers_weight_rows, Kernel,
    MatrixMut, MatrixRef, PackedB,
};
use std::time::Instant;

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::process_cpu_seconds;

/// `len` zeros where the operands of a compiled program live: a tensor's storage, which for
/// 4 MiB or more is a mapping of its own marked for transparent huge pages (`pages.rs`), or with
/// `SMALL_PAGES=1` a plain `Vec` (4 KiB pages under `THP=madvise`), as this example had until
/// it was seen to measure what no program runs: with 4 KiB pages each 6-row tile of a `c` whose
/// rows are 4 KiB apart touches 6 pages. Measured on an Intel Xeon of family 6 model 207, one
/// thread, three alternated runs: the train step's depth-256 products `--transposed-a`
/// multiplied in 15.2-15.3 ms against 15.8-16.0 ([4096x256]·[256x1024]) and 13.9-14.1 against
/// 14.7-14.8 ([1024x256]·[256x4096]); perf's share of the loop around the tiles (stalled on the
/// tile's stores) fell from 13% to 4%.
enum Buffer {
    Vec(Vec<f32>),
    Tensor(minductor_runtime::Tensor),
}

fn buffer(len: usize) -> Buffer {
    if std::env::var("SMALL_PAGES").is_ok_and(|v| v == "1") {
        Buffer::Vec(vec![0f32; len])
    } else {
        Buffer::Tensor(minductor_runtime::Tensor::zeros(
            minductor_ir::DType::F32,
            &[len],
        ))
    }
}

impl Buffer {
    fn values(&mut self) -> &mut [f32] {
        match self {
            Buffer::Vec(v) => v,
            Buffer::Tensor(t) => t
                .data_mut::<f32>()
                .expect("a contiguous f32 tensor of its own"),
        }
    }
}

/// Median wall seconds and median process CPU seconds per thread (CPU seconds / threads) of
/// 15 calls after one warm-up call.
fn median(f: &mut dyn FnMut()) -> f64 {
    f();
    let threads = minductor_runtime::threads::num_threads() as f64;
    let cold = std::env::var("COLD").is_ok();
    let mut flush = vec![0u8; if cold { 96 << 20 } else { 0 }];
    let mut times: Vec<f64> = (0..15)
        .map(|i| {
            // `COLD=1`: every operand evicted from the caches first, as in a program whose
            // other steps ran in between.
            flush.iter_mut().for_each(|x| *x = x.wrapping_add(i as u8));
            std::hint::black_box(&flush);
            let (t, cpu) = (Instant::now(), process_cpu_seconds());
            f();
            let (wall, cpu) = (t.elapsed().as_secs_f64(), process_cpu_seconds() - cpu);
            if std::env::var("WALL").is_ok() {
                wall
            } else {
                cpu / threads
            }
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let shapes = [
        ("mlp up", [256, 1024, 4096]),
        ("mlp down", [256, 4096, 1024]),
        ("llama qkvo", [1024, 512, 512]),
        ("llama kv", [1024, 512, 256]),
        ("llama gate/up", [1024, 512, 1408]),
        ("llama down", [1024, 1408, 512]),
        ("square", [1024, 1024, 1024]),
        // attention_8x256x512's linear layers (8 sequences of 256 rows stacked).
        ("attn qkv", [2048, 512, 1536]),
        ("attn out", [2048, 512, 512]),
        ("attn ffn up", [2048, 512, 2048]),
        ("attn ffn down", [2048, 2048, 512]),
        // mlp_train_step_256's backward products (dX = dY · W, dW = dYᵀ · X).
        ("train dx", [256, 4096, 1024]),
        ("train dw", [4096, 256, 1024]),
        ("train dw2", [1024, 256, 4096]),
    ];
    // `SHAPES=name,name` keeps the shapes whose names contain one of them; `MODES=` picks among
    // pack, multiply, together, streaming, in_place (all by default).
    let wanted = |name: &str| {
        std::env::var("SHAPES").map_or(true, |list| list.split(',').any(|w| name.contains(w)))
    };
    let mode =
        |m: &str| std::env::var("MODES").map_or(true, |list| list.split(',').any(|w| w == m));
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let row_major_b = std::env::args().any(|a| a == "--row-major-b");
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|s| s.parse().ok())
        .unwrap_or(1);
    minductor_runtime::threads::set_num_threads(threads).unwrap();
    let kernel = Kernel::detect();
    for _ in 0..rounds {
        for (name, [m, k, n]) in shapes {
            if !wanted(name) {
                continue;
            }
            let (mut a, mut b, mut c) = (buffer(m * k), buffer(k * n), buffer(m * n));
            for (i, x) in a.values().iter_mut().enumerate() {
                *x = (i % 17) as f32 * 0.01;
            }
            for (i, x) in b.values().iter_mut().enumerate() {
                *x = (i % 13) as f32 * 0.01;
            }
            let (a, b, c): (&[f32], &[f32], &mut [f32]) = (a.values(), b.values(), c.values());
            // `--transposed-a`: `a` column-contiguous (a backward pass's `dYᵀ`).
            let a = if std::env::args().any(|a| a == "--transposed-a") {
                MatrixRef::new(a, 0, [m, k], [1, m as i64], "a").unwrap()
            } else {
                MatrixRef::row_major(a, m, k).unwrap()
            };
            let b = if row_major_b {
                MatrixRef::row_major(b, k, n).unwrap()
            } else {
                MatrixRef::new(b, 0, [k, n], [1, k as i64], "b").unwrap()
            };
            let skip = |m: &str, f: &mut dyn FnMut()| if mode(m) { median(f) } else { f64::NAN };
            let pack = skip("pack", &mut || {
                drop(PackedB::pack(&b, kernel, threads).unwrap())
            });
            let packed = PackedB::pack(&b, kernel, threads).unwrap();
            let multiply = skip("multiply", &mut || {
                let mut out = MatrixMut::row_major(c, m, n).unwrap();
                multiply_parallel(&a, &packed, &mut out, threads).unwrap();
            });
            let together = skip("together", &mut || {
                let packed = PackedB::lazy(&b, kernel).unwrap();
                let mut out = MatrixMut::row_major(c, m, n).unwrap();
                multiply_parallel(&a, &packed, &mut out, threads).unwrap();
            });
            let streaming = skip("streaming", &mut || {
                let mut out = MatrixMut::row_major(c, m, n).unwrap();
                multiply_streaming(kernel, &a, &b, &mut out, threads).unwrap();
            });
            // `w` read in place, where that path applies.
            let in_place = if prefers_weight_rows(kernel, [m, k, n], a.strides()[1], b.strides()) {
                skip("in_place", &mut || {
                    let mut out = MatrixMut::row_major(c, m, n).unwrap();
                    multiply_weight_rows(kernel, &a, &b, &mut out, threads).unwrap();
                })
            } else {
                f64::NAN
            };
            let flop = 2.0 * (m * k * n) as f64;
            println!(
                "{name:>14} {m}x{k}x{n}: pack {:.3} ms, multiply {:.3} ms ({:.0} GFLOP/s), lazy together {:.3} ms ({:.0} GFLOP/s), streaming {:.3} ms ({:.0} GFLOP/s), w in place {:.3} ms ({:.0} GFLOP/s)",
                pack * 1e3,
                multiply * 1e3,
                flop / multiply / 1e9,
                together * 1e3,
                flop / together / 1e9,
                streaming * 1e3,
                flop / streaming / 1e9,
                in_place * 1e3,
                flop / in_place / 1e9
            );
        }
    }
}
