//! `lower_kernel`: one kernel of the kernel IR → one Cranelift function.
//!
//! The function's signature is `fn(buffers: *const *mut u8, params: *const i64, start: i64, end: i64)`:
//! `buffers` holds one pointer per entry of `Kernel::buffers()`, `params` the loop extents and
//! then the symbols the indices read, in the order of `Kernel::params()`, and `start..end` a
//! range of the first outer loop, or of the first few outer loops' iterations flattened in
//! row-major order (`Kernel::split_loops`), so the runtime can split them across threads (a
//! `[4, 256]` domain into up to 1024 pieces, not 4); the loop variables of a flattened range
//! start from `start`'s digits and advance like an odometer. A kernel without outer loops runs
//! once for any non-empty range. Symbolic index coefficients and offsets (size
//! expressions such as `48*s0`) are computed from those symbols once, in the entry block; the
//! kernel-IR verifier proved, for the call's sizes, that every address they form lies inside its
//! buffer (their products, evaluated exactly there, fit in the buffer's extent).
//!
//! Each stage's innermost loop runs four lanes at a time (`f32x4`): `UNROLL` vectors per
//! iteration (independent chains, one accumulator each in a reduction, combined in a fixed
//! order), then one vector per iteration, then a scalar tail that evaluates the very same
//! expressions. The loop-invariant part of every address (base pointer and outer loop terms) is
//! computed once before the innermost loop, and a reduction's result is computed once, after its
//! loop (Cranelift's elaborator would otherwise place pure code at each use, inside later
//! loops). Expressions that do not depend on the innermost
//! loop variable are *uniform*: computed as scalars and splat where they meet vectors. A stage is
//! run scalar-only when it needs a value that has no 4-lane form here (i64 or bool data varying
//! along the innermost loop, a data-dependent index that varies along it).
//!
//! **Invariants.** Values that read no buffer and do not change along the innermost loop (a
//! row's mean, `rsqrt(var + eps)`, the reciprocal of a softmax's sum) are computed once before
//! that loop rather than in every iteration (a division or square root per iteration costs
//! more than the rest of a layer norm's row pass).
//!
//! **Contraction.** Where the host has FMA, `a * b + c`, `a * b - c` and `c - a * b` are one
//! fused multiply-add when the product has no other use (as C compilers contract by default,
//! and Inductor's generated C++ with them): fewer instructions and one rounding instead of two.
//!
//! **Math blocks.** Where the CPU has wider vectors than Cranelift emits (AVX-512, AVX2), a
//! vectorized stage whose innermost loop computes `exp`, `log`, `tanh`, `erf`, `sigmoid`, `sin`
//! or `cos` runs that loop in blocks of [`MATH_BLOCK`] elements: for each level of nested
//! functions, one pass computes the function's arguments into a stack buffer, one call to the
//! ahead-of-time routine (`math::block`) turns them into results in place, and the last pass
//! runs the stage's body, reading those results instead of computing them inline. The
//! routines compute the same operations as the inline form, so results are unchanged; they do
//! it on 16 lanes instead of 4. The same blocks convert half-precision data ([`Conversion`]):
//! f16 and bf16 loads contiguous along the loop are widened into block buffers before the
//! passes, such stores narrowed from block buffers after the last one, and an f32 rounded to a
//! half type is one more math-block function.

//! **Files.** This file holds the types of a lowering and its entry points; the methods live
//! by concern in `lower/`: `loops.rs` (loop nests and hoisting), `emit.rs` (uniformity and the
//! one emitter of an expression's scalar and vector forms), `address.rs` (addresses from affine
//! indices), `memory.rs` (loads, stores and casts), `reduce.rs` (accumulators and their
//! combination), `blocks.rs` (math blocks), `rows.rs` (whole row stages handed to the kernel
//! library's row routines) and `outer.rs` (the outer-reduction loop order).

use crate::convert::{
    emit_bf16_to_f32, emit_f16_to_f32, emit_f32_to_bf16_bits, emit_f32_to_f16_bits,
};
use crate::math::block::{block_routine, BlockFn};
use crate::math::{emit_math, emit_pow, host_has_fma, MathFn, GELU_SCALE};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, AbiParam, Block, ConstantData, Function, InstBuilder, MemFlagsData, Signature,
    StackSlot, StackSlotData, StackSlotKind, Type, Value,
};
use cranelift_frontend::{FunctionBuilder, Variable};
use minductor_ir::{BinaryOp, CompareOp, DType, ReduceOp, SizeExpr, SymId, UnaryOp};
use minductor_kernel_ir::*;
use minductor_kernels::convert::{narrow_routine, round_routine, widen_routine, ConvertFn, Half};
use std::collections::HashMap;

mod address;
mod blocks;
mod emit;
mod loops;
mod memory;
mod outer;
mod reduce;
mod rows;
mod transpose;

use rows::Stash;

pub use rows::{
    kernel_vector_bits, set_row_kernels, set_row_shapes_by_cpu, stage_prefetches, stage_streams,
    stage_vector_bits, step_forms, step_vector_bits, HALF_CHUNKS, HALF_ROW, SHORT_ROW,
};

/// Lanes of the vector type Cranelift lowers on x86-64 (128-bit).
pub const LANES: i64 = 4;

/// Vectors per iteration of the unrolled innermost loop. Each of them has its own accumulator
/// in a reduction, so that independent chains overlap; they are combined in a fixed order.
pub const UNROLL: usize = 4;

/// Elements per math block (see the module docs): a block's buffers stay in L1.
pub const MATH_BLOCK: i64 = 256;

/// A sum's innermost loop accumulates blocks of this many elements into fresh accumulators
/// and adds each block's partial sums into running ones with Kahan compensation (math blocks,
/// if any, are the blocks). Each accumulator lane adds at most `SUM_BLOCK / (LANES * UNROLL)`
/// values in a row, and the compensated running sums lose almost nothing, so the error stays
/// near a block's, whatever the length (PyTorch gets there with a cascade summation): an f32
/// sum of 402,653,184 ones is exact, the mean of 8M uniform values within 1e-7.
pub const SUM_BLOCK: i64 = 1024;

pub fn kernel_signature(sig: &mut Signature) {
    for _ in 0..4 {
        sig.params.push(AbiParam::new(types::I64));
    }
}

/// A loop being emitted: its variable, blocks, and the variable's value in the header.
struct LoopHead {
    var: Variable,
    header: Block,
    body: Block,
    exit: Block,
    i: Value,
}

/// A value in vector mode: a scalar (uniform across lanes) or a 4-lane vector.
#[derive(Clone, Copy)]
enum Val {
    Scalar(Value),
    Vector(Value),
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Scalar,
    Vector,
}

struct Lowering<'k, 'b, 'f> {
    b: &'b mut FunctionBuilder<'f>,
    kernel: &'k Kernel,
    program: &'k Program,
    /// Base pointer of each buffer, by BufferId.
    bases: HashMap<BufferId, Value>,
    /// Current value of each loop variable (the lane-0 value for the vectorised one).
    vars: HashMap<Var, Value>,
    /// The innermost loop variable of the stage being emitted (the vectorised one).
    innermost: Option<Var>,
    stage_results: Vec<Option<Value>>,
    memo: HashMap<ExprId, Val>,
    flags: MemFlagsData,
    /// Elements added along the innermost variable for the unrolled vector being emitted.
    lane_offset: i64,
    /// Whether the body being emitted is the unrolled loop's (its slots come in order
    /// `0..UNROLL` within one iteration).
    unrolled: bool,
    /// The buffer indexes the current stage reads or writes (see `address_sites`).
    sites: Vec<(BufferId, Affine)>,
    /// `base + (index without its innermost term)` of each site, computed before the innermost
    /// loop of the current stage (Cranelift does not hoist it out of the loop by itself).
    hoisted: HashMap<(BufferId, Affine), Value>,
    /// Math-block results available to the current pass: expression → the address of its
    /// block buffer (see the module docs).
    block_values: HashMap<ExprId, Value>,
    /// `1 / c` of uniform divisors in the current loop iteration (see `reciprocal`).
    reciprocals: HashMap<ExprId, Value>,
    /// First element of the math block being emitted (its first row, in the outer order).
    block_start: Option<Value>,
    /// In the outer order, the row variable of the math block being emitted and the values per
    /// row of its buffers (the column group's width): see `outer::math_rows`.
    block_row: Option<(Var, i64)>,
    /// The current stage's math-block functions, by nesting level (innermost first).
    block_levels: Vec<Vec<BlockMath>>,
    /// The current stage's one store, when its value is the outermost level's one math-block
    /// function and its elements are contiguous f32s along the innermost loop: the routine
    /// writes them straight into the output, and the stage needs no pass after the routines
    /// (see [`Lowering::direct_store`]).
    direct_store: Option<Store>,
    /// The current stage's sum accumulators, when it is a sum (see [`SUM_BLOCK`]).
    fold: Option<Fold>,
    /// The current stage's f16 and bf16 loads and stores converted a block at a time (see
    /// [`Conversion`]).
    conversions: Vec<Conversion>,
    /// The current stage's row length, when it has one loop of a static extent (half rows
    /// for the row routines: see `rows.rs`).
    row_extent: Option<usize>,
    /// The stack rows f16 and bf16 rows are widened into for the row routines, shared by the
    /// kernel's stages (see `rows.rs`), and the row each holds at this point of the kernel's
    /// body, if it is still a widened copy of one (the body is emitted once, its stages in
    /// order, so this follows the order they run in).
    half_rows: Vec<(StackSlot, Option<(BufferId, Affine)>)>,
    /// A reduction's row values kept on the stack for a later stage of the same row (see
    /// `rows.rs`, [`Stash`]): set by the stage that stores them, taken by the one that reads
    /// them.
    stash: Option<Stash>,
    /// The block buffers of [`Conversion`]s, shared by the kernel's stages.
    conversion_slots: Vec<StackSlot>,
    /// Uses of each expression (as an operand or a stage's value), for contraction.
    uses: Vec<u32>,
    /// Whether products are contracted into fused multiply-adds (the host has FMA).
    contract: bool,
    /// The current stage's computed values (its reduced value and stored values).
    stage_roots: Vec<ExprId>,
    /// Whether each expression reads no buffer (through any operand).
    load_free: Vec<bool>,
    /// Values computed before the current innermost loop (see "Invariants" in the module docs).
    invariants: HashMap<ExprId, Value>,
    /// `1 / c` for the invariant divisors `c`, computed with them.
    invariant_reciprocals: HashMap<ExprId, Value>,
    /// The value of every symbolic index coefficient and offset, computed in the entry block
    /// from the symbol sizes in `params` (so once per call, dominating every use).
    sizes: HashMap<SizeExpr, Value>,
    /// Whether the kernel runs in the outer-reduction order (see `outer`): the vectorised
    /// variable (`innermost`) is then the last outer loop, and stage results vary along it.
    outer_mode: bool,
    /// In the outer-reduction order, each stage's result for each column slot of the group
    /// being emitted (vectors, or scalars in the scalar column loop).
    outer_results: Vec<Vec<Val>>,
    /// In the outer-reduction order, the column (slot of the group) being emitted.
    column: outer::Column,
    /// In the outer-reduction order, for each stage whose sums the column routine computes
    /// for several groups in one call (see `outer::routine_sums`), while those groups are
    /// emitted: the address of the call's sums and the call's first column.
    routine_sums: Vec<Option<(Value, Value)>>,
    /// The vector width (bits) each stage's loop runs at (`None`: no loop), for reports.
    stage_bits: Vec<Option<u32>>,
    /// Whether each stage's stores bypass the caches (a row routine's `ROW_STREAM`).
    stage_streams: Vec<bool>,
    /// Whether each stage's row routine prefetches the next row (`ROW_PREFETCH_NEXT`).
    stage_prefetches: Vec<bool>,
    /// Leading outer loops that `start..end` ranges over, flattened in row-major order (see
    /// [`lower_kernel`]).
    split: usize,
    /// The kernel as one transposed copy, which the kernel library's routine runs (see
    /// `transpose`).
    transposed: Option<transpose::TransposedCopy>,
    /// Whether the kernel's one stage runs each run of its last outer loop as one row routine
    /// call per plan, over the run's rows (see `rows.rs`, [`Lowering::choose_row_runs`]).
    row_runs: bool,
    /// While such a call is emitted: the run's row count (the last outer loop's variable is at
    /// its first row).
    row_run: Option<Value>,
}

/// A sum's accumulators: the block ones the loop body adds into, reset at each block, and the
/// running ones each block's partial sums are added into, with their Kahan compensations. The
/// running sums live in a stack slot (`sums`, see [`Fold::offset`]), touched once per block:
/// as variables they would hold eight more vector registers through the loop, and spill.
#[derive(Clone)]
struct Fold {
    block: Vec<Variable>,
    block_scalar: Variable,
    /// Address of the running sums and compensations.
    sums: Value,
}

impl Fold {
    /// Bytes of the slot: `UNROLL` running vectors, `UNROLL` compensation vectors, then the
    /// scalar running sum and its compensation.
    const BYTES: u32 = (32 * UNROLL + 8) as u32;

    /// Offset of running (`compensation` false) or compensation vector `slot`, or of the scalar
    /// pair for `slot == UNROLL`.
    fn offset(slot: usize, compensation: bool) -> i32 {
        if slot == UNROLL {
            (32 * UNROLL + if compensation { 4 } else { 0 }) as i32
        } else {
            (16 * (slot + if compensation { UNROLL } else { 0 })) as i32
        }
    }
}

/// A load or store of f16 or bf16 elements contiguous along a vectorised stage's loop, converted
/// a block at a time by the kernel library's routine (`minductor_kernels::convert`) where the
/// CPU has one: before the stage's body, the block's elements are widened into a stack buffer
/// of f32s that the body reads (a load); the body writes f32s there and after it they are
/// narrowed into the output (a store). The routines give the inline conversions' bits (see
/// `blocks.rs`).
#[derive(Clone)]
struct Conversion {
    /// The load expression, or `None` for a store.
    load: Option<ExprId>,
    buffer_id: BufferId,
    index: Affine,
    routine: ConvertFn,
    /// The block buffer's address.
    buffer: Value,
}

/// A function computed in math blocks: the expression, its argument, the routine and the
/// block buffer's address.
#[derive(Clone, Copy)]
struct BlockMath {
    expr: ExprId,
    arg: ExprId,
    routine: BlockFn,
    buffer: Value,
}

/// Emits the body of `kernel` into `b` (whose function has the kernel signature), its range
/// `start..end` over the first `split` outer loops flattened in row-major order (one loop when
/// `split <= 1`: a GEMM epilogue's blocks of rows; `Kernel::split_loops` for a step's kernel).
/// Returns the vector width (bits) of each stage's loop (`None` for a stage without loops).
pub fn lower_kernel(
    b: &mut FunctionBuilder,
    kernel: &Kernel,
    program: &Program,
    split: usize,
) -> StageForms {
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params: Vec<Value> = b.block_params(entry).to_vec();
    let (buffers_ptr, params_ptr, start, end) = (params[0], params[1], params[2], params[3]);
    let flags = MemFlagsData::trusted();
    let mut bases = HashMap::new();
    for (slot, id) in kernel.buffers().into_iter().enumerate() {
        let p = b
            .ins()
            .load(types::I64, flags, buffers_ptr, (slot * 8) as i32);
        bases.insert(id, p);
    }
    let extents: Vec<Value> = (0..kernel.params().len())
        .map(|k| b.ins().load(types::I64, flags, params_ptr, (k * 8) as i32))
        .collect();
    // The symbols come last in `params`, after every loop extent.
    let symbols = kernel.index_symbols();
    let first_symbol = extents.len() - symbols.len();
    let symbol_values: HashMap<SymId, Value> = symbols
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, extents[first_symbol + i]))
        .collect();
    let mut sizes = HashMap::new();
    for e in kernel.size_exprs() {
        if e.as_const().is_none() && !sizes.contains_key(e) {
            let v = emit_size_expr(b, e, &symbol_values);
            sizes.insert(e.clone(), v);
        }
    }
    let mut l = Lowering {
        b,
        kernel,
        program,
        bases,
        vars: HashMap::new(),
        innermost: None,
        stage_results: vec![None; kernel.stages.len()],
        memo: HashMap::new(),
        flags: MemFlagsData::new().with_notrap(),
        lane_offset: 0,
        unrolled: false,
        sites: Vec::new(),
        hoisted: HashMap::new(),
        block_values: HashMap::new(),
        reciprocals: HashMap::new(),
        block_start: None,
        block_levels: Vec::new(),
        conversions: Vec::new(),
        row_extent: None,
        half_rows: Vec::new(),
        stash: None,
        conversion_slots: Vec::new(),
        direct_store: None,
        block_row: None,
        fold: None,
        uses: use_counts(kernel),
        contract: host_has_fma(),
        stage_roots: Vec::new(),
        load_free: load_free(kernel),
        invariants: HashMap::new(),
        invariant_reciprocals: HashMap::new(),
        sizes,
        outer_mode: false,
        outer_results: Vec::new(),
        column: outer::Column::FIRST,
        routine_sums: vec![None; kernel.stages.len()],
        stage_bits: vec![None; kernel.stages.len()],
        stage_streams: vec![false; kernel.stages.len()],
        stage_prefetches: vec![false; kernel.stages.len()],
        split: split.min(kernel.outer.len()),
        transposed: transpose::transposed_copy(kernel, program),
        row_runs: false,
        row_run: None,
    };
    if let Some(copy) = &l.transposed {
        l.stage_bits[0] = Some(copy.bits());
    }
    l.row_runs = l.choose_row_runs();
    let outer = kernel.outer.len();
    if kernel.order == LoopOrder::OuterReduction && outer > 0 {
        l.outer_order(start, end, &extents);
    } else if outer == 0 {
        // Run once if the range is non-empty.
        let body = l.b.create_block();
        let exit = l.b.create_block();
        let nonempty = l.b.ins().icmp(IntCC::SignedLessThan, start, end);
        l.b.ins().brif(nonempty, body, &[], exit, &[]);
        l.b.switch_to_block(body);
        l.stages(&extents[outer..]);
        l.b.ins().jump(exit, &[]);
        l.b.switch_to_block(exit);
    } else {
        l.outer_loops(0, start, end, &extents);
    }
    l.b.ins().return_(&[]);
    l.b.seal_all_blocks();
    StageForms {
        bits: l.stage_bits,
        streams: l.stage_streams,
        prefetches: l.stage_prefetches,
    }
}

/// How [`lower_kernel`] lowered each stage of a kernel, for reports and tests.
pub struct StageForms {
    /// The vector width (bits) of each stage's loop (`None`: no loop).
    pub bits: Vec<Option<u32>>,
    /// Whether each stage's stores bypass the caches.
    pub streams: Vec<bool>,
    /// Whether each stage's row routine prefetches the next row.
    pub prefetches: Vec<bool>,
}

/// How often each expression of `kernel` is used: as an operand, a stage's reduced value or
/// a stored value.
fn use_counts(kernel: &Kernel) -> Vec<u32> {
    let mut uses = vec![0u32; kernel.exprs.len()];
    for e in &kernel.exprs {
        for o in e.operands() {
            uses[o.0 as usize] += 1;
        }
    }
    for stage in &kernel.stages {
        for root in stage.action.roots() {
            uses[root.0 as usize] += 1;
        }
    }
    uses
}

/// For each expression of `kernel`, whether it reads no buffer through any operand.
fn load_free(kernel: &Kernel) -> Vec<bool> {
    let mut free = vec![true; kernel.exprs.len()];
    // Operands precede their users (the verifier checks it), so one pass in order suffices.
    for (i, e) in kernel.exprs.iter().enumerate() {
        free[i] = !matches!(e, Expr::Load { .. })
            && e.operands()
                .iter()
                .all(|o| free.get(o.0 as usize) == Some(&true));
    }
    free
}

/// The math function a unary op computes, if it is one.
fn math_fn(op: UnaryOp) -> Option<MathFn> {
    Some(match op {
        UnaryOp::Exp => MathFn::Exp,
        UnaryOp::Log => MathFn::Log,
        UnaryOp::Sin => MathFn::Sin,
        UnaryOp::Cos => MathFn::Cos,
        UnaryOp::Tanh => MathFn::Tanh,
        UnaryOp::Erf => MathFn::Erf,
        UnaryOp::Sigmoid => MathFn::Sigmoid,
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Rsqrt => return None,
    })
}

/// A fresh function with the kernel signature.
pub fn kernel_function(call_conv: cranelift_codegen::isa::CallConv) -> Function {
    let mut sig = Signature::new(call_conv);
    kernel_signature(&mut sig);
    Function::with_name_signature(Default::default(), sig)
}

/// Emits `e` (a polynomial in the symbols) from the symbols' values.
fn emit_size_expr(b: &mut FunctionBuilder, e: &SizeExpr, symbols: &HashMap<SymId, Value>) -> Value {
    let mut acc: Option<Value> = None;
    for (monomial, coefficient) in e.terms() {
        let mut term: Option<Value> = None;
        for s in &monomial {
            let v = symbols[s];
            term = Some(match term {
                None => v,
                Some(t) => b.ins().imul(t, v),
            });
        }
        let term = match term {
            None => b.ins().iconst(types::I64, coefficient),
            Some(t) if coefficient == 1 => t,
            Some(t) => b.ins().imul_imm_s(t, coefficient),
        };
        acc = Some(match acc {
            None => term,
            Some(a) => b.ins().iadd(a, term),
        });
    }
    acc.unwrap_or_else(|| b.ins().iconst(types::I64, 0))
}
