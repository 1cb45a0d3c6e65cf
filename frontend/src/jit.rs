//! `jit`: TorchDynamo for Rust closures over traced tensors.
//!
//! `jit(f)` wraps `f: Fn(&[Traced]) -> Vec<Traced>`. A call checks the cache entries' guards
//! (newest first, see `guards.rs`); on a hit it runs the cached code without running `f`. On a
//! miss it traces `f` with inputs typed like the real ones, installs guards, compiles with the
//! backend, caches the result and runs it.
//!
//! **Recompiles.** A miss while entries exist is a recompile: logged under
//! `minductor::recompiles` with the failed guard of each entry in words, counted in
//! [`JitStats::recompiles`]. Past `recompile_limit` entries (default 8) a miss runs eagerly and a
//! warning is logged once. Stances (`stance.rs`) can force eager, run eagerly instead of
//! recompiling, or make a recompile an error.
//!
//! **Dynamic shapes.** Each function remembers every input dim's size at its compiles (Dynamo's
//! frame state). `dynamic: None` (automatic): a dim whose size differs from an earlier compile's
//! is compiled symbolic, so the first recompile over a size sweep already yields a graph for any
//! size; `Some(true)`: every dim symbolic from the first compile; `Some(false)`: never. Sizes 0
//! and 1 stay static (specialized). Dims of equal size share one symbol (duck sizing) with a
//! guard tying them. If the symbolic trace cannot hold (an op without a symbolic rule, Rust code
//! reading a symbolic size through `shape()`) or the backend refuses symbolic dims
//! (`CompileError::Unsupported`), the call falls back to a static specialization for its shape;
//! the reason is logged under `minductor::dynamic` and kept in [`JitStats::dynamic_fallbacks`].
//!
//! **Graph breaks.** `item()`/`to_vec()` on a traced value end the current graph: the values
//! still held by Rust code (live `Traced` handles) become the graph's outputs, it is compiled and
//! run on the real inputs, the concrete value is returned to `f`, and tracing goes on with the
//! materialized values as inputs of the next graph. A cache entry is therefore a tree: a
//! segment graph ends in the function's return or in a break, and a break has one child per value
//! read there. A hit walks the tree: run a segment, read the break value, pick the child for it.
//! A value not seen before re-runs `f` from the start in tracing mode with the entry's input
//! types: segments the replay already ran are not run again (their values are handed over), and
//! every segment whose re-traced graph equals a compiled one (on this path or a sibling's) reuses
//! its code. Only a new graph is a recompile (limit and stance apply); a re-trace that compiles
//! nothing is counted in [`JitStats::break_retraces`]. This assumes what Dynamo's guards assume:
//! `f` depends only on its inputs' types and the values it reads (no hidden state).
//! `fullgraph(true)` turns a break into an error at the call site of `item()`/`to_vec()`.
//!
//! **Stances** are per thread and scoped (`stance.rs`). `force_eager` and the eager fallbacks
//! trace `f` with static shapes and interpret it op by op (our eager mode), breaks included.
//!
//! **What differs from Dynamo.** Guards see only the inputs' metadata: a closure that reads
//! captured state (a `Cell`, a global) is not guarded, as Dynamo would guard a global. A break
//! value keys its children by exact value, where Dynamo with symbolic floats would guard the
//! branch condition; we cannot see the condition in Rust code, so a new value costs a re-trace
//! (microseconds) instead of a guard check. Strides are guarded as contiguous or not, not stride
//! by stride. Symbols have no arithmetic (`Dim` is a number or a symbol): a reshape, slice or
//! cat whose result size would be an expression of a symbol specializes or falls back to static.
//! A `jit` function calling itself from inside `f` deadlocks (its cache is locked during a call).

use crate::backend::{compile_segment, JitBackend, SegmentExec};
use crate::compile::{Backend, CompileError};
use crate::guards::Guards;
use crate::stance::{current_stance, Stance};
use crate::trace::{TraceError, TraceHooks, Traced, Tracer};
use minductor_ir::{Dim, Graph, IrError, Node, NodeId, Op, Shape, SymId, TensorType};
use minductor_runtime::{RuntimeError, Tensor};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Dynamo's default `recompile_limit`.
pub const DEFAULT_RECOMPILE_LIMIT: usize = 8;

#[derive(Debug, Error)]
pub enum JitError {
    #[error("{0}")]
    Trace(#[from] TraceError),
    #[error("compile failed: {0}")]
    Compile(#[from] CompileError),
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    #[error("fail_on_recompile: `{function}` would recompile because {reason}")]
    RecompileForbidden { function: String, reason: String },
    #[error("{0} returned a value that is not from its inputs' tracer")]
    ForeignOutput(String),
}

/// Options, as `torch.compile(fn, backend=, dynamic=, fullgraph=)` and Dynamo's config.
#[derive(Clone, Debug)]
pub struct JitOptions {
    pub backend: JitBackend,
    /// `None`: automatic dynamic shapes; `Some(true)`: all dims symbolic; `Some(false)`: static.
    pub dynamic: Option<bool>,
    pub fullgraph: bool,
    pub recompile_limit: usize,
    /// Names of the inputs in guards and graphs (`arg0`, `arg1`, ... when not given).
    pub input_names: Vec<String>,
    /// The function's name in logs.
    pub name: String,
}

impl Default for JitOptions {
    fn default() -> Self {
        JitOptions {
            backend: JitBackend::default(),
            dynamic: None,
            fullgraph: false,
            recompile_limit: DEFAULT_RECOMPILE_LIMIT,
            input_names: Vec::new(),
            name: "jit_fn".to_string(),
        }
    }
}

/// Counters of one `jit` function, for tests and tuning.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JitStats {
    /// Calls made (any stance).
    pub calls: u64,
    /// Calls answered entirely from the cache.
    pub cache_hits: u64,
    /// Graphs handed to the backend (one per segment; a function without breaks: one per miss).
    pub compiles: u64,
    /// Of `compiles`, graphs with at least one symbolic dim.
    pub symbolic_compiles: u64,
    /// Why each recompile happened (a miss while cache entries existed), oldest first.
    pub recompiles: Vec<String>,
    /// Graph breaks met while tracing.
    pub graph_breaks: u64,
    /// Calls run eagerly because the recompile limit was reached.
    pub limit_fallbacks: u64,
    /// Calls run eagerly because of the stance (`force_eager`, `eager_on_recompile`).
    pub stance_eager_calls: u64,
    /// New break values whose path re-traced `f` but compiled nothing (every graph on it was
    /// already compiled for another value).
    pub break_retraces: u64,
    /// Symbolic traces that fell back to a static specialization, with the reason.
    pub dynamic_fallbacks: Vec<String>,
}

impl JitStats {
    /// Calls run eagerly for any reason.
    pub fn eager_fallbacks(&self) -> u64 {
        self.limit_fallbacks + self.stance_eager_calls
    }
}

/// A function compiled on demand; see the module doc.
pub struct Jit<F> {
    f: F,
    options: JitOptions,
    state: Mutex<JitState>,
}

/// Wraps `f` for compilation on first call (`torch.compile(f)`).
pub fn jit<F>(f: F) -> Jit<F>
where
    F: Fn(&[Traced]) -> Vec<Traced>,
{
    Jit {
        f,
        options: JitOptions::default(),
        state: Mutex::new(JitState::default()),
    }
}

#[derive(Default)]
struct JitState {
    entries: Vec<CacheEntry>,
    frame: FrameState,
    stats: JitStats,
    warned_limit: bool,
}

struct CacheEntry {
    guards: Guards,
    /// How the inputs were typed: re-traces after a new break value use the same types.
    typing: Typing,
    root: Segment,
}

/// One compiled graph of a traced path and what follows it.
#[derive(Clone)]
struct Segment {
    graph: Option<Arc<Graph>>,
    exec: Option<Arc<dyn SegmentExec>>,
    /// Environment slots the graph's inputs come from (slots 0.. are the call's inputs).
    inputs: Vec<usize>,
    /// Number of outputs; they are appended to the environment in order.
    outputs: usize,
    compile_time: Duration,
    end: SegmentEnd,
}

#[derive(Clone)]
enum SegmentEnd {
    Return(Vec<usize>),
    Break {
        read: usize,
        what: String,
        location: String,
        children: Vec<(Vec<u64>, Segment)>,
    },
}

/// The bits of a break's value: children are found by exact equality.
fn break_key(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|v| v.to_bits()).collect()
}

fn format_key(key: &[u64]) -> String {
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

// ---- dynamic-shape policy -----------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum DimSeen {
    Static(usize),
    Dynamic,
}

/// What earlier compiles saw of each input's dims (Dynamo's frame state).
#[derive(Clone, Default)]
struct FrameState {
    dims: Vec<Option<Vec<DimSeen>>>,
    /// Dims Rust code read as numbers while symbolic: compiled static from then on.
    forced_static: HashMap<(usize, usize), String>,
}

/// How one call's inputs are typed for tracing.
#[derive(Clone)]
struct Typing {
    types: Vec<TensorType>,
    /// Example size of each symbol.
    hints: HashMap<u32, usize>,
    /// The (input, dim) positions of each symbol.
    positions: HashMap<u32, Vec<(usize, usize)>>,
    /// What the dynamic policy decided, in words, for `explain` and the `dynamic` log.
    notes: Vec<String>,
}

impl FrameState {
    /// Records `inputs`' sizes; returns which dims changed since the last compile.
    fn update(&mut self, names: &[String], inputs: &[Tensor]) -> Vec<String> {
        let mut changed = Vec::new();
        if self.dims.len() < inputs.len() {
            self.dims.resize(inputs.len(), None);
        }
        for (i, t) in inputs.iter().enumerate() {
            match &mut self.dims[i] {
                Some(seen) if seen.len() == t.rank() => {
                    for (d, (s, &n)) in seen.iter_mut().zip(t.shape()).enumerate() {
                        if let DimSeen::Static(old) = *s {
                            if old != n {
                                *s = DimSeen::Dynamic;
                                changed.push(format!(
                                    "input {}, dim {d}: size changed {old} -> {n}; marking it \
                                     dynamic",
                                    names[i]
                                ));
                            }
                        }
                    }
                }
                slot => {
                    *slot = Some(t.shape().iter().map(|&n| DimSeen::Static(n)).collect());
                }
            }
        }
        changed
    }

    fn typing(&self, names: &[String], inputs: &[Tensor], dynamic: Option<bool>) -> Typing {
        let mut symbol_of_size: HashMap<usize, u32> = HashMap::new();
        let mut typing = Typing {
            types: Vec::new(),
            hints: HashMap::new(),
            positions: HashMap::new(),
            notes: Vec::new(),
        };
        for (i, t) in inputs.iter().enumerate() {
            let mut shape = Shape::new();
            for (d, &n) in t.shape().iter().enumerate() {
                let wanted = match dynamic {
                    Some(all) => all,
                    None => matches!(
                        self.dims
                            .get(i)
                            .and_then(|s| s.as_ref())
                            .and_then(|s| s.get(d)),
                        Some(DimSeen::Dynamic)
                    ),
                };
                let forced = self.forced_static.get(&(i, d));
                let dim = if !wanted {
                    Dim::Static(n)
                } else if let Some(why) = forced {
                    typing.notes.push(format!(
                        "input {}, dim {d}: static ({n}), because {why}",
                        names[i]
                    ));
                    Dim::Static(n)
                } else if n < 2 {
                    typing.notes.push(format!(
                        "input {}, dim {d}: size {n} specialized (sizes 0 and 1 are always \
                         specialized)",
                        names[i]
                    ));
                    Dim::Static(n)
                } else {
                    let next = symbol_of_size.len() as u32;
                    let sym = *symbol_of_size.entry(n).or_insert(next);
                    typing.hints.insert(sym, n);
                    typing.positions.entry(sym).or_default().push((i, d));
                    Dim::Sym(SymId(sym))
                };
                shape.push(dim);
            }
            typing.types.push(TensorType::new(t.dtype(), shape));
        }
        for (sym, positions) in &typing.positions {
            let at: Vec<String> = positions
                .iter()
                .map(|(i, d)| format!("input {}, dim {d}", names[*i]))
                .collect();
            typing.notes.push(format!(
                "s{sym} (example {}): {}",
                typing.hints[sym],
                at.join(", ")
            ));
        }
        typing.notes.sort();
        typing
    }
}

fn is_symbolic(types: &[TensorType]) -> bool {
    types.iter().any(|t| t.static_sizes().is_none())
}

fn static_types(inputs: &[Tensor]) -> Vec<TensorType> {
    inputs.iter().map(|t| t.tensor_type()).collect()
}

// ---- tracing with graph breaks ------------------------------------------------------------------

/// A segment built while tracing, with its break value.
struct BuiltSegment {
    segment: Segment,
    /// For a break: the value read (its key) and a description for `explain`.
    break_key: Option<Vec<u64>>,
    reused: bool,
}

/// Why a symbolic trace could not be used as is.
enum SymbolicFailure {
    /// Rust code read these symbols as numbers.
    Specialized(Vec<(u32, String)>),
    /// The backend or an op refused symbolic dims.
    Unsupported(String),
}

/// The result of tracing and running one call.
pub(crate) struct TraceRun {
    pub outputs: Vec<Tensor>,
    chain: Vec<BuiltSegment>,
}

/// The hooks a tracer calls under `jit`: runs segments at graph breaks.
struct Recorder {
    backend: JitBackend,
    fullgraph: bool,
    hints: HashMap<u32, usize>,
    specialized: RefCell<Vec<(u32, String)>>,
    unsupported: RefCell<Option<String>>,
    env: RefCell<Vec<Tensor>>,
    slot_of: RefCell<HashMap<NodeId, usize>>,
    segment_start: Cell<usize>,
    chain: RefCell<Vec<BuiltSegment>>,
    /// Cached segments at the position the next segment takes: the one on the path of the break
    /// values read so far first, then its siblings (whose compiled code a retrace may reuse).
    candidates: RefCell<Vec<Segment>>,
    /// Values a replay already computed for this call (slots in trace order): reused segments
    /// whose outputs are here are not run again.
    prefilled: Vec<Tensor>,
    /// Whether a segment may be compiled; if not, needing one sets `compile_refused`.
    allow_compile: bool,
    compile_refused: Cell<bool>,
    function: String,
}

/// Where a traced run starts from: cached segments to reuse, values already computed, and
/// whether compiling is allowed.
struct Resume {
    candidates: Vec<Segment>,
    prefilled: Vec<Tensor>,
    allow_compile: bool,
}

impl Resume {
    fn fresh() -> Resume {
        Resume {
            candidates: Vec::new(),
            prefilled: Vec::new(),
            allow_compile: true,
        }
    }
}

impl Recorder {
    /// Builds, compiles (or reuses) and runs the segment from `segment_start` to the end of
    /// `graph` that computes `wanted`; returns the segment.
    fn run_segment(&self, graph: &Graph, wanted: &[NodeId]) -> Result<(Segment, bool), String> {
        let (seg_graph, input_slots) = {
            let slot_of = self.slot_of.borrow();
            extract_segment(graph, self.segment_start.get(), wanted, &slot_of)?
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
                return Err("a new graph would have to be compiled".to_string());
            }
            None => {
                let started = Instant::now();
                let symbolic = seg_graph
                    .nodes()
                    .iter()
                    .any(|n| n.ty.static_sizes().is_none());
                match compile_segment(&self.backend, &seg_graph) {
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
                        return Err(why);
                    }
                    Err(e) => return Err(e.to_string()),
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
                    Some(exec) => exec.run(&args).map_err(|e| e.to_string())?,
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
    ) -> Result<Tensor, IrError> {
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
        let (mut segment, reused) = self.run_segment(graph, &wanted).map_err(|m| {
            IrError::ty(
                what,
                format!("graph break: the graph before it failed: {m}"),
            )
        })?;
        let read = self.slot_of.borrow()[&node];
        let value = self.env.borrow()[read].clone();
        let key = break_key(&value);
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
        Ok(value)
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
fn extract_segment(
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

/// A failed traced run: a real error, or a symbolic trace to redo with static dims.
enum RunFailure {
    Error(JitError),
    Symbolic(SymbolicFailure),
    /// A graph had to be compiled and `Resume::allow_compile` was false.
    CompileRefused,
}

impl<F> Jit<F>
where
    F: Fn(&[Traced]) -> Vec<Traced>,
{
    /// The backend, by name (`"eager"`, `"aot_eager"`, `"inductor"`), enum or custom.
    pub fn backend(mut self, backend: impl Into<JitBackend>) -> Self {
        self.options.backend = backend.into();
        self
    }
    /// `None` automatic dynamic shapes, `Some(true)` all dims symbolic, `Some(false)` static.
    pub fn dynamic(mut self, dynamic: Option<bool>) -> Self {
        self.options.dynamic = dynamic;
        self
    }
    /// A graph break becomes an error naming its call site.
    pub fn fullgraph(mut self, fullgraph: bool) -> Self {
        self.options.fullgraph = fullgraph;
        self
    }
    /// Cache entries allowed before misses run eagerly (default 8).
    pub fn recompile_limit(mut self, limit: usize) -> Self {
        self.options.recompile_limit = limit;
        self
    }
    /// Names of the inputs, used in guards, graphs and messages.
    pub fn input_names<S: AsRef<str>>(mut self, names: &[S]) -> Self {
        self.options.input_names = names.iter().map(|s| s.as_ref().to_string()).collect();
        self
    }
    /// The function's name in logs.
    pub fn name(mut self, name: &str) -> Self {
        self.options.name = name.to_string();
        self
    }

    pub fn options(&self) -> &JitOptions {
        &self.options
    }

    /// A copy of the counters.
    pub fn stats(&self) -> JitStats {
        self.lock().stats.clone()
    }

    /// Drops every cache entry, the frame state and the counters (`torch._dynamo.reset()`).
    pub fn reset(&self) {
        *self.lock() = JitState::default();
    }

    /// Number of cache entries (guarded specializations at the function's entry).
    pub fn cache_entries(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JitState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn names(&self, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                self.options
                    .input_names
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| format!("arg{i}"))
            })
            .collect()
    }

    /// Calls the function: cached code when a guard set passes, otherwise compile (or run
    /// eagerly, per stance and recompile limit).
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, JitError> {
        let stance = current_stance();
        let mut state = self.lock();
        state.stats.calls += 1;
        if stance == Stance::ForceEager {
            state.stats.stance_eager_calls += 1;
            drop(state);
            return self.run_eager(inputs);
        }

        // The hit path: guards, then the cached segments.
        for index in (0..state.entries.len()).rev() {
            let entry = &state.entries[index];
            if !entry.guards.check(inputs) {
                continue;
            }
            return match replay(&entry.root, inputs)? {
                Replay::Hit(outputs) => {
                    state.stats.cache_hits += 1;
                    Ok(outputs)
                }
                Replay::NewBreakValue {
                    reason,
                    children,
                    env,
                } => self.break_miss(state, stance, index, inputs, reason, children, env),
            };
        }

        // No guard set holds.
        let names = self.names(inputs.len());
        if !state.entries.is_empty() {
            let reasons: Vec<String> = state
                .entries
                .iter()
                .enumerate()
                .rev()
                .map(|(i, e)| {
                    let why = e.guards.failure(inputs).unwrap_or_default();
                    tracing::debug!(
                        target: "minductor::guards",
                        "{}: entry {i}: guard failed: {why}",
                        self.options.name
                    );
                    why
                })
                .collect();
            let reason = if reasons.len() == 1 {
                reasons[0].clone()
            } else {
                reasons
                    .iter()
                    .enumerate()
                    .map(|(i, r)| format!("entry {}: {r}", reasons.len() - 1 - i))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            match stance {
                Stance::FailOnRecompile => {
                    return Err(JitError::RecompileForbidden {
                        function: self.options.name.clone(),
                        reason,
                    })
                }
                Stance::EagerOnRecompile => {
                    state.stats.stance_eager_calls += 1;
                    drop(state);
                    return self.run_eager(inputs);
                }
                _ => {}
            }
            if state.entries.len() >= self.options.recompile_limit {
                return self.limit_fallback(state, inputs, &reason);
            }
            tracing::info!(
                target: "minductor::recompiles",
                "Recompiling {}: {reason}",
                self.options.name
            );
            state.stats.recompiles.push(reason);
        }
        for change in state.frame.update(&names, inputs) {
            tracing::info!(target: "minductor::dynamic", "{}: {change}", self.options.name);
        }
        let (run, typing) = self.trace_with_fallbacks(&mut state, inputs, &names)?;
        count_compiles(&mut state.stats, &run.chain);
        let contiguous: Vec<bool> = inputs.iter().map(|t| t.is_contiguous()).collect();
        let guards = Guards::new(&names, &typing.types, &contiguous);
        for line in guards.describe() {
            tracing::info!(target: "minductor::guards", "{}: guard {line}", self.options.name);
        }
        state.entries.push(CacheEntry {
            guards,
            typing,
            root: assemble(run.chain),
        });
        Ok(run.outputs)
    }

    /// A cached path met a break value it has no child for: re-trace `f` with the entry's
    /// types, reusing the segments already run (`env`) and any compiled graph equal to the
    /// one traced. Compiling is a recompile (limit and stance apply); reusing is not.
    #[allow(clippy::too_many_arguments)]
    fn break_miss(
        &self,
        mut state: std::sync::MutexGuard<'_, JitState>,
        stance: Stance,
        index: usize,
        inputs: &[Tensor],
        reason: String,
        children: usize,
        env: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, JitError> {
        let under_limit = children < self.options.recompile_limit;
        let entry = &state.entries[index];
        let resume = Resume {
            candidates: vec![entry.root.clone()],
            prefilled: env,
            allow_compile: stance == Stance::Default && under_limit,
        };
        let typing = entry.typing.clone();
        let run = self.trace_run(
            inputs,
            &typing,
            &self.options.backend,
            self.options.fullgraph,
            resume,
        );
        match run {
            Ok(run) => {
                let compiles = count_compiles(&mut state.stats, &run.chain);
                if compiles > 0 {
                    tracing::info!(
                        target: "minductor::recompiles",
                        "Recompiling {}: {reason}",
                        self.options.name
                    );
                    state.stats.recompiles.push(reason);
                } else {
                    tracing::debug!(
                        target: "minductor::graph_breaks",
                        "{}: re-traced without compiling: {reason}",
                        self.options.name
                    );
                    state.stats.break_retraces += 1;
                }
                if under_limit {
                    merge(&mut state.entries[index].root, assemble(run.chain));
                }
                Ok(run.outputs)
            }
            Err(RunFailure::CompileRefused) => match stance {
                Stance::FailOnRecompile => Err(JitError::RecompileForbidden {
                    function: self.options.name.clone(),
                    reason,
                }),
                Stance::EagerOnRecompile => {
                    state.stats.stance_eager_calls += 1;
                    drop(state);
                    self.run_eager(inputs)
                }
                _ => self.limit_fallback(state, inputs, &reason),
            },
            Err(RunFailure::Error(e)) => Err(e),
            Err(RunFailure::Symbolic(_)) => {
                // The entry's symbolic types held when it was compiled; run this call eagerly.
                drop(state);
                self.run_eager(inputs)
            }
        }
    }

    /// Past the recompile limit: run eagerly, warn once.
    fn limit_fallback(
        &self,
        mut state: std::sync::MutexGuard<'_, JitState>,
        inputs: &[Tensor],
        reason: &str,
    ) -> Result<Vec<Tensor>, JitError> {
        state.stats.limit_fallbacks += 1;
        if !state.warned_limit {
            state.warned_limit = true;
            tracing::warn!(
                target: "minductor::recompiles",
                "{}: recompile limit ({}) reached; calls that miss the cache run eagerly from \
                 now on. Last failure: {reason}",
                self.options.name,
                self.options.recompile_limit
            );
        }
        drop(state);
        self.run_eager(inputs)
    }

    /// Traces with the dynamic policy's types, falling back to static dims when a symbolic
    /// trace or compile fails. Returns the run and the types it used.
    fn trace_with_fallbacks(
        &self,
        state: &mut JitState,
        inputs: &[Tensor],
        names: &[String],
    ) -> Result<(TraceRun, Typing), JitError> {
        for _attempt in 0.. {
            let mut typing = state.frame.typing(names, inputs, self.options.dynamic);
            if _attempt > 8 {
                // Specializations keep coming: give up on symbolic dims for this call.
                typing.types = static_types(inputs);
            }
            let symbolic = is_symbolic(&typing.types);
            match self.trace_run(
                inputs,
                &typing,
                &self.options.backend,
                self.options.fullgraph,
                Resume::fresh(),
            ) {
                Ok(run) => return Ok((run, typing)),
                Err(RunFailure::Symbolic(failure)) if symbolic => {
                    let reason = match failure {
                        SymbolicFailure::Specialized(symbols) => {
                            let mut parts = Vec::new();
                            for (sym, why) in symbols {
                                for &(i, d) in typing.positions.get(&sym).into_iter().flatten() {
                                    state.frame.forced_static.insert((i, d), why.clone());
                                    parts.push(format!(
                                        "input {}, dim {d} (s{sym}): {why}",
                                        names[i]
                                    ));
                                }
                            }
                            format!("specialized {}", parts.join("; "))
                        }
                        SymbolicFailure::Unsupported(why) => {
                            // Compile this call's shape statically; the dims stay dynamic in the
                            // frame state, so a later call tries symbolic again.
                            let reason = format!(
                                "symbolic trace failed ({why}); compiling a static specialization"
                            );
                            tracing::info!(target: "minductor::dynamic", "{}: {reason}", self.options.name);
                            state.stats.dynamic_fallbacks.push(reason);
                            let typing = Typing {
                                types: static_types(inputs),
                                hints: HashMap::new(),
                                positions: HashMap::new(),
                                notes: typing.notes,
                            };
                            return match self.trace_run(
                                inputs,
                                &typing,
                                &self.options.backend,
                                self.options.fullgraph,
                                Resume::fresh(),
                            ) {
                                Ok(run) => Ok((run, typing)),
                                Err(RunFailure::Error(e)) => Err(e),
                                Err(RunFailure::Symbolic(_) | RunFailure::CompileRefused) => {
                                    unreachable!("static types, compiling allowed")
                                }
                            };
                        }
                    };
                    tracing::info!(target: "minductor::dynamic", "{}: {reason}", self.options.name);
                    state.stats.dynamic_fallbacks.push(reason);
                }
                Err(RunFailure::Symbolic(_) | RunFailure::CompileRefused) => {
                    unreachable!("a static trace has no symbols; compiling is allowed")
                }
                Err(RunFailure::Error(e)) => return Err(e),
            }
        }
        unreachable!("the loop only ends by returning")
    }

    /// Runs `f` in tracing mode on `inputs` typed by `typing`, compiling and running each
    /// segment with `backend` as breaks are met.
    fn trace_run(
        &self,
        inputs: &[Tensor],
        typing: &Typing,
        backend: &JitBackend,
        fullgraph: bool,
        resume: Resume,
    ) -> Result<TraceRun, RunFailure> {
        let names = self.names(inputs.len());
        let tracer = Tracer::new();
        let traced: Vec<Traced> = names
            .iter()
            .zip(&typing.types)
            .map(|(name, ty)| tracer.input_typed(name, ty.clone()))
            .collect();
        let recorder = Rc::new(Recorder {
            backend: backend.clone(),
            fullgraph,
            hints: typing.hints.clone(),
            specialized: RefCell::new(Vec::new()),
            unsupported: RefCell::new(None),
            env: RefCell::new(inputs.to_vec()),
            slot_of: RefCell::new(
                (0..inputs.len())
                    .map(|i| (NodeId(i as u32), i))
                    .collect::<HashMap<_, _>>(),
            ),
            segment_start: Cell::new(0),
            chain: RefCell::new(Vec::new()),
            candidates: RefCell::new(resume.candidates),
            prefilled: resume.prefilled,
            allow_compile: resume.allow_compile,
            compile_refused: Cell::new(false),
            function: self.options.name.clone(),
        });
        tracer.set_hooks(recorder.clone());
        let outputs = (self.f)(&traced);
        drop(traced);

        if recorder.compile_refused.get() {
            return Err(RunFailure::CompileRefused);
        }
        let symbolic = is_symbolic(&typing.types);
        let specialized = recorder.specialized.borrow().clone();
        if symbolic && !specialized.is_empty() {
            return Err(RunFailure::Symbolic(SymbolicFailure::Specialized(
                specialized,
            )));
        }
        if let Some(why) = recorder.unsupported.borrow().clone() {
            return Err(RunFailure::Symbolic(SymbolicFailure::Unsupported(why)));
        }
        if let Some(error) = tracer.error() {
            return Err(if symbolic {
                RunFailure::Symbolic(SymbolicFailure::Unsupported(error.to_string()))
            } else {
                RunFailure::Error(JitError::Trace(error))
            });
        }
        let Some(ids) = tracer.ids_of(&outputs) else {
            return Err(RunFailure::Error(JitError::ForeignOutput(
                self.options.name.clone(),
            )));
        };
        drop(outputs);
        let graph = tracer.graph_so_far();
        let mut wanted: Vec<NodeId> = {
            let slot_of = recorder.slot_of.borrow();
            ids.iter()
                .copied()
                .filter(|id| !slot_of.contains_key(id))
                .collect()
        };
        wanted.sort();
        wanted.dedup();
        let (mut segment, reused) = match recorder.run_segment(&graph, &wanted) {
            Ok(s) => s,
            Err(_) if recorder.compile_refused.get() => return Err(RunFailure::CompileRefused),
            Err(m) if symbolic && recorder.unsupported.borrow().is_some() => {
                return Err(RunFailure::Symbolic(SymbolicFailure::Unsupported(m)))
            }
            Err(m) => {
                return Err(RunFailure::Error(JitError::Runtime(
                    RuntimeError::Unsupported(m),
                )))
            }
        };
        let slot_of = recorder.slot_of.borrow();
        let returned: Vec<usize> = ids.iter().map(|id| slot_of[id]).collect();
        let env = recorder.env.borrow();
        let outputs: Vec<Tensor> = returned.iter().map(|&s| env[s].clone()).collect();
        segment.end = SegmentEnd::Return(returned);
        let mut chain = recorder.chain.take();
        chain.push(BuiltSegment {
            segment,
            break_key: None,
            reused,
        });
        Ok(TraceRun { outputs, chain })
    }

    /// Runs `f` eagerly: traced with static dims and interpreted op by op, breaks included.
    fn run_eager(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, JitError> {
        let typing = Typing {
            types: static_types(inputs),
            hints: HashMap::new(),
            positions: HashMap::new(),
            notes: Vec::new(),
        };
        match self.trace_run(
            inputs,
            &typing,
            &JitBackend::Named(Backend::Eager),
            false,
            Resume::fresh(),
        ) {
            Ok(run) => Ok(run.outputs),
            Err(RunFailure::Error(e)) => Err(e),
            Err(RunFailure::Symbolic(_) | RunFailure::CompileRefused) => {
                unreachable!("static types, compiling allowed")
            }
        }
    }

    /// `torch._dynamo.explain`: traces and compiles `f` on `inputs` as a cache miss would (with
    /// this function's dynamic-shape state), without touching the cache, and reports what it
    /// captured. Graph breaks are reported even when `fullgraph` is set.
    pub fn explain(&self, inputs: &[Tensor]) -> Result<crate::explain::Explanation, JitError> {
        let names = self.names(inputs.len());
        let (mut frame, recompiles) = {
            let state = self.lock();
            (state.frame.clone(), state.stats.recompiles.clone())
        };
        let mut notes = frame.update(&names, inputs);
        let typing = frame.typing(&names, inputs, self.options.dynamic);
        let started = Instant::now();
        let (run, typing) = match self.trace_run(
            inputs,
            &typing,
            &self.options.backend,
            false,
            Resume::fresh(),
        ) {
            Ok(run) => (run, typing),
            Err(RunFailure::Error(e)) => return Err(e),
            Err(RunFailure::CompileRefused) => unreachable!("compiling is allowed"),
            Err(RunFailure::Symbolic(failure)) => {
                notes.push(match failure {
                    SymbolicFailure::Specialized(s) => format!(
                        "symbolic trace specialized {}; explained with static dims",
                        s.iter()
                            .map(|(sym, why)| format!("s{sym} ({why})"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    SymbolicFailure::Unsupported(why) => {
                        format!("symbolic trace failed ({why}); explained with static dims")
                    }
                });
                let typing = Typing {
                    types: static_types(inputs),
                    hints: HashMap::new(),
                    positions: HashMap::new(),
                    notes: typing.notes,
                };
                match self.trace_run(
                    inputs,
                    &typing,
                    &self.options.backend,
                    false,
                    Resume::fresh(),
                ) {
                    Ok(run) => (run, typing),
                    Err(RunFailure::Error(e)) => return Err(e),
                    Err(RunFailure::Symbolic(_) | RunFailure::CompileRefused) => {
                        unreachable!("static types, compiling allowed")
                    }
                }
            }
        };
        notes.extend(typing.notes.iter().cloned());
        let contiguous: Vec<bool> = inputs.iter().map(|t| t.is_contiguous()).collect();
        let guards = Guards::new(&names, &typing.types, &contiguous).describe();
        let mut graphs = Vec::new();
        let mut breaks = Vec::new();
        for built in &run.chain {
            let seg = &built.segment;
            if let Some(graph) = &seg.graph {
                if seg.exec.is_some() {
                    graphs.push(crate::explain::GraphReport::new(graph, seg.compile_time));
                }
            }
            if let (SegmentEnd::Break { what, location, .. }, Some(key)) =
                (&seg.end, &built.break_key)
            {
                breaks.push(crate::explain::BreakReport {
                    reason: format!("{what} reads a tensor's value (= {})", format_key(key)),
                    location: location.clone(),
                });
            }
        }
        Ok(crate::explain::Explanation {
            function: self.options.name.clone(),
            backend: self.options.backend.name(),
            graphs,
            breaks,
            guards,
            dynamic: notes,
            recompile_reasons: recompiles,
            total_time: started.elapsed(),
        })
    }
}

impl<F> fmt::Debug for Jit<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jit")
            .field("options", &self.options)
            .finish()
    }
}

/// Adds a traced run's compiles and breaks to `stats`; returns the number of graphs compiled.
fn count_compiles(stats: &mut JitStats, chain: &[BuiltSegment]) -> u64 {
    let mut compiled = 0;
    for built in chain {
        if !built.reused && built.segment.exec.is_some() {
            compiled += 1;
            let symbolic = built
                .segment
                .graph
                .as_ref()
                .is_some_and(|g| g.nodes().iter().any(|n| n.ty.static_sizes().is_none()));
            if symbolic {
                stats.symbolic_compiles += 1;
            }
        }
        if built.break_key.is_some() {
            stats.graph_breaks += 1;
        }
    }
    stats.compiles += compiled;
    compiled
}

/// Links a traced chain of segments into a path: each break's only child is the next segment.
fn assemble(chain: Vec<BuiltSegment>) -> Segment {
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
fn merge(root: &mut Segment, path: Segment) {
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

enum Replay {
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
fn replay(root: &Segment, inputs: &[Tensor]) -> Result<Replay, JitError> {
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
                let key = break_key(&env[*read]);
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
