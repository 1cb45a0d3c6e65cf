//! Shapes whose dimensions are either known numbers or named symbols.
//!
//! Symbolic dimensions are part of the type from the start so that dynamic shapes never need an
//! IR rewrite: a kernel reads its sizes from runtime arguments whether they are static or not.

use crate::DType;
use smallvec::SmallVec;
use std::fmt;

/// A symbolic size, e.g. `s0`. Its value is bound at call time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SymId(pub u32);

/// One dimension of a shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Static(usize),
    Sym(SymId),
}

impl Dim {
    /// The size if it is known at compile time.
    pub fn as_static(self) -> Option<usize> {
        match self {
            Dim::Static(n) => Some(n),
            Dim::Sym(_) => None,
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Static(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Sym(s) => write!(f, "s{}", s.0),
        }
    }
}

pub type Shape = SmallVec<[Dim; 4]>;

/// Builds a static shape from sizes.
pub fn static_shape(sizes: &[usize]) -> Shape {
    sizes.iter().map(|&n| Dim::Static(n)).collect()
}

/// The type of a tensor value: element type and shape. Values are always logically contiguous;
/// strides are a matter of the buffers kernels read, not of the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Shape) -> Self {
        TensorType { dtype, shape }
    }

    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Shape::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Sizes of every dimension, if none is symbolic.
    pub fn static_sizes(&self) -> Option<Vec<usize>> {
        self.shape.iter().map(|d| d.as_static()).collect()
    }

    /// Number of elements, if static (and representable: `None` if the product overflows).
    pub fn numel(&self) -> Option<usize> {
        self.static_sizes()
            .and_then(|s| s.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n)))
    }

    /// Bytes of the static dims times the element size: the whole size when every dim is
    /// static, a factor of it otherwise. `None` past [`MAX_TENSOR_BYTES`].
    pub fn static_bytes(&self) -> Option<usize> {
        checked_bytes(
            self.shape.iter().filter_map(|d| d.as_static()),
            self.dtype.size_bytes(),
        )
    }
}

/// The largest byte size of any tensor: what one allocation can hold (`isize::MAX`). Types past
/// it are rejected when they are made (`infer_type`, `Graph::verify`), so products of static
/// sizes of a verified graph cannot overflow.
pub const MAX_TENSOR_BYTES: usize = isize::MAX as usize;

/// `Π sizes · element_bytes`, or `None` if it overflows or exceeds [`MAX_TENSOR_BYTES`].
pub fn checked_bytes(
    sizes: impl IntoIterator<Item = usize>,
    element_bytes: usize,
) -> Option<usize> {
    sizes
        .into_iter()
        .try_fold(element_bytes, |acc, n| acc.checked_mul(n))
        .filter(|&b| b <= MAX_TENSOR_BYTES)
}

/// Checks that the static part of `ty` fits in [`MAX_TENSOR_BYTES`]; the error names `op`.
pub fn check_size(op: &str, ty: &TensorType) -> Result<(), crate::IrError> {
    match ty.static_bytes() {
        Some(_) => Ok(()),
        None => Err(crate::IrError::ty(
            op,
            format!("{ty} holds more than {MAX_TENSOR_BYTES} bytes (its size overflows)"),
        )),
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// NumPy broadcasting of two shapes; `None` when a pair of dimensions is incompatible.
pub fn broadcast_shapes(a: &[Dim], b: &[Dim]) -> Option<Shape> {
    let rank = a.len().max(b.len());
    let mut out = Shape::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            Dim::Static(1)
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            Dim::Static(1)
        };
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (Dim::Static(1), y) => y,
            (x, Dim::Static(1)) => x,
            _ => return None,
        });
    }
    Some(out)
}

/// Formats a shape as `[a, b, c]` for error messages.
pub fn shape_string(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}
