//! The fusion report: what the compiler made of a graph, kernel by kernel, and how fast each
//! kernel ran against what this machine can do.
//!
//! For every step of the compiled program (a kernel, or a GEMM with its epilogue) it lists the
//! graph nodes fused, the iteration domain, bytes read and written and FLOPs (from
//! `passes::program_cost`), and, after running the graph, the median time per step
//! (`Compiled::profile`) with the achieved GB/s (GFLOP/s for GEMMs) as a fraction of the probe's
//! copy bandwidth (GEMM peak over all threads), and the vector width (bits) each runs at on this
//! CPU (`codegen_cpu::lower::step_vector_bits`).

use crate::probe::MachineProbe;
use minductor::internals::codegen_cpu::lower::step_vector_bits;
use minductor::internals::kernel_ir::cost::{program_cost, StepCost, StepKind};
use minductor::internals::kernel_ir::Step;
use minductor::internals::runtime::{RuntimeError, Tensor};
use minductor::Graph;
use minductor::{compile, CompileError, Compiled};
use std::fmt;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ReportError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Run(#[from] RuntimeError),
    #[error("the fusion report needs the inductor backend's kernel program")]
    NoProgram,
}

/// One step of the compiled program: its cost rows (a GEMM and its epilogue are two) and its
/// median time.
#[derive(Clone, Debug)]
pub struct StepReport {
    pub costs: Vec<StepCost>,
    pub median: Duration,
    /// The vector width (bits) of each cost row on this CPU (`None`: scalar loops), from
    /// `codegen_cpu::lower::step_vector_bits`, which detects the CPU's features at run time.
    pub vector_bits: Vec<Option<u32>>,
}

#[derive(Clone, Debug)]
pub struct FusionReport {
    pub steps: Vec<StepReport>,
    pub arena_bytes: usize,
    pub compile: Duration,
    pub runs: usize,
    pub probe: Option<MachineProbe>,
}

/// Compiles `graph`, runs it `runs` times on `inputs` with per-step timing, and reports.
pub fn fusion_report(
    graph: &Graph,
    inputs: &[Tensor],
    runs: usize,
    probe: Option<MachineProbe>,
) -> Result<FusionReport, ReportError> {
    let compiled: Compiled = compile(graph)?;
    let program = compiled
        .artifacts()
        .program
        .clone()
        .ok_or(ReportError::NoProgram)?;
    let runs = runs.max(1);
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); program.steps.len()];
    compiled.call(inputs)?; // warm-up: first-touch of the arena and outputs
    for _ in 0..runs {
        let (_, timings) = compiled.profile(inputs)?;
        for (slot, t) in times.iter_mut().zip(timings) {
            slot.push(t.time);
        }
    }
    let mut costs = program_cost(&program).into_iter();
    let steps = program
        .steps
        .iter()
        .zip(times)
        .map(|(step, mut samples)| {
            let rows = match step {
                Step::Matmul(m) if m.epilogue.is_some() => 2,
                _ => 1,
            };
            samples.sort();
            StepReport {
                costs: costs.by_ref().take(rows).collect(),
                median: samples[samples.len() / 2],
                vector_bits: step_vector_bits(step, &program),
            }
        })
        .collect();
    Ok(FusionReport {
        steps,
        arena_bytes: compiled.arena_bytes(),
        compile: compiled.compile_time(),
        runs,
        probe,
    })
}

impl fmt::Display for FusionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "compiled in {:.2} ms; arena {} bytes; median of {} runs per step",
            self.compile.as_secs_f64() * 1e3,
            self.arena_bytes,
            self.runs
        )?;
        if let Some(p) = &self.probe {
            writeln!(
                f,
                "machine ({} threads): copy {:.1} GB/s, GEMM {:.1} GFLOP/s, FMA peak {:.1} GFLOP/s",
                p.threads,
                p.copy_gb_per_s,
                p.gemm_gflops_all_threads,
                p.compute_peak_gflops()
            )?;
        }
        writeln!(
            f,
            "{:<44} {:<7} {:>4} {:<26} {:>11} {:>11} {:>12} {:>9} {:>14} {:>7}",
            "step",
            "kind",
            "vec",
            "domain",
            "read B",
            "written B",
            "FLOPs",
            "ms",
            "achieved",
            "of peak"
        )?;
        let mut total = Duration::ZERO;
        for step in &self.steps {
            total += step.median;
            let seconds = step.median.as_secs_f64().max(1e-12);
            let bytes: u64 = step
                .costs
                .iter()
                .map(|c| c.bytes_read + c.bytes_written)
                .sum();
            let flops: u64 = step.costs.iter().map(|c| c.flops).sum();
            let gemm = step
                .costs
                .iter()
                .any(|c| matches!(c.kind, StepKind::Matmul | StepKind::Attention));
            let (achieved, fraction) = if gemm {
                let g = flops as f64 / seconds / 1e9;
                let peak = self.probe.as_ref().map(|p| g / p.compute_peak_gflops());
                (format!("{g:.1} GFLOP/s"), peak)
            } else {
                let g = bytes as f64 / seconds / 1e9;
                let peak = self.probe.as_ref().map(|p| g / p.copy_gb_per_s);
                (format!("{g:.1} GB/s"), peak)
            };
            for (i, c) in step.costs.iter().enumerate() {
                let kind = match c.kind {
                    StepKind::Matmul => "gemm",
                    StepKind::ScatterAdd => "scatter",
                    StepKind::Fallback => "fallbk",
                    StepKind::Attention => "attn",
                    StepKind::Kernel if i > 0 => "epilog",
                    StepKind::Kernel => "kernel",
                };
                let timing = if i == 0 {
                    format!(
                        "{:>9.3} {:>14} {:>7}",
                        seconds * 1e3,
                        achieved,
                        fraction.map_or("-".into(), |x| format!("{:.0}%", x * 100.0))
                    )
                } else {
                    format!("{:>9} {:>14} {:>7}", "", "", "")
                };
                let bits = step.vector_bits.get(i).copied().flatten();
                writeln!(
                    f,
                    "{:<44} {:<7} {:>4} {:<26} {:>11} {:>11} {:>12} {timing}",
                    c.name,
                    kind,
                    bits.map_or("-".into(), |b| b.to_string()),
                    c.domain_text(),
                    c.bytes_read,
                    c.bytes_written,
                    c.flops
                )?;
            }
        }
        writeln!(f, "total {:.3} ms", total.as_secs_f64() * 1e3)?;
        writeln!(f, "fused graph nodes:")?;
        for c in self.steps.iter().flat_map(|s| &s.costs) {
            writeln!(f, "  {}: {}", c.name, c.nodes_text())?;
        }
        Ok(())
    }
}
