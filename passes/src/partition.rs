//! `partition`: decides which forward values the backward reads from memory and which it
//! recomputes (AOTAutograd's min-cut rematerialization partitioner, in small).
//!
//! Assumes a simplified joint prim graph (after `autodiff` and `simplify`) whose backward passes
//! start from tangent inputs. Guarantees an equivalent graph laid out as the forward (every node
//! the forward outputs need, and the saved values), then the backward (every node the gradients
//! need that is not saved), in which the backward's copies of recomputed forward nodes are nodes
//! of their own, so that `fuse` computes them inside backward kernels instead of reading them
//! from memory. Run no CSE after it: CSE would merge the copies back.
//!
//! Classification, as PyTorch's partitioner does it: an output is a backward output when it
//! depends on a tangent; *required backward* nodes depend on a tangent and are needed by a
//! backward output; *required forward* nodes are needed by a forward output. The decision is a
//! minimum cut in a flow network over the rest: each node `v` is an edge `v_in → v_out` whose
//! capacity is its size in bytes, every use is an infinite edge `v_out → user_in`, required
//! backward nodes drain into the sink, and graph inputs and constants are free (source edges,
//! capacity 0), as are nodes whose recomputation is banned: GEMM outputs, reductions, cats and
//! scatter-adds that the forward computes anyway, and forward values a backward GEMM reads (the
//! backward would have to write them to memory again; PyTorch's `is_materialized_backwards`).
//! The cut's nodes are the saved values: the fewest bytes that let the backward recompute every
//! cheap pointwise chain from them.
//!
//! An activation memory budget below 1 lifts the ban from the largest saved values, one at a
//! time, while the saved bytes exceed that fraction of the unconstrained cut's (recomputing
//! GEMMs and reductions in the backward to keep less memory between the two).

use minductor_ir::{Graph, NodeId, Op, TensorType};
use std::collections::VecDeque;
use std::fmt;

/// How `partition` trades memory for recomputation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartitionOptions {
    /// The saved bytes allowed, as a fraction of what the default cut saves (1: the default
    /// cut; 0: recompute whatever can be recomputed).
    pub activation_memory_budget: f64,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions {
            activation_memory_budget: 1.0,
        }
    }
}

/// A forward value the backward reads from memory.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedValue {
    /// The node in the partitioned graph.
    pub node: NodeId,
    pub op: String,
    pub ty: TensorType,
    pub bytes: u64,
}

/// The partitioned joint graph and the decision, printable.
#[derive(Clone, Debug)]
pub struct Partition {
    /// Forward nodes first (`0..forward_len`), then the backward's.
    pub graph: Graph,
    pub forward_len: usize,
    pub saved: Vec<SavedValue>,
    /// Forward nodes the backward computes again (nodes of the partitioned graph's backward).
    pub recomputed: Vec<NodeId>,
}

impl Partition {
    pub fn saved_bytes(&self) -> u64 {
        self.saved.iter().map(|s| s.bytes).sum()
    }

    /// The partitioned graph's text with the forward and the backward marked, saved values and
    /// recomputed nodes annotated.
    pub fn graph_text(&self) -> String {
        let mut out = String::new();
        for line in self.graph.to_string().lines() {
            let id = line
                .trim_start()
                .strip_prefix('%')
                .and_then(|rest| rest.split_once(' '))
                .and_then(|(n, _)| n.parse::<u32>().ok());
            if id == Some(0) {
                out.push_str("  // forward\n");
            }
            if id == Some(self.forward_len as u32) {
                out.push_str("  // backward\n");
            }
            out.push_str(line);
            if let Some(id) = id.map(NodeId) {
                if self.saved.iter().any(|s| s.node == id) {
                    out.push_str("  // saved");
                } else if self.recomputed.contains(&id) {
                    out.push_str("  // recomputed");
                }
            }
            out.push('\n');
        }
        out
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "partition: forward %0..%{} ({} nodes), backward %{}..%{} ({} nodes)",
            self.forward_len,
            self.forward_len,
            self.forward_len,
            self.graph.len(),
            self.graph.len() - self.forward_len
        )?;
        writeln!(
            f,
            "saved: {} values, {} bytes",
            self.saved.len(),
            self.saved_bytes()
        )?;
        for s in &self.saved {
            writeln!(f, "  {} = {} : {}  {} bytes", s.node, s.op, s.ty, s.bytes)?;
        }
        let recomputed: Vec<String> = self
            .recomputed
            .iter()
            .map(|&id| format!("{id} {}", self.graph.node(id).op.name()))
            .collect();
        writeln!(
            f,
            "recomputed in backward: {} nodes{}{}",
            recomputed.len(),
            if recomputed.is_empty() { "" } else { ": " },
            recomputed.join(", ")
        )
    }
}

/// Bytes of a value; a symbolic dim counts as 64 (the cut only compares sizes).
fn bytes_of(ty: &TensorType) -> u64 {
    let elements: u64 = ty
        .shape
        .iter()
        .map(|d| d.as_static().unwrap_or(64) as u64)
        .product();
    elements * ty.dtype.size_bytes() as u64
}

pub fn partition(graph: &Graph, tangents: &[usize], options: &PartitionOptions) -> Partition {
    let n = graph.len();
    let nodes = graph.nodes();
    let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    for (index, node) in nodes.iter().enumerate() {
        for &i in &node.inputs {
            users[i.index()].push(NodeId(index as u32));
        }
    }
    let mut from_tangent = vec![false; n];
    for &t in tangents {
        if let Some(&id) = graph.inputs().get(t) {
            from_tangent[id.index()] = true;
        }
    }
    for index in 0..n {
        if nodes[index].inputs.iter().any(|i| from_tangent[i.index()]) {
            from_tangent[index] = true;
        }
    }
    let backward_output: Vec<bool> = graph
        .outputs()
        .iter()
        .map(|o| from_tangent[o.index()])
        .collect();
    let ancestors = |roots: &mut dyn Iterator<Item = NodeId>, stop: &dyn Fn(usize) -> bool| {
        let mut seen = vec![false; n];
        let mut stack: Vec<NodeId> = roots.collect();
        while let Some(id) = stack.pop() {
            if std::mem::replace(&mut seen[id.index()], true) || stop(id.index()) {
                continue;
            }
            stack.extend(nodes[id.index()].inputs.iter().copied());
        }
        seen
    };
    let outputs = graph.outputs();
    let required_forward = ancestors(
        &mut outputs
            .iter()
            .zip(&backward_output)
            .filter(|(_, &b)| !b)
            .map(|(&o, _)| o),
        &|_| false,
    );
    let needed_by_backward = ancestors(
        &mut outputs
            .iter()
            .zip(&backward_output)
            .filter(|(_, &b)| b)
            .map(|(&o, _)| o),
        &|_| false,
    );
    let required_backward: Vec<bool> = (0..n)
        .map(|i| from_tangent[i] && needed_by_backward[i])
        .collect();
    let free = |i: usize| matches!(nodes[i].op, Op::Input { .. } | Op::Constant { .. });
    let expensive = |i: usize| {
        matches!(
            nodes[i].op,
            Op::Matmul
                | Op::Reduce { .. }
                | Op::Cat { .. }
                | Op::ScatterAdd { .. }
                | Op::CumSum { .. }
        )
    };
    // Forward values that a backward GEMM, cat or scatter-add reads (through views): the
    // backward would have to write them to memory again to recompute them.
    let mut materialized_backward = vec![false; n];
    for (index, node) in nodes.iter().enumerate() {
        let extern_op = matches!(node.op, Op::Matmul | Op::Cat { .. } | Op::ScatterAdd { .. });
        if !extern_op || required_forward[index] {
            continue;
        }
        for &operand in &node.inputs {
            let mut v = operand;
            while nodes[v.index()].op.is_view() {
                v = nodes[v.index()].inputs[0];
            }
            materialized_backward[v.index()] = true;
        }
    }
    let mut banned: Vec<bool> = (0..n)
        .map(|i| {
            required_forward[i] && !from_tangent[i] && (expensive(i) || materialized_backward[i])
        })
        .collect();

    let cut = |banned: &[bool]| -> Vec<bool> {
        let (source, sink) = (2 * n, 2 * n + 1);
        let mut net = FlowNetwork::new(2 * n + 2);
        for i in 0..n {
            let (v_in, v_out) = (2 * i, 2 * i + 1);
            if required_backward[i] {
                net.edge(v_in, sink, INFINITE);
                continue;
            }
            if free(i) || banned[i] {
                net.edge(source, v_in, INFINITE);
            }
            let capacity = if free(i) {
                0
            } else {
                bytes_of(&nodes[i].ty).max(1)
            };
            net.edge(v_in, v_out, capacity);
            for u in &users[i] {
                net.edge(v_out, 2 * u.index(), INFINITE);
            }
        }
        let reachable = net.min_cut_source_side(source, sink);
        (0..n)
            .map(|i| {
                !required_backward[i]
                    && !free(i)
                    && needed_by_backward[i]
                    && reachable[2 * i]
                    && !reachable[2 * i + 1]
            })
            .collect()
    };
    let saved_bytes = |saved: &[bool]| -> u64 {
        (0..n)
            .filter(|&i| saved[i])
            .map(|i| bytes_of(&nodes[i].ty))
            .sum()
    };
    let mut saved = cut(&banned);
    let budget = options.activation_memory_budget.clamp(0.0, 1.0);
    if budget < 1.0 {
        let allowed = (saved_bytes(&saved) as f64 * budget) as u64;
        while saved_bytes(&saved) > allowed {
            let largest = (0..n)
                .filter(|&i| saved[i] && banned[i])
                .max_by_key(|&i| bytes_of(&nodes[i].ty));
            let Some(i) = largest else { break };
            banned[i] = false;
            saved = cut(&banned);
        }
    }

    // The forward computes what its outputs and the saved values need; the backward computes
    // what the gradients need, down to saved values, inputs and constants.
    let forward = ancestors(
        &mut outputs
            .iter()
            .zip(&backward_output)
            .filter(|(_, &b)| !b)
            .map(|(&o, _)| o)
            .chain((0..n).filter(|&i| saved[i]).map(|i| NodeId(i as u32))),
        &|_| false,
    );
    let backward = ancestors(
        &mut outputs
            .iter()
            .zip(&backward_output)
            .filter(|(_, &b)| b)
            .map(|(&o, _)| o),
        &|i| saved[i] || free(i),
    );
    let mut out = Graph::new();
    let mut forward_map: Vec<Option<NodeId>> = vec![None; n];
    for &input in graph.inputs() {
        let node = &nodes[input.index()];
        if let Op::Input { name } = &node.op {
            forward_map[input.index()] = Some(out.input(name.clone(), node.ty.clone()));
        }
    }
    for (i, node) in nodes.iter().enumerate() {
        let needed = forward[i] || (backward[i] && free(i));
        if forward_map[i].is_some() || !needed {
            continue;
        }
        let id = match &node.op {
            Op::Constant { value } => out.constant(*value, node.ty.dtype),
            _ => out.push(minductor_ir::Node {
                op: node.op.clone(),
                inputs: node
                    .inputs
                    .iter()
                    .map(|o| forward_map[o.index()].expect("a forward node's operands are forward"))
                    .collect(),
                ty: node.ty.clone(),
            }),
        };
        forward_map[i] = Some(id);
    }
    let forward_len = out.len();
    let mut backward_map: Vec<Option<NodeId>> = vec![None; n];
    let mut recomputed = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        if !backward[i] || free(i) || saved[i] {
            continue;
        }
        let inputs = node
            .inputs
            .iter()
            .map(|o| {
                backward_map[o.index()]
                    .or(forward_map[o.index()])
                    .expect("a backward node reads backward, saved or free values")
            })
            .collect();
        let id = out.push(minductor_ir::Node {
            op: node.op.clone(),
            inputs,
            ty: node.ty.clone(),
        });
        if forward[i] {
            recomputed.push(id);
        }
        backward_map[i] = Some(id);
    }
    out.set_outputs(
        outputs
            .iter()
            .map(|o| {
                backward_map[o.index()]
                    .or(forward_map[o.index()])
                    .expect("every output is computed")
            })
            .collect(),
    );
    let saved = (0..n)
        .filter(|&i| saved[i])
        .map(|i| SavedValue {
            node: forward_map[i].expect("saved values are forward values"),
            op: nodes[i].op.name(),
            ty: nodes[i].ty.clone(),
            bytes: bytes_of(&nodes[i].ty),
        })
        .collect();
    Partition {
        graph: out,
        forward_len,
        saved,
        recomputed,
    }
}

const INFINITE: u64 = u64::MAX / 4;

/// A flow network for Dinic's maximum flow; edges are stored in pairs (edge, reverse).
struct FlowNetwork {
    /// Per vertex, indices into `to`/`capacity`.
    adjacency: Vec<Vec<usize>>,
    to: Vec<usize>,
    capacity: Vec<u64>,
}

impl FlowNetwork {
    fn new(vertices: usize) -> Self {
        FlowNetwork {
            adjacency: vec![Vec::new(); vertices],
            to: Vec::new(),
            capacity: Vec::new(),
        }
    }

    fn edge(&mut self, from: usize, to: usize, capacity: u64) {
        self.adjacency[from].push(self.to.len());
        self.to.push(to);
        self.capacity.push(capacity);
        self.adjacency[to].push(self.to.len());
        self.to.push(from);
        self.capacity.push(0);
    }

    fn levels(&self, source: usize) -> Vec<u32> {
        let mut level = vec![u32::MAX; self.adjacency.len()];
        level[source] = 0;
        let mut queue = VecDeque::from([source]);
        while let Some(v) = queue.pop_front() {
            for &e in &self.adjacency[v] {
                let w = self.to[e];
                if self.capacity[e] > 0 && level[w] == u32::MAX {
                    level[w] = level[v] + 1;
                    queue.push_back(w);
                }
            }
        }
        level
    }

    /// Pushes flow from `v` to `sink` along level-increasing edges (an iterative DFS).
    fn augment(&mut self, source: usize, sink: usize, level: &[u32], next: &mut [usize]) -> u64 {
        let mut path: Vec<usize> = Vec::new();
        let mut v = source;
        loop {
            if v == sink {
                let pushed = path.iter().map(|&e| self.capacity[e]).min().unwrap_or(0);
                for &e in &path {
                    self.capacity[e] -= pushed;
                    self.capacity[e ^ 1] += pushed;
                }
                return pushed;
            }
            let mut advanced = false;
            while next[v] < self.adjacency[v].len() {
                let e = self.adjacency[v][next[v]];
                let w = self.to[e];
                if self.capacity[e] > 0 && level[w] == level[v] + 1 {
                    path.push(e);
                    v = w;
                    advanced = true;
                    break;
                }
                next[v] += 1;
            }
            if !advanced {
                // Dead end: retreat and never try this vertex again in this phase.
                let Some(e) = path.pop() else { return 0 };
                v = self.to[e ^ 1];
                next[v] += 1;
            }
        }
    }

    /// Runs a maximum flow and returns the vertices reachable from `source` in the residual
    /// network: the source side of a minimum cut.
    fn min_cut_source_side(&mut self, source: usize, sink: usize) -> Vec<bool> {
        loop {
            let level = self.levels(source);
            if level[sink] == u32::MAX {
                return level.iter().map(|&l| l != u32::MAX).collect();
            }
            let mut next = vec![0usize; self.adjacency.len()];
            while self.augment(source, sink, &level, &mut next) > 0 {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_cut_of_a_small_network() {
        // source → a (3), source → b (2), a → b (1), a → sink (2), b → sink (3): max flow 5, and
        // the source side of the minimum cut is {source} (both source edges saturated).
        let mut net = FlowNetwork::new(4);
        let (source, a, b, sink) = (0, 1, 2, 3);
        net.edge(source, a, 3);
        net.edge(source, b, 2);
        net.edge(a, b, 1);
        net.edge(a, sink, 2);
        net.edge(b, sink, 3);
        let side = net.min_cut_source_side(source, sink);
        assert_eq!(side, vec![true, false, false, false]);
        let mut net = FlowNetwork::new(4);
        net.edge(source, a, 10);
        net.edge(a, b, 1);
        net.edge(b, sink, 10);
        let side = net.min_cut_source_side(source, sink);
        assert_eq!(side, vec![true, true, false, false]);
    }
}
