//! `compile`: a graph and a backend in, something callable out.
//!
//! Backends, by name like torch.compile's:
//! - `eager`: the reference interpreter, op by op, unfused, each op allocating its result;
//! - `aot_eager`: the decomposed and simplified prim graph, interpreted;
//! - `inductor` (default): decompose → autodiff → simplify → partition → fuse → fuse_horizontal →
//!   fuse_epilogues → store_once → split_transposes → choose_loop_order → plan_buffers → Cranelift,
//!   run as machine code.
//!
//! A graph with `grad` nodes becomes a joint graph (`autodiff`) on every backend; its tangent
//! inputs are fed with ones by the compiled object, so callers pass the traced inputs only.

use minductor_codegen_cpu::{compile_program, CodegenError, CompiledProgram};
use minductor_ir::{Graph, IrError};
use minductor_kernel_ir::{verify_program, Program, VerifyError};
use minductor_passes::{
    autodiff, choose_loop_order, decompose, fuse, fuse_epilogues, fuse_horizontal, partition,
    plan_buffers, simplify, sink_cats, split_transposes, store_once, AutodiffError, Joint,
    Partition, PartitionOptions,
};
use minductor_runtime::{
    check_inputs, interpret, Executable, RuntimeError, StepPartition, StepTiming, Tensor,
};
use std::str::FromStr;
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    Eager,
    AotEager,
    #[default]
    Inductor,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Eager => "eager",
            Backend::AotEager => "aot_eager",
            Backend::Inductor => "inductor",
        }
    }
}

impl FromStr for Backend {
    type Err = CompileError;
    fn from_str(s: &str) -> Result<Self, CompileError> {
        match s {
            "eager" => Ok(Backend::Eager),
            "aot_eager" => Ok(Backend::AotEager),
            "inductor" | "default" => Ok(Backend::Inductor),
            other => Err(CompileError::UnknownBackend(other.to_string())),
        }
    }
}

#[derive(Debug, Error)]
pub enum CompileError {
    #[error("unknown backend `{0}` (expected eager, aot_eager or inductor)")]
    UnknownBackend(String),
    #[error("unknown mode `{0}` (expected default, reduce-overhead or max-autotune)")]
    UnknownMode(String),
    #[error("invalid graph: {0}")]
    InvalidGraph(#[from] IrError),
    #[error("code generation failed: {0}")]
    Codegen(#[from] CodegenError),
    #[error("{0}")]
    Autodiff(#[from] AutodiffError),
    #[error("the kernel program after `{pass}` fails verification (a compiler bug): {error}")]
    Verify {
        pass: &'static str,
        error: Box<VerifyError>,
    },
    #[error("the graph after `{pass}` fails verification (a compiler bug): {error}")]
    GraphVerify { pass: &'static str, error: IrError },
    #[error("{0}")]
    Freeze(#[from] crate::freeze::FreezeError),
    #[error("backend {backend} does not support {what} yet")]
    Unsupported { backend: &'static str, what: String },
}

/// How much compile-time and per-call work to trade, like `torch.compile(mode=...)`. Parsed
/// from `"default"`, `"reduce-overhead"` and `"max-autotune"`. Every mode computes bitwise the
/// same outputs.
///
/// - `Default`: every call checks its inputs against the graph (names in errors) and allocates
///   its outputs.
/// - `ReduceOverhead`: less work per call. [`Compiled::call`] and [`Compiled::call_into`] skip
///   the graph-level input check on the inductor backend: the compiled program binds its sizes
///   from the inputs and checks each one's dtype and shape there anyway (that check is what keeps
///   compiled code inside its buffers, so it always runs; a `jit` function's guards have already
///   proved the same), so a bad input is still a typed error, naming the input by position. Pair
///   it with `call_into`, which writes into output tensors the caller hands back instead of
///   allocating new ones (PyTorch's CUDA graphs reuse static output buffers likewise).
/// - `MaxAutotune`: at compile time, time every kernel under each way of splitting its outer loops
///   across threads, and every GEMM under each of its plans (`codegen_cpu::Split`,
///   `GemmChoice`), on zero inputs and keep the fastest per step (`Artifacts::autotune` lists
///   the choices). Graphs with symbolic sizes are not tuned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    #[default]
    Default,
    ReduceOverhead,
    MaxAutotune,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Default => "default",
            Mode::ReduceOverhead => "reduce-overhead",
            Mode::MaxAutotune => "max-autotune",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = CompileError;
    fn from_str(s: &str) -> Result<Self, CompileError> {
        match s {
            "default" => Ok(Mode::Default),
            "reduce-overhead" => Ok(Mode::ReduceOverhead),
            "max-autotune" => Ok(Mode::MaxAutotune),
            other => Err(CompileError::UnknownMode(other.to_string())),
        }
    }
}

/// What `compile_with_options` does besides picking a backend.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CompileOptions {
    pub backend: Backend,
    /// How joint graphs trade saved memory for recomputation (`passes::partition`).
    pub partition: PartitionOptions,
    /// Per-call overhead and compile-time tuning (see [`Mode`]).
    pub mode: Mode,
    /// The most bytes one call may allocate (arena, outputs, copies; the interpreter's values
    /// on the eager backends): a call that would need more is `RuntimeError::OutOfMemory`
    /// before it starts. `None`: the `MINDUCTOR_MEMORY_LIMIT` environment variable's (bytes,
    /// or `512M`, `4G`...), read when the graph is compiled or loaded, else no limit. Not part
    /// of an artifact or of the compile-cache key (it changes no code).
    pub memory_limit: Option<usize>,
}

/// One pass of one compile: its wall time and the size of what it made.
#[derive(Clone, Debug, PartialEq)]
pub struct PassTime {
    /// The pass's name (`decompose`, `fuse`, `verify_program`, `codegen`, ...).
    pub pass: &'static str,
    pub time: Duration,
    /// Nodes of the graph the pass made (graph passes) or scheduled (`fuse`); 0 otherwise.
    pub nodes: usize,
    /// Steps of the kernel program after the pass (0 for graph passes).
    pub steps: usize,
    /// Kernels of the program after the pass (for `codegen`: the functions it compiled).
    pub kernels: usize,
}

impl std::fmt::Display for PassTime {
    /// `fuse 1.234 ms (392 nodes, 69 steps, 41 kernels)`, listing the sizes that are not 0.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:.3} ms", self.pass, self.time.as_secs_f64() * 1e3)?;
        let sizes: Vec<String> = [
            (self.nodes, "nodes"),
            (self.steps, "steps"),
            (self.kernels, "kernels"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if !sizes.is_empty() {
            write!(f, " ({})", sizes.join(", "))?;
        }
        Ok(())
    }
}

/// The passes of one compile in order, each with its wall time and sizes (a pass run several
/// times, such as `verify_program`, appears each time).
#[derive(Clone, Debug, Default)]
struct PassTimer(Vec<PassTime>);

impl PassTimer {
    /// Runs `pass`, recording its time and the sizes `sizes` reads from its result.
    fn graph<T>(
        &mut self,
        pass: &'static str,
        run: impl FnOnce() -> T,
        nodes: impl Fn(&T) -> usize,
    ) -> T {
        let started = Instant::now();
        let out = run();
        self.0.push(PassTime {
            pass,
            time: started.elapsed(),
            nodes: nodes(&out),
            steps: 0,
            kernels: 0,
        });
        out
    }

    /// Runs a pass that makes a program, recording its time and the program's steps and kernels.
    fn program(&mut self, pass: &'static str, run: impl FnOnce() -> Program) -> Program {
        let started = Instant::now();
        let out = run();
        let time = started.elapsed();
        self.0.push(PassTime {
            pass,
            time,
            nodes: 0,
            steps: out.steps.len(),
            kernels: out.kernels().count(),
        });
        out
    }
}

/// Every stage's output, kept for inspection.
#[derive(Clone, Debug, Default)]
pub struct Artifacts {
    /// Each pass of the compile in order, with its wall time and the sizes it worked on (empty
    /// for a loaded artifact, which runs no pass). Logged under `MINDUCTOR_LOGS=perf`, listed by
    /// `explain` and written to the dump directory's `pass_times.txt`.
    pub pass_times: Vec<PassTime>,
    /// For a graph with gradients: the joint forward-backward prim graph after `autodiff` and
    /// `simplify`, before partitioning.
    pub joint_graph: Option<Graph>,
    /// For a joint graph: which forward values the backward saves and which it recomputes.
    pub partition: Option<Partition>,
    /// The graph after `decompose`, before `autodiff` and `simplify`; empty for `eager` and for
    /// a frozen compile (whose graph `freeze` decomposed and simplified before compiling it).
    pub decomposed: Option<Graph>,
    /// The prim graph the backend runs: after `decompose` and `simplify` (and `partition`, for a
    /// joint graph; and `sink_cats`, for inductor: the graph `fuse` schedules); empty for
    /// `eager`.
    pub prim_graph: Option<Graph>,
    /// The kernel program code generation compiled (inductor only): after every kernel-IR pass,
    /// `fuse` to `choose_loop_order`, with the buffer plan of `plan_buffers`.
    pub program: Option<Program>,
    /// Each kernel's name and its Cranelift IR as compiled (inductor only).
    pub cranelift_ir: Vec<(String, String)>,
    /// With `Mode::MaxAutotune`: each kernel step's name and the thread split autotuning kept
    /// (empty otherwise, and for graphs with symbolic sizes).
    pub autotune: Vec<(String, minductor_codegen_cpu::Split)>,
    /// Whether `autotune` was read from a saved artifact (timed on this thread count and CPU)
    /// instead of timed by this compile or load.
    pub autotune_reused: bool,
}

/// The sizes a symbolic dim of a compiled graph's inputs may take: `min..=max` (no `max`: no
/// upper bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeRange {
    pub sym: minductor_ir::SymId,
    pub min: usize,
    pub max: Option<usize>,
}

impl std::fmt::Display for SizeRange {
    /// `s0: 2..=64`, or `s0: 1..` without an upper bound (the artifact's `range` guard).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}..", minductor_ir::Dim::Sym(self.sym), self.min)?;
        match self.max {
            Some(max) => write!(f, "={max}"),
            None => Ok(()),
        }
    }
}

/// A compiled graph. `call` checks the inputs against the graph and runs the backend's code.
pub struct Compiled {
    graph: Graph,
    backend: Backend,
    options: CompileOptions,
    /// The dtype of each tangent input (fed with ones after the caller's inputs) of a joint
    /// graph; empty otherwise.
    tangents: Vec<minductor_ir::DType>,
    /// Loaded from the compile cache rather than compiled.
    from_cache: bool,
    /// The most bytes one call may allocate (`CompileOptions::memory_limit`, else the
    /// environment's when compiled or loaded), checked before each call starts.
    memory_limit: Option<usize>,
    /// A frozen compile's constants (`freeze.rs`): the graph's last inputs, fed by `call` after
    /// the caller's; empty otherwise.
    frozen: Vec<Tensor>,
    /// GEMM operands the executable packed once from `frozen` (`Executable::prepare_constants`).
    prepacked: usize,
    /// The sizes each symbolic dim may take (an imported program's `range_constraints`),
    /// checked on the caller's inputs before a call runs; empty when any size goes. At most one
    /// per symbol.
    size_ranges: Vec<SizeRange>,
    /// Shared by concurrent calls: per-call state lives in the executable's pool.
    executable: Box<dyn Executable>,
    artifacts: Artifacts,
    compile_time: Duration,
}

struct Interpreted(Graph);

impl Executable for Interpreted {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        interpret(&self.0, inputs)
    }

    fn memory_needed(&self, _inputs: &[Tensor]) -> Result<Option<usize>, RuntimeError> {
        Ok(minductor_runtime::interpreter_peak_bytes(&self.0))
    }
}

/// Compiles `graph` with the default (inductor) backend.
pub fn compile(graph: &Graph) -> Result<Compiled, CompileError> {
    compile_with(graph, Backend::Inductor)
}

/// Compiles `graph` with the named backend.
pub fn compile_with(graph: &Graph, backend: Backend) -> Result<Compiled, CompileError> {
    compile_with_options(
        graph,
        CompileOptions {
            backend,
            ..CompileOptions::default()
        },
    )
}

/// `graph`, made by the graph pass `pass`, once `Graph::verify` accepts it (each node after its
/// operands, each type the one its op's rule derives): a broken pass is named by the first check
/// that fails, as the kernel-IR verifier names kernel-IR passes.
pub(crate) fn verified(pass: &'static str, graph: Graph) -> Result<Graph, CompileError> {
    match graph.verify() {
        Ok(()) => Ok(graph),
        Err(error) => Err(CompileError::GraphVerify { pass, error }),
    }
}

/// What a compile starts from.
pub(crate) enum Start<'a> {
    /// A traced graph: the compile decomposes it (and differentiates it when it has gradients).
    Captured(&'a Graph),
    /// A graph already decomposed and simplified (by `compile_frozen`, which must see prims to
    /// freeze them), which no pass runs over again.
    Prims(&'a Graph),
}

/// The runnable prim graph: `decomposed` simplified, or for a joint graph the joint simplified
/// and partitioned between forward and backward.
fn prim_graph(
    decomposed: &Graph,
    joint: Option<&Joint>,
    options: &CompileOptions,
    artifacts: &mut Artifacts,
    timer: &mut PassTimer,
) -> Result<Graph, CompileError> {
    let Some(joint) = joint else {
        let prims = timer.graph("simplify", || simplify(decomposed), Graph::len);
        return verified("simplify", prims);
    };
    let prims = timer.graph("simplify", || simplify(&joint.graph), Graph::len);
    let prims = verified("simplify", prims)?;
    artifacts.joint_graph = Some(prims.clone());
    if joint.seeded || joint.tangents.is_empty() {
        // A backward seeded by a traced value has no tangent to tell backward nodes apart.
        return Ok(prims);
    }
    let partitioned = timer.graph(
        "partition",
        || partition(&prims, &joint.tangents, &options.partition),
        |p| p.graph.len(),
    );
    let graph = verified("partition", partitioned.graph.clone())?;
    artifacts.partition = Some(partitioned);
    Ok(graph)
}

/// A 0-d one of `dtype` (a tangent's value).
fn one(dtype: minductor_ir::DType) -> Tensor {
    Tensor::from_f64(dtype, &[], &[1.0]).expect("a 0-d tensor of one element")
}

/// `inner`, fed with a one of each of `tangents` after the caller's inputs (unchanged when there
/// are none).
pub(crate) fn with_tangents(
    inner: Box<dyn Executable>,
    tangents: &[minductor_ir::DType],
) -> Box<dyn Executable> {
    if tangents.is_empty() {
        return inner;
    }
    Box::new(WithTangents {
        inner,
        tangents: tangents.iter().map(|&d| one(d)).collect(),
    })
}

/// Runs `inner` with the tangent inputs (ones) after the caller's inputs.
struct WithTangents {
    inner: Box<dyn Executable>,
    tangents: Vec<Tensor>,
}

impl WithTangents {
    fn inputs(&self, inputs: &[Tensor]) -> Vec<Tensor> {
        inputs.iter().chain(&self.tangents).cloned().collect()
    }
}

impl Executable for WithTangents {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        let all = self.inputs(inputs);
        self.inner.run(&all)
    }

    fn run_into(&self, inputs: &[Tensor], outputs: &mut [Tensor]) -> Result<(), RuntimeError> {
        let all = self.inputs(inputs);
        self.inner.run_into(&all, outputs)
    }

    fn profile(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<StepTiming>), RuntimeError> {
        let all = self.inputs(inputs);
        self.inner.profile(&all)
    }

    fn profile_products(&self, inputs: &[Tensor]) -> Result<Vec<StepTiming>, RuntimeError> {
        let all = self.inputs(inputs);
        self.inner.profile_products(&all)
    }

    fn arena_bytes(&self) -> usize {
        self.inner.arena_bytes()
    }

    fn memory_needed(&self, inputs: &[Tensor]) -> Result<Option<usize>, RuntimeError> {
        let all = self.inputs(inputs);
        self.inner.memory_needed(&all)
    }

    fn partition(
        &self,
        inputs: &[Tensor],
        threads: usize,
    ) -> Result<Vec<StepPartition>, RuntimeError> {
        let all = self.inputs(inputs);
        self.inner.partition(&all, threads)
    }
}

/// Compiles `graph` with the given backend and options; with `MINDUCTOR_CACHE_DIR` set, an
/// inductor compile goes through the on-disk compile cache (`cache.rs`).
pub fn compile_with_options(
    graph: &Graph,
    options: CompileOptions,
) -> Result<Compiled, CompileError> {
    match crate::cache::CompileCache::from_env() {
        Some(cache) if options.backend == Backend::Inductor => {
            crate::logging::init_lazily();
            graph.verify()?;
            let mut compiled = cache.compile(graph, options)?.0;
            if options.memory_limit.is_some() {
                compiled.set_memory_limit(options.memory_limit);
            }
            Ok(compiled)
        }
        _ => compile_uncached(graph, options),
    }
}

/// Compiles `graph` with the given backend and options, without the compile cache.
pub(crate) fn compile_uncached(
    graph: &Graph,
    options: CompileOptions,
) -> Result<Compiled, CompileError> {
    compile_from(Start::Captured(graph), options)
}

/// Compiles from `start` with the given backend and options, without the compile cache: the
/// pipeline, each pass once, each graph pass's result verified.
pub(crate) fn compile_from(
    start: Start,
    options: CompileOptions,
) -> Result<Compiled, CompileError> {
    let graph = match start {
        Start::Captured(graph) | Start::Prims(graph) => graph,
    };
    let backend = options.backend;
    crate::logging::init_lazily();
    graph.verify()?;
    // The prim-graph interpreter needs static shapes; inductor binds symbolic sizes per call.
    if backend == Backend::AotEager {
        if let Some(node) = graph.nodes().iter().find(|n| n.ty.static_sizes().is_none()) {
            let what = format!("symbolic dims ({} : {})", node.op, node.ty);
            return Err(CompileError::Unsupported {
                backend: backend.name(),
                what,
            });
        }
    }
    let started = Instant::now();
    let mut artifacts = Artifacts::default();
    let mut timer = PassTimer::default();
    let has_grad = graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, minductor_ir::Op::Grad { .. }));
    // Eager interprets the captured graph itself (a joint graph's forward decomposed, so that
    // autodiff can differentiate it).
    let decomposed = match start {
        Start::Captured(_) if backend != Backend::Eager || has_grad => {
            let decomposed = timer.graph("decompose", || decompose(graph), Graph::len);
            let decomposed = verified("decompose", decomposed)?;
            artifacts.decomposed = Some(decomposed.clone());
            Some(decomposed)
        }
        Start::Captured(_) | Start::Prims(_) => None,
    };
    let joint = match (&decomposed, has_grad) {
        (Some(decomposed), true) => {
            let joint = timer.graph(
                "autodiff",
                || autodiff(decomposed),
                |j| j.as_ref().map_or(0, |j| j.graph.len()),
            )?;
            verified("autodiff", joint.graph.clone())?;
            Some(joint)
        }
        _ => None,
    };
    // The graph `prim_graph` starts from: the decomposed one, or the prims it was given.
    let unsimplified = decomposed.as_ref().unwrap_or(graph);
    let prims_of = |artifacts: &mut Artifacts, timer: &mut PassTimer| match start {
        Start::Prims(prims) => Ok(prims.clone()),
        Start::Captured(_) => prim_graph(unsimplified, joint.as_ref(), &options, artifacts, timer),
    };
    let executable: Box<dyn Executable> = match backend {
        // Op by op; a gradient runs the joint graph (the forward decomposed so that autodiff can
        // differentiate it), still op by op.
        Backend::Eager => match &joint {
            Some(joint) => Box::new(Interpreted(joint.graph.clone())),
            None => Box::new(Interpreted(graph.clone())),
        },
        Backend::AotEager => {
            let prims = prims_of(&mut artifacts, &mut timer)?;
            artifacts.prim_graph = Some(prims.clone());
            Box::new(Interpreted(prims))
        }
        Backend::Inductor => {
            let prims = prims_of(&mut artifacts, &mut timer)?;
            let prims = timer.graph("sink_cats", || sink_cats(&prims), Graph::len);
            let prims = verified("sink_cats", prims)?;
            let fuse_started = Instant::now();
            let fused = fuse(&prims).map_err(|e| CompileError::Unsupported {
                backend: backend.name(),
                what: e.to_string(),
            })?;
            timer.0.push(PassTime {
                pass: "fuse",
                time: fuse_started.elapsed(),
                nodes: prims.len(),
                steps: fused.steps.len(),
                kernels: fused.kernels().count(),
            });
            // The kernel-IR verifier after every pass that makes or rewrites a program, so a
            // broken pass is named by the first check that fails (and `compile_program` checks
            // again whatever it is given).
            let verified = |timer: &mut PassTimer, pass: &'static str, program: Program| {
                let started = Instant::now();
                let result = verify_program(&program, &[]);
                timer.0.push(PassTime {
                    pass: "verify_program",
                    time: started.elapsed(),
                    nodes: 0,
                    steps: program.steps.len(),
                    kernels: 0,
                });
                result.map(|()| program).map_err(|e| CompileError::Verify {
                    pass,
                    error: Box::new(e),
                })
            };
            let fused = verified(&mut timer, "fuse", fused)?;
            let horizontal = timer.program("fuse_horizontal", || fuse_horizontal(&fused));
            let horizontal = verified(&mut timer, "fuse_horizontal", horizontal)?;
            let epilogues = timer.program("fuse_epilogues", || fuse_epilogues(&horizontal));
            let epilogues = verified(&mut timer, "fuse_epilogues", epilogues)?;
            let once = timer.program("store_once", || store_once(&epilogues));
            let once = verified(&mut timer, "store_once", once)?;
            let split = timer.program("split_transposes", || split_transposes(&once));
            let split = verified(&mut timer, "split_transposes", split)?;
            let ordered = timer.program("choose_loop_order", || choose_loop_order(&split));
            let mut program = verified(&mut timer, "choose_loop_order", ordered)?;
            let plan = timer.graph("plan_buffers", || plan_buffers(&program), |_| 0);
            program.plan = Some(plan);
            let program = verified(&mut timer, "plan_buffers", program)?;
            let codegen_started = Instant::now();
            let mut compiled: CompiledProgram = compile_program(&program)?;
            timer.0.push(PassTime {
                pass: "codegen",
                time: codegen_started.elapsed(),
                nodes: 0,
                steps: program.steps.len(),
                kernels: compiled.kernels().count(),
            });
            if options.mode == Mode::MaxAutotune {
                artifacts.autotune = autotune(&mut compiled);
            }
            artifacts.cranelift_ir = compiled
                .kernels()
                .map(|k| (k.name.clone(), k.clif.clone()))
                .collect();
            artifacts.prim_graph = Some(prims);
            artifacts.program = Some(program);
            Box::new(compiled)
        }
    };
    let tangents: Vec<minductor_ir::DType> = match &joint {
        Some(joint) => {
            let inputs = joint.graph.inputs();
            joint
                .tangents
                .iter()
                .map(|&t| joint.graph.ty(inputs[t]).dtype)
                .collect()
        }
        None => Vec::new(),
    };
    let executable = with_tangents(executable, &tangents);
    let compile_time = started.elapsed();
    artifacts.pass_times = timer.0;
    crate::dump::after_compile(graph, backend.name(), &artifacts, compile_time);
    Ok(Compiled::from_parts(
        graph.clone(),
        executable,
        artifacts,
        options,
        tangents,
        compile_time,
    ))
}

/// Calls of each split per kernel step when autotuning (the fastest call counts).
const AUTOTUNE_RUNS: usize = 2;

/// `Mode::MaxAutotune`'s tuning of `compiled`, logged under `minductor::perf`. A program that
/// fails to run on zero inputs keeps its default splits (its real inputs will say why).
pub(crate) fn autotune(
    compiled: &mut CompiledProgram,
) -> Vec<(String, minductor_codegen_cpu::Split)> {
    match compiled.autotune(AUTOTUNE_RUNS) {
        Ok(chosen) => {
            for (kernel, split) in &chosen {
                tracing::info!(target: "minductor::perf", "max-autotune: {kernel}: {}", split.name());
            }
            chosen
        }
        Err(e) => {
            tracing::warn!(
                target: "minductor::perf",
                "max-autotune: not tuned ({e}); the default thread splits stay"
            );
            Vec::new()
        }
    }
}

impl Compiled {
    /// A compiled graph from its parts (a compile's, or a loaded artifact's).
    pub(crate) fn from_parts(
        graph: Graph,
        executable: Box<dyn Executable>,
        artifacts: Artifacts,
        options: CompileOptions,
        tangents: Vec<minductor_ir::DType>,
        compile_time: Duration,
    ) -> Compiled {
        Compiled {
            graph,
            backend: options.backend,
            memory_limit: options
                .memory_limit
                .or_else(minductor_runtime::memory_limit_from_env),
            options,
            tangents,
            from_cache: false,
            frozen: Vec::new(),
            prepacked: 0,
            size_ranges: Vec::new(),
            executable,
            artifacts,
            compile_time,
        }
    }

    /// Makes the graph's last `constants.len()` inputs frozen to `constants`, which `call`
    /// feeds after the caller's inputs; `total` is the whole compile's time.
    /// The executable prepares what depends only on them once (it packs the GEMM operands they
    /// are); they are kept contiguous, so each call binds the storage it prepared from.
    pub(crate) fn set_frozen(&mut self, constants: Vec<Tensor>, total: Duration) {
        let constants: Vec<Tensor> = constants.iter().map(Tensor::contiguous).collect();
        let first = self.graph.inputs().len() - constants.len();
        self.prepacked = self.executable.prepare_constants(first, &constants);
        self.frozen = constants;
        self.compile_time = total;
    }

    /// How many GEMM operands a frozen compile packed once at compile time (frozen linear
    /// layers' weights), rather than at every call.
    pub fn prepacked_operands(&self) -> usize {
        self.prepacked
    }

    /// Restricts the sizes of symbolic dims: a call whose inputs bind a symbol outside its
    /// range is a `RuntimeError::Shape` (a later range for the same symbol replaces an earlier).
    pub fn set_size_ranges(&mut self, ranges: &[SizeRange]) {
        self.size_ranges.clear();
        for range in ranges {
            self.size_ranges.retain(|r| r.sym != range.sym);
            self.size_ranges.push(*range);
        }
    }

    /// The ranges `call` checks symbolic sizes against (see [`Compiled::set_size_ranges`]).
    pub fn size_ranges(&self) -> &[SizeRange] {
        &self.size_ranges
    }

    /// Every symbolic size the caller's `inputs` bind within its range.
    fn check_size_ranges(&self, inputs: &[Tensor]) -> Result<(), RuntimeError> {
        if self.size_ranges.is_empty() {
            return Ok(());
        }
        for (i, (&id, tensor)) in self.graph.inputs().iter().zip(inputs).enumerate() {
            let ty = self.graph.ty(id);
            for (d, dim) in ty.shape.iter().enumerate() {
                let minductor_ir::Dim::Sym(sym) = *dim else {
                    continue;
                };
                let (Some(range), Some(&size)) = (
                    self.size_ranges.iter().find(|r| r.sym == sym),
                    tensor.shape().get(d),
                ) else {
                    continue;
                };
                if size < range.min || range.max.is_some_and(|max| size > max) {
                    return Err(RuntimeError::Shape {
                        name: self.graph.input_name(i).to_string(),
                        expected: format!("{ty} with {range}"),
                        found: tensor.shape().to_vec(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The values a frozen compile feeds as the graph's last inputs (empty unless frozen).
    pub fn frozen_constants(&self) -> &[Tensor] {
        &self.frozen
    }

    /// The caller's inputs checked against the graph, followed by the frozen constants.
    fn all_inputs<'a>(
        &self,
        inputs: &'a [Tensor],
    ) -> Result<std::borrow::Cow<'a, [Tensor]>, RuntimeError> {
        if self.frozen.is_empty() {
            self.check_call_inputs(inputs)?;
            self.check_size_ranges(inputs)?;
            self.check_memory_limit(inputs)?;
            return Ok(std::borrow::Cow::Borrowed(inputs));
        }
        let expected = self.graph.inputs().len() - self.frozen.len();
        if inputs.len() != expected {
            return Err(RuntimeError::Arity {
                expected,
                found: inputs.len(),
            });
        }
        let all: Vec<Tensor> = inputs.iter().chain(&self.frozen).cloned().collect();
        self.check_call_inputs(&all)?;
        self.check_size_ranges(&all)?;
        self.check_memory_limit(&all)?;
        Ok(std::borrow::Cow::Owned(all))
    }

    /// `OutOfMemory` when a call on `inputs` would allocate more than the memory limit.
    fn check_memory_limit(&self, inputs: &[Tensor]) -> Result<(), RuntimeError> {
        let Some(limit) = self.memory_limit else {
            return Ok(());
        };
        match self.executable.memory_needed(inputs)? {
            Some(needed) if needed > limit => Err(RuntimeError::out_of_memory(
                needed,
                format!("this call (the memory limit is {limit} bytes)"),
            )),
            _ => Ok(()),
        }
    }

    /// The most bytes one call may allocate (see `CompileOptions::memory_limit`).
    pub fn memory_limit(&self) -> Option<usize> {
        self.memory_limit
    }

    /// Sets the most bytes one call may allocate; `None` removes the limit.
    pub fn set_memory_limit(&mut self, limit: Option<usize>) {
        self.memory_limit = limit;
    }

    pub(crate) fn mark_from_cache(&mut self) {
        self.from_cache = true;
    }

    /// Whether this was loaded from the compile cache (`MINDUCTOR_CACHE_DIR`) instead of
    /// compiled; `compile_time` is then the load's.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// The options it was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.options
    }

    /// The dtype of each tangent input of a joint graph (fed with ones after the caller's
    /// inputs); empty for a graph without gradients.
    pub fn tangent_dtypes(&self) -> &[minductor_ir::DType] {
        &self.tangents
    }

    /// Runs the compiled graph. Inputs are checked (count, dtype, rank, shape) first; the error
    /// names the input, the expected and the found. Non-contiguous inputs are accepted. In
    /// `Mode::ReduceOverhead` the inductor backend leaves the check to its program (see
    /// [`Mode`]).
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        let inputs = self.all_inputs(inputs)?;
        self.executable.run(&inputs)
    }

    /// Runs the compiled graph writing output `i` into `outputs[i]` instead of allocating it:
    /// hand back the tensors an earlier call returned (or any of the right dtypes and shapes)
    /// and no output is allocated; the inductor backend's kernels store straight into them.
    /// Each must have its output's dtype and shape (for this call's sizes), be contiguous and
    /// share its storage with no other tensor (so no input, nor another output, can alias it;
    /// a value the graph returns twice comes back from `call` as two handles on one storage, so
    /// give one of them a tensor of its own):
    /// anything else is a typed error (`RuntimeError::OutputBuffer`, or
    /// `OutputBufferCount` for the wrong number) before any step runs, on the inductor backend
    /// (the others run first and check before copying in). Inputs are checked as by `call`.
    pub fn call_into(&self, inputs: &[Tensor], outputs: &mut [Tensor]) -> Result<(), RuntimeError> {
        let inputs = self.all_inputs(inputs)?;
        if outputs.len() != self.graph.outputs().len() {
            return Err(RuntimeError::OutputBufferCount {
                expected: self.graph.outputs().len(),
                found: outputs.len(),
            });
        }
        self.executable.run_into(&inputs, outputs)
    }

    /// The graph-level input check, which `Mode::ReduceOverhead` leaves to the inductor
    /// program's own binding of sizes (it checks count, dtype, rank and every size).
    fn check_call_inputs(&self, inputs: &[Tensor]) -> Result<(), RuntimeError> {
        if self.options.mode == Mode::ReduceOverhead && self.backend == Backend::Inductor {
            if inputs.len() != self.graph.inputs().len() {
                return Err(RuntimeError::Arity {
                    expected: self.graph.inputs().len(),
                    found: inputs.len(),
                });
            }
            return Ok(());
        }
        check_inputs(&self.graph, inputs)
    }

    /// Runs like `call` and also returns the wall time of each step (kernel, or GEMM with its
    /// epilogue) of the compiled code.
    pub fn profile(
        &self,
        inputs: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<StepTiming>), RuntimeError> {
        let inputs = self.all_inputs(inputs)?;
        self.executable.profile(&inputs)
    }

    /// The wall time of each step as [`Compiled::profile`] gives it, with every GEMM's
    /// epilogue left out (the products alone). The call's results are not computed, so none
    /// are returned.
    pub fn profile_products(&self, inputs: &[Tensor]) -> Result<Vec<StepTiming>, RuntimeError> {
        let inputs = self.all_inputs(inputs)?;
        self.executable.profile_products(&inputs)
    }

    /// How a call on `inputs` would split each step of the compiled code across `threads`
    /// threads, by the executor's own rules, without running it (the partition report).
    pub fn partition(
        &self,
        inputs: &[Tensor],
        threads: usize,
    ) -> Result<Vec<StepPartition>, RuntimeError> {
        let inputs = self.all_inputs(inputs)?;
        self.executable.partition(&inputs, threads)
    }

    /// Bytes the compiled code keeps allocated between calls (the intermediate-buffer arena).
    pub fn arena_bytes(&self) -> usize {
        self.executable.arena_bytes()
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The nodes the compiled code runs with the reference interpreter (fallback steps), each as
    /// `%node op because reason`, in execution order; empty when every node is compiled (and
    /// for the eager backends, which compile nothing).
    pub fn fallbacks(&self) -> Vec<String> {
        self.artifacts
            .program
            .iter()
            .flat_map(|p| p.fallbacks())
            .map(|fb| format!("{} {} because {}", fb.node, fb.op, fb.reason))
            .collect()
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn artifacts(&self) -> &Artifacts {
        &self.artifacts
    }

    /// Wall time `compile_with` took: passes plus code generation (for a loaded artifact: the
    /// load, code generation included).
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }
}
