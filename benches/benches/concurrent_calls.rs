//! Throughput of one compiled graph called from one thread and from two threads at once, on a
//! graph too small to be split across threads (its kernels run on the calling thread, so any
//! gain comes from concurrent calls, each in its own arena from the pool).
//!
//! `cargo bench -p minductor-benches --bench concurrent_calls`
//!
//! A plain harness rather than criterion: the number that matters is a ratio of two
//! throughputs measured on a shared, noisy machine, so the rounds interleave the cases (one
//! caller, two callers, then the same for a trivial CPU-bound loop) and the report is the median
//! of each case over the rounds. The loop is the machine's own ceiling: two threads running
//! arithmetic that touches no shared memory show how much of a second core this machine gives
//! (on a VM with a busy neighbour, less than 2x). Each case spawns its callers afresh and starts
//! them together at a barrier; the time is from the barrier to the last caller's end.
//!
//! Two numbers per case. The wall-time ratio is the throughput asked for, but on a machine
//! others use it says as much about them as about us. The CPU-time ratio (each caller's
//! thread CPU time, summed, per call: one caller's over two callers') is what two callers cost
//! each other (shared cache lines, a lock spun on, memory bandwidth) whatever else runs: 1.0
//! means no cost, and 2 × it is the throughput two callers reach when each has a core. A lock
//! slept on would show in the wall time only; the compiled call takes none but the arena
//! pool's, held for a push or a pop.
//!
//! Environment: `ROUNDS` (default 15) and `CALLS` (calls per round, split between the callers;
//! default 4000).

use minductor::{compile, jit, trace, DType, Tensor, Traced};
use minductor_tools::workloads::uniform;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// The CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs `work(calls_per_thread)` on `threads` fresh threads started together; the wall time
/// from their start to the last one's end, and the CPU time the threads used, summed.
fn timed(threads: usize, calls: usize, work: &(dyn Fn(usize) + Sync)) -> (Duration, Duration) {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let cpu = thread_cpu_time();
                    work(calls / threads);
                    (Instant::now(), thread_cpu_time() - cpu)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let ends: Vec<(Instant, Duration)> = handles
            .into_iter()
            .map(|h| h.join().expect("a caller panicked"))
            .collect();
        let ended = ends.iter().map(|e| e.0).max().expect("at least one caller");
        (ended - started, ends.iter().map(|e| e.1).sum())
    })
}

/// A CPU-bound loop of about the cost of one call, on registers only.
fn spin(iterations: u64) -> u64 {
    let mut x = black_box(0x9E37_79B9_7F4A_7C15u64);
    for i in 0..iterations {
        x = x.rotate_left(5) ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03);
    }
    x
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with no such flag and a
    // smoke test is enough then.
    let benching = std::env::args().any(|a| a == "--bench");
    let rounds = if benching { env_or("ROUNDS", 15) } else { 1 };
    let calls = if benching { env_or("CALLS", 4000) } else { 20 };

    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[16, 256]);
        let g = t.input("g", DType::F32, &[256]);
        vec![(x.layer_norm(&[256], Some(&g), None, 1e-5).gelu() * 2.0).softmax(-1)]
    })
    .expect("well-typed");
    let compiled = compile(&graph).expect("compiles");
    let inputs: Vec<Tensor> = vec![
        uniform(&[16, 256], -2.0, 2.0, 1),
        uniform(&[256], 0.5, 1.5, 2),
    ];
    let call = |n: usize| {
        for _ in 0..n {
            black_box(compiled.call(&inputs).expect("runs"));
        }
    };
    // The same function through `jit` (its cache hit: guards, then the cached code).
    let function = jit(|x: &[Traced]| {
        vec![(x[0].layer_norm(&[256], Some(&x[1]), None, 1e-5).gelu() * 2.0).softmax(-1)]
    });
    function.call(&inputs).expect("compiles and runs");
    let call_jit = |n: usize| {
        for _ in 0..n {
            black_box(function.call(&inputs).expect("runs"));
        }
    };
    // The loop's length: about one call's time on one thread.
    let started = Instant::now();
    call(200);
    let per_call = started.elapsed() / 200;
    let started = Instant::now();
    black_box(spin(1 << 20));
    let per_spin = started.elapsed().as_secs_f64() / f64::from(1 << 20);
    let spin_iterations = ((per_call.as_secs_f64() / per_spin) as u64).max(1);
    let loop_ = |n: usize| {
        for _ in 0..n {
            black_box(spin(spin_iterations));
        }
    };

    let (mut graph_ratio, mut loop_ratio) = (Vec::new(), Vec::new());
    let (mut graph_cpu, mut loop_cpu) = (Vec::new(), Vec::new());
    let (mut graph_one, mut graph_two) = (Vec::new(), Vec::new());
    let (mut jit_ratio, mut jit_cpu) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let seconds = |(wall, cpu): (Duration, Duration)| (wall.as_secs_f64(), cpu.as_secs_f64());
        let (one, one_cpu) = seconds(timed(1, calls, &call));
        let (two, two_cpu) = seconds(timed(2, calls, &call));
        let (loop_one, loop_one_cpu) = seconds(timed(1, calls, &loop_));
        let (loop_two, loop_two_cpu) = seconds(timed(2, calls, &loop_));
        graph_one.push(one_cpu / calls as f64);
        graph_two.push(two_cpu / calls as f64);
        graph_ratio.push(one / two);
        loop_ratio.push(loop_one / loop_two);
        graph_cpu.push(one_cpu / two_cpu);
        loop_cpu.push(loop_one_cpu / loop_two_cpu);
        let (jit_one, jit_one_cpu) = seconds(timed(1, calls, &call_jit));
        let (jit_two, jit_two_cpu) = seconds(timed(2, calls, &call_jit));
        jit_ratio.push(jit_one / jit_two);
        jit_cpu.push(jit_one_cpu / jit_two_cpu);
    }
    let micros = |s: f64| s * 1e6;
    println!(
        "layer_norm 16x256 graph: {:.2} us of CPU a call from one caller, {:.2} us from two",
        micros(median(graph_one)),
        micros(median(graph_two)),
    );
    println!(
        "two callers over one: wall-time throughput {:.2}x (the CPU-bound loop, the machine's \
         ceiling now: {:.2}x); CPU time a call {:.2} (loop: {:.2}), so {:.2}x with a core each",
        median(graph_ratio.clone()),
        median(loop_ratio.clone()),
        median(graph_cpu.clone()),
        median(loop_cpu.clone()),
        2.0 * median(graph_cpu.clone()),
    );
    println!(
        "the same function through jit: wall-time throughput {:.2}x, CPU time a call {:.2}",
        median(jit_ratio),
        median(jit_cpu),
    );
    println!(
        "medians of {rounds} interleaved rounds of {calls} calls; per round, wall (graph/loop): {}",
        graph_ratio
            .iter()
            .zip(&loop_ratio)
            .map(|(g, l)| format!("{g:.2}/{l:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
}
