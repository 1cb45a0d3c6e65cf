//! Median CPU time per thread (and wall time) of compiled workloads' calls: on a shared, busy
//! host the CPU time this process used counts only our own work, not the time other processes
//! ran, so variants can be compared where wall times are noise:
//! `cargo run --release -p minductor-tools --example workload_cpu -- [threads] [workload…]`.

use minductor::{compile_with, Backend};
use minductor_tools::workloads;
use std::time::Instant;

/// `struct timespec` of 64-bit Linux.
#[repr(C)]
struct Timespec {
    seconds: i64,
    nanoseconds: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
}

/// CPU seconds used by every thread of this process so far.
fn process_cpu_seconds() -> f64 {
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut time = Timespec {
        seconds: 0,
        nanoseconds: 0,
    };
    // SAFETY: `time` is a valid, writable `struct timespec` for the call.
    let status = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut time) };
    assert_eq!(status, 0, "clock_gettime");
    time.seconds as f64 + time.nanoseconds as f64 * 1e-9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2);
    let names: Vec<String> = args.collect();
    minductor::set_num_threads(threads)?;
    for name in &names {
        let workload = workloads::by_name(name)?;
        let compiled = compile_with(&workload.graph, Backend::Inductor)?;
        for _ in 0..3 {
            drop(compiled.call(&workload.inputs)?);
        }
        let mut cpu = Vec::new();
        let mut wall = Vec::new();
        for _ in 0..21 {
            let (start, start_cpu) = (Instant::now(), process_cpu_seconds());
            drop(compiled.call(&workload.inputs)?);
            cpu.push((process_cpu_seconds() - start_cpu) / threads as f64 * 1e3);
            wall.push(start.elapsed().as_secs_f64() * 1e3);
        }
        cpu.sort_by(f64::total_cmp);
        wall.sort_by(f64::total_cmp);
        let gflops = workload.flops as f64 / cpu[cpu.len() / 2] / 1e6;
        println!(
            "{name:<24} cpu/thread {:8.3} ms ({gflops:5.1} GFLOP/s)   wall {:8.3} ms",
            cpu[cpu.len() / 2],
            wall[wall.len() / 2]
        );
    }
    Ok(())
}
