//! Code generation for CPUs: kernel IR → Cranelift → machine code.
//!
//! `lower` turns one kernel into one Cranelift function, `math` and `convert` emit the vector math
//! and the f16/bf16 conversions it needs inline, and `program` JIT-compiles a whole program and
//! runs it (kernels and extern GEMM calls) as an `Executable`.

pub mod convert;
pub mod lower;
pub mod math;
mod program;

pub use program::{
    compile_program, AttentionChoice, CodegenError, CompiledKernel, CompiledProgram, GemmChoice,
    Split,
};
