//! The graph text format read back: `Graph::from_str(&graph.to_string())` rebuilds the graph.
//!
//! Every node is re-added through [`Graph::add`] (so its type is re-derived by the op's rule) and
//! the printed type must agree; inputs and constants take their printed types. The result is a
//! graph that verifies, or a [`ParseError`] naming the line.

use crate::text::{Cursor, ParseError};
use crate::{
    BinaryOp, CompareOp, DType, Graph, NodeId, Op, ReduceOp, SliceFrom, TensorType, UnaryOp,
};
use std::str::FromStr;

impl FromStr for Graph {
    type Err = ParseError;

    /// Parses the text [`Graph`]'s `Display` writes.
    fn from_str(text: &str) -> Result<Graph, ParseError> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        let (n, header) = lines
            .next()
            .ok_or_else(|| ParseError::new(1, "empty text: expected `graph(…) {`"))?;
        if !(header.starts_with("graph(") && header.ends_with(") {")) {
            return Err(Cursor::new(header, n).error("`graph(…) {`"));
        }
        let mut graph = Graph::new();
        let mut returned = false;
        let mut closed = false;
        for (n, line) in lines {
            if closed {
                return Err(Cursor::new(line, n).error("nothing after the closing `}`"));
            }
            let mut c = Cursor::new(line, n);
            if returned {
                c.eat("}")?;
                c.end()?;
                closed = true;
            } else if c.try_eat("  return") {
                let mut outputs = Vec::new();
                if c.try_eat(" ") {
                    outputs = operand_list(&mut c, &graph)?;
                }
                c.end()?;
                graph.set_outputs(outputs);
                returned = true;
            } else {
                node(&mut c, &mut graph)?;
            }
        }
        if !closed {
            return Err(ParseError::new(
                text.lines().count() + 1,
                "the text ends before `  return …` and `}`",
            ));
        }
        graph
            .verify()
            .map_err(|e| ParseError::new(0, format!("the parsed graph does not verify: {e}")))?;
        Ok(graph)
    }
}

/// `%i, %j, …`: ids of nodes already parsed.
fn operand_list(c: &mut Cursor, graph: &Graph) -> Result<Vec<NodeId>, ParseError> {
    let mut out = Vec::new();
    loop {
        let save = c.clone();
        c.eat("%")?;
        let id = c.u32()?;
        if id as usize >= graph.len() {
            return Err(save.error("an earlier node"));
        }
        out.push(NodeId(id));
        if !c.try_eat(", ") {
            return Ok(out);
        }
    }
}

/// One `  %i = op[attributes] %a, %b : type` line.
fn node(c: &mut Cursor, graph: &mut Graph) -> Result<(), ParseError> {
    c.eat("  %")?;
    let at = c.clone();
    if c.u32()? as usize != graph.len() {
        return Err(at.error(&format!("node number {}", graph.len())));
    }
    c.eat(" = ")?;
    // The type follows the last ` : ` (an input's name may hold one).
    let rest = c.rest();
    let split = rest.rfind(" : ").ok_or_else(|| c.error("`op … : type`"))?;
    let mut ty_cursor = Cursor::new(&rest[split + 3..], c.line());
    let ty = ty_cursor.tensor_type()?;
    ty_cursor.end()?;
    let mut c = Cursor::new(&rest[..split], c.line());
    if c.try_eat("input[") {
        let name = c
            .rest()
            .strip_suffix(']')
            .ok_or_else(|| c.error("`]` closing the input's name"))?;
        graph.input(name, ty);
        return Ok(());
    }
    let name = c.word()?;
    let mut op = attributes(&mut c, name)?;
    let mut operands = Vec::new();
    if c.try_eat(" ") {
        operands = operand_list(&mut c, graph)?;
    }
    c.end()?;
    match &mut op {
        Op::Constant { value } => {
            if !operands.is_empty() || ty.rank() != 0 {
                return Err(ParseError::new(
                    c.line(),
                    "a constant has no operands and a 0-d type",
                ));
            }
            graph.constant(*value, ty.dtype);
            return Ok(());
        }
        // Flags the text leaves to the operand count.
        Op::Linear { has_bias } => *has_bias = operands.len() == 3,
        // `weight only`/`bias only` set one flag already; otherwise the count says.
        Op::LayerNorm {
            has_weight,
            has_bias,
            ..
        } if !*has_weight && !*has_bias && operands.len() == 3 => {
            (*has_weight, *has_bias) = (true, true);
        }
        _ => {}
    }
    let id = graph
        .add(op, &operands)
        .map_err(|e| ParseError::new(c.line(), e.to_string()))?;
    if graph.ty(id) != &ty {
        return Err(ParseError::new(
            c.line(),
            format!("printed type {ty} but the op's rule gives {}", graph.ty(id)),
        ));
    }
    Ok(())
}

/// An op as `Op`'s `Display` writes it: its name and its attributes (`reduce_sum[axes=[1],
/// keepdim=false]`). Flags the graph text leaves to the operand count (`linear`'s bias,
/// `layer_norm`'s weight and bias) are left unset: the kernel-program text names only prims.
pub fn parse_op(c: &mut Cursor) -> Result<Op, ParseError> {
    let name = c.word()?;
    attributes(c, name)
}

/// The op named `name` with the attributes that follow it (`[…]`, when it has any).
fn attributes(c: &mut Cursor, name: &str) -> Result<Op, ParseError> {
    let unary = |u| Ok(Op::Unary(u));
    let binary = |b| Ok(Op::Binary(b));
    let compare = |b| Ok(Op::Compare(b));
    let usizes = |c: &mut Cursor| c.list(|c| c.usize());
    let dim_attr = |c: &mut Cursor| -> Result<usize, ParseError> {
        c.eat("[dim=")?;
        let dim = c.usize()?;
        c.eat("]")?;
        Ok(dim)
    };
    let reduce = |c: &mut Cursor, op: ReduceOp| -> Result<Op, ParseError> {
        c.eat("[axes=")?;
        let axes = usizes(c)?;
        c.eat(", keepdim=")?;
        let keepdim = c.bool()?;
        c.eat("]")?;
        Ok(Op::Reduce { op, axes, keepdim })
    };
    let option = |c: &mut Cursor| -> Result<Option<f64>, ParseError> {
        if c.try_eat("None") {
            return Ok(None);
        }
        c.eat("Some(")?;
        let v = c.f64(&[')'])?;
        c.eat(")")?;
        Ok(Some(v))
    };
    match name {
        "constant" => {
            c.eat("[")?;
            let value = c.f64(&[']'])?;
            c.eat("]")?;
            Ok(Op::Constant { value })
        }
        "neg" => unary(UnaryOp::Neg),
        "abs" => unary(UnaryOp::Abs),
        "exp" => unary(UnaryOp::Exp),
        "log" => unary(UnaryOp::Log),
        "sqrt" => unary(UnaryOp::Sqrt),
        "rsqrt" => unary(UnaryOp::Rsqrt),
        "sin" => unary(UnaryOp::Sin),
        "cos" => unary(UnaryOp::Cos),
        "tanh" => unary(UnaryOp::Tanh),
        "erf" => unary(UnaryOp::Erf),
        "sigmoid" => unary(UnaryOp::Sigmoid),
        "add" => binary(BinaryOp::Add),
        "sub" => binary(BinaryOp::Sub),
        "mul" => binary(BinaryOp::Mul),
        "div" => binary(BinaryOp::Div),
        "maximum" => binary(BinaryOp::Maximum),
        "minimum" => binary(BinaryOp::Minimum),
        "pow" => binary(BinaryOp::Pow),
        "eq" => compare(CompareOp::Eq),
        "ne" => compare(CompareOp::Ne),
        "lt" => compare(CompareOp::Lt),
        "le" => compare(CompareOp::Le),
        "gt" => compare(CompareOp::Gt),
        "ge" => compare(CompareOp::Ge),
        "where" => Ok(Op::Where),
        "cast" => {
            c.eat("[")?;
            let dtype = c.dtype()?;
            c.eat("]")?;
            Ok(Op::Cast { dtype })
        }
        "reduce_sum" => reduce(c, ReduceOp::Sum),
        "reduce_max" => reduce(c, ReduceOp::Max),
        "reduce_min" => reduce(c, ReduceOp::Min),
        "mean" => match reduce(c, ReduceOp::Sum)? {
            Op::Reduce { axes, keepdim, .. } => Ok(Op::Mean { axes, keepdim }),
            _ => unreachable!("reduce returns a Reduce"),
        },
        "var" => {
            c.eat("[axes=")?;
            let axes = usizes(c)?;
            c.eat(", correction=")?;
            let correction = c.usize()?;
            c.eat(", keepdim=")?;
            let keepdim = c.bool()?;
            c.eat("]")?;
            Ok(Op::Var {
                axes,
                correction,
                keepdim,
            })
        }
        "reshape" | "expand" => {
            c.eat("[")?;
            let shape = c.dims()?.into();
            c.eat("]")?;
            Ok(if name == "reshape" {
                Op::Reshape { shape }
            } else {
                Op::Expand { shape }
            })
        }
        "permute" => {
            c.eat("[")?;
            let perm = usizes(c)?;
            c.eat("]")?;
            Ok(Op::Permute { perm })
        }
        "slice" => {
            c.eat("[dim=")?;
            let dim = c.usize()?;
            c.eat(", ")?;
            let start_from_end = c.try_eat("end-");
            let start = c.usize()?;
            c.eat(":")?;
            let end_from_end = c.try_eat("end-");
            let from = match (start_from_end, end_from_end) {
                (false, false) => SliceFrom::Start,
                (true, true) => SliceFrom::End,
                (false, true) => SliceFrom::StartToEnd,
                (true, false) => return Err(c.error("`end-` before the end bound too")),
            };
            let end = c.usize()?;
            c.eat(":")?;
            let step = c.usize()?;
            c.eat("]")?;
            Ok(Op::Slice {
                dim,
                start,
                end,
                step,
                from,
            })
        }
        "cat" => Ok(Op::Cat { dim: dim_attr(c)? }),
        "softmax" => Ok(Op::Softmax { dim: dim_attr(c)? }),
        "log_softmax" => Ok(Op::LogSoftmax { dim: dim_attr(c)? }),
        "take_along" => Ok(Op::TakeAlong { dim: dim_attr(c)? }),
        "cumsum" => Ok(Op::CumSum { dim: dim_attr(c)? }),
        "gather" => Ok(Op::Gather),
        "matmul" => Ok(Op::Matmul),
        "detach" => Ok(Op::Detach),
        "scatter_add" => {
            c.eat("[dim=")?;
            let dim = c.usize()?;
            c.eat(", size=")?;
            let size = c.dim()?;
            c.eat("]")?;
            Ok(Op::ScatterAdd { dim, size })
        }
        "im2col" => {
            c.eat("[")?;
            let window = window2d(c)?;
            c.eat("]")?;
            Ok(Op::Im2col { window })
        }
        "iota" => {
            c.eat("[len=")?;
            let len = c.dim()?;
            c.eat(", ")?;
            let dtype: DType = c.dtype()?;
            c.eat("]")?;
            Ok(Op::Iota { len, dtype })
        }
        "grad" => {
            c.eat("[wrt=")?;
            let index = c.usize()?;
            let seeded = c.try_eat(", seeded");
            c.eat("]")?;
            Ok(Op::Grad { index, seeded })
        }
        "relu" => Ok(Op::Relu),
        "silu" => Ok(Op::Silu),
        "reciprocal" => Ok(Op::Reciprocal),
        "gelu" => Ok(Op::Gelu {
            tanh: c.try_eat("[tanh]"),
        }),
        "clamp" => {
            c.eat("[min=")?;
            let min = option(c)?;
            c.eat(", max=")?;
            let max = option(c)?;
            c.eat("]")?;
            Ok(Op::Clamp { min, max })
        }
        "layer_norm" => {
            c.eat("[normalized_rank=")?;
            let normalized_rank = c.usize()?;
            c.eat(", eps=")?;
            let eps = c.f64(&[',', ']'])?;
            let (has_weight, has_bias) = if c.try_eat(", weight only") {
                (true, false)
            } else if c.try_eat(", bias only") {
                (false, true)
            } else {
                (false, false)
            };
            c.eat("]")?;
            Ok(Op::LayerNorm {
                normalized_rank,
                eps,
                has_weight,
                has_bias,
            })
        }
        "linear" => Ok(Op::Linear { has_bias: false }),
        _ => Err(ParseError::new(c.line(), format!("unknown op `{name}`"))),
    }
}

/// Parses a tensor type as printed (`f32[4, s0]`).
pub fn parse_tensor_type(text: &str) -> Result<TensorType, ParseError> {
    let mut c = Cursor::new(text, 1);
    let ty = c.tensor_type()?;
    c.end()?;
    Ok(ty)
}

/// A [`Window2d`] as it prints: `kernel=3x3, stride=1x1, padding=1x1, dilation=1x1`.
pub fn window2d(c: &mut Cursor) -> Result<crate::op::Window2d, ParseError> {
    fn pair(c: &mut Cursor, name: &str) -> Result<[usize; 2], ParseError> {
        c.eat(name)?;
        let a = c.usize()?;
        c.eat("x")?;
        Ok([a, c.usize()?])
    }
    let kernel = pair(c, "kernel=")?;
    let stride = pair(c, ", stride=")?;
    let padding = pair(c, ", padding=")?;
    let dilation = pair(c, ", dilation=")?;
    Ok(crate::op::Window2d {
        kernel,
        stride,
        padding,
        dilation,
    })
}
