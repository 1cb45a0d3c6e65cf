//! The machine probe: the two figures achieved speeds are judged against, measured once per
//! machine and thread count and cached.
//!
//! - Copy bandwidth: a large `f32` buffer copied into another (both far larger than any cache),
//!   split into one contiguous chunk per thread of a rayon pool of the given size; the median of
//!   several runs, in GB/s counting the bytes read plus the bytes written (as the workloads count
//!   theirs). The destination is touched before timing, so page faults are not measured.
//! - Vector FMA peak, for each vector width the CPU has FMAs of (128-bit and 256-bit with FMA3,
//!   512-bit with AVX-512F, detected at run time): a tight loop of 12 independent chains of FMAs
//!   written with `std::arch` (more than latency × FMA pipes, so the pipes never wait), the best
//!   of several runs (a peak is what the core can do; a run slowed by another process on a shared
//!   machine says nothing about it, and a median of such runs made GEMMs read "137% of peak"),
//!   on one thread and on every thread of the pool at once. The best all-thread figure over the
//!   widths is the compute peak compute-bound workloads are judged against.
//! - GEMM speed: our GEMM (`minductor::internals::kernels::gemm::sgemm`, the one compiled programs call)
//!   on square `n × n` matrices, median of several runs, as 2·n³ / time. `gemm_gflops` is one
//!   GEMM on one thread; `gemm_gflops_all_threads` runs one independent GEMM on every thread of
//!   the pool at once and reports the aggregate.
//!
//! The result is cached as JSON in `$MINDUCTOR_CACHE_DIR`, else `$XDG_CACHE_HOME/minductor`, else
//! `~/.cache/minductor` (never in the repository), one file per machine (CPU model, logical CPU
//! count, host name) and thread count. `force` re-measures and overwrites the file; a file that
//! cannot be parsed or was written for another machine is measured again, never trusted.
//!
//! A probe measured while other processes were running is not cached. The probe counts the CPU
//! time the whole machine spent busy during the measurement (`/proc/stat`, steal time
//! included: a hypervisor running another guest on our CPU) less its own process's
//! (`/proc/self/stat`), as a mean number of CPUs ([`MachineProbe::contention`]). Above
//! [`ProbeSizes::max_contention`] it measures again (three attempts in all), and if every
//! attempt was contended it returns the least contended one without saving it
//! ([`Origin::Contended`]). Why: a cached probe is read by every later bench and report on the
//! machine, and one measured while a finished PyTorch run's worker processes still held a CPU
//! read 226 GFLOP/s as the 2-thread FMA peak of a machine whose two cores reach 449 (Zen 5,
//! 2026-12-01), so every GEMM afterwards showed "128% of peak". The figures are bests and
//! medians of several runs, which a busy spell of milliseconds does not move, but another
//! process holding a CPU for the whole probe does.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// What this machine can do, for one thread count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineProbe {
    /// CPU model, logical CPU count and host name: the identity the cache is keyed by.
    pub machine: String,
    /// Threads of the rayon pool the figures were measured with.
    pub threads: usize,
    /// Bytes of the copied buffer (the copy reads and writes this many bytes each).
    pub copy_bytes: usize,
    /// Median copy bandwidth, GB/s (1e9 bytes), read + write bytes counted.
    pub copy_gb_per_s: f64,
    /// `n` of the `n × n × n` sgemm.
    pub gemm_size: usize,
    /// Median GFLOP/s of one sgemm on one thread.
    pub gemm_gflops: f64,
    /// Median aggregate GFLOP/s of one sgemm per thread, all threads at once.
    pub gemm_gflops_all_threads: f64,
    /// The vector FMA peak of every width this CPU has FMAs of, narrowest first.
    pub fma_peaks: Vec<FmaPeak>,
    /// When it was measured, seconds since the Unix epoch.
    pub measured_at_unix_s: u64,
    /// The mean number of CPUs other processes (and the hypervisor's other guests, as steal
    /// time) kept busy while it was measured; `None` where the system does not say (not
    /// Linux), or in a file written before the probe counted it.
    #[serde(default)]
    pub contention: Option<f64>,
}

/// The FMA throughput of one vector width.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FmaPeak {
    /// Vector width: 128, 256 or 512.
    pub bits: u32,
    /// Best GFLOP/s of the runs (an FMA counts 2 per lane) on one thread.
    pub gflops: f64,
    /// Best aggregate GFLOP/s of the runs on every thread of the pool at once.
    pub gflops_all_threads: f64,
}

impl MachineProbe {
    /// The ceiling for compute-bound work: the best vector FMA peak on all threads over the
    /// widths (512-bit FMAs run at half rate on some cores, as 256-bit ones on Zen 4; the GEMM
    /// speed if the CPU has no FMA).
    pub fn compute_peak_gflops(&self) -> f64 {
        self.fma_peaks
            .iter()
            .map(|p| p.gflops_all_threads)
            .fold(None, |best: Option<f64>, g| {
                Some(best.map_or(g, |b| b.max(g)))
            })
            .unwrap_or(self.gemm_gflops_all_threads)
    }
}

/// How big and how often the probe measures.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSizes {
    pub copy_bytes: usize,
    pub gemm_size: usize,
    /// Timed runs of each measurement (after one untimed warmup run); the median is kept.
    pub runs: usize,
    /// The most [`MachineProbe::contention`] (CPUs busy with other work) a probe may be
    /// measured under and still be cached.
    pub max_contention: f64,
}

impl Default for ProbeSizes {
    /// 256 MiB copies and 1024³ GEMMs, 7 runs each; cached when other work kept at most a
    /// quarter of a CPU busy on average.
    fn default() -> Self {
        ProbeSizes {
            copy_bytes: 256 << 20,
            gemm_size: 1024,
            runs: 7,
            max_contention: 0.25,
        }
    }
}

/// Attempts [`load_or_measure_with`] makes at a quiet probe before it gives up on caching one.
pub const PROBE_ATTEMPTS: usize = 3;

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("the probe needs at least 1 thread, found {0}")]
    NoThreads(usize),
    #[error("could not build a rayon pool of {threads} threads: {message}")]
    Pool { threads: usize, message: String },
    #[error("probe cache {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("probe cache {}: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// Where a probe result came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Origin {
    /// Read from this cache file.
    Cached(PathBuf),
    /// Measured now, and saved to this file (`None` when no cache directory is known).
    Measured(Option<PathBuf>),
    /// Measured now while other work kept this many CPUs busy (the least of
    /// [`PROBE_ATTEMPTS`] attempts, each above [`ProbeSizes::max_contention`]), so not saved:
    /// the figures may be low.
    Contended(f64),
}

/// The probe for `threads` threads: from the cache when it holds one for this machine (unless
/// `force`), else measured with the default sizes and saved (unless other work contended for
/// the CPUs: see the module docs).
pub fn load_or_measure(threads: usize, force: bool) -> Result<(MachineProbe, Origin), ProbeError> {
    load_or_measure_with(threads, force, ProbeSizes::default())
}

/// [`load_or_measure`] with the given measurement sizes.
pub fn load_or_measure_with(
    threads: usize,
    force: bool,
    sizes: ProbeSizes,
) -> Result<(MachineProbe, Origin), ProbeError> {
    let machine = machine_id();
    let file = cache_dir().map(|dir| cache_file(&dir, &machine, threads));
    if let (Some(path), false) = (&file, force) {
        // An unreadable, unparsable or foreign file is measured again and overwritten.
        if let Ok(Some(probe)) = load(path) {
            if probe.machine == machine && probe.threads == threads {
                return Ok((probe, Origin::Cached(path.clone())));
            }
        }
    }
    let mut best: Option<MachineProbe> = None;
    for _ in 0..PROBE_ATTEMPTS {
        let probe = measure(threads, sizes)?;
        let contention = probe.contention.unwrap_or(0.0);
        if contention <= sizes.max_contention {
            if let Some(path) = &file {
                save(path, &probe)?;
            }
            return Ok((probe, Origin::Measured(file)));
        }
        if best
            .as_ref()
            .is_none_or(|b| contention < b.contention.unwrap_or(0.0))
        {
            best = Some(probe);
        }
    }
    let probe = best.expect("at least one attempt");
    let contention = probe.contention.unwrap_or(0.0);
    Ok((probe, Origin::Contended(contention)))
}

/// The cache directory: `$MINDUCTOR_CACHE_DIR`, else `$XDG_CACHE_HOME/minductor`, else
/// `$HOME/.cache/minductor`; `None` if none of these variables is set.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("MINDUCTOR_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("minductor"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".cache").join("minductor"))
}

/// The cache file of `machine` at `threads` threads inside `dir`.
pub fn cache_file(dir: &Path, machine: &str, threads: usize) -> PathBuf {
    // FNV-1a: a hash that is the same in every build, unlike std's.
    let hash = machine.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    dir.join(format!("probe-{hash:016x}-t{threads}.json"))
}

/// Reads a cached probe; `Ok(None)` if the file does not exist.
pub fn load(path: &Path) -> Result<Option<MachineProbe>, ProbeError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ProbeError::Io {
                path: path.into(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| ProbeError::Json {
            path: path.into(),
            source,
        })
}

/// Writes `probe` to `path` (creating its directory) as pretty JSON.
pub fn save(path: &Path, probe: &MachineProbe) -> Result<(), ProbeError> {
    let io = |source| ProbeError::Io {
        path: path.into(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let text = serde_json::to_string_pretty(probe).map_err(|source| ProbeError::Json {
        path: path.into(),
        source,
    })?;
    std::fs::write(path, text + "\n").map_err(io)
}

/// This machine's identity: CPU model, logical CPU count and host name.
pub fn machine_id() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!("{cpu}; {cpus} logical CPUs; host {host}")
}

/// Measures both figures now on a rayon pool of `threads` threads.
pub fn measure(threads: usize, sizes: ProbeSizes) -> Result<MachineProbe, ProbeError> {
    if threads == 0 {
        return Err(ProbeError::NoThreads(threads));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| ProbeError::Pool {
            threads,
            message: e.to_string(),
        })?;
    let runs = sizes.runs.max(1);
    let before = CpuTimes::now();
    let copy_seconds = pool.install(|| copy_seconds(sizes.copy_bytes, threads, runs));
    let n = sizes.gemm_size.max(1);
    let flop = 2.0 * (n as f64).powi(3);
    let gemm_seconds = gemm_seconds(n, runs);
    let all_threads_seconds = gemm_all_threads_seconds(&pool, n, runs);
    let copy_bytes = sizes.copy_bytes / 4 * 4;
    let fma_peaks = fma::WIDTHS
        .iter()
        .filter(|w| w.is_supported())
        .map(|w| {
            let flop = w.flops(fma::ITERATIONS);
            let one = best_seconds(3 * runs, || w.run(fma::ITERATIONS));
            let all = best_seconds(3 * runs, || {
                pool.broadcast(|_| w.run(fma::ITERATIONS));
            });
            FmaPeak {
                bits: w.bits,
                gflops: flop / one / 1e9,
                gflops_all_threads: threads as f64 * flop / all / 1e9,
            }
        })
        .collect();
    let contention = before
        .zip(CpuTimes::now())
        .and_then(|(before, after)| after.others_since(&before));
    Ok(MachineProbe {
        machine: machine_id(),
        threads,
        copy_bytes,
        copy_gb_per_s: 2.0 * copy_bytes as f64 / copy_seconds / 1e9,
        gemm_size: n,
        gemm_gflops: flop / gemm_seconds / 1e9,
        gemm_gflops_all_threads: threads as f64 * flop / all_threads_seconds / 1e9,
        fma_peaks,
        measured_at_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        contention,
    })
}

/// The machine's and this process's CPU time so far, in clock ticks (Linux's `/proc`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuTimes {
    /// Ticks all CPUs spent busy: user, nice, system, irq, softirq and steal.
    pub busy: u64,
    /// Ticks all CPUs spent in all, idle included.
    pub total: u64,
    /// Logical CPUs `/proc/stat` lists.
    pub cpus: usize,
    /// Ticks this process's threads ran, user and system.
    pub own: u64,
}

impl CpuTimes {
    /// Now, or `None` where `/proc` does not tell (not Linux).
    pub fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        CpuTimes::parse(&stat, &own)
    }

    /// From the texts of `/proc/stat` and `/proc/self/stat`.
    pub fn parse(stat: &str, own_stat: &str) -> Option<CpuTimes> {
        let mut lines = stat.lines();
        let first = lines.next()?;
        let fields: Vec<u64> = first
            .strip_prefix("cpu ")?
            .split_whitespace()
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
        // already counted in user, so the first eight fields are the total.
        let field = |i: usize| fields.get(i).copied().unwrap_or(0);
        let busy = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
        let total = (0..8).map(field).sum();
        let cpus = lines
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count();
        // `pid (comm) state ...`: comm may hold spaces and parentheses, so fields are counted
        // after the last `)`; utime and stime are fields 14 and 15, the 12th and 13th after it.
        let after = &own_stat[own_stat.rfind(')')? + 1..];
        let mut rest = after.split_whitespace().skip(11);
        let utime: u64 = rest.next()?.parse().ok()?;
        let stime: u64 = rest.next()?.parse().ok()?;
        Some(CpuTimes {
            busy,
            total,
            cpus: cpus.max(1),
            own: utime + stime,
        })
    }

    /// The mean number of CPUs kept busy by anything but this process between `before` and
    /// `self`; `None` when no tick passed.
    pub fn others_since(&self, before: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(before.total).filter(|&t| t > 0)?;
        let busy = self.busy.saturating_sub(before.busy);
        let own = self.own.saturating_sub(before.own);
        Some(busy.saturating_sub(own) as f64 / total as f64 * self.cpus as f64)
    }
}

/// Median seconds of `runs` timed runs of `f`, after one untimed run.
fn median_seconds(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2].max(1e-9)
}

/// Fewest seconds of `runs` timed runs of `f`, after one untimed run: a peak.
fn best_seconds(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
        .max(1e-9)
}

/// Median seconds to copy `bytes` in one chunk per thread (runs on the current rayon pool).
fn copy_seconds(bytes: usize, threads: usize, runs: usize) -> f64 {
    let n = (bytes / 4).max(1);
    let source: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut destination = vec![0f32; n];
    let chunk = n.div_ceil(threads);
    median_seconds(runs, || {
        destination
            .par_chunks_mut(chunk)
            .zip(source.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
    })
}

/// One `n × n × n` GEMM on the calling thread, row-major, `c = a·b`.
fn sgemm(n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    use minductor::internals::kernels::gemm::{self, MatrixMut, MatrixRef};
    let a = MatrixRef::row_major(a, n, n).expect("a holds n·n values");
    let b = MatrixRef::row_major(b, n, n).expect("b holds n·n values");
    let mut c = MatrixMut::row_major(c, n, n).expect("c holds n·n values");
    gemm::sgemm(&a, &b, &mut c, 1).expect("shapes agree");
}

fn gemm_operands(n: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..n * n).map(|i| (i % 17) as f32 * 0.01).collect();
    let b = (0..n * n).map(|i| (i % 13) as f32 * 0.01).collect();
    (a, b)
}

/// Median seconds of one sgemm on the calling thread.
fn gemm_seconds(n: usize, runs: usize) -> f64 {
    let (a, b) = gemm_operands(n);
    let mut c = vec![0f32; n * n];
    median_seconds(runs, || sgemm(n, &a, &b, &mut c))
}

/// Median seconds of one sgemm on every thread of `pool` at once, each into its own output.
fn gemm_all_threads_seconds(pool: &rayon::ThreadPool, n: usize, runs: usize) -> f64 {
    let (a, b) = gemm_operands(n);
    let outputs: Vec<Mutex<Vec<f32>>> = (0..pool.current_num_threads())
        .map(|_| Mutex::new(vec![0f32; n * n]))
        .collect();
    median_seconds(runs, || {
        pool.broadcast(|context| {
            let mut c = outputs[context.index()]
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            sgemm(n, &a, &b, &mut c);
        });
    })
}

/// The FMA loops, one per vector width.
mod fma {
    /// Loop trips per measurement: 12 chains × 16 lanes × 2 flops × 2²⁰ trips ≈ 0.4 GFLOP at
    /// 512 bits, a few milliseconds.
    pub const ITERATIONS: usize = 1 << 20;
    /// Independent accumulator chains: more than FMA latency (4 cycles) × FMA pipes (2).
    const CHAINS: usize = 12;

    pub struct Width {
        pub bits: u32,
    }

    pub const WIDTHS: [Width; 3] = [
        Width { bits: 128 },
        Width { bits: 256 },
        Width { bits: 512 },
    ];

    impl Width {
        pub fn is_supported(&self) -> bool {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                match self.bits {
                    128 => has!("fma"),
                    256 => has!("avx") && has!("fma"),
                    512 => has!("avx512f"),
                    _ => false,
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            false
        }

        /// Flops of `iterations` trips: every chain does one FMA (2 flops per lane) per trip.
        pub fn flops(&self, iterations: usize) -> f64 {
            (iterations * CHAINS * (self.bits as usize / 32) * 2) as f64
        }

        /// Runs the loop; the result goes through `black_box` so it is not optimized away.
        pub fn run(&self, iterations: usize) {
            assert!(
                self.is_supported(),
                "{}-bit FMAs are not supported",
                self.bits
            );
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the loop's target features (asserted above).
            let sum = unsafe {
                match self.bits {
                    128 => x86::fma_128(iterations),
                    256 => x86::fma_256(iterations),
                    _ => x86::fma_512(iterations),
                }
            };
            #[cfg(not(target_arch = "x86_64"))]
            let sum = 0.0f32;
            std::hint::black_box(sum);
        }
    }

    /// `x ← x · 0.999999 + 1e-7` on every chain converges to 0.1: no overflow, no subnormals.
    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::CHAINS;
        use std::arch::x86_64::*;

        /// # Safety
        /// The CPU supports FMA3.
        #[target_feature(enable = "fma")]
        pub unsafe fn fma_128(iterations: usize) -> f32 {
            let (m, a) = (_mm_set1_ps(0.999_999), _mm_set1_ps(1e-7));
            let mut chains = [_mm_set1_ps(1.0); CHAINS];
            for _ in 0..iterations {
                for x in chains.iter_mut() {
                    *x = _mm_fmadd_ps(*x, m, a);
                }
            }
            let mut out = [0f32; 4];
            // SAFETY: `out` holds 4 values.
            unsafe {
                _mm_storeu_ps(
                    out.as_mut_ptr(),
                    chains
                        .iter()
                        .fold(_mm_setzero_ps(), |s, &x| _mm_add_ps(s, x)),
                )
            };
            out.iter().sum()
        }

        /// # Safety
        /// The CPU supports AVX and FMA3.
        #[target_feature(enable = "avx,fma")]
        pub unsafe fn fma_256(iterations: usize) -> f32 {
            let (m, a) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut chains = [_mm256_set1_ps(1.0); CHAINS];
            for _ in 0..iterations {
                for x in chains.iter_mut() {
                    *x = _mm256_fmadd_ps(*x, m, a);
                }
            }
            let mut out = [0f32; 8];
            // SAFETY: `out` holds 8 values.
            unsafe {
                _mm256_storeu_ps(
                    out.as_mut_ptr(),
                    chains
                        .iter()
                        .fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x)),
                )
            };
            out.iter().sum()
        }

        /// # Safety
        /// The CPU supports AVX-512F.
        #[target_feature(enable = "avx512f")]
        pub unsafe fn fma_512(iterations: usize) -> f32 {
            let (m, a) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            let mut chains = [_mm512_set1_ps(1.0); CHAINS];
            for _ in 0..iterations {
                for x in chains.iter_mut() {
                    *x = _mm512_fmadd_ps(*x, m, a);
                }
            }
            _mm512_reduce_add_ps(
                chains
                    .iter()
                    .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x)),
            )
        }
    }
}
