//! The kernel-program text format read back: `Program::from_str(&program.to_string())` rebuilds
//! the program, its buffer plan included (print → parse → print is the identity, and the parsed
//! program equals the printed one).
//!
//! The parser checks the syntax and that every buffer id names a declared buffer; everything
//! else (expression ids and types, index ranges, the plan's safety) is the verifier's job
//! (`verify_program`), which every consumer of a parsed program runs before code generation.
//! The plan's live ranges are recomputed from the steps (the text prints them only for slot
//! members, and they must agree).

use crate::kernel::*;
use crate::plan::{live_ranges, BufferPlan, Slot};
use minductor_ir::text::{Cursor, ParseError};
use minductor_ir::{BinaryOp, CompareOp, NodeId, ReduceOp, SizeExpr, UnaryOp};
use std::str::FromStr;

impl FromStr for Program {
    type Err = ParseError;

    /// Parses the text [`Program`]'s `Display` writes.
    fn from_str(text: &str) -> Result<Program, ParseError> {
        Parser {
            lines: text.lines().enumerate().map(|(i, l)| (i + 1, l)).collect(),
            at: 0,
            buffers: 0,
        }
        .program()
    }
}

/// Parses one kernel as `Kernel`'s `Display` writes it (a header line, expression lines, stage
/// lines).
pub fn parse_kernel(text: &str, buffers: usize) -> Result<Kernel, ParseError> {
    let mut p = Parser {
        lines: text.lines().enumerate().map(|(i, l)| (i + 1, l)).collect(),
        at: 0,
        buffers,
    };
    let (n, header) = p.next_line("`kernel …`")?;
    let mut c = Cursor::new(header, n);
    let kernel = p.kernel(&mut c)?;
    match p.peek() {
        None => Ok(kernel),
        Some((n, line)) => Err(Cursor::new(line, n).error("the end of the kernel")),
    }
}

struct Parser<'a> {
    lines: Vec<(usize, &'a str)>,
    at: usize,
    /// How many buffers the program declares (ids must be below).
    buffers: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<(usize, &'a str)> {
        self.lines.get(self.at).copied()
    }

    fn next_line(&mut self, expected: &str) -> Result<(usize, &'a str), ParseError> {
        let line = self.peek().ok_or_else(|| {
            ParseError::new(
                self.lines.last().map_or(1, |l| l.0 + 1),
                format!("the text ends where {expected} was expected"),
            )
        })?;
        self.at += 1;
        Ok(line)
    }

    fn program(mut self) -> Result<Program, ParseError> {
        let (n, line) = self.next_line("`buffers:`")?;
        let mut c = Cursor::new(line, n);
        c.eat("buffers:")?;
        c.end()?;
        let mut program = Program::default();
        while let Some((n, line)) = self.peek() {
            if !line.starts_with("  buf") {
                break;
            }
            self.at += 1;
            program
                .buffers
                .push(buffer_line(line, n, program.buffers.len())?);
        }
        self.buffers = program.buffers.len();
        loop {
            let (n, line) = self.next_line("a step or `outputs:`")?;
            let mut c = Cursor::new(line, n);
            if c.try_eat("kernel ") {
                program.steps.push(Step::Kernel(self.kernel(&mut c)?));
            } else if c.try_eat("matmul ") {
                let mut m = self.matmul(&mut c)?;
                if let Some((n, line)) = self.peek() {
                    let mut c = Cursor::new(line, n);
                    if c.try_eat("epilogue of ") {
                        self.at += 1;
                        let at = c.clone();
                        if self.buffer(&mut c)? != m.out {
                            return Err(at.error(&format!("the GEMM's output {}", m.out)));
                        }
                        c.eat(": kernel ")?;
                        m.epilogue = Some(self.kernel(&mut c)?);
                    }
                }
                program.steps.push(Step::Matmul(m));
            } else if c.try_eat("scatter_add ") {
                program
                    .steps
                    .push(Step::ScatterAdd(self.scatter_add(&mut c)?));
            } else if c.try_eat("attention ") {
                let step = self.attention(&mut c, &program.buffers)?;
                program.steps.push(Step::Attention(step));
            } else if c.try_eat("fallback ") {
                program.steps.push(Step::Fallback(self.fallback(&mut c)?));
            } else if c.try_eat("outputs:") {
                if c.try_eat(" ") && !c.is_empty() {
                    loop {
                        program.outputs.push(self.buffer(&mut c)?);
                        if !c.try_eat(", ") {
                            break;
                        }
                    }
                }
                c.end()?;
                break;
            } else {
                return Err(c.error(
                    "`kernel`, `matmul`, `scatter_add`, `attention`, `fallback` or `outputs:`",
                ));
            }
        }
        while let Some((n, line)) = self.peek() {
            let mut c = Cursor::new(line, n);
            if !c.try_eat("index check: ") {
                break;
            }
            self.at += 1;
            let buffer = self.buffer(&mut c)?;
            c.eat(" in 0..")?;
            let bound = SizeExpr::parse(&mut c)?;
            c.eat(" before step ")?;
            let step = c.usize()?;
            c.end()?;
            program.index_checks.push(IndexCheck {
                buffer,
                bound,
                step,
            });
        }
        if self.peek().is_some() {
            program.plan = Some(self.plan(&program)?);
        }
        if let Some((n, line)) = self.peek() {
            return Err(Cursor::new(line, n).error("the end of the program"));
        }
        Ok(program)
    }

    /// `bufN`, a declared buffer.
    fn buffer(&self, c: &mut Cursor) -> Result<BufferId, ParseError> {
        let at = c.clone();
        c.eat("buf")?;
        let id = c.u32()?;
        if id as usize >= self.buffers {
            return Err(at.error(&format!("one of the {} declared buffers", self.buffers)));
        }
        Ok(BufferId(id))
    }

    /// The rest of `kernel NAME outer=[…] [order=outer_reduction] fuses %a %b`, then its expression and stage lines.
    fn kernel(&mut self, c: &mut Cursor) -> Result<Kernel, ParseError> {
        let name = c.until(" outer=")?;
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(ParseError::new(
                c.line(),
                format!("kernel name `{name}` is empty or holds spaces"),
            ));
        }
        let outer = c.dims()?;
        let order = if c.try_eat(" order=outer_reduction") {
            LoopOrder::OuterReduction
        } else {
            LoopOrder::Inner
        };
        c.eat(" fuses")?;
        let mut nodes = Vec::new();
        if c.try_eat(" ") {
            while !c.is_empty() {
                c.eat("%")?;
                nodes.push(NodeId(c.u32()?));
                if !c.try_eat(" ") {
                    break;
                }
            }
        }
        c.end()?;
        let mut kernel = Kernel {
            name: name.to_string(),
            outer,
            order,
            stages: Vec::new(),
            exprs: Vec::new(),
            types: Vec::new(),
            nodes,
        };
        while let Some((n, line)) = self.peek() {
            let mut c = Cursor::new(line, n);
            if c.try_eat("  e") {
                self.at += 1;
                self.expr_line(&mut c, &mut kernel)?;
            } else if c.try_eat("  stage") {
                self.at += 1;
                self.stage_line(&mut c, &mut kernel)?;
            } else {
                break;
            }
        }
        Ok(kernel)
    }

    /// The rest of `  eN: Type = expression`.
    fn expr_line(&self, c: &mut Cursor, kernel: &mut Kernel) -> Result<(), ParseError> {
        let at = c.clone();
        if c.u32()? as usize != kernel.exprs.len() {
            return Err(at.error(&format!("expression number {}", kernel.exprs.len())));
        }
        c.eat(": ")?;
        let ty = if c.try_eat("F32") {
            ScalarType::F32
        } else if c.try_eat("I64") {
            ScalarType::I64
        } else if c.try_eat("Bool") {
            ScalarType::Bool
        } else {
            return Err(c.error("`F32`, `I64` or `Bool`"));
        };
        c.eat(" = ")?;
        let expr = self.expr(c, ty)?;
        c.end()?;
        kernel.exprs.push(expr);
        kernel.types.push(ty);
        Ok(())
    }

    fn expr(&self, c: &mut Cursor, ty: ScalarType) -> Result<Expr, ParseError> {
        if c.try_eat("load ") {
            let buffer = self.buffer(c)?;
            c.eat("[")?;
            let (index, indirect) = affine(c, true)?;
            c.eat("]")?;
            return Ok(Expr::Load {
                buffer,
                index,
                indirect,
            });
        }
        if c.try_eat("index ") {
            let (index, _) = affine(c, false)?;
            return Ok(Expr::Index(index));
        }
        if c.try_eat("cast[") {
            let dtype = c.dtype()?;
            c.eat("] ")?;
            return Ok(Expr::Cast(dtype, expr_id(c)?));
        }
        if c.try_eat("stage") {
            return Ok(Expr::StageResult(c.u32()?));
        }
        let save = c.clone();
        let word = c.take_while(|ch| ch.is_ascii_lowercase());
        let unary = |u, c: &mut Cursor| Ok(Expr::Unary(u, expr_id(c)?));
        let two = |c: &mut Cursor| -> Result<(ExprId, ExprId), ParseError> {
            let a = expr_id(c)?;
            c.eat(", ")?;
            Ok((a, expr_id(c)?))
        };
        let binary = |b, c: &mut Cursor| {
            let (x, y) = two(c)?;
            Ok(Expr::Binary(b, x, y))
        };
        let compare = |b, c: &mut Cursor| {
            let (x, y) = two(c)?;
            Ok(Expr::Compare(b, x, y))
        };
        if !word.is_empty() && c.try_eat(" ") {
            return match word {
                "neg" => unary(UnaryOp::Neg, c),
                "abs" => unary(UnaryOp::Abs, c),
                "exp" => unary(UnaryOp::Exp, c),
                "log" => unary(UnaryOp::Log, c),
                "sqrt" => unary(UnaryOp::Sqrt, c),
                "rsqrt" => unary(UnaryOp::Rsqrt, c),
                "sin" => unary(UnaryOp::Sin, c),
                "cos" => unary(UnaryOp::Cos, c),
                "tanh" => unary(UnaryOp::Tanh, c),
                "erf" => unary(UnaryOp::Erf, c),
                "sigmoid" => unary(UnaryOp::Sigmoid, c),
                "add" => binary(BinaryOp::Add, c),
                "sub" => binary(BinaryOp::Sub, c),
                "mul" => binary(BinaryOp::Mul, c),
                "div" => binary(BinaryOp::Div, c),
                "maximum" => binary(BinaryOp::Maximum, c),
                "minimum" => binary(BinaryOp::Minimum, c),
                "pow" => binary(BinaryOp::Pow, c),
                "eq" => compare(CompareOp::Eq, c),
                "ne" => compare(CompareOp::Ne, c),
                "lt" => compare(CompareOp::Lt, c),
                "le" => compare(CompareOp::Le, c),
                "gt" => compare(CompareOp::Gt, c),
                "ge" => compare(CompareOp::Ge, c),
                "where" => {
                    let (x, y) = two(c)?;
                    c.eat(", ")?;
                    Ok(Expr::Where(x, y, expr_id(c)?))
                }
                _ => Err(save.error("an expression")),
            };
        }
        // A constant: the rest of the line is an `f64` as `{:?}` prints it.
        *c = save;
        let value = c.f64(&[])?;
        Ok(Expr::Constant { value, ty })
    }

    /// The rest of `  stageN over [extent]: action`. A store stage with several stores prints
    /// one line per store, each with the same stage number.
    fn stage_line(&self, c: &mut Cursor, kernel: &mut Kernel) -> Result<(), ParseError> {
        let at = c.clone();
        let number = c.u32()? as usize;
        c.eat(" over ")?;
        let extent = c.dims()?;
        c.eat(": ")?;
        let action = if c.try_eat("no stores") {
            StageAction::Store(Vec::new())
        } else if c.try_eat("reduce_") {
            let op = if c.try_eat("sum") {
                ReduceOp::Sum
            } else if c.try_eat("max") {
                ReduceOp::Max
            } else if c.try_eat("min") {
                ReduceOp::Min
            } else {
                return Err(c.error("`sum`, `max` or `min`"));
            };
            c.eat(" ")?;
            let value = expr_id(c)?;
            let mut stores = Vec::new();
            while c.try_eat(", ") {
                stores.push(self.store(c)?);
            }
            StageAction::Reduce { op, value, stores }
        } else {
            let (buffer, index) = self.store_target(c)?;
            let scan = c.try_eat("running sum of ");
            let store = Store {
                buffer,
                index,
                value: expr_id(c)?,
            };
            if scan {
                StageAction::Scan(store)
            } else {
                StageAction::Store(vec![store])
            }
        };
        c.end()?;
        if number == kernel.stages.len() {
            kernel.stages.push(Stage { extent, action });
            return Ok(());
        }
        // Another store of the last stage, printed on a line of its own.
        if number + 1 == kernel.stages.len() {
            if let (StageAction::Store(new), Some(last)) = (&action, kernel.stages.last_mut()) {
                if let StageAction::Store(stores) = &mut last.action {
                    if last.extent == extent && !stores.is_empty() && new.len() == 1 {
                        stores.extend(new.iter().cloned());
                        return Ok(());
                    }
                }
            }
        }
        Err(at.error(&format!("stage number {}", kernel.stages.len())))
    }

    /// `store bufN[index] = ` (the value follows).
    fn store_target(&self, c: &mut Cursor) -> Result<(BufferId, Affine), ParseError> {
        c.eat("store ")?;
        let buffer = self.buffer(c)?;
        c.eat("[")?;
        let (index, _) = affine(c, false)?;
        c.eat("] = ")?;
        Ok((buffer, index))
    }

    /// `store bufN[index] = eM`.
    fn store(&self, c: &mut Cursor) -> Result<Store, ParseError> {
        let (buffer, index) = self.store_target(c)?;
        Ok(Store {
            buffer,
            index,
            value: expr_id(c)?,
        })
    }

    /// A view as the GEMM and scatter-add lines print it: `bufN[Static(4), …]+offset strides
    /// [s, …]` (the shape left out when `with_shape` is false).
    fn view(&self, c: &mut Cursor, with_shape: bool) -> Result<StridedView, ParseError> {
        let buffer = self.buffer(c)?;
        let shape = if with_shape {
            c.list(|c| c.dim_debug())?
        } else {
            Vec::new()
        };
        c.eat("+")?;
        let offset = SizeExpr::parse(c)?;
        c.eat(" strides ")?;
        let strides = c.list(SizeExpr::parse)?;
        Ok(StridedView {
            buffer,
            offset,
            shape,
            strides,
        })
    }

    /// The rest of `matmul bufO = A @ B (node %n)`.
    fn matmul(&self, c: &mut Cursor) -> Result<MatmulStep, ParseError> {
        let out = self.buffer(c)?;
        c.eat(" = ")?;
        let a = self.view(c, true)?;
        c.eat(" @ ")?;
        let b = if c.try_eat("im2col[") {
            let window = minductor_ir::window2d(c)?;
            c.eat(", groups=")?;
            let groups = c.usize()?;
            c.eat("](")?;
            let source = self.buffer(c)?;
            c.eat(")")?;
            let shape = c.list(|c| c.dim_debug())?;
            MatmulOperand::Im2col(Im2colView {
                source,
                window,
                groups,
                shape,
            })
        } else {
            MatmulOperand::View(self.view(c, true)?)
        };
        let node = node_suffix(c)?;
        Ok(MatmulStep {
            a,
            b,
            out,
            node,
            epilogue: None,
        })
    }

    /// The rest of `scatter_add bufO[dim d] += SRC at indices INDEX (node %n)`; the index view
    /// has the source's shape.
    fn scatter_add(&self, c: &mut Cursor) -> Result<ScatterAddStep, ParseError> {
        let out = self.buffer(c)?;
        c.eat("[dim ")?;
        let dim = c.usize()?;
        c.eat("] += ")?;
        let src = self.view(c, true)?;
        c.eat(" at indices ")?;
        let mut index = self.view(c, false)?;
        index.shape = src.shape.clone();
        let node = node_suffix(c)?;
        Ok(ScatterAddStep {
            index,
            src,
            out,
            dim,
            node,
        })
    }

    /// The rest of `attention bufO = q Q k K v V[ mask [keep |drop ]M] scale X[ causal] group G nodes [%a, …] (node
    /// %n)`.
    fn attention(&self, c: &mut Cursor, buffers: &[Buffer]) -> Result<AttentionStep, ParseError> {
        // `bufO` (the buffer whole) or a view of it.
        let start = c.clone();
        let buffer = self.buffer(c)?;
        let out = if c.try_eat(" = q ") {
            StridedView::contiguous(buffer, &buffers[buffer.0 as usize].shape)
        } else {
            *c = start;
            let out = self.view(c, true)?;
            c.eat(" = q ")?;
            out
        };
        let q = self.view(c, true)?;
        c.eat(" k ")?;
        let k = self.view(c, true)?;
        c.eat(" v ")?;
        let v = self.view(c, true)?;
        let (mask, mask_kind) = if c.try_eat(" mask ") {
            let kind = if c.try_eat("keep ") {
                MaskKind::Keep
            } else if c.try_eat("drop ") {
                MaskKind::Drop
            } else {
                MaskKind::Add
            };
            (Some(self.view(c, true)?), kind)
        } else {
            (None, MaskKind::Add)
        };
        c.eat(" scale ")?;
        let at = c.clone();
        let scale: f32 = c
            .take_while(|ch| ch != ' ')
            .parse()
            .map_err(|_| at.error("an f32 scale"))?;
        let causal = c.try_eat(" causal");
        c.eat(" group ")?;
        let group = c.usize()?;
        if group == 0 {
            return Err(c.error("a group of at least 1"));
        }
        c.eat(" nodes ")?;
        let nodes = c.list(|c| {
            c.eat("%")?;
            Ok(NodeId(c.u32()?))
        })?;
        let node = node_suffix(c)?;
        Ok(AttentionStep {
            q,
            k,
            v,
            out,
            scale,
            causal,
            mask,
            mask_kind,
            group,
            node,
            nodes,
        })
    }

    /// The rest of `fallback bufO = OP[attributes](bufI, …) (node %n) because REASON`.
    fn fallback(&self, c: &mut Cursor) -> Result<FallbackStep, ParseError> {
        let out = self.buffer(c)?;
        c.eat(" = ")?;
        let op = minductor_ir::parse_op(c)?;
        c.eat("(")?;
        let mut inputs = Vec::new();
        if !c.try_eat(")") {
            loop {
                inputs.push(self.buffer(c)?);
                if c.try_eat(")") {
                    break;
                }
                c.eat(", ")?;
            }
        }
        c.eat(" (node %")?;
        let node = NodeId(c.u32()?);
        c.eat(") because ")?;
        let reason = c.rest().to_string();
        if reason.is_empty() {
            return Err(c.error("the reason the node falls back"));
        }
        Ok(FallbackStep {
            op,
            inputs,
            out,
            node,
            reason,
        })
    }

    /// The buffer plan: `arena …` and its slot and in-place lines.
    fn plan(&mut self, program: &Program) -> Result<BufferPlan, ParseError> {
        let (n, line) = self.next_line("`arena …`")?;
        let mut c = Cursor::new(line, n);
        c.eat("arena ")?;
        let arena_bytes = c.usize()?;
        c.eat(" bytes in ")?;
        let slot_count = c.usize()?;
        c.eat(" slots (unshared ")?;
        let unshared_bytes = c.usize()?;
        c.eat(" bytes, live peak ")?;
        let live_peak_bytes = c.usize()?;
        c.eat(" bytes)")?;
        c.end()?;
        let live = live_ranges(program);
        let mut plan = BufferPlan {
            slot_of: vec![None; program.buffers.len()],
            slots: Vec::new(),
            live,
            in_place: Vec::new(),
            arena_bytes,
            unshared_bytes,
            live_peak_bytes,
        };
        while let Some((n, line)) = self.peek() {
            let mut c = Cursor::new(line, n);
            if !c.try_eat("  slot") {
                break;
            }
            self.at += 1;
            let at = c.clone();
            let index = c.usize()?;
            if index != plan.slots.len() {
                return Err(at.error(&format!("slot number {}", plan.slots.len())));
            }
            c.eat(" @")?;
            let offset = c.usize()?;
            c.eat(" ")?;
            let bytes = c.usize()?;
            c.eat(" bytes:")?;
            let mut members = Vec::new();
            if c.try_eat(" ") && !c.is_empty() {
                loop {
                    let at = c.clone();
                    let m = self.buffer(&mut c)?;
                    let printed = if c.try_eat(" (steps ") {
                        let first = c.usize()?;
                        c.eat("..=")?;
                        let last = c.usize()?;
                        c.eat(")")?;
                        Some((first, last))
                    } else {
                        None
                    };
                    if printed != plan.live[m.0 as usize] {
                        return Err(at.error(&format!(
                            "{m} with the live range its steps give ({:?})",
                            plan.live[m.0 as usize]
                        )));
                    }
                    if plan.slot_of[m.0 as usize].replace(index).is_some() {
                        return Err(at.error(&format!("{m} in one slot only")));
                    }
                    members.push(m);
                    if !c.try_eat(", ") {
                        break;
                    }
                }
            }
            c.end()?;
            plan.slots.push(Slot {
                offset,
                bytes,
                members,
            });
        }
        if plan.slots.len() != slot_count {
            return Err(ParseError::new(
                n,
                format!(
                    "the plan announces {slot_count} slots but lists {}",
                    plan.slots.len()
                ),
            ));
        }
        while let Some((n, line)) = self.peek() {
            let mut c = Cursor::new(line, n);
            if !c.try_eat("  in place: ") {
                break;
            }
            self.at += 1;
            let written = self.buffer(&mut c)?;
            c.eat(" overwrites ")?;
            let input = self.buffer(&mut c)?;
            c.eat(" at step ")?;
            let step = c.usize()?;
            c.end()?;
            plan.in_place.push((written, input, step));
        }
        Ok(plan)
    }
}

/// `  bufN: dtype[dims] Kind (node %n)`.
fn buffer_line(line: &str, n: usize, expected: usize) -> Result<Buffer, ParseError> {
    let mut c = Cursor::new(line, n);
    c.eat("  buf")?;
    let at = c.clone();
    if c.usize()? != expected {
        return Err(at.error(&format!("buffer number {expected}")));
    }
    c.eat(": ")?;
    let dtype = c.dtype()?;
    let shape = c.dims()?;
    c.eat(" ")?;
    let kind = if c.try_eat("Input(") {
        let n = c.usize()?;
        c.eat(")")?;
        BufferKind::Input(n)
    } else if c.try_eat("Output") {
        BufferKind::Output
    } else if c.try_eat("Intermediate") {
        BufferKind::Intermediate
    } else {
        return Err(c.error("`Input(n)`, `Output` or `Intermediate`"));
    };
    let node = node_suffix(&mut c)?;
    Ok(Buffer {
        dtype,
        shape,
        kind,
        node,
    })
}

/// ` (node %n)` ending a line.
fn node_suffix(c: &mut Cursor) -> Result<NodeId, ParseError> {
    c.eat(" (node %")?;
    let node = NodeId(c.u32()?);
    c.eat(")")?;
    c.end()?;
    Ok(node)
}

/// `eN`.
fn expr_id(c: &mut Cursor) -> Result<ExprId, ParseError> {
    c.eat("e")?;
    Ok(ExprId(c.u32()?))
}

/// `oN` or `iN`, if the text continues with one.
fn var(c: &mut Cursor) -> Result<Option<Var>, ParseError> {
    if c.try_eat("o") {
        Ok(Some(Var::Outer(c.u32()?)))
    } else if c.try_eat("i") {
        Ok(Some(Var::Inner(c.u32()?)))
    } else {
        Ok(None)
    }
}

/// An affine index as printed (`o0 + 8*i0 + 64*s0*o1 + (s0 + -1)*i1 + 97*s0 + -97`: terms joined
/// by ` + `, each a product of factors — integers, symbols `sN`, a parenthesized size
/// expression, and at most one loop variable), and when `indirect` is allowed, an optional
/// `+ stride*clamp(eN, 0, bound)` after it.
fn affine(c: &mut Cursor, indirect: bool) -> Result<(Affine, Option<Indirect>), ParseError> {
    let mut out = Affine::default();
    loop {
        let at = c.clone();
        let mut coefficient = SizeExpr::Const(1);
        let mut variable: Option<Var> = None;
        loop {
            if let Some(v) = var(c)? {
                if variable.is_some() {
                    return Err(at.error("one loop variable per term"));
                }
                variable = Some(v);
            } else if c.try_eat("(") {
                coefficient = coefficient.times(&SizeExpr::parse(c)?);
                c.eat(")")?;
            } else if c.rest().starts_with('s') {
                c.eat("s")?;
                let s = SizeExpr::symbol(minductor_ir::SymId(c.u32()?));
                coefficient = coefficient.times(&s);
            } else if indirect && variable.is_none() && c.try_eat("clamp(") {
                let Some(stride) = coefficient.as_const() else {
                    return Err(at.error("a numeric stride before `clamp(`"));
                };
                let value = expr_id(c)?;
                c.eat(", 0, ")?;
                let bound = SizeExpr::parse(c)?;
                c.eat(")")?;
                let data = Indirect {
                    value,
                    stride,
                    bound,
                };
                return Ok((out, Some(data)));
            } else {
                coefficient = coefficient.scale(c.i64()?);
            }
            if !c.try_eat("*") {
                break;
            }
        }
        let term = match variable {
            Some(v) => Affine::var(v).scale_by(&coefficient),
            None => Affine {
                offset: coefficient,
                terms: Default::default(),
            },
        };
        out = out.plus(&term);
        if !c.try_eat(" + ") {
            return Ok((out, None));
        }
    }
}
