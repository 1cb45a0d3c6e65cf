//! Tracing: ordinary Rust on [`Traced`] tensors records a [`Graph`].
//!
//! Operators (`+ - * /`, unary `-`) and methods mirror PyTorch's names and argument conventions
//! (negative dims count from the end, `reshape` accepts one `-1`, slices clamp like Python's).
//! An ill-typed op does not panic: the tracer remembers the first error with the caller's source
//! location (`#[track_caller]`), every later op on a poisoned value is skipped, and
//! [`Tracer::finish`] returns the error.

use minductor_ir::{
    static_shape, BinaryOp, CompareOp, DType, Dim, Graph, IrError, NodeId, Op, ReduceOp, Shape,
    TensorType, UnaryOp,
};
use std::cell::RefCell;
use std::fmt;
use std::panic::Location;
use std::rc::Rc;

/// An error found while tracing, with the source location of the offending call.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceError {
    pub location: String,
    pub error: IrError,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "trace error at {}: {}", self.location, self.error)
    }
}

impl std::error::Error for TraceError {}

struct TraceState {
    graph: RefCell<Graph>,
    error: RefCell<Option<TraceError>>,
}

/// Records a graph. Create inputs with [`Tracer::input`], compute on them, then [`Tracer::finish`].
pub struct Tracer {
    state: Rc<TraceState>,
}

/// A tensor being traced: a handle to a node of the graph under construction.
#[derive(Clone)]
pub struct Traced {
    state: Rc<TraceState>,
    /// `None` once an error poisoned this value.
    id: Option<NodeId>,
}

/// Traces `f` into a graph: `f` declares its inputs on the tracer and returns its outputs.
pub fn trace(f: impl FnOnce(&Tracer) -> Vec<Traced>) -> Result<Graph, TraceError> {
    let tracer = Tracer::new();
    let outputs = f(&tracer);
    tracer.finish(&outputs)
}

impl Default for Tracer {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracer {
    pub fn new() -> Self {
        Tracer {
            state: Rc::new(TraceState {
                graph: RefCell::new(Graph::new()),
                error: RefCell::new(None),
            }),
        }
    }

    /// Declares an input with a static shape.
    pub fn input(&self, name: &str, dtype: DType, shape: &[usize]) -> Traced {
        self.input_typed(name, TensorType::new(dtype, static_shape(shape)))
    }

    /// Declares an input of any type (dims may be symbolic).
    pub fn input_typed(&self, name: &str, ty: TensorType) -> Traced {
        let id = self.state.graph.borrow_mut().input(name, ty);
        Traced {
            state: self.state.clone(),
            id: Some(id),
        }
    }

    /// Ends tracing: the graph with `outputs`, or the first error met while tracing.
    pub fn finish(self, outputs: &[Traced]) -> Result<Graph, TraceError> {
        if let Some(err) = self.state.error.borrow().clone() {
            return Err(err);
        }
        let ids: Option<Vec<NodeId>> = outputs.iter().map(|t| t.id).collect();
        let ids = ids.expect("a poisoned value always records an error");
        if outputs.iter().any(|t| !Rc::ptr_eq(&t.state, &self.state)) {
            return Err(TraceError {
                location: "finish".into(),
                error: IrError::ty("finish", "an output belongs to a different tracer"),
            });
        }
        let mut graph = self.state.graph.borrow().clone();
        graph.set_outputs(ids);
        Ok(graph)
    }
}

/// A second operand: a traced tensor or a Rust number (which becomes a 0-d constant).
pub enum Operand<'a> {
    Tensor(&'a Traced),
    Scalar(f64),
}

impl<'a> From<&'a Traced> for Operand<'a> {
    fn from(t: &'a Traced) -> Self {
        Operand::Tensor(t)
    }
}

macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl From<$t> for Operand<'_> {
            fn from(v: $t) -> Self {
                Operand::Scalar(v as f64)
            }
        }
    )*};
}
scalar_operand!(f64, f32, i32, i64);

fn normalize_dim(dim: isize, rank: usize) -> Result<usize, String> {
    if rank == 0 && (dim == 0 || dim == -1) {
        return Ok(0);
    }
    let r = rank as isize;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(format!("dim {dim} out of range for rank {rank}"));
    }
    Ok(d as usize)
}

impl Traced {
    /// The type of this value (`None` if an earlier error poisoned it).
    pub fn ty(&self) -> Option<TensorType> {
        self.id.map(|id| self.state.graph.borrow().ty(id).clone())
    }

    /// Static sizes of this value (empty if poisoned or symbolic).
    pub fn shape(&self) -> Vec<usize> {
        self.ty().and_then(|t| t.static_sizes()).unwrap_or_default()
    }

    pub fn rank(&self) -> usize {
        self.ty().map(|t| t.rank()).unwrap_or(0)
    }

    pub fn dtype(&self) -> Option<DType> {
        self.ty().map(|t| t.dtype)
    }

    #[track_caller]
    fn fail(&self, error: IrError) -> Traced {
        let mut slot = self.state.error.borrow_mut();
        if slot.is_none() {
            *slot = Some(TraceError {
                location: Location::caller().to_string(),
                error,
            });
        }
        Traced {
            state: self.state.clone(),
            id: None,
        }
    }

    #[track_caller]
    fn fail_msg(&self, op: &str, message: String) -> Traced {
        self.fail(IrError::ty(op, message))
    }

    /// Adds `op(inputs)`; the first operand is `self`'s tracer.
    #[track_caller]
    fn apply(&self, op: Op, inputs: &[&Traced]) -> Traced {
        let mut ids = Vec::with_capacity(inputs.len());
        for t in inputs {
            if !Rc::ptr_eq(&t.state, &self.state) {
                return self.fail_msg(&op.name(), "operands come from different tracers".into());
            }
            match t.id {
                Some(id) => ids.push(id),
                None => {
                    return Traced {
                        state: self.state.clone(),
                        id: None,
                    }
                }
            }
        }
        let result = self.state.graph.borrow_mut().add(op, &ids);
        match result {
            Ok(id) => Traced {
                state: self.state.clone(),
                id: Some(id),
            },
            Err(e) => self.fail(e),
        }
    }

    /// A 0-d constant usable against `self`: same float dtype, or f32 next to integers.
    fn constant_like(&self, value: f64) -> Traced {
        let dtype = match self.dtype() {
            Some(d) if d.is_float() => d,
            Some(DType::I64) if value.fract() == 0.0 => DType::I64,
            _ => DType::F32,
        };
        let id = self.state.graph.borrow_mut().constant(value, dtype);
        Traced {
            state: self.state.clone(),
            id: Some(id),
        }
    }

    fn operand(&self, other: Operand<'_>) -> Traced {
        match other {
            Operand::Tensor(t) => t.clone(),
            Operand::Scalar(v) => self.constant_like(v),
        }
    }

    #[track_caller]
    fn binary<'a>(&self, op: BinaryOp, other: impl Into<Operand<'a>>) -> Traced {
        let other = self.operand(other.into());
        self.apply(Op::Binary(op), &[self, &other])
    }

    #[track_caller]
    fn compare<'a>(&self, op: CompareOp, other: impl Into<Operand<'a>>) -> Traced {
        let other = self.operand(other.into());
        self.apply(Op::Compare(op), &[self, &other])
    }

    #[track_caller]
    fn unary(&self, op: UnaryOp) -> Traced {
        self.apply(Op::Unary(op), &[self])
    }

    // ---- pointwise ----------------------------------------------------------------------------
    #[track_caller]
    pub fn add<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Add, other)
    }
    #[track_caller]
    pub fn sub<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Sub, other)
    }
    #[track_caller]
    pub fn mul<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Mul, other)
    }
    #[track_caller]
    pub fn div<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Div, other)
    }
    #[track_caller]
    pub fn pow<'a>(&self, exponent: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Pow, exponent)
    }
    #[track_caller]
    pub fn maximum<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Maximum, other)
    }
    #[track_caller]
    pub fn minimum<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Minimum, other)
    }
    #[track_caller]
    pub fn gt<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Gt, other)
    }
    #[track_caller]
    pub fn ge<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Ge, other)
    }
    #[track_caller]
    pub fn lt<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Lt, other)
    }
    #[track_caller]
    pub fn le<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Le, other)
    }
    #[track_caller]
    pub fn eq<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Eq, other)
    }
    #[track_caller]
    pub fn ne<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Ne, other)
    }
    #[track_caller]
    pub fn neg(&self) -> Traced {
        self.unary(UnaryOp::Neg)
    }
    #[track_caller]
    pub fn abs(&self) -> Traced {
        self.unary(UnaryOp::Abs)
    }
    #[track_caller]
    pub fn exp(&self) -> Traced {
        self.unary(UnaryOp::Exp)
    }
    #[track_caller]
    pub fn log(&self) -> Traced {
        self.unary(UnaryOp::Log)
    }
    #[track_caller]
    pub fn sqrt(&self) -> Traced {
        self.unary(UnaryOp::Sqrt)
    }
    #[track_caller]
    pub fn rsqrt(&self) -> Traced {
        self.unary(UnaryOp::Rsqrt)
    }
    #[track_caller]
    pub fn sin(&self) -> Traced {
        self.unary(UnaryOp::Sin)
    }
    #[track_caller]
    pub fn cos(&self) -> Traced {
        self.unary(UnaryOp::Cos)
    }
    #[track_caller]
    pub fn tanh(&self) -> Traced {
        self.unary(UnaryOp::Tanh)
    }
    #[track_caller]
    pub fn erf(&self) -> Traced {
        self.unary(UnaryOp::Erf)
    }
    #[track_caller]
    pub fn sigmoid(&self) -> Traced {
        self.unary(UnaryOp::Sigmoid)
    }
    #[track_caller]
    pub fn reciprocal(&self) -> Traced {
        self.apply(Op::Reciprocal, &[self])
    }
    #[track_caller]
    pub fn relu(&self) -> Traced {
        self.apply(Op::Relu, &[self])
    }
    #[track_caller]
    pub fn silu(&self) -> Traced {
        self.apply(Op::Silu, &[self])
    }
    /// GELU, erf form (PyTorch's default).
    #[track_caller]
    pub fn gelu(&self) -> Traced {
        self.apply(Op::Gelu { tanh: false }, &[self])
    }
    /// GELU, tanh approximation (`approximate='tanh'`).
    #[track_caller]
    pub fn gelu_tanh(&self) -> Traced {
        self.apply(Op::Gelu { tanh: true }, &[self])
    }
    #[track_caller]
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Traced {
        self.apply(Op::Clamp { min, max }, &[self])
    }
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Traced {
        self.apply(Op::Cast { dtype }, &[self])
    }
    /// `torch.where(self, a, b)`: `self` is the bool condition.
    #[track_caller]
    pub fn where_<'a, 'b>(&self, a: impl Into<Operand<'a>>, b: impl Into<Operand<'b>>) -> Traced {
        let (a, b) = (a.into(), b.into());
        let like = match (&a, &b) {
            (Operand::Tensor(t), _) | (_, Operand::Tensor(t)) => (*t).clone(),
            _ => self.constant_like(0.0).cast(DType::F32),
        };
        let (a, b) = (like.operand(a), like.operand(b));
        self.apply(Op::Where, &[self, &a, &b])
    }

    // ---- reductions ---------------------------------------------------------------------------
    #[track_caller]
    fn axes(&self, op: &str, dims: &[isize]) -> Result<Vec<usize>, Traced> {
        let rank = self.rank();
        let mut axes = Vec::new();
        for &d in dims {
            match normalize_dim(d, rank) {
                Ok(a) if rank > 0 => axes.push(a),
                Ok(_) => {}
                Err(m) => return Err(self.fail_msg(op, m)),
            }
        }
        axes.sort_unstable();
        if axes.windows(2).any(|w| w[0] == w[1]) {
            return Err(self.fail_msg(op, format!("dims {dims:?} repeat a dimension")));
        }
        Ok(axes)
    }

    #[track_caller]
    fn reduce(&self, op: ReduceOp, dims: &[isize], keepdim: bool) -> Traced {
        match self.axes("reduce", dims) {
            Ok(axes) => self.apply(Op::Reduce { op, axes, keepdim }, &[self]),
            Err(t) => t,
        }
    }

    /// Sum over `dims` (an empty list sums every dim, like `x.sum()`).
    #[track_caller]
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Traced {
        self.reduce(ReduceOp::Sum, &self.dims_or_all(dims), keepdim)
    }
    #[track_caller]
    pub fn amax(&self, dims: &[isize], keepdim: bool) -> Traced {
        self.reduce(ReduceOp::Max, &self.dims_or_all(dims), keepdim)
    }
    #[track_caller]
    pub fn amin(&self, dims: &[isize], keepdim: bool) -> Traced {
        self.reduce(ReduceOp::Min, &self.dims_or_all(dims), keepdim)
    }
    #[track_caller]
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Traced {
        match self.axes("mean", &self.dims_or_all(dims)) {
            Ok(axes) => self.apply(Op::Mean { axes, keepdim }, &[self]),
            Err(t) => t,
        }
    }
    /// Variance; `unbiased` selects Bessel's correction (PyTorch's default is `true`).
    #[track_caller]
    pub fn var(&self, dims: &[isize], unbiased: bool, keepdim: bool) -> Traced {
        match self.axes("var", &self.dims_or_all(dims)) {
            Ok(axes) => self.apply(
                Op::Var {
                    axes,
                    correction: unbiased as usize,
                    keepdim,
                },
                &[self],
            ),
            Err(t) => t,
        }
    }

    fn dims_or_all(&self, dims: &[isize]) -> Vec<isize> {
        if dims.is_empty() {
            (0..self.rank() as isize).collect()
        } else {
            dims.to_vec()
        }
    }

    #[track_caller]
    pub fn softmax(&self, dim: isize) -> Traced {
        match normalize_dim(dim, self.rank()) {
            Ok(dim) => self.apply(Op::Softmax { dim }, &[self]),
            Err(m) => self.fail_msg("softmax", m),
        }
    }
    #[track_caller]
    pub fn log_softmax(&self, dim: isize) -> Traced {
        match normalize_dim(dim, self.rank()) {
            Ok(dim) => self.apply(Op::LogSoftmax { dim }, &[self]),
            Err(m) => self.fail_msg("log_softmax", m),
        }
    }
    /// `F.layer_norm(x, normalized_shape, weight, bias, eps)`.
    #[track_caller]
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Traced>,
        bias: Option<&Traced>,
        eps: f64,
    ) -> Traced {
        let shape = self.shape();
        let k = normalized_shape.len();
        if k == 0 || k > shape.len() || shape[shape.len() - k..] != *normalized_shape {
            return self.fail_msg(
                "layer_norm",
                format!("normalized_shape {normalized_shape:?} does not match the trailing dims of {shape:?}"),
            );
        }
        let op = Op::LayerNorm {
            normalized_rank: k,
            eps,
            has_weight: weight.is_some(),
            has_bias: bias.is_some(),
        };
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        self.apply(op, &inputs)
    }

    // ---- matrix products ----------------------------------------------------------------------
    /// `torch.matmul`: 1-d operands, batch broadcasting.
    #[track_caller]
    pub fn matmul(&self, other: &Traced) -> Traced {
        self.apply(Op::Matmul, &[self, other])
    }
    /// `torch.bmm`: both operands rank 3 with equal batch.
    #[track_caller]
    pub fn bmm(&self, other: &Traced) -> Traced {
        let (a, b) = (self.shape(), other.shape());
        if a.len() != 3 || b.len() != 3 || a[0] != b[0] {
            return self.fail_msg(
                "bmm",
                format!("expected [b, n, m] and [b, m, p], found {a:?} and {b:?}"),
            );
        }
        self.matmul(other)
    }
    /// `F.linear(x, weight, bias)`: `x @ weight^T + bias`.
    #[track_caller]
    pub fn linear(&self, weight: &Traced, bias: Option<&Traced>) -> Traced {
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        self.apply(
            Op::Linear {
                has_bias: bias.is_some(),
            },
            &inputs,
        )
    }

    // ---- views and data movement --------------------------------------------------------------
    #[track_caller]
    pub fn permute(&self, dims: &[isize]) -> Traced {
        let rank = self.rank();
        let perm: Result<Vec<usize>, String> =
            dims.iter().map(|&d| normalize_dim(d, rank)).collect();
        match perm {
            Ok(perm) => self.apply(Op::Permute { perm }, &[self]),
            Err(m) => self.fail_msg("permute", m),
        }
    }
    #[track_caller]
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Traced {
        let rank = self.rank();
        match (normalize_dim(dim0, rank), normalize_dim(dim1, rank)) {
            (Ok(a), Ok(b)) => {
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(a, b);
                self.apply(Op::Permute { perm }, &[self])
            }
            (Err(m), _) | (_, Err(m)) => self.fail_msg("transpose", m),
        }
    }
    /// `reshape` with at most one `-1`.
    #[track_caller]
    pub fn reshape(&self, shape: &[isize]) -> Traced {
        let numel: usize = self.shape().iter().product();
        let known: usize = shape
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .product();
        let holes = shape.iter().filter(|&&d| d == -1).count();
        if holes > 1
            || shape.iter().any(|&d| d < -1)
            || (holes == 1 && (known == 0 || numel % known != 0))
        {
            return self.fail_msg(
                "reshape",
                format!("cannot reshape {:?} to {shape:?}", self.shape()),
            );
        }
        let sizes: Shape = shape
            .iter()
            .map(|&d| Dim::Static(if d == -1 { numel / known } else { d as usize }))
            .collect();
        self.apply(Op::Reshape { shape: sizes }, &[self])
    }
    /// `expand`; `-1` keeps a dimension's size.
    #[track_caller]
    pub fn expand(&self, shape: &[isize]) -> Traced {
        let own = self.shape();
        let lead = shape.len().saturating_sub(own.len());
        let sizes: Shape = shape
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                Dim::Static(if d < 0 && i >= lead {
                    own[i - lead]
                } else {
                    d.max(0) as usize
                })
            })
            .collect();
        self.apply(Op::Expand { shape: sizes }, &[self])
    }
    /// `x[..., start:end:step, ...]` along `dim` with Python's clamping of negative/oversized bounds;
    /// `None` bounds mean the whole range.
    #[track_caller]
    pub fn slice(
        &self,
        dim: isize,
        start: Option<isize>,
        end: Option<isize>,
        step: usize,
    ) -> Traced {
        let shape = self.shape();
        let dim = match normalize_dim(dim, shape.len()) {
            Ok(d) if !shape.is_empty() => d,
            Ok(_) => return self.fail_msg("slice", "cannot slice a 0-d tensor".into()),
            Err(m) => return self.fail_msg("slice", m),
        };
        if step == 0 {
            return self.fail_msg("slice", "step must be positive".into());
        }
        let size = shape[dim] as isize;
        let clamp = |v: isize| (if v < 0 { v + size } else { v }).clamp(0, size) as usize;
        let start = start.map_or(0, clamp);
        let end = end.map_or(size as usize, clamp).max(start);
        self.apply(
            Op::Slice {
                dim,
                start,
                end,
                step,
            },
            &[self],
        )
    }
    /// `torch.cat(tensors, dim)`.
    #[track_caller]
    pub fn cat(tensors: &[&Traced], dim: isize) -> Traced {
        let first = tensors.first().expect("cat needs at least one tensor");
        match normalize_dim(dim, first.rank()) {
            Ok(dim) => first.apply(Op::Cat { dim }, tensors),
            Err(m) => first.fail_msg("cat", m),
        }
    }
    /// `F.embedding(self, table)`: rows of `table` picked by the i64 indices in `self`.
    #[track_caller]
    pub fn embedding(&self, table: &Traced) -> Traced {
        self.apply(Op::Gather, &[table, self])
    }
}

impl fmt::Debug for Traced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.id, self.ty()) {
            (Some(id), Some(ty)) => write!(f, "Traced({id}: {ty})"),
            _ => f.write_str("Traced(<poisoned>)"),
        }
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl std::ops::$trait<&Traced> for &Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: &Traced) -> Traced {
                self.binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<Traced> for Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: Traced) -> Traced {
                (&self).binary(BinaryOp::$op, &rhs)
            }
        }
        impl std::ops::$trait<&Traced> for Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: &Traced) -> Traced {
                (&self).binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<Traced> for &Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: Traced) -> Traced {
                self.binary(BinaryOp::$op, &rhs)
            }
        }
        impl std::ops::$trait<f64> for &Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: f64) -> Traced {
                self.binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<f64> for Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: f64) -> Traced {
                (&self).binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<&Traced> for f64 {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: &Traced) -> Traced {
                rhs.constant_like(self).binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<Traced> for f64 {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: Traced) -> Traced {
                rhs.constant_like(self).binary(BinaryOp::$op, &rhs)
            }
        }
    };
}
operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl std::ops::Neg for &Traced {
    type Output = Traced;
    #[track_caller]
    fn neg(self) -> Traced {
        self.unary(UnaryOp::Neg)
    }
}

impl std::ops::Neg for Traced {
    type Output = Traced;
    #[track_caller]
    fn neg(self) -> Traced {
        (&self).unary(UnaryOp::Neg)
    }
}
