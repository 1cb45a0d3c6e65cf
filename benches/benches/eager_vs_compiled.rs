//! Eager (reference interpreter) against compiled (full pipeline) on a few workloads.
//! `cargo bench -p minductor-benches`

use criterion::{criterion_group, criterion_main, Criterion};
use minductor::{compile_with, Backend, Graph, Tensor};
use minductor_benches::{layer_norm, pointwise_gelu, softmax};

fn bench_pair(c: &mut Criterion, name: &str, (graph, inputs): (Graph, Vec<Tensor>)) {
    let mut group = c.benchmark_group(name);
    group.sample_size(20);
    for backend in [Backend::Eager, Backend::Inductor] {
        let compiled = compile_with(&graph, backend).expect("compiles");
        group.bench_function(backend.name(), |b| {
            b.iter(|| compiled.call(&inputs).expect("runs"))
        });
    }
    group.finish();
}

fn workloads(c: &mut Criterion) {
    bench_pair(c, "pointwise_gelu_1m", pointwise_gelu(1 << 20));
    bench_pair(c, "softmax_4096x1024", softmax(4096, 1024));
    bench_pair(c, "layernorm_4096x1024", layer_norm(4096, 1024));
}

criterion_group!(benches, workloads);
criterion_main!(benches);
