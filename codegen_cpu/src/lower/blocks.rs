//! Math blocks: a stage's transcendental functions computed a block of elements at a time by the
//! kernel library's ahead-of-time routines (see the module docs of `lower`), and its f16 and
//! bf16 loads and stores converted a block at a time ([`Conversion`]).

use super::*;

impl Lowering<'_, '_, '_> {
    /// Address of the current element(s) in a math-block buffer: element `i - start` along the
    /// innermost loop, or in the outer order, row `r - start`, column `lane_offset` of the group.
    pub(super) fn block_address(&mut self, buffer: Value) -> Value {
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

    pub(super) fn store_block(&mut self, buffer: Value, v: Val, mode: Mode) {
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

    pub(super) fn load_block(&mut self, buffer: Value, mode: Mode) -> Val {
        let address = self.block_address(buffer);
        match mode {
            Mode::Vector => Val::Vector(self.b.ins().load(types::F32X4, self.flags, address, 0)),
            Mode::Scalar => Val::Scalar(self.b.ins().load(types::F32, self.flags, address, 0)),
        }
    }

    /// `routine(buffer, dst, n)`: the block's results go to `dst`, `n` f32s (the block buffer
    /// itself, replacing the arguments, or the stage's output: see `direct_store`).
    pub(super) fn call_block(&mut self, m: &BlockMath, dst: Value, n: Value) {
        self.call_elementwise(m.routine as usize, m.buffer, dst, n);
    }

    /// A call of the kernel library routine at address `routine` of the shape `fn(src, dst,
    /// n)` (math blocks, conversions): `n` elements from `src` to `dst`.
    pub(super) fn call_elementwise(&mut self, routine: usize, src: Value, dst: Value, n: Value) {
        let mut sig = Signature::new(self.b.func.signature.call_conv);
        for _ in 0..3 {
            sig.params.push(AbiParam::new(types::I64));
        }
        let sig = self.b.import_signature(sig);
        let callee = self.b.ins().iconst(types::I64, routine as i64);
        self.b.ins().call_indirect(sig, callee, &[src, dst, n]);
    }

    /// The stage's functions that math blocks compute (non-uniform, with a routine on this CPU),
    /// grouped by nesting level, each with a fresh block buffer.
    /// `e` as a composite of one argument that a math routine computes whole — `gelu` and
    /// `silu`, in the operations `decompose` writes them in, so that the routine's result is
    /// bit for bit the expression's — when nothing else uses its inner values:
    /// `(argument, function)`.
    pub(super) fn composite(&self, e: ExprId) -> Option<(ExprId, MathFn)> {
        self.composite_where(e, |x| self.uses[x.0 as usize] == 1)
    }

    /// `e` as a composite of one argument (as [`Self::composite`]) whatever else uses its inner
    /// values: the function's result is still the expression's bits (a row routine computes the
    /// whole of it, where a GELU forward also stores its inner values for the backward).
    pub(super) fn composite_any_uses(&self, e: ExprId) -> Option<(ExprId, MathFn)> {
        self.composite_where(e, |_| true)
    }

    /// [`Self::composite`], with `single` saying which inner values may be taken into it.
    fn composite_where(
        &self,
        e: ExprId,
        single: impl Fn(ExprId) -> bool,
    ) -> Option<(ExprId, MathFn)> {
        let k = self.kernel;
        if k.ty(e) != ScalarType::F32 {
            return None;
        }
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
    pub(super) fn direct_store(&self, stage: &Stage) -> Option<Store> {
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

    pub(super) fn block_math(&mut self, stage: &Stage) -> Vec<Vec<BlockMath>> {
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
                    // An f32 rounded to f16's or bf16's values (a half-precision operation's
                    // result in a chain computed in f32): inline, a conversion to the half's
                    // bits and back, some 40 operations on 4 lanes for f16.
                    (Expr::Cast(to @ (DType::F16 | DType::BF16), a), ScalarType::F32)
                        if l.kernel.ty(*a) == ScalarType::F32 =>
                    {
                        let half = match to {
                            DType::F16 => Half::F16,
                            _ => Half::Bf16,
                        };
                        match round_routine(half) {
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

    /// The current stage's f16 and bf16 loads and stores to convert a block at a time: plain
    /// loads and stores contiguous along the innermost loop (a load that varies along it), of a
    /// buffer the kernel does not both load and store (converting a block of loads before the
    /// body and the stores after it keeps the order of each element's read and write, not of
    /// different elements'), where the CPU has the routine. Each gets a block buffer (the
    /// `k`-th of every stage the same).
    pub(super) fn conversions(&mut self, stage: &Stage) -> Vec<Conversion> {
        let Some(inner) = self.innermost else {
            return Vec::new();
        };
        let kernel = self.kernel;
        let stored = kernel.stores();
        let loaded: Vec<BufferId> = (kernel.exprs.iter())
            .filter_map(|e| match e {
                Expr::Load { buffer, .. } => Some(*buffer),
                _ => None,
            })
            .collect();
        let half = |b: BufferId| match self.program.buffer(b).dtype {
            DType::F16 => Some(Half::F16),
            DType::BF16 => Some(Half::Bf16),
            _ => None,
        };
        let mut found: Vec<(Option<ExprId>, BufferId, Affine, ConvertFn)> = Vec::new();
        for e in kernel.reachable(&stage.action.roots()) {
            let Expr::Load {
                buffer,
                index,
                indirect: None,
            } = kernel.expr(e)
            else {
                continue;
            };
            let routine = half(*buffer).and_then(widen_routine);
            if let (Some(routine), true, false) = (
                routine,
                index.coefficient(inner).is(1),
                stored.contains(buffer),
            ) {
                found.push((Some(e), *buffer, index.clone(), routine));
            }
        }
        if let StageAction::Store(stores) = &stage.action {
            for st in stores {
                let routine = half(st.buffer).and_then(narrow_routine);
                if let (Some(routine), true, false) = (
                    routine,
                    st.index.coefficient(inner).is(1),
                    loaded.contains(&st.buffer),
                ) {
                    found.push((None, st.buffer, st.index.clone(), routine));
                }
            }
        }
        found
            .into_iter()
            .enumerate()
            .map(|(k, (load, buffer_id, index, routine))| {
                // The largest block: a sum's, when no math block sets it. The stages come one
                // after the other: the `k`-th conversion of each shares one buffer.
                while self.conversion_slots.len() <= k {
                    let slot = self.b.create_sized_stack_slot(StackSlotData::new(
                        StackSlotKind::ExplicitSlot,
                        (MATH_BLOCK.max(SUM_BLOCK) * 4) as u32,
                        4,
                    ));
                    self.conversion_slots.push(slot);
                }
                let slot = self.conversion_slots[k];
                let buffer = self.b.ins().stack_addr(types::I64, slot, 0);
                Conversion {
                    load,
                    buffer_id,
                    index,
                    routine,
                    buffer,
                }
            })
            .collect()
    }

    /// Converts the block `start..end` of the innermost loop `var` for `c`: a load's elements
    /// widened into its block buffer (which the body then reads for the load), or a store's
    /// narrowed from its block buffer into the output.
    pub(super) fn convert_block(&mut self, c: &Conversion, var: Var, start: Value, end: Value) {
        self.vars.insert(var, start);
        let at = self.address(c.buffer_id, &c.index, None, 0);
        let n = self.b.ins().isub(end, start);
        let (src, dst) = match c.load {
            Some(_) => (at, c.buffer),
            None => (c.buffer, at),
        };
        self.call_elementwise(c.routine as usize, src, dst, n);
        if let Some(e) = c.load {
            self.block_values.insert(e, c.buffer);
        }
    }

    /// The block buffer the current stage's store `st` goes to, if it is converted.
    pub(super) fn block_store(&self, st: &Store) -> Option<Value> {
        (self.conversions.iter())
            .find(|c| c.load.is_none() && c.buffer_id == st.buffer && c.index == st.index)
            .map(|c| c.buffer)
    }
}
