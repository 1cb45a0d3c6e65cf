//! Graph breaks in `jit`: segment graphs, the tree of cached paths, and the hooks that run a
//! segment when traced code reads a value.
//!
//! While `f` is traced, `item()`/`to_vec()` call `Recorder::graph_break`: the nodes recorded
//! since the previous break that Rust code still holds (live `Traced` handles), plus the value
//! read, become the outputs of a segment graph (`extract_segment`); its operands from earlier
//! segments or the call's inputs become its inputs. The segment is compiled (or reused) and run,
//! its outputs are appended to the environment of values (slot `i` = input `i`, then each
//! segment's outputs in order) and tracing goes on. A cached path is a chain of segments; paths
//! from one cache entry form a tree keyed by the exact bits of each break value (`merge`), which
//! `replay` walks on a cache hit without running Rust code.

use crate::backend::{compile_segment, JitBackend, SegmentExec};
use crate::compile::CompileError;
use crate::jit::JitError;
use crate::trace::TraceHooks;
use minductor_ir::{Graph, IrError, Node, NodeId, Op, SymId};
use minductor_runtime::{RuntimeError, Tensor};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::Location;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone)]
pub(crate) struct Segment {
    pub(crate) graph: Option<Arc<Graph>>,
    pub(crate) exec: Option<Arc<dyn SegmentExec>>,
    /// Environment slots the graph's inputs come from (slots 0.. are the call's inputs).
    pub(crate) inputs: Vec<usize>,
    /// Number of outputs; they are appended to the environment in order.
    pub(crate) outputs: usize,
    pub(crate) compile_time: Duration,
    pub(crate) end: SegmentEnd,
}

#[derive(Clone)]
pub(crate) enum SegmentEnd {
    Return(Vec<usize>),
    Break {
        read: usize,
        what: String,
        location: String,
        children: Vec<(Vec<u64>, Segment)>,
    },
}

/// The bits of a break's value: children are found by exact equality. `OutOfMemory` when
/// they cannot be allocated (8 bytes an element).
pub(crate) fn break_key(t: &Tensor) -> Result<Vec<u64>, RuntimeError> {
    // Collected in place: the f64 values' allocation becomes the key's.
    Ok(t.try_to_f64_vec()?.into_iter().map(f64::to_bits).collect())
}

/// [`break_key`] of `values`, read from the break's tensor.
fn key_of(values: &[f64]) -> Result<Vec<u64>, RuntimeError> {
    let mut key: Vec<u64> = Vec::new();
    key.try_reserve_exact(values.len()).map_err(|_| {
        RuntimeError::out_of_memory(values.len().saturating_mul(8), "a graph break's key")
    })?;
    key.extend(values.iter().map(|v| v.to_bits()));
    Ok(key)
}

pub(crate) fn format_key(key: &[u64]) -> String {
    let values: Vec<String> = key
        .iter()
        .take(8)
        .map(|&b| format!("{}", f64::from_bits(b)))
        .collect();
    if key.len() == 1 {
        values[0].clone()
    } else if key.len() > 8 {
        format!("[{}, ...]", values.join(", "))
    } else {
        format!("[{}]", values.join(", "))
    }
}

// ---- tracing with graph breaks ------------------------------------------------------------------

/// A segment built while tracing, with its break value.
pub(crate) struct BuiltSegment {
    pub(crate) segment: Segment,
    /// For a break: the value read (its key) and a description for `explain`.
    pub(crate) break_key: Option<Vec<u64>>,
    pub(crate) reused: bool,
}

/// Why a symbolic trace could not be used as is.
pub(crate) enum SymbolicFailure {
    /// Rust code read these symbols as numbers.
    Specialized(Vec<(u32, String)>),
    /// The backend or an op refused symbolic dims.
    Unsupported(String),
}

/// The result of tracing and running one call.
pub(crate) struct TraceRun {
    pub outputs: Vec<Tensor>,
    pub(crate) chain: Vec<BuiltSegment>,
}

/// The hooks a tracer calls under `jit`: runs segments at graph breaks.
pub(crate) struct Recorder {
    pub(crate) backend: JitBackend,
    pub(crate) mode: crate::compile::Mode,
    pub(crate) fullgraph: bool,
    pub(crate) hints: HashMap<u32, usize>,
    pub(crate) specialized: RefCell<Vec<(u32, String)>>,
    pub(crate) unsupported: RefCell<Option<String>>,
    pub(crate) env: RefCell<Vec<Tensor>>,
    pub(crate) slot_of: RefCell<HashMap<NodeId, usize>>,
    pub(crate) segment_start: Cell<usize>,
    pub(crate) chain: RefCell<Vec<BuiltSegment>>,
    /// Cached segments at the position the next segment takes: the one on the path of the break
    /// values read so far first, then its siblings (whose compiled code a retrace may reuse).
    pub(crate) candidates: RefCell<Vec<Segment>>,
    /// Values a replay already computed for this call (slots in trace order): reused segments
    /// whose outputs are here are not run again.
    pub(crate) prefilled: Vec<Tensor>,
    /// Whether a segment may be compiled; if not, needing one sets `compile_refused`.
    pub(crate) allow_compile: bool,
    pub(crate) compile_refused: Cell<bool>,
    /// The first run at a graph break that failed, out of memory say (the segment's run or
    /// reading its value): the call's error, which `jit` returns instead of the trace error
    /// the tracer records for the break.
    pub(crate) failed: RefCell<Option<RuntimeError>>,
    pub(crate) function: String,
}

/// Where a traced run starts from: cached segments to reuse, values already computed, and
/// whether compiling is allowed.
pub(crate) struct Resume {
    pub(crate) candidates: Vec<Segment>,
    pub(crate) prefilled: Vec<Tensor>,
    pub(crate) allow_compile: bool,
}

impl Resume {
    pub(crate) fn fresh() -> Resume {
        Resume {
            candidates: Vec::new(),
            prefilled: Vec::new(),
            allow_compile: true,
        }
    }
}

/// Why a segment could not be run: its run failed (kept typed, so `jit` returns the call's
/// own error, an out-of-memory one say), or it could not be built or compiled.
#[derive(Debug)]
pub(crate) enum SegmentError {
    Runtime(RuntimeError),
    Other(String),
}

impl std::fmt::Display for SegmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SegmentError::Runtime(e) => write!(f, "{e}"),
            SegmentError::Other(m) => f.write_str(m),
        }
    }
}

impl Recorder {
    /// Builds, compiles (or reuses) and runs the segment from `segment_start` to the end of
    /// `graph` that computes `wanted`; returns the segment.
    pub(crate) fn run_segment(
        &self,
        graph: &Graph,
        wanted: &[NodeId],
    ) -> Result<(Segment, bool), SegmentError> {
        let (seg_graph, input_slots) = {
            let slot_of = self.slot_of.borrow();
            extract_segment(graph, self.segment_start.get(), wanted, &slot_of)
                .map_err(SegmentError::Other)?
        };
        let found = self
            .candidates
            .borrow()
            .iter()
            .find(|seg| seg.graph.as_deref() == Some(&seg_graph) && seg.inputs == input_slots)
            .map(|seg| (seg.exec.clone(), seg.compile_time));
        let reused = found.is_some();
        let (exec, compile_time) = match found {
            Some(found) => found,
            None if wanted.is_empty() => (None, Duration::ZERO),
            None if !self.allow_compile => {
                self.compile_refused.set(true);
                return Err(SegmentError::Other(
                    "a new graph would have to be compiled".to_string(),
                ));
            }
            None => {
                let started = Instant::now();
                let symbolic = seg_graph
                    .nodes()
                    .iter()
                    .any(|n| n.ty.static_sizes().is_none());
                match compile_segment(&self.backend, self.mode, &seg_graph) {
                    Ok(exec) => {
                        let elapsed = started.elapsed();
                        tracing::info!(
                            target: "minductor::graph",
                            "{}: compiled a graph of {} nodes with {} in {:?}{}",
                            self.function,
                            seg_graph.len(),
                            self.backend.name(),
                            elapsed,
                            if symbolic { " (symbolic)" } else { "" }
                        );
                        (Some(exec), elapsed)
                    }
                    Err(CompileError::Unsupported { backend, what }) if symbolic => {
                        let why = format!("backend {backend} does not support {what} yet");
                        *self.unsupported.borrow_mut() = Some(why.clone());
                        return Err(SegmentError::Other(why));
                    }
                    Err(e) => return Err(SegmentError::Other(e.to_string())),
                }
            }
        };
        let outputs = {
            let env = self.env.borrow();
            let end = env.len() + wanted.len();
            if reused && self.prefilled.len() >= end {
                self.prefilled[env.len()..end].to_vec()
            } else {
                let args: Vec<Tensor> = input_slots.iter().map(|&s| env[s].clone()).collect();
                match &exec {
                    Some(exec) => exec.run(&args).map_err(SegmentError::Runtime)?,
                    None => Vec::new(),
                }
            }
        };
        let mut env = self.env.borrow_mut();
        let mut slot_of = self.slot_of.borrow_mut();
        for (&node, value) in wanted.iter().zip(outputs) {
            slot_of.insert(node, env.len());
            env.push(value);
        }
        self.segment_start.set(graph.len());
        Ok((
            Segment {
                graph: Some(Arc::new(seg_graph)),
                exec,
                inputs: input_slots,
                outputs: wanted.len(),
                compile_time,
                end: SegmentEnd::Return(Vec::new()),
            },
            reused,
        ))
    }
}

impl TraceHooks for Recorder {
    fn graph_break(
        &self,
        graph: &Graph,
        node: NodeId,
        live: &[NodeId],
        what: &str,
        location: &'static Location<'static>,
    ) -> Result<Vec<f64>, IrError> {
        if self.fullgraph {
            return Err(IrError::ty(
                what,
                format!(
                    "graph break in fullgraph mode: reading a tensor's value ends the graph \
                     (called at {location})"
                ),
            ));
        }
        if !self.specialized.borrow().is_empty() || self.unsupported.borrow().is_some() {
            return Err(IrError::ty(what, "symbolic trace abandoned"));
        }
        tracing::info!(
            target: "minductor::graph_breaks",
            "{}: graph break at {location}: {what} reads a tensor's value",
            self.function
        );
        let start = self.segment_start.get();
        let mut wanted: Vec<NodeId> = {
            let slot_of = self.slot_of.borrow();
            live.iter()
                .copied()
                .filter(|id| id.index() >= start && id.index() < graph.len())
                .filter(|id| !slot_of.contains_key(id))
                .filter(|id| !matches!(graph.node(*id).op, Op::Input { .. }))
                .collect()
        };
        if !self.slot_of.borrow().contains_key(&node) && !wanted.contains(&node) {
            wanted.push(node);
        }
        wanted.sort();
        let failed = |error: RuntimeError| {
            let message = format!("graph break: the graph before it failed: {error}");
            self.failed.borrow_mut().get_or_insert(error);
            IrError::ty(what, message)
        };
        let (mut segment, reused) = match self.run_segment(graph, &wanted) {
            Ok(run) => run,
            Err(SegmentError::Runtime(error)) => return Err(failed(error)),
            Err(m) => {
                return Err(IrError::ty(
                    what,
                    format!("graph break: the graph before it failed: {m}"),
                ))
            }
        };
        let read = self.slot_of.borrow()[&node];
        let value = self.env.borrow()[read].clone();
        let values = value
            .try_to_f64_vec()
            .map_err(|e| failed(e.allocating(format!("the values {what} reads"))))?;
        let key = key_of(&values).map_err(failed)?;
        // The cached segments after this break: the one for the value read now first.
        let next = {
            let candidates = self.candidates.borrow();
            let (mut first, mut rest) = (Vec::new(), Vec::new());
            for seg in candidates.iter() {
                if let SegmentEnd::Break { children, .. } = &seg.end {
                    for (k, child) in children {
                        if *k == key {
                            first.push(child.clone());
                        } else {
                            rest.push(child.clone());
                        }
                    }
                }
            }
            first.extend(rest);
            first
        };
        *self.candidates.borrow_mut() = next;
        segment.end = SegmentEnd::Break {
            read,
            what: what.to_string(),
            location: location.to_string(),
            children: Vec::new(),
        };
        self.chain.borrow_mut().push(BuiltSegment {
            segment,
            break_key: Some(key),
            reused,
        });
        Ok(values)
    }

    fn specialize(&self, sym: SymId, location: &'static Location<'static>) -> Option<usize> {
        let hint = self.hints.get(&sym.0).copied();
        if hint.is_some() {
            self.specialized.borrow_mut().push((
                sym.0,
                format!("Rust code read it as a number at {location}"),
            ));
        }
        hint
    }
}

/// The graph of nodes `start..` needed for `outputs`; operands outside it (inputs and values
/// materialized at earlier breaks) become its inputs. Returns the graph and its inputs' slots.
pub(crate) fn extract_segment(
    graph: &Graph,
    start: usize,
    outputs: &[NodeId],
    slot_of: &HashMap<NodeId, usize>,
) -> Result<(Graph, Vec<usize>), String> {
    let external = |id: NodeId| slot_of.contains_key(&id);
    let mut needed = vec![false; graph.len()];
    let mut stack: Vec<NodeId> = outputs.to_vec();
    let mut inputs: Vec<NodeId> = Vec::new();
    while let Some(id) = stack.pop() {
        if needed[id.index()] {
            continue;
        }
        needed[id.index()] = true;
        if external(id) {
            inputs.push(id);
            continue;
        }
        if id.index() < start || matches!(graph.node(id).op, Op::Input { .. }) {
            return Err(format!(
                "internal: {id} is used after a graph break but was not materialized"
            ));
        }
        stack.extend(graph.node(id).inputs.iter().copied());
    }
    inputs.sort();
    let mut out = Graph::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    let mut slots = Vec::with_capacity(inputs.len());
    for &id in &inputs {
        let name = match &graph.node(id).op {
            Op::Input { name } => name.clone(),
            _ => format!("v{}", id.0),
        };
        map.insert(id, out.input(name, graph.ty(id).clone()));
        slots.push(slot_of[&id]);
    }
    for id in graph.ids().skip(start) {
        if !needed[id.index()] || map.contains_key(&id) {
            continue;
        }
        let node = graph.node(id);
        let new = match &node.op {
            Op::Constant { value } => out.constant(*value, node.ty.dtype),
            op => out.push(Node {
                op: op.clone(),
                inputs: node.inputs.iter().map(|i| map[i]).collect(),
                ty: node.ty.clone(),
            }),
        };
        map.insert(id, new);
    }
    out.set_outputs(outputs.iter().map(|o| map[o]).collect());
    Ok((out, slots))
}

/// Links a traced chain of segments into a path: each break's only child is the next segment.
pub(crate) fn assemble(chain: Vec<BuiltSegment>) -> Segment {
    let mut next: Option<Segment> = None;
    for built in chain.into_iter().rev() {
        let mut segment = built.segment;
        if let (SegmentEnd::Break { children, .. }, Some(key), Some(child)) =
            (&mut segment.end, built.break_key, next.take())
        {
            children.push((key, child));
        }
        next = Some(segment);
    }
    next.expect("a traced run has at least its final segment")
}

/// Adds `path` (traced from the same entry) to the tree at `root`.
pub(crate) fn merge(root: &mut Segment, path: Segment) {
    let mut node = root;
    let mut path = path;
    loop {
        let (
            SegmentEnd::Break { children, .. },
            SegmentEnd::Break {
                children: mut new, ..
            },
        ) = (&mut node.end, path.end)
        else {
            return;
        };
        let Some((key, child)) = new.pop() else {
            return;
        };
        match children.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                node = &mut children[i].1;
                path = child;
            }
            None => {
                children.push((key, child));
                return;
            }
        }
    }
}

pub(crate) enum Replay {
    Hit(Vec<Tensor>),
    /// A break read a value no cached path has: `children` paths exist at that break.
    NewBreakValue {
        reason: String,
        children: usize,
        /// The values computed so far, in slot order.
        env: Vec<Tensor>,
    },
}

/// Runs a cached tree on `inputs` without tracing.
pub(crate) fn replay(root: &Segment, inputs: &[Tensor]) -> Result<Replay, JitError> {
    // Fast path: one graph taking the inputs in order and returning its outputs in order.
    if let (SegmentEnd::Return(returned), Some(exec)) = (&root.end, &root.exec) {
        let n = inputs.len();
        let direct = root.inputs.len() == n
            && root.inputs.iter().enumerate().all(|(i, &s)| i == s)
            && returned.len() == root.outputs
            && returned.iter().enumerate().all(|(i, &s)| s == n + i);
        if direct {
            return Ok(Replay::Hit(exec.run(inputs)?));
        }
    }
    let mut env: Vec<Tensor> = inputs.to_vec();
    let mut segment = root;
    loop {
        if let Some(exec) = &segment.exec {
            let args: Vec<Tensor> = segment.inputs.iter().map(|&s| env[s].clone()).collect();
            env.extend(exec.run(&args)?);
        }
        match &segment.end {
            SegmentEnd::Return(returned) => {
                return Ok(Replay::Hit(
                    returned.iter().map(|&s| env[s].clone()).collect(),
                ))
            }
            SegmentEnd::Break {
                read,
                what,
                location,
                children,
            } => {
                let key = break_key(&env[*read])?;
                match children.iter().find(|(k, _)| *k == key) {
                    Some((_, child)) => segment = child,
                    None => {
                        let seen: Vec<String> =
                            children.iter().map(|(k, _)| format_key(k)).collect();
                        return Ok(Replay::NewBreakValue {
                            reason: format!(
                                "{what} at {location} read {}, cached for [{}]",
                                format_key(&key),
                                seen.join(", ")
                            ),
                            children: children.len(),
                            env,
                        });
                    }
                }
            }
        }
    }
}
