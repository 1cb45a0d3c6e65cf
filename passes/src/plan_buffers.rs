//! `plan_buffers`: gives every intermediate buffer a slot in one arena, from liveness over the
//! step schedule (Inductor's memory planning: buffer reuse and in-place updates).
//!
//! - A buffer is live from the step that first writes it to the last step that reads or writes
//!   it. Steps run one after the other (a step's threads join before the next starts), so two
//!   buffers whose live ranges do not overlap can share memory.
//! - Walking the steps in order, the slots of buffers whose last use has passed return to a free
//!   list; each newly written buffer then takes, in order of preference:
//!   1. *in place*: the slot of an input it is computed from, when this step is that input's last
//!      reader and the kernel reads each element only in the iteration that writes the same
//!      element (same dtype width, same index, no later stage nor later store of its stage
//!      reading it), so overwriting is safe;
//!   2. *reuse*: the smallest free slot at least as large (best fit);
//!   3. a new slot.
//! - Slots are laid out one after another, each 64-byte aligned; the arena is their total.
//!
//! Symbolic sizes are planned with a nominal size per symbol ([`SIZE_HINT`]): which buffers share
//! a slot is decided once, and each slot's size and offset are recomputed for the sizes of each
//! call ([`BufferPlan::layout`]), so sharing stays safe at any size. Guarantees that no two buffers live at the same step overlap in
//! the arena, except an in-place pair inside the one step where the kernel's access pattern makes
//! it safe. Inputs and outputs are not planned: inputs belong to the caller, outputs are handed to
//! the caller and so are allocated for each call.

use minductor_kernel_ir::plan::{buffer_bytes, live_ranges, BufferPlan, Slot, SLOT_ALIGN};
use minductor_kernel_ir::*;

pub fn plan_buffers(program: &Program) -> BufferPlan {
    let n = program.buffers.len();
    let bytes: Vec<usize> = program.buffers.iter().map(buffer_bytes).collect();
    let live = live_ranges(program);
    let planned = |b: usize| program.buffers[b].kind == BufferKind::Intermediate;

    let mut plan = BufferPlan {
        slot_of: vec![None; n],
        live: live.clone(),
        ..BufferPlan::default()
    };
    for (step_index, step) in program.steps.iter().enumerate() {
        // Slots whose every member's last use is behind us.
        let mut free: Vec<usize> = (0..plan.slots.len())
            .filter(|&s| !occupied(&plan, &live, s, step_index))
            .collect();
        for written in step.writes() {
            let b = written.0 as usize;
            if !planned(b) || plan.slot_of[b].is_some() {
                continue;
            }
            let slot = match in_place_candidate(program, step, step_index, written, &plan, &live) {
                Some(input) => {
                    plan.in_place.push((written, input, step_index));
                    plan.slot_of[input.0 as usize].expect("an in-place input is planned")
                }
                None => {
                    let fit = free
                        .iter()
                        .copied()
                        .filter(|&s| plan.slots[s].bytes >= bytes[b])
                        .min_by_key(|&s| plan.slots[s].bytes);
                    match fit {
                        Some(s) => {
                            free.retain(|&f| f != s);
                            s
                        }
                        None => {
                            plan.slots.push(Slot {
                                offset: 0,
                                bytes: bytes[b],
                                members: Vec::new(),
                            });
                            plan.slots.len() - 1
                        }
                    }
                }
            };
            plan.slots[slot].members.push(written);
            plan.slot_of[b] = Some(slot);
        }
    }
    let mut offset = 0;
    for slot in &mut plan.slots {
        slot.offset = offset;
        offset = offset.saturating_add(slot.bytes.div_ceil(SLOT_ALIGN) * SLOT_ALIGN);
    }
    plan.arena_bytes = offset;
    plan.unshared_bytes = (0..n)
        .filter(|&b| planned(b))
        .fold(0usize, |acc, b| acc.saturating_add(bytes[b]));
    // A buffer updated in place takes no memory of its own at the step that creates it.
    let shares = |b: usize, s: usize| {
        plan.in_place
            .iter()
            .any(|&(into, _, at)| into.0 as usize == b && at == s)
    };
    plan.live_peak_bytes = (0..program.steps.len())
        .map(|s| {
            (0..n)
                .filter(|&b| planned(b) && matches!(live[b], Some((d, l)) if d <= s && s <= l))
                .filter(|&b| !shares(b, s))
                .fold(0usize, |acc, b| acc.saturating_add(bytes[b]))
        })
        .max()
        .unwrap_or(0);
    plan
}

/// Whether a member of `slot` is still live at `step` (its slot cannot be handed out).
fn occupied(plan: &BufferPlan, live: &[Option<(usize, usize)>], slot: usize, step: usize) -> bool {
    plan.slots[slot]
        .members
        .iter()
        .any(|m| matches!(live[m.0 as usize], Some((_, last)) if last >= step))
}

/// An input of `step` whose slot `written` may take over: an intermediate whose last use is this
/// step, not already overwritten by another buffer, for which [`in_place_is_safe`] holds.
fn in_place_candidate(
    program: &Program,
    step: &Step,
    step_index: usize,
    written: BufferId,
    plan: &BufferPlan,
    live: &[Option<(usize, usize)>],
) -> Option<BufferId> {
    let kernel = match step {
        Step::Kernel(k) => k,
        Step::Matmul(m) => m.epilogue.as_ref()?,
        Step::ScatterAdd(_) | Step::Attention(_) | Step::Fallback(_) => return None,
    };
    kernel.loads().into_iter().find(|&input| {
        // Not already overwritten by another buffer this kernel writes.
        plan.slot_of[input.0 as usize]
            .is_some_and(|slot| plan.slots[slot].members.last() == Some(&input))
            && matches!(live[input.0 as usize], Some((_, last)) if last == step_index)
            && in_place_is_safe(program, step, written, input)
    })
}

/// Whether the kernel of `step` may write `written` over `input` (both intermediates, `input`
/// not used after this step): same element width and size, and the kernel reads `input` only at
/// the index it stores `written` to, in the store's stage or earlier stages of the same loop
/// shape, never through a GEMM, and the store is the only one to `written`, in the last stage.
/// `plan_buffers` places buffers in place only where this holds; the verifier re-checks it.
pub(crate) fn in_place_is_safe(
    program: &Program,
    step: &Step,
    written: BufferId,
    input: BufferId,
) -> bool {
    let kernel = match step {
        Step::Kernel(k) => k,
        Step::Matmul(m) => match m.epilogue.as_ref() {
            Some(e) => e,
            None => return false,
        },
        // An attention reads q, k and v whole while it writes: never in place.
        Step::ScatterAdd(_) | Step::Attention(_) | Step::Fallback(_) => return false,
    };
    let out = program.buffer(written);
    let stores: Vec<(usize, &Store)> = kernel
        .stages
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.action.stores().iter().map(move |x| (i, x)))
        .filter(|(_, st)| st.buffer == written)
        .collect();
    // One store to `written` (a reduction stage that also stores it disqualifies it), in the
    // last stage (no later stage can read what it overwrote).
    let [(store_stage, store)] = stores.as_slice() else {
        return false;
    };
    if *store_stage + 1 != kernel.stages.len() {
        return false;
    }
    let store_extent = &kernel.stages[*store_stage].extent;
    // A load that a later store of the stage needs may run after `written` overwrote the
    // element: stores of one stage run in order, and the code generator does not keep every
    // value computed for an earlier store (block math routines compute a block of values first,
    // then the stores reload what they need). So no later store of the stage may read `input`.
    let StageAction::Store(stage_stores) = &kernel.stages[*store_stage].action else {
        return false;
    };
    let Some(position) = stage_stores.iter().position(|st| st.buffer == written) else {
        return false;
    };
    let values = |stores: &[Store]| -> Vec<ExprId> { stores.iter().map(|st| st.value).collect() };
    let computed_after = kernel.reachable(&values(&stage_stores[position + 1..]));
    let b = program.buffer(input);
    b.kind == BufferKind::Intermediate
        && out.kind == BufferKind::Intermediate
        && input != written
        && b.dtype.size_bytes() == out.dtype.size_bytes()
        && (b.shape == out.shape || (b.numel().is_some() && b.numel() == out.numel()))
        && !read_by_gemm(step, input)
        && kernel.exprs.iter().enumerate().all(|(i, e)| match e {
            Expr::Load {
                buffer,
                index,
                indirect,
            } if *buffer == input => {
                let id = ExprId(i as u32);
                indirect.is_none()
                    && *index == store.index
                    && !computed_after.contains(&id)
                    && stages_using(kernel, ExprId(i as u32))
                        .iter()
                        .all(|&s| kernel.stages[s].extent == *store_extent)
            }
            _ => true,
        })
}

/// Whether a GEMM in the same step reads `input` (its operands are read whole, not row by row).
fn read_by_gemm(step: &Step, input: BufferId) -> bool {
    match step {
        Step::Kernel(_) => false,
        Step::Matmul(m) => m.a.buffer == input || m.b.buffer() == input,
        Step::ScatterAdd(sc) => sc.index.buffer == input || sc.src.buffer == input,
        Step::Attention(a) => {
            [a.q.buffer, a.k.buffer, a.v.buffer].contains(&input)
                || a.mask.as_ref().is_some_and(|m| m.buffer == input)
        }
        Step::Fallback(fb) => fb.inputs.contains(&input),
    }
}

/// The stages whose computation uses expression `target`.
fn stages_using(kernel: &Kernel, target: ExprId) -> Vec<usize> {
    let uses = |root: ExprId| kernel.reachable(&[root]).contains(&target);
    kernel
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.action.roots().into_iter().any(uses))
        .map(|(i, _)| i)
        .collect()
}
