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
//!
//! **The outer loops' nesting.** A kernel in the inner order also gets the nesting of its outer
//! loops (they are independent, so any nesting computes the same values) whose accesses make
//! the fewest interleaved memory streams ([`streams`]). Rotary embeddings are the case: they
//! read the query projection `[b, t, h·d]` as `[b, h, t, d]` and store `[b, h, t, d]`. Nested
//! `b, h, t`, each row of the load is 2 KiB past the previous one (a new page every second
//! row, which the hardware prefetchers do not cross), and the loads wait on the cache; nested
//! `b, t, h`, the load runs in address order and the store becomes `h` streams that each run
//! in order. In `llama_block_4x256x512` at 1 thread that took the two rotary kernels from
//! 0.66–0.73 and 0.30–0.35 ms to 0.22 and 0.10 ms, and the block from 62.0–63.3 to 61.3–61.5 ms
//! (`minductor bench --workload llama_block_4x256x512 --threads 1,2 --rounds 3`, three
//! alternated runs; at 2 threads 31.3–31.5 against 31.0–31.4 ms). A copy that transposes the
//! other way (a `[b, h, t, d]` buffer stored as `[b, t, h, d]`; attention's output no longer
//! takes one: `fuse` folds that copy into the attention) keeps its order:
//! there the store is already the one stream and the load `h` streams (nested `b, h, t` instead
//! measured 0.14–0.22 ms against 0.08–0.13). Inductor orders a kernel's loops by a vote of its
//! accesses' strides (`pick_loop_order`), which ties on both kernels. A kernel split across
//! threads over its first loop only (`Kernel::split_loops`) keeps that loop first.

use minductor_ir::{Dim, SizeExpr};
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
            if k.order == LoopOrder::Inner {
                if let Some(perm) = transpose_order(k, program).or_else(|| stream_order(k, program))
                {
                    permute_outer(k, &perm);
                }
            }
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

/// For a kernel that copies a transposed view (`Kernel::transposed_copy`), the nesting with
/// the loop that reads the view contiguously last (the others in their order), which the code
/// generator runs as calls of the transpose routine; `None` when it is last already, or when
/// it is the first loop of a kernel split over its first loop only (see `stream_order`).
fn transpose_order(k: &Kernel, program: &Program) -> Option<Vec<usize>> {
    let o = k.transposed_copy(program)?;
    let n = k.outer.len();
    if o + 1 == n || (o == 0 && k.split_loops() < n) {
        return None;
    }
    Some((0..n).filter(|&i| i != o).chain([o]).collect())
}

/// Bytes within which the next access of a stream counts as sequential: the next eight cache
/// lines, which the hardware's stream prefetchers follow.
const NEAR: i64 = 512;

/// The size a symbolic dim counts as when choosing a nesting (a sequence of a few dozen
/// tokens or more; Inductor orders loops by the example inputs' sizes, which a compile for
/// every size does not have).
const SIZE_HINT: u64 = 64;

/// `d`'s size, or [`SIZE_HINT`] for a symbolic dim (also `split_transposes`' estimate).
pub(crate) fn hinted_size(d: &Dim) -> u64 {
    d.as_static().map_or(SIZE_HINT, |e| e as u64)
}

/// How many interleaved streams an access with outer-loop steps `steps` (bytes, by old loop
/// number) makes when the outer loops run in `order` (outermost first): walking out from the
/// innermost loop, each loop stepping further than [`NEAR`] splits the access into as many
/// streams as its extent, until a loop steps within `NEAR` (the streams then advance in order);
/// loops that do not move the access repeat it and add none.
fn streams(steps: &[i64], extents: &[u64], order: &[usize]) -> u64 {
    let mut streams = 1u64;
    for &l in order.iter().rev() {
        match steps[l].unsigned_abs() {
            0 => {}
            s if s <= NEAR as u64 => return streams,
            _ => streams = streams.saturating_mul(extents[l]),
        }
    }
    streams
}

/// The order of `k`'s outer loops (old loop numbers, outermost first) whose accesses make the
/// fewest interleaved memory streams, if it makes fewer than the present order (see
/// [`streams`]). Each distinct pattern of outer steps (in bytes) counts once, whatever buffer it
/// reads or writes: a `cat`'s two halves of a row are one access, and so are two tables read
/// alike (rotary embeddings' `cos` and `sin`). A symbolic size counts as [`SIZE_HINT`].
fn stream_order(k: &Kernel, program: &Program) -> Option<Vec<usize>> {
    let n = k.outer.len();
    if !(2..=6).contains(&n) {
        return None;
    }
    let extents: Vec<u64> = k.outer.iter().map(hinted_size).collect();
    let elem = |b: BufferId| program.buffer(b).dtype.size_bytes() as i64;
    let mut accesses: Vec<Vec<i64>> = Vec::new();
    let mut add = |buffer: BufferId, index: &Affine| {
        let Some(steps) = (0..n)
            .map(|i| {
                let step = index.coefficient(Var::Outer(i as u32));
                step.eval_i64(|_| Some(SIZE_HINT as i128))
            })
            .collect::<Option<Vec<i64>>>()
        else {
            return;
        };
        let steps: Vec<i64> = steps
            .iter()
            .map(|s| s.saturating_mul(elem(buffer)))
            .collect();
        if steps.iter().any(|&s| s != 0) && !accesses.contains(&steps) {
            accesses.push(steps);
        }
    };
    for e in &k.exprs {
        if let Expr::Load {
            buffer,
            index,
            indirect: None,
        } = e
        {
            add(*buffer, index);
        }
    }
    for stage in &k.stages {
        for st in stage.action.stores() {
            add(st.buffer, &st.index);
        }
    }
    let cost = |order: &[usize]| -> u64 {
        (accesses.iter()).fold(0u64, |c, steps| {
            c.saturating_add(streams(steps, &extents, order))
        })
    };
    // A kernel that splits across threads over its first loop only (stores into one buffer
    // that `Kernel::stores_apart` cannot prove apart) keeps that loop first: the verifier
    // proves its stores apart per row of that loop, which another first loop need not keep
    // (the pieces of a `cat` along the first dim), and its pieces are that loop's iterations.
    let first_fixed = k.split_loops() < n;
    let present: Vec<usize> = (0..n).collect();
    let mut best = (cost(&present), present.clone());
    let mut order = present.clone();
    // Every permutation (n <= 6: at most 720), in lexicographic order; the first of the least
    // cost wins, and the present order on a tie.
    while next_permutation(&mut order) {
        if first_fixed && order[0] != 0 {
            continue;
        }
        let c = cost(&order);
        if c < best.0 {
            best = (c, order.clone());
        }
    }
    (best.1 != present).then_some(best.1)
}

/// Advances `p` to the next permutation in lexicographic order; `false` after the last.
fn next_permutation(p: &mut [usize]) -> bool {
    let Some(i) = (1..p.len()).rev().find(|&i| p[i - 1] < p[i]) else {
        return false;
    };
    let j = (i..p.len())
        .rev()
        .find(|&j| p[j] > p[i - 1])
        .expect("p[i] > p[i - 1]");
    p.swap(i - 1, j);
    p[i..].reverse();
    true
}

/// Reorders `k`'s outer loops: new loop `j` is old loop `perm[j]`.
fn permute_outer(k: &mut Kernel, perm: &[usize]) {
    let mut new_of = vec![0u32; perm.len()];
    for (j, &old) in perm.iter().enumerate() {
        new_of[old] = j as u32;
    }
    let rename = |index: &mut Affine| {
        for t in &mut index.terms {
            if let Var::Outer(i) = t.0 {
                t.0 = Var::Outer(new_of[i as usize]);
            }
        }
        index.terms.sort_by_key(|t| t.0);
    };
    k.outer = perm.iter().map(|&i| k.outer[i]).collect();
    for e in &mut k.exprs {
        if let Expr::Load { index, .. } | Expr::Index(index) = e {
            rename(index);
        }
    }
    for stage in &mut k.stages {
        (stage.action.stores_mut().iter_mut()).for_each(|st| rename(&mut st.index));
    }
}
