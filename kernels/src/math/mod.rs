//! Transcendental functions, written once over [`Lanes`]: emitted inline as Cranelift IR by the
//! code generator, and compiled ahead of time into block routines ([`block`]).
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
//! * `erf`: `x + x*P(x^2)` for `|x| < 0.875`; above, `1 - Q_k(4|x| - k)` with `k = round(4|x|)`
//!   in 4..=16, where each `Q_k` fits `erfc` on its quarter-wide piece (`|x|` clamped to 4,
//!   where erf rounds to 1), sign copied. The coefficients of the 14 degree-5 pieces come
//!   from one table by per-lane lookup. `P`, `Q_k` are fits made for this module.
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
//! | `erf`     | all                                           | 1.02            |
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

pub mod block;

/// A float lane comparison, as the algorithms below ask for it (each implementation of
/// [`Lanes`] maps it to its own instruction: Cranelift's `fcmp` condition codes, AVX-512's
/// `_CMP_*` predicates). Ordered comparisons are false when either operand is NaN; `NotEqual`
/// is true then, `Unordered` is true exactly then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatCmp {
    Equal,
    NotEqual,
    LessThan,
    LessThanOrEqual,
    GreaterThan,
    GreaterThanOrEqual,
    Unordered,
    Ordered,
}

/// A signed i32 lane comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntCmp {
    Equal,
    NotEqual,
    SignedLessThan,
    SignedLessThanOrEqual,
    SignedGreaterThan,
    SignedGreaterThanOrEqual,
}

/// `f(x)` written in `e`'s operations: Cranelift IR when `e` is the code generator's emitter,
/// AVX-512 or AVX2 registers when it is a block routine's.
#[inline(always)]
pub fn apply<E: Lanes>(e: &mut E, f: MathFn, x: E::V) -> E::V {
    match f {
        MathFn::Exp => exp(e, x, None),
        MathFn::Log => log(e, x),
        MathFn::Tanh => tanh(e, x),
        MathFn::Erf => erf(e, x),
        MathFn::Sin => sincos(e, x, false),
        MathFn::Cos => sincos(e, x, true),
        MathFn::Sigmoid => sigmoid(e, x),
        MathFn::Gelu => gelu(e, x),
        MathFn::Silu => silu(e, x),
    }
}

/// `pow(a, y)` with PyTorch (C99 `powf`) semantics, written in `e`'s operations (see the module
/// docs for the special cases and the accuracy).
#[inline(always)]
pub fn power<E: Lanes>(e: &mut E, a: E::V, y: E::V) -> E::V {
    pow(e, a, y)
}

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
    /// `x/2 * (1 + erf(x/sqrt 2))`, in the operations and order of `decompose`'s `gelu`:
    /// a kernel that computes that expression hands it to one routine (the inline form is
    /// the expression itself).
    Gelu,
    /// `x * sigmoid(x)`, as `decompose` writes `silu`.
    Silu,
}

impl MathFn {
    /// All functions, for tests and tables.
    pub const ALL: [MathFn; 9] = [
        MathFn::Exp,
        MathFn::Log,
        MathFn::Tanh,
        MathFn::Erf,
        MathFn::Sin,
        MathFn::Cos,
        MathFn::Sigmoid,
        MathFn::Gelu,
        MathFn::Silu,
    ];
}

/// `ln` of the smallest normal `f32`, rounded up to an `f32`: `exp(x)` is subnormal exactly for
/// `x` below it. Where a result that small cannot matter, kernels give 0 below it rather than
/// a subnormal, which costs an Intel core a microcode assist in every operation touching it
/// (the attention step's `exp`, autodiff's `erf` derivative: `block::rows::ERF_GRAD_FLOOR`).
pub const LN_MIN_NORMAL: f32 = -87.336_54;

/// The f32 constant of `gelu`'s `x / sqrt 2` (as the kernel's f64 constant rounds to).
pub const GELU_SCALE: f32 = std::f32::consts::FRAC_1_SQRT_2;

// ---------------------------------------------------------------------------------------------
// The operations the algorithms are written in.

/// What the algorithms below are written in: IEEE single-precision and i32 lane operations.
/// The code generator's emitter (`minductor_codegen_cpu`'s `math::Em`) emits them as Cranelift IR (scalar or 4 lanes, inline in a kernel);
/// [`block::Wide`] runs them on 16 lanes in Rust compiled ahead of time for AVX-512 or AVX2
/// (kernels hand it blocks of values). Both perform the same operations in the same order, so
/// their results agree bit for bit and the accuracy table above holds for both.
pub trait Lanes {
    /// A value of the working shape: float lanes, i32 lanes or a compare mask, by use.
    type V: Copy;

    /// A float constant of the working type.
    fn f(&mut self, c: f32) -> Self::V;
    /// An i32 constant of the working integer type.
    fn i(&mut self, c: i32) -> Self::V;
    fn add(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn div(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`, fused (one rounding) where the host has FMA.
    fn mul_add(&mut self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn abs(&mut self, a: Self::V) -> Self::V;
    fn neg(&mut self, a: Self::V) -> Self::V;
    /// Float → its bits (same lane count).
    fn bits(&mut self, x: Self::V) -> Self::V;
    /// Bits → float.
    fn float(&mut self, i: Self::V) -> Self::V;
    fn iadd(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn isub(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// Bitwise and of i32 lanes or masks.
    fn band(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// Bitwise or of i32 lanes or masks.
    fn bor(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn bxor(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn shl(&mut self, a: Self::V, n: i64) -> Self::V;
    fn ushr(&mut self, a: Self::V, n: i64) -> Self::V;
    fn sshr(&mut self, a: Self::V, n: i64) -> Self::V;
    /// i32 lanes → f32 lanes (value conversion).
    fn i2f(&mut self, i: Self::V) -> Self::V;
    /// Float compare → mask.
    fn fcmp(&mut self, cc: FloatCmp, a: Self::V, b: Self::V) -> Self::V;
    /// Integer compare → mask.
    fn icmp(&mut self, cc: IntCmp, a: Self::V, b: Self::V) -> Self::V;
    /// `mask ? t : f`, lane-wise.
    fn sel(&mut self, mask: Self::V, t: Self::V, f: Self::V) -> Self::V;
    /// `table[idx & 15]` for i32 lanes `idx`: a table lookup (one permute on AVX-512).
    fn lookup(&mut self, table: &'static [f32; 16], idx: Self::V) -> Self::V;

    #[inline(always)]
    fn and(&mut self, m1: Self::V, m2: Self::V) -> Self::V {
        self.band(m1, m2)
    }
    #[inline(always)]
    fn or(&mut self, m1: Self::V, m2: Self::V) -> Self::V {
        self.bor(m1, m2)
    }
    /// `a * b + c` for a constant `c`.
    #[inline(always)]
    fn mul_addc(&mut self, a: Self::V, b: Self::V, c: f32) -> Self::V {
        let c = self.f(c);
        self.mul_add(a, b, c)
    }
    /// `a * c + d` for a constant `c`.
    #[inline(always)]
    fn mulc_add(&mut self, a: Self::V, c: f32, d: Self::V) -> Self::V {
        let c = self.f(c);
        self.mul_add(a, c, d)
    }
    #[inline(always)]
    fn addc(&mut self, a: Self::V, c: f32) -> Self::V {
        let c = self.f(c);
        self.add(a, c)
    }
    #[inline(always)]
    fn mulc(&mut self, a: Self::V, c: f32) -> Self::V {
        let c = self.f(c);
        self.mul(a, c)
    }
    /// `c - a`.
    #[inline(always)]
    fn rsubc(&mut self, c: f32, a: Self::V) -> Self::V {
        let c = self.f(c);
        self.sub(c, a)
    }
    #[inline(always)]
    fn iaddc(&mut self, a: Self::V, c: i32) -> Self::V {
        let c = self.i(c);
        self.iadd(a, c)
    }
    #[inline(always)]
    fn bandc(&mut self, a: Self::V, c: i32) -> Self::V {
        let c = self.i(c);
        self.band(a, c)
    }
    #[inline(always)]
    fn borc(&mut self, a: Self::V, c: i32) -> Self::V {
        let c = self.i(c);
        self.bor(a, c)
    }
    #[inline(always)]
    fn fcmpc(&mut self, cc: FloatCmp, a: Self::V, c: f32) -> Self::V {
        let c = self.f(c);
        self.fcmp(cc, a, c)
    }
    #[inline(always)]
    fn icmpc(&mut self, cc: IntCmp, a: Self::V, c: i32) -> Self::V {
        let c = self.i(c);
        self.icmp(cc, a, c)
    }
    #[inline(always)]
    fn selc(&mut self, mask: Self::V, t: f32, f: Self::V) -> Self::V {
        let t = self.f(t);
        self.sel(mask, t, f)
    }
    /// `min(x, c)` that keeps a NaN `x` (`c < x ? c : x`; `minps` for vectors).
    #[inline(always)]
    fn minc(&mut self, x: Self::V, c: f32) -> Self::V {
        let cv = self.f(c);
        let m = self.fcmp(FloatCmp::LessThan, cv, x);
        self.sel(m, cv, x)
    }
    /// `max(x, c)` that keeps a NaN `x` (`x < c ? c : x`; `maxps` for vectors).
    #[inline(always)]
    fn maxc(&mut self, x: Self::V, c: f32) -> Self::V {
        let cv = self.f(c);
        let m = self.fcmp(FloatCmp::LessThan, x, cv);
        self.sel(m, cv, x)
    }
    /// Horner: `c[0] + v*(c[1] + v*(... + v*c[n-1]))`.
    #[inline(always)]
    fn horner(&mut self, coefs: &[f32], v: Self::V) -> Self::V {
        let mut p = self.f(coefs[coefs.len() - 1]);
        for &c in coefs[..coefs.len() - 1].iter().rev() {
            p = self.mul_addc(p, v, c);
        }
        p
    }
    /// `|r|` with the sign bit of `x`.
    #[inline(always)]
    fn copysign(&mut self, r: Self::V, x: Self::V) -> Self::V {
        let rb = self.bits(r);
        let rb = self.bandc(rb, 0x7fff_ffff);
        let xb = self.bits(x);
        let sb = self.bandc(xb, i32::MIN);
        let o = self.bor(rb, sb);
        self.float(o)
    }
    /// `2^n` for integer lanes `n` in `[-126, 127]`.
    #[inline(always)]
    fn pow2i(&mut self, n: Self::V) -> Self::V {
        let t = self.iaddc(n, 127);
        let t = self.shl(t, 23);
        self.float(t)
    }
    /// `p * 2^n`, for `p` in `[0.5, 2]` and `n` integer-valued in `[-159, 128]` (`n_i` the same
    /// as i32 lanes), rounded once: `2^n` is applied as two factors (the first product exact),
    /// so that subnormal results and `2^128` overflow come out right. AVX-512 does it in one
    /// `vscalefps`, which rounds the exact product once too.
    #[inline(always)]
    fn scale_pow2(&mut self, p: Self::V, n: Self::V, n_i: Self::V) -> Self::V {
        let _ = n;
        let n1 = self.sshr(n_i, 1);
        let n2 = self.isub(n_i, n1);
        let s1 = self.pow2i(n1);
        let s2 = self.pow2i(n2);
        let y = self.mul(p, s1);
        self.mul(y, s2)
    }
    /// Round to the nearest integer for `|x| < 2^22`: returns `(float, int)`.
    #[inline(always)]
    fn round_small(&mut self, x: Self::V) -> (Self::V, Self::V) {
        const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
        let t = self.addc(x, MAGIC);
        let tb = self.bits(t);
        let n_i = self.iaddc(tb, -(MAGIC.to_bits() as i32));
        let mv = self.f(MAGIC);
        let n = self.sub(t, mv);
        (n, n_i)
    }
    /// Veltkamp split: `a = hi + lo` with `hi` holding the top 12 bits.
    #[inline(always)]
    fn split(&mut self, a: Self::V) -> (Self::V, Self::V) {
        let t = self.mulc(a, 4097.0);
        let d = self.sub(t, a);
        let hi = self.sub(t, d);
        let lo = self.sub(a, hi);
        (hi, lo)
    }
    /// Dekker product: `a*b = p + err` exactly (barring over/underflow).
    #[inline(always)]
    fn two_prod(&mut self, a: Self::V, b: Self::V) -> (Self::V, Self::V) {
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
    #[inline(always)]
    fn two_sum(&mut self, a: Self::V, b: Self::V) -> (Self::V, Self::V) {
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
#[inline(always)]
fn exp<E: Lanes>(e: &mut E, x: E::V, xl: Option<E::V>) -> E::V {
    let x = e.minc(x, 89.0);
    let x = e.maxc(x, -110.0);
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
    e.scale_pow2(p, n, n_i)
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
#[inline(always)]
fn log_reduce<E: Lanes>(e: &mut E, x: E::V) -> (E::V, E::V) {
    let sub = e.fcmpc(FloatCmp::LessThan, x, MIN_NORMAL);
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

#[inline(always)]
fn log<E: Lanes>(e: &mut E, x: E::V) -> E::V {
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
    let is_inf = e.fcmpc(FloatCmp::Equal, x, f32::INFINITY);
    let r = e.sel(is_inf, x, r);
    let is_zero = e.fcmpc(FloatCmp::Equal, x, 0.0);
    let r = e.selc(is_zero, f32::NEG_INFINITY, r);
    let is_neg = e.fcmpc(FloatCmp::LessThan, x, 0.0);
    let r = e.selc(is_neg, f32::NAN, r);
    let is_nan = e.fcmp(FloatCmp::Unordered, x, x);
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

#[inline(always)]
fn tanh<E: Lanes>(e: &mut E, x: E::V) -> E::V {
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
    let is_small = e.fcmpc(FloatCmp::LessThan, a, 0.625);
    let r = e.sel(is_small, small, big);
    e.copysign(r, x)
}

#[inline(always)]
fn sigmoid<E: Lanes>(e: &mut E, x: E::V) -> E::V {
    let a = e.abs(x);
    let na = e.neg(a);
    let ex = exp(e, na, None);
    let d = e.addc(ex, 1.0);
    let neg = e.fcmpc(FloatCmp::LessThan, x, 0.0);
    let one = e.f(1.0);
    let num = e.sel(neg, ex, one);
    e.div(num, d)
}

// ---------------------------------------------------------------------------------------------
// erf

/// Below this `|x|`, `erf x = x + x * P(x^2)`; above, `erf x = 1 - Q_k(4|x| - k)`.
const ERF_SMALL: f32 = 0.875;
/// The pieces of `erf`, coefficients lowest degree first: piece 0 is `P` (minimax-like for
/// relative error on `|x| < 0.875`), piece `k - 3` is `Q_k`, which fits `erfc` on
/// `|x| in [(k - 1/2)/4, (k + 1/2)/4]` as a polynomial in `s = 4|x| - k` (`k` = 4..16, `s` in
/// `[-1/2, 1/2]`, computed exactly). Chebyshev interpolants in high precision, rounded to f32.
const ERF_PIECES: [[f32; 6]; 14] = [
    // |x| < 0.875: erf(x) = x + x*P(x^2)
    [
        0.12837915,
        -0.37612554,
        0.11282497,
        -0.026792947,
        0.005034371,
        -0.0006214585,
    ],
    // |x| in [0.875, 1.125]: erfc(x) = Q(4|x| - 4)
    [
        0.1572992,
        -0.10377687,
        0.025944257,
        -0.0021619857,
        -0.0002706669,
        6.721696e-05,
    ],
    // |x| in [1.125, 1.375]: erfc(x) = Q(4|x| - 5)
    [
        0.07709987,
        -0.05913028,
        0.018478394,
        -0.002617739,
        2.2119131e-05,
        4.599189e-05,
    ],
    // |x| in [1.375, 1.625]: erfc(x) = Q(4|x| - 6)
    [
        0.03389485,
        -0.029732572,
        0.0111498805,
        -0.0021680102,
        0.00017244874,
        1.4625731e-05,
    ],
    // |x| in [1.625, 1.875]: erfc(x) = Q(4|x| - 7)
    [
        0.013328328,
        -0.013193749,
        0.0057723424,
        -0.0014087205,
        0.0001870775,
        -6.330789e-06,
    ],
    // |x| in [1.875, 2.125]: erfc(x) = Q(4|x| - 8)
    [
        0.004677735,
        -0.005166746,
        0.0025833775,
        -0.00075349107,
        0.00013450609,
        -1.2704959e-05,
    ],
    // |x| in [2.125, 2.375]: erfc(x) = Q(4|x| - 9)
    [
        0.001462717,
        -0.0017855797,
        0.0010043639,
        -0.0003394476,
        7.480876e-05,
        -1.0392396e-05,
    ],
    // |x| in [2.375, 2.625]: erfc(x) = Q(4|x| - 10)
    [
        0.00040695234,
        -0.0005445711,
        0.00034033295,
        -0.000130469,
        3.393694e-05,
        -5.986287e-06,
    ],
    // |x| in [2.625, 2.875]: erfc(x) = Q(4|x| - 11)
    [
        0.00010062212,
        -0.00014656933,
        0.00010075216,
        -4.312969e-05,
        1.28788815e-05,
        -2.705977e-06,
    ],
    // |x| in [2.875, 3.125]: erfc(x) = Q(4|x| - 12)
    [
        2.2090586e-05,
        -3.4813274e-05,
        2.6103586e-05,
        -1.2328858e-05,
        4.1474655e-06,
        -1.001667e-06,
    ],
    // |x| in [3.125, 3.375]: erfc(x) = Q(4|x| - 13)
    [
        4.3028112e-06,
        -7.2972616e-06,
        5.926743e-06,
        -3.0591607e-06,
        1.1436697e-06,
        -3.103438e-07,
    ],
    // |x| in [3.375, 3.625]: erfc(x) = Q(4|x| - 14)
    [
        7.4310776e-07,
        -1.3498584e-06,
        1.1804507e-06,
        -6.607417e-07,
        2.7169565e-07,
        -8.152978e-08,
    ],
    // |x| in [3.625, 3.875]: erfc(x) = Q(4|x| - 15)
    [
        1.13729584e-07,
        -2.2035854e-07,
        2.064181e-07,
        -1.2449003e-07,
        5.584979e-08,
        -1.831538e-08,
    ],
    // |x| in [3.875, 4.125]: erfc(x) = Q(4|x| - 16)
    [
        1.5417248e-08,
        -3.174713e-08,
        3.17098e-08,
        -2.0802753e-08,
        8.467064e-09,
        -5.316244e-09,
    ],
];
/// [`ERF_PIECES`] by coefficient, padded to 16 pieces: `ERF_TABLE[j][i]` is coefficient `j` of
/// piece `i`, what one [`Lanes::lookup`] reads (a `vpermps` on AVX-512). A `static`: inline
/// kernels load from its address.
static ERF_TABLE: [[f32; 16]; 6] = by_coefficient(ERF_PIECES);

const fn by_coefficient<const N: usize>(pieces: [[f32; 6]; N]) -> [[f32; 16]; 6] {
    assert!(N <= 16);
    let mut table = [[0.0; 16]; 6];
    let mut i = 0;
    while i < N {
        let mut j = 0;
        while j < 6 {
            table[j][i] = pieces[i][j];
            j += 1;
        }
        i += 1;
    }
    table
}

/// One Horner evaluation on per-lane coefficients from [`ERF_TABLE`]: `P(x^2)` for small `|x|`,
/// else `Q_k(4|x| - k)` with `k = round(4|x|)` (`|x|` clamped to 4, where `erf` rounds to 1).
/// No division and no `exp`: the pieces' 6 table lookups and 5 multiply-adds bound the
/// routine's throughput.
#[inline(always)]
fn erf<E: Lanes>(e: &mut E, x: E::V) -> E::V {
    let a = e.abs(x);
    let is_small = e.fcmpc(FloatCmp::LessThan, a, ERF_SMALL);
    let z = e.mul(a, a);
    let ac = e.minc(a, 4.0);
    let a4 = e.mulc(ac, 4.0);
    // k in [4, 16] where not small (ties go to even: 4|x| = 3.5 gives k = 4); s exact.
    let (k, k_i) = e.round_small(a4);
    let s = e.sub(a4, k);
    let piece = e.iaddc(k_i, -3);
    let zero = e.i(0);
    let piece = e.sel(is_small, zero, piece);
    let u = e.sel(is_small, z, s);
    let mut p = e.lookup(&ERF_TABLE[5], piece);
    for j in (0..5).rev() {
        let c = e.lookup(&ERF_TABLE[j], piece);
        p = e.mul_add(p, u, c);
    }
    let small = e.mul(a, p);
    let small = e.add(a, small);
    let big = e.rsubc(1.0, p);
    let r = e.sel(is_small, small, big);
    e.copysign(r, x)
}

#[inline(always)]
fn gelu<E: Lanes>(e: &mut E, x: E::V) -> E::V {
    let scaled = e.mulc(x, GELU_SCALE);
    let r = erf(e, scaled);
    let one_plus = e.addc(r, 1.0);
    let half_x = e.mulc(x, 0.5);
    e.mul(half_x, one_plus)
}

#[inline(always)]
fn silu<E: Lanes>(e: &mut E, x: E::V) -> E::V {
    let s = sigmoid(e, x);
    e.mul(x, s)
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

#[inline(always)]
fn sincos<E: Lanes>(e: &mut E, x: E::V, cos: bool) -> E::V {
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
    let use_cos = e.icmpc(IntCmp::NotEqual, odd, 0);
    let res = e.sel(use_cos, pc, ps);
    let sign = e.bandc(qi, 2);
    let sign = e.shl(sign, 30);
    let rb = e.bits(res);
    let rb = e.bxor(rb, sign);
    let res = e.float(rb);
    let res = e.minc(res, 1.0);
    let res = e.maxc(res, -1.0);
    if cos {
        res
    } else {
        // sin(±0) = ±0 (the reduction would turn -0 into +0).
        let is_zero = e.fcmpc(FloatCmp::Equal, x, 0.0);
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
#[inline(always)]
fn log_ext<E: Lanes>(e: &mut E, a: E::V) -> (E::V, E::V) {
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
#[inline(always)]
fn int_masks<E: Lanes>(e: &mut E, av: E::V) -> (E::V, E::V) {
    const TWO23: f32 = 8_388_608.0;
    let t = e.addc(av, TWO23);
    let t = e.addc(t, -TWO23);
    let big = e.fcmpc(FloatCmp::GreaterThanOrEqual, av, TWO23);
    let small = e.fcmpc(FloatCmp::LessThan, av, TWO23);
    let same = e.fcmp(FloatCmp::Equal, t, av);
    let differ = e.fcmp(FloatCmp::NotEqual, t, av);
    let is_int = e.or(big, same);
    let not_int = e.and(small, differ);
    (is_int, not_int)
}

#[inline(always)]
fn pow<E: Lanes>(e: &mut E, a: E::V, y: E::V) -> E::V {
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
    let y_neg = e.fcmpc(FloatCmp::LessThan, y, 0.0);
    let zero = e.f(0.0);
    let inf = e.f(f32::INFINITY);
    let at0 = e.sel(y_neg, inf, zero);
    let atinf = e.sel(y_neg, zero, inf);
    let a_zero = e.fcmpc(FloatCmp::Equal, aa, 0.0);
    let mag = e.sel(a_zero, at0, mag);
    let a_inf = e.fcmpc(FloatCmp::Equal, aa, f32::INFINITY);
    let mag = e.sel(a_inf, atinf, mag);
    let any_nan = e.fcmp(FloatCmp::Unordered, a, y);
    let mag = e.selc(any_nan, f32::NAN, mag);
    // Sign: negative base (incl. -0, -inf) with an odd integer exponent.
    let (y_int, y_not_int) = int_masks(e, ay);
    let half = e.mulc(ay, 0.5);
    let (_, half_not_int) = int_masks(e, half);
    let odd = e.and(y_int, half_not_int);
    let ab = e.bits(a);
    let a_signed = e.icmpc(IntCmp::SignedLessThan, ab, 0);
    let flip = e.and(a_signed, odd);
    let nmag = e.neg(mag);
    let r = e.sel(flip, nmag, mag);
    // Negative finite base with a non-integer exponent.
    let a_lt0 = e.fcmpc(FloatCmp::LessThan, a, 0.0);
    let a_fin = e.fcmpc(FloatCmp::NotEqual, a, f32::NEG_INFINITY);
    let bad = e.and(a_lt0, a_fin);
    let bad = e.and(bad, y_not_int);
    let r = e.selc(bad, f32::NAN, r);
    // Results that are exactly 1.
    let y0 = e.fcmpc(FloatCmp::Equal, y, 0.0);
    let a1 = e.fcmpc(FloatCmp::Equal, a, 1.0);
    let am1 = e.fcmpc(FloatCmp::Equal, a, -1.0);
    let yinf = e.fcmpc(FloatCmp::Equal, ay, f32::INFINITY);
    let m1inf = e.and(am1, yinf);
    let one = e.or(y0, a1);
    let one = e.or(one, m1inf);
    e.selc(one, 1.0, r)
}

// ---------------------------------------------------------------------------------------------
