//! `sink_cats`: moves a `cat` below the pointwise ops that read it, so that they run on its
//! pieces and the `cat` assembles their results instead (Inductor lowers such a `cat` to a
//! pointwise kernel that selects its operand by index; a kernel here cannot select a load, so
//! the ops move to the pieces instead).
//!
//! `fuse` realizes every `cat`: each operand is written into its slice of one buffer, which the
//! readers then load. Rotary embeddings read `cat(-x2, x1) * sin + x * cos`: the rotated half
//! copy was a buffer of its own, written and read back once per call. After this pass the sum is
//! `cat(-x2 * sin1 + x1' * cos1, x1 * sin2 + x2' * cos2)`, whose two halves are each one
//! pointwise kernel writing the result's slice, and the rotated copy is gone.
//!
//! A pointwise node (unary, binary, cast) *sinks*, running once per piece and assembling
//! the results with a `cat` of the same pieces, when
//! - one of its operands is a `cat` (or a node that sinks) whose pieces have static sizes along
//!   a dim the node has at their total size, every other operand being broadcast along that
//!   dim or spanning it (each piece then reads its slice, or its own piece of a `cat` with the
//!   same pieces);
//! - and no larger buffer results: the node's own `cat` dissolves (each of its readers sinks
//!   too, and it is no output), or it is the one reader of a `cat` of its own shape that
//!   dissolves (one buffer replaces another of the same size).
//!
//! The nodes that sink are the largest set meeting these conditions (candidates that fail are
//! removed, and their neighbours checked again, until none fails). A small `cat` broadcast into
//! a larger product that a reduction reads stays where it is (`cos` and `sin` tables do move
//! when the sum they end in is itself a `cat` that dissolves or replaces one).
//!
//! Assumes a verified prim graph. Guarantees an equivalent graph, computing every element with
//! the same operations on the same values (the same bits), that realizes no more and no larger
//! buffers than before, simplified again (`simplify`: the dissolved `cat`s are dropped).

use minductor_ir::{Dim, Graph, Node, NodeId, Op, SliceFrom};
use smallvec::SmallVec;

/// A `cat`-valued node: the dim (counted from the last, so that it lines up under
/// broadcasting) and the static size of each piece along it.
#[derive(Clone, Debug, PartialEq)]
struct Pieces {
    from_last: usize,
    sizes: SmallVec<[usize; 4]>,
}

pub fn sink_cats(graph: &Graph) -> Graph {
    let n = graph.len();
    // The pieces of every `cat` with static pieces, and of every pointwise node that could run
    // on pieces (a candidate).
    let mut pieces: Vec<Option<Pieces>> = vec![None; n];
    let mut sinks = vec![false; n];
    for id in graph.ids() {
        let node = graph.node(id);
        pieces[id.index()] = match &node.op {
            Op::Cat { dim } => cat_pieces(graph, node, *dim),
            op if pointwise(op) => candidate(graph, node, &pieces),
            _ => None,
        };
        sinks[id.index()] = pointwise(&node.op) && pieces[id.index()].is_some();
    }
    let mut readers: Vec<SmallVec<[NodeId; 4]>> = vec![SmallVec::new(); n];
    for id in graph.ids() {
        for &i in &graph.node(id).inputs {
            if !readers[i.index()].contains(&id) {
                readers[i.index()].push(id);
            }
        }
    }
    let mut is_output = vec![false; n];
    for &o in graph.outputs() {
        is_output[o.index()] = true;
    }
    // Which candidates sink: the largest set in which every member reads a `cat` (one, or a
    // member) of its pieces, and either is itself dissolved (every reader is a member of the
    // same pieces: no buffer holds it) or reads such a dissolved `cat` of its own shape (its
    // `cat` replaces that one, no larger). Candidates that fail are removed until none does.
    let mut work: Vec<NodeId> = graph.ids().filter(|id| sinks[id.index()]).collect();
    while let Some(id) = work.pop() {
        if !sinks[id.index()] || keeps_sinking(graph, id, &pieces, &sinks, &readers, &is_output) {
            continue;
        }
        sinks[id.index()] = false;
        // Whoever's test read this node's membership: its readers, its operands (their
        // dissolving), and its operands' other readers (whose operand may no longer dissolve).
        work.extend(readers[id.index()].iter().copied());
        for &o in &graph.node(id).inputs {
            work.push(o);
            work.extend(readers[o.index()].iter().copied());
        }
    }

    let mut out = Graph::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(n);
    // Each node that is a `cat` in `out`: its pieces there.
    let mut parts: Vec<Option<SmallVec<[NodeId; 4]>>> = vec![None; n];
    for id in graph.ids() {
        let node = graph.node(id);
        let inputs: SmallVec<[NodeId; 4]> = node.inputs.iter().map(|i| map[i.index()]).collect();
        let new = match &node.op {
            Op::Input { name } => out.input(name.clone(), node.ty.clone()),
            Op::Cat { .. } => {
                parts[id.index()] = Some(inputs.clone());
                push(&mut out, node, &inputs)
            }
            _ if sinks[id.index()] => {
                let p = pieces[id.index()]
                    .as_ref()
                    .expect("a sinking node has pieces");
                let dim = node.ty.rank() - 1 - p.from_last;
                let mut results: SmallVec<[NodeId; 4]> = SmallVec::new();
                let mut offset = 0;
                for (k, &size) in p.sizes.iter().enumerate() {
                    let operands: SmallVec<[NodeId; 4]> = (node.inputs.iter().zip(&inputs))
                        .map(|(&old, &new)| {
                            let own = (pieces[old.index()].as_ref() == Some(p))
                                .then(|| parts[old.index()].as_ref())
                                .flatten();
                            piece_of(graph, &mut out, old, new, own, p, k, offset, size)
                        })
                        .collect();
                    let piece = out
                        .add(node.op.clone(), &operands)
                        .expect("a pointwise op types on pieces of its operands");
                    results.push(piece);
                    offset += size;
                }
                let cat = out
                    .add(Op::Cat { dim }, &results)
                    .expect("the pieces assemble the node's shape");
                debug_assert_eq!(out.ty(cat), &node.ty);
                parts[id.index()] = Some(results);
                cat
            }
            _ => push(&mut out, node, &inputs),
        };
        map.push(new);
    }
    out.set_outputs(graph.outputs().iter().map(|o| map[o.index()]).collect());
    // The dissolved `cat`s and the nodes only they read go (DCE), and the slices of one
    // operand taken for several readers become one (CSE).
    crate::simplify::simplify(&out)
}

/// Whether candidate `id` (still a member of `sinks`) keeps its place (see [`sink_cats`]).
fn keeps_sinking(
    graph: &Graph,
    id: NodeId,
    pieces: &[Option<Pieces>],
    sinks: &[bool],
    readers: &[SmallVec<[NodeId; 4]>],
    is_output: &[bool],
) -> bool {
    let p = &pieces[id.index()];
    let is_cat = |c: NodeId| matches!(graph.node(c).op, Op::Cat { .. }) || sinks[c.index()];
    let same = |c: NodeId| pieces[c.index()] == *p && is_cat(c);
    let dissolved = |c: NodeId| {
        !is_output[c.index()]
            && (readers[c.index()].iter())
                .all(|&r| sinks[r.index()] && pieces[r.index()] == pieces[c.index()])
    };
    let inputs = &graph.node(id).inputs;
    let reads_pieces = inputs.iter().any(|&c| same(c));
    // Or the one reader of a dissolving `cat` of its shape: one buffer replaces one.
    let no_larger = dissolved(id)
        || inputs.iter().any(|&c| {
            same(c)
                && graph.ty(c).shape == graph.ty(id).shape
                && readers[c.index()].len() == 1
                && dissolved(c)
        });
    reads_pieces && no_larger
}

/// Piece `k` (at `offset`, `size` long along the pieces' dim) of operand `old` of a sinking
/// node, `new` in `out`: itself if it is broadcast along the dim, its own piece if it is a
/// `cat` of the same pieces (`own`), else its slice.
#[allow(clippy::too_many_arguments)]
fn piece_of(
    graph: &Graph,
    out: &mut Graph,
    old: NodeId,
    new: NodeId,
    own: Option<&SmallVec<[NodeId; 4]>>,
    p: &Pieces,
    k: usize,
    offset: usize,
    size: usize,
) -> NodeId {
    let shape = &graph.ty(old).shape;
    let rank = shape.len();
    if rank <= p.from_last || shape[rank - 1 - p.from_last] == Dim::Static(1) {
        return new;
    }
    if let Some(own) = own {
        return own[k];
    }
    out.add(
        Op::Slice {
            dim: rank - 1 - p.from_last,
            start: offset,
            end: offset + size,
            step: 1,
            from: SliceFrom::Start,
        },
        &[new],
    )
    .expect("the slice lies within the operand's static dim")
}

fn pointwise(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_) | Op::Cast { .. })
}

/// The pieces of `cat` node `node` along `dim`, if their sizes are static.
fn cat_pieces(graph: &Graph, node: &Node, dim: usize) -> Option<Pieces> {
    let rank = node.ty.rank();
    let sizes = (node.inputs.iter())
        .map(|&i| graph.ty(i).shape[dim].as_static())
        .collect::<Option<SmallVec<[usize; 4]>>>()?;
    // Every piece at least one long, so the total (at least 2) is never a broadcast size.
    (sizes.len() >= 2 && sizes.iter().all(|&s| s >= 1)).then_some(Pieces {
        from_last: rank - 1 - dim,
        sizes,
    })
}

/// The pieces pointwise `node` could run on: those of its first operand with pieces along a
/// dim the node has at their total size, if every operand is broadcast along that dim, or
/// spans it (and then has no pieces, or the same).
fn candidate(graph: &Graph, node: &Node, pieces: &[Option<Pieces>]) -> Option<Pieces> {
    let shape = &node.ty.shape;
    let rank = shape.len();
    let p = (node.inputs.iter())
        .find_map(|&c| pieces[c.index()].as_ref().filter(|p| p.from_last < rank))?;
    let total: usize = p.sizes.iter().sum();
    let fits = node.inputs.iter().all(|&o| {
        let s = &graph.ty(o).shape;
        let r = s.len();
        if r <= p.from_last {
            return true;
        }
        match s[r - 1 - p.from_last] {
            Dim::Static(1) => true,
            // Slices of a `cat` along another split would be read from its buffer: they
            // would keep it.
            Dim::Static(size) if size == total => pieces[o.index()].as_ref().is_none_or(|q| q == p),
            _ => false,
        }
    });
    (fits && shape[rank - 1 - p.from_last] == Dim::Static(total)).then(|| p.clone())
}

/// `node` with operands `inputs`, as it is.
fn push(out: &mut Graph, node: &Node, inputs: &[NodeId]) -> NodeId {
    out.push(Node {
        op: node.op.clone(),
        inputs: inputs.into(),
        ty: node.ty.clone(),
    })
}
