//! `compile_program`: JIT-compiles every kernel of a `Program` and returns a
//! [`CompiledProgram`], an [`Executable`](minductor_runtime::Executable) that runs the steps in
//! order: Cranelift kernels, extern GEMM, attention and scatter-add calls, and fallback steps
//! (one graph node run by the reference interpreter on the step's buffers).
//!
//! This file compiles; a call runs in [`execute`] (binding sizes and buffers, arenas, kernel
//! dispatch over threads, fallbacks) and, for the steps that call ahead-of-time code rather than
//! JIT kernels, in [`extern_steps`].

mod execute;
mod extern_steps;

use execute::Arena;
use extern_steps::Prepacked;

use crate::lower::{kernel_function, lower_kernel};
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, ModuleReloc};
use minductor_ir::Dim;
use minductor_kernel_ir::{verify_program, BufferPlan, VerifyError};
use minductor_kernel_ir::{
    AttentionStep, BufferId, BufferKind, FallbackStep, Kernel, MatmulStep, Program, ScatterAddStep,
    Step,
};
use minductor_kernels::attention::AttentionTiling;
use minductor_runtime::{Executable, RuntimeError, Tensor};
use rayon::prelude::*;
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
    #[error("the program has no buffer plan (run `plan_buffers` before code generation)")]
    Unplanned,
}

/// The signature of every compiled kernel (see `lower`).
type KernelFn = unsafe extern "C" fn(*const *mut u8, *const i64, i64, i64);

pub struct CompiledKernel {
    pub name: String,
    /// Cranelift IR text of the kernel, as compiled (before machine lowering).
    pub clif: String,
    /// A hash of the kernel's machine code bytes (FNV-1a): equal for equal code, so tests can
    /// check that a compile on any number of threads makes the same code.
    pub code_hash: u64,
    function: KernelFn,
    buffers: Vec<BufferId>,
    /// Loop extents, then the symbols indices read, in `Kernel::params()` order; symbolic ones
    /// are bound at each call.
    extents: Vec<Dim>,
    /// How many of `extents` are outer loops, and how many belong to each stage after them.
    outer_loops: usize,
    /// How many leading outer loops the function's range covers, flattened (see `lower_kernel`).
    split_loops: usize,
    stage_loops: Vec<usize>,
    /// How the first outer loop is split across threads (`CompiledProgram::autotune` may pick
    /// another than the default).
    pub split: Split,
}

/// How a kernel's first outer loop is split across threads. Every choice gives bitwise the same
/// results: each row is computed within one call, whatever the chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// Four chunks per thread (each thread runs its own first, then takes what is left of the
    /// others'), each visiting at least 2^14 elements (fewer chunks for less work, down to one;
    /// the default; see `execute::kernel_pieces`). The name is kept from when it was one chunk
    /// per thread: artifacts and the compile cache store it.
    PerThread,
    /// Always on the calling thread.
    Serial,
    /// Four chunks per thread whatever the work (finer load balance for uneven rows).
    Fine,
    /// A GEMM step's plan, as max-autotune timed it (a kernel step takes it as `PerThread`).
    Gemm(GemmChoice),
    /// An attention step's tiling, as max-autotune timed it (a kernel step takes it as
    /// `PerThread`).
    Attention(AttentionChoice),
}

/// A GEMM's plan at one thread count: streamed (each block of `b` packed per thread right
/// before use) or packed once and cut into `row_groups × panel_groups` pieces. Every plan sums
/// the same products in the same order (the same bits; see `gemm::multiply_streaming`); only
/// the speed differs, so max-autotune times a few and keeps the fastest. At another thread
/// count than `threads` the default plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmChoice {
    pub threads: usize,
    pub streams: bool,
    /// The cut of a packed product (ignored when it streams, whose cut is its own).
    pub row_groups: usize,
    pub panel_groups: usize,
}

impl GemmChoice {
    /// The plans max-autotune times on `threads` threads besides the default: streamed, and
    /// packed with the rows, the panels, or (from 4 threads) both cut.
    pub fn candidates(threads: usize) -> Vec<GemmChoice> {
        let t = threads.max(1);
        let packed = |row_groups, panel_groups| GemmChoice {
            threads: t,
            streams: false,
            row_groups,
            panel_groups,
        };
        let mut out = vec![
            GemmChoice {
                streams: true,
                ..packed(1, 1)
            },
            packed(t, 1),
        ];
        if t > 1 {
            out.push(packed(1, t));
        }
        if t >= 4 {
            out.push(packed(2, t / 2));
            out.push(packed(t / 2, 2));
        }
        out
    }
}

/// An attention step's tiling at one thread count: query rows per block and work items per
/// thread (`minductor_kernels::attention::AttentionTiling`). Every tiling computes each output
/// row by the same operations in the same order (the same bits; the key block, which would
/// change the online softmax's rescaling order, is not a choice); only the speed differs, so
/// max-autotune times a few and keeps the fastest. At another thread count than `threads` the
/// default tiling runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionChoice {
    pub threads: usize,
    /// Query rows per block: a multiple of 4 from 4 to 4096.
    pub query_block: usize,
    /// Work items per thread the split aims for: 1 to 64.
    pub items_per_thread: usize,
}

impl AttentionChoice {
    /// The tilings max-autotune times on `threads` threads besides the default: blocks of 32,
    /// 64 and 128 rows, each with 2, 4 and 8 items a thread.
    pub fn candidates(threads: usize) -> Vec<AttentionChoice> {
        AttentionTiling::candidates()
            .into_iter()
            .filter(|&t| t != AttentionTiling::DEFAULT)
            .map(|t| AttentionChoice {
                threads: threads.max(1),
                query_block: t.query_block,
                items_per_thread: t.items_per_thread,
            })
            .collect()
    }

    /// The library's tiling (`None` when a field is out of its range).
    pub(crate) fn tiling(self) -> Option<AttentionTiling> {
        AttentionTiling::new(self.query_block, self.items_per_thread)
    }
}

impl Split {
    /// Every split, the default first.
    pub const ALL: [Split; 3] = [Split::PerThread, Split::Serial, Split::Fine];

    /// The plans max-autotune times for an attention step on `threads` threads: its default
    /// tiling (`PerThread`) first, then every [`AttentionChoice`] candidate.
    pub fn attention_plans(threads: usize) -> Vec<Split> {
        std::iter::once(Split::PerThread)
            .chain(
                AttentionChoice::candidates(threads)
                    .into_iter()
                    .map(Split::Attention),
            )
            .collect()
    }

    /// The split's name: `per_thread`, `serial`, `fine`, for a GEMM plan `gemm-t2-stream` /
    /// `gemm-t2-2x1` (threads, then streamed or the packed cut), for an attention tiling
    /// `attention-t2-rows32-items8` (threads, query rows per block, items per thread).
    pub fn name(self) -> String {
        match self {
            Split::PerThread => "per_thread".into(),
            Split::Serial => "serial".into(),
            Split::Fine => "fine".into(),
            Split::Gemm(g) if g.streams => format!("gemm-t{}-stream", g.threads),
            Split::Gemm(g) => format!("gemm-t{}-{}x{}", g.threads, g.row_groups, g.panel_groups),
            Split::Attention(a) => format!(
                "attention-t{}-rows{}-items{}",
                a.threads, a.query_block, a.items_per_thread
            ),
        }
    }

    /// The split named `name` (as [`Split::name`] spells it).
    pub fn from_name(name: &str) -> Option<Split> {
        if let Some(rest) = name.strip_prefix("attention-t") {
            let (threads, rest) = rest.split_once("-rows")?;
            let (query_block, items_per_thread) = rest.split_once("-items")?;
            let choice = AttentionChoice {
                threads: threads.parse().ok()?,
                query_block: query_block.parse().ok()?,
                items_per_thread: items_per_thread.parse().ok()?,
            };
            if choice.threads == 0 || choice.tiling().is_none() {
                return None;
            }
            return Some(Split::Attention(choice));
        }
        if let Some(rest) = name.strip_prefix("gemm-t") {
            let (threads, plan) = rest.split_once('-')?;
            let threads: usize = threads.parse().ok()?;
            let (streams, row_groups, panel_groups) = match plan {
                "stream" => (true, 1, 1),
                cut => {
                    let (r, p) = cut.split_once('x')?;
                    (false, r.parse().ok()?, p.parse().ok()?)
                }
            };
            if threads == 0 || row_groups == 0 || panel_groups == 0 {
                return None;
            }
            return Some(Split::Gemm(GemmChoice {
                threads,
                streams,
                row_groups,
                panel_groups,
            }));
        }
        Split::ALL.into_iter().find(|s| s.name() == name)
    }
}

enum CompiledStep {
    Kernel(CompiledKernel),
    /// A GEMM, the kernel that runs on each block of its output rows (see `fuse_epilogues`),
    /// and its weight operand packed once if a frozen constant feeds it (`prepare_constants`).
    Matmul {
        step: Box<MatmulStep>,
        epilogue: Option<CompiledKernel>,
        prepacked: Option<Box<Prepacked>>,
        /// The plan max-autotune chose (`PerThread`: the default plan).
        split: Split,
    },
    /// An extern scatter-add (`scatter::scatter_add`).
    ScatterAdd(Box<ScatterAddStep>),
    /// A fused attention (`attention::attention`).
    Attention {
        step: Box<AttentionStep>,
        /// The tiling max-autotune chose (`PerThread`: the default tiling).
        split: Split,
    },
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

/// The pool of arenas, aligned to (and so alone on) a pair of cache lines (an adjacent-line
/// prefetcher fetches lines in pairs).
#[repr(align(128))]
struct ArenaPool(Mutex<Vec<Arena>>);

pub struct CompiledProgram {
    pub program: Program,
    /// Where each intermediate lives in the arena.
    pub plan: BufferPlan,
    steps: Vec<CompiledStep>,
    /// Arenas of finished calls, kept for the next ones (grown when a call's symbolic sizes need
    /// more); as many as calls ran at once. On cache lines of its own: each call writes the
    /// lock twice, and the fields every call reads must not share its line.
    arenas: ArenaPool,
    /// The program's derived dims (`s0 + 1`), each once: a call checks that every one has a
    /// size (is not negative) for its inputs before any step runs.
    derived_dims: Vec<Dim>,
    /// Checking mode (`MINDUCTOR_CHECK_BUFFERS=1` when compiled, or
    /// [`CompiledProgram::set_check_buffers`]): intermediates live in a fresh arena filled with
    /// a signalling-NaN pattern and fenced by guard bytes, checked after every step, and f32
    /// outputs are checked for the pattern after the call (`execute.rs: CheckedArena`).
    check_buffers: bool,
    /// Whether some step is large enough to split across threads (see [`splits_across_threads`];
    /// `None`: it depends on the sizes of a call): if not, a call never runs as a team.
    splits: Option<bool>,
    /// Whether a call runs as a team, for recent (input shapes, thread count) pairs, by hash
    /// (see `execute.rs: CompiledProgram::runs_as_team`).
    team_choices: std::sync::Mutex<Vec<(u64, bool)>>,
    pub compile_time: Duration,
    _code: CodeOwner,
}

/// Whether some step of `program` splits across threads: a kernel visiting, or an extern step
/// producing (a GEMM: times its depth; an attention: times its keys), at least two pieces'
/// worth of elements
/// (`execute::MIN_PIECE_WORK`); `None` when that depends on sizes only known at a call.
fn splits_across_threads(program: &Program) -> Option<bool> {
    let least = 2 * execute::MIN_PIECE_WORK as usize;
    let product = |dims: &[Dim]| -> Option<usize> {
        dims.iter()
            .try_fold(1usize, |acc, d| acc.checked_mul(d.as_static()?))
    };
    let numel = |b: BufferId| product(&program.buffer(b).shape);
    let mut symbolic = false;
    let large = program.steps.iter().any(|step| {
        let work = match step {
            Step::Kernel(k) => k.stages.iter().try_fold(0usize, |acc, s| {
                let trips = product(&k.outer)?.checked_mul(product(&s.extent)?)?;
                acc.checked_add(trips)
            }),
            Step::Matmul(m) => {
                m.a.shape
                    .last()
                    .and_then(|k| k.as_static())
                    .and_then(|k| numel(m.out)?.checked_mul(k.max(1)))
            }
            // Its output times the keys each row reads (a decoder's one query row reads
            // them all).
            Step::Attention(a) => {
                let keys = a.k.shape.iter().rev().nth(1).and_then(|d| d.as_static());
                product(&a.out.shape).and_then(|n| n.checked_mul(keys?.max(1)))
            }
            Step::ScatterAdd(_) | Step::Fallback(_) => Some(0),
        };
        symbolic |= work.is_none();
        work.is_some_and(|w| w >= least)
    });
    if large {
        Some(true)
    } else if symbolic {
        None
    } else {
        Some(false)
    }
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
    // A kernel's frame holds its stack buffers (math blocks, conversions, a row routine's
    // f16/bf16 rows: up to tens of KiB); frames past a page touch each page on entry, so a
    // call near the end of a thread's stack meets the guard page (a stack overflow) instead of
    // writing past it.
    set(&mut flags, "enable_probestack", "true")?;
    set(&mut flags, "probestack_strategy", "inline")?;
    let isa_builder =
        cranelift_native::builder().map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    isa_builder
        .finish(settings::Flags::new(flags))
        .map_err(|e| CodegenError::Cranelift(e.to_string()))
}

/// One kernel compiled to machine code, not yet placed in the JIT module.
struct MachineCode {
    /// Cranelift IR text as compiled (and the machine code's text under `MINDUCTOR_DISASM`).
    clif: String,
    bytes: Vec<u8>,
    alignment: u64,
    relocs: Vec<ModuleReloc>,
}

/// Lowers `kernel` (its range over its first `split` outer loops) into `ctx` (reused between
/// kernels of one thread) and compiles it for `isa`.
fn compile_kernel(
    isa: &dyn TargetIsa,
    ctx: &mut cranelift_codegen::Context,
    fctx: &mut FunctionBuilderContext,
    (kernel, split): (&Kernel, usize),
    program: &Program,
    id: FuncId,
    disasm: bool,
) -> Result<MachineCode, CodegenError> {
    ctx.clear();
    ctx.func = kernel_function(isa.default_call_conv());
    ctx.set_disasm(disasm);
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
        lower_kernel(&mut b, kernel, program, split);
        b.finalize(isa.frontend_config());
    }
    let clif = ctx.func.display().to_string();
    ctx.compile(isa, &mut ControlPlane::default())
        .map_err(|e| CodegenError::Cranelift(format!("{}: {:?}\n{clif}", kernel.name, e.inner)))?;
    let compiled = ctx.compiled_code().expect("compiled just above");
    let bytes = compiled.code_buffer().to_vec();
    let alignment = compiled.buffer.alignment as u64;
    let clif = match &compiled.vcode {
        Some(machine) if disasm => format!("{clif}\n; machine code\n{machine}"),
        _ => clif,
    };
    let relocs = compiled
        .buffer
        .relocs()
        .iter()
        .map(|reloc| ModuleReloc::from_mach_reloc(reloc, &ctx.func, id))
        .collect();
    Ok(MachineCode {
        clif,
        bytes,
        alignment,
        relocs,
    })
}

/// FNV-1a over `bytes`.
fn code_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Compiles every kernel of `program` to machine code. The program must carry its buffer plan
/// (`plan_buffers`' output; else [`CodegenError::Unplanned`]) and pass `verify_program` first: whatever built it,
/// compiled code then stays inside its buffers. Ranges that depend on symbolic sizes are
/// verified again at each call that brings new sizes.
pub fn compile_program(program: &Program) -> Result<CompiledProgram, CodegenError> {
    let started = Instant::now();
    if program.plan.is_none() {
        return Err(CodegenError::Unplanned);
    }
    verify_program(program, &[]).map_err(|e| CodegenError::Verify(Box::new(e)))?;
    let isa = isa()?;
    // Owned from the start, so an error below frees whatever was compiled before it.
    let mut code = CodeOwner(Some(JITModule::new(JITBuilder::with_isa(
        isa.clone(),
        cranelift_module::default_libcall_names(),
    ))));
    let module = code.0.as_mut().expect("just created");
    let disasm = std::env::var_os("MINDUCTOR_DISASM").is_some_and(|v| v != "0");
    // Each kernel with the outer loops its range covers (`split_loops`; a GEMM runs its
    // epilogue on blocks of rows of the first loop, scaled to that range: `call_kernel_rows`).
    let kernels: Vec<(&Kernel, usize)> = program.kernels().map(|k| (k, k.split_loops())).collect();
    // Declared in kernel order, so the ids (and below, the order code is placed in memory) are
    // those of a serial compile.
    let signature = kernel_function(isa.default_call_conv()).signature.clone();
    let ids = kernels
        .iter()
        .map(|kernel| {
            module
                .declare_function(&kernel.0.name, Linkage::Local, &signature)
                .map_err(|e| CodegenError::Cranelift(e.to_string()))
        })
        .collect::<Result<Vec<FuncId>, _>>()?;
    // Each kernel is an independent function: lowered and compiled to machine code on the
    // configured threads (Cranelift compiles a function alone, so its bytes do not depend on the thread or on
    // the other kernels), then placed in the module one by one, in kernel order.
    let machine: Vec<MachineCode> = minductor_runtime::threads::on_threads(|| {
        kernels
            .par_iter()
            .zip(&ids)
            .map_init(
                || {
                    (
                        cranelift_codegen::Context::new(),
                        FunctionBuilderContext::new(),
                    )
                },
                |(ctx, fctx), (&(kernel, split), &id)| {
                    compile_kernel(&*isa, ctx, fctx, (kernel, split), program, id, disasm)
                },
            )
            .collect::<Result<_, CodegenError>>()
    })?;
    let mut pending = Vec::with_capacity(machine.len());
    for (&id, code) in ids.iter().zip(machine) {
        module
            .define_function_bytes(id, code.alignment, &code.bytes, &code.relocs)
            .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
        pending.push((id, code.clif, code_hash(&code.bytes)));
    }
    module
        .finalize_definitions()
        .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    let mut pending = pending.into_iter();
    let mut finished = |kernel: &Kernel, split_loops: usize| -> CompiledKernel {
        let (id, clif, code_hash) = pending.next().expect("one function per kernel");
        let address = module.get_finalized_function(id);
        // SAFETY: `address` was compiled from `kernel_function`'s signature, which is KernelFn's.
        let function = unsafe { std::mem::transmute::<*const u8, KernelFn>(address) };
        CompiledKernel {
            name: kernel.name.clone(),
            clif,
            code_hash,
            function,
            buffers: kernel.buffers(),
            extents: kernel.params(),
            outer_loops: kernel.outer.len(),
            split_loops,
            stage_loops: kernel.stages.iter().map(|s| s.extent.len()).collect(),
            split: Split::PerThread,
        }
    };
    let steps = program
        .steps
        .iter()
        .map(|step| match step {
            Step::Kernel(kernel) => CompiledStep::Kernel(finished(kernel, kernel.split_loops())),
            Step::Matmul(m) => CompiledStep::Matmul {
                step: Box::new(m.clone()),
                epilogue: m.epilogue.as_ref().map(|e| finished(e, e.split_loops())),
                prepacked: None,
                split: Split::PerThread,
            },
            Step::ScatterAdd(sc) => CompiledStep::ScatterAdd(Box::new(sc.clone())),
            Step::Attention(a) => CompiledStep::Attention {
                step: Box::new(a.clone()),
                split: Split::PerThread,
            },
            Step::Fallback(fb) => CompiledStep::Fallback(Box::new(fb.clone())),
        })
        .collect();
    let plan = program.plan.clone().expect("planned above");
    let mut derived_dims: Vec<Dim> = minductor_kernel_ir::program_dims(program)
        .into_iter()
        .filter(|d| matches!(d, Dim::Sym(s) if s.is_derived()))
        .collect();
    derived_dims.sort_by_key(|d| match d {
        Dim::Sym(s) => s.0,
        Dim::Static(_) => 0,
    });
    derived_dims.dedup();
    Ok(CompiledProgram {
        program: program.clone(),
        arenas: ArenaPool(Mutex::new(Vec::new())),
        derived_dims,
        plan,
        steps,
        check_buffers: execute::check_buffers_from_env(),
        splits: splits_across_threads(program),
        team_choices: std::sync::Mutex::new(Vec::new()),
        compile_time: started.elapsed(),
        _code: code,
    })
}

/// How much faster than its default tiling (a fraction of the tiling's time) another tiling
/// of an attention step must run for max-autotune to choose it.
const ATTENTION_MARGIN: f64 = 0.05;

impl CompiledProgram {
    /// Turns checking mode on or off (see `MINDUCTOR_CHECK_BUFFERS`).
    pub fn set_check_buffers(&mut self, on: bool) {
        self.check_buffers = on;
    }

    /// Max-autotune: times every kernel step under each [`Split`], every GEMM step (a plain
    /// one; convolutions keep theirs) under its default plan and each of
    /// [`GemmChoice::candidates`] and every attention step under its default tiling and each of
    /// [`AttentionChoice::candidates`] at the current thread count, on zero-filled inputs (each
    /// over `runs` calls, keeping each step's fastest time), and keeps per step what was fastest
    /// (the default on a tie; an attention's default, timed first and last, unless another
    /// tiling was 5% faster: `ATTENTION_MARGIN`). Results do not depend on the choice (see [`Split`],
    /// [`GemmChoice`], [`AttentionChoice`]). Programs with symbolic sizes are left as they are
    /// (there are no sizes to time). Returns each tuned step's name (a kernel's, `matmul_bufN`
    /// for a GEMM, `attention_bufN` for an attention) and its choice.
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
        let tuned: Vec<usize> = (0..self.steps.len())
            .filter(|&i| self.tuned_step(i).is_some())
            .collect();
        // Rounds: round r sets every kernel step to `Split::ALL[r]`, every GEMM step to its r-th
        // plan and every attention step to its r-th tiling (the default first), while there
        // are any.
        let threads = minductor_runtime::num_threads();
        let kernel_splits: Vec<Split> = Split::ALL.to_vec();
        let gemm_plans: Vec<Split> = std::iter::once(Split::PerThread)
            .chain(GemmChoice::candidates(threads).into_iter().map(Split::Gemm))
            .collect();
        let attention_tilings = Split::attention_plans(threads);
        // Each tuned step's plans, the default first; an attention times only the tilings that
        // cut its work differently from those before them (at a few threads, for many heads,
        // the items per thread change nothing), then its default again (see below).
        let mut plans_of: Vec<Vec<Split>> = vec![Vec::new(); self.steps.len()];
        for &i in &tuned {
            plans_of[i] = match self.steps[i] {
                CompiledStep::Kernel(_) => kernel_splits.clone(),
                CompiledStep::Attention { .. } => {
                    let mut tilings =
                        self.distinct_tilings(i, &inputs, threads, &attention_tilings)?;
                    if tilings.len() > 1 {
                        tilings.push(Split::PerThread);
                    }
                    tilings
                }
                _ => gemm_plans.clone(),
            };
        }
        let rounds = plans_of.iter().map(Vec::len).max().unwrap_or(0);
        // best[i]: the fastest (time, split) of step i so far.
        let mut best: Vec<Option<(Duration, Split)>> = vec![None; self.steps.len()];
        // The default's fastest time of each step (its rounds).
        let mut default_time: Vec<Option<Duration>> = vec![None; self.steps.len()];
        for round in 0..rounds {
            let mut timed = vec![None; self.steps.len()];
            for &i in &tuned {
                if let (Some(&split), Some(slot)) = (plans_of[i].get(round), self.tuned_step(i)) {
                    *slot = split;
                    timed[i] = Some(split);
                }
            }
            let mut fastest: Vec<Option<Duration>> = vec![None; self.steps.len()];
            for _ in 0..runs.max(1) {
                let (_, timings) = self.profile(&inputs)?;
                for (slot, t) in fastest.iter_mut().zip(&timings) {
                    *slot = Some(slot.map_or(t.time, |s| s.min(t.time)));
                }
            }
            for &i in &tuned {
                if let (Some(time), Some(split)) = (fastest[i], timed[i]) {
                    if split == Split::PerThread {
                        default_time[i] = Some(default_time[i].map_or(time, |d| d.min(time)));
                    }
                    if best[i].is_none_or(|(b, _)| time < b) {
                        best[i] = Some((time, split));
                    }
                }
            }
        }
        // An attention keeps its default tiling unless another was clearly faster than the
        // default's best of its two rounds: measured on the suite (`tools/examples/
        // attention_tilings`), no tiling beats the default by more than the noise of two
        // calls, which alone made max-autotune pick a slower one.
        for &i in &tuned {
            if let (CompiledStep::Attention { .. }, Some((time, _)), Some(default)) =
                (&self.steps[i], best[i], default_time[i])
            {
                if time.as_secs_f64() * (1.0 + ATTENTION_MARGIN) > default.as_secs_f64() {
                    best[i] = Some((default, Split::PerThread));
                }
            }
        }
        let mut chosen = Vec::new();
        for &i in &tuned {
            let name = self.tuned_name(i);
            if let Some(slot) = self.tuned_step(i) {
                *slot = best[i].map_or(Split::PerThread, |(_, s)| s);
                chosen.push((name, *slot));
            }
        }
        Ok(chosen)
    }

    /// The tilings of `all` (the default first) that cut attention step `i`'s work on `inputs`
    /// differently (other query blocks, or other work items on `threads` threads) from every
    /// tiling before them. Leaves the step at its default tiling.
    fn distinct_tilings(
        &mut self,
        i: usize,
        inputs: &[Tensor],
        threads: usize,
        all: &[Split],
    ) -> Result<Vec<Split>, RuntimeError> {
        let mut cuts: Vec<(usize, Vec<u64>)> = Vec::new();
        let mut distinct = Vec::new();
        for &split in all {
            if let Some(slot) = self.tuned_step(i) {
                *slot = split;
            }
            let query_block = match split {
                Split::Attention(a) => a.query_block,
                _ => AttentionTiling::DEFAULT.query_block,
            };
            let pieces = self.partition_steps(inputs, threads)?.swap_remove(i).pieces;
            if !cuts.contains(&(query_block, pieces.clone())) {
                cuts.push((query_block, pieces));
                distinct.push(split);
            }
        }
        if let Some(slot) = self.tuned_step(i) {
            *slot = Split::PerThread;
        }
        Ok(distinct)
    }

    /// The split of step `i` if max-autotune tunes it: a kernel step's, a plain GEMM's plan,
    /// an attention's tiling.
    fn tuned_step(&mut self, i: usize) -> Option<&mut Split> {
        match &mut self.steps[i] {
            CompiledStep::Kernel(k) => Some(&mut k.split),
            CompiledStep::Attention { split, .. } => Some(split),
            CompiledStep::Matmul { step, split, .. }
                if matches!(step.b, minductor_kernel_ir::MatmulOperand::View(_)) =>
            {
                Some(split)
            }
            _ => None,
        }
    }

    /// The name max-autotune's choices use for step `i`.
    fn tuned_name(&self, i: usize) -> String {
        match &self.steps[i] {
            CompiledStep::Kernel(k) => k.name.clone(),
            CompiledStep::Matmul { step, .. } => format!("matmul_{}", step.out),
            CompiledStep::Attention { step, .. } => format!("attention_{}", step.out.buffer),
            _ => String::new(),
        }
    }

    /// Applies splits an earlier [`CompiledProgram::autotune`] chose (step names and splits);
    /// `false`, changing nothing, unless they name exactly this program's tuned steps, in order.
    pub fn set_splits(&mut self, splits: &[(String, Split)]) -> bool {
        let tuned: Vec<usize> = (0..self.steps.len())
            .filter(|&i| self.tuned_step(i).is_some())
            .collect();
        let same = tuned.len() == splits.len()
            && tuned.iter().zip(splits).all(|(&i, (name, split))| {
                // A kernel step takes a kernel split, a GEMM its default or a GEMM plan, an
                // attention its default or a tiling.
                let fits = match self.steps[i] {
                    CompiledStep::Kernel(_) => {
                        !matches!(split, Split::Gemm(_) | Split::Attention(_))
                    }
                    CompiledStep::Attention { .. } => {
                        matches!(split, Split::PerThread | Split::Attention(_))
                    }
                    _ => matches!(split, Split::PerThread | Split::Gemm(_)),
                };
                *name == self.tuned_name(i) && fits
            });
        if !same {
            return false;
        }
        for (&i, (_, split)) in tuned.iter().zip(splits) {
            if let Some(slot) = self.tuned_step(i) {
                *slot = *split;
            }
        }
        true
    }

    pub fn kernels(&self) -> impl Iterator<Item = &CompiledKernel> {
        self.steps.iter().filter_map(|s| match s {
            CompiledStep::Kernel(k) => Some(k),
            CompiledStep::Matmul { epilogue, .. } => epilogue.as_ref(),
            CompiledStep::ScatterAdd(_)
            | CompiledStep::Attention { .. }
            | CompiledStep::Fallback(_) => None,
        })
    }
}
