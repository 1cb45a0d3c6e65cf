//! `explain`, like `torch._dynamo.explain`: what a `jit` function captures on given inputs.
//!
//! The report counts graphs and graph breaks (with reason and source location), lists each
//! graph's ops and compile time, the guards a cache entry would install, what the dynamic-shape
//! policy decided (symbolic dims, sizes 0/1 specialized, static fallbacks) and the function's
//! recompile reasons so far. It prints as a readable report (`Display`). Each graph also lists its
//! fallbacks: prim-graph nodes the compiled code runs with the reference interpreter (op and
//! reason).

use crate::jit::{jit, JitError};
use crate::trace::Traced;
use minductor_ir::{Dim, Graph, Op};
use minductor_runtime::Tensor;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// One captured graph.
#[derive(Clone, Debug)]
pub struct GraphReport {
    /// Ops other than inputs and constants.
    pub ops: usize,
    /// Count per op name, e.g. `{"linear": 1, "relu": 1}`.
    pub op_counts: BTreeMap<String, usize>,
    pub graph: Graph,
    pub compile_time: Duration,
    /// Whether any dim in the graph is symbolic.
    pub symbolic: bool,
    /// The nodes the compiled code runs with the reference interpreter (fallback steps), each
    /// as `%node op because reason` (`%node` numbers the prim graph the backend compiled, which
    /// `Compiled::artifacts().prim_graph` holds, not `graph`); empty when everything is compiled.
    pub fallbacks: Vec<String>,
    /// Each derived size in the graph (a dim that is an expression of input symbols) with the
    /// node that first makes it, e.g. `s0 + 1 (first from cat %5)`, in graph order.
    pub derived_sizes: Vec<String>,
}

/// The derived sizes of `graph` with the node that first makes each (see
/// [`GraphReport::derived_sizes`]).
fn derived_sizes(graph: &Graph) -> Vec<String> {
    let mut seen: Vec<Dim> = Vec::new();
    let mut out = Vec::new();
    for (id, node) in graph.ids().zip(graph.nodes()) {
        for &d in &node.ty.shape {
            if matches!(d, Dim::Sym(s) if s.is_derived()) && !seen.contains(&d) {
                seen.push(d);
                out.push(format!("{d} (first from {} {id})", node.op.name()));
            }
        }
    }
    out
}

impl GraphReport {
    pub(crate) fn new(
        graph: &Graph,
        compile_time: Duration,
        fallbacks: Vec<String>,
    ) -> GraphReport {
        let mut op_counts = BTreeMap::new();
        for node in graph.nodes() {
            if !matches!(node.op, Op::Input { .. } | Op::Constant { .. }) {
                *op_counts.entry(node.op.name()).or_insert(0) += 1;
            }
        }
        GraphReport {
            ops: op_counts.values().sum(),
            op_counts,
            graph: graph.clone(),
            compile_time,
            symbolic: graph.nodes().iter().any(|n| n.ty.static_sizes().is_none()),
            fallbacks,
            derived_sizes: derived_sizes(graph),
        }
    }
}

/// One graph break.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakReport {
    pub reason: String,
    /// `file:line:column` of the `item()`/`to_vec()` call.
    pub location: String,
}

/// What `explain` found.
#[derive(Clone, Debug)]
pub struct Explanation {
    pub function: String,
    pub backend: String,
    pub graphs: Vec<GraphReport>,
    pub breaks: Vec<BreakReport>,
    /// The guards in words, one per line.
    pub guards: Vec<String>,
    /// Dynamic-shape decisions in words.
    pub dynamic: Vec<String>,
    /// The function's recompile reasons so far.
    pub recompile_reasons: Vec<String>,
    /// Tracing, compiling and running all graphs.
    pub total_time: Duration,
}

impl Explanation {
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }
    pub fn graph_break_count(&self) -> usize {
        self.breaks.len()
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "explain `{}` (backend {})", self.function, self.backend)?;
        writeln!(f, "Graph count: {}", self.graphs.len())?;
        writeln!(f, "Graph break count: {}", self.breaks.len())?;
        writeln!(
            f,
            "Op count: {}",
            self.graphs.iter().map(|g| g.ops).sum::<usize>()
        )?;
        if !self.breaks.is_empty() {
            writeln!(f, "Break reasons:")?;
            for (i, b) in self.breaks.iter().enumerate() {
                writeln!(f, "  {}. {} at {}", i + 1, b.reason, b.location)?;
            }
        }
        for (i, g) in self.graphs.iter().enumerate() {
            let counts: Vec<String> = g
                .op_counts
                .iter()
                .map(|(name, n)| format!("{name} x{n}"))
                .collect();
            writeln!(
                f,
                "Graph {i}: {} ops ({}), compiled in {:.3} ms{}",
                g.ops,
                counts.join(", "),
                g.compile_time.as_secs_f64() * 1e3,
                if g.symbolic { ", symbolic" } else { "" }
            )?;
            if g.symbolic {
                // The symbolic shapes of the inputs, e.g. `idx: i64[2, s0]`.
                let shapes: Vec<String> = g
                    .graph
                    .inputs()
                    .iter()
                    .enumerate()
                    .filter(|(_, &id)| g.graph.ty(id).static_sizes().is_none())
                    .map(|(n, &id)| format!("{}: {}", g.graph.input_name(n), g.graph.ty(id)))
                    .collect();
                writeln!(f, "  symbolic shapes: {}", shapes.join(", "))?;
                if !g.derived_sizes.is_empty() {
                    writeln!(f, "  derived sizes: {}", g.derived_sizes.join(", "))?;
                }
            }
            for line in g.graph.to_string().lines() {
                writeln!(f, "    {line}")?;
            }
            if !g.fallbacks.is_empty() {
                writeln!(
                    f,
                    "  Fallbacks ({}, run by the reference interpreter):",
                    g.fallbacks.len()
                )?;
                for fallback in &g.fallbacks {
                    writeln!(f, "    {fallback}")?;
                }
            }
        }
        writeln!(f, "Guards:")?;
        for g in &self.guards {
            writeln!(f, "  {g}")?;
        }
        if !self.dynamic.is_empty() {
            writeln!(f, "Dynamic shapes:")?;
            for d in &self.dynamic {
                writeln!(f, "  {d}")?;
            }
        }
        if !self.recompile_reasons.is_empty() {
            writeln!(f, "Recompiles so far:")?;
            for r in &self.recompile_reasons {
                writeln!(f, "  {r}")?;
            }
        }
        write!(
            f,
            "Total time: {:.3} ms",
            self.total_time.as_secs_f64() * 1e3
        )
    }
}

/// `torch._dynamo.explain(f)(*inputs)` with default options (inductor backend).
pub fn explain<F>(f: F, inputs: &[Tensor]) -> Result<Explanation, JitError>
where
    F: Fn(&[Traced]) -> Vec<Traced>,
{
    jit(f).explain(inputs)
}
