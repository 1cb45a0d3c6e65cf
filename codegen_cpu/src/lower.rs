//! `lower_kernel`: one kernel of the kernel IR → one Cranelift function.
//!
//! The function's signature is `fn(buffers: *const *mut u8, params: *const i64, start: i64, end: i64)`:
//! `buffers` holds one pointer per entry of `Kernel::buffers()`, `params` the loop extents in the
//! order of `Kernel::params()`, and `start..end` the range of the first outer loop (so the runtime
//! can split it across threads; a kernel without outer loops runs once for any non-empty range).
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

use crate::convert::{
    emit_bf16_to_f32, emit_f16_to_f32, emit_f32_to_bf16_bits, emit_f32_to_f16_bits,
};
use crate::math::{emit_math, emit_pow, MathFn};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, AbiParam, Function, InstBuilder, MemFlagsData, Signature, StackSlotData, StackSlotKind,
    Type, Value,
};
use cranelift_frontend::FunctionBuilder;
use minductor_ir::{BinaryOp, CompareOp, DType, ReduceOp, UnaryOp};
use minductor_passes::kernel::*;
use std::collections::HashMap;

/// Lanes of the vector type Cranelift lowers on x86-64 (128-bit).
pub const LANES: i64 = 4;

/// Vectors per iteration of the unrolled innermost loop. Each of them has its own accumulator
/// in a reduction, so that independent chains overlap; they are combined in a fixed order.
pub const UNROLL: usize = 4;

pub fn kernel_signature(sig: &mut Signature) {
    for _ in 0..4 {
        sig.params.push(AbiParam::new(types::I64));
    }
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
    /// The buffer indexes the current stage reads or writes (see `address_sites`).
    sites: Vec<(BufferId, Affine)>,
    /// `base + (index without its innermost term)` of each site, computed before the innermost
    /// loop of the current stage (Cranelift does not hoist it out of the loop by itself).
    hoisted: HashMap<(BufferId, Affine), Value>,
}

/// Emits the body of `kernel` into `b` (whose function has the kernel signature).
pub fn lower_kernel(b: &mut FunctionBuilder, kernel: &Kernel, program: &Program) {
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
        sites: Vec::new(),
        hoisted: HashMap::new(),
    };
    let outer = kernel.outer.len();
    if outer == 0 {
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
        let var = self.b.declare_var(types::I64);
        self.b.def_var(var, lo);
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let i = self.b.use_var(var);
        let next = self.b.ins().iadd_imm_s(i, step);
        let go = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, hi);
        self.b.ins().brif(go, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        self.memo.clear();
        body(self, i);
        self.memo.clear();
        let i = self.b.use_var(var);
        let next = self.b.ins().iadd_imm_s(i, step);
        self.b.def_var(var, next);
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(exit);
        self.b.use_var(var)
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
        let vector = depth > 0 && self.vectorizable(stage);
        self.sites = self.address_sites(stage);
        match &stage.action {
            StageAction::Reduce { op, value } => {
                let (op, value) = (*op, *value);
                let init = match op {
                    ReduceOp::Sum => 0.0,
                    ReduceOp::Max => f32::NEG_INFINITY,
                    ReduceOp::Min => f32::INFINITY,
                };
                let scalar_acc = self.b.declare_var(types::F32);
                let c = self.b.ins().f32const(init);
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
                self.inner_loops(0, extents, vector, &mut |l, mode, slot| {
                    let x = l.emit(value, mode);
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
                                let nan = l.b.ins().fcmp(FloatCC::Unordered, x, x);
                                let seen = l.b.use_var(nan_lanes);
                                let seen = l.b.ins().bor(seen, nan);
                                l.b.def_var(nan_lanes, seen);
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
                // Fixed combine order: a pairwise tree over the unrolled accumulators, then
                // over the lanes, then the scalar tail.
                let mut accs: Vec<Value> = vector_accs.iter().map(|&a| self.b.use_var(a)).collect();
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
                let s = self.b.use_var(scalar_acc);
                let result = self.combine(op, v, s);
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
                // One element at a time, in order: the running sum lives in a variable.
                let acc = self.b.declare_var(types::F32);
                let zero = self.b.ins().f32const(0.0);
                self.b.def_var(acc, zero);
                self.inner_loops(0, extents, false, &mut |l, _, _| {
                    let x = l.scalar_operand(store.value);
                    let sum = l.b.use_var(acc);
                    let sum = l.b.ins().fadd(sum, x);
                    l.b.def_var(acc, sum);
                    l.store(store, Val::Scalar(sum), Mode::Scalar);
                });
            }
            StageAction::Store(stores) => {
                self.inner_loops(0, extents, vector, &mut |l, mode, _| {
                    for st in stores {
                        let v = l.emit(st.value, mode);
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
            self.memo.clear();
            body(self, Mode::Scalar, 0);
            self.memo.clear();
            return;
        }
        let zero = self.b.ins().iconst(types::I64, 0);
        let var = Var::Inner(level as u32);
        if level + 1 < extents.len() {
            self.counted_loop(zero, extents[level], 1, |l, i| {
                l.vars.insert(var, i);
                l.inner_loops(level + 1, extents, vector, body);
            });
            return;
        }
        self.hoist_addresses();
        let tail_start = if vector {
            let unrolled_end =
                self.counted_loop(zero, extents[level], LANES * UNROLL as i64, |l, i| {
                    l.vars.insert(var, i);
                    for slot in 0..UNROLL {
                        // Values uniform along the innermost loop are shared by the slots.
                        l.memo.retain(|_, v| matches!(v, Val::Scalar(_)));
                        l.lane_offset = slot as i64 * LANES;
                        body(l, Mode::Vector, slot);
                    }
                    l.lane_offset = 0;
                });
            self.counted_loop(unrolled_end, extents[level], LANES, |l, i| {
                l.vars.insert(var, i);
                body(l, Mode::Vector, 0);
            })
        } else {
            zero
        };
        self.counted_loop(tail_start, extents[level], 1, |l, i| {
            l.vars.insert(var, i);
            body(l, Mode::Scalar, 0);
        });
    }

    /// `x` (an f32) passed through a stack slot, so that it is computed here, once per row.
    /// Cranelift's elaborator otherwise places pure instructions at their uses, and it would
    /// recompute a reduction's final combine (four branchy NaN-aware `fmax` for a max) in every
    /// iteration of the loops that read the result.
    fn pin(&mut self, x: Value) -> Value {
        let slot =
            self.b
                .create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 4, 2));
        self.b.ins().stack_store(types::I64, x, slot, 0);
        self.b.ins().stack_load(types::I64, types::F32, slot, 0)
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
            } => {
                index.coefficient(inner) == 0
                    && indirect.as_ref().is_none_or(|i| self.is_uniform(i.value))
            }
            Expr::Constant { .. } | Expr::StageResult(_) => true,
            Expr::Index(index) => index.coefficient(inner) == 0,
            Expr::Unary(_, a) | Expr::Cast(_, a) => self.is_uniform(*a),
            Expr::Binary(_, a, c) | Expr::Compare(_, a, c) => {
                self.is_uniform(*a) && self.is_uniform(*c)
            }
            Expr::Where(c, a, d) => {
                self.is_uniform(*c) && self.is_uniform(*a) && self.is_uniform(*d)
            }
        }
    }

    /// Every (buffer, index) the stage loads (without a data-dependent part) or stores.
    fn address_sites(&self, stage: &Stage) -> Vec<(BufferId, Affine)> {
        let mut sites = Vec::new();
        let mut stack = match &stage.action {
            StageAction::Reduce { value, .. } => vec![*value],
            StageAction::Scan(store) => {
                sites.push((store.buffer, store.index.clone()));
                vec![store.value]
            }
            StageAction::Store(stores) => {
                sites.extend(stores.iter().map(|st| (st.buffer, st.index.clone())));
                stores.iter().map(|st| st.value).collect()
            }
        };
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
        let roots: Vec<ExprId> = match &stage.action {
            StageAction::Reduce { value, .. } => vec![*value],
            StageAction::Scan(_) => return false,
            StageAction::Store(stores) => {
                for st in stores {
                    let dtype = self.program.buffer(st.buffer).dtype;
                    if !dtype.is_float() {
                        return false;
                    }
                }
                stores.iter().map(|s| s.value).collect()
            }
        };
        let mut stack = roots;
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
        let uniform = mode == Mode::Scalar || self.is_uniform(e);
        let v = if uniform {
            Val::Scalar(self.emit_scalar(e))
        } else {
            self.emit_vector(e)
        };
        self.memo.insert(e, v);
        v
    }

    fn scalar_operand(&mut self, e: ExprId) -> Value {
        match self.emit(e, Mode::Scalar) {
            Val::Scalar(v) => v,
            Val::Vector(_) => unreachable!("scalar mode yields scalars"),
        }
    }

    /// `index` without its innermost-variable term, and that term's coefficient.
    fn split_inner(&self, index: &Affine) -> (Affine, i64) {
        match self.innermost {
            Some(inner) if index.coefficient(inner) != 0 => {
                let mut invariant = index.clone();
                invariant.terms.retain(|(v, _)| *v != inner);
                (invariant, index.coefficient(inner))
            }
            _ => (index.clone(), 0),
        }
    }

    /// `base(buffer) + index` in bytes, for an index without the innermost variable.
    fn invariant_address(&mut self, buffer: BufferId, index: &Affine) -> Value {
        if let Some(&a) = self.hoisted.get(&(buffer, index.clone())) {
            return a;
        }
        let size = self.program.buffer(buffer).dtype.size_bytes() as i64;
        let mut address = self.bases[&buffer];
        for &(var, coef) in &index.terms {
            let v = self.vars[&var];
            let scaled = self.b.ins().imul_imm_s(v, coef * size);
            address = self.b.ins().iadd(address, scaled);
        }
        if index.offset != 0 {
            address = self.b.ins().iadd_imm_s(address, index.offset * size);
        }
        address
    }

    /// Computes the loop-invariant part of every address of the current stage, here (before
    /// its innermost loop), for `address` to use inside the loop.
    fn hoist_addresses(&mut self) {
        self.hoisted.clear();
        for (buffer, index) in std::mem::take(&mut self.sites) {
            let (invariant, _) = self.split_inner(&index);
            if !self.hoisted.contains_key(&(buffer, invariant.clone())) {
                let a = self.invariant_address(buffer, &invariant);
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
        if coef != 0 {
            let inner = self
                .innermost
                .expect("a coefficient implies an innermost var");
            let v = self.vars[&inner];
            let scaled = self.b.ins().imul_imm_s(v, coef * size);
            address = self.b.ins().iadd(address, scaled);
            let lane = lane + self.lane_offset;
            if lane != 0 {
                address = self.b.ins().iadd_imm_s(address, lane * coef * size);
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

    fn emit_scalar(&mut self, e: ExprId) -> Value {
        let ty = self.kernel.ty(e);
        match self.kernel.expr(e).clone() {
            Expr::Load {
                buffer,
                index,
                indirect,
            } => {
                let addr = self.address(buffer, &index, indirect.as_ref(), 0);
                self.load_scalar(buffer, addr)
            }
            Expr::Constant { value, ty } => match ty {
                ScalarType::F32 => self.b.ins().f32const(value as f32),
                ScalarType::I64 => self.b.ins().iconst(types::I64, value as i64),
                ScalarType::Bool => self.b.ins().iconst(types::I8, (value != 0.0) as i64),
            },
            Expr::StageResult(n) => {
                self.stage_results[n as usize].expect("stages run in dependency order")
            }
            Expr::Index(index) => {
                let i = self.index_value(&index);
                match ty {
                    ScalarType::F32 => self.b.ins().fcvt_from_sint(types::F32, i),
                    _ => i,
                }
            }
            Expr::Unary(op, a) => {
                let a = self.scalar_operand(a);
                self.unary(op, a, ty)
            }
            Expr::Binary(op, a, c) => {
                let (a, c) = (self.scalar_operand(a), self.scalar_operand(c));
                self.binary(op, a, c, ty)
            }
            Expr::Compare(op, a, c) => {
                let operand_ty = self.kernel.ty(a);
                let (a, c) = (self.scalar_operand(a), self.scalar_operand(c));
                self.compare(op, a, c, operand_ty)
            }
            Expr::Where(c, a, d) => {
                let (c, a, d) = (
                    self.scalar_operand(c),
                    self.scalar_operand(a),
                    self.scalar_operand(d),
                );
                self.b.ins().select(c, a, d)
            }
            Expr::Cast(to, a) => {
                let from = self.kernel.ty(a);
                let a = self.scalar_operand(a);
                self.cast_scalar(to, from, a)
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
            UnaryOp::Exp => emit_math(self.b, MathFn::Exp, a),
            UnaryOp::Log => emit_math(self.b, MathFn::Log, a),
            UnaryOp::Sin => emit_math(self.b, MathFn::Sin, a),
            UnaryOp::Cos => emit_math(self.b, MathFn::Cos, a),
            UnaryOp::Tanh => emit_math(self.b, MathFn::Tanh, a),
            UnaryOp::Erf => emit_math(self.b, MathFn::Erf, a),
            UnaryOp::Sigmoid => emit_math(self.b, MathFn::Sigmoid, a),
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

    fn emit_vector(&mut self, e: ExprId) -> Val {
        let ty = self.kernel.ty(e);
        let v = match self.kernel.expr(e).clone() {
            Expr::Load {
                buffer,
                index,
                indirect,
            } => self.load_vector(buffer, &index, indirect.as_ref()),
            Expr::Unary(op, a) => {
                let a = self.vector_operand(a);
                self.unary(op, a, ty)
            }
            Expr::Binary(op, a, c) => {
                let (a, c) = (self.vector_operand(a), self.vector_operand(c));
                self.binary(op, a, c, ty)
            }
            Expr::Compare(op, a, c) => {
                let operand_ty = self.kernel.ty(a);
                let (a, c) = (self.vector_operand(a), self.vector_operand(c));
                let mask = self.compare(op, a, c, operand_ty);
                self.bitcast(types::I32X4, mask)
            }
            Expr::Where(c, a, d) => {
                let (c, a, d) = (
                    self.vector_operand(c),
                    self.vector_operand(a),
                    self.vector_operand(d),
                );
                // Bool operands are i32x4 masks, float ones f32x4: the mask takes their type.
                let operand_type = self.b.func.dfg.value_type(a);
                let mask = self.bitcast(operand_type, c);
                self.b.ins().bitselect(mask, a, d)
            }
            Expr::Cast(to, a) => {
                let from = self.kernel.ty(a);
                let x = self.vector_operand(a);
                match (to, from) {
                    (DType::F32 | DType::F16 | DType::BF16, ScalarType::F32) => {
                        self.round_to(to, x)
                    }
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
            Expr::Index(index) => {
                // Lane 0's value, splat, plus [0, c, 2c, 3c] for the innermost coefficient c.
                let inner = self.innermost.expect("vector mode has an innermost loop");
                let c = index.coefficient(inner);
                let i = self.index_value(&index);
                let f = self.b.ins().fcvt_from_sint(types::F32, i);
                let base = self.b.ins().splat(types::F32X4, f);
                let mut steps = self.f32_like(0.0, types::F32X4);
                for lane in 1..LANES {
                    let k = self.b.ins().f32const((lane * c) as f32);
                    steps = self.b.ins().insertlane(steps, k, lane as u8);
                }
                self.b.ins().fadd(base, steps)
            }
            Expr::Constant { .. } | Expr::StageResult(_) => unreachable!("uniform"),
        };
        Val::Vector(v)
    }

    /// The i64 value of `index` at the current loop variables (lane 0 of the unroll slot).
    fn index_value(&mut self, index: &Affine) -> Value {
        let mut acc = self.b.ins().iconst(types::I64, index.offset);
        for &(var, coef) in &index.terms {
            let v = self.vars[&var];
            let scaled = self.b.ins().imul_imm_s(v, coef);
            acc = self.b.ins().iadd(acc, scaled);
            if Some(var) == self.innermost && self.lane_offset != 0 {
                acc = self.b.ins().iadd_imm_s(acc, self.lane_offset * coef);
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
        if index.coefficient(inner) == 1 {
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
        if st.index.coefficient(inner) == 1 {
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

/// A fresh function with the kernel signature.
pub fn kernel_function(call_conv: cranelift_codegen::isa::CallConv) -> Function {
    let mut sig = Signature::new(call_conv);
    kernel_signature(&mut sig);
    Function::with_name_signature(Default::default(), sig)
}
