//! Eager (reference interpreter) against compiled (full pipeline) on the benchmark suite
//! (`minductor_tools::workloads`). `cargo bench -p minductor-benches [-- NAME]`
//!
//! Kept quick: 10 samples and short warmup and measurement times for every workload, and flat
//! sampling (the same iteration count in every sample) where an eager call takes over 10 ms, since
//! it takes about half a second per call on the largest workloads. For the full table (median
//! ms, speedup, compile time, peak bytes, achieved bandwidth) run `minductor bench`.

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use minductor::{compile_with, Backend};
use minductor_benches::{by_name, Workload, SUITE};
use std::time::{Duration, Instant};

fn bench_pair(c: &mut Criterion, workload: &Workload) {
    let mut group = c.benchmark_group(&workload.name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for backend in [Backend::Eager, Backend::Inductor] {
        let compiled = compile_with(&workload.graph, backend).expect("compiles");
        if backend == Backend::Eager {
            let start = Instant::now();
            compiled.call(&workload.inputs).expect("runs");
            if start.elapsed() > Duration::from_millis(10) {
                group.sampling_mode(SamplingMode::Flat);
            }
        }
        group.bench_function(backend.name(), |b| {
            b.iter(|| compiled.call(&workload.inputs).expect("runs"))
        });
    }
    group.finish();
}

fn suite(c: &mut Criterion) {
    for name in SUITE {
        let workload = by_name(name).expect("a suite name");
        bench_pair(c, &workload);
    }
}

criterion_group!(benches, suite);
criterion_main!(benches);
