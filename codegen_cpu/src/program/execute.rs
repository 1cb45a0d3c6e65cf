//! Running a compiled program: binding every symbolic size and buffer for one call, the pool of
//! arenas the intermediates live in, the steps in order with the index checks before them, JIT
//! kernels split across threads, and fallback steps.

use super::extern_steps::{
    attention_pieces_of, matmul_pieces, run_attention, run_matmul, run_scatter_add, Prepacked,
};
use super::{CompiledKernel, CompiledProgram, CompiledStep, Split};
use minductor_ir::{checked_bytes, Dim, SymId};
use minductor_kernel_ir::verify_program;
use minductor_kernel_ir::{BufferId, BufferKind, FallbackStep, Program, StridedView};
use minductor_runtime::{
    threads, Executable, RuntimeError, StepPartition, StepTiming, Storage, Tensor, WorkUnit,
};
use std::time::Instant;

/// A kernel's loop extents for one call.
pub(super) struct BoundKernel {
    params: Vec<i64>,
    /// Iterations of the outer loops the function's range covers (the first, or the first few
    /// flattened: `split_loops`), the range it is called with (1 if none).
    pub(super) range: i64,
    /// Elements the kernel visits (all loop trip counts), to decide on threading.
    pub(super) work: i64,
    /// Iterations of the range per iteration of the first outer loop (the other split loops').
    per_first: i64,
}

impl CompiledKernel {
    pub(super) fn bind(&self, symbols: &Symbols) -> BoundKernel {
        let params: Vec<i64> = self
            .extents
            .iter()
            .map(|&d| symbols.size(d) as i64)
            .collect();
        // Saturating: these only decide whether to split the work across threads.
        let outer: i64 = params[..self.outer_loops]
            .iter()
            .fold(1i64, |acc, &n| acc.saturating_mul(n));
        let mut at = self.outer_loops;
        let mut inner: i64 = 0;
        for &n in &self.stage_loops {
            let trips = params[at..at + n]
                .iter()
                .fold(1i64, |acc, &n| acc.saturating_mul(n));
            inner = inner.saturating_add(trips);
            at += n;
        }
        BoundKernel {
            per_first: params[1.min(self.split_loops)..self.split_loops]
                .iter()
                .fold(1i64, |acc, &n| acc.saturating_mul(n)),
            range: if self.split_loops > 0 {
                params[..self.split_loops]
                    .iter()
                    .fold(1i64, |acc, &n| acc.saturating_mul(n))
            } else {
                1
            },
            work: outer.saturating_mul(inner),
            params,
        }
    }
}

/// The f32 elements `0..len` of buffer `id`, read-only.
///
/// # Safety
/// `pointers[id]` is the start of a live buffer holding at least `len` f32s for this call's
/// sizes, which nothing writes while the slice lives.
pub(super) unsafe fn read_f32<'a>(pointers: &[*mut u8], id: BufferId, len: usize) -> &'a [f32] {
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(pointers[id.0 as usize] as *const f32, len) }
}

/// The size of every symbolic dim for one call, read off the inputs' shapes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Symbols(Vec<Option<usize>>, Vec<(SymId, usize)>);

impl Symbols {
    /// The size of an input symbol, if an input bound it.
    fn input_size(&self, s: SymId) -> Option<i128> {
        self.0
            .get(s.0 as usize)
            .copied()
            .flatten()
            .map(|n| n as i128)
    }

    /// The size of symbol `s` for this call, input or derived (the size `bind` evaluated, else
    /// its definition on the input sizes), if it has one.
    fn symbol_size(&self, s: SymId) -> Option<i128> {
        if !s.is_derived() {
            return self.input_size(s);
        }
        match self.1.iter().find(|(x, _)| *x == s) {
            Some(&(_, n)) => Some(n as i128),
            None => Dim::Sym(s).eval(|s| self.input_size(s)),
        }
    }

    /// The value of a size expression over this call's symbols (input or derived), if each
    /// has a size and the value fits an i64.
    pub(super) fn value(&self, e: &minductor_ir::SizeExpr) -> Option<i64> {
        e.eval_i64(|s| self.symbol_size(s))
    }

    /// The size of `d` for this call. A derived symbol's size was evaluated from its
    /// definition by `bind` (which checked that every derived dim of the program has one).
    pub(super) fn size(&self, d: Dim) -> usize {
        match d {
            Dim::Static(n) => n,
            Dim::Sym(s) if s.is_derived() => self
                .symbol_size(s)
                .and_then(|n| usize::try_from(n).ok())
                .expect("every derived symbol is sized by bind"),
            Dim::Sym(s) => self.0[s.0 as usize].expect("every symbol is bound by an input"),
        }
    }

    pub(super) fn sizes(&self, shape: &[Dim]) -> Vec<usize> {
        shape.iter().map(|&d| self.size(d)).collect()
    }

    /// The number of elements of `program`'s buffer `id` for these sizes.
    pub(super) fn elements(&self, program: &Program, id: BufferId) -> usize {
        self.sizes(&program.buffer(id).shape).iter().product()
    }

    /// A view's offset and strides for these sizes (they may be size expressions). The
    /// verifier, run for these sizes, evaluated the same expressions, so an overflow here is a
    /// size it rejected too; it is still an error, not a panic.
    pub(super) fn view(
        &self,
        view: &StridedView,
        step: BufferId,
    ) -> Result<(i64, Vec<i64>), RuntimeError> {
        view.bind(|s| self.input_size(s)).ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "step writing {step}: a view's strides overflow i64 for these sizes"
            ))
        })
    }

    /// Binds the symbols from the inputs, checking every static size and that a symbol has one
    /// size across all the dims it names.
    /// `derived_dims` are the program's derived dims, each of which must have a size.
    fn bind(
        program: &Program,
        derived_dims: &[Dim],
        inputs: &[Tensor],
    ) -> Result<Symbols, RuntimeError> {
        let mut symbols = Symbols(Vec::new(), Vec::new());
        let mut derived_inputs: Vec<(usize, Dim, usize)> = Vec::new();
        for b in &program.buffers {
            let BufferKind::Input(n) = b.kind else {
                continue;
            };
            let t = inputs.get(n).ok_or(RuntimeError::Arity {
                expected: n + 1,
                found: inputs.len(),
            })?;
            let mismatch = || RuntimeError::Shape {
                name: format!("#{n}"),
                expected: format!("{}{}", b.dtype, minductor_ir::shape_string(&b.shape)),
                found: t.shape().to_vec(),
            };
            if t.dtype() != b.dtype || t.rank() != b.shape.len() {
                return Err(mismatch());
            }
            for (&d, &size) in b.shape.iter().zip(t.shape()) {
                match d {
                    Dim::Static(n) if n != size => return Err(mismatch()),
                    Dim::Static(_) => {}
                    // A derived size (an input of a graph segment after a break) is checked
                    // below, once the input symbols are bound.
                    Dim::Sym(s) if s.is_derived() => derived_inputs.push((n, d, size)),
                    Dim::Sym(s) => {
                        let slot = s.0 as usize;
                        if symbols.0.len() <= slot {
                            symbols.0.resize(slot + 1, None);
                        }
                        match symbols.0[slot] {
                            Some(bound) if bound != size => {
                                return Err(RuntimeError::Shape {
                                    name: format!("#{n}"),
                                    expected: format!(
                                        "{}{} with {d} = {bound} (bound by an earlier input)",
                                        b.dtype,
                                        minductor_ir::shape_string(&b.shape)
                                    ),
                                    found: t.shape().to_vec(),
                                })
                            }
                            _ => symbols.0[slot] = Some(size),
                        }
                    }
                }
            }
        }
        // An input symbol that only such dims name is solved from one of them (`s0 + 1` of
        // size 7 binds `s0` to 6); every one must then agree.
        for &(_, d, size) in &derived_inputs {
            if let Dim::Sym(s) = d {
                if let Some((x, value)) = s.solve(size) {
                    let slot = x.0 as usize;
                    if symbols.0.len() <= slot {
                        symbols.0.resize(slot + 1, None);
                    }
                    symbols.0[slot].get_or_insert(value);
                }
            }
        }
        for (n, d, size) in derived_inputs {
            if d.eval(|s| symbols.input_size(s)) != Some(size as i128) {
                return Err(RuntimeError::Shape {
                    name: format!("#{n}"),
                    expected: format!("dim {d} as the other inputs bind its symbols"),
                    found: inputs[n].shape().to_vec(),
                });
            }
        }
        // A derived size (`s0 - 1` of a slice) must come out at least 0 for these sizes.
        for &d in derived_dims {
            let size = d
                .eval(|s| symbols.input_size(s))
                .and_then(|n| usize::try_from(n).ok());
            match (d, size) {
                (Dim::Sym(s), Some(n)) => symbols.1.push((s, n)),
                _ => {
                    return Err(RuntimeError::Shape {
                        name: "inputs".into(),
                        expected: format!("sizes for which {d} is a size (not negative)"),
                        found: inputs
                            .first()
                            .map(|t| t.shape().to_vec())
                            .unwrap_or_default(),
                    })
                }
            }
        }
        Ok(symbols)
    }
}

/// The 4 bytes checking mode fills memory with (the kernels' scratch too): f32 `0x7FA5A5A5`, a
/// signalling NaN whose payload (`0x25A5A5`) survives arithmetic (which only sets the quiet
/// bit), so a result computed from memory no step wrote carries it.
use minductor_kernels::scratch::UNWRITTEN;
/// Bytes of guard before and after every slot of a checking arena.
const GUARD_BYTES: usize = 64;

/// `MINDUCTOR_CHECK_BUFFERS=1`, read once.
pub(super) fn check_buffers_from_env() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MINDUCTOR_CHECK_BUFFERS").is_ok_and(|v| v == "1"))
}

/// Whether an f32's bits are the unwritten pattern, signalling or quieted.
fn carries_unwritten_pattern(bits: u32) -> bool {
    bits & !0x0040_0000 == UNWRITTEN
}

/// Checking mode's arena: every slot of the plan in its own place, `GUARD_BYTES` of the
/// pattern before and after it, all filled with the pattern before the call.
struct CheckedArena {
    storage: Storage,
    /// Each slot's offset and bytes for this call's sizes.
    slots: Vec<(usize, usize)>,
}

impl CheckedArena {
    fn new(
        program: &Program,
        plan: &minductor_kernel_ir::BufferPlan,
        symbols: &Symbols,
    ) -> Result<CheckedArena, RuntimeError> {
        let overflow = || RuntimeError::SizeOverflow("the checking arena".into());
        let slot_count = plan
            .slot_of
            .iter()
            .flatten()
            .map(|&s| s + 1)
            .max()
            .unwrap_or(0);
        let mut sizes = vec![0usize; slot_count];
        for (index, slot) in plan.slot_of.iter().enumerate() {
            if let Some(slot) = *slot {
                let b = &program.buffers[index];
                let bytes = checked_bytes(symbols.sizes(&b.shape), b.dtype.size_bytes())
                    .ok_or_else(overflow)?;
                sizes[slot] = sizes[slot].max(bytes);
            }
        }
        let mut slots = Vec::with_capacity(slot_count);
        let mut end = 0usize;
        for bytes in sizes {
            let offset = end.checked_add(GUARD_BYTES).ok_or_else(overflow)?;
            slots.push((offset, bytes));
            end = offset
                .checked_add(bytes.div_ceil(GUARD_BYTES) * GUARD_BYTES + GUARD_BYTES)
                .ok_or_else(overflow)?;
        }
        let storage = Storage::try_zeroed(end.max(GUARD_BYTES))
            .map_err(|e| e.allocating("the checking arena"))?;
        fill_unwritten(storage.as_mut_ptr(), storage.len());
        Ok(CheckedArena { storage, slots })
    }

    /// The first guard byte a step changed, as an error naming the step and the slot.
    fn check_guards(&self, step: usize) -> Result<(), RuntimeError> {
        let bytes = self.storage.as_bytes();
        for (slot, &(offset, len)) in self.slots.iter().enumerate() {
            let after = offset + len;
            let ranges = [offset - GUARD_BYTES..offset, after..after + GUARD_BYTES];
            for range in ranges {
                for at in range {
                    if bytes[at] != UNWRITTEN.to_le_bytes()[at % 4] {
                        return Err(RuntimeError::BufferCheck(format!(
                            "step {step} wrote outside slot {slot} ({len} bytes): guard byte at \
                             {} from the slot's start",
                            at as isize - offset as isize
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Fills `len` bytes at `ptr` with the pattern, byte `i` being byte `i % 4` of [`UNWRITTEN`]
/// (so every 4-byte-aligned f32 reads as the pattern).
fn fill_unwritten(ptr: *mut u8, len: usize) {
    let pattern = UNWRITTEN.to_le_bytes();
    // SAFETY: the callers pass a buffer they own of `len` bytes, which no one else uses.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = pattern[i % 4];
    }
}

/// A test's deliberate fault, to prove checking mode catches it: a step sees a buffer one
/// element past where it starts (so it reads, or writes, one element past its end), or a step
/// does not run.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(super) enum Sabotage {
    ShiftByOneElement { step: usize, buffer: BufferId },
    Skip { step: usize },
}

#[cfg(test)]
thread_local! {
    pub(super) static SABOTAGE: std::cell::Cell<Option<Sabotage>> = const { std::cell::Cell::new(None) };
}

/// One call's memory for the intermediates: an allocation laid out by the plan for some symbol
/// sizes. Calls take an arena from the program's pool and give it back, so calls from several
/// threads run at once, each in its own arena.
pub(super) struct Arena {
    storage: Storage,
    /// The symbol sizes the arena is laid out for, each slot's offset for them, and the total.
    layout: Option<(Symbols, Vec<usize>, usize)>,
}

impl Executable for CompiledProgram {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        self.run_in_pooled_arena(inputs, None, None, false)
    }

    fn profile(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<StepTiming>), RuntimeError> {
        let mut timings = Vec::new();
        let outputs = self.run_in_pooled_arena(inputs, Some(&mut timings), None, false)?;
        Ok((outputs, timings))
    }

    /// Every step runs (the GEMMs without their epilogues), each timed; the outputs, whose
    /// values are not the graph's, are dropped.
    fn profile_products(&self, inputs: &[Tensor]) -> Result<Vec<StepTiming>, RuntimeError> {
        let mut timings = Vec::new();
        self.run_in_pooled_arena(inputs, Some(&mut timings), None, true)?;
        Ok(timings)
    }

    /// Writes every output straight into the caller's tensor: kernels store into it, no output
    /// is allocated. Each tensor is checked (`output_destination`) before any step runs.
    fn run_into(&self, inputs: &[Tensor], outputs: &mut [Tensor]) -> Result<(), RuntimeError> {
        self.run_in_pooled_arena(inputs, None, Some(outputs), false)
            .map(|_| ())
    }

    /// Packs, once, the weight operand of every GEMM that a constant feeds directly (a frozen
    /// linear layer's `b`, a frozen convolution's `a`; see [`Prepacked`]).
    fn prepare_constants(&mut self, first: usize, constants: &[Tensor]) -> usize {
        let program = &self.program;
        let mut packed = 0;
        for step in &mut self.steps {
            if let CompiledStep::Matmul {
                step, prepacked, ..
            } = step
            {
                *prepacked = Prepacked::new(step, program, first, constants).map(Box::new);
                packed += usize::from(prepacked.is_some());
            }
        }
        packed
    }

    /// The arena laid out for the inputs' sizes, the outputs and the contiguous copies of
    /// non-contiguous inputs (GEMM packing and per-thread scratch, bounded by the blocking, are
    /// not counted).
    fn memory_needed(&self, inputs: &[Tensor]) -> Result<Option<usize>, RuntimeError> {
        let symbols = Symbols::bind(&self.program, &self.derived_dims, inputs)?;
        let program = &self.program;
        let bytes = |b: &minductor_kernel_ir::Buffer| {
            checked_bytes(symbols.sizes(&b.shape), b.dtype.size_bytes())
        };
        let overflow =
            || RuntimeError::SizeOverflow(format!("the buffers for sizes {:?}", symbols.0));
        let (_, arena) = self
            .plan
            .layout(|b| bytes(program.buffer(b)))
            .ok_or_else(overflow)?;
        let mut needed = arena;
        for b in &program.buffers {
            let extra = match b.kind {
                BufferKind::Output => bytes(b).ok_or_else(overflow)?,
                BufferKind::Input(n) => match inputs.get(n) {
                    Some(t) if !t.is_contiguous() => bytes(b).ok_or_else(overflow)?,
                    _ => 0,
                },
                BufferKind::Intermediate => 0,
            };
            needed = needed.checked_add(extra).ok_or_else(overflow)?;
        }
        Ok(Some(needed))
    }

    /// The largest pooled arena (what one call keeps), or the plan's estimate before any call.
    fn partition(
        &self,
        inputs: &[Tensor],
        threads: usize,
    ) -> Result<Vec<StepPartition>, RuntimeError> {
        self.partition_steps(inputs, threads)
    }

    fn arena_bytes(&self) -> usize {
        let pool = self.arenas.0.lock().unwrap_or_else(|p| p.into_inner());
        pool.iter()
            .filter_map(|a| a.layout.as_ref().map(|l| l.2))
            .max()
            .unwrap_or(self.plan.arena_bytes)
    }
}

/// The pointer table, shared read-only by the threads running one step.
#[derive(Clone, Copy)]
pub(super) struct SharedPointers(pub(super) *const *mut u8);
// SAFETY: the table and the buffers behind it outlive the parallel loop (it joins before the
// step returns), and the chunks of the first outer loop write disjoint elements (see `run_steps`).
unsafe impl Send for SharedPointers {}
unsafe impl Sync for SharedPointers {}

impl CompiledProgram {
    /// Runs the steps in an arena taken from the pool (a new one if every arena is in use) and
    /// returns it to the pool afterwards.
    fn run_in_pooled_arena(
        &self,
        inputs: &[Tensor],
        timings: Option<&mut Vec<StepTiming>>,
        destinations: Option<&mut [Tensor]>,
        products_only: bool,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let lock = || self.arenas.0.lock().unwrap_or_else(|p| p.into_inner());
        let taken = lock().pop();
        let mut arena = taken.unwrap_or_else(|| Arena {
            storage: Storage::zeroed(0),
            layout: None,
        });
        // A call whose steps split enough to pay for it runs its steps on a worker of the pool,
        // with the pool's other workers held in a team for the call: they spin for each step's
        // pieces instead of falling asleep between steps (see `threads::in_team`). A small one
        // stays on the caller (concurrent callers of a small graph never queue behind the
        // pool, and a call of a few microseconds does not pay for the hand-over).
        let result = if self.runs_as_team(inputs) {
            threads::in_team(|| {
                self.run_steps(&mut arena, inputs, timings, destinations, products_only)
            })
        } else {
            // Steps that still cut pieces run them here, in order: handing a piece to a
            // sleeping worker costs more than such a call saves.
            threads::serially(|| {
                self.run_steps(&mut arena, inputs, timings, destinations, products_only)
            })
        };
        lock().push(arena);
        result
    }

    /// Whether a call on `inputs` runs as a team: when splitting its steps across the threads
    /// saves more than waking the team costs ([`TEAM_WAKE_NS`]), by the pieces the steps cut
    /// (`partition_steps`, the executor's own rules) at about [`NS_PER_ELEMENT`] a kernel's
    /// element and [`NS_PER_MULTIPLY_ADD`] a GEMM's or an attention's multiply-add. Decided once
    /// per input shapes and thread count (remembered by a hash of them).
    pub fn runs_as_team(&self, inputs: &[Tensor]) -> bool {
        let threads = threads::num_threads();
        if threads <= 1 || self.splits == Some(false) {
            return false;
        }
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            threads.hash(&mut h);
            for t in inputs {
                t.shape().hash(&mut h);
            }
            h.finish()
        };
        let choices = || self.team_choices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(_, team)) = choices().iter().find(|(k, _)| *k == key) {
            return team;
        }
        // Inputs that do not bind (their error comes from the call itself) run on the caller.
        let team = self.partition_steps(inputs, threads).is_ok_and(|steps| {
            let saved: f64 = steps
                .iter()
                .filter(|p| p.pieces.len() > 1)
                .map(|p| {
                    let total = p.total();
                    let largest = p.pieces.iter().copied().max().unwrap_or(0);
                    let slowest = largest.max(total.div_ceil(threads as u64));
                    let per_unit = if p.unit == WorkUnit::Elements {
                        NS_PER_ELEMENT
                    } else {
                        NS_PER_MULTIPLY_ADD
                    };
                    (total - slowest) as f64 * per_unit
                })
                .sum();
            saved > TEAM_WAKE_NS
        });
        let mut choices = choices();
        if choices.len() >= 8 {
            choices.remove(0);
        }
        choices.push((key, team));
        team
    }

    /// Binds every buffer to memory (inputs: the caller's, contiguous; outputs: fresh, or the
    /// caller's `destinations`; intermediates: their slots in `arena`) and runs the steps, timing
    /// each if asked; with `products_only` every GEMM runs without its epilogue
    /// (`profile_products`). Returns the outputs (none when they were written into
    /// `destinations`).
    fn run_steps(
        &self,
        arena: &mut Arena,
        inputs: &[Tensor],
        mut timings: Option<&mut Vec<StepTiming>>,
        destinations: Option<&mut [Tensor]>,
        products_only: bool,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let symbols = Symbols::bind(&self.program, &self.derived_dims, inputs)?;
        // The caller's tensors, checked before anything runs: a pointer to each one's first
        // element (they stay borrowed, so no one else can reach their storage meanwhile).
        let mut destination_pointers: Vec<*mut u8> = Vec::new();
        if let Some(outs) = destinations {
            if outs.len() != self.program.outputs.len() {
                return Err(RuntimeError::OutputBufferCount {
                    expected: self.program.outputs.len(),
                    found: outs.len(),
                });
            }
            for (index, (out, &id)) in outs.iter_mut().zip(&self.program.outputs).enumerate() {
                let buffer = self.program.buffer(id);
                let shape = symbols.sizes(&buffer.shape);
                destination_pointers.push(minductor_runtime::output_destination(
                    index,
                    buffer.dtype,
                    &shape,
                    out,
                )?);
            }
        }
        if arena.layout.as_ref().map(|l| &l.0) != Some(&symbols) {
            let program = &self.program;
            if !symbols.0.is_empty() {
                // Ranges over symbolic extents could not be checked at compile time: check them
                // for these sizes before any kernel runs with them.
                verify_program(program, &symbols.0)
                    .map_err(|e| RuntimeError::InvalidProgram(e.to_string()))?;
            }
            let overflow = || {
                RuntimeError::SizeOverflow(format!(
                    "the intermediates for sizes {:?} exceed isize::MAX bytes",
                    symbols.0
                ))
            };
            let (offsets, total) = self
                .plan
                .layout(|b| {
                    let buffer = program.buffer(b);
                    checked_bytes(symbols.sizes(&buffer.shape), buffer.dtype.size_bytes())
                })
                .ok_or_else(overflow)?;
            if total > arena.storage.len() {
                // The old block is freed first (its contents are dead), so growing never holds
                // both; if the new one cannot be had, the arena is left empty and unlaid.
                arena.storage = Storage::zeroed(0);
                arena.layout = None;
                arena.storage = Storage::try_zeroed(total)
                    .map_err(|e| e.allocating("the arena of intermediates"))?;
            }
            arena.layout = Some((symbols.clone(), offsets, total));
        }
        let program = &self.program;
        let slot_offsets = &arena.layout.as_ref().expect("laid out above").1;
        let checked = if self.check_buffers {
            Some(CheckedArena::new(program, &self.plan, &symbols)?)
        } else {
            None
        };
        // The kernels' scratch (GEMM packing, attention's packed keys, Winograd tiles) is
        // filled with the pattern and guarded while this call runs.
        let _scratch_check = self
            .check_buffers
            .then(minductor_kernels::scratch::CheckScratch::new);
        let mut held: Vec<Option<Tensor>> = vec![None; program.buffers.len()];
        let mut pointers: Vec<*mut u8> = vec![std::ptr::null_mut(); program.buffers.len()];
        // Every buffer the compiled code touches, checked against the plan: this is the fence
        // that keeps JIT code inside its buffers.
        for (index, b) in program.buffers.iter().enumerate() {
            match b.kind {
                BufferKind::Input(n) => {
                    let t = inputs.get(n).ok_or(RuntimeError::Arity {
                        expected: n + 1,
                        found: inputs.len(),
                    })?;
                    // Dtype and sizes were checked by `Symbols::bind`. Kernels only ever read
                    // inputs (fuse never stores to an input buffer), so this pointer to
                    // storage the caller may share is never written through. A contiguous
                    // input is read where it is, without taking a reference: its count is
                    // shared with every other caller passing the same tensor, and each change
                    // would move its cache line between their cores.
                    if t.is_contiguous() {
                        pointers[index] = t.data_ptr() as *mut u8;
                        continue;
                    }
                    let t = t
                        .try_contiguous()
                        .map_err(|e| e.allocating(format!("a contiguous copy of input {n}")))?;
                    pointers[index] = t.data_ptr() as *mut u8;
                    held[index] = Some(t);
                }
                BufferKind::Output if !destination_pointers.is_empty() => {
                    // The first caller tensor receiving this buffer; others get a copy below.
                    let first = program
                        .outputs
                        .iter()
                        .position(|o| o.0 as usize == index)
                        .expect("an output buffer is one of the outputs");
                    pointers[index] = destination_pointers[first];
                }
                BufferKind::Output => {
                    // Kernels write every element of an output, so a recycled block will do.
                    let mut t =
                        Tensor::for_overwrite(b.dtype, &symbols.sizes(&b.shape)).map_err(|e| {
                            e.allocating(format!("output buffer {}", BufferId(index as u32)))
                        })?;
                    pointers[index] = t.data_mut_ptr().expect("a fresh tensor is uniquely owned");
                    if checked.is_some() && b.dtype != minductor_ir::DType::Bool {
                        // Bool tensors hold only 0 and 1; every other output starts as the
                        // pattern, so an element no step writes is found after the call.
                        let bytes = checked_bytes(symbols.sizes(&b.shape), b.dtype.size_bytes())
                            .unwrap_or(0);
                        fill_unwritten(pointers[index], bytes);
                    }
                    held[index] = Some(t);
                }
                BufferKind::Intermediate => {
                    // An intermediate no step touches (its stores were fused away) has no slot.
                    let Some(slot) = self.plan.slot_of[index] else {
                        continue;
                    };
                    if let Some(checked) = &checked {
                        // SAFETY: `CheckedArena::new` placed the slot, as large as its largest
                        // member for this call's sizes, inside its storage, which this call
                        // alone owns.
                        pointers[index] =
                            unsafe { checked.storage.as_mut_ptr().add(checked.slots[slot].0) };
                        continue;
                    }
                    let offset = slot_offsets[slot];
                    // SAFETY: `layout` placed the slot, as large as its largest member for this
                    // call's sizes, inside `total` bytes, and the arena holds at least that
                    // many; the arena was taken out of the pool (`&mut Arena`), so this call is
                    // its only user.
                    pointers[index] = unsafe { arena.storage.as_mut_ptr().add(offset) };
                }
            }
        }
        let mut table: Vec<*mut u8> = Vec::with_capacity(8);
        for (n, step) in self.steps.iter().enumerate() {
            for check in program.index_checks.iter().filter(|c| c.step == n) {
                check_indices(&pointers, program, &symbols, check.buffer, &check.bound)?;
            }
            let started = timings.is_some().then(Instant::now);
            #[cfg(test)]
            let restore = match SABOTAGE.with(|s| s.get()) {
                Some(Sabotage::Skip { step }) if step == n => continue,
                Some(Sabotage::ShiftByOneElement { step, buffer }) if step == n => {
                    let i = buffer.0 as usize;
                    let element = program.buffer(buffer).dtype.size_bytes();
                    let original = pointers[i];
                    pointers[i] = original.wrapping_add(element);
                    Some((i, original))
                }
                _ => None,
            };
            match step {
                CompiledStep::Kernel(k) => run_kernel(k, &symbols, &pointers, &mut table),
                CompiledStep::Matmul {
                    step,
                    epilogue,
                    prepacked,
                    split,
                } => run_matmul(
                    step,
                    epilogue.as_ref().filter(|_| !products_only),
                    prepacked.as_deref(),
                    *split,
                    program,
                    &symbols,
                    &pointers,
                )?,
                CompiledStep::ScatterAdd(sc) => run_scatter_add(sc, program, &symbols, &pointers)?,
                CompiledStep::Attention { step, split } => {
                    run_attention(step, *split, program, &symbols, &pointers)?
                }
                CompiledStep::Fallback(fb) => run_fallback(fb, program, &symbols, &pointers)?,
            }
            #[cfg(test)]
            if let Some((i, original)) = restore {
                pointers[i] = original;
            }
            if let Some(checked) = &checked {
                checked.check_guards(n)?;
            }
            if let (Some(timings), Some(started)) = (timings.as_deref_mut(), started) {
                timings.push(StepTiming {
                    name: step.name(),
                    time: started.elapsed(),
                });
            }
        }
        if checked.is_some() {
            // A result computed from memory no step wrote (or outside a buffer) carries the
            // pattern: look for it in every f32 output.
            for (j, &id) in program.outputs.iter().enumerate() {
                let buffer = program.buffer(id);
                if buffer.dtype != minductor_ir::DType::F32
                    || !matches!(buffer.kind, BufferKind::Output)
                {
                    continue;
                }
                let n = symbols.elements(program, id);
                // SAFETY: an output buffer of `n` f32 values for this call's sizes, written by
                // the steps, which have all finished.
                let values = unsafe { read_f32(&pointers, id, n) };
                if let Some(k) = values
                    .iter()
                    .position(|v| carries_unwritten_pattern(v.to_bits()))
                {
                    return Err(RuntimeError::BufferCheck(format!(
                        "output {j} ({id}) element {k} is {:#010x}: computed from memory no step \
                         wrote, or from outside a buffer, or never written",
                        values[k].to_bits()
                    )));
                }
            }
        }
        if !destination_pointers.is_empty() {
            // Outputs that are inputs, or a buffer already written into an earlier output's
            // tensor, are copied into their own.
            for (j, &id) in program.outputs.iter().enumerate() {
                let source = pointers[id.0 as usize];
                if source == destination_pointers[j] {
                    continue;
                }
                let buffer = program.buffer(id);
                let bytes = checked_bytes(symbols.sizes(&buffer.shape), buffer.dtype.size_bytes())
                    .ok_or_else(|| RuntimeError::SizeOverflow(format!("output {j}")))?;
                // SAFETY: the source is a live input or output buffer of `bytes` bytes for this
                // call's sizes; the destination is the caller's uniquely owned, contiguous tensor
                // of the same dtype and shape (`output_destination`), which no step wrote and
                // which cannot overlap the source (its storage is shared with no tensor, and
                // distinct output tensors never share storage).
                unsafe { std::ptr::copy_nonoverlapping(source, destination_pointers[j], bytes) };
            }
            return Ok(Vec::new());
        }
        Ok(program
            .outputs
            .iter()
            .map(
                |&id| match (&held[id.0 as usize], program.buffer(id).kind) {
                    (Some(t), _) => t.clone(),
                    // An input returned as it is (contiguous, so read in place above).
                    (None, BufferKind::Input(n)) => inputs[n].clone(),
                    (None, _) => unreachable!("output buffers are allocated"),
                },
            )
            .collect())
    }
}

impl CompiledStep {
    /// The step's name in timings and partitions.
    fn name(&self) -> String {
        match self {
            CompiledStep::Kernel(k) => k.name.clone(),
            CompiledStep::Matmul {
                step,
                epilogue: None,
                ..
            } => format!("matmul_{}", step.out),
            CompiledStep::Matmul {
                step,
                epilogue: Some(e),
                ..
            } => format!("matmul_{}+{}", step.out, e.name),
            CompiledStep::ScatterAdd(sc) => format!("scatter_add_{}", sc.out),
            CompiledStep::Attention { step, .. } => format!("attention_{}", step.out.buffer),
            CompiledStep::Fallback(fb) => format!("fallback_{}_{}", fb.op.name(), fb.out),
        }
    }
}

impl CompiledProgram {
    /// How a call on `inputs` splits each step on `threads` threads, by the rules the steps
    /// run by (`kernel_pieces`, `plan_matmul`, the attention's items), without running any.
    /// A GEMM's epilogue is not listed (its pieces are the product's rows, or the epilogue
    /// kernel's own); scatter-adds and fallbacks run on the calling thread, one piece.
    pub fn partition_steps(
        &self,
        inputs: &[Tensor],
        threads: usize,
    ) -> Result<Vec<StepPartition>, RuntimeError> {
        let symbols = Symbols::bind(&self.program, &self.derived_dims, inputs)?;
        let program = &self.program;
        self.steps
            .iter()
            .map(|step| {
                let (pieces, unit) = match step {
                    CompiledStep::Kernel(k) => {
                        let bound = k.bind(&symbols);
                        let per_row = bound.work as u64 / bound.range.max(1) as u64;
                        let pieces = kernel_pieces(k.split, &bound, threads)
                            .into_iter()
                            .map(|r| (r.end - r.start) as u64 * per_row)
                            .collect();
                        (pieces, WorkUnit::Elements)
                    }
                    CompiledStep::Matmul {
                        step,
                        prepacked,
                        split,
                        ..
                    } => (
                        matmul_pieces(
                            step,
                            prepacked.as_ref().is_some_and(|p| p.is_winograd()),
                            prepacked.as_ref().is_some_and(|p| !p.is_winograd()),
                            *split,
                            program,
                            &symbols,
                            threads,
                        )?,
                        WorkUnit::MultiplyAdds,
                    ),
                    CompiledStep::Attention { step, split } => (
                        attention_pieces_of(step, *split, &symbols, threads),
                        WorkUnit::MultiplyAdds,
                    ),
                    CompiledStep::ScatterAdd(sc) => (
                        vec![symbols.sizes(&sc.src.shape).iter().product::<usize>() as u64],
                        WorkUnit::Elements,
                    ),
                    CompiledStep::Fallback(fb) => (
                        vec![symbols.elements(program, fb.out) as u64],
                        WorkUnit::Elements,
                    ),
                };
                Ok(StepPartition {
                    name: step.name(),
                    pieces,
                    unit,
                })
            })
            .collect()
    }
}

/// Runs a fallback step: copies each operand out of its buffer into a tensor, runs the step's op
/// with the reference interpreter on a one-node graph typed with this call's sizes, and copies
/// the result into the output buffer. Runs on the calling thread.
fn run_fallback(
    fb: &FallbackStep,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let at = || format!("fallback {} ({})", fb.node, fb.op);
    let bytes_of = |id: BufferId| -> Result<(Vec<usize>, usize), RuntimeError> {
        let buffer = program.buffer(id);
        let shape = symbols.sizes(&buffer.shape);
        let bytes = checked_bytes(shape.clone(), buffer.dtype.size_bytes()).ok_or_else(|| {
            RuntimeError::SizeOverflow(format!("{}: {id} of shape {shape:?}", at()))
        })?;
        Ok((shape, bytes))
    };
    let mut graph = minductor_ir::Graph::new();
    let mut operands = Vec::with_capacity(fb.inputs.len());
    let mut ids = Vec::with_capacity(fb.inputs.len());
    for &id in &fb.inputs {
        let dtype = program.buffer(id).dtype;
        let (shape, bytes) = bytes_of(id)?;
        // SAFETY: the pointer is the start of a live buffer holding `bytes` bytes (its planned
        // size for this call's sizes, `run_steps`), written by an earlier step or given as an
        // input (`verify_program` checks the order), and no other step runs meanwhile.
        let data = unsafe { std::slice::from_raw_parts(pointers[id.0 as usize], bytes) };
        operands.push(Tensor::from_bytes(dtype, &shape, data)?);
        let ty =
            minductor_ir::TensorType::new(dtype, shape.iter().map(|&n| Dim::Static(n)).collect());
        ids.push(graph.input(id.to_string(), ty));
    }
    let node = match fb.op {
        // A constant's dtype is its output's (`verify_program` checked it has no operands).
        minductor_ir::Op::Constant { value } => graph.constant(value, program.buffer(fb.out).dtype),
        _ => graph
            .add(fb.op.clone(), &ids)
            .map_err(|e| RuntimeError::InvalidProgram(format!("{}: {e}", at())))?,
    };
    graph.set_outputs(vec![node]);
    let result = minductor_runtime::interpret(&graph, &operands).map_err(|e| match e {
        RuntimeError::Data(message) => RuntimeError::Data(format!("{}: {message}", at())),
        other => other,
    })?;
    let out = program.buffer(fb.out);
    let (shape, bytes) = bytes_of(fb.out)?;
    let value = result
        .first()
        .filter(|t| t.dtype() == out.dtype && t.shape() == shape.as_slice())
        .ok_or_else(|| {
            RuntimeError::InvalidProgram(format!(
                "{}: the interpreter's result is not {}{shape:?}",
                at(),
                out.dtype
            ))
        })?;
    let data = value.to_bytes();
    if data.len() != bytes {
        return Err(RuntimeError::InvalidProgram(format!(
            "{}: {} bytes for a buffer of {bytes}",
            at(),
            data.len()
        )));
    }
    // SAFETY: the output pointer is the start of a live buffer of `bytes` bytes (its planned size
    // for this call's sizes), written by this step alone while it runs; `data` is a fresh vector
    // of exactly `bytes` bytes, so the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), pointers[fb.out.0 as usize], bytes) };
    Ok(())
}

/// Every i64 in `buffer` must lie in `0..bound` (embedding indices read from memory).
fn check_indices(
    pointers: &[*mut u8],
    program: &Program,
    symbols: &Symbols,
    buffer: BufferId,
    bound: &minductor_ir::SizeExpr,
) -> Result<(), RuntimeError> {
    let Some(bound) = symbols.value(bound) else {
        return Err(RuntimeError::Unsupported(format!(
            "a gather's table size {bound} overflows for these sizes"
        )));
    };
    let n: usize = symbols
        .sizes(&program.buffer(buffer).shape)
        .iter()
        .product();
    // SAFETY: the buffer holds `n` i64s (its planned size), written by earlier steps or given
    // as an input, and no step runs meanwhile.
    let values =
        unsafe { std::slice::from_raw_parts(pointers[buffer.0 as usize] as *const i64, n) };
    match values.iter().find(|&&i| i < 0 || i >= bound) {
        Some(bad) => Err(RuntimeError::Data(format!(
            "index {bad} is out of range for a dim of size {bound} (a gather's indices)"
        ))),
        None => Ok(()),
    }
}

/// Runs kernel `k` over its outer rows, in the pieces [`kernel_pieces`] cuts for the thread
/// count.
fn run_kernel(
    k: &CompiledKernel,
    symbols: &Symbols,
    pointers: &[*mut u8],
    table: &mut Vec<*mut u8>,
) {
    table.clear();
    table.extend(k.buffers.iter().map(|id| pointers[id.0 as usize]));
    let shared = SharedPointers(table.as_ptr());
    let bound = k.bind(symbols);
    let pieces = kernel_pieces(k.split, &bound, threads::num_threads());
    run_pieces(k, &bound, shared, &pieces);
}

/// Calls `k` on each of `pieces` (ranges of its first outer loop), across the threads when
/// there are several.
pub(super) fn run_pieces(
    k: &CompiledKernel,
    bound: &BoundKernel,
    shared: SharedPointers,
    pieces: &[std::ops::Range<i64>],
) {
    match pieces {
        [] => {}
        [only] => call_kernel(k, bound, shared, only.start, only.end),
        _ => threads::for_each_chunk(pieces.len(), |p| {
            call_kernel(k, bound, shared, pieces[p].start, pieces[p].end)
        }),
    }
}

/// What running a call as a team costs (waking the pool's workers, handing them the steps),
/// in nanoseconds: small models ran 8-10 µs slower at 2 threads than at 1 as teams
/// (tiny_gpt2.pt2, tiny_bert.pt2, `minductor bench --pt2 --threads 1,2`).
const TEAM_WAKE_NS: f64 = 10_000.0;

/// Nanoseconds of one core per element a kernel visits (a rough mean over pointwise and row
/// kernels: 0.5 ns, 2 GB/s of f32 read and written).
const NS_PER_ELEMENT: f64 = 0.5;

/// Nanoseconds of one core per multiply-add of a GEMM or an attention (50 G a second).
const NS_PER_MULTIPLY_ADD: f64 = 0.02;

/// Elements a piece of a kernel visits at least: below this, handing a piece to another
/// thread costs about as much as the piece saves.
pub(super) const MIN_PIECE_WORK: i64 = 1 << 14;

/// The pieces per thread a kernel's default split ([`Split::PerThread`]) cuts when its work
/// allows ([`MIN_PIECE_WORK`] each): a team member runs its own contiguous run of them first
/// (the same memory stream as one piece) and then takes what is left of the others' runs, so a
/// thread slowed by something the split cannot see (a busy sibling core, a member woken late,
/// another process) leaves its last pieces to the rest, where with one piece each the step
/// waits for it. Measured on the 2-vCPU Zen 4 VM at 2 threads, calls alternating between the
/// two rules in one process (300 each, medians, three runs): layernorm_4096x1024 1.68 → 1.28,
/// 1.64 → 1.53, 1.42 → 1.10 ms, and in a run over seven workloads 1.61 → 1.24;
/// softmax_4096x1024 1.48 → 1.33, 1.22 → 1.08, 1.03 → 1.03; pointwise_gelu_1m, gelu_16m, the
/// ResNet and LLaMA blocks, the attention block and the train step within 1% (2026-12-04).
/// Three more runs in a quieter spell: layer norm 0.96 → 0.82, 1.18 → 1.02, 0.70 → 0.70 ms,
/// its upper quartile 1.04-1.71 → 0.87-1.25 (never slower; the gain is the slow calls').
/// Separate processes paired (`minductor bench`, 16 pairs) were too noisy to tell: layer norm
/// faster in 5 of 16, softmax in 5 of 6.
pub(super) const PIECES_PER_THREAD: i64 = 4;

/// Rows whose elements together span at least a cache line (16 f32s): piece boundaries fall on
/// multiples of this many rows when rows are shorter, so two threads never write one line.
const LINE_ELEMENTS: i64 = 16;

/// The pieces (ranges of the first outer loop) kernel `k` of `bound`'s sizes runs in on
/// `threads` threads: the one rule both running and the partition report follow.
///
/// - [`Split::PerThread`]: [`PIECES_PER_THREAD`] pieces per thread, as long as each visits at
///   least [`MIN_PIECE_WORK`] elements (fewer pieces, down to one, for less work);
/// - [`Split::Fine`]: four pieces per thread (finer balance for uneven rows);
/// - [`Split::Serial`]: one piece.
///
/// Pieces are runs of whole rows of equal length, give or take the alignment: when a row visits
/// fewer than [`LINE_ELEMENTS`] elements, boundaries are rounded to a multiple of enough rows to
/// fill a cache line. Every row is computed within one call whatever the cut, so results do not
/// depend on it.
pub(super) fn kernel_pieces(
    split: Split,
    bound: &BoundKernel,
    threads: usize,
) -> Vec<std::ops::Range<i64>> {
    let range = bound.range.max(0);
    let threads = threads.max(1) as i64;
    let wanted = match split {
        Split::PerThread | Split::Gemm(_) | Split::Attention(_) => {
            (PIECES_PER_THREAD * threads).min(bound.work / MIN_PIECE_WORK)
        }
        Split::Serial => 1,
        Split::Fine => 4 * threads,
    };
    let per_row = bound.work / range.max(1);
    let align = if per_row >= LINE_ELEMENTS {
        1
    } else {
        (LINE_ELEMENTS / per_row.max(1)).max(1)
    };
    let chunks = wanted.min(range / align).max(1);
    if threads == 1 || chunks == 1 {
        return std::iter::once(0..range).collect();
    }
    let boundary = |c: i64| {
        if c == chunks {
            range
        } else {
            (range * c / chunks) / align * align
        }
    };
    (0..chunks).map(|c| boundary(c)..boundary(c + 1)).collect()
}

/// Calls the compiled function of `k` (a GEMM's epilogue) on rows `start..end` of its first
/// outer loop: the iterations of its range under them.
pub(super) fn call_kernel_rows(
    k: &CompiledKernel,
    bound: &BoundKernel,
    table: SharedPointers,
    start: i64,
    end: i64,
) {
    let p = bound.per_first;
    call_kernel(
        k,
        bound,
        table,
        start.saturating_mul(p),
        end.saturating_mul(p),
    );
}

/// Calls the compiled function of `k` on outer rows `start..end`.
pub(super) fn call_kernel(
    k: &CompiledKernel,
    bound: &BoundKernel,
    table: SharedPointers,
    start: i64,
    end: i64,
) {
    // SAFETY: every pointer in the table is the start of a live, contiguous buffer whose size is
    // the one `fuse` planned (checked for inputs in `run_steps`, allocated from the plan
    // otherwise, arena slots never overlapping while live); `fuse` guarantees each index stays
    // inside its buffer for loop extents equal to `params` (the buffers were sized for the same
    // symbol values `bound` was made from), and `start..end` lies within the range of its
    // split outer loops (`bound.range`). Threads get disjoint row ranges: a kernel's store index is the row-major
    // index of its own iteration domain, so disjoint rows write disjoint elements, and a kernel
    // reads no buffer it writes except in place at the very element it writes (`plan_buffers`).
    // Each element's value, reductions included, is computed within one call, so results do not
    // depend on the thread count.
    unsafe { (k.function)(table.0, bound.params.as_ptr(), start, end) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::compile_program;
    use minductor_ir::Graph;
    use minductor_passes::{fuse, plan_buffers};

    /// `exp(x) @ w`: a kernel writes the intermediate `exp(x)`, a GEMM reads it.
    fn program() -> (CompiledProgram, BufferId, Vec<Tensor>) {
        let graph: Graph = "graph(x: f32[5, 37], w: f32[37, 3]) {
  %0 = input[x] : f32[5, 37]
  %1 = input[w] : f32[37, 3]
  %2 = exp %0 : f32[5, 37]
  %3 = matmul %2, %1 : f32[5, 3]
  return %3
}"
        .parse()
        .unwrap();
        let mut program = fuse(&graph).unwrap();
        program.plan = Some(plan_buffers(&program));
        let intermediate = program
            .buffers
            .iter()
            .position(|b| matches!(b.kind, BufferKind::Intermediate))
            .map(|i| BufferId(i as u32))
            .expect("exp(x) is realized for the GEMM");
        let compiled = compile_program(&program).unwrap();
        let x = (0..5 * 37).map(|i| (i as f32 * 0.01).sin()).collect();
        let w = (0..37 * 3).map(|i| (i as f32 * 0.1).cos()).collect();
        let inputs = vec![
            Tensor::from_vec(&[5, 37], x).unwrap(),
            Tensor::from_vec(&[37, 3], w).unwrap(),
        ];
        (compiled, intermediate, inputs)
    }

    fn run_with(
        compiled: &CompiledProgram,
        inputs: &[Tensor],
        sabotage: Option<Sabotage>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        SABOTAGE.with(|s| s.set(sabotage));
        let result = compiled.run(inputs);
        SABOTAGE.with(|s| s.set(None));
        result
    }

    #[test]
    fn checking_mode_passes_a_correct_program_with_the_same_results() {
        let (mut compiled, _, inputs) = program();
        let plain = run_with(&compiled, &inputs, None).unwrap();
        compiled.set_check_buffers(true);
        let checked = run_with(&compiled, &inputs, None).unwrap();
        assert_eq!(
            plain[0].to_vec::<f32>().unwrap(),
            checked[0].to_vec::<f32>().unwrap()
        );
    }

    /// The GEMM reads the intermediate from one element past its start, so its last element is
    /// read from past the buffer's end: the guard's pattern reaches the output.
    #[test]
    fn checking_mode_catches_a_read_one_element_past_a_buffer() {
        let (mut compiled, intermediate, inputs) = program();
        let sabotage = Some(Sabotage::ShiftByOneElement {
            step: 1,
            buffer: intermediate,
        });
        compiled.set_check_buffers(true);
        match run_with(&compiled, &inputs, sabotage) {
            Err(RuntimeError::BufferCheck(m)) => assert!(m.contains("output 0"), "{m}"),
            other => panic!("expected a buffer check error, got {other:?}"),
        }
    }

    /// The kernel writing the intermediate does not run: the GEMM reads memory no step wrote.
    #[test]
    fn checking_mode_catches_a_read_before_the_first_write() {
        let (mut compiled, _, inputs) = program();
        let sabotage = Some(Sabotage::Skip { step: 0 });
        // Without checking, the fault goes unnoticed (the arena holds zeros or old values).
        assert!(run_with(&compiled, &inputs, sabotage).is_ok());
        compiled.set_check_buffers(true);
        match run_with(&compiled, &inputs, sabotage) {
            Err(RuntimeError::BufferCheck(m)) => assert!(m.contains("no step"), "{m}"),
            other => panic!("expected a buffer check error, got {other:?}"),
        }
    }

    /// A step writing one element past its buffer changes the guard after it.
    #[test]
    fn checking_mode_catches_a_write_one_element_past_a_buffer() {
        let (mut compiled, intermediate, inputs) = program();
        compiled.set_check_buffers(true);
        let sabotage = Some(Sabotage::ShiftByOneElement {
            step: 0,
            buffer: intermediate,
        });
        match run_with(&compiled, &inputs, sabotage) {
            Err(RuntimeError::BufferCheck(m)) => assert!(m.contains("step 0 wrote outside"), "{m}"),
            other => panic!("expected a buffer check error, got {other:?}"),
        }
    }
}
