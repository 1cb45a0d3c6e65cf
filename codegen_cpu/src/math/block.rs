//! The math algorithms compiled ahead of time for wide vectors, called by kernels on blocks.
//!
//! Cranelift emits 128-bit vectors only, so an inline `exp` or `erf` runs 4 lanes per
//! instruction where the CPU has 16 (AVX-512) or 8 (AVX2). As Inductor's C++ calls Sleef, a
//! kernel whose loop computes such a function hands a block of arguments to a routine here
//! (see `lower.rs`, "math blocks"), which runs the very same algorithm (`super::exp`, …) on
//! [`Wide`]: 16 lanes held as `[u32; 16]`, every operation a lane-wise loop that LLVM turns
//! into one AVX-512 instruction (two AVX2 ones) inside the `#[target_feature]` functions below.
//! The operations and their order are those of the inline form, so the results agree bit for
//! bit (tested in `tests.rs`) and one accuracy table covers both.
//!
//! A routine is chosen once per process by [`block_routine`]: AVX-512F, else AVX2 with FMA,
//! else none (then kernels keep the inline form, which is as wide as a plain SSE routine).

use super::{Lanes, MathFn};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};

/// Lanes of one [`Wide`] value.
pub const WIDTH: usize = 16;

/// The signature of a block routine: `data[0..n] = f(data[0..n])` in place.
pub type BlockFn = unsafe extern "C" fn(data: *mut f32, n: i64);

/// 16 lanes of 32 bits: floats, i32s or masks (all ones / all zeros), by use, like the
/// untyped vector registers the inline form uses.
pub(crate) struct Wide;

type W = [u32; WIDTH];

#[inline(always)]
fn map(a: W, f: impl Fn(u32) -> u32) -> W {
    let mut r = [0; WIDTH];
    for i in 0..WIDTH {
        r[i] = f(a[i]);
    }
    r
}

#[inline(always)]
fn zip(a: W, b: W, f: impl Fn(u32, u32) -> u32) -> W {
    let mut r = [0; WIDTH];
    for i in 0..WIDTH {
        r[i] = f(a[i], b[i]);
    }
    r
}

#[inline(always)]
fn fzip(a: W, b: W, f: impl Fn(f32, f32) -> f32) -> W {
    zip(a, b, |x, y| f(f32::from_bits(x), f32::from_bits(y)).to_bits())
}

#[inline(always)]
fn mask(c: bool) -> u32 {
    if c {
        u32::MAX
    } else {
        0
    }
}

impl Lanes for Wide {
    type V = W;

    #[inline(always)]
    fn f(&mut self, c: f32) -> W {
        [c.to_bits(); WIDTH]
    }
    #[inline(always)]
    fn i(&mut self, c: i32) -> W {
        [c as u32; WIDTH]
    }
    #[inline(always)]
    fn add(&mut self, a: W, b: W) -> W {
        fzip(a, b, |x, y| x + y)
    }
    #[inline(always)]
    fn sub(&mut self, a: W, b: W) -> W {
        fzip(a, b, |x, y| x - y)
    }
    #[inline(always)]
    fn mul(&mut self, a: W, b: W) -> W {
        fzip(a, b, |x, y| x * y)
    }
    #[inline(always)]
    fn div(&mut self, a: W, b: W) -> W {
        fzip(a, b, |x, y| x / y)
    }
    /// Always fused: routines exist only for CPUs with FMA, where the inline form fuses too.
    #[inline(always)]
    fn mul_add(&mut self, a: W, b: W, c: W) -> W {
        let mut r = [0; WIDTH];
        for i in 0..WIDTH {
            let (x, y, z) = (
                f32::from_bits(a[i]),
                f32::from_bits(b[i]),
                f32::from_bits(c[i]),
            );
            r[i] = x.mul_add(y, z).to_bits();
        }
        r
    }
    #[inline(always)]
    fn abs(&mut self, a: W) -> W {
        map(a, |x| x & 0x7fff_ffff)
    }
    #[inline(always)]
    fn neg(&mut self, a: W) -> W {
        map(a, |x| x ^ 0x8000_0000)
    }
    #[inline(always)]
    fn bits(&mut self, x: W) -> W {
        x
    }
    #[inline(always)]
    fn float(&mut self, i: W) -> W {
        i
    }
    #[inline(always)]
    fn iadd(&mut self, a: W, b: W) -> W {
        zip(a, b, u32::wrapping_add)
    }
    #[inline(always)]
    fn isub(&mut self, a: W, b: W) -> W {
        zip(a, b, u32::wrapping_sub)
    }
    #[inline(always)]
    fn band(&mut self, a: W, b: W) -> W {
        zip(a, b, |x, y| x & y)
    }
    #[inline(always)]
    fn bor(&mut self, a: W, b: W) -> W {
        zip(a, b, |x, y| x | y)
    }
    #[inline(always)]
    fn bxor(&mut self, a: W, b: W) -> W {
        zip(a, b, |x, y| x ^ y)
    }
    #[inline(always)]
    fn shl(&mut self, a: W, n: i64) -> W {
        map(a, |x| x << (n as u32 & 31))
    }
    #[inline(always)]
    fn ushr(&mut self, a: W, n: i64) -> W {
        map(a, |x| x >> (n as u32 & 31))
    }
    #[inline(always)]
    fn sshr(&mut self, a: W, n: i64) -> W {
        map(a, |x| ((x as i32) >> (n as u32 & 31)) as u32)
    }
    #[inline(always)]
    fn i2f(&mut self, i: W) -> W {
        map(i, |x| (x as i32 as f32).to_bits())
    }
    #[inline(always)]
    fn fcmp(&mut self, cc: FloatCC, a: W, b: W) -> W {
        zip(a, b, |x, y| {
            let (x, y) = (f32::from_bits(x), f32::from_bits(y));
            mask(match cc {
                FloatCC::Equal => x == y,
                FloatCC::NotEqual => x != y,
                FloatCC::LessThan => x < y,
                FloatCC::LessThanOrEqual => x <= y,
                FloatCC::GreaterThan => x > y,
                FloatCC::GreaterThanOrEqual => x >= y,
                FloatCC::Unordered => x.is_nan() || y.is_nan(),
                FloatCC::Ordered => !x.is_nan() && !y.is_nan(),
                other => unreachable!("the math algorithms do not use {other:?}"),
            })
        })
    }
    #[inline(always)]
    fn icmp(&mut self, cc: IntCC, a: W, b: W) -> W {
        zip(a, b, |x, y| {
            let (sx, sy) = (x as i32, y as i32);
            mask(match cc {
                IntCC::Equal => x == y,
                IntCC::NotEqual => x != y,
                IntCC::SignedLessThan => sx < sy,
                IntCC::SignedLessThanOrEqual => sx <= sy,
                IntCC::SignedGreaterThan => sx > sy,
                IntCC::SignedGreaterThanOrEqual => sx >= sy,
                other => unreachable!("the math algorithms do not use {other:?}"),
            })
        })
    }
    #[inline(always)]
    fn sel(&mut self, m: W, t: W, f: W) -> W {
        let mut r = [0; WIDTH];
        for i in 0..WIDTH {
            r[i] = (m[i] & t[i]) | (!m[i] & f[i]);
        }
        r
    }
}

/// `f` on one 16-lane value.
#[inline(always)]
fn apply(f: MathFn, x: W) -> W {
    let e = &mut Wide;
    match f {
        MathFn::Exp => super::exp(e, x, None),
        MathFn::Log => super::log(e, x),
        MathFn::Tanh => super::tanh(e, x),
        MathFn::Erf => super::erf(e, x),
        MathFn::Sin => super::sincos(e, x, false),
        MathFn::Cos => super::sincos(e, x, true),
        MathFn::Sigmoid => super::sigmoid(e, x),
    }
}

/// `data = f(data)`, 16 lanes at a time; the last partial group is padded with zeros.
#[inline(always)]
fn run(f: MathFn, data: &mut [f32]) {
    let mut chunks = data.chunks_exact_mut(WIDTH);
    for chunk in &mut chunks {
        let x: W = std::array::from_fn(|i| chunk[i].to_bits());
        let y = apply(f, x);
        for i in 0..WIDTH {
            chunk[i] = f32::from_bits(y[i]);
        }
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut x = [0u32; WIDTH];
        for (xi, v) in x.iter_mut().zip(rest.iter()) {
            *xi = v.to_bits();
        }
        let y = apply(f, x);
        for (v, yi) in rest.iter_mut().zip(y) {
            *v = f32::from_bits(yi);
        }
    }
}

/// One `extern "C"` routine per function and instruction set.
macro_rules! routines {
    ($($name:ident => $f:expr, $feature:literal;)*) => {
        $(
            /// # Safety
            /// `data` points to `n` initialized, writable f32s (any `n <= 0` does nothing), and
            /// the CPU has the enabled target features (checked by [`block_routine`]).
            #[target_feature(enable = $feature)]
            unsafe extern "C" fn $name(data: *mut f32, n: i64) {
                if n <= 0 {
                    return;
                }
                // SAFETY: the caller's contract above.
                let data = unsafe { std::slice::from_raw_parts_mut(data, n as usize) };
                run($f, data);
            }
        )*
    };
}

#[cfg(target_arch = "x86_64")]
routines! {
    exp_avx512 => MathFn::Exp, "avx512f,fma";
    log_avx512 => MathFn::Log, "avx512f,fma";
    tanh_avx512 => MathFn::Tanh, "avx512f,fma";
    erf_avx512 => MathFn::Erf, "avx512f,fma";
    sin_avx512 => MathFn::Sin, "avx512f,fma";
    cos_avx512 => MathFn::Cos, "avx512f,fma";
    sigmoid_avx512 => MathFn::Sigmoid, "avx512f,fma";
    exp_avx2 => MathFn::Exp, "avx2,fma";
    log_avx2 => MathFn::Log, "avx2,fma";
    tanh_avx2 => MathFn::Tanh, "avx2,fma";
    erf_avx2 => MathFn::Erf, "avx2,fma";
    sin_avx2 => MathFn::Sin, "avx2,fma";
    cos_avx2 => MathFn::Cos, "avx2,fma";
    sigmoid_avx2 => MathFn::Sigmoid, "avx2,fma";
}

/// Which instruction set the block routines use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockIsa {
    Avx512,
    Avx2,
}

/// The best instruction set this CPU offers the routines, or `None` (no routines: kernels
/// compute inline). `MINDUCTOR_MATH_BLOCKS=0` turns them off (for comparisons).
pub fn block_isa() -> Option<BlockIsa> {
    static ISA: std::sync::OnceLock<Option<BlockIsa>> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("MINDUCTOR_MATH_BLOCKS").is_ok_and(|v| v == "0") {
            return None;
        }
        detect()
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Option<BlockIsa> {
    use std::arch::is_x86_feature_detected as has;
    if has!("avx512f") && has!("fma") {
        Some(BlockIsa::Avx512)
    } else if has!("avx2") && has!("fma") {
        Some(BlockIsa::Avx2)
    } else {
        None
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Option<BlockIsa> {
    None
}

/// The routine computing `f` with `isa`, which the caller has checked this CPU supports
/// (via [`block_isa`]).
#[cfg(target_arch = "x86_64")]
pub fn routine(f: MathFn, isa: BlockIsa) -> BlockFn {
    match (isa, f) {
        (BlockIsa::Avx512, MathFn::Exp) => exp_avx512,
        (BlockIsa::Avx512, MathFn::Log) => log_avx512,
        (BlockIsa::Avx512, MathFn::Tanh) => tanh_avx512,
        (BlockIsa::Avx512, MathFn::Erf) => erf_avx512,
        (BlockIsa::Avx512, MathFn::Sin) => sin_avx512,
        (BlockIsa::Avx512, MathFn::Cos) => cos_avx512,
        (BlockIsa::Avx512, MathFn::Sigmoid) => sigmoid_avx512,
        (BlockIsa::Avx2, MathFn::Exp) => exp_avx2,
        (BlockIsa::Avx2, MathFn::Log) => log_avx2,
        (BlockIsa::Avx2, MathFn::Tanh) => tanh_avx2,
        (BlockIsa::Avx2, MathFn::Erf) => erf_avx2,
        (BlockIsa::Avx2, MathFn::Sin) => sin_avx2,
        (BlockIsa::Avx2, MathFn::Cos) => cos_avx2,
        (BlockIsa::Avx2, MathFn::Sigmoid) => sigmoid_avx2,
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn routine(_f: MathFn, _isa: BlockIsa) -> BlockFn {
    unreachable!("`block_isa` offers no routines on this architecture")
}

/// The routine for `f` on this CPU, if it has one.
pub fn block_routine(f: MathFn) -> Option<BlockFn> {
    block_isa().map(|isa| routine(f, isa))
}

/// `data = f(data)` with the routine for `isa` (which must be supported: see [`block_isa`]),
/// for tests and benchmarks.
pub fn apply_block(f: MathFn, isa: BlockIsa, data: &mut [f32]) {
    let supported = match isa {
        BlockIsa::Avx512 => detect() == Some(BlockIsa::Avx512),
        BlockIsa::Avx2 => detect().is_some(),
    };
    assert!(supported, "{isa:?} routines need a CPU that has {isa:?}");
    // SAFETY: `data` is a valid mutable slice of `data.len()` f32s, and the CPU supports
    // `isa` (asserted above).
    unsafe { routine(f, isa)(data.as_mut_ptr(), data.len() as i64) }
}
