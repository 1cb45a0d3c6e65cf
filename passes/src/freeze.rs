//! `freeze`: parameters declared constant at compile time, like Inductor's `freezing=True`.
//!
//! Assumes a prim graph (after `decompose` and `simplify`) without gradients, and a mask saying
//! which graph inputs are frozen (their values are known when compiling: weights, batch-norm
//! statistics). Guarantees two graphs whose composition equals the input graph:
//! - `constants`: inputs are the frozen inputs, in graph order; outputs are the *roots*, the
//!   values the rest of the graph needs that depend on frozen inputs and 0-d constants only.
//!   The caller evaluates it once (the frontend uses the reference interpreter).
//! - `run`: inputs are the graph's other inputs, in order, then one input per root; its outputs
//!   are the graph's outputs. It is what gets compiled and called.
//!
//! Before splitting, an affine chain on a convolution's GEMM folds into its weight (batch-norm
//! folding): `matmul(A, X)` seen as `[N, C, …]` and followed by single-use `+ c`, `− c`, `· c`,
//! `/ c` with frozen `c` that vary along the channel dim only becomes
//! `matmul(A · s, X) + t`, with `s` and `t` computed from the `c`s. After freezing, `A · s` and
//! `t` are roots: the scale is folded into the weight once, and the GEMM's epilogue keeps one add.
//!
//! Views of roots stay in `run` (a view is free in a kernel; folding an `expand` would
//! materialize every copy), and so do `iota`s (an index computed in a kernel is cheaper than a
//! mask read from memory).

use crate::simplify;
use minductor_ir::{static_shape, BinaryOp, DType, Dim, Graph, NodeId, Op};

/// The two halves of a frozen graph (see the module doc).
#[derive(Clone, Debug)]
pub struct Frozen {
    /// Frozen inputs → roots; evaluated once, at compile time.
    pub constants: Graph,
    /// The other inputs, then one input per root → the graph's outputs.
    pub run: Graph,
    /// How many affine chains were folded into a GEMM's weight.
    pub folded_chains: usize,
}

/// Splits `graph` into its constant part and the part to run (see the module doc). `frozen[i]`
/// says whether input `i` is frozen; a mask of another length freezes nothing past its end.
pub fn freeze(graph: &Graph, frozen: &[bool]) -> Frozen {
    let is_frozen = |index: usize| frozen.get(index).copied().unwrap_or(false);
    let (folded, folded_chains) = fold_affine_chains(graph, &is_frozen);
    let graph = simplify(&folded);
    let constant = constant_nodes(&graph, &is_frozen);
    split(&graph, &constant, &is_frozen, folded_chains)
}

/// Each node's position among `graph.inputs()` (the index `frozen` masks), if it is an input.
fn input_positions(graph: &Graph) -> Vec<Option<usize>> {
    let mut position = vec![None; graph.len()];
    for (k, id) in graph.inputs().iter().enumerate() {
        position[id.index()] = Some(k);
    }
    position
}

/// Which nodes depend on frozen inputs and 0-d constants only.
fn constant_nodes(graph: &Graph, is_frozen: &dyn Fn(usize) -> bool) -> Vec<bool> {
    let mut constant = vec![false; graph.len()];
    let position = input_positions(graph);
    for (index, node) in graph.nodes().iter().enumerate() {
        constant[index] = match node.op {
            Op::Input { .. } => position[index].is_some_and(is_frozen),
            Op::Constant { .. } => true,
            Op::Iota { .. } => false,
            // A value of a symbolic shape (a constant expanded to `[s0]`) has no size until a
            // call binds it, so it cannot be computed at compile time.
            _ => {
                !node.inputs.is_empty()
                    && node.inputs.iter().all(|i| constant[i.index()])
                    && node.ty.static_sizes().is_some()
            }
        };
    }
    constant
}

fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. } | Op::Permute { .. } | Op::Expand { .. } | Op::Slice { .. }
    )
}

/// Copies `graph` into the two halves. A node is computed in `run` unless it is constant and
/// neither a view nor a 0-d constant; a frozen input is never an input of `run`. Whatever `run`
/// reads (or returns) of the other half is a root: a folded value, or a frozen input as it is.
fn split(
    graph: &Graph,
    constant: &[bool],
    is_frozen: &dyn Fn(usize) -> bool,
    folded_chains: usize,
) -> Frozen {
    let input_of = input_positions(graph);
    // Users come after their operands: walking backwards, a constant view is known to be read
    // by `run` (or returned) before its own operands are decided.
    let mut in_run = vec![false; graph.len()];
    let mut read_by_run = vec![false; graph.len()];
    for output in graph.outputs() {
        read_by_run[output.index()] = true;
    }
    for (index, node) in graph.nodes().iter().enumerate().rev() {
        in_run[index] = match (&node.op, input_of[index]) {
            (Op::Input { .. }, Some(k)) => !is_frozen(k),
            (Op::Constant { .. }, _) => true,
            (op, _) => !constant[index] || (is_view(op) && read_by_run[index]),
        };
        if in_run[index] {
            for input in &node.inputs {
                read_by_run[input.index()] = true;
            }
        }
    }
    let mut root = vec![false; graph.len()];
    for (index, node) in graph.nodes().iter().enumerate() {
        if in_run[index] {
            for input in &node.inputs {
                root[input.index()] |= !in_run[input.index()];
            }
        }
    }
    for output in graph.outputs() {
        root[output.index()] |= !in_run[output.index()];
    }
    let roots: Vec<usize> = (0..graph.len()).filter(|&i| root[i]).collect();

    // The constant half: the frozen inputs, then every constant node `run` does not compute.
    let mut constants = Graph::new();
    let mut in_constants: Vec<Option<NodeId>> = vec![None; graph.len()];
    for (index, node) in graph.nodes().iter().enumerate() {
        if !constant[index] {
            continue;
        }
        in_constants[index] = Some(copy_node(&mut constants, node, &in_constants));
    }
    constants.set_outputs(
        roots
            .iter()
            .map(|&i| in_constants[i].expect("a root is constant"))
            .collect(),
    );

    // The half to run: the other inputs, then the roots as inputs, then the remaining nodes.
    let mut run = Graph::new();
    let mut in_run_graph: Vec<Option<NodeId>> = vec![None; graph.len()];
    for &id in graph.inputs() {
        if in_run[id.index()] {
            let node = graph.node(id);
            in_run_graph[id.index()] = Some(copy_node(&mut run, node, &in_run_graph));
        }
    }
    for (k, &index) in roots.iter().enumerate() {
        let ty = graph.nodes()[index].ty.clone();
        in_run_graph[index] = Some(run.input(format!("frozen.{k}"), ty));
    }
    for (index, node) in graph.nodes().iter().enumerate() {
        if in_run[index] && in_run_graph[index].is_none() {
            in_run_graph[index] = Some(copy_node(&mut run, node, &in_run_graph));
        }
    }
    run.set_outputs(
        graph
            .outputs()
            .iter()
            .map(|o| in_run_graph[o.index()].expect("every output is computed by run or a root"))
            .collect(),
    );
    Frozen {
        constants,
        run,
        folded_chains,
    }
}

/// Appends a copy of `node` to `out`, its operands mapped by `map`.
fn copy_node(out: &mut Graph, node: &minductor_ir::Node, map: &[Option<NodeId>]) -> NodeId {
    match &node.op {
        Op::Input { name } => out.input(name.clone(), node.ty.clone()),
        Op::Constant { value } => out.constant(*value, node.ty.dtype),
        op => {
            let inputs: Vec<NodeId> = node
                .inputs
                .iter()
                .map(|i| map[i.index()].expect("operands are copied first"))
                .collect();
            out.add(op.clone(), &inputs)
                .expect("a node of a verified graph types the same with the same operands")
        }
    }
}

/// One `+ c`, `− c`, `· c` or `/ c` of an affine chain, `c` already in the new graph.
#[derive(Clone, Copy)]
struct Step {
    op: BinaryOp,
    constant: NodeId,
}

/// A convolution GEMM whose output's affine chain folds into its weight: the matmul, its
/// `[N, C, …]` view, the chain's steps (old ids of the constants) and its last node.
struct Chain {
    matmul: NodeId,
    view: NodeId,
    steps: Vec<(BinaryOp, NodeId)>,
    last: NodeId,
    groups: usize,
    rows: usize,
}

/// Finds every foldable chain (see the module doc) and rewrites it.
fn fold_affine_chains(graph: &Graph, is_frozen: &dyn Fn(usize) -> bool) -> (Graph, usize) {
    let constant = constant_nodes(graph, is_frozen);
    let uses = graph.use_counts();
    let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); graph.len()];
    for id in graph.ids() {
        for input in &graph.node(id).inputs {
            users[input.index()].push(id);
        }
    }
    let chains: Vec<Chain> = graph
        .ids()
        .filter_map(|id| find_chain(graph, id, &constant, &uses, &users))
        .collect();
    if chains.is_empty() {
        return (graph.clone(), 0);
    }
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; graph.len()];
    for (index, node) in graph.nodes().iter().enumerate() {
        let id = NodeId(index as u32);
        let new = match chains.iter().find(|c| c.last == id) {
            Some(chain) => emit_folded(graph, &mut out, &map, chain),
            None => copy_node(&mut out, node, &map),
        };
        map[index] = Some(new);
    }
    out.set_outputs(
        graph
            .outputs()
            .iter()
            .map(|o| map[o.index()].expect("every node is copied"))
            .collect(),
    );
    (out, chains.len())
}

/// The static sizes of `id`'s type, if it has them.
fn sizes(graph: &Graph, id: NodeId) -> Option<Vec<usize>> {
    graph.ty(id).static_sizes()
}

/// The chain that starts at `matmul`, if it folds: `A` frozen `[G, R, K]` f32, the product
/// `[N, G, R, P]` viewed once as `[N, G·R, …]`, then at least one `·`/`/` by frozen values that
/// vary along dim 1 only, each step the single user of the one before.
fn find_chain(
    graph: &Graph,
    matmul: NodeId,
    constant: &[bool],
    uses: &[usize],
    users: &[Vec<NodeId>],
) -> Option<Chain> {
    let node = graph.node(matmul);
    if !matches!(node.op, Op::Matmul) || node.ty.dtype != DType::F32 {
        return None;
    }
    let (a, x) = (node.inputs[0], node.inputs[1]);
    if !constant[a.index()] || constant[x.index()] {
        return None;
    }
    let a_sizes = sizes(graph, a)?;
    let m_sizes = sizes(graph, matmul)?;
    let [groups, rows, _] = a_sizes[..] else {
        return None;
    };
    let [_, g, r, pixels] = m_sizes[..] else {
        return None;
    };
    // One use, and it is a node (not a graph output).
    let only_user = |id: NodeId| match users[id.index()][..] {
        [user] if uses[id.index()] == 1 => Some(user),
        _ => None,
    };
    if (g, r) != (groups, rows) {
        return None;
    }
    let view = only_user(matmul)?;
    let v_sizes = sizes(graph, view)?;
    let channels = groups * rows;
    if !matches!(graph.node(view).op, Op::Reshape { .. })
        || v_sizes.len() < 2
        || v_sizes[0] != m_sizes[0]
        || v_sizes[1] != channels
        || v_sizes[2..].iter().product::<usize>() != pixels
    {
        return None;
    }
    let mut steps = Vec::new();
    let mut current = view;
    while let Some(user) = only_user(current) {
        let user_node = graph.node(user);
        let Op::Binary(op) = user_node.op else { break };
        let [left, right] = user_node.inputs[..] else {
            break;
        };
        let other = match op {
            BinaryOp::Add | BinaryOp::Mul if left == current => right,
            BinaryOp::Add | BinaryOp::Mul if right == current => left,
            BinaryOp::Sub | BinaryOp::Div if left == current && right != current => right,
            _ => break,
        };
        if !constant[other.index()]
            || user_node.ty != *graph.ty(view)
            || !per_channel(graph, other, v_sizes.len(), channels)
        {
            break;
        }
        steps.push((op, other));
        current = user;
    }
    let scales = steps
        .iter()
        .any(|(op, _)| matches!(op, BinaryOp::Mul | BinaryOp::Div));
    if !scales {
        return None;
    }
    Some(Chain {
        matmul,
        view,
        steps,
        last: current,
        groups,
        rows,
    })
}

/// Whether `c`, broadcast against a value of rank `rank` whose dim 1 has `channels` elements,
/// varies along that dim only (f32, every other dim of size 1).
fn per_channel(graph: &Graph, c: NodeId, rank: usize, channels: usize) -> bool {
    let ty = graph.ty(c);
    let Some(c_sizes) = ty.static_sizes() else {
        return false;
    };
    if ty.dtype != DType::F32 || c_sizes.len() > rank {
        return false;
    }
    // Right-aligned, the value's dim 1 is the constant's dim `len − rank + 1`.
    let channel_dim = (c_sizes.len() + 1).checked_sub(rank);
    c_sizes
        .iter()
        .enumerate()
        .all(|(d, &n)| n == 1 || (Some(d) == channel_dim && n == channels))
}

/// Emits `matmul(A · s, X)` viewed as before, plus `t`, for `chain` into `out`; returns the node
/// that replaces the chain's last node.
fn emit_folded(graph: &Graph, out: &mut Graph, map: &[Option<NodeId>], chain: &Chain) -> NodeId {
    let new = |id: NodeId| map[id.index()].expect("operands come first");
    let channels = chain.groups * chain.rows;
    let add = |out: &mut Graph, op: Op, inputs: &[NodeId]| {
        out.add(op, inputs)
            .expect("per-channel vectors of one length combine")
    };
    // Each constant as a vector over channels (a 0-d constant stays 0-d: it broadcasts).
    let steps: Vec<Step> = chain
        .steps
        .iter()
        .map(|&(op, c)| {
            let numel: usize = sizes(graph, c).map(|s| s.iter().product()).unwrap_or(1);
            let reshaped = if graph.ty(c).rank() == 0 {
                new(c)
            } else if numel == channels {
                add(
                    out,
                    Op::Reshape {
                        shape: static_shape(&[channels]),
                    },
                    &[new(c)],
                )
            } else {
                add(
                    out,
                    Op::Reshape {
                        shape: static_shape(&[]),
                    },
                    &[new(c)],
                )
            };
            Step {
                op,
                constant: reshaped,
            }
        })
        .collect();
    // y·s + t, replayed over the steps.
    let mut scale: Option<NodeId> = None;
    let mut shift: Option<NodeId> = None;
    for step in steps {
        let c = step.constant;
        let binary = |op| Op::Binary(op);
        match step.op {
            BinaryOp::Add => {
                shift = Some(match shift {
                    Some(t) => add(out, binary(BinaryOp::Add), &[t, c]),
                    None => c,
                });
            }
            BinaryOp::Sub => {
                shift = Some(match shift {
                    Some(t) => add(out, binary(BinaryOp::Sub), &[t, c]),
                    None => add(out, Op::Unary(minductor_ir::UnaryOp::Neg), &[c]),
                });
            }
            BinaryOp::Mul | BinaryOp::Div => {
                let op = step.op;
                scale = Some(match scale {
                    Some(s) => add(out, binary(op), &[s, c]),
                    None if op == BinaryOp::Mul => c,
                    None => {
                        let one = out.constant(1.0, DType::F32);
                        add(out, binary(BinaryOp::Div), &[one, c])
                    }
                });
                shift = shift.map(|t| add(out, binary(op), &[t, c]));
            }
            _ => unreachable!("find_chain keeps affine steps only"),
        }
    }
    let scale = scale.expect("find_chain keeps chains that scale");
    let matmul = graph.node(chain.matmul);
    let (a, x) = (new(matmul.inputs[0]), new(matmul.inputs[1]));
    // The scale per output row of the weight `[G, R, K]`: `[G, R, 1]`, or 0-d as it is.
    let row_scale = if out.ty(scale).rank() == 0 {
        scale
    } else {
        add(
            out,
            Op::Reshape {
                shape: static_shape(&[chain.groups, chain.rows, 1]),
            },
            &[scale],
        )
    };
    let weight = add(out, Op::Binary(BinaryOp::Mul), &[a, row_scale]);
    let product = add(out, Op::Matmul, &[weight, x]);
    let view_shape = graph.ty(chain.view).shape.clone();
    let mut result = add(
        out,
        Op::Reshape {
            shape: view_shape.clone(),
        },
        &[product],
    );
    if let Some(shift) = shift {
        let shift = if out.ty(shift).rank() == 0 {
            shift
        } else {
            // `[C, 1, …]`: the channel dim and the dims after it.
            let mut shape = vec![Dim::Static(1); view_shape.len() - 1];
            shape[0] = Dim::Static(channels);
            add(
                out,
                Op::Reshape {
                    shape: shape.into_iter().collect(),
                },
                &[shift],
            )
        };
        result = add(out, Op::Binary(BinaryOp::Add), &[result, shift]);
    }
    debug_assert_eq!(out.ty(result), graph.ty(chain.last));
    result
}
