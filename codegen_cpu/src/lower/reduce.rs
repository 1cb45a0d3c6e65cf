//! Reductions: accumulators, their initial values, compensated block sums and the combination of
//! partial results in a fixed order.

use super::*;

impl Lowering<'_, '_, '_> {
    /// Zeroes the block accumulators of a sum.
    pub(super) fn reset_block_sums(&mut self, fold: &Fold) {
        let zero = self.b.ins().f32const(0.0);
        let zeros = self.b.ins().splat(types::F32X4, zero);
        for &acc in &fold.block {
            self.b.def_var(acc, zeros);
        }
        self.b.def_var(fold.block_scalar, zero);
    }

    /// Adds a block's partial sums into the running ones (Kahan: the compensation keeps what
    /// each addition rounded away and takes it off the next block's partial sum).
    pub(super) fn add_block_sums(&mut self, fold: &Fold) {
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
    pub(super) fn kahan_add(&mut self, sums: Value, at_r: i32, at_c: i32, x: Value, ty: Type) {
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

    /// The identity of `op`, as a value of type `ty` (f32 or f32x4).
    pub(super) fn reduce_init(&mut self, op: ReduceOp, ty: Type) -> Value {
        let init = match op {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        };
        self.f32_like(init, ty)
    }

    /// For a sum of a product used only there (a variance's squares), its factors: accumulated
    /// with one FMA (where the host has FMA).
    pub(super) fn summed_product(&self, op: ReduceOp, value: ExprId) -> Option<(ExprId, ExprId)> {
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
    pub(super) fn f32_operands(&mut self, a: ExprId, c: ExprId, mode: Mode) -> (Value, Value) {
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

    pub(super) fn combine(&mut self, op: ReduceOp, a: Value, x: Value) -> Value {
        match op {
            ReduceOp::Sum => self.b.ins().fadd(a, x),
            ReduceOp::Max => self.b.ins().fmax(a, x),
            ReduceOp::Min => self.b.ins().fmin(a, x),
        }
    }
}
