//! What loading a frozen artifact holds at once (its own test binary: it installs the counting
//! allocator). `minductor::load` frees the file's bytes before the constants become tensors and
//! each constant's bytes as soon as its tensor is made, so the weights are held about twice at
//! the peak (the file's bytes and the decoded constants), not three times.

use minductor::{compile_frozen, Tensor};
use minductor_tools::bench::HeapMeter;
use minductor_tools::heap::{AllocatorMeter, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn loading_a_frozen_artifact_holds_its_weights_about_twice() {
    // A 32 MiB weight that no GEMM reads (a GEMM's weight is packed again at load, on purpose).
    let n = 8 << 20;
    let (graph, inputs) = minductor_tests::build_graph(
        &[&[n], &[n]],
        |shape, seed| minductor_tests::sine_values(shape, seed, 1.0),
        |i| vec![i[0].mul(&i[1]).add(1.0)],
    );
    let weight_name = graph.input_name(1).to_string();
    let compiled = compile_frozen(&graph, &[(&weight_name, inputs[1].clone())]).unwrap();
    let dir =
        std::env::temp_dir().join(format!("minductor-artifact-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("frozen.mind");
    compiled.save(&path).unwrap();
    let expected = compiled.call(&inputs[..1]).unwrap();
    drop(compiled);

    let weight_bytes = n * std::mem::size_of::<f32>();
    let before = AllocatorMeter.reset_peak();
    let loaded = minductor::load(&path).unwrap();
    let held = AllocatorMeter.peak() - before;
    std::fs::remove_dir_all(&dir).ok();
    eprintln!("loading held {held} bytes at its peak for a {weight_bytes}-byte weight");
    assert!(
        held <= weight_bytes * 9 / 4,
        "loading held {held} bytes at its peak for a {weight_bytes}-byte weight"
    );
    let found = loaded.call(&inputs[..1]).unwrap();
    let bits = |t: &[Tensor]| t[0].to_vec::<f32>().unwrap();
    assert_eq!(
        bits(&found),
        bits(&expected),
        "the loaded artifact computes the same"
    );
}
