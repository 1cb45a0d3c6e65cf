//! Importing `torch.export` programs (`.pt2` archives) and compiling them.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use minductor_frontend::export;
//! let program = export::load("model.pt2")?;
//! println!("{}", program.signature());
//! let compiled = program.compile()?; // weights frozen, inductor
//! # let x = minductor_runtime::Tensor::zeros(minductor_ir::DType::F32, &[4, 32]);
//! let outputs = compiled.call(&[x])?;
//! # Ok(()) }
//! ```
//!
//! - [`load`] reads the archive ([`archive`]: zip, `models/model.json`, raw weights), checks the
//!   schema's major version, and replays the graph's ATen nodes on a tracer ([`import`]). Every
//!   failure is an [`ImportError`]: an op it cannot import names the op, the node and the
//!   node's `stack_trace` from the file.
//! - The [`Signature`] lists the user inputs (names, dtypes, shapes with the program's symbols),
//!   the user outputs, and each symbol's range (`range_constraints`).
//! - [`ExportedProgram::compile`] freezes parameters, buffers and constants into the compiled
//!   program (`compile_frozen`: batch norms fold into convolutions, GEMM operands are packed
//!   once); [`Weights::Inputs`] keeps them as runtime inputs instead. Either way
//!   [`CompiledProgram::call`] takes the user inputs in signature order, checks each symbolic
//!   size against its range (a typed [`CallError`] outside it), and returns the user outputs in
//!   order. One compile serves every size in range.

mod archive;
mod error;
mod expr;
mod import;
mod json;

pub use archive::SUPPORTED_SCHEMA_MAJOR;
pub use error::{CallError, ImportError};
pub use import::{functional_target, is_supported, SUPPORTED_TARGETS};

use crate::compile::{compile_with_options, CompileOptions, Compiled};
use crate::freeze::compile_frozen_with_options;
use import::{Importer, Value};
use json::Json;
use minductor_ir::{Dim, Graph, SymId, TensorType};
use minductor_runtime::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One user input of the program: its name, dtype and shape (dims may be symbolic).
#[derive(Clone, Debug)]
pub struct UserInput {
    pub name: String,
    pub ty: TensorType,
}

/// A symbolic size of the program and the sizes it was exported for.
#[derive(Clone, Debug)]
pub struct SymbolRange {
    /// The program's name for it (`s77`).
    pub name: String,
    /// minductor's symbol (`s0`, ...), as the graph's types print it.
    pub sym: SymId,
    pub min: usize,
    /// `None`: unbounded.
    pub max: Option<usize>,
}

/// What a caller of the program sees.
#[derive(Clone, Debug, Default)]
pub struct Signature {
    /// The user inputs, in the order `call` takes them.
    pub inputs: Vec<UserInput>,
    /// The names of the user outputs, in the order `call` returns them.
    pub outputs: Vec<String>,
    /// Every symbolic size with its range.
    pub symbols: Vec<SymbolRange>,
    /// Outputs of the program that are not user outputs (buffer mutations and the like), which
    /// the compiled program does not return.
    pub dropped_outputs: Vec<String>,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inputs: Vec<String> = self
            .inputs
            .iter()
            .map(|i| format!("{}: {}", i.name, i.ty))
            .collect();
        write!(
            f,
            "({}) -> ({})",
            inputs.join(", "),
            self.outputs.join(", ")
        )?;
        for s in &self.symbols {
            let max = s.max.map_or("inf".to_string(), |m| m.to_string());
            write!(
                f,
                "\n  {} ({}) in {}..={}",
                s.sym_name(),
                s.name,
                s.min,
                max
            )?;
        }
        Ok(())
    }
}

impl SymbolRange {
    /// minductor's spelling of the symbol (`s0`).
    pub fn sym_name(&self) -> String {
        Dim::Sym(self.sym).to_string()
    }
}

/// Whether a weight is a parameter, a buffer or a constant of the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    Parameter,
    Buffer,
    Constant,
}

/// A parameter, buffer or tensor constant, fed to the graph input `input`.
#[derive(Clone, Debug)]
pub struct Weight {
    /// The graph input it feeds (`p_net_0_weight`).
    pub input: String,
    /// The module's name for it (`net.0.weight`).
    pub name: String,
    pub kind: WeightKind,
    pub tensor: Tensor,
}

/// A `.pt2` program imported as a minductor graph.
pub struct ExportedProgram {
    signature: Signature,
    /// Inputs: the user inputs (signature order), then one per weight (`weights` order).
    /// Outputs: the user outputs in order.
    graph: Graph,
    weights: Vec<Weight>,
    /// Every node target of the file with its count.
    ops: BTreeMap<String, usize>,
    schema_version: (i64, i64),
    torch_version: String,
}

/// How weights reach the compiled program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Weights {
    /// Frozen into the program at compile time (the default).
    #[default]
    Frozen,
    /// Kept as runtime inputs, which the compiled program feeds after the user inputs.
    Inputs,
}

/// `compile_with_options`' options.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExportOptions {
    pub compile: CompileOptions,
    pub weights: Weights,
}

/// Reads and imports the `.pt2` archive at `path`.
pub fn load(path: impl AsRef<Path>) -> Result<ExportedProgram, ImportError> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| ImportError::Io {
        path: shown.clone(),
        source,
    })?;
    load_bytes_named(&shown, bytes)
}

/// Imports a `.pt2` archive held in memory.
pub fn load_bytes(bytes: Vec<u8>) -> Result<ExportedProgram, ImportError> {
    load_bytes_named("<bytes>", bytes)
}

/// The node targets of the archive at `path` with their counts and whether each can be
/// imported, without importing (what `minductor pt2 info` lists).
pub fn op_counts(path: impl AsRef<Path>) -> Result<Vec<(String, usize, bool)>, ImportError> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| ImportError::Io {
        path: shown.clone(),
        source,
    })?;
    let archive = archive::read_bytes(&shown, bytes)?;
    let model = Json::new(&archive.model, "model.json");
    let nodes = model.get("graph_module")?.get("graph")?.get("nodes")?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for node in nodes.array()? {
        *counts
            .entry(node.get("target")?.str()?.to_string())
            .or_default() += 1;
    }
    Ok(counts
        .into_iter()
        .map(|(t, n)| {
            let ok = is_supported(&t);
            (t, n, ok)
        })
        .collect())
}

fn load_bytes_named(path: &str, bytes: Vec<u8>) -> Result<ExportedProgram, ImportError> {
    let archive = archive::read_bytes(path, bytes)?;
    let model = Json::new(&archive.model, "model.json");
    let version = model.get("schema_version")?;
    let schema_version = (
        version.get("major")?.int()?,
        version
            .opt("minor")
            .map(|m| m.int())
            .transpose()?
            .unwrap_or(0),
    );
    let torch_version = model
        .opt("torch_version")
        .and_then(|v| v.str().ok().map(str::to_string))
        .unwrap_or_default();
    let module = model.get("graph_module")?;
    let graph_json = module.get("graph")?;
    let signature_json = module.get("signature")?;

    let mut metas = HashMap::new();
    if let Some(values) = graph_json.opt("tensor_values") {
        for (name, meta) in values.object()? {
            metas.insert(name.to_string(), meta);
        }
    }
    let mut importer = Importer::new(metas);

    // The signature: which graph input is what.
    let graph_inputs = graph_json.get("inputs")?.array()?;
    let specs = signature_json.get("input_specs")?.array()?;
    if specs.len() != graph_inputs.len() {
        return Err(signature_json.malformed(format!(
            "{} input specs for {} graph inputs",
            specs.len(),
            graph_inputs.len()
        )));
    }
    let mut user_inputs: Vec<(String, TensorType)> = Vec::new();
    let mut weight_specs: Vec<(String, String, WeightKind)> = Vec::new();
    for spec in &specs {
        let (kind, v) = spec.union()?;
        match kind {
            "user_input" => {
                let (arg_kind, arg) = v.get("arg")?.union()?;
                match arg_kind {
                    "as_tensor" => {
                        let name = arg.get("name")?.str()?.to_string();
                        let ty = importer.meta_type(&name)?.ok_or_else(|| {
                            graph_json
                                .malformed(format!("no tensor_values entry for input `{name}`"))
                        })?;
                        user_inputs.push((name, ty));
                    }
                    "as_none" => {}
                    other => {
                        return Err(ImportError::Unsupported(format!(
                            "a user input of kind `{other}` (only tensor inputs are supported)"
                        )))
                    }
                }
            }
            "parameter" | "buffer" | "tensor_constant" => {
                let input = v.get("arg")?.get("name")?.str()?.to_string();
                let (key, weight_kind) = match kind {
                    "parameter" => ("parameter_name", WeightKind::Parameter),
                    "buffer" => ("buffer_name", WeightKind::Buffer),
                    _ => ("tensor_constant_name", WeightKind::Constant),
                };
                let name = v.get(key)?.str()?.to_string();
                weight_specs.push((input, name, weight_kind));
            }
            "constant_input" => {
                let name = v.get("name")?.str()?.to_string();
                let (k, value) = v.get("value")?.union()?;
                let bound = match k {
                    "as_none" => Value::Missing(format!("`{name}` is None")),
                    "as_int" | "as_float" | "as_bool" => Value::Number(value.float()?),
                    other => Value::Missing(format!("`{name}` is a constant of kind `{other}`")),
                };
                importer.env.insert(name, bound);
            }
            other => {
                return Err(ImportError::Unsupported(format!(
                    "an input of kind `{other}` (custom objects and tokens are not supported)"
                )))
            }
        }
    }

    // Graph inputs: user inputs first, then the weights.
    for (name, ty) in &user_inputs {
        let t = importer.tracer.input_typed(name, ty.clone());
        importer.env.insert(name.clone(), Value::Tensor(t));
    }
    let mut weights = Vec::new();
    for (input, name, kind) in weight_specs {
        let tensor = archive
            .weights
            .get(&name)
            .or_else(|| archive.constants.get(&name))
            .cloned()
            .ok_or_else(|| ImportError::MissingEntry {
                entry: format!("data/weights or data/constants: `{name}`"),
                hint: format!("the graph input `{input}` reads it"),
            })?;
        if let Some(want) = importer.meta_type(&input)? {
            let found = tensor.tensor_type();
            if want != found {
                return Err(ImportError::Malformed {
                    entry: format!("weight `{name}`"),
                    reason: format!("stored as {found}, the graph input `{input}` is {want}"),
                });
            }
        }
        let t = importer
            .tracer
            .input(&input, tensor.dtype(), tensor.shape());
        importer.env.insert(input.clone(), Value::Tensor(t));
        weights.push(Weight {
            input,
            name,
            kind,
            tensor,
        });
    }

    // The nodes.
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    let nodes = graph_json.get("nodes")?.array()?;
    for node in &nodes {
        *ops.entry(node.get("target")?.str()?.to_string())
            .or_default() += 1;
    }
    for node in &nodes {
        importer.node(node)?;
    }

    // The outputs.
    let mut outputs = Vec::new();
    let mut output_names = Vec::new();
    let mut dropped = Vec::new();
    for spec in signature_json.get("output_specs")?.array()? {
        let (kind, v) = spec.union()?;
        let arg = v.get("arg")?;
        let name = match arg.opt("as_tensor") {
            Some(t) => t.get("name")?.str()?.to_string(),
            None => arg
                .opt("name")
                .and_then(|n| n.str().ok().map(str::to_string))
                .unwrap_or_default(),
        };
        if kind != "user_output" {
            dropped.push(format!("{kind}: {name}"));
            continue;
        }
        if arg.opt("as_tensor").is_none() {
            return Err(ImportError::Unsupported(format!(
                "a user output that is not a tensor ({})",
                arg.value
            )));
        }
        let t = match importer.env.get(&name) {
            Some(Value::Tensor(t)) => t.clone(),
            Some(Value::Missing(why)) => {
                return Err(ImportError::Unsupported(format!(
                    "user output `{name}`: {why}"
                )))
            }
            _ => {
                return Err(graph_json.malformed(format!(
                    "user output `{name}` is not a tensor the graph computes"
                )))
            }
        };
        outputs.push(t);
        output_names.push(name);
    }
    let tracer = std::mem::take(&mut importer.tracer);
    let graph = tracer.finish(&outputs).map_err(|e| ImportError::Node {
        op: "output".into(),
        node: "output".into(),
        reason: e.to_string(),
        stack_trace: String::new(),
    })?;

    // Ranges of the symbols.
    let ranges = model.opt("range_constraints");
    let mut symbols = Vec::new();
    for (name, sym) in &importer.symbols {
        let (mut min, mut max) = (0usize, None);
        if let Some(r) = ranges.as_ref().and_then(|r| r.opt(name)) {
            if let Some(v) = r.opt("min_val") {
                min = v.int()?.max(0) as usize;
            }
            if let Some(v) = r.opt("max_val") {
                // PyTorch writes "unbounded" as a huge number.
                let m = v.float()?;
                if m.is_finite() && m < 9.0e15 {
                    max = Some(m.max(0.0) as usize);
                }
            }
        }
        symbols.push(SymbolRange {
            name: name.clone(),
            sym: *sym,
            min,
            max,
        });
    }

    let signature = Signature {
        inputs: user_inputs
            .into_iter()
            .map(|(name, ty)| UserInput { name, ty })
            .collect(),
        outputs: output_names,
        symbols,
        dropped_outputs: dropped,
    };
    Ok(ExportedProgram {
        signature,
        graph,
        weights,
        ops,
        schema_version,
        torch_version,
    })
}

impl ExportedProgram {
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The imported graph: user inputs, then one input per weight; the user outputs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Parameters, buffers and constants, in the order of their graph inputs.
    pub fn weights(&self) -> &[Weight] {
        &self.weights
    }

    /// Every node target of the file (as `model.json` spells it) with its count.
    pub fn ops(&self) -> &BTreeMap<String, usize> {
        &self.ops
    }

    /// `(major, minor)` of the file's schema.
    pub fn schema_version(&self) -> (i64, i64) {
        self.schema_version
    }

    /// The PyTorch that wrote the file.
    pub fn torch_version(&self) -> &str {
        &self.torch_version
    }

    /// Compiles with the inductor backend, weights frozen.
    pub fn compile(&self) -> Result<CompiledProgram, ImportError> {
        self.compile_with_options(ExportOptions::default())
    }

    /// Compiles with `options` (backend, mode, and whether weights are frozen).
    ///
    /// The inductor backend compiles once for every size in range. `eager` and `aot_eager`
    /// interpret, and the interpreter needs static shapes: on a program with symbolic sizes they
    /// build (and keep) one specialization per distinct set of input shapes at call time.
    pub fn compile_with_options(
        &self,
        options: ExportOptions,
    ) -> Result<CompiledProgram, ImportError> {
        let symbolic = self
            .graph
            .nodes()
            .iter()
            .any(|n| n.ty.static_sizes().is_none());
        let engine = if symbolic && options.compile.backend != crate::Backend::Inductor {
            self.graph.verify().map_err(crate::CompileError::from)?;
            Engine::PerSize {
                graph: self.graph.clone(),
                inputs: self.weights.iter().map(|w| w.input.clone()).collect(),
                options,
                cache: Mutex::new(HashMap::new()),
            }
        } else {
            let mut compiled = compile_graph(&self.graph, &self.weights_named(), options)?;
            // The ranges travel with the compiled graph (and its artifact).
            let ranges: Vec<crate::SizeRange> = self
                .signature
                .symbols
                .iter()
                .map(|r| crate::SizeRange {
                    sym: r.sym,
                    min: r.min,
                    max: r.max,
                })
                .collect();
            compiled.set_size_ranges(&ranges);
            Engine::Once(Box::new(compiled))
        };
        Ok(CompiledProgram {
            engine,
            signature: self.signature.clone(),
            weights: self.weights.iter().map(|w| w.tensor.clone()).collect(),
            mode: options.weights,
        })
    }

    fn weights_named(&self) -> Vec<(String, Tensor)> {
        self.weights
            .iter()
            .map(|w| (w.input.clone(), w.tensor.clone()))
            .collect()
    }
}

/// Compiles `graph` with `weights` frozen or kept as inputs.
fn compile_graph(
    graph: &Graph,
    weights: &[(String, Tensor)],
    options: ExportOptions,
) -> Result<Compiled, crate::CompileError> {
    match options.weights {
        Weights::Frozen => {
            let constants: Vec<(&str, Tensor)> = weights
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            compile_frozen_with_options(graph, &constants, options.compile)
        }
        Weights::Inputs => compile_with_options(graph, options.compile),
    }
}

/// How a compiled program runs.
enum Engine {
    /// One compile for every size.
    Once(Box<Compiled>),
    /// The interpreting backends on symbolic sizes: one specialization per input shapes.
    PerSize {
        graph: Graph,
        /// The weights' graph input names.
        inputs: Vec<String>,
        options: ExportOptions,
        cache: Mutex<HashMap<Vec<Vec<usize>>, Arc<Compiled>>>,
    },
}

/// A compiled `.pt2` program.
pub struct CompiledProgram {
    engine: Engine,
    signature: Signature,
    /// The weights, in graph input order.
    weights: Vec<Tensor>,
    /// Whether the compiled code takes the weights after the user inputs.
    mode: Weights,
}

impl CompiledProgram {
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The compiled graph (for its artifacts, fallbacks, timings); `None` for an interpreting
    /// backend on symbolic sizes, which specializes per call.
    pub fn compiled(&self) -> Option<&Compiled> {
        match &self.engine {
            Engine::Once(c) => Some(c),
            Engine::PerSize { .. } => None,
        }
    }

    /// Runs the program on the user inputs (signature order); returns the user outputs.
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, CallError> {
        self.check(inputs)?;
        let with_weights = || {
            let mut all: Vec<Tensor> = inputs.to_vec();
            all.extend(self.weights.iter().cloned());
            all
        };
        match &self.engine {
            Engine::Once(compiled) => match self.mode {
                Weights::Frozen => Ok(compiled.call(inputs)?),
                Weights::Inputs => Ok(compiled.call(&with_weights())?),
            },
            Engine::PerSize {
                graph,
                inputs: names,
                options,
                cache,
            } => {
                let key: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
                let all = with_weights();
                let cached = cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
                    .cloned();
                let compiled = match cached {
                    Some(c) => c,
                    None => {
                        let specialized = crate::backend::specialize(graph, &all)?;
                        let weights: Vec<(String, Tensor)> = names
                            .iter()
                            .cloned()
                            .zip(self.weights.iter().cloned())
                            .collect();
                        let c = Arc::new(compile_graph(&specialized, &weights, *options)?);
                        cache
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key, c.clone());
                        c
                    }
                };
                match self.mode {
                    Weights::Frozen => Ok(compiled.call(inputs)?),
                    Weights::Inputs => Ok(compiled.call(&all)?),
                }
            }
        }
    }

    /// The range guards: each symbolic size of the inputs within its exported range.
    fn check(&self, inputs: &[Tensor]) -> Result<(), CallError> {
        let sig = &self.signature;
        if inputs.len() != sig.inputs.len() {
            return Err(CallError::Arity {
                expected: sig.inputs.len(),
                found: inputs.len(),
                names: sig
                    .inputs
                    .iter()
                    .map(|i| i.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        for (input, tensor) in sig.inputs.iter().zip(inputs) {
            for (d, dim) in input.ty.shape.iter().enumerate() {
                let Dim::Sym(s) = dim else { continue };
                let Some(range) = sig.symbols.iter().find(|r| r.sym == *s) else {
                    continue;
                };
                let Some(&size) = tensor.shape().get(d) else {
                    continue;
                };
                if size < range.min || range.max.is_some_and(|m| size > m) {
                    return Err(CallError::OutOfRange {
                        input: input.name.clone(),
                        dim: d,
                        size,
                        symbol: format!("{} ({})", range.sym_name(), range.name),
                        min: range.min,
                        max: range.max.map_or("inf".into(), |m| m.to_string()),
                    });
                }
            }
        }
        Ok(())
    }
}
