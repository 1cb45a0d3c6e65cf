//! `fuse`: schedules a prim graph into kernels and extern matmuls (Inductor's scheduler).
//!
//! Each graph node is either *realized* (written to a buffer by a kernel or a GEMM) or *inlined*
//! into every kernel that reads it, recomputed there from an index. Views are never copied:
//! permute, expand, slice and reshape become index arithmetic in the kernels that read them.
//!
//! - Pointwise chains inline into their consumer: one kernel per realized pointwise value.
//! - A reduction inlines into its consumer as a *stage* of the consumer's kernel when the consumer
//!   iterates over the reduction's kept dims (`x.sum(-1) / n`) or over its whole input, reading the
//!   result broadcast along the reduced dims (softmax, layer_norm): one kernel per row loop.
//! - Matmul is an extern GEMM reading strided views of realized buffers; cat writes each operand
//!   into its slice of the output.
//!
//! Symbolic dims may sit anywhere: they are loop extents that reach kernels at run time, and the
//! strides and offsets they imply are size expressions (`64*s0`, `s0*s0`) that kernels compute
//! from their size arguments. A dim may be a derived symbol (`s0 + 1`): its extent is the
//! definition evaluated at run time, and strides and offsets read its definition, so they are
//! polynomials over input symbols only. A reshape may insert or drop size-1 dims and regroup the
//! static dims between symbolic ones as index arithmetic; one that regroups symbolic dims
//! (`[2, s0, 8]` to `[2*s0, 8]`) realizes its operand and reads it at the same linear index. A
//! cat along a symbolic dim offsets each operand by the sum of the earlier ones' sizes (`s0`).
//! An embedding table or `take_along` source with a symbolic size is reported unsupported.
//! Assumes a verified prim graph. Guarantees a `Program` that computes every
//! graph output into its own buffer and in which every load and store index stays within its
//! buffer. Starting from a minimal set of realized nodes (inputs, outputs, matmuls, cats), it
//! builds the program and, whenever a node cannot be inlined where it is read (a non-affine
//! reshape, a reduction read in an incompatible loop, a value needed by two kernels), realizes
//! that node and starts again. For reductions over incompatible loops it realizes the outermost
//! values computed wholly by one of the loops (`softmax(dim=0)` read by a row softmax: the
//! softmax, with its max and sum as stages of its kernel) rather than the reductions one by one.
//!
//! A node no kernel can compute (one making or reading f64 values, an integer reduction or scan, a
//! scatter-add of a non-f32 value,
//! a gather from a table of symbolic size, an im2col read other than
//! by a GEMM) becomes a `Step::Fallback`, which the runtime runs with the reference interpreter:
//! the node and its operands are realized, the step reads the operands' buffers and writes the
//! node's, and the kernels around it stay compiled (Inductor's fallback to ATen kernels). The
//! reason is kept in the step for `explain` and the dumps.
//!
//! The prim expansion of `scaled_dot_product_attention` (found by `attention::find_attention`:
//! scores GEMM, scale, optional causal mask, row softmax, `p·v` GEMM, nothing else reading the
//! scores) becomes one `Step::Attention` reading q, k and v through strided views: none of its
//! interior values is realized, so no `[.., T, S]` buffer exists. An attention whose output only
//! a plain copy reads (the permute back to `[b, t, h, d]`) writes the copy's layout itself
//! instead (`attention::fold_output_copies`, run on the assembled program).

use crate::attention::{find_attention, fold_output_copies, AttentionPattern};
use minductor_ir::{DType, Dim, Graph, NodeId, Op, SizeExpr, SliceFrom};
use minductor_kernel_ir::*;
use smallvec::SmallVec;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Why `fuse` cannot schedule a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FuseError {
    #[error("{0}")]
    Unsupported(String),
}

/// How much work one `fuse` did: `builds` counts the builds of realized nodes' steps that were
/// started (each node's once, again whenever a retry changed what its build asked about, and
/// those a retry interrupted), `retries` the retries (nodes realized, or made fallback steps,
/// after the first schedule). Both grow linearly with the graph, which `tests/large_graphs.rs`
/// checks on deep training steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FuseStats {
    pub builds: usize,
    pub retries: usize,
}

pub fn fuse(graph: &Graph) -> Result<Program, FuseError> {
    fuse_counting(graph).map(|(program, _)| program)
}

/// [`fuse`], with the work it did.
pub fn fuse_counting(graph: &Graph) -> Result<(Program, FuseStats), FuseError> {
    // Nodes no kernel computes run as fallback steps; more are found while scheduling.
    let fallbacks: HashMap<NodeId, String> = graph
        .ids()
        .filter_map(|id| fallback_reason(graph, id).map(|why| (id, why)))
        .collect();
    let mut realized: HashSet<NodeId> = HashSet::new();
    for id in graph.ids() {
        if matches!(
            graph.node(id).op,
            Op::Input { .. }
                | Op::Matmul
                | Op::Cat { .. }
                | Op::ScatterAdd { .. }
                | Op::CumSum { .. }
        ) {
            realized.insert(id);
        }
    }
    realized.extend(graph.outputs().iter().copied());
    // A fused attention computes its interior values (the scores GEMM among them) itself.
    let attention = find_attention(graph);
    for pattern in attention.values() {
        for node in &pattern.nodes[..pattern.nodes.len() - 1] {
            realized.remove(node);
        }
    }
    // A fallback step reads its operands from buffers and writes its own.
    for &id in fallbacks.keys() {
        realized.insert(id);
        realized.extend(graph.node(id).inputs.iter().copied());
    }
    // A retry realizes nodes; the steps of a node depend only on the nodes its build asked
    // about (whether they are realized, whether an earlier step inlines them), so a retry
    // builds again only the steps of the new nodes and of the builds that asked about what
    // changed, rather than everything after the first new node: a training step's optimizer
    // updates, which each realize a gradient deep in the backward, cost their own kernels, not
    // the rest of the backward each (the program is the one a restart from scratch builds).
    let mut scheduler = Scheduler::new(graph, realized, fallbacks, &attention);
    let mut retries = 0;
    loop {
        match scheduler.run() {
            Ok(program) => {
                // An attention writes in the layout of the copy that is its one reader.
                let program = fold_output_copies(program);
                let stats = FuseStats {
                    builds: scheduler.builds,
                    retries,
                };
                return Ok((program, stats));
            }
            Err(Reject::Unsupported(what)) => return Err(FuseError::Unsupported(what)),
            Err(Reject::Fallback(node, why)) => scheduler.fall_back(node, why),
            Err(Reject::Realize(nodes)) => scheduler.realize(nodes),
        }
        retries += 1;
    }
}

/// Why no kernel computes `node`, when none can: it then runs as a fallback step (the reference
/// interpreter on its operands' buffers). Kernels compute floats in f32 (so every node making or
/// reading an f64 value falls back, constants included), reduce and scan in f32, and the extern
/// scatter-add handles f32 only.
fn fallback_reason(graph: &Graph, id: NodeId) -> Option<String> {
    let node = graph.node(id);
    let dtype = node.ty.dtype;
    if matches!(node.op, Op::Input { .. }) {
        return None;
    }
    let reads_f64 = node.inputs.iter().any(|&i| graph.ty(i).dtype == DType::F64);
    if dtype == DType::F64 || reads_f64 {
        return Some("f64 values are not compiled (kernels compute in f32)".to_string());
    }
    match &node.op {
        Op::Reduce { .. } if !dtype.is_float() => Some(format!(
            "reductions over {dtype} values are not compiled (kernels reduce in f32)"
        )),
        Op::CumSum { .. } if !dtype.is_float() && dtype != DType::I64 => Some(format!(
            "scans of {dtype} values are not compiled (kernels scan in f32 or i64)"
        )),
        Op::ScatterAdd { .. } if dtype != DType::F32 => Some(format!(
            "the extern scatter-add adds f32 values, not {dtype}"
        )),
        _ => None,
    }
}

enum Reject {
    /// "These nodes must be realized; schedule again."
    Realize(Vec<NodeId>),
    /// "No kernel can compute this node (the reason says why): run it as a fallback step and
    /// schedule again."
    Fallback(NodeId, String),
    /// No schedule exists for this graph (e.g. a reshape that regroups symbolic dims).
    Unsupported(String),
}

type Retry<T> = Result<T, Reject>;

fn retry<T>(node: NodeId) -> Retry<T> {
    Err(Reject::Realize(vec![node]))
}

fn unsupported<T>(what: impl Into<String>) -> Retry<T> {
    Err(Reject::Unsupported(what.into()))
}

fn fallback<T>(node: NodeId, why: impl Into<String>) -> Retry<T> {
    Err(Reject::Fallback(node, why.into()))
}

fn dims(graph: &Graph, id: NodeId) -> Vec<Dim> {
    graph.ty(id).shape.to_vec()
}

fn static_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1) as i64;
    }
    strides
}

/// `Σ idx[d] · strides[d]`.
fn linear(idx: &[Affine], strides: &[SizeExpr]) -> Retry<Affine> {
    let mut acc = Affine::constant(0);
    for (a, s) in idx.iter().zip(strides) {
        if *a == Affine::constant(0) {
            continue;
        }
        acc = acc.plus(&a.scale_by(s));
    }
    Ok(acc)
}

/// Elements per row when a 1-D pointwise domain of `n` elements is tiled for threads: a divisor
/// of `n` that leaves whole vectors per row, for domains big enough to be worth splitting.
fn row_block(n: usize) -> Option<usize> {
    const MIN_SPLIT: usize = 1 << 15;
    if n < MIN_SPLIT {
        return None;
    }
    [4096, 2048, 8192, 1024, 16384, 512, 256]
        .into_iter()
        .find(|&b| n.is_multiple_of(b))
}

/// The loop structure of a kernel with reductions: reductions over `axes` of an input of `shape`.
#[derive(Clone, PartialEq)]
struct RowLoop {
    shape: Vec<Dim>,
    axes: Vec<usize>,
}

impl RowLoop {
    fn kept(&self) -> Vec<usize> {
        (0..self.shape.len())
            .filter(|d| !self.axes.contains(d))
            .collect()
    }
    /// Index of the full input domain: kept dims are outer loops, reduced dims inner loops.
    fn full_index(&self) -> Vec<Affine> {
        let kept = self.kept();
        (0..self.shape.len())
            .map(|d| match self.axes.iter().position(|&a| a == d) {
                Some(p) => Affine::var(Var::Inner(p as u32)),
                None => Affine::var(Var::Outer(kept.iter().position(|&k| k == d).unwrap() as u32)),
            })
            .collect()
    }
}

struct Scheduler<'g> {
    graph: &'g Graph,
    /// Nodes written to buffers: inputs, outputs, GEMMs, cats, scatter-adds, scans, fallbacks
    /// and their operands, and whatever retries asked for. It only grows.
    realized: HashSet<NodeId>,
    /// Nodes run as fallback steps (all realized, as are their operands), with the reason.
    fallbacks: HashMap<NodeId, String>,
    /// Fused attentions, keyed by their final GEMM (realized, the others not).
    attention: &'g HashMap<NodeId, AttentionPattern>,
    outputs: HashSet<NodeId>,
    /// The graph's inputs (realized from the start, with buffers of their own and no steps).
    inputs: HashSet<NodeId>,
    /// Per node: the steps built for it, if it is realized and not an input, as a run from
    /// scratch builds them but numbered by node (see [`Built`]); out of date while it is in
    /// `pending`.
    built: Vec<Option<Built>>,
    /// Realized nodes (not inputs) whose steps are missing or may be out of date, built again in
    /// node order by `run`.
    pending: BTreeSet<NodeId>,
    /// Per node: the builds that asked about it (whether it is realized, whether a step before
    /// theirs inlines it, whether a reduction is reached through it), as the node whose steps
    /// were built and that build's `generation`; an entry of an older generation no longer
    /// counts.
    dependents: Vec<Vec<(NodeId, u32)>>,
    /// Per node: how many times its steps were built.
    generation: Vec<u32>,
    /// Per node: the nodes whose steps' kernels inline it (build its definition), in node order.
    inliners: Vec<SmallVec<[NodeId; 1]>>,
    /// Per node: whether no reduction is reached from it through nodes that are not realized
    /// ([`Scheduler::reduce_free`]), and the `realized_version` it was found at. A `true` stays
    /// true as more nodes are realized; a `false` is found again once they change.
    reduce_free: Vec<Option<(bool, u64)>>,
    /// Per node found not reduce-free at the current version: the operand through which a
    /// reduction is reached (none for a reduction), so that the path can be followed.
    reduce_path: Vec<Option<NodeId>>,
    /// Counts the changes of `realized`.
    realized_version: u64,
    /// The build in progress.
    current: Current,
    /// How many builds were started (see [`FuseStats`]).
    builds: usize,
}

/// The steps of one realized node, numbered independently of the rest of the program: a buffer
/// is `BufferId(node)` of the node it holds, a step's number counts from the node's first step
/// (in index checks and `Inlined`), and a kernel's name lacks its `k{step}_` prefix. `assemble`
/// numbers them as a run from scratch does.
#[derive(Default)]
struct Built {
    steps: Vec<Step>,
    inlined: Vec<Inlined>,
    index_checks: Vec<IndexCheck>,
}

/// What the build of one node's steps has asked and made so far.
struct Current {
    owner: NodeId,
    /// Every node whose state the build read (see `Scheduler::dependents`).
    asked: HashSet<NodeId>,
    /// Nodes whose reduction paths are already in `asked`.
    paths: HashSet<NodeId>,
    /// Computing nodes inlined (not skipped) by the node's finished kernels.
    inlined_here: HashSet<NodeId>,
    built: Built,
}

impl Current {
    fn new(owner: NodeId) -> Self {
        Current {
            owner,
            asked: HashSet::new(),
            paths: HashSet::new(),
            inlined_here: HashSet::new(),
            built: Built::default(),
        }
    }
}

/// `node` is computed inside the kernel of step `step` (of the node whose steps hold it).
/// `skipped`: its definition was not built there (see `KernelBuilder::emit`), so every node it
/// reaches through nodes that are not realized is recomputed by that step too.
#[derive(Clone, Copy)]
struct Inlined {
    node: NodeId,
    step: usize,
    skipped: bool,
}

impl<'g> Scheduler<'g> {
    fn new(
        graph: &'g Graph,
        realized: HashSet<NodeId>,
        fallbacks: HashMap<NodeId, String>,
        attention: &'g HashMap<NodeId, AttentionPattern>,
    ) -> Self {
        let inputs: HashSet<NodeId> = graph.inputs().iter().copied().collect();
        let pending = realized
            .iter()
            .copied()
            .filter(|n| !inputs.contains(n))
            .collect();
        let n = graph.len();
        Scheduler {
            graph,
            realized,
            fallbacks,
            attention,
            outputs: graph.outputs().iter().copied().collect(),
            inputs,
            built: (0..n).map(|_| None).collect(),
            pending,
            dependents: vec![Vec::new(); n],
            generation: vec![0; n],
            inliners: vec![SmallVec::new(); n],
            reduce_free: vec![None; n],
            reduce_path: vec![None; n],
            realized_version: 0,
            current: Current::new(NodeId(0)),
            builds: 0,
        }
    }

    /// Realizes `nodes` (some at least not realized yet): each needs steps of its own, and
    /// the builds that asked about one are out of date.
    fn realize(&mut self, nodes: Vec<NodeId>) {
        self.realized_version += 1;
        let mut fresh = false;
        for n in nodes {
            if self.realized.insert(n) {
                fresh = true;
                self.now_realized(n);
            }
        }
        assert!(fresh, "fuse: a retry must realize a new node");
    }

    /// Makes `node` a fallback step (its operands realized): its steps and those of the builds
    /// that asked about a node realized now are out of date.
    fn fall_back(&mut self, node: NodeId, why: String) {
        let fresh = self.fallbacks.insert(node, why).is_none();
        assert!(fresh, "fuse: a node falls back once");
        self.realized_version += 1;
        if self.realized.insert(node) {
            self.now_realized(node);
        } else {
            self.pending.insert(node);
        }
        for &i in &self.graph.node(node).inputs {
            if self.realized.insert(i) {
                self.now_realized(i);
            }
        }
    }

    fn now_realized(&mut self, node: NodeId) {
        if !self.inputs.contains(&node) {
            self.pending.insert(node);
        }
        self.out_of_date(node, |_| true);
    }

    /// Marks out of date the current builds that asked about `node` and that `which` selects.
    fn out_of_date(&mut self, node: NodeId, which: impl Fn(NodeId) -> bool) {
        let generation = &self.generation;
        let asked = &mut self.dependents[node.index()];
        asked.retain(|&(owner, g)| generation[owner.index()] == g);
        for &(owner, _) in asked.iter() {
            if which(owner) {
                self.pending.insert(owner);
            }
        }
    }

    /// Builds the steps of the pending nodes in node order (stopping at the first that asks for
    /// a retry), then checks that no inlined node is computed by two steps and numbers the
    /// program. A node's steps depend only on what its build asked about (recorded in
    /// `dependents`), so the steps of nodes no retry touched are kept, and the program is the one
    /// a run from scratch with the same realized nodes builds.
    fn run(&mut self) -> Retry<Program> {
        while let Some(owner) = self.pending.first().copied() {
            self.current = Current::new(owner);
            self.builds += 1;
            self.schedule(owner)?;
            self.pending.remove(&owner);
            let current = std::mem::replace(&mut self.current, Current::new(owner));
            self.generation[owner.index()] += 1;
            let generation = self.generation[owner.index()];
            for &n in &current.asked {
                self.dependents[n.index()].push((owner, generation));
            }
            let old = self.built[owner.index()].take();
            let inlined_set = |b: &Built| -> Vec<NodeId> {
                let mut v: Vec<NodeId> = b
                    .inlined
                    .iter()
                    .filter(|i| !i.skipped)
                    .map(|i| i.node)
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            let before = old.as_ref().map(inlined_set).unwrap_or_default();
            let after = inlined_set(&current.built);
            self.built[owner.index()] = Some(current.built);
            // The nodes this build inlines that the last one did not, or the other way: the
            // later builds that asked whether a step before theirs inlines them may have an
            // other answer now.
            let (mut a, mut b) = (0, 0);
            loop {
                match (before.get(a).copied(), after.get(b).copied()) {
                    (None, None) => break,
                    (Some(x), Some(y)) if x == y => {
                        a += 1;
                        b += 1;
                    }
                    (Some(x), y) if y.is_none_or(|y| x < y) => {
                        self.inliner_changed(owner, x, false);
                        a += 1;
                    }
                    (_, Some(y)) => {
                        self.inliner_changed(owner, y, true);
                        b += 1;
                    }
                    (Some(_), None) => unreachable!("handled above"),
                }
            }
        }
        // Nodes computed by two steps are realized.
        let mut steps_of: HashMap<NodeId, HashSet<(NodeId, usize)>> = HashMap::new();
        let mut skipped: Vec<NodeId> = Vec::new();
        for (owner, built) in self.built.iter().enumerate() {
            let Some(built) = built else { continue };
            for i in &built.inlined {
                steps_of
                    .entry(i.node)
                    .or_default()
                    .insert((NodeId(owner as u32), i.step));
                if i.skipped {
                    skipped.push(i.node);
                }
            }
        }
        let mut shared: HashSet<NodeId> = steps_of
            .into_iter()
            .filter(|(_, steps)| steps.len() > 1)
            .map(|(n, _)| n)
            .collect();
        // A skipped definition was built by an earlier step: everything it reaches is recomputed
        // by two steps.
        shared.extend(self.reached(&skipped));
        let shared: Vec<NodeId> = shared.into_iter().collect();
        if !shared.is_empty() {
            return Err(Reject::Realize(shared));
        }
        Ok(self.assemble())
    }

    /// Whether the kernels of `owner` inline `node` changed (`now`: they do now): the builds of
    /// later nodes that asked whether a step before theirs inlines it, and whose answer changes,
    /// are out of date (those after the next other node inlining it had it before them anyway).
    fn inliner_changed(&mut self, owner: NodeId, node: NodeId, now: bool) {
        let list = &mut self.inliners[node.index()];
        match list.binary_search(&owner) {
            Ok(at) if !now => {
                list.remove(at);
            }
            Err(at) if now => list.insert(at, owner),
            _ => unreachable!("fuse: inliners out of step"),
        }
        if list.first().is_some_and(|&o| o < owner) {
            return;
        }
        let next = list.iter().copied().find(|&o| o > owner);
        self.out_of_date(node, |asking| {
            asking > owner && next.is_none_or(|next| asking <= next)
        });
    }

    /// The program: buffers for the inputs in order, then for the realized nodes in node order;
    /// the steps of each node in node order, numbered so.
    fn assemble(&mut self) -> Program {
        let g = self.graph;
        let mut number = vec![u32::MAX; g.len()];
        let mut buffers = Vec::new();
        let mut buffer = |node: NodeId, kind: BufferKind| {
            number[node.index()] = buffers.len() as u32;
            let ty = g.ty(node);
            buffers.push(Buffer {
                dtype: ty.dtype,
                shape: ty.shape.to_vec(),
                kind,
                node,
            });
        };
        for (n, &id) in g.inputs().iter().enumerate() {
            buffer(id, BufferKind::Input(n));
        }
        for id in g.ids() {
            if self.built[id.index()].is_some() {
                let kind = if self.outputs.contains(&id) {
                    BufferKind::Output
                } else {
                    BufferKind::Intermediate
                };
                buffer(id, kind);
            }
        }
        let renumber = |b: &mut BufferId| *b = BufferId(number[b.0 as usize]);
        let mut steps = Vec::new();
        let mut index_checks = Vec::new();
        for built in self.built.iter_mut() {
            let Some(built) = built.take() else { continue };
            let first = steps.len();
            for mut check in built.index_checks {
                check.step += first;
                renumber(&mut check.buffer);
                index_checks.push(check);
            }
            for mut step in built.steps {
                renumber_buffers(&mut step, &renumber);
                if let Step::Kernel(k) = &mut step {
                    k.name = format!("k{}_{}", steps.len(), k.name);
                }
                steps.push(step);
            }
        }
        let outputs = g
            .outputs()
            .iter()
            .map(|o| BufferId(number[o.index()]))
            .collect();
        Program {
            buffers,
            steps,
            index_checks,
            outputs,
            plan: None,
        }
    }

    /// Whether `node` is realized, recorded as asked by the current build.
    fn is_realized(&mut self, node: NodeId) -> bool {
        self.current.asked.insert(node);
        self.realized.contains(&node)
    }

    /// Whether a step before the current one inlines `node` (builds its definition), recorded as
    /// asked by the current build.
    fn inlined_before(&mut self, node: NodeId) -> bool {
        self.current.asked.insert(node);
        self.current.inlined_here.contains(&node)
            || self.inliners[node.index()]
                .first()
                .is_some_and(|&o| o < self.current.owner)
    }

    /// Builds the steps computing the realized node `id` into its buffer.
    fn schedule(&mut self, id: NodeId) -> Retry<()> {
        let g = self.graph;
        let buffer = BufferId(id.0);
        if let Some(reason) = self.fallbacks.get(&id) {
            let node = g.node(id);
            let step = Step::Fallback(FallbackStep {
                op: node.op.clone(),
                inputs: node.inputs.iter().map(|i| BufferId(i.0)).collect(),
                out: buffer,
                node: id,
                reason: reason.clone(),
            });
            self.current.built.steps.push(step);
            return Ok(());
        }
        let step = self.current.built.steps.len();
        let steps: Vec<Step> = match &g.node(id).op {
            Op::Matmul => match self.attention.get(&id) {
                Some(pattern) => vec![Step::Attention(self.attention_step(id, buffer, pattern)?)],
                None => vec![Step::Matmul(self.matmul(id, buffer)?)],
            },
            Op::ScatterAdd { dim, .. } => {
                vec![Step::ScatterAdd(self.scatter_add(id, *dim, buffer)?)]
            }
            Op::CumSum { dim } => vec![Step::Kernel(self.scan_kernel(id, *dim, buffer, step)?)],
            Op::Cat { dim } => {
                // Each operand starts where the previous ones end: a size expression when
                // one of them is symbolic (`s0` for the new row after a `[.., s0, ..]` cache).
                let mut offset = SizeExpr::Const(0);
                for &operand in &g.node(id).inputs {
                    let step = self.current.built.steps.len();
                    let kernel =
                        self.kernel(id, operand, buffer, Some((*dim, offset.clone())), step)?;
                    offset = offset.plus(&SizeExpr::of_dim(dims(g, operand)[*dim]));
                    self.current.built.steps.push(Step::Kernel(kernel));
                }
                Vec::new()
            }
            _ => vec![Step::Kernel(self.kernel(id, id, buffer, None, step)?)],
        };
        self.current.built.steps.extend(steps);
        Ok(())
    }

    /// Records the nodes the kernel of step `step` recomputes.
    fn record_inlined(&mut self, builder: &KernelBuilder, step: usize) {
        for &node in &builder.inlined {
            self.current.inlined_here.insert(node);
            self.current.built.inlined.push(Inlined {
                node,
                step,
                skipped: false,
            });
        }
        for &node in &builder.skipped {
            self.current.built.inlined.push(Inlined {
                node,
                step,
                skipped: true,
            });
        }
    }

    /// Whether no reduction is reached from `node` (not realized) through nodes that are not
    /// realized: then building its definition in a kernel fails (asks for a retry) for reasons
    /// that do not depend on the kernel's loops or the index it is read at, only on the graph
    /// and the realized nodes (a gather's table, a reshape's shapes): a kernel that built it
    /// once shows it builds. A `false` is recorded as asked about every node of the path to the
    /// reduction it found (realizing one of them may make it `true`); a `true` stays true.
    fn reduce_free(&mut self, node: NodeId) -> bool {
        let free = self.find_reduce_free(node);
        if !free {
            let mut on = Some(node);
            while let Some(n) = on {
                if !self.current.paths.insert(n) {
                    break;
                }
                self.current.asked.insert(n);
                on = self.reduce_path[n.index()];
            }
        }
        free
    }

    fn find_reduce_free(&mut self, node: NodeId) -> bool {
        match self.reduce_free[node.index()] {
            Some((true, _)) => return true,
            Some((false, version)) if version == self.realized_version => return false,
            _ => {}
        }
        let n = self.graph.node(node);
        let mut path = None;
        let free = !matches!(n.op, Op::Reduce { .. })
            && n.inputs.iter().all(|&i| {
                let free = self.realized.contains(&i) || self.find_reduce_free(i);
                if !free {
                    path = Some(i);
                }
                free
            });
        self.reduce_free[node.index()] = Some((free, self.realized_version));
        self.reduce_path[node.index()] = path;
        free
    }

    /// The computing nodes (not views, constants or `iota`s) reached from `roots` through nodes
    /// that are not realized, the roots included: what building their definitions inlines.
    fn reached(&self, roots: &[NodeId]) -> Vec<NodeId> {
        let mut seen: HashSet<NodeId> = HashSet::new();
        let mut stack = roots.to_vec();
        let mut found = Vec::new();
        while let Some(id) = stack.pop() {
            if self.realized.contains(&id) || !seen.insert(id) {
                continue;
            }
            let n = self.graph.node(id);
            if !matches!(n.op, Op::Constant { .. } | Op::Iota { .. }) && !n.op.is_view() {
                found.push(id);
            }
            stack.extend(n.inputs.iter().copied());
        }
        found
    }

    fn matmul(&mut self, id: NodeId, out: BufferId) -> Retry<MatmulStep> {
        let g = self.graph;
        let out_shape = dims(g, id);
        let batch = out_shape.len() - 2;
        let (a, b) = (g.node(id).inputs[0], g.node(id).inputs[1]);
        let view = |s: &mut Self, operand: NodeId, rows: Dim, cols: Dim| -> Retry<StridedView> {
            let shape = dims(g, operand);
            let lead = batch + 2 - shape.len();
            let idx: Vec<Affine> = (0..shape.len())
                .map(|d| {
                    if d + 2 < shape.len() && shape[d] == Dim::Static(1) {
                        Affine::constant(0)
                    } else {
                        Affine::var(Var::Outer((d + lead) as u32))
                    }
                })
                .collect();
            let (buffer, index) = s.address(operand, idx)?;
            let mut view_shape = out_shape[..batch].to_vec();
            view_shape.extend([rows, cols]);
            let strides = (0..batch + 2)
                .map(|d| index.coefficient(Var::Outer(d as u32)))
                .collect();
            Ok(StridedView {
                buffer,
                offset: index.offset.clone(),
                shape: view_shape,
                strides,
            })
        };
        let k = *dims(g, a).last().unwrap();
        let a_view = view(self, a, out_shape[batch], k)?;
        let b_operand = match self.im2col_operand(b)? {
            Some(im2col) => MatmulOperand::Im2col(im2col),
            None => MatmulOperand::View(view(self, b, k, out_shape[batch + 1])?),
        };
        Ok(MatmulStep {
            a: a_view,
            b: b_operand,
            out,
            node: id,
            epilogue: None,
        })
    }

    /// The fused attention computing `id` (the final GEMM of `pattern`) into `out`.
    fn attention_step(
        &mut self,
        id: NodeId,
        out: BufferId,
        pattern: &AttentionPattern,
    ) -> Retry<AttentionStep> {
        let g = self.graph;
        let view = |s: &mut Self, operand: NodeId| -> Retry<StridedView> {
            let shape = dims(g, operand);
            let idx: Vec<Affine> = (0..shape.len())
                .map(|d| Affine::var(Var::Outer(d as u32)))
                .collect();
            let (buffer, index) = s.address(operand, idx)?;
            let strides = (0..shape.len())
                .map(|d| index.coefficient(Var::Outer(d as u32)))
                .collect();
            Ok(StridedView {
                buffer,
                offset: index.offset.clone(),
                shape,
                strides,
            })
        };
        let mut k = view(self, pattern.k)?;
        if pattern.k_transposed {
            // `kt` is `[batch.., E, S]`: the same elements seen as `[batch.., S, E]`.
            let rank = k.shape.len();
            k.shape.swap(rank - 2, rank - 1);
            k.strides.swap(rank - 2, rank - 1);
        }
        let mask = match pattern.mask {
            None => None,
            Some((mask, _)) => {
                // Seen with the scores' shape: stride 0 along the dims it broadcasts over.
                let scores = dims(g, pattern.nodes[0]);
                let idx: Vec<Affine> = (0..scores.len())
                    .map(|d| Affine::var(Var::Outer(d as u32)))
                    .collect();
                let idx = broadcast_index(&idx, &dims(g, mask), &scores);
                let (buffer, index) = self.address(mask, idx)?;
                let strides = (0..scores.len())
                    .map(|d| index.coefficient(Var::Outer(d as u32)))
                    .collect();
                Some(StridedView {
                    buffer,
                    offset: index.offset.clone(),
                    shape: scores,
                    strides,
                })
            }
        };
        Ok(AttentionStep {
            q: view(self, pattern.q)?,
            k,
            v: view(self, pattern.v)?,
            out: StridedView::contiguous(out, &dims(g, id)),
            scale: pattern.scale,
            causal: pattern.causal,
            mask,
            mask_kind: pattern.mask.map_or(MaskKind::Add, |(_, kind)| kind),
            group: pattern.group,
            node: id,
            nodes: pattern.nodes.clone(),
        })
    }

    /// The implicit im2col a GEMM reads as its right operand `b`, when `b` is the reshape `[N,
    /// groups, C/groups·KH·KW, L]` of an `im2col` (what `decompose` keeps): its source must be a
    /// buffer (realized, so contiguous).
    fn im2col_operand(&mut self, b: NodeId) -> Retry<Option<Im2colView>> {
        let g = self.graph;
        let reshape = g.node(b);
        if !matches!(reshape.op, Op::Reshape { .. }) {
            return Ok(None);
        }
        let im2col = g.node(reshape.inputs[0]);
        let Op::Im2col { window } = im2col.op else {
            return Ok(None);
        };
        if self.is_realized(reshape.inputs[0]) {
            // Written out (a fallback step computes it): an ordinary strided operand.
            return Ok(None);
        }
        let source = im2col.inputs[0];
        if !self.is_realized(source) {
            return retry(source);
        }
        let shape = dims(g, b);
        let Some(groups) = shape.get(1).and_then(|d| d.as_static()) else {
            return unsupported(format!("an im2col operand of shape {shape:?}"));
        };
        Ok(Some(Im2colView {
            source: BufferId(source.0),
            window,
            groups,
            shape,
        }))
    }

    fn scatter_add(&mut self, id: NodeId, dim: usize, out: BufferId) -> Retry<ScatterAddStep> {
        let g = self.graph;
        if g.ty(id).dtype != DType::F32 {
            return unsupported(format!("scatter_add on {}", g.ty(id)));
        }
        let (index, src) = (g.node(id).inputs[0], g.node(id).inputs[1]);
        let src_shape = dims(g, src);
        // Both operands are seen with `src`'s shape; the index broadcasts along its size-1 dims.
        let view = |s: &mut Self, operand: NodeId| -> Retry<StridedView> {
            let shape = dims(g, operand);
            let idx: Vec<Affine> = (0..shape.len())
                .map(|d| {
                    if shape[d] == Dim::Static(1) {
                        Affine::constant(0)
                    } else {
                        Affine::var(Var::Outer(d as u32))
                    }
                })
                .collect();
            let (buffer, index) = s.address(operand, idx)?;
            Ok(StridedView {
                buffer,
                offset: index.offset.clone(),
                shape: src_shape.clone(),
                strides: (0..shape.len())
                    .map(|d| index.coefficient(Var::Outer(d as u32)))
                    .collect(),
            })
        };
        let index_view = view(self, index)?;
        let src_view = view(self, src)?;
        Ok(ScatterAddStep {
            index: index_view,
            src: src_view,
            out,
            dim,
            node: id,
        })
    }

    /// The kernel of a running sum along `dim`: the other dims are its outer loops, `dim` the
    /// one loop of a scan stage, which reads the (inlined) operand one element at a time.
    fn scan_kernel(
        &mut self,
        id: NodeId,
        dim: usize,
        buffer: BufferId,
        step: usize,
    ) -> Retry<Kernel> {
        let g = self.graph;
        let shape = dims(g, id);
        let operand = g.node(id).inputs[0];
        let kept: Vec<usize> = (0..shape.len()).filter(|&d| d != dim).collect();
        let idx: Vec<Affine> = (0..shape.len())
            .map(|d| match kept.iter().position(|&k| k == d) {
                Some(p) => Affine::var(Var::Outer(p as u32)),
                None => Affine::var(Var::Inner(0)),
            })
            .collect();
        let mut builder = KernelBuilder::new(g, step);
        builder.inlined.push(id);
        builder.names.push(g.node(id).op.name());
        let value = builder.emit(self, operand, &idx)?;
        // Floats scan in f32 values (summed in f64), integers (an i64 output) in i64.
        let ty = match g.ty(id).dtype {
            DType::I64 => ScalarType::I64,
            _ => ScalarType::F32,
        };
        let value = builder.convert(value, ty);
        let index = linear(&idx, &contiguous_strides(&shape))?;
        builder.stages.push(Stage {
            extent: vec![shape[dim]],
            action: StageAction::Scan(Store {
                buffer,
                index,
                value,
            }),
        });
        self.record_inlined(&builder, step);
        Ok(builder.finish(kept.iter().map(|&d| shape[d]).collect()))
    }

    /// Where element `idx` of `node` lives, following views down to a realized buffer.
    fn address(&mut self, node: NodeId, idx: Vec<Affine>) -> Retry<(BufferId, Affine)> {
        let g = self.graph;
        if self.is_realized(node) {
            return Ok((
                BufferId(node.0),
                linear(&idx, &contiguous_strides(&dims(g, node)))?,
            ));
        }
        let n = g.node(node);
        if !n.op.is_view() {
            return retry(node);
        }
        let operand = n.inputs[0];
        if let Op::Reshape { .. } = n.op {
            if self.is_realized(operand) {
                // A reshape of a contiguous buffer is the same linear index.
                return Ok((
                    BufferId(operand.0),
                    linear(&idx, &contiguous_strides(&dims(g, node)))?,
                ));
            }
        }
        let inner = view_index(g, node, &idx)?;
        self.address(operand, inner)
    }

    /// Builds the kernel that writes `value` (the root's value, or one operand of a cat) into `buffer`.
    fn kernel(
        &mut self,
        root: NodeId,
        value: NodeId,
        buffer: BufferId,
        cat: Option<(usize, SizeExpr)>,
        step: usize,
    ) -> Retry<Kernel> {
        let g = self.graph;
        let shape = dims(g, value);
        let reductions = self.inlined_reductions(value);
        let mut builder = KernelBuilder::new(g, step);
        // Choose the loop structure.
        let long_1d = match shape.as_slice() {
            [Dim::Static(n)] => row_block(*n).map(|block| (*n, block)),
            _ => None,
        };
        let (outer, extent, store_idx): (Vec<Dim>, Vec<Dim>, Vec<Affine>) = match reductions.first()
        {
            None if long_1d.is_some() => {
                // A long 1-D domain is tiled as [n / block, block] so that the runtime has an
                // outer loop to split across threads.
                let (n, block) = long_1d.expect("checked");
                let idx = Affine::var(Var::Outer(0))
                    .scale(block as i64)
                    .plus(&Affine::var(Var::Inner(0)));
                (
                    vec![Dim::Static(n / block)],
                    vec![Dim::Static(block)],
                    vec![idx],
                )
            }
            None => {
                let r = shape.len();
                let idx = (0..r)
                    .map(|d| {
                        Affine::var(if d + 1 == r {
                            Var::Inner(0)
                        } else {
                            Var::Outer(d as u32)
                        })
                    })
                    .collect();
                let (outer, extent) = if r == 0 {
                    (vec![], vec![])
                } else {
                    (shape[..r - 1].to_vec(), vec![shape[r - 1]])
                };
                (outer, extent, idx)
            }
            Some(&first) => {
                let row = self.row_loop(first);
                let mismatched: Vec<NodeId> = reductions
                    .iter()
                    .copied()
                    .filter(|&r| self.row_loop(r) != row)
                    .collect();
                if !mismatched.is_empty() {
                    return Err(Reject::Realize(self.realize_boundary(
                        value,
                        &row,
                        &mismatched,
                    )));
                }
                let kept = row.kept();
                let kept_sizes: Vec<Dim> = kept.iter().map(|&d| row.shape[d]).collect();
                let reduced_sizes: Vec<Dim> = row.axes.iter().map(|&d| row.shape[d]).collect();
                let keepdim_shape: Vec<Dim> = (0..row.shape.len())
                    .map(|d| {
                        if row.axes.contains(&d) {
                            Dim::Static(1)
                        } else {
                            row.shape[d]
                        }
                    })
                    .collect();
                if shape == row.shape && cat.is_none() {
                    (kept_sizes, reduced_sizes, row.full_index())
                } else if shape == keepdim_shape {
                    let idx = (0..shape.len())
                        .map(|d| match kept.iter().position(|&k| k == d) {
                            Some(p) => Affine::var(Var::Outer(p as u32)),
                            None => Affine::constant(0),
                        })
                        .collect();
                    (kept_sizes, vec![], idx)
                } else if shape == kept_sizes {
                    let idx = (0..shape.len())
                        .map(|p| Affine::var(Var::Outer(p as u32)))
                        .collect();
                    (kept_sizes, vec![], idx)
                } else {
                    return Err(Reject::Realize(reductions));
                }
            }
        };
        builder.row = reductions.first().map(|&r| self.row_loop(r));
        let value_expr = if value == root {
            builder.emit_definition(self, value, &store_idx)?
        } else {
            builder.emit(self, value, &store_idx)?
        };
        // Store index into the destination buffer (offset along the cat dim, if any).
        let dest_shape = dims(g, root);
        let mut dest_idx = store_idx.clone();
        if let Some((dim, offset)) = cat {
            dest_idx[dim] = dest_idx[dim].plus(&Affine {
                offset,
                terms: Default::default(),
            });
        }
        let index = linear(&dest_idx, &contiguous_strides(&dest_shape))?;
        builder.stages.push(Stage {
            extent,
            action: StageAction::Store(vec![Store {
                buffer,
                index,
                value: value_expr,
            }]),
        });
        self.record_inlined(&builder, step);
        Ok(builder.finish(outer))
    }

    fn row_loop(&self, reduction: NodeId) -> RowLoop {
        let n = self.graph.node(reduction);
        match &n.op {
            Op::Reduce { axes, .. } => RowLoop {
                shape: dims(self.graph, n.inputs[0]),
                axes: axes.clone(),
            },
            _ => unreachable!("row_loop of a non-reduction"),
        }
    }

    /// What to realize when the kernel for `value`, whose loops are `row`'s, meets `mismatched`
    /// reductions over other loops: the outermost inlined values that depend on reductions of
    /// one loop structure only (the mismatched ones, or those over `row`) and have the shape of
    /// that structure's input — whole results of one loop, such as `softmax(dim=0)` read by a row
    /// softmax — so that one kernel computes each of them with all its reductions (Inductor
    /// realizes the softmax; realizing its max and sum one retry at a time would leave its
    /// pointwise values to be recomputed and then realized one by one). The mismatched
    /// reductions themselves when no such value exists.
    fn realize_boundary(&self, value: NodeId, row: &RowLoop, mismatched: &[NodeId]) -> Vec<NodeId> {
        let g = self.graph;
        let shapes: Vec<Vec<Dim>> = mismatched.iter().map(|&m| self.row_loop(m).shape).collect();
        // For each inlined node: (depends on a mismatched reduction, on a reduction over `row`).
        let mut deps: HashMap<NodeId, (bool, bool)> = HashMap::new();
        fn walk(
            s: &Scheduler,
            id: NodeId,
            value: NodeId,
            row: &RowLoop,
            mismatched: &[NodeId],
            deps: &mut HashMap<NodeId, (bool, bool)>,
        ) -> (bool, bool) {
            if let Some(&d) = deps.get(&id) {
                return d;
            }
            let n = s.graph.node(id);
            let mut d = (false, false);
            if (id == value || !s.realized.contains(&id))
                && !matches!(
                    n.op,
                    Op::Matmul
                        | Op::Cat { .. }
                        | Op::Input { .. }
                        | Op::ScatterAdd { .. }
                        | Op::CumSum { .. }
                )
            {
                if matches!(n.op, Op::Reduce { .. }) {
                    if mismatched.contains(&id) {
                        d.0 = true;
                    } else if s.row_loop(id) == *row {
                        d.1 = true;
                    }
                }
                for &i in &n.inputs {
                    let (a, b) = walk(s, i, value, row, mismatched, deps);
                    d = (d.0 || a, d.1 || b);
                }
            }
            deps.insert(id, d);
            d
        }
        walk(self, value, value, row, mismatched, &mut deps);
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![value];
        while let Some(id) = stack.pop() {
            if !seen.insert(id) || (id != value && self.realized.contains(&id)) {
                continue;
            }
            let n = g.node(id);
            let (other, own) = deps.get(&id).copied().unwrap_or((false, false));
            if !other && !own {
                continue;
            }
            let shape = dims(g, id);
            let whole = id != value
                && !n.op.is_view()
                && !matches!(n.op, Op::Reduce { .. })
                && ((other && !own && shapes.contains(&shape))
                    || (own && !other && shape == row.shape));
            if whole {
                found.push(id);
                continue;
            }
            stack.extend(n.inputs.iter().copied());
        }
        if found.is_empty() {
            mismatched.to_vec()
        } else {
            found
        }
    }

    /// Reductions computed inside the kernel for `value` (itself included), nearest first.
    fn inlined_reductions(&mut self, value: NodeId) -> Vec<NodeId> {
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![value];
        while let Some(id) = stack.pop() {
            if !seen.insert(id) || (id != value && self.is_realized(id)) {
                continue;
            }
            // Nothing to find below a node that reaches no reduction.
            if id != value && self.reduce_free(id) {
                continue;
            }
            let n = self.graph.node(id);
            if matches!(n.op, Op::Reduce { .. }) {
                found.push(id);
            }
            if matches!(
                n.op,
                Op::Matmul
                    | Op::Cat { .. }
                    | Op::Input { .. }
                    | Op::ScatterAdd { .. }
                    | Op::CumSum { .. }
            ) {
                continue;
            }
            stack.extend(n.inputs.iter().rev().copied());
        }
        found
    }
}

/// The operand index a view reads for its element `idx`; fails (realize the operand) where the
/// map is not affine (a reshape that merges dims of a non-buffer).
fn view_index(g: &Graph, node: NodeId, idx: &[Affine]) -> Retry<Vec<Affine>> {
    let n = g.node(node);
    let operand = n.inputs[0];
    let in_shape = dims(g, operand);
    Ok(match &n.op {
        Op::Permute { perm } => {
            let mut out = vec![Affine::default(); perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                out[p] = idx[i].clone();
            }
            out
        }
        Op::Expand { .. } => broadcast_index(idx, &in_shape, &dims(g, node)),
        Op::Slice {
            dim,
            start,
            step,
            from,
            ..
        } => {
            // From the end, the first element is `size - start` (a size expression).
            let first = if *from == SliceFrom::End {
                SizeExpr::of_dim(in_shape[*dim]).plus(&SizeExpr::Const(-(*start as i64)))
            } else {
                SizeExpr::Const(*start as i64)
            };
            let mut out = idx.to_vec();
            out[*dim] = idx[*dim].scale(*step as i64).plus(&Affine {
                offset: first,
                terms: Default::default(),
            });
            out
        }
        Op::Reshape { .. } => {
            let out_shape = dims(g, node);
            let statics = |shape: &[Dim]| -> Option<Vec<usize>> {
                shape.iter().map(|d| d.as_static()).collect()
            };
            // Symbolic dims must sit in a prefix the reshape leaves alone; the static rest is
            // regrouped as usual.
            let prefix = in_shape
                .iter()
                .zip(&out_shape)
                .take_while(|(a, b)| a == b)
                .count();
            let (Some(in_rest), Some(out_rest)) =
                (statics(&in_shape[prefix..]), statics(&out_shape[prefix..]))
            else {
                // A reshape that regroups symbolic dims (`[2, s0, 8]` to `[2*s0, 8]`) needs
                // division by a symbol to index its operand: the operand is realized, and a
                // reshape of a contiguous buffer reads it at the same linear index.
                return match symbolic_reshape_index(idx, &in_shape, &out_shape) {
                    Some(Ok(inner)) => Ok(inner),
                    Some(Err(())) | None => retry(operand),
                };
            };
            let mut out = idx[..prefix].to_vec();
            match reshape_index(&idx[prefix..], &in_rest, &out_rest) {
                Some(rest) => out.extend(rest),
                None => return retry(operand),
            }
            out
        }
        _ => unreachable!("view_index of a non-view"),
    })
}

/// The operand index of a reshape with symbolic dims, read at `idx`: size-1 dims carry no index,
/// every symbolic dim must map to itself, in order, and the static runs between them regroup
/// among themselves (equal products; [`reshape_index`] on each run). `None` if the dims do not
/// line up so (unsupported), `Some(Err)` if a run's regrouping is not affine (realize the
/// operand).
fn symbolic_reshape_index(
    idx: &[Affine],
    in_shape: &[Dim],
    out_shape: &[Dim],
) -> Option<Result<Vec<Affine>, ()>> {
    let kept = |shape: &[Dim]| -> Vec<usize> {
        (0..shape.len())
            .filter(|&d| shape[d] != Dim::Static(1))
            .collect()
    };
    let (ins, outs) = (kept(in_shape), kept(out_shape));
    let mut out = vec![Affine::constant(0); in_shape.len()];
    let (mut i, mut j) = (0, 0);
    loop {
        // A run of static dims on each side, up to the next symbolic dim or the end.
        let run = |dims: &[usize], shape: &[Dim], from: usize| -> (usize, Vec<usize>) {
            let mut to = from;
            let mut sizes = Vec::new();
            while let Some(Dim::Static(n)) = dims.get(to).map(|&d| shape[d]) {
                sizes.push(n);
                to += 1;
            }
            (to, sizes)
        };
        let (i_end, in_sizes) = run(&ins, in_shape, i);
        let (j_end, out_sizes) = run(&outs, out_shape, j);
        if in_sizes.iter().product::<usize>() != out_sizes.iter().product::<usize>() {
            return None;
        }
        let run_idx: Vec<Affine> = outs[j..j_end].iter().map(|&d| idx[d].clone()).collect();
        match reshape_index(&run_idx, &in_sizes, &out_sizes) {
            Some(mapped) => {
                for (k, a) in mapped.into_iter().enumerate() {
                    out[ins[i + k]] = a;
                }
            }
            None => return Some(Err(())),
        }
        match (ins.get(i_end), outs.get(j_end)) {
            (None, None) => return Some(Ok(out)),
            (Some(&a), Some(&b)) if in_shape[a] == out_shape[b] => {
                out[a] = idx[b].clone();
                i = i_end + 1;
                j = j_end + 1;
            }
            _ => return None,
        }
    }
}

/// The operand index of a reshape from `in_shape` to `out_shape` read at `idx`, when it is affine
/// (each output dim lies within one input dim).
fn reshape_index(idx: &[Affine], in_shape: &[usize], out_shape: &[usize]) -> Option<Vec<Affine>> {
    let out_strides = static_strides(out_shape);
    let in_strides = static_strides(in_shape);
    let mut out = vec![Affine::constant(0); in_shape.len()];
    for (d, &size) in out_shape.iter().enumerate() {
        if size <= 1 {
            continue;
        }
        let c = out_strides[d];
        let e = (0..in_shape.len()).find(|&e| {
            in_shape[e] > 1 && in_strides[e] <= c && c < in_strides[e] * in_shape[e] as i64
        })?;
        if c % in_strides[e] != 0 || c * size as i64 > in_strides[e] * in_shape[e] as i64 {
            return None;
        }
        out[e] = out[e].plus(&idx[d].scale(c / in_strides[e]));
    }
    Some(out)
}

/// The index of an operand of shape `in_shape` broadcast (NumPy-style) to `out_shape`, read at
/// `idx`: leading dims dropped, size-1 dims pinned to 0.
fn broadcast_index(idx: &[Affine], in_shape: &[Dim], out_shape: &[Dim]) -> Vec<Affine> {
    let lead = out_shape.len() - in_shape.len();
    (0..in_shape.len())
        .map(|j| {
            if in_shape[j] == Dim::Static(1) && out_shape[j + lead] != Dim::Static(1) {
                Affine::constant(0)
            } else {
                idx[j + lead].clone()
            }
        })
        .collect()
}

/// Builds one kernel's expressions and stages.
struct KernelBuilder<'g> {
    graph: &'g Graph,
    step: usize,
    exprs: Vec<Expr>,
    types: Vec<ScalarType>,
    /// `exprs` by [`expr_hash`] (with `types`), in order: how `push` finds an equal expression.
    by_hash: HashMap<u64, SmallVec<[ExprId; 1]>>,
    memo: HashMap<(NodeId, Vec<Affine>), ExprId>,
    stages: Vec<Stage>,
    stage_of: HashMap<NodeId, u32>,
    row: Option<RowLoop>,
    /// Computing (non-view, non-constant) nodes inlined here.
    inlined: Vec<NodeId>,
    /// Computing nodes inlined here whose definitions an earlier step built (see `emit`).
    skipped: Vec<NodeId>,
    names: Vec<String>,
}

impl<'g> KernelBuilder<'g> {
    fn new(graph: &'g Graph, step: usize) -> Self {
        KernelBuilder {
            graph,
            step,
            exprs: Vec::new(),
            types: Vec::new(),
            by_hash: HashMap::new(),
            memo: HashMap::new(),
            stages: Vec::new(),
            stage_of: HashMap::new(),
            row: None,
            inlined: Vec::new(),
            skipped: Vec::new(),
            names: Vec::new(),
        }
    }

    fn finish(self, outer: Vec<Dim>) -> Kernel {
        let mut seen = HashSet::new();
        let names: Vec<String> = self
            .names
            .into_iter()
            .filter(|n| seen.insert(n.clone()))
            .collect();
        let label = if names.is_empty() {
            "copy".to_string()
        } else {
            names.join("_")
        };
        Kernel {
            name: label,
            outer,
            order: LoopOrder::Inner,
            stages: self.stages,
            exprs: self.exprs,
            types: self.types,
            nodes: {
                let mut n = self.inlined;
                n.sort();
                n.dedup();
                n
            },
        }
    }

    fn push(&mut self, expr: Expr, ty: ScalarType) -> ExprId {
        // The same expression of another type (an f32 and an i64 `index`) is another value. The
        // first equal expression (by `==`, so a NaN constant is never reused) is found among
        // those of equal hash, which `==` implies.
        let key = expr_hash(&expr, ty);
        let same = self.by_hash.entry(key).or_default();
        if let Some(&i) = same
            .iter()
            .find(|&&i| self.exprs[i.0 as usize] == expr && self.types[i.0 as usize] == ty)
        {
            return i;
        }
        let id = ExprId(self.exprs.len() as u32);
        same.push(id);
        self.exprs.push(expr);
        self.types.push(ty);
        id
    }

    fn convert(&mut self, e: ExprId, to: ScalarType) -> ExprId {
        if self.types[e.0 as usize] == to {
            return e;
        }
        let dtype = match to {
            ScalarType::F32 => DType::F32,
            ScalarType::I64 => DType::I64,
            ScalarType::Bool => DType::Bool,
        };
        self.push(Expr::Cast(dtype, e), to)
    }

    /// Makes the runtime check, before this step runs, that every index `indices` holds lies in
    /// `0..bound` (a gather clamps, so an unchecked index would read the wrong row silently).
    /// The check reads a realized buffer: the indices themselves, or the buffer under a chain of
    /// reshapes, permutes and expands (views that read every element); computed or sliced
    /// indices are realized first (a retry), so that they can be checked.
    fn check_indices(&self, s: &mut Scheduler, indices: NodeId, bound: SizeExpr) -> Retry<()> {
        let g = s.graph;
        let mut v = indices;
        while !s.is_realized(v) {
            match g.node(v).op {
                Op::Reshape { .. } | Op::Permute { .. } | Op::Expand { .. } => {
                    v = g.node(v).inputs[0]
                }
                _ => return retry(indices),
            }
        }
        let check = IndexCheck {
            buffer: BufferId(v.0),
            bound,
            step: self.step,
        };
        if !s.current.built.index_checks.contains(&check) {
            s.current.built.index_checks.push(check);
        }
        Ok(())
    }

    /// Value of `node` at `idx`: a load if it is realized, else its inlined definition.
    fn emit(&mut self, s: &mut Scheduler, node: NodeId, idx: &[Affine]) -> Retry<ExprId> {
        if s.is_realized(node) {
            let (buffer, index) = s.address(node, idx.to_vec())?;
            let ty = ScalarType::of(self.graph.ty(NodeId(buffer.0)).dtype);
            return Ok(self.push(
                Expr::Load {
                    buffer,
                    index,
                    indirect: None,
                },
                ty,
            ));
        }
        // A definition an earlier step built (and so will have to realize, as two steps compute
        // it) is built here only if it can fail here differently: if no reduction is reached
        // from it (whose stage depends on this kernel's loops), it would build as it did there.
        // Its value is then a stand-in: this kernel will not run, since the program is scheduled
        // again once the node is realized (the end of `Scheduler::run` realizes it, with all it
        // reaches, unless a retry first drops this step).
        let n = self.graph.node(node);
        if !matches!(n.op, Op::Constant { .. } | Op::Iota { .. })
            && !n.op.is_view()
            && s.inlined_before(node)
            && s.reduce_free(node)
        {
            self.skipped.push(node);
            let ty = ScalarType::of(n.ty.dtype);
            return Ok(self.push(Expr::Constant { value: 0.0, ty }, ty));
        }
        self.emit_definition(s, node, idx)
    }

    fn emit_definition(
        &mut self,
        s: &mut Scheduler,
        node: NodeId,
        idx: &[Affine],
    ) -> Retry<ExprId> {
        let key = (node, idx.to_vec());
        if let Some(&e) = self.memo.get(&key) {
            return Ok(e);
        }
        let g = self.graph;
        let n = g.node(node);
        let ty = ScalarType::of(n.ty.dtype);
        let out_shape = dims(g, node);
        // Index of a broadcast operand.
        let operand_idx = |operand: NodeId| broadcast_index(idx, &dims(g, operand), &out_shape);
        if !matches!(n.op, Op::Constant { .. } | Op::Iota { .. }) && !n.op.is_view() {
            self.inlined.push(node);
            self.names.push(n.op.name());
        }
        let e = match &n.op {
            Op::Constant { value } => self.push(Expr::Constant { value: *value, ty }, ty),
            // Recomputed from the loop index wherever it is read (never worth a buffer).
            Op::Iota { .. } => self.push(Expr::Index(idx[0].clone()), ty),
            Op::Unary(u) => {
                let a = self.emit(s, n.inputs[0], &operand_idx(n.inputs[0]))?;
                let a = self.convert(a, ty);
                self.push(Expr::Unary(*u, a), ty)
            }
            Op::Binary(b) => {
                let x = self.emit(s, n.inputs[0], &operand_idx(n.inputs[0]))?;
                let y = self.emit(s, n.inputs[1], &operand_idx(n.inputs[1]))?;
                let (x, y) = (self.convert(x, ty), self.convert(y, ty));
                self.push(Expr::Binary(*b, x, y), ty)
            }
            Op::Compare(c) => {
                let common = ScalarType::of(DType::promote(
                    g.ty(n.inputs[0]).dtype,
                    g.ty(n.inputs[1]).dtype,
                ));
                let x = self.emit(s, n.inputs[0], &operand_idx(n.inputs[0]))?;
                let y = self.emit(s, n.inputs[1], &operand_idx(n.inputs[1]))?;
                let (x, y) = (self.convert(x, common), self.convert(y, common));
                self.push(Expr::Compare(*c, x, y), ScalarType::Bool)
            }
            Op::Where => {
                let c = self.emit(s, n.inputs[0], &operand_idx(n.inputs[0]))?;
                let x = self.emit(s, n.inputs[1], &operand_idx(n.inputs[1]))?;
                let y = self.emit(s, n.inputs[2], &operand_idx(n.inputs[2]))?;
                let (x, y) = (self.convert(x, ty), self.convert(y, ty));
                self.push(Expr::Where(c, x, y), ty)
            }
            Op::Cast { dtype }
                if *dtype == DType::F32
                    && matches!(g.node(n.inputs[0]).op, Op::Iota { .. })
                    && !s.is_realized(n.inputs[0]) =>
            {
                // An integer arange read as floats is the float arange (vectorizable); exact
                // below 2^24, far beyond any length a kernel indexes.
                self.push(Expr::Index(idx[0].clone()), ScalarType::F32)
            }
            Op::Cast { dtype } => {
                let a = self.emit(s, n.inputs[0], idx)?;
                let from = g.ty(n.inputs[0]).dtype;
                let narrowing = matches!(dtype, DType::F16 | DType::BF16) && from != *dtype;
                if ScalarType::of(from) == ty && !narrowing {
                    a
                } else {
                    self.push(Expr::Cast(*dtype, a), ty)
                }
            }
            Op::Reduce { op, keepdim, .. } => {
                let row = match &self.row {
                    Some(r) if *r == s.row_loop(node) => r.clone(),
                    _ => return retry(node),
                };
                // The reduction's value is per outer iteration: the index must be exactly the outer loops.
                let kept_idx: Vec<&Affine> = if *keepdim {
                    idx.iter()
                        .enumerate()
                        .filter(|(d, _)| !row.axes.contains(d))
                        .map(|(_, a)| a)
                        .collect()
                } else {
                    idx.iter().collect()
                };
                let sizes_kept: Vec<Dim> = row.kept().iter().map(|&d| row.shape[d]).collect();
                let in_order = kept_idx.iter().enumerate().all(|(p, a)| {
                    a.as_var() == Some(Var::Outer(p as u32))
                        || (sizes_kept[p] == Dim::Static(1) && **a == Affine::constant(0))
                });
                if !in_order {
                    return retry(node);
                }
                let stage = match self.stage_of.get(&node) {
                    Some(&st) => st,
                    None => {
                        let value = self.emit(s, n.inputs[0], &row.full_index())?;
                        let value = self.convert(value, ScalarType::F32);
                        if ty != ScalarType::F32 {
                            return retry(node);
                        }
                        let extent = row.axes.iter().map(|&d| row.shape[d]).collect();
                        self.stages.push(Stage {
                            extent,
                            action: StageAction::Reduce {
                                op: *op,
                                value,
                                stores: Vec::new(),
                            },
                        });
                        let st = self.stages.len() as u32 - 1;
                        self.stage_of.insert(node, st);
                        st
                    }
                };
                self.push(Expr::StageResult(stage), ScalarType::F32)
            }
            Op::Gather => {
                let (table, indices) = (n.inputs[0], n.inputs[1]);
                let index_rank = g.ty(indices).rank();
                let i = self.emit(s, indices, &idx[..index_rank])?;
                let table_shape = dims(g, table);
                if !s.is_realized(table) {
                    return retry(table);
                }
                let strides = contiguous_strides(&table_shape);
                let index = linear(&idx[index_rank..], &strides[1..])?;
                // The rows may be symbolic (a table as long as the input: a mask's, a position
                // table's); the row width must be a number.
                let Some(stride) = strides[0].as_const() else {
                    return fallback(
                        node,
                        "embedding tables of rows of symbolic width are not compiled",
                    );
                };
                let bound = SizeExpr::of_dim(table_shape[0]);
                self.check_indices(s, indices, bound.clone())?;
                let indirect = Indirect {
                    value: i,
                    stride,
                    bound,
                };
                let buffer = BufferId(table.0);
                self.push(
                    Expr::Load {
                        buffer,
                        index,
                        indirect: Some(indirect),
                    },
                    ty,
                )
            }
            Op::Reshape { .. } | Op::Permute { .. } | Op::Expand { .. } | Op::Slice { .. } => {
                let operand = n.inputs[0];
                if let (Op::Reshape { .. }, true) = (&n.op, s.is_realized(operand)) {
                    let buffer = BufferId(operand.0);
                    let index = linear(idx, &contiguous_strides(&out_shape))?;
                    let ty = ScalarType::of(g.ty(operand).dtype);
                    self.push(
                        Expr::Load {
                            buffer,
                            index,
                            indirect: None,
                        },
                        ty,
                    )
                } else {
                    let inner = view_index(g, node, idx)?;
                    self.emit(s, operand, &inner)?
                }
            }
            Op::Detach => self.emit(s, n.inputs[0], idx)?,
            Op::TakeAlong { dim } => {
                let (source, indices) = (n.inputs[0], n.inputs[1]);
                let i = self.emit(s, indices, idx)?;
                if !s.is_realized(source) {
                    return retry(source);
                }
                let source_shape = dims(g, source);
                let strides = contiguous_strides(&source_shape);
                let mut rest = idx.to_vec();
                rest[*dim] = Affine::constant(0);
                let index = linear(&rest, &strides)?;
                let Some(stride) = strides[*dim].as_const() else {
                    return fallback(
                        node,
                        "take_along with a symbolic stride along its dim is not compiled",
                    );
                };
                let bound = SizeExpr::of_dim(source_shape[*dim]);
                self.check_indices(s, indices, bound.clone())?;
                let buffer = BufferId(source.0);
                self.push(
                    Expr::Load {
                        buffer,
                        index,
                        indirect: Some(Indirect {
                            value: i,
                            stride,
                            bound,
                        }),
                    },
                    ty,
                )
            }
            Op::Input { .. }
            | Op::Matmul
            | Op::Cat { .. }
            | Op::ScatterAdd { .. }
            | Op::CumSum { .. } => {
                unreachable!("{} is always realized", n.op)
            }
            Op::Im2col { .. } => {
                return fallback(
                    node,
                    "im2col is compiled only as a GEMM's right operand (an implicit GEMM)",
                )
            }
            // The pipeline decomposes composites first; a graph that was not (through
            // `internals`) runs them as fallback steps rather than failing.
            composite => {
                return fallback(
                    node,
                    format!("{composite} is a composite op: `decompose` compiles it"),
                )
            }
        };
        self.memo.insert(key, e);
        Ok(e)
    }
}

/// A hash of `expr` of type `ty` that equal expressions share (`==`: a constant hashes its value
/// with 0.0 and -0.0 alike, which compare equal).
fn expr_hash(expr: &Expr, ty: ScalarType) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ty.hash(&mut h);
    std::mem::discriminant(expr).hash(&mut h);
    match expr {
        Expr::Load {
            buffer,
            index,
            indirect,
        } => {
            buffer.hash(&mut h);
            index.hash(&mut h);
            if let Some(Indirect {
                value,
                stride,
                bound,
            }) = indirect
            {
                (value, stride, bound).hash(&mut h);
            }
        }
        Expr::Constant { value, ty } => {
            let bits = if *value == 0.0 { 0 } else { value.to_bits() };
            (bits, ty).hash(&mut h);
        }
        Expr::StageResult(stage) => stage.hash(&mut h),
        Expr::Index(index) => index.hash(&mut h),
        Expr::Unary(op, a) => (op, a).hash(&mut h),
        Expr::Binary(op, a, b) => (op, a, b).hash(&mut h),
        Expr::Compare(op, a, b) => (op, a, b).hash(&mut h),
        Expr::Where(c, a, b) => (c, a, b).hash(&mut h),
        Expr::Cast(dtype, a) => (dtype, a).hash(&mut h),
    }
    h.finish()
}

/// Applies `renumber` to every buffer `step` names.
pub(crate) fn renumber_buffers(step: &mut Step, renumber: &impl Fn(&mut BufferId)) {
    let view = |v: &mut StridedView| renumber(&mut v.buffer);
    match step {
        Step::Kernel(k) => renumber_kernel(k, renumber),
        Step::Matmul(m) => {
            view(&mut m.a);
            match &mut m.b {
                MatmulOperand::View(v) => view(v),
                MatmulOperand::Im2col(v) => renumber(&mut v.source),
            }
            renumber(&mut m.out);
            if let Some(e) = &mut m.epilogue {
                renumber_kernel(e, renumber);
            }
        }
        Step::ScatterAdd(sc) => {
            view(&mut sc.index);
            view(&mut sc.src);
            renumber(&mut sc.out);
        }
        Step::Attention(a) => {
            view(&mut a.q);
            view(&mut a.k);
            view(&mut a.v);
            if let Some(m) = &mut a.mask {
                view(m);
            }
            view(&mut a.out);
        }
        Step::Fallback(fb) => {
            fb.inputs.iter_mut().for_each(renumber);
            renumber(&mut fb.out);
        }
    }
}

fn renumber_kernel(k: &mut Kernel, renumber: &impl Fn(&mut BufferId)) {
    for e in &mut k.exprs {
        if let Expr::Load { buffer, .. } = e {
            renumber(buffer);
        }
    }
    for stage in &mut k.stages {
        (stage.action.stores_mut().iter_mut()).for_each(|st| renumber(&mut st.buffer));
    }
}
