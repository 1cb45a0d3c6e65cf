//! The frontend: tracing Rust code into graphs, compiling graphs with a backend, and showing what
//! the compiler did (`MINDUCTOR_LOGS`, `MINDUCTOR_DUMP_DIR`).

mod compile;
pub mod dump;
pub mod logging;
mod trace;

pub use compile::{compile, compile_with, Artifacts, Backend, CompileError, Compiled};
pub use trace::{trace, Operand, TraceError, Traced, Tracer};
