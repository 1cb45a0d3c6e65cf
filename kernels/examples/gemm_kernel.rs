//! GFLOP/s of the detected micro-kernel in the macro-kernel's loops on packed operands (no
//! packing): one thread, CPU time of the loops alone, median of 9, without and with the
//! prefetches a product asks the tiles for (`KERNEL=avx2` or `portable` for a narrower kernel
//! than the detected one):
//! `cargo run --release -p minductor-kernels --example gemm_kernel [-- kc micro_panels panels]`.

use minductor_kernels::gemm::{bench_macro_kernel, Kernel};

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::thread_cpu_seconds;

fn main() {
    // `KERNEL=avx2` (or `portable`) times a narrower kernel than the detected one.
    let kernel = match std::env::var("KERNEL").as_deref() {
        Ok("avx2") => Kernel::Avx2,
        Ok("portable") => Kernel::Portable,
        _ => Kernel::detect(),
    };
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let configs: Vec<[usize; 3]> = if args.len() == 3 {
        vec![[args[0], args[1], args[2]]]
    } else {
        let mp = 264 / kernel.mr();
        vec![
            [64, 1, 1],
            [128, 1, 1],
            [64, mp, 8],
            [96, mp, 8],
            [128, mp, 8],
            [192, mp, 8],
            [256, mp, 8],
            [384, mp, 8],
        ]
    };
    for [kc, micro_panels, panels] in configs {
        let flop = 2.0 * (kc * micro_panels * kernel.mr() * panels * kernel.nr()) as f64;
        let reps = ((2e8 / flop) as usize).max(1);
        // Without prefetches and with (the next panel's lines spread over the tiles, as in a
        // product), alternated so both see the same moments of a noisy machine.
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..9 {
            for (prefetch, times) in times.iter_mut().enumerate() {
                let run = bench_macro_kernel(
                    kernel,
                    kc,
                    micro_panels,
                    panels,
                    reps,
                    prefetch == 1,
                    thread_cpu_seconds,
                );
                times.push(run.unwrap());
            }
        }
        let [plain, prefetched] = times.map(|mut t| {
            t.sort_by(f64::total_cmp);
            flop * reps as f64 / t[4] / 1e9
        });
        println!(
            "{kernel:?} {}x{} kc {kc:4} micro-panels {micro_panels:3} panels {panels:3}: {plain:.1} GFLOP/s, prefetching {prefetched:.1}",
            kernel.mr(),
            kernel.nr()
        );
    }
}
