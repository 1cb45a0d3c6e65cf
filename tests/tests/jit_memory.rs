//! Issue 11, defect 8: JIT code was never freed (cranelift-jit keeps a module's code mapped
//! unless `free_memory` is called), so resident memory grew by about 12 KiB per compiled graph.
//! Alone in its own test binary: it reads the whole process's resident set size.

use minductor::{compile, trace, DType, Tensor};

/// Resident set size of this process in bytes (`/proc/self/statm`, second field, in pages).
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm's second field is the resident page count");
    pages * 4096
}

/// Compiles the small graph, calls it once, checks the result, drops everything.
fn cycle(graph: &minductor::Graph, x: &Tensor, want: &[f64]) {
    let compiled = compile(graph).unwrap();
    let out = compiled.call(std::slice::from_ref(x)).unwrap();
    let got = out[0].to_f64_vec();
    assert!(got
        .iter()
        .zip(want)
        .all(|(g, w)| (g - w).abs() <= 1e-5 * (1.0 + w.abs())));
}

#[test]
fn resident_memory_stays_flat_over_10000_compile_call_drop_cycles() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[4, 8]);
        vec![(x.exp() * 2.0).softmax(-1)]
    })
    .unwrap();
    let x = Tensor::from_vec(&[4, 8], (0..32).map(|i| i as f32 * 0.1).collect()).unwrap();
    let want = minductor::interpret(&graph, std::slice::from_ref(&x)).unwrap()[0].to_f64_vec();
    // Warm up: allocator arenas, thread pools, logging and lazily built tables reach their size.
    for _ in 0..500 {
        cycle(&graph, &x, &want);
    }
    let before = resident_bytes();
    for _ in 0..10_000 {
        cycle(&graph, &x, &want);
    }
    let after = resident_bytes();
    let growth = after.saturating_sub(before);
    eprintln!(
        "resident memory: {before} bytes after warm-up, {after} bytes after 10,000 cycles \
         (growth {growth} bytes, {:.1} bytes per cycle)",
        growth as f64 / 10_000.0
    );
    // Slack: 4 MiB for allocator fragmentation, about 420 bytes per cycle. The leak this guards
    // against was about 12 KiB per compiled graph, 120 MiB over these cycles.
    assert!(
        growth <= 4 << 20,
        "resident memory grew by {growth} bytes over 10,000 cycles"
    );
}
