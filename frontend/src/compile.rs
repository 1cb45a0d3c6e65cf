//! `compile`: a graph and a backend in, something callable out.
//!
//! Backends, by name like torch.compile's:
//! - `eager`: the reference interpreter, op by op, unfused, each op allocating its result;
//! - `aot_eager`: the decomposed and simplified prim graph, interpreted;
//! - `inductor` (default): decompose → simplify → fuse → fuse_horizontal → fuse_epilogues →
//!   plan_buffers → Cranelift, run as machine code.

use minductor_codegen_cpu::{compile_program, CodegenError, CompiledProgram};
use minductor_ir::{Graph, IrError};
use minductor_passes::{
    autodiff, decompose, fuse, fuse_epilogues, fuse_horizontal, kernel::Program, plan_buffers,
    simplify, AutodiffError,
};
use minductor_runtime::{check_inputs, interpret, Executable, RuntimeError, StepTiming, Tensor};
use std::str::FromStr;
use std::sync::Mutex;
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
    #[error("invalid graph: {0}")]
    InvalidGraph(#[from] IrError),
    #[error("code generation failed: {0}")]
    Codegen(#[from] CodegenError),
    #[error("{0}")]
    Autodiff(#[from] AutodiffError),
    #[error("backend {backend} does not support {what} yet")]
    Unsupported { backend: &'static str, what: String },
}

/// Every stage's output, kept for inspection.
#[derive(Clone, Debug, Default)]
pub struct Artifacts {
    /// The prim graph after `decompose` and `simplify` (empty for `eager`).
    pub prim_graph: Option<Graph>,
    /// The kernel program after `fuse` (inductor only).
    pub program: Option<Program>,
    /// Each kernel's name and its Cranelift IR as compiled (inductor only).
    pub cranelift_ir: Vec<(String, String)>,
}

/// A compiled graph. `call` checks the inputs against the graph and runs the backend's code.
pub struct Compiled {
    graph: Graph,
    backend: Backend,
    executable: Mutex<Box<dyn Executable>>,
    artifacts: Artifacts,
    compile_time: Duration,
}

struct Interpreted(Graph);

impl Executable for Interpreted {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        interpret(&self.0, inputs)
    }
}

/// Compiles `graph` with the default (inductor) backend.
pub fn compile(graph: &Graph) -> Result<Compiled, CompileError> {
    compile_with(graph, Backend::Inductor)
}

/// Compiles `graph` with the named backend.
pub fn compile_with(graph: &Graph, backend: Backend) -> Result<Compiled, CompileError> {
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
    let has_grad = graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, minductor_ir::Op::Grad { .. }));
    let executable: Box<dyn Executable> = match backend {
        // Op by op; a gradient runs the joint graph (the forward decomposed so that autodiff can
        // differentiate it), still op by op.
        Backend::Eager if has_grad => Box::new(Interpreted(autodiff(&decompose(graph))?.graph)),
        Backend::Eager => Box::new(Interpreted(graph.clone())),
        Backend::AotEager => {
            let prims = simplify(&autodiff(&decompose(graph))?.graph);
            artifacts.prim_graph = Some(prims.clone());
            Box::new(Interpreted(prims))
        }
        Backend::Inductor => {
            let prims = simplify(&autodiff(&decompose(graph))?.graph);
            let integer_reduction = prims.nodes().iter().find(|n| {
                matches!(n.op, minductor_ir::Op::Reduce { .. }) && !n.ty.dtype.is_float()
            });
            if let Some(node) = integer_reduction {
                let what = format!("reductions over {} tensors ({})", node.ty.dtype, node.op);
                return Err(CompileError::Unsupported {
                    backend: backend.name(),
                    what,
                });
            }
            let fused = fuse(&prims).map_err(|e| CompileError::Unsupported {
                backend: backend.name(),
                what: e.to_string(),
            })?;
            let mut program = fuse_epilogues(&fuse_horizontal(&fused));
            program.plan = Some(plan_buffers(&program));
            let compiled: CompiledProgram = compile_program(&program)?;
            artifacts.cranelift_ir = compiled
                .kernels()
                .map(|k| (k.name.clone(), k.clif.clone()))
                .collect();
            artifacts.prim_graph = Some(prims);
            artifacts.program = Some(program);
            Box::new(compiled)
        }
    };
    let compile_time = started.elapsed();
    crate::dump::after_compile(graph, backend.name(), &artifacts, compile_time);
    Ok(Compiled {
        graph: graph.clone(),
        backend,
        executable: Mutex::new(executable),
        artifacts,
        compile_time,
    })
}

impl Compiled {
    /// Runs the compiled graph. Inputs are checked (count, dtype, rank, shape) first; the error
    /// names the input, the expected and the found. Non-contiguous inputs are accepted.
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        check_inputs(&self.graph, inputs)?;
        let mut exec = self
            .executable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        exec.run(inputs)
    }

    /// Runs like `call` and also returns the wall time of each step (kernel, or GEMM with its
    /// epilogue) of the compiled code.
    pub fn profile(
        &self,
        inputs: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<StepTiming>), RuntimeError> {
        check_inputs(&self.graph, inputs)?;
        let mut exec = self
            .executable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        exec.profile(inputs)
    }

    /// Bytes the compiled code keeps allocated between calls (the intermediate-buffer arena).
    pub fn arena_bytes(&self) -> usize {
        self.executable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .arena_bytes()
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn artifacts(&self) -> &Artifacts {
        &self.artifacts
    }

    /// Wall time `compile_with` took: passes plus code generation.
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }
}
