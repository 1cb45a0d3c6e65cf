//! The thread setting compiled code runs with (`torch.set_num_threads`, in small).
//!
//! By default kernels run on rayon's global pool, one worker per core. [`set_num_threads`]
//! replaces that with a dedicated pool of the given size for every later call, process-wide.
//! Results do not depend on the setting: work is split by whole rows, and every reduction
//! combines its elements in an order fixed by the code, not by the split.

use crate::RuntimeError;
use std::sync::{Arc, RwLock};

static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);

/// Runs later kernels on `n` threads (`0` restores the default: all cores).
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
    *POOL.write().unwrap_or_else(|p| p.into_inner()) = pool;
    Ok(())
}

/// The number of threads kernels run on.
pub fn num_threads() -> usize {
    match &*POOL.read().unwrap_or_else(|p| p.into_inner()) {
        Some(pool) => pool.current_num_threads(),
        None => rayon::current_num_threads(),
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

/// Calls `f(0)`, …, `f(chunks - 1)` on the configured threads and returns when all are done.
pub fn for_each_chunk(chunks: usize, f: impl Fn(usize) + Sync + Send) {
    use rayon::prelude::*;
    let pool = POOL.read().unwrap_or_else(|p| p.into_inner()).clone();
    let run = || (0..chunks).into_par_iter().for_each(&f);
    match pool {
        Some(pool) => pool.install(run),
        None => run(),
    }
}
