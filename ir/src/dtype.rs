//! Element types. Floating types narrower than f32 are stored narrow and computed in f32.

use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    /// Double precision: the interpreter computes in it (gradient checks); compiled kernels do not.
    F64,
    F16,
    BF16,
    I64,
    Bool,
}

impl DType {
    /// Bytes one element occupies in memory.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
    }

    /// Parses either the short (`f32`) or the PyTorch (`float32`) spelling.
    pub fn parse(name: &str) -> Option<DType> {
        Some(match name {
            "f64" | "float64" | "double" => DType::F64,
            "f32" | "float32" | "float" => DType::F32,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i64" | "int64" | "long" => DType::I64,
            "bool" => DType::Bool,
            _ => return None,
        })
    }

    /// The type two operands are computed in (PyTorch's type promotion, restricted to our dtypes).
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        match (a, b) {
            (x, y) if x == y => x,
            (F64, _) | (_, F64) => F64,
            (F32, _) | (_, F32) => F32,
            (F16, BF16) | (BF16, F16) => F32,
            (F16, _) | (_, F16) => F16,
            (BF16, _) | (_, BF16) => BF16,
            (I64, _) | (_, I64) => I64,
            _ => Bool,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::Bool => "bool",
        })
    }
}
