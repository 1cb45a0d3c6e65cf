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

use super::archive::dtype_of_code;
use super::error::ImportError;
use super::expr;
use super::json::Json;
use crate::conv::Window;
use crate::trace::{Traced, Tracer};
use crate::{ConvOptions, PoolOptions};
use minductor_ir::{DType, Dim, Op, Shape, SizeExpr, SliceFrom, SymId, TensorType};
use std::collections::HashMap;

/// Every op the importer maps (functional spelling; in-place variants such as `relu_` map to
/// these and rebind their `self` to the result).
pub const SUPPORTED_TARGETS: &[&str] = &[
    // sizes and assertions
    "aten.sym_size.int",
    "aten.sym_numel.default",
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten._assert_async.msg",
    "aten.sym_constrain_range.default",
    "aten.sym_constrain_range_for_size.default",
    "_operator.add",
    "_operator.sub",
    "_operator.mul",
    "_operator.floordiv",
    "_operator.neg",
    "_operator.eq",
    "_operator.ne",
    "_operator.lt",
    "_operator.le",
    "_operator.gt",
    "_operator.ge",
    // higher-order ops that only scope their subgraph (`torch.no_grad()`, `autocast` regions)
    "higher_order.wrap_with_set_grad_enabled",
    "higher_order.wrap_with_autocast",
    // identities and casts
    "aten.alias.default",
    "aten.clone.default",
    "aten.contiguous.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.dropout.default",
    "aten.native_dropout.default",
    "aten.feature_dropout.default",
    "aten._to_copy.default",
    "aten.to.dtype",
    "aten.to.dtype_layout",
    "aten.to.device",
    "aten.to.other",
    "aten.type_as.default",
    "aten.copy.default",
    // creation
    "aten.arange.default",
    "aten.arange.start",
    "aten.arange.start_step",
    "aten.full.default",
    "aten.full_like.default",
    "aten.zeros.default",
    "aten.ones.default",
    "aten.empty.memory_format",
    "aten.zeros_like.default",
    "aten.ones_like.default",
    "aten.empty_like.default",
    "aten.new_ones.default",
    "aten.new_zeros.default",
    "aten.new_full.default",
    "aten.new_empty.default",
    "aten.scalar_tensor.default",
    "aten.fill.Scalar",
    "aten.zero.default",
    // pointwise unary
    "aten.abs.default",
    "aten.neg.default",
    "aten.exp.default",
    "aten.exp2.default",
    "aten.expm1.default",
    "aten.log.default",
    "aten.log1p.default",
    "aten.log2.default",
    "aten.log10.default",
    "aten.sqrt.default",
    "aten.rsqrt.default",
    "aten.sin.default",
    "aten.cos.default",
    "aten.tan.default",
    "aten.sinh.default",
    "aten.cosh.default",
    "aten.tanh.default",
    "aten.erf.default",
    "aten.sigmoid.default",
    "aten.reciprocal.default",
    "aten.square.default",
    "aten.sign.default",
    "aten.trunc.default",
    "aten.floor.default",
    "aten.ceil.default",
    "aten.isnan.default",
    "aten.isinf.default",
    "aten.logical_not.default",
    "aten.bitwise_not.default",
    "aten.relu.default",
    "aten.relu6.default",
    "aten.silu.default",
    "aten.gelu.default",
    "aten.mish.default",
    "aten.hardtanh.default",
    "aten.hardsigmoid.default",
    "aten.hardswish.default",
    "aten.leaky_relu.default",
    "aten.elu.default",
    "aten.softplus.default",
    "aten.clamp.default",
    "aten.clamp.Tensor",
    "aten.clamp_min.default",
    "aten.clamp_max.default",
    "aten.pow.Tensor_Scalar",
    "aten.pow.Tensor_Tensor",
    "aten.pow.Scalar",
    // pointwise binary
    "aten.add.Tensor",
    "aten.add.Scalar",
    "aten.sub.Tensor",
    "aten.sub.Scalar",
    "aten.rsub.Scalar",
    "aten.rsub.Tensor",
    "aten.mul.Tensor",
    "aten.mul.Scalar",
    "aten.div.Tensor",
    "aten.div.Scalar",
    "aten.div.Tensor_mode",
    "aten.remainder.Tensor",
    "aten.remainder.Scalar",
    "aten.maximum.default",
    "aten.minimum.default",
    "aten.eq.Tensor",
    "aten.eq.Scalar",
    "aten.ne.Tensor",
    "aten.ne.Scalar",
    "aten.lt.Tensor",
    "aten.lt.Scalar",
    "aten.le.Tensor",
    "aten.le.Scalar",
    "aten.gt.Tensor",
    "aten.gt.Scalar",
    "aten.ge.Tensor",
    "aten.ge.Scalar",
    "aten.logical_and.default",
    "aten.logical_or.default",
    "aten.logical_xor.default",
    "aten.bitwise_and.Tensor",
    "aten.bitwise_or.Tensor",
    "aten.bitwise_xor.Tensor",
    "aten.__and__.Tensor",
    "aten.__or__.Tensor",
    "aten.where.self",
    "aten.where.ScalarSelf",
    "aten.where.ScalarOther",
    "aten.where.Scalar",
    "aten.masked_fill.Scalar",
    "aten.masked_fill.Tensor",
    // reductions and scans
    "aten.sum.dim_IntList",
    "aten.sum.default",
    "aten.mean.dim",
    "aten.mean.default",
    "aten.amax.default",
    "aten.amin.default",
    "aten.max.dim",
    "aten.min.dim",
    "aten.max.default",
    "aten.min.default",
    "aten.argmax.default",
    "aten.argmin.default",
    "aten.any.dim",
    "aten.any.dims",
    "aten.any.default",
    "aten.all.dim",
    "aten.all.default",
    "aten.var.correction",
    "aten.var.dim",
    "aten.std.correction",
    "aten.std.dim",
    "aten.logsumexp.default",
    "aten.var_mean.correction",
    "aten.std_mean.correction",
    "aten.linalg_vector_norm.default",
    "aten.cumsum.default",
    "aten._softmax.default",
    "aten.softmax.int",
    "aten._safe_softmax.default",
    "aten._log_softmax.default",
    "aten.log_softmax.int",
    // shapes and data movement
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    "aten.expand.default",
    "aten.permute.default",
    "aten.transpose.int",
    "aten.t.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze.default",
    "aten.flatten.using_ints",
    "aten.unflatten.int",
    "aten.slice.Tensor",
    "aten.select.int",
    "aten.narrow.default",
    "aten.split.Tensor",
    "aten.split_with_sizes.default",
    "aten.chunk.default",
    "aten.unbind.int",
    "aten.cat.default",
    "aten.stack.default",
    "aten.repeat.default",
    "aten.index.Tensor",
    "aten.index_select.default",
    "aten.gather.default",
    "aten.embedding.default",
    "aten.constant_pad_nd.default",
    "aten.tril.default",
    "aten.triu.default",
    "aten.diff.default",
    "aten.roll.default",
    "aten.upsample_nearest2d.default",
    "aten.upsample_nearest2d.vec",
    // matrix products and layers
    "aten.linear.default",
    "aten.addmm.default",
    "aten.mm.default",
    "aten.bmm.default",
    "aten.matmul.default",
    "aten.baddbmm.default",
    "aten.conv1d.default",
    "aten.conv2d.default",
    "aten.convolution.default",
    "aten.batch_norm.default",
    "aten.native_batch_norm.default",
    "aten._native_batch_norm_legit_no_training.default",
    "aten.layer_norm.default",
    "aten.native_layer_norm.default",
    "aten.group_norm.default",
    "aten.native_group_norm.default",
    "aten.max_pool2d.default",
    "aten.max_pool2d_with_indices.default",
    "aten.avg_pool2d.default",
    "aten.adaptive_avg_pool2d.default",
    "aten._adaptive_avg_pool2d.default",
    "aten.scaled_dot_product_attention.default",
];

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

    // ---- argument decoding -------------------------------------------------------------------

    fn value_of(&self, name: &str) -> Result<Value, ImportError> {
        self.env
            .get(name)
            .cloned()
            .ok_or_else(|| self.error(format!("reads `{name}`, which no earlier node defines")))
    }

    fn tensor_named(&self, name: &str) -> Result<Traced, ImportError> {
        match self.value_of(name)? {
            Value::Tensor(t) => Ok(t),
            Value::Missing(why) => Err(self.error(format!("reads `{name}`: {why}"))),
            _ => Err(self.error(format!("`{name}` is not a tensor"))),
        }
    }

    fn tensor(&self, args: &Args<'a>, key: &str) -> Result<Traced, ImportError> {
        self.opt_tensor(args, key)?
            .ok_or_else(|| self.error(format!("argument `{key}` is missing")))
    }

    fn opt_tensor(&self, args: &Args<'a>, key: &str) -> Result<Option<Traced>, ImportError> {
        let Some(arg) = args.find(key) else {
            return Ok(None);
        };
        let (kind, v) = arg.union()?;
        match kind {
            "as_none" => Ok(None),
            "as_tensor" => Ok(Some(self.tensor_named(v.get("name")?.str()?)?)),
            "as_optional_tensor" => match v.union()? {
                ("as_tensor", t) => Ok(Some(self.tensor_named(t.get("name")?.str()?)?)),
                _ => Ok(None),
            },
            other => Err(self.error(format!("argument `{key}` is `{other}`, expected a tensor"))),
        }
    }

    fn opt_tensors(&self, args: &Args<'a>, key: &str) -> Result<Vec<Option<Traced>>, ImportError> {
        let Some(arg) = args.find(key) else {
            return Err(self.error(format!("argument `{key}` is missing")));
        };
        let (kind, v) = arg.union()?;
        let mut out = Vec::new();
        for item in v.array()? {
            match kind {
                "as_tensors" => out.push(Some(self.tensor_named(item.get("name")?.str()?)?)),
                "as_optional_tensors" => match item.union()? {
                    ("as_tensor", t) => out.push(Some(self.tensor_named(t.get("name")?.str()?)?)),
                    _ => out.push(None),
                },
                other => {
                    return Err(
                        self.error(format!("argument `{key}` is `{other}`, expected tensors"))
                    )
                }
            }
        }
        Ok(out)
    }

    fn tensors(&self, args: &Args<'a>, key: &str) -> Result<Vec<Traced>, ImportError> {
        self.opt_tensors(args, key)?
            .into_iter()
            .map(|t| t.ok_or_else(|| self.error(format!("`{key}` holds a None"))))
            .collect()
    }

    /// A size argument: an int or a `SymInt` (`{"as_sym_int": {"as_name": ..}}`).
    fn size(&self, arg: &Json) -> Result<SizeExpr, ImportError> {
        let (kind, v) = arg.union()?;
        match kind {
            "as_int" => Ok(SizeExpr::Const(v.int()?)),
            "as_sym_int" => match v.union()? {
                ("as_int", n) => Ok(SizeExpr::Const(n.int()?)),
                ("as_name", n) => match self.value_of(n.str()?)? {
                    Value::Size(e) => Ok(e),
                    Value::Number(x) if x.fract() == 0.0 => Ok(SizeExpr::Const(x as i64)),
                    _ => Err(self.error(format!("`{}` is not a size", n.str()?))),
                },
                (other, _) => Err(self.error(format!("unknown SymInt argument `{other}`"))),
            },
            other => Err(self.error(format!("expected a size, found `{other}`"))),
        }
    }

    fn opt_size(&self, args: &Args<'a>, key: &str) -> Result<Option<SizeExpr>, ImportError> {
        match args.find(key) {
            None => Ok(None),
            Some(a) if a.union()?.0 == "as_none" => Ok(None),
            Some(a) => self.size(&a).map(Some),
        }
    }

    fn sizes(&self, args: &Args<'a>, key: &str) -> Result<Vec<SizeExpr>, ImportError> {
        let Some(arg) = args.find(key) else {
            return Err(self.error(format!("argument `{key}` is missing")));
        };
        let (kind, v) = arg.union()?;
        match kind {
            "as_ints" => v
                .array()?
                .iter()
                .map(|i| Ok(SizeExpr::Const(i.int()?)))
                .collect(),
            "as_sym_ints" => v
                .array()?
                .iter()
                .map(|item| {
                    let wrapped = serde_json::json!({ "as_sym_int": item.value });
                    self.size(&Json::new(&wrapped, &item.path))
                })
                .collect(),
            "as_int" | "as_sym_int" => Ok(vec![self.size(&arg)?]),
            other => Err(self.error(format!("argument `{key}` is `{other}`, expected sizes"))),
        }
    }

    fn int(&self, args: &Args<'a>, key: &str, default: Option<i64>) -> Result<i64, ImportError> {
        match self.opt_size(args, key)? {
            Some(e) => e
                .as_const()
                .ok_or_else(|| self.error(format!("argument `{key}` = {e} must be a number"))),
            None => default.ok_or_else(|| self.error(format!("argument `{key}` is missing"))),
        }
    }

    fn ints(&self, args: &Args<'a>, key: &str, default: &[i64]) -> Result<Vec<i64>, ImportError> {
        match args.find(key) {
            None => Ok(default.to_vec()),
            Some(a) if a.union()?.0 == "as_none" => Ok(default.to_vec()),
            Some(_) => self
                .sizes(args, key)?
                .iter()
                .map(|e| {
                    e.as_const()
                        .ok_or_else(|| self.error(format!("argument `{key}` holds the size {e}")))
                })
                .collect(),
        }
    }

    fn opt_ints(&self, args: &Args<'a>, key: &str) -> Result<Option<Vec<i64>>, ImportError> {
        match args.find(key) {
            None => Ok(None),
            Some(a) if a.union()?.0 == "as_none" => Ok(None),
            Some(_) => self.ints(args, key, &[]).map(Some),
        }
    }

    fn number(&self, arg: &Json) -> Result<f64, ImportError> {
        let (kind, v) = arg.union()?;
        match kind {
            "as_float" | "as_int" | "as_bool" => v.float(),
            "as_sym_int" | "as_sym_float" => match v.union()? {
                ("as_name", n) => match self.value_of(n.str()?)? {
                    Value::Number(x) => Ok(x),
                    Value::Size(e) => e.as_const().map(|c| c as f64).ok_or_else(|| {
                        self.error(format!("`{e}` is a symbolic size used as a number"))
                    }),
                    _ => Err(self.error("expected a number")),
                },
                (_, x) => x.float(),
            },
            other => Err(self.error(format!("expected a number, found `{other}`"))),
        }
    }

    fn float(&self, args: &Args<'a>, key: &str, default: Option<f64>) -> Result<f64, ImportError> {
        match args.find(key) {
            Some(a) if a.union()?.0 != "as_none" => self.number(&a),
            _ => default.ok_or_else(|| self.error(format!("argument `{key}` is missing"))),
        }
    }

    fn opt_float(&self, args: &Args<'a>, key: &str) -> Result<Option<f64>, ImportError> {
        match args.find(key) {
            Some(a) if a.union()?.0 != "as_none" => self.number(&a).map(Some),
            _ => Ok(None),
        }
    }

    fn boolean(&self, args: &Args<'a>, key: &str, default: bool) -> Result<bool, ImportError> {
        match args.find(key) {
            Some(a) => match a.union()? {
                ("as_bool", v) => v.bool(),
                ("as_none", _) => Ok(default),
                ("as_int", v) => Ok(v.int()? != 0),
                (other, _) => {
                    Err(self.error(format!("argument `{key}` is `{other}`, expected a bool")))
                }
            },
            None => Ok(default),
        }
    }

    fn string(&self, args: &Args<'a>, key: &str) -> Result<Option<String>, ImportError> {
        match args.find(key) {
            Some(a) => match a.union()? {
                ("as_string", v) => Ok(Some(v.str()?.to_string())),
                _ => Ok(None),
            },
            None => Ok(None),
        }
    }

    fn dtype(&self, args: &Args<'a>, key: &str) -> Result<Option<DType>, ImportError> {
        match args.find(key) {
            Some(a) => match a.union()? {
                ("as_scalar_type", v) => dtype_of_code(v.int()?, key).map(Some),
                _ => Ok(None),
            },
            None => Ok(None),
        }
    }

    /// A tensor or a number (`other` of `add.Tensor`, `self` of `where.ScalarSelf`).
    fn operand(&self, args: &Args<'a>, key: &str) -> Result<Operand, ImportError> {
        let Some(arg) = args.find(key) else {
            return Err(self.error(format!("argument `{key}` is missing")));
        };
        match arg.union()?.0 {
            "as_tensor" | "as_optional_tensor" => Ok(Operand::Tensor(self.tensor(args, key)?)),
            _ => Ok(Operand::Number(self.number(&arg)?)),
        }
    }

    /// `operand` as a tensor next to `like` (a number becomes a 0-d constant of a dtype that
    /// does not promote `like`).
    fn operand_tensor(&self, like: &Traced, op: Operand) -> Traced {
        match op {
            Operand::Tensor(t) => t,
            Operand::Number(v) => like.constant_like(v),
        }
    }

    fn bool_constant(&self, value: bool) -> Traced {
        self.tracer
            .constant(f64::from(u8::from(value)), DType::Bool)
    }

    fn as_bool(&self, t: &Traced) -> Traced {
        if t.dtype() == Some(DType::Bool) {
            t.clone()
        } else {
            t.ne(0.0)
        }
    }

    /// The dims of `sizes` (which must not be negative).
    fn dims_of(&self, sizes: &[SizeExpr]) -> Result<Shape, ImportError> {
        sizes
            .iter()
            .map(|e| Dim::of_expr(e).ok_or_else(|| self.error(format!("size {e} is negative"))))
            .collect()
    }

    /// A 0-d i64 tensor holding the size `dim` (a sum of ones when it is symbolic).
    fn size_tensor(&self, like: &Traced, dim: Dim) -> Traced {
        match dim {
            Dim::Static(n) => self.tracer.constant(n as f64, DType::I64),
            Dim::Sym(_) => {
                let _ = like;
                self.tracer
                    .constant(1.0, DType::I64)
                    .expand_dims(std::iter::once(dim).collect())
                    .sum(&[0], false)
            }
        }
    }

    /// The type PyTorch recorded for the node's first output (for sizes written as `-1`).
    fn output_type(&mut self) -> Option<TensorType> {
        let name = self.context.first_output.clone()?;
        self.meta_type(&name).ok().flatten()
    }

    // ---- shape helpers -----------------------------------------------------------------------

    /// Elements `start, start + step, ..` (`len` of them) of dim `d` of `x`, by `gather` (for a
    /// symbolic dim, whose static range the IR's slices cannot state).
    fn take_range(&self, x: &Traced, d: usize, start: usize, len: usize, step: usize) -> Traced {
        let rank = x.rank();
        let positions = self.tracer.arange(len, DType::I64);
        let positions = if step == 1 {
            positions
        } else {
            positions * step as f64
        };
        let positions = if start == 0 {
            positions
        } else {
            positions + start as f64
        };
        self.take_along_dim(x, d, &positions, rank)
    }

    /// `x.index_select(d, positions)` for a 1-d i64 `positions`, by a gather along the first dim.
    fn take_along_dim(&self, x: &Traced, d: usize, positions: &Traced, rank: usize) -> Traced {
        if d == 0 {
            return x.apply(Op::Gather, &[x, positions]);
        }
        let mut perm: Vec<isize> = vec![d as isize];
        perm.extend((0..rank as isize).filter(|&i| i != d as isize));
        let front = x.permute(&perm);
        let gathered = front.apply(Op::Gather, &[&front, positions]);
        // Back: the gathered dim (now 0) returns to `d`.
        let mut back: Vec<isize> = (1..=d as isize).collect();
        back.push(0);
        back.extend(d as isize + 1..rank as isize);
        gathered.permute(&back)
    }

    /// `x[.., start:end:step, ..]` along `dim` with PyTorch's bounds (negative counts from the
    /// end, past-the-end clamps).
    fn slice(
        &self,
        x: &Traced,
        dim: i64,
        start: Option<SizeExpr>,
        end: Option<SizeExpr>,
        step: i64,
    ) -> Result<Traced, ImportError> {
        let dims = x.ir_dims();
        let d = normalize(dim, dims.len())
            .filter(|_| !dims.is_empty())
            .ok_or_else(|| {
                self.error(format!("dim {dim} out of range for {}", dims_text(&dims)))
            })?;
        if step <= 0 {
            return Err(self.error(format!("step {step} must be positive")));
        }
        let huge = |e: &SizeExpr| e.as_const().is_some_and(|c| c >= i64::MAX / 4);
        let end = end.filter(|e| !huge(e));
        match dims[d] {
            Dim::Static(n)
                if [&start, &end]
                    .iter()
                    .any(|b| b.as_ref().is_some_and(|e| e.as_const().is_none())) =>
            {
                // A static dim sliced to a symbolic bound (`position_ids[:, 0:s0]` of a
                // `[1, 512]` buffer): a gather of the symbolic-length range.
                let size = SizeExpr::Const(n as i64);
                let from_start = |e: Option<SizeExpr>, default: SizeExpr| match e {
                    None => default,
                    Some(e) => match e.as_const() {
                        Some(c) if c < 0 => size.plus(&SizeExpr::Const(c)),
                        Some(c) => SizeExpr::Const(c.min(n as i64)),
                        None => e,
                    },
                };
                let s = from_start(start, SizeExpr::Const(0));
                let e = from_start(end, size.clone());
                self.symbolic_range(x, d, &s, &e, step)
            }
            Dim::Static(n) => {
                let konst =
                    |e: &Option<SizeExpr>, what: &str| -> Result<Option<isize>, ImportError> {
                        match e {
                            None => Ok(None),
                            Some(e) => e
                                .as_const()
                                .map(|c| Some(c.clamp(-(1 << 40), 1 << 40) as isize))
                                .ok_or_else(|| {
                                    self.error(format!(
                                        "{what} {e} of a slice of a static dim of size {n}"
                                    ))
                                }),
                        }
                    };
                Ok(x.slice(
                    d as isize,
                    konst(&start, "start")?,
                    konst(&end, "end")?,
                    step as usize,
                ))
            }
            Dim::Sym(_) => {
                let size = SizeExpr::of_dim(dims[d]);
                let from_start = |e: Option<SizeExpr>, default: SizeExpr| match e {
                    None => default,
                    Some(e) => match e.as_const() {
                        Some(c) if c < 0 => size.plus(&SizeExpr::Const(c)),
                        _ => e,
                    },
                };
                let s = from_start(start, SizeExpr::Const(0));
                let e = from_start(end, size.clone());
                let back = |v: &SizeExpr| size.plus(&v.scale(-1)).as_const();
                if let (Some(a), Some(b)) = (s.as_const(), back(&e)) {
                    if a >= 0 && b >= 0 && step == 1 {
                        if a == 0 && b == 0 {
                            return Ok(x.clone());
                        }
                        return Ok(x.apply(
                            Op::Slice {
                                dim: d,
                                start: a as usize,
                                end: b as usize,
                                step: 1,
                                from: SliceFrom::StartToEnd,
                            },
                            &[x],
                        ));
                    }
                }
                if let (Some(a), Some(b)) = (back(&s), back(&e)) {
                    if a >= b && b >= 0 {
                        return Ok(x.apply(
                            Op::Slice {
                                dim: d,
                                start: a as usize,
                                end: b as usize,
                                step: step as usize,
                                from: SliceFrom::End,
                            },
                            &[x],
                        ));
                    }
                }
                if let (Some(a), Some(b)) = (s.as_const(), e.as_const()) {
                    if 0 <= a && a <= b {
                        let len = ((b - a) as usize).div_ceil(step as usize);
                        return Ok(self.take_range(x, d, a as usize, len, step as usize));
                    }
                }
                self.symbolic_range(x, d, &s, &e, step)
            }
        }
    }

    /// Elements `s..e` (step 1, `s` a number, `e` a size) of dim `d`, by a gather of an `arange`
    /// of the symbolic length `e - s`.
    fn symbolic_range(
        &self,
        x: &Traced,
        d: usize,
        s: &SizeExpr,
        e: &SizeExpr,
        step: i64,
    ) -> Result<Traced, ImportError> {
        let length = e.plus(&s.scale(-1));
        let (Some(a), Some(len), 1) = (s.as_const(), Dim::of_expr(&length), step) else {
            return Err(self.error(format!(
                "a slice {s}:{e}:{step} of dim {d} of {} cannot be imported",
                dims_text(&x.ir_dims())
            )));
        };
        if a < 0 {
            return Err(self.error(format!("a slice starting at {a}")));
        }
        let iota = x.apply(
            Op::Iota {
                len,
                dtype: DType::I64,
            },
            &[],
        );
        let positions = if a == 0 { iota } else { iota + a as f64 };
        Ok(self.take_along_dim(x, d, &positions, x.rank()))
    }

    /// `x` without dim `d` (of size 1).
    fn drop_dim(&self, x: &Traced, d: usize) -> Traced {
        let mut dims: Shape = x.ir_dims().into_iter().collect();
        dims.remove(d);
        x.reshape_dims(dims)
    }

    /// `x.select(dim, index)`.
    fn select(&self, x: &Traced, dim: i64, index: i64) -> Result<Traced, ImportError> {
        let dims = x.ir_dims();
        let d = normalize(dim, dims.len())
            .filter(|_| !dims.is_empty())
            .ok_or_else(|| {
                self.error(format!("dim {dim} out of range for {}", dims_text(&dims)))
            })?;
        let end = if index == -1 {
            None
        } else {
            Some(SizeExpr::Const(index + 1))
        };
        let piece = self.slice(x, d as i64, Some(SizeExpr::Const(index)), end, 1)?;
        Ok(self.drop_dim(&piece, d))
    }

    /// Pieces of `sizes` along `dim`.
    fn split_sizes(
        &self,
        x: &Traced,
        dim: i64,
        sizes: &[usize],
    ) -> Result<Vec<Value>, ImportError> {
        let mut out = Vec::new();
        let mut at = 0usize;
        for &n in sizes {
            let piece = self.slice(
                x,
                dim,
                Some(SizeExpr::Const(at as i64)),
                Some(SizeExpr::Const((at + n) as i64)),
                1,
            )?;
            out.push(Value::Tensor(piece));
            at += n;
        }
        Ok(out)
    }

    fn static_size(&self, x: &Traced, d: usize, what: &str) -> Result<usize, ImportError> {
        match x.ir_dims().get(d) {
            Some(Dim::Static(n)) => Ok(*n),
            Some(dim) => Err(self.error(format!(
                "{what} along the symbolic dim {dim} is not supported"
            ))),
            None => Err(self.error(format!("dim {d} out of range"))),
        }
    }

    fn dim_arg(
        &self,
        x: &Traced,
        args: &Args<'a>,
        key: &str,
        default: Option<i64>,
    ) -> Result<usize, ImportError> {
        let dim = self.int(args, key, default)?;
        normalize(dim, x.rank())
            .ok_or_else(|| self.error(format!("dim {dim} out of range for rank {}", x.rank())))
    }

    /// Reduction dims (`None` or empty: every dim).
    fn reduce_dims(
        &self,
        x: &Traced,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Vec<isize>, ImportError> {
        let dims = self.opt_ints(args, key)?.unwrap_or_default();
        dims.iter()
            .map(|&d| {
                normalize(d, x.rank()).map(|d| d as isize).ok_or_else(|| {
                    self.error(format!("dim {d} out of range for rank {}", x.rank()))
                })
            })
            .collect()
    }

    /// PyTorch's result dtype of two operands (a float wins, then i64, then bool).
    fn promote(&self, tensors: &[Traced]) -> Vec<Traced> {
        let dtypes: Vec<DType> = tensors.iter().filter_map(|t| t.dtype()).collect();
        let target = dtypes
            .iter()
            .copied()
            .find(|d| d.is_float())
            .or_else(|| dtypes.iter().copied().find(|&d| d == DType::I64))
            .unwrap_or(DType::Bool);
        tensors
            .iter()
            .map(|t| {
                if t.dtype() == Some(target) {
                    t.clone()
                } else {
                    t.cast(target)
                }
            })
            .collect()
    }

    /// `x[indices]` (`aten.index.Tensor`): integer index tensors for some dims (broadcast
    /// together), `None` for dims taken whole. The indexed dims are flattened into one and the
    /// broadcast linear position gathers from it (negative positions count from the end).
    fn index(&self, x: &Traced, indices: &[Option<Traced>]) -> Result<Traced, ImportError> {
        let rank = x.rank();
        if indices.len() > rank {
            return Err(self.error(format!("{} indices for rank {rank}", indices.len())));
        }
        let positions: Vec<usize> = (0..indices.len())
            .filter(|&i| indices[i].is_some())
            .collect();
        if positions.is_empty() {
            return Ok(x.clone());
        }
        let mut index_tensors = Vec::new();
        for &p in &positions {
            let t = indices[p]
                .clone()
                .expect("positions lists the Some entries");
            match t.dtype() {
                Some(DType::Bool) => {
                    return Err(self.error(
                        "indexing with a bool mask has a data-dependent shape (not supported)",
                    ))
                }
                Some(DType::I64) => index_tensors.push(t),
                _ => index_tensors.push(t.cast(DType::I64)),
            }
        }
        let adjacent = positions.windows(2).all(|w| w[1] == w[0] + 1);
        let mut perm: Vec<isize> = positions.iter().map(|&p| p as isize).collect();
        perm.extend(
            (0..rank)
                .filter(|i| !positions.contains(i))
                .map(|i| i as isize),
        );
        let identity = perm.iter().enumerate().all(|(i, &p)| i as isize == p);
        let front = if identity {
            x.clone()
        } else {
            x.permute(&perm)
        };
        let dims = front.ir_dims();
        let m = positions.len();
        let mut linear: Option<Traced> = None;
        for (j, idx) in index_tensors.iter().enumerate() {
            let size = self.size_tensor(x, dims[j]);
            let wrapped = idx.lt(0.0).where_(&(idx + &size), idx);
            let stride = Dim::of_expr(&SizeExpr::product(&dims[j + 1..m]))
                .ok_or_else(|| self.error("a negative size"))?;
            let term = if stride == Dim::Static(1) {
                wrapped
            } else {
                &wrapped * &self.size_tensor(x, stride)
            };
            linear = Some(match linear {
                None => term,
                Some(l) => l + term,
            });
        }
        let linear = linear.expect("at least one index");
        let flat = if m == 1 {
            front
        } else {
            let merged = Dim::of_expr(&SizeExpr::product(&dims[..m]))
                .ok_or_else(|| self.error("a negative size"))?;
            let shape: Shape = std::iter::once(merged)
                .chain(dims[m..].iter().copied())
                .collect();
            front.reshape_dims(shape)
        };
        let out = flat.apply(Op::Gather, &[&flat, &linear]);
        let p0 = positions[0];
        if adjacent && p0 > 0 {
            // The broadcast index dims take the place of the indexed dims.
            let out_rank = out.rank();
            let nb = out_rank - (rank - m);
            let mut back: Vec<isize> = (nb..nb + p0).map(|i| i as isize).collect();
            back.extend((0..nb).map(|i| i as isize));
            back.extend((nb + p0..out_rank).map(|i| i as isize));
            return Ok(out.permute(&back));
        }
        Ok(out)
    }

    fn pair(&self, v: &[i64], what: &str, default: usize) -> Result<(usize, usize), ImportError> {
        let bad = || {
            self.error(format!(
                "{what} {v:?} must be one or two non-negative numbers"
            ))
        };
        match v {
            [] => Ok((default, default)),
            [a] if *a >= 0 => Ok((*a as usize, *a as usize)),
            [a, b] if *a >= 0 && *b >= 0 => Ok((*a as usize, *b as usize)),
            _ => Err(bad()),
        }
    }

    /// A convolution of a 3-d (1-d conv) or 4-d (2-d conv) input.
    #[allow(clippy::too_many_arguments)]
    fn convolution(
        &self,
        x: &Traced,
        weight: &Traced,
        bias: Option<&Traced>,
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        groups: i64,
    ) -> Result<Traced, ImportError> {
        if groups <= 0 {
            return Err(self.error(format!("groups {groups} must be positive")));
        }
        match x.rank() {
            4 => {
                let window = Window {
                    stride: self.pair(stride, "stride", 1)?,
                    padding: self.pair(padding, "padding", 0)?,
                    dilation: self.pair(dilation, "dilation", 1)?,
                };
                Ok(x.convolution("convolution", weight, bias, window, groups as usize))
            }
            3 => {
                let one = |v: &[i64], what: &str, default: usize| -> Result<usize, ImportError> {
                    Ok(self.pair(v, what, default)?.0)
                };
                let options = ConvOptions::default()
                    .stride(one(stride, "stride", 1)?)
                    .padding(one(padding, "padding", 0)?)
                    .dilation(one(dilation, "dilation", 1)?)
                    .groups(groups as usize);
                let window = Window {
                    stride: (1, options.stride),
                    padding: (0, options.padding),
                    dilation: (1, options.dilation),
                };
                let out = x.unsqueeze(2).convolution(
                    "conv1d",
                    &weight.unsqueeze(2),
                    bias,
                    window,
                    options.groups,
                );
                Ok(self.drop_dim(&out, 2))
            }
            r => Err(self.error(format!("convolution of a rank-{r} input is not supported"))),
        }
    }

    fn pool_options(&self, args: &Args<'a>) -> Result<PoolOptions, ImportError> {
        let kernel = self.ints(args, "kernel_size", &[])?;
        let stride = self.ints(args, "stride", &[])?;
        let padding = self.ints(args, "padding", &[0])?;
        let dilation = self.ints(args, "dilation", &[1])?;
        let square = |v: &[i64], what: &str| -> Result<Option<usize>, ImportError> {
            match v {
                [] => Ok(None),
                [a] if *a >= 0 => Ok(Some(*a as usize)),
                [a, b] if a == b && *a >= 0 => Ok(Some(*a as usize)),
                _ => Err(self.error(format!(
                    "{what} {v:?}: only square pooling windows are supported"
                ))),
            }
        };
        let k =
            square(&kernel, "kernel_size")?.ok_or_else(|| self.error("kernel_size is missing"))?;
        let mut options = PoolOptions::new(k);
        if let Some(s) = square(&stride, "stride")? {
            options = options.stride(s);
        }
        options = options
            .padding(square(&padding, "padding")?.unwrap_or(0))
            .dilation(square(&dilation, "dilation")?.unwrap_or(1));
        if self.boolean(args, "ceil_mode", false)? {
            options = options.ceil_mode();
        }
        Ok(options)
    }

    /// The shape of a view-like node's result: PyTorch's recorded type when it can be read,
    /// else the `size` argument with a `-1` solved from the element count.
    fn target_shape(
        &mut self,
        x: &Traced,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Shape, ImportError> {
        if let Some(ty) = self.output_type() {
            return Ok(ty.shape);
        }
        let sizes = self.sizes(args, key)?;
        let known: Vec<&SizeExpr> = sizes.iter().filter(|e| e.as_const() != Some(-1)).collect();
        let mut shape = Shape::new();
        for e in &sizes {
            if e.as_const() == Some(-1) {
                let total = SizeExpr::product(&x.ir_dims());
                let k: Option<i64> = known.iter().map(|e| e.as_const()).product();
                let hole = k
                    .filter(|&k| k > 0)
                    .and_then(|k| {
                        if let Some(c) = total.as_const() {
                            (c % k == 0).then_some(SizeExpr::Const(c / k))
                        } else {
                            total.divide_exactly(k)
                        }
                    })
                    .and_then(|e| Dim::of_expr(&e))
                    .ok_or_else(|| self.error(format!("cannot solve the -1 of {sizes:?}")))?;
                shape.push(hole);
            } else {
                shape.push(
                    Dim::of_expr(e).ok_or_else(|| self.error(format!("size {e} is negative")))?,
                );
            }
        }
        Ok(shape)
    }

    fn creation_shape(&mut self, args: &Args<'a>, key: &str) -> Result<Shape, ImportError> {
        let sizes = self.sizes(args, key)?;
        self.dims_of(&sizes)
    }

    fn filled(&self, shape: Shape, value: f64, dtype: DType) -> Traced {
        let c = self.tracer.constant(value, dtype);
        if shape.is_empty() {
            c
        } else {
            c.expand_dims(shape)
        }
    }

    /// The dtype of a creation op: its `dtype` argument, else PyTorch's recorded one, else
    /// from the fill value.
    fn creation_dtype(
        &mut self,
        args: &Args<'a>,
        fill: Option<&Json>,
    ) -> Result<DType, ImportError> {
        if let Some(d) = self.dtype(args, "dtype")? {
            return Ok(d);
        }
        if let Some(ty) = self.output_type() {
            return Ok(ty.dtype);
        }
        Ok(match fill.map(|f| f.union()).transpose()?.map(|(k, _)| k) {
            Some("as_bool") => DType::Bool,
            Some("as_int") => DType::I64,
            _ => DType::F32,
        })
    }

    fn keep_or_drop(
        &self,
        reduced: Traced,
        x_rank: usize,
        dims: &[isize],
        keepdim: bool,
    ) -> Traced {
        if keepdim {
            return reduced;
        }
        let all: Vec<usize> = if dims.is_empty() {
            (0..x_rank).collect()
        } else {
            dims.iter().map(|&d| d as usize).collect()
        };
        let kept: Shape = reduced
            .ir_dims()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !all.contains(i))
            .map(|(_, d)| d)
            .collect();
        reduced.reshape_dims(kept)
    }

    fn pow(&self, x: &Traced, exponent: f64) -> Traced {
        // Small integer powers multiply (exact for negative bases, as PyTorch's).
        if exponent == 1.0 {
            x.clone()
        } else if exponent == 2.0 {
            x * x
        } else if exponent == 3.0 {
            &(x * x) * x
        } else if exponent == 4.0 {
            let square = x * x;
            &square * &square
        } else if exponent == 0.5 {
            x.sqrt()
        } else if exponent == -0.5 {
            x.rsqrt()
        } else if exponent == -1.0 {
            x.reciprocal()
        } else if exponent == 0.0 {
            x.full_like(1.0)
        } else {
            x.pow(exponent)
        }
    }

    fn trunc(&self, x: &Traced) -> Traced {
        match x.dtype() {
            Some(d) if d.is_float() => x.cast(DType::I64).cast(d),
            _ => x.clone(),
        }
    }

    // ---- the op table ------------------------------------------------------------------------

    fn dispatch(&mut self, target: &str, args: &Args<'a>) -> Result<Vec<Value>, ImportError> {
        let one = |t: Traced| Ok(vec![Value::Tensor(t)]);
        let op = target;
        match op {
            // -- sizes and assertions
            "aten.sym_size.int" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", None)?;
                Ok(vec![Value::Size(SizeExpr::of_dim(x.ir_dims()[d]))])
            }
            "aten.sym_numel.default" => {
                let x = self.tensor(args, "self")?;
                Ok(vec![Value::Size(SizeExpr::product(&x.ir_dims()))])
            }
            "aten._assert_tensor_metadata.default"
            | "aten._assert_scalar.default"
            | "aten._assert_async.msg"
            | "aten.sym_constrain_range.default"
            | "aten.sym_constrain_range_for_size.default" => Ok(vec![]),
            "_operator.add" | "_operator.sub" | "_operator.mul" | "_operator.floordiv" => {
                let a = self.size(&args.get(self, "a")?)?;
                let b = self.size(&args.get(self, "b")?)?;
                let v = match op {
                    "_operator.add" => a.plus(&b),
                    "_operator.sub" => a.plus(&b.scale(-1)),
                    "_operator.mul" => a.times(&b),
                    _ => match (a.as_const(), b.as_const()) {
                        (Some(x), Some(y)) if y != 0 => SizeExpr::Const(x.div_euclid(y)),
                        (_, Some(y)) if y > 0 => a.divide_exactly(y).ok_or_else(|| {
                            self.error(format!("{a} // {y} is not exact for every size"))
                        })?,
                        _ => return Err(self.error(format!("cannot divide {a} by {b}"))),
                    },
                };
                Ok(vec![Value::Size(v)])
            }
            "_operator.eq" | "_operator.ne" | "_operator.lt" | "_operator.le" | "_operator.gt"
            | "_operator.ge" => Ok(vec![Value::Missing(
                "a comparison of sizes (only assertions may read it)".into(),
            )]),
            "_operator.neg" => {
                let a = self.size(&args.get(self, "a")?)?;
                Ok(vec![Value::Size(a.scale(-1))])
            }

            // -- identities and casts
            "aten.alias.default"
            | "aten.clone.default"
            | "aten.contiguous.default"
            | "aten.detach.default"
            | "aten.lift_fresh_copy.default" => one(self.tensor(args, "self")?),
            "aten.dropout.default" | "aten.feature_dropout.default" => {
                let x = self.tensor(args, "input")?;
                let p = self.float(args, "p", Some(0.0))?;
                if self.boolean(args, "train", false)? && p > 0.0 {
                    return Err(
                        self.error("dropout in training mode (export the module in eval mode)")
                    );
                }
                one(x)
            }
            "aten.native_dropout.default" => {
                let x = self.tensor(args, "input")?;
                let p = self.float(args, "p", Some(0.0))?;
                if self.boolean(args, "train", false)? && p > 0.0 {
                    return Err(
                        self.error("dropout in training mode (export the module in eval mode)")
                    );
                }
                let mask = x.full_like(1.0).cast(DType::Bool);
                Ok(vec![Value::Tensor(x), Value::Tensor(mask)])
            }
            "aten._to_copy.default"
            | "aten.to.dtype"
            | "aten.to.dtype_layout"
            | "aten.to.device" => {
                let x = self.tensor(args, "self")?;
                match self.dtype(args, "dtype")? {
                    Some(d) if Some(d) != x.dtype() => one(x.cast(d)),
                    _ => one(x),
                }
            }
            "aten.to.other" | "aten.type_as.default" => {
                let x = self.tensor(args, "self")?;
                let other = self.tensor(args, "other")?;
                match other.dtype() {
                    Some(d) if Some(d) != x.dtype() => one(x.cast(d)),
                    _ => one(x),
                }
            }
            "aten.copy.default" => {
                let x = self.tensor(args, "self")?;
                let src = self.tensor(args, "src")?;
                let src = match x.dtype() {
                    Some(d) if Some(d) != src.dtype() => src.cast(d),
                    _ => src,
                };
                one(src.expand_dims(x.ir_dims().into_iter().collect()))
            }

            // -- creation
            "aten.arange.default" | "aten.arange.start" | "aten.arange.start_step" => {
                let start = args.find("start");
                let end_arg = args.get(self, "end")?;
                let step_arg = args.find("step");
                let is_int =
                    |a: &Json| matches!(a.union().map(|(k, _)| k), Ok("as_int") | Ok("as_sym_int"));
                let all_int = start.as_ref().is_none_or(is_int)
                    && is_int(&end_arg)
                    && step_arg.as_ref().is_none_or(is_int);
                let dtype = match self.dtype(args, "dtype")? {
                    Some(d) => d,
                    None => match self.output_type() {
                        Some(t) => t.dtype,
                        None if all_int => DType::I64,
                        None => DType::F32,
                    },
                };
                if all_int {
                    let s = match &start {
                        Some(a) => self.size(a)?,
                        None => SizeExpr::Const(0),
                    };
                    let e = self.size(&end_arg)?;
                    let st = match &step_arg {
                        Some(a) => self.size(a)?,
                        None => SizeExpr::Const(1),
                    };
                    let (Some(step), Some(s0)) = (st.as_const(), s.as_const()) else {
                        return Err(self.error("a symbolic start or step of arange"));
                    };
                    if step == 1 {
                        let len = e.plus(&SizeExpr::Const(-s0));
                        let dim = Dim::of_expr(&len).unwrap_or(Dim::Static(0));
                        let iota = self
                            .tracer
                            .constant(0.0, dtype)
                            .apply(Op::Iota { len: dim, dtype }, &[]);
                        return one(if s0 == 0 { iota } else { iota + s0 as f64 });
                    }
                    let Some(e0) = e.as_const() else {
                        return Err(self.error("arange to a symbolic end with a step other than 1"));
                    };
                    return one(self
                        .tracer
                        .arange_range(s0 as f64, e0 as f64, step as f64, dtype));
                }
                let s = match &start {
                    Some(a) => self.number(a)?,
                    None => 0.0,
                };
                let e = self.number(&end_arg)?;
                let st = match &step_arg {
                    Some(a) => self.number(a)?,
                    None => 1.0,
                };
                one(self.tracer.arange_range(s, e, st, dtype))
            }
            "aten.full.default" => {
                let fill = args.get(self, "fill_value")?;
                let value = self.number(&fill)?;
                let dtype = self.creation_dtype(args, Some(&fill))?;
                let shape = self.creation_shape(args, "size")?;
                one(self.filled(shape, value, dtype))
            }
            "aten.zeros.default" | "aten.ones.default" | "aten.empty.memory_format" => {
                let dtype = self.creation_dtype(args, None)?;
                let shape = self.creation_shape(args, "size")?;
                let value = if op == "aten.ones.default" { 1.0 } else { 0.0 };
                one(self.filled(shape, value, dtype))
            }
            "aten.full_like.default"
            | "aten.zeros_like.default"
            | "aten.ones_like.default"
            | "aten.empty_like.default"
            | "aten.fill.Scalar"
            | "aten.zero.default" => {
                let x = self.tensor(args, "self")?;
                let value = match op {
                    "aten.full_like.default" => self.float(args, "fill_value", None)?,
                    "aten.fill.Scalar" => self.float(args, "value", None)?,
                    "aten.ones_like.default" => 1.0,
                    _ => 0.0,
                };
                let dtype = self
                    .dtype(args, "dtype")?
                    .or(x.dtype())
                    .unwrap_or(DType::F32);
                one(self.filled(x.ir_dims().into_iter().collect(), value, dtype))
            }
            "aten.new_ones.default"
            | "aten.new_zeros.default"
            | "aten.new_full.default"
            | "aten.new_empty.default" => {
                let x = self.tensor(args, "self")?;
                let value = match op {
                    "aten.new_ones.default" => 1.0,
                    "aten.new_full.default" => self.float(args, "fill_value", None)?,
                    _ => 0.0,
                };
                let dtype = self
                    .dtype(args, "dtype")?
                    .or(x.dtype())
                    .unwrap_or(DType::F32);
                let shape = self.creation_shape(args, "size")?;
                one(self.filled(shape, value, dtype))
            }
            "aten.scalar_tensor.default" => {
                let value = self.float(args, "s", None)?;
                let dtype = self.dtype(args, "dtype")?.unwrap_or(DType::F32);
                one(self.tracer.constant(value, dtype))
            }

            // -- pointwise unary
            "aten.abs.default" => one(self.tensor(args, "self")?.abs()),
            "aten.neg.default" => one(self.tensor(args, "self")?.neg()),
            "aten.exp.default" => one(self.tensor(args, "self")?.exp()),
            "aten.exp2.default" => one((self.tensor(args, "self")? * std::f64::consts::LN_2).exp()),
            "aten.expm1.default" => one(self.tensor(args, "self")?.exp() - 1.0),
            "aten.log.default" => one(self.tensor(args, "self")?.log()),
            "aten.log1p.default" => one((self.tensor(args, "self")? + 1.0).log()),
            "aten.log2.default" => one(self.tensor(args, "self")?.log() * std::f64::consts::LOG2_E),
            "aten.log10.default" => {
                one(self.tensor(args, "self")?.log() * std::f64::consts::LOG10_E)
            }
            "aten.sqrt.default" => one(self.tensor(args, "self")?.sqrt()),
            "aten.rsqrt.default" => one(self.tensor(args, "self")?.rsqrt()),
            "aten.sin.default" => one(self.tensor(args, "self")?.sin()),
            "aten.cos.default" => one(self.tensor(args, "self")?.cos()),
            "aten.tan.default" => {
                let x = self.tensor(args, "self")?;
                one(x.sin() / x.cos())
            }
            "aten.sinh.default" | "aten.cosh.default" => {
                let x = self.tensor(args, "self")?;
                let (a, b) = (x.exp(), x.neg().exp());
                one(if op == "aten.sinh.default" {
                    (a - b) * 0.5
                } else {
                    (a + b) * 0.5
                })
            }
            "aten.tanh.default" => one(self.tensor(args, "self")?.tanh()),
            "aten.erf.default" => one(self.tensor(args, "self")?.erf()),
            "aten.sigmoid.default" => one(self.tensor(args, "self")?.sigmoid()),
            "aten.reciprocal.default" => one(self.tensor(args, "self")?.reciprocal()),
            "aten.square.default" => {
                let x = self.tensor(args, "self")?;
                one(&x * &x)
            }
            "aten.sign.default" => {
                let x = self.tensor(args, "self")?;
                let zero = x.full_like(0.0);
                one(x.gt(0.0).where_(1.0, &x.lt(0.0).where_(-1.0, &zero)))
            }
            "aten.trunc.default" => {
                let x = self.tensor(args, "self")?;
                one(self.trunc(&x))
            }
            "aten.floor.default" | "aten.ceil.default" => {
                let x = self.tensor(args, "self")?;
                let t = self.trunc(&x);
                if !x.dtype().is_some_and(|d| d.is_float()) {
                    return one(x);
                }
                one(if op == "aten.floor.default" {
                    x.lt(&t).where_(&(&t - 1.0), &t)
                } else {
                    x.gt(&t).where_(&(&t + 1.0), &t)
                })
            }
            "aten.isnan.default" => {
                let x = self.tensor(args, "self")?;
                one(x.ne(&x))
            }
            "aten.isinf.default" => one(self.tensor(args, "self")?.abs().eq(f64::INFINITY)),
            "aten.logical_not.default" | "aten.bitwise_not.default" => {
                let x = self.tensor(args, "self")?;
                if op == "aten.bitwise_not.default" && x.dtype() != Some(DType::Bool) {
                    return Err(self.error("bitwise_not of an integer tensor is not supported"));
                }
                let b = self.as_bool(&x);
                one(b.where_(&self.bool_constant(false), &self.bool_constant(true)))
            }
            "aten.relu.default" => one(self.tensor(args, "self")?.relu()),
            "aten.relu6.default" => one(self.tensor(args, "self")?.clamp(Some(0.0), Some(6.0))),
            "aten.silu.default" => one(self.tensor(args, "self")?.silu()),
            "aten.gelu.default" => {
                let x = self.tensor(args, "self")?;
                match self.string(args, "approximate")?.as_deref() {
                    None | Some("none") => one(x.gelu()),
                    Some("tanh") => one(x.gelu_tanh()),
                    Some(other) => Err(self.error(format!("gelu approximate={other:?}"))),
                }
            }
            "aten.mish.default" => {
                let x = self.tensor(args, "self")?;
                let softplus = (x.exp() + 1.0).log();
                one(&x * &softplus.tanh())
            }
            "aten.hardtanh.default" => {
                let x = self.tensor(args, "self")?;
                let lo = self.float(args, "min_val", Some(-1.0))?;
                let hi = self.float(args, "max_val", Some(1.0))?;
                one(x.clamp(Some(lo), Some(hi)))
            }
            "aten.hardsigmoid.default" => {
                let x = self.tensor(args, "self")?;
                one((x / 6.0 + 0.5).clamp(Some(0.0), Some(1.0)))
            }
            "aten.hardswish.default" => {
                let x = self.tensor(args, "self")?;
                one(&x * &(&x / 6.0 + 0.5).clamp(Some(0.0), Some(1.0)))
            }
            "aten.leaky_relu.default" => {
                let x = self.tensor(args, "self")?;
                let slope = self.float(args, "negative_slope", Some(0.01))?;
                one(x.gt(0.0).where_(&x, &(&x * slope)))
            }
            "aten.elu.default" => {
                let x = self.tensor(args, "self")?;
                let alpha = self.float(args, "alpha", Some(1.0))?;
                let scale = self.float(args, "scale", Some(1.0))?;
                let input_scale = self.float(args, "input_scale", Some(1.0))?;
                let negative = ((&x * input_scale).exp() - 1.0) * (alpha * scale);
                one(x.gt(0.0).where_(&(&x * scale), &negative))
            }
            "aten.softplus.default" => {
                let x = self.tensor(args, "self")?;
                let beta = self.float(args, "beta", Some(1.0))?;
                let threshold = self.float(args, "threshold", Some(20.0))?;
                let bx = &x * beta;
                let soft = ((bx.exp() + 1.0).log()) / beta;
                one(bx.gt(threshold).where_(&x, &soft))
            }
            "aten.clamp.default" | "aten.clamp_min.default" | "aten.clamp_max.default" => {
                let x = self.tensor(args, "self")?;
                let (lo, hi) = match op {
                    "aten.clamp_min.default" => (self.opt_float(args, "min")?, None),
                    "aten.clamp_max.default" => (None, self.opt_float(args, "max")?),
                    _ => (self.opt_float(args, "min")?, self.opt_float(args, "max")?),
                };
                one(x.clamp(lo, hi))
            }
            "aten.clamp.Tensor" => {
                let x = self.tensor(args, "self")?;
                let mut y = x.clone();
                if let Some(lo) = self.opt_tensor(args, "min")? {
                    y = y.maximum(&lo);
                }
                if let Some(hi) = self.opt_tensor(args, "max")? {
                    y = y.minimum(&hi);
                }
                one(y)
            }
            "aten.pow.Tensor_Scalar" => {
                let x = self.tensor(args, "self")?;
                let e = self.float(args, "exponent", None)?;
                one(self.pow(&x, e))
            }
            "aten.pow.Tensor_Tensor" => {
                let x = self.tensor(args, "self")?;
                let e = self.tensor(args, "exponent")?;
                one(x.pow(&e))
            }
            "aten.pow.Scalar" => {
                let base = self.float(args, "self", None)?;
                let e = self.tensor(args, "exponent")?;
                one(e.constant_like(base).pow(&e))
            }

            // -- pointwise binary
            "aten.add.Tensor" | "aten.add.Scalar" | "aten.sub.Tensor" | "aten.sub.Scalar"
            | "aten.rsub.Scalar" | "aten.rsub.Tensor" => {
                let x = self.tensor(args, "self")?;
                let other = self.operand(args, "other")?;
                let alpha = self.float(args, "alpha", Some(1.0))?;
                let y = self.operand_tensor(&x, other);
                let scaled = |t: &Traced| if alpha == 1.0 { t.clone() } else { t * alpha };
                one(match op {
                    "aten.add.Tensor" | "aten.add.Scalar" => &x + &scaled(&y),
                    "aten.sub.Tensor" | "aten.sub.Scalar" => &x - &scaled(&y),
                    _ => &y - &scaled(&x),
                })
            }
            "aten.mul.Tensor" | "aten.mul.Scalar" => {
                let x = self.tensor(args, "self")?;
                let y = self.operand(args, "other")?;
                let y = self.operand_tensor(&x, y);
                if x.dtype() == Some(DType::Bool) && y.dtype() == Some(DType::Bool) {
                    return one(x.where_(&y, &self.bool_constant(false)));
                }
                one(&x * &y)
            }
            "aten.div.Tensor" | "aten.div.Scalar" | "aten.div.Tensor_mode" => {
                let x = self.tensor(args, "self")?;
                let y = self.operand(args, "other")?;
                let y = self.operand_tensor(&x, y);
                // True division is floating-point, as PyTorch's.
                let float = |t: &Traced| match t.dtype() {
                    Some(d) if d.is_float() => t.clone(),
                    _ => t.cast(DType::F32),
                };
                let q = float(&x) / float(&y);
                match self.string(args, "rounding_mode")?.as_deref() {
                    None => one(q),
                    Some("trunc") => one(self.trunc(&q)),
                    Some("floor") => {
                        let t = self.trunc(&q);
                        one(q.lt(&t).where_(&(&t - 1.0), &t))
                    }
                    Some(other) => Err(self.error(format!("rounding_mode {other:?}"))),
                }
            }
            "aten.remainder.Tensor" | "aten.remainder.Scalar" => {
                let x = self.tensor(args, "self")?;
                let y = self.operand(args, "other")?;
                let y = self.operand_tensor(&x, y);
                if !x.dtype().is_some_and(|d| d.is_float()) {
                    return Err(self.error("remainder of integer tensors is not supported"));
                }
                // Python's modulo: x - floor(x / y) * y (the sign of y).
                let q = &x / &y;
                let t = self.trunc(&q);
                let floor = q.lt(&t).where_(&(&t - 1.0), &t);
                one(&x - &(&floor * &y))
            }
            "aten.maximum.default" | "aten.minimum.default" => {
                let x = self.tensor(args, "self")?;
                let y = self.tensor(args, "other")?;
                one(if op == "aten.maximum.default" {
                    x.maximum(&y)
                } else {
                    x.minimum(&y)
                })
            }
            "aten.eq.Tensor" | "aten.eq.Scalar" | "aten.ne.Tensor" | "aten.ne.Scalar"
            | "aten.lt.Tensor" | "aten.lt.Scalar" | "aten.le.Tensor" | "aten.le.Scalar"
            | "aten.gt.Tensor" | "aten.gt.Scalar" | "aten.ge.Tensor" | "aten.ge.Scalar" => {
                let x = self.tensor(args, "self")?;
                let y = self.operand(args, "other")?;
                let y = self.operand_tensor(&x, y);
                let (x, y) = match (x.dtype(), y.dtype()) {
                    (Some(a), Some(b)) if a != b => {
                        let p = self.promote(&[x, y]);
                        (p[0].clone(), p[1].clone())
                    }
                    _ => (x, y),
                };
                let name = op.split('.').nth(1).unwrap_or("");
                one(match name {
                    "eq" => x.eq(&y),
                    "ne" => x.ne(&y),
                    "lt" => x.lt(&y),
                    "le" => x.le(&y),
                    "gt" => x.gt(&y),
                    _ => x.ge(&y),
                })
            }
            "aten.logical_and.default"
            | "aten.logical_or.default"
            | "aten.logical_xor.default"
            | "aten.bitwise_and.Tensor"
            | "aten.bitwise_or.Tensor"
            | "aten.bitwise_xor.Tensor"
            | "aten.__and__.Tensor"
            | "aten.__or__.Tensor" => {
                let x = self.tensor(args, "self")?;
                let y = self.tensor(args, "other")?;
                let bitwise = op.contains("bitwise") || op.contains("__");
                if bitwise && (x.dtype() != Some(DType::Bool) || y.dtype() != Some(DType::Bool)) {
                    return Err(
                        self.error("bitwise ops on integer tensors are not supported (bool only)")
                    );
                }
                let (a, b) = (self.as_bool(&x), self.as_bool(&y));
                one(if op.contains("and") {
                    a.where_(&b, &self.bool_constant(false))
                } else if op.contains("xor") {
                    a.ne(&b)
                } else {
                    a.where_(&self.bool_constant(true), &b)
                })
            }
            "aten.where.self"
            | "aten.where.ScalarSelf"
            | "aten.where.ScalarOther"
            | "aten.where.Scalar" => {
                let c = self.tensor(args, "condition")?;
                let c = self.as_bool(&c);
                let a = self.operand(args, "self")?;
                let b = self.operand(args, "other")?;
                let (a, b) = match (a, b) {
                    (Operand::Tensor(a), Operand::Tensor(b)) => {
                        let p = self.promote(&[a, b]);
                        (p[0].clone(), p[1].clone())
                    }
                    (Operand::Tensor(a), b) => {
                        let b = self.operand_tensor(&a, b);
                        (a, b)
                    }
                    (a, Operand::Tensor(b)) => {
                        let a = self.operand_tensor(&b, a);
                        (a, b)
                    }
                    (Operand::Number(a), Operand::Number(b)) => {
                        let dtype = self.output_type().map_or(DType::F32, |t| t.dtype);
                        (
                            self.tracer.constant(a, dtype),
                            self.tracer.constant(b, dtype),
                        )
                    }
                };
                one(c.where_(&a, &b))
            }
            "aten.masked_fill.Scalar" | "aten.masked_fill.Tensor" => {
                let x = self.tensor(args, "self")?;
                let mask = self.tensor(args, "mask")?;
                let value = self.operand(args, "value")?;
                let v = match value {
                    Operand::Tensor(t) => match (t.dtype(), x.dtype()) {
                        (Some(a), Some(b)) if a != b => t.cast(b),
                        _ => t,
                    },
                    Operand::Number(v) => match x.dtype() {
                        Some(d) => self.tracer.constant(v, d),
                        None => x.constant_like(v),
                    },
                };
                one(self.as_bool(&mask).where_(&v, &x))
            }

            // -- reductions and scans
            "aten.sum.dim_IntList" | "aten.sum.default" | "aten.mean.dim" | "aten.mean.default" => {
                let mut x = self.tensor(args, "self")?;
                if let Some(d) = self.dtype(args, "dtype")? {
                    x = x.cast(d);
                } else if matches!(x.dtype(), Some(DType::Bool)) {
                    x = x.cast(DType::I64);
                }
                let dims = self.reduce_dims(&x, args, "dim")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                one(if op.starts_with("aten.sum") {
                    x.sum(&dims, keepdim)
                } else {
                    x.mean(&dims, keepdim)
                })
            }
            "aten.amax.default" | "aten.amin.default" | "aten.max.default" | "aten.min.default" => {
                let x = self.tensor(args, "self")?;
                let dims = self.reduce_dims(&x, args, "dim")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let x = if x.dtype() == Some(DType::Bool) {
                    x.cast(DType::I64)
                } else {
                    x
                };
                one(if op.contains("max") {
                    x.amax(&dims, keepdim)
                } else {
                    x.amin(&dims, keepdim)
                })
            }
            "aten.max.dim" | "aten.min.dim" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", None)? as isize;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let (v, i) = if op == "aten.max.dim" {
                    x.max_dim(d, keepdim)
                } else {
                    x.min_dim(d, keepdim)
                };
                Ok(vec![Value::Tensor(v), Value::Tensor(i)])
            }
            "aten.argmax.default" | "aten.argmin.default" => {
                let x = self.tensor(args, "self")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let (x, d) = match self.opt_size(args, "dim")? {
                    Some(_) => {
                        let d = self.dim_arg(&x, args, "dim", None)?;
                        (x, d)
                    }
                    None => (x.flatten(0, -1), 0),
                };
                one(if op == "aten.argmax.default" {
                    x.argmax(d as isize, keepdim)
                } else {
                    x.argmin(d as isize, keepdim)
                })
            }
            "aten.any.dim" | "aten.any.dims" | "aten.any.default" | "aten.all.dim"
            | "aten.all.default" => {
                let x = self.tensor(args, "self")?;
                let dims: Vec<isize> = if op.ends_with(".default") {
                    Vec::new()
                } else if op == "aten.any.dims" {
                    self.reduce_dims(&x, args, "dim")?
                } else {
                    vec![self.dim_arg(&x, args, "dim", None)? as isize]
                };
                let keepdim = self.boolean(args, "keepdim", false)?;
                let b = self.as_bool(&x);
                let f = b.where_(
                    &self.tracer.constant(1.0, DType::F32),
                    &self.tracer.constant(0.0, DType::F32),
                );
                one(if op.contains("any") {
                    f.amax(&dims, keepdim).gt(0.0)
                } else {
                    f.amin(&dims, keepdim).gt(0.0)
                })
            }
            "aten.var.correction"
            | "aten.var.dim"
            | "aten.std.correction"
            | "aten.std.dim"
            | "aten.var_mean.correction"
            | "aten.std_mean.correction" => {
                let x = self.tensor(args, "self")?;
                let mut dims = self.reduce_dims(&x, args, "dim")?;
                if dims.is_empty() {
                    dims = (0..x.rank() as isize).collect();
                }
                let keepdim = self.boolean(args, "keepdim", false)?;
                let correction = if op.ends_with(".dim") {
                    if self.boolean(args, "unbiased", true)? {
                        1
                    } else {
                        0
                    }
                } else {
                    self.float(args, "correction", Some(1.0))? as i64
                };
                if !(0..=1).contains(&correction) {
                    return Err(self.error(format!("correction {correction} (0 or 1 supported)")));
                }
                let mut axes: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
                axes.sort_unstable();
                let var = x.apply(
                    Op::Var {
                        axes,
                        correction: correction as usize,
                        keepdim,
                    },
                    &[&x],
                );
                let spread = if op.starts_with("aten.std") {
                    var.sqrt()
                } else {
                    var
                };
                if op.contains("_mean.") {
                    Ok(vec![
                        Value::Tensor(spread),
                        Value::Tensor(x.mean(&dims, keepdim)),
                    ])
                } else {
                    one(spread)
                }
            }
            "aten.linalg_vector_norm.default" => {
                let mut x = self.tensor(args, "self")?;
                if let Some(d) = self.dtype(args, "dtype")? {
                    x = x.cast(d);
                }
                let order = self.float(args, "ord", Some(2.0))?;
                let dims = self.reduce_dims(&x, args, "dim")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let a = x.abs();
                one(if order == 2.0 {
                    (&a * &a).sum(&dims, keepdim).sqrt()
                } else if order == 1.0 {
                    a.sum(&dims, keepdim)
                } else if order == f64::INFINITY {
                    a.amax(&dims, keepdim)
                } else if order == f64::NEG_INFINITY {
                    a.amin(&dims, keepdim)
                } else if order > 0.0 {
                    a.pow(order).sum(&dims, keepdim).pow(1.0 / order)
                } else {
                    return Err(self.error(format!("vector norm of order {order}")));
                })
            }
            "aten.logsumexp.default" => {
                let x = self.tensor(args, "self")?;
                let dims = self.reduce_dims(&x, args, "dim")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let s = x.logsumexp(&dims, true);
                one(self.keep_or_drop(s, x.rank(), &dims, keepdim))
            }
            "aten.cumsum.default" => {
                let mut x = self.tensor(args, "self")?;
                if let Some(d) = self.dtype(args, "dtype")? {
                    x = x.cast(d);
                } else if x.dtype() == Some(DType::Bool) {
                    x = x.cast(DType::I64);
                }
                let d = self.dim_arg(&x, args, "dim", None)?;
                one(x.cumsum(d as isize))
            }
            "aten._softmax.default"
            | "aten.softmax.int"
            | "aten._log_softmax.default"
            | "aten.log_softmax.int"
            | "aten._safe_softmax.default" => {
                let mut x = self.tensor(args, "self")?;
                if let Some(d) = self.dtype(args, "dtype")? {
                    x = x.cast(d);
                }
                let d = self.dim_arg(&x, args, "dim", None)? as isize;
                one(if op.contains("log") {
                    x.log_softmax(d)
                } else if op.contains("safe") {
                    // Rows that are all −inf give zeros instead of NaN.
                    let live = x
                        .ne(f64::NEG_INFINITY)
                        .where_(1.0, 0.0)
                        .amax(&[d], true)
                        .gt(0.0);
                    live.where_(&x.softmax(d), 0.0)
                } else {
                    x.softmax(d)
                })
            }

            // -- shapes and data movement
            "aten.view.default" | "aten._unsafe_view.default" | "aten.reshape.default" => {
                let x = self.tensor(args, "self")?;
                let key = if args.find("size").is_some() {
                    "size"
                } else {
                    "shape"
                };
                let shape = self.target_shape(&x, args, key)?;
                one(x.reshape_dims(shape))
            }
            "aten.expand.default" => {
                let x = self.tensor(args, "self")?;
                let shape = match self.output_type() {
                    Some(t) => t.shape,
                    None => {
                        let sizes = self.sizes(args, "size")?;
                        let own = x.ir_dims();
                        let lead = sizes.len().saturating_sub(own.len());
                        let mut shape = Shape::new();
                        for (i, e) in sizes.iter().enumerate() {
                            if e.as_const() == Some(-1) && i >= lead {
                                shape.push(own[i - lead]);
                            } else {
                                shape.push(
                                    Dim::of_expr(e)
                                        .ok_or_else(|| self.error(format!("size {e}")))?,
                                );
                            }
                        }
                        shape
                    }
                };
                one(x.expand_dims(shape))
            }
            "aten.permute.default" => {
                let x = self.tensor(args, "self")?;
                let dims: Vec<isize> = self
                    .ints(args, "dims", &[])?
                    .iter()
                    .map(|&d| d as isize)
                    .collect();
                one(x.permute(&dims))
            }
            "aten.transpose.int" => {
                let x = self.tensor(args, "self")?;
                let a = self.int(args, "dim0", None)? as isize;
                let b = self.int(args, "dim1", None)? as isize;
                one(x.transpose(a, b))
            }
            "aten.t.default" => {
                let x = self.tensor(args, "self")?;
                one(if x.rank() < 2 { x } else { x.transpose(0, 1) })
            }
            "aten.unsqueeze.default" => {
                let x = self.tensor(args, "self")?;
                one(x.unsqueeze(self.int(args, "dim", None)? as isize))
            }
            "aten.squeeze.dim" | "aten.squeeze.dims" | "aten.squeeze.default" => {
                let x = self.tensor(args, "self")?;
                let dims: Vec<usize> = match op {
                    "aten.squeeze.default" => (0..x.rank()).collect(),
                    "aten.squeeze.dim" => vec![self.dim_arg(&x, args, "dim", None)?],
                    _ => self
                        .reduce_dims(&x, args, "dim")?
                        .iter()
                        .map(|&d| d as usize)
                        .collect(),
                };
                let kept: Shape = x
                    .ir_dims()
                    .into_iter()
                    .enumerate()
                    .filter(|(i, d)| !(dims.contains(i) && *d == Dim::Static(1)))
                    .map(|(_, d)| d)
                    .collect();
                one(x.reshape_dims(kept))
            }
            "aten.flatten.using_ints" => {
                let x = self.tensor(args, "self")?;
                let s = self.int(args, "start_dim", Some(0))? as isize;
                let e = self.int(args, "end_dim", Some(-1))? as isize;
                one(x.flatten(s, e))
            }
            "aten.unflatten.int" => {
                let x = self.tensor(args, "self")?;
                let shape = self.target_shape(&x, args, "sizes")?;
                one(x.reshape_dims(shape))
            }
            "aten.slice.Tensor" => {
                let x = self.tensor(args, "self")?;
                let dim = self.int(args, "dim", Some(0))?;
                let start = self.opt_size(args, "start")?;
                let end = self.opt_size(args, "end")?;
                let step = self.int(args, "step", Some(1))?;
                one(self.slice(&x, dim, start, end, step)?)
            }
            "aten.select.int" => {
                let x = self.tensor(args, "self")?;
                let dim = self.int(args, "dim", None)?;
                let index = self.int(args, "index", None)?;
                one(self.select(&x, dim, index)?)
            }
            "aten.narrow.default" => {
                let x = self.tensor(args, "self")?;
                let dim = self.int(args, "dim", None)?;
                let start = self.size(&args.get(self, "start")?)?;
                let length = self.size(&args.get(self, "length")?)?;
                let end = start.plus(&length);
                one(self.slice(&x, dim, Some(start), Some(end), 1)?)
            }
            "aten.split.Tensor" | "aten.chunk.default" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", Some(0))?;
                let n = self.static_size(&x, d, "split")?;
                let size = if op == "aten.chunk.default" {
                    let chunks = self.int(args, "chunks", None)?.max(1) as usize;
                    n.div_ceil(chunks).max(1)
                } else {
                    self.int(args, "split_size", None)?.max(1) as usize
                };
                let mut sizes = Vec::new();
                let mut at = 0;
                while at < n || sizes.is_empty() {
                    sizes.push(size.min(n - at));
                    at += size;
                }
                self.split_sizes(&x, d as i64, &sizes)
            }
            "aten.split_with_sizes.default" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", Some(0))?;
                let sizes: Vec<usize> = self
                    .ints(args, "split_sizes", &[])?
                    .iter()
                    .map(|&s| s.max(0) as usize)
                    .collect();
                self.split_sizes(&x, d as i64, &sizes)
            }
            "aten.unbind.int" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", Some(0))?;
                let n = self.static_size(&x, d, "unbind")?;
                (0..n)
                    .map(|i| self.select(&x, d as i64, i as i64).map(Value::Tensor))
                    .collect()
            }
            "aten.cat.default" | "aten.stack.default" => {
                let tensors = self.tensors(args, "tensors")?;
                if tensors.is_empty() {
                    return Err(self.error("cat of no tensors"));
                }
                let tensors = self.promote(&tensors);
                let dim = self.int(args, "dim", Some(0))?;
                if op == "aten.stack.default" {
                    let d = normalize(dim, tensors[0].rank() + 1)
                        .ok_or_else(|| self.error(format!("dim {dim} out of range")))?;
                    let expanded: Vec<Traced> =
                        tensors.iter().map(|t| t.unsqueeze(d as isize)).collect();
                    let refs: Vec<&Traced> = expanded.iter().collect();
                    return one(Traced::cat(&refs, d as isize));
                }
                let refs: Vec<&Traced> = tensors.iter().collect();
                one(Traced::cat(&refs, dim as isize))
            }
            "aten.repeat.default" => {
                let x = self.tensor(args, "self")?;
                let repeats = self.ints(args, "repeats", &[])?;
                if repeats.len() < x.rank() || repeats.iter().any(|&r| r < 0) {
                    return Err(self.error(format!("repeats {repeats:?} for rank {}", x.rank())));
                }
                let mut own: Vec<Dim> = vec![Dim::Static(1); repeats.len() - x.rank()];
                own.extend(x.ir_dims());
                let interleaved: Shape = own.iter().flat_map(|&d| [Dim::Static(1), d]).collect();
                let expanded: Shape = own
                    .iter()
                    .zip(&repeats)
                    .flat_map(|(&d, &r)| [Dim::Static(r as usize), d])
                    .collect();
                let merged: Shape = own
                    .iter()
                    .zip(&repeats)
                    .map(|(&d, &r)| {
                        Dim::of_expr(&SizeExpr::of_dim(d).scale(r)).unwrap_or(Dim::Static(0))
                    })
                    .collect();
                one(x
                    .reshape_dims(interleaved)
                    .expand_dims(expanded)
                    .reshape_dims(merged))
            }
            "aten.index.Tensor" => {
                let x = self.tensor(args, "self")?;
                let indices = self.opt_tensors(args, "indices")?;
                one(self.index(&x, &indices)?)
            }
            "aten.index_select.default" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", None)?;
                let index = self.tensor(args, "index")?;
                let index = if index.rank() == 0 {
                    index.reshape(&[1])
                } else {
                    index
                };
                let mut indices: Vec<Option<Traced>> = vec![None; d];
                indices.push(Some(index));
                one(self.index(&x, &indices)?)
            }
            "aten.gather.default" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", None)?;
                let index = self.tensor(args, "index")?;
                one(x.gather(d as isize, &index))
            }
            "aten.embedding.default" => {
                let weight = self.tensor(args, "weight")?;
                let indices = self.tensor(args, "indices")?;
                let indices = if indices.dtype() == Some(DType::I64) {
                    indices
                } else {
                    indices.cast(DType::I64)
                };
                one(indices.embedding(&weight))
            }
            "aten.constant_pad_nd.default" => {
                let x = self.tensor(args, "self")?;
                let pad: Vec<isize> = self
                    .ints(args, "pad", &[])?
                    .iter()
                    .map(|&p| p as isize)
                    .collect();
                let value = self.float(args, "value", Some(0.0))?;
                one(x.pad(&pad, value))
            }
            "aten.tril.default" | "aten.triu.default" => {
                let x = self.tensor(args, "self")?;
                let k = self.int(args, "diagonal", Some(0))?;
                one(if op == "aten.tril.default" {
                    x.tril(k)
                } else {
                    x.triu(k)
                })
            }
            "aten.roll.default" => {
                let x = self.tensor(args, "self")?;
                let shifts = self.ints(args, "shifts", &[])?;
                let dims = self.ints(args, "dims", &[])?;
                let (mut y, flat) = if dims.is_empty() {
                    (x.flatten(0, -1), true)
                } else {
                    (x.clone(), false)
                };
                let dims = if flat { vec![0] } else { dims };
                if shifts.len() != dims.len() {
                    return Err(self.error(format!("shifts {shifts:?} for dims {dims:?}")));
                }
                for (&shift, &dim) in shifts.iter().zip(&dims) {
                    let d = normalize(dim, y.rank())
                        .ok_or_else(|| self.error(format!("dim {dim} out of range")))?;
                    let n = self.static_size(&y, d, "roll")? as i64;
                    if n == 0 {
                        continue;
                    }
                    let s = shift.rem_euclid(n);
                    if s == 0 {
                        continue;
                    }
                    let tail = self.slice(&y, d as i64, Some(SizeExpr::Const(n - s)), None, 1)?;
                    let head = self.slice(&y, d as i64, None, Some(SizeExpr::Const(n - s)), 1)?;
                    y = Traced::cat(&[&tail, &head], d as isize);
                }
                one(if flat {
                    y.reshape_dims(x.ir_dims().into_iter().collect())
                } else {
                    y
                })
            }
            "aten.upsample_nearest2d.default" | "aten.upsample_nearest2d.vec" => {
                let x = self
                    .tensor(args, "self")
                    .or_else(|_| self.tensor(args, "input"))?;
                if x.rank() != 4 {
                    return Err(self.error("upsample_nearest2d needs [N, C, H, W]"));
                }
                let (h, w) = (
                    self.static_size(&x, 2, "upsampling")?,
                    self.static_size(&x, 3, "upsampling")?,
                );
                let out = match self.output_type() {
                    Some(t) => (
                        t.shape.get(2).and_then(|d| d.as_static()),
                        t.shape.get(3).and_then(|d| d.as_static()),
                    ),
                    None => (None, None),
                };
                let (Some(oh), Some(ow)) = out else {
                    return Err(self.error("upsample_nearest2d without a static output size"));
                };
                // PyTorch's nearest index: floor(i * in / out) (scales given: floor(i / scale)).
                let scales: Vec<f64> = match args.find("scale_factors") {
                    Some(a) if a.union()?.0 == "as_floats" => a
                        .union()?
                        .1
                        .array()?
                        .iter()
                        .map(|v| v.float())
                        .collect::<Result<_, _>>()?,
                    _ => {
                        let sh = self.opt_float(args, "scales_h")?;
                        let sw = self.opt_float(args, "scales_w")?;
                        match (sh, sw) {
                            (Some(a), Some(b)) => vec![a, b],
                            _ => Vec::new(),
                        }
                    }
                };
                let ratio = |i: usize, n: usize, o: usize| match scales.get(i) {
                    Some(&s) if s > 0.0 => 1.0 / s,
                    _ => n as f64 / o as f64,
                };
                let mut y = x.clone();
                for (axis, n, o, r) in [(2, h, oh, ratio(0, h, oh)), (3, w, ow, ratio(1, w, ow))] {
                    let positions = (self.tracer.arange(o, DType::F32) * (r as f32 as f64))
                        .cast(DType::I64)
                        .minimum(&self.tracer.constant((n - 1) as f64, DType::I64));
                    y = self.take_along_dim(&y, axis, &positions, 4);
                }
                one(y)
            }
            "aten.diff.default" => {
                let x = self.tensor(args, "self")?;
                let n = self.int(args, "n", Some(1))?;
                let d = self.dim_arg(&x, args, "dim", Some(-1))?;
                let mut pieces = Vec::new();
                if let Some(p) = self.opt_tensor(args, "prepend")? {
                    pieces.push(p);
                }
                pieces.push(x.clone());
                if let Some(a) = self.opt_tensor(args, "append")? {
                    pieces.push(a);
                }
                let mut y = if pieces.len() == 1 {
                    x.clone()
                } else {
                    let pieces = self.promote(&pieces);
                    let refs: Vec<&Traced> = pieces.iter().collect();
                    Traced::cat(&refs, d as isize)
                };
                if y.dtype() == Some(DType::Bool) {
                    return Err(self.error("diff of a bool tensor is not supported"));
                }
                for _ in 0..n.max(0) {
                    let hi = self.slice(&y, d as i64, Some(SizeExpr::Const(1)), None, 1)?;
                    let lo = self.slice(&y, d as i64, None, Some(SizeExpr::Const(-1)), 1)?;
                    y = hi - lo;
                }
                one(y)
            }

            // -- matrix products and layers
            "aten.linear.default" => {
                let x = self.tensor(args, "input")?;
                let w = self.tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                one(x.linear(&w, b.as_ref()))
            }
            "aten.addmm.default" | "aten.baddbmm.default" => {
                let bias = self.tensor(args, "self")?;
                let (a, b) = if op == "aten.addmm.default" {
                    (self.tensor(args, "mat1")?, self.tensor(args, "mat2")?)
                } else {
                    (self.tensor(args, "batch1")?, self.tensor(args, "batch2")?)
                };
                let beta = self.float(args, "beta", Some(1.0))?;
                let alpha = self.float(args, "alpha", Some(1.0))?;
                let mut product = a.matmul(&b);
                if alpha != 1.0 {
                    product = product * alpha;
                }
                one(if beta == 0.0 {
                    product
                } else if beta == 1.0 {
                    product + bias
                } else {
                    product + bias * beta
                })
            }
            "aten.mm.default" | "aten.matmul.default" => {
                let x = self.tensor(args, "self")?;
                let key = if args.find("mat2").is_some() {
                    "mat2"
                } else {
                    "other"
                };
                one(x.matmul(&self.tensor(args, key)?))
            }
            "aten.bmm.default" => {
                let x = self.tensor(args, "self")?;
                one(x.bmm(&self.tensor(args, "mat2")?))
            }
            "aten.conv1d.default" | "aten.conv2d.default" | "aten.convolution.default" => {
                let x = self.tensor(args, "input")?;
                let w = self.tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                if self.boolean(args, "transposed", false)? {
                    return Err(self.error("transposed convolution is not supported"));
                }
                let stride = self.ints(args, "stride", &[1])?;
                let padding = match self.string(args, "padding")?.as_deref() {
                    Some("valid") => vec![0],
                    Some(other) => {
                        return Err(self.error(format!("padding={other:?} is not supported")))
                    }
                    None => self.ints(args, "padding", &[0])?,
                };
                let dilation = self.ints(args, "dilation", &[1])?;
                let groups = self.int(args, "groups", Some(1))?;
                one(self.convolution(&x, &w, b.as_ref(), &stride, &padding, &dilation, groups)?)
            }
            "aten.batch_norm.default"
            | "aten.native_batch_norm.default"
            | "aten._native_batch_norm_legit_no_training.default" => {
                let x = self.tensor(args, "input")?;
                let w = self.opt_tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                let mean = self.opt_tensor(args, "running_mean")?;
                let var = self.opt_tensor(args, "running_var")?;
                if self.boolean(args, "training", false)? {
                    return Err(
                        self.error("batch norm in training mode (export the module in eval mode)")
                    );
                }
                let (Some(mean), Some(var)) = (mean, var) else {
                    return Err(self.error("batch norm without running statistics"));
                };
                let eps = self.float(args, "eps", Some(1e-5))?;
                let y = x.batch_norm(&mean, &var, w.as_ref(), b.as_ref(), eps);
                if op == "aten.batch_norm.default" {
                    return one(y);
                }
                Ok(vec![
                    Value::Tensor(y),
                    Value::Missing("the saved mean of a batch norm is not computed".into()),
                    Value::Missing("the saved inverse std of a batch norm is not computed".into()),
                ])
            }
            "aten.layer_norm.default" | "aten.native_layer_norm.default" => {
                let x = self.tensor(args, "input")?;
                let shape: Vec<usize> = self
                    .ints(args, "normalized_shape", &[])?
                    .iter()
                    .map(|&n| n.max(0) as usize)
                    .collect();
                let w = self.opt_tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                let eps = self.float(args, "eps", Some(1e-5))?;
                let y = x.layer_norm(&shape, w.as_ref(), b.as_ref(), eps);
                if op == "aten.layer_norm.default" {
                    return one(y);
                }
                Ok(vec![
                    Value::Tensor(y),
                    Value::Missing("the mean output of native_layer_norm is not computed".into()),
                    Value::Missing("the rstd output of native_layer_norm is not computed".into()),
                ])
            }
            "aten.group_norm.default" | "aten.native_group_norm.default" => {
                let x = self.tensor(args, "input")?;
                let groups = if op == "aten.group_norm.default" {
                    self.int(args, "num_groups", None)?
                } else {
                    self.int(args, "group", None)?
                };
                let w = self.opt_tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                let eps = self.float(args, "eps", Some(1e-5))?;
                let dims = x.ir_dims();
                if dims.len() < 2 || groups <= 0 {
                    return Err(self.error("group norm needs [N, C, ..] and positive groups"));
                }
                let c = self.static_size(&x, 1, "group norm")?;
                let g = groups as usize;
                if c % g != 0 {
                    return Err(self.error(format!("{c} channels do not split into {g} groups")));
                }
                let mut rest = c / g;
                for d in 2..dims.len() {
                    rest *= self.static_size(&x, d, "group norm")?;
                }
                let grouped = x.reshape_dims(
                    [dims[0], Dim::Static(g), Dim::Static(rest)]
                        .into_iter()
                        .collect(),
                );
                let normalized = grouped.layer_norm(&[rest], None, None, eps);
                let mut y = normalized.reshape_dims(dims.iter().copied().collect());
                let mut per_channel: Vec<isize> = vec![1; dims.len() - 1];
                per_channel[0] = -1;
                if let Some(w) = w {
                    y = y * w.reshape(&per_channel);
                }
                if let Some(b) = b {
                    y = y + b.reshape(&per_channel);
                }
                if op == "aten.group_norm.default" {
                    return one(y);
                }
                Ok(vec![
                    Value::Tensor(y),
                    Value::Missing("the mean output of native_group_norm is not computed".into()),
                    Value::Missing("the rstd output of native_group_norm is not computed".into()),
                ])
            }
            "aten.max_pool2d.default" | "aten.max_pool2d_with_indices.default" => {
                let x = self.tensor(args, "self")?;
                let options = self.pool_options(args)?;
                let y = x.max_pool2d_with(options);
                if op == "aten.max_pool2d.default" {
                    return one(y);
                }
                Ok(vec![
                    Value::Tensor(y),
                    Value::Missing(
                        "the indices of max_pool2d_with_indices are not computed".into(),
                    ),
                ])
            }
            "aten.avg_pool2d.default" => {
                let x = self.tensor(args, "self")?;
                let options = self.pool_options(args)?;
                if options.ceil_mode
                    || !self.boolean(args, "count_include_pad", true)?
                    || self.opt_float(args, "divisor_override")?.is_some()
                {
                    return Err(self.error(
                        "avg_pool2d with ceil_mode, count_include_pad=False or divisor_override",
                    ));
                }
                one(x.avg_pool2d_with(options.kernel, options.stride, options.padding))
            }
            "aten.adaptive_avg_pool2d.default" | "aten._adaptive_avg_pool2d.default" => {
                let x = self.tensor(args, "self")?;
                let size = self.ints(args, "output_size", &[])?;
                let (h, w) = self.pair(&size, "output_size", 1)?;
                one(x.adaptive_avg_pool2d((h, w)))
            }
            "aten.scaled_dot_product_attention.default" => {
                let q = self.tensor(args, "query")?;
                let mut k = self.tensor(args, "key")?;
                let mut v = self.tensor(args, "value")?;
                let mask = self.opt_tensor(args, "attn_mask")?;
                if self.float(args, "dropout_p", Some(0.0))? != 0.0 {
                    return Err(self.error("attention dropout (export the module in eval mode)"));
                }
                let causal = self.boolean(args, "is_causal", false)?;
                let scale = self.opt_float(args, "scale")?;
                if self.boolean(args, "enable_gqa", false)? && q.rank() >= 3 {
                    let hq = self.static_size(&q, q.rank() - 3, "grouped-query attention")?;
                    let hk = self.static_size(&k, k.rank() - 3, "grouped-query attention")?;
                    if hk != hq && hk > 0 && hq % hk == 0 {
                        let r = hq / hk;
                        k = k.repeat_interleave(r, -3);
                        v = v.repeat_interleave(r, -3);
                    }
                }
                let head = self.static_size(&q, q.rank().saturating_sub(1), "attention")?;
                let q = match scale {
                    Some(s)
                        if (s - 1.0 / (head as f64).sqrt()).abs() > 1e-12 * s.abs().max(1.0) =>
                    {
                        &q * (s * (head as f64).sqrt())
                    }
                    _ => q,
                };
                one(q.scaled_dot_product_attention(&k, &v, mask.as_ref(), causal))
            }
            other => Err(self.error(format!(
                "`{other}` is listed as supported but has no import rule (an importer bug)"
            ))),
        }
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
