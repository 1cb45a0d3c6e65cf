//! `program_cost`: a static cost model of each step of a [`Program`], computed from the kernel IR
//! (Inductor's `estimate_kernel_num_bytes` and FLOP counter, in small).
//!
//! For every step it reports the graph nodes fused, the iteration domain, bytes read, bytes
//! written and FLOPs:
//! - **Bytes** count the distinct elements each buffer's accesses touch, times the dtype's size:
//!   a buffer read by several stages or loads is counted once, a broadcast operand (index
//!   coefficient 0) counts its own size, a slice only the elements inside it. One access pattern
//!   `offset + Σ c·var` whose strides do not overlap touches exactly `Π extent` elements; several
//!   distinct patterns on one buffer, or overlapping strides, are counted exactly by enumerating
//!   the addresses when there are at most 2^24 of them, and otherwise bounded by the sum of the
//!   patterns' sizes (never more than the buffer). Data-dependent (embedding) indices are counted
//!   as every row they could reach, an upper bound.
//! - **FLOPs** of a kernel: every unary, binary, compare and where op reachable from a stage's
//!   result counts one per evaluation, plus one per element combined by a reduction; casts, loads
//!   and constants count zero. An op that does not depend on the stage's inner loops counts once
//!   per outer iteration (the generated code hoists it), any other once per inner iteration.
//!   A matmul counts `2·batch·M·N·K`.
//!
//! Assumes a program from `fuse` (indices within their buffers). Symbolic extents (which `fuse`
//! does not produce yet) count as 1. Never panics on the program's contents.

use crate::kernel::*;
use minductor_ir::{Dim, NodeId};
use std::collections::{HashMap, HashSet};
use std::fmt;

/// What a step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// A generated loop kernel.
    Kernel,
    /// An extern GEMM call.
    Matmul,
    /// An extern scatter-add (the derivative of a gather).
    ScatterAdd,
    /// A fused attention (`Step::Attention`): both GEMMs and the softmax in one kernel.
    Attention,
    /// A node the reference interpreter runs (`Step::Fallback`).
    Fallback,
}

/// The static cost of one step of a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepCost {
    /// The kernel's name; `k<step>_matmul` for a GEMM.
    pub name: String,
    pub kind: StepKind,
    /// Graph nodes the step computes (for a kernel, the non-view nodes fused into it).
    pub nodes: Vec<NodeId>,
    /// Iteration domain: a kernel's outer loops; a GEMM's `[batch..., M, N]`.
    pub outer: Vec<Dim>,
    /// Inner loops: each stage's extents for a kernel; `[[K]]` for a GEMM.
    pub inner: Vec<Vec<Dim>>,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flops: u64,
}

/// Costs every step of `program`, in step order; a GEMM's epilogue kernel is a row of its own
/// right after the GEMM's.
pub fn program_cost(program: &Program) -> Vec<StepCost> {
    program
        .steps
        .iter()
        .enumerate()
        .flat_map(|(index, step)| match step {
            Step::Kernel(kernel) => vec![kernel_cost(program, kernel)],
            Step::Matmul(matmul) => {
                let mut rows = vec![matmul_cost(program, index, matmul)];
                rows.extend(matmul.epilogue.as_ref().map(|e| kernel_cost(program, e)));
                rows
            }
            Step::ScatterAdd(scatter) => vec![scatter_add_cost(program, index, scatter)],
            Step::Attention(attention) => vec![attention_cost(program, index, attention)],
            Step::Fallback(fallback) => vec![fallback_cost(program, index, fallback)],
        })
        .collect()
}

fn extent(d: &Dim) -> u64 {
    d.as_static().unwrap_or(1) as u64
}

/// A size expression's value (at least 0) with each symbol counted as 1, as [`extent`] counts
/// symbolic dims.
fn symbols_as_one(e: &minductor_ir::SizeExpr) -> u64 {
    e.eval(|_| Some(1))
        .map_or(1, |v| v.clamp(0, u64::MAX as i128) as u64)
}

/// A stride or offset with each symbol counted as 1, as [`extent`] counts symbolic dims.
fn nominal(e: &minductor_ir::SizeExpr) -> i64 {
    e.eval(|_| Some(1))
        .and_then(|v| i64::try_from(v).ok())
        .unwrap_or(i64::MAX)
}

/// Saturating products and sums throughout: this is an estimate, and a program with sizes near
/// the limits must not make it overflow.
fn trip_count(dims: &[Dim]) -> u64 {
    dims.iter()
        .map(extent)
        .fold(1u64, |acc, n| acc.saturating_mul(n))
}

/// The addresses `offset + Σ coefficient · i`, `i` in `0..count`, of one access, in elements.
/// Terms are normalised (zero coefficients and unit extents dropped, sorted) so that equal sets
/// of addresses written with different loop variables compare equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Pattern {
    offset: i64,
    terms: Vec<(i64, u64)>,
}

impl Pattern {
    fn new(offset: i64, terms: impl IntoIterator<Item = (i64, u64)>) -> Pattern {
        let mut terms: Vec<(i64, u64)> = terms
            .into_iter()
            .filter(|&(c, n)| c != 0 && n > 1)
            .collect();
        terms.sort();
        Pattern { offset, terms }
    }

    fn points(&self) -> u64 {
        self.terms
            .iter()
            .map(|t| t.1)
            .fold(1u64, |acc, n| acc.saturating_mul(n))
    }

    /// True if no two index tuples reach the same address (each stride exceeds the span of the
    /// smaller ones), so the footprint is exactly `points()`.
    fn injective(&self) -> bool {
        let mut by_size: Vec<(u64, u64)> = self
            .terms
            .iter()
            .map(|&(c, n)| (c.unsigned_abs(), n))
            .collect();
        by_size.sort();
        let mut span: u64 = 0;
        for (c, n) in by_size {
            if c <= span {
                return false;
            }
            span = span.saturating_add(c.saturating_mul(n - 1));
        }
        true
    }

    /// Calls `f` with every address.
    fn for_each(&self, f: &mut impl FnMut(i64)) {
        fn walk(terms: &[(i64, u64)], base: i64, f: &mut impl FnMut(i64)) {
            match terms.split_first() {
                None => f(base),
                Some((&(c, n), rest)) => {
                    for i in 0..n as i64 {
                        walk(rest, base + c * i, f);
                    }
                }
            }
        }
        walk(&self.terms, self.offset, f);
    }
}

/// Distinct elements of a buffer of `numel` elements that `patterns` touch.
fn footprint(patterns: &HashSet<Pattern>, numel: u64) -> u64 {
    const ENUMERATION_LIMIT: u64 = 1 << 24;
    if patterns.len() == 1 {
        let p = patterns.iter().next().expect("one pattern");
        if p.injective() {
            return p.points().min(numel);
        }
    }
    let total: u64 = patterns
        .iter()
        .fold(0u64, |acc, p| acc.saturating_add(p.points()));
    if total > ENUMERATION_LIMIT || numel > ENUMERATION_LIMIT {
        return total.min(numel);
    }
    let mut seen = vec![false; numel as usize];
    let mut count = 0u64;
    for p in patterns {
        p.for_each(&mut |address| {
            if let Some(slot) = usize::try_from(address).ok().and_then(|a| seen.get_mut(a)) {
                if !*slot {
                    *slot = true;
                    count += 1;
                }
            }
        });
    }
    count
}

fn bytes(program: &Program, accesses: &HashMap<BufferId, HashSet<Pattern>>) -> u64 {
    accesses
        .iter()
        .filter_map(|(&id, patterns)| {
            let buffer = program.buffers.get(id.0 as usize)?;
            let numel = trip_count(&buffer.shape);
            Some(footprint(patterns, numel).saturating_mul(buffer.dtype.size_bytes() as u64))
        })
        .fold(0u64, |acc, b| acc.saturating_add(b))
}

/// Extent of each loop variable as seen from inside `stage`.
fn var_extent(kernel: &Kernel, stage: &Stage, var: Var) -> u64 {
    match var {
        Var::Outer(i) => kernel.outer.get(i as usize).map_or(1, extent),
        Var::Inner(i) => stage.extent.get(i as usize).map_or(1, extent),
    }
}

fn affine_pattern(kernel: &Kernel, stage: &Stage, index: &Affine) -> Pattern {
    Pattern::new(
        nominal(&index.offset),
        index
            .terms
            .iter()
            .map(|(v, c)| (nominal(c), var_extent(kernel, stage, *v))),
    )
}

fn kernel_cost(program: &Program, kernel: &Kernel) -> StepCost {
    let outer_trips = trip_count(&kernel.outer);
    let varies = inner_dependence(kernel);
    let mut reads: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    let mut writes: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    let mut flops = 0u64;
    for stage in &kernel.stages {
        let inner_trips = trip_count(&stage.extent);
        if let StageAction::Reduce { .. } | StageAction::Scan(_) = &stage.action {
            flops = flops.saturating_add(outer_trips.saturating_mul(inner_trips));
        }
        for store in stage.action.stores() {
            writes
                .entry(store.buffer)
                .or_default()
                .insert(affine_pattern(kernel, stage, &store.index));
        }
        let roots = stage.action.roots();
        for id in kernel.reachable(&roots) {
            let Some(expr) = kernel.exprs.get(id.0 as usize) else {
                continue;
            };
            let per_evaluation = if varies[id.0 as usize] {
                outer_trips * inner_trips
            } else {
                outer_trips
            };
            match expr {
                Expr::Load {
                    buffer,
                    index,
                    indirect,
                } => {
                    let mut pattern = affine_pattern(kernel, stage, index);
                    if let Some(ind) = indirect {
                        // Every row the clamped data-dependent index could select.
                        pattern = Pattern::new(
                            pattern.offset,
                            pattern
                                .terms
                                .iter()
                                .copied()
                                .chain([(ind.stride, symbols_as_one(&ind.bound))]),
                        );
                    }
                    reads.entry(*buffer).or_default().insert(pattern);
                }
                Expr::Unary(..) | Expr::Binary(..) | Expr::Compare(..) | Expr::Where(..) => {
                    flops = flops.saturating_add(per_evaluation)
                }
                Expr::Constant { .. } | Expr::StageResult(_) | Expr::Cast(..) | Expr::Index(_) => {}
            }
        }
    }
    StepCost {
        name: kernel.name.clone(),
        kind: StepKind::Kernel,
        nodes: kernel.nodes.clone(),
        outer: kernel.outer.clone(),
        inner: kernel.stages.iter().map(|s| s.extent.clone()).collect(),
        bytes_read: bytes(program, &reads),
        bytes_written: bytes(program, &writes),
        flops,
    }
}

/// For each expression, whether its value depends on an inner loop variable.
fn inner_dependence(kernel: &Kernel) -> Vec<bool> {
    let mut varies = vec![false; kernel.exprs.len()];
    // Operands precede their users in `exprs` (the builder appends bottom-up), but do not rely
    // on it: iterate until nothing changes.
    loop {
        let mut changed = false;
        for (i, expr) in kernel.exprs.iter().enumerate() {
            let get = |e: &ExprId| varies.get(e.0 as usize).copied().unwrap_or(false);
            let v = match expr {
                Expr::Load {
                    index, indirect, ..
                } => {
                    index
                        .terms
                        .iter()
                        .any(|(var, _)| matches!(var, Var::Inner(_)))
                        || indirect.as_ref().is_some_and(|ind| get(&ind.value))
                }
                Expr::Unary(_, a) | Expr::Cast(_, a) => get(a),
                Expr::Binary(_, a, b) | Expr::Compare(_, a, b) => get(a) || get(b),
                Expr::Where(c, a, b) => get(c) || get(a) || get(b),
                Expr::Constant { .. } | Expr::StageResult(_) => false,
                Expr::Index(index) => index
                    .terms
                    .iter()
                    .any(|(var, _)| matches!(var, Var::Inner(_))),
            };
            if v && !varies[i] {
                varies[i] = true;
                changed = true;
            }
        }
        if !changed {
            return varies;
        }
    }
}

fn view_pattern(view: &StridedView) -> Pattern {
    Pattern::new(
        nominal(&view.offset),
        view.strides
            .iter()
            .zip(&view.shape)
            .map(|(s, n)| (nominal(s), extent(n))),
    )
}

/// A fallback step reads each operand buffer whole and writes its output whole; its FLOPs are
/// counted as one per element of its largest operand (every fallback op is a reduction, scan or
/// scatter visiting each element once).
fn fallback_cost(program: &Program, step: usize, fallback: &FallbackStep) -> StepCost {
    let shape = |id: BufferId| -> Vec<Dim> {
        program
            .buffers
            .get(id.0 as usize)
            .map_or_else(Vec::new, |b| b.shape.clone())
    };
    let whole = |id: BufferId| Pattern::new(0, [(1, trip_count(&shape(id)))]);
    let mut reads: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    for &input in &fallback.inputs {
        reads.entry(input).or_default().insert(whole(input));
    }
    let mut writes: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    writes
        .entry(fallback.out)
        .or_default()
        .insert(whole(fallback.out));
    let flops = fallback
        .inputs
        .iter()
        .map(|&b| trip_count(&shape(b)))
        .max()
        .unwrap_or(0);
    StepCost {
        name: format!("k{step}_fallback_{}", fallback.op.name()),
        kind: StepKind::Fallback,
        nodes: vec![fallback.node],
        outer: shape(fallback.out),
        inner: Vec::new(),
        bytes_read: bytes(program, &reads),
        bytes_written: bytes(program, &writes),
        flops,
    }
}

fn scatter_add_cost(program: &Program, step: usize, scatter: &ScatterAddStep) -> StepCost {
    let out_shape: Vec<Dim> = program
        .buffers
        .get(scatter.out.0 as usize)
        .map_or_else(Vec::new, |b| b.shape.clone());
    let mut reads: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    for view in [&scatter.index, &scatter.src] {
        reads
            .entry(view.buffer)
            .or_default()
            .insert(view_pattern(view));
    }
    let mut writes: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    writes
        .entry(scatter.out)
        .or_default()
        .insert(Pattern::new(0, [(1, trip_count(&out_shape))]));
    StepCost {
        name: format!("k{step}_scatter_add"),
        kind: StepKind::ScatterAdd,
        nodes: vec![scatter.node],
        outer: scatter.src.shape.clone(),
        inner: Vec::new(),
        bytes_read: bytes(program, &reads),
        bytes_written: bytes(program, &writes),
        flops: trip_count(&scatter.src.shape),
    }
}

/// Each operand read once, the output written once; two GEMMs' FLOPs (`q·kᵀ` and `p·v`), half of
/// them under a causal mask (the key blocks above the diagonal are skipped).
fn attention_cost(program: &Program, step: usize, attention: &AttentionStep) -> StepCost {
    let mut reads: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    for view in [&attention.q, &attention.k, &attention.v]
        .into_iter()
        .chain(attention.mask.as_ref())
    {
        reads
            .entry(view.buffer)
            .or_default()
            .insert(view_pattern(view));
    }
    let mut writes: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    writes
        .entry(attention.out.buffer)
        .or_default()
        .insert(view_pattern(&attention.out));
    let rank = attention.q.shape.len();
    let (keys, head, value_head) = if rank >= 2 {
        (
            extent(&attention.k.shape[rank - 2]),
            extent(&attention.q.shape[rank - 1]),
            extent(&attention.v.shape[rank - 1]),
        )
    } else {
        (0, 0, 0)
    };
    let rows = trip_count(
        attention
            .q
            .shape
            .get(..rank.saturating_sub(1))
            .unwrap_or(&[]),
    );
    let full = rows
        .saturating_mul(keys)
        .saturating_mul(head.saturating_add(value_head))
        .saturating_mul(2);
    StepCost {
        name: format!("k{step}_attention"),
        kind: StepKind::Attention,
        nodes: attention.nodes.clone(),
        outer: attention.out.shape[..attention.out.shape.len().saturating_sub(1)].to_vec(),
        inner: vec![vec![attention.k.shape[rank.saturating_sub(2)]]],
        bytes_read: bytes(program, &reads),
        bytes_written: bytes(program, &writes),
        flops: if attention.causal { full / 2 } else { full },
    }
}

fn matmul_cost(program: &Program, step: usize, matmul: &MatmulStep) -> StepCost {
    let out_shape: Vec<Dim> = program
        .buffers
        .get(matmul.out.0 as usize)
        .map_or_else(Vec::new, |b| b.shape.clone());
    let rank = matmul.a.shape.len();
    let k = if rank >= 2 {
        extent(&matmul.a.shape[rank - 1])
    } else {
        0
    };
    let mut reads: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    reads
        .entry(matmul.a.buffer)
        .or_default()
        .insert(view_pattern(&matmul.a));
    match &matmul.b {
        MatmulOperand::View(view) => {
            reads
                .entry(view.buffer)
                .or_default()
                .insert(view_pattern(view));
        }
        // The GEMM packs the im2col from its source, reading each element of it.
        MatmulOperand::Im2col(view) => {
            let numel = program
                .buffers
                .get(view.source.0 as usize)
                .map_or(0, |b| trip_count(&b.shape));
            reads
                .entry(view.source)
                .or_default()
                .insert(Pattern::new(0, [(1, numel)]));
        }
    }
    let mut writes: HashMap<BufferId, HashSet<Pattern>> = HashMap::new();
    let out_numel = trip_count(&out_shape);
    writes
        .entry(matmul.out)
        .or_default()
        .insert(Pattern::new(0, [(1, out_numel)]));
    StepCost {
        name: format!("k{step}_matmul"),
        kind: StepKind::Matmul,
        nodes: vec![matmul.node],
        outer: out_shape,
        inner: vec![vec![Dim::Static(k as usize)]],
        bytes_read: bytes(program, &reads),
        bytes_written: bytes(program, &writes),
        flops: out_numel.saturating_mul(k).saturating_mul(2),
    }
}

// ---- text format -----------------------------------------------------------------------------

fn dims_text(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

impl StepCost {
    /// `[4, 7] x [37] [37] [37]`: outer loops, then each stage's (a GEMM's K) loops.
    pub fn domain_text(&self) -> String {
        let mut text = dims_text(&self.outer);
        if !self.inner.is_empty() {
            let inner: Vec<String> = self.inner.iter().map(|d| dims_text(d)).collect();
            text.push_str(" x ");
            text.push_str(&inner.join(" "));
        }
        text
    }

    /// The fused graph nodes as `%3 %4 %5`.
    pub fn nodes_text(&self) -> String {
        let parts: Vec<String> = self.nodes.iter().map(|n| n.to_string()).collect();
        parts.join(" ")
    }
}

/// The kernel table: one line per step (name, kind, domain, bytes read and written, FLOPs), then
/// the totals.
pub struct CostTable<'a>(pub &'a [StepCost]);

impl fmt::Display for CostTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header = ["kernel", "kind", "domain", "read B", "written B", "FLOPs"];
        let rows: Vec<[String; 6]> = self
            .0
            .iter()
            .map(|c| {
                [
                    c.name.clone(),
                    match c.kind {
                        StepKind::Kernel => "kernel".to_string(),
                        StepKind::Matmul => "matmul".to_string(),
                        StepKind::ScatterAdd => "scatter_add".to_string(),
                        StepKind::Attention => "attention".to_string(),
                        StepKind::Fallback => "fallback".to_string(),
                    },
                    c.domain_text(),
                    c.bytes_read.to_string(),
                    c.bytes_written.to_string(),
                    c.flops.to_string(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: [&str; 6]| -> fmt::Result {
            // Text columns left-aligned, numbers right-aligned.
            writeln!(
                f,
                "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {:>w4$}  {:>w5$}",
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                cells[4],
                cells[5],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3],
                w4 = widths[4],
                w5 = widths[5],
            )
        };
        line(f, header)?;
        for row in &rows {
            line(f, [&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]])?;
        }
        let total = |g: fn(&StepCost) -> u64| self.0.iter().map(g).sum::<u64>().to_string();
        line(
            f,
            [
                "total",
                "",
                "",
                &total(|c| c.bytes_read),
                &total(|c| c.bytes_written),
                &total(|c| c.flops),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footprint_is_exact_for_overlapping_strides_and_capped_by_the_buffer() {
        // i + 2j, i in 0..4, j in 0..4: addresses 0..=9.
        let overlapping = Pattern::new(0, [(1, 4), (2, 4)]);
        assert!(!overlapping.injective());
        assert_eq!(footprint(&HashSet::from([overlapping.clone()]), 100), 10);
        let rows = Pattern::new(0, [(8, 4), (1, 8)]);
        assert!(rows.injective());
        assert_eq!(footprint(&HashSet::from([rows.clone()]), 32), 32);
        // A broadcast (stride 0) term adds nothing.
        assert_eq!(Pattern::new(0, [(0, 5), (1, 8)]).points(), 8);
        assert_eq!(footprint(&HashSet::from([rows, overlapping]), 32), 32);
    }
}
