//! The LLaMA block's rotary-embedding kernels with row routines and without (the 4-lane
//! Cranelift loop), timed in one process, the two forms alternated round by round at each
//! thread count, so that a busy machine's slow moments fall on both: each kernel's median
//! milliseconds per form and thread count. For a change to a row routine those kernels take
//! (`math::block::rows`, `codegen_cpu/src/lower/rows.rs`).
//! `cargo run --release -p minductor-tools --example rotary_ab -- [ROUNDS] [RUNS]` (20, 10).

use minductor::internals::codegen_cpu::lower::set_row_kernels;
use minductor_tools::report::StepTimer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(20), |a| a.parse())?;
    let runs: usize = args.next().map_or(Ok(10), |a| a.parse())?;
    let w = minductor_tools::workloads::by_name("llama_block_4x256x512")?;
    let threads = [1usize, 2];
    // (form, threads) -> timer; compiled at the thread count it runs at.
    let mut timers = Vec::new();
    for rows in [true, false] {
        for &t in &threads {
            minductor::set_num_threads(t)?;
            set_row_kernels(rows);
            timers.push((rows, t, StepTimer::new(&w.graph)?));
        }
    }
    for round in 0..rounds {
        // The first form alternates too.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..timers.len()).collect()
        } else {
            (0..timers.len()).rev().collect()
        };
        for i in order {
            let (_, t, timer) = &mut timers[i];
            minductor::set_num_threads(*t)?;
            timer.time(&w.inputs, runs)?;
        }
    }
    println!("median ms over {rounds} rounds of {runs} runs, row routines against the loop");
    for (rows, t, timer) in timers {
        // (The widths printed are the lowering's decisions under the switch as it is now.)
        set_row_kernels(rows);
        let report = timer.finish(None);
        for step in &report.steps {
            let cost = &step.costs[0];
            if cost.name.contains("_add_mul_neg_add_mul") {
                println!(
                    "{:<28} {:>3} bits  {} thread(s)  {:.4} ms  ({})",
                    cost.name,
                    step.vector_bits[0].unwrap_or(0),
                    t,
                    step.median.as_secs_f64() * 1e3,
                    if rows { "row routines" } else { "loop" }
                );
            }
        }
    }
    Ok(())
}
