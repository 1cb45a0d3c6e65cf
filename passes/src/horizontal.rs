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
use std::collections::{BTreeSet, HashMap, HashSet};

pub fn fuse_horizontal(program: &Program) -> Program {
    // Steps keep the position they have in `program` (a merged-away step leaves `None`), so the
    // index below never shifts; the order of the live ones is the program's order.
    let mut steps: Vec<Option<Step>> = program.steps.iter().cloned().map(Some).collect();
    // For each step, the original steps it contains (to move index checks along).
    let mut origin: Vec<Vec<usize>> = (0..steps.len()).map(|i| vec![i]).collect();
    let mut index = StepIndex::new(program, &steps);
    for j in 1..steps.len() {
        let Some(Step::Kernel(_)) = &steps[j] else {
            // Only kernels merge.
            continue;
        };
        let partner = index.candidates(j).into_iter().find_map(|i| {
            let (Some(Step::Kernel(a)), Some(Step::Kernel(b))) = (&steps[i], &steps[j]) else {
                return None;
            };
            if index.checks_what_earlier_writes(i, j) {
                return None;
            }
            if index.siblings(a, b, i, j) {
                return Some((i, Vec::new()));
            }
            index
                .forwarded(program, a, b, i, j)
                .map(|values| (i, values))
        });
        let Some((i, forward)) = partner else {
            continue;
        };
        let Some(Step::Kernel(later)) = steps[j].take() else {
            unreachable!("siblings are kernels")
        };
        let moved = std::mem::take(&mut origin[j]);
        origin[i].extend(moved);
        let Some(Step::Kernel(earlier)) = &mut steps[i] else {
            unreachable!("siblings are kernels")
        };
        *earlier = merge(earlier, &later, &forward);
        let earlier_name = earlier.name.clone();
        index.merged(i, j, steps[i].as_ref().expect("the merged step"));
        tracing::debug!(
            target: "minductor::fusion",
            "{}: merged {} into {}",
            if forward.is_empty() { "horizontal" } else { "vertical" },
            later.name,
            earlier_name
        );
    }
    let (steps, origin): (Vec<Step>, Vec<Vec<usize>>) = steps
        .into_iter()
        .zip(origin)
        .filter_map(|(step, origin)| Some((step?, origin)))
        .unzip();
    let mut steps = steps;
    drop_dead_stores(program, &mut steps);
    program.with_steps(steps, &origin)
}

/// The buffers each live step reads and writes, computed once per step (again only when a merge
/// changes it), and for each buffer the live steps reading and writing it, by position. A step's
/// partner is found among the steps that share a buffer with it, after the last step it cannot
/// move above, rather than by comparing it with every earlier step.
struct StepIndex {
    /// `Step::reads` of each live step, sorted and unique (a kernel's loads).
    reads: Vec<Vec<BufferId>>,
    /// `Step::writes` of each live step, in order (a kernel's stores).
    writes: Vec<Vec<BufferId>>,
    /// The buffers whose index checks run before each step (those of the steps it contains).
    checked: Vec<Vec<BufferId>>,
    readers: HashMap<BufferId, BTreeSet<usize>>,
    writers: HashMap<BufferId, BTreeSet<usize>>,
}

impl StepIndex {
    fn new(program: &Program, steps: &[Option<Step>]) -> StepIndex {
        let mut index = StepIndex {
            reads: Vec::with_capacity(steps.len()),
            writes: Vec::with_capacity(steps.len()),
            checked: vec![Vec::new(); steps.len()],
            readers: HashMap::new(),
            writers: HashMap::new(),
        };
        for check in &program.index_checks {
            index.checked[check.step].push(check.buffer);
        }
        for (i, step) in steps.iter().enumerate() {
            let step = step.as_ref().expect("every step is live at first");
            index.reads.push(sorted(step.reads()));
            index.writes.push(step.writes());
            index.insert(i);
        }
        index
    }

    fn insert(&mut self, i: usize) {
        for &b in &self.reads[i] {
            self.readers.entry(b).or_default().insert(i);
        }
        for &b in &self.writes[i] {
            self.writers.entry(b).or_default().insert(i);
        }
    }

    fn remove(&mut self, i: usize) {
        for b in &self.reads[i] {
            if let Some(set) = self.readers.get_mut(b) {
                set.remove(&i);
            }
        }
        for b in &self.writes[i] {
            if let Some(set) = self.writers.get_mut(b) {
                set.remove(&i);
            }
        }
    }

    /// Step `j` was merged into step `i`, which is now `merged`.
    fn merged(&mut self, i: usize, j: usize, merged: &Step) {
        self.remove(i);
        self.remove(j);
        self.reads[j].clear();
        self.writes[j].clear();
        let checked = std::mem::take(&mut self.checked[j]);
        self.checked[i].extend(checked);
        self.reads[i] = sorted(merged.reads());
        self.writes[i] = merged.writes();
        self.insert(i);
    }

    /// The live steps before `j` that `j` could merge with, latest first: those it can move up
    /// to (no step in between writes what it reads or reads what it writes) that read a buffer
    /// it reads (siblings) or write one (a producer, which can only be the last step it cannot
    /// move above).
    fn candidates(&self, j: usize) -> Vec<usize> {
        let last_before = |set: Option<&BTreeSet<usize>>| -> Option<usize> {
            set.and_then(|s| s.range(..j).next_back().copied())
        };
        // The last step `j` cannot move above: every step in between must let it pass.
        let barrier = self.reads[j]
            .iter()
            .map(|b| last_before(self.writers.get(b)))
            .chain(
                self.writes[j]
                    .iter()
                    .map(|b| last_before(self.readers.get(b))),
            )
            .max()
            .flatten();
        let from = barrier.unwrap_or(0);
        let mut found: Vec<usize> = barrier.into_iter().collect();
        for b in &self.reads[j] {
            if let Some(set) = self.readers.get(b) {
                found.extend(set.range(from..j));
            }
        }
        found.sort_unstable_by(|x, y| y.cmp(x));
        found.dedup();
        found
    }

    /// Whether step `j` checks indices that step `i` writes: merged, the check (which runs before
    /// its step) would read them before they are computed.
    fn checks_what_earlier_writes(&self, i: usize, j: usize) -> bool {
        self.checked[j].iter().any(|b| self.writes[i].contains(b))
    }

    /// Kernels `a` (step `i`) and `b` (step `j`) run the same outer loops, read a common
    /// buffer, and neither reads what the other writes.
    fn siblings(&self, a: &Kernel, b: &Kernel, i: usize, j: usize) -> bool {
        let (la, lb) = (&self.reads[i], &self.reads[j]);
        let pointwise_alike =
            single_store(a) && single_store(b) && a.stages[0].extent == b.stages[0].extent;
        a.outer == b.outer
            && (!a.outer.is_empty() || pointwise_alike)
            && la.iter().any(|x| lb.binary_search(x).is_ok())
            && !self.writes[i].iter().any(|x| lb.binary_search(x).is_ok())
            && !self.writes[j].iter().any(|x| la.binary_search(x).is_ok())
    }

    /// When kernel `b` (step `j`) can take the values kernel `a` (step `i`) stores instead of
    /// loading them: the buffers `a` writes that `b` reads, each with the expression `a` stores
    /// to it.
    fn forwarded(
        &self,
        program: &Program,
        a: &Kernel,
        b: &Kernel,
        i: usize,
        j: usize,
    ) -> Option<Vec<(BufferId, ExprId)>> {
        let (la, lb) = (&self.reads[i], &self.reads[j]);
        if a.outer != b.outer
            || !single_store(a)
            || !single_store(b)
            || a.stages[0].extent != b.stages[0].extent
            || self.writes[j].iter().any(|x| la.binary_search(x).is_ok())
        {
            return None;
        }
        let StageAction::Store(stores) = &a.stages[0].action else {
            return None;
        };
        let mut values = Vec::new();
        for store in stores
            .iter()
            .filter(|st| lb.binary_search(&st.buffer).is_ok())
        {
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
}

fn sorted(mut buffers: Vec<BufferId>) -> Vec<BufferId> {
    buffers.sort_unstable();
    buffers.dedup();
    buffers
}

/// Removes stores to intermediates no step reads any more (a vertical merge forwarded their only
/// reader the value), keeping at least one store per kernel.
fn drop_dead_stores(program: &Program, steps: &mut [Step]) {
    let read: HashSet<BufferId> = steps.iter().flat_map(Step::reads).collect();
    let checked: HashSet<BufferId> = program.index_checks.iter().map(|c| c.buffer).collect();
    let dead = |b: BufferId| {
        program.buffer(b).kind == BufferKind::Intermediate
            && !read.contains(&b)
            && !checked.contains(&b)
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
