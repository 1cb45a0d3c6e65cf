//! The machine probe's cache: a probe round-trips through its JSON file, is read back instead of
//! measured, is measured again when forced or when the file is corrupt or foreign. One test, so
//! that only it sets `MINDUCTOR_CACHE_DIR` in this test binary. A probe measured while another
//! process holds a CPU is not cached; the CPU accounting is checked on fixed `/proc` texts.

use minductor_tools::probe::{
    cache_dir, cache_file, load, load_or_measure_with, machine_id, measure, save, CpuTimes, Origin,
    ProbeError, ProbeSizes, PROBE_ATTEMPTS,
};

/// Tiny sizes, cached whatever else runs (the other tests of this binary and of the workspace
/// run beside it): the cache's behaviour is what the first test checks.
const TINY: ProbeSizes = ProbeSizes {
    copy_bytes: 1 << 16,
    gemm_size: 32,
    runs: 3,
    max_contention: f64::INFINITY,
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

    // Another process spinning on a CPU through the whole measurement: measured again, then
    // returned with its contention and not saved (the file keeps the last quiet probe).
    #[cfg(target_os = "linux")]
    {
        let kept = load(&path).unwrap();
        let mut spinner = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("sh runs");
        std::thread::sleep(std::time::Duration::from_millis(100));
        let strict = ProbeSizes {
            max_contention: 0.25,
            ..TINY
        };
        let result = load_or_measure_with(1, true, strict);
        spinner.kill().unwrap();
        spinner.wait().unwrap();
        let (probe, origin) = result.unwrap();
        let Origin::Contended(cpus) = origin else {
            panic!("a probe beside a spinning process was {origin:?}");
        };
        assert!(cpus > 0.25, "{cpus}");
        assert_eq!(probe.contention, Some(cpus));
        assert_eq!(load(&path).unwrap(), kept);
        assert_eq!(PROBE_ATTEMPTS, 3);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The accounting of other processes' CPU time, on `/proc/stat` and `/proc/self/stat` texts.
#[test]
fn contention_counts_other_processes_and_steal_not_this_one() {
    let stat = |user: u64, idle: u64, steal: u64| {
        format!(
            "cpu  {user} 0 10 {idle} 5 1 1 {steal} 0 0\n\
             cpu0 1 0 1 1 0 0 0 0 0 0\ncpu1 1 0 1 1 0 0 0 0 0 0\nintr 1 2 3\n"
        )
    };
    // A process name with spaces and parentheses: fields count from the last `)`.
    let own = |ticks: u64| {
        format!("42 (a (b) c) R 1 42 42 0 -1 4194304 100 0 0 0 {ticks} 3 0 0 20 0 1 0 1 2 3")
    };
    let before = CpuTimes::parse(&stat(100, 1000, 0), &own(50)).unwrap();
    assert_eq!(before.cpus, 2);
    assert_eq!(before.own, 53);
    assert_eq!(before.busy, 100 + 10 + 1 + 1);
    assert_eq!(before.total, 100 + 10 + 1000 + 5 + 1 + 1);
    // 200 ticks passed on 2 CPUs (100 each): 100 busy, all of them this process's: quiet.
    let quiet = CpuTimes::parse(&stat(200, 1100, 0), &own(150)).unwrap();
    assert_eq!(quiet.others_since(&before), Some(0.0));
    // 100 busy ticks of which 50 this process's, 50 stolen by the hypervisor, 50 idle: other
    // work held 100 of 200 ticks, one CPU of the two.
    let busy = CpuTimes::parse(&stat(200, 1050, 50), &own(100)).unwrap();
    assert_eq!(busy.others_since(&before), Some(1.0));
    // No tick passed: unknown. A text that is not /proc's: none.
    assert_eq!(before.others_since(&before), None);
    assert_eq!(CpuTimes::parse("intr 1", &own(1)), None);
    assert_eq!(CpuTimes::parse(&stat(1, 1, 1), "42 (x) R"), None);
}
