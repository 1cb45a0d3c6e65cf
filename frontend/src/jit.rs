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
//! `eager_then_compile` runs the first miss of each input signature eagerly and compiles on the
//! second. [`Jit::disable`] marks one function never to be compiled (`torch.compiler.disable`):
//! it always runs in that eager mode.
//!
//! **What differs from Dynamo.** Guards see only the inputs' metadata: a closure that reads
//! captured state (a `Cell`, a global) is not guarded, as Dynamo would guard a global. A break
//! value keys its children by exact value, where Dynamo with symbolic floats would guard the
//! branch condition; we cannot see the condition in Rust code, so a new value costs a re-trace
//! (microseconds) instead of a guard check. Strides are guarded as contiguous or not, not stride
//! by stride. A result size that is an expression of the input symbols is a *derived* symbol
//! (`s0 + 1` of a cat with a KV cache, `2*s0` of a flatten, `s0 - 1` of `x[:, 1:]`, `s0 + 2` of a
//! pad: polynomials with integer coefficients, `SymId::derive`); one that would need division
//! (`s0 // 2`, a reshape `-1` that does not divide the element count exactly) specializes.
//! A `jit` function calling itself from inside `f` deadlocks (its cache is locked during a call).

use crate::backend::JitBackend;
use crate::compile::{Backend, CompileError};
use crate::dynamic::{is_symbolic, static_types, FrameState, Typing};
use crate::graph_break::{
    assemble, format_key, merge, replay, BuiltSegment, Recorder, Replay, Resume, Segment,
    SegmentEnd, SegmentError, SymbolicFailure, TraceRun,
};
use crate::guards::Guards;
use crate::stance::{current_stance, Stance};
use crate::trace::{TraceError, Traced, Tracer};
use minductor_ir::NodeId;
use minductor_runtime::{RuntimeError, Tensor};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
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
    /// Never compile: every call runs eagerly (`torch.compiler.disable`; see [`Jit::disable`]).
    pub disabled: bool,
    /// The compile mode of every graph (`torch.compile(mode=...)`; see [`crate::Mode`]). With
    /// `reduce-overhead`, a cache hit's compiled code skips the graph-level input check the
    /// guards have just proved.
    pub mode: crate::compile::Mode,
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
            disabled: false,
            mode: crate::compile::Mode::Default,
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
    /// Calls run eagerly because of the stance (`force_eager`, `eager_on_recompile`,
    /// `eager_then_compile`).
    pub stance_eager_calls: u64,
    /// Calls run eagerly because the function is disabled ([`Jit::disable`]).
    pub disabled_calls: u64,
    /// New break values whose path re-traced `f` but compiled nothing (every graph on it was
    /// already compiled for another value).
    pub break_retraces: u64,
    /// Symbolic traces that fell back to a static specialization, with the reason.
    pub dynamic_fallbacks: Vec<String>,
}

impl JitStats {
    /// Calls run eagerly for any reason.
    pub fn eager_fallbacks(&self) -> u64 {
        self.limit_fallbacks + self.stance_eager_calls + self.disabled_calls
    }
}

/// A function compiled on demand; see the module doc.
pub struct Jit<F> {
    f: F,
    options: JitOptions,
    state: Mutex<JitState>,
    /// `JitStats::cache_hits`, counted after the cached code ran without taking the lock
    /// again.
    cache_hits: std::sync::atomic::AtomicU64,
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
        cache_hits: std::sync::atomic::AtomicU64::new(0),
    }
}

#[derive(Default)]
struct JitState {
    entries: Vec<CacheEntry>,
    frame: FrameState,
    stats: JitStats,
    warned_limit: bool,
    /// Input signatures (each input's dtype and shape) a cache miss already ran eagerly under
    /// `eager_then_compile`: the next miss with one of them compiles.
    eager_signatures: std::collections::HashSet<Vec<(minductor_ir::DType, Vec<usize>)>>,
}

struct CacheEntry {
    guards: Guards,
    /// How the inputs were typed: re-traces after a new break value use the same types.
    typing: Typing,
    /// Shared with the calls replaying it, which run without the state's lock; a new path is
    /// merged into a copy when a call still holds the old tree (`Arc::make_mut`).
    root: Arc<Segment>,
}

/// One compiled graph of a traced path and what follows it.
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
    /// The compile mode of every graph it compiles (`"reduce-overhead".parse()?`, …).
    pub fn mode(mut self, mode: crate::compile::Mode) -> Self {
        self.options.mode = mode;
        self
    }
    /// The function's name in logs.
    pub fn name(mut self, name: &str) -> Self {
        self.options.name = name.to_string();
        self
    }
    /// Never compiles this function, like `torch.compiler.disable`: every call traces `f` with
    /// static shapes and runs it eagerly (op by op, with the reference interpreter), whatever
    /// the stance; no cache entry, guard or compile is ever made. Counted in
    /// [`JitStats::disabled_calls`]. (A region inside a jitted function cannot be disabled on
    /// its own: a closure over traced values has no boundary the tracer could break at other
    /// than `item()`/`to_vec()`; make the region a separate disabled function and call it on the
    /// values the first one returns.)
    pub fn disable(mut self) -> Self {
        self.options.disabled = true;
        self
    }

    pub fn options(&self) -> &JitOptions {
        &self.options
    }

    /// A copy of the counters.
    pub fn stats(&self) -> JitStats {
        let mut stats = self.lock().stats.clone();
        stats.cache_hits = self.cache_hits.load(std::sync::atomic::Ordering::Relaxed);
        stats
    }

    /// Drops every cache entry, the frame state and the counters (`torch._dynamo.reset()`).
    pub fn reset(&self) {
        let mut state = self.lock();
        *state = JitState::default();
        self.cache_hits
            .store(0, std::sync::atomic::Ordering::Relaxed);
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
        loop {
            if let Some(outputs) = self.call_once(inputs)? {
                return Ok(outputs);
            }
        }
    }

    /// One attempt at [`Jit::call`]; `None` when the cache entry a replay ran changed before
    /// its miss could be handled (another call merged a path into it), so the call starts over.
    ///
    /// The state's lock is held to pick an entry and to handle a miss (tracing and compiling
    /// run under it), not while the cached code runs: calls from several threads that hit the
    /// cache run at once.
    fn call_once(&self, inputs: &[Tensor]) -> Result<Option<Vec<Tensor>>, JitError> {
        let stance = current_stance();
        let mut state = self.lock();
        state.stats.calls += 1;
        if self.options.disabled {
            state.stats.disabled_calls += 1;
            drop(state);
            return self.run_eager(inputs).map(Some);
        }
        if stance == Stance::ForceEager {
            state.stats.stance_eager_calls += 1;
            drop(state);
            return self.run_eager(inputs).map(Some);
        }

        // The hit path: guards, then the cached segments, run without the lock.
        let hit = (0..state.entries.len())
            .rev()
            .find(|&index| state.entries[index].guards.check(inputs))
            .map(|index| (index, state.entries[index].root.clone()));
        if let Some((index, root)) = hit {
            drop(state);
            return match replay(&root, inputs)? {
                Replay::Hit(outputs) => {
                    self.cache_hits
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok(Some(outputs))
                }
                Replay::NewBreakValue {
                    reason,
                    children,
                    env,
                } => {
                    let mut state = self.lock();
                    let unchanged = state
                        .entries
                        .get(index)
                        .is_some_and(|entry| Arc::ptr_eq(&entry.root, &root));
                    if !unchanged {
                        // Counted again when the call starts over.
                        state.stats.calls -= 1;
                        return Ok(None);
                    }
                    drop(root);
                    self.break_miss(state, stance, index, inputs, reason, children, env)
                        .map(Some)
                }
            };
        }
        self.miss(state, stance, inputs).map(Some)
    }

    /// A call no cache entry's guards admit: runs eagerly, refuses, or traces and compiles a
    /// new entry, per stance and recompile limit.
    fn miss(
        &self,
        mut state: std::sync::MutexGuard<'_, JitState>,
        stance: Stance,
        inputs: &[Tensor],
    ) -> Result<Vec<Tensor>, JitError> {
        // No guard set holds.
        let names = self.names(inputs.len());
        if stance == Stance::EagerThenCompile {
            let signature: Vec<(minductor_ir::DType, Vec<usize>)> = inputs
                .iter()
                .map(|t| (t.dtype(), t.shape().to_vec()))
                .collect();
            if state.eager_signatures.insert(signature) {
                // Seen once, eagerly: its sizes count for the dynamic-shape policy as a
                // compile's would, so the compile that follows knows which dims vary.
                for change in state.frame.update(&names, inputs) {
                    tracing::info!(target: "minductor::dynamic", "{}: {change}", self.options.name);
                }
                tracing::debug!(
                    target: "minductor::recompiles",
                    "{}: eager_then_compile: first call with these input types runs eagerly",
                    self.options.name
                );
                state.stats.stance_eager_calls += 1;
                drop(state);
                return self.run_eager(inputs);
            }
        }
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
            root: Arc::new(assemble(run.chain)),
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
            candidates: vec![(*entry.root).clone()],
            prefilled: env,
            allow_compile: matches!(stance, Stance::Default | Stance::EagerThenCompile)
                && under_limit,
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
                    merge(
                        Arc::make_mut(&mut state.entries[index].root),
                        assemble(run.chain),
                    );
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
            mode: self.options.mode,
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
            failed: RefCell::new(None),
            function: self.options.name.clone(),
        });
        tracer.set_hooks(recorder.clone());
        let outputs = (self.f)(&traced);
        drop(traced);

        if recorder.compile_refused.get() {
            return Err(RunFailure::CompileRefused);
        }
        if let Some(error) = recorder.failed.take() {
            // A break's run failed (out of memory, say): the call's error, not the trace's.
            return Err(RunFailure::Error(JitError::Runtime(error)));
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
        if let Some(error) = tracer.foreign_error(&outputs) {
            return Err(RunFailure::Error(JitError::Trace(error)));
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
            Err(SegmentError::Runtime(e)) => return Err(RunFailure::Error(JitError::Runtime(e))),
            Err(m) if symbolic && recorder.unsupported.borrow().is_some() => {
                return Err(RunFailure::Symbolic(SymbolicFailure::Unsupported(
                    m.to_string(),
                )))
            }
            Err(m) => {
                return Err(RunFailure::Error(JitError::Runtime(
                    RuntimeError::Unsupported(m.to_string()),
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
                if let Some(exec) = &seg.exec {
                    let mut report =
                        crate::explain::GraphReport::new(graph, seg.compile_time, exec.fallbacks());
                    report.pass_times = exec.pass_times();
                    graphs.push(report);
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
