//! Transcendental functions in compiled kernels, one thread, 64K elements: `y = f(x)` for each
//! function that kernels compute in math blocks (16-lane routines compiled ahead of time, see
//! `codegen_cpu::math::block`). Run it twice to compare with the inline 4-lane form:
//! `cargo bench -p minductor-benches --bench math_blocks` and the same with
//! `MINDUCTOR_MATH_BLOCKS=0`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use minductor::{compile, set_num_threads, trace, DType};
use minductor_tools::workloads::uniform;

const N: usize = 1 << 16;

fn math(c: &mut Criterion) {
    set_num_threads(1).expect("one thread");
    let blocks = minductor::internals::kernels::math::block::block_isa();
    let mut group = c.benchmark_group(format!("math_64k_blocks_{blocks:?}"));
    group.throughput(Throughput::Elements(N as u64));
    group.sample_size(30);
    type Case = (&'static str, fn(minductor::Traced) -> minductor::Traced);
    let cases: [Case; 7] = [
        ("mul (no math: the floor)", |x| x * 2.0),
        ("exp", |x| x.exp()),
        ("log", |x| x.abs().log()),
        ("tanh", |x| x.tanh()),
        ("erf", |x| x.erf()),
        ("sigmoid", |x| x.sigmoid()),
        ("sin", |x| x.sin()),
    ];
    for (name, f) in cases {
        let graph = trace(|t| vec![f(t.input("x", DType::F32, &[N]))]).expect("well-typed");
        let compiled = compile(&graph).expect("compiles");
        let inputs = vec![uniform(&[N], -4.0, 4.0, 1)];
        group.bench_function(name, |b| b.iter(|| compiled.call(&inputs).expect("runs")));
    }
    group.finish();
}

criterion_group!(benches, math);
criterion_main!(benches);
