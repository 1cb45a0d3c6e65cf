//! ATen nodes to traced ops: the serialized graph is replayed on a [`Tracer`], node by node, so
//! an imported program decomposes, fuses and freezes like a traced one.
//!
//! Each node is imported by its op's semantics (its schema's argument names, PyTorch's defaults
//! for omitted ones), never by the shapes of one program. After every node the result's shape
//! is compared with the shape PyTorch recorded for it (`tensor_values`): a mismatch is an
//! [`ImportError::Node`] rather than a wrong answer later; where only the dtype differs (type
//! promotion rules the prims do not share), the result is cast to PyTorch's dtype.
//!
//! Sizes: a symbolic size of the program (`s70`, `Add(s70, 1)`) is a [`SizeExpr`] over
//! minductor's input symbols, made into a [`Dim`] (a derived symbol when it is an expression).
//! `sym_size` nodes read a dim, `_operator.add`/`mul`/... compute on sizes. Slices of a symbolic
//! dim keep it symbolic where the IR can say so (bounds from the end, or start to end) and
//! otherwise take a static-length range by `gather` (never by reading a size as a number).
//!
//! Layout: this file walks the nodes and binds their outputs; `args` decodes arguments,
//! `shapes` holds the slicing and promotion helpers the families share, and each op family
//! (`sizes`, `casts`, `creation`, `pointwise`, `reductions`, `views`, `indexing`, `linalg`,
//! `norms`, `pooling`) lists its `TARGETS` and imports them; [`SUPPORTED_TARGETS`] is the
//! families' lists end to end, and `dispatch` hands a node to the family that lists its target.

mod args;
mod casts;
mod creation;
mod indexing;
mod linalg;
mod norms;
mod pointwise;
mod pooling;
mod reductions;
mod shapes;
mod sizes;
mod views;

use super::archive::dtype_of_code;
use super::error::ImportError;
use super::expr;
use super::json::Json;
use crate::trace::{Traced, Tracer};
use minductor_ir::{Dim, Shape, SizeExpr, SymId, TensorType};
use std::collections::HashMap;

/// Every op the importer maps (functional spelling; in-place variants such as `relu_` map to
/// these and rebind their `self` to the result).
pub const SUPPORTED_TARGETS: &[&str] = &concat::<{ total(FAMILIES) }>(FAMILIES);

/// Higher-order ops that only scope their subgraph (`torch.no_grad()`, `autocast` regions); their
/// nodes are imported in place.
const HIGHER_ORDER: &[&str] = &[
    "higher_order.wrap_with_set_grad_enabled",
    "higher_order.wrap_with_autocast",
];

/// The target lists of the op families, in the order `dispatch` tries them.
const FAMILIES: &[&[&str]] = &[
    HIGHER_ORDER,
    sizes::TARGETS,
    casts::TARGETS,
    creation::TARGETS,
    pointwise::TARGETS,
    reductions::TARGETS,
    views::TARGETS,
    indexing::TARGETS,
    linalg::TARGETS,
    norms::TARGETS,
    pooling::TARGETS,
];

/// How many targets the lists hold together.
const fn total(lists: &[&[&str]]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < lists.len() {
        n += lists[i].len();
        i += 1;
    }
    n
}

/// The lists one after the other (a `const` concatenation).
const fn concat<const N: usize>(lists: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut k = 0;
    let mut i = 0;
    while i < lists.len() {
        let mut j = 0;
        while j < lists[i].len() {
            out[k] = lists[i][j];
            k += 1;
            j += 1;
        }
        i += 1;
    }
    out
}

/// Symbols of an expression being parsed are numbered from here (input symbols, never derived)
/// and renamed to the program's symbols after parsing.
const PLACEHOLDER_BASE: u32 = 1 << 30;

/// The functional target of `target` (`torch.ops.aten.relu_.default` → `aten.relu.default`)
/// and whether it was an in-place variant.
pub fn functional_target(target: &str) -> (String, bool) {
    let t = target.strip_prefix("torch.ops.").unwrap_or(target);
    let mut parts: Vec<&str> = t.split('.').collect();
    if parts.len() == 3 {
        let op = parts[1];
        if op.ends_with('_') && !op.starts_with("__") {
            let base = op.trim_end_matches('_').to_string();
            parts[1] = &base;
            return (parts.join("."), true);
        }
    }
    (t.to_string(), false)
}

/// Whether nodes of `target` (as `model.json` spells it) can be imported.
pub fn is_supported(target: &str) -> bool {
    SUPPORTED_TARGETS.contains(&functional_target(target).0.as_str())
}

/// A value of the graph being imported.
#[derive(Clone)]
pub(crate) enum Value {
    Tensor(Traced),
    /// A size (a `SymInt`).
    Size(SizeExpr),
    /// A number bound by the signature (`constant_input`).
    Number(f64),
    /// An output the importer does not compute (`save_mean` of a batch norm, pool indices):
    /// using it is an error that says so.
    Missing(String),
}

/// A tensor operand or a number, as binary ops take them.
enum Operand {
    Tensor(Traced),
    Number(f64),
}

/// The context of the node being imported, for errors.
#[derive(Clone, Default)]
struct NodeContext {
    /// The name of the node's first tensor output, if it has one.
    first_output: Option<String>,
    op: String,
    node: String,
    stack_trace: String,
}

pub(crate) struct Importer<'a> {
    pub tracer: Tracer,
    pub env: HashMap<String, Value>,
    metas: HashMap<String, Json<'a>>,
    /// Symbol names of the program (`s70`) and their minductor symbols, in order of first use.
    pub symbols: Vec<(String, SymId)>,
    context: NodeContext,
}

/// A node's single tensor result.
fn one(t: Traced) -> Result<Vec<Value>, ImportError> {
    Ok(vec![Value::Tensor(t)])
}

fn normalize(dim: i64, rank: usize) -> Option<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    (0..r).contains(&d).then_some(d as usize)
}

fn dims_text(dims: &[Dim]) -> String {
    minductor_ir::shape_string(dims)
}

impl<'a> Importer<'a> {
    pub fn new(metas: HashMap<String, Json<'a>>) -> Importer<'a> {
        Importer {
            tracer: Tracer::new(),
            env: HashMap::new(),
            metas,
            symbols: Vec::new(),
            context: NodeContext::default(),
        }
    }

    /// The minductor symbol of the program's symbol `name`, made on first use.
    pub fn symbol(&mut self, name: &str) -> SymId {
        if let Some((_, s)) = self.symbols.iter().find(|(n, _)| n == name) {
            return *s;
        }
        let s = SymId(self.symbols.len() as u32);
        self.symbols.push((name.to_string(), s));
        s
    }

    /// Parses a size expression of the program.
    pub fn size_expr(&mut self, text: &str) -> Result<SizeExpr, ImportError> {
        let mut names: Vec<String> = Vec::new();
        // Symbols are allocated after parsing so the closure does not borrow `self`.
        let parsed = {
            let mut collect = |n: &str| {
                let i = names.iter().position(|m| m == n).unwrap_or_else(|| {
                    names.push(n.to_string());
                    names.len() - 1
                });
                SymId(PLACEHOLDER_BASE + i as u32)
            };
            expr::parse(text, &mut collect)
        };
        let parsed = parsed.map_err(|reason| ImportError::SizeExpr {
            expr: text.to_string(),
            reason,
        })?;
        if names.is_empty() {
            return Ok(parsed);
        }
        // Rename the placeholder symbols to the program's.
        let ids: Vec<SymId> = names.iter().map(|n| self.symbol(n)).collect();
        let rename = |s: SymId| ids[(s.0 - PLACEHOLDER_BASE) as usize];
        let mut out = SizeExpr::Const(0);
        for (monomial, coefficient) in parsed.terms() {
            let mut term = SizeExpr::Const(coefficient);
            for s in monomial {
                term = term.times(&SizeExpr::symbol(rename(s)));
            }
            out = out.plus(&term);
        }
        Ok(out)
    }

    /// A `SymInt` of the schema (`{"as_int": 3}` or `{"as_expr": {"expr_str": ..}}`).
    pub fn sym_int(&mut self, v: &Json) -> Result<SizeExpr, ImportError> {
        let (kind, inner) = v.union()?;
        match kind {
            "as_int" => Ok(SizeExpr::Const(inner.int()?)),
            "as_expr" => {
                let text = inner.get("expr_str")?.str()?;
                self.size_expr(text)
            }
            other => Err(v.malformed(format!("unknown SymInt kind `{other}`"))),
        }
    }

    /// The type PyTorch recorded for tensor `name`.
    pub fn meta_type(&mut self, name: &str) -> Result<Option<TensorType>, ImportError> {
        let Some(meta) = self.metas.get(name).cloned() else {
            return Ok(None);
        };
        let dtype = dtype_of_code(meta.get("dtype")?.int()?, name)?;
        let mut shape = Shape::new();
        for size in meta.get("sizes")?.array()? {
            let e = self.sym_int(&size)?;
            let dim = Dim::of_expr(&e).ok_or_else(|| ImportError::SizeExpr {
                expr: e.to_string(),
                reason: format!("the size of `{name}` is negative"),
            })?;
            shape.push(dim);
        }
        Ok(Some(TensorType::new(dtype, shape)))
    }

    fn error(&self, reason: impl Into<String>) -> ImportError {
        ImportError::Node {
            op: self.context.op.clone(),
            node: self.context.node.clone(),
            reason: reason.into(),
            stack_trace: self.context.stack_trace.clone(),
        }
    }

    /// Imports one node of the serialized graph.
    pub fn node(&mut self, node: &Json<'a>) -> Result<(), ImportError> {
        let target = node.get("target")?.str()?.to_string();
        let outputs = node.get("outputs")?.array()?;
        let name = match node.opt("name") {
            Some(n) => n.str()?.to_string(),
            None => outputs
                .first()
                .and_then(|o| o.union().ok())
                .and_then(|(_, v)| v.opt("name").and_then(|n| n.str().ok().map(str::to_string)))
                .unwrap_or_else(|| target.clone()),
        };
        let stack_trace = node
            .opt("metadata")
            .and_then(|m| m.opt("stack_trace"))
            .and_then(|s| s.str().ok().map(str::to_string))
            .unwrap_or_default();
        let first_output = outputs.first().and_then(|o| match o.union() {
            Ok(("as_tensor", v)) => v.opt("name").and_then(|n| n.str().ok().map(str::to_string)),
            _ => None,
        });
        self.context = NodeContext {
            first_output,
            op: target.clone(),
            node: name.clone(),
            stack_trace: stack_trace.clone(),
        };
        let (functional, in_place) = functional_target(&target);
        if !SUPPORTED_TARGETS.contains(&functional.as_str()) {
            return Err(ImportError::UnsupportedOp {
                op: target,
                node: name,
                stack_trace,
            });
        }
        let mut args: Vec<(String, Json<'a>)> = Vec::new();
        for input in node.get("inputs")?.array()? {
            let arg_name = input.get("name")?.str()?.to_string();
            args.push((arg_name, input.get("arg")?));
        }
        let args = Args { items: args };
        let values = if functional.starts_with("higher_order.") {
            self.inline_subgraph(&args)?
        } else {
            self.dispatch(&functional, &args)?
        };
        if let Some(e) = self.tracer.error() {
            return Err(self.error(e.error.to_string()));
        }
        // An in-place op's `self` names its result from here on.
        if in_place {
            if let (Some(Value::Tensor(t)), Some(self_arg)) = (values.first(), args.find("self")) {
                if let Ok(("as_tensor", v)) = self_arg.union() {
                    let target_name = v.get("name")?.str()?.to_string();
                    self.env.insert(target_name, Value::Tensor(t.clone()));
                }
            }
        }
        self.bind_outputs(&outputs, values)
    }

    /// A scoping higher-order op: its subgraph's nodes imported in place, on its operands (the
    /// arguments after the graph). Names inside the subgraph do not leak out.
    fn inline_subgraph(&mut self, args: &Args<'a>) -> Result<Vec<Value>, ImportError> {
        let position = args
            .items
            .iter()
            .position(|(_, v)| matches!(v.union(), Ok(("as_graph", _))))
            .ok_or_else(|| self.error("a higher-order op without a subgraph"))?;
        let graph = args.items[position].1.union()?.1.get("graph")?;
        let operands: Vec<Value> = args.items[position + 1..]
            .iter()
            .map(|(_, v)| self.arg_value(v))
            .collect::<Result<_, _>>()?;
        let inputs = graph.get("inputs")?.array()?;
        if inputs.len() != operands.len() {
            return Err(self.error(format!(
                "the subgraph takes {} inputs, the op passes {}",
                inputs.len(),
                operands.len()
            )));
        }
        let outer = self.env.clone();
        let context = self.context.clone();
        for (input, value) in inputs.iter().zip(operands) {
            let (_, v) = input.union()?;
            let name = match v.opt("name") {
                Some(n) => n.str()?.to_string(),
                None => match v.union() {
                    Ok(("as_name", n)) => n.str()?.to_string(),
                    _ => continue,
                },
            };
            self.env.insert(name, value);
        }
        if let Some(values) = graph.opt("tensor_values") {
            for (name, meta) in values.object()? {
                self.metas.insert(name.to_string(), meta);
            }
        }
        for node in graph.get("nodes")?.array()? {
            self.node(&node)?;
        }
        self.context = context;
        let mut results = Vec::new();
        for out in graph.get("outputs")?.array()? {
            results.push(self.arg_value(&out)?);
        }
        self.env = outer;
        Ok(results)
    }

    /// The value an argument stands for (a tensor, a size or a number).
    fn arg_value(&self, v: &Json) -> Result<Value, ImportError> {
        let (kind, inner) = v.union()?;
        match kind {
            "as_tensor" => Ok(Value::Tensor(self.tensor_named(inner.get("name")?.str()?)?)),
            "as_sym_int" | "as_int" => Ok(Value::Size(self.size(v)?)),
            "as_float" | "as_bool" => Ok(Value::Number(inner.float()?)),
            "as_none" => Ok(Value::Missing("None".into())),
            other => Err(self.error(format!("a subgraph operand of kind `{other}`"))),
        }
    }

    fn bind_outputs(
        &mut self,
        outputs: &[Json<'a>],
        values: Vec<Value>,
    ) -> Result<(), ImportError> {
        let mut values = values.into_iter();
        let mut next = |what: &str| {
            values.next().unwrap_or_else(|| {
                Value::Missing(format!("`{what}` is not computed by the importer"))
            })
        };
        for out in outputs {
            let (kind, v) = out.union()?;
            match kind {
                "as_tensor" => {
                    let name = v.get("name")?.str()?.to_string();
                    let value = next(&name);
                    self.bind_tensor(name, value)?;
                }
                "as_tensors" | "as_optional_tensors" => {
                    for item in v.array()? {
                        let inner = if kind == "as_tensors" {
                            Some(item.clone())
                        } else {
                            match item.union()? {
                                ("as_tensor", t) => Some(t),
                                _ => None,
                            }
                        };
                        match inner {
                            Some(t) => {
                                let name = t.get("name")?.str()?.to_string();
                                let value = next(&name);
                                self.bind_tensor(name, value)?;
                            }
                            None => {
                                next("none");
                            }
                        }
                    }
                }
                "as_sym_int" => {
                    let (k, n) = v.union()?;
                    let value = next("size");
                    if k == "as_name" {
                        self.env.insert(n.str()?.to_string(), value);
                    }
                }
                _ => {
                    next(kind);
                }
            }
        }
        Ok(())
    }

    /// Binds tensor output `name`, checked against the type PyTorch recorded.
    fn bind_tensor(&mut self, name: String, value: Value) -> Result<(), ImportError> {
        let Value::Tensor(t) = value else {
            self.env.insert(name, value);
            return Ok(());
        };
        // A size expression the IR cannot hold only skips the check.
        let want = self.meta_type(&name).ok().flatten();
        let t = match (want, t.ty()) {
            (Some(want), Some(got)) => {
                if want.shape != got.shape {
                    return Err(self.error(format!(
                        "the imported `{name}` is {got}, the program says {want}",
                    )));
                }
                if want.dtype != got.dtype {
                    t.cast(want.dtype)
                } else {
                    t
                }
            }
            _ => t,
        };
        self.env.insert(name, Value::Tensor(t));
        Ok(())
    }

    // ---- the op table ------------------------------------------------------------------------

    fn dispatch(&mut self, op: &str, args: &Args<'a>) -> Result<Vec<Value>, ImportError> {
        if sizes::TARGETS.contains(&op) {
            self.import_size_op(op, args)
        } else if casts::TARGETS.contains(&op) {
            self.import_cast(op, args)
        } else if creation::TARGETS.contains(&op) {
            self.import_creation(op, args)
        } else if pointwise::TARGETS.contains(&op) {
            self.import_pointwise(op, args)
        } else if reductions::TARGETS.contains(&op) {
            self.import_reduction(op, args)
        } else if views::TARGETS.contains(&op) {
            self.import_view(op, args)
        } else if indexing::TARGETS.contains(&op) {
            self.import_indexing(op, args)
        } else if linalg::TARGETS.contains(&op) {
            self.import_linalg(op, args)
        } else if norms::TARGETS.contains(&op) {
            self.import_norm(op, args)
        } else if pooling::TARGETS.contains(&op) {
            self.import_pool(op, args)
        } else {
            Err(self.no_rule(op))
        }
    }

    /// The error for a target listed as supported that its family has no arm for.
    fn no_rule(&self, op: &str) -> ImportError {
        self.error(format!(
            "`{op}` is listed as supported but has no import rule (an importer bug)"
        ))
    }
}

/// A node's named arguments.
pub(crate) struct Args<'a> {
    items: Vec<(String, Json<'a>)>,
}

impl<'a> Args<'a> {
    fn find(&self, key: &str) -> Option<Json<'a>> {
        self.items
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn get(&self, importer: &Importer, key: &str) -> Result<Json<'a>, ImportError> {
        self.find(key)
            .ok_or_else(|| importer.error(format!("argument `{key}` is missing")))
    }
}

#[cfg(test)]
mod tests {
    use super::SUPPORTED_TARGETS;

    /// A target in two families would be imported by the first one only.
    #[test]
    fn each_target_has_one_family() {
        let mut seen = std::collections::HashSet::new();
        for t in SUPPORTED_TARGETS {
            assert!(seen.insert(*t), "`{t}` is listed twice");
        }
        assert!(SUPPORTED_TARGETS.contains(&"aten.convolution.default"));
    }
}
