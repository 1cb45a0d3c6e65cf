//! The frontend: tracing Rust code into graphs, compiling graphs with a backend, `jit`
//! (Dynamo's part: guards, recompiles, dynamic shapes, graph breaks, stances, explain), and
//! showing what the compiler did (`MINDUCTOR_LOGS`, `MINDUCTOR_DUMP_DIR`).

pub mod artifact;
mod autograd;
mod backend;
pub mod cache;
mod compile;
mod conv;
pub mod dump;
mod dynamic;
mod explain;
pub mod export;
mod freeze;
mod graph_break;
mod guards;
mod indexing;
mod jit;
pub mod logging;
mod losses;
mod ops;
mod stance;
mod trace;
mod train;
mod weights;

pub use artifact::{load, load_bytes, Artifact, ArtifactError};
pub use backend::{reference_executable, CompiledFn, CustomBackend, JitBackend};
pub use cache::{CacheOutcome, CompileCache};
pub use compile::{
    compile, compile_with, compile_with_options, Artifacts, Backend, CompileError, CompileOptions,
    Compiled, Mode, PassTime, SizeRange,
};
pub use conv::{ConvOptions, PoolOptions};
pub use explain::{explain, BreakReport, Explanation, GraphReport};
pub use freeze::{compile_frozen, compile_frozen_with_options, FreezeError};
pub use jit::{jit, Jit, JitError, JitOptions, JitStats, DEFAULT_RECOMPILE_LIMIT};
pub use losses::CrossEntropyOptions;
pub use stance::{current_stance, set_stance, with_stance, Stance, StanceGuard};
pub use trace::{trace, Operand, TraceError, Traced, TracedDim, Tracer};
pub use train::{AdamW, Optimizer, Parameters, Sgd, TracedParameters, TrainError, TrainStep};
pub use weights::load_safetensors;
