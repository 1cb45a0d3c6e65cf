//! Expressions: which values are uniform along the innermost loop, whether a stage vectorizes, and
//! the one emitter of an expression's scalar and vector forms (contractions, reciprocals,
//! operators).

use super::*;

impl Lowering<'_, '_, '_> {
    pub(super) fn is_uniform(&self, e: ExprId) -> bool {
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

    /// Whether every value the stage needs has a 4-lane form.
    pub(super) fn vectorizable(&self, stage: &Stage) -> bool {
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

    pub(super) fn emit(&mut self, e: ExprId, mode: Mode) -> Val {
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
    pub(super) fn divides_by_uniform(&self, a: ExprId, c: ExprId, ty: ScalarType) -> bool {
        ty == ScalarType::F32 && !self.is_uniform(a) && self.is_uniform(c)
    }

    /// `a ± c` as a fused `x * y ± z`: `(x, y, z, negate_product)`, where the product is `a`
    /// (`negate_product` false) or, for `a - x*y`, `c` (then the product is negated), when it
    /// is an f32 multiply used only here and the host has FMA.
    pub(super) fn contraction(
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
    pub(super) fn fused(
        &mut self,
        x: Value,
        y: Value,
        z: Value,
        op: BinaryOp,
        negate_product: bool,
    ) -> Value {
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
    pub(super) fn reciprocal(&mut self, c: ExprId) -> Value {
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

    pub(super) fn scalar_operand(&mut self, e: ExprId) -> Value {
        match self.emit(e, Mode::Scalar) {
            Val::Scalar(v) => v,
            Val::Vector(_) => unreachable!("scalar mode yields scalars"),
        }
    }

    /// `e`'s operand `a` in `mode`: a scalar, or a vector (a uniform operand splat).
    pub(super) fn operand(&mut self, a: ExprId, mode: Mode) -> Value {
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
    pub(super) fn emit_in(&mut self, e: ExprId, mode: Mode) -> Value {
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

    pub(super) fn unary(&mut self, op: UnaryOp, a: Value, ty: ScalarType) -> Value {
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

    pub(super) fn binary(&mut self, op: BinaryOp, a: Value, c: Value, ty: ScalarType) -> Value {
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

    pub(super) fn compare(
        &mut self,
        op: CompareOp,
        a: Value,
        c: Value,
        operand: ScalarType,
    ) -> Value {
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

    pub(super) fn f32_like(&mut self, v: f32, ty: Type) -> Value {
        let c = self.b.ins().f32const(v);
        if ty.is_vector() {
            self.b.ins().splat(ty, c)
        } else {
            c
        }
    }

    /// `v` as a 4-lane vector of the kernel type `ty` (f32x4, or an i32x4 mask for bool).
    pub(super) fn vector_of(&mut self, v: Val, ty: ScalarType) -> Value {
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

    pub(super) fn vector_operand(&mut self, e: ExprId) -> Value {
        let v = self.emit(e, Mode::Vector);
        let ty = self.kernel.ty(e);
        self.vector_of(v, ty)
    }

    /// The f32 vector of `index` at the current loop variables: lane 0's value, splat, plus
    /// `[0, c, 2c, 3c]` for the innermost coefficient `c`.
    pub(super) fn index_vector(&mut self, index: &Affine) -> Value {
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

    pub(super) fn bitcast(&mut self, to: Type, v: Value) -> Value {
        if self.b.func.dfg.value_type(v) == to {
            return v;
        }
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        self.b.ins().bitcast(to, flags, v)
    }
}
