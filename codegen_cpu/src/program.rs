//! `compile_program`: JIT-compiles every kernel of a `Program` and returns an [`Executable`]
//! that runs the steps in order: Cranelift kernels, extern GEMM and scatter-add calls, and
//! fallback steps (one graph node run by the reference interpreter on the step's buffers).

use crate::attention::{attention, AttentionShape, Mask, MaskData};
use crate::gemm;
use crate::lower::{kernel_function, lower_kernel};
use crate::scatter::{scatter_add, View};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module};
use minductor_ir::{checked_bytes, DType, Dim};
use minductor_passes::kernel::{
    AttentionStep, BufferId, BufferKind, FallbackStep, Im2colView, Kernel, MaskKind, MatmulOperand,
    MatmulStep, Program, ScatterAddStep, Step, StridedView,
};
use minductor_passes::plan_buffers::{plan_buffers, BufferPlan};
use minductor_passes::{verify_program, VerifyError};
use minductor_runtime::{threads, Executable, RuntimeError, StepTiming, Storage, Tensor};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CodegenError {
    #[error("cranelift: {0}")]
    Cranelift(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Boxed: a verifier error is large and rare.
    #[error("the program fails verification: {0}")]
    Verify(Box<VerifyError>),
}

/// The signature of every compiled kernel (see `lower`).
type KernelFn = unsafe extern "C" fn(*const *mut u8, *const i64, i64, i64);

pub struct CompiledKernel {
    pub name: String,
    /// Cranelift IR text of the kernel, as compiled (before machine lowering).
    pub clif: String,
    function: KernelFn,
    buffers: Vec<BufferId>,
    /// Loop extents, then the symbols indices read, in `Kernel::params()` order; symbolic ones
    /// are bound at each call.
    extents: Vec<Dim>,
    /// How many of `extents` are outer loops, and how many belong to each stage after them.
    outer_loops: usize,
    stage_loops: Vec<usize>,
    /// How the first outer loop is split across threads (`CompiledProgram::autotune` may pick
    /// another than the default).
    pub split: Split,
}

/// How a kernel's first outer loop is split across threads. Every choice gives bitwise the same
/// results: each row is computed within one call, whatever the chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// One chunk per thread, when the kernel visits at least 2^15 elements (the default).
    PerThread,
    /// Always on the calling thread.
    Serial,
    /// Four chunks per thread whatever the work (finer load balance for uneven rows).
    Fine,
}

impl Split {
    /// Every split, the default first.
    pub const ALL: [Split; 3] = [Split::PerThread, Split::Serial, Split::Fine];

    pub fn name(self) -> &'static str {
        match self {
            Split::PerThread => "per_thread",
            Split::Serial => "serial",
            Split::Fine => "fine",
        }
    }

    /// The split named `name` (as [`Split::name`] spells it).
    pub fn from_name(name: &str) -> Option<Split> {
        Split::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A kernel's loop extents for one call.
struct BoundKernel {
    params: Vec<i64>,
    /// Extent of the first outer loop, the range the function is called with (1 if none).
    range: i64,
    /// Elements the kernel visits (all loop trip counts), to decide on threading.
    work: i64,
}

impl CompiledKernel {
    fn bind(&self, symbols: &Symbols) -> BoundKernel {
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
            range: if self.outer_loops > 0 { params[0] } else { 1 },
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
unsafe fn read_f32<'a>(pointers: &[*mut u8], id: BufferId, len: usize) -> &'a [f32] {
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(pointers[id.0 as usize] as *const f32, len) }
}

/// The size of every symbolic dim for one call, read off the inputs' shapes.
#[derive(Clone, Debug, Default, PartialEq)]
struct Symbols(Vec<Option<usize>>);

impl Symbols {
    fn size(&self, d: Dim) -> usize {
        match d {
            Dim::Static(n) => n,
            Dim::Sym(s) => self.0[s.0 as usize].expect("every symbol is bound by an input"),
        }
    }

    fn sizes(&self, shape: &[Dim]) -> Vec<usize> {
        shape.iter().map(|&d| self.size(d)).collect()
    }

    /// The number of elements of `program`'s buffer `id` for these sizes.
    fn elements(&self, program: &Program, id: BufferId) -> usize {
        self.sizes(&program.buffer(id).shape).iter().product()
    }

    /// A view's offset and strides for these sizes (they may be size expressions). The
    /// verifier, run for these sizes, evaluated the same expressions, so an overflow here is a
    /// size it rejected too; it is still an error, not a panic.
    fn view(&self, view: &StridedView, step: BufferId) -> Result<(i64, Vec<i64>), RuntimeError> {
        view.bind(|s| {
            self.0
                .get(s.0 as usize)
                .copied()
                .flatten()
                .map(|n| n as i128)
        })
        .ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "step writing {step}: a view's strides overflow i64 for these sizes"
            ))
        })
    }

    /// Binds the symbols from the inputs, checking every static size and that a symbol has one
    /// size across all the dims it names.
    fn bind(program: &Program, inputs: &[Tensor]) -> Result<Symbols, RuntimeError> {
        let mut symbols = Symbols(Vec::new());
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
        Ok(symbols)
    }
}

/// Kernels visiting fewer elements than this run on the calling thread.
const PARALLEL_WORK_THRESHOLD: i64 = 1 << 15;

enum CompiledStep {
    Kernel(CompiledKernel),
    /// A GEMM, and the kernel that runs on each block of its output rows (see `fuse_epilogues`).
    Matmul(Box<MatmulStep>, Option<CompiledKernel>),
    /// An extern scatter-add (`scatter::scatter_add`).
    ScatterAdd(Box<ScatterAddStep>),
    /// A fused attention (`attention::attention`).
    Attention(Box<AttentionStep>),
    /// A node the reference interpreter runs (`run_fallback`).
    Fallback(Box<FallbackStep>),
}

/// The owner of the machine code: frees it when dropped. Never used after finalisation.
///
/// cranelift-jit keeps a module's code mapped until `JITModule::free_memory` is called (dropping
/// the module leaks it), so this calls it. The code is reachable only through the function
/// pointers in the `CompiledKernel`s of the same `CompiledProgram`, which are private and never
/// copied out; a `CompiledProgram` is only called through `&self`, so no call can be running
/// when it (and with it this owner, its last field) is dropped.
struct CodeOwner(Option<JITModule>);
// SAFETY: after `finalize_definitions` the module's memory is immutable code; moving its owner to
// another thread, or sharing it, changes nothing about it. The module is never used again
// except by Drop.
unsafe impl Send for CodeOwner {}
unsafe impl Sync for CodeOwner {}

impl Drop for CodeOwner {
    fn drop(&mut self) {
        if let Some(module) = self.0.take() {
            // SAFETY: no function pointer into this module outlives it: they live only in the
            // `CompiledKernel`s of the `CompiledProgram` that owns this `CodeOwner`, which is
            // being dropped, and no call is in progress (calls borrow the program).
            unsafe { module.free_memory() };
        }
    }
}

/// One call's memory for the intermediates: an allocation laid out by the plan for some symbol
/// sizes. Calls take an arena from the program's pool and give it back, so calls from several
/// threads run at once, each in its own arena.
struct Arena {
    storage: Storage,
    /// The symbol sizes the arena is laid out for, each slot's offset for them, and the total.
    layout: Option<(Symbols, Vec<usize>, usize)>,
}

pub struct CompiledProgram {
    pub program: Program,
    /// Where each intermediate lives in the arena.
    pub plan: BufferPlan,
    steps: Vec<CompiledStep>,
    /// Arenas of finished calls, kept for the next ones (grown when a call's symbolic sizes need
    /// more); as many as calls ran at once.
    arenas: Mutex<Vec<Arena>>,
    pub compile_time: Duration,
    _code: CodeOwner,
}

fn isa() -> Result<std::sync::Arc<dyn cranelift_codegen::isa::TargetIsa>, CodegenError> {
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| {
        f.set(k, v)
            .map_err(|e| CodegenError::Cranelift(e.to_string()))
    };
    set(&mut flags, "opt_level", "speed")?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    set(&mut flags, "is_pic", "false")?;
    let isa_builder =
        cranelift_native::builder().map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    isa_builder
        .finish(settings::Flags::new(flags))
        .map_err(|e| CodegenError::Cranelift(e.to_string()))
}

/// Compiles every kernel of `program` to machine code. The program (with its plan, or the one
/// `plan_buffers` makes when it has none) must pass `verify_program` first: whatever built it,
/// compiled code then stays inside its buffers. Ranges that depend on symbolic sizes are
/// verified again at each call that brings new sizes.
pub fn compile_program(program: &Program) -> Result<CompiledProgram, CodegenError> {
    let started = Instant::now();
    let mut program = program.clone();
    if program.plan.is_none() {
        program.plan = Some(plan_buffers(&program));
    }
    verify_program(&program, &[]).map_err(|e| CodegenError::Verify(Box::new(e)))?;
    let program = &program;
    let isa = isa()?;
    let call_conv = isa.default_call_conv();
    // Owned from the start, so an error below frees whatever was compiled before it.
    let mut code = CodeOwner(Some(JITModule::new(JITBuilder::with_isa(
        isa,
        cranelift_module::default_libcall_names(),
    ))));
    let module = code.0.as_mut().expect("just created");
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut pending = Vec::new();
    let disasm = std::env::var_os("MINDUCTOR_DISASM").is_some_and(|v| v != "0");
    for kernel in program.kernels() {
        ctx.func = kernel_function(call_conv);
        ctx.set_disasm(disasm);
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            lower_kernel(&mut b, kernel, program);
            b.finalize(module.isa().frontend_config());
        }
        let clif = ctx.func.display().to_string();
        let id = module
            .declare_function(&kernel.name, Linkage::Local, &ctx.func.signature)
            .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
        module
            .define_function(id, &mut ctx)
            .map_err(|e| CodegenError::Cranelift(format!("{}: {e:?}\n{clif}", kernel.name)))?;
        let clif = match ctx.compiled_code().and_then(|c| c.vcode.as_ref()) {
            Some(machine) if disasm => format!("{clif}\n; machine code\n{machine}"),
            _ => clif,
        };
        module.clear_context(&mut ctx);
        pending.push((id, clif));
    }
    module
        .finalize_definitions()
        .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    let mut pending = pending.into_iter();
    let mut finished = |kernel: &Kernel| -> CompiledKernel {
        let (id, clif) = pending.next().expect("one function per kernel");
        let address = module.get_finalized_function(id);
        // SAFETY: `address` was compiled from `kernel_function`'s signature, which is KernelFn's.
        let function = unsafe { std::mem::transmute::<*const u8, KernelFn>(address) };
        CompiledKernel {
            name: kernel.name.clone(),
            clif,
            function,
            buffers: kernel.buffers(),
            extents: kernel.params(),
            outer_loops: kernel.outer.len(),
            stage_loops: kernel.stages.iter().map(|s| s.extent.len()).collect(),
            split: Split::PerThread,
        }
    };
    let steps = program
        .steps
        .iter()
        .map(|step| match step {
            Step::Kernel(kernel) => CompiledStep::Kernel(finished(kernel)),
            Step::Matmul(m) => {
                CompiledStep::Matmul(Box::new(m.clone()), m.epilogue.as_ref().map(&mut finished))
            }
            Step::ScatterAdd(sc) => CompiledStep::ScatterAdd(Box::new(sc.clone())),
            Step::Attention(a) => CompiledStep::Attention(Box::new(a.clone())),
            Step::Fallback(fb) => CompiledStep::Fallback(Box::new(fb.clone())),
        })
        .collect();
    let plan = program.plan.clone().expect("planned above");
    Ok(CompiledProgram {
        program: program.clone(),
        arenas: Mutex::new(Vec::new()),
        plan,
        steps,
        compile_time: started.elapsed(),
        _code: code,
    })
}

impl CompiledProgram {
    /// Max-autotune: times every kernel step under each [`Split`] on zero-filled inputs (each
    /// split over `runs` calls, keeping each step's fastest time) and keeps, per kernel step, the
    /// split that was fastest (the default on a tie). Results do not depend on the choice (see
    /// [`Split`]). Programs with symbolic sizes are left as they are (there are no sizes to
    /// time). Returns each kernel step's name and chosen split.
    pub fn autotune(&mut self, runs: usize) -> Result<Vec<(String, Split)>, RuntimeError> {
        let mut inputs = Vec::new();
        for b in &self.program.buffers {
            if let BufferKind::Input(n) = b.kind {
                let Some(shape) = b
                    .shape
                    .iter()
                    .map(|d| d.as_static())
                    .collect::<Option<Vec<_>>>()
                else {
                    return Ok(Vec::new());
                };
                if inputs.len() <= n {
                    inputs.resize(n + 1, None);
                }
                inputs[n] = Some(Tensor::try_zeros(b.dtype, &shape)?);
            }
        }
        let Some(inputs) = inputs.into_iter().collect::<Option<Vec<Tensor>>>() else {
            return Ok(Vec::new());
        };
        let kernel_steps: Vec<usize> = (0..self.steps.len())
            .filter(|&i| matches!(self.steps[i], CompiledStep::Kernel(_)))
            .collect();
        // best[i]: the fastest (time, split) of kernel step i so far.
        let mut best: Vec<Option<(Duration, Split)>> = vec![None; self.steps.len()];
        for split in Split::ALL {
            for &i in &kernel_steps {
                if let CompiledStep::Kernel(k) = &mut self.steps[i] {
                    k.split = split;
                }
            }
            let mut fastest: Vec<Option<Duration>> = vec![None; self.steps.len()];
            for _ in 0..runs.max(1) {
                let (_, timings) = self.profile(&inputs)?;
                for (slot, t) in fastest.iter_mut().zip(&timings) {
                    *slot = Some(slot.map_or(t.time, |s| s.min(t.time)));
                }
            }
            for &i in &kernel_steps {
                if let Some(time) = fastest[i] {
                    if best[i].is_none_or(|(b, _)| time < b) {
                        best[i] = Some((time, split));
                    }
                }
            }
        }
        let mut chosen = Vec::new();
        for &i in &kernel_steps {
            if let CompiledStep::Kernel(k) = &mut self.steps[i] {
                k.split = best[i].map_or(Split::PerThread, |(_, s)| s);
                chosen.push((k.name.clone(), k.split));
            }
        }
        Ok(chosen)
    }

    /// Applies splits an earlier [`CompiledProgram::autotune`] chose (kernel names and splits);
    /// `false`, changing nothing, unless they name exactly this program's kernel steps.
    pub fn set_splits(&mut self, splits: &[(String, Split)]) -> bool {
        let names: Vec<&str> = self
            .steps
            .iter()
            .filter_map(|s| match s {
                CompiledStep::Kernel(k) => Some(k.name.as_str()),
                _ => None,
            })
            .collect();
        let same = names.len() == splits.len()
            && names.iter().zip(splits).all(|(n, (m, _))| *n == m.as_str());
        if !same {
            return false;
        }
        let kernels = self.steps.iter_mut().filter_map(|s| match s {
            CompiledStep::Kernel(k) => Some(k),
            _ => None,
        });
        for (k, (_, split)) in kernels.zip(splits) {
            k.split = *split;
        }
        true
    }

    pub fn kernels(&self) -> impl Iterator<Item = &CompiledKernel> {
        self.steps.iter().filter_map(|s| match s {
            CompiledStep::Kernel(k) => Some(k),
            CompiledStep::Matmul(_, epilogue) => epilogue.as_ref(),
            CompiledStep::ScatterAdd(_)
            | CompiledStep::Attention(_)
            | CompiledStep::Fallback(_) => None,
        })
    }
}

impl Executable for CompiledProgram {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        self.run_in_pooled_arena(inputs, None, None)
    }

    fn profile(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<StepTiming>), RuntimeError> {
        let mut timings = Vec::new();
        let outputs = self.run_in_pooled_arena(inputs, Some(&mut timings), None)?;
        Ok((outputs, timings))
    }

    /// Writes every output straight into the caller's tensor: kernels store into it, no output
    /// is allocated. Each tensor is checked (`output_destination`) before any step runs.
    fn run_into(&self, inputs: &[Tensor], outputs: &mut [Tensor]) -> Result<(), RuntimeError> {
        self.run_in_pooled_arena(inputs, None, Some(outputs))
            .map(|_| ())
    }

    /// The largest pooled arena (what one call keeps), or the plan's estimate before any call.
    fn arena_bytes(&self) -> usize {
        let pool = self.arenas.lock().unwrap_or_else(|p| p.into_inner());
        pool.iter()
            .filter_map(|a| a.layout.as_ref().map(|l| l.2))
            .max()
            .unwrap_or(self.plan.arena_bytes)
    }
}

/// The pointer table, shared read-only by the threads running one step.
#[derive(Clone, Copy)]
struct SharedPointers(*const *mut u8);
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
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let lock = || self.arenas.lock().unwrap_or_else(|p| p.into_inner());
        let taken = lock().pop();
        let mut arena = taken.unwrap_or_else(|| Arena {
            storage: Storage::zeroed(0),
            layout: None,
        });
        let result = self.run_steps(&mut arena, inputs, timings, destinations);
        lock().push(arena);
        result
    }

    /// Binds every buffer to memory (inputs: the caller's, contiguous; outputs: fresh, or the
    /// caller's `destinations`; intermediates: their slots in `arena`) and runs the steps, timing
    /// each if asked. Returns the outputs (none when they were written into `destinations`).
    fn run_steps(
        &self,
        arena: &mut Arena,
        inputs: &[Tensor],
        mut timings: Option<&mut Vec<StepTiming>>,
        destinations: Option<&mut [Tensor]>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let symbols = Symbols::bind(&self.program, inputs)?;
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
                arena.storage = Storage::try_zeroed(total)?;
            }
            arena.layout = Some((symbols.clone(), offsets, total));
        }
        let program = &self.program;
        let slot_offsets = &arena.layout.as_ref().expect("laid out above").1;
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
                    // Dtype and sizes were checked by `Symbols::bind`.
                    let t = t.contiguous();
                    // Kernels only ever read inputs (fuse never stores to an input buffer), so
                    // this pointer to storage the caller may share is never written through.
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
                    let mut t = Tensor::for_overwrite(b.dtype, &symbols.sizes(&b.shape))?;
                    pointers[index] = t.data_mut_ptr().expect("a fresh tensor is uniquely owned");
                    held[index] = Some(t);
                }
                BufferKind::Intermediate => {
                    // An intermediate no step touches (its stores were fused away) has no slot.
                    let Some(slot) = self.plan.slot_of[index] else {
                        continue;
                    };
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
                check_indices(&pointers, program, &symbols, check.buffer, check.bound)?;
            }
            let started = timings.is_some().then(Instant::now);
            match step {
                CompiledStep::Kernel(k) => run_kernel(k, &symbols, &pointers, &mut table),
                CompiledStep::Matmul(m, epilogue) => {
                    run_matmul(m, epilogue.as_ref(), program, &symbols, &pointers)?
                }
                CompiledStep::ScatterAdd(sc) => run_scatter_add(sc, program, &symbols, &pointers)?,
                CompiledStep::Attention(a) => run_attention(a, program, &symbols, &pointers)?,
                CompiledStep::Fallback(fb) => run_fallback(fb, program, &symbols, &pointers)?,
            }
            if let (Some(timings), Some(started)) = (timings.as_deref_mut(), started) {
                timings.push(StepTiming {
                    name: match step {
                        CompiledStep::Kernel(k) => k.name.clone(),
                        CompiledStep::Matmul(m, None) => format!("matmul_{}", m.out),
                        CompiledStep::Matmul(m, Some(e)) => format!("matmul_{}+{}", m.out, e.name),
                        CompiledStep::ScatterAdd(sc) => format!("scatter_add_{}", sc.out),
                        CompiledStep::Attention(a) => format!("attention_{}", a.out),
                        CompiledStep::Fallback(fb) => {
                            format!("fallback_{}_{}", fb.op.name(), fb.out)
                        }
                    },
                    time: started.elapsed(),
                });
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
            .map(|id| {
                held[id.0 as usize]
                    .clone()
                    .expect("output buffers are allocated")
            })
            .collect())
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

/// Runs a scatter-add step on its buffers.
fn run_attention(
    a: &AttentionStep,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let numel = |id: BufferId| symbols.elements(program, id);
    // SAFETY: each pointer is the start of a live buffer holding its planned number of f32
    // elements for this call's sizes (`run_steps`; `verify_program` checked that all four are
    // f32 buffers). The output is written by this step alone and overlaps no operand: the
    // verifier rejects an attention reading its own output, `plan_buffers` never places an
    // attention's output in place of a buffer it reads, and live buffers' slots are disjoint.
    // Every index the routine reads is checked against these slices.
    let mask = match &a.mask {
        None => None,
        Some(m) => {
            let (offset, strides) = symbols.view(m, a.out)?;
            let n = numel(m.buffer);
            // SAFETY: as for q, k and v below (a buffer the step only reads; `verify_program`
            // checked that it is f32 for an additive mask, else bool: one byte an element).
            let data = unsafe {
                match a.mask_kind {
                    MaskKind::Add => MaskData::F32(read_f32(pointers, m.buffer, n)),
                    MaskKind::Keep | MaskKind::Drop => MaskData::Bool(std::slice::from_raw_parts(
                        pointers[m.buffer.0 as usize] as *const u8,
                        n,
                    )),
                }
            };
            Some((data, offset, strides))
        }
    };
    let (q, k, v, out) = unsafe {
        let read = |id: BufferId| read_f32(pointers, id, numel(id));
        (
            read(a.q.buffer),
            read(a.k.buffer),
            read(a.v.buffer),
            std::slice::from_raw_parts_mut(pointers[a.out.0 as usize] as *mut f32, numel(a.out)),
        )
    };
    let (q_offset, q_strides) = symbols.view(&a.q, a.out)?;
    let (k_offset, k_strides) = symbols.view(&a.k, a.out)?;
    let (v_offset, v_strides) = symbols.view(&a.v, a.out)?;
    let q_shape = symbols.sizes(&a.q.shape);
    let k_shape = symbols.sizes(&a.k.shape);
    let v_shape = symbols.sizes(&a.v.shape);
    let rank = q_shape.len();
    if rank < 2 || k_shape.len() != rank || v_shape.len() != rank {
        return Err(RuntimeError::Unsupported(format!(
            "attention into {}: operands of ranks {}, {}, {}",
            a.out,
            rank,
            k_shape.len(),
            v_shape.len()
        )));
    }
    let shape = AttentionShape {
        batch: &q_shape[..rank - 2],
        t: q_shape[rank - 2],
        s: k_shape[rank - 2],
        e: q_shape[rank - 1],
        ev: v_shape[rank - 1],
        group: a.group,
        scale: a.scale,
        causal: a.causal,
    };
    let mask = match &mask {
        Some((data, offset, strides)) => Some(Mask::new(a.mask_kind, *data, *offset, strides)?),
        None => None,
    };
    let view = |data, offset, strides| View {
        data,
        offset,
        strides,
    };
    attention(
        view(q, q_offset, &q_strides),
        view(k, k_offset, &k_strides),
        view(v, v_offset, &v_strides),
        mask,
        &shape,
        out,
    )
}

fn run_scatter_add(
    sc: &ScatterAddStep,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let numel = |id: BufferId| symbols.elements(program, id);
    let (index_len, src_len, out_len) =
        (numel(sc.index.buffer), numel(sc.src.buffer), numel(sc.out));
    // SAFETY: each pointer is the start of a live buffer holding its planned number of elements
    // of its dtype for this call's sizes (`run_steps`): i64 indices, f32 source and output
    // (`fuse` only emits f32 scatter-adds). The output is written by this step alone and does
    // not overlap either operand: `plan_buffers` never places a scatter-add's output in place of
    // a buffer it reads, and live buffers' slots are disjoint.
    let (index, src, out) = unsafe {
        (
            std::slice::from_raw_parts(
                pointers[sc.index.buffer.0 as usize] as *const i64,
                index_len,
            ),
            read_f32(pointers, sc.src.buffer, src_len),
            std::slice::from_raw_parts_mut(pointers[sc.out.0 as usize] as *mut f32, out_len),
        )
    };
    let shape = symbols.sizes(&sc.src.shape);
    let out_shape = symbols.sizes(&program.buffer(sc.out).shape);
    let (index_offset, index_strides) = symbols.view(&sc.index, sc.out)?;
    let (src_offset, src_strides) = symbols.view(&sc.src, sc.out)?;
    scatter_add(
        View {
            data: index,
            offset: index_offset,
            strides: &index_strides,
        },
        View {
            data: src,
            offset: src_offset,
            strides: &src_strides,
        },
        &shape,
        out,
        &out_shape,
        sc.dim,
    )
}

/// Every i64 in `buffer` must lie in `0..bound` (embedding indices read from memory).
fn check_indices(
    pointers: &[*mut u8],
    program: &Program,
    symbols: &Symbols,
    buffer: BufferId,
    bound: i64,
) -> Result<(), RuntimeError> {
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

/// Runs kernel `k` over outer rows `start..end`, split across threads when worth it.
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
    let (range, bound) = (bound.range, &bound);
    let threads = threads::num_threads() as i64;
    let chunks = match k.split {
        Split::PerThread if bound.work >= PARALLEL_WORK_THRESHOLD => threads,
        Split::PerThread | Split::Serial => 1,
        Split::Fine => 4 * threads,
    };
    if threads > 1 && range > 1 && chunks > 1 {
        let chunks = chunks.min(range);
        threads::for_each_chunk(chunks as usize, |c| {
            let c = c as i64;
            call_kernel(
                k,
                bound,
                shared,
                range * c / chunks,
                range * (c + 1) / chunks,
            );
        });
    } else {
        call_kernel(k, bound, shared, 0, range);
    }
}

/// Calls the compiled function of `k` on outer rows `start..end`.
fn call_kernel(
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
    // symbol values `bound` was made from), and `start..end` lies within the
    // first outer loop. Threads get disjoint row ranges: a kernel's store index is the row-major
    // index of its own iteration domain, so disjoint rows write disjoint elements, and a kernel
    // reads no buffer it writes except in place at the very element it writes (`plan_buffers`).
    // Each element's value, reductions included, is computed within one call, so results do not
    // depend on the thread count.
    unsafe { (k.function)(table.0, bound.params.as_ptr(), start, end) };
}

/// Output units (rows, or indices of the first batch dim) per tile: one tile's GEMM output and
/// its epilogue stay in cache together.
const TILE_BYTES: usize = 256 << 10;
/// GEMMs with fewer flops run on the calling thread.
const PARALLEL_FLOPS_THRESHOLD: usize = 1 << 22;

/// Runs `out = a @ b` with our GEMM (`crate::gemm`) tile by tile over the output's first dim,
/// each tile followed by the epilogue on the same rows; tiles are split across threads. `b` is
/// packed once per product, block by block as the first tile to need each block gets to it,
/// and shared by every tile and thread (each thread starts at its own panels). A 2-D product
/// with too few rows for every thread splits its columns instead, and runs the epilogue after
/// all of them.
fn run_matmul(
    m: &MatmulStep,
    epilogue: Option<&CompiledKernel>,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let b_view_of_step = match &m.b {
        MatmulOperand::View(view) => view,
        MatmulOperand::Im2col(view) => {
            return run_implicit_matmul(m, view, epilogue, program, symbols, pointers)
        }
    };
    let (a_shape, b_shape) = (
        symbols.sizes(&m.a.shape),
        symbols.sizes(&b_view_of_step.shape),
    );
    let batch = a_shape.len() - 2;
    let (rows, k, cols) = (a_shape[batch], a_shape[batch + 1], b_shape[batch + 1]);
    let (a_offset, a_strides) = symbols.view(&m.a, m.out)?;
    let (b_offset, b_strides) = symbols.view(b_view_of_step, m.out)?;
    debug_assert!(program.buffer(m.out).dtype == DType::F32);
    let numel = |id: BufferId| symbols.elements(program, id);
    let count: usize = a_shape[..batch].iter().product();
    // SAFETY: each pointer is the start of a live buffer holding its planned number of f32s for
    // this call's sizes (`run_steps`; `fuse` only emits f32 GEMMs). The operands are only read
    // during this step. The output is written only through the tiles below, each made from
    // `c` for rows no other thread touches, and overlaps neither operand: `plan_buffers` never
    // places a GEMM's output in place of a buffer the GEMM reads, and live slots are disjoint.
    let (a_data, b_data) = unsafe {
        (
            read_f32(pointers, m.a.buffer, numel(m.a.buffer)),
            read_f32(
                pointers,
                b_view_of_step.buffer,
                numel(b_view_of_step.buffer),
            ),
        )
    };
    let c = SendPtr(pointers[m.out.0 as usize]);
    assert!(
        numel(m.out) == count * rows * cols,
        "a GEMM's output holds its product"
    );
    let a_view = |offset: i64| {
        gemm::MatrixRef::new(
            a_data,
            offset,
            [rows, k],
            [a_strides[batch], a_strides[batch + 1]],
            "a",
        )
    };
    let b_view = |offset: i64| {
        gemm::MatrixRef::new(
            b_data,
            offset,
            [k, cols],
            [b_strides[batch], b_strides[batch + 1]],
            "b",
        )
    };
    // Output rows `start..end` of batch matrix `index`, as the unique borrow of those values.
    let c_rows = |index: usize, start: usize, end: usize| {
        let first = index * rows * cols + start * cols;
        // SAFETY: `first + (end - start)·cols ≤ count·rows·cols`, the output's length (asserted
        // above); callers ask for disjoint rows on different threads and drop each tile before
        // its epilogue runs.
        let values = unsafe {
            std::slice::from_raw_parts_mut((c.get() as *mut f32).add(first), (end - start) * cols)
        };
        gemm::MatrixMut::row_major(values, end - start, cols)
    };
    let gemm_error =
        |e: gemm::GemmError| RuntimeError::Unsupported(format!("matmul {}: {e}", m.out));

    let units = a_shape[0];
    let unit_bytes = count * rows * cols * std::mem::size_of::<f32>() / units.max(1);
    // Saturating: only decides whether to split the GEMM across threads.
    let flops = [count, rows, k, cols]
        .iter()
        .fold(2usize, |acc, &n| acc.saturating_mul(n));
    // At least 128 rows of a 2-D product: every tile streams all of packed `b` once, which costs
    // more than keeping the tile's output in L2 for the epilogue saves (measured on the MLP).
    let min_tile = if batch == 0 { 128 } else { 1 };
    let tile = (TILE_BYTES / unit_bytes.max(1))
        .max(min_tile)
        .min(units.max(1));
    let mut table = Vec::new();
    if let Some(e) = epilogue {
        table.extend(e.buffers.iter().map(|id| pointers[id.0 as usize]));
    }
    let epilogue = epilogue.map(|e| (e, e.bind(symbols)));
    let shared = SharedPointers(table.as_ptr());
    let threads = threads::num_threads();
    let parallel = threads > 1 && flops >= PARALLEL_FLOPS_THRESHOLD;
    let kernel = gemm::Kernel::detect();
    let gemm_threads = if parallel { threads } else { 1 };
    // The epilogue over every row at once, split across the threads (after a product whose
    // threads split columns).
    let epilogue_on_all_rows = || {
        if let Some((epilogue, bound)) = &epilogue {
            let chunks = threads.min(bound.range.max(1) as usize) as i64;
            threads::for_each_chunk(chunks as usize, |ch| {
                let ch = ch as i64;
                let (s, e) = (bound.range * ch / chunks, bound.range * (ch + 1) / chunks);
                call_kernel(epilogue, bound, shared, s, e);
            });
        }
    };

    // A batch of products sharing one `b` (a linear layer over a batch of sequences) whose `a`
    // matrices follow one another at the same row stride is one product of `count · rows`
    // rows: streamed, each block of `b` is packed once for all of them (the batched path below
    // packs all of `b` once per thread) and the threads split its columns.
    let row_stride = a_strides[batch];
    let stacked = batch > 0
        && (0..batch).all(|d| {
            let below = a_shape[d + 1..batch].iter().product::<usize>() * rows;
            (b_strides[d] == 0 || b_shape[d] == 1)
                && (a_shape[d] == 1 || a_strides[d] == row_stride * below as i64)
        });
    if stacked && gemm::prefers_streaming(kernel, count * rows, cols, gemm_threads) {
        let a = gemm::MatrixRef::new(
            a_data,
            a_offset,
            [count * rows, k],
            [row_stride, a_strides[batch + 1]],
            "a",
        )
        .map_err(gemm_error)?;
        let b = b_view(b_offset).map_err(gemm_error)?;
        {
            // The output's unique borrow ends here, before the epilogue reads its rows.
            let mut out = c_rows(0, 0, count * rows).map_err(gemm_error)?;
            gemm::multiply_streaming(kernel, &a, &b, &mut out, gemm_threads).map_err(gemm_error)?;
        }
        epilogue_on_all_rows();
        return Ok(());
    }

    if batch == 0 {
        let a = a_view(a_offset).map_err(gemm_error)?;
        let b = b_view(b_offset).map_err(gemm_error)?;
        let streaming = gemm::prefers_streaming(kernel, rows, cols, gemm_threads);
        // Packed as the tiles need it, once, by whichever thread gets to each block first
        // (unless streamed: then each block is packed into L1 right before its use).
        let packed = if streaming {
            None
        } else {
            Some(gemm::PackedB::lazy(&b, kernel).map_err(gemm_error)?)
        };
        let panels = cols.div_ceil(kernel.nr());
        if streaming || (parallel && rows < threads * 4 * kernel.mr()) {
            // Few rows: every thread takes a run of columns, then the epilogue runs on whole
            // rows.
            {
                // The tile's unique borrow ends here, before the epilogue reads its rows.
                let mut out = c_rows(0, 0, rows).map_err(gemm_error)?;
                match &packed {
                    None => gemm::multiply_streaming(kernel, &a, &b, &mut out, gemm_threads),
                    Some(packed) => gemm::multiply_parallel(&a, packed, &mut out, threads),
                }
                .map_err(gemm_error)?;
            }
            epilogue_on_all_rows();
            return Ok(());
        }
        let packed = packed.expect("packed unless streamed");
        let run_rows = |start: usize, end: usize, first_panel: usize| {
            let mut s = start;
            while s < end {
                let e = (s + tile).min(end);
                {
                    // The tile's unique borrow ends before its epilogue reads the rows.
                    let mut out = c_rows(0, s, e).expect("rows inside the output");
                    gemm::multiply_from(&a.rows(s, e), &packed, &mut out, first_panel)
                        .expect("shapes agree");
                }
                if let Some((epilogue, bound)) = &epilogue {
                    call_kernel(epilogue, bound, shared, s as i64, e as i64);
                }
                s = e;
            }
        };
        if parallel && rows > 1 {
            let chunks = threads.min(rows);
            threads::for_each_chunk(chunks, |ch| {
                run_rows(
                    rows * ch / chunks,
                    rows * (ch + 1) / chunks,
                    panels * ch / chunks,
                )
            });
        } else {
            run_rows(0, rows, 0);
        }
        return Ok(());
    }

    // Batched: each unit of the first batch dim holds `inner` matrices; each is packed and
    // multiplied on one thread (`b` is packed once and reused while consecutive matrices share
    // it, as a broadcast operand does).
    let inner: usize = a_shape[1..batch].iter().product();
    let failure: Mutex<Option<RuntimeError>> = Mutex::new(None);
    let run_units = |start: usize, end: usize| -> Result<(), RuntimeError> {
        let mut packed: Option<(i64, gemm::PackedB)> = None;
        let mut s = start;
        while s < end {
            let e = (s + tile).min(end);
            for n in s * inner..e * inner {
                // Decompose the flat batch index into per-dim offsets.
                let (mut rest, mut a_off, mut b_off) = (n, a_offset, b_offset);
                for d in (0..batch).rev() {
                    let i = (rest % a_shape[d]) as i64;
                    rest /= a_shape[d];
                    a_off += i * a_strides[d];
                    b_off += i * b_strides[d];
                }
                if packed.as_ref().is_none_or(|(at, _)| *at != b_off) {
                    // Return the old buffer to the pool before taking one.
                    drop(packed.take());
                    let b = b_view(b_off).map_err(gemm_error)?;
                    packed = Some((b_off, gemm::PackedB::lazy(&b, kernel).map_err(gemm_error)?));
                }
                let (_, b) = packed.as_ref().expect("packed above");
                let mut out = c_rows(n, 0, rows).map_err(gemm_error)?;
                gemm::multiply(&a_view(a_off).map_err(gemm_error)?, b, &mut out)
                    .map_err(gemm_error)?;
            }
            if let Some((epilogue, bound)) = &epilogue {
                call_kernel(epilogue, bound, shared, s as i64, e as i64);
            }
            s = e;
        }
        Ok(())
    };
    let run_units = |start: usize, end: usize| {
        if let Err(e) = run_units(start, end) {
            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    };
    if parallel && units > 1 {
        let chunks = threads.min(units);
        threads::for_each_chunk(chunks, |ch| {
            run_units(units * ch / chunks, units * (ch + 1) / chunks)
        });
    } else {
        run_units(0, units);
    }
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Runs `out = a @ im2col(x)` (a convolution, `b` an [`Im2colView`]) with the implicit GEMM
/// (`gemm::multiply_im2col`): the output's first dim (images) is split across threads, each
/// image's channel groups run one after the other on its thread, and the epilogue follows each
/// tile of images. `a` (the weight) is packed once per group and call.
fn run_implicit_matmul(
    m: &MatmulStep,
    b: &Im2colView,
    epilogue: Option<&CompiledKernel>,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let a_shape = symbols.sizes(&m.a.shape);
    let b_shape = symbols.sizes(&b.shape);
    let source_shape = symbols.sizes(&program.buffer(b.source).shape);
    let numel = |id: BufferId| symbols.elements(program, id);
    let gemm_error =
        |e: gemm::GemmError| RuntimeError::Unsupported(format!("matmul {}: {e}", m.out));
    let (&[images, groups, k, cols], &[_, channels, h, w]) = (&b_shape[..], &source_shape[..])
    else {
        return Err(RuntimeError::Unsupported(format!(
            "matmul {}: an im2col operand {b_shape:?} of a source {source_shape:?}",
            m.out
        )));
    };
    let rows = a_shape[2];
    let group_channels = channels / groups.max(1);
    let (a_offset, a_strides) = symbols.view(&m.a, m.out)?;
    // SAFETY: each pointer is the start of a live buffer holding its planned number of f32s for
    // this call's sizes (`run_steps`; `fuse` only emits f32 GEMMs). The operands are only read
    // during this step; the output is written only through the per-matrix borrows below, each
    // on one thread, and overlaps neither operand (`plan_buffers` never places a GEMM's output
    // in place of a buffer it reads; live slots are disjoint).
    let (a_data, x_data) = unsafe {
        (
            read_f32(pointers, m.a.buffer, numel(m.a.buffer)),
            read_f32(pointers, b.source, numel(b.source)),
        )
    };
    let c = SendPtr(pointers[m.out.0 as usize]);
    let matrix = rows * cols;
    assert!(
        numel(m.out) == images * groups * matrix,
        "a GEMM's output holds its product"
    );
    let kernel = gemm::Kernel::detect();
    // The weight of each group, packed once and shared by every image and thread.
    let packed: Vec<gemm::PackedA> = (0..groups)
        .map(|g| {
            let offset = a_offset + g as i64 * a_strides[1];
            let a =
                gemm::MatrixRef::new(a_data, offset, [rows, k], [a_strides[2], a_strides[3]], "a")?;
            gemm::PackedA::pack(&a, kernel)
        })
        .collect::<Result<_, _>>()
        .map_err(gemm_error)?;
    let mut table = Vec::new();
    if let Some(e) = epilogue {
        table.extend(e.buffers.iter().map(|id| pointers[id.0 as usize]));
    }
    let epilogue = epilogue.map(|e| (e, e.bind(symbols)));
    let shared = SharedPointers(table.as_ptr());
    let unit_bytes = groups * matrix * std::mem::size_of::<f32>();
    let tile = (TILE_BYTES / unit_bytes.max(1)).clamp(1, images.max(1));
    let run_images = |start: usize, end: usize| -> Result<(), RuntimeError> {
        let mut s = start;
        while s < end {
            let e = (s + tile).min(end);
            for image in s..e {
                for (g, a) in packed.iter().enumerate() {
                    let plane_offset = (image * channels + g * group_channels) * h * w;
                    let x = gemm::Im2colRef::new(
                        x_data,
                        plane_offset,
                        group_channels,
                        [h, w],
                        b.window,
                    )
                    .map_err(gemm_error)?;
                    let first = (image * groups + g) * matrix;
                    // SAFETY: `first + matrix ≤ images·groups·matrix`, the output's length
                    // (asserted above); each (image, group) matrix is borrowed by one thread
                    // only, and the borrow ends before the epilogue reads the rows.
                    let values = unsafe {
                        std::slice::from_raw_parts_mut((c.get() as *mut f32).add(first), matrix)
                    };
                    let mut out =
                        gemm::MatrixMut::row_major(values, rows, cols).map_err(gemm_error)?;
                    gemm::multiply_im2col(a, &x, &mut out).map_err(gemm_error)?;
                }
            }
            if let Some((epilogue, bound)) = &epilogue {
                call_kernel(epilogue, bound, shared, s as i64, e as i64);
            }
            s = e;
        }
        Ok(())
    };
    let failure: Mutex<Option<RuntimeError>> = Mutex::new(None);
    let run_images = |start: usize, end: usize| {
        if let Err(e) = run_images(start, end) {
            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    };
    let flops = [images, groups, rows, k, cols]
        .iter()
        .fold(2usize, |acc, &n| acc.saturating_mul(n));
    let threads = threads::num_threads();
    if threads > 1 && flops >= PARALLEL_FLOPS_THRESHOLD && images > 1 {
        let chunks = threads.min(images);
        threads::for_each_chunk(chunks, |ch| {
            run_images(images * ch / chunks, images * (ch + 1) / chunks)
        });
    } else {
        run_images(0, images);
    }
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The output pointer handed to the GEMM threads.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: the buffers outlive the step; threads write disjoint rows of the output (see
// `run_matmul`) and only read the operands.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// A method, so closures capture the whole `Send + Sync` wrapper rather than its field.
    fn get(self) -> *mut u8 {
        self.0
    }
}
