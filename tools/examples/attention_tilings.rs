//! The fused attention step's time under every tiling max-autotune may choose (query rows per
//! block, work items per thread; `codegen_cpu::AttentionChoice`), at 1 and 2 threads, and
//! what max-autotune picks for it:
//! `cargo run --release -p minductor-tools --example attention_tilings -- [rounds] [workload…]`
//! (default: 15 rounds of `attention_8x256x512` and `llama_block_4x256x512`).
//!
//! Every round times each tiling once (the median of 3 profiled calls), in an order that
//! rotates from round to round, so a machine whose speed drifts affects every tiling alike;
//! each tiling's figure is the median over the rounds. The other steps keep their default
//! splits.

use minductor::internals::codegen_cpu::{compile_program, Split};
use minductor::internals::runtime::Executable;
use minductor_tools::workloads;

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).peekable();
    let rounds: usize = match args.peek().map(|a| a.parse::<usize>()) {
        Some(Ok(n)) => {
            args.next();
            n.max(1)
        }
        _ => 15,
    };
    let mut names: Vec<String> = args.collect();
    if names.is_empty() {
        names = vec!["attention_8x256x512".into(), "llama_block_4x256x512".into()];
    }
    for name in &names {
        let workload = workloads::by_name(name)?;
        let program = minductor::compile(&workload.graph)?
            .artifacts()
            .program
            .clone()
            .ok_or("no kernel program")?;
        let mut compiled = compile_program(&program)?;
        for threads in [1, 2] {
            minductor::set_num_threads(threads)?;
            // The tuned steps' names (this also tunes them; every split is reset below).
            let steps: Vec<String> = compiled
                .autotune(1)?
                .into_iter()
                .map(|(step, _)| step)
                .collect();
            let all = Split::attention_plans(threads);
            let splits_with = |tiling: Split| -> Vec<(String, Split)> {
                steps
                    .iter()
                    .map(|s| match s.starts_with("attention_") {
                        true => (s.clone(), tiling),
                        false => (s.clone(), Split::PerThread),
                    })
                    .collect()
            };
            // Only the tilings that cut the attention steps differently (query block, or the
            // work items' multiply-adds) are timed, as max-autotune does.
            let mut tilings: Vec<Split> = Vec::new();
            let mut cuts: Vec<(usize, Vec<Vec<u64>>)> = Vec::new();
            for &tiling in &all {
                compiled.set_splits(&splits_with(tiling));
                let pieces: Vec<Vec<u64>> = compiled
                    .partition_steps(&workload.inputs, threads)?
                    .into_iter()
                    .filter(|p| p.name.starts_with("attention_"))
                    .map(|p| p.pieces)
                    .collect();
                let query_block = match tiling {
                    Split::Attention(a) => a.query_block,
                    _ => 64,
                };
                if !cuts.contains(&(query_block, pieces.clone())) {
                    println!(
                        "  {}: {} item(s) per attention step",
                        tiling.name(),
                        pieces.first().map_or(0, Vec::len)
                    );
                    cuts.push((query_block, pieces));
                    tilings.push(tiling);
                }
            }
            // samples[tiling]: the attention steps' milliseconds, one sum per round.
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); tilings.len()];
            let mut attention_steps: Vec<String> = Vec::new();
            for round in 0..rounds {
                for offset in 0..tilings.len() {
                    let which = (round + offset) % tilings.len();
                    if !compiled.set_splits(&splits_with(tilings[which])) {
                        return Err("the tuned steps changed".into());
                    }
                    drop(compiled.run(&workload.inputs)?);
                    let mut calls: Vec<Vec<f64>> = Vec::new();
                    for _ in 0..3 {
                        let (_, timings) = compiled.profile(&workload.inputs)?;
                        let attention: Vec<_> = timings
                            .iter()
                            .filter(|t| t.name.starts_with("attention_"))
                            .collect();
                        attention_steps = attention.iter().map(|t| t.name.clone()).collect();
                        for (i, t) in attention.iter().enumerate() {
                            if calls.len() <= i {
                                calls.push(Vec::new());
                            }
                            calls[i].push(t.time.as_secs_f64() * 1e3);
                        }
                    }
                    samples[which].push(calls.iter_mut().map(|c| median(c)).sum());
                }
            }
            let medians: Vec<f64> = samples.iter_mut().map(|s| median(s)).collect();
            let default = medians[0];
            println!(
                "{name} on {threads} thread(s), {} attention step(s) {attention_steps:?}, \
                 median of {rounds} rounds:",
                attention_steps.len()
            );
            for (tiling, ms) in tilings.iter().zip(&medians) {
                let label = match tiling {
                    Split::PerThread => "default (rows64-items4)".to_string(),
                    other => other.name(),
                };
                println!(
                    "  {label:<28} {ms:8.3} ms  {:5.3}x the default",
                    default / ms
                );
            }
            // What max-autotune (two calls per plan, as a compile does) picks, five times.
            let mut picks = Vec::new();
            for _ in 0..5 {
                let chosen = compiled.autotune(2)?;
                picks.extend(
                    chosen
                        .into_iter()
                        .filter(|(s, _)| s.starts_with("attention_"))
                        .map(|(_, split)| split.name()),
                );
            }
            println!("  max-autotune picked: {picks:?}");
        }
        minductor::set_num_threads(0)?;
    }
    Ok(())
}
