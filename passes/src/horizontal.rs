//! `fuse_horizontal`: merges sibling kernels that iterate over the same domain and read a common
//! buffer into one kernel, so that buffer is streamed from memory once (Inductor's horizontal
//! fusion), and a pointwise consumer into the pointwise producer of a buffer it reads element by
//! element (vertical fusion of realized buffers: an optimizer's moments and its parameter update
//! become one pass).
//!
//! Two kernels are siblings when they have the same outer loops, neither reads what the other
//! writes, and the later one can run where the earlier one runs: nothing it reads is written by
//! a step in between, and nothing it writes is read in between. Their merge runs the stages of
//! both per outer iteration; when the later one is a single store stage over the same inner loops
//! as the earlier one's last (store) stage, the stores share that stage, so a common load is
//! issued once per element.
//!
//! A producer and a consumer merge when both are one store stage over the same loops, the
//! consumer reads each buffer the producer writes only at the index the producer stores it
//! (so the value is the one just computed, in the same iteration), the producer reads nothing the
//! consumer writes, and the consumer can move up to the producer. The consumer then uses the
//! stored expression instead of loading it; the store stays while the buffer is an output or
//! read elsewhere, and is dropped once no step reads the intermediate.
//!
//! Assumes a `Program` from `fuse`. Guarantees the same results: each merged kernel computes the
//! same values at the same indices, and the thread split of the first outer loop still gives
//! every thread disjoint elements to write.

use minductor_ir::DType;
use minductor_kernel_ir::*;

pub fn fuse_horizontal(program: &Program) -> Program {
    let mut steps: Vec<Step> = program.steps.clone();
    // For each current step, the original steps it contains (to move index checks along).
    let mut origin: Vec<Vec<usize>> = (0..steps.len()).map(|i| vec![i]).collect();
    let mut j = 1;
    while j < steps.len() {
        let partner = (0..j).rev().find_map(|i| {
            if !movable(&steps, i, j) || checks_what_earlier_writes(program, &steps, &origin, i, j)
            {
                return None;
            }
            if siblings(&steps, i, j) {
                return Some((i, Vec::new()));
            }
            forwarded(program, &steps, i, j).map(|values| (i, values))
        });
        match partner {
            Some((i, forward)) => {
                let Step::Kernel(later) = steps.remove(j) else {
                    unreachable!("siblings are kernels")
                };
                let moved = origin.remove(j);
                origin[i].extend(moved);
                let Step::Kernel(earlier) = &mut steps[i] else {
                    unreachable!("siblings are kernels")
                };
                *earlier = merge(earlier, &later, &forward);
                tracing::debug!(
                    target: "minductor::fusion",
                    "{}: merged {} into {}",
                    if forward.is_empty() { "horizontal" } else { "vertical" },
                    later.name,
                    earlier.name
                );
            }
            None => j += 1,
        }
    }
    drop_dead_stores(program, &mut steps);
    program.with_steps(steps, &origin)
}

/// Whether step `j` checks indices that step `i` writes: merged, the check (which runs before
/// its step) would read them before they are computed.
fn checks_what_earlier_writes(
    program: &Program,
    steps: &[Step],
    origin: &[Vec<usize>],
    i: usize,
    j: usize,
) -> bool {
    let written = steps[i].writes();
    program
        .index_checks
        .iter()
        .any(|c| origin[j].contains(&c.step) && written.contains(&c.buffer))
}

/// Removes stores to intermediates no step reads any more (a vertical merge forwarded their only
/// reader the value), keeping at least one store per kernel.
fn drop_dead_stores(program: &Program, steps: &mut [Step]) {
    let read: Vec<BufferId> = steps.iter().flat_map(Step::reads).collect();
    let dead = |b: BufferId| {
        program.buffer(b).kind == BufferKind::Intermediate
            && !read.contains(&b)
            && !program.index_checks.iter().any(|c| c.buffer == b)
    };
    for step in steps.iter_mut() {
        let Step::Kernel(kernel) = step else { continue };
        let live_stores = kernel.stores().into_iter().filter(|&b| !dead(b)).count();
        if live_stores == 0 {
            continue;
        }
        for stage in &mut kernel.stages {
            if let StageAction::Store(stores) = &mut stage.action {
                stores.retain(|st| !dead(st.buffer));
            }
        }
        kernel
            .stages
            .retain(|s| !matches!(&s.action, StageAction::Store(stores) if stores.is_empty()));
    }
}

fn siblings(steps: &[Step], i: usize, j: usize) -> bool {
    let (Step::Kernel(a), Step::Kernel(b)) = (&steps[i], &steps[j]) else {
        return false;
    };
    let (la, lb) = (a.loads(), b.loads());
    let pointwise_alike =
        single_store(a) && single_store(b) && a.stages[0].extent == b.stages[0].extent;
    a.outer == b.outer
        && (!a.outer.is_empty() || pointwise_alike)
        && la.iter().any(|x| lb.contains(x))
        && !a.stores().iter().any(|x| lb.contains(x))
        && !b.stores().iter().any(|x| la.contains(x))
}

/// One store stage, nothing else.
fn single_store(k: &Kernel) -> bool {
    matches!(
        k.stages.as_slice(),
        [Stage {
            action: StageAction::Store(_),
            ..
        }]
    )
}

/// When kernel `j` can take the values kernel `i` stores instead of loading them: the buffers
/// `i` writes that `j` reads, each with the expression `i` stores to it.
fn forwarded(
    program: &Program,
    steps: &[Step],
    i: usize,
    j: usize,
) -> Option<Vec<(BufferId, ExprId)>> {
    let (Step::Kernel(a), Step::Kernel(b)) = (&steps[i], &steps[j]) else {
        return None;
    };
    if a.outer != b.outer
        || !single_store(a)
        || !single_store(b)
        || a.stages[0].extent != b.stages[0].extent
        || b.stores().iter().any(|x| a.loads().contains(x))
    {
        return None;
    }
    let StageAction::Store(stores) = &a.stages[0].action else {
        return None;
    };
    let reads = b.loads();
    let mut values = Vec::new();
    for store in stores.iter().filter(|st| reads.contains(&st.buffer)) {
        let stored_once = stores.iter().filter(|st| st.buffer == store.buffer).count() == 1;
        let same_element = b.exprs.iter().all(|e| match e {
            Expr::Load {
                buffer,
                index,
                indirect,
            } if *buffer == store.buffer => *index == store.index && indirect.is_none(),
            _ => true,
        });
        // A narrow float buffer rounds what it stores: a load would not see the exact value.
        let exact = !matches!(program.buffer(store.buffer).dtype, DType::F16 | DType::BF16);
        if !stored_once || !same_element || !exact {
            return None;
        }
        values.push((store.buffer, store.value));
    }
    (!values.is_empty()).then_some(values)
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
/// when both are a single store stage over the same loops); `b`'s loads of the buffers in
/// `forward` become the expressions `a` stores to them.
fn merge(a: &Kernel, b: &Kernel, forward: &[(BufferId, ExprId)]) -> Kernel {
    let mut merged = a.clone();
    let base_stage = a.stages.len() as u32;
    let mut map: Vec<ExprId> = Vec::with_capacity(b.exprs.len());
    for (e, &ty) in b.exprs.iter().zip(&b.types) {
        let m = |x: &ExprId| map[x.0 as usize];
        if let Expr::Load { buffer, .. } = e {
            if let Some(&(_, value)) = forward.iter().find(|(f, _)| f == buffer) {
                map.push(value);
                continue;
            }
        }
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
            Expr::Constant { .. } | Expr::Index(_) => e.clone(),
            Expr::StageResult(s) => Expr::StageResult(s + base_stage),
            Expr::Unary(op, x) => Expr::Unary(*op, m(x)),
            Expr::Binary(op, x, y) => Expr::Binary(*op, m(x), m(y)),
            Expr::Compare(op, x, y) => Expr::Compare(*op, m(x), m(y)),
            Expr::Where(c, x, y) => Expr::Where(m(c), m(x), m(y)),
            Expr::Cast(d, x) => Expr::Cast(*d, m(x)),
        };
        // The same expression of another type (an f32 and an i64 `index`) is another value.
        let id = match (0..merged.exprs.len())
            .find(|&x| merged.exprs[x] == expr && merged.types[x] == ty)
        {
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
            StageAction::Reduce { op, value, stores } => StageAction::Reduce {
                op: *op,
                value: map[value.0 as usize],
                stores: stores
                    .iter()
                    .map(|st| Store {
                        buffer: st.buffer,
                        index: st.index.clone(),
                        value: map[st.value.0 as usize],
                    })
                    .collect(),
            },
            StageAction::Scan(st) => StageAction::Scan(Store {
                buffer: st.buffer,
                index: st.index.clone(),
                value: map[st.value.0 as usize],
            }),
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
