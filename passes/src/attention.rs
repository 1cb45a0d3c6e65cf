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

use minductor_ir::{BinaryOp, CompareOp, DType, Dim, Graph, NodeId, Op, ReduceOp, UnaryOp};
use minductor_kernel_ir::MaskKind;
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
