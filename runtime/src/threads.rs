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
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

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
/// [`in_team`] goes further, for a whole program call.
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match current_pool() {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// The pool kernels run on: the configured one, the default one, or `None` for rayon's global
/// pool.
fn current_pool() -> Option<Arc<rayon::ThreadPool>> {
    POOL.read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .or_else(default_pool)
}

/// Runs `f` with the pool's workers held in a *team* for its duration, OpenMP-style (led by
/// the calling thread when it is not one of the pool's workers, [`led_from_here`]; else by that
/// worker): every [`for_each_chunk`] that `f` itself calls (one per parallel step of a program)
/// publishes its pieces to the team, whose members are spinning for them,
/// and each runs its own contiguous share of them, then steals what is left of the others'
/// (see `Team`); between steps (while `f` runs a serial step)
/// the members keep spinning instead of going to sleep. A program call is one team: it costs
/// one wake-up of the workers, not one per step. (Inductor's C++ gets this from OpenMP, whose
/// workers spin between parallel regions, `GOMP_SPINCOUNT` / `KMP_BLOCKTIME`; rayon's idle
/// workers fall asleep within microseconds and each step then waits for the kernel to wake
/// them, which on the development VM took up to hundreds of microseconds a step.)
///
/// Members spin with `spin_loop` first, then yield their core (`rayon::yield_now`, so that
/// other work in the pool still runs, then the OS's), so a long serial step costs the other
/// cores' time but never blocks anything. Which thread runs a piece changes no result: pieces
/// are what the step's own split made them. Nested calls (a piece that itself splits, a team
/// asked for inside a team) run as before, on rayon.
pub fn in_team<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_none() && !leader_on_worker() {
        return led_from_here(f);
    }
    let body = || {
        let members = rayon::current_num_threads().saturating_sub(1);
        if members == 0 || BUSY.get() {
            return f();
        }
        let team = Team::new(members + 1);
        rayon::scope(|s| {
            for slot in 1..=members {
                let team = &team;
                s.spawn(move |_| team.member(slot));
            }
            // Dropped when `f` returns or unwinds: stops the members before the scope waits
            // for them.
            let _leader = Leader::enter(&team);
            f()
        })
    };
    match current_pool() {
        Some(pool) => pool.install(body),
        None => rayon::scope(|_| body()),
    }
}

/// [`in_team`] called from outside the pool: the calling thread leads, as an OpenMP program's
/// initial thread is its team's thread 0, and all but one of the pool's workers join as
/// members (so as many threads work as the pool has). Handing `f` to a worker instead
/// (`ThreadPool::install`) woke that worker and then put the caller to sleep until `f` was done,
/// and woke it again: two hand-overs per call on top of the members' own start. Measured on the
/// 2-core development VM (Xeon family 6 model 167), the median time of 51 calls beyond their
/// steps' (`tools/examples/call_overhead.rs`, three alternated runs): 1-4 µs led from here
/// against 35-59 µs handed to a worker; layernorm_4096x1024 at 2 threads 593-596 against
/// 639-655 µs a call, pointwise_gelu_1m 285-287 against 338-348.
///
/// The members hold the team by reference count, so the call returns as soon as `f` has (a
/// member whose job starts after that finds the team stopped and returns).
/// `MINDUCTOR_TEAM_LEADER=worker` hands `f` to a worker as before, for comparisons.
fn led_from_here<R>(f: impl FnOnce() -> R) -> R {
    let pool = current_pool();
    let workers = pool
        .as_ref()
        .map_or_else(rayon::current_num_threads, |p| p.current_num_threads());
    let members = workers.saturating_sub(1);
    if members == 0 || BUSY.get() {
        return f();
    }
    let team = Arc::new(Team::new(members + 1));
    // One job for all the members: it recruits the rest from inside the pool (see `recruit`),
    // so the caller pays for one hand-over, not one per member.
    let recruits = Arc::clone(&team);
    match &pool {
        Some(pool) => pool.spawn(move || recruit(recruits, 1..members + 1)),
        None => rayon::spawn(move || recruit(recruits, 1..members + 1)),
    }
    // Dropped when `f` returns or unwinds: stops the members.
    let _leader = Leader::enter(&team);
    f()
}

/// Joins `team` as the members of `slots` (on a worker of the pool the team's leader spawned
/// this on): splits off the upper half of the slots as a job of its own, again and again, then
/// becomes the first member. The pool's other workers steal those jobs and do the same, so the
/// members are recruited in a tree: on 64 threads the last joins after 6 hand-overs rather than
/// 63, and no thread hands over more than 6.
fn recruit(team: Arc<Team>, slots: std::ops::Range<usize>) {
    let (first, mut end) = (slots.start, slots.end);
    while end - first > 1 {
        let middle = first + (end - first) / 2;
        let (half, rest) = (Arc::clone(&team), middle..end);
        rayon::spawn(move || recruit(half, rest));
        end = middle;
    }
    if first < end {
        team.member(first);
    }
}

/// `MINDUCTOR_TEAM_LEADER=worker`: a call from outside the pool hands its steps to a worker
/// that leads the team (measurements).
fn leader_on_worker() -> bool {
    static ON_WORKER: OnceLock<bool> = OnceLock::new();
    *ON_WORKER
        .get_or_init(|| std::env::var("MINDUCTOR_TEAM_LEADER").is_ok_and(|v| v.trim() == "worker"))
}

thread_local! {
    /// The team this thread leads (set by [`in_team`] while its `f` runs), or null.
    static LEADING: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
    /// This thread is a team's leader or member: a team asked for now runs without one, and a
    /// member's job starting here returns at once (a thread in a team's work never joins another
    /// team's, nor its own twice, from a nested rayon wait).
    static BUSY: Cell<bool> = const { Cell::new(false) };
    /// This thread is running a piece its team handed out: a [`for_each_chunk`] inside it is
    /// nested and goes to rayon (the team's one job slot is taken).
    static IN_PIECE: Cell<bool> = const { Cell::new(false) };
    /// Inside [`serially`]: every [`for_each_chunk`] runs its pieces here, in order.
    static SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every [`for_each_chunk`] it calls on this thread running its pieces here, in
/// order: for a call too small to pay for waking the pool's workers (the executor decides).
pub fn serially<R>(f: impl FnOnce() -> R) -> R {
    /// Restores the flag when dropped (also when `f` panics).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.set(self.0);
        }
    }
    let _restore = Restore(SERIAL.replace(true));
    f()
}

/// A slot word: `epoch | front | back` in [`EPOCH_BITS`], [`COUNT_BITS`], [`COUNT_BITS`] bits,
/// the pieces `front..back` of one thread's share of the current step still unclaimed. One word,
/// so that a piece is claimed (compare-and-swap of `front` by the owner, of `back` by a thief)
/// only while its step is still the current one.
const COUNT_BITS: u32 = 19;
const EPOCH_BITS: u32 = 64 - 2 * COUNT_BITS;
/// The most pieces a team hands out in one step (more go to rayon).
const MAX_TEAM_CHUNKS: usize = (1 << COUNT_BITS) - 1;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << EPOCH_BITS) - 1;

fn pack(epoch: u64, front: usize, back: usize) -> u64 {
    ((epoch & EPOCH_MASK) << (2 * COUNT_BITS)) | ((front as u64) << COUNT_BITS) | back as u64
}

/// `(front, back)` of a slot word.
fn unpack(word: u64) -> (usize, usize) {
    (
        ((word >> COUNT_BITS) & COUNT_MASK) as usize,
        (word & COUNT_MASK) as usize,
    )
}

/// Thread `slot`'s share of a step of `chunks` pieces on `threads` threads: the `slot`-th of
/// `threads` contiguous, equal (to within one) runs of pieces, as OpenMP's static schedule
/// deals them.
fn share(chunks: usize, threads: usize, slot: usize) -> std::ops::Range<usize> {
    chunks * slot / threads..chunks * (slot + 1) / threads
}

/// `MINDUCTOR_TEAM_SCHEDULE=dynamic` deals every piece to the leader's share instead, and every
/// thread takes the next piece from its front, first come, first served (how teams claimed
/// pieces before they had shares; kept to measure one against the other in one binary).
fn dynamic_schedule() -> bool {
    static DYNAMIC: OnceLock<bool> = OnceLock::new();
    *DYNAMIC.get_or_init(|| {
        std::env::var("MINDUCTOR_TEAM_SCHEDULE").is_ok_and(|v| v.trim() == "dynamic")
    })
}

/// Spins before a waiting member starts yielding its core.
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

/// A job: the leader's step closure, lent to the team for one step.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

/// One thread's slot word, alone on its cache lines (its owner claims from it on every piece).
#[repr(align(128))]
struct Slot(AtomicU64);

/// The shared state of a team (see [`in_team`]).
///
/// Each step's pieces are dealt out as OpenMP's static schedule deals them: thread `i` (the
/// leader is 0) owns the `i`-th contiguous run of them, so that on every step the same thread
/// takes the same part of the rows (a row kernel after a GEMM reads the rows this core's GEMM
/// pieces just wrote, from its own cache, where claiming from one shared counter handed them to
/// whichever thread came first). A thread that has run its own share then steals pieces one at
/// a time from the far end of the others' shares, so a core slowed down (a busy VM, a
/// descheduled thread) still leaves no piece waiting for it.
struct Team {
    /// The current step's number: members wait for it to change.
    epoch: AtomicU64,
    /// One per thread, the leader's first: `epoch | front | back` (see [`pack`]) of its share.
    slots: Box<[Slot]>,
    /// Pieces of the current step finished.
    done: AtomicUsize,
    /// Points to the leader's [`Job`] of the current step, on the leader's stack.
    job: AtomicPtr<()>,
    /// The leader is done: members return.
    stop: AtomicBool,
    /// The first panic of a piece, resumed by the leader once every piece has finished.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

impl Team {
    fn new(threads: usize) -> Team {
        Team {
            epoch: AtomicU64::new(0),
            slots: (0..threads.max(1))
                .map(|_| Slot(AtomicU64::new(0)))
                .collect(),
            done: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            stop: AtomicBool::new(false),
            panic: Mutex::new(None),
        }
    }

    /// A member's life (`slot` ≥ 1): claim and run pieces as steps are published, until the
    /// leader stops.
    fn member(&self, slot: usize) {
        if BUSY.get() || self.stop.load(Ordering::Acquire) {
            return;
        }
        BUSY.set(true);
        let mut idle = 0u32;
        let mut seen = 0u64;
        while !self.stop.load(Ordering::Acquire) {
            let epoch = self.epoch.load(Ordering::Acquire);
            if epoch != seen {
                seen = epoch;
                self.claim_and_run(slot);
                idle = 0;
            } else if idle < SPINS_BEFORE_YIELD {
                idle += 1;
                std::hint::spin_loop();
            } else if !matches!(rayon::yield_now(), Some(rayon::Yield::Executed)) {
                std::thread::yield_now();
            }
        }
        BUSY.set(false);
    }

    /// Claims a piece of the current step: the front of `slot`'s own share, else the back of
    /// another thread's (the next slots' first); `None` when no piece is left unclaimed.
    fn claim(&self, slot: usize) -> Option<usize> {
        // (`dynamic_schedule`: every thread takes the front of the leader's share.)
        let (threads, slot) = if dynamic_schedule() {
            (1, 0)
        } else {
            (self.slots.len(), slot)
        };
        for offset in 0..threads {
            let own = offset == 0;
            let word = &self.slots[(slot + offset) % threads].0;
            let mut current = word.load(Ordering::Acquire);
            loop {
                let (front, back) = unpack(current);
                if front >= back {
                    break;
                }
                let (claimed, next) = if own {
                    (
                        front,
                        (current & !(COUNT_MASK << COUNT_BITS))
                            | (((front + 1) as u64) << COUNT_BITS),
                    )
                } else {
                    (back - 1, (current & !COUNT_MASK) | (back - 1) as u64)
                };
                match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return Some(claimed),
                    Err(now) => current = now,
                }
            }
        }
        None
    }

    /// Claims and runs pieces of the current step until none is left unclaimed.
    fn claim_and_run(&self, slot: usize) {
        let mut ran = 0;
        while let Some(piece) = self.claim(slot) {
            // SAFETY: piece `piece` of the current step is claimed and not finished, so the
            // leader is still inside `run` for this step (it returns only when `done` counts
            // every piece), and `job` points to its live `Job` (stored before the slot word
            // this compare-and-swap acquired was published; the word's epoch makes a claim
            // read in an earlier step fail).
            let job: Job<'_> = unsafe { *(self.job.load(Ordering::Acquire) as *const Job<'_>) };
            let outer = IN_PIECE.replace(true);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(piece)));
            IN_PIECE.set(outer);
            if let Err(payload) = result {
                let mut first = self.panic.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(payload);
            }
            ran += 1;
        }
        if ran > 0 {
            self.done.fetch_add(ran, Ordering::Release);
        }
    }

    /// The leader's step: deals `chunks` pieces of `f` out to the slots, runs its own share
    /// (and steals), and returns when every piece has finished (resuming a piece's panic).
    fn run(&self, chunks: usize, f: Job<'_>) {
        let job: Job<'_> = f;
        self.job
            .store(&job as *const Job<'_> as *mut (), Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        let epoch = (self.epoch.load(Ordering::Relaxed) + 1) & EPOCH_MASK;
        let threads = if dynamic_schedule() {
            1
        } else {
            self.slots.len()
        };
        for (slot, word) in self.slots.iter().enumerate() {
            let range = if slot < threads {
                share(chunks, threads, slot)
            } else {
                0..0
            };
            word.0
                .store(pack(epoch, range.start, range.end), Ordering::Release);
        }
        self.epoch.store(epoch, Ordering::Release);
        self.claim_and_run(0);
        // The last pieces are running on members; spin, then yield the core (to them, when
        // there are more threads than cores).
        let mut spins = 0u32;
        while self.done.load(Ordering::Acquire) < chunks {
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // Every piece is finished: no member reads `job` again before the next step.
        let panic = self.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
    }
}

/// The leader's registration (see [`in_team`]); dropping it stops the team.
struct Leader<'a> {
    team: &'a Team,
}

impl<'a> Leader<'a> {
    fn enter(team: &'a Team) -> Leader<'a> {
        LEADING.set(team);
        BUSY.set(true);
        Leader { team }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        LEADING.set(std::ptr::null());
        BUSY.set(false);
        self.team.stop.store(true, Ordering::Release);
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
    // The threads the pieces would run on: the pool this thread works for, else the
    // configured one.
    let threads = match rayon::current_thread_index() {
        Some(_) => rayon::current_num_threads(),
        None => num_threads(),
    };
    if threads <= 1 || SERIAL.get() {
        // One thread: the pieces run here, in order. Handing them to a pool of one worker would
        // only add its wake-up, tens of microseconds a call from outside the pool: a fused
        // attention of a small model (8 work items whatever the thread count) took 96 µs at one
        // thread against 10 µs at two (tiny_gpt2.pt2, `pt2_profile`).
        for chunk in 0..chunks {
            f(chunk);
        }
        return;
    }
    let leading = LEADING.get();
    if !leading.is_null() && !IN_PIECE.get() && chunks <= MAX_TEAM_CHUNKS {
        // SAFETY: `LEADING` points to the team of the `in_team` call this thread is inside
        // (cleared before that team is dropped).
        let team = unsafe { &*leading };
        // (`claim_and_run` marks the leader as in a piece while it runs one.)
        team.run(chunks, &f);
        return;
    }
    let run = || (0..chunks).into_par_iter().for_each(&f);
    match current_pool() {
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

    /// Runs `steps` steps of `chunks(step)` pieces in one team, each piece counting itself and
    /// (every third step) splitting again inside; every piece must run exactly once.
    fn team_counts(steps: usize, chunks: impl Fn(usize) -> usize + Sync + Send) {
        use std::sync::atomic::AtomicUsize;
        let total: usize = (0..steps).map(&chunks).sum();
        let runs: Vec<AtomicUsize> = (0..total).map(|_| AtomicUsize::new(0)).collect();
        let nested = AtomicUsize::new(0);
        in_team(|| {
            let mut first = 0;
            for step in 0..steps {
                let n = chunks(step);
                for_each_chunk(n, |i| {
                    runs[first + i].fetch_add(1, Ordering::Relaxed);
                    if step % 3 == 0 {
                        for_each_chunk(3, |_| {
                            nested.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
                // Every piece of the step has finished when the call returns.
                assert!(runs[first..first + n]
                    .iter()
                    .all(|r| r.load(Ordering::Relaxed) == 1));
                first += n;
            }
        });
        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        let nested_steps: usize = (0..steps).step_by(3).map(&chunks).sum();
        assert_eq!(nested.load(Ordering::Relaxed), 3 * nested_steps);
    }

    #[test]
    fn a_team_runs_every_piece_once() {
        for threads in [2, 3, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                team_counts(200, |step| 2 + step % 17);
                team_counts(4, |step| [1, 1000, 64, threads - 1][step]);
            });
        }
        // From outside any pool, and several teams at once.
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| team_counts(100, |step| 1 + step % 9));
            }
        });
    }

    #[test]
    fn a_panicking_piece_reaches_the_leader_after_every_piece_ends() {
        use std::sync::atomic::AtomicUsize;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let finished = AtomicUsize::new(0);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| {
                in_team(|| {
                    for_each_chunk(8, |i| {
                        if i == 5 {
                            panic!("piece 5");
                        }
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        finished.fetch_add(1, Ordering::Relaxed);
                    });
                })
            })
        }));
        let payload = result.expect_err("the piece's panic reaches the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"piece 5"));
        assert_eq!(finished.load(Ordering::Relaxed), 7);
        // The pool still works, in a new team.
        pool.install(|| team_counts(10, |_| 4));
    }

    #[test]
    fn a_team_led_from_outside_the_pool_uses_the_caller_and_survives_a_panic() {
        use std::sync::atomic::AtomicUsize;
        // A thread of no pool leads: every piece runs once, some of them on the caller itself
        // (it is thread 0 of the team and runs its own share first).
        std::thread::scope(|s| {
            s.spawn(|| {
                let caller = std::thread::current().id();
                let on_caller = AtomicUsize::new(0);
                in_team(|| {
                    for_each_chunk(64, |_| {
                        // (Long enough that no member could run all of its own share and then
                        // steal the caller's before the caller claims its first.)
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        if std::thread::current().id() == caller {
                            on_caller.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                });
                assert!(on_caller.load(Ordering::Relaxed) > 0);
                team_counts(50, |step| 1 + step % 7);
                // A piece's panic reaches the caller once every other piece has ended, and the
                // members of the stopped team leave it: the next team runs normally.
                let finished = AtomicUsize::new(0);
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    in_team(|| {
                        for_each_chunk(6, |i| {
                            if i == 4 {
                                panic!("piece 4");
                            }
                            std::thread::sleep(std::time::Duration::from_millis(2));
                            finished.fetch_add(1, Ordering::Relaxed);
                        })
                    })
                }));
                let payload = result.expect_err("the piece's panic reaches the caller");
                assert_eq!(payload.downcast_ref::<&str>(), Some(&"piece 4"));
                assert_eq!(finished.load(Ordering::Relaxed), 5);
                team_counts(20, |_| 3);
            });
        });
    }

    #[test]
    fn shares_deal_every_piece_once_in_order_and_equal_to_within_one() {
        for threads in 1..=9 {
            for chunks in 0..100 {
                let shares: Vec<_> = (0..threads).map(|t| share(chunks, threads, t)).collect();
                assert_eq!(shares[0].start, 0);
                assert_eq!(shares[threads - 1].end, chunks);
                for pair in shares.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                }
                let (least, most) = (chunks / threads, chunks.div_ceil(threads));
                assert!(shares.iter().all(|s| (least..=most).contains(&s.len())));
            }
        }
    }

    #[test]
    fn a_slot_word_keeps_its_epoch_and_both_ends() {
        let word = pack(EPOCH_MASK + 5, MAX_TEAM_CHUNKS, 7);
        assert_eq!(unpack(word), (MAX_TEAM_CHUNKS, 7));
        assert_eq!(word >> (2 * COUNT_BITS), 4);
    }

    /// The tests that set the process-wide thread count, one at a time.
    static GLOBAL_COUNT: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn at_one_thread_the_pieces_run_on_the_calling_thread_in_order() {
        let _one_at_a_time = GLOBAL_COUNT.lock().unwrap_or_else(|e| e.into_inner());
        set_num_threads(1).unwrap();
        let caller = std::thread::current().id();
        let seen = std::sync::Mutex::new(Vec::new());
        for_each_chunk(8, |i| {
            seen.lock().unwrap().push((i, std::thread::current().id()));
        });
        set_num_threads(0).unwrap();
        let seen = seen.into_inner().unwrap();
        let expected: Vec<_> = (0..8).map(|i| (i, caller)).collect();
        assert_eq!(seen, expected);
        // Inside a pool of several workers, the pieces still spread over them.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        pool.install(|| team_counts(20, |_| 6));
    }

    #[test]
    fn a_team_of_many_recruited_members_led_from_outside_runs_every_piece_once() {
        let _one_at_a_time = GLOBAL_COUNT.lock().unwrap_or_else(|e| e.into_inner());
        // More workers than cores: the members are recruited in a tree (`recruit`), some late.
        for threads in [3, 5, 9] {
            set_num_threads(threads).unwrap();
            team_counts(100, |step| 1 + step % 23);
            team_counts(3, |step| [threads - 1, 1000, 1][step]);
        }
        set_num_threads(0).unwrap();
    }

    #[test]
    fn set_num_threads_overrides_the_default() {
        let _one_at_a_time = GLOBAL_COUNT.lock().unwrap_or_else(|e| e.into_inner());
        assert!(default_num_threads() >= 1);
        set_num_threads(3).unwrap();
        assert_eq!(num_threads(), 3);
        set_num_threads(0).unwrap();
        assert_eq!(num_threads(), default_num_threads());
    }
}
