//! `verify_program`: the kernel-IR verifier. Compiled code runs on whatever a [`Program`] says,
//! so before any machine code runs, this checks that it cannot reach outside its buffers.
//!
//! Assumes nothing about where the program came from (`fuse`, a later pass, or a user's hands).
//! Guarantees, when it returns `Ok`:
//! - **Structure.** Every buffer, expression, stage and step id is in range; expressions form a
//!   DAG in order (operands before users); each expression's recorded type follows its op's rule
//!   and each store's value has its buffer's type; ops are limited to the types code generation
//!   implements (no integer exp, div or pow, no bool arithmetic, no f64 in kernels); no step
//!   writes a graph input; the program's
//!   outputs are input or output buffers; index checks name i64 buffers and existing steps.
//! - **Sizes.** Every symbolic size is the size of an input dim (so it is bound at run time);
//!   every buffer's byte size fits in `isize::MAX` for the sizes known.
//! - **Stages in order.** A stage reads `StageResult(n)` only of an earlier reduction stage, and
//!   its loads and stores use only the outer loops and its own loops; a step reads an
//!   intermediate or output only if that step or an earlier one writes it.
//! - **Ranges.** Every load and store index (`offset + Σ coefficient·var`, plus a clamped
//!   data-dependent term), evaluated at its minimum and maximum over the loop extents of the
//!   stage that runs it, lies inside its buffer; so does every element of a GEMM's or
//!   scatter-add's strided views; a GEMM's shapes agree and its epilogue runs over its rows.
//! - **Threads.** Iterations of the outer loops the runtime splits across threads (the first, or
//!   all of them flattened: `Kernel::split_loops`) never store the same element (each store
//!   index is a mixed-radix number over its loops, moved by every split loop; several stores to
//!   one buffer, split by the first loop only, are apart or within one row), and a buffer a
//!   kernel stores is loaded only at the element the same iteration stores.
//! - **Fallback steps.** The op is not an input nor `grad`; its type rule applied to the operand
//!   buffers' types (for a constant: no operands, 0-d) gives exactly the output buffer's type (so the
//!   interpreter's result fills it at any bound sizes); it writes no input, does not read its own
//!   output, and its reason is one non-empty line (so the program text parses back).
//! - **Loop order.** A kernel in the outer-reduction order has an outer loop and no scan stage,
//!   and is not a GEMM's epilogue (the order changes only which loop is vectorised and the
//!   nesting, not the set of accesses, so the range and thread checks are the same).
//! - **Outputs.** Some step writes every output buffer (they are allocated without zeroing).
//! - **Plan.** Every intermediate a step touches has a slot and only intermediates do; slot
//!   membership is consistent and each slot is at least as large as its members (at the plan's
//!   nominal sizes; the runtime lays slots out per call from exact sizes); two buffers share a slot
//!   only if their live ranges (recomputed from the steps) are disjoint, or they are an in-place
//!   pair at the one step where one ends and the other begins and the kernel's access pattern
//!   makes it safe (re-derived here from the step, not taken from the planner: the verifier
//!   shares no code with the passes it checks, so a bug in one is caught by the other).
//!
//! Ranges depend on loop extents, index coefficients and offsets, which may be symbolic (extents
//! are dims; coefficients and offsets are size expressions such as `7*s0` or `-1 + s0`, evaluated
//! exactly in `i128`): `symbols[s]` is the size of symbol `s` when known. An access whose extents,
//! coefficients or offset involve an unknown symbol is not range-checked; callers
//! run the verifier again once the sizes are bound (the runtime does so whenever a call brings
//! new sizes), which then checks every access. An access inside a loop of extent 0 never runs
//! and is not checked. Cost: linear in the program, plus one reachability walk per stage.

use crate::kernel::*;
use crate::plan::{buffer_bytes, BufferPlan};
use minductor_ir::{checked_bytes, DType, Dim, LayoutFault, SizeExpr, SymId};
use std::collections::HashSet;
use thiserror::Error;

/// Why a program was rejected; `at` names the step, kernel, stage or buffer.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum VerifyError {
    #[error("{at}: {message}")]
    Malformed { at: String, message: String },
    #[error(
        "{at}: {access} of {buffer} reaches elements {min}..={max}, outside its {len} elements"
    )]
    OutOfRange {
        at: String,
        access: String,
        buffer: BufferId,
        min: i128,
        max: i128,
        len: i128,
    },
    #[error("symbolic size {0} is not the size of any input dim, so no call can bind it")]
    UnboundSymbol(Dim),
    #[error("{at}: size overflow: {message}")]
    Size { at: String, message: String },
    #[error("buffer plan: {0}")]
    Plan(String),
}

fn malformed(at: impl Into<String>, message: impl Into<String>) -> VerifyError {
    VerifyError::Malformed {
        at: at.into(),
        message: message.into(),
    }
}

/// Checks `program` (and its plan, if it has one); see the module doc. `symbols[s]` is the size
/// of symbol `s` when known (empty at compile time).
pub fn verify_program(program: &Program, symbols: &[Option<usize>]) -> Result<(), VerifyError> {
    let v = Verifier { program, symbols };
    v.symbols_bound()?;
    v.buffers()?;
    for (n, step) in program.steps.iter().enumerate() {
        v.step(n, step)?;
    }
    v.order()?;
    v.outputs_and_checks()?;
    if let Some(plan) = &program.plan {
        v.plan(plan)?;
    }
    Ok(())
}

/// Every dim the program's buffers and steps use: buffer shapes, kernel loop extents (and the
/// symbols kernels read), GEMM, scatter-add and attention operand shapes. A call must give each
/// a size (a derived symbol one that is not negative) before any step runs.
pub fn program_dims(p: &Program) -> Vec<Dim> {
    let mut used: Vec<Dim> = p.buffers.iter().flat_map(|b| b.shape.clone()).collect();
    let kernel_dims = |k: &Kernel| -> Vec<Dim> { k.params() };
    for step in &p.steps {
        match step {
            Step::Kernel(k) => used.extend(kernel_dims(k)),
            Step::Matmul(m) => {
                used.extend(m.a.shape.iter().chain(m.b.shape()).copied());
                used.extend(m.epilogue.iter().flat_map(kernel_dims));
            }
            Step::ScatterAdd(sc) => {
                used.extend(sc.index.shape.iter().chain(&sc.src.shape).copied())
            }
            Step::Attention(a) => {
                used.extend(
                    [&a.q, &a.k, &a.v, &a.out]
                        .iter()
                        .flat_map(|v| v.shape.clone()),
                );
                used.extend(a.mask.iter().flat_map(|m| m.shape.clone()));
            }
            // A fallback's sizes are its buffers', counted above.
            Step::Fallback(_) => {}
        }
    }
    used
}

struct Verifier<'a> {
    program: &'a Program,
    symbols: &'a [Option<usize>],
}

impl Verifier<'_> {
    /// The size of an input symbol, if known.
    fn input_size(&self, s: SymId) -> Option<i128> {
        self.symbols
            .get(s.0 as usize)
            .copied()
            .flatten()
            .map(|n| n as i128)
    }

    /// The size of `d`, if known (a derived symbol's definition evaluated on the input sizes;
    /// unknown if that is negative).
    fn size(&self, d: Dim) -> Option<usize> {
        d.eval(|s| self.input_size(s))
            .and_then(|n| usize::try_from(n).ok())
    }

    /// The value of a size expression (a stride or offset), if its symbols are known.
    fn value(&self, e: &SizeExpr) -> Option<i128> {
        e.eval(|s| {
            if s.is_derived() {
                Dim::Sym(s).eval(|s| self.input_size(s))
            } else {
                self.input_size(s)
            }
        })
    }

    fn buffer(&self, id: BufferId, at: &str) -> Result<&Buffer, VerifyError> {
        self.program
            .buffers
            .get(id.0 as usize)
            .ok_or_else(|| malformed(at, format!("{id} does not exist")))
    }

    /// Elements of buffer `id`, if its sizes are known.
    fn numel(&self, id: BufferId) -> Option<i128> {
        self.program
            .buffer(id)
            .shape
            .iter()
            .try_fold(1i128, |acc, &d| Some(acc * self.size(d)? as i128))
    }

    /// Every symbol used anywhere is the size of some input dim, or derived from such symbols.
    fn symbols_bound(&self) -> Result<(), VerifyError> {
        let p = self.program;
        let mut bound: HashSet<Dim> = p
            .buffers
            .iter()
            .filter(|b| matches!(b.kind, BufferKind::Input(_)))
            .flat_map(|b| b.shape.iter().copied())
            .collect();
        // An input dim `c*s0 + k` binds `s0` too (a call solves it from the size).
        let solved: Vec<Dim> = bound
            .iter()
            .filter_map(|d| match d {
                Dim::Sym(s) => s.solvable_input().map(Dim::Sym),
                Dim::Static(_) => None,
            })
            .collect();
        bound.extend(solved);
        let unbound = |d: &Dim| match d {
            Dim::Static(_) => false,
            Dim::Sym(s) => s
                .inputs()
                .into_iter()
                .any(|i| !bound.contains(&Dim::Sym(i))),
        };
        match program_dims(p).into_iter().find(unbound) {
            Some(d) => Err(VerifyError::UnboundSymbol(d)),
            None => Ok(()),
        }
    }

    /// Every buffer's byte size (its static part, or all of it once the symbols are known) fits.
    fn buffers(&self) -> Result<(), VerifyError> {
        for (i, b) in self.program.buffers.iter().enumerate() {
            let known: Vec<usize> = b.shape.iter().filter_map(|&d| self.size(d)).collect();
            if checked_bytes(known, b.dtype.size_bytes()).is_none() {
                return Err(VerifyError::Size {
                    at: format!("{}", BufferId(i as u32)),
                    message: format!(
                        "{}{} holds more than isize::MAX bytes",
                        b.dtype,
                        minductor_ir::shape_string(&b.shape)
                    ),
                });
            }
        }
        Ok(())
    }

    fn step(&self, n: usize, step: &Step) -> Result<(), VerifyError> {
        match step {
            Step::Kernel(k) => self.kernel(&format!("step {n} (kernel {})", k.name), n, k),
            Step::Matmul(m) => self.matmul(n, m),
            Step::ScatterAdd(sc) => self.scatter_add(n, sc),
            Step::Attention(a) => self.attention(n, a),
            Step::Fallback(fb) => self.fallback(n, fb),
        }
    }

    /// Kernel `k` of step `step` (a kernel step, or a GEMM's epilogue).
    fn kernel(&self, at: &str, step: usize, k: &Kernel) -> Result<(), VerifyError> {
        if k.types.len() != k.exprs.len() {
            return Err(malformed(
                at,
                format!("{} types for {} expressions", k.types.len(), k.exprs.len()),
            ));
        }
        for (i, e) in k.exprs.iter().enumerate() {
            self.expr(at, k, i, e)?;
        }
        // The outer-reduction order vectorises the last outer loop and runs every stage's
        // loops inside it in order, one element at a time per column: a scan's running sum
        // along its loops would need the inner order's nesting.
        if k.order == LoopOrder::OuterReduction {
            if k.outer.is_empty() {
                return Err(malformed(
                    at,
                    "the outer-reduction order needs an outer loop to vectorise",
                ));
            }
            if k.stages
                .iter()
                .any(|s| matches!(s.action, StageAction::Scan(_)))
            {
                return Err(malformed(
                    at,
                    "a scan stage runs only in the inner loop order",
                ));
            }
        }
        for (s, stage) in k.stages.iter().enumerate() {
            let at = format!("{at}, stage {s}");
            // A reduction stage may also store values it computes (`store_once`).
            let roots: Vec<ExprId> = stage.action.roots();
            if let Some(bad) = roots.iter().find(|r| r.0 as usize >= k.exprs.len()) {
                return Err(malformed(
                    &at,
                    format!("expression e{} does not exist", bad.0),
                ));
            }
            if let StageAction::Reduce { value, .. } = &stage.action {
                if k.ty(*value) != ScalarType::F32 {
                    return Err(malformed(&at, "reductions are over f32 values"));
                }
            }
            for id in k.reachable(&roots) {
                match k.expr(id) {
                    Expr::StageResult(r) if *r as usize >= s => {
                        return Err(malformed(
                            &at,
                            format!("e{} reads the result of stage {r}, which runs later", id.0),
                        ))
                    }
                    Expr::Load {
                        buffer,
                        index,
                        indirect,
                    } => {
                        let access = format!("load e{}", id.0);
                        self.vars(&at, &access, k, stage, index)?;
                        // A symbolic bound is known once the symbols are bound (checked again
                        // then, as every symbolic range is).
                        let extra = match indirect {
                            None => Some(None),
                            Some(ind) => self.value(&ind.bound).map(|b| {
                                Some((
                                    ind.stride,
                                    b.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
                                ))
                            }),
                        };
                        if let Some(extra) = extra {
                            if !matches!(extra, Some((_, bound)) if bound < 1)
                                || !self.step_never_runs(step, extra.map_or(0, |e| e.1))
                            {
                                self.range(&at, &access, k, stage, *buffer, index, extra)?;
                            }
                        }
                    }
                    _ => {}
                }
            }
            {
                for (j, st) in stage.action.stores().iter().enumerate() {
                    let access = format!("store {j}");
                    let b = self.buffer(st.buffer, &at)?;
                    if matches!(b.kind, BufferKind::Input(_)) {
                        return Err(malformed(
                            &at,
                            format!("{access} writes input {}", st.buffer),
                        ));
                    }
                    if b.dtype == DType::F64 {
                        return Err(malformed(&at, "kernels do not store f64 buffers"));
                    }
                    if k.ty(st.value) != ScalarType::of(b.dtype) {
                        return Err(malformed(
                            &at,
                            format!(
                                "{access} stores a {:?} value into {} of {}",
                                k.ty(st.value),
                                st.buffer,
                                b.dtype
                            ),
                        ));
                    }
                    self.vars(&at, &access, k, stage, &st.index)?;
                    self.range(&at, &access, k, stage, st.buffer, &st.index, None)?;
                }
            }
        }
        self.disjoint_rows(at, k)
    }

    /// The runtime may split a kernel's first outer loop across threads, so iterations of
    /// different rows must not write the same element, nor read an element another row writes.
    /// Checked per buffer the kernel stores: its one store's index, with its variables ordered by
    /// coefficient, is a mixed-radix number (each coefficient exceeds the span of all smaller
    /// ones), so different iterations write different elements; several stores to one buffer
    /// must share their variable terms and fit, offsets included, within one row's stride. A
    /// buffer the kernel also loads is stored and loaded at one index only (store_once rereads it). Extents
    /// not known yet are checked once the sizes are bound.
    fn disjoint_rows(&self, at: &str, k: &Kernel) -> Result<(), VerifyError> {
        let Some(&first) = k.outer.first() else {
            return Ok(()); // One call runs everything: no threads.
        };
        // The loops split across threads (`Kernel::split_loops`: the first, or every outer
        // loop): with none of more than one iteration, one call runs everything.
        let split = &k.outer[..k.split_loops().max(1)];
        if split.iter().all(|&d| matches!(self.size(d), Some(0 | 1)))
            || split.iter().any(|&d| self.size(d) == Some(0))
        {
            return Ok(());
        }
        let row = Var::Outer(0);
        let mut stores: Vec<(usize, &Store)> = Vec::new();
        for (s, stage) in k.stages.iter().enumerate() {
            stores.extend(stage.action.stores().iter().map(|x| (s, x)));
        }
        let extent = |s: usize, v: Var| match v {
            Var::Outer(i) => self.size(k.outer[i as usize]),
            Var::Inner(i) => self.size(k.stages[s].extent[i as usize]),
        };
        let overlap = |buffer: BufferId| {
            malformed(
                at,
                format!(
                    "iterations of different rows of the first outer loop (split across \
                     threads) may store the same element of {buffer}"
                ),
            )
        };
        let mut buffers: Vec<BufferId> = stores.iter().map(|(_, st)| st.buffer).collect();
        buffers.sort();
        buffers.dedup();
        for buffer in buffers {
            let mine: Vec<&(usize, &Store)> = stores
                .iter()
                .filter(|(_, st)| st.buffer == buffer)
                .collect();
            let first_store = mine[0].1;
            // Each store: mixed radix over the variables that move its index.
            let mut deferred = false;
            for (t, st) in &mine {
                // Every split loop of more than one iteration moves the index (else two
                // threads' iterations write one element); the mixed radix below covers the rest.
                let unmoved = (0..split.len()).any(|i| {
                    let v = Var::Outer(i as u32);
                    !st.index.uses(v) && !matches!(self.size(split[i]), Some(0 | 1))
                });
                if unmoved {
                    return Err(overlap(buffer));
                }
                let terms: Vec<(Option<i128>, Option<usize>)> = st
                    .index
                    .terms
                    .iter()
                    .map(|(v, c)| (self.value(c).map(i128::abs), extent(*t, *v)))
                    .collect();
                if terms.iter().any(|t| t.1 == Some(0)) {
                    continue; // Never runs.
                }
                if terms.iter().any(|t| t.0.is_none() || t.1.is_none()) {
                    deferred = true; // Checked again once the symbols are bound.
                    continue;
                }
                let terms = terms
                    .into_iter()
                    .map(|(c, n)| (c.expect("known above"), n.expect("known above")))
                    .collect();
                if !mixed_radix(terms, 0) {
                    return Err(overlap(buffer));
                }
            }
            if deferred {
                continue;
            }
            if mine.len() > 1 && split.len() > 1 {
                // Split over every outer loop: each iteration's window is its own.
                if !k.stores_apart(buffer) {
                    return Err(overlap(buffer));
                }
            } else if mine.len() > 1 {
                // Several stores (a cat's operands in one kernel), pairwise: either they never
                // write the same element at all (disjoint ranges over every row: a cat along the
                // first dim), or each row's elements of both lie within one stride of the row's
                // base (a cat along a later dim).
                let Some(stride) = self.value(&first_store.index.coefficient(row)) else {
                    return Ok(()); // Checked again once the symbols are bound.
                };
                let rows = self.size(first).map(|n| n as i128);
                let mut windows = Vec::new();
                // Stores at one index over the same loop extents write the same elements (a
                // value `store_once` stores in a reduction and a later stage overwrites): the
                // mixed-radix check above covers them as one store.
                let extents_of = |t: usize, st: &Store| -> Vec<Option<usize>> {
                    st.index.terms.iter().map(|(v, _)| extent(t, *v)).collect()
                };
                let mut seen: Vec<(&Affine, Vec<Option<usize>>)> = Vec::new();
                for (t, st) in &mine {
                    let key = (&st.index, extents_of(*t, st));
                    if seen.contains(&key) {
                        continue;
                    }
                    seen.push(key);
                    if self.value(&st.index.coefficient(row)) != Some(stride) {
                        return Err(overlap(buffer));
                    }
                    let Some(offset) = self.value(&st.index.offset) else {
                        return Ok(()); // Checked again once the symbols are bound.
                    };
                    let (mut min, mut max) = (offset, offset);
                    for (v, c) in st.index.terms.iter().filter(|t| t.0 != row) {
                        let (Some(n), Some(c)) = (extent(*t, *v), self.value(c)) else {
                            return Ok(()); // Checked again once the symbols are bound.
                        };
                        let span = c * (n as i128 - 1).max(0);
                        if span < 0 {
                            min += span;
                        } else {
                            max += span;
                        }
                    }
                    windows.push((min, max));
                }
                let Some(rows) = rows else {
                    return Ok(()); // Checked again once the symbols are bound.
                };
                let all_rows = stride * (rows - 1);
                let whole =
                    |(min, max): (i128, i128)| (min + all_rows.min(0), max + all_rows.max(0));
                for (x, &a) in windows.iter().enumerate() {
                    for &b in &windows[x + 1..] {
                        let (wa, wb) = (whole(a), whole(b));
                        let apart = wa.1 < wb.0 || wb.1 < wa.0;
                        let one_row = a.1.max(b.1) - a.0.min(b.0) < stride.abs();
                        if !apart && !one_row {
                            return Err(overlap(buffer));
                        }
                    }
                }
            }
            let loaded_elsewhere = k.exprs.iter().any(|e| match e {
                Expr::Load {
                    buffer: b,
                    index,
                    indirect,
                } if *b == buffer => {
                    indirect.is_some() || mine.iter().any(|(_, st)| st.index != *index)
                }
                _ => false,
            });
            if loaded_elsewhere {
                return Err(malformed(
                    at,
                    format!(
                        "{buffer} is loaded at elements other than the one each iteration stores"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Expression `i`: operands exist and precede it, and its recorded type follows its rule.
    fn expr(&self, at: &str, k: &Kernel, i: usize, e: &Expr) -> Result<(), VerifyError> {
        let at = format!("{at}, e{i}");
        if let Some(bad) = e.operands().iter().find(|o| o.0 as usize >= i) {
            return Err(malformed(
                &at,
                format!("operand e{} does not precede its user", bad.0),
            ));
        }
        let ty = |id: ExprId| k.ty(id);
        use ScalarType as T;
        let expected = match e {
            Expr::Load {
                buffer, indirect, ..
            } => {
                let b = self.buffer(*buffer, &at)?;
                if b.dtype == DType::F64 {
                    return Err(malformed(&at, "kernels do not load f64 buffers"));
                }
                if let Some(ind) = indirect {
                    if ty(ind.value) != T::I64 {
                        return Err(malformed(&at, "a data-dependent index must be i64"));
                    }
                }
                Some(ScalarType::of(b.dtype))
            }
            Expr::Constant { ty, .. } => Some(*ty),
            Expr::Index(_) => match k.ty(ExprId(i as u32)) {
                T::Bool => return Err(malformed(&at, "a loop index is f32 or i64, not bool")),
                other => Some(other),
            },
            Expr::StageResult(r) => match k.stages.get(*r as usize).map(|s| &s.action) {
                Some(StageAction::Reduce { value, .. }) if (value.0 as usize) < k.exprs.len() => {
                    Some(ty(*value))
                }
                _ => return Err(malformed(&at, format!("stage {r} is not a reduction"))),
            },
            Expr::Unary(op, a) => {
                let integer_ok =
                    matches!(op, minductor_ir::UnaryOp::Neg | minductor_ir::UnaryOp::Abs);
                match ty(*a) {
                    T::F32 => {}
                    T::I64 if integer_ok => {}
                    other => {
                        return Err(malformed(
                            &at,
                            format!("{op:?} is not defined on {other:?}"),
                        ))
                    }
                }
                Some(ty(*a))
            }
            Expr::Binary(op, a, b) => {
                if ty(*a) != ty(*b) {
                    return Err(malformed(&at, "binary operands of different types"));
                }
                let float_only = matches!(
                    op,
                    minductor_ir::BinaryOp::Div | minductor_ir::BinaryOp::Pow
                );
                match ty(*a) {
                    T::F32 => {}
                    T::I64 if !float_only => {}
                    other => {
                        return Err(malformed(
                            &at,
                            format!("{op:?} is not defined on {other:?}"),
                        ))
                    }
                }
                Some(ty(*a))
            }
            Expr::Compare(_, a, b) => {
                if ty(*a) != ty(*b) {
                    return Err(malformed(&at, "compared operands of different types"));
                }
                Some(T::Bool)
            }
            Expr::Where(c, a, b) => {
                if ty(*c) != T::Bool || ty(*a) != ty(*b) {
                    return Err(malformed(
                        &at,
                        "where needs a bool condition and operands of one type",
                    ));
                }
                Some(ty(*a))
            }
            Expr::Cast(d, _) => {
                if *d == DType::F64 {
                    return Err(malformed(&at, "kernels do not compute in f64"));
                }
                Some(ScalarType::of(*d))
            }
        };
        match expected {
            Some(t) if t != k.ty(ExprId(i as u32)) => Err(malformed(
                &at,
                format!(
                    "recorded type {:?}, the rule gives {t:?}",
                    k.ty(ExprId(i as u32))
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Whether an index check before `step` fails on every call: it bounds a nonempty buffer's
    /// indices by `bound` < 1, so no index passes (a gather from a table with no rows). A load
    /// through such indices never runs. Unknown sizes count as "may run".
    fn step_never_runs(&self, step: usize, bound: i64) -> bool {
        self.program.index_checks.iter().any(|c| {
            c.step == step
                && self.value(&c.bound) == Some(bound as i128)
                && bound < 1
                && (c.buffer.0 as usize) < self.program.buffers.len()
                && self.numel(c.buffer).is_some_and(|n| n > 0)
        })
    }

    /// An index uses only the kernel's outer loops and the loops of the stage running it.
    fn vars(
        &self,
        at: &str,
        access: &str,
        k: &Kernel,
        stage: &Stage,
        index: &Affine,
    ) -> Result<(), VerifyError> {
        for &(v, _) in &index.terms {
            let ok = match v {
                Var::Outer(i) => (i as usize) < k.outer.len(),
                Var::Inner(i) => (i as usize) < stage.extent.len(),
            };
            if !ok {
                return Err(malformed(
                    at,
                    format!("{access} uses loop {v}, which this stage does not have"),
                ));
            }
        }
        Ok(())
    }

    /// The index range of an access over the stage's loops lies inside `buffer`. `indirect` is a
    /// data-dependent term `clamp(value, 0, bound - 1) · stride`.
    #[allow(clippy::too_many_arguments)]
    fn range(
        &self,
        at: &str,
        access: &str,
        k: &Kernel,
        stage: &Stage,
        buffer: BufferId,
        index: &Affine,
        indirect: Option<(i64, i64)>,
    ) -> Result<(), VerifyError> {
        self.buffer(buffer, at)?;
        let extent = |v: Var| -> Option<usize> {
            match v {
                Var::Outer(i) => self.size(k.outer[i as usize]),
                Var::Inner(i) => self.size(stage.extent[i as usize]),
            }
        };
        let loops: Vec<Option<usize>> = k
            .outer
            .iter()
            .chain(&stage.extent)
            .map(|&d| self.size(d))
            .collect();
        if loops.contains(&Some(0)) {
            return Ok(()); // The access never runs.
        }
        if loops.contains(&None) {
            return Ok(()); // Checked again once the symbols are bound.
        }
        let Some(len) = self.numel(buffer) else {
            return Ok(());
        };
        let Some(offset) = self.value(&index.offset) else {
            return Ok(()); // Checked again once the symbols are bound.
        };
        let (mut min, mut max) = (offset, offset);
        for (v, c) in &index.terms {
            let Some(c) = self.value(c) else {
                return Ok(()); // Checked again once the symbols are bound.
            };
            let span = c * (extent(*v).expect("known above") as i128 - 1);
            if span < 0 {
                min += span;
            } else {
                max += span;
            }
        }
        if let Some((stride, bound)) = indirect {
            if bound < 1 {
                return Err(malformed(
                    at,
                    format!("{access} has a data-dependent index into a dim of size {bound}"),
                ));
            }
            let span = stride as i128 * (bound as i128 - 1);
            if span < 0 {
                min += span;
            } else {
                max += span;
            }
        }
        if min < 0 || max >= len {
            return Err(VerifyError::OutOfRange {
                at: at.to_string(),
                access: access.to_string(),
                buffer,
                min,
                max,
                len,
            });
        }
        Ok(())
    }

    /// Every element of `view` seen with `shape` lies inside its buffer.
    /// An implicit im2col operand: a rank-4 source with static channels and spatial sizes that
    /// the window fits, seen with the shape `[N, groups, C/groups·KH·KW, OH·OW]`.
    fn im2col(&self, at: &str, view: &Im2colView) -> Result<(), VerifyError> {
        let source = self.buffer(view.source, at)?;
        let bad = |why: String| Err(malformed(at, format!("im2col operand: {why}")));
        let statics: Option<Vec<usize>> = source.shape[1..].iter().map(|d| d.as_static()).collect();
        let (4, Some(&[c, h, w])) = (source.shape.len(), statics.as_deref()) else {
            return bad(format!(
                "source {} must be [N, C, H, W] with static C, H, W",
                minductor_ir::shape_string(&source.shape)
            ));
        };
        let Some([oh, ow]) = view.window.output_size(h, w) else {
            return bad(format!("the window ({}) does not fit {h}x{w}", view.window));
        };
        let g = view.groups;
        let expected = (g > 0 && c % g == 0).then(|| {
            vec![
                source.shape[0],
                Dim::Static(g),
                Dim::Static(c / g * view.window.taps()),
                Dim::Static(oh * ow),
            ]
        });
        if expected.as_deref() != Some(&view.shape[..]) {
            return bad(format!(
                "shape {} is not the im2col of {} in {g} groups",
                minductor_ir::shape_string(&view.shape),
                minductor_ir::shape_string(&source.shape)
            ));
        }
        Ok(())
    }

    fn view(
        &self,
        at: &str,
        what: &str,
        view: &StridedView,
        shape: &[Dim],
    ) -> Result<(), VerifyError> {
        self.buffer(view.buffer, at)?;
        if view.strides.len() != shape.len() {
            return Err(malformed(
                at,
                format!(
                    "{what}: {} strides for {} dims",
                    view.strides.len(),
                    shape.len()
                ),
            ));
        }
        let sizes: Option<Vec<usize>> = shape.iter().map(|&d| self.size(d)).collect();
        let (Some(sizes), Some(len)) = (sizes, self.numel(view.buffer)) else {
            return Ok(()); // Checked again once the symbols are bound.
        };
        if sizes.contains(&0) {
            return Ok(());
        }
        let Some(offset) = self.value(&view.offset) else {
            return Ok(()); // Checked again once the symbols are bound.
        };
        let (mut min, mut max) = (offset, offset);
        for (&n, stride) in sizes.iter().zip(&view.strides) {
            let Some(stride) = self.value(stride) else {
                return Ok(()); // Checked again once the symbols are bound.
            };
            let span = stride * (n as i128 - 1);
            if span < 0 {
                min += span;
            } else {
                max += span;
            }
        }
        if min < 0 || max >= len {
            return Err(VerifyError::OutOfRange {
                at: at.to_string(),
                access: what.to_string(),
                buffer: view.buffer,
                min,
                max,
                len,
            });
        }
        Ok(())
    }

    /// Two dims are the same size: equal dims, or equal known sizes.
    fn same(&self, a: Dim, b: Dim) -> bool {
        a == b || matches!((self.size(a), self.size(b)), (Some(x), Some(y)) if x == y)
    }

    fn matmul(&self, n: usize, m: &MatmulStep) -> Result<(), VerifyError> {
        let at = format!("step {n} (matmul into {})", m.out);
        for (what, id) in [("a", m.a.buffer), ("b", m.b.buffer()), ("out", m.out)] {
            if self.buffer(id, &at)?.dtype != DType::F32 {
                return Err(malformed(&at, format!("{what} ({id}) must be f32")));
            }
        }
        let out = self.program.buffer(m.out);
        if matches!(out.kind, BufferKind::Input(_)) {
            return Err(malformed(&at, "writes an input"));
        }
        let (a, b) = (&m.a.shape, m.b.shape());
        let rank = a.len();
        let dims_agree = rank >= 2
            && b.len() == rank
            && out.shape.len() == rank
            && (0..rank - 2).all(|d| self.same(a[d], b[d]) && self.same(a[d], out.shape[d]))
            && self.same(a[rank - 1], b[rank - 2])
            && self.same(a[rank - 2], out.shape[rank - 2])
            && self.same(b[rank - 1], out.shape[rank - 1]);
        if !dims_agree {
            return Err(malformed(
                &at,
                format!(
                    "shapes {} @ {} do not give {}",
                    minductor_ir::shape_string(a),
                    minductor_ir::shape_string(b),
                    minductor_ir::shape_string(&out.shape)
                ),
            ));
        }
        self.view(&at, "operand a", &m.a, a)?;
        match &m.b {
            MatmulOperand::View(view) => self.view(&at, "operand b", view, b)?,
            MatmulOperand::Im2col(view) => self.im2col(&at, view)?,
        }
        if let Some(e) = &m.epilogue {
            let eat = format!("{at}, epilogue {}", e.name);
            // The epilogue is called on ranges of the output's first dim.
            match e.outer.first() {
                Some(&first) if self.same(first, a[0]) => {}
                _ => {
                    return Err(malformed(
                        &eat,
                        "its first outer loop must be the output's first dim",
                    ))
                }
            }
            if e.order != LoopOrder::Inner {
                return Err(malformed(&eat, "an epilogue runs in the inner loop order"));
            }
            self.kernel(&eat, n, e)?;
        }
        Ok(())
    }

    fn scatter_add(&self, n: usize, sc: &ScatterAddStep) -> Result<(), VerifyError> {
        let at = format!("step {n} (scatter-add into {})", sc.out);
        let want = [
            ("index", sc.index.buffer, DType::I64),
            ("src", sc.src.buffer, DType::F32),
            ("out", sc.out, DType::F32),
        ];
        for (what, id, dtype) in want {
            if self.buffer(id, &at)?.dtype != dtype {
                return Err(malformed(&at, format!("{what} ({id}) must be {dtype}")));
            }
        }
        let out = self.program.buffer(sc.out);
        if matches!(out.kind, BufferKind::Input(_)) {
            return Err(malformed(&at, "writes an input"));
        }
        if out.shape.len() != sc.src.shape.len() || sc.dim >= out.shape.len() {
            return Err(malformed(&at, "dim or ranks do not agree"));
        }
        self.view(&at, "index", &sc.index, &sc.src.shape)?;
        self.view(&at, "src", &sc.src, &sc.src.shape)
    }

    /// A fused attention: f32 buffers, an output that is a non-input buffer distinct from the
    /// operands, shapes `q [batch.., T, E]`, `k [batch_kv.., S, E]`, `v [batch_kv.., S, Ev]`,
    /// `out [batch.., T, Ev]` (`batch_kv` is `batch` with its last dim divided by `group`), and
    /// every view inside its buffer. The kernel's unsafe reads and writes rest on exactly this.
    fn attention(&self, n: usize, a: &AttentionStep) -> Result<(), VerifyError> {
        let at = format!("step {n} (attention into {})", a.out.buffer);
        for (what, id) in [
            ("q", a.q.buffer),
            ("k", a.k.buffer),
            ("v", a.v.buffer),
            ("out", a.out.buffer),
        ]
        .into_iter()
        .chain(
            a.mask
                .as_ref()
                .filter(|_| a.mask_kind == MaskKind::Add)
                .map(|m| ("mask", m.buffer)),
        ) {
            if self.buffer(id, &at)?.dtype != DType::F32 {
                return Err(malformed(&at, format!("{what} ({id}) must be f32")));
            }
        }
        if let Some(m) = a.mask.as_ref().filter(|_| a.mask_kind != MaskKind::Add) {
            if self.buffer(m.buffer, &at)?.dtype != DType::Bool {
                return Err(malformed(
                    &at,
                    format!("a keep or drop mask ({}) must be bool", m.buffer),
                ));
            }
        }
        let out = self.program.buffer(a.out.buffer);
        if matches!(out.kind, BufferKind::Input(_)) {
            return Err(malformed(&at, "writes an input"));
        }
        if [a.q.buffer, a.k.buffer, a.v.buffer].contains(&a.out.buffer)
            || a.mask.as_ref().is_some_and(|m| m.buffer == a.out.buffer)
        {
            return Err(malformed(&at, "reads its own output"));
        }
        let (q, k, v, o) = (&a.q.shape, &a.k.shape, &a.v.shape, &a.out.shape);
        let rank = q.len();
        let batch = rank.saturating_sub(2);
        let kv_batch_agrees = |d: usize| {
            if d + 1 < batch {
                return self.same(q[d], k[d]) && self.same(q[d], v[d]);
            }
            // The heads: q's count is `group` times k's and v's.
            match (self.size(q[d]), self.size(k[d]), self.size(v[d])) {
                (Some(h), Some(hk), Some(hv)) => hk == hv && hk * a.group == h,
                _ => a.group == 1 && self.same(q[d], k[d]) && self.same(q[d], v[d]),
            }
        };
        let dims_agree = rank >= 3
            && a.group >= 1
            && [k.len(), v.len(), o.len()].iter().all(|&r| r == rank)
            && (0..batch).all(|d| self.same(q[d], o[d]) && kv_batch_agrees(d))
            && self.same(q[rank - 2], o[rank - 2])
            && self.same(q[rank - 1], k[rank - 1])
            && self.same(k[rank - 2], v[rank - 2])
            && self.same(v[rank - 1], o[rank - 1]);
        if !dims_agree || !a.scale.is_finite() {
            return Err(malformed(
                &at,
                format!(
                    "q {}, k {}, v {} (group {}, scale {}) do not give {}",
                    minductor_ir::shape_string(q),
                    minductor_ir::shape_string(k),
                    minductor_ir::shape_string(v),
                    a.group,
                    a.scale,
                    minductor_ir::shape_string(o)
                ),
            ));
        }
        if let Some(mask) = &a.mask {
            // The scores' shape: q's batch dims, T, S.
            let m = &mask.shape;
            let agrees = m.len() == rank
                && (0..batch).all(|d| self.same(m[d], q[d]))
                && self.same(m[rank - 2], q[rank - 2])
                && self.same(m[rank - 1], k[rank - 2]);
            if !agrees {
                return Err(malformed(
                    &at,
                    format!(
                        "mask {} is not the scores' shape",
                        minductor_ir::shape_string(m)
                    ),
                ));
            }
            self.view(&at, "mask", mask, m)?;
        }
        self.view(&at, "q", &a.q, q)?;
        self.view(&at, "k", &a.k, k)?;
        self.view(&at, "v", &a.v, v)?;
        self.distinct_rows(&at, &a.out)?;
        self.view(&at, "out", &a.out, o)
    }

    /// An attention's output view keeps each row's elements contiguous (last stride 1) and
    /// gives every element its own place: with the dims of more than one position sorted by
    /// stride (none negative), each stride is past everything the smaller ones reach. Then
    /// each output row, which one work item writes, is no other row's, whatever the threads.
    /// (The kernel library checks the same again for the bound sizes.)
    fn distinct_rows(&self, at: &str, view: &StridedView) -> Result<(), VerifyError> {
        let sizes: Option<Vec<usize>> = view.shape.iter().map(|&d| self.size(d)).collect();
        let strides: Option<Vec<i128>> = view.strides.iter().map(|s| self.value(s)).collect();
        let (Some(sizes), Some(strides)) = (sizes, strides) else {
            return Ok(()); // Checked again once the symbols are bound.
        };
        match minductor_ir::distinct_places(&sizes, &strides) {
            // A view spanning more than an `i128` of elements fits no buffer: `view` refuses it.
            Ok(_) | Err(LayoutFault::Overflow) => Ok(()),
            Err(LayoutFault::ColumnsApart(stride)) => Err(malformed(
                at,
                format!("out: the columns of a row are {stride} apart, not contiguous"),
            )),
            Err(LayoutFault::Negative(_) | LayoutFault::SharedPlace) => Err(malformed(
                at,
                format!(
                    "out: strides {} give two elements one place",
                    crate::kernel::size_list(&view.strides)
                ),
            )),
        }
    }

    /// A fallback step: its buffers exist, it writes no input and none of its operands, and its
    /// op's type rule over the operands' buffer types gives exactly its output buffer's type (so
    /// the interpreter's result fills the buffer exactly, whatever sizes a call binds).
    fn fallback(&self, n: usize, fb: &FallbackStep) -> Result<(), VerifyError> {
        let at = format!("step {n} (fallback {} into {})", fb.op, fb.out);
        let out = self.buffer(fb.out, &at)?;
        if matches!(out.kind, BufferKind::Input(_)) {
            return Err(malformed(&at, format!("writes input {}", fb.out)));
        }
        if fb.inputs.contains(&fb.out) {
            return Err(malformed(&at, format!("reads its own output {}", fb.out)));
        }
        use minductor_ir::Op;
        if matches!(fb.op, Op::Input { .. } | Op::Grad { .. }) {
            return Err(malformed(
                &at,
                format!("{} cannot run as a fallback", fb.op),
            ));
        }
        if fb.reason.contains('\n') || fb.reason.is_empty() {
            return Err(malformed(&at, "the reason must be one non-empty line"));
        }
        let mut types = Vec::with_capacity(fb.inputs.len());
        for &id in &fb.inputs {
            let b = self.buffer(id, &at)?;
            types.push(minductor_ir::TensorType::new(
                b.dtype,
                b.shape.iter().copied().collect(),
            ));
        }
        let refs: Vec<&minductor_ir::TensorType> = types.iter().collect();
        let ty = if let Op::Constant { .. } = fb.op {
            // A constant takes its output's dtype; it is 0-d and has no operands.
            if !fb.inputs.is_empty() {
                return Err(malformed(&at, "a constant has no operands"));
            }
            minductor_ir::TensorType::new(out.dtype, Default::default())
        } else {
            minductor_ir::infer_type(&fb.op, &refs).map_err(|e| {
                malformed(&at, format!("the op does not apply to its operands: {e}"))
            })?
        };
        if ty.dtype != out.dtype || ty.shape.as_slice() != out.shape.as_slice() {
            return Err(malformed(
                &at,
                format!(
                    "the op gives {ty}, but {} is {}{}",
                    fb.out,
                    out.dtype,
                    minductor_ir::shape_string(&out.shape)
                ),
            ));
        }
        Ok(())
    }

    /// A step reads an intermediate or output only if it or an earlier step writes it.
    fn order(&self) -> Result<(), VerifyError> {
        let mut written: HashSet<BufferId> = HashSet::new();
        for (n, step) in self.program.steps.iter().enumerate() {
            written.extend(step.writes());
            for r in step.reads() {
                let b = self.buffer(r, &format!("step {n}"))?;
                if !matches!(b.kind, BufferKind::Input(_)) && !written.contains(&r) {
                    return Err(malformed(
                        format!("step {n}"),
                        format!("reads {r} before any step writes it"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn outputs_and_checks(&self) -> Result<(), VerifyError> {
        let p = self.program;
        // Every buffer some step writes, gathered once (a training step has an output per
        // parameter: asking every step per output would be quadratic).
        let written: HashSet<BufferId> = p.steps.iter().flat_map(|s| s.writes()).collect();
        for &o in &p.outputs {
            let b = self.buffer(o, "outputs")?;
            if b.kind == BufferKind::Intermediate {
                return Err(malformed("outputs", format!("{o} is an intermediate")));
            }
            // Outputs are allocated without zeroing, so some step must write them. (That it
            // writes every element is `fuse`'s guarantee, not checked here: an unwritten
            // element holds stale but initialised bytes, zero for bool outputs.)
            if b.kind == BufferKind::Output && !written.contains(&o) {
                return Err(malformed("outputs", format!("no step writes output {o}")));
            }
        }
        for check in &p.index_checks {
            let at = format!("index check of {}", check.buffer);
            if self.buffer(check.buffer, &at)?.dtype != DType::I64 {
                return Err(malformed(&at, "indices must be i64"));
            }
            if check.step >= p.steps.len() {
                return Err(malformed(
                    &at,
                    format!("step {} does not exist", check.step),
                ));
            }
            // The check runs before its step: the indices must exist by then.
            if p.steps[check.step].writes().contains(&check.buffer) {
                return Err(malformed(
                    &at,
                    format!(
                        "step {} checks indices it computes itself (before computing them)",
                        check.step
                    ),
                ));
            }
        }
        Ok(())
    }

    fn plan(&self, plan: &BufferPlan) -> Result<(), VerifyError> {
        let p = self.program;
        let fail = |m: String| Err(VerifyError::Plan(m));
        if plan.slot_of.len() != p.buffers.len() {
            return fail(format!(
                "{} slot entries for {} buffers",
                plan.slot_of.len(),
                p.buffers.len()
            ));
        }
        let live = steps_using(p);
        // Each slot's members as one set (a slot may hold hundreds of buffers).
        let member_of: HashSet<(usize, BufferId)> = plan
            .slots
            .iter()
            .enumerate()
            .flat_map(|(s, slot)| slot.members.iter().map(move |&m| (s, m)))
            .collect();
        for (i, (b, slot)) in p.buffers.iter().zip(&plan.slot_of).enumerate() {
            let id = BufferId(i as u32);
            match (b.kind, slot) {
                (BufferKind::Intermediate, None) if live[i].is_some() => {
                    return fail(format!("{id} is used by a step but has no slot"))
                }
                (BufferKind::Intermediate, _) => {}
                (_, Some(_)) => return fail(format!("{id} is not an intermediate but has a slot")),
                (_, None) => {}
            }
            if let Some(s) = *slot {
                if s >= plan.slots.len() {
                    return fail(format!("{id} is in slot {s}, which does not exist"));
                }
                if !member_of.contains(&(s, id)) {
                    return fail(format!("{id} is in slot {s} but not among its members"));
                }
            }
        }
        for (s, slot) in plan.slots.iter().enumerate() {
            for &m in &slot.members {
                if plan.slot_of.get(m.0 as usize).copied().flatten() != Some(s) {
                    return fail(format!("slot {s} lists {m}, which is not placed in it"));
                }
                let bytes = buffer_bytes(p.buffer(m));
                if slot.bytes < bytes {
                    return fail(format!(
                        "slot {s} has {} bytes, too few for {m} ({bytes} bytes)",
                        slot.bytes
                    ));
                }
            }
            // Overlapping lifetimes: only an in-place pair, at the step where the input's life
            // ends and the output's begins, with a safe access pattern.
            let pair =
                |written: BufferId, input: BufferId, lw: (usize, usize), li: (usize, usize)| {
                    li.1 == lw.0
                        && plan.in_place.contains(&(written, input, lw.0))
                        && in_place_allowed(p, &p.steps[lw.0], written, input)
                };
            // A slot may hold hundreds of buffers one after another (a deep training step), so
            // the overlapping pairs are found by a sweep over the members sorted by their first
            // step rather than by comparing every pair; only when one is refused does the
            // member-by-member walk below run, to name the first refused pair in member order.
            let mut spans: Vec<(usize, usize, BufferId)> = slot
                .members
                .iter()
                .filter_map(|&m| live[m.0 as usize].map(|(first, last)| (first, last, m)))
                .collect();
            spans.sort_unstable_by_key(|&(first, last, m)| (first, last, m.0));
            let mut active: Vec<(usize, usize, BufferId)> = Vec::new();
            let mut refused = false;
            'sweep: for &(first, last, b) in &spans {
                active.retain(|&(_, end, _)| end >= first);
                for &(afirst, alast, a) in &active {
                    let (la, lb) = ((afirst, alast), (first, last));
                    if !(pair(b, a, lb, la) || pair(a, b, la, lb)) {
                        refused = true;
                        break 'sweep;
                    }
                }
                active.push((first, last, b));
            }
            if !refused {
                continue;
            }
            for (x, &a) in slot.members.iter().enumerate() {
                for &b in &slot.members[x + 1..] {
                    let (Some(la), Some(lb)) = (live[a.0 as usize], live[b.0 as usize]) else {
                        continue;
                    };
                    if la.1 < lb.0 || lb.1 < la.0 {
                        continue;
                    }
                    if !(pair(b, a, lb, la) || pair(a, b, la, lb)) {
                        return fail(format!(
                            "{a} (steps {}..={}) and {b} (steps {}..={}) share slot {s} while both \
                             are live",
                            la.0, la.1, lb.0, lb.1
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// For each buffer, the first and the last step that reads or writes it (`None`: no step does).
fn steps_using(p: &Program) -> Vec<Option<(usize, usize)>> {
    let mut span = vec![None; p.buffers.len()];
    for (i, step) in p.steps.iter().enumerate() {
        for b in step.reads().into_iter().chain(step.writes()) {
            let entry: &mut Option<(usize, usize)> = &mut span[b.0 as usize];
            let first = entry.map_or(i, |(first, _)| first);
            *entry = Some((first, i));
        }
    }
    span
}

/// Whether `step` may write `written` into the slot of `input` while it reads `input`:
/// re-derived from the step alone. The step is a loop kernel, or a GEMM's epilogue with `input`
/// not an operand of the GEMM (a GEMM reads its operands whole); both buffers are distinct
/// intermediates of the same element width and count; `written` has exactly one store, in the
/// last stage; and every load of `input` is direct, at that store's index, needed by no store
/// after it in that stage, and used only by stages of the store stage's extent. Then each
/// element of `input` is read in the iteration that overwrites it, before it is overwritten.
fn in_place_allowed(p: &Program, step: &Step, written: BufferId, input: BufferId) -> bool {
    let kernel = match step {
        Step::Kernel(k) => k,
        Step::Matmul(m) if m.a.buffer != input && m.b.buffer() != input => match &m.epilogue {
            Some(epilogue) => epilogue,
            None => return false,
        },
        _ => return false,
    };
    let (out, inp) = (p.buffer(written), p.buffer(input));
    let same_elements =
        out.shape == inp.shape || (out.numel().is_some() && out.numel() == inp.numel());
    if written == input
        || out.kind != BufferKind::Intermediate
        || inp.kind != BufferKind::Intermediate
        || out.dtype.size_bytes() != inp.dtype.size_bytes()
        || !same_elements
    {
        return false;
    }
    let mut stores_of_written = kernel.stages.iter().enumerate().flat_map(|(s, stage)| {
        stage
            .action
            .stores()
            .iter()
            .enumerate()
            .filter(|(_, st)| st.buffer == written)
            .map(move |(position, st)| (s, position, st))
    });
    let (Some((stage, position, store)), None) =
        (stores_of_written.next(), stores_of_written.next())
    else {
        return false;
    };
    if stage + 1 != kernel.stages.len() {
        return false;
    }
    let StageAction::Store(stage_stores) = &kernel.stages[stage].action else {
        return false;
    };
    let later: Vec<ExprId> = stage_stores[position + 1..]
        .iter()
        .map(|st| st.value)
        .collect();
    let needed_later = kernel.reachable(&later);
    let extent = &kernel.stages[stage].extent;
    kernel.exprs.iter().enumerate().all(|(i, e)| {
        let Expr::Load {
            buffer,
            index,
            indirect,
        } = e
        else {
            return true;
        };
        if *buffer != input {
            return true;
        }
        let id = ExprId(i as u32);
        indirect.is_none()
            && *index == store.index
            && !needed_later.contains(&id)
            && kernel
                .stages
                .iter()
                .all(|s| s.extent == *extent || !kernel.reachable(&s.action.roots()).contains(&id))
    })
}
