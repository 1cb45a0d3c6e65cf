//! `store_once`: a costly value that a reduction stage computes and a later stage of the same
//! kernel computes again is stored by the reduction's loop and loaded back by the later stage.
//!
//! Softmax is the example: `e = exp(x - max)` is summed by one stage and divided by the sum in
//! the next. Without this pass both stages compute `exp`; with it the summing stage also stores
//! `e` into the output row, and the last stage reads it back and overwrites it with `e / sum`
//! (Inductor's softmax kernels likewise keep the exponentials instead of recomputing them):
//!
//! ```text
//! stage1 over [1024]: reduce_sum e3, store buf1[1024*o0 + i0] = e3
//! stage2 over [1024]: store buf1[1024*o0 + i0] = e7          (e7 = div e6, e4; e6 = load buf1[..])
//! ```
//!
//! It applies when both stages loop over the same single inner extent, the later stage stores
//! an f32 buffer at an index that moves with the loop (so each element has its own place, and
//! the value read back is the one stored for the same element in the same outer iteration),
//! nothing else in the kernel writes that buffer, and the value (a transcendental function)
//! varies along the loop. `plan_buffers` never lets such a buffer overwrite an input in place.

use minductor_ir::{DType, UnaryOp};
use minductor_kernel_ir::*;
use std::collections::HashMap;

/// `program` with each reduction stage's costly value stored once for a later stage (see the
/// module docs). Other steps are unchanged.
pub fn store_once(program: &Program) -> Program {
    let mut out = program.clone();
    for step in &mut out.steps {
        if let Step::Kernel(kernel) = step {
            rewrite(program, kernel);
        }
    }
    out
}

/// A value worth storing instead of recomputing.
fn costly(e: &Expr) -> bool {
    matches!(
        e,
        Expr::Unary(
            UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Tanh
                | UnaryOp::Erf
                | UnaryOp::Sigmoid
                | UnaryOp::Sin
                | UnaryOp::Cos,
            _
        )
    )
}

fn rewrite(program: &Program, kernel: &mut Kernel) {
    let inner = Var::Inner(0);
    for k in 0..kernel.stages.len() {
        let (value, has_stores) = match &kernel.stages[k].action {
            StageAction::Reduce { value, stores, .. } => (*value, !stores.is_empty()),
            StageAction::Store(_) | StageAction::Scan(_) => continue,
        };
        if has_stores || kernel.stages[k].extent.len() != 1 {
            continue;
        }
        let reduced = kernel.reachable(&[value]);
        for s in k + 1..kernel.stages.len() {
            if kernel.stages[s].extent != kernel.stages[k].extent {
                continue;
            }
            let StageAction::Store(stores) = &kernel.stages[s].action else {
                continue;
            };
            let roots: Vec<ExprId> = stores.iter().map(|st| st.value).collect();
            let reached = kernel.reachable(&roots);
            let shared: Vec<ExprId> = reduced
                .iter()
                .copied()
                .filter(|e| {
                    reached.contains(e)
                        && kernel.ty(*e) == ScalarType::F32
                        && costly(kernel.expr(*e))
                        && varies(kernel, *e, inner)
                })
                .collect();
            // The outermost shared value (the others are computed inside it).
            let Some(&v) = shared.iter().find(|&&v| {
                !shared
                    .iter()
                    .any(|&w| w != v && kernel.reachable(&[w]).contains(&v))
            }) else {
                continue;
            };
            let Some(target) = stores.iter().find(|st| {
                program.buffer(st.buffer).dtype == DType::F32
                    && st.index.uses(inner)
                    && st.index.terms.iter().all(|(var, _)| match var {
                        Var::Inner(i) => *i == 0,
                        Var::Outer(_) => true,
                    })
                    && kernel
                        .stages
                        .iter()
                        .flat_map(|stage| stage.action.stores())
                        .filter(|other| other.buffer == st.buffer)
                        .count()
                        == 1
            }) else {
                continue;
            };
            let target = target.clone();
            kernel.exprs.push(Expr::Load {
                buffer: target.buffer,
                index: target.index.clone(),
                indirect: None,
            });
            kernel.types.push(ScalarType::F32);
            let load = ExprId(kernel.exprs.len() as u32 - 1);
            let mut memo = HashMap::new();
            let StageAction::Store(stores) = kernel.stages[s].action.clone() else {
                unreachable!("checked above");
            };
            let stores = stores
                .into_iter()
                .map(|st| Store {
                    value: substitute(kernel, st.value, v, load, &mut memo),
                    ..st
                })
                .collect();
            kernel.stages[s].action = StageAction::Store(stores);
            if let StageAction::Reduce { stores, .. } = &mut kernel.stages[k].action {
                stores.push(Store { value: v, ..target });
            }
            break;
        }
    }
}

/// Whether `e` depends on loop variable `var` (through a load's index).
fn varies(kernel: &Kernel, e: ExprId, var: Var) -> bool {
    kernel
        .reachable(&[e])
        .into_iter()
        .any(|r| match kernel.expr(r) {
            Expr::Load { index, .. } => index.uses(var),
            _ => false,
        })
}

/// `root` with `from` replaced by `to`: the expressions on the way are copied (others, such as
/// the reduction stage, keep using the originals).
fn substitute(
    kernel: &mut Kernel,
    root: ExprId,
    from: ExprId,
    to: ExprId,
    memo: &mut HashMap<ExprId, ExprId>,
) -> ExprId {
    if root == from {
        return to;
    }
    if let Some(&done) = memo.get(&root) {
        return done;
    }
    let expr = kernel.expr(root).clone();
    let operands = expr.operands();
    let new: Vec<ExprId> = operands
        .iter()
        .map(|&o| substitute(kernel, o, from, to, memo))
        .collect();
    let result = if new.as_slice() == operands.as_slice() {
        root
    } else {
        let ty = kernel.ty(root);
        kernel.exprs.push(with_operands(expr, &new));
        kernel.types.push(ty);
        ExprId(kernel.exprs.len() as u32 - 1)
    };
    memo.insert(root, result);
    result
}

/// `expr` reading `ops` (in the order of [`Expr::operands`]) instead of its operands.
fn with_operands(expr: Expr, ops: &[ExprId]) -> Expr {
    match expr {
        Expr::Load {
            buffer,
            index,
            indirect,
        } => Expr::Load {
            buffer,
            index,
            indirect: indirect.map(|i| Indirect { value: ops[0], ..i }),
        },
        Expr::Unary(op, _) => Expr::Unary(op, ops[0]),
        Expr::Cast(d, _) => Expr::Cast(d, ops[0]),
        Expr::Binary(op, _, _) => Expr::Binary(op, ops[0], ops[1]),
        Expr::Compare(op, _, _) => Expr::Compare(op, ops[0], ops[1]),
        Expr::Where(_, _, _) => Expr::Where(ops[0], ops[1], ops[2]),
        leaf @ (Expr::Constant { .. } | Expr::StageResult(_) | Expr::Index(_)) => leaf,
    }
}
