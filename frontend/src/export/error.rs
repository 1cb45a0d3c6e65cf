//! The importer's errors: every way a `.pt2` can fail to load, and every way a call of an
//! imported program can be refused, as typed values that name what they found.

use crate::compile::CompileError;
use minductor_runtime::RuntimeError;
use thiserror::Error;

/// Why a `.pt2` archive could not be read or imported.
#[derive(Debug, Error)]
pub enum ImportError {
    #[error("cannot read `{path}`: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is not a zip archive (or is truncated): {reason}")]
    NotZip { path: String, reason: String },
    #[error("the archive has no `{entry}` ({hint})")]
    MissingEntry { entry: String, hint: String },
    #[error("cannot read archive entry `{entry}`: {reason}")]
    Entry { entry: String, reason: String },
    #[error("`{entry}` is malformed: {reason}")]
    Malformed { entry: String, reason: String },
    #[error(
        "the program's schema version is {major}.{minor}; this importer reads major version \
         {supported} (PyTorch 2.8 and later)"
    )]
    SchemaVersion {
        major: i64,
        minor: i64,
        supported: i64,
    },
    #[error("node `{node}`: op `{op}` cannot be imported (not supported){}", stack(.stack_trace))]
    UnsupportedOp {
        op: String,
        node: String,
        stack_trace: String,
    },
    #[error("node `{node}` (`{op}`): {reason}{}", stack(.stack_trace))]
    Node {
        op: String,
        node: String,
        reason: String,
        stack_trace: String,
    },
    #[error("weight `{name}` (file `{file}`) needs {expected} bytes, the file holds {found}")]
    WeightSize {
        name: String,
        file: String,
        expected: usize,
        found: usize,
    },
    #[error("`{what}` has dtype code {code}, which minductor does not support")]
    UnsupportedDtype { what: String, code: i64 },
    #[error("size expression `{expr}`: {reason}")]
    SizeExpr { expr: String, reason: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("compiling the imported program failed: {0}")]
    Compile(#[from] CompileError),
}

fn stack(trace: &str) -> String {
    if trace.is_empty() {
        String::new()
    } else {
        format!("\n  from the exported module's source:\n  {trace}")
    }
}

/// Why a call of a compiled `.pt2` program was refused or failed.
#[derive(Debug, Error)]
pub enum CallError {
    #[error("expected {expected} user inputs ({names}), got {found}")]
    Arity {
        expected: usize,
        found: usize,
        names: String,
    },
    #[error(
        "input `{input}` dim {dim} is {size}, outside the range {min}..={max} the program was \
         exported for (symbol {symbol})"
    )]
    OutOfRange {
        input: String,
        dim: usize,
        size: usize,
        symbol: String,
        min: usize,
        max: String,
    },
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    #[error("compiling for these sizes failed: {0}")]
    Compile(#[from] CompileError),
}
