//! `fuse_horizontal`: merges sibling kernels that iterate over the same domain and read a common
//! buffer into one kernel, so that buffer is streamed from memory once (Inductor's horizontal
//! fusion).
//!
//! Two kernels are siblings when they have the same outer loops, neither reads what the other
//! writes, and the later one can run where the earlier one runs: nothing it reads is written by
//! a step in between, and nothing it writes is read in between. Their merge runs the stages of
//! both per outer iteration; when the later one is a single store stage over the same inner loops
//! as the earlier one's last (store) stage, the stores share that stage, so a common load is
//! issued once per element.
//!
//! Assumes a `Program` from `fuse`. Guarantees the same results: each merged kernel computes the
//! same values at the same indices, and the thread split of the first outer loop still gives
//! every thread disjoint elements to write.

use crate::kernel::*;

pub fn fuse_horizontal(program: &Program) -> Program {
    let mut steps: Vec<Step> = program.steps.clone();
    // For each current step, the original steps it contains (to move index checks along).
    let mut origin: Vec<Vec<usize>> = (0..steps.len()).map(|i| vec![i]).collect();
    let mut j = 1;
    while j < steps.len() {
        let partner = (0..j)
            .rev()
            .find(|&i| siblings(&steps, i, j) && movable(&steps, i, j));
        match partner {
            Some(i) => {
                let Step::Kernel(later) = steps.remove(j) else {
                    unreachable!("siblings are kernels")
                };
                let moved = origin.remove(j);
                origin[i].extend(moved);
                let Step::Kernel(earlier) = &mut steps[i] else {
                    unreachable!("siblings are kernels")
                };
                *earlier = merge(earlier, &later);
                tracing::debug!(
                    target: "minductor::fusion",
                    "horizontal: merged {} into {}",
                    later.name,
                    earlier.name
                );
            }
            None => j += 1,
        }
    }
    program.with_steps(steps, &origin)
}

fn siblings(steps: &[Step], i: usize, j: usize) -> bool {
    let (Step::Kernel(a), Step::Kernel(b)) = (&steps[i], &steps[j]) else {
        return false;
    };
    let (la, lb) = (a.loads(), b.loads());
    a.outer == b.outer
        && !a.outer.is_empty()
        && la.iter().any(|x| lb.contains(x))
        && !a.stores().iter().any(|x| lb.contains(x))
        && !b.stores().iter().any(|x| la.contains(x))
}

/// Whether step `j` can run at position `i` (before the steps in between).
fn movable(steps: &[Step], i: usize, j: usize) -> bool {
    let (reads, writes) = (steps[j].reads(), steps[j].writes());
    steps[i + 1..j].iter().all(|s| {
        !s.writes().iter().any(|b| reads.contains(b))
            && !s.reads().iter().any(|b| writes.contains(b))
    })
}

/// One kernel running `a`'s stages and then `b`'s per outer iteration (sharing one store stage
/// when both are a single store stage over the same loops).
fn merge(a: &Kernel, b: &Kernel) -> Kernel {
    let mut merged = a.clone();
    let base_stage = a.stages.len() as u32;
    let mut map: Vec<ExprId> = Vec::with_capacity(b.exprs.len());
    for (e, &ty) in b.exprs.iter().zip(&b.types) {
        let m = |x: &ExprId| map[x.0 as usize];
        let expr = match e {
            Expr::Load {
                buffer,
                index,
                indirect,
            } => Expr::Load {
                buffer: *buffer,
                index: index.clone(),
                indirect: indirect.as_ref().map(|ind| Indirect {
                    value: m(&ind.value),
                    ..ind.clone()
                }),
            },
            Expr::Constant { .. } => e.clone(),
            Expr::StageResult(s) => Expr::StageResult(s + base_stage),
            Expr::Unary(op, x) => Expr::Unary(*op, m(x)),
            Expr::Binary(op, x, y) => Expr::Binary(*op, m(x), m(y)),
            Expr::Compare(op, x, y) => Expr::Compare(*op, m(x), m(y)),
            Expr::Where(c, x, y) => Expr::Where(m(c), m(x), m(y)),
            Expr::Cast(d, x) => Expr::Cast(*d, m(x)),
        };
        let id = match merged.exprs.iter().position(|x| *x == expr) {
            Some(existing) => ExprId(existing as u32),
            None => {
                merged.exprs.push(expr);
                merged.types.push(ty);
                ExprId(merged.exprs.len() as u32 - 1)
            }
        };
        map.push(id);
    }
    let remap_stage = |s: &Stage| Stage {
        extent: s.extent.clone(),
        action: match &s.action {
            StageAction::Reduce { op, value } => StageAction::Reduce {
                op: *op,
                value: map[value.0 as usize],
            },
            StageAction::Store(stores) => StageAction::Store(
                stores
                    .iter()
                    .map(|st| Store {
                        buffer: st.buffer,
                        index: st.index.clone(),
                        value: map[st.value.0 as usize],
                    })
                    .collect(),
            ),
        },
    };
    let single_store = |k: &Kernel| {
        matches!(
            k.stages.as_slice(),
            [Stage {
                action: StageAction::Store(_),
                ..
            }]
        )
    };
    let last = merged.stages.last_mut().expect("a kernel has a stage");
    if single_store(b)
        && matches!(last.action, StageAction::Store(_))
        && last.extent == b.stages[0].extent
    {
        let StageAction::Store(extra) = remap_stage(&b.stages[0]).action else {
            unreachable!("a store stage")
        };
        let StageAction::Store(stores) = &mut last.action else {
            unreachable!("a store stage")
        };
        stores.extend(extra);
    } else {
        merged.stages.extend(b.stages.iter().map(remap_stage));
    }
    let suffix = b
        .name
        .split_once('_')
        .map_or(b.name.as_str(), |(_, rest)| rest);
    merged.name = format!("{}_{}", a.name, suffix);
    merged.name.truncate(80);
    merged.nodes.extend(b.nodes.iter().copied());
    merged.nodes.sort();
    merged.nodes.dedup();
    merged
}
