//! `f16` / `bf16` <-> `f32` conversions emitted as Cranelift IR.
//!
//! Half-precision values travel as their 16 bits zero-extended in `I32` lanes (`I32` or
//! `I32X4`); the float side is `F32` / `F32X4`. Every conversion is branch-free (`select` for
//! scalars, `bitselect` for vectors) and the same code serves both shapes, so a kernel's
//! scalar tail matches its vector body bit for bit. Only integer ops, `bitcast`, compares
//! and one `fmul`/`fadd` are used, all lowered inline on x86-64 (no F16C needed).
//!
//! Results match the `half` crate exactly, except that NaN payloads are only guaranteed to
//! stay NaN:
//! * `f16 -> f32` is exact (subnormals via a multiply by `2^112`); NaN gets the quiet bit,
//!   payload kept.
//! * `bf16 -> f32` is exact: the bits shifted left by 16 (NaN passes through unchanged).
//! * `f32 -> f16` rounds to nearest-even, overflows to `±inf` (from `65520` up), produces
//!   subnormals and signed zeros; NaN becomes a quiet NaN with the top payload bits kept.
//! * `f32 -> bf16` rounds to nearest-even (overflow to `±inf`); NaN keeps its top bits with
//!   the quiet bit set.

use crate::math::{Em, Lanes};
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::FunctionBuilder;
use minductor_kernels::math::IntCmp;

/// `bits` is `I32` or `I32X4` holding an IEEE half's 16 bits zero-extended; returns
/// `F32` / `F32X4`.
pub fn emit_f16_to_f32(b: &mut FunctionBuilder, bits: Value) -> Value {
    let mut e = Em::new(b, bits);
    let sign = e.bandc(bits, 0x8000);
    let sign = e.shl(sign, 16);
    let em = e.bandc(bits, 0x7fff);
    let o = e.shl(em, 13);
    // Finite values: exponent/mantissa moved into place, then rebias by multiplying with
    // 2^112 (exact, also for half subnormals, which land on f32 subnormals first).
    let f = e.float(o);
    let scale = e.f(f32::from_bits((127 + 112) << 23));
    let f = e.mul(f, scale);
    let fin = e.bits(f);
    // Inf / NaN: all exponent bits set, mantissa kept, NaN made quiet.
    let inf = e.borc(o, 0x7f80_0000);
    let nan = e.borc(o, 0x7fc0_0000);
    let is_nan = e.icmpc(IntCmp::SignedGreaterThan, em, 0x7c00);
    let special = e.sel(is_nan, nan, inf);
    let is_special = e.icmpc(IntCmp::SignedGreaterThanOrEqual, em, 0x7c00);
    let r = e.sel(is_special, special, fin);
    let r = e.b.ins().bor(r, sign);
    e.float(r)
}

/// `bits` is `I32` or `I32X4` holding a bfloat16's 16 bits zero-extended; returns
/// `F32` / `F32X4`.
pub fn emit_bf16_to_f32(b: &mut FunctionBuilder, bits: Value) -> Value {
    let mut e = Em::new(b, bits);
    let r = e.shl(bits, 16);
    e.float(r)
}

/// `x` is `F32` / `F32X4`; returns `I32` / `I32X4` holding the IEEE half bits (upper 16 bits
/// zero), rounded to nearest-even.
pub fn emit_f32_to_f16_bits(b: &mut FunctionBuilder, x: Value) -> Value {
    let mut e = Em::new(b, x);
    let xb = e.bits(x);
    let sign = e.bandc(xb, i32::MIN);
    let sign = e.ushr(sign, 16);
    let u = e.bandc(xb, 0x7fff_ffff);
    // |x| >= 65536 (or inf/NaN): inf, or a quiet NaN keeping the top payload bits.
    let man = e.bandc(u, 0x007f_ffff);
    let man = e.ushr(man, 13);
    let nan = e.borc(man, 0x7e00);
    let inf = e.i(0x7c00);
    let is_nan = e.icmpc(IntCmp::SignedGreaterThan, u, 0x7f80_0000);
    let big = e.sel(is_nan, nan, inf);
    // |x| < 2^-14: half subnormal or zero. Adding 0.5 aligns the 10 mantissa bits at the
    // bottom of the f32 mantissa and rounds to nearest-even in hardware.
    let ax = e.float(u);
    let magic = e.f(0.5);
    let s = e.add(ax, magic);
    let sb = e.bits(s);
    let sub = e.iaddc(sb, -0x3f00_0000);
    // Normal: rebias the exponent, round to nearest-even, shift.
    let odd = e.ushr(u, 13);
    let odd = e.bandc(odd, 1);
    let n = e.iaddc(u, ((15 - 127) << 23) + 0xfff);
    let n = e.iadd(n, odd);
    let norm = e.ushr(n, 13);
    let is_sub = e.icmpc(IntCmp::SignedLessThan, u, 113 << 23);
    let r = e.sel(is_sub, sub, norm);
    let is_big = e.icmpc(IntCmp::SignedGreaterThanOrEqual, u, (127 + 16) << 23);
    let r = e.sel(is_big, big, r);
    e.b.ins().bor(r, sign)
}

/// `x` is `F32` / `F32X4`; returns `I32` / `I32X4` holding the bfloat16 bits (upper 16 bits
/// zero), rounded to nearest-even.
pub fn emit_f32_to_bf16_bits(b: &mut FunctionBuilder, x: Value) -> Value {
    let mut e = Em::new(b, x);
    let xb = e.bits(x);
    let hi = e.ushr(xb, 16);
    let odd = e.bandc(hi, 1);
    let r = e.iaddc(xb, 0x7fff);
    let r = e.iadd(r, odd);
    let r = e.ushr(r, 16);
    let nan = e.borc(hi, 0x0040);
    let u = e.bandc(xb, 0x7fff_ffff);
    let is_nan = e.icmpc(IntCmp::SignedGreaterThan, u, 0x7f80_0000);
    e.sel(is_nan, nan, r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::tests::testjit::{compile, strided_bits, Kernel};
    use cranelift_codegen::ir::types;
    use half::{bf16, f16};

    type Emit = fn(&mut FunctionBuilder, Value) -> Value;

    fn kernels(to_f32: bool, f: Emit) -> [Kernel; 2] {
        let (i, o) = if to_f32 {
            (types::I32, types::F32)
        } else {
            (types::F32, types::I32)
        };
        [true, false].map(|v| compile(i, o, v, &move |b, x, _| f(b, x)))
    }

    /// Runs both the vector and the scalar kernel, checks they agree, returns the result.
    fn run(ks: &[Kernel; 2], input: &[u32]) -> Vec<u32> {
        let mut v = vec![0; input.len()];
        let mut s = vec![0; input.len()];
        ks[0].run(input, input, &mut v);
        ks[1].run(input, input, &mut s);
        for i in 0..input.len() {
            assert_eq!(v[i], s[i], "vector/scalar differ for input {:#x}", input[i]);
        }
        v
    }

    fn all_halves() -> Vec<u32> {
        let mut v: Vec<u32> = (0..=0xffffu32).collect();
        v.push(0x3c00); // odd length: exercise the scalar tail
        v
    }

    #[test]
    fn convert_f16_to_f32_exhaustive() {
        let ks = kernels(true, emit_f16_to_f32);
        let hs = all_halves();
        let out = run(&ks, &hs);
        for (h, o) in hs.iter().zip(&out) {
            let want = f16::from_bits(*h as u16).to_f32();
            let got = f32::from_bits(*o);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}: {got}");
            } else {
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{h:#06x}: {got:e} vs {want:e}"
                );
            }
        }
    }

    #[test]
    fn convert_bf16_to_f32_exhaustive() {
        let ks = kernels(true, emit_bf16_to_f32);
        let hs = all_halves();
        let out = run(&ks, &hs);
        for (h, o) in hs.iter().zip(&out) {
            let want = bf16::from_bits(*h as u16).to_f32();
            let got = f32::from_bits(*o);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}: {got}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    /// A strided sweep of all f32 patterns plus every f32 within a few ulps of each
    /// half / bfloat16 value and each midpoint between neighbours (the rounding cases).
    fn f32_inputs(mid_shift: u32) -> Vec<u32> {
        let mut v = strided_bits(61);
        for h in 0..=0xffffu32 {
            let base = if mid_shift == 13 {
                f16::from_bits(h as u16).to_f32().to_bits()
            } else {
                h << 16
            };
            let half_ulp = 1u32 << (mid_shift - 1);
            for d in [0u32, 1, half_ulp - 1, half_ulp, half_ulp + 1] {
                v.push(base.wrapping_add(d));
                v.push(base.wrapping_sub(d));
            }
        }
        // Half subnormal range, densely: every 7th pattern in [2^-26, 2^-14].
        if mid_shift == 13 {
            v.extend((0x3280_0000u32..0x3880_0000).step_by(7));
            v.extend((0xb280_0000u32..0xb880_0000).step_by(7));
        }
        v.extend([
            0x477f_efff,
            0x477f_f000,
            0x477f_f001,
            0x7f7f_ffff,
            0x7f80_0000,
            0xff80_0000,
        ]);
        if v.len().is_multiple_of(4) {
            v.push(0);
        }
        v
    }

    #[test]
    fn convert_f32_to_f16_sweep() {
        let ks = kernels(false, emit_f32_to_f16_bits);
        let xs = f32_inputs(13);
        let out = run(&ks, &xs);
        for (x, o) in xs.iter().zip(&out) {
            let xf = f32::from_bits(*x);
            let want = f16::from_f32(xf);
            assert_eq!(o >> 16, 0, "{x:#x}: upper bits set");
            let got = f16::from_bits(*o as u16);
            if want.is_nan() {
                assert!(got.is_nan(), "{xf:e} ({x:#x}): {o:#x}");
            } else {
                assert_eq!(*o, want.to_bits() as u32, "{xf:e} ({x:#x})");
            }
        }
    }

    #[test]
    fn convert_f32_to_bf16_sweep() {
        let ks = kernels(false, emit_f32_to_bf16_bits);
        let xs = f32_inputs(16);
        let out = run(&ks, &xs);
        for (x, o) in xs.iter().zip(&out) {
            let xf = f32::from_bits(*x);
            let want = bf16::from_f32(xf);
            assert_eq!(o >> 16, 0, "{x:#x}: upper bits set");
            let got = bf16::from_bits(*o as u16);
            if want.is_nan() {
                assert!(got.is_nan(), "{xf:e} ({x:#x}): {o:#x}");
            } else {
                assert_eq!(*o, want.to_bits() as u32, "{xf:e} ({x:#x})");
            }
        }
    }
}
