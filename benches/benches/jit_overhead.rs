//! Guard check + dispatch on a `jit` cache hit: `jit(f).call` against `compile(graph).call` of
//! the same graph, on inputs small enough that the kernels take little time. The difference is
//! what the jit layer adds (lock, guards, cache walk, stats).
//! `cargo bench -p minductor-benches --bench jit_overhead`

use criterion::{criterion_group, criterion_main, Criterion};
use minductor::{compile, jit, trace, DType, Traced};
use minductor_tools::workloads::uniform;

fn values(shape: &[usize], seed: u64) -> minductor::Tensor {
    uniform(shape, -2.0, 2.0, seed)
}

fn gelu_affine(x: &[Traced]) -> Vec<Traced> {
    vec![(&x[0] * &x[1] + &x[2]).gelu()]
}

fn overhead(c: &mut Criterion) {
    for n in [16usize, 4096] {
        let inputs = vec![values(&[n], 1), values(&[n], 2), values(&[n], 3)];
        let graph = trace(|t| {
            let xs: Vec<Traced> = ["x", "w", "b"]
                .iter()
                .map(|name| t.input(name, DType::F32, &[n]))
                .collect();
            gelu_affine(&xs)
        })
        .expect("well-typed");
        let compiled = compile(&graph).expect("compiles");
        let jitted = jit(gelu_affine).input_names(&["x", "w", "b"]);
        jitted.call(&inputs).expect("first call compiles");

        let mut group = c.benchmark_group(format!("jit_hit_gelu_affine_{n}"));
        group.sample_size(50);
        group.bench_function("compiled.call", |b| {
            b.iter(|| compiled.call(&inputs).expect("runs"))
        });
        group.bench_function("jit.call (cache hit)", |b| {
            b.iter(|| jitted.call(&inputs).expect("runs"))
        });
        group.finish();
        assert_eq!(
            jitted.stats().compiles,
            1,
            "every timed call was a cache hit"
        );
    }

    // Worst case for the guards: 8 cache entries (static shapes), the call matching the oldest,
    // so all 8 guard sets are checked.
    let jitted = jit(gelu_affine)
        .dynamic(Some(false))
        .input_names(&["x", "w", "b"]);
    for n in 16usize..24 {
        jitted
            .call(&[values(&[n], 1), values(&[n], 2), values(&[n], 3)])
            .expect("compiles");
    }
    let oldest = vec![values(&[16], 1), values(&[16], 2), values(&[16], 3)];
    let mut group = c.benchmark_group("jit_hit_8_entries_gelu_affine_16");
    group.sample_size(50);
    group.bench_function("jit.call (hit on the 8th guard set)", |b| {
        b.iter(|| jitted.call(&oldest).expect("runs"))
    });
    group.finish();
    assert_eq!(
        jitted.stats().compiles,
        8,
        "every timed call was a cache hit"
    );
}

criterion_group!(benches, overhead);
criterion_main!(benches);
