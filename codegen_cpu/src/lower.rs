//! `lower_kernel`: one kernel of the kernel IR → one Cranelift function.
//!
//! The function's signature is `fn(buffers: *const *mut u8, params: *const i64, start: i64, end: i64)`:
//! `buffers` holds one pointer per entry of `Kernel::buffers()`, `params` the loop extents and
//! then the symbols the indices read, in the order of `Kernel::params()`, and `start..end` the
//! range of the first outer loop (so the runtime can split it across threads; a kernel without
//! outer loops runs once for any non-empty range). Symbolic index coefficients and offsets (size
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
//! it on 16 lanes instead of 4.

use crate::convert::{
    emit_bf16_to_f32, emit_f16_to_f32, emit_f32_to_bf16_bits, emit_f32_to_f16_bits,
};
use crate::math::block::{block_routine, BlockFn};
use crate::math::{emit_math, emit_pow, host_has_fma, MathFn, GELU_SCALE};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, AbiParam, Block, ConstantData, Function, InstBuilder, MemFlagsData, Signature,
    StackSlotData, StackSlotKind, Type, Value,
};
use cranelift_frontend::{FunctionBuilder, Variable};
use minductor_ir::{BinaryOp, CompareOp, DType, ReduceOp, SizeExpr, SymId, UnaryOp};
use minductor_kernel_ir::*;
use std::collections::HashMap;

mod outer;
mod rows;

pub use rows::{kernel_vector_bits, set_row_kernels, step_vector_bits};

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
    /// The vector width (bits) each stage's loop runs at (`None`: no loop), for reports.
    stage_bits: Vec<Option<u32>>,
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

/// A function computed in math blocks: the expression, its argument, the routine and the
/// block buffer's address.
#[derive(Clone, Copy)]
struct BlockMath {
    expr: ExprId,
    arg: ExprId,
    routine: BlockFn,
    buffer: Value,
}

/// Emits the body of `kernel` into `b` (whose function has the kernel signature). Returns the
/// vector width (bits) of each stage's loop (`None` for a stage without loops).
pub fn lower_kernel(
    b: &mut FunctionBuilder,
    kernel: &Kernel,
    program: &Program,
) -> Vec<Option<u32>> {
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
    for index in kernel.indices() {
        for e in index.size_exprs() {
            if e.as_const().is_none() && !sizes.contains_key(e) {
                let v = emit_size_expr(b, e, &symbol_values);
                sizes.insert(e.clone(), v);
            }
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
        stage_bits: vec![None; kernel.stages.len()],
    };
    let outer = kernel.outer.len();
    if kernel.order == LoopOrder::OuterReduction && outer > 0 {
        // Cranelift's 4-lane vectors along the columns, for every stage.
        l.stage_bits = vec![Some(128); kernel.stages.len()];
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
    l.stage_bits
}

impl Lowering<'_, '_, '_> {
    fn outer_loops(&mut self, level: usize, start: Value, end: Value, extents: &[Value]) {
        let outer = self.kernel.outer.len();
        if level == outer {
            self.stages(&extents[outer..]);
            return;
        }
        let (lo, hi) = if level == 0 {
            (start, end)
        } else {
            (self.b.ins().iconst(types::I64, 0), extents[level])
        };
        self.counted_loop(lo, hi, 1, |l, i| {
            l.vars.insert(Var::Outer(level as u32), i);
            l.outer_loops(level + 1, start, end, extents);
        });
    }

    /// `for i in (lo..hi).step_by(step)` where the body runs only while `i + step <= hi`.
    /// Returns the first `i` the body did not run for.
    fn counted_loop(
        &mut self,
        lo: Value,
        hi: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Value),
    ) -> Value {
        let head = self.loop_head(lo);
        let next = self.b.ins().iadd_imm_s(head.i, step);
        let go = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, hi);
        self.b.ins().brif(go, head.body, &[], head.exit, &[]);
        self.b.switch_to_block(head.body);
        self.forget();
        body(self, head.i);
        self.forget();
        let i = self.b.use_var(head.var);
        let next = self.b.ins().iadd_imm_s(i, step);
        self.loop_tail(&head, next);
        self.b.use_var(head.var)
    }

    /// The head of a loop over an i64 variable starting at `lo`: its header, body and exit
    /// blocks, with the builder left in the header, where the variable's value is `i`.
    fn loop_head(&mut self, lo: Value) -> LoopHead {
        let var = self.b.declare_var(types::I64);
        self.b.def_var(var, lo);
        let header = self.b.create_block();
        let body = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let i = self.b.use_var(var);
        LoopHead {
            var,
            header,
            body,
            exit,
            i,
        }
    }

    /// The end of a loop's body: the variable takes `next`, back to the header; the builder
    /// continues after the loop.
    fn loop_tail(&mut self, head: &LoopHead, next: Value) {
        self.b.def_var(head.var, next);
        self.b.ins().jump(head.header, &[]);
        self.b.switch_to_block(head.exit);
    }

    /// A stage loop above the innermost: `Var::Inner(level)` over `0..extents[level]`, `deeper`
    /// inside (both stage loop orders nest their levels this way).
    fn enclosing_loop(
        &mut self,
        level: usize,
        extents: &[Value],
        mut deeper: impl FnMut(&mut Self),
    ) {
        let zero = self.b.ins().iconst(types::I64, 0);
        let var = Var::Inner(level as u32);
        self.counted_loop(zero, extents[level], 1, |l, i| {
            l.vars.insert(var, i);
            deeper(l);
        });
    }

    fn stages(&mut self, extents: &[Value]) {
        let mut offset = 0;
        for (n, stage) in self.kernel.stages.iter().enumerate() {
            let ext = &extents[offset..offset + stage.extent.len()];
            offset += stage.extent.len();
            self.stage(n, stage, ext);
        }
        self.stage_results.iter_mut().for_each(|r| *r = None);
    }

    fn stage(&mut self, n: usize, stage: &Stage, extents: &[Value]) {
        let depth = extents.len();
        self.innermost = if depth == 0 {
            None
        } else {
            Some(Var::Inner(depth as u32 - 1))
        };
        if let Some(plans) = self.row_plans(stage) {
            self.stage_bits[n] = Some(Self::row_bits());
            for plan in &plans {
                self.row_call(n, plan, extents[0]);
            }
            self.hoisted.clear();
            return;
        }
        let vector = depth > 0 && self.vectorizable(stage);
        self.stage_bits[n] = (depth > 0).then_some(if vector { 128 } else { 32 });
        self.block_levels = if vector {
            self.block_math(stage)
        } else {
            Vec::new()
        };
        self.direct_store = self.direct_store(stage);
        self.sites = self.address_sites(stage);
        self.stage_roots = stage.action.roots();
        match &stage.action {
            StageAction::Reduce { op, value, stores } => {
                let (op, value) = (*op, *value);
                let scalar_acc = self.b.declare_var(types::F32);
                let c = self.reduce_init(op, types::F32);
                self.b.def_var(scalar_acc, c);
                let v = self.b.ins().splat(types::F32X4, c);
                let vector_accs: Vec<_> = (0..UNROLL)
                    .map(|_| {
                        let acc = self.b.declare_var(types::F32X4);
                        self.b.def_var(acc, v);
                        acc
                    })
                    .collect();
                // Vector max/min use a compare and select (one `maxps`/`minps`, which drops a NaN
                // `x`) and note NaN lanes in this mask, instead of the 8-instruction NaN-exact
                // `fmax`/`fmin`; the result is NaN if any lane saw one, as with `fmax`.
                let nan_lanes = self.b.declare_var(types::I32X4);
                let zero = self.b.ins().iconst(types::I32, 0);
                let none = self.b.ins().splat(types::I32X4, zero);
                self.b.def_var(nan_lanes, none);
                // (A stage without loops has nothing to block.)
                if op == ReduceOp::Sum && depth > 0 {
                    let slot = self.b.create_sized_stack_slot(StackSlotData::new(
                        StackSlotKind::ExplicitSlot,
                        Fold::BYTES,
                        4,
                    ));
                    let sums = self.b.ins().stack_addr(types::I64, slot, 0);
                    for k in 0..UNROLL {
                        for comp in [false, true] {
                            self.b
                                .ins()
                                .store(self.flags, v, sums, Fold::offset(k, comp));
                        }
                    }
                    for comp in [false, true] {
                        self.b
                            .ins()
                            .store(self.flags, c, sums, Fold::offset(UNROLL, comp));
                    }
                    self.fold = Some(Fold {
                        block: vector_accs.clone(),
                        block_scalar: scalar_acc,
                        sums,
                    });
                }
                // In the unrolled loop, one unordered compare covers two slots' vectors (it is
                // true where either lane is NaN): even slots leave theirs here for the next.
                const { assert!(UNROLL.is_multiple_of(2)) };
                let mut unpaired: Option<Value> = None;
                let product = self.summed_product(op, value);
                self.inner_loops(0, extents, vector, &mut |l, mode, slot| {
                    if let Some((a, c)) = product {
                        let (a, c) = l.f32_operands(a, c, mode);
                        let var = match mode {
                            Mode::Vector => vector_accs[slot],
                            Mode::Scalar => scalar_acc,
                        };
                        let acc = l.b.use_var(var);
                        let r = l.b.ins().fma(a, c, acc);
                        l.b.def_var(var, r);
                        for st in stores {
                            let v = l.emit(st.value, mode);
                            l.store(st, v, mode);
                        }
                        return;
                    }
                    let x = l.emit(value, mode);
                    for st in stores {
                        let v = l.emit(st.value, mode);
                        l.store(st, v, mode);
                    }
                    match (mode, x) {
                        (Mode::Vector, x) => {
                            let x = l.vector_of(x, ScalarType::F32);
                            let acc = l.b.use_var(vector_accs[slot]);
                            let r = if op == ReduceOp::Sum {
                                l.b.ins().fadd(acc, x)
                            } else {
                                let cc = if op == ReduceOp::Max {
                                    FloatCC::LessThan
                                } else {
                                    FloatCC::GreaterThan
                                };
                                let take = l.b.ins().fcmp(cc, acc, x);
                                let take = l.bitcast(types::F32X4, take);
                                let other = match (l.unrolled, slot % 2, unpaired.take()) {
                                    (true, 0, _) => {
                                        unpaired = Some(x);
                                        None
                                    }
                                    (true, _, Some(prev)) => Some(prev),
                                    _ => Some(x),
                                };
                                if let Some(other) = other {
                                    let nan = l.b.ins().fcmp(FloatCC::Unordered, other, x);
                                    let seen = l.b.use_var(nan_lanes);
                                    let seen = l.b.ins().bor(seen, nan);
                                    l.b.def_var(nan_lanes, seen);
                                }
                                l.b.ins().bitselect(take, x, acc)
                            };
                            l.b.def_var(vector_accs[slot], r);
                        }
                        (Mode::Scalar, Val::Scalar(x)) | (Mode::Scalar, Val::Vector(x)) => {
                            let acc = l.b.use_var(scalar_acc);
                            let r = l.combine(op, acc, x);
                            l.b.def_var(scalar_acc, r);
                        }
                    }
                });
                let (mut accs, scalar): (Vec<Value>, Value) = match self.fold.take() {
                    Some(fold) => {
                        let flags = self.flags;
                        let accs = (0..UNROLL)
                            .map(|k| {
                                let at = Fold::offset(k, false);
                                self.b.ins().load(types::F32X4, flags, fold.sums, at)
                            })
                            .collect();
                        let at = Fold::offset(UNROLL, false);
                        (accs, self.b.ins().load(types::F32, flags, fold.sums, at))
                    }
                    None => (
                        vector_accs.iter().map(|&a| self.b.use_var(a)).collect(),
                        self.b.use_var(scalar_acc),
                    ),
                };
                // Fixed combine order: a pairwise tree over the unrolled accumulators, then
                // over the lanes, then the scalar tail.
                while accs.len() > 1 {
                    accs = accs
                        .chunks(2)
                        .map(|pair| match pair {
                            [a, c] => self.combine(op, *a, *c),
                            [a] => *a,
                            _ => unreachable!(),
                        })
                        .collect();
                }
                let acc = accs[0];
                let lanes: Vec<Value> = (0..4)
                    .map(|i| self.b.ins().extractlane(acc, i as u8))
                    .collect();
                let lo = self.combine(op, lanes[0], lanes[1]);
                let hi = self.combine(op, lanes[2], lanes[3]);
                let v = self.combine(op, lo, hi);
                let result = self.combine(op, v, scalar);
                let result = if op == ReduceOp::Sum {
                    result
                } else {
                    let seen = self.b.use_var(nan_lanes);
                    let any = self.b.ins().vany_true(seen);
                    let nan = self.b.ins().f32const(f32::NAN);
                    self.b.ins().select(any, nan, result)
                };
                self.stage_results[n] = Some(self.pin(result));
            }
            StageAction::Scan(store) => {
                // One element at a time, in order: the running sum lives in a variable, in f64
                // (as PyTorch's CPU cumsum accumulates floats in `acc_type`, double), each
                // stored element rounded once from it.
                let acc = self.b.declare_var(types::F64);
                let zero = self.b.ins().f64const(0.0);
                self.b.def_var(acc, zero);
                self.inner_loops(0, extents, false, &mut |l, _, _| {
                    let x = l.scalar_operand(store.value);
                    let x = l.b.ins().fpromote(types::F64, x);
                    let sum = l.b.use_var(acc);
                    let sum = l.b.ins().fadd(sum, x);
                    l.b.def_var(acc, sum);
                    let rounded = l.b.ins().fdemote(types::F32, sum);
                    l.store(store, Val::Scalar(rounded), Mode::Scalar);
                });
            }
            StageAction::Store(stores) => {
                self.inner_loops(0, extents, vector, &mut |l, mode, _| {
                    // Every value before any store: a store may overwrite in place an element
                    // that a later value still loads (math blocks hand a function's result over
                    // without evaluating its argument, so the argument's load can come after).
                    let values: Vec<Val> = stores.iter().map(|st| l.emit(st.value, mode)).collect();
                    for (st, v) in stores.iter().zip(values) {
                        l.store(st, v, mode);
                    }
                });
            }
        }
        self.hoisted.clear();
    }

    /// Loops over the stage's extents. The innermost runs `UNROLL` vectors per iteration, then
    /// one vector per iteration, then a scalar tail; `body` gets the mode and the unroll slot
    /// (`0..UNROLL`; the single-vector and scalar loops use slot 0).
    fn inner_loops(
        &mut self,
        level: usize,
        extents: &[Value],
        vector: bool,
        body: &mut dyn FnMut(&mut Self, Mode, usize),
    ) {
        if extents.is_empty() {
            self.forget();
            body(self, Mode::Scalar, 0);
            self.forget();
            return;
        }
        if level + 1 < extents.len() {
            self.enclosing_loop(level, extents, |l| {
                l.inner_loops(level + 1, extents, vector, body)
            });
            return;
        }
        let zero = self.b.ins().iconst(types::I64, 0);
        let var = Var::Inner(level as u32);
        self.hoist_addresses();
        self.hoist_invariants();
        if !self.block_levels.is_empty() || self.fold.is_some() {
            let levels = std::mem::take(&mut self.block_levels);
            let direct = self.direct_store.take();
            let direct = direct.as_ref();
            let fold = self.fold.clone();
            let step = if levels.is_empty() {
                SUM_BLOCK
            } else {
                MATH_BLOCK
            };
            self.block_loop(zero, extents[level], step, |l, start, end| {
                if let Some(fold) = &fold {
                    l.reset_block_sums(fold);
                }
                l.block_start = Some(start);
                for functions in &levels {
                    // Arguments into the block buffers, then the routines in place.
                    l.range_loops(var, start, end, true, &mut |l, mode, _| {
                        for m in functions {
                            let v = l.emit(m.arg, mode);
                            l.store_block(m.buffer, v, mode);
                        }
                    });
                    let n = l.b.ins().isub(end, start);
                    for m in functions {
                        if let Some(st) = direct.filter(|st| st.value == m.expr) {
                            // The routine writes the block's elements of the output itself.
                            l.vars.insert(var, start);
                            let dst = l.address(st.buffer, &st.index, None, 0);
                            l.call_block(m, dst, n);
                        } else {
                            l.call_block(m, m.buffer, n);
                            l.block_values.insert(m.expr, m.buffer);
                        }
                    }
                }
                if direct.is_none() {
                    l.range_loops(var, start, end, vector, body);
                }
                l.block_values.clear();
                l.block_start = None;
                if let Some(fold) = &fold {
                    l.add_block_sums(fold);
                }
            });
            self.block_levels = levels;
            self.direct_store = direct.cloned();
            self.drop_invariants();
            return;
        }
        self.range_loops(var, zero, extents[level], vector, body);
        self.drop_invariants();
    }

    /// Computes the stage's load-free values that do not vary along the innermost loop, here,
    /// before it (with the reciprocals of those that divide), for `emit` to reuse inside.
    fn hoist_invariants(&mut self) {
        self.drop_invariants();
        let mut ids = self.kernel.reachable(&self.stage_roots);
        ids.sort_by_key(|e| e.0);
        for &e in &ids {
            let worth = matches!(
                self.kernel.expr(e),
                Expr::Unary(..)
                    | Expr::Binary(..)
                    | Expr::Compare(..)
                    | Expr::Where(..)
                    | Expr::Cast(..)
                    | Expr::StageResult(_)
            );
            if worth && self.load_free[e.0 as usize] && self.is_uniform(e) {
                let v = self.scalar_operand(e);
                let v = self.pin(v);
                self.invariants.insert(e, v);
            }
        }
        for &e in &ids {
            if let Expr::Binary(BinaryOp::Div, a, c) = *self.kernel.expr(e) {
                if self.divides_by_uniform(a, c, self.kernel.ty(e)) {
                    if let Some(&d) = self.invariants.get(&c) {
                        let one = self.b.ins().f32const(1.0);
                        let r = self.b.ins().fdiv(one, d);
                        let r = self.pin(r);
                        self.invariant_reciprocals.insert(c, r);
                    }
                }
            }
        }
        self.forget();
    }

    /// Forgets the values [`Self::hoist_invariants`] computed (they do not dominate the code
    /// after the loop they were computed for).
    fn drop_invariants(&mut self) {
        self.invariants.clear();
        self.invariant_reciprocals.clear();
    }

    /// The innermost loop over `lo..hi`: `UNROLL` vectors per iteration, then one vector per
    /// iteration (when `vector`), then a scalar tail.
    fn range_loops(
        &mut self,
        var: Var,
        lo: Value,
        hi: Value,
        vector: bool,
        body: &mut dyn FnMut(&mut Self, Mode, usize),
    ) {
        let tail_start = if vector {
            let unrolled_end = self.counted_loop(lo, hi, LANES * UNROLL as i64, |l, i| {
                l.vars.insert(var, i);
                l.unrolled = true;
                for slot in 0..UNROLL {
                    // Values uniform along the innermost loop are shared by the slots.
                    l.memo.retain(|_, v| matches!(v, Val::Scalar(_)));
                    l.lane_offset = slot as i64 * LANES;
                    body(l, Mode::Vector, slot);
                }
                l.unrolled = false;
                l.lane_offset = 0;
            });
            self.counted_loop(unrolled_end, hi, LANES, |l, i| {
                l.vars.insert(var, i);
                body(l, Mode::Vector, 0);
            })
        } else {
            lo
        };
        self.counted_loop(tail_start, hi, 1, |l, i| {
            l.vars.insert(var, i);
            body(l, Mode::Scalar, 0);
        });
    }

    /// `for start in (lo..hi).step_by(step)` with `end = min(start + step, hi)`: every element
    /// of `lo..hi` in one block, the last block possibly short.
    fn block_loop(
        &mut self,
        lo: Value,
        hi: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Value, Value),
    ) {
        let head = self.loop_head(lo);
        let go = self.b.ins().icmp(IntCC::SignedLessThan, head.i, hi);
        self.b.ins().brif(go, head.body, &[], head.exit, &[]);
        self.b.switch_to_block(head.body);
        let next = self.b.ins().iadd_imm_s(head.i, step);
        let full = self.b.ins().icmp(IntCC::SignedLessThan, next, hi);
        let end = self.b.ins().select(full, next, hi);
        self.forget();
        body(self, head.i, end);
        self.forget();
        self.loop_tail(&head, next);
    }

    /// Zeroes the block accumulators of a sum.
    fn reset_block_sums(&mut self, fold: &Fold) {
        let zero = self.b.ins().f32const(0.0);
        let zeros = self.b.ins().splat(types::F32X4, zero);
        for &acc in &fold.block {
            self.b.def_var(acc, zeros);
        }
        self.b.def_var(fold.block_scalar, zero);
    }

    /// Adds a block's partial sums into the running ones (Kahan: the compensation keeps what
    /// each addition rounded away and takes it off the next block's partial sum).
    fn add_block_sums(&mut self, fold: &Fold) {
        for k in 0..=UNROLL {
            let (block, ty) = if k == UNROLL {
                (fold.block_scalar, types::F32)
            } else {
                (fold.block[k], types::F32X4)
            };
            let b = self.b.use_var(block);
            self.kahan_add(
                fold.sums,
                Fold::offset(k, false),
                Fold::offset(k, true),
                b,
                ty,
            );
        }
    }

    /// Adds `x` into the running sum at `sums + at_r` with Kahan compensation (kept at
    /// `sums + at_c`), for one value of type `ty` (f32 or f32x4). Row sums (`add_block_sums`)
    /// and outer-order column sums (`outer.rs`) both fold their blocks through it.
    fn kahan_add(&mut self, sums: Value, at_r: i32, at_c: i32, x: Value, ty: Type) {
        let flags = self.flags;
        let r = self.b.ins().load(ty, flags, sums, at_r);
        let c = self.b.ins().load(ty, flags, sums, at_c);
        let y = self.b.ins().fsub(x, c);
        let t = self.b.ins().fadd(r, y);
        let rounded = self.b.ins().fsub(t, r);
        let c = self.b.ins().fsub(rounded, y);
        // Past an infinity the compensation is NaN (inf - inf): drop it, so the sum stays
        // inf as an uncompensated one would.
        let zero = self.f32_like(0.0, ty);
        let d = self.b.ins().fsub(c, c);
        let finite = self.b.ins().fcmp(FloatCC::Equal, d, zero);
        let c = if ty.is_vector() {
            let finite = self.bitcast(ty, finite);
            self.b.ins().bitselect(finite, c, zero)
        } else {
            self.b.ins().select(finite, c, zero)
        };
        self.b.ins().store(flags, t, sums, at_r);
        self.b.ins().store(flags, c, sums, at_c);
    }

    /// Address of the current element(s) in a math-block buffer: element `i - start` along the
    /// innermost loop, or in the outer order, row `r - start`, column `lane_offset` of the group.
    fn block_address(&mut self, buffer: Value) -> Value {
        let start = self.block_start.expect("inside a math block");
        let (var, width) = match self.block_row {
            Some(row) => row,
            None => (
                self.innermost
                    .expect("math blocks run in an innermost loop"),
                1,
            ),
        };
        let i = self.vars[&var];
        let k = self.b.ins().isub(i, start);
        let bytes = self.b.ins().imul_imm_s(k, 4 * width);
        let address = self.b.ins().iadd(buffer, bytes);
        if self.lane_offset != 0 {
            self.b.ins().iadd_imm_s(address, self.lane_offset * 4)
        } else {
            address
        }
    }

    fn store_block(&mut self, buffer: Value, v: Val, mode: Mode) {
        let address = self.block_address(buffer);
        let v = match mode {
            Mode::Vector => self.vector_of(v, ScalarType::F32),
            Mode::Scalar => match v {
                Val::Scalar(x) => x,
                Val::Vector(_) => unreachable!("scalar mode yields scalars"),
            },
        };
        self.b.ins().store(self.flags, v, address, 0);
    }

    fn load_block(&mut self, buffer: Value, mode: Mode) -> Val {
        let address = self.block_address(buffer);
        match mode {
            Mode::Vector => Val::Vector(self.b.ins().load(types::F32X4, self.flags, address, 0)),
            Mode::Scalar => Val::Scalar(self.b.ins().load(types::F32, self.flags, address, 0)),
        }
    }

    /// `routine(buffer, dst, n)`: the block's results go to `dst`, `n` f32s (the block buffer
    /// itself, replacing the arguments, or the stage's output: see `direct_store`).
    fn call_block(&mut self, m: &BlockMath, dst: Value, n: Value) {
        let mut sig = Signature::new(self.b.func.signature.call_conv);
        for _ in 0..3 {
            sig.params.push(AbiParam::new(types::I64));
        }
        let sig = self.b.import_signature(sig);
        let callee = self.b.ins().iconst(types::I64, m.routine as usize as i64);
        self.b.ins().call_indirect(sig, callee, &[m.buffer, dst, n]);
    }

    /// Forgets the values emitted so far (they do not dominate the code that follows).
    fn forget(&mut self) {
        self.memo.clear();
        self.reciprocals.clear();
    }

    /// `x` passed through a stack slot, so that it is computed here, once. Cranelift's
    /// elaborator otherwise places pure instructions at their uses, and it would recompute a
    /// reduction's final combine (four branchy NaN-aware `fmax` for a max), a row's `1/sum` or
    /// `rsqrt(var)`, or a row's base address in every iteration of the (unrolled, vector and
    /// scalar) loops that use it: a division per 16 elements.
    fn pin(&mut self, x: Value) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            ty.bytes(),
            ty.bytes().trailing_zeros() as u8,
        ));
        self.b.ins().stack_store(types::I64, x, slot, 0);
        self.b.ins().stack_load(types::I64, ty, slot, 0)
    }

    /// The identity of `op`, as a value of type `ty` (f32 or f32x4).
    fn reduce_init(&mut self, op: ReduceOp, ty: Type) -> Value {
        let init = match op {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        };
        self.f32_like(init, ty)
    }

    /// For a sum of a product used only there (a variance's squares), its factors: accumulated
    /// with one FMA (where the host has FMA).
    fn summed_product(&self, op: ReduceOp, value: ExprId) -> Option<(ExprId, ExprId)> {
        match *self.kernel.expr(value) {
            Expr::Binary(BinaryOp::Mul, a, c)
                if op == ReduceOp::Sum
                    && self.contract
                    && self.kernel.ty(value) == ScalarType::F32
                    && self.uses[value.0 as usize] == 1 =>
            {
                Some((a, c))
            }
            _ => None,
        }
    }

    /// `a` and `c` as f32 vectors (`Mode::Vector`) or scalars.
    fn f32_operands(&mut self, a: ExprId, c: ExprId, mode: Mode) -> (Value, Value) {
        match mode {
            Mode::Vector => {
                let a = self.emit(a, mode);
                let c = self.emit(c, mode);
                (
                    self.vector_of(a, ScalarType::F32),
                    self.vector_of(c, ScalarType::F32),
                )
            }
            Mode::Scalar => (self.scalar_operand(a), self.scalar_operand(c)),
        }
    }

    fn combine(&mut self, op: ReduceOp, a: Value, x: Value) -> Value {
        match op {
            ReduceOp::Sum => self.b.ins().fadd(a, x),
            ReduceOp::Max => self.b.ins().fmax(a, x),
            ReduceOp::Min => self.b.ins().fmin(a, x),
        }
    }

    // ---- analysis -----------------------------------------------------------------------------

    fn is_uniform(&self, e: ExprId) -> bool {
        let Some(inner) = self.innermost else {
            return true;
        };
        match self.kernel.expr(e) {
            Expr::Load {
                index, indirect, ..
            } => !index.uses(inner) && indirect.as_ref().is_none_or(|i| self.is_uniform(i.value)),
            Expr::Constant { .. } => true,
            // In the outer-reduction order a stage's result is one per column.
            Expr::StageResult(_) => !self.outer_mode,
            Expr::Index(index) => !index.uses(inner),
            Expr::Unary(_, a) | Expr::Cast(_, a) => self.is_uniform(*a),
            Expr::Binary(_, a, c) | Expr::Compare(_, a, c) => {
                self.is_uniform(*a) && self.is_uniform(*c)
            }
            Expr::Where(c, a, d) => {
                self.is_uniform(*c) && self.is_uniform(*a) && self.is_uniform(*d)
            }
        }
    }

    /// The stage's functions that math blocks compute (non-uniform, with a routine on this CPU),
    /// grouped by nesting level, each with a fresh block buffer.
    /// `e` as a composite of one argument that a math routine computes whole — `gelu` and
    /// `silu`, in the operations `decompose` writes them in, so that the routine's result is
    /// bit for bit the expression's — when nothing else uses its inner values:
    /// `(argument, function)`.
    fn composite(&self, e: ExprId) -> Option<(ExprId, MathFn)> {
        let k = self.kernel;
        if k.ty(e) != ScalarType::F32 {
            return None;
        }
        let single = |x: ExprId| self.uses[x.0 as usize] == 1;
        let is_const = |x: ExprId, c: f32| matches!(k.expr(x), Expr::Constant { value, .. } if *value as f32 == c);
        // `x ∘ c` or `c ∘ x` for a binary `op` and constant `c`: `x`.
        let with_const = |m: ExprId, op: BinaryOp, c: f32| match *k.expr(m) {
            Expr::Binary(o, a, b) if o == op && is_const(b, c) => Some(a),
            Expr::Binary(o, a, b) if o == op && is_const(a, c) => Some(b),
            _ => None,
        };
        let Expr::Binary(BinaryOp::Mul, p, q) = *k.expr(e) else {
            return None;
        };
        for (p, q) in [(p, q), (q, p)] {
            // gelu: (x * 0.5) * (erf(x * GELU_SCALE) + 1)
            let erf_of = with_const(q, BinaryOp::Add, 1.0).filter(|&r| single(r));
            if let (Some(x), Some(r)) = (with_const(p, BinaryOp::Mul, 0.5), erf_of) {
                if let Expr::Unary(UnaryOp::Erf, s) = *k.expr(r) {
                    let scaled = with_const(s, BinaryOp::Mul, GELU_SCALE);
                    if scaled == Some(x) && single(p) && single(q) && single(s) {
                        return Some((x, MathFn::Gelu));
                    }
                }
            }
            // silu: x * sigmoid(x)
            if let Expr::Unary(UnaryOp::Sigmoid, x) = *k.expr(q) {
                if x == p && single(q) {
                    return Some((x, MathFn::Silu));
                }
            }
        }
        None
    }

    /// The store a math routine can write itself (see the `direct_store` field): a stage of
    /// one store, of an f32 buffer at a unit stride along the innermost loop, whose value is
    /// the only function of the outermost math-block level.
    fn direct_store(&self, stage: &Stage) -> Option<Store> {
        let StageAction::Store(stores) = &stage.action else {
            return None;
        };
        let ([st], Some([m])) = (
            stores.as_slice(),
            self.block_levels.last().map(Vec::as_slice),
        ) else {
            return None;
        };
        let inner = self.innermost?;
        let contiguous = st.index.coefficient(inner).is(1);
        let f32_out = self.program.buffer(st.buffer).dtype == DType::F32;
        (st.value == m.expr && contiguous && f32_out).then(|| st.clone())
    }

    fn block_math(&mut self, stage: &Stage) -> Vec<Vec<BlockMath>> {
        let roots = stage.action.roots();
        // Nesting level of each function reached: 1 + the deepest function in its argument.
        let mut level: HashMap<ExprId, usize> = HashMap::new();
        let mut found: Vec<(ExprId, ExprId, BlockFn)> = Vec::new();
        fn depth(
            l: &Lowering,
            e: ExprId,
            level: &mut HashMap<ExprId, usize>,
            found: &mut Vec<(ExprId, ExprId, BlockFn)>,
        ) -> usize {
            if let Some(&d) = level.get(&e) {
                return d;
            }
            let composite = l
                .composite(e)
                .and_then(|(arg, f)| Some((arg, block_routine(f)?)));
            let d = if l.is_uniform(e) {
                0
            } else if let Some((arg, routine)) = composite {
                // The whole expression in one routine: its inner values are never emitted.
                let inner = depth(l, arg, level, found);
                found.push((e, arg, routine));
                inner + 1
            } else {
                let inner = l
                    .kernel
                    .expr(e)
                    .operands()
                    .into_iter()
                    .map(|a| depth(l, a, level, found))
                    .max()
                    .unwrap_or(0);
                match (l.kernel.expr(e), l.kernel.ty(e)) {
                    (Expr::Unary(op, a), ScalarType::F32) => {
                        match math_fn(*op).and_then(block_routine) {
                            Some(routine) => {
                                found.push((e, *a, routine));
                                inner + 1
                            }
                            None => inner,
                        }
                    }
                    _ => inner,
                }
            };
            level.insert(e, d);
            d
        }
        for r in roots {
            depth(self, r, &mut level, &mut found);
        }
        let mut levels: Vec<Vec<BlockMath>> = Vec::new();
        for (expr, arg, routine) in found {
            let slot = self.b.create_sized_stack_slot(StackSlotData::new(
                StackSlotKind::ExplicitSlot,
                (MATH_BLOCK * 4) as u32,
                4,
            ));
            let buffer = self.b.ins().stack_addr(types::I64, slot, 0);
            let d = level[&expr];
            if levels.len() < d {
                levels.resize_with(d, Vec::new);
            }
            levels[d - 1].push(BlockMath {
                expr,
                arg,
                routine,
                buffer,
            });
        }
        levels
    }

    /// Every (buffer, index) the stage loads (without a data-dependent part) or stores.
    fn address_sites(&self, stage: &Stage) -> Vec<(BufferId, Affine)> {
        let mut sites: Vec<(BufferId, Affine)> = stage
            .action
            .stores()
            .iter()
            .map(|st| (st.buffer, st.index.clone()))
            .collect();
        let mut stack = stage.action.roots();
        let mut seen = std::collections::HashSet::new();
        while let Some(e) = stack.pop() {
            if !seen.insert(e) {
                continue;
            }
            match self.kernel.expr(e) {
                Expr::Load {
                    buffer,
                    index,
                    indirect,
                } => {
                    sites.push((*buffer, index.clone()));
                    if let Some(ind) = indirect {
                        stack.push(ind.value);
                    }
                }
                other => stack.extend(other.operands()),
            }
        }
        sites
    }

    /// Whether every value the stage needs has a 4-lane form.
    fn vectorizable(&self, stage: &Stage) -> bool {
        if matches!(stage.action, StageAction::Scan(_)) {
            // A scan runs one element at a time.
            return false;
        }
        for st in stage.action.stores() {
            if !self.program.buffer(st.buffer).dtype.is_float() {
                return false;
            }
        }
        let mut stack = stage.action.roots();
        while let Some(e) = stack.pop() {
            if self.is_uniform(e) {
                continue;
            }
            let ty = self.kernel.ty(e);
            if ty == ScalarType::I64 {
                return false;
            }
            match self.kernel.expr(e) {
                Expr::Load {
                    buffer, indirect, ..
                } => {
                    if !self.program.buffer(*buffer).dtype.is_float() || indirect.is_some() {
                        return false;
                    }
                }
                Expr::Cast(to, a) => {
                    if *to == DType::I64 || self.kernel.ty(*a) == ScalarType::I64 {
                        return false;
                    }
                    stack.push(*a);
                }
                // The lane steps of an index are constants in the code: a symbolic innermost
                // coefficient runs scalar.
                Expr::Index(index)
                    if self
                        .innermost
                        .is_some_and(|v| index.coefficient(v).as_const().is_none()) =>
                {
                    return false;
                }
                other => stack.extend(other.operands()),
            }
        }
        true
    }

    // ---- expressions --------------------------------------------------------------------------

    fn emit(&mut self, e: ExprId, mode: Mode) -> Val {
        if let Some(&v) = self.memo.get(&e) {
            return v;
        }
        if let Some(&v) = self.invariants.get(&e) {
            return Val::Scalar(v);
        }
        if let Some(&buffer) = self.block_values.get(&e) {
            let v = self.load_block(buffer, mode);
            self.memo.insert(e, v);
            return v;
        }
        let uniform = mode == Mode::Scalar || self.is_uniform(e);
        let v = if uniform {
            Val::Scalar(self.emit_in(e, Mode::Scalar))
        } else {
            Val::Vector(self.emit_in(e, Mode::Vector))
        };
        self.memo.insert(e, v);
        v
    }

    /// Whether `a / c` varies along the innermost loop while `c` does not: then it is computed
    /// as `a * (1/c)`, one division per row instead of one per element (as PyTorch's softmax
    /// does; within 1.5 ulp of the quotient). Scalar tails do the same, so lanes agree.
    fn divides_by_uniform(&self, a: ExprId, c: ExprId, ty: ScalarType) -> bool {
        ty == ScalarType::F32 && !self.is_uniform(a) && self.is_uniform(c)
    }

    /// `a ± c` as a fused `x * y ± z`: `(x, y, z, negate_product)`, where the product is `a`
    /// (`negate_product` false) or, for `a - x*y`, `c` (then the product is negated), when it
    /// is an f32 multiply used only here and the host has FMA.
    fn contraction(
        &self,
        op: BinaryOp,
        a: ExprId,
        c: ExprId,
    ) -> Option<(ExprId, ExprId, ExprId, bool)> {
        if !self.contract || self.kernel.ty(a) != ScalarType::F32 {
            return None;
        }
        let product = |e: ExprId| match self.kernel.expr(e) {
            Expr::Binary(BinaryOp::Mul, x, y)
                if self.uses[e.0 as usize] == 1 && !self.memo.contains_key(&e) =>
            {
                Some((*x, *y))
            }
            _ => None,
        };
        if let Some((x, y)) = product(a) {
            return Some((x, y, c, false));
        }
        match (op, product(c)) {
            (BinaryOp::Add, Some((x, y))) => Some((x, y, a, false)),
            (BinaryOp::Sub, Some((x, y))) => Some((x, y, a, true)),
            _ => None,
        }
    }

    /// `x*y + z` (`Add`), `x*y - z` (`Sub`), or `z - x*y` (`Sub`, `negate_product`), fused.
    fn fused(&mut self, x: Value, y: Value, z: Value, op: BinaryOp, negate_product: bool) -> Value {
        if negate_product {
            let nx = self.b.ins().fneg(x);
            return self.b.ins().fma(nx, y, z);
        }
        let z = if op == BinaryOp::Sub {
            self.b.ins().fneg(z)
        } else {
            z
        };
        self.b.ins().fma(x, y, z)
    }

    /// `1 / c` for a uniform `c`, once per loop iteration (shared by the unrolled vectors).
    fn reciprocal(&mut self, c: ExprId) -> Value {
        if let Some(&r) = self.invariant_reciprocals.get(&c) {
            return r;
        }
        if let Some(&r) = self.reciprocals.get(&c) {
            return r;
        }
        let d = self.scalar_operand(c);
        let one = self.b.ins().f32const(1.0);
        let r = self.b.ins().fdiv(one, d);
        self.reciprocals.insert(c, r);
        r
    }

    fn scalar_operand(&mut self, e: ExprId) -> Value {
        match self.emit(e, Mode::Scalar) {
            Val::Scalar(v) => v,
            Val::Vector(_) => unreachable!("scalar mode yields scalars"),
        }
    }

    /// `index` without its innermost-variable term, and that term's coefficient.
    fn split_inner(&self, index: &Affine) -> (Affine, SizeExpr) {
        match self.innermost {
            Some(inner) if index.uses(inner) => {
                let mut invariant = index.clone();
                invariant.terms.retain(|(v, _)| *v != inner);
                (invariant, index.coefficient(inner))
            }
            _ => (index.clone(), SizeExpr::Const(0)),
        }
    }

    /// `v · c · k`, for a size expression `c` (a number, or computed in the entry block).
    fn scaled(&mut self, v: Value, c: &SizeExpr, k: i64) -> Value {
        match c.as_const() {
            Some(c) => self.b.ins().imul_imm_s(v, c * k),
            None => {
                let ck = self.symbolic_times(c, k);
                self.b.ins().imul(v, ck)
            }
        }
    }

    /// `c · k` for a symbolic size expression `c` (computed in the entry block).
    fn symbolic_times(&mut self, c: &SizeExpr, k: i64) -> Value {
        let c = self.sizes[c];
        if k == 1 {
            c
        } else {
            self.b.ins().imul_imm_s(c, k)
        }
    }

    /// `x + c · k` for a size expression `c`.
    fn add_scaled(&mut self, x: Value, c: &SizeExpr, k: i64) -> Value {
        match c.as_const() {
            Some(0) => x,
            Some(c) => self.b.ins().iadd_imm_s(x, c * k),
            None => {
                let ck = self.symbolic_times(c, k);
                self.b.ins().iadd(x, ck)
            }
        }
    }

    /// `base(buffer) + index` in bytes, for an index without the innermost variable.
    fn invariant_address(&mut self, buffer: BufferId, index: &Affine) -> Value {
        if let Some(&a) = self.hoisted.get(&(buffer, index.clone())) {
            return a;
        }
        let size = self.program.buffer(buffer).dtype.size_bytes() as i64;
        let mut address = self.bases[&buffer];
        for (var, coef) in &index.terms {
            let v = self.vars[var];
            let scaled = self.scaled(v, coef, size);
            address = self.b.ins().iadd(address, scaled);
        }
        self.add_scaled(address, &index.offset, size)
    }

    /// Computes the loop-invariant part of every address of the current stage, here (before
    /// its innermost loop), for `address` to use inside the loop.
    fn hoist_addresses(&mut self) {
        self.hoisted.clear();
        for (buffer, index) in std::mem::take(&mut self.sites) {
            let (invariant, _) = self.split_inner(&index);
            if !self.hoisted.contains_key(&(buffer, invariant.clone())) {
                let a = self.invariant_address(buffer, &invariant);
                let a = self.pin(a);
                self.hoisted.insert((buffer, invariant.clone()), a);
            }
            self.sites.push((buffer, index));
        }
    }

    /// Address of element `index` (+ `lane` and the unroll slot's offset along the innermost
    /// var) of `buffer`.
    fn address(
        &mut self,
        buffer: BufferId,
        index: &Affine,
        indirect: Option<&Indirect>,
        lane: i64,
    ) -> Value {
        let size = self.program.buffer(buffer).dtype.size_bytes() as i64;
        let (invariant, coef) = self.split_inner(index);
        let mut address = self.invariant_address(buffer, &invariant);
        if !coef.is_zero() {
            let inner = self
                .innermost
                .expect("a coefficient implies an innermost var");
            let v = self.vars[&inner];
            let scaled = self.scaled(v, &coef, size);
            address = self.b.ins().iadd(address, scaled);
            let lane = lane + self.lane_offset;
            if lane != 0 {
                address = self.add_scaled(address, &coef, lane * size);
            }
        }
        if let Some(ind) = indirect {
            // Clamp the data-dependent index into the table: JIT code never reads outside a buffer.
            let i = self.scalar_operand(ind.value);
            let zero = self.b.ins().iconst(types::I64, 0);
            let last = self.b.ins().iconst(types::I64, ind.bound - 1);
            let i = self.b.ins().smax(i, zero);
            let i = self.b.ins().smin(i, last);
            let scaled = self.b.ins().imul_imm_s(i, ind.stride * size);
            address = self.b.ins().iadd(address, scaled);
        }
        address
    }

    fn load_scalar(&mut self, buffer: BufferId, addr: Value) -> Value {
        let f = self.flags;
        match self.program.buffer(buffer).dtype {
            DType::F32 => self.b.ins().load(types::F32, f, addr, 0),
            // Kernels compute floats in f32 (`fuse` refuses f64 graphs; this keeps lowering total).
            DType::F64 => {
                let wide = self.b.ins().load(types::F64, f, addr, 0);
                self.b.ins().fdemote(types::F32, wide)
            }
            DType::F16 => {
                let bits = self.b.ins().uload16(types::I32, f, addr, 0);
                emit_f16_to_f32(self.b, bits)
            }
            DType::BF16 => {
                let bits = self.b.ins().uload16(types::I32, f, addr, 0);
                emit_bf16_to_f32(self.b, bits)
            }
            DType::I64 => self.b.ins().load(types::I64, f, addr, 0),
            DType::Bool => {
                let byte = self.b.ins().load(types::I8, f, addr, 0);
                self.b.ins().icmp_imm_s(IntCC::NotEqual, byte, 0)
            }
        }
    }

    /// `e`'s operand `a` in `mode`: a scalar, or a vector (a uniform operand splat).
    fn operand(&mut self, a: ExprId, mode: Mode) -> Value {
        match mode {
            Mode::Scalar => self.scalar_operand(a),
            Mode::Vector => self.vector_operand(a),
        }
    }

    /// The value of `e` computed once for all lanes (`Mode::Scalar`: an `F32`, `I64` or `I8`
    /// value) or lane by lane (`Mode::Vector`: an `F32X4`, or an `I32X4` mask for bool). One
    /// emitter serves both forms, so the scalar tail and the vector body perform the same
    /// operations in the same order and agree bit for bit; only loads, constants, indices,
    /// stage results, selects and casts differ by form.
    fn emit_in(&mut self, e: ExprId, mode: Mode) -> Value {
        let ty = self.kernel.ty(e);
        match self.kernel.expr(e).clone() {
            Expr::Load {
                buffer,
                index,
                indirect,
            } => match mode {
                Mode::Scalar => {
                    let addr = self.address(buffer, &index, indirect.as_ref(), 0);
                    self.load_scalar(buffer, addr)
                }
                Mode::Vector => self.load_vector(buffer, &index, indirect.as_ref()),
            },
            Expr::Constant { .. } if mode == Mode::Vector => unreachable!("constants are uniform"),
            Expr::Constant { value, ty } => match ty {
                ScalarType::F32 => self.b.ins().f32const(value as f32),
                ScalarType::I64 => self.b.ins().iconst(types::I64, value as i64),
                ScalarType::Bool => self.b.ins().iconst(types::I8, (value != 0.0) as i64),
            },
            Expr::StageResult(n) if self.outer_mode => match mode {
                Mode::Scalar => self.outer_result_scalar(n),
                Mode::Vector => self.outer_result_vector(n),
            },
            Expr::StageResult(_) if mode == Mode::Vector => {
                unreachable!("stage results are uniform outside the outer-reduction order")
            }
            Expr::StageResult(n) => {
                self.stage_results[n as usize].expect("stages run in dependency order")
            }
            Expr::Index(index) => match mode {
                Mode::Scalar => {
                    let i = self.index_value(&index);
                    match ty {
                        ScalarType::F32 => self.b.ins().fcvt_from_sint(types::F32, i),
                        _ => i,
                    }
                }
                Mode::Vector => self.index_vector(&index),
            },
            Expr::Unary(op, a) => {
                let a = self.operand(a, mode);
                self.unary(op, a, ty)
            }
            Expr::Binary(BinaryOp::Div, a, c) if self.divides_by_uniform(a, c, ty) => {
                let a = self.operand(a, mode);
                let r = self.reciprocal(c);
                let r = match mode {
                    Mode::Scalar => r,
                    Mode::Vector => self.b.ins().splat(types::F32X4, r),
                };
                self.b.ins().fmul(a, r)
            }
            Expr::Binary(op @ (BinaryOp::Add | BinaryOp::Sub), a, c)
                if self.contraction(op, a, c).is_some() =>
            {
                let (x, y, z, negate_product) = self.contraction(op, a, c).expect("checked");
                let (x, y, z) = (
                    self.operand(x, mode),
                    self.operand(y, mode),
                    self.operand(z, mode),
                );
                self.fused(x, y, z, op, negate_product)
            }
            Expr::Binary(op, a, c) => {
                let (a, c) = (self.operand(a, mode), self.operand(c, mode));
                self.binary(op, a, c, ty)
            }
            Expr::Compare(op, a, c) => {
                let operand_ty = self.kernel.ty(a);
                let (a, c) = (self.operand(a, mode), self.operand(c, mode));
                let mask = self.compare(op, a, c, operand_ty);
                match mode {
                    Mode::Scalar => mask,
                    Mode::Vector => self.bitcast(types::I32X4, mask),
                }
            }
            Expr::Where(c, a, d) => {
                let (c, a, d) = (
                    self.operand(c, mode),
                    self.operand(a, mode),
                    self.operand(d, mode),
                );
                match mode {
                    Mode::Scalar => self.b.ins().select(c, a, d),
                    Mode::Vector => {
                        // Bool operands are i32x4 masks, float ones f32x4: the mask takes their
                        // type.
                        let operand_type = self.b.func.dfg.value_type(a);
                        let mask = self.bitcast(operand_type, c);
                        self.b.ins().bitselect(mask, a, d)
                    }
                }
            }
            Expr::Cast(to, a) => {
                let from = self.kernel.ty(a);
                let a = self.operand(a, mode);
                match mode {
                    Mode::Scalar => self.cast_scalar(to, from, a),
                    Mode::Vector => self.cast_vector(to, from, a),
                }
            }
        }
    }

    fn cast_scalar(&mut self, to: DType, from: ScalarType, a: Value) -> Value {
        match (to, from) {
            (DType::F64 | DType::F32 | DType::F16 | DType::BF16, ScalarType::I64) => {
                let f = self.b.ins().fcvt_from_sint(types::F32, a);
                self.round_to(to, f)
            }
            (DType::F64 | DType::F32 | DType::F16 | DType::BF16, ScalarType::Bool) => {
                let one = self.b.ins().f32const(1.0);
                let zero = self.b.ins().f32const(0.0);
                self.b.ins().select(a, one, zero)
            }
            (DType::F64 | DType::F32 | DType::F16 | DType::BF16, ScalarType::F32) => {
                self.round_to(to, a)
            }
            (DType::I64, ScalarType::F32) => self.b.ins().fcvt_to_sint_sat(types::I64, a),
            (DType::I64, ScalarType::Bool) => self.b.ins().uextend(types::I64, a),
            (DType::I64, ScalarType::I64) => a,
            (DType::Bool, ScalarType::F32) => {
                let zero = self.b.ins().f32const(0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, a, zero)
            }
            (DType::Bool, ScalarType::I64) => self.b.ins().icmp_imm_s(IntCC::NotEqual, a, 0),
            (DType::Bool, ScalarType::Bool) => a,
        }
    }

    /// Rounds an f32 (scalar or vector) to the value set of `to`.
    fn round_to(&mut self, to: DType, x: Value) -> Value {
        match to {
            DType::F16 => {
                let bits = emit_f32_to_f16_bits(self.b, x);
                emit_f16_to_f32(self.b, bits)
            }
            DType::BF16 => {
                let bits = emit_f32_to_bf16_bits(self.b, x);
                emit_bf16_to_f32(self.b, bits)
            }
            _ => x,
        }
    }

    fn unary(&mut self, op: UnaryOp, a: Value, ty: ScalarType) -> Value {
        let vty = self.b.func.dfg.value_type(a);
        if ty == ScalarType::I64 {
            return match op {
                UnaryOp::Neg => self.b.ins().ineg(a),
                UnaryOp::Abs => self.b.ins().iabs(a),
                _ => unreachable!("type rules allow only neg/abs on integers"),
            };
        }
        match op {
            UnaryOp::Neg => self.b.ins().fneg(a),
            UnaryOp::Abs => self.b.ins().fabs(a),
            UnaryOp::Sqrt => self.b.ins().sqrt(a),
            UnaryOp::Rsqrt => {
                let s = self.b.ins().sqrt(a);
                let one = self.f32_like(1.0, vty);
                self.b.ins().fdiv(one, s)
            }
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tanh
            | UnaryOp::Erf
            | UnaryOp::Sigmoid => {
                let f = math_fn(op).expect("a math op");
                emit_math(self.b, f, a)
            }
        }
    }

    fn binary(&mut self, op: BinaryOp, a: Value, c: Value, ty: ScalarType) -> Value {
        if ty == ScalarType::I64 {
            return match op {
                BinaryOp::Add => self.b.ins().iadd(a, c),
                BinaryOp::Sub => self.b.ins().isub(a, c),
                BinaryOp::Mul => self.b.ins().imul(a, c),
                BinaryOp::Maximum => self.b.ins().smax(a, c),
                BinaryOp::Minimum => self.b.ins().smin(a, c),
                BinaryOp::Div | BinaryOp::Pow => unreachable!("type rules forbid integer div/pow"),
            };
        }
        match op {
            BinaryOp::Add => self.b.ins().fadd(a, c),
            BinaryOp::Sub => self.b.ins().fsub(a, c),
            BinaryOp::Mul => self.b.ins().fmul(a, c),
            BinaryOp::Div => self.b.ins().fdiv(a, c),
            BinaryOp::Maximum => self.b.ins().fmax(a, c),
            BinaryOp::Minimum => self.b.ins().fmin(a, c),
            BinaryOp::Pow => emit_pow(self.b, a, c),
        }
    }

    fn compare(&mut self, op: CompareOp, a: Value, c: Value, operand: ScalarType) -> Value {
        if operand == ScalarType::F32 {
            let cc = match op {
                CompareOp::Eq => FloatCC::Equal,
                CompareOp::Ne => FloatCC::NotEqual,
                CompareOp::Lt => FloatCC::LessThan,
                CompareOp::Le => FloatCC::LessThanOrEqual,
                CompareOp::Gt => FloatCC::GreaterThan,
                CompareOp::Ge => FloatCC::GreaterThanOrEqual,
            };
            self.b.ins().fcmp(cc, a, c)
        } else {
            let cc = match op {
                CompareOp::Eq => IntCC::Equal,
                CompareOp::Ne => IntCC::NotEqual,
                CompareOp::Lt => IntCC::SignedLessThan,
                CompareOp::Le => IntCC::SignedLessThanOrEqual,
                CompareOp::Gt => IntCC::SignedGreaterThan,
                CompareOp::Ge => IntCC::SignedGreaterThanOrEqual,
            };
            self.b.ins().icmp(cc, a, c)
        }
    }

    fn f32_like(&mut self, v: f32, ty: Type) -> Value {
        let c = self.b.ins().f32const(v);
        if ty.is_vector() {
            self.b.ins().splat(ty, c)
        } else {
            c
        }
    }

    // ---- vector mode --------------------------------------------------------------------------

    /// `v` as a 4-lane vector of the kernel type `ty` (f32x4, or an i32x4 mask for bool).
    fn vector_of(&mut self, v: Val, ty: ScalarType) -> Value {
        match v {
            Val::Vector(x) => x,
            Val::Scalar(x) => match ty {
                ScalarType::F32 => self.b.ins().splat(types::F32X4, x),
                ScalarType::Bool => {
                    let all = self.b.ins().iconst(types::I32, -1);
                    let none = self.b.ins().iconst(types::I32, 0);
                    let lane = self.b.ins().select(x, all, none);
                    self.b.ins().splat(types::I32X4, lane)
                }
                ScalarType::I64 => unreachable!("i64 values are never vectorised"),
            },
        }
    }

    fn vector_operand(&mut self, e: ExprId) -> Value {
        let v = self.emit(e, Mode::Vector);
        let ty = self.kernel.ty(e);
        self.vector_of(v, ty)
    }

    /// `x` (a vector of kernel type `from`) cast to `to`, lane by lane (`vectorizable` keeps
    /// i64 casts scalar).
    fn cast_vector(&mut self, to: DType, from: ScalarType, x: Value) -> Value {
        match (to, from) {
            (DType::F32 | DType::F16 | DType::BF16, ScalarType::F32) => self.round_to(to, x),
            (DType::F64 | DType::F32 | DType::F16 | DType::BF16, ScalarType::Bool) => {
                let one = self.f32_like(1.0, types::F32X4);
                let mask = self.bitcast(types::F32X4, x);
                self.b.ins().band(mask, one)
            }
            (DType::Bool, ScalarType::F32) => {
                let zero = self.f32_like(0.0, types::F32X4);
                let m = self.b.ins().fcmp(FloatCC::NotEqual, x, zero);
                self.bitcast(types::I32X4, m)
            }
            (DType::Bool, ScalarType::Bool) => x,
            _ => unreachable!("vectorizable() excludes i64 casts"),
        }
    }

    /// The f32 vector of `index` at the current loop variables: lane 0's value, splat, plus
    /// `[0, c, 2c, 3c]` for the innermost coefficient `c`.
    fn index_vector(&mut self, index: &Affine) -> Value {
        let inner = self.innermost.expect("vector mode has an innermost loop");
        let c = index
            .coefficient(inner)
            .as_const()
            .expect("vectorizable() keeps symbolic innermost index coefficients scalar");
        let i = self.index_value(index);
        let f = self.b.ins().fcvt_from_sint(types::F32, i);
        let base = self.b.ins().splat(types::F32X4, f);
        // One constant from the pool (inserting lanes costs an instruction each).
        let bytes: Vec<u8> = (0..LANES)
            .flat_map(|lane| ((lane * c) as f32).to_le_bytes())
            .collect();
        let handle = self.b.func.dfg.constants.insert(ConstantData::from(bytes));
        let steps = self.b.ins().vconst(types::F32X4, handle);
        self.b.ins().fadd(base, steps)
    }

    /// The i64 value of `index` at the current loop variables (lane 0 of the unroll slot).
    fn index_value(&mut self, index: &Affine) -> Value {
        let zero = self.b.ins().iconst(types::I64, 0);
        let mut acc = self.add_scaled(zero, &index.offset, 1);
        for (var, coef) in &index.terms {
            let v = self.vars[var];
            let scaled = self.scaled(v, coef, 1);
            acc = self.b.ins().iadd(acc, scaled);
            if Some(*var) == self.innermost && self.lane_offset != 0 {
                acc = self.add_scaled(acc, coef, self.lane_offset);
            }
        }
        acc
    }

    fn bitcast(&mut self, to: Type, v: Value) -> Value {
        if self.b.func.dfg.value_type(v) == to {
            return v;
        }
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        self.b.ins().bitcast(to, flags, v)
    }

    fn load_vector(
        &mut self,
        buffer: BufferId,
        index: &Affine,
        indirect: Option<&Indirect>,
    ) -> Value {
        let inner = self.innermost.expect("vector mode has an innermost loop");
        let dtype = self.program.buffer(buffer).dtype;
        let addr = self.address(buffer, index, indirect, 0);
        if index.coefficient(inner).is(1) {
            let f = self.flags;
            match dtype {
                DType::F32 => return self.b.ins().load(types::F32X4, f, addr, 0),
                DType::F16 | DType::BF16 => {
                    let bits = self.b.ins().uload16x4(f, addr, 0);
                    let bits = self.bitcast(types::I32X4, bits);
                    return if dtype == DType::F16 {
                        emit_f16_to_f32(self.b, bits)
                    } else {
                        emit_bf16_to_f32(self.b, bits)
                    };
                }
                _ => unreachable!("vectorizable() admits float buffers only"),
            }
        }
        // Strided: gather the four lanes.
        let mut v = None;
        for lane in 0..LANES {
            let a = self.address(buffer, index, indirect, lane);
            let x = self.load_scalar(buffer, a);
            v = Some(match v {
                None => self.b.ins().scalar_to_vector(types::F32X4, x),
                Some(acc) => self.b.ins().insertlane(acc, x, lane as u8),
            });
        }
        v.unwrap()
    }

    fn store(&mut self, st: &Store, v: Val, mode: Mode) {
        let dtype = self.program.buffer(st.buffer).dtype;
        let f = self.flags;
        if mode == Mode::Scalar || !dtype.is_float() {
            let x = match v {
                Val::Scalar(x) => x,
                Val::Vector(_) => unreachable!("non-float stores run scalar"),
            };
            let addr = self.address(st.buffer, &st.index, None, 0);
            self.store_scalar(dtype, x, addr);
            return;
        }
        let inner = self.innermost.expect("vector mode has an innermost loop");
        let x = self.vector_of(v, ScalarType::F32);
        if st.index.coefficient(inner).is(1) {
            let addr = self.address(st.buffer, &st.index, None, 0);
            match dtype {
                DType::F32 => {
                    self.b.ins().store(f, x, addr, 0);
                }
                DType::F16 | DType::BF16 => {
                    let bits = if dtype == DType::F16 {
                        emit_f32_to_f16_bits(self.b, x)
                    } else {
                        emit_f32_to_bf16_bits(self.b, x)
                    };
                    let packed = self.b.ins().unarrow(bits, bits);
                    let wide = self.bitcast(types::I64X2, packed);
                    let low = self.b.ins().extractlane(wide, 0);
                    self.b.ins().store(f, low, addr, 0);
                }
                _ => unreachable!(),
            }
            return;
        }
        for lane in 0..LANES {
            let addr = self.address(st.buffer, &st.index, None, lane);
            let s = self.b.ins().extractlane(x, lane as u8);
            self.store_scalar(dtype, s, addr);
        }
    }

    fn store_scalar(&mut self, dtype: DType, x: Value, addr: Value) {
        let f = self.flags;
        match dtype {
            DType::F32 | DType::I64 => {
                self.b.ins().store(f, x, addr, 0);
            }
            DType::F64 => {
                let wide = self.b.ins().fpromote(types::F64, x);
                self.b.ins().store(f, wide, addr, 0);
            }
            DType::F16 | DType::BF16 => {
                let bits = if dtype == DType::F16 {
                    emit_f32_to_f16_bits(self.b, x)
                } else {
                    emit_f32_to_bf16_bits(self.b, x)
                };
                self.b.ins().istore16(f, bits, addr, 0);
            }
            DType::Bool => {
                let byte = self.b.ins().uextend(types::I32, x);
                self.b.ins().istore8(f, byte, addr, 0);
            }
        }
    }
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
