//! `fuse_epilogues`: attaches the pointwise (or row-wise) consumer of a GEMM's output to the GEMM
//! as its epilogue, so the runtime runs it on each block of output rows right after the GEMM
//! computed that block, while it is still in cache (Inductor's GEMM epilogue fusion: bias,
//! activation, residual add, scaling, even a softmax over the rows of an attention score).
//!
//! A kernel qualifies as the epilogue of `out = a @ b` when
//! - its first outer loop runs over the output's first dim (rows, or the first batch dim), so
//!   the runtime can hand it exactly the rows the GEMM just wrote;
//! - every load of `out` is *row-local*: it moves by the output's row stride along that loop,
//!   and stays within one row block for every value of the other loop variables;
//! - it can run where the GEMM runs: no step in between writes what it reads or reads what it
//!   writes.
//!
//! Assumes a `Program` from `fuse` (possibly after `fuse_horizontal`). Guarantees the same
//! results: the epilogue reads only output rows that the GEMM has finished.

use minductor_ir::{Dim, SizeExpr};
use minductor_kernel_ir::*;

pub fn fuse_epilogues(program: &Program) -> Program {
    let mut steps = program.steps.clone();
    let mut origin: Vec<Vec<usize>> = (0..steps.len()).map(|i| vec![i]).collect();
    let mut i = 0;
    while i < steps.len() {
        let candidate = match &steps[i] {
            Step::Matmul(m) if m.epilogue.is_none() => {
                let out = program.buffer(m.out);
                (i + 1..steps.len())
                    .find(|&j| matches!(&steps[j], Step::Kernel(k) if k.loads().contains(&m.out)))
                    .filter(|&j| {
                        let Step::Kernel(k) = &steps[j] else {
                            return false;
                        };
                        row_local(k, m.out, &out.shape) && movable(&steps, i, j)
                    })
            }
            _ => None,
        };
        if let Some(j) = candidate {
            let Step::Kernel(kernel) = steps.remove(j) else {
                unreachable!("checked above")
            };
            let moved = origin.remove(j);
            origin[i].extend(moved);
            let Step::Matmul(m) = &mut steps[i] else {
                unreachable!("checked above")
            };
            tracing::debug!(
                target: "minductor::fusion",
                "epilogue: {} runs on the row blocks of matmul {}",
                kernel.name,
                m.out
            );
            m.epilogue = Some(kernel);
        }
        i += 1;
    }
    program.with_steps(steps, &origin)
}

/// Whether every load of `out` in `k` stays inside the rows of `out` that the first outer loop
/// variable names (see the module doc).
fn row_local(k: &Kernel, out: BufferId, out_shape: &[Dim]) -> bool {
    let Some(first) = k.outer.first() else {
        return false;
    };
    // Rows may be symbolic (a dynamic batch). A symbolic row stride (a symbolic dim inside a
    // row) is checked structurally, for every size at once.
    let Some(row_stride) = out_shape[1..]
        .iter()
        .map(|d| d.as_static())
        .product::<Option<usize>>()
    else {
        return out_shape.first() == Some(first) && row_local_symbolic(k, out, out_shape);
    };
    if out_shape.first() != Some(first) || row_stride == 0 {
        return false;
    }
    // The largest extent each loop variable can take in this kernel.
    let extent = |v: Var| -> Option<i64> {
        let d = match v {
            Var::Outer(n) => k.outer.get(n as usize)?.as_static()?,
            Var::Inner(n) => k
                .stages
                .iter()
                .filter_map(|s| s.extent.get(n as usize)?.as_static())
                .max()?,
        };
        Some(d as i64)
    };
    k.exprs.iter().all(|e| match e {
        Expr::Load {
            buffer,
            index,
            indirect,
        } if *buffer == out => {
            if indirect.is_some()
                || index.coefficient(Var::Outer(0)).as_const() != Some(row_stride as i64)
            {
                return false;
            }
            let Some(offset) = index.offset.as_const() else {
                return false;
            };
            let (mut low, mut high) = (offset, offset);
            for (v, c) in &index.terms {
                if *v == Var::Outer(0) {
                    continue;
                }
                let (Some(n), Some(c)) = (extent(*v), c.as_const()) else {
                    return false;
                };
                let span = c * (n - 1).max(0);
                if span < 0 {
                    low += span;
                } else {
                    high += span;
                }
            }
            low >= 0 && high < row_stride as i64
        }
        _ => true,
    })
}

/// Row-locality for an output whose rows have symbolic sizes: every load of `out` is
/// `row_stride·o0 + Σ stride_d·v_d` over distinct dims `d >= 1` of the output, each `v_d` a loop
/// whose extent is that dim (in every stage that has the loop), with the output's contiguous
/// strides and no offset. Its largest value within a row is then `Σ stride_d·(size_d − 1) <
/// row_stride` for every size, and its smallest is 0.
fn row_local_symbolic(k: &Kernel, out: BufferId, out_shape: &[Dim]) -> bool {
    let mut strides = vec![SizeExpr::Const(1); out_shape.len()];
    for d in (0..out_shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].times(&SizeExpr::of_dim(out_shape[d + 1]));
    }
    // The extent of loop `v`, if every stage that has it agrees.
    let extent = |v: Var| -> Option<Dim> {
        match v {
            Var::Outer(n) => k.outer.get(n as usize).copied(),
            Var::Inner(n) => {
                let mut found = k.stages.iter().filter_map(|s| s.extent.get(n as usize));
                let first = *found.next()?;
                found.all(|&e| e == first).then_some(first)
            }
        }
    };
    k.exprs.iter().all(|e| match e {
        Expr::Load {
            buffer,
            index,
            indirect,
        } if *buffer == out => {
            if indirect.is_some()
                || !index.offset.is_zero()
                || index.coefficient(Var::Outer(0)) != strides[0]
            {
                return false;
            }
            let mut used = vec![false; out_shape.len()];
            index
                .terms
                .iter()
                .filter(|(v, _)| *v != Var::Outer(0))
                .all(|(v, c)| {
                    let Some(n) = extent(*v) else {
                        return false;
                    };
                    match (1..out_shape.len())
                        .find(|&d| !used[d] && strides[d] == *c && out_shape[d] == n)
                    {
                        Some(d) => {
                            used[d] = true;
                            true
                        }
                        None => false,
                    }
                })
        }
        _ => true,
    })
}

/// Whether kernel `j` can run as part of step `i`: it reads nothing written by a step in
/// between, and writes nothing those steps touch; and the GEMM does not read what it writes.
fn movable(steps: &[Step], i: usize, j: usize) -> bool {
    let (reads, writes) = (steps[j].reads(), steps[j].writes());
    let gemm_reads = steps[i].reads();
    !writes.iter().any(|b| gemm_reads.contains(b))
        && steps[i + 1..j].iter().all(|s| {
            let (r, w) = (s.reads(), s.writes());
            !w.iter().any(|b| reads.contains(b) || writes.contains(b))
                && !r.iter().any(|b| writes.contains(b))
        })
}
