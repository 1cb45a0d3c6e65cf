//! minductor: torch.compile's pipeline rebuilt in Rust for CPUs.
//!
//! ```no_run
//! use minductor::{compile, trace, DType, Tensor};
//! let graph = trace(|t| {
//!     let x = t.input("x", DType::F32, &[4, 8]);
//!     vec![(&x * 2.0 + 1.0).softmax(-1)]
//! })
//! .unwrap();
//! let compiled = compile(&graph).unwrap();
//! let out = compiled.call(&[Tensor::zeros(DType::F32, &[4, 8])]).unwrap();
//! ```
//!
//! The root holds what a user writes: tracing and `jit`, `compile` and its options, backends and
//! modes, tensors and their types, training, freezing, artifacts and the compile cache, the
//! errors of each. The pipeline's crates are reachable through [`internals`], for minductor's own
//! tools and tests; they are not a stable API.

pub use minductor_frontend::{artifact, cache, dump, export, logging};
pub use minductor_frontend::{
    compile, compile_with, compile_with_options, current_stance, explain, jit,
    reference_executable, set_stance, trace, with_stance, Artifacts, Backend, BreakReport,
    CompileError, CompileOptions, Compiled, CompiledFn, CustomBackend, Explanation, GraphReport,
    Jit, JitBackend, JitError, JitOptions, JitStats, Mode, Operand, SizeRange, Stance, StanceGuard,
    TraceError, Traced, TracedDim, Tracer, DEFAULT_RECOMPILE_LIMIT,
};
pub use minductor_frontend::{compile_frozen, compile_frozen_with_options, FreezeError};
pub use minductor_frontend::{load, load_bytes, Artifact, ArtifactError};
pub use minductor_frontend::{
    load_safetensors, AdamW, ConvOptions, CrossEntropyOptions, Optimizer, Parameters, PoolOptions,
    Sgd, TracedParameters, TrainError, TrainStep,
};
pub use minductor_frontend::{CacheOutcome, CompileCache};
pub use minductor_ir::{DType, Dim, Graph, IrError, SymId, TensorType};
pub use minductor_passes::PartitionOptions;
pub use minductor_runtime::{
    interpret, num_threads, set_num_threads, Executable, RuntimeError, StepPartition, StepTiming,
    Tensor, WorkUnit,
};

/// The pipeline's crates, for minductor's own tools, tests and benchmarks (the golden runner, the
/// fusion report, tests that edit a kernel program to check the verifier). Not a stable API:
/// a user's code needs nothing from here.
pub mod internals {
    pub use minductor_codegen_cpu as codegen_cpu;
    pub use minductor_ir as ir;
    pub use minductor_kernel_ir as kernel_ir;
    pub use minductor_kernels as kernels;
    pub use minductor_passes as passes;
    pub use minductor_runtime as runtime;
}

/// README.md's Rust snippets, compiled (and those not marked `no_run`, run) as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
