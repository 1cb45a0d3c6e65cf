//! What a call costs beyond its steps: the median wall time of back-to-back calls against the
//! median of the same calls' step times summed (`Compiled::profile`), alternating the two, for
//! each workload named, on `threads` threads. The difference is the call's own work: binding
//! the inputs, taking an arena and the outputs, and handing the steps to the thread team.
//! `cargo run --release -p minductor-tools --example call_overhead -- [threads] [workload…]`.

use minductor::{compile_with, Backend};
use minductor_tools::workloads;
use std::time::Instant;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2);
    let names: Vec<String> = args.collect();
    minductor::set_num_threads(threads)?;
    for name in &names {
        let workload = workloads::by_name(name)?;
        let compiled = compile_with(&workload.graph, Backend::Inductor)?;
        for _ in 0..5 {
            drop(compiled.call(&workload.inputs)?);
        }
        let (mut calls, mut steps) = (Vec::new(), Vec::new());
        for _ in 0..51 {
            let start = Instant::now();
            drop(compiled.call(&workload.inputs)?);
            calls.push(start.elapsed().as_secs_f64() * 1e6);
            let (_, timings) = compiled.profile(&workload.inputs)?;
            steps.push(timings.iter().map(|t| t.time.as_secs_f64() * 1e6).sum());
        }
        let (call, step) = (median(calls), median(steps));
        let beyond = call - step;
        println!(
            "{name:<24} {threads} threads: call {call:9.1} us, steps {step:9.1} us, \
             beyond the steps {beyond:7.1} us"
        );
    }
    Ok(())
}
