//! The machine probe's cache: a probe round-trips through its JSON file, is read back instead of
//! measured, is measured again when forced or when the file is corrupt or foreign. One test, so
//! that only it sets `MINDUCTOR_CACHE_DIR` in this test binary.

use minductor_tools::probe::{
    cache_dir, cache_file, load, load_or_measure_with, machine_id, measure, save, Origin,
    ProbeError, ProbeSizes,
};

const TINY: ProbeSizes = ProbeSizes {
    copy_bytes: 1 << 16,
    gemm_size: 32,
    runs: 3,
};

#[test]
fn probe_cache_round_trips_and_is_reused_until_forced() {
    let dir = std::env::temp_dir().join(format!("minductor-probe-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("MINDUCTOR_CACHE_DIR", &dir);
    assert_eq!(cache_dir(), Some(dir.clone()));
    let path = cache_file(&dir, &machine_id(), 2);

    // Nothing cached: measured and saved.
    let (first, origin) = load_or_measure_with(2, false, TINY).unwrap();
    assert_eq!(origin, Origin::Measured(Some(path.clone())));
    assert_eq!(
        (first.threads, first.gemm_size, first.copy_bytes),
        (2, 32, 1 << 16)
    );
    assert!(first.copy_gb_per_s > 0.0 && first.copy_gb_per_s.is_finite());
    assert!(first.gemm_gflops > 0.0 && first.gemm_gflops_all_threads > 0.0);
    // Every width with FMAs is measured, narrowest first; the widest is the compute peak.
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let widths: Vec<u32> = first.fma_peaks.iter().map(|p| p.bits).collect();
        let expected: Vec<u32> = [
            (128, has!("fma")),
            (256, has!("avx") && has!("fma")),
            (512, has!("avx512f")),
        ]
        .into_iter()
        .filter_map(|(bits, present)| present.then_some(bits))
        .collect();
        assert_eq!(widths, expected);
    }
    for p in &first.fma_peaks {
        assert!(
            p.gflops > 0.0 && p.gflops.is_finite() && p.gflops_all_threads > 0.0,
            "{p:?}"
        );
    }
    // The compute peak is the best width's all-thread figure.
    if let Some(best) = first
        .fma_peaks
        .iter()
        .map(|p| p.gflops_all_threads)
        .max_by(f64::total_cmp)
    {
        assert_eq!(first.compute_peak_gflops(), best);
    }
    assert_eq!(load(&path).unwrap(), Some(first.clone()));

    // Cached: read back unchanged, even with other sizes asked for.
    let (second, origin) = load_or_measure_with(2, false, ProbeSizes::default()).unwrap();
    assert_eq!(origin, Origin::Cached(path.clone()));
    assert_eq!(second, first);

    // A hand-made probe round-trips exactly through save and load.
    let mut edited = first.clone();
    edited.copy_gb_per_s = 12.345678901234567;
    edited.gemm_gflops = 98.7;
    save(&path, &edited).unwrap();
    let (third, origin) = load_or_measure_with(2, false, TINY).unwrap();
    assert_eq!(origin, Origin::Cached(path.clone()));
    assert_eq!(third, edited);

    // Forced: measured again and the file overwritten.
    let (forced, origin) = load_or_measure_with(2, true, TINY).unwrap();
    assert_eq!(origin, Origin::Measured(Some(path.clone())));
    assert_eq!(load(&path).unwrap(), Some(forced));

    // Another thread count is another file.
    let (_, origin) = load_or_measure_with(1, false, TINY).unwrap();
    assert_eq!(
        origin,
        Origin::Measured(Some(cache_file(&dir, &machine_id(), 1)))
    );

    // A probe of another machine, or a corrupt file, is measured again, never trusted.
    let mut foreign = edited.clone();
    foreign.machine = "some other machine".into();
    save(&path, &foreign).unwrap();
    let (probe, origin) = load_or_measure_with(2, false, TINY).unwrap();
    assert!(matches!(origin, Origin::Measured(_)));
    assert_eq!(probe.machine, machine_id());
    std::fs::write(&path, "{ not json").unwrap();
    assert!(matches!(load(&path), Err(ProbeError::Json { .. })));
    let (_, origin) = load_or_measure_with(2, false, TINY).unwrap();
    assert!(matches!(origin, Origin::Measured(_)));
    assert!(load(&path).unwrap().is_some());

    assert!(matches!(measure(0, TINY), Err(ProbeError::NoThreads(0))));
    std::fs::remove_dir_all(&dir).unwrap();
}
