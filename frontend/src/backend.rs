//! Backends for `jit`: the named ones (`eager`, `aot_eager`, `inductor`) and custom backends.
//!
//! A custom backend is what `torch.compile(backend=my_fn)` takes: a function that receives the
//! captured graph and its example input types and returns something callable. It may compile,
//! count ops, analyse memory, or just return the graph's reference execution
//! ([`reference_executable`]).
//!
//! The `eager` backend also runs graphs with symbolic dims: each call binds the symbols to the
//! inputs' sizes, rebuilds the graph with those sizes (`specialize`) and interprets it. The
//! reference interpreter itself needs static shapes, so this binding happens here.

use crate::compile::{Backend, CompileError, Compiled};
use minductor_ir::{Dim, Graph, NodeId, Op, Shape, TensorType};
use minductor_runtime::{check_inputs, interpret, RuntimeError, Tensor};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

/// What a custom backend returns: called with the graph's inputs, returns its outputs.
pub type CompiledFn = Box<dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>, RuntimeError> + Send>;

/// A user backend: `torch.compile(backend=...)` in Rust.
pub trait CustomBackend: Send + Sync {
    /// Shown in logs and `explain`.
    fn name(&self) -> String {
        "custom".to_string()
    }
    /// Compiles one captured graph; `example_inputs` are its input types (dims may be symbolic).
    fn compile(
        &self,
        graph: &Graph,
        example_inputs: &[TensorType],
    ) -> Result<CompiledFn, CompileError>;
}

impl<F> CustomBackend for F
where
    F: Fn(&Graph, &[TensorType]) -> Result<CompiledFn, CompileError> + Send + Sync,
{
    fn compile(
        &self,
        graph: &Graph,
        example_inputs: &[TensorType],
    ) -> Result<CompiledFn, CompileError> {
        self(graph, example_inputs)
    }
}

/// The backend a `jit` function compiles its graphs with.
#[derive(Clone)]
pub enum JitBackend {
    Named(Backend),
    Custom(Arc<dyn CustomBackend>),
}

impl JitBackend {
    /// A custom backend from a trait object or a closure
    /// `Fn(&Graph, &[TensorType]) -> Result<CompiledFn, CompileError>`.
    pub fn custom(backend: impl CustomBackend + 'static) -> JitBackend {
        JitBackend::Custom(Arc::new(backend))
    }

    pub fn name(&self) -> String {
        match self {
            JitBackend::Named(b) => b.name().to_string(),
            JitBackend::Custom(c) => c.name(),
        }
    }
}

impl Default for JitBackend {
    fn default() -> Self {
        JitBackend::Named(Backend::Inductor)
    }
}

impl From<Backend> for JitBackend {
    fn from(b: Backend) -> Self {
        JitBackend::Named(b)
    }
}

impl FromStr for JitBackend {
    type Err = CompileError;
    fn from_str(s: &str) -> Result<Self, CompileError> {
        s.parse::<Backend>().map(JitBackend::Named)
    }
}

impl fmt::Debug for JitBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JitBackend({})", self.name())
    }
}

/// A compiled graph segment as the jit cache holds it.
pub(crate) trait SegmentExec: Send + Sync {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError>;

    /// The nodes this segment runs with the reference interpreter inside compiled code (for
    /// `explain`), as `%node op because reason`.
    fn fallbacks(&self) -> Vec<String> {
        Vec::new()
    }
}

impl SegmentExec for Compiled {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        self.call(inputs)
    }

    fn fallbacks(&self) -> Vec<String> {
        self.fallbacks()
    }
}

struct CustomExec {
    graph: Graph,
    function: Mutex<CompiledFn>,
    /// The backend's name, for errors about what it returned.
    name: String,
}

impl SegmentExec for CustomExec {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        check_inputs(&self.graph, inputs)?;
        let outputs = {
            let mut f = self
                .function
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            f(inputs)?
        };
        check_outputs(&self.name, &self.graph, inputs, &outputs)?;
        Ok(outputs)
    }
}

/// A custom backend's outputs must match the graph's: their count, each dtype and rank, each
/// static dim, and each symbolic dim's size as the inputs bind it. Later segments and the
/// caller index them by position and trust their types.
fn check_outputs(
    backend: &str,
    graph: &Graph,
    inputs: &[Tensor],
    outputs: &[Tensor],
) -> Result<(), RuntimeError> {
    if outputs.len() != graph.outputs().len() {
        return Err(RuntimeError::OutputCount {
            backend: backend.to_string(),
            expected: graph.outputs().len(),
            found: outputs.len(),
        });
    }
    let symbols = input_symbol_sizes(graph, inputs);
    for (index, (&id, tensor)) in graph.outputs().iter().zip(outputs).enumerate() {
        let ty = graph.ty(id);
        let fits = tensor.dtype() == ty.dtype
            && tensor.rank() == ty.rank()
            && ty.shape.iter().zip(tensor.shape()).all(|(d, &n)| match d {
                Dim::Static(m) => *m == n,
                Dim::Sym(s) => s
                    .eval(|x| symbols.get(&x.0).map(|&m| m as i128))
                    .is_none_or(|m| m == n as i128),
            });
        if !fits {
            return Err(RuntimeError::OutputType {
                backend: backend.to_string(),
                index,
                expected: ty.to_string(),
                found: format!("{}{:?}", tensor.dtype(), tensor.shape()),
            });
        }
    }
    Ok(())
}

/// The sizes of the input symbols the inputs' shapes bind: a plain symbol's dim names it, a
/// derived dim `c*s0 + k` (an input carried across a graph break) solves it when no plain dim
/// does. The first size seen wins; `specialize` checks that every dim agrees.
fn input_symbol_sizes(graph: &Graph, inputs: &[Tensor]) -> HashMap<u32, usize> {
    let mut sizes: HashMap<u32, usize> = HashMap::new();
    let dims = || {
        graph
            .inputs()
            .iter()
            .zip(inputs)
            .flat_map(|(&id, t)| graph.ty(id).shape.iter().copied().zip(t.shape().to_vec()))
    };
    for (d, n) in dims() {
        if let Dim::Sym(s) = d {
            if !s.is_derived() {
                sizes.entry(s.0).or_insert(n);
            }
        }
    }
    for (d, n) in dims() {
        if let Some((x, value)) = match d {
            Dim::Sym(s) => s.solve(n),
            Dim::Static(_) => None,
        } {
            sizes.entry(x.0).or_insert(value);
        }
    }
    sizes
}

/// The reference interpreter on a graph whose dims may be symbolic.
struct SymbolicEager(Graph);

impl SegmentExec for SymbolicEager {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        run_reference(&self.0, inputs)
    }
}

fn has_symbolic_dims(graph: &Graph) -> bool {
    graph.nodes().iter().any(|n| n.ty.static_sizes().is_none())
}

/// Runs `graph` on `inputs` with the reference interpreter, binding symbolic dims first.
fn run_reference(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
    if has_symbolic_dims(graph) {
        interpret(&specialize(graph, inputs)?, inputs)
    } else {
        interpret(graph, inputs)
    }
}

/// The graph's reference execution (the interpreter, op by op) as a [`CompiledFn`]: what a custom
/// backend returns when it only inspects the graph. Accepts symbolic dims.
pub fn reference_executable(graph: &Graph) -> CompiledFn {
    let graph = graph.clone();
    Box::new(move |inputs| run_reference(&graph, inputs))
}

/// `graph` with every symbolic dim replaced by the size the matching input has.
pub(crate) fn specialize(graph: &Graph, inputs: &[Tensor]) -> Result<Graph, RuntimeError> {
    check_inputs(graph, inputs)?;
    let sizes = input_symbol_sizes(graph, inputs);
    let size = |d: Dim| d.eval(|x| sizes.get(&x.0).map(|&n| n as i128));
    for (index, (&id, tensor)) in graph.inputs().iter().zip(inputs).enumerate() {
        for (dim, (&d, &n)) in graph.ty(id).shape.iter().zip(tensor.shape()).enumerate() {
            if let Dim::Sym(_) = d {
                if let Some(bound) = size(d).filter(|&b| b != n as i128) {
                    return Err(RuntimeError::Shape {
                        name: graph.input_name(index).to_string(),
                        expected: format!("dim {dim} = {d} = {bound}"),
                        found: tensor.shape().to_vec(),
                    });
                }
            }
        }
    }
    let bind = |shape: &Shape| -> Result<Shape, RuntimeError> {
        shape
            .iter()
            .map(|&d| match d {
                Dim::Static(n) => Ok(Dim::Static(n)),
                Dim::Sym(_) => size(d)
                    .and_then(|n| usize::try_from(n).ok())
                    .map(Dim::Static)
                    .ok_or_else(|| {
                        RuntimeError::Unsupported(format!(
                            "size {d} is not bound by the inputs (or is negative for them)"
                        ))
                    }),
            })
            .collect()
    };
    let mut out = Graph::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.len());
    for node in graph.nodes() {
        let id = match &node.op {
            Op::Input { name } => out.input(
                name.clone(),
                TensorType::new(node.ty.dtype, bind(&node.ty.shape)?),
            ),
            Op::Constant { value } => out.constant(*value, node.ty.dtype),
            op => {
                let op = match op {
                    Op::Reshape { shape } => Op::Reshape {
                        shape: bind(shape)?,
                    },
                    Op::Expand { shape } => Op::Expand {
                        shape: bind(shape)?,
                    },
                    Op::Iota { len, dtype } => Op::Iota {
                        len: bind(&Shape::from_slice(&[*len]))?[0],
                        dtype: *dtype,
                    },
                    other => other.clone(),
                };
                let operands: Vec<NodeId> = node.inputs.iter().map(|i| map[i.index()]).collect();
                out.add(op, &operands)?
            }
        };
        map.push(id);
    }
    out.set_outputs(graph.outputs().iter().map(|o| map[o.index()]).collect());
    Ok(out)
}

/// Compiles one captured graph with `backend`.
pub(crate) fn compile_segment(
    backend: &JitBackend,
    mode: crate::compile::Mode,
    graph: &Graph,
) -> Result<Arc<dyn SegmentExec>, CompileError> {
    match backend {
        JitBackend::Named(Backend::Eager) if has_symbolic_dims(graph) => {
            graph.verify()?;
            Ok(Arc::new(SymbolicEager(graph.clone())))
        }
        JitBackend::Named(named) => Ok(Arc::new(crate::compile::compile_with_options(
            graph,
            crate::compile::CompileOptions {
                backend: *named,
                mode,
                ..Default::default()
            },
        )?)),
        JitBackend::Custom(custom) => {
            graph.verify()?;
            let types: Vec<TensorType> = graph
                .inputs()
                .iter()
                .map(|&i| graph.ty(i).clone())
                .collect();
            let function = custom.compile(graph, &types)?;
            Ok(Arc::new(CustomExec {
                graph: graph.clone(),
                function: Mutex::new(function),
                name: custom.name(),
            }))
        }
    }
}
