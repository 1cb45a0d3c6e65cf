//! The IR's error type: every message names the op, what it expected and what it found.

use thiserror::Error;

#[derive(Debug, Clone, Error, PartialEq)]
pub enum IrError {
    #[error("{op}: {message}")]
    Type { op: String, message: String },
    #[error("{op}: expected {expected} inputs, got {found}")]
    Arity {
        op: String,
        expected: usize,
        found: usize,
    },
    #[error("graph verification failed at %{node}: {message}")]
    Verify { node: u32, message: String },
}

impl IrError {
    pub fn ty(op: impl Into<String>, message: impl Into<String>) -> Self {
        IrError::Type {
            op: op.into(),
            message: message.into(),
        }
    }
}
