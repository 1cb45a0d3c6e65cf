//! The math algorithms as Cranelift IR: [`Em`] implements [`Lanes`] by emitting instructions
//! into a kernel being built, for `F32` or `F32X4` values.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, Endianness, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use minductor_kernels::math::{apply, power, FloatCmp, IntCmp, Lanes, MathFn};

/// Emits `f(x)` inline. `x` has type `F32` or `F32X4`; the result has the same type. No calls.
pub fn emit_math(b: &mut FunctionBuilder, f: MathFn, x: Value) -> Value {
    let mut e = Em::new(b, x);
    apply(&mut e, f, x)
}

/// `pow(a, e)` with PyTorch (C99 `powf`) semantics; `a` and `e` have the same type, `F32` or
/// `F32X4`. See the module docs for the special cases and the accuracy.
pub fn emit_pow(b: &mut FunctionBuilder, a: Value, e: Value) -> Value {
    let mut m = Em::new(b, a);
    power(&mut m, a, e)
}

/// Flags for vector bitcasts (lane order must be stated for them).
fn cast_flags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

pub(crate) struct Em<'a, 'b> {
    pub(crate) b: &'a mut FunctionBuilder<'b>,
    /// `F32` or `F32X4`.
    pub(crate) fty: Type,
    /// `I32` or `I32X4`.
    pub(crate) ity: Type,
    /// Whether `mul_add` emits a fused `fma` (see [`host_has_fma`]).
    fma: bool,
}

/// Whether the JIT's target, the host (`cranelift_native`), lowers `fma` to one instruction.
pub(crate) fn host_has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl<'a, 'b> Em<'a, 'b> {
    /// `like` is any value of the working shape (`F32`/`I32` or `F32X4`/`I32X4`).
    pub(crate) fn new(b: &'a mut FunctionBuilder<'b>, like: Value) -> Self {
        let ty = b.func.dfg.value_type(like);
        let (fty, ity) = if ty.is_vector() {
            assert_eq!(
                ty.lane_count(),
                4,
                "math emitters take F32/F32X4 (or I32/I32X4)"
            );
            (types::F32X4, types::I32X4)
        } else {
            (types::F32, types::I32)
        };
        Em {
            b,
            fty,
            ity,
            fma: host_has_fma(),
        }
    }

    fn vec(&self) -> bool {
        self.fty.is_vector()
    }
}

impl Lanes for Em<'_, '_> {
    type V = Value;

    fn f(&mut self, c: f32) -> Value {
        let s = self.b.ins().f32const(c);
        if self.vec() {
            self.b.ins().splat(self.fty, s)
        } else {
            s
        }
    }
    fn i(&mut self, c: i32) -> Value {
        let s = self.b.ins().iconst(types::I32, (c as u32) as i64);
        if self.vec() {
            self.b.ins().splat(self.ity, s)
        } else {
            s
        }
    }
    fn add(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fadd(a, b)
    }
    fn sub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fsub(a, b)
    }
    fn mul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmul(a, b)
    }
    fn div(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fdiv(a, b)
    }
    fn mul_add(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let p = self.mul(a, b);
            self.add(p, c)
        }
    }
    fn abs(&mut self, a: Value) -> Value {
        self.b.ins().fabs(a)
    }
    fn neg(&mut self, a: Value) -> Value {
        self.b.ins().fneg(a)
    }
    fn bits(&mut self, x: Value) -> Value {
        let ity = self.ity;
        self.b.ins().bitcast(ity, cast_flags(), x)
    }
    fn float(&mut self, i: Value) -> Value {
        let fty = self.fty;
        self.b.ins().bitcast(fty, cast_flags(), i)
    }
    fn iadd(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().iadd(a, b)
    }
    fn isub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().isub(a, b)
    }
    fn shl(&mut self, a: Value, n: i64) -> Value {
        self.b.ins().ishl_imm_u(a, n)
    }
    fn ushr(&mut self, a: Value, n: i64) -> Value {
        self.b.ins().ushr_imm_u(a, n)
    }
    fn sshr(&mut self, a: Value, n: i64) -> Value {
        self.b.ins().sshr_imm_u(a, n)
    }
    fn i2f(&mut self, i: Value) -> Value {
        let fty = self.fty;
        self.b.ins().fcvt_from_sint(fty, i)
    }
    fn fcmp(&mut self, cc: FloatCmp, a: Value, b: Value) -> Value {
        let cc = match cc {
            FloatCmp::Equal => FloatCC::Equal,
            FloatCmp::NotEqual => FloatCC::NotEqual,
            FloatCmp::LessThan => FloatCC::LessThan,
            FloatCmp::LessThanOrEqual => FloatCC::LessThanOrEqual,
            FloatCmp::GreaterThan => FloatCC::GreaterThan,
            FloatCmp::GreaterThanOrEqual => FloatCC::GreaterThanOrEqual,
            FloatCmp::Unordered => FloatCC::Unordered,
            FloatCmp::Ordered => FloatCC::Ordered,
        };
        self.b.ins().fcmp(cc, a, b)
    }
    fn icmp(&mut self, cc: IntCmp, a: Value, b: Value) -> Value {
        let cc = match cc {
            IntCmp::Equal => IntCC::Equal,
            IntCmp::NotEqual => IntCC::NotEqual,
            IntCmp::SignedLessThan => IntCC::SignedLessThan,
            IntCmp::SignedLessThanOrEqual => IntCC::SignedLessThanOrEqual,
            IntCmp::SignedGreaterThan => IntCC::SignedGreaterThan,
            IntCmp::SignedGreaterThanOrEqual => IntCC::SignedGreaterThanOrEqual,
        };
        self.b.ins().icmp(cc, a, b)
    }
    fn sel(&mut self, mask: Value, t: Value, f: Value) -> Value {
        if self.vec() {
            let ty = self.b.func.dfg.value_type(t);
            let mty = self.b.func.dfg.value_type(mask);
            let m = if mty == ty {
                mask
            } else {
                self.b.ins().bitcast(ty, cast_flags(), mask)
            };
            self.b.ins().bitselect(m, t, f)
        } else {
            self.b.ins().select(mask, t, f)
        }
    }
    /// Loads from the table's address, lane by lane; the index is masked to 0..16 first, so
    /// the loads stay inside the `'static` table (which outlives every kernel).
    fn lookup(&mut self, table: &'static [f32; 16], idx: Value) -> Value {
        let idx = self.bandc(idx, 15);
        let base = self.b.ins().iconst(types::I64, table.as_ptr() as i64);
        let flags = MemFlagsData::trusted().with_readonly();
        let entry = |b: &mut FunctionBuilder, i: Value| {
            let i = b.ins().uextend(types::I64, i);
            let offset = b.ins().ishl_imm_u(i, 2);
            let address = b.ins().iadd(base, offset);
            b.ins().load(types::F32, flags, address, 0)
        };
        if !self.vec() {
            return entry(self.b, idx);
        }
        let first = self.b.ins().extractlane(idx, 0);
        let first = entry(self.b, first);
        let mut v = self.b.ins().scalar_to_vector(types::F32X4, first);
        for lane in 1..4u8 {
            let i = self.b.ins().extractlane(idx, lane);
            let x = entry(self.b, i);
            v = self.b.ins().insertlane(v, x, lane);
        }
        v
    }
    fn band(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().band(a, b)
    }
    fn bor(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().bor(a, b)
    }
    fn bxor(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().bxor(a, b)
    }
}
