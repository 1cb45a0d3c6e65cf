//! `simplify`: constant folding, algebraic identities, CSE and DCE on a prim graph.
//!
//! Assumes a prim graph (after `decompose`). Guarantees an equivalent prim graph in which
//! - pointwise ops over 0-d constants are folded into one constant (rounded to its dtype),
//! - identity views/casts and `x * 1`, `x + 0`, `x / 1` whose result type equals `x`'s are gone,
//!   and a permute of a permute is one permute,
//! - `x ** c` for c in {1, 2, 3, 0.5, -1} becomes multiplications, `sqrt` or a division,
//! - structurally equal nodes are merged (CSE) and nodes no output needs are dropped (DCE);
//!   graph inputs always stay, in order.

use minductor_ir::{
    BinaryOp, CompareOp, DType, Graph, Node, NodeId, Op, SliceFrom, TensorType, UnaryOp,
};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// What makes two nodes the same value (the CSE key): the op with its attributes, the operands
/// and the result type. Constants compare by their bits, so `0.0` and `-0.0` stay apart.
#[derive(Clone, Debug)]
struct Key {
    op: Op,
    inputs: SmallVec<[NodeId; 4]>,
    ty: TensorType,
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        let same_op = match (&self.op, &other.op) {
            (Op::Constant { value: a }, Op::Constant { value: b }) => a.to_bits() == b.to_bits(),
            (a, b) => a == b,
        };
        same_op && self.inputs == other.inputs && self.ty == other.ty
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Equal keys hash equally: the op's kind, constants' bits, the operands and the type;
        // other attributes only tell apart keys that `eq` compares anyway.
        std::mem::discriminant(&self.op).hash(state);
        if let Op::Constant { value } = self.op {
            value.to_bits().hash(state);
        }
        self.inputs.hash(state);
        self.ty.hash(state);
    }
}

type Seen = HashMap<Key, NodeId>;

pub fn simplify(graph: &Graph) -> Graph {
    let live = live_nodes(graph);
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; graph.len()];
    let mut seen = Seen::new();
    for (index, node) in graph.nodes().iter().enumerate() {
        if !live[index] {
            continue;
        }
        let ins: Vec<NodeId> = node
            .inputs
            .iter()
            .map(|i| map[i.index()].expect("operands are live"))
            .collect();
        let id = match &node.op {
            Op::Input { name } => out.input(name.clone(), node.ty.clone()),
            _ => rewrite(&mut out, &mut seen, node, &ins),
        };
        map[index] = Some(id);
    }
    out.set_outputs(
        graph
            .outputs()
            .iter()
            .map(|o| map[o.index()].expect("outputs are live"))
            .collect(),
    );
    out
}

/// Nodes an output depends on, plus every input.
fn live_nodes(graph: &Graph) -> Vec<bool> {
    let mut live = vec![false; graph.len()];
    for &o in graph.outputs() {
        live[o.index()] = true;
    }
    for &i in graph.inputs() {
        live[i.index()] = true;
    }
    for index in (0..graph.len()).rev() {
        if live[index] {
            for &i in &graph.nodes()[index].inputs {
                live[i.index()] = true;
            }
        }
    }
    live
}

fn constant_value(g: &Graph, id: NodeId) -> Option<f64> {
    match g.node(id).op {
        Op::Constant { value } => Some(value),
        _ => None,
    }
}

/// Rounds `v` the way storing it in `dtype` would.
fn round_to(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F64 => v,
        DType::F32 => v as f32 as f64,
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::I64 => (v as i64) as f64,
        DType::Bool => (v != 0.0) as u8 as f64,
    }
}

fn fold(op: &Op, args: &[f64]) -> Option<f64> {
    let x = args[0];
    Some(match op {
        Op::Unary(u) => match u {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Erf => return None,
        },
        Op::Binary(b) => {
            let y = args[1];
            match b {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div => x / y,
                BinaryOp::Maximum => {
                    if x.is_nan() || y.is_nan() {
                        f64::NAN
                    } else {
                        x.max(y)
                    }
                }
                BinaryOp::Minimum => {
                    if x.is_nan() || y.is_nan() {
                        f64::NAN
                    } else {
                        x.min(y)
                    }
                }
                BinaryOp::Pow => x.powf(y),
            }
        }
        Op::Compare(c) => {
            let y = args[1];
            let r = match c {
                CompareOp::Eq => x == y,
                CompareOp::Ne => x != y,
                CompareOp::Lt => x < y,
                CompareOp::Le => x <= y,
                CompareOp::Gt => x > y,
                CompareOp::Ge => x >= y,
            };
            r as u8 as f64
        }
        Op::Where => {
            if x != 0.0 {
                args[1]
            } else {
                args[2]
            }
        }
        Op::Cast { .. } => x,
        _ => return None,
    })
}

fn rewrite(out: &mut Graph, seen: &mut Seen, node: &Node, ins: &[NodeId]) -> NodeId {
    // Constant folding: every operand a constant, result 0-d.
    if node.op.is_pointwise() && node.ty.rank() == 0 {
        let args: Option<Vec<f64>> = ins.iter().map(|&i| constant_value(out, i)).collect();
        if let Some(v) = args.and_then(|a| fold(&node.op, &a)) {
            return intern(
                out,
                seen,
                Op::Constant {
                    value: round_to(v, node.ty.dtype),
                },
                &[],
                node,
            );
        }
    }
    let same_as_operand = |out: &Graph, i: usize| out.ty(ins[i]) == &node.ty;
    match &node.op {
        Op::Reshape { .. } | Op::Expand { .. } | Op::Cast { .. } if same_as_operand(out, 0) => {
            return ins[0]
        }
        Op::Permute { perm } if perm.iter().enumerate().all(|(i, &p)| i == p) => return ins[0],
        Op::Permute { perm } => {
            // A permute of a permute is one permute (the identity when they cancel).
            if let Op::Permute { perm: inner } = &out.node(ins[0]).op {
                let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
                let source = out.node(ins[0]).inputs[0];
                if composed.iter().enumerate().all(|(i, &p)| i == p) {
                    return source;
                }
                return intern(out, seen, Op::Permute { perm: composed }, &[source], node);
            }
        }
        // Only autodiff (which runs before) distinguishes a detached value.
        Op::Detach => return ins[0],
        Op::Slice {
            dim,
            start: 0,
            end,
            step: 1,
            from: SliceFrom::Start,
        } if Some(*end) == out.ty(ins[0]).shape[*dim].as_static() => return ins[0],
        Op::Binary(b) => {
            let rhs = constant_value(out, ins[1]);
            let lhs = constant_value(out, ins[0]);
            let identity = match b {
                BinaryOp::Add => (rhs == Some(0.0))
                    .then_some(0)
                    .or((lhs == Some(0.0)).then_some(1)),
                BinaryOp::Sub => (rhs == Some(0.0)).then_some(0),
                BinaryOp::Mul => (rhs == Some(1.0))
                    .then_some(0)
                    .or((lhs == Some(1.0)).then_some(1)),
                BinaryOp::Div | BinaryOp::Pow => (rhs == Some(1.0)).then_some(0),
                _ => None,
            };
            if let Some(keep) = identity {
                if same_as_operand(out, keep) {
                    return ins[keep];
                }
            }
            if *b == BinaryOp::Pow && out.ty(ins[0]) == &node.ty {
                if let Some(p) = rhs {
                    let x = ins[0];
                    let mul = |out: &mut Graph, seen: &mut Seen, a, c| {
                        intern(out, seen, Op::Binary(BinaryOp::Mul), &[a, c], node)
                    };
                    if p == 2.0 {
                        return mul(out, seen, x, x);
                    }
                    if p == 3.0 {
                        let sq = mul(out, seen, x, x);
                        return mul(out, seen, sq, x);
                    }
                    if p == 0.5 {
                        return intern(out, seen, Op::Unary(UnaryOp::Sqrt), &[x], node);
                    }
                    if p == -1.0 {
                        let one = intern_constant(out, seen, 1.0, node.ty.dtype);
                        return intern(out, seen, Op::Binary(BinaryOp::Div), &[one, x], node);
                    }
                }
            }
        }
        _ => {}
    }
    intern(out, seen, node.op.clone(), ins, node)
}

fn intern_constant(out: &mut Graph, seen: &mut Seen, value: f64, dtype: DType) -> NodeId {
    let key = Key {
        op: Op::Constant { value },
        inputs: SmallVec::new(),
        ty: TensorType::scalar(dtype),
    };
    *seen
        .entry(key)
        .or_insert_with(|| out.constant(value, dtype))
}

/// Adds `op(ins)` with `like`'s type unless a structurally equal node exists (CSE).
fn intern(out: &mut Graph, seen: &mut Seen, op: Op, ins: &[NodeId], like: &Node) -> NodeId {
    if let Op::Constant { value } = op {
        return intern_constant(out, seen, value, like.ty.dtype);
    }
    let key = Key {
        op,
        inputs: ins.into(),
        ty: like.ty.clone(),
    };
    if let Some(&id) = seen.get(&key) {
        return id;
    }
    let id = out.push(Node {
        op: key.op.clone(),
        inputs: key.inputs.clone(),
        ty: key.ty.clone(),
    });
    seen.insert(key, id);
    id
}
