//! The op set, in two tiers.
//!
//! *Composite* ops are what users trace (softmax, layer_norm, gelu, linear, ...). *Prims* are the
//! small closed set every later pass sees; `passes::decompose` rewrites composites into prims.
//! Adding an op means a variant here, its type rule in [`infer_type`], its reference semantics in
//! `runtime::interpret`, and a decomposition or a lowering: exhaustive matches point at each.

use crate::{broadcast_shapes, shape_string, DType, Dim, IrError, Shape, TensorType};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
    Erf,
    Sigmoid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// The geometry of a 2-d sliding window (convolution or pooling): per spatial dim (height,
/// width) its kernel size, stride, zero padding on both sides and dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window2d {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

impl Window2d {
    /// Kernel offsets per channel: `KH · KW`.
    pub fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }

    /// The output size `(OH, OW)` of the window sliding over an `h × w` input, or `None` when a
    /// size is zero or the dilated window does not fit the padded input.
    pub fn output_size(&self, h: usize, w: usize) -> Option<[usize; 2]> {
        let mut out = [0; 2];
        for (d, size) in [h, w].into_iter().enumerate() {
            if self.kernel[d] == 0 || self.stride[d] == 0 || self.dilation[d] == 0 {
                return None;
            }
            let padded = size.checked_add(self.padding[d].checked_mul(2)?)?;
            let span = (self.kernel[d] - 1).checked_mul(self.dilation[d])? + 1;
            if span > padded {
                return None;
            }
            out[d] = (padded - span) / self.stride[d] + 1;
        }
        Some(out)
    }
}

impl fmt::Display for Window2d {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pair = |p: [usize; 2]| format!("{}x{}", p[0], p[1]);
        write!(
            f,
            "kernel={}, stride={}, padding={}, dilation={}",
            pair(self.kernel),
            pair(self.stride),
            pair(self.padding),
            pair(self.dilation)
        )
    }
}

/// Where the bounds of a [`Op::Slice`] count from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SliceFrom {
    /// Both from the start of the dim: elements `start, start+step, .. < end`.
    Start,
    /// Both back from the end (elements `size - start, .. < size - end`, so `start >= end`):
    /// how a slice of a symbolic dim such as `x[:, -1:]` keeps a static size and a symbolic
    /// offset.
    End,
    /// `start` from the start, `end` back from the end (elements `start, .. < size - end`, step
    /// 1): `x[:, 1:]` of a symbolic dim, whose size is the derived `s0 - 1`.
    StartToEnd,
}

/// One graph operation. Attributes live in the variant; operands are the node's inputs.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    // ---- sources --------------------------------------------------------------------------
    /// A graph input; its type is given when the input is declared.
    Input {
        name: String,
    },
    /// A 0-d constant of the node's dtype. Broadcasting makes it usable against any shape.
    Constant {
        value: f64,
    },

    // ---- prims ------------------------------------------------------------------------------
    Unary(UnaryOp),
    /// Elementwise with NumPy broadcasting and type promotion.
    Binary(BinaryOp),
    /// Elementwise comparison with broadcasting; the result is bool.
    Compare(CompareOp),
    /// `where(cond, a, b)` with broadcasting of all three.
    Where,
    Cast {
        dtype: DType,
    },
    /// Reduce over `axes` (sorted, unique, in range).
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// View with a new shape of the same element count.
    Reshape {
        shape: Shape,
    },
    Permute {
        perm: Vec<usize>,
    },
    /// Broadcast size-1 dims (and new leading dims) to `shape`.
    Expand {
        shape: Shape,
    },
    /// Elements `start, start+step, ... < end` of `dim` (`from` says where each bound counts
    /// from: see [`SliceFrom`]); bounds are normalised (0 <= start <= end <= size).
    Slice {
        dim: usize,
        start: usize,
        end: usize,
        step: usize,
        from: SliceFrom,
    },
    Cat {
        dim: usize,
    },
    /// `table[indices]` along the table's first dim (embedding lookup): inputs `(table, indices)`.
    Gather,
    /// Batched matrix product with broadcast batch dims. Prim form: both operands rank >= 2.
    Matmul,
    /// `torch.gather(x, dim, index)`: inputs `(x, index)` of equal rank, `index` i64 and sized like
    /// `x` except along `dim`; `out[p] = x[p with p[dim] = index[p]]`.
    TakeAlong {
        dim: usize,
    },
    /// `zeros(..).scatter_add(dim, index, src)`: inputs `(index, src)` of equal rank, `index` i64
    /// and sized like `src` or 1 (broadcast) in every dim; the result is `src`'s shape with `dim`
    /// of `size`, and `out[p with p[dim] = index[p]] += src[p]` for every position `p` of `src`
    /// (repeated indices accumulate). The derivative of `Gather` and `TakeAlong`.
    ScatterAdd {
        dim: usize,
        size: Dim,
    },
    /// The identity whose derivative is zero (`x.detach()`, stop-gradient).
    Detach,
    /// `x.cumsum(dim)`: running sums along `dim` (floating-point or i64 `x`; i64 sums wrap), a
    /// scan.
    CumSum {
        dim: usize,
    },
    /// `torch.arange(len, dtype)`: the 1-d tensor `[0, 1, .., len - 1]` of `dtype` (no operands).
    /// Other starts and steps, masks (`triu`/`tril`, causal attention) and arg-reductions are
    /// built from it by the tracer.
    Iota {
        len: Dim,
        dtype: DType,
    },
    /// `F.unfold(x, kernel, dilation, padding, stride)` (aten's `im2col`) on a floating-point
    /// `x: [N, C, H, W]`: `[N, C·KH·KW, OH·OW]`, whose element `(n, c·KH·KW + i·KW + j, oh·OW +
    /// ow)` is `x[n, c, oh·SH − PH + i·DH, ow·SW − PW + j·DW]`, or zero where that is outside `x`.
    /// A convolution is a GEMM of the weight with it. `decompose` keeps it only where a GEMM reads
    /// it as its right operand (`fuse` then packs the GEMM's panels from `x` directly: an
    /// implicit GEMM, no im2col buffer) and expands it into pads, strided slices and a `cat`
    /// everywhere else (so `autodiff` and kernels never see it).
    Im2col {
        window: Window2d,
    },

    // ---- composites (decomposed before fusion) ---------------------------------------------
    Relu,
    Silu,
    Gelu {
        tanh: bool,
    },
    Reciprocal,
    Clamp {
        min: Option<f64>,
        max: Option<f64>,
    },
    Softmax {
        dim: usize,
    },
    LogSoftmax {
        dim: usize,
    },
    /// Normalise over the last `normalized_rank` dims; optional weight and bias follow `x`.
    LayerNorm {
        normalized_rank: usize,
        eps: f64,
        has_weight: bool,
        has_bias: bool,
    },
    /// `x @ w^T (+ b)`; inputs `(x, w[, b])`.
    Linear {
        has_bias: bool,
    },
    Mean {
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// Variance with Bessel-style `correction` (0 = population, 1 = unbiased).
    Var {
        axes: Vec<usize>,
        correction: usize,
        keepdim: bool,
    },
    /// The gradient of a loss with respect to one value (`torch.autograd.grad`, functional):
    /// inputs `(loss, [seed,] wrt_0, .., wrt_n)`; the result is `d loss / d wrt_index`, typed like
    /// `wrt_index`. Without a seed the loss must be 0-d (the seed is 1); a seed has the loss's type.
    /// Nodes with the same inputs share one backward pass. `passes::autodiff` expands it.
    Grad {
        index: usize,
        seeded: bool,
    },
}

impl Op {
    /// True for ops every pass after `decompose` may see.
    pub fn is_prim(&self) -> bool {
        !matches!(
            self,
            Op::Relu
                | Op::Silu
                | Op::Gelu { .. }
                | Op::Reciprocal
                | Op::Clamp { .. }
                | Op::Softmax { .. }
                | Op::LogSoftmax { .. }
                | Op::LayerNorm { .. }
                | Op::Linear { .. }
                | Op::Mean { .. }
                | Op::Var { .. }
                | Op::Grad { .. }
        )
    }

    /// True for ops that only re-index their input (no arithmetic).
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::Reshape { .. } | Op::Permute { .. } | Op::Expand { .. } | Op::Slice { .. }
        )
    }

    /// True for elementwise prims (fusible as a scalar expression).
    pub fn is_pointwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Cast { .. }
        )
    }

    /// Short name used in the text format and in error messages.
    pub fn name(&self) -> String {
        match self {
            Op::Input { .. } => "input".into(),
            Op::Constant { .. } => "constant".into(),
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Compare(c) => format!("{c:?}").to_lowercase(),
            Op::Where => "where".into(),
            Op::Cast { .. } => "cast".into(),
            Op::Reduce { op, .. } => format!("reduce_{}", format!("{op:?}").to_lowercase()),
            Op::Reshape { .. } => "reshape".into(),
            Op::Permute { .. } => "permute".into(),
            Op::Expand { .. } => "expand".into(),
            Op::Slice { .. } => "slice".into(),
            Op::Cat { .. } => "cat".into(),
            Op::Gather => "gather".into(),
            Op::Matmul => "matmul".into(),
            Op::TakeAlong { .. } => "take_along".into(),
            Op::ScatterAdd { .. } => "scatter_add".into(),
            Op::Detach => "detach".into(),
            Op::Iota { .. } => "iota".into(),
            Op::CumSum { .. } => "cumsum".into(),
            Op::Im2col { .. } => "im2col".into(),
            Op::Grad { .. } => "grad".into(),
            Op::Relu => "relu".into(),
            Op::Silu => "silu".into(),
            Op::Gelu { .. } => "gelu".into(),
            Op::Reciprocal => "reciprocal".into(),
            Op::Clamp { .. } => "clamp".into(),
            Op::Softmax { .. } => "softmax".into(),
            Op::LogSoftmax { .. } => "log_softmax".into(),
            Op::LayerNorm { .. } => "layer_norm".into(),
            Op::Linear { .. } => "linear".into(),
            Op::Mean { .. } => "mean".into(),
            Op::Var { .. } => "var".into(),
        }
    }

    /// The attributes in the text format, e.g. `[axes=[2], keepdim=false]`; empty when none.
    pub fn attributes(&self) -> String {
        let list = |v: &[usize]| {
            format!(
                "[{}]",
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        match self {
            Op::Input { name } => format!("[{name}]"),
            Op::Constant { value } => format!("[{value:?}]"),
            Op::Cast { dtype } => format!("[{dtype}]"),
            Op::Reduce { axes, keepdim, .. } | Op::Mean { axes, keepdim } => {
                format!("[axes={}, keepdim={keepdim}]", list(axes))
            }
            Op::Var {
                axes,
                correction,
                keepdim,
            } => {
                format!(
                    "[axes={}, correction={correction}, keepdim={keepdim}]",
                    list(axes)
                )
            }
            Op::Reshape { shape } | Op::Expand { shape } => format!("[{}]", shape_string(shape)),
            Op::Permute { perm } => format!("[{}]", list(perm)),
            Op::Slice {
                dim,
                start,
                end,
                step,
                from: SliceFrom::Start,
            } => format!("[dim={dim}, {start}:{end}:{step}]"),
            Op::Slice {
                dim,
                start,
                end,
                step,
                from: SliceFrom::StartToEnd,
            } => format!("[dim={dim}, {start}:end-{end}:{step}]"),
            Op::Slice {
                dim,
                start,
                end,
                step,
                from: SliceFrom::End,
            } => format!("[dim={dim}, end-{start}:end-{end}:{step}]"),
            Op::Cat { dim }
            | Op::Softmax { dim }
            | Op::LogSoftmax { dim }
            | Op::TakeAlong { dim }
            | Op::CumSum { dim } => {
                format!("[dim={dim}]")
            }
            Op::ScatterAdd { dim, size } => format!("[dim={dim}, size={size}]"),
            Op::Im2col { window } => format!("[{window}]"),
            Op::Iota { len, dtype } => format!("[len={len}, {dtype}]"),
            Op::Grad { index, seeded } => {
                if *seeded {
                    format!("[wrt={index}, seeded]")
                } else {
                    format!("[wrt={index}]")
                }
            }
            Op::Gelu { tanh } => {
                if *tanh {
                    "[tanh]".into()
                } else {
                    String::new()
                }
            }
            Op::Clamp { min, max } => format!("[min={min:?}, max={max:?}]"),
            Op::LayerNorm {
                normalized_rank,
                eps,
                has_weight,
                has_bias,
            } => {
                // The operand count tells none (1) from both (3); with two, say which it is.
                let only = match (has_weight, has_bias) {
                    (true, false) => ", weight only",
                    (false, true) => ", bias only",
                    _ => "",
                };
                format!("[normalized_rank={normalized_rank}, eps={eps:e}{only}]")
            }
            _ => String::new(),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.name(), self.attributes())
    }
}

fn expect_arity(op: &Op, inputs: &[&TensorType], expected: usize) -> Result<(), IrError> {
    if inputs.len() != expected {
        return Err(IrError::Arity {
            op: op.name(),
            expected,
            found: inputs.len(),
        });
    }
    Ok(())
}

fn expect_float(op: &Op, t: &TensorType) -> Result<(), IrError> {
    if !t.dtype.is_float() {
        return Err(IrError::ty(
            op.name(),
            format!("expected a floating-point tensor, found {t}"),
        ));
    }
    Ok(())
}

fn check_axes(op: &Op, axes: &[usize], rank: usize) -> Result<(), IrError> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank || (i > 0 && axes[i - 1] >= a) {
            return Err(IrError::ty(
                op.name(),
                format!("axes {axes:?} must be sorted, unique and < rank {rank}"),
            ));
        }
    }
    Ok(())
}

fn reduced_shape(shape: &[Dim], axes: &[usize], keepdim: bool) -> Shape {
    let mut out = Shape::new();
    for (i, &d) in shape.iter().enumerate() {
        if axes.contains(&i) {
            if keepdim {
                out.push(Dim::Static(1));
            }
        } else {
            out.push(d);
        }
    }
    out
}

fn broadcast(op: &Op, a: &TensorType, b: &TensorType) -> Result<Shape, IrError> {
    broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| {
        IrError::ty(
            op.name(),
            format!(
                "cannot broadcast shapes {} and {}",
                shape_string(&a.shape),
                shape_string(&b.shape)
            ),
        )
    })
}

/// The result type of `op` applied to operands of the given types, or why it is ill-typed.
/// Sources (`Input`, `Constant`) have no rule: their type is declared.
pub fn infer_type(op: &Op, inputs: &[&TensorType]) -> Result<TensorType, IrError> {
    let ty = infer_type_unchecked(op, inputs)?;
    crate::shape::check_size(&op.name(), &ty)?;
    Ok(ty)
}

/// The type rule proper; [`infer_type`] adds the size check.
fn infer_type_unchecked(op: &Op, inputs: &[&TensorType]) -> Result<TensorType, IrError> {
    let first = || inputs[0].clone();
    match op {
        Op::Input { .. } | Op::Constant { .. } => Err(IrError::ty(
            op.name(),
            "sources have declared types; use Graph::input or Graph::constant",
        )),
        Op::Unary(u) => {
            expect_arity(op, inputs, 1)?;
            if !matches!(u, UnaryOp::Neg | UnaryOp::Abs) || inputs[0].dtype == DType::Bool {
                expect_float(op, inputs[0])?;
            }
            Ok(first())
        }
        Op::Relu | Op::Silu | Op::Gelu { .. } | Op::Reciprocal | Op::Clamp { .. } => {
            expect_arity(op, inputs, 1)?;
            expect_float(op, inputs[0])?;
            Ok(first())
        }
        Op::Binary(b) => {
            expect_arity(op, inputs, 2)?;
            let dtype = DType::promote(inputs[0].dtype, inputs[1].dtype);
            if dtype == DType::Bool {
                return Err(IrError::ty(
                    op.name(),
                    "arithmetic on bool tensors is not supported; cast first",
                ));
            }
            if matches!(b, BinaryOp::Div | BinaryOp::Pow) && !dtype.is_float() {
                return Err(IrError::ty(
                    op.name(),
                    "needs floating-point operands; cast integers first",
                ));
            }
            Ok(TensorType::new(dtype, broadcast(op, inputs[0], inputs[1])?))
        }
        Op::Compare(_) => {
            expect_arity(op, inputs, 2)?;
            Ok(TensorType::new(
                DType::Bool,
                broadcast(op, inputs[0], inputs[1])?,
            ))
        }
        Op::Where => {
            expect_arity(op, inputs, 3)?;
            if inputs[0].dtype != DType::Bool {
                return Err(IrError::ty(
                    op.name(),
                    format!("condition must be bool, found {}", inputs[0]),
                ));
            }
            let ab = broadcast(op, inputs[1], inputs[2])?;
            let shape = broadcast(op, inputs[0], &TensorType::new(DType::Bool, ab))?;
            Ok(TensorType::new(
                DType::promote(inputs[1].dtype, inputs[2].dtype),
                shape,
            ))
        }
        Op::Cast { dtype } => {
            expect_arity(op, inputs, 1)?;
            Ok(TensorType::new(*dtype, inputs[0].shape.clone()))
        }
        Op::Reduce {
            axes,
            keepdim,
            op: reduce,
        } => {
            expect_arity(op, inputs, 1)?;
            check_axes(op, axes, inputs[0].rank())?;
            if inputs[0].dtype == DType::Bool {
                return Err(IrError::ty(
                    op.name(),
                    "reductions over bool tensors are not supported; cast first",
                ));
            }
            if *reduce != ReduceOp::Sum {
                for &a in axes {
                    if inputs[0].shape[a] == Dim::Static(0) {
                        return Err(IrError::ty(
                            op.name(),
                            format!("cannot take {reduce:?} over empty dim {a}"),
                        ));
                    }
                }
            }
            Ok(TensorType::new(
                inputs[0].dtype,
                reduced_shape(&inputs[0].shape, axes, *keepdim),
            ))
        }
        Op::Mean { axes, keepdim } | Op::Var { axes, keepdim, .. } => {
            expect_arity(op, inputs, 1)?;
            expect_float(op, inputs[0])?;
            check_axes(op, axes, inputs[0].rank())?;
            Ok(TensorType::new(
                inputs[0].dtype,
                reduced_shape(&inputs[0].shape, axes, *keepdim),
            ))
        }
        Op::Reshape { shape } => {
            expect_arity(op, inputs, 1)?;
            let (from, to) = (
                inputs[0].numel(),
                TensorType::new(inputs[0].dtype, shape.clone()).numel(),
            );
            match (from, to) {
                (Some(a), Some(b)) if a == b => {}
                (Some(_), Some(_)) => {
                    return Err(IrError::ty(
                        op.name(),
                        format!(
                            "cannot reshape {} to {}: element counts differ",
                            inputs[0],
                            shape_string(shape)
                        ),
                    ))
                }
                _ if inputs[0].shape == *shape => {}
                // Symbolic counts: the products of the dims must be the same polynomial.
                _ if crate::SizeExpr::product(&inputs[0].shape)
                    == crate::SizeExpr::product(shape) => {}
                _ => {
                    return Err(IrError::ty(
                        op.name(),
                        format!(
                            "cannot reshape {} to {}: element counts differ",
                            inputs[0],
                            shape_string(shape)
                        ),
                    ))
                }
            }
            Ok(TensorType::new(inputs[0].dtype, shape.clone()))
        }
        Op::Permute { perm } => {
            expect_arity(op, inputs, 1)?;
            let rank = inputs[0].rank();
            let mut seen = vec![false; rank];
            if perm.len() != rank
                || perm
                    .iter()
                    .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
            {
                return Err(IrError::ty(
                    op.name(),
                    format!("{perm:?} is not a permutation of {rank} dims"),
                ));
            }
            Ok(TensorType::new(
                inputs[0].dtype,
                perm.iter().map(|&p| inputs[0].shape[p]).collect(),
            ))
        }
        Op::Expand { shape } => {
            expect_arity(op, inputs, 1)?;
            let from = &inputs[0].shape;
            let ok = shape.len() >= from.len()
                && from
                    .iter()
                    .zip(&shape[shape.len() - from.len()..])
                    .all(|(&f, &t)| f == t || f == Dim::Static(1));
            if !ok {
                return Err(IrError::ty(
                    op.name(),
                    format!(
                        "cannot expand {} to {}",
                        shape_string(from),
                        shape_string(shape)
                    ),
                ));
            }
            Ok(TensorType::new(inputs[0].dtype, shape.clone()))
        }
        Op::Slice {
            dim,
            start,
            end,
            step,
            from,
        } => {
            expect_arity(op, inputs, 1)?;
            let rank = inputs[0].rank();
            if *dim >= rank {
                return Err(IrError::ty(
                    op.name(),
                    format!("dim {dim} out of range for rank {rank}"),
                ));
            }
            if *from == SliceFrom::StartToEnd {
                // The size is `size - start - end`, a derived symbol of a symbolic dim; a call
                // binding a size that makes it negative is refused when the program binds it.
                let size = crate::SizeExpr::of_dim(inputs[0].shape[*dim]);
                let taken = size.plus(&crate::SizeExpr::Const(-((start + end) as i64)));
                let extent = Dim::of_expr(&taken).filter(|_| *step == 1);
                let Some(extent) = extent else {
                    return Err(IrError::ty(
                        op.name(),
                        format!(
                            "bounds {start}:end-{end}:{step} invalid for dim {dim} of {}",
                            inputs[0]
                        ),
                    ));
                };
                let mut shape = inputs[0].shape.clone();
                shape[*dim] = extent;
                return Ok(TensorType::new(inputs[0].dtype, shape));
            }
            if *from == SliceFrom::End {
                // Counted from the end: a static dim must hold `start` elements; a symbolic one
                // is checked when a call binds it (the kernel-IR verifier proves the offset
                // `size - start` inside the buffer).
                let fits = inputs[0].shape[*dim]
                    .as_static()
                    .is_none_or(|n| *start <= n);
                if *step == 0 || start < end || !fits {
                    return Err(IrError::ty(
                        op.name(),
                        format!(
                            "bounds end-{start}:end-{end}:{step} invalid for dim {dim} of {}",
                            inputs[0]
                        ),
                    ));
                }
                let mut shape = inputs[0].shape.clone();
                shape[*dim] = Dim::Static((start - end).div_ceil(*step));
                return Ok(TensorType::new(inputs[0].dtype, shape));
            }
            let size = inputs[0].shape[*dim].as_static().ok_or_else(|| {
                IrError::ty(
                    op.name(),
                    "a slice of a symbolic dim counts both bounds from its end",
                )
            })?;
            if *step == 0 || start > end || *end > size {
                return Err(IrError::ty(
                    op.name(),
                    format!("bounds {start}:{end}:{step} invalid for dim {dim} of size {size}"),
                ));
            }
            let mut shape = inputs[0].shape.clone();
            shape[*dim] = Dim::Static((end - start).div_ceil(*step));
            Ok(TensorType::new(inputs[0].dtype, shape))
        }
        Op::Cat { dim } => {
            if inputs.is_empty() {
                return Err(IrError::ty(op.name(), "needs at least one tensor"));
            }
            let rank = inputs[0].rank();
            if *dim >= rank {
                return Err(IrError::ty(
                    op.name(),
                    format!("dim {dim} out of range for rank {rank}"),
                ));
            }
            // The extent is the sum of the operands' (a size expression when one is symbolic:
            // a KV cache `[.., s0, ..]` and one new row give `s0 + 1`).
            let mut total = crate::SizeExpr::Const(0);
            for t in inputs {
                let same_rest = t.rank() == rank
                    && t.dtype == inputs[0].dtype
                    && (0..rank).all(|d| d == *dim || t.shape[d] == inputs[0].shape[d]);
                if !same_rest {
                    return Err(IrError::ty(
                        op.name(),
                        format!("{} does not match {} outside dim {dim}", t, inputs[0]),
                    ));
                }
                total = total.plus(&crate::SizeExpr::of_dim(t.shape[*dim]));
            }
            let mut shape = inputs[0].shape.clone();
            shape[*dim] = Dim::of_expr(&total)
                .ok_or_else(|| IrError::ty(op.name(), format!("the extent {total} is negative")))?;
            Ok(TensorType::new(inputs[0].dtype, shape))
        }
        Op::Gather => {
            expect_arity(op, inputs, 2)?;
            let (table, indices) = (inputs[0], inputs[1]);
            if indices.dtype != DType::I64 {
                return Err(IrError::ty(
                    op.name(),
                    format!("indices must be i64, found {indices}"),
                ));
            }
            if table.rank() < 1 {
                return Err(IrError::ty(op.name(), "table must have rank >= 1"));
            }
            let mut shape = indices.shape.clone();
            shape.extend_from_slice(&table.shape[1..]);
            Ok(TensorType::new(table.dtype, shape))
        }
        Op::Matmul => {
            expect_arity(op, inputs, 2)?;
            matmul_type(op, inputs[0], inputs[1])
        }
        Op::TakeAlong { dim } => {
            expect_arity(op, inputs, 2)?;
            let (x, index) = (inputs[0], inputs[1]);
            if index.dtype != DType::I64 {
                return Err(IrError::ty(
                    op.name(),
                    format!("index must be i64, found {index}"),
                ));
            }
            let same_rank = x.rank() == index.rank() && *dim < x.rank();
            if !same_rank || (0..x.rank()).any(|d| d != *dim && x.shape[d] != index.shape[d]) {
                return Err(IrError::ty(
                    op.name(),
                    format!("index {index} must match {x} outside dim {dim}"),
                ));
            }
            if x.shape[*dim] == Dim::Static(0) && index.shape[*dim] != Dim::Static(0) {
                return Err(IrError::ty(
                    op.name(),
                    format!("cannot take from empty dim {dim} of {x}"),
                ));
            }
            Ok(TensorType::new(x.dtype, index.shape.clone()))
        }
        Op::ScatterAdd { dim, size } => {
            expect_arity(op, inputs, 2)?;
            let (index, src) = (inputs[0], inputs[1]);
            if index.dtype != DType::I64 {
                return Err(IrError::ty(
                    op.name(),
                    format!("index must be i64, found {index}"),
                ));
            }
            expect_float(op, src)?;
            let fits = index.rank() == src.rank()
                && *dim < src.rank()
                && (0..src.rank())
                    .all(|d| index.shape[d] == src.shape[d] || index.shape[d] == Dim::Static(1));
            if !fits {
                return Err(IrError::ty(
                    op.name(),
                    format!("index {index} must match or broadcast to {src} (dim {dim})"),
                ));
            }
            let mut shape = src.shape.clone();
            shape[*dim] = *size;
            Ok(TensorType::new(src.dtype, shape))
        }
        Op::Detach => {
            expect_arity(op, inputs, 1)?;
            Ok(first())
        }
        Op::CumSum { dim } => {
            expect_arity(op, inputs, 1)?;
            if inputs[0].dtype == DType::Bool {
                return Err(IrError::ty(
                    op.name(),
                    format!("expected a numeric tensor, found {}", inputs[0]),
                ));
            }
            if *dim >= inputs[0].rank() {
                return Err(IrError::ty(
                    op.name(),
                    format!("dim {dim} out of range for {}", inputs[0]),
                ));
            }
            Ok(first())
        }
        Op::Im2col { window } => {
            expect_arity(op, inputs, 1)?;
            expect_float(op, inputs[0])?;
            let x = inputs[0];
            if x.rank() != 4 {
                return Err(IrError::ty(
                    op.name(),
                    format!("expected [N, C, H, W], found {x}"),
                ));
            }
            let static_dim = |d: usize| x.shape.get(d).and_then(|d| d.as_static());
            let (Some(c), Some(h), Some(w)) = (static_dim(1), static_dim(2), static_dim(3)) else {
                return Err(IrError::ty(
                    op.name(),
                    format!("expected [N, C, H, W] with static C, H, W, found {x}"),
                ));
            };
            let Some([oh, ow]) = window.output_size(h, w) else {
                return Err(IrError::ty(
                    op.name(),
                    format!("the window ({window}) does not fit the input {x}"),
                ));
            };
            Ok(TensorType::new(
                x.dtype,
                Shape::from_slice(&[
                    x.shape[0],
                    Dim::Static(c * window.taps()),
                    Dim::Static(oh * ow),
                ]),
            ))
        }
        Op::Iota { len, dtype } => {
            expect_arity(op, inputs, 0)?;
            if *dtype == DType::Bool {
                return Err(IrError::ty(op.name(), "a bool arange is not supported"));
            }
            Ok(TensorType::new(*dtype, Shape::from_slice(&[*len])))
        }
        Op::Grad { index, seeded } => {
            let fixed = 1 + *seeded as usize;
            if inputs.len() <= fixed + index {
                return Err(IrError::ty(
                    op.name(),
                    format!("wrt index {index} out of range ({} inputs)", inputs.len()),
                ));
            }
            let loss = inputs[0];
            if !loss.dtype.is_float() {
                return Err(IrError::ty(
                    op.name(),
                    format!("the differentiated value must be floating-point, found {loss}"),
                ));
            }
            if *seeded {
                if inputs[1] != loss {
                    return Err(IrError::ty(
                        op.name(),
                        format!("output gradient {} must have the type of {loss}", inputs[1]),
                    ));
                }
            } else if loss.rank() != 0 {
                return Err(IrError::ty(
                    op.name(),
                    format!(
                        "{loss} is not a scalar: a non-scalar output needs explicit output \
                         gradients (grad_with)"
                    ),
                ));
            }
            for (i, w) in inputs[fixed..].iter().enumerate() {
                if !w.dtype.is_float() {
                    return Err(IrError::ty(
                        op.name(),
                        format!("cannot differentiate with respect to {w} (argument {i}): only floating-point values have gradients"),
                    ));
                }
            }
            Ok(inputs[fixed + index].clone())
        }
        Op::Linear { has_bias } => {
            expect_arity(op, inputs, 2 + *has_bias as usize)?;
            let (x, w) = (inputs[0], inputs[1]);
            expect_float(op, x)?;
            if w.rank() != 2
                || x.rank() < 1
                || x.shape[x.rank() - 1] != w.shape[1]
                || x.dtype != w.dtype
            {
                return Err(IrError::ty(
                    op.name(),
                    format!("input {x} does not match weight {w} (expected [out, in])"),
                ));
            }
            if *has_bias {
                let b = inputs[2];
                if b.rank() != 1 || b.shape[0] != w.shape[0] || b.dtype != w.dtype {
                    return Err(IrError::ty(
                        op.name(),
                        format!("bias {b} does not match weight {w}"),
                    ));
                }
            }
            let mut shape = x.shape.clone();
            *shape.last_mut().unwrap() = w.shape[0];
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::Softmax { dim } | Op::LogSoftmax { dim } => {
            expect_arity(op, inputs, 1)?;
            expect_float(op, inputs[0])?;
            if *dim >= inputs[0].rank() {
                return Err(IrError::ty(
                    op.name(),
                    format!("dim {dim} out of range for {}", inputs[0]),
                ));
            }
            Ok(first())
        }
        Op::LayerNorm {
            normalized_rank,
            has_weight,
            has_bias,
            ..
        } => {
            expect_arity(op, inputs, 1 + *has_weight as usize + *has_bias as usize)?;
            let x = inputs[0];
            expect_float(op, x)?;
            if *normalized_rank == 0 || *normalized_rank > x.rank() {
                return Err(IrError::ty(
                    op.name(),
                    format!("normalized_rank {normalized_rank} invalid for {x}"),
                ));
            }
            let tail = &x.shape[x.rank() - normalized_rank..];
            for p in &inputs[1..] {
                if p.shape.as_slice() != tail || p.dtype != x.dtype {
                    return Err(IrError::ty(
                        op.name(),
                        format!(
                            "weight/bias {p} must have shape {} and dtype {}",
                            shape_string(tail),
                            x.dtype
                        ),
                    ));
                }
            }
            Ok(first())
        }
    }
}

fn matmul_type(op: &Op, a: &TensorType, b: &TensorType) -> Result<TensorType, IrError> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err(IrError::ty(op.name(), "both operands need rank >= 1"));
    }
    if a.dtype != b.dtype || !a.dtype.is_float() {
        return Err(IrError::ty(
            op.name(),
            format!("operands must share a float dtype, found {a} and {b}"),
        ));
    }
    let k_a = a.shape[a.rank() - 1];
    let k_b = if b.rank() == 1 {
        b.shape[0]
    } else {
        b.shape[b.rank() - 2]
    };
    if k_a != k_b {
        return Err(IrError::ty(
            op.name(),
            format!(
                "inner dimensions differ: {} @ {} ({k_a} vs {k_b})",
                shape_string(&a.shape),
                shape_string(&b.shape)
            ),
        ));
    }
    let batch_a = &a.shape[..a.rank().saturating_sub(2)];
    let batch_b = &b.shape[..b.rank().saturating_sub(2)];
    let mut shape = broadcast_shapes(batch_a, batch_b).ok_or_else(|| {
        IrError::ty(
            op.name(),
            format!(
                "batch dims {} and {} do not broadcast",
                shape_string(batch_a),
                shape_string(batch_b)
            ),
        )
    })?;
    if a.rank() >= 2 {
        shape.push(a.shape[a.rank() - 2]);
    }
    if b.rank() >= 2 {
        shape.push(b.shape[b.rank() - 1]);
    }
    Ok(TensorType::new(a.dtype, shape))
}
