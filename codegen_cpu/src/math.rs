//! Transcendental functions emitted inline as Cranelift IR.
//!
//! Cranelift has no `exp`/`log`/`tanh`/`erf`/`sin`/`cos`, and a kernel should not pay for a
//! libcall per element, so [`emit_math`] and [`emit_pow`] expand each function into a
//! branch-free sequence of plain IEEE single-precision operations: Cody–Waite argument
//! reduction, a polynomial, and `select`s for the special values. The same emitter code
//! serves `F32` and `F32X4` (constants are splatted for vectors, conditions use `select` for
//! scalars and `bitselect` on a compare mask for vectors), so a kernel's scalar tail computes
//! bit-identical results to its vector body.
//!
//! Only operations that the x86-64 backend lowers inline for both `f32` and `f32x4` are used:
//! `fadd fsub fmul fdiv fabs fneg`, `fcmp`/`icmp` with `select`/`bitselect`, `bitcast`
//! f32<->i32, `band bor bxor ishl ushr sshr iadd isub` on i32 lanes and `fcvt_from_sint`.
//! `fma` only where the host has FMA (the JIT targets the host through `cranelift_native`;
//! elsewhere Cranelift makes it a libcall), in the polynomials and the `exp` reduction, so
//! the scalar and vector forms still agree bit for bit. No `nearest`/`floor` (rounding to an
//! integer uses the `x + 1.5*2^23 - 1.5*2^23` trick), and no `fmin`/`fmax` (clamps are
//! `select(c < x, c, x)`, which keeps NaN and lowers to `minps`/`maxps`).
//!
//! # Methods
//! * `exp`: `n = round(x/ln 2)`, `r = x - n*ln2` with a 2-part `ln 2`, Cephes degree-7
//!   polynomial, and `2^n` applied as two factors `2^(n>>1) * 2^(n-(n>>1))` so that results in
//!   the subnormal range are right too. `x` is clamped to `[-110, 89]` first (NaN kept).
//! * `log`: subnormals scaled by `2^23`; `x = 2^k * m` with `m` in `[sqrt(1/2), sqrt 2)`,
//!   `log1p(m - 1)` by the Cephes polynomial, `k*ln 2` with a 2-part `ln 2`.
//! * `tanh`: odd polynomial for `|x| < 0.625`, `1 - 2/(exp(2|x|) + 1)` above, sign copied.
//! * `erf`: `x + x*P(x^2)` for `|x| < 1`; `1 - exp(-x^2) * Q(1/x)` for `1 <= |x| <= 4` (and
//!   `|x|` clamped to 4 above, where erf rounds to 1), sign copied. `P`, `Q` are minimax fits
//!   made for this module.
//! * `sigmoid`: `e = exp(-|x|)`, result `1/(1+e)` for `x >= 0` and `e/(1+e)` for `x < 0`, so
//!   it is accurate for large `|x|` (`sigmoid(-100) = 3.78e-44`).
//! * `sin`/`cos`: `q = round(x * 2/pi)`, `r = x - q*pi/2` with a 6-part Cody–Waite `pi/2`
//!   (five 8-bit parts, whose products with `|q| < 2^16` are exact, and a 24-bit tail: 64
//!   bits in all, enough for the f32 inputs closest to a multiple of `pi/2` below `1e5`),
//!   Cephes sin/cos polynomials on `[-pi/4, pi/4]`, quadrant from `q`. `sin(-0) = -0`.
//! * `pow(a, b)`: `exp(b * log|a|)` where `log|a|` is computed as a double-`f32` (hi + lo,
//!   relative error < 2^-33, via `s = f/(2+f)`, `log1p f = 2 atanh s`) and `b * log|a|` with a
//!   Dekker product, so the result keeps ~1 ulp even when `|b log|a||` is near 88. Special
//!   cases follow C99 `powf` (what PyTorch's CPU kernels call): `x^0 = 1` (also for NaN),
//!   `1^y = 1` (also for NaN), `(-1)^±inf = 1`, negative finite base with non-integer
//!   exponent is NaN, negative base with odd integer exponent is negative, `±0^y` is `+inf`
//!   for `y < 0` (`-inf` for `-0` and odd `y`) and `+0` for `y > 0` (`-0` for `-0` and odd
//!   `y`), `(-inf)^y` gives `±0`/`±inf` likewise, NaN otherwise propagates.
//!
//! # Accuracy
//! Max error in ulps of the `f32` result against an `f64` reference (`std`, and `libm::erf`).
//! One ulp is `2^(e-23)` where `2^e <= |exact| < 2^(e+1)`, with `e >= -126`, so an error on
//! a subnormal result is counted in units of the smallest subnormal. "All" means every `f32`
//! bit pattern (checked exhaustively by the ignored test `math::tests::exhaustive_bounds`;
//! the regular tests sweep every 1031st pattern plus dense grids and special values).
//!
//! (Measured with FMA, on an x86-64 host that has it; `exhaustive_bounds` for exp, log, tanh,
//! erf and sigmoid.)
//!
//! | function  | input range                                   | max error (ulp) |
//! |-----------|-----------------------------------------------|-----------------|
//! | `exp`     | all (`0` below `-103.97`, `inf` above `88.72`) | 0.99            |
//! | `log`     | all                                           | 0.83            |
//! | `tanh`    | all                                           | 1.33            |
//! | `erf`     | all                                           | 1.26            |
//! | `sigmoid` | all                                           | 2.40            |
//! | `sin`     | `\|x\| <= 1e2` / `1e3` / `1e4` / `1e5`          | 2.31 / 2.43 / 2.76 / 3.18 |
//! | `cos`     | `\|x\| <= 1e2` / `1e3` / `1e4` / `1e5`          | 2.49 / 2.84 / 3.34 / 3.42 |
//! | `pow`     | sampled: 2M random `(a, b)` with `a` in `2^±128`, `\|b\|` in `2^±6`; 0.5M bases near 1 with `\|b log a\| <= 100`; `b` in {±1, ±2, 3, 7, ±0.5} over every 1031st `a` (finite nonzero results) | 1.14 |
//!
//! Past `|x| = 1e5` `sin`/`cos` lose accuracy (the reduction products stop being exact at
//! `|q| >= 2^16`, `q` itself is wrong past `2^22`); there the result is only guaranteed to be
//! in `[-1, 1]` (NaN for infinite input). `pow` is not exhaustively checked (two inputs);
//! its error is dominated by the `exp` polynomial (`log|a|` is carried with < 2^-33
//! relative error), e.g. `pow(x, 1)` is within 1 ulp of `x`, not always exact.
//!
//! Every function returns NaN for a NaN input.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, Endianness, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;

/// A unary transcendental function that [`emit_math`] can expand inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MathFn {
    Exp,
    Log,
    Tanh,
    Erf,
    Sin,
    Cos,
    Sigmoid,
}

impl MathFn {
    /// All functions, for tests and tables.
    pub const ALL: [MathFn; 7] = [
        MathFn::Exp,
        MathFn::Log,
        MathFn::Tanh,
        MathFn::Erf,
        MathFn::Sin,
        MathFn::Cos,
        MathFn::Sigmoid,
    ];
}

/// Emits `f(x)` inline. `x` has type `F32` or `F32X4`; the result has the same type. No calls.
pub fn emit_math(b: &mut FunctionBuilder, f: MathFn, x: Value) -> Value {
    let mut e = Em::new(b, x);
    match f {
        MathFn::Exp => exp(&mut e, x, None),
        MathFn::Log => log(&mut e, x),
        MathFn::Tanh => tanh(&mut e, x),
        MathFn::Erf => erf(&mut e, x),
        MathFn::Sin => sincos(&mut e, x, false),
        MathFn::Cos => sincos(&mut e, x, true),
        MathFn::Sigmoid => sigmoid(&mut e, x),
    }
}

/// `pow(a, e)` with PyTorch (C99 `powf`) semantics; `a` and `e` have the same type, `F32` or
/// `F32X4`. See the module docs for the special cases and the accuracy.
pub fn emit_pow(b: &mut FunctionBuilder, a: Value, e: Value) -> Value {
    let mut m = Em::new(b, a);
    pow(&mut m, a, e)
}

// ---------------------------------------------------------------------------------------------
// Emission helpers: the same calls build scalar or 4-lane code.

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
fn host_has_fma() -> bool {
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

    /// A float constant of the working type.
    pub(crate) fn f(&mut self, c: f32) -> Value {
        let s = self.b.ins().f32const(c);
        if self.vec() {
            self.b.ins().splat(self.fty, s)
        } else {
            s
        }
    }

    /// An i32 constant of the working integer type.
    pub(crate) fn i(&mut self, c: i32) -> Value {
        let s = self.b.ins().iconst(types::I32, (c as u32) as i64);
        if self.vec() {
            self.b.ins().splat(self.ity, s)
        } else {
            s
        }
    }

    pub(crate) fn add(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fadd(a, b)
    }
    pub(crate) fn sub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fsub(a, b)
    }
    pub(crate) fn mul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmul(a, b)
    }
    pub(crate) fn div(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fdiv(a, b)
    }
    /// `a * b + c`, fused (one rounding) where the host has FMA.
    pub(crate) fn mul_add(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let p = self.mul(a, b);
            self.add(p, c)
        }
    }
    /// `a * b + c` for a constant `c`.
    fn mul_addc(&mut self, a: Value, b: Value, c: f32) -> Value {
        let c = self.f(c);
        self.mul_add(a, b, c)
    }
    /// `a * c + d` for a constant `c`.
    fn mulc_add(&mut self, a: Value, c: f32, d: Value) -> Value {
        let c = self.f(c);
        self.mul_add(a, c, d)
    }
    fn addc(&mut self, a: Value, c: f32) -> Value {
        let c = self.f(c);
        self.add(a, c)
    }
    fn mulc(&mut self, a: Value, c: f32) -> Value {
        let c = self.f(c);
        self.mul(a, c)
    }
    /// `c - a`.
    fn rsubc(&mut self, c: f32, a: Value) -> Value {
        let c = self.f(c);
        self.sub(c, a)
    }
    fn abs(&mut self, a: Value) -> Value {
        self.b.ins().fabs(a)
    }
    fn neg(&mut self, a: Value) -> Value {
        self.b.ins().fneg(a)
    }

    /// Float → its bits (same lane count).
    pub(crate) fn bits(&mut self, x: Value) -> Value {
        let ity = self.ity;
        self.b.ins().bitcast(ity, cast_flags(), x)
    }
    /// Bits → float.
    pub(crate) fn float(&mut self, i: Value) -> Value {
        let fty = self.fty;
        self.b.ins().bitcast(fty, cast_flags(), i)
    }
    pub(crate) fn iadd(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().iadd(a, b)
    }
    pub(crate) fn isub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().isub(a, b)
    }
    pub(crate) fn iaddc(&mut self, a: Value, c: i32) -> Value {
        let c = self.i(c);
        self.iadd(a, c)
    }
    pub(crate) fn bandc(&mut self, a: Value, c: i32) -> Value {
        let c = self.i(c);
        self.b.ins().band(a, c)
    }
    pub(crate) fn borc(&mut self, a: Value, c: i32) -> Value {
        let c = self.i(c);
        self.b.ins().bor(a, c)
    }
    pub(crate) fn shl(&mut self, a: Value, n: i64) -> Value {
        self.b.ins().ishl_imm_u(a, n)
    }
    pub(crate) fn ushr(&mut self, a: Value, n: i64) -> Value {
        self.b.ins().ushr_imm_u(a, n)
    }
    pub(crate) fn sshr(&mut self, a: Value, n: i64) -> Value {
        self.b.ins().sshr_imm_u(a, n)
    }
    /// i32 lanes → f32 lanes (value conversion).
    fn i2f(&mut self, i: Value) -> Value {
        let fty = self.fty;
        self.b.ins().fcvt_from_sint(fty, i)
    }

    /// Float compare → mask (`I8` 0/1 for scalars, all-ones/zero `I32X4` for vectors).
    pub(crate) fn fcmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        self.b.ins().fcmp(cc, a, b)
    }
    pub(crate) fn fcmpc(&mut self, cc: FloatCC, a: Value, c: f32) -> Value {
        let c = self.f(c);
        self.fcmp(cc, a, c)
    }
    /// Integer compare → mask.
    pub(crate) fn icmp(&mut self, cc: IntCC, a: Value, b: Value) -> Value {
        self.b.ins().icmp(cc, a, b)
    }
    pub(crate) fn icmpc(&mut self, cc: IntCC, a: Value, c: i32) -> Value {
        let c = self.i(c);
        self.icmp(cc, a, c)
    }
    pub(crate) fn and(&mut self, m1: Value, m2: Value) -> Value {
        self.b.ins().band(m1, m2)
    }
    pub(crate) fn or(&mut self, m1: Value, m2: Value) -> Value {
        self.b.ins().bor(m1, m2)
    }

    /// `mask ? t : f`, lane-wise. `select` for scalars, `bitselect` for vectors.
    pub(crate) fn sel(&mut self, mask: Value, t: Value, f: Value) -> Value {
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
    fn selc(&mut self, mask: Value, t: f32, f: Value) -> Value {
        let t = self.f(t);
        self.sel(mask, t, f)
    }

    /// `min(x, c)` that keeps a NaN `x` (`c < x ? c : x`; `minps` for vectors).
    fn minc(&mut self, x: Value, c: f32) -> Value {
        let cv = self.f(c);
        let m = self.fcmp(FloatCC::LessThan, cv, x);
        self.sel(m, cv, x)
    }
    /// `max(x, c)` that keeps a NaN `x` (`x < c ? c : x`; `maxps` for vectors).
    fn maxc(&mut self, x: Value, c: f32) -> Value {
        let cv = self.f(c);
        let m = self.fcmp(FloatCC::LessThan, x, cv);
        self.sel(m, cv, x)
    }

    /// Horner: `c[0] + v*(c[1] + v*(... + v*c[n-1]))`.
    fn horner(&mut self, coefs: &[f32], v: Value) -> Value {
        let mut p = self.f(coefs[coefs.len() - 1]);
        for &c in coefs[..coefs.len() - 1].iter().rev() {
            p = self.mul_addc(p, v, c);
        }
        p
    }

    /// `|r|` with the sign bit of `x`.
    fn copysign(&mut self, r: Value, x: Value) -> Value {
        let rb = self.bits(r);
        let rb = self.bandc(rb, 0x7fff_ffff);
        let xb = self.bits(x);
        let sb = self.bandc(xb, i32::MIN);
        let o = self.b.ins().bor(rb, sb);
        self.float(o)
    }

    /// `2^n` for integer lanes `n` in `[-126, 127]`.
    fn pow2i(&mut self, n: Value) -> Value {
        let t = self.iaddc(n, 127);
        let t = self.shl(t, 23);
        self.float(t)
    }

    /// Round to the nearest integer for `|x| < 2^22`: returns `(float, int)`.
    fn round_small(&mut self, x: Value) -> (Value, Value) {
        const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
        let t = self.addc(x, MAGIC);
        let tb = self.bits(t);
        let n_i = self.iaddc(tb, -(MAGIC.to_bits() as i32));
        let mv = self.f(MAGIC);
        let n = self.sub(t, mv);
        (n, n_i)
    }

    // --- double-f32 arithmetic (for pow) ---

    /// Veltkamp split: `a = hi + lo` with `hi` holding the top 12 bits.
    fn split(&mut self, a: Value) -> (Value, Value) {
        let t = self.mulc(a, 4097.0);
        let d = self.sub(t, a);
        let hi = self.sub(t, d);
        let lo = self.sub(a, hi);
        (hi, lo)
    }
    /// Dekker product: `a*b = p + err` exactly (barring over/underflow).
    fn two_prod(&mut self, a: Value, b: Value) -> (Value, Value) {
        let p = self.mul(a, b);
        let (ah, al) = self.split(a);
        let (bh, bl) = self.split(b);
        let t = self.mul(ah, bh);
        let t = self.sub(t, p);
        let u = self.mul(ah, bl);
        let t = self.add(t, u);
        let u = self.mul(al, bh);
        let t = self.add(t, u);
        let u = self.mul(al, bl);
        let err = self.add(t, u);
        (p, err)
    }
    /// Knuth two-sum: `a+b = s + err` exactly.
    fn two_sum(&mut self, a: Value, b: Value) -> (Value, Value) {
        let s = self.add(a, b);
        let bb = self.sub(s, a);
        let t = self.sub(s, bb);
        let t = self.sub(a, t);
        let u = self.sub(b, bb);
        let err = self.add(t, u);
        (s, err)
    }
}

// ---------------------------------------------------------------------------------------------
// exp

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split for Cody–Waite: `EXP_C1` has 9 significant bits, so `n*EXP_C1` is exact.
const EXP_C1: f32 = 0.693_359_4;
const EXP_C2: f32 = -2.121_944_4e-4;
/// Cephes `expf` polynomial: `exp(r) ≈ 1 + r + r^2 * P(r)`, highest degree first.
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5e-1,
];

/// `exp(x + xl)` where `xl` is an optional small low part (`|xl|` well below `ulp(x)` scale).
fn exp(e: &mut Em, x: Value, xl: Option<Value>) -> Value {
    let x = e.minc(x, 89.0);
    let x = e.maxc(x, -110.0);
    exp_unclamped(e, x, xl, true)
}

/// `exp(x)` for `x` in `[-80, 80]` (or NaN), where neither the clamps nor the two-factor
/// `2^n` are needed: the same result as [`exp`], with fewer operations.
fn exp_in_normal_range(e: &mut Em, x: Value) -> Value {
    exp_unclamped(e, x, None, false)
}

/// `exp` after the clamps; `two_factor_scale` applies `2^n` as two factors (needed where the
/// result can be subnormal or `2^n` overflow; exact and equal to one factor elsewhere).
fn exp_unclamped(e: &mut Em, x: Value, xl: Option<Value>, two_factor_scale: bool) -> Value {
    let t = e.mulc(x, LOG2E);
    let (n, n_i) = e.round_small(t);
    // `n * EXP_C1` is exact, so fusing the first step changes nothing; the second gains.
    let r = e.mulc_add(n, -EXP_C1, x);
    let mut r = e.mulc_add(n, -EXP_C2, r);
    if let Some(xl) = xl {
        // Only meaningful while x was not clamped; keep it tiny so a clamped x stays 0/inf.
        let xl = e.minc(xl, 1e-3);
        let xl = e.maxc(xl, -1e-3);
        r = e.add(r, xl);
    }
    let mut p = e.f(EXP_P[0]);
    for &c in &EXP_P[1..] {
        p = e.mul_addc(p, r, c);
    }
    let p = e.mul(p, r);
    let p = e.mul(p, r);
    let p = e.add(p, r);
    let p = e.addc(p, 1.0);
    if !two_factor_scale {
        // n in [-116, 116]: 2^n is normal, and p * 2^n is exact while it stays normal.
        let s = e.pow2i(n_i);
        return e.mul(p, s);
    }
    // 2^n as two factors so that n in [-159, 128] works (subnormal results, 2^128 overflow).
    let n1 = e.sshr(n_i, 1);
    let n2 = e.isub(n_i, n1);
    let s1 = e.pow2i(n1);
    let s2 = e.pow2i(n2);
    let y = e.mul(p, s1);
    e.mul(y, s2)
}

// ---------------------------------------------------------------------------------------------
// log

const MIN_NORMAL: f32 = f32::MIN_POSITIVE;
/// Bits of `sqrt(1/2)`: `m` is normalized into `[sqrt(1/2), sqrt(2))`.
const SQRTHF_BITS: i32 = 0x3f35_04f3;
/// Cephes `logf` polynomial: `log1p(f) ≈ f - f^2/2 + f^3 * P(f)`, highest degree first.
const LOG_P: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_4e-1,
    -2.499_999_4e-1,
    3.333_333e-1,
];

/// Splits positive `x` (normal or subnormal) into `(k as float, m)` with `x = 2^k m`,
/// `m` in `[sqrt(1/2), sqrt(2))`.
fn log_reduce(e: &mut Em, x: Value) -> (Value, Value) {
    let sub = e.fcmpc(FloatCC::LessThan, x, MIN_NORMAL);
    let xs = e.mulc(x, 8_388_608.0); // 2^23
    let xs = e.sel(sub, xs, x);
    let zero = e.f(0.0);
    let kadj = e.selc(sub, 23.0, zero);
    let ix = e.bits(xs);
    let t = e.iaddc(ix, -SQRTHF_BITS);
    let k = e.sshr(t, 23);
    let ks = e.shl(k, 23);
    let mb = e.isub(ix, ks);
    let m = e.float(mb);
    let kf = e.i2f(k);
    let kf = e.sub(kf, kadj);
    (kf, m)
}

fn log(e: &mut Em, x: Value) -> Value {
    let (kf, m) = log_reduce(e, x);
    let f = e.addc(m, -1.0);
    let z = e.mul(f, f);
    let mut p = e.f(LOG_P[0]);
    for &c in &LOG_P[1..] {
        p = e.mul_addc(p, f, c);
    }
    let y = e.mul(p, f);
    let y = e.mul(y, z);
    let u = e.mulc(kf, EXP_C2);
    let y = e.add(y, u);
    let u = e.mulc(z, 0.5);
    let y = e.sub(y, u);
    let r = e.add(f, y);
    let u = e.mulc(kf, EXP_C1);
    let r = e.add(r, u);
    // Special values.
    let is_inf = e.fcmpc(FloatCC::Equal, x, f32::INFINITY);
    let r = e.sel(is_inf, x, r);
    let is_zero = e.fcmpc(FloatCC::Equal, x, 0.0);
    let r = e.selc(is_zero, f32::NEG_INFINITY, r);
    let is_neg = e.fcmpc(FloatCC::LessThan, x, 0.0);
    let r = e.selc(is_neg, f32::NAN, r);
    let is_nan = e.fcmp(FloatCC::Unordered, x, x);
    e.sel(is_nan, x, r)
}

// ---------------------------------------------------------------------------------------------
// tanh, sigmoid

/// Cephes `tanhf` polynomial for `|x| < 0.625`: `tanh x ≈ x + x^3 * P(x^2)`, highest first.
const TANH_P: [f32; 5] = [
    -5.704_988_7e-3,
    2.063_909e-2,
    -5.373_971_6e-2,
    1.333_144_2e-1,
    -3.333_328e-1,
];

fn tanh(e: &mut Em, x: Value) -> Value {
    let a = e.abs(x);
    let z = e.mul(a, a);
    let mut p = e.f(TANH_P[0]);
    for &c in &TANH_P[1..] {
        p = e.mul_addc(p, z, c);
    }
    let small = e.mul(p, z);
    let small = e.mul(small, a);
    let small = e.add(small, a);
    let a2 = e.add(a, a);
    let ex = exp(e, a2, None);
    let d = e.addc(ex, 1.0);
    let two = e.f(2.0);
    let q = e.div(two, d);
    let big = e.rsubc(1.0, q);
    let is_small = e.fcmpc(FloatCC::LessThan, a, 0.625);
    let r = e.sel(is_small, small, big);
    e.copysign(r, x)
}

fn sigmoid(e: &mut Em, x: Value) -> Value {
    let a = e.abs(x);
    let na = e.neg(a);
    let ex = exp(e, na, None);
    let d = e.addc(ex, 1.0);
    let neg = e.fcmpc(FloatCC::LessThan, x, 0.0);
    let one = e.f(1.0);
    let num = e.sel(neg, ex, one);
    e.div(num, d)
}

// ---------------------------------------------------------------------------------------------
// erf

/// `erf x ≈ x + x * P(x^2)` on `|x| < 1` (minimax for relative error), lowest degree first.
const ERF_P: [f32; 7] = [
    0.128_379_17,
    -0.376_126_26,
    0.112_835_854,
    -0.026_853_811,
    0.005_188_325_4,
    -0.000_801_017_33,
    7.853_787e-5,
];
/// `erfc x ≈ exp(-x^2) * Q(1/x)` on `[1, 4]` (minimax for absolute error), lowest first.
const ERF_Q: [f32; 7] = [
    -0.001_661_393_2,
    0.577_875_73,
    -0.033_944_808,
    -0.309_965_7,
    0.308_651_12,
    -0.138_749_12,
    0.025_377_74,
];

fn erf(e: &mut Em, x: Value) -> Value {
    let a = e.abs(x);
    let z = e.mul(a, a);
    let p = e.horner(&ERF_P, z);
    let small = e.mul(a, p);
    let small = e.add(a, small);
    let ac = e.minc(a, 4.0);
    let z2 = e.mul(ac, ac);
    let one = e.f(1.0);
    let t = e.div(one, ac);
    let nz2 = e.neg(z2);
    // -16 <= nz2 <= 0 (or NaN).
    let ex = exp_in_normal_range(e, nz2);
    let q = e.horner(&ERF_Q, t);
    let c = e.mul(ex, q);
    let big = e.rsubc(1.0, c);
    let is_small = e.fcmpc(FloatCC::LessThan, a, 1.0);
    let r = e.sel(is_small, small, big);
    e.copysign(r, x)
}

// ---------------------------------------------------------------------------------------------
// sin, cos

const TWO_OVER_PI: f32 = std::f32::consts::FRAC_2_PI;
/// `pi/2` in six parts of 8, 8, 8, 8, 8 and 24 significant bits: for `|q| < 2^16` the
/// first five products `q * part` are exact, and so (in practice) are the subtractions.
const PIO2: [u32; 6] = [
    0x3fc9_0000,
    0x39fe_0000,
    0xb52c_0000,
    0x3088_0000,
    0x2c34_0000,
    0x27c2_34c5,
];
/// Cephes `sinf`: `sin r ≈ r + r^3 * S(r^2)`, highest first.
const SIN_S: [f32; 3] = [-1.951_529_6e-4, 8.332_161e-3, -1.666_665_5e-1];
/// Cephes `cosf`: `cos r ≈ 1 - r^2/2 + r^4 * C(r^2)`, highest first.
const COS_C: [f32; 3] = [2.443_315_7e-5, -1.388_731_6e-3, 4.166_664_6e-2];

fn sincos(e: &mut Em, x: Value, cos: bool) -> Value {
    let t = e.mulc(x, TWO_OVER_PI);
    let (q, mut qi) = e.round_small(t);
    let mut r = x;
    for p in PIO2 {
        let u = e.mulc(q, f32::from_bits(p));
        r = e.sub(r, u);
    }
    // Only matters past the accurate range: keeps the polynomials finite.
    let r = e.minc(r, 4.0);
    let r = e.maxc(r, -4.0);
    if cos {
        qi = e.iaddc(qi, 1);
    }
    let z = e.mul(r, r);
    let mut ps = e.f(SIN_S[0]);
    for &c in &SIN_S[1..] {
        ps = e.mul(ps, z);
        ps = e.addc(ps, c);
    }
    let ps = e.mul(ps, z);
    let ps = e.mul(ps, r);
    let ps = e.add(ps, r);
    let mut pc = e.f(COS_C[0]);
    for &c in &COS_C[1..] {
        pc = e.mul(pc, z);
        pc = e.addc(pc, c);
    }
    let pc = e.mul(pc, z);
    let pc = e.mul(pc, z);
    let hz = e.mulc(z, 0.5);
    let pc = e.sub(pc, hz);
    let pc = e.addc(pc, 1.0);
    let odd = e.bandc(qi, 1);
    let use_cos = e.icmpc(IntCC::NotEqual, odd, 0);
    let res = e.sel(use_cos, pc, ps);
    let sign = e.bandc(qi, 2);
    let sign = e.shl(sign, 30);
    let rb = e.bits(res);
    let rb = e.b.ins().bxor(rb, sign);
    let res = e.float(rb);
    let res = e.minc(res, 1.0);
    let res = e.maxc(res, -1.0);
    if cos {
        res
    } else {
        // sin(±0) = ±0 (the reduction would turn -0 into +0).
        let is_zero = e.fcmpc(FloatCC::Equal, x, 0.0);
        e.sel(is_zero, x, res)
    }
}

// ---------------------------------------------------------------------------------------------
// pow

const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 15 significant bits
const LN2_LO: f32 = 1.428_606_8e-6;
/// `(2 atanh s - 2s - (2/3)s^3) / s^5` as a polynomial in `s^2`, lowest first.
const ATANH_R: [f32; 4] = [0.399_999_95, 0.285_721_1, 0.221_762_09, 0.195_839_06];
const TWO_THIRDS_HI: f32 = 0.666_666_7;
const TWO_THIRDS_LO: f32 = -1.986_821_6e-8;

/// `log(a)` for finite positive `a` (normal or subnormal) as `hi + lo`, relative error
/// below 2^-33. Garbage (but no trap) for other inputs.
fn log_ext(e: &mut Em, a: Value) -> (Value, Value) {
    let (kf, m) = log_reduce(e, a);
    let f = e.addc(m, -1.0);
    // d = m + 1 exactly as dh + dl.
    let dh = e.addc(m, 1.0);
    let t = e.addc(dh, -1.0);
    let dl = e.sub(m, t);
    // s = f / d as sh + sl.
    let sh = e.div(f, dh);
    let (p, pe) = e.two_prod(sh, dh);
    let t = e.sub(f, p);
    let t = e.sub(t, pe);
    let u = e.mul(sh, dl);
    let t = e.sub(t, u);
    let sl = e.div(t, dh);
    // (2/3) s^3 in double-f32, the rest in f32.
    let (zh, zl) = e.two_prod(sh, sh);
    let (ch, cl) = e.two_prod(sh, zh);
    let u = e.mul(sh, zl);
    let v = e.mulc(zh, 3.0);
    let v = e.mul(v, sl);
    let u = e.add(u, v);
    let cl = e.add(cl, u);
    let kh = e.f(TWO_THIRDS_HI);
    let (th, tl) = e.two_prod(kh, ch);
    let q = e.horner(&ATANH_R, zh);
    let u = e.mulc(cl, TWO_THIRDS_HI);
    let tail = e.add(tl, u);
    let u = e.mulc(ch, TWO_THIRDS_LO);
    let tail = e.add(tail, u);
    let u = e.mul(ch, zh);
    let u = e.mul(u, q);
    let tail = e.add(tail, u);
    // log a = k ln2 + 2 s + (2/3) s^3 + ...
    let kl = e.mulc(kf, LN2_HI);
    let s2 = e.add(sh, sh);
    let (hi, e1) = e.two_sum(kl, s2);
    let (hi, e2) = e.two_sum(hi, th);
    let lo = e.add(e1, e2);
    let u = e.mulc(kf, LN2_LO);
    let sl2 = e.add(sl, sl);
    let u = e.add(u, sl2);
    let u = e.add(u, tail);
    let lo = e.add(lo, u);
    (hi, lo)
}

/// Masks `(is_integer, is_not_integer)` of `|v|` (NaN: neither).
fn int_masks(e: &mut Em, av: Value) -> (Value, Value) {
    const TWO23: f32 = 8_388_608.0;
    let t = e.addc(av, TWO23);
    let t = e.addc(t, -TWO23);
    let big = e.fcmpc(FloatCC::GreaterThanOrEqual, av, TWO23);
    let small = e.fcmpc(FloatCC::LessThan, av, TWO23);
    let same = e.fcmp(FloatCC::Equal, t, av);
    let differ = e.fcmp(FloatCC::NotEqual, t, av);
    let is_int = e.or(big, same);
    let not_int = e.and(small, differ);
    (is_int, not_int)
}

fn pow(e: &mut Em, a: Value, y: Value) -> Value {
    let aa = e.abs(a);
    let ay = e.abs(y);
    // |a|^y for finite nonzero |a|.
    let (hi, lo) = log_ext(e, aa);
    let yc = e.minc(y, 4_294_967_296.0); // 2^32: |y log a| >= 256 beyond that (a != 1)
    let yc = e.maxc(yc, -4_294_967_296.0);
    let (ph, pl) = e.two_prod(yc, hi);
    let u = e.mul(yc, lo);
    let pl = e.add(pl, u);
    let (yh, yl) = e.two_sum(ph, pl);
    let mag = exp(e, yh, Some(yl));
    // |a| = 0 or inf.
    let y_neg = e.fcmpc(FloatCC::LessThan, y, 0.0);
    let zero = e.f(0.0);
    let inf = e.f(f32::INFINITY);
    let at0 = e.sel(y_neg, inf, zero);
    let atinf = e.sel(y_neg, zero, inf);
    let a_zero = e.fcmpc(FloatCC::Equal, aa, 0.0);
    let mag = e.sel(a_zero, at0, mag);
    let a_inf = e.fcmpc(FloatCC::Equal, aa, f32::INFINITY);
    let mag = e.sel(a_inf, atinf, mag);
    let any_nan = e.fcmp(FloatCC::Unordered, a, y);
    let mag = e.selc(any_nan, f32::NAN, mag);
    // Sign: negative base (incl. -0, -inf) with an odd integer exponent.
    let (y_int, y_not_int) = int_masks(e, ay);
    let half = e.mulc(ay, 0.5);
    let (_, half_not_int) = int_masks(e, half);
    let odd = e.and(y_int, half_not_int);
    let ab = e.bits(a);
    let a_signed = e.icmpc(IntCC::SignedLessThan, ab, 0);
    let flip = e.and(a_signed, odd);
    let nmag = e.neg(mag);
    let r = e.sel(flip, nmag, mag);
    // Negative finite base with a non-integer exponent.
    let a_lt0 = e.fcmpc(FloatCC::LessThan, a, 0.0);
    let a_fin = e.fcmpc(FloatCC::NotEqual, a, f32::NEG_INFINITY);
    let bad = e.and(a_lt0, a_fin);
    let bad = e.and(bad, y_not_int);
    let r = e.selc(bad, f32::NAN, r);
    // Results that are exactly 1.
    let y0 = e.fcmpc(FloatCC::Equal, y, 0.0);
    let a1 = e.fcmpc(FloatCC::Equal, a, 1.0);
    let am1 = e.fcmpc(FloatCC::Equal, a, -1.0);
    let yinf = e.fcmpc(FloatCC::Equal, ay, f32::INFINITY);
    let m1inf = e.and(am1, yinf);
    let one = e.or(y0, a1);
    let one = e.or(one, m1inf);
    e.selc(one, 1.0, r)
}

// ---------------------------------------------------------------------------------------------

#[cfg(test)]
pub(crate) mod testjit {
    //! A tiny JIT harness: compiles `fn(a: *const u32, b: *const u32, dst: *mut u32, n: i64)`
    //! that applies an emitter to 4 lanes at a time (vector body) and then to the tail
    //! (scalar), or only scalar.
    use cranelift_codegen::ir::{
        types, AbiParam, BlockArg, InstBuilder, MemFlagsData, Type, Value,
    };
    use cranelift_codegen::settings::{self, Configurable};
    use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
    use cranelift_jit::{JITBuilder, JITModule};
    use cranelift_module::{default_libcall_names, Linkage, Module};

    pub type KFn = unsafe extern "C" fn(*const u32, *const u32, *mut u32, i64);

    pub struct Kernel {
        _module: JITModule,
        f: KFn,
    }

    impl Kernel {
        /// Runs over `a` (and `b`, same length; pass `a` again for unary kernels).
        pub fn run(&self, a: &[u32], b: &[u32], out: &mut [u32]) {
            assert!(a.len() == b.len() && a.len() == out.len());
            unsafe { (self.f)(a.as_ptr(), b.as_ptr(), out.as_mut_ptr(), a.len() as i64) }
        }
        /// The compiled function (valid while `self` lives).
        pub fn raw(&self) -> KFn {
            self.f
        }
        pub fn run_f32(&self, a: &[f32], b: &[f32]) -> Vec<f32> {
            let mut out = vec![0u32; a.len()];
            let a: Vec<u32> = a.iter().map(|v| v.to_bits()).collect();
            let b: Vec<u32> = b.iter().map(|v| v.to_bits()).collect();
            self.run(&a, &b, &mut out);
            out.into_iter().map(f32::from_bits).collect()
        }
    }

    fn vec_of(lane: Type) -> Type {
        if lane == types::F32 {
            types::F32X4
        } else {
            types::I32X4
        }
    }

    /// `in_lane`/`out_lane` are `F32` or `I32`; `emit` gets the loaded `a` and `b` values.
    pub fn compile(
        in_lane: Type,
        out_lane: Type,
        vector: bool,
        emit: &dyn Fn(&mut FunctionBuilder, Value, Value) -> Value,
    ) -> Kernel {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").unwrap();
        let isa = cranelift_native::builder()
            .unwrap()
            .finish(settings::Flags::new(flags))
            .unwrap();
        let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
        let ptr = module.target_config().pointer_type();
        let mut ctx = module.make_context();
        for _ in 0..3 {
            ctx.func.signature.params.push(AbiParam::new(ptr));
        }
        ctx.func.signature.params.push(AbiParam::new(types::I64));
        let id = module
            .declare_function("k", Linkage::Local, &ctx.func.signature)
            .unwrap();
        let mut fctx = FunctionBuilderContext::new();
        let cfg = module.target_config();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let entry = b.create_block();
            let vhead = b.create_block();
            let vbody = b.create_block();
            let shead = b.create_block();
            let sbody = b.create_block();
            let exit = b.create_block();
            for blk in [vhead, vbody, shead, sbody] {
                b.append_block_param(blk, types::I64);
            }
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            let p = b.block_params(entry).to_vec();
            let (pa, pb, pd, n) = (p[0], p[1], p[2], p[3]);
            let zero = b.ins().iconst(types::I64, 0);
            let start = if vector { vhead } else { shead };
            b.ins().jump(start, &[BlockArg::Value(zero)]);
            let mf = MemFlagsData::trusted();

            let body = |b: &mut FunctionBuilder, i: Value, lin: Type, lout: Type| {
                let off = b.ins().ishl_imm_u(i, 2);
                let aa = b.ins().iadd(pa, off);
                let ba = b.ins().iadd(pb, off);
                let da = b.ins().iadd(pd, off);
                let x = b.ins().load(lin, mf, aa, 0);
                let y = b.ins().load(lin, mf, ba, 0);
                let r = emit(b, x, y);
                assert_eq!(b.func.dfg.value_type(r), lout);
                b.ins().store(mf, r, da, 0);
            };

            b.switch_to_block(vhead);
            let i = b.block_params(vhead)[0];
            let i4 = b.ins().iadd_imm_u(i, 4);
            let c = b.ins().icmp(
                cranelift_codegen::ir::condcodes::IntCC::SignedLessThanOrEqual,
                i4,
                n,
            );
            b.ins().brif(
                c,
                vbody,
                &[BlockArg::Value(i)],
                shead,
                &[BlockArg::Value(i)],
            );

            b.switch_to_block(vbody);
            let i = b.block_params(vbody)[0];
            body(&mut b, i, vec_of(in_lane), vec_of(out_lane));
            let i4 = b.ins().iadd_imm_u(i, 4);
            b.ins().jump(vhead, &[BlockArg::Value(i4)]);

            b.switch_to_block(shead);
            let i = b.block_params(shead)[0];
            let c = b.ins().icmp(
                cranelift_codegen::ir::condcodes::IntCC::SignedLessThan,
                i,
                n,
            );
            b.ins().brif(c, sbody, &[BlockArg::Value(i)], exit, &[]);

            b.switch_to_block(sbody);
            let i = b.block_params(sbody)[0];
            body(&mut b, i, in_lane, out_lane);
            let i1 = b.ins().iadd_imm_u(i, 1);
            b.ins().jump(shead, &[BlockArg::Value(i1)]);

            b.switch_to_block(exit);
            b.ins().return_(&[]);
            b.seal_all_blocks();
            b.finalize(cfg);
        }
        module.define_function(id, &mut ctx).unwrap();
        module.clear_context(&mut ctx);
        module.finalize_definitions().unwrap();
        let code = module.get_finalized_function(id);
        let f = unsafe { std::mem::transmute::<*const u8, KFn>(code) };
        Kernel { _module: module, f }
    }

    /// Every `step`-th bit pattern of the whole 32-bit space (both signs, inf, NaN).
    pub fn strided_bits(step: u64) -> Vec<u32> {
        (0..(1u64 << 32))
            .step_by(step as usize)
            .map(|v| v as u32)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testjit::{compile, strided_bits, Kernel};
    use super::*;

    fn kernel(f: MathFn, vector: bool) -> Kernel {
        compile(types::F32, types::F32, vector, &move |b, x, _| {
            emit_math(b, f, x)
        })
    }
    fn pow_kernel(vector: bool) -> Kernel {
        compile(types::F32, types::F32, vector, &|b, x, y| emit_pow(b, x, y))
    }

    fn sigmoid64(x: f64) -> f64 {
        if x < 0.0 {
            let e = x.exp();
            e / (1.0 + e)
        } else {
            1.0 / (1.0 + (-x).exp())
        }
    }

    fn reference(f: MathFn, x: f32) -> f64 {
        let x = x as f64;
        match f {
            MathFn::Exp => x.exp(),
            MathFn::Log => x.ln(),
            MathFn::Tanh => x.tanh(),
            MathFn::Erf => libm::erf(x),
            MathFn::Sin => x.sin(),
            MathFn::Cos => x.cos(),
            MathFn::Sigmoid => sigmoid64(x),
        }
    }

    /// Error of `y` in ulps of the f32 rounding of `exact` (see the module docs).
    fn ulp_err(y: f32, exact: f64) -> f64 {
        if exact.is_nan() || y.is_nan() {
            return if exact.is_nan() && y.is_nan() {
                0.0
            } else {
                f64::INFINITY
            };
        }
        if y.is_infinite() {
            return if (exact as f32) == y {
                0.0
            } else {
                f64::INFINITY
            };
        }
        let a = exact.abs();
        let e = if a == 0.0 || a.is_infinite() {
            -126
        } else {
            (((a.to_bits() >> 52) & 0x7ff) as i64 - 1023).max(-126)
        };
        if a.is_infinite() {
            return f64::INFINITY;
        }
        let ulp = 2f64.powi(e as i32 - 23);
        (y as f64 - exact).abs() / ulp
    }

    /// Inputs for `f`: a strided sweep of all bit patterns, dense grids over the interesting
    /// range and special values.
    fn inputs(f: MathFn, step: u64) -> Vec<f32> {
        let mut v: Vec<f32> = strided_bits(step).into_iter().map(f32::from_bits).collect();
        let grid = |v: &mut Vec<f32>, lo: f32, hi: f32, n: usize| {
            for i in 0..=n {
                v.push(lo + (hi - lo) * (i as f32 / n as f32));
            }
        };
        match f {
            MathFn::Exp => grid(&mut v, -87.0, 88.0, 1_000_000),
            MathFn::Log => grid(&mut v, 0.5, 2.0, 500_000),
            MathFn::Tanh | MathFn::Erf | MathFn::Sigmoid => grid(&mut v, -6.0, 6.0, 1_000_000),
            MathFn::Sin | MathFn::Cos => grid(&mut v, -10.0, 10.0, 1_000_000),
        }
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::from_bits(0x007f_ffff),
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            1.0,
            -1.0,
            88.72,
            88.73,
            -87.3,
            -103.9,
            -104.0,
            0.625,
            -0.625,
            3.92,
            4.0,
            std::f32::consts::FRAC_PI_2,
            std::f32::consts::PI,
            1e4,
            -1e4,
        ]);
        // Pad to a length that is not a multiple of 4 so the scalar tail runs too.
        v.push(0.5);
        if v.len().is_multiple_of(4) {
            v.push(0.25);
        }
        v
    }

    /// Max ulp error of `f` over `xs` restricted to `keep`; also checks vector == scalar.
    fn check(f: MathFn, xs: &[f32], bound: f64, keep: impl Fn(f32) -> bool) {
        let vk = kernel(f, true);
        let sk = kernel(f, false);
        let yv = vk.run_f32(xs, xs);
        let ys = sk.run_f32(xs, xs);
        let mut worst = (0.0f64, 0.0f32, 0.0f32);
        for i in 0..xs.len() {
            assert_eq!(
                yv[i].to_bits(),
                ys[i].to_bits(),
                "{f:?}: vector and scalar differ at x={:e}: {:e} vs {:e}",
                xs[i],
                yv[i],
                ys[i]
            );
            if !keep(xs[i]) {
                continue;
            }
            let err = ulp_err(yv[i], reference(f, xs[i]));
            if err > worst.0 {
                worst = (err, xs[i], yv[i]);
            }
        }
        eprintln!(
            "{f:?}: max {:.3} ulp at x={:e} (got {:e}, want {:e}) over {} points",
            worst.0,
            worst.1,
            worst.2,
            reference(f, worst.1),
            xs.len()
        );
        assert!(worst.0 <= bound, "{f:?}: {} ulp > {bound}", worst.0);
    }

    #[test]
    fn math_exp() {
        check(MathFn::Exp, &inputs(MathFn::Exp, 1031), 1.0, |_| true);
        // The brief's requirement, stated in relative terms.
        let k = kernel(MathFn::Exp, true);
        let xs: Vec<f32> = (0..=1_000_000)
            .map(|i| -87.0 + 175.0 * (i as f32 / 1e6))
            .collect();
        let ys = k.run_f32(&xs, &xs);
        for (x, y) in xs.iter().zip(&ys) {
            let r = (*x as f64).exp();
            assert!(((*y as f64 - r) / r).abs() < 2e-6, "exp({x})");
        }
        let s = k.run_f32(
            &[
                f32::INFINITY,
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                88.73,
                -110.0,
                -1e30,
            ],
            &[0.0; 7],
        );
        assert_eq!(s, [f32::INFINITY, 0.0, 1.0, 1.0, f32::INFINITY, 0.0, 0.0]);
        assert!(k.run_f32(&[f32::NAN], &[0.0])[0].is_nan());
    }

    #[test]
    fn math_log() {
        check(MathFn::Log, &inputs(MathFn::Log, 1031), 1.0, |_| true);
        let k = kernel(MathFn::Log, false);
        let s = k.run_f32(&[0.0, -0.0, f32::INFINITY, 1.0], &[0.0; 4]);
        assert_eq!(
            s,
            [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::INFINITY, 0.0]
        );
        let s = k.run_f32(&[-1.0, f32::NEG_INFINITY, -1e-45, f32::NAN], &[0.0; 4]);
        assert!(s.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn math_tanh() {
        check(MathFn::Tanh, &inputs(MathFn::Tanh, 1031), 1.5, |_| true);
        let k = kernel(MathFn::Tanh, false);
        let s = k.run_f32(
            &[f32::INFINITY, f32::NEG_INFINITY, 20.0, -0.0, 1e-30],
            &[0.0; 5],
        );
        assert_eq!(s, [1.0, -1.0, 1.0, -0.0, 1e-30]);
        assert!(s[3].is_sign_negative());
    }

    #[test]
    fn math_erf() {
        check(MathFn::Erf, &inputs(MathFn::Erf, 1031), 1.5, |_| true);
        let k = kernel(MathFn::Erf, false);
        let s = k.run_f32(
            &[f32::INFINITY, f32::NEG_INFINITY, 5.0, -0.0, 1e-30],
            &[0.0; 5],
        );
        assert_eq!(s, [1.0, -1.0, 1.0, -0.0, 1.128_379_2e-30]);
        assert!(s[3].is_sign_negative());
    }

    #[test]
    fn math_sigmoid() {
        check(MathFn::Sigmoid, &inputs(MathFn::Sigmoid, 1031), 2.5, |_| {
            true
        });
        let k = kernel(MathFn::Sigmoid, false);
        let s = k.run_f32(&[f32::INFINITY, f32::NEG_INFINITY, 0.0, -100.0], &[0.0; 4]);
        assert_eq!(&s[..3], [1.0, 0.0, 0.5]);
        assert!((s[3] as f64 - 3.720076e-44).abs() < 3e-45);
    }

    #[test]
    fn math_sin_cos() {
        for f in [MathFn::Sin, MathFn::Cos] {
            let xs = inputs(f, 1031);
            check(f, &xs, 3.5, |x| x.abs() <= 1e5);
            // Anything finite stays within [-1, 1]; infinities give NaN.
            let k = kernel(f, true);
            let ys = k.run_f32(&xs, &xs);
            for (x, y) in xs.iter().zip(&ys) {
                if x.is_finite() {
                    assert!(y.abs() <= 1.0, "{f:?}({x}) = {y}");
                } else {
                    assert!(y.is_nan());
                }
            }
        }
        let k = kernel(MathFn::Sin, false);
        let s = k.run_f32(&[-0.0, 0.0], &[0.0; 2]);
        assert!(s[0] == 0.0 && s[0].is_sign_negative() && s[1].is_sign_positive());
    }

    /// Deterministic xorshift for test inputs.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn check_pow(a: &[f32], b: &[f32], bound: f64) -> f64 {
        let yv = pow_kernel(true).run_f32(a, b);
        let ys = pow_kernel(false).run_f32(a, b);
        let mut worst = (0.0, 0.0, 0.0);
        for i in 0..a.len() {
            assert_eq!(yv[i].to_bits(), ys[i].to_bits(), "pow({}, {})", a[i], b[i]);
            let r = (a[i] as f64).powf(b[i] as f64);
            let err = ulp_err(yv[i], r);
            if err > worst.0 {
                worst = (err, a[i], b[i]);
            }
        }
        eprintln!(
            "pow: max {:.3} ulp at ({:e}, {:e})",
            worst.0, worst.1, worst.2
        );
        assert!(
            worst.0 <= bound,
            "pow({}, {}): {} ulp",
            worst.1,
            worst.2,
            worst.0
        );
        worst.0
    }

    #[test]
    fn math_pow_accuracy() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        while a.len() < 2_000_001 {
            // log-uniform base over the whole range, exponent log-uniform in ±[2^-6, 2^6];
            // keep the pairs whose result is finite and nonzero.
            let x = 2f64.powf(rng.unit() * 256.0 - 128.0) as f32;
            let y = (2f64.powf(rng.unit() * 12.0 - 6.0) * if rng.unit() < 0.5 { -1.0 } else { 1.0 })
                as f32;
            let r = (x as f64).powf(y as f64);
            if x > 0.0 && r > 1e-45 && r < 3.4e38 {
                a.push(x);
                b.push(y);
            }
        }
        check_pow(&a, &b, 1.5);
        // Bases near 1 with large exponents: |b * log a| up to ~100 stresses log's precision.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        while a.len() < 500_001 {
            let x = (1.0 + (rng.unit() - 0.5) * 2f64.powf(-(rng.unit() * 20.0))) as f32;
            let y = ((rng.unit() - 0.5) * 200.0 / (x as f64).ln().abs().max(1e-30)) as f32;
            let r = (x as f64).powf(y as f64);
            if x != 1.0 && y.is_finite() && r > 1e-45 && r < 3.4e38 {
                a.push(x);
                b.push(y);
            }
        }
        check_pow(&a, &b, 1.5);
        // Common integer/half exponents over every 1031st positive float, and negative bases.
        for e in [2.0f32, 3.0, 0.5, -1.0, -0.5, 1.0, 7.0, -2.0] {
            let xs: Vec<f32> = strided_bits(1031)
                .into_iter()
                .map(f32::from_bits)
                .filter(|x| x.is_finite() && *x != 0.0)
                .filter(|x| {
                    let r = (*x as f64).powf(e as f64);
                    r.is_nan() || (r.abs() < 3.4e38 && r.abs() > 1e-45)
                })
                .collect();
            let es = vec![e; xs.len()];
            check_pow(&xs, &es, 1.5);
        }
    }

    #[test]
    fn math_pow_special() {
        let inf = f32::INFINITY;
        let nan = f32::NAN;
        #[rustfmt::skip]
        let cases: &[(f32, f32, f32)] = &[
            (nan, 0.0, 1.0), (nan, -0.0, 1.0), (2.0, 0.0, 1.0), (-inf, 0.0, 1.0), (0.0, 0.0, 1.0),
            (1.0, nan, 1.0), (1.0, inf, 1.0), (1.0, -inf, 1.0), (-1.0, inf, 1.0), (-1.0, -inf, 1.0),
            (0.0, 2.0, 0.0), (0.0, 0.5, 0.0), (0.0, -1.0, inf), (0.0, -0.5, inf), (0.0, -inf, inf),
            (0.0, inf, 0.0), (-0.0, 3.0, -0.0), (-0.0, 2.0, 0.0), (-0.0, -3.0, -inf),
            (-0.0, -2.0, inf), (-0.0, 0.5, 0.0), (-0.0, -0.5, inf),
            (-2.0, 2.0, 4.0), (-2.0, 3.0, -8.0), (-2.0, -1.0, -0.5), (-2.0, -2.0, 0.25),
            (-3.0, 1.0, -3.0), (-2.0, inf, inf), (-2.0, -inf, 0.0), (-0.5, inf, 0.0),
            (-0.5, -inf, inf), (2.0, inf, inf), (0.5, inf, 0.0), (2.0, -inf, 0.0), (0.5, -inf, inf),
            (inf, 2.0, inf), (inf, -2.0, 0.0), (inf, 0.5, inf), (-inf, 3.0, -inf), (-inf, 2.0, inf),
            (-inf, -3.0, -0.0), (-inf, -2.0, 0.0), (-inf, 0.5, inf), (-inf, -0.5, 0.0),
            (-2.0, 16777216.0, inf), (-2.0, 16777217.0, inf), (-1.0, 16777215.0, -1.0),
            (-1.0, 8388609.0, -1.0), (-1.0, 8388610.0, 1.0),
            (2.0, 128.0, inf), (2.0, -149.0, 1e-45), (2.0, -150.0, 0.0), (2.0, 1e30, inf),
            (2.0, -1e30, 0.0), (1.0000001, 1e30, inf), (0.9999999, 1e30, 0.0), (4.0, 0.5, 2.0),
            (9.0, 0.5, 3.0), (10.0, 2.0, 100.0), (3.0, 3.0, 27.0), (0.99999994, 1e10, 0.0),
            (0.99999994, -1e10, inf), (1.0000001, 4e9, inf), (-0.99999994, 1e10, 0.0),
        ];
        let a: Vec<f32> = cases.iter().map(|c| c.0).collect();
        let b: Vec<f32> = cases.iter().map(|c| c.1).collect();
        for vector in [true, false] {
            let got = pow_kernel(vector).run_f32(&a, &b);
            for (c, g) in cases.iter().zip(&got) {
                assert!(
                    g.to_bits() == c.2.to_bits(),
                    "pow({}, {}) = {g:e}, want {:e} (vector {vector})",
                    c.0,
                    c.1,
                    c.2
                );
            }
        }
        #[rustfmt::skip]
        let nans: &[(f32, f32)] = &[
            (-2.0, 0.5), (-2.0, -1.5), (-0.5, 0.3), (-f32::MAX, 0.5), (nan, 1.0), (2.0, nan),
            (nan, nan), (0.0, nan), (inf, nan), (nan, inf), (-1.0, nan), (-1.0, 0.5),
        ];
        let a: Vec<f32> = nans.iter().map(|c| c.0).collect();
        let b: Vec<f32> = nans.iter().map(|c| c.1).collect();
        for vector in [true, false] {
            let got = pow_kernel(vector).run_f32(&a, &b);
            for (c, g) in nans.iter().zip(&got) {
                assert!(g.is_nan(), "pow({}, {}) = {g}, want NaN", c.0, c.1);
            }
        }
    }

    /// Every f32 input for every function (minutes; run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn exhaustive_bounds() {
        let chunk = 1usize << 24;
        // MATH_FNS=sin,cos restricts the run.
        let only = std::env::var("MATH_FNS").unwrap_or_default().to_lowercase();
        for f in MathFn::ALL {
            if !only.is_empty()
                && !only
                    .split(',')
                    .any(|n| n == format!("{f:?}").to_lowercase())
            {
                continue;
            }
            let buckets: &[f32] = match f {
                MathFn::Sin | MathFn::Cos => &[1e2, 1e3, 1e4, 1e5],
                _ => &[f32::INFINITY],
            };
            let vkk = kernel(f, true);
            let skk = kernel(f, false);
            let (vk, sk) = (vkk.raw(), skk.raw());
            let run = |k: super::testjit::KFn, a: &[u32], o: &mut [u32]| unsafe {
                k(a.as_ptr(), a.as_ptr(), o.as_mut_ptr(), a.len() as i64)
            };
            let worst = std::sync::Mutex::new(vec![(0.0f64, 0.0f32); buckets.len()]);
            let next = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        let mut out = vec![0u32; chunk];
                        let mut outs = vec![0u32; chunk];
                        let mut local = vec![(0.0f64, 0.0f32); buckets.len()];
                        loop {
                            let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if c >= (1u64 << 32) / chunk as u64 {
                                break;
                            }
                            let xs: Vec<u32> = (0..chunk)
                                .map(|i| (c as usize * chunk + i) as u32)
                                .collect();
                            run(vk, &xs, &mut out);
                            // The scalar path on a slice of each chunk (it is slower).
                            let m = chunk / 16;
                            run(sk, &xs[..m], &mut outs[..m]);
                            for i in 0..m {
                                assert_eq!(out[i], outs[i], "{f:?} scalar/vector at {:#x}", xs[i]);
                            }
                            for i in 0..chunk {
                                let x = f32::from_bits(xs[i]);
                                let err = ulp_err(f32::from_bits(out[i]), reference(f, x));
                                for (k, lim) in buckets.iter().enumerate() {
                                    if (x.abs() <= *lim || x.is_nan()) && err > local[k].0 {
                                        local[k] = (err, x);
                                    }
                                }
                            }
                        }
                        let mut w = worst.lock().unwrap();
                        for k in 0..buckets.len() {
                            if local[k].0 > w[k].0 {
                                w[k] = local[k];
                            }
                        }
                    });
                }
            });
            for (k, lim) in buckets.iter().enumerate() {
                let (e, x) = worst.lock().unwrap()[k];
                println!("{f:?} |x| <= {lim:e}: max {e:.3} ulp at x = {x:e}");
            }
        }
    }
}
