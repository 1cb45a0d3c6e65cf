//! Throughput of one compiled graph called from one thread and from two threads at once, on a
//! graph too small to be split across threads (so any gain comes from concurrent calls, each in
//! its own arena from the pool). Reports the time for a fixed batch of calls.
//! `cargo bench -p minductor-benches --bench concurrent_calls`

use criterion::{criterion_group, criterion_main, Criterion};
use minductor::{compile, trace, DType};
use minductor_tools::workloads::uniform;

const CALLS: usize = 2000;

fn concurrent(c: &mut Criterion) {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[16, 256]);
        let g = t.input("g", DType::F32, &[256]);
        vec![(x.layer_norm(&[256], Some(&g), None, 1e-5).gelu() * 2.0).softmax(-1)]
    })
    .expect("well-typed");
    let compiled = compile(&graph).expect("compiles");
    let inputs = vec![
        uniform(&[16, 256], -2.0, 2.0, 1),
        uniform(&[256], 0.5, 1.5, 2),
    ];
    let mut group = c.benchmark_group(format!("{CALLS}_calls_layer_norm_16x256"));
    group.sample_size(20);
    group.bench_function("1 thread", |b| {
        b.iter(|| {
            for _ in 0..CALLS {
                compiled.call(&inputs).expect("runs");
            }
        })
    });
    group.bench_function("2 threads", |b| {
        b.iter(|| {
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for _ in 0..CALLS / 2 {
                            compiled.call(&inputs).expect("runs");
                        }
                    });
                }
            })
        })
    });
    group.finish();
}

criterion_group!(benches, concurrent);
criterion_main!(benches);
