//! `find_attention`: finds the prim expansion of `scaled_dot_product_attention` that `fuse` turns
//! into one `Step::Attention` (a flash-attention kernel) instead of two GEMMs around a softmax
//! kernel and a `[.., T, S]` scores buffer.
//!
//! Assumes a verified prim graph after `simplify`. The pattern, read from the final GEMM back:
//!
//! ```text
//! kt = permute[swap the last two dims] k'        k' = k, or reshape(expand(reshape(k))) (GQA);
//!                                                or any kt [batch.., E, S] (read transposed)
//! s0 = matmul q, kt                              [batch.., T, S]
//! s1 = mul s0, c | mul c, s0 | div s0, c         c a constant
//! sm = add s1, mask | add mask, s1              (an additive f32 mask; optional)
//!    | where(bmask, s1, -inf)                    (or a bool mask: sdpa's, true takes part)
//!    | where(bmask, -inf, s1)                    (or masked_fill(bmask, -inf))
//! s2 = where(gt(sub(iota(S), reshape[[T, 1]](iota(T))), 0), -inf, sm)   (causal; optional;
//!                                                may also come before the bool mask)
//! m  = reduce_max[axes=[last], keepdim] s2;  e = exp(sub(s2, m))
//! z  = reduce_sum[axes=[last], keepdim] e;   p = div e, z
//! out = matmul p, v'                             v' = v, or the same GQA expansion of v
//! ```
//!
//! Guarantees: every value the pattern computes, except `out`, is read only inside the pattern
//! and is not a graph output (so no other step needs the scores or the probabilities: a graph
//! with gradients through attention keeps the unfused form); all of it is f32; q, k and v have
//! the same batch dims as `out` (k and v may share one head among `group` q heads through the
//! expand-reshape `repeat_interleave` makes).

use minductor_ir::{
    BinaryOp, CompareOp, DType, Dim, Graph, NodeId, Op, ReduceOp, SizeExpr, UnaryOp,
};
use minductor_kernel_ir::{
    AttentionStep, BufferId, BufferKind, Expr, MaskKind, Program, StageAction, Step, StridedView,
    Var,
};
use std::collections::{HashMap, HashSet};

/// One attention found in the graph.
#[derive(Clone, Debug)]
pub(crate) struct AttentionPattern {
    pub q: NodeId,
    /// `[batch_kv.., S, E]` (the transpose's operand), or with `k_transposed` the GEMM's right
    /// operand itself, `[batch.., E, S]`.
    pub k: NodeId,
    pub k_transposed: bool,
    /// `[batch_kv.., S, Ev]`.
    pub v: NodeId,
    pub scale: f32,
    pub causal: bool,
    /// A mask broadcast to the scores: an additive f32 one, or a bool one (`Keep`: true takes
    /// part; `Drop`: true is −inf).
    pub mask: Option<(NodeId, MaskKind)>,
    pub group: usize,
    /// Every node the attention step computes, the final GEMM last.
    pub nodes: Vec<NodeId>,
}

/// Every attention pattern of `graph`, keyed by its final GEMM.
pub(crate) fn find_attention(graph: &Graph) -> HashMap<NodeId, AttentionPattern> {
    let mut users: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for id in graph.ids() {
        for &input in &graph.node(id).inputs {
            users.entry(input).or_default().push(id);
        }
    }
    let outputs: HashSet<NodeId> = graph.outputs().iter().copied().collect();
    graph
        .ids()
        .filter_map(|id| {
            let pattern = Matcher {
                graph,
                users: &users,
                outputs: &outputs,
            }
            .attention(id)?;
            Some((id, pattern))
        })
        .collect()
}

struct Matcher<'g> {
    graph: &'g Graph,
    users: &'g HashMap<NodeId, Vec<NodeId>>,
    outputs: &'g HashSet<NodeId>,
}

impl Matcher<'_> {
    fn op(&self, id: NodeId) -> &Op {
        &self.graph.node(id).op
    }

    fn inputs(&self, id: NodeId) -> &[NodeId] {
        &self.graph.node(id).inputs
    }

    fn dims(&self, id: NodeId) -> &[Dim] {
        &self.graph.ty(id).shape
    }

    /// `id` is read only by `readers` (each at least once) and is not a graph output.
    fn only_read_by(&self, id: NodeId, readers: &[NodeId]) -> bool {
        !self.outputs.contains(&id)
            && self
                .users
                .get(&id)
                .is_some_and(|u| u.iter().all(|r| readers.contains(r)))
    }

    fn constant(&self, id: NodeId) -> Option<f64> {
        match self.op(id) {
            Op::Constant { value } => Some(*value),
            _ => None,
        }
    }

    /// A reduction over the last dim with `keepdim` of `input`.
    fn row_reduce(&self, id: NodeId, op: ReduceOp) -> Option<NodeId> {
        let rank = self.dims(id).len();
        match self.op(id) {
            Op::Reduce {
                op: o,
                axes,
                keepdim: true,
            } if *o == op && axes[..] == [rank - 1] => Some(self.inputs(id)[0]),
            _ => None,
        }
    }

    fn attention(&self, out: NodeId) -> Option<AttentionPattern> {
        let g = self.graph;
        if !matches!(self.op(out), Op::Matmul) || g.ty(out).dtype != DType::F32 {
            return None;
        }
        let rank = self.dims(out).len();
        let (p, v_operand) = (self.inputs(out)[0], self.inputs(out)[1]);
        // p = div e, z
        if !matches!(self.op(p), Op::Binary(BinaryOp::Div)) || !self.only_read_by(p, &[out]) {
            return None;
        }
        let (e, z) = (self.inputs(p)[0], self.inputs(p)[1]);
        if self.row_reduce(z, ReduceOp::Sum)? != e || !self.only_read_by(z, &[p]) {
            return None;
        }
        if !matches!(self.op(e), Op::Unary(UnaryOp::Exp)) || !self.only_read_by(e, &[z, p]) {
            return None;
        }
        let centered = self.inputs(e)[0];
        if !matches!(self.op(centered), Op::Binary(BinaryOp::Sub))
            || !self.only_read_by(centered, &[e])
        {
            return None;
        }
        let (s2, m) = (self.inputs(centered)[0], self.inputs(centered)[1]);
        if self.row_reduce(m, ReduceOp::Max)? != s2
            || !self.only_read_by(m, &[centered])
            || !self.only_read_by(s2, &[m, centered])
        {
            return None;
        }
        let mut nodes = vec![s2, m, centered, e, z, p];
        // The optional causal mask and bool mask: `where`s that put −inf in the scores, in
        // either order.
        let neg_inf = |n: NodeId| self.constant(n) == Some(f64::NEG_INFINITY);
        let mut s1 = s2;
        let mut causal_cond = None;
        let mut mask = None;
        while let Op::Where = self.op(s1) {
            let (cond, a, b) = (self.inputs(s1)[0], self.inputs(s1)[1], self.inputs(s1)[2]);
            let (inner, kind) = match (neg_inf(a), neg_inf(b)) {
                (true, false) => (b, MaskKind::Drop),
                (false, true) => (a, MaskKind::Keep),
                _ => return None,
            };
            if self.dims(inner) != self.dims(s1) || !self.only_read_by(inner, &[s1]) {
                return None;
            }
            if kind == MaskKind::Drop && causal_cond.is_none() && self.causal_condition(cond) {
                causal_cond = Some(cond);
            } else if mask.is_none()
                && g.ty(cond).dtype == DType::Bool
                && self.dims(cond).len() <= rank
            {
                // `where`'s type rule: the condition broadcasts to the scores.
                mask = Some((cond, kind));
            } else {
                return None;
            }
            nodes.insert(0, inner);
            s1 = inner;
        }
        let causal = causal_cond.is_some();
        // The optional additive mask (not with a bool one).
        let s1 = match self.op(s1) {
            Op::Binary(BinaryOp::Add) if mask.is_none() => {
                let (a, b) = (self.inputs(s1)[0], self.inputs(s1)[1]);
                let scaled = |n: NodeId| {
                    matches!(
                        self.op(n),
                        Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div)
                    ) && self.dims(n) == self.dims(s1)
                };
                let (scaled_scores, additive) = if scaled(a) { (a, b) } else { (b, a) };
                if !scaled(scaled_scores)
                    || g.ty(additive).dtype != DType::F32
                    || self.dims(additive).len() > rank
                    || !self.only_read_by(scaled_scores, &[s1])
                {
                    return None;
                }
                nodes.insert(0, scaled_scores);
                mask = Some((additive, MaskKind::Add));
                scaled_scores
            }
            _ => s1,
        };
        // The scale.
        let (s0, scale) = match self.op(s1) {
            Op::Binary(BinaryOp::Mul) => {
                let (a, b) = (self.inputs(s1)[0], self.inputs(s1)[1]);
                match (self.constant(a), self.constant(b)) {
                    (None, Some(c)) => (a, c),
                    (Some(c), None) => (b, c),
                    _ => return None,
                }
            }
            Op::Binary(BinaryOp::Div) => {
                let (a, b) = (self.inputs(s1)[0], self.inputs(s1)[1]);
                (a, 1.0 / self.constant(b)?)
            }
            _ => return None,
        };
        if !matches!(self.op(s0), Op::Matmul) || !self.only_read_by(s0, &[s1]) {
            return None;
        }
        nodes.insert(0, s0);
        nodes.push(out);
        let (q, kt) = (self.inputs(s0)[0], self.inputs(s0)[1]);
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        let (k_operand, k_transposed) = match self.op(kt) {
            Op::Permute { perm: p } if *p == perm => (self.inputs(kt)[0], false),
            _ => (kt, true),
        };
        // Every operand has the output's rank and batch dims (no broadcasting of batch dims).
        let out_dims = self.dims(out);
        let q_dims = self.dims(q);
        if q_dims.len() != rank
            || q_dims[..rank - 1] != out_dims[..rank - 1]
            || [q, k_operand, v_operand]
                .iter()
                .any(|&n| g.ty(n).dtype != DType::F32)
        {
            return None;
        }
        let (k, k_group) = if k_transposed {
            let k_dims = self.dims(kt);
            if k_dims.len() != rank || k_dims[..rank - 2] != q_dims[..rank - 2] {
                return None;
            }
            (kt, 1)
        } else {
            self.grouped(k_operand, &q_dims[..rank - 2])?
        };
        let (v, v_group) = self.grouped(v_operand, &q_dims[..rank - 2])?;
        if k_group != v_group || !scale.is_finite() {
            return None;
        }
        if let Some(cond) = causal_cond {
            // The mask's sizes are the scores' (checked in `causal_condition` against [T, S]).
            let scores = self.dims(s0);
            let mask = self.dims(cond);
            if mask.len() < 2 || mask[mask.len() - 2..] != scores[rank - 2..] {
                return None;
            }
        }
        Some(AttentionPattern {
            q,
            k,
            k_transposed,
            v,
            scale: scale as f32,
            causal,
            mask,
            group: k_group,
            nodes,
        })
    }

    /// `gt(sub(iota(S), reshape[[T, 1]](iota(T))), 0)`: key position after query position.
    fn causal_condition(&self, cond: NodeId) -> bool {
        let ok = || -> Option<bool> {
            if !matches!(self.op(cond), Op::Compare(CompareOp::Gt)) {
                return Some(false);
            }
            let (diff, zero) = (self.inputs(cond)[0], self.inputs(cond)[1]);
            if self.constant(zero)? != 0.0 || !matches!(self.op(diff), Op::Binary(BinaryOp::Sub)) {
                return Some(false);
            }
            let (col, row) = (self.inputs(diff)[0], self.inputs(diff)[1]);
            let iota_len = |n: NodeId| match self.op(n) {
                Op::Iota { len, .. } => Some(*len),
                _ => None,
            };
            let s = iota_len(col)?;
            let row_iota = match self.op(row) {
                Op::Reshape { .. } => self.inputs(row)[0],
                _ => return Some(false),
            };
            let t = iota_len(row_iota)?;
            Some(self.dims(row) == [t, Dim::Static(1)] && self.dims(diff) == [t, s])
        };
        ok() == Some(true)
    }

    /// The k or v source of an operand seen with q's batch dims `batch`: the operand itself
    /// (group 1), or the source of `repeat_interleave`'s `reshape(expand(reshape(x)))` along the
    /// last batch dim (`[.., Hkv, S, E]` → `[.., Hkv, 1, S, E]` → `[.., Hkv, group, S, E]` →
    /// `[.., Hkv·group, S, E]`).
    fn grouped(&self, operand: NodeId, batch: &[Dim]) -> Option<(NodeId, usize)> {
        let dims = self.dims(operand);
        if dims.len() != batch.len() + 2 || dims[..batch.len()] != *batch {
            return None;
        }
        let plain = Some((operand, 1));
        let Op::Reshape { .. } = self.op(operand) else {
            return plain;
        };
        let expand = self.inputs(operand)[0];
        let Op::Expand { .. } = self.op(expand) else {
            return plain;
        };
        let inner = self.inputs(expand)[0];
        let Op::Reshape { .. } = self.op(inner) else {
            return plain;
        };
        let source = self.inputs(inner)[0];
        let (e, i, s) = (self.dims(expand), self.dims(inner), self.dims(source));
        let n = batch.len();
        if n == 0 || s.len() != n + 2 || e.len() != n + 3 || i.len() != n + 3 {
            return plain;
        }
        let (Some(heads), Some(kv_heads), Some(group)) = (
            batch[n - 1].as_static(),
            s[n - 1].as_static(),
            e[n].as_static(),
        ) else {
            return plain;
        };
        let shaped = s[..n - 1] == batch[..n - 1]
            && i[..n] == s[..n]
            && i[n] == Dim::Static(1)
            && i[n + 1..] == s[n..]
            && e[..n] == s[..n]
            && e[n + 1..] == s[n..]
            && dims[n..] == s[n..]
            && kv_heads * group == heads;
        if shaped && group > 0 {
            Some((source, group))
        } else {
            plain
        }
    }
}

/// `program` with each fused attention whose output only a plain copy reads (the permute of
/// `[b, h, t, d]` back to `[b, t, h, d]`, and its reshape to `[b, t, h·d]`, that multi-head
/// attention ends with) writing straight into the copy's buffer in the copy's layout: its
/// output view takes the copy's store strides (`[T·H·D, D, H·D, 1]`), and the copy step and
/// the attention's own buffer go. Called by `fuse` on the program it assembled.
///
/// A copy folds when it is a kernel of one store stage whose stored value is a plain load of
/// the attention's buffer (nothing else loaded, f32 into f32), whose loops visit exactly the
/// elements the attention writes, each once (each loop of more than one iteration moves the
/// load as the attention's output view moves along its own dim of the same size, or along
/// several static dims the loop walks as one, from the view's offset), whose store keeps a row's columns contiguous (coefficient 1 along the loop
/// of the last dim), when the attention's buffer is an intermediate, no other
/// step reads or writes the attention's buffer, the copy's buffer is not an input and is none
/// of the attention's operands, and no step between the two reads or writes it. The attention
/// then writes every element the copy wrote, the same values, earlier; `verify_program`
/// checks its view as any other (inside its buffer, every element its own place).
pub(crate) fn fold_output_copies(program: Program) -> Program {
    // Each round drops a step per fold: a copy after a copy (the permute realized, then its
    // reshape) folds in the next round.
    let mut program = program;
    loop {
        let steps = program.steps.len();
        program = fold_once(program);
        if program.steps.len() == steps {
            return program;
        }
    }
}

/// One round of [`fold_output_copies`]: each attention's current output copy folded.
fn fold_once(program: Program) -> Program {
    let mut folds: Vec<(usize, usize, StridedView)> = Vec::new();
    for (i, step) in program.steps.iter().enumerate() {
        if let Step::Attention(a) = step {
            if let Some((j, view)) = output_copy(&program, i, a) {
                folds.push((i, j, view));
            }
        }
    }
    if folds.is_empty() {
        return program;
    }
    // The attentions' own buffers go; the others are numbered down past them.
    let dropped: Vec<u32> = folds
        .iter()
        .map(|(i, _, _)| match &program.steps[*i] {
            Step::Attention(a) => a.out.buffer.0,
            _ => unreachable!("a fold starts at an attention"),
        })
        .collect();
    let below = |b: u32| dropped.iter().filter(|&&d| d < b).count() as u32;
    let renumber = |b: &mut BufferId| *b = BufferId(b.0 - below(b.0));
    let mut steps = Vec::with_capacity(program.steps.len());
    let mut origin: Vec<Vec<usize>> = Vec::with_capacity(program.steps.len());
    for (n, step) in program.steps.iter().enumerate() {
        if folds.iter().any(|f| f.1 == n) {
            // The copy's index checks (it has none: it loads f32) would go with the attention.
            let (i, _, _) = folds.iter().find(|f| f.1 == n).expect("found above");
            if let Some(at) = origin.iter().position(|o| o.contains(i)) {
                origin[at].push(n);
            }
            continue;
        }
        let mut step = step.clone();
        if let Some((_, j, view)) = folds.iter().find(|f| f.0 == n) {
            if let (Step::Attention(a), Step::Kernel(copy)) = (&mut step, &program.steps[*j]) {
                a.out = view.clone();
                a.nodes.extend(copy.nodes.iter().copied());
            }
        }
        crate::fuse::renumber_buffers(&mut step, &renumber);
        steps.push(step);
        origin.push(vec![n]);
    }
    let mut out = program.with_steps(steps, &origin);
    out.buffers = program
        .buffers
        .iter()
        .enumerate()
        .filter(|(b, _)| !dropped.contains(&(*b as u32)))
        .map(|(_, b)| b.clone())
        .collect();
    for check in &mut out.index_checks {
        renumber(&mut check.buffer);
    }
    for o in &mut out.outputs {
        renumber(o);
    }
    out
}

/// The copy step of attention step `i`'s output and the view of the copy's buffer the attention
/// should write instead (see [`fold_output_copies`]).
fn output_copy(program: &Program, i: usize, a: &AttentionStep) -> Option<(usize, StridedView)> {
    let own = a.out.buffer;
    if program.buffer(own).kind != BufferKind::Intermediate {
        return None;
    }
    // The one other step touching the attention's buffer.
    let mut touching = program
        .steps
        .iter()
        .enumerate()
        .filter(|&(n, s)| n != i && (s.reads().contains(&own) || s.writes().contains(&own)));
    let (j, copy) = touching.next()?;
    if touching.next().is_some() || j < i {
        return None;
    }
    let Step::Kernel(copy) = copy else {
        return None;
    };
    let [stage] = &copy.stages[..] else {
        return None;
    };
    let StageAction::Store(stores) = &stage.action else {
        return None;
    };
    let [store] = &stores[..] else {
        return None;
    };
    let Expr::Load {
        buffer,
        index: load,
        indirect: None,
    } = copy.expr(store.value)
    else {
        return None;
    };
    let target = program.buffer(store.buffer);
    if *buffer != own
        || copy.loads() != [own]
        || store.buffer == own
        || matches!(target.kind, BufferKind::Input(_))
        || target.dtype != DType::F32
        || copy.ty(store.value) != minductor_kernel_ir::ScalarType::F32
        || load.offset != a.out.offset
    {
        return None;
    }
    let operands = [a.q.buffer, a.k.buffer, a.v.buffer];
    if operands.contains(&store.buffer) || a.mask.as_ref().is_some_and(|m| m.buffer == store.buffer)
    {
        return None;
    }
    // Each loop of more than one iteration walks one dim of the attention's output, moving
    // the load as that dim moves the attention's store; so the copy reads exactly the elements
    // the attention writes, each once, and the attention can store each where the copy would.
    let (shape, written) = (&a.out.shape, &a.out.strides);
    let loops: Vec<(Var, Dim)> = (0..copy.outer.len())
        .map(|o| (Var::Outer(o as u32), copy.outer[o]))
        .chain((0..stage.extent.len()).map(|s| (Var::Inner(s as u32), stage.extent[s])))
        .collect();
    let mut strides: Vec<Option<SizeExpr>> = vec![None; shape.len()];
    for &(var, extent) in &loops {
        if extent == Dim::Static(1) {
            continue;
        }
        let (c, to) = (load.coefficient(var), store.index.coefficient(var));
        let free = |strides: &[Option<SizeExpr>], d: usize, step: &SizeExpr| {
            strides[d].is_none() && shape[d] != Dim::Static(1) && written[d] == *step
        };
        // The dim the loop moves along, or (a reshape that merged dims: `[h, d]` walked as
        // one loop of `h·d`) the static dims it walks through, innermost first, each moving
        // the attention's store by the previous ones' elements times the loop's step.
        let d = (0..shape.len()).find(|&d| free(&strides, d, &c))?;
        if shape[d] == extent {
            strides[d] = Some(to);
            continue;
        }
        let (Some(total), Some(first)) = (extent.as_static(), shape[d].as_static()) else {
            return None;
        };
        let mut walked = first;
        strides[d] = Some(to.clone());
        while walked < total {
            let step = c.times(&SizeExpr::Const(walked as i64));
            let next = (0..shape.len()).find(|&d| free(&strides, d, &step))?;
            strides[next] = Some(to.times(&SizeExpr::Const(walked as i64)));
            walked = walked.checked_mul(shape[next].as_static()?)?;
        }
        if walked != total {
            return None;
        }
    }
    // Every dim of more than one element is walked, and the load moves with no other loop.
    let walked = |d: usize| strides[d].is_some() || shape[d] == Dim::Static(1);
    let moves_only_with_loops = load
        .terms
        .iter()
        .all(|(v, _)| loops.iter().any(|&(w, _)| w == *v));
    if !(0..shape.len()).all(walked) || !moves_only_with_loops {
        return None;
    }
    let strides: Vec<SizeExpr> = strides
        .into_iter()
        .map(|s| s.unwrap_or(SizeExpr::Const(0)))
        .collect();
    let rank = shape.len();
    if shape[rank - 1] != Dim::Static(1) && !strides[rank - 1].is(1) {
        return None;
    }
    // Nothing between the two steps reads or writes the copy's buffer.
    let between = &program.steps[i + 1..j];
    if between
        .iter()
        .any(|s| s.reads().contains(&store.buffer) || s.writes().contains(&store.buffer))
    {
        return None;
    }
    Some((
        j,
        StridedView {
            buffer: store.buffer,
            offset: store.index.offset.clone(),
            shape: shape.clone(),
            strides,
        },
    ))
}
