//! The thread setting compiled code runs with (`torch.set_num_threads`, in small).
//!
//! By default kernels run on one worker per physical core, as PyTorch's default does
//! (hyperthreads share a core's FMA units, so a second thread per core adds little to compute
//! and splits every step finer): rayon's global pool when it has that many workers (no
//! simultaneous multithreading, or `RAYON_NUM_THREADS` set so), else a pool of that size.
//! [`set_num_threads`] replaces that with a dedicated pool of the given size for every later
//! call, process-wide. Results do not depend on the setting: work is split by whole rows, and
//! every reduction combines its elements in an order fixed by the code, not by the split.

use crate::RuntimeError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);

/// The size of [`POOL`]'s pool, 0 when it has none: what [`num_threads`] reads on every
/// kernel, without the lock (a read lock still writes its count, a cache line that concurrent
/// callers on other cores would pass back and forth).
static POOL_THREADS: AtomicUsize = AtomicUsize::new(0);

/// The default pool: `None` for rayon's global pool (when its size is the physical core count).
static DEFAULT_POOL: OnceLock<Option<Arc<rayon::ThreadPool>>> = OnceLock::new();

fn default_pool() -> Option<Arc<rayon::ThreadPool>> {
    default_pool_ref().cloned()
}

/// [`default_pool`], borrowed (no reference count is touched).
fn default_pool_ref() -> Option<&'static Arc<rayon::ThreadPool>> {
    DEFAULT_POOL
        .get_or_init(|| {
            let wanted = default_num_threads();
            if rayon::current_num_threads() == wanted || rayon::current_thread_index().is_some() {
                // Already the right size (or asked from inside some pool, whose size says
                // nothing about the global one): the global pool.
                return None;
            }
            rayon::ThreadPoolBuilder::new()
                .num_threads(wanted)
                .thread_name(|i| format!("minductor-{i}"))
                .build()
                .ok()
                .map(Arc::new)
        })
        .as_ref()
}

/// The default thread count: the physical cores this process may run on, one thread each.
///
/// Read at run time: the logical CPUs the process may use (`available_parallelism`, which
/// follows the affinity mask and cgroup quotas) divided by the hardware threads per core
/// (from Linux's `/sys/devices/system/cpu/cpu*/topology/core_id` and `physical_package_id`:
/// online logical CPUs over distinct (package, core) pairs). `RAYON_NUM_THREADS` set to a
/// positive count wins, as it does for rayon. Falls back to the logical count when the
/// topology cannot be read.
pub fn default_num_threads() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        if let Some(n) = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
        {
            return n;
        }
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_core = read_topology().map_or(1, |cpus| threads_per_core(&cpus));
        physical_threads(logical, per_core)
    })
}

/// One thread per core of `logical` usable CPUs with `per_core` hardware threads a core.
fn physical_threads(logical: usize, per_core: usize) -> usize {
    (logical / per_core.max(1)).max(1)
}

/// Hardware threads per core: logical CPUs over distinct `(package, core)` pairs, rounded
/// (1 for an empty list).
fn threads_per_core(cpus: &[(u32, u32)]) -> usize {
    let mut cores: Vec<(u32, u32)> = cpus.to_vec();
    cores.sort_unstable();
    cores.dedup();
    if cores.is_empty() {
        return 1;
    }
    ((cpus.len() + cores.len() / 2) / cores.len()).max(1)
}

/// `(physical_package_id, core_id)` of every logical CPU Linux lists, if it lists them.
fn read_topology() -> Option<Vec<(u32, u32)>> {
    let mut cpus = Vec::new();
    for entry in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_str().unwrap_or("");
        if !name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let read = |file: &str| -> Option<u32> {
            std::fs::read_to_string(entry.path().join("topology").join(file))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        // An offline CPU has no topology: it is not counted.
        if let (Some(package), Some(core)) = (read("physical_package_id"), read("core_id")) {
            cpus.push((package, core));
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Runs later kernels on `n` threads (`0` restores the default: one per physical core).
pub fn set_num_threads(n: usize) -> Result<(), RuntimeError> {
    let pool = if n == 0 {
        None
    } else {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("minductor-{i}"))
            .build()
            .map_err(|e| RuntimeError::Unsupported(format!("cannot start {n} threads: {e}")))?;
        Some(Arc::new(pool))
    };
    let mut slot = POOL.write().unwrap_or_else(|p| p.into_inner());
    POOL_THREADS.store(
        pool.as_ref().map_or(0, |p| p.current_num_threads()),
        Ordering::Relaxed,
    );
    *slot = pool;
    Ok(())
}

/// The number of threads kernels run on.
pub fn num_threads() -> usize {
    // Read on every step of every call, from any number of threads at once: no lock and no
    // reference count is touched (each would be a shared write).
    match POOL_THREADS.load(Ordering::Relaxed) {
        0 => match default_pool_ref() {
            Some(pool) => pool.current_num_threads(),
            None => rayon::current_num_threads(),
        },
        n => n,
    }
}

/// Runs `f` on the configured threads: rayon's parallel iterators inside it use them (the
/// compiler's code generation does, so `set_num_threads(1)` makes it serial too).
pub fn on_threads<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let pool = POOL.read().unwrap_or_else(|p| p.into_inner()).clone();
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// Runs `f` on a worker of the pool kernels run on (the caller waits), so that the
/// [`for_each_chunk`] calls inside it start their pieces from a worker: the pool's other
/// workers steal them while still spinning from the last piece, where a call from outside the
/// pool hands every piece over and wakes workers that have gone to sleep. Measured on the 2-core
/// development VM (`tools/examples/pool_latency.rs`), per parallel step of 50 µs pieces with
/// 100 µs of serial work between steps: 62 µs of overhead from outside, 22 µs from inside.
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let pool = POOL
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .or_else(default_pool);
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// Calls `f(0)`, …, `f(chunks - 1)` on the configured threads and returns when all are done.
pub fn for_each_chunk(chunks: usize, f: impl Fn(usize) + Sync + Send) {
    use rayon::prelude::*;
    if chunks <= 1 {
        // One piece runs on the calling thread: no pool is entered (a small step called from
        // several threads at once must not queue behind the pool's workers).
        if chunks == 1 {
            f(0);
        }
        return;
    }
    let pool = POOL
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .or_else(default_pool);
    let run = || (0..chunks).into_par_iter().for_each(&f);
    match pool {
        Some(pool) => pool.install(run),
        None => run(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyperthreads_count_once_per_core() {
        // A 16-thread Xeon of 8 cores with 2 threads each (CPUs 0-7 and 8-15 are siblings).
        let xeon: Vec<(u32, u32)> = (0..16).map(|cpu| (0, cpu % 8)).collect();
        assert_eq!(threads_per_core(&xeon), 2);
        assert_eq!(physical_threads(16, threads_per_core(&xeon)), 8);
        // Two sockets of 4 cores, no SMT: core ids repeat across packages.
        let two_sockets: Vec<(u32, u32)> = (0..8).map(|cpu| (cpu / 4, cpu % 4)).collect();
        assert_eq!(threads_per_core(&two_sockets), 1);
        assert_eq!(physical_threads(8, 1), 8);
        // An affinity mask of 3 CPUs on a 2-way SMT machine still gets a thread.
        assert_eq!(physical_threads(3, 2), 1);
        assert_eq!(physical_threads(1, 2), 1);
        assert_eq!(threads_per_core(&[]), 1);
    }

    #[test]
    fn set_num_threads_overrides_the_default() {
        assert!(default_num_threads() >= 1);
        set_num_threads(3).unwrap();
        assert_eq!(num_threads(), 3);
        set_num_threads(0).unwrap();
        assert_eq!(num_threads(), default_num_threads());
    }
}
