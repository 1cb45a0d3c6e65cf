//! `autodiff`: reverse-mode differentiation of a prim graph (AOTAutograd's joint graph).
//!
//! Assumes a verified graph of prims and [`Op::Grad`] nodes (the output of `decompose`).
//! Guarantees a graph of prims only, with the same inputs and outputs, in which every `Grad` node
//! is replaced by the value it names: the backward pass is appended to the forward, so the result
//! is the joint graph, and it decomposes, fuses, plans and compiles like any graph. `Grad` nodes
//! with the same inputs (one loss, one seed, one list of values) share one backward pass. Nodes
//! inside a backward may themselves be differentiated by a later `Grad` (higher derivatives).
//!
//! Each prim has one derivative rule, written in prims (`rule`): views transpose to views (a slice
//! becomes a cat with zeros, a permute its inverse, an expand a sum), `Gather` and `TakeAlong`
//! become a `ScatterAdd` (repeated indices accumulate), reductions broadcast back, `amax`/`amin`
//! split the gradient evenly between equal extreme elements (as PyTorch's `amax` does), and
//! comparisons, `where`'s condition, integer values and `Detach` get none. Binary ops sum the
//! gradient over the dims they broadcast. A value the loss does not depend on gets zeros (what
//! `torch.func.grad` and `allow_unused` with materialized gradients give).
//!
//! A loss without an explicit output gradient is seeded by a new graph input, a *tangent* (as in
//! PyTorch's joint graph), which the caller feeds with 1: `partition` classifies every node that
//! depends on a tangent as backward. Tangent inputs come after the graph's own inputs, which keep
//! their positions.

use minductor_ir::{
    BinaryOp, CompareOp, DType, Dim, Graph, IrError, NodeId, Op, ReduceOp, Shape, SizeExpr,
    SliceFrom, UnaryOp,
};
use std::collections::HashMap;

/// `ln` of the smallest normal `f32`, rounded up to an `f32` (−87.33654): `exp(t)` is subnormal
/// exactly for `t` below it. `erf`'s derivative `2/√π · exp(−x²)` is 0 where `−x²` is below it
/// (what PyTorch's GELU derivative gives, its vectorized `exp` being 0 there too), and `exp`'s
/// argument is clamped to it: no operation of the derivative forms a subnormal, each of which
/// costs an Intel core a microcode assist. Measured on a Xeon of family 6 model 207, one
/// thread: a training step's GELU derivative kernel and its `exp` went from 9.4% of the step's
/// samples to 2.0% (1.6% with the CPU's flush-to-zero mode set instead). The error is below
/// `2/√π · f32::MIN_POSITIVE` times the gradient.
pub const ERF_GRAD_FLOOR: f64 = -87.336_540_222_167_97;

/// The joint forward-backward graph and where its backward passes start.
#[derive(Clone, Debug)]
pub struct Joint {
    pub graph: Graph,
    /// Positions (in `graph.inputs()`) of the tangent inputs, each to be fed a 0-d 1 of its dtype.
    pub tangents: Vec<usize>,
    /// True if some backward pass starts from an output gradient the traced code computed
    /// (`grad_with`) rather than from a tangent input.
    pub seeded: bool,
}

/// Why a graph cannot be differentiated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AutodiffError {
    #[error("autodiff: {0}")]
    Unsupported(String),
}

impl From<IrError> for AutodiffError {
    fn from(e: IrError) -> Self {
        AutodiffError::Unsupported(format!("a derivative rule is ill-typed here: {e}"))
    }
}

pub fn autodiff(graph: &Graph) -> Result<Joint, AutodiffError> {
    let mut g = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; graph.len()];
    // The graph's own inputs first, so that tangents added later come after them.
    for &input in graph.inputs() {
        let node = graph.node(input);
        if let Op::Input { name } = &node.op {
            map[input.index()] = Some(g.input(name.clone(), node.ty.clone()));
        }
    }
    let mut passes: HashMap<Vec<NodeId>, Vec<NodeId>> = HashMap::new();
    let (mut tangents, mut seeded_pass) = (Vec::new(), false);
    for (index, node) in graph.nodes().iter().enumerate() {
        if map[index].is_some() {
            continue;
        }
        let ins: Vec<NodeId> = node
            .inputs
            .iter()
            .map(|i| map[i.index()].expect("operands precede their users"))
            .collect();
        let id = match &node.op {
            Op::Input { .. } => {
                return Err(AutodiffError::Unsupported(format!(
                    "%{index} is an input node the graph does not list"
                )))
            }
            Op::Constant { value } => g.constant(*value, node.ty.dtype),
            Op::Grad { index, seeded } => {
                let grads = match passes.get(&ins) {
                    Some(grads) => grads.clone(),
                    None => {
                        let fixed = 1 + *seeded as usize;
                        let (loss, wrt) = (ins[0], &ins[fixed..]);
                        let seed = if *seeded {
                            seeded_pass = true;
                            ins[1]
                        } else {
                            tangents.push(g.inputs().len());
                            let ty = g.ty(loss).clone();
                            g.input(format!("tangent{}", tangents.len() - 1), ty)
                        };
                        let grads = Backward { g: &mut g }.run(loss, seed, wrt)?;
                        passes.insert(ins.clone(), grads.clone());
                        grads
                    }
                };
                grads[*index]
            }
            op if op.is_prim() => g.add(op.clone(), &ins)?,
            op => {
                return Err(AutodiffError::Unsupported(format!(
                    "{op} is a composite: run decompose first"
                )))
            }
        };
        map[index] = Some(id);
    }
    g.set_outputs(
        graph
            .outputs()
            .iter()
            .map(|o| map[o.index()].expect("every node is mapped"))
            .collect(),
    );
    Ok(Joint {
        graph: g,
        tangents,
        seeded: seeded_pass,
    })
}

/// Appends one backward pass to a graph.
struct Backward<'a> {
    g: &'a mut Graph,
}

type Emit = Result<NodeId, AutodiffError>;

impl Backward<'_> {
    /// Gradients of `loss` (seeded with `seed`) with respect to each of `wrt`.
    fn run(
        &mut self,
        loss: NodeId,
        seed: NodeId,
        wrt: &[NodeId],
    ) -> Result<Vec<NodeId>, AutodiffError> {
        let n = loss.index() + 1;
        // A node is active when it depends on a value in `wrt` through differentiable ops and the
        // loss depends on it.
        let mut depends_on_wrt = vec![false; n];
        for &w in wrt {
            if w.index() < n {
                depends_on_wrt[w.index()] = true;
            }
        }
        for index in 0..n {
            let node = &self.g.nodes()[index];
            if node.ty.dtype.is_float()
                && !matches!(node.op, Op::Detach)
                && node.inputs.iter().any(|i| depends_on_wrt[i.index()])
            {
                depends_on_wrt[index] = true;
            }
        }
        let mut reaches_loss = vec![false; n];
        reaches_loss[loss.index()] = true;
        for index in (0..n).rev() {
            if reaches_loss[index] {
                for &i in &self.g.nodes()[index].inputs {
                    reaches_loss[i.index()] = true;
                }
            }
        }
        let active: Vec<bool> = (0..n)
            .map(|i| depends_on_wrt[i] && reaches_loss[i])
            .collect();

        let mut adjoint: HashMap<NodeId, NodeId> = HashMap::new();
        if active[loss.index()] {
            adjoint.insert(loss, seed);
        }
        for index in (0..n).rev() {
            let id = NodeId(index as u32);
            let Some(&gy) = adjoint.get(&id) else {
                continue;
            };
            let inputs = self.g.node(id).inputs.clone();
            for (k, &x) in inputs.iter().enumerate() {
                if !active[x.index()] {
                    continue;
                }
                let Some(gx) = self.rule(id, k, gy)? else {
                    continue;
                };
                let total = match adjoint.get(&x) {
                    Some(&previous) => self.bin(BinaryOp::Add, previous, gx)?,
                    None => gx,
                };
                adjoint.insert(x, total);
            }
        }
        wrt.iter()
            .map(|&w| match adjoint.get(&w) {
                Some(&gw) => Ok(gw),
                None => self.zeros_like(w),
            })
            .collect()
    }

    // ---- emitting prims ---------------------------------------------------------------------

    fn add(&mut self, op: Op, inputs: &[NodeId]) -> Emit {
        Ok(self.g.add(op, inputs)?)
    }
    fn shape(&self, x: NodeId) -> Shape {
        self.g.ty(x).shape.clone()
    }
    fn dtype(&self, x: NodeId) -> DType {
        self.g.ty(x).dtype
    }
    fn scalar(&mut self, value: f64, like: NodeId) -> NodeId {
        let dtype = self.dtype(like);
        self.g.constant(value, dtype)
    }
    fn zeros_like(&mut self, x: NodeId) -> Emit {
        let zero = self.scalar(0.0, x);
        let shape = self.shape(x);
        self.add(Op::Expand { shape }, &[zero])
    }
    fn zeros(&mut self, like: NodeId, shape: Shape) -> Emit {
        let zero = self.scalar(0.0, like);
        self.add(Op::Expand { shape }, &[zero])
    }
    fn bin(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Emit {
        self.add(Op::Binary(op), &[a, b])
    }
    fn mul(&mut self, a: NodeId, b: NodeId) -> Emit {
        self.bin(BinaryOp::Mul, a, b)
    }
    fn mul_scalar(&mut self, a: NodeId, value: f64) -> Emit {
        let c = self.scalar(value, a);
        self.mul(a, c)
    }
    fn un(&mut self, op: UnaryOp, a: NodeId) -> Emit {
        self.add(Op::Unary(op), &[a])
    }
    fn compare(&mut self, op: CompareOp, a: NodeId, b: NodeId) -> Emit {
        self.add(Op::Compare(op), &[a, b])
    }
    fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Emit {
        self.add(Op::Where, &[cond, a, b])
    }
    fn cast(&mut self, x: NodeId, dtype: DType) -> Emit {
        if self.dtype(x) == dtype {
            return Ok(x);
        }
        self.add(Op::Cast { dtype }, &[x])
    }
    fn reshape(&mut self, x: NodeId, shape: Shape) -> Emit {
        if self.shape(x) == shape {
            return Ok(x);
        }
        self.add(Op::Reshape { shape }, &[x])
    }
    fn sum(&mut self, x: NodeId, axes: Vec<usize>, keepdim: bool) -> Emit {
        self.add(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes,
                keepdim,
            },
            &[x],
        )
    }
    fn transpose_last(&mut self, x: NodeId) -> Emit {
        let rank = self.shape(x).len();
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        self.add(Op::Permute { perm }, &[x])
    }

    /// Sums `grad` over the dims a broadcast to its shape added or stretched, giving `target`'s
    /// shape (the derivative of broadcasting).
    fn sum_to(&mut self, grad: NodeId, target: &[Dim]) -> Emit {
        let shape = self.shape(grad);
        if shape.as_slice() == target {
            return Ok(grad);
        }
        let lead = shape.len() - target.len();
        let stretched: Vec<usize> = (0..target.len())
            .filter(|&i| target[i] == Dim::Static(1) && shape[lead + i] != Dim::Static(1))
            .map(|i| lead + i)
            .collect();
        let mut g = grad;
        if !stretched.is_empty() {
            g = self.sum(g, stretched, true)?;
        }
        if lead > 0 {
            g = self.sum(g, (0..lead).collect(), false)?;
        }
        Ok(g)
    }

    /// `x`'s shape with every dim in `axes` set to 1 (a reduction's keepdim shape).
    fn kept_shape(&self, x: NodeId, axes: &[usize]) -> Shape {
        let mut shape = self.shape(x);
        for &a in axes {
            shape[a] = Dim::Static(1);
        }
        shape
    }

    // ---- derivative rules -------------------------------------------------------------------

    /// The gradient flowing to operand `k` of node `y` given the gradient `g` of `y`, or `None`
    /// when that operand gets none.
    fn rule(&mut self, y: NodeId, k: usize, g: NodeId) -> Result<Option<NodeId>, AutodiffError> {
        let node = self.g.node(y).clone();
        let x = node.inputs[k];
        let operand = |i: usize| node.inputs[i];
        let gx = match &node.op {
            Op::Unary(u) => match u {
                UnaryOp::Neg => self.un(UnaryOp::Neg, g)?,
                UnaryOp::Abs => {
                    // g · sign(x), 0 at 0.
                    let zero = self.scalar(0.0, x);
                    let pos = self.compare(CompareOp::Gt, x, zero)?;
                    let neg = self.compare(CompareOp::Lt, x, zero)?;
                    let dtype = self.dtype(x);
                    let (pos, neg) = (self.cast(pos, dtype)?, self.cast(neg, dtype)?);
                    let sign = self.bin(BinaryOp::Sub, pos, neg)?;
                    self.mul(g, sign)?
                }
                UnaryOp::Exp => self.mul(g, y)?,
                UnaryOp::Log => self.bin(BinaryOp::Div, g, x)?,
                UnaryOp::Sqrt => {
                    let twice = self.mul_scalar(y, 2.0)?;
                    self.bin(BinaryOp::Div, g, twice)?
                }
                UnaryOp::Rsqrt => {
                    // -0.5 · g · y³
                    let y2 = self.mul(y, y)?;
                    let y3 = self.mul(y2, y)?;
                    let h = self.mul_scalar(y3, -0.5)?;
                    self.mul(g, h)?
                }
                UnaryOp::Sin => {
                    let c = self.un(UnaryOp::Cos, x)?;
                    self.mul(g, c)?
                }
                UnaryOp::Cos => {
                    let s = self.un(UnaryOp::Sin, x)?;
                    let gs = self.mul(g, s)?;
                    self.un(UnaryOp::Neg, gs)?
                }
                UnaryOp::Tanh => {
                    // g · (1 − y²)
                    let y2 = self.mul(y, y)?;
                    let one = self.scalar(1.0, y);
                    let d = self.bin(BinaryOp::Sub, one, y2)?;
                    self.mul(g, d)?
                }
                UnaryOp::Erf => {
                    // g · 2/√π · exp(−x²), with exp(−x²) taken as 0 where it is subnormal
                    // (−x² below ln of the smallest normal f32), as PyTorch's GELU derivative
                    // gives, and the argument of exp clamped there (`where`, not `maximum`, so
                    // NaN passes unchanged). An Intel core takes a microcode assist for every
                    // vector operation that produces or reads a subnormal: a training step's
                    // GELU derivative spent 8% of the step there (see `ERF_GRAD_FLOOR`).
                    // (f64 keeps the plain rule: its exp is normal far beyond.)
                    let x2 = self.mul(x, x)?;
                    let nx2 = self.un(UnaryOp::Neg, x2)?;
                    let e = if self.dtype(x) == DType::F64 {
                        self.un(UnaryOp::Exp, nx2)?
                    } else {
                        let floor = self.scalar(ERF_GRAD_FLOOR, nx2);
                        let tiny = self.compare(CompareOp::Lt, nx2, floor)?;
                        let clamped = self.select(tiny, floor, nx2)?;
                        let e = self.un(UnaryOp::Exp, clamped)?;
                        let zero = self.scalar(0.0, e);
                        self.select(tiny, zero, e)?
                    };
                    let d = self.mul_scalar(e, std::f64::consts::FRAC_2_SQRT_PI)?;
                    self.mul(g, d)?
                }
                UnaryOp::Sigmoid => {
                    // g · y · (1 − y)
                    let one = self.scalar(1.0, y);
                    let rest = self.bin(BinaryOp::Sub, one, y)?;
                    let d = self.mul(y, rest)?;
                    self.mul(g, d)?
                }
            },
            Op::Binary(b) => {
                let (a, c) = (operand(0), operand(1));
                let full = match (b, k) {
                    (BinaryOp::Add, _) | (BinaryOp::Sub, 0) => g,
                    (BinaryOp::Sub, _) => self.un(UnaryOp::Neg, g)?,
                    (BinaryOp::Mul, 0) => self.mul(g, c)?,
                    (BinaryOp::Mul, _) => self.mul(g, a)?,
                    (BinaryOp::Div, 0) => self.bin(BinaryOp::Div, g, c)?,
                    (BinaryOp::Div, _) => {
                        // −g · a / c²
                        let c2 = self.mul(c, c)?;
                        let ga = self.mul(g, a)?;
                        let q = self.bin(BinaryOp::Div, ga, c2)?;
                        self.un(UnaryOp::Neg, q)?
                    }
                    (BinaryOp::Maximum | BinaryOp::Minimum, _) => {
                        // The larger (smaller) operand takes the gradient; ties split it evenly.
                        let (me, other) = if k == 0 { (a, c) } else { (c, a) };
                        let loses = match b {
                            BinaryOp::Maximum => CompareOp::Lt,
                            _ => CompareOp::Gt,
                        };
                        let tie = self.compare(CompareOp::Eq, me, other)?;
                        let half = self.mul_scalar(g, 0.5)?;
                        let shared = self.select(tie, half, g)?;
                        let lost = self.compare(loses, me, other)?;
                        let zero = self.scalar(0.0, g);
                        self.select(lost, zero, shared)?
                    }
                    (BinaryOp::Pow, 0) => {
                        // g · c · a^(c−1), and 0 where c = 0 (PyTorch's pow_backward_self).
                        let one = self.scalar(1.0, c);
                        let c1 = self.bin(BinaryOp::Sub, c, one)?;
                        let p = self.bin(BinaryOp::Pow, a, c1)?;
                        let d = self.mul(c, p)?;
                        let gd = self.mul(g, d)?;
                        let zero = self.scalar(0.0, c);
                        let at_zero = self.compare(CompareOp::Eq, c, zero)?;
                        let zero_g = self.scalar(0.0, g);
                        self.select(at_zero, zero_g, gd)?
                    }
                    (BinaryOp::Pow, _) => {
                        // g · y · ln(a), and 0 where a = 0 and c >= 0 (pow_backward_exponent).
                        let l = self.un(UnaryOp::Log, a)?;
                        let yl = self.mul(y, l)?;
                        let zero_a = self.scalar(0.0, a);
                        let a_zero = self.compare(CompareOp::Eq, a, zero_a)?;
                        let zero_c = self.scalar(0.0, c);
                        let c_nonneg = self.compare(CompareOp::Ge, c, zero_c)?;
                        let zero = self.scalar(0.0, yl);
                        let inner = self.select(c_nonneg, zero, yl)?;
                        let d = self.select(a_zero, inner, yl)?;
                        self.mul(g, d)?
                    }
                };
                let target = self.shape(x);
                let summed = self.sum_to(full, &target)?;
                self.cast(summed, self.dtype(x))?
            }
            Op::Where => {
                if k == 0 {
                    return Ok(None);
                }
                let cond = operand(0);
                let zero = self.scalar(0.0, g);
                let full = if k == 1 {
                    self.select(cond, g, zero)?
                } else {
                    self.select(cond, zero, g)?
                };
                let target = self.shape(x);
                let summed = self.sum_to(full, &target)?;
                self.cast(summed, self.dtype(x))?
            }
            Op::Cast { .. } => self.cast(g, self.dtype(x))?,
            Op::Reduce { op, axes, keepdim } => {
                let kept = self.kept_shape(x, axes);
                let g_kept = if *keepdim {
                    g
                } else {
                    self.reshape(g, kept.clone())?
                };
                let shape = self.shape(x);
                match op {
                    ReduceOp::Sum => self.add(Op::Expand { shape }, &[g_kept])?,
                    ReduceOp::Max | ReduceOp::Min => {
                        // Split evenly between the elements equal to the extreme.
                        let y_kept = if *keepdim { y } else { self.reshape(y, kept)? };
                        let hit = self.compare(CompareOp::Eq, x, y_kept)?;
                        let mask = self.cast(hit, self.dtype(x))?;
                        let count = self.sum(mask, axes.clone(), true)?;
                        let share = self.bin(BinaryOp::Div, g_kept, count)?;
                        self.mul(mask, share)?
                    }
                }
            }
            Op::Reshape { .. } => {
                let shape = self.shape(x);
                self.reshape(g, shape)?
            }
            Op::Permute { perm } => {
                let rank = perm.len();
                let swaps_last_two = rank >= 2
                    && perm[rank - 2] == rank - 1
                    && perm[rank - 1] == rank - 2
                    && perm[..rank - 2].iter().enumerate().all(|(i, &p)| i == p);
                if swaps_last_two && matches!(self.g.node(g).op, Op::Matmul) {
                    // (A·B)ᵀ = Bᵀ·Aᵀ: the gradient of a transposed operand (a linear layer's
                    // weight) comes out of the GEMM in the operand's own layout.
                    let (a, b) = (self.g.node(g).inputs[0], self.g.node(g).inputs[1]);
                    let (at, bt) = (self.transpose_last(a)?, self.transpose_last(b)?);
                    self.add(Op::Matmul, &[bt, at])?
                } else {
                    let mut inverse = vec![0; rank];
                    for (i, &p) in perm.iter().enumerate() {
                        inverse[p] = i;
                    }
                    self.add(Op::Permute { perm: inverse }, &[g])?
                }
            }
            Op::Expand { .. } => {
                let target = self.shape(x);
                let summed = self.sum_to(g, &target)?;
                self.reshape(summed, target)?
            }
            Op::Slice {
                dim,
                start,
                end,
                step,
                from: SliceFrom::Start,
            } => self.unslice(x, g, *dim, *start, *end, *step)?,
            Op::Slice {
                dim,
                start,
                end,
                step: 1,
                from: from @ (SliceFrom::End | SliceFrom::StartToEnd),
            } => self.unslice_from_end(x, g, *dim, *start, *end, *from)?,
            Op::Slice { .. } => {
                return Err(AutodiffError::Unsupported(format!(
                    "the gradient of a stepped slice with a bound counted from the end of a dim \
                     of {}",
                    self.g.ty(x)
                )))
            }
            Op::Cat { dim } => {
                let size = |i: &NodeId| SizeExpr::of_dim(self.shape(*i)[*dim]);
                let sum = |ids: &[NodeId]| {
                    ids.iter()
                        .fold(SizeExpr::Const(0), |acc, i| acc.plus(&size(i)))
                };
                let before = sum(&node.inputs[..k]).as_const();
                let after = sum(&node.inputs[k + 1..]).as_const();
                let len = size(&x).as_const();
                // The operand's rows of `g`: from the start when everything is static, else
                // between static counts from the start and from the end (`s0` rows of a cat
                // of `[s0]` and `[1]`: `0:end-1`), or the last static rows (`end-1:end-0`).
                let (start, end, from) = match (before, after, len) {
                    (Some(b), Some(_), Some(l)) if self.shape(g)[*dim].as_static().is_some() => {
                        (b, b + l, SliceFrom::Start)
                    }
                    (Some(b), Some(a), _) => (b, a, SliceFrom::StartToEnd),
                    (_, Some(a), Some(l)) => (l + a, a, SliceFrom::End),
                    _ => {
                        return Err(AutodiffError::Unsupported(format!(
                            "the gradient of a cat along dim {dim} of {} with symbolic operands \
                             on both sides of operand {k}",
                            self.g.ty(y)
                        )))
                    }
                };
                let as_usize = |v: i64| usize::try_from(v).expect("sizes are not negative");
                self.add(
                    Op::Slice {
                        dim: *dim,
                        start: as_usize(start),
                        end: as_usize(end),
                        step: 1,
                        from,
                    },
                    &[g],
                )?
            }
            Op::Gather => {
                if k == 1 {
                    return Ok(None);
                }
                self.embedding_backward(x, operand(1), g)?
            }
            Op::TakeAlong { dim } => {
                if k == 1 {
                    return Ok(None);
                }
                let size = self.shape(x)[*dim];
                self.add(Op::ScatterAdd { dim: *dim, size }, &[operand(1), g])?
            }
            Op::ScatterAdd { dim, .. } => {
                if k == 0 {
                    return Ok(None);
                }
                let index = operand(0);
                let shape = self.shape(x);
                let full = if self.shape(index) == shape {
                    index
                } else {
                    self.add(Op::Expand { shape }, &[index])?
                };
                self.add(Op::TakeAlong { dim: *dim }, &[g, full])?
            }
            Op::CumSum { dim } => {
                // The reverse running sums of g: Σ_{j >= i} g_j = Σ g − cumsum(g)_i + g_i.
                let total = self.sum(g, vec![*dim], true)?;
                let shape = self.shape(g);
                let total = self.add(Op::Expand { shape }, &[total])?;
                let running = self.add(Op::CumSum { dim: *dim }, &[g])?;
                let before = self.bin(BinaryOp::Sub, total, running)?;
                self.bin(BinaryOp::Add, before, g)?
            }
            Op::Matmul => {
                let (a, c) = (operand(0), operand(1));
                let full = if k == 0 {
                    let ct = self.transpose_last(c)?;
                    self.add(Op::Matmul, &[g, ct])?
                } else {
                    let at = self.transpose_last(a)?;
                    self.add(Op::Matmul, &[at, g])?
                };
                let target = self.shape(x);
                self.sum_to(full, &target)?
            }
            Op::Compare(_)
            | Op::Detach
            | Op::Input { .. }
            | Op::Constant { .. }
            | Op::Iota { .. } => return Ok(None),
            op => {
                return Err(AutodiffError::Unsupported(format!(
                    "no derivative rule for {op} (composites are decomposed first)"
                )))
            }
        };
        Ok(Some(gx))
    }

    fn static_size(&self, x: NodeId, dim: usize) -> Result<usize, AutodiffError> {
        self.shape(x)[dim].as_static().ok_or_else(|| {
            AutodiffError::Unsupported(format!(
                "the gradient of a cat or slice along symbolic dim {dim} of {}",
                self.g.ty(x)
            ))
        })
    }

    /// The derivative of `x.slice(dim, start..end by step)`: `g` spread back to its positions,
    /// zeros elsewhere, built from cats of zeros (a stepped slice interleaves first).
    fn unslice(
        &mut self,
        x: NodeId,
        g: NodeId,
        dim: usize,
        start: usize,
        end: usize,
        step: usize,
    ) -> Emit {
        let size = self.static_size(x, dim)?;
        let taken = self.static_size(g, dim)?;
        if taken == 0 {
            return self.zeros_like(x);
        }
        let mut body = g;
        if step > 1 {
            // [.., m, ..] → [.., m, 1, ..] ++ zeros [.., m, step-1, ..] → [.., m·step, ..].
            let mut unsqueezed = self.shape(g);
            unsqueezed.insert(dim + 1, Dim::Static(1));
            let column = self.reshape(g, unsqueezed.clone())?;
            let mut gap = unsqueezed.clone();
            gap[dim + 1] = Dim::Static(step - 1);
            let zeros = self.zeros(g, gap)?;
            let woven = self.add(Op::Cat { dim: dim + 1 }, &[column, zeros])?;
            let mut flat = self.shape(g);
            flat[dim] = Dim::Static(taken * step);
            let flat = self.reshape(woven, flat)?;
            body = self.add(
                Op::Slice {
                    dim,
                    start: 0,
                    end: end - start,
                    step: 1,
                    from: SliceFrom::Start,
                },
                &[flat],
            )?;
        }
        let mut pieces = Vec::new();
        let mut piece_shape = self.shape(g);
        if start > 0 {
            piece_shape[dim] = Dim::Static(start);
            pieces.push(self.zeros(g, piece_shape.clone())?);
        }
        pieces.push(body);
        if size > end {
            piece_shape[dim] = Dim::Static(size - end);
            pieces.push(self.zeros(g, piece_shape)?);
        }
        if pieces.len() == 1 {
            return Ok(body);
        }
        self.add(Op::Cat { dim }, &pieces)
    }

    /// The derivative of a step-1 slice with a bound counted from the end of `dim` (`from` is
    /// `End` or `StartToEnd`): `g` between zeros, the pieces' sizes static or derived (`s0 - 1`
    /// zeros before the last row of `x[-1:]`), so the cat has `x`'s size again.
    fn unslice_from_end(
        &mut self,
        x: NodeId,
        g: NodeId,
        dim: usize,
        start: usize,
        end: usize,
        from: SliceFrom,
    ) -> Emit {
        let size = SizeExpr::of_dim(self.shape(x)[dim]);
        let before = match from {
            SliceFrom::Start | SliceFrom::StartToEnd => SizeExpr::Const(start as i64),
            SliceFrom::End => size.plus(&SizeExpr::Const(-(start as i64))),
        };
        let mut pieces = Vec::new();
        let mut piece_shape = self.shape(g);
        if !before.is_zero() {
            piece_shape[dim] = Dim::of_expr(&before).ok_or_else(|| {
                AutodiffError::Unsupported(format!("a slice starting at a negative {before}"))
            })?;
            pieces.push(self.zeros(g, piece_shape.clone())?);
        }
        pieces.push(g);
        if end > 0 {
            piece_shape[dim] = Dim::Static(end);
            pieces.push(self.zeros(g, piece_shape)?);
        }
        if pieces.len() == 1 {
            return Ok(g);
        }
        self.add(Op::Cat { dim }, &pieces)
    }

    /// The derivative of an embedding lookup `table[indices]` with respect to the table: the rows
    /// of `g` added into the rows the indices name (`ScatterAdd` along dim 0).
    fn embedding_backward(&mut self, table: NodeId, indices: NodeId, g: NodeId) -> Emit {
        let table_shape = self.shape(table);
        let index_shape = self.shape(indices);
        let count: Option<usize> = index_shape.iter().map(|d| d.as_static()).product();
        let Some(count) = count else {
            return Err(AutodiffError::Unsupported(
                "the gradient of an embedding with symbolic index dims".into(),
            ));
        };
        let mut rows_shape: Shape = table_shape.clone();
        rows_shape[0] = Dim::Static(count);
        let rows = self.reshape(g, rows_shape)?;
        let mut column: Shape = std::iter::repeat_n(Dim::Static(1), table_shape.len()).collect();
        column[0] = Dim::Static(count);
        let column = self.reshape(indices, column)?;
        self.add(
            Op::ScatterAdd {
                dim: 0,
                size: table_shape[0],
            },
            &[column, rows],
        )
    }
}
