//! The buffer plan's types: which arena slot each intermediate buffer of a [`Program`] takes
//! (made by the `plan_buffers` pass, re-checked by [`crate::verify_program`], printed with the
//! program and parsed back), and the facts a plan is defined over (buffer bytes at the size
//! hint, live ranges over the steps).

use crate::kernel::*;
use std::fmt;

/// Alignment of every slot in the arena, in bytes.
pub const SLOT_ALIGN: usize = 64;

/// The size assumed for a symbolic dim when choosing slots (sizes are exact at run time).
pub const SIZE_HINT: usize = 256;

#[derive(Clone, Debug, PartialEq, Default)]
pub struct BufferPlan {
    /// For each buffer of the program: its slot, if it is an intermediate.
    pub slot_of: Vec<Option<usize>>,
    pub slots: Vec<Slot>,
    /// For each buffer: the steps it is live over (first write, last use), if it is used at all.
    pub live: Vec<Option<(usize, usize)>>,
    /// `(buffer, overwritten input, step)` for every in-place update.
    pub in_place: Vec<(BufferId, BufferId, usize)>,
    /// Bytes of the arena: all slots laid out with their alignment.
    pub arena_bytes: usize,
    /// Bytes the intermediates would take with no sharing.
    pub unshared_bytes: usize,
    /// Largest total of intermediates live at one step (a lower bound for any plan).
    pub live_peak_bytes: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// Byte offset in the arena.
    pub offset: usize,
    pub bytes: usize,
    /// The buffers that occupy this slot, in the order they take it.
    pub members: Vec<BufferId>,
}

impl BufferPlan {
    /// Slot offsets and the arena's total bytes for the actual byte size of each buffer: each
    /// slot is as large as its largest member, 64-byte aligned, laid out in order. `None` if a
    /// buffer's size is `None` (it overflowed) or the total exceeds `isize::MAX`.
    pub fn layout(
        &self,
        buffer_bytes: impl Fn(BufferId) -> Option<usize>,
    ) -> Option<(Vec<usize>, usize)> {
        let mut offsets = Vec::with_capacity(self.slots.len());
        let mut total: usize = 0;
        for slot in &self.slots {
            offsets.push(total);
            let mut bytes = 0;
            for &m in &slot.members {
                bytes = bytes.max(buffer_bytes(m)?);
            }
            let aligned = bytes.checked_next_multiple_of(SLOT_ALIGN)?;
            total = total.checked_add(aligned)?;
        }
        (total <= isize::MAX as usize).then_some((offsets, total))
    }

    /// Byte offset of `buffer` in the arena, if it is planned.
    pub fn offset(&self, buffer: BufferId) -> Option<usize> {
        self.slot_of
            .get(buffer.0 as usize)
            .copied()
            .flatten()
            .map(|s| self.slots[s].offset)
    }
}

/// Bytes of `b`, with [`SIZE_HINT`] for each symbolic dim.
/// Saturates instead of overflowing: these sizes only choose which buffers share a slot (exact
/// sizes are computed, checked, per call).
pub fn buffer_bytes(b: &Buffer) -> usize {
    b.shape
        .iter()
        .map(|d| d.as_static().unwrap_or(SIZE_HINT))
        .fold(b.dtype.size_bytes(), |acc, n| acc.saturating_mul(n))
}

/// For each buffer: the steps it is live over (the first and the last step that reads or writes
/// it), if any step uses it.
pub fn live_ranges(program: &Program) -> Vec<Option<(usize, usize)>> {
    let mut live: Vec<Option<(usize, usize)>> = vec![None; program.buffers.len()];
    for (i, step) in program.steps.iter().enumerate() {
        for b in step.writes().into_iter().chain(step.reads()) {
            let entry = &mut live[b.0 as usize];
            *entry = Some(match *entry {
                None => (i, i),
                Some((first, _)) => (first, i),
            });
        }
    }
    live
}

impl fmt::Display for BufferPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "arena {} bytes in {} slots (unshared {} bytes, live peak {} bytes)",
            self.arena_bytes,
            self.slots.len(),
            self.unshared_bytes,
            self.live_peak_bytes
        )?;
        for (i, slot) in self.slots.iter().enumerate() {
            let members: Vec<String> = slot
                .members
                .iter()
                .map(|m| match self.live[m.0 as usize] {
                    Some((d, l)) => format!("{m} (steps {d}..={l})"),
                    None => m.to_string(),
                })
                .collect();
            writeln!(
                f,
                "  slot{i} @{} {} bytes: {}",
                slot.offset,
                slot.bytes,
                members.join(", ")
            )?;
        }
        for (b, input, step) in &self.in_place {
            writeln!(f, "  in place: {b} overwrites {input} at step {step}")?;
        }
        Ok(())
    }
}
