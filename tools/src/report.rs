//! The fusion report: what the compiler made of a graph, kernel by kernel, and how fast each
//! kernel ran against what this machine can do.
//!
//! For every step of the compiled program (a kernel, or a GEMM with its epilogue) it lists the
//! graph nodes fused, the iteration domain, bytes read and written and FLOPs (from
//! `passes::program_cost`), and, after running the graph, the median time per step
//! (`Compiled::profile`) with the achieved GB/s (GFLOP/s for GEMMs) as a fraction of the probe's
//! copy bandwidth (GEMM peak over all threads), and the vector width (bits) each runs at on this
//! CPU (`codegen_cpu::lower::step_vector_bits`), marked `nt` where its stores bypass the caches
//! (non-temporal: an output too large for the last-level cache; `step_forms`).

use crate::probe::MachineProbe;
use minductor::internals::codegen_cpu::lower::step_forms;
use minductor::internals::kernel_ir::cost::{program_cost, StepCost, StepKind};
use minductor::internals::kernel_ir::Step;
use minductor::internals::runtime::{RuntimeError, Tensor};
use minductor::Graph;
use minductor::{compile_with_options, CompileError, CompileOptions, Compiled, Mode};
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
    /// Whether each cost row's stores bypass the caches (`codegen_cpu::lower::step_forms`).
    pub streams: Vec<bool>,
    /// For a GEMM with an epilogue: the median time of its product alone
    /// (`Compiled::profile_products`), so that the step's time splits into the product's and
    /// the epilogue's.
    pub product: Option<Duration>,
}

#[derive(Clone, Debug)]
pub struct FusionReport {
    pub steps: Vec<StepReport>,
    pub arena_bytes: usize,
    pub compile: Duration,
    pub runs: usize,
    pub probe: Option<MachineProbe>,
    /// Max-autotune's choice for each step it tuned (its name, the choice's name); empty in
    /// the other modes.
    pub autotune: Vec<(String, String)>,
}

/// Compiles `graph`, runs it `runs` times on `inputs` with per-step timing, and reports.
pub fn fusion_report(
    graph: &Graph,
    inputs: &[Tensor],
    runs: usize,
    probe: Option<MachineProbe>,
) -> Result<FusionReport, ReportError> {
    let mut timer = StepTimer::new(graph)?;
    timer.time(inputs, runs)?;
    Ok(timer.finish(probe))
}

/// `graph` compiled in `mode`, and its kernel program.
fn compile_program(
    graph: &Graph,
    mode: Mode,
) -> Result<(Compiled, minductor::internals::kernel_ir::Program), ReportError> {
    let options = CompileOptions {
        mode,
        ..CompileOptions::default()
    };
    let compiled: Compiled = compile_with_options(graph, options)?;
    let program = compiled
        .artifacts()
        .program
        .clone()
        .ok_or(ReportError::NoProgram)?;
    Ok((compiled, program))
}

/// How long [`StepTimer::time`] calls the program before timing it. On the 2-core VM a pool
/// just started ran single-kernel programs at 2 threads no faster than at 1 for its first tens
/// of milliseconds (softmax_4096x1024's kernel: 1.3-1.7 ms in a report of 20 runs, 0.87 ms
/// in the bench's second of calls); a quarter second of calls first brings the report to the
/// bench's figures.
pub const WARM_UP: Duration = Duration::from_millis(250);

/// A compiled graph and the per-step times of its runs so far: [`StepTimer::time`] may be
/// called in several rounds (interleaved with other timers, at other thread counts), and the
/// report takes each step's median over every run.
pub struct StepTimer {
    compiled: Compiled,
    program: minductor::internals::kernel_ir::Program,
    times: Vec<Vec<Duration>>,
    /// Each step's times with the GEMMs' epilogues left out.
    products: Vec<Vec<Duration>>,
}

impl StepTimer {
    /// Compiles `graph` (at the thread count set now).
    pub fn new(graph: &Graph) -> Result<StepTimer, ReportError> {
        StepTimer::new_in(graph, Mode::Default)
    }

    /// Compiles `graph` in `mode` (at the thread count set now: max-autotune tunes for it).
    pub fn new_in(graph: &Graph, mode: Mode) -> Result<StepTimer, ReportError> {
        let (compiled, program) = compile_program(graph, mode)?;
        let times = vec![Vec::new(); program.steps.len()];
        Ok(StepTimer {
            compiled,
            program,
            products: times.clone(),
            times,
        })
    }

    /// Warm-up calls (first touch of the arena and outputs, the pool's threads) for at least
    /// [`WARM_UP`] and one call, then `runs` timed runs.
    pub fn time(&mut self, inputs: &[Tensor], runs: usize) -> Result<(), ReportError> {
        let started = std::time::Instant::now();
        loop {
            self.compiled.call(inputs)?;
            if started.elapsed() >= WARM_UP {
                break;
            }
        }
        let epilogues = (self.program.steps.iter())
            .any(|s| matches!(s, Step::Matmul(m) if m.epilogue.is_some()));
        for _ in 0..runs.max(1) {
            let (_, timings) = self.compiled.profile(inputs)?;
            for (slot, t) in self.times.iter_mut().zip(timings) {
                slot.push(t.time);
            }
            // The products alone, alternated with the whole steps (a run whose later steps read
            // what no epilogue wrote; only the GEMMs' times are kept). Such a run can fail where
            // a later step checks values no epilogue wrote (indices): the column is then left
            // out, not the report.
            if epilogues {
                if let Ok(timings) = self.compiled.profile_products(inputs) {
                    for (slot, t) in self.products.iter_mut().zip(timings) {
                        slot.push(t.time);
                    }
                }
            }
        }
        Ok(())
    }

    /// The report: each step's median over every timed run.
    pub fn finish(self, probe: Option<MachineProbe>) -> FusionReport {
        let program = &self.program;
        let runs = self.times.first().map_or(0, Vec::len);
        let mut costs = program_cost(program).into_iter();
        let steps = program
            .steps
            .iter()
            .zip(self.times)
            .zip(self.products)
            .map(|((step, mut samples), mut products)| {
                let rows = match step {
                    Step::Matmul(m) if m.epilogue.is_some() => 2,
                    _ => 1,
                };
                samples.sort();
                products.sort();
                let product = (rows == 2)
                    .then(|| products.get(products.len() / 2).copied())
                    .flatten();
                let (vector_bits, streams) = step_forms(step, program).into_iter().unzip();
                StepReport {
                    costs: costs.by_ref().take(rows).collect(),
                    median: samples.get(samples.len() / 2).copied().unwrap_or_default(),
                    vector_bits,
                    streams,
                    product,
                }
            })
            .collect();
        FusionReport {
            steps,
            arena_bytes: self.compiled.arena_bytes(),
            compile: self.compiled.compile_time(),
            runs,
            probe,
            autotune: self
                .compiled
                .artifacts()
                .autotune
                .iter()
                .map(|(step, choice)| (step.clone(), choice.name()))
                .collect(),
        }
    }
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
        if !self.autotune.is_empty() {
            let chosen: Vec<String> = self
                .autotune
                .iter()
                .map(|(step, choice)| format!("{step} {choice}"))
                .collect();
            writeln!(f, "max-autotune chose: {}", chosen.join(", "))?;
        }
        writeln!(
            f,
            "{:<44} {:<7} {:>6} {:<26} {:>11} {:>11} {:>12} {:>9} {:>14} {:>7} {:>17}",
            "step",
            "kind",
            "vec",
            "domain",
            "read B",
            "written B",
            "FLOPs",
            "ms",
            "achieved",
            "of peak",
            "product: ms, peak"
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
                // A GEMM with an epilogue: its product alone, and that product's share of the
                // peak (the rest of the step's time is the epilogue's).
                let product = match (step.product, &self.probe) {
                    (Some(t), probe) if i == 0 => {
                        let s = t.as_secs_f64().max(1e-12);
                        let g = step.costs[0].flops as f64 / s / 1e9;
                        let peak = probe.as_ref().map_or("-".into(), |p| {
                            format!("{:.0}%", g / p.compute_peak_gflops() * 100.0)
                        });
                        format!(" {:>9.3} {peak:>7}", s * 1e3)
                    }
                    _ => String::new(),
                };
                let timing = if i == 0 {
                    format!(
                        "{:>9.3} {:>14} {:>7}{product}",
                        seconds * 1e3,
                        achieved,
                        fraction.map_or("-".into(), |x| format!("{:.0}%", x * 100.0))
                    )
                } else {
                    format!("{:>9} {:>14} {:>7}", "", "", "")
                };
                let bits = step.vector_bits.get(i).copied().flatten();
                let streams = step.streams.get(i).copied().unwrap_or(false);
                writeln!(
                    f,
                    "{:<44} {:<7} {:>6} {:<26} {:>11} {:>11} {:>12} {timing}",
                    c.name,
                    kind,
                    bits.map_or("-".into(), |b| {
                        format!("{b}{}", if streams { "nt" } else { "" })
                    }),
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

/// The rates of the reference core the partition report estimates one-thread times with: a
/// core of a current server at 1 thread (its GEMM reaches ~100 GFLOP/s; a stream of 20 GB/s).
/// Fixed, not measured, so the steps a test selects by their work do not depend on the machine
/// it runs on.
pub const REFERENCE_GFLOPS: f64 = 100.0;
pub const REFERENCE_GB_PER_S: f64 = 20.0;

/// One step of a [`PartitionReport`]: its static cost and how it splits at each thread count.
#[derive(Clone, Debug)]
pub struct PartitionRow {
    pub name: String,
    /// The step's cost rows (a GEMM and its epilogue are two).
    pub costs: Vec<StepCost>,
    /// One per thread count of the report, in its order.
    pub partitions: Vec<minductor::StepPartition>,
}

impl PartitionRow {
    /// The step's time on one thread of the reference core ([`reference_ms`] of its costs).
    pub fn reference_ms(&self) -> f64 {
        reference_ms(&self.costs)
    }
}

/// The time of cost rows `costs` on one thread of the reference core, from the cost model: the
/// longer of their FLOPs at [`REFERENCE_GFLOPS`] and their bytes at [`REFERENCE_GB_PER_S`], in
/// ms.
pub fn reference_ms(costs: &[StepCost]) -> f64 {
    let flops: u64 = costs.iter().map(|c| c.flops).sum();
    let bytes: u64 = costs.iter().map(|c| c.bytes_read + c.bytes_written).sum();
    (flops as f64 / (REFERENCE_GFLOPS * 1e6)).max(bytes as f64 / (REFERENCE_GB_PER_S * 1e6))
}

/// How every step of a compiled graph splits across threads at several thread counts, by the
/// executor's own rules (`Compiled::partition`), without running any kernel.
#[derive(Clone, Debug)]
pub struct PartitionReport {
    pub threads: Vec<usize>,
    pub steps: Vec<PartitionRow>,
}

/// Compiles `graph` and asks it how a call on `inputs` splits at each of `threads`.
pub fn partition_report(
    graph: &Graph,
    inputs: &[Tensor],
    threads: &[usize],
) -> Result<PartitionReport, ReportError> {
    let (compiled, program) = compile_program(graph, Mode::Default)?;
    let mut per_count = Vec::with_capacity(threads.len());
    for &t in threads {
        per_count.push(compiled.partition(inputs, t)?);
    }
    let mut costs = program_cost(&program).into_iter();
    let steps = program
        .steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            let rows = match step {
                Step::Matmul(m) if m.epilogue.is_some() => 2,
                _ => 1,
            };
            let partitions: Vec<minductor::StepPartition> =
                per_count.iter().map(|p| p[index].clone()).collect();
            PartitionRow {
                name: partitions
                    .first()
                    .map_or_else(String::new, |p| p.name.clone()),
                costs: costs.by_ref().take(rows).collect(),
                partitions,
            }
        })
        .collect();
    Ok(PartitionReport {
        threads: threads.to_vec(),
        steps,
    })
}

impl fmt::Display for PartitionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "partition by the executor's rules (no kernel run); ref ms: the cost model's time on \
             one reference core ({REFERENCE_GFLOPS} GFLOP/s, {REFERENCE_GB_PER_S} GB/s); \
             imbalance: largest piece / mean piece; sched: slowest thread / perfect split, \
             each thread its own share of the pieces, then stealing, as the team runs them"
        )?;
        write!(f, "{:<44} {:>9} {:>14}", "step", "ref ms", "work")?;
        for t in &self.threads {
            write!(
                f,
                " | {:>4} thr: {:>6} {:>9} {:>6}",
                t, "pieces", "imbalance", "sched"
            )?;
        }
        writeln!(f)?;
        for step in &self.steps {
            let work = step.partitions.first().map_or(0, |p| p.total());
            write!(
                f,
                "{:<44} {:>9.3} {:>14}",
                step.name,
                step.reference_ms(),
                work
            )?;
            for (p, &t) in step.partitions.iter().zip(&self.threads) {
                write!(
                    f,
                    " | {:>9} {:>6} {:>9.3} {:>6.3}",
                    "",
                    p.pieces.len(),
                    p.imbalance(),
                    p.schedule_overhead(t)
                )?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// Per-step median times of one graph at several thread counts, side by side.
#[derive(Clone, Debug)]
pub struct ScalingReport {
    pub threads: Vec<usize>,
    /// One fusion report per thread count, in `threads`' order (same program, same steps).
    pub reports: Vec<FusionReport>,
}

impl fmt::Display for ScalingReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(first) = self.reports.first() else {
            return Ok(());
        };
        write!(f, "{:<44} {:>12}", "step", "FLOPs")?;
        for t in &self.threads {
            write!(f, " {:>9}", format!("ms@{t}"))?;
        }
        for t in self.threads.iter().skip(1) {
            write!(f, " {:>9}", format!("x@{t}"))?;
        }
        writeln!(f)?;
        let mut totals = vec![Duration::ZERO; self.reports.len()];
        for (i, step) in first.steps.iter().enumerate() {
            let name = step.costs.first().map_or("", |c| c.name.as_str());
            let flops: u64 = step.costs.iter().map(|c| c.flops).sum();
            write!(f, "{:<44} {:>12}", name, flops)?;
            let times: Vec<Duration> = self.reports.iter().map(|r| r.steps[i].median).collect();
            for (total, t) in totals.iter_mut().zip(&times) {
                *total += *t;
                write!(f, " {:>9.3}", t.as_secs_f64() * 1e3)?;
            }
            for t in times.iter().skip(1) {
                write!(
                    f,
                    " {:>9.2}",
                    times[0].as_secs_f64() / t.as_secs_f64().max(1e-12)
                )?;
            }
            writeln!(f)?;
        }
        write!(f, "{:<44} {:>12}", "total", "")?;
        for t in &totals {
            write!(f, " {:>9.3}", t.as_secs_f64() * 1e3)?;
        }
        for t in totals.iter().skip(1) {
            write!(
                f,
                " {:>9.2}",
                totals[0].as_secs_f64() / t.as_secs_f64().max(1e-12)
            )?;
        }
        writeln!(f)
    }
}
