//! Cold and warm compile times with the on-disk compile cache, on workloads of the benchmark
//! suite: `uncached` is `compile` without a cache, `cold` a cache miss (compile, then save the
//! artifact), `warm` a hit (read, parse, verify, and Cranelift again: no machine code is stored).
//!
//! ```sh
//! cargo run --release --example compile_cache               # a fresh cache directory
//! cargo run --release --example compile_cache -- DIR        # DIR kept: run twice, the 2nd is warm
//! ```

use minductor::{compile_with_options, CompileCache, CompileOptions};
use minductor_tools::workloads::by_name;
use std::time::{Duration, Instant};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = match std::env::args().nth(1) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            let dir =
                std::env::temp_dir().join(format!("minductor-cache-demo-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            dir
        }
    };
    // So that `uncached` is: the cache below is the one named on the command line.
    std::env::remove_var("MINDUCTOR_CACHE_DIR");
    let cache = CompileCache::new(&dir);
    println!("cache: {}", dir.display());
    println!(
        "{:<26} {:>12} {:>12} {:>12} {:>10} {:>12}",
        "workload", "uncached ms", "first ms", "warm ms", "first was", "artifact KiB"
    );
    for name in [
        "softmax_4096x1024",
        "mlp_256x1024x4096",
        "attention_8x256x512",
        "resnet_block_8x64x56",
        "llama_block_4x256x512",
        "mlp_train_step_256",
    ] {
        let workload = by_name(name)?;
        let options = CompileOptions::default();
        let started = Instant::now();
        compile_with_options(&workload.graph, options)?;
        let uncached = started.elapsed();
        let started = Instant::now();
        let (_, first) = cache.compile(&workload.graph, options)?;
        let cold = started.elapsed();
        // The best of three hits.
        let mut warm = Duration::MAX;
        for _ in 0..3 {
            let started = Instant::now();
            let (compiled, outcome) = cache.compile(&workload.graph, options)?;
            assert!(compiled.from_cache(), "{name}: {outcome:?}");
            warm = warm.min(started.elapsed());
        }
        let key = CompileCache::key(&workload.graph, &options);
        let bytes = std::fs::metadata(cache.path(&key))?.len();
        println!(
            "{name:<26} {:>12.2} {:>12.2} {:>12.2} {:>10} {:>12.1}",
            ms(uncached),
            ms(cold),
            ms(warm),
            format!("{first:?}"),
            bytes as f64 / 1024.0
        );
    }
    Ok(())
}
