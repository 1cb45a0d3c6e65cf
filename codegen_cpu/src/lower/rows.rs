//! Row stages at the CPU's full vector width: a stage whose loop is one contiguous row and
//! whose expression has one of the shapes of `math::block::rows` (softmax's maximum, its
//! `exp(x - max)` summed and stored and its `e * (1/sum)`, a layer norm's sums and its
//! `(x - mean) * rstd * w + b`, an RMS norm's, SwiGLU's `silu(a) * b`, a GEMM epilogue's
//! `gelu(acc + bias)` or `acc + bias + residual`, a training step's GELU forward storing what
//! its backward reads (`(acc + bias) * (1/√2)`, `erf(·) + 1`, `(acc + bias) * 0.5`), the GELU
//! gradient from those saved values, a squared error's gradient (`acc + bias - target` and
//! `g * d + g * d`), a convolution epilogue's batch norm and ReLU, a pointwise function of a
//! row) calls that routine once
//! per row instead of running the 4-lane Cranelift loop: 16 lanes per instruction on AVX-512, 8
//! on AVX2. Where the CPU has neither (or `MINDUCTOR_ROW_KERNELS=0`), the stage runs the
//! Cranelift loop as before.
//!
//! Rows of f16 or bf16 (static rows) take the same routines: each such row the routine reads
//! is first widened into an f32 row on the stack by the kernel library's conversion routine
//! (`minductor_kernels::convert`), and a half output row is written there and narrowed after
//! the call; the conversions are the inline form's bits. A row longer than [`HALF_ROW`] goes
//! to the routine a chunk of that many elements at a time ([`HALF_CHUNKS`] at most).
//! A reduction whose row values a later stage computes again (a half softmax's `exp(x - max)`,
//! which `store_once` cannot keep in a half output) stores them into a stack row for that stage
//! instead ([`Stash`]).
//!
//! Why ahead-of-time shapes rather than an emitter of our own: the stages of row kernels are a
//! handful of shapes (the suite's softmax, layer norm, RMS norm and gated products are all
//! chains of at most five steps), a routine per shape is compiled by LLVM with every value in
//! registers (as Inductor's `Vectorized<float>` C++ is), and nothing new has to be trusted to
//! encode instructions. A stage of another shape keeps the Cranelift loop.
//!
//! A kernel whose one stage only stores, over static rows shorter than [`SHORT_ROW`] that
//! follow each other in every operand (a batch norm over a 56-wide image's rows), runs as *row
//! runs* ([`Lowering::choose_row_runs`]): each run of its last outer loop (a thread's range of
//! it) is one call per store, which the routine runs as one long row, where a call per row
//! would cost more than the row. Rows apart take a run only for a rotary embedding's two
//! halves paired into one plan ([`Lowering::pair_halves`], `RowShape::HALVES`): each head
//! row is then written in order, one call per run of heads (its halves apart, one call each,
//! measured slower than the loop).
//!
//! The matcher also answers which vector width each stage runs at ([`kernel_vector_bits`]),
//! from the same decisions the lowering takes, for `minductor report`.

use super::{lower_kernel, math_fn, Lowering};
use crate::math::block::rows::{
    row_routine, streams_stores, RowFn, RowShape, ROW_ARGS_B, ROW_ARGS_BYTES, ROW_ARGS_B_STRIDE,
    ROW_ARGS_C, ROW_ARGS_C_STRIDE, ROW_ARGS_FLAGS, ROW_ARGS_N, ROW_ARGS_OUT, ROW_ARGS_OUT_STRIDE,
    ROW_ARGS_P, ROW_ARGS_P_STRIDE, ROW_ARGS_Q, ROW_ARGS_Q_STRIDE, ROW_ARGS_RESERVED, ROW_ARGS_ROWS,
    ROW_ARGS_U0, ROW_ARGS_U1, ROW_ARGS_U2, ROW_ARGS_U3, ROW_ARGS_W, ROW_ARGS_W_STRIDE, ROW_ARGS_X,
    ROW_ARGS_X_STRIDE, ROW_PREFETCH_NEXT, ROW_STREAM,
};
use crate::math::block::rows::{ERF_GRAD_FLOOR, TWO_OVER_SQRT_PI};
use crate::math::block::{block_isa, splits_512_bit_operations, BlockIsa};
use crate::math::GELU_SCALE;
use cranelift_codegen::ir::{
    types, AbiParam, InstBuilder, Signature, StackSlot, StackSlotData, StackSlotKind, Value,
};
use minductor_ir::{BinaryOp, CompareOp, DType, ReduceOp, SizeExpr, UnaryOp};
use minductor_kernel_ir::*;
use minductor_kernels::cache::l3_bytes;
use minductor_kernels::convert::{narrow_routine, widen_routine, Half};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// The longest f16 or bf16 row a row routine takes in one call (each converted row is a stack
/// buffer of this many f32s: 32 KiB). A longer static row (a language model's logits over its
/// vocabulary) is converted and passed to the routine in chunks of this many elements, up to
/// [`HALF_CHUNKS`] of them: a reduction's chunks are combined in order (sums added, maxima by
/// `fmax`), so such a row's sum is not bit for bit the one-call sum, only a fixed function of
/// the row.
pub const HALF_ROW: usize = 8192;

/// The most chunks of [`HALF_ROW`] elements a half row is cut into (512 Ki elements); a longer
/// row takes the 4-lane loop.
pub const HALF_CHUNKS: usize = 64;

/// A row stage's routine and the rows and values it is given.
pub(super) struct RowPlan {
    routine: RowFn,
    shape: RowShape,
    x: (BufferId, Affine),
    w: Option<(BufferId, Affine)>,
    b: Option<(BufferId, Affine)>,
    c: Option<(BufferId, Affine)>,
    out: Option<(BufferId, Affine)>,
    /// The rows multiplied (`p`) and added (`q`) first.
    p: Option<(BufferId, Affine)>,
    q: Option<(BufferId, Affine)>,
    /// `u0`: the value subtracted.
    u0: Option<ExprId>,
    /// `u1`, the factor.
    u1: Option<Factor>,
    /// `u2`, `u3`: the affine step's factor and addend.
    u2: Option<ExprId>,
    u3: Option<ExprId>,
    /// Whether the stores bypass the caches (`ROW_STREAM`): the output is too large for them.
    stream: bool,
    /// Whether the routine reads the kernel's [`Stash`] row instead of `x` (its steps up to
    /// the function were done by the stage that stashed it).
    x_stash: bool,
    /// Whether the routine also stores its row values into the kernel's [`Stash`] row.
    out_stash: bool,
}

/// A reduction stage's row values, `f(x - u0)` for a costly function `f`, stored into a stack
/// row for a later stage of the same row that computes them again, which then reads them from
/// there: the code generator's form of `store_once` (`passes/src/store_once.rs`) for a row
/// whose output the later stage cannot hold them in, an f16 or bf16 one. A half softmax is the
/// example: its sum computes `exp(x - max)` into the stack row, and its store scales that row
/// by `1/sum` (`SCALE | STORE`) instead of computing `exp` again (`SUB | EXP | SCALE |
/// STORE`). The values are the same bits: both routines compute them by the same steps.
pub(super) struct Stash {
    /// `row_extent` f32s.
    slot: StackSlot,
    /// The stage that reads the row.
    consumer: usize,
    /// What the row holds.
    holds: Stashed,
}

/// What a stash row holds: the steps up to the function of the producer's shape, on its rows
/// and `u0` (the consumer's plan must ask for exactly these).
struct Stashed {
    value: u32,
    x: (BufferId, Affine),
    p: Option<(BufferId, Affine)>,
    q: Option<(BufferId, Affine)>,
    u0: Option<ExprId>,
}

impl Stashed {
    fn of(plan: &RowPlan) -> Stashed {
        Stashed {
            value: plan.shape.0 & UP_TO_FUNCTION,
            x: plan.x.clone(),
            p: plan.p.clone(),
            q: plan.q.clone(),
            u0: plan.u0,
        }
    }

    /// Whether `plan` computes these values before its further steps. (A GELU gradient's
    /// shape returns before the steps of `UP_TO_FUNCTION`, and a shape that scales before its
    /// function or subtracts a row computes another argument: never.)
    fn starts(&self, plan: &RowPlan) -> bool {
        let other = RowShape::GELU_GRAD | RowShape::SCALE_FIRST | RowShape::SUB_ROW;
        plan.shape.0 & UP_TO_FUNCTION == self.value
            && plan.shape.0 & other == 0
            && plan.x == self.x
            && plan.p == self.p
            && plan.q == self.q
            && plan.u0 == self.u0
    }
}

/// The steps of a shape up to and including its function (see `math::block::rows`): what a
/// stashed row holds.
const UP_TO_FUNCTION: u32 =
    RowShape::PRE_MUL | RowShape::PRE_ADD | RowShape::SUB | (0xf << RowShape::FN_SHIFT);

/// GELU's gradient times `g`, as [`Lowering::gelu_grad`] finds it.
enum GeluGrad {
    /// At `t`, computing GELU's inner values again.
    Recomputed { t: ExprId, g: ExprId },
    /// From the values the forward saved: the `erf` argument `s`, `one_plus = erf(s) + 1` and
    /// `half_x = x * 0.5`.
    Saved {
        s: ExprId,
        g: ExprId,
        one_plus: ExprId,
        half_x: ExprId,
    },
}

/// What a shape reduces.
const REDUCTIONS: u32 = RowShape::SUM | RowShape::SUM_SQUARES | RowShape::MAX;

/// The factor `u1` of a row shape.
#[derive(Clone, Copy)]
enum Factor {
    Value(ExprId),
    /// `1 / value`: the Cranelift loop divides by a value uniform along the row that way.
    Reciprocal(ExprId),
    /// `-value` (`b - t * value` is `t * (-value) + b`, the same fused result).
    Negated(ExprId),
    Constant(f32),
}

/// Whether row routines may be used: `MINDUCTOR_ROW_KERNELS=0` turns them off (comparisons).
/// Whether kernels compiled from now on may use row routines: 0 unset (then
/// `MINDUCTOR_ROW_KERNELS=0` turns them off), 1 off, 2 on. See [`set_row_kernels`].
static ROW_KERNELS: AtomicU8 = AtomicU8::new(0);

/// Turns row routines off (`false`) or back on for the kernels compiled after the call, in this
/// process (already compiled programs keep what they have): for comparing the two forms in one
/// process, as benchmarks and tests do. `MINDUCTOR_ROW_KERNELS=0` is the default `false`.
pub fn set_row_kernels(enabled: bool) {
    ROW_KERNELS.store(if enabled { 2 } else { 1 }, Ordering::Relaxed);
}

pub(super) fn row_kernels_enabled() -> bool {
    match ROW_KERNELS.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            *ON.get_or_init(|| !std::env::var("MINDUCTOR_ROW_KERNELS").is_ok_and(|v| v == "0"))
        }
    }
}

/// A layer norm's affine store, `(x - mean) * rstd * weight + bias`. Where the CPU splits
/// 512-bit operations in two ([`splits_512_bit_operations`]: Zen 4) and the output is at least
/// half the last-level cache (or of unknown size) it stays the 4-lane loop: there the routine
/// gains no compute rate, and in the suite's full run (its 16 MiB output
/// coming cold from the block cache) it measured slower, layernorm_4096x1024 at 1.65-1.82 ms
/// against 1.19-1.26 ms (`minductor bench --threads 1 --rounds 3`, two alternated runs of
/// each build, 2026-11-27), though alone, with the output in cache, the two tie. A store-only
/// pass missing to memory ran 25-40% slower with 512-bit stores than with 128-bit ones on that
/// core in a stand-alone probe. Measured again after softmax_4096x1024 (whose 16 MiB output
/// block the layer norm's output reuses), `bench --workload softmax_4096x1024,
/// layernorm_4096x1024,llama_block_4x256x512 --threads 1,2 --rounds 3`, three alternated runs
/// (2026-11-27): the loop 1.030-1.054 ms at 1 thread and 0.539-0.649 at 2; the routine storing
/// its 512-bit registers as 128-bit quarters 1.093-1.277 and 0.569-0.669 (alone, the forms
/// tie within noise). With buffers on huge pages (`runtime/src/pages.rs`) the routine still
/// lost in the full suite (`bench --threads 1,2 --rounds 3`, two alternated runs of each
/// build, 2026-11-27): 1.41-1.51 ms against 1.00-1.02 at 1 thread, 0.70-0.85 against 0.61 at 2,
/// though after softmax alone the two tied. On cores with full-width units the loop is a
/// quarter of the routine's rate, so it runs there.
///
/// A smaller output takes the routine on Zen 4 too: there the loop's cost per row (its
/// unrolled, vector and scalar parts, each row on its own) is what counts, not stores missing
/// to memory. Measured on Zen 4 (32 MiB L3) at 1 thread, median of 41 calls, three alternated
/// runs of each build (2026-11-27), loop against routine: [8192, 64] 0.42 against 0.35 ms,
/// [16384, 128] 1.17-1.20 against 0.83, [4096, 256] 0.39 against 0.31, [8192, 256] 0.80-0.95
/// against 0.64, [4096, 512] 0.58 against 0.45, [2048, 768] 0.38 against 0.29, [2048, 1024]
/// 0.48 against 0.37-0.39 (outputs of 2-8 MiB); at 16 MiB and more the loop won or tied
/// ([4096, 1024] 1.01-1.06 against 1.18-1.22, [8192, 768] 1.63-1.69 against 1.83-1.86,
/// [2048, 2048] tied) except [1024, 4096] (1.93-2.18 against 1.76-1.85).
const LAYER_NORM_AFFINE_STORE: u32 =
    RowShape::SUB | RowShape::SCALE | RowShape::MUL_ROW | RowShape::ADD_ROW | RowShape::STORE;

/// Rows shorter than this take the 4-lane loop for a stage without a function (a sum, a
/// maximum, a layer norm's affine store): such a row is at most three registers of the
/// routine's 16 lanes, and the call costs more than the loop's few vectors. A function (a
/// softmax's `exp`) still pays for the call. Measured on Zen 4 at 1 thread (median of 41 calls,
/// two runs each, 2026-11-27), all routines against all loops: layer norm `[65536, 16]`
/// 2.20-2.23 against 1.71-1.72 ms, `[32768, 32]` 1.19 against 0.99, `[16384, 48]` 0.63 against
/// 0.56, but `[8192, 64]` 0.32-0.33 against 0.37; RMS norm `[32768, 32]` 0.70-0.71 against
/// 0.51; softmax the other way, `[32768, 32]` 1.43 against 1.68-1.69. A kernel of one stage
/// that only stores takes the routine over such rows too, a run of rows per call (see
/// [`Lowering::choose_row_runs`]).
pub const SHORT_ROW: usize = 64;

/// Whether the shapes chosen per CPU follow the CPU (see [`set_row_shapes_by_cpu`]).
static BY_CPU: AtomicBool = AtomicBool::new(true);

/// `false`: every shape with a routine gets it whatever the CPU and the row's length (for tests
/// that compare each routine with its loop on any machine, at any length); `true` (the
/// default) restores the per-CPU choices ([`LAYER_NORM_AFFINE_STORE`], [`SHORT_ROW`]).
/// For the kernels compiled after the call, in this process.
pub fn set_row_shapes_by_cpu(by_cpu: bool) {
    BY_CPU.store(by_cpu, Ordering::Relaxed);
}

fn by_cpu() -> bool {
    BY_CPU.load(Ordering::Relaxed)
}

/// Bits per vector register of `isa`.
fn isa_bits(isa: BlockIsa) -> u32 {
    match isa {
        BlockIsa::Avx512 => 512,
        BlockIsa::Avx2 => 256,
    }
}

/// The narrowest vector width (bits) at which `kernel`'s stages with a loop run on this CPU:
/// 512 or 256 for row routines, 128 for Cranelift's vector loops, 32 for a scalar loop; `None`
/// for a kernel without loops. (An outer-reduction kernel's loops are Cranelift's 4-lane ones.)
pub fn kernel_vector_bits(kernel: &Kernel, program: &Program) -> Option<u32> {
    stage_vector_bits(kernel, program)
        .into_iter()
        .flatten()
        .min()
}

/// The vector width (bits) at which each stage of `kernel` runs on this CPU (as
/// [`kernel_vector_bits`]; `None` for a stage without loops).
pub fn stage_vector_bits(kernel: &Kernel, program: &Program) -> Vec<Option<u32>> {
    stage_forms(kernel, program).bits
}

/// Whether each stage of `kernel` stores around the caches on this CPU (an output of at least
/// half the last-level cache that the kernel does not read: see
/// `math::block::rows::streams_stores`).
pub fn stage_streams(kernel: &Kernel, program: &Program) -> Vec<bool> {
    stage_forms(kernel, program).streams
}

/// Whether each stage of `kernel` has its row routine prefetch the next row on this CPU
/// (`ROW_PREFETCH_NEXT`: a kernel's first stage, over rows that follow each other).
pub fn stage_prefetches(kernel: &Kernel, program: &Program) -> Vec<bool> {
    stage_forms(kernel, program).prefetches
}

fn stage_forms(kernel: &Kernel, program: &Program) -> super::StageForms {
    use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
    let mut func = super::kernel_function(cranelift_codegen::isa::CallConv::SystemV);
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut fctx);
    lower_kernel(&mut b, kernel, program, 1)
}

impl RowPlan {
    /// Whether the routine's stores bypass the caches.
    pub(super) fn streams(&self) -> bool {
        self.stream
    }

    /// Every row the routine reads or writes: `x`, the others it has, and `out`.
    fn rows(&self) -> impl Iterator<Item = &(BufferId, Affine)> {
        [
            Some(&self.x),
            self.w.as_ref(),
            self.b.as_ref(),
            self.c.as_ref(),
            self.p.as_ref(),
            self.q.as_ref(),
            self.out.as_ref(),
        ]
        .into_iter()
        .flatten()
    }
}

impl Lowering<'_, '_, '_> {
    /// The routines for stage `stage`, one per store of a store stage (when no store writes a
    /// buffer the stage reads, the stores are independent), if it is a row stage of shapes that
    /// have routines.
    pub(super) fn row_plans(&self, stage: &Stage) -> Option<Vec<RowPlan>> {
        if let StageAction::Store(stores) = &stage.action {
            if stores.len() > 1 {
                let reads = self.kernel.reachable(&stage.action.roots());
                let read = |b: BufferId| {
                    reads.iter().any(|&r| {
                        matches!(self.kernel.expr(r), Expr::Load { buffer, .. } if *buffer == b)
                    })
                };
                if stores.iter().any(|st| read(st.buffer)) {
                    return None;
                }
                // A run of rows stores each plan's rows before the next plan's: the stores to
                // one buffer must write windows of their own in every outer iteration.
                let shared = |st: &Store| stores.iter().filter(|o| o.buffer == st.buffer).count();
                if self.row_runs
                    && (stores.iter())
                        .any(|st| shared(st) > 1 && !self.kernel.stores_apart(st.buffer))
                {
                    return None;
                }
                let plans: Vec<RowPlan> = stores
                    .iter()
                    .map(|st| {
                        let one = Stage {
                            extent: stage.extent.clone(),
                            action: StageAction::Store(vec![st.clone()]),
                        };
                        self.row_plan(&one)
                    })
                    .collect::<Option<_>>()?;
                return Some(self.pair_halves(plans));
            }
        }
        Some(vec![self.row_plan(stage)?])
    }

    /// `plans` with a rotary embedding's two halves made one plan of both
    /// (`RowShape::HALVES`): the plan storing `x1 * cos + (-x2) * sin` (`NEG_PRODUCT`, `x` the
    /// first half, `b` the second) and the plan storing `x2 * cos + x1 * sin` (`ADD_PRODUCT`,
    /// the same rows with `x` and `b` swapped) `n` elements after it in the same buffer, `n`
    /// the static row's length, every row f32. The routine computes each half with the same
    /// operations as its plan alone (the same bits), and writes each head row in order: one
    /// call per row (or run of rows) instead of two. Other plans are returned as they are.
    fn pair_halves(&self, plans: Vec<RowPlan>) -> Vec<RowPlan> {
        let first =
            RowShape::MUL_ROW | RowShape::ADD_PRODUCT | RowShape::NEG_PRODUCT | RowShape::STORE;
        let second = first & !RowShape::NEG_PRODUCT;
        let (Some(n), Some(isa), [p, q]) = (self.row_extent, block_isa(), plans.as_slice()) else {
            return plans;
        };
        let (one, two) = match (p.shape.0, q.shape.0) {
            (a, b) if a == first && b == second => (p, q),
            (a, b) if a == second && b == first => (q, p),
            _ => return plans,
        };
        let after = |(buffer, index): &(BufferId, Affine)| {
            (*buffer, index.plus(&Affine::constant(n as i64)))
        };
        let f32_rows = (one.rows().chain(two.rows()))
            .all(|(buffer, _)| self.program.buffer(*buffer).dtype == DType::F32);
        let pairs = f32_rows
            && one.w == two.w
            && one.c == two.c
            && one.b.as_ref() == Some(&two.x)
            && two.b.as_ref() == Some(&one.x)
            && one.out.as_ref().map(after) == two.out
            && one.stream == two.stream
            && ![one, two].iter().any(|plan| plan.x_stash || plan.out_stash);
        let shape = RowShape(first | RowShape::HALVES);
        let Some(routine) = row_routine(shape, isa).filter(|_| pairs) else {
            return plans;
        };
        let one = if std::ptr::eq(one, p) { 0 } else { 1 };
        let plan = plans.into_iter().nth(one).expect("one of the two");
        vec![RowPlan {
            routine,
            shape,
            ..plan
        }]
    }

    /// The routine for stage `stage`, if it is a row stage of a shape that has one.
    fn row_plan(&self, stage: &Stage) -> Option<RowPlan> {
        if self.outer_mode || stage.extent.len() != 1 || !row_kernels_enabled() {
            return None;
        }
        let isa = block_isa()?;
        let inner = self.innermost?;
        let mut bits = 0;
        let mut out = None;
        let root = match &stage.action {
            StageAction::Reduce { op, value, stores } => {
                let mut root = *value;
                match op {
                    ReduceOp::Max => bits |= RowShape::MAX,
                    ReduceOp::Min => return None,
                    ReduceOp::Sum => match *self.kernel.expr(*value) {
                        Expr::Binary(BinaryOp::Mul, p, q) if p == q => {
                            bits |= RowShape::SUM_SQUARES;
                            root = p;
                        }
                        _ => bits |= RowShape::SUM,
                    },
                }
                match stores.as_slice() {
                    [] => {}
                    [st] if st.value == root && bits & RowShape::SUM_SQUARES == 0 => {
                        bits |= RowShape::STORE;
                        out = Some(st);
                    }
                    _ => return None,
                }
                root
            }
            StageAction::Store(stores) => match stores.as_slice() {
                [st] => {
                    bits |= RowShape::STORE;
                    out = Some(st);
                    // A value rounded to the half type it is stored in: the store rounds it
                    // alike (rounding to nearest-even twice is rounding once).
                    let dtype = self.program.buffer(st.buffer).dtype;
                    match *self.kernel.expr(st.value) {
                        Expr::Cast(to, a)
                            if to == dtype
                                && matches!(to, DType::F16 | DType::BF16)
                                && self.kernel.ty(a) == ScalarType::F32 =>
                        {
                            a
                        }
                        _ => st.value,
                    }
                }
                _ => return None,
            },
            StageAction::Scan(_) => return None,
        };
        if let Some(st) = out {
            let f32_out = self.program.buffer(st.buffer).dtype == DType::F32;
            let half_out = self.half_row(st.buffer).and_then(narrow_routine).is_some();
            if !(f32_out || half_out) || !st.index.coefficient(inner).is(1) {
                return None;
            }
        }
        let k = self.kernel;
        // Row values: f32 values uniform along the row that read nothing the stage stores (the
        // routine reads them once, before the row).
        let stored = out.map(|st| st.buffer);
        let value = |e: ExprId| {
            k.ty(e) == ScalarType::F32
                && self.is_uniform(e)
                && (self.load_free[e.0 as usize]
                    || !k.reachable(&[e]).iter().any(|&r| {
                        matches!(k.expr(r), Expr::Load { buffer, .. } if Some(*buffer) == stored)
                    }))
        };
        let varying = |e: ExprId| k.ty(e) == ScalarType::F32 && !self.is_uniform(e);
        let mut e = root;
        let (mut w, mut b, mut c, mut u0, mut u1) = (None, None, None, None, None);
        let (mut p_row, mut q_row, mut u2, mut u3) = (None, None, None, None);
        // `max(t, 0)`, last.
        if bits == RowShape::STORE {
            let zero = |x: ExprId| matches!(k.expr(x), Expr::Constant { value, .. } if value.to_bits() == 0);
            if let Expr::Binary(BinaryOp::Maximum, p, q) = *k.expr(e) {
                if zero(q) && varying(p) {
                    bits |= RowShape::RELU;
                    e = p;
                } else if zero(p) && varying(q) {
                    bits |= RowShape::RELU;
                    e = q;
                }
            }
        }
        // GELU's gradient times a row, alone after the first steps (or from saved rows).
        let mut gelu_grad = false;
        if bits == RowShape::STORE {
            match self.gelu_grad(e) {
                Some(GeluGrad::Recomputed { t, g }) => {
                    if let Some(row) = self.row_load(g) {
                        bits |= RowShape::GELU_GRAD;
                        w = Some(row);
                        e = t;
                        gelu_grad = true;
                    }
                }
                Some(GeluGrad::Saved {
                    s,
                    g,
                    one_plus,
                    half_x,
                }) => {
                    // Each a row (`s` is the routine's `x`, found below).
                    let rows = (
                        self.row_load(g),
                        self.row_load(one_plus),
                        self.row_load(half_x),
                        self.row_load(s),
                    );
                    if let (Some(rg), Some(ra), Some(rh), Some(_)) = rows {
                        bits |= RowShape::GELU_GRAD | RowShape::GELU_GRAD_SAVED;
                        (w, b, c) = (Some(rg), Some(ra), Some(rh));
                        e = s;
                        gelu_grad = true;
                    }
                }
                None => {}
            }
        }
        // A product the Cranelift loop contracts into a fused multiply-add: `(t, factor)`.
        let contracted = |e: ExprId| match *k.expr(e) {
            Expr::Binary(BinaryOp::Mul, p, q) if self.contract && self.uses[e.0 as usize] == 1 => {
                Some((p, q))
            }
            _ => None,
        };
        // `t * u + b` or `b - t * u`, fused.
        let fused_scale = match *k.expr(e) {
            _ if gelu_grad => None,
            Expr::Binary(op @ (BinaryOp::Add | BinaryOp::Sub), p, q) => {
                let product = |m: ExprId| {
                    let (x, y) = contracted(m)?;
                    if value(y) && varying(x) {
                        Some((x, y))
                    } else if value(x) && varying(y) {
                        Some((y, x))
                    } else {
                        None
                    }
                };
                match op {
                    BinaryOp::Add => match (product(p), self.row_load(q)) {
                        (Some((t, u)), Some(row)) => Some((t, Factor::Value(u), row)),
                        _ => match (self.row_load(p), product(q)) {
                            (Some(row), Some((t, u))) if contracted(p).is_none() => {
                                Some((t, Factor::Value(u), row))
                            }
                            _ => None,
                        },
                    },
                    _ => match (self.row_load(p), product(q)) {
                        (Some(row), Some((t, u))) => Some((t, Factor::Negated(u), row)),
                        _ => None,
                    },
                }
            }
            _ => None,
        };
        if let Some((t, u, row)) = fused_scale {
            bits |= RowShape::FUSED_SCALE | RowShape::SCALE | RowShape::ADD_ROW;
            u1 = Some(u);
            b = Some(row);
            e = t;
        }
        // `t * w + b * c`: the product the Cranelift loop fuses is the first it can. One
        // factor of `b * c` may be negated (`NEG_PRODUCT`; it is then `b`).
        if let Expr::Binary(BinaryOp::Add, p, q) = *k.expr(e) {
            let negated = |x: ExprId| match *k.expr(x) {
                Expr::Unary(UnaryOp::Neg, y) => self.row_load(y),
                _ => None,
            };
            let rows = |m: ExprId| match *k.expr(m) {
                Expr::Binary(BinaryOp::Mul, x, y) => {
                    match (self.row_load(x), self.row_load(y), negated(x), negated(y)) {
                        (Some(rx), Some(ry), _, _) => Some((rx, ry, false)),
                        (None, Some(ry), Some(nx), _) => Some((nx, ry, true)),
                        (Some(rx), None, _, Some(ny)) => Some((ny, rx, true)),
                        _ => None,
                    }
                }
                _ => None,
            };
            let (fused, added) = if contracted(p).is_some() {
                (p, q)
            } else {
                (q, p)
            };
            if bits == RowShape::STORE && contracted(fused).is_some() {
                if let Some((rb, rc, negated)) = rows(added) {
                    bits |= RowShape::ADD_PRODUCT;
                    if negated {
                        bits |= RowShape::NEG_PRODUCT;
                    }
                    b = Some(rb);
                    c = Some(rc);
                    e = fused;
                }
            }
        }
        if gelu_grad || bits & RowShape::FUSED_SCALE != 0 || bits & RowShape::ADD_PRODUCT != 0 {
        } else if let Expr::Binary(BinaryOp::Add, p, q) = *k.expr(e) {
            let row = if self.row_load(q).is_some() {
                Some((q, p))
            } else if self.row_load(p).is_some() {
                Some((p, q))
            } else {
                None
            };
            if let Some((row, rest)) = row {
                b = self.row_load(row);
                bits |= RowShape::ADD_ROW;
                e = rest;
            }
        }
        if gelu_grad || bits & RowShape::FUSED_SCALE != 0 {
        } else if let Expr::Binary(BinaryOp::Mul, p, q) = *k.expr(e) {
            let row = [(q, p), (p, q)]
                .into_iter()
                .find(|&(row, rest)| self.row_load(row).is_some() && varying(rest));
            if let Some((row, rest)) = row {
                // With a bias, the routine fuses `t * w + b`, as the Cranelift loop contracts
                // a product used only there.
                if b.is_some() && contracted(e).is_none() {
                    return None;
                }
                w = self.row_load(row);
                bits |= RowShape::MUL_ROW;
                e = rest;
            }
        }
        if bits & RowShape::ADD_PRODUCT != 0 && bits & RowShape::MUL_ROW == 0 {
            return None;
        }
        // `t * u2 + u3`, the product fused (the first of the two the loop can contract).
        if !gelu_grad && bits & RowShape::FUSED_SCALE == 0 {
            if let Expr::Binary(BinaryOp::Add, p, q) = *k.expr(e) {
                let (fused, added) = if contracted(p).is_some() {
                    (p, q)
                } else {
                    (q, p)
                };
                let scaled = contracted(fused).and_then(|(x, y)| {
                    if value(y) && varying(x) {
                        Some((x, y))
                    } else if value(x) && varying(y) {
                        Some((y, x))
                    } else {
                        None
                    }
                });
                if let Some((t, factor)) = scaled.filter(|_| value(added)) {
                    bits |= RowShape::AFFINE;
                    u2 = Some(factor);
                    u3 = Some(added);
                    e = t;
                } else if contracted(p).is_none() && contracted(q).is_none() {
                    // `t + u3`, which the loop does not fuse (neither side is a product it
                    // contracts).
                    let offset = [(p, q), (q, p)]
                        .into_iter()
                        .find(|&(t, u)| varying(t) && value(u));
                    if let Some((t, u)) = offset {
                        bits |= RowShape::OFFSET;
                        u3 = Some(u);
                        e = t;
                    }
                }
            }
        }
        // `t + t`, after the scale (its operand has two uses: the loop fuses nothing).
        if !gelu_grad && bits & RowShape::FUSED_SCALE == 0 {
            if let Expr::Binary(BinaryOp::Add, p, q) = *k.expr(e) {
                if p == q && varying(p) {
                    bits |= RowShape::DOUBLE;
                    e = p;
                }
            }
        }
        // `t * u1`, `t / u1` (times its reciprocal, as the loop computes it) or `-t`.
        let scaled = |e: ExprId| match *k.expr(e) {
            Expr::Binary(BinaryOp::Mul, p, q) if value(q) && varying(p) => {
                Some((p, Factor::Value(q)))
            }
            Expr::Binary(BinaryOp::Mul, p, q) if value(p) && varying(q) => {
                Some((q, Factor::Value(p)))
            }
            Expr::Binary(BinaryOp::Div, p, q) if value(q) && varying(p) => {
                Some((p, Factor::Reciprocal(q)))
            }
            Expr::Unary(UnaryOp::Neg, p) if varying(p) => Some((p, Factor::Constant(-1.0))),
            _ => None,
        };
        if !gelu_grad && bits & RowShape::FUSED_SCALE == 0 {
            if let Some((p, factor)) = scaled(e) {
                u1 = Some(factor);
                bits |= RowShape::SCALE;
                e = p;
            }
        }
        // The function; its inner values may have other uses (other stores of the stage): the
        // routine computes the same bits.
        let function = match *k.expr(e) {
            _ if gelu_grad => None,
            Expr::Unary(op, a) => math_fn(op).map(|f| (a, f)),
            _ => self.composite_any_uses(e),
        };
        if let Some((a, f)) = function {
            bits |= RowShape::function(f);
            e = a;
            // `f(t * u1)`: the product before the function, if none came after it.
            if bits & (RowShape::SCALE | RowShape::FUSED_SCALE) == 0 {
                if let Some((p, factor)) = scaled(e) {
                    u1 = Some(factor);
                    bits |= RowShape::SCALE | RowShape::SCALE_FIRST;
                    e = p;
                }
            }
        }
        if let Expr::Binary(BinaryOp::Sub, p, q) = *k.expr(e) {
            if !gelu_grad && value(q) && varying(p) {
                u0 = Some(q);
                bits |= RowShape::SUB;
                e = p;
            } else if !gelu_grad
                && c.is_none()
                && varying(p)
                && contracted(p).is_none()
                && contracted(q).is_none()
            {
                // `t - c`, a row, which the loop does not fuse (neither side is a product it
                // contracts).
                if let Some(row) = self.row_load(q) {
                    c = Some(row);
                    bits |= RowShape::SUB | RowShape::SUB_ROW;
                    e = p;
                }
            }
        }
        // `x * p + q` fused (the first product the loop can contract), `x + q` or `x * p`.
        match *k.expr(e) {
            Expr::Binary(BinaryOp::Add, p, q) => {
                let (fused, added) = if contracted(p).is_some() {
                    (p, q)
                } else {
                    (q, p)
                };
                if let Some((x, y)) = contracted(fused) {
                    if let (Some(_), Some(ry), Some(rq)) =
                        (self.row_load(x), self.row_load(y), self.row_load(added))
                    {
                        bits |= RowShape::PRE_MUL | RowShape::PRE_ADD;
                        (p_row, q_row) = (Some(ry), Some(rq));
                        e = x;
                    }
                } else if let (Some(_), Some(rq)) = (self.row_load(p), self.row_load(q)) {
                    bits |= RowShape::PRE_ADD;
                    q_row = Some(rq);
                    e = p;
                }
            }
            Expr::Binary(BinaryOp::Mul, p, q) if self.row_load(p).is_some() => {
                if let Some(rp) = self.row_load(q) {
                    bits |= RowShape::PRE_MUL;
                    p_row = Some(rp);
                    e = p;
                }
            }
            _ => {}
        }
        let x = self.row_load(e)?;
        // A store in place must write each element only where the routine reads it.
        if let Some(st) = out {
            for row in [
                Some(&x),
                w.as_ref(),
                b.as_ref(),
                c.as_ref(),
                p_row.as_ref(),
                q_row.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                if row.0 == st.buffer && row.1 != st.index {
                    return None;
                }
            }
        }
        let shape = RowShape(bits);
        let function = shape.0 & (0xf << RowShape::FN_SHIFT) != 0;
        if !function && by_cpu() && !self.row_runs && self.row_extent.is_some_and(|n| n < SHORT_ROW)
        {
            return None;
        }
        if shape.0 == LAYER_NORM_AFFINE_STORE && by_cpu() && splits_512_bit_operations() {
            let small = out
                .and_then(|st| self.bytes(st.buffer))
                .zip(l3_bytes())
                .is_some_and(|(written, l3)| written < l3 / 2);
            if !small {
                return None;
            }
        }
        // An output whose static size says it cannot stay in the last-level cache until it is
        // read (see `streams_stores`), and that this kernel does not read (a softmax reads
        // back the exponentials it stored: they must stay in cache).
        // (A half output row is written on the stack, then narrowed: not streamed.)
        let stream = out.is_some_and(|st| {
            let half = self.program.buffer(st.buffer).dtype != DType::F32;
            let read_here = (k.exprs.iter())
                .any(|e| matches!(e, Expr::Load { buffer, .. } if *buffer == st.buffer));
            !read_here
                && !half
                && self
                    .bytes(st.buffer)
                    .zip(self.traffic())
                    .is_some_and(|(written, traffic)| streams_stores(written, traffic))
        });
        Some(RowPlan {
            stream,
            routine: row_routine(shape, isa)?,
            shape,
            x,
            w,
            b,
            c,
            out: out.map(|st| (st.buffer, st.index.clone())),
            p: p_row,
            q: q_row,
            u0,
            u1,
            u2,
            u3,
            x_stash: false,
            out_stash: false,
        })
    }

    /// Whether the kernel runs as row runs: each run of its last outer loop (a thread's range
    /// of it) as one routine call per plan of its one stage, over the run's rows, instead of a
    /// call per row (too costly for rows shorter than [`SHORT_ROW`], which would then keep the
    /// 4-lane loop, or pay a call per short row). It does when the stage is one static row
    /// shorter than `SHORT_ROW` whose plans store f32 rows and reduce nothing, their row values
    /// (`u0`..`u3`) the same along the last outer loop, and each of its rows follows the one
    /// before in memory (its index's coefficient of the last outer loop is the row length: a
    /// batch norm's `[.., 56] x [56]` over images), so the routine runs the run as one row
    /// (`math::block::rows::row_runs`), with the operations of one row for every element: each
    /// value is the one a call per row would store (and the loop's).
    ///
    /// Rows at other strides (0 for an operand broadcast along the loop, rotary embeddings'
    /// `cos` and `sin` across heads; 64 KiB apart for their half heads written heads-first) the
    /// routines can run too. As two plans, one per half, they measured slower than the 4-lane
    /// loop: the LLaMA block's rotary kernels (`[4, 256, 8] x [32]`, one thread, Zen 5,
    /// `minductor report --runs 30`, three runs alternated with `MINDUCTOR_ROW_KERNELS=0`)
    /// reached 17-27 GB/s as runs of 8 rows against 29-37 GB/s as the loop, each call writing
    /// a half row of 128 bytes per head. Paired into one plan of both halves
    /// ([`Self::pair_halves`]), each head row of 256 bytes is written in order as the loop
    /// writes it, and those runs do take the routine: on Zen 5 (AMD EPYC, family 26, 2 vCPUs
    /// shared with other builds), seven runs of 16-30 rounds of 10 calls each alternating both
    /// forms in one process (`cargo run --release -p minductor-tools --example rotary_ab`),
    /// medians of their medians, routine against loop: k11 (`[4, 256, 8] x [32]`) 0.170
    /// against 0.181 ms at 1 thread (faster in 6 of the 7 runs) and 0.166 against 0.176 at 2
    /// (5 of 7); k13 (`[4, 256, 4] x [32]`, runs of 4 heads) ties, 0.0818 against 0.0819 and
    /// 0.0860 against 0.0878.
    pub(super) fn choose_row_runs(&mut self) -> bool {
        let k = self.kernel;
        if k.order != LoopOrder::Inner
            || k.outer.is_empty()
            || k.stages.len() != 1
            || self.transposed.is_some()
            || !row_kernels_enabled()
        {
            return false;
        }
        let stage = &k.stages[0];
        let len = match stage.extent.as_slice() {
            [d] => d.as_static(),
            _ => None,
        };
        let Some(len) = len.filter(|&n| n < SHORT_ROW) else {
            return false;
        };
        let last = Var::Outer(k.outer.len() as u32 - 1);
        // The stage's context, as `stage` sets it.
        (self.row_extent, self.innermost, self.row_runs) = (Some(len), Some(Var::Inner(0)), true);
        let runs = self.row_plans(stage).is_some_and(|plans| {
            plans.iter().all(|plan| {
                let factor = plan.u1.and_then(|f| match f {
                    Factor::Value(e) | Factor::Reciprocal(e) | Factor::Negated(e) => Some(e),
                    Factor::Constant(_) => None,
                });
                let follow = |(_, index): &(BufferId, Affine)| {
                    index.coefficient(last) == SizeExpr::Const(len as i64)
                };
                // A head's two halves in one call write each head row in order, wherever
                // the rows lie: they run whatever their strides (see below).
                let halves = plan.shape.0 & RowShape::HALVES != 0;
                !plan.shape.reduces()
                    && (halves || plan.rows().all(follow))
                    && !plan.x_stash
                    && !plan.out_stash
                    && (plan.rows())
                        .all(|(buffer, _)| self.program.buffer(*buffer).dtype == DType::F32)
                    && ([plan.u0, factor, plan.u2, plan.u3].into_iter().flatten())
                        .all(|e| !self.varies_along(e, last))
            })
        });
        (self.row_extent, self.innermost, self.row_runs) = (None, None, false);
        runs
    }

    /// Whether `e` reads anything that changes with `var`.
    fn varies_along(&self, e: ExprId, var: Var) -> bool {
        let k = self.kernel;
        k.reachable(&[e]).iter().any(|&r| match k.expr(r) {
            Expr::Load { index, .. } | Expr::Index(index) => index.uses(var),
            Expr::StageResult(_) => true,
            _ => false,
        })
    }

    /// The kernel's one stage over rows `lo..hi` of its last outer loop (the other outer loops'
    /// variables set), one routine call per plan ([`Self::choose_row_runs`]).
    pub(super) fn row_run_calls(&mut self, lo: Value, hi: Value, extents: &[Value]) {
        let outer = self.kernel.outer.len();
        self.forget();
        self.vars.insert(Var::Outer(outer as u32 - 1), lo);
        let rows = self.b.ins().isub(hi, lo);
        self.row_run = Some(rows);
        self.stages(&extents[outer..]);
        self.row_run = None;
        self.forget();
    }

    /// The plans of stage `n` (`plans`, for the current stage's context) rewritten for a
    /// [`Stash`]: stage `n` reads the pending one if it is its consumer; else, if `n` is a
    /// reduction computing `f(x - u0)` that a later stage computes again (with no store
    /// between them), `n` stores it into a new stash row for that stage.
    pub(super) fn stash_plans(&mut self, n: usize, plans: &mut [RowPlan]) {
        if let [plan] = &mut *plans {
            let pending = self.stash.as_ref();
            if pending.is_some_and(|s| s.consumer == n && s.holds.starts(plan)) {
                let shape = RowShape(plan.shape.0 & !UP_TO_FUNCTION);
                if let Some(routine) = block_isa().and_then(|isa| row_routine(shape, isa)) {
                    plan.shape = shape;
                    plan.routine = routine;
                    plan.x_stash = true;
                    (plan.p, plan.q, plan.u0) = (None, None, None);
                    return;
                }
            }
        }
        self.stash = None;
        let ([producer], Some(len)) = (&mut *plans, self.row_extent) else {
            return;
        };
        let Some(isa) = block_isa() else {
            return;
        };
        let value = producer.shape.0 & UP_TO_FUNCTION;
        let stored = RowShape(producer.shape.0 | RowShape::STORE);
        let worth = value & (0xf << RowShape::FN_SHIFT) != 0
            && producer.shape.0 & !(UP_TO_FUNCTION | REDUCTIONS) == 0
            && producer.shape.0 & RowShape::SUM_SQUARES == 0
            && len <= HALF_ROW
            && row_routine(stored, isa).is_some();
        if !worth {
            return;
        }
        let (innermost, row_extent) = (self.innermost, self.row_extent);
        let mut consumer = None;
        for s in n + 1..self.kernel.stages.len() {
            let stage = &self.kernel.stages[s];
            let StageAction::Store(_) = &stage.action else {
                // A reduction between them may run, if it stores nothing.
                match &stage.action {
                    StageAction::Reduce { stores, .. } if stores.is_empty() => continue,
                    _ => break,
                }
            };
            // The later stage's plan, in its own context (as `stage` sets it).
            self.row_extent = match stage.extent.as_slice() {
                [d] => d.as_static(),
                _ => None,
            };
            self.innermost =
                (!stage.extent.is_empty()).then(|| Var::Inner(stage.extent.len() as u32 - 1));
            let holds = Stashed::of(producer);
            if let Some([later]) = self.row_plans(stage).as_deref() {
                let rest = RowShape(later.shape.0 & !UP_TO_FUNCTION);
                if self.row_extent == Some(len)
                    && holds.starts(later)
                    && row_routine(rest, isa).is_some()
                {
                    consumer = Some((s, holds));
                }
            }
            break;
        }
        (self.innermost, self.row_extent) = (innermost, row_extent);
        let Some((consumer, holds)) = consumer else {
            return;
        };
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (len * 4) as u32,
            6,
        ));
        producer.shape = stored;
        producer.routine = row_routine(stored, isa).expect("checked above");
        producer.out_stash = true;
        producer.stream = false;
        self.stash = Some(Stash {
            slot,
            consumer,
            holds,
        });
    }

    /// `e` as GELU's gradient times `g`, in the operations autodiff writes it in and with the
    /// product the loop contracts (see `math::block::rows::gelu_backward`): computed from `t`,
    /// or from the values a GELU forward saved for it (its `erf` argument, `erf(·) + 1` and
    /// `x * 0.5`, each an operand the caller checks is a row).
    fn gelu_grad(&self, e: ExprId) -> Option<GeluGrad> {
        let k = self.kernel;
        if !self.contract || k.ty(e) != ScalarType::F32 {
            return None;
        }
        let mul = |x: ExprId| match *k.expr(x) {
            Expr::Binary(BinaryOp::Mul, a, b) => Some((a, b)),
            _ => None,
        };
        let konst = |x: ExprId, c: f32| matches!(k.expr(x), Expr::Constant { value, .. } if *value as f32 == c);
        // `x * c` or `c * x`: `x`.
        let times = |x: ExprId, c: f32| {
            let (a, b) = mul(x)?;
            if konst(b, c) {
                Some(a)
            } else if konst(a, c) {
                Some(b)
            } else {
                None
            }
        };
        let Expr::Binary(BinaryOp::Add, first, second) = *k.expr(e) else {
            return None;
        };
        // The loop contracts the first operand, a product used only here: `fma(p, 0.5, second)`.
        if self.uses[first.0 as usize] != 1 {
            return None;
        }
        let p = times(first, 0.5)?;
        // `erf(s) + 1`: `s`.
        let erf_plus_one = |x: ExprId| {
            let Expr::Binary(BinaryOp::Add, a, b) = *k.expr(x) else {
                return None;
            };
            let erf = if konst(b, 1.0) {
                a
            } else if konst(a, 1.0) {
                b
            } else {
                return None;
            };
            match *k.expr(erf) {
                Expr::Unary(UnaryOp::Erf, s) => Some(s),
                _ => None,
            }
        };
        // `second = ((g * half_x) * (q * 2/√π)) * (1/√2)`, `q` the flushed `exp(-(s * s))` of
        // autodiff's `erf` rule: `where(m < F, 0, exp(where(m < F, F, m)))`, `m = -(s * s)`,
        // `F` the floor. `gauss(x)` is the `s` of `x = q * 2/√π`.
        let (m, n) = mul(times(second, GELU_SCALE)?)?;
        let gauss = |x: ExprId| {
            let flushed = times(x, TWO_OVER_SQRT_PI)?;
            let minus_square = |m: ExprId| match *k.expr(m) {
                Expr::Unary(UnaryOp::Neg, sq) => mul(sq).filter(|(a, b)| a == b).map(|(a, _)| a),
                _ => None,
            };
            let tiny = |c: ExprId| match *k.expr(c) {
                Expr::Compare(CompareOp::Lt, m, f) if konst(f, ERF_GRAD_FLOOR) => minus_square(m),
                _ => None,
            };
            let Expr::Where(c, zero, exp) = *k.expr(flushed) else {
                return None;
            };
            let Expr::Unary(UnaryOp::Exp, clamped) = *k.expr(exp) else {
                return None;
            };
            let Expr::Where(c2, f, m) = *k.expr(clamped) else {
                return None;
            };
            let s = tiny(c)?;
            let same = konst(zero, 0.0)
                && tiny(c2) == Some(s)
                && konst(f, ERF_GRAD_FLOOR)
                && minus_square(m) == Some(s);
            same.then_some(s)
        };
        let (s, h) = match (gauss(n), gauss(m)) {
            (Some(s), _) => (s, m),
            (None, Some(s)) => (s, n),
            _ => return None,
        };
        // `p = g * (erf(s) + 1)` or `g * one_plus` (saved) and `h = g * half_x`, the same `g`:
        // `(g, one_plus, half_x)`.
        let (a, b) = mul(p)?;
        let (x, y) = mul(h)?;
        let (g, one_plus, half_x) = [(a, b), (b, a)]
            .into_iter()
            .flat_map(|(g, one_plus)| [(g, one_plus, x, y), (g, one_plus, y, x)])
            .find(|&(g, _, h_g, _)| g == h_g)
            .map(|(g, one_plus, _, half_x)| (g, one_plus, half_x))?;
        match erf_plus_one(one_plus) {
            // Computed: `s = t * (1/√2)`, `half_x = t * 0.5`.
            Some(erf_of) if erf_of == s => {
                let t = times(s, GELU_SCALE)?;
                (times(half_x, 0.5) == Some(t)).then_some(GeluGrad::Recomputed { t, g })
            }
            Some(_) => None,
            None => Some(GeluGrad::Saved {
                s,
                g,
                one_plus,
                half_x,
            }),
        }
    }

    /// The bytes of `buffer`, if its size is static.
    fn bytes(&self, buffer: BufferId) -> Option<usize> {
        let buffer = self.program.buffer(buffer);
        buffer.numel()?.checked_mul(buffer.dtype.size_bytes())
    }

    /// The bytes the kernel moves in all: every buffer it loads and every buffer it stores, each
    /// once, if their sizes are static.
    fn traffic(&self) -> Option<usize> {
        (self.kernel.buffers().into_iter())
            .try_fold(0usize, |sum, b| sum.checked_add(self.bytes(b)?))
    }

    /// `e` as a load of contiguous f32s along the row: its buffer and index.
    fn row_load(&self, e: ExprId) -> Option<(BufferId, Affine)> {
        let inner = self.innermost?;
        match self.kernel.expr(e) {
            Expr::Load {
                buffer,
                index,
                indirect: None,
            } if index.coefficient(inner).is(1)
                && (self.program.buffer(*buffer).dtype == DType::F32
                    || self.half_row(*buffer).and_then(widen_routine).is_some()) =>
            {
                Some((*buffer, index.clone()))
            }
            _ => None,
        }
    }

    /// `buffer`'s half type, if it holds f16 or bf16 and the current stage's row is static and
    /// at most [`HALF_ROW`] long (its rows can be converted on the stack).
    fn half_row(&self, buffer: BufferId) -> Option<Half> {
        let half = match self.program.buffer(buffer).dtype {
            DType::F16 => Half::F16,
            DType::BF16 => Half::Bf16,
            _ => return None,
        };
        self.row_extent
            .is_some_and(|n| n <= HALF_ROW * HALF_CHUNKS)
            .then_some(half)
    }

    /// Whether `plan`'s rows are static and past [`HALF_ROW`] with one of them f16 or bf16:
    /// the row is passed to the routine in chunks (see [`Self::row_call`]).
    fn chunked(&self, plan: &RowPlan) -> Option<usize> {
        let half = plan.rows().any(|r| self.half_row(r.0).is_some());
        self.row_extent.filter(|&n| n > HALF_ROW && half)
    }

    /// The f32 row the `k`-th half row of a routine call converts to: a stack buffer of
    /// [`HALF_ROW`] f32s, one per `k` for the whole kernel (the stages' calls come one after the
    /// other, and each is done with its rows when it returns).
    fn half_row_buffer(&mut self, k: usize) -> Value {
        while self.half_rows.len() <= k {
            let slot = self.b.create_sized_stack_slot(StackSlotData::new(
                StackSlotKind::ExplicitSlot,
                (HALF_ROW * 4) as u32,
                6,
            ));
            self.half_rows.push((slot, None));
        }
        self.b.ins().stack_addr(types::I64, self.half_rows[k].0, 0)
    }

    /// Forgets which rows the stack rows hold: all (`None`), or those of `buffer` (written).
    pub(super) fn forget_half_rows(&mut self, buffer: Option<BufferId>) {
        for (_, holds) in &mut self.half_rows {
            if buffer.is_none() || holds.as_ref().map(|h| h.0) == buffer {
                *holds = None;
            }
        }
    }

    /// The call of `plan`'s routine for the current row of stage `n` (`extent` elements): its
    /// result is the stage's, for a reduction. A static row past [`HALF_ROW`] with f16 or bf16
    /// rows ([`Self::chunked`]) takes one call per chunk of `HALF_ROW` elements, each half
    /// row's chunk widened into its stack row first and a half output's narrowed after, and a
    /// reduction's chunk results combined in order (sums added, maxima by `fmax`).
    pub(super) fn row_call(&mut self, n: usize, plan: &RowPlan, extent: Value) {
        // `(offset, length)` of each call; `None`: the whole row, `extent` elements.
        let chunks: Vec<(usize, Option<usize>)> = match self.chunked(plan) {
            Some(total) => (0..total)
                .step_by(HALF_ROW)
                .map(|offset| (offset, Some(HALF_ROW.min(total - offset))))
                .collect(),
            None => vec![(0, None)],
        };
        let whole = chunks.len() == 1;
        let args = self.row_args();
        let flags = self.flags;
        let mut row_flags = if plan.stream { ROW_STREAM } else { 0 };
        if n == 0 && whole && self.row_run.is_none() && self.rows_follow_each_other(plan) {
            row_flags |= ROW_PREFETCH_NEXT;
            self.stage_prefetches[n] = true;
        }
        self.store_row_values(plan, args, row_flags);
        self.store_row_strides(plan, args);
        let stash = |l: &mut Self| {
            let slot = l.stash.as_ref().expect("a stash plan has its row").slot;
            l.b.ins().stack_addr(types::I64, slot, 0)
        };
        // Each row's start; `x` first (the rows a shape does not read point to it).
        let rows = [
            (ROW_ARGS_X, Some(&plan.x).filter(|_| !plan.x_stash)),
            (ROW_ARGS_W, plan.w.as_ref()),
            (ROW_ARGS_B, plan.b.as_ref()),
            (ROW_ARGS_C, plan.c.as_ref()),
            (ROW_ARGS_P, plan.p.as_ref()),
            (ROW_ARGS_Q, plan.q.as_ref()),
        ];
        let mut starts = Vec::new();
        for (field, row) in rows {
            starts.push((field, row.map(|r| (self.row_address(r), r))));
        }
        let out_start = plan.out.as_ref().map(|r| (self.row_address(r), r.0));
        let mut combined: Option<Value> = None;
        for &(offset, len) in &chunks {
            let len = match len {
                Some(len) => self.b.ins().iconst(types::I64, len as i64),
                None => extent,
            };
            let mut halves = 0;
            let mut x = None;
            for &(field, start) in &starts {
                let p = match start {
                    Some((at, row)) => self.row_operand(row, at, offset, len, whole, &mut halves),
                    None if field == ROW_ARGS_X => stash(self),
                    None => x.expect("x comes first"),
                };
                x = x.or(Some(p));
                self.b.ins().store(flags, p, args, field);
            }
            // The output row, or for a half one the f32 row narrowed after the call.
            let mut narrow = None;
            let out = match out_start {
                _ if plan.out_stash => stash(self),
                Some((at, buffer)) => {
                    let at = self.chunk_address(at, buffer, offset);
                    match self.half_row(buffer).and_then(narrow_routine) {
                        Some(routine) => {
                            let scratch = self.half_row_buffer(halves);
                            self.half_rows[halves].1 = None;
                            narrow = Some((routine, scratch, at));
                            scratch
                        }
                        None => at,
                    }
                }
                None => x.expect("x is set"),
            };
            self.b.ins().store(flags, out, args, ROW_ARGS_OUT);
            self.b.ins().store(flags, len, args, ROW_ARGS_N);
            let call = self.call_row_routine(plan, args);
            if plan.shape.reduces() {
                let result = self.b.inst_results(call)[0];
                combined = Some(match combined {
                    None => result,
                    Some(so_far) if plan.shape.0 & RowShape::MAX != 0 => {
                        self.b.ins().fmax(so_far, result)
                    }
                    Some(so_far) => self.b.ins().fadd(so_far, result),
                });
            }
            if let Some((routine, scratch, at)) = narrow {
                self.call_elementwise(routine as usize, scratch, at, len);
            }
        }
        if let Some(result) = combined {
            self.stage_results[n] = Some(self.pin(result));
        }
        if let Some((buffer, _)) = &plan.out {
            // Its rows held widened are stale.
            self.forget_half_rows(Some(*buffer));
        }
        self.forget();
    }

    /// The start of a row call: the row's addresses taken at its first element (the innermost
    /// loop variable at 0), and a fresh stack slot for the routine's arguments, its address.
    fn row_args(&mut self) -> Value {
        self.forget();
        let inner = self.innermost.expect("a row stage has a loop");
        let zero = self.b.ins().iconst(types::I64, 0);
        self.vars.insert(inner, zero);
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            ROW_ARGS_BYTES,
            3,
        ));
        self.b.ins().stack_addr(types::I64, slot, 0)
    }

    /// `start` (a row of `buffer`) moved on by `offset` elements.
    fn chunk_address(&mut self, start: Value, buffer: BufferId, offset: usize) -> Value {
        if offset == 0 {
            return start;
        }
        let bytes = offset * self.program.buffer(buffer).dtype.size_bytes();
        self.b.ins().iadd_imm_s(start, bytes as i64)
    }

    /// Whether `plan` reads its `x` rows from an f32 buffer in which each row is followed by
    /// the next, as far as the index shows: a static row length that is the coefficient of an
    /// outer loop (the routine may then prefetch the next row, [`ROW_PREFETCH_NEXT`]).
    fn rows_follow_each_other(&self, plan: &RowPlan) -> bool {
        let (buffer, index) = &plan.x;
        let Some(inner) = self.innermost else {
            return false;
        };
        let length = match self.kernel.stages.first().map(|s| s.extent.as_slice()) {
            Some([dim]) => dim.as_static(),
            _ => None,
        };
        !plan.x_stash
            && self.program.buffer(*buffer).dtype == DType::F32
            && index.coefficient(inner) == SizeExpr::Const(1)
            && length.is_some_and(|length| {
                index
                    .terms
                    .iter()
                    .any(|(v, c)| *v != inner && *c == SizeExpr::Const(length as i64))
            })
    }

    /// Stores the call's row count and each row's stride (elements between its rows along the
    /// last outer loop) into the arguments at `args`: the current run's ([`Self::row_run`]),
    /// or one row.
    fn store_row_strides(&mut self, plan: &RowPlan, args: Value) {
        let flags = self.flags;
        let last = Var::Outer(self.kernel.outer.len().saturating_sub(1) as u32);
        let run = self.row_run;
        let stride = |l: &mut Self, row: Option<&(BufferId, Affine)>| match (run, row) {
            (Some(_), Some((_, index))) => l.size_value(&index.coefficient(last), 1),
            _ => l.b.ins().iconst(types::I64, 0),
        };
        // A row the shape does not read points to `x`, with its stride.
        let x = stride(self, Some(&plan.x));
        let rows = [
            (ROW_ARGS_W_STRIDE, plan.w.as_ref()),
            (ROW_ARGS_B_STRIDE, plan.b.as_ref()),
            (ROW_ARGS_C_STRIDE, plan.c.as_ref()),
            (ROW_ARGS_P_STRIDE, plan.p.as_ref()),
            (ROW_ARGS_Q_STRIDE, plan.q.as_ref()),
            (ROW_ARGS_OUT_STRIDE, plan.out.as_ref()),
        ];
        self.b.ins().store(flags, x, args, ROW_ARGS_X_STRIDE);
        for (field, row) in rows {
            let v = match row {
                Some(_) => stride(self, row),
                None => x,
            };
            self.b.ins().store(flags, v, args, field);
        }
        let count = match run {
            Some(count) => count,
            None => self.b.ins().iconst(types::I64, 1),
        };
        self.b.ins().store(flags, count, args, ROW_ARGS_ROWS);
    }

    /// Stores `plan`'s row values (`u0` to `u3`) and `row_flags` into the arguments at `args`.
    fn store_row_values(&mut self, plan: &RowPlan, args: Value, row_flags: u32) {
        let flags = self.flags;
        let row_flags = self.b.ins().iconst(types::I32, row_flags as i64);
        self.b.ins().store(flags, row_flags, args, ROW_ARGS_FLAGS);
        // Every byte of the arguments is written: the routine copies the whole struct.
        let zero = self.b.ins().iconst(types::I32, 0);
        self.b.ins().store(flags, zero, args, ROW_ARGS_RESERVED);
        let u0 = match plan.u0 {
            Some(e) => self.scalar_operand(e),
            None => self.b.ins().f32const(0.0),
        };
        let u1 = match plan.u1 {
            Some(Factor::Value(e)) => self.scalar_operand(e),
            Some(Factor::Reciprocal(e)) => {
                let d = self.scalar_operand(e);
                let one = self.b.ins().f32const(1.0);
                self.b.ins().fdiv(one, d)
            }
            Some(Factor::Negated(e)) => {
                let v = self.scalar_operand(e);
                self.b.ins().fneg(v)
            }
            Some(Factor::Constant(v)) => self.b.ins().f32const(v),
            None => self.b.ins().f32const(1.0),
        };
        self.b.ins().store(flags, u0, args, ROW_ARGS_U0);
        self.b.ins().store(flags, u1, args, ROW_ARGS_U1);
        for (at, value, default) in [(ROW_ARGS_U2, plan.u2, 1.0), (ROW_ARGS_U3, plan.u3, 0.0)] {
            let v = match value {
                Some(e) => self.scalar_operand(e),
                None => self.b.ins().f32const(default),
            };
            self.b.ins().store(flags, v, args, at);
        }
    }

    /// The call of `plan`'s routine on the arguments at `args`.
    fn call_row_routine(&mut self, plan: &RowPlan, args: Value) -> cranelift_codegen::ir::Inst {
        let mut sig = Signature::new(self.b.func.signature.call_conv);
        sig.params.push(AbiParam::new(types::I64));
        sig.returns.push(AbiParam::new(types::F32));
        let sig = self.b.import_signature(sig);
        let callee = self
            .b
            .ins()
            .iconst(types::I64, plan.routine as usize as i64);
        self.b.ins().call_indirect(sig, callee, &[args])
    }

    /// Address, as f32s, of `len` elements of `row` (which starts at `start`) from `offset`:
    /// the row itself, or for an f16 or bf16 row those elements widened into the call's next
    /// stack row (`halves` counts them).
    fn row_operand(
        &mut self,
        row: &(BufferId, Affine),
        start: Value,
        offset: usize,
        len: Value,
        whole: bool,
        halves: &mut usize,
    ) -> Value {
        let at = self.chunk_address(start, row.0, offset);
        let Some(routine) = self.half_row(row.0).and_then(widen_routine) else {
            return at;
        };
        let k = *halves;
        *halves += 1;
        let scratch = self.half_row_buffer(k);
        // The stages of a row kernel read the same row one after the other (a softmax's
        // maximum, sum and store): a `whole` row is widened once, for all of them; a chunk
        // each time (the stack row ends holding a chunk, not a row).
        let holds = whole.then(|| row.clone());
        if !whole || self.half_rows[k].1 != holds {
            self.call_elementwise(routine as usize, at, scratch, len);
            self.half_rows[k].1 = holds;
        }
        scratch
    }

    /// Address of the first element of `row` in the current row.
    fn row_address(&mut self, row: &(BufferId, Affine)) -> Value {
        let (invariant, _) = self.split_inner(&row.1);
        self.invariant_address(row.0, &invariant)
    }

    /// The width (bits) of stage vectors for a row routine on this CPU.
    pub(super) fn row_bits() -> u32 {
        block_isa().map_or(128, isa_bits)
    }
}

/// The vector width (bits) of each cost row of `step` on this CPU, as `passes::program_cost`
/// lists them (a GEMM with an epilogue has two rows: the micro-kernel's width, then the
/// epilogue kernel's): see [`kernel_vector_bits`] for kernels; a GEMM's is its micro-kernel's
/// (AVX-512 512, AVX2 256, the portable one 128); the fused attention's 512 with AVX-512 (its
/// portable loops 128); `None` for scatter-adds and fallback steps (scalar loops).
pub fn step_vector_bits(step: &Step, program: &Program) -> Vec<Option<u32>> {
    step_forms(step, program).into_iter().map(|r| r.0).collect()
}

/// For each cost row of `step`: its vector width ([`step_vector_bits`]) and whether it stores
/// around the caches on this CPU (a kernel's or an epilogue's stage does: [`stage_streams`]),
/// lowering each kernel once (for reports, which show both).
pub fn step_forms(step: &Step, program: &Program) -> Vec<(Option<u32>, bool)> {
    let kernel = |k: &Kernel| {
        let forms = stage_forms(k, program);
        let bits = forms.bits.into_iter().flatten().min();
        (bits, forms.streams.contains(&true))
    };
    match step {
        Step::Kernel(k) => vec![kernel(k)],
        Step::Matmul(m) => {
            let gemm = match minductor_kernels::gemm::Kernel::detect() {
                minductor_kernels::gemm::Kernel::Avx512 => 512,
                minductor_kernels::gemm::Kernel::Avx2 => 256,
                minductor_kernels::gemm::Kernel::Portable => 128,
            };
            let mut rows = vec![(Some(gemm), false)];
            if let Some(e) = &m.epilogue {
                rows.push(kernel(e));
            }
            rows
        }
        Step::Attention(_) => {
            let bits = minductor_kernels::attention::Form::detect().bits();
            vec![(Some(bits), false)]
        }
        Step::ScatterAdd(_) | Step::Fallback(_) => vec![(None, false)],
    }
}
