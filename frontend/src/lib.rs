//! The frontend: tracing Rust code into graphs, and compiling graphs with a backend.

mod compile;
mod trace;

pub use compile::{compile, compile_with, Artifacts, Backend, CompileError, Compiled};
pub use trace::{trace, Operand, TraceError, Traced, Tracer};
