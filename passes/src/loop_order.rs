//! `choose_loop_order`: picks, for each kernel step, the loop order its code runs in
//! ([`LoopOrder`]). A kernel whose reductions run over a non-innermost axis of their input
//! (column sums such as a bias gradient `sum(0)` of a `[batch, features]` buffer, `softmax(dim
//! = 0)`, a mean over the middle axis of a 3-D tensor) reads, along its stages' innermost loop,
//! elements a whole row apart: vectorised along that loop it gathers four lanes from four rows.
//! Inductor's outer-reduction loop order (`OuterLoopFusedSchedulerNode`, `CppVecKernel` over
//! outer dims) keeps the contiguous axis, here the last outer loop, as the vector axis and runs
//! the reduced loop outside it, one row of a group of columns at a time, with a vector of partial
//! results per group.
//!
//! A kernel step takes the outer-reduction order when
//! - it has an outer loop and no scan stage (see [`LoopOrder::OuterReduction`]),
//! - every store is contiguous along the last outer loop (coefficient 1): each column group
//!   stores whole vectors,
//! - some stage with loops loads a buffer contiguously along the last outer loop, and no stage
//!   loads anything contiguously along its own innermost loop (which the inner order would
//!   vectorise with plain vector loads).
//!
//! The order changes neither the set of accesses nor, per element, the operations' order, so
//! results do not depend on it beyond a reduction's summation order, and the verifier's range
//! and thread checks are the same. GEMM epilogues keep the inner order (they run on row blocks).

use minductor_ir::SizeExpr;
use minductor_kernel_ir::*;

/// `program` with the loop order of each kernel step chosen (epilogues untouched).
pub fn choose_loop_order(program: &Program) -> Program {
    let mut out = program.clone();
    for step in &mut out.steps {
        if let Step::Kernel(k) = step {
            k.order = if wants_outer_reduction(k) {
                LoopOrder::OuterReduction
            } else {
                LoopOrder::Inner
            };
        }
    }
    out
}

/// Whether `k` runs faster in the outer-reduction order (see the module docs).
pub fn wants_outer_reduction(k: &Kernel) -> bool {
    let Some(last) = k.outer.len().checked_sub(1) else {
        return false;
    };
    let column = Var::Outer(last as u32);
    let one = |c: &SizeExpr| c.is(1);
    let mut contiguous_columns = false;
    for stage in &k.stages {
        if matches!(stage.action, StageAction::Scan(_)) {
            return false;
        }
        if stage
            .action
            .stores()
            .iter()
            .any(|st| !one(&st.index.coefficient(column)))
        {
            return false;
        }
        let Some(depth) = stage.extent.len().checked_sub(1) else {
            continue;
        };
        let row = Var::Inner(depth as u32);
        for e in k.reachable(&stage.action.roots()) {
            if let Expr::Load { index, .. } = k.expr(e) {
                if one(&index.coefficient(row)) {
                    return false;
                }
                if one(&index.coefficient(column)) {
                    contiguous_columns = true;
                }
            }
        }
    }
    contiguous_columns
}
