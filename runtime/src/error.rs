//! Errors a call can return: each names the input, the expected and the found.

use minductor_ir::IrError;
use thiserror::Error;

#[derive(Debug, Clone, Error, PartialEq)]
pub enum RuntimeError {
    #[error("expected {expected} inputs, got {found}")]
    Arity { expected: usize, found: usize },
    #[error("input `{name}`: expected dtype {expected}, found {found}")]
    DType {
        name: String,
        expected: String,
        found: String,
    },
    #[error("input `{name}`: expected rank {expected}, found rank {found} (shape {shape:?})")]
    Rank {
        name: String,
        expected: usize,
        found: usize,
        shape: Vec<usize>,
    },
    #[error("input `{name}`: expected shape {expected}, found {found:?}")]
    Shape {
        name: String,
        expected: String,
        found: Vec<usize>,
    },
    #[error("backend `{backend}` returned {found} outputs; the graph has {expected}")]
    OutputCount {
        backend: String,
        expected: usize,
        found: usize,
    },
    #[error("backend `{backend}`: output {index}: expected {expected}, found {found}")]
    OutputType {
        backend: String,
        index: usize,
        expected: String,
        found: String,
    },
    #[error("{found} output tensors handed in to receive {expected} outputs")]
    OutputBufferCount { expected: usize, found: usize },
    #[error(
        "output {index}: the tensor handed in to receive it must be {expected}, found {found}"
    )]
    OutputBuffer {
        index: usize,
        expected: String,
        found: String,
    },
    #[error("size overflow: {0}")]
    SizeOverflow(String),
    /// An allocation failed, or would pass the memory limit (`CompileOptions::memory_limit`,
    /// `MINDUCTOR_MEMORY_LIMIT`). Nothing was changed; the next call may succeed.
    #[error("out of memory: {what} needs {bytes} bytes")]
    OutOfMemory { bytes: usize, what: String },
    /// Checking mode (`MINDUCTOR_CHECK_BUFFERS=1`) caught a step writing outside its buffer or
    /// a value computed from memory no step wrote: a bug in the compiled code or a kernel.
    #[error("buffer check: {0}")]
    BufferCheck(String),
    #[error("invalid program: {0}")]
    InvalidProgram(String),
    #[error("bad tensor data: {0}")]
    Data(String),
    #[error("cannot execute: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Ir(#[from] IrError),
}

impl RuntimeError {
    /// An out-of-memory error for `bytes` bytes of `what`.
    pub fn out_of_memory(bytes: usize, what: impl Into<String>) -> RuntimeError {
        RuntimeError::OutOfMemory {
            bytes,
            what: what.into(),
        }
    }

    /// Names what an out-of-memory error was allocating (other errors pass unchanged).
    pub fn allocating(self, what: impl Into<String>) -> RuntimeError {
        match self {
            RuntimeError::OutOfMemory { bytes, .. } => RuntimeError::out_of_memory(bytes, what),
            e => e,
        }
    }
}
