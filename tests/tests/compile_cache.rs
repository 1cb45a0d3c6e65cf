//! The on-disk compile cache: a second compile of the same graph and options loads the stored
//! artifact (in this process through `CompileCache`, in another through `MINDUCTOR_CACHE_DIR`),
//! other options or graphs miss, and a damaged entry is compiled again and replaced.

use minductor::{
    compile, CacheOutcome, CompileCache, CompileOptions, DType, Graph, Tensor, Tracer,
};
use minductor_tests::{compare_outputs, Tolerance};
use std::path::PathBuf;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minductor-cache-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn graph(width: usize) -> Graph {
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[8, width]);
    let w = t.input("w", DType::F32, &[width, width]);
    let y = x.matmul(&w).gelu().layer_norm(&[width], None, None, 1e-5);
    let loss = y.sum(&[], false);
    let mut outs = vec![y];
    outs.extend(loss.grad(&[&w]));
    t.finish(&outs).unwrap()
}

fn inputs(width: usize) -> Vec<Tensor> {
    let ramp = |n: usize, s: f32| (0..n).map(|i| ((i as f32) * 0.3 + s).cos()).collect();
    vec![
        Tensor::from_vec(&[8, width], ramp(8 * width, 0.0)).unwrap(),
        Tensor::from_vec(&[width, width], ramp(width * width, 1.0)).unwrap(),
    ]
}

#[test]
fn a_second_compile_hits_the_cache() {
    let dir = temp_dir("hit");
    let cache = CompileCache::new(&dir);
    let g = graph(32);
    let (cold, outcome) = cache.compile(&g, CompileOptions::default()).unwrap();
    assert_eq!(outcome, CacheOutcome::Miss);
    assert!(!cold.from_cache());
    let entry = cache.path(&CompileCache::key(&g, &CompileOptions::default()));
    assert!(entry.exists(), "{} was not written", entry.display());
    let (warm, outcome) = cache.compile(&g, CompileOptions::default()).unwrap();
    assert_eq!(outcome, CacheOutcome::Hit);
    assert!(warm.from_cache());
    println!(
        "cold {:.2} ms, warm {:.2} ms",
        cold.compile_time().as_secs_f64() * 1e3,
        warm.compile_time().as_secs_f64() * 1e3
    );
    let x = inputs(32);
    compare_outputs(
        &warm.call(&x).unwrap(),
        &cold.call(&x).unwrap(),
        Tolerance::EXACT,
        "warm vs cold",
    )
    .unwrap();

    // Other options and other graphs are other entries.
    let mut options = CompileOptions::default();
    options.partition.activation_memory_budget = 0.0;
    let (budget, outcome) = cache.compile(&g, options).unwrap();
    assert_eq!(outcome, CacheOutcome::Miss);
    assert_eq!(budget.options().partition.activation_memory_budget, 0.0);
    let (hit, outcome) = cache.compile(&g, options).unwrap();
    assert_eq!(outcome, CacheOutcome::Hit);
    assert_eq!(hit.options().partition.activation_memory_budget, 0.0);
    assert_eq!(
        cache
            .compile(&graph(16), CompileOptions::default())
            .unwrap()
            .1,
        CacheOutcome::Miss
    );

    // A damaged entry is compiled again and replaced; no temporary files are left behind.
    let bytes = std::fs::read(&entry).unwrap();
    std::fs::write(&entry, &bytes[..bytes.len() / 2]).unwrap();
    assert_eq!(
        cache.compile(&g, CompileOptions::default()).unwrap().1,
        CacheOutcome::Miss
    );
    assert_eq!(std::fs::read(&entry).unwrap(), bytes);
    assert_eq!(
        cache.compile(&g, CompileOptions::default()).unwrap().1,
        CacheOutcome::Hit
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

const CHILD: &str = "MINDUCTOR_CACHE_TEST_CHILD";

/// This process fills the cache; a second process with `MINDUCTOR_CACHE_DIR` set compiles the
/// same graph with plain `compile` and must load it (it reports through its exit status).
#[test]
fn a_second_process_loads_the_cached_compile() {
    let root = temp_dir("process");
    let cache = CompileCache::new(root.join("compiled"));
    assert_eq!(
        cache
            .compile(&graph(24), CompileOptions::default())
            .unwrap()
            .1,
        CacheOutcome::Miss
    );
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_compiles_with_the_cache",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("MINDUCTOR_CACHE_DIR", &root)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the child did not load the cached compile"
    );
}

#[test]
fn child_compiles_with_the_cache() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let compiled = compile(&graph(24)).unwrap();
    assert!(compiled.from_cache(), "compile did not hit the cache");
    println!(
        "child: loaded from the cache in {:.2} ms",
        compiled.compile_time().as_secs_f64() * 1e3
    );
    compiled.call(&inputs(24)).unwrap();
}
