//! The `minductor` command line: `minductor golden DIR` runs PyTorch reference cases;
//! `minductor bench` runs the benchmark suite (or, with `--pt2`, the `.pt2` cases) on the eager
//! and the compiled backend;
//! `minductor compile` times compiles of the GPT-style decoder at several depths.
//! `minductor pt2 info|run|compile MODEL.pt2` imports programs saved by `torch.export`.

use clap::{Parser, Subcommand};
use minductor::Backend;
use minductor_tools::bench::{
    plot_speedup, plot_thread_scaling, render_probe, render_table, run_workload, BenchOptions,
    PreparedWorkload, Report,
};
use minductor_tools::golden::{default_golden_dir, run_golden};
use minductor_tools::heap::{AllocatorMeter, CountingAllocator};
use minductor_tools::probe::{load_or_measure, Origin};
use minductor_tools::pt2;
use minductor_tools::workloads::{self, Workload, WorkloadError, SUITE};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[derive(Parser)]
#[command(
    name = "minductor",
    about = "torch.compile's pipeline in Rust for CPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every case of DIR/manifest.json on each backend and compare with PyTorch's outputs.
    Golden {
        /// Folder holding manifest.json and the .safetensors files (default: ../shared/golden).
        dir: Option<PathBuf>,
        /// Comma-separated backends to run.
        #[arg(long, default_value = "eager,inductor")]
        backends: String,
    },
    /// Run the benchmark suite on the eager and the compiled backend and print a table.
    Bench {
        /// Workloads to run, comma-separated (default: the whole suite; with --pt2, case names).
        #[arg(long)]
        workload: Option<String>,
        /// Instead of the suite, time every case of DIR/manifest.json (programs saved by
        /// `torch.export`; default DIR: ../shared/exported): compiled with the inductor backend,
        /// weights frozen, against minductor eager, at the stored input sizes.
        #[arg(long, value_name = "DIR")]
        pt2: Option<Option<PathBuf>>,
        /// Threads the compiled kernels and the probe use, a comma-separated list: one table per
        /// count (default: one per physical core).
        #[arg(long)]
        threads: Option<String>,
        /// Write every figure as JSON to this file (with several thread counts, one file per
        /// count: `NAME.tN.json`).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Plot (SVG): with one thread count, also run the pointwise and softmax size sweeps and
        /// plot speedup over size; with several, the compiled speedup over threads.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Seconds of timed calls per backend and workload (at least 3 calls each), spread over
        /// the rounds.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Rounds of timing: every workload is timed once per round, rounds interleaved, and
        /// each backend's time is the median of its rounds' medians.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// Measure the machine probe again instead of reading its cache.
        #[arg(long)]
        reprobe: bool,
        /// The compiled backend's mode: default, reduce-overhead or max-autotune (which tunes
        /// each step at each thread count while compiling).
        #[arg(long, default_value = "default")]
        mode: String,
    },
    /// Time compiles: the GPT-style decoder at several depths (and, with --suite, the suite's
    /// workloads), printing graph nodes, the median compile time and microseconds per node.
    Compile {
        /// Decoder depths to compile, comma-separated.
        #[arg(long, default_value = "2,8,32,96")]
        layers: String,
        /// Timed compiles per graph (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also compile every workload of the suite.
        #[arg(long)]
        suite: bool,
        /// Also compile the decoder's SGD training step (autodiff and partition) at each depth.
        #[arg(long)]
        train: bool,
        /// Write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Compile one workload of the suite and print its fusion report: the kernel table, then
    /// each step's median time and achieved bandwidth (GFLOP/s for GEMMs) against the probe.
    Report {
        /// A workload name (see `bench`), or with --pt2 a case of the manifest.
        workload: String,
        /// The workload is a `.pt2` case of DIR/manifest.json (default ../shared/exported),
        /// compiled with its weights as inputs, at the stored input sizes.
        #[arg(long, value_name = "DIR")]
        pt2: Option<Option<PathBuf>>,
        /// Threads the kernels and the probe use, a comma-separated list: with several, each
        /// step's median time at every count side by side (default: one per physical core).
        #[arg(long)]
        threads: Option<String>,
        /// Timed runs per step (the median is reported).
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Rounds of timing: each round times `runs` runs at every thread count in turn, and
        /// each step's median is over all its runs (so a slow moment of a noisy machine falls
        /// on every count alike).
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// Print how each step would split at these thread counts (comma-separated), by the
        /// executor's own rules, without running any kernel, instead of timing.
        #[arg(long)]
        simulate_threads: Option<String>,
        /// The compile mode: default, reduce-overhead or max-autotune (which times each step's
        /// splits, GEMM plans and attention tilings at each thread count and lists its
        /// choices).
        #[arg(long, default_value = "default")]
        mode: String,
    },
    /// Programs saved by `torch.export.save` (`.pt2`): inspect, run or compile them.
    Pt2 {
        #[command(subcommand)]
        command: Pt2Command,
    },
}

#[derive(Subcommand)]
enum Pt2Command {
    /// The signature, dynamic dims and their ranges, op counts, and which ops cannot be imported.
    Info { model: PathBuf },
    /// Run the program on the user inputs of a safetensors file (named as the program's inputs);
    /// write the user outputs as `out0`, `out1`, ...
    Run {
        model: PathBuf,
        #[arg(long)]
        inputs: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// eager, aot_eager or inductor.
        #[arg(long, default_value = "inductor")]
        backend: String,
    },
    /// Compile with the inductor backend, weights frozen, and save one self-contained artifact
    /// (`minductor::load`, the C ABI's `minductor_load`).
    Compile {
        model: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Pt2 { command } => {
            let result = match command {
                Pt2Command::Info { model } => pt2::info(&model),
                Pt2Command::Run {
                    model,
                    inputs,
                    out,
                    backend,
                } => match backend.parse::<Backend>() {
                    Ok(b) => pt2::run(&model, &inputs, &out, b),
                    Err(e) => Err(e.to_string()),
                },
                Pt2Command::Compile { model, output } => pt2::compile_artifact(&model, &output),
            };
            match result {
                Ok(text) => {
                    println!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Report {
            workload,
            pt2,
            threads,
            runs,
            rounds,
            simulate_threads,
            mode,
        } => match report(
            &workload,
            pt2,
            threads,
            runs,
            rounds,
            simulate_threads,
            &mode,
        ) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Compile {
            layers,
            runs,
            suite,
            train,
            json,
        } => match compile_bench(&layers, runs, suite, train, json) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Bench {
            workload,
            pt2,
            threads,
            json,
            plot,
            seconds,
            rounds,
            reprobe,
            mode,
        } => match bench(
            workload, pt2, threads, json, plot, seconds, rounds, reprobe, &mode,
        ) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Golden { dir, backends } => {
            let backends: Result<Vec<Backend>, _> =
                backends.split(',').map(|b| b.trim().parse()).collect();
            let backends = match backends {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let dir = dir.unwrap_or_else(default_golden_dir);
            match run_golden(&dir, &backends) {
                Ok(report) => {
                    print!("{}", report.render());
                    if report.failed() == 0 {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// A comma-separated list of thread counts, each at least 1.
fn thread_list(flag: &str, text: &str) -> Result<Vec<usize>, Box<dyn std::error::Error>> {
    let counts: Vec<usize> = text
        .split(',')
        .map(|n| {
            n.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("{flag} takes thread counts of at least 1, found {n:?}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(counts)
}

fn report(
    name: &str,
    pt2: Option<Option<PathBuf>>,
    threads: Option<String>,
    runs: usize,
    rounds: usize,
    simulate: Option<String>,
    mode: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mode: minductor::Mode = mode.parse()?;
    if rounds == 0 {
        return Err("--rounds must be at least 1, found 0".into());
    }
    let workload = match pt2 {
        Some(dir) => {
            let dir = dir.unwrap_or_else(pt2::default_exported_dir);
            let Some(case) = pt2::pt2_workloads(&dir, Some(&[name.to_string()]))?.pop() else {
                return Err(format!("no case `{name}`").into());
            };
            // The graph takes the weights after the user inputs.
            let mut workload = case.workload;
            let weights = case.program.weights().iter().map(|w| w.tensor.clone());
            workload.inputs.extend(weights);
            workload
        }
        None => workloads::by_name(name)?,
    };
    if let Some(list) = simulate {
        let counts = thread_list("--simulate-threads", &list)?;
        let report =
            minductor_tools::report::partition_report(&workload.graph, &workload.inputs, &counts)?;
        println!("{}: {}", workload.name, report);
        return Ok(());
    }
    let counts = match threads {
        Some(list) => thread_list("--threads", &list)?,
        None => vec![0],
    };
    // One compiled program per count, then the rounds: every count timed once per round.
    let mut timers = Vec::new();
    for &count in &counts {
        minductor::set_num_threads(count)?;
        let threads = minductor::num_threads();
        let (probe, origin) = load_or_measure(threads, false)?;
        if let Origin::Contended(cpus) = origin {
            eprintln!(
                "probe ({threads} threads): measured while other processes kept {cpus:.2} CPUs \
                 busy, not saved: its peaks may be low"
            );
        }
        let timer = minductor_tools::report::StepTimer::new_in(&workload.graph, mode)?;
        timers.push((count, threads, probe, timer));
    }
    for round in 0..rounds {
        for (count, _, _, timer) in &mut timers {
            if rounds > 1 {
                eprintln!("round {}/{rounds}: {count} threads ...", round + 1);
            }
            minductor::set_num_threads(*count)?;
            timer.time(&workload.inputs, runs)?;
        }
    }
    let mut reports = Vec::new();
    for (_, threads, probe, timer) in timers {
        let report = timer.finish(Some(probe));
        println!("{} at {threads} threads: {}", workload.name, report);
        reports.push(report);
    }
    if counts.len() > 1 {
        let scaling = minductor_tools::report::ScalingReport {
            threads: counts,
            reports,
        };
        println!(
            "{}: per-step median ms at each thread count, and speedup over the first\n{scaling}",
            workload.name
        );
    }
    Ok(())
}

fn compile_bench(
    layers: &str,
    runs: usize,
    suite: bool,
    train: bool,
    json: Option<PathBuf>,
) -> Result<(), Box<dyn std::error::Error>> {
    let depths: Vec<usize> = layers
        .split(',')
        .map(|l| {
            l.trim()
                .parse()
                .map_err(|e| format!("--layers: `{}` is not a layer count: {e}", l.trim()))
        })
        .collect::<Result<_, _>>()?;
    let mut graphs = Vec::new();
    for &n in &depths {
        graphs.push(workloads::gpt_decoder(n)?);
    }
    if train {
        for &n in &depths {
            graphs.push(workloads::gpt_decoder_train_step(n, 1e-3)?);
        }
    }
    if suite {
        for name in SUITE {
            graphs.push(workloads::by_name(name)?);
        }
    }
    let mut results = Vec::new();
    for workload in &graphs {
        eprintln!("compiling {} ...", workload.name);
        results.push(minductor_tools::bench::compile_benchmark(workload, runs)?);
    }
    println!(
        "median of {} compiles each (wall time of compile_with, inductor)",
        runs.max(1)
    );
    print!("{}", minductor_tools::bench::render_compile_table(&results));
    if let Some(path) = &json {
        std::fs::write(path, serde_json::to_string_pretty(&results)? + "\n")
            .map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("json: {}", path.display());
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bench(
    workload: Option<String>,
    pt2: Option<Option<PathBuf>>,
    threads: Option<String>,
    json: Option<PathBuf>,
    plot: Option<PathBuf>,
    seconds: f64,
    rounds: usize,
    reprobe: bool,
    mode: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mode: minductor::Mode = mode.parse()?;
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(format!("--seconds must be a non-negative number, found {seconds}").into());
    }
    if rounds == 0 {
        return Err("--rounds must be at least 1, found 0".into());
    }
    let counts = match &threads {
        Some(list) => thread_list("--threads", list)?,
        None => vec![0],
    };
    let listed: Option<Vec<String>> = workload
        .as_ref()
        .map(|list| list.split(',').map(|n| n.trim().to_string()).collect());
    let programs = match &pt2 {
        Some(dir) => {
            if plot.is_some() {
                return Err("--plot goes with the suite, not with --pt2".into());
            }
            let dir = dir.clone().unwrap_or_else(pt2::default_exported_dir);
            pt2::pt2_workloads(&dir, listed.as_deref())?
        }
        None => Vec::new(),
    };
    let workloads: Vec<Workload> = if pt2.is_some() {
        Vec::new()
    } else {
        let names = listed.unwrap_or_else(|| SUITE.iter().map(|n| n.to_string()).collect());
        // Unknown names fail before anything is measured.
        if let Some(bad) = names.iter().find(|n| !SUITE.contains(&n.as_str())) {
            return Err(WorkloadError::Unknown { found: bad.clone() }.into());
        }
        names
            .iter()
            .map(|n| workloads::by_name(n))
            .collect::<Result<_, _>>()?
    };
    let names: Vec<&str> = programs
        .iter()
        .map(|p| p.workload.name.as_str())
        .chain(workloads.iter().map(|w| w.name.as_str()))
        .collect();
    let several = counts.len() > 1;
    let mut per_count = Vec::new();
    let mut used = Vec::new();
    for &count in &counts {
        minductor::set_num_threads(count)?;
        let threads = minductor::num_threads();
        used.push(threads);
        let (probe, origin) = load_or_measure(threads, reprobe)?;
        match origin {
            Origin::Cached(path) => eprintln!("probe: cached in {}", path.display()),
            Origin::Measured(Some(path)) => {
                eprintln!("probe: measured, saved to {}", path.display())
            }
            Origin::Measured(None) => eprintln!("probe: measured (no cache directory known)"),
            Origin::Contended(cpus) => eprintln!(
                "probe: measured while other processes kept {cpus:.2} CPUs busy ({} attempts), \
                 not saved: its peaks may be low",
                minductor_tools::probe::PROBE_ATTEMPTS
            ),
        }
        print!("{}", render_probe(&probe));

        let options = BenchOptions {
            budget: Duration::from_secs_f64(seconds / rounds as f64),
            min_iterations: 3,
        };
        let mut prepared = Vec::new();
        for workload in &workloads {
            eprintln!("compiling {} ...", workload.name);
            prepared.push(PreparedWorkload::new(workload, mode)?);
        }
        for p in &programs {
            eprintln!("compiling {} ...", p.workload.name);
            prepared.push(PreparedWorkload::from_program(
                &p.workload,
                &p.program,
                mode,
            )?);
        }
        for round in 0..rounds {
            for p in &mut prepared {
                eprintln!("round {}/{rounds}: {} ...", round + 1, p.name());
                p.time_round(options)?;
            }
        }
        let results: Vec<_> = prepared
            .into_iter()
            .map(|p| p.finish(&probe, Some(&AllocatorMeter)))
            .collect::<Result<_, _>>()?;
        println!(
            "\n{} threads{}; median of timed calls{}; peaks are heap bytes above the pre-call baseline",
            threads,
            if mode == minductor::Mode::Default {
                String::new()
            } else {
                format!(", compiled in mode {mode}")
            },
            if rounds > 1 {
                format!(" (median of {rounds} interleaved rounds' medians)")
            } else {
                String::new()
            }
        );
        print!("{}", render_table(&results));

        let mut sweep = Vec::new();
        if let (Some(path), false) = (&plot, several) {
            let sweep_options = BenchOptions {
                budget: options.budget / 4,
                ..options
            };
            let sweeps = [
                workloads::pointwise_gelu_sweep(&workloads::POINTWISE_SWEEP)?,
                workloads::softmax_sweep(&workloads::SOFTMAX_SWEEP_ROWS, 1024)?,
            ];
            for workload in sweeps.into_iter().flatten() {
                eprintln!("running {} ...", workload.name);
                sweep.push(run_workload(
                    &workload,
                    &probe,
                    Some(&AllocatorMeter),
                    sweep_options,
                )?);
            }
            println!("\nsize sweep");
            print!("{}", render_table(&sweep));
            plot_speedup(&sweep, threads, path)?;
            eprintln!("plot: {}", path.display());
        }

        if let Some(path) = &json {
            let path = if several {
                path.with_extension(format!("t{threads}.json"))
            } else {
                path.clone()
            };
            let report = Report {
                threads,
                mode: mode.to_string(),
                probe: probe.clone(),
                workloads: results.clone(),
                sweep,
            };
            std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
                .map_err(|e| format!("{}: {e}", path.display()))?;
            eprintln!("json: {}", path.display());
        }
        per_count.push(results);
    }
    if several {
        println!(
            "\ncompiled median ms by thread count (speedup over {} threads)",
            used[0]
        );
        print!("{:<28}", "workload");
        for t in &used {
            print!(" {:>16}", format!("{t} threads"));
        }
        println!();
        for (i, name) in names.iter().enumerate() {
            print!("{:<28}", name);
            let base = per_count[0][i].compiled.median_ms;
            for results in &per_count {
                let ms = results[i].compiled.median_ms;
                print!(" {:>16}", format!("{ms:.3} ({:.2}x)", base / ms.max(1e-12)));
            }
            println!();
        }
        if let Some(path) = &plot {
            plot_thread_scaling(&used, &per_count, path)?;
            eprintln!("plot: {}", path.display());
        }
    }
    Ok(())
}
