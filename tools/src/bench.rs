//! The benchmark harness behind `minductor bench`: runs a [`Workload`] on the eager backend (the
//! reference interpreter) and the compiled one (inductor), checks that they agree, and reports
//! median times, speedup, cold compile time, peak heap bytes and achieved GB/s or GFLOP/s as a
//! fraction of the [`MachineProbe`]'s copy bandwidth or vector FMA peak.
//!
//! Timing: one untimed warmup call, then calls until the time budget is spent (at least
//! `min_iterations`), each timed alone; the median is reported. Outputs are dropped outside the
//! timed region.
//!
//! Peak bytes need a counting global allocator, which only a binary can install: the harness asks
//! a [`HeapMeter`] for the peak live heap bytes during one more call, above the bytes live before
//! it (so the inputs, already allocated, are not counted; the outputs, allocated by the call, are).
//! For the compiled backend the intermediates it keeps between calls
//! ([`Compiled::arena_bytes`](minductor::Compiled::arena_bytes)) are allocated before the call and are
//! added, so both figures mean "heap the backend needs to run this graph once".
//!
//! Agreement: every output element must satisfy |compiled − eager| ≤ 1e-3 · (1 + |eager|).

use crate::probe::MachineProbe;
use crate::workloads::{Bound, Workload};
use minductor::export::{CompiledProgram, ExportOptions, ExportedProgram};
use minductor::{
    compile_with, compile_with_options, Backend, CompileError, CompileOptions, Compiled, Mode,
    RuntimeError, Tensor,
};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Relative-and-absolute tolerance of the compiled-vs-eager check.
pub const TOLERANCE: f64 = 1e-3;

/// Peak live heap bytes, as a counting global allocator sees them.
pub trait HeapMeter {
    /// Starts a measurement: the peak becomes the current live bytes, which are returned.
    fn reset_peak(&self) -> usize;
    /// The highest live byte count since the last `reset_peak`.
    fn peak(&self) -> usize;
}

/// How long to time each backend of each workload.
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions {
    /// Stop timing a backend once this much time was spent on timed calls...
    pub budget: Duration,
    /// ...but never before this many timed calls.
    pub min_iterations: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            budget: Duration::from_secs(2),
            min_iterations: 3,
        }
    }
}

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("workload {workload}: {backend} failed to compile: {source}")]
    Compile {
        workload: String,
        backend: &'static str,
        /// Boxed: a compile error is large and rare.
        source: Box<CompileError>,
    },
    #[error("workload {workload}: {backend} failed to run: {source}")]
    Run {
        workload: String,
        backend: &'static str,
        source: RuntimeError,
    },
    #[error("workload {workload}: {backend}: {message}")]
    Program {
        workload: String,
        backend: &'static str,
        message: String,
    },
    #[error(
        "workload {workload}: compiled output {output} disagrees with eager at element {index}: \
         eager {expected}, compiled {found} (allowed |diff| ≤ {TOLERANCE}·(1 + |eager|))"
    )]
    Mismatch {
        workload: String,
        output: usize,
        index: usize,
        expected: f64,
        found: f64,
    },
    #[error(
        "workload {workload}: compiled output {output} has shape {found:?}, eager {expected:?}"
    )]
    ShapeMismatch {
        workload: String,
        output: usize,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("workload {workload}: compiled returned {found} outputs, eager {expected}")]
    OutputCount {
        workload: String,
        expected: usize,
        found: usize,
    },
    #[error("plot {path}: {message}")]
    Plot { path: String, message: String },
}

/// The figures of one backend on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct BackendResult {
    pub backend: &'static str,
    pub median_ms: f64,
    pub iterations: usize,
    /// Peak live heap bytes during one call above the bytes live before it (`None` without a
    /// meter), plus `kept_bytes`.
    pub peak_bytes: Option<u64>,
    /// Bytes kept allocated between calls (the compiled arena; 0 for eager).
    pub kept_bytes: u64,
    /// GB/s for memory-bound workloads, GFLOP/s for GEMM-dominated ones.
    pub achieved: f64,
    /// `achieved` over the probe's copy bandwidth or all-thread vector FMA peak (the best
    /// width's, [`MachineProbe::compute_peak_gflops`]).
    pub fraction_of_peak: f64,
}

/// One workload's results on both backends.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub name: String,
    /// "memory" (reported in GB/s) or "compute" (GFLOP/s).
    pub bound: &'static str,
    pub unit: &'static str,
    pub elements: usize,
    pub bytes_moved: u64,
    pub flops: u64,
    pub eager: BackendResult,
    pub compiled: BackendResult,
    /// eager median / compiled median.
    pub speedup: f64,
    /// Wall time of `compile_with(graph, inductor)`.
    pub compile_ms: f64,
    pub max_abs_error: f64,
    /// Names of the compiled program's kernels, in order.
    pub kernels: Vec<String>,
    /// Extern GEMM calls of the compiled program.
    pub gemms: usize,
    /// For a workload with gradients: bytes of the forward values the backward reads from
    /// memory (the partitioner's saved activations); `None` without a backward.
    pub saved_activation_bytes: Option<u64>,
}

/// Everything one `minductor bench` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub threads: usize,
    /// The compiled backend's mode (`default`, `reduce-overhead`, `max-autotune`).
    pub mode: String,
    pub probe: MachineProbe,
    pub workloads: Vec<WorkloadResult>,
    /// The pointwise and softmax sweeps (empty unless a plot was asked for).
    pub sweep: Vec<WorkloadResult>,
}

/// Compiles `workload` on both backends, checks agreement, and times both.
pub fn run_workload(
    workload: &Workload,
    probe: &MachineProbe,
    meter: Option<&dyn HeapMeter>,
    options: BenchOptions,
) -> Result<WorkloadResult, BenchError> {
    let mut prepared = PreparedWorkload::new(workload, Mode::Default)?;
    prepared.time_round(options)?;
    prepared.finish(probe, meter)
}

/// A workload compiled on both backends and checked, whose timed calls are gathered round by
/// round (`minductor bench --rounds`: the rounds of all workloads interleave, so a slow spell of
/// a shared machine spreads over every workload instead of falling on one).
pub struct PreparedWorkload<'w> {
    workload: &'w Workload,
    eager: Runner,
    compiled: Runner,
    compile_ms: f64,
    max_abs_error: f64,
    /// The median seconds of each round, per backend.
    eager_rounds: Vec<f64>,
    compiled_rounds: Vec<f64>,
    iterations: [usize; 2],
}

/// The options a bench compiles `backend` with: the inductor backend in `mode`, the eager
/// one (the reference every run is checked against) in the default mode.
fn options_for(backend: Backend, mode: Mode) -> CompileOptions {
    CompileOptions {
        backend,
        mode: if backend == Backend::Inductor {
            mode
        } else {
            Mode::Default
        },
        ..Default::default()
    }
}

impl<'w> PreparedWorkload<'w> {
    pub fn name(&self) -> &str {
        &self.workload.name
    }

    /// Compiles `workload` on both backends (the inductor one in `mode`), runs each once and
    /// checks that they agree.
    pub fn new(workload: &'w Workload, mode: Mode) -> Result<Self, BenchError> {
        let compile = |backend: Backend| {
            compile_with_options(&workload.graph, options_for(backend, mode)).map_err(|source| {
                BenchError::Compile {
                    workload: workload.name.clone(),
                    backend: backend.name(),
                    source: Box::new(source),
                }
            })
        };
        let eager = Runner::Graph(Box::new(compile(Backend::Eager)?));
        let compiled = Runner::Graph(Box::new(compile(Backend::Inductor)?));
        Self::checked(workload, eager, compiled)
    }

    /// A `.pt2` program (`workload.inputs` its user inputs) compiled with its weights frozen on
    /// the eager and the inductor backend, run once each and checked.
    pub fn from_program(
        workload: &'w Workload,
        program: &ExportedProgram,
        mode: Mode,
    ) -> Result<Self, BenchError> {
        let compile = |backend: Backend| {
            let options = ExportOptions {
                compile: options_for(backend, mode),
                ..Default::default()
            };
            program
                .compile_with_options(options)
                .map(|p| Runner::Program(Box::new(p), backend))
                .map_err(|e| BenchError::Program {
                    workload: workload.name.clone(),
                    backend: backend.name(),
                    message: format!("failed to compile: {e}"),
                })
        };
        let eager = compile(Backend::Eager)?;
        let compiled = compile(Backend::Inductor)?;
        Self::checked(workload, eager, compiled)
    }

    fn checked(
        workload: &'w Workload,
        eager: Runner,
        compiled: Runner,
    ) -> Result<Self, BenchError> {
        let compile_ms = compiled
            .compiled()
            .map_or(0.0, |c| c.compile_time().as_secs_f64() * 1e3);
        let expected = call(workload, &eager)?;
        let found = call(workload, &compiled)?;
        let max_abs_error = compare(&workload.name, &expected, &found)?;
        Ok(PreparedWorkload {
            workload,
            eager,
            compiled,
            compile_ms,
            max_abs_error,
            eager_rounds: Vec::new(),
            compiled_rounds: Vec::new(),
            iterations: [0, 0],
        })
    }

    /// One round: times each backend (a warm-up call, then calls until `options`' budget is
    /// spent) and keeps each one's median.
    pub fn time_round(&mut self, options: BenchOptions) -> Result<(), BenchError> {
        for (index, backend) in [&self.eager, &self.compiled].into_iter().enumerate() {
            let times = time_calls(self.workload, backend, options)?;
            self.iterations[index] += times.len();
            let median = times[times.len() / 2];
            if index == 0 {
                self.eager_rounds.push(median);
            } else {
                self.compiled_rounds.push(median);
            }
        }
        Ok(())
    }

    /// The figures, each backend's time the median of its rounds' medians.
    pub fn finish(
        self,
        probe: &MachineProbe,
        meter: Option<&dyn HeapMeter>,
    ) -> Result<WorkloadResult, BenchError> {
        let workload = self.workload;
        let median = |rounds: &[f64]| {
            let mut rounds = rounds.to_vec();
            rounds.sort_by(f64::total_cmp);
            rounds
                .get(rounds.len() / 2)
                .copied()
                .unwrap_or(0.0)
                .max(1e-12)
        };
        let eager_result = backend_result(
            workload,
            &self.eager,
            probe,
            meter,
            median(&self.eager_rounds),
            self.iterations[0],
        )?;
        let compiled_result = backend_result(
            workload,
            &self.compiled,
            probe,
            meter,
            median(&self.compiled_rounds),
            self.iterations[1],
        )?;
        let compiled = self.compiled.compiled();
        let program = compiled.and_then(|c| c.artifacts().program.as_ref());
        let saved_activation_bytes = compiled
            .and_then(|c| c.artifacts().partition.as_ref())
            .map(|p| p.saved_bytes());
        Ok(WorkloadResult {
            name: workload.name.clone(),
            bound: match workload.bound {
                Bound::Memory => "memory",
                Bound::Compute => "compute",
            },
            unit: unit(workload.bound),
            elements: workload.elements,
            bytes_moved: workload.bytes_moved,
            flops: workload.flops,
            speedup: eager_result.median_ms / compiled_result.median_ms,
            eager: eager_result,
            compiled: compiled_result,
            compile_ms: self.compile_ms,
            max_abs_error: self.max_abs_error,
            kernels: program.map_or(vec![], |p| p.kernels().map(|k| k.name.clone()).collect()),
            gemms: program.map_or(0, |p| {
                p.steps
                    .iter()
                    .filter(|s| {
                        use minductor::internals::kernel_ir::Step;
                        matches!(s, Step::Matmul(_) | Step::Attention(_))
                    })
                    .count()
            }),
            saved_activation_bytes,
        })
    }
}

fn unit(bound: Bound) -> &'static str {
    match bound {
        Bound::Memory => "GB/s",
        Bound::Compute => "GFLOP/s",
    }
}

/// What a backend runs: a compiled graph (on all of the workload's inputs) or a compiled `.pt2`
/// program (on its user inputs, the weights frozen in).
enum Runner {
    /// Boxed: a `Compiled` is large beside a program's handle.
    Graph(Box<Compiled>),
    Program(Box<CompiledProgram>, Backend),
}

impl Runner {
    fn backend(&self) -> Backend {
        match self {
            Runner::Graph(c) => c.backend(),
            Runner::Program(_, b) => *b,
        }
    }

    /// The compiled graph, where there is one (an interpreting backend on a program with
    /// symbolic sizes specializes per call and has none).
    fn compiled(&self) -> Option<&Compiled> {
        match self {
            Runner::Graph(c) => Some(c),
            Runner::Program(p, _) => p.compiled(),
        }
    }
}

fn call(workload: &Workload, runner: &Runner) -> Result<Vec<Tensor>, BenchError> {
    match runner {
        Runner::Graph(compiled) => {
            compiled
                .call(&workload.inputs)
                .map_err(|source| BenchError::Run {
                    workload: workload.name.clone(),
                    backend: compiled.backend().name(),
                    source,
                })
        }
        Runner::Program(program, backend) => {
            program
                .call(&workload.inputs)
                .map_err(|e| BenchError::Program {
                    workload: workload.name.clone(),
                    backend: backend.name(),
                    message: format!("failed to run: {e}"),
                })
        }
    }
}

/// The largest |found − expected| over all outputs, or the first element out of tolerance.
pub fn compare(workload: &str, expected: &[Tensor], found: &[Tensor]) -> Result<f64, BenchError> {
    if expected.len() != found.len() {
        return Err(BenchError::OutputCount {
            workload: workload.to_string(),
            expected: expected.len(),
            found: found.len(),
        });
    }
    let mut max_abs_error = 0f64;
    for (output, (e, f)) in expected.iter().zip(found).enumerate() {
        if e.shape() != f.shape() {
            return Err(BenchError::ShapeMismatch {
                workload: workload.to_string(),
                output,
                expected: e.shape().to_vec(),
                found: f.shape().to_vec(),
            });
        }
        for (index, (e, f)) in e.to_f64_vec().into_iter().zip(f.to_f64_vec()).enumerate() {
            let diff = (f - e).abs();
            // NaN fails: a NaN difference is not within any bound.
            let within = diff <= TOLERANCE * (1.0 + e.abs());
            if !within {
                return Err(BenchError::Mismatch {
                    workload: workload.to_string(),
                    output,
                    index,
                    expected: e,
                    found: f,
                });
            }
            max_abs_error = max_abs_error.max(diff);
        }
    }
    Ok(max_abs_error)
}

/// A warm-up call, then timed calls until the budget is spent (at least `min_iterations`):
/// their seconds, sorted.
fn time_calls(
    workload: &Workload,
    compiled: &Runner,
    options: BenchOptions,
) -> Result<Vec<f64>, BenchError> {
    drop(call(workload, compiled)?); // warmup
    let mut times = Vec::new();
    let mut spent = Duration::ZERO;
    while times.len() < options.min_iterations.max(1) || spent < options.budget {
        let start = Instant::now();
        let outputs = call(workload, compiled)?;
        let elapsed = start.elapsed();
        drop(outputs);
        spent += elapsed;
        times.push(elapsed.as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// A backend's figures from its median seconds (and its peak heap, measured now).
fn backend_result(
    workload: &Workload,
    compiled: &Runner,
    probe: &MachineProbe,
    meter: Option<&dyn HeapMeter>,
    median: f64,
    iterations: usize,
) -> Result<BackendResult, BenchError> {
    let kept_bytes = compiled.compiled().map_or(0, |c| c.arena_bytes()) as u64;
    let peak_bytes = match meter {
        Some(meter) => {
            // Outputs recycled from the block cache would not show as new heap: empty it first.
            minductor::internals::runtime::release_cached_blocks();
            let baseline = meter.reset_peak();
            let outputs = call(workload, compiled)?;
            let peak = meter.peak().saturating_sub(baseline) as u64;
            drop(outputs);
            Some(peak + kept_bytes)
        }
        None => None,
    };
    let (achieved, fraction_of_peak) = match workload.bound {
        Bound::Memory => {
            let gb_per_s = workload.bytes_moved as f64 / median / 1e9;
            (gb_per_s, gb_per_s / probe.copy_gb_per_s)
        }
        Bound::Compute => {
            let gflops = workload.flops as f64 / median / 1e9;
            (gflops, gflops / probe.compute_peak_gflops())
        }
    };
    Ok(BackendResult {
        backend: compiled.backend().name(),
        median_ms: median * 1e3,
        iterations,
        peak_bytes,
        kept_bytes,
        achieved,
        fraction_of_peak,
    })
}

/// How long one graph takes to compile (`minductor compile`).
#[derive(Clone, Debug, Serialize)]
pub struct CompileResult {
    pub name: String,
    /// Nodes of the traced graph.
    pub nodes: usize,
    /// Steps of the compiled program (kernels, GEMMs, attentions, fallbacks).
    pub steps: usize,
    /// Timed compiles (the median is reported).
    pub runs: usize,
    /// Median wall time of `compile_with(graph, inductor)`.
    pub median_ms: f64,
    /// `median_ms` per traced node, in microseconds.
    pub us_per_node: f64,
}

/// Compiles `workload`'s graph with the inductor backend `runs` times (at least once) and
/// reports the median wall time, as [`Compiled::compile_time`] measures it.
pub fn compile_benchmark(workload: &Workload, runs: usize) -> Result<CompileResult, BenchError> {
    let mut times = Vec::new();
    let mut steps = 0;
    for _ in 0..runs.max(1) {
        let compiled = compile_with(&workload.graph, Backend::Inductor).map_err(|source| {
            BenchError::Compile {
                workload: workload.name.clone(),
                backend: Backend::Inductor.name(),
                source: Box::new(source),
            }
        })?;
        times.push(compiled.compile_time().as_secs_f64() * 1e3);
        steps = compiled
            .artifacts()
            .program
            .as_ref()
            .map_or(0, |p| p.steps.len());
    }
    times.sort_by(f64::total_cmp);
    let median_ms = times[times.len() / 2];
    let nodes = workload.graph.nodes().len();
    Ok(CompileResult {
        name: workload.name.clone(),
        nodes,
        steps,
        runs: times.len(),
        median_ms,
        us_per_node: median_ms * 1e3 / nodes.max(1) as f64,
    })
}

/// Compile results as an aligned text table, one row per graph.
pub fn render_compile_table(results: &[CompileResult]) -> String {
    let mut out = format!(
        "{:<28}  {:>7}  {:>6}  {:>11}  {:>11}\n",
        "graph", "nodes", "steps", "compile ms", "us per node"
    );
    for r in results {
        let _ = writeln!(
            out,
            "{:<28}  {:>7}  {:>6}  {:>11.1}  {:>11.1}",
            r.name, r.nodes, r.steps, r.median_ms, r.us_per_node
        );
    }
    out
}

/// The probe's figures, one line each.
pub fn render_probe(probe: &MachineProbe) -> String {
    let fma: Vec<String> = probe
        .fma_peaks
        .iter()
        .map(|p| {
            format!(
                "{}-bit {:.1} ({:.1} on one)",
                p.bits, p.gflops_all_threads, p.gflops
            )
        })
        .collect();
    format!(
        "machine: {}\nprobe ({} threads): copy {:.1} GB/s (read+write, {} MiB buffers); \
         sgemm {}³ {:.1} GFLOP/s on one thread, {:.1} GFLOP/s on all {} threads\n\
         FMA peak GFLOP/s on all threads: {} (\"of peak\" for GEMM workloads: {:.1})\n",
        probe.machine,
        probe.threads,
        probe.copy_gb_per_s,
        probe.copy_bytes >> 20,
        probe.gemm_size,
        probe.gemm_gflops,
        probe.gemm_gflops_all_threads,
        probe.threads,
        if fma.is_empty() {
            "none".to_string()
        } else {
            fma.join(", ")
        },
        probe.compute_peak_gflops(),
    )
}

/// The results as an aligned text table, one row per workload.
pub fn render_table(results: &[WorkloadResult]) -> String {
    let header = [
        "workload",
        "eager ms",
        "compiled ms",
        "speedup",
        "compile ms",
        "eager peak",
        "compiled peak (kept)",
        "eager achieved",
        "compiled achieved",
        "of peak",
        "steps",
        "saved activations",
        "max abs err",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let peak = |b: &BackendResult| b.peak_bytes.map_or("-".to_string(), format_bytes);
            vec![
                r.name.clone(),
                format!("{:.3}", r.eager.median_ms),
                format!("{:.3}", r.compiled.median_ms),
                format!("{:.2}x", r.speedup),
                format!("{:.1}", r.compile_ms),
                peak(&r.eager),
                format!(
                    "{} ({})",
                    peak(&r.compiled),
                    format_bytes(r.compiled.kept_bytes)
                ),
                format!("{:.1} {}", r.eager.achieved, r.unit),
                format!("{:.1} {}", r.compiled.achieved, r.unit),
                format!("{:.0}%", r.compiled.fraction_of_peak * 100.0),
                format!("{}k+{}g", r.kernels.len(), r.gemms),
                r.saved_activation_bytes
                    .map_or("-".to_string(), format_bytes),
                format!("{:.1e}", r.max_abs_error),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = w - cell.chars().count();
            if i == 0 {
                let _ = write!(out, "{cell}{}", " ".repeat(pad));
            } else {
                let _ = write!(out, "  {}{cell}", " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(&header.map(String::from));
    for row in &rows {
        line(row);
    }
    out
}

/// Bytes in B, KiB, MiB or GiB with one decimal.
pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..=1023 => format!("{bytes} B"),
        1024..=1048575 => format!("{:.1} KiB", b / 1024.0),
        1048576..=1073741823 => format!("{:.1} MiB", b / 1048576.0),
        _ => format!("{:.2} GiB", b / 1073741824.0),
    }
}

/// A count with an SI suffix: 4096 → "4.1k", 1048576 → "1M".
fn format_count(x: f64) -> String {
    let (value, suffix) = match x {
        x if x >= 1e9 => (x / 1e9, "G"),
        x if x >= 1e6 => (x / 1e6, "M"),
        x if x >= 1e3 => (x / 1e3, "k"),
        x => (x, ""),
    };
    let text = format!("{value:.1}");
    format!("{}{suffix}", text.trim_end_matches(".0"))
}

/// Writes an SVG plot of speedup (eager ms / compiled ms) against elements, one line per family
/// of `sweep` (workload names up to their last `_`).
pub fn plot_speedup(
    sweep: &[WorkloadResult],
    threads: usize,
    path: &Path,
) -> Result<(), BenchError> {
    use plotters::prelude::*;
    let plot_error = |message: String| BenchError::Plot {
        path: path.display().to_string(),
        message,
    };
    let mut families: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in sweep {
        let family = r.name.rsplit_once('_').map_or(&*r.name, |(f, _)| f);
        let point = (r.elements as f64, r.speedup);
        match families.iter_mut().find(|(f, _)| f == family) {
            Some((_, points)) => points.push(point),
            None => families.push((family.to_string(), vec![point])),
        }
    }
    let all = || families.iter().flat_map(|(_, p)| p.iter().copied());
    let (x_min, x_max) = all().fold((f64::MAX, 0f64), |(lo, hi), (x, _)| (lo.min(x), hi.max(x)));
    let y_max = all().fold(1f64, |hi, (_, y)| hi.max(y));
    if families.is_empty() {
        return Err(plot_error("no sweep results to plot".into()));
    }

    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("compiled vs eager speedup over size ({threads} threads)"),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min / 1.5..x_max * 1.5).log_scale(), 0f64..y_max * 1.15)
        .map_err(|e| plot_error(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("elements (log scale)")
        .y_desc("speedup (eager ms / compiled ms)")
        .x_label_formatter(&|x| format_count(*x))
        .draw()
        .map_err(|e| plot_error(e.to_string()))?;
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        GREEN,
        MAGENTA,
    ];
    for (i, (family, points)) in families.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| plot_error(e.to_string()))?
            .label(family.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(PointSeries::of_element(
                points.iter().copied(),
                4,
                color,
                &|c, s, st| Circle::new(c, s, st.filled()),
            ))
            .map_err(|e| plot_error(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| plot_error(e.to_string()))?;
    root.present().map_err(|e| plot_error(e.to_string()))?;
    Ok(())
}

/// Writes an SVG plot of the compiled backend's speedup over threads (its median at the first
/// thread count over its median at each), one line per workload; `runs[i]` holds the results at
/// `threads[i]`.
pub fn plot_thread_scaling(
    threads: &[usize],
    runs: &[Vec<WorkloadResult>],
    path: &Path,
) -> Result<(), BenchError> {
    use plotters::prelude::*;
    let plot_error = |message: String| BenchError::Plot {
        path: path.display().to_string(),
        message,
    };
    let (Some(&first), Some(&last)) = (threads.first(), threads.last()) else {
        return Err(plot_error("no thread counts to plot".into()));
    };
    let names: Vec<&str> = runs
        .first()
        .map(|r| r.iter().map(|w| w.name.as_str()).collect())
        .unwrap_or_default();
    let series: Vec<Vec<(f64, f64)>> = names
        .iter()
        .enumerate()
        .map(|(i, _)| {
            let base = runs[0][i].compiled.median_ms;
            threads
                .iter()
                .zip(runs)
                .map(|(&t, r)| (t as f64, base / r[i].compiled.median_ms.max(1e-12)))
                .collect()
        })
        .collect();
    let top = series
        .iter()
        .flatten()
        .map(|&(_, y)| y)
        .fold(last as f64 / first as f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("compiled speedup over threads", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(first as f64..last as f64, 0f64..top)
        .map_err(|e| plot_error(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc(format!("median at {first} thread(s) / median"))
        .draw()
        .map_err(|e| plot_error(e.to_string()))?;
    chart
        .draw_series(LineSeries::new(
            threads.iter().map(|&t| (t as f64, t as f64 / first as f64)),
            BLACK.mix(0.3),
        ))
        .map_err(|e| plot_error(e.to_string()))?
        .label("linear")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.mix(0.3)));
    for (i, (name, points)) in names.iter().zip(series).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color))
            .map_err(|e| plot_error(e.to_string()))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| plot_error(e.to_string()))?;
    root.present().map_err(|e| plot_error(e.to_string()))?;
    Ok(())
}

/// Median milliseconds of `runs` calls of `graph` compiled (with `minductor::compile`) on
/// `inputs`, after 3 warm-up calls: the examples' measure of one graph.
pub fn median_call_ms(
    graph: &minductor::Graph,
    inputs: &[minductor::Tensor],
    runs: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let compiled = minductor::compile(graph)?;
    for _ in 0..3 {
        compiled.call(inputs)?;
    }
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let started = std::time::Instant::now();
        compiled.call(inputs)?;
        ms.push(started.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}
