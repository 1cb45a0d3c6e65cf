//! Times each pass of compiling the decoder's SGD step at several depths (the best of `REPS`
//! runs, 3 by default), with `fuse`'s work counts, to see which pass grows faster than the graph:
//! `cargo run --release -p minductor-tools --example train_compile_parts -- 8,32,64`.
//! `NO_CODEGEN=1` skips Cranelift; `DIGEST=1` prints instead a hash of each fused program's
//! `Debug` text (two builds that print the same hashes fused the same programs).

use minductor::internals::codegen_cpu::compile_program;
use minductor::internals::kernel_ir::{verify_program, Program};
use minductor::internals::passes::*;
use minductor::{compile_with, Backend};
use minductor_tools::workloads::gpt_decoder_train_step;
use std::hash::{Hash, Hasher};
use std::time::Instant;

type Pass = fn(&Program) -> Program;

/// `f`'s result and its best time in milliseconds.
fn best<T>(f: impl Fn() -> T) -> (T, f64) {
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let mut fastest = f64::INFINITY;
    let mut out = None;
    for _ in 0..reps.max(1) {
        let started = Instant::now();
        out = Some(f());
        fastest = fastest.min(started.elapsed().as_secs_f64() * 1e3);
    }
    (out.expect("at least one run"), fastest)
}

fn main() {
    let layers: Vec<usize> = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "8,32".into())
        .split(',')
        .map(|s| s.parse().expect("a comma-separated list of depths"))
        .collect();
    let codegen = std::env::var("NO_CODEGEN").is_err();
    let digest = std::env::var("DIGEST").is_ok();
    for l in layers {
        let step = gpt_decoder_train_step(l, 1e-3).expect("the decoder's training step");
        // The eager-on-prims backend stops where `fuse` starts: its prim graph is the one the
        // inductor backend schedules.
        let compiled = compile_with(&step.graph, Backend::AotEager).expect("compiles");
        let prims = compiled
            .artifacts()
            .prim_graph
            .clone()
            .expect("a prim graph");
        let ((fused, stats), t) = best(|| fuse_counting(&prims).expect("fuses"));
        if digest {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            format!("{fused:?}").hash(&mut h);
            println!("{l}l fused digest {:016x}", h.finish());
            continue;
        }
        let mut line = format!("{l}l ({} prim nodes):", prims.len());
        line += &format!(
            " fuse {t:.1} ({} builds, {} retries, {} steps)",
            stats.builds,
            stats.retries,
            fused.steps.len()
        );
        let (_, t) = best(|| verify_program(&fused, &[]).expect("verifies"));
        line += &format!(" verify {t:.1}");
        let passes: [(&str, Pass); 5] = [
            ("horizontal", fuse_horizontal),
            ("epilogues", fuse_epilogues),
            ("store_once", store_once),
            ("split_transposes", split_transposes),
            ("loop_order", choose_loop_order),
        ];
        let mut program = fused;
        for (name, pass) in passes {
            let (next, t) = best(|| pass(&program));
            line += &format!(" {name} {t:.1}");
            program = next;
        }
        let (plan, t) = best(|| plan_buffers(&program));
        line += &format!(" plan {t:.1}");
        program.plan = Some(plan);
        if codegen {
            let (compiled, t) = best(|| compile_program(&program).expect("generates code"));
            let kernels = compiled.kernels().count();
            line += &format!(
                " codegen {t:.1} ({kernels} kernels, {:.3} each)",
                t / kernels as f64
            );
        }
        println!("{line} (ms)");
    }
}
