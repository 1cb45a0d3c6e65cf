//! Row routines: one stage of a row kernel (softmax, layer norm, RMS norm, a SwiGLU product…)
//! over one contiguous row, compiled ahead of time at the CPU's full vector width.
//!
//! Cranelift emits 128-bit vectors only. A math block widens the stage's functions (`exp`,
//! `silu`), but the stage's adds, multiplies, maxima and sums stay at 4 lanes, and on a core with
//! full-width 512-bit FMA units (Intel's server cores) that is a quarter of its rate. Inductor's
//! C++ backend writes such a loop body with `at::vec::Vectorized<float>` at the widest width the
//! CPU has (16 lanes on AVX-512) and lets a C++ compiler keep every value in registers. We cannot
//! compile C++ at run time, and an interpreter over the stage's expressions would pay a load and
//! a store per operation, so the common *shapes* of row stages are compiled here, ahead of time,
//! once per instruction set, and a stage whose expression has one of these shapes calls its
//! routine once per row (the code generator's `lower/rows.rs` matches them).
//!
//! A shape is a chain, applied to each element `x[i]` of the row in this order (each step
//! optional; the bits of [`RowShape`]):
//!
//! ```text
//! t = x[i]; t = t * p[i]; t = t + q[i]                       (t*p + q fused)
//! t = t - u0; t = f(t); t = t * u1; t = t + t
//! t = t * u2 + u3                                            (fused; or t + u3 alone)
//! t = t * w[i]; t = t + b[i]                                 (t*w + b fused)
//! t = max(t, 0)
//! ```
//!
//! where the row `c[i]` may be subtracted in place of `u0` (a squared error's gradient,
//! `prediction - target`), and the product by `u1` may come before `f` instead of after it
//! (`f((t - u0) * u1)`: GELU's `erf(x * (1/√2))`); `t + t` is autodiff's gradient of a square,
//! `t + u3` GELU's `erf(s) + 1`;
//! or, instead of `w` and `b`, `t * w[i] + b[i] * c[i]` (rotary embeddings) or `t * u1 + b[i]`
//! fused (an optimizer step), or, after the first steps and instead of all the others, GELU's
//! gradient times `w[i]`, from `t` or from the three values a GELU forward saved for it
//! (`t` its `erf` argument, `b[i]` its `erf(·) + 1` and `c[i]` its `x * 0.5`),
//!
//! and then `t` is stored to `out[i]`, and/or reduced: summed, summed as `t * t` (fused), or its
//! maximum taken. `u0`..`u3` are values of the row (a mean, `1/sum`, `rsqrt(var + eps)`, a
//! channel's batch-norm weight and bias); `p`, `q`, `w`, `b`, `c` other rows (weights, a GEMM
//! epilogue's bias, a residual, the other half of a gated product). The first line is what a
//! GEMM epilogue adds before its activation (`gelu(acc + bias)`), the last a ReLU (IEEE
//! `maximum`, as the code generator's: NaN stays NaN, `-0` becomes `+0`).
//!
//! **Several rows per call.** A shape that only stores may run several rows in one call
//! ([`RowArgs::rows`], with a stride per row operand; stride 0 repeats one row for every row,
//! as rotary embeddings' `cos` and `sin` across heads). Each row gets the same operations as
//! alone; rows that follow each other in every operand run as one row ([`row_runs`]). The code
//! generator hands it a run of its kernel's last outer loop when the rows are too short for a
//! call each and follow each other (a 56-wide image's rows), or lie apart as the heads of a
//! rotary embedding whose two halves are one call ([`RowShape::HALVES`]; each half its own
//! call, rows apart measured slower than the 4-lane loop: `choose_row_runs` in
//! `lower/rows.rs`).
//!
//! **Both halves of a head.** A rotary embedding's halves, `x1 * cos + (-x2) * sin` into the
//! head's first half and `x2 * cos + x1 * sin` into its second, are two shapes (`NEG_PRODUCT`
//! and `ADD_PRODUCT`) over rows of half a head; [`RowShape::HALVES`] computes both in one call,
//! each head row then written in order (as the 4-lane loop writes it), which is what lets the
//! LLaMA block's half heads of 32, rows 64 KiB apart, run at full width at least as fast as the
//! loop.
//!
//! **Sums.** A sum adds blocks of [`SUM_BLOCK`] elements into four
//! fresh accumulator registers (so each lane adds at most 16 values in a row on AVX-512), and
//! each block's partial sums into Kahan-compensated running sums; at the end the four are added
//! pairwise, then the lanes pairwise. The order depends only on the row's length, never on which
//! thread runs the row, so results are the same at every thread count. (It is not the order of
//! the 4-lane Cranelift loop, whose lanes are fewer: sums differ from it in the last bits.)
//!
//! **Maxima** are exact whatever the order; a NaN anywhere makes the result NaN, as in the
//! Cranelift loop.

use super::{apply, kahan_fold, x86, Wide};
use crate::math::FloatCmp;
use crate::math::MathFn;

/// What a row routine reads: its rows, their length and its two row values.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RowArgs {
    /// `n` f32s.
    pub x: *const f32,
    /// `n` f32s when the shape multiplies by a row (or takes GELU's gradient times it), else
    /// unused.
    pub w: *const f32,
    /// `n` f32s when the shape adds a row (or takes GELU's gradient from saved values), else
    /// unused.
    pub b: *const f32,
    /// `n` f32s when the shape adds the product of `b` and this row, subtracts it
    /// (`SUB_ROW`) or takes GELU's gradient from saved values, else unused.
    pub c: *const f32,
    /// `n` writable f32s when the shape stores (`2n` for [`RowShape::HALVES`]), else unused.
    /// May be `x`, `w`, `b` or `c` (in place).
    pub out: *mut f32,
    pub n: i64,
    pub u0: f32,
    pub u1: f32,
    /// `n` f32s when the shape multiplies by a row first (`PRE_MUL`), else unused.
    pub p: *const f32,
    /// `n` f32s when the shape adds a row first (`PRE_ADD`), else unused.
    pub q: *const f32,
    pub u2: f32,
    pub u3: f32,
    /// [`ROW_STREAM`] and [`ROW_PREFETCH_NEXT`], or 0.
    pub flags: u32,
    /// Keeps the struct a multiple of 8 bytes; unused.
    pub reserved: u32,
    /// Rows the call runs, one after the other (see [`row_runs`]): 1, or for a shape that only
    /// stores any count (none when 0 or less). The fields above describe the first row; row
    /// `r` of each row operand starts `r` times its stride (below, in elements) after it.
    pub rows: i64,
    pub x_stride: i64,
    pub w_stride: i64,
    pub b_stride: i64,
    pub c_stride: i64,
    pub p_stride: i64,
    pub q_stride: i64,
    pub out_stride: i64,
}

/// A [`RowArgs`] flag: the row's stores bypass the caches (non-temporal stores of whole
/// registers, where `out` is aligned to a register), for an output too large to stay in the
/// last-level cache ([`streams_stores`]). Writing to memory directly saves reading each line of `out` in first (a cached store
/// fills the line before it writes it), a third of a pointwise kernel's memory traffic; the
/// values are the same.
pub const ROW_STREAM: u32 = 1;

/// A [`RowArgs`] flag: as the routine reads `x`, it asks the caches for the `n` values after
/// it (`x + n ..`), a line for each line of `x`: the next row, in a kernel whose rows lie one
/// after the other. The code generator sets it for a kernel's first stage, the one that reads
/// each row from memory (the later stages find it in L1). The hardware prefetchers stop at
/// every 4 KiB page, so without it each row (a page, for 1024 f32s) starts with misses.
/// Measured on a Xeon of family 6 model 207, medians of five alternated runs: at 2 threads
/// layernorm_4096x1024 0.85 → 0.81 ms and softmax_4096x1024 1.30 → 1.22 ms; at 1 thread
/// 1.33 → 1.32 and 2.22 → 2.03 ms.
pub const ROW_PREFETCH_NEXT: u32 = 2;

/// Whether a kernel storing `written` bytes of one output, and moving `traffic` bytes in all
/// (every buffer it reads, and its outputs), should stream that output ([`ROW_STREAM`]): when
/// the output is at least half the last-level cache (`crate::cache::l3_bytes`) and the
/// kernel's traffic is at least 1.25 times that cache. Then the output's first lines are
/// evicted before anything could read them back, and a cached store only adds a read of each
/// line before it writes it. Below that, the output largely survives in the cache for its
/// reader (or the next call), and streaming it would send it to memory and back. Unknown
/// cache: never. `MINDUCTOR_STREAM_BYTES=n` instead streams every output of at least `n` bytes
/// (for measurements), and [`set_stream_bytes`] over both. (The code generator never streams
/// a buffer its kernel also reads: see `lower/rows.rs`.)
///
/// Measured on Zen 4 (32 MiB L3, `minductor report` and `bench`, alternated runs):
/// - the train step's two weight updates (16 MiB outputs of GEMM epilogues, 50 MiB of
///   traffic) went from 22.4-23.1 to 21.3-22.0 ms at 1 thread and 11.7-12.0 to 10.9-12.0 ms at
///   2; pointwise_gelu_16m (64 MiB out, 256 MiB of traffic) from ~10.3 to ~9.7 ms at 1 and
///   ~7.3 to ~6.3 ms at 2 (medians of six);
/// - a layer norm's affine store run by its routine over layernorm_4096x1024 (16 MiB in,
///   16 MiB out: the cache's size) went the other way when streamed, 0.70-0.80 ms at 2
///   threads against 0.55-0.57 cached (`bench --rounds 3`, three alternated runs): its output
///   stays in the cache from one call to the next otherwise.
pub fn streams_stores(written: usize, traffic: usize) -> bool {
    static FROM_ENV: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let forced = match FORCED_STREAM_BYTES.load(std::sync::atomic::Ordering::Relaxed) {
        0 => *FROM_ENV.get_or_init(|| {
            std::env::var("MINDUCTOR_STREAM_BYTES")
                .ok()
                .and_then(|v| v.parse().ok())
        }),
        forced => Some(forced - 1),
    };
    if let Some(threshold) = forced {
        return written >= threshold;
    }
    crate::cache::l3_bytes().is_some_and(|l3| streams_past(l3, written, traffic))
}

/// [`streams_stores`]' rule for a last-level cache of `l3` bytes.
fn streams_past(l3: usize, written: usize, traffic: usize) -> bool {
    written >= l3 / 2 && traffic >= l3.saturating_add(l3 / 4)
}

/// [`set_stream_bytes`]'s threshold plus one; 0 when unset.
static FORCED_STREAM_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Makes kernels compiled from now on, in this process, stream outputs of at least `threshold`
/// bytes whatever their traffic (`Some(0)`: every output; `Some(usize::MAX)`: none), or
/// (`None`) go back to the cache size's rule: for tests and benchmarks that compare the two
/// forms.
pub fn set_stream_bytes(threshold: Option<usize>) {
    let stored = threshold.map_or(0, |t| t.saturating_add(1));
    FORCED_STREAM_BYTES.store(stored, std::sync::atomic::Ordering::Relaxed);
}

/// Byte offsets of [`RowArgs`]' fields, for the code that fills one in.
pub const ROW_ARGS_X: i32 = 0;
pub const ROW_ARGS_W: i32 = 8;
pub const ROW_ARGS_B: i32 = 16;
pub const ROW_ARGS_C: i32 = 24;
pub const ROW_ARGS_OUT: i32 = 32;
pub const ROW_ARGS_N: i32 = 40;
pub const ROW_ARGS_U0: i32 = 48;
pub const ROW_ARGS_U1: i32 = 52;
pub const ROW_ARGS_P: i32 = 56;
pub const ROW_ARGS_Q: i32 = 64;
pub const ROW_ARGS_U2: i32 = 72;
pub const ROW_ARGS_U3: i32 = 76;
pub const ROW_ARGS_FLAGS: i32 = 80;
pub const ROW_ARGS_RESERVED: i32 = 84;
pub const ROW_ARGS_ROWS: i32 = 88;
pub const ROW_ARGS_X_STRIDE: i32 = 96;
pub const ROW_ARGS_W_STRIDE: i32 = 104;
pub const ROW_ARGS_B_STRIDE: i32 = 112;
pub const ROW_ARGS_C_STRIDE: i32 = 120;
pub const ROW_ARGS_P_STRIDE: i32 = 128;
pub const ROW_ARGS_Q_STRIDE: i32 = 136;
pub const ROW_ARGS_OUT_STRIDE: i32 = 144;
pub const ROW_ARGS_BYTES: u32 = 152;

const _: () = {
    assert!(std::mem::size_of::<RowArgs>() == ROW_ARGS_BYTES as usize);
    assert!(std::mem::offset_of!(RowArgs, n) == ROW_ARGS_N as usize);
    assert!(std::mem::offset_of!(RowArgs, u0) == ROW_ARGS_U0 as usize);
    assert!(std::mem::offset_of!(RowArgs, u1) == ROW_ARGS_U1 as usize);
    assert!(std::mem::offset_of!(RowArgs, out) == ROW_ARGS_OUT as usize);
    assert!(std::mem::offset_of!(RowArgs, c) == ROW_ARGS_C as usize);
    assert!(std::mem::offset_of!(RowArgs, p) == ROW_ARGS_P as usize);
    assert!(std::mem::offset_of!(RowArgs, q) == ROW_ARGS_Q as usize);
    assert!(std::mem::offset_of!(RowArgs, u2) == ROW_ARGS_U2 as usize);
    assert!(std::mem::offset_of!(RowArgs, u3) == ROW_ARGS_U3 as usize);
    assert!(std::mem::offset_of!(RowArgs, flags) == ROW_ARGS_FLAGS as usize);
    assert!(std::mem::offset_of!(RowArgs, reserved) == ROW_ARGS_RESERVED as usize);
    assert!(std::mem::offset_of!(RowArgs, rows) == ROW_ARGS_ROWS as usize);
    assert!(std::mem::offset_of!(RowArgs, x_stride) == ROW_ARGS_X_STRIDE as usize);
    assert!(std::mem::offset_of!(RowArgs, w_stride) == ROW_ARGS_W_STRIDE as usize);
    assert!(std::mem::offset_of!(RowArgs, b_stride) == ROW_ARGS_B_STRIDE as usize);
    assert!(std::mem::offset_of!(RowArgs, c_stride) == ROW_ARGS_C_STRIDE as usize);
    assert!(std::mem::offset_of!(RowArgs, p_stride) == ROW_ARGS_P_STRIDE as usize);
    assert!(std::mem::offset_of!(RowArgs, q_stride) == ROW_ARGS_Q_STRIDE as usize);
    assert!(std::mem::offset_of!(RowArgs, out_stride) == ROW_ARGS_OUT_STRIDE as usize);
};

/// A row routine: runs the shape over `args`' row and returns the reduced value (0 for a shape
/// that only stores).
pub type RowFn = unsafe extern "C" fn(args: *const RowArgs) -> f32;

/// The steps of a shape, as bits (see the module docs); the function of `FN` is the 4-bit field
/// at [`RowShape::FN_SHIFT`], the [`MathFn`] at that index of `MathFn::ALL` plus one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowShape(pub u32);

impl RowShape {
    pub const SUB: u32 = 1;
    pub const SCALE: u32 = 1 << 1;
    pub const MUL_ROW: u32 = 1 << 2;
    pub const ADD_ROW: u32 = 1 << 3;
    pub const STORE: u32 = 1 << 4;
    pub const SUM: u32 = 1 << 5;
    pub const SUM_SQUARES: u32 = 1 << 6;
    pub const MAX: u32 = 1 << 7;
    pub const FN_SHIFT: u32 = 8;
    /// With `MUL_ROW`: `t * w + b * c` (the product `b * c` rounded, then one fused
    /// multiply-add), as the Cranelift loop contracts a sum of two products (rotary embeddings'
    /// `x * cos + rotate_half(x) * sin`).
    pub const ADD_PRODUCT: u32 = 1 << 12;
    /// With `SCALE` and `ADD_ROW` (no `MUL_ROW`): `t * u1 + b` fused (an optimizer's
    /// `p - lr * g` is `g * (-lr) + p`).
    pub const FUSED_SCALE: u32 = 1 << 13;
    /// First, `t = x * p`.
    pub const PRE_MUL: u32 = 1 << 14;
    /// First (after `PRE_MUL`, fused with it), `t = t + q`.
    pub const PRE_ADD: u32 = 1 << 15;
    /// After `SCALE`, `t * u2 + u3` fused (a batch norm's per-channel weight and bias).
    pub const AFFINE: u32 = 1 << 16;
    /// Last, `max(t, 0)` (a ReLU).
    pub const RELU: u32 = 1 << 17;
    /// After the first steps, GELU's gradient times the row `w` (the incoming gradient), in
    /// the operations autodiff writes it in (see [`gelu_backward`]); nothing after it.
    pub const GELU_GRAD: u32 = 1 << 18;
    /// With `ADD_PRODUCT`: the product negated, `t * w + (-b) * c` (rotary embeddings' first
    /// half, `x1 * cos + (-x2) * sin`; `(-b) * c` is `-(b * c)`, bit for bit).
    pub const NEG_PRODUCT: u32 = 1 << 19;
    /// With `SCALE`: the product by `u1` comes before the function, `f((t - u0) * u1)`, not
    /// after it (GELU's `erf(x * (1/√2)) + 1` stored for its backward).
    pub const SCALE_FIRST: u32 = 1 << 20;
    /// After `SCALE`, `t + u3`, not fused (in place of `AFFINE`: `erf(s) + 1`).
    pub const OFFSET: u32 = 1 << 21;
    /// With `GELU_GRAD`: the gradient from the values a GELU forward saved, `t` the `erf`
    /// argument `s`, `b` its `erf(s) + 1` and `c` its `x * 0.5` (see [`gelu_backward_saved`]).
    pub const GELU_GRAD_SAVED: u32 = 1 << 22;
    /// With `SUB`: the row `c` is subtracted, `t - c`, in place of `u0` (a loss gradient's
    /// `prediction - target`).
    pub const SUB_ROW: u32 = 1 << 23;
    /// After `SCALE`, `t + t` (autodiff's gradient of a square, `g * x + g * x`).
    pub const DOUBLE: u32 = 1 << 24;
    /// With `MUL_ROW | ADD_PRODUCT | NEG_PRODUCT | STORE` and nothing else: both halves of a
    /// rotary embedding's head in one call, `n` the half's length and `out` the head's row of
    /// `2n`: for `i < n`, `out[i] = x[i] * w[i] + (-b[i]) * c[i]` and
    /// `out[n + i] = b[i] * w[i] + x[i] * c[i]`, each the first product fused with the sum, as
    /// `NEG_PRODUCT` and `ADD_PRODUCT` alone (`x` the first half `x1`, `b` the second `x2`, `w`
    /// and `c` the half rows of `cos` and `sin`). A head row is then one stream of `2n` values
    /// written in order, where the two shapes apart write its halves one call after the other.
    /// Several rows per call step every operand by its stride (never run as one long row); in
    /// place, `x` is `out` and `b` is `out + n`.
    pub const HALVES: u32 = 1 << 25;

    /// The bits of function `f`.
    pub const fn function(f: MathFn) -> u32 {
        let index = match f {
            MathFn::Exp => 0,
            MathFn::Log => 1,
            MathFn::Tanh => 2,
            MathFn::Erf => 3,
            MathFn::Sin => 4,
            MathFn::Cos => 5,
            MathFn::Sigmoid => 6,
            MathFn::Gelu => 7,
            MathFn::Silu => 8,
        };
        (index + 1) << Self::FN_SHIFT
    }

    const fn math(bits: u32) -> Option<MathFn> {
        match (bits >> Self::FN_SHIFT) & 0xf {
            0 => None,
            k => Some(MathFn::ALL[k as usize - 1]),
        }
    }

    /// Whether the shape reduces (sum, sum of squares or maximum).
    pub fn reduces(self) -> bool {
        self.0 & (Self::SUM | Self::SUM_SQUARES | Self::MAX) != 0
    }

    /// Elements of `out` a row of `n` writes: `2n` for [`Self::HALVES`], else `n`.
    pub fn out_len(self, n: usize) -> usize {
        if self.0 & Self::HALVES != 0 {
            2 * n
        } else {
            n
        }
    }
}

/// `t` of the module docs for the elements `i..i + L::WIDTH`.
///
/// # Safety
/// The CPU has `L`'s instruction set; `x` (and `w`, `b` when the shape reads them) point to
/// `i + L::WIDTH` readable f32s.
#[inline(always)]
unsafe fn value<L: Wide, const S: u32>(e: &mut L, a: &RowArgs, u: &Values<L>, i: usize) -> L::V {
    // SAFETY: the caller's contract.
    unsafe {
        let mut t = L::load(a.x.add(i));
        if S & RowShape::PRE_MUL != 0 {
            let p = L::load(a.p.add(i));
            t = if S & RowShape::PRE_ADD != 0 {
                e.mul_add(t, p, L::load(a.q.add(i)))
            } else {
                e.mul(t, p)
            };
        } else if S & RowShape::PRE_ADD != 0 {
            t = e.add(t, L::load(a.q.add(i)));
        }
        if S & RowShape::GELU_GRAD != 0 {
            let g = L::load(a.w.add(i));
            if S & RowShape::GELU_GRAD_SAVED != 0 {
                let (one_plus, half_x) = (L::load(a.b.add(i)), L::load(a.c.add(i)));
                return gelu_backward_saved(e, t, one_plus, half_x, g);
            }
            return gelu_backward(e, t, g);
        }
        if S & RowShape::SUB != 0 {
            t = if S & RowShape::SUB_ROW != 0 {
                e.sub(t, L::load(a.c.add(i)))
            } else {
                e.sub(t, u.0)
            };
        }
        let scale_first = S & RowShape::SCALE_FIRST != 0;
        if S & RowShape::SCALE != 0 && scale_first {
            t = e.mul(t, u.1);
        }
        if let Some(f) = RowShape::math(S) {
            t = apply(e, f, t);
        }
        if S & RowShape::FUSED_SCALE != 0 {
            return e.mul_add(t, u.1, L::load(a.b.add(i)));
        }
        if S & RowShape::SCALE != 0 && !scale_first {
            t = e.mul(t, u.1);
        }
        if S & RowShape::DOUBLE != 0 {
            t = e.add(t, t);
        }
        if S & RowShape::AFFINE != 0 {
            t = e.mul_add(t, u.2, u.3);
        }
        if S & RowShape::OFFSET != 0 {
            t = e.add(t, u.3);
        }
        if S & RowShape::MUL_ROW != 0 {
            let w = L::load(a.w.add(i));
            t = if S & RowShape::ADD_PRODUCT != 0 {
                let mut bc = e.mul(L::load(a.b.add(i)), L::load(a.c.add(i)));
                if S & RowShape::NEG_PRODUCT != 0 {
                    bc = e.neg(bc);
                }
                e.mul_add(t, w, bc)
            } else if S & RowShape::ADD_ROW != 0 {
                e.mul_add(t, w, L::load(a.b.add(i)))
            } else {
                e.mul(t, w)
            };
        } else if S & RowShape::ADD_ROW != 0 {
            t = e.add(t, L::load(a.b.add(i)));
        }
        if S & RowShape::RELU != 0 {
            // IEEE maximum with +0: `t <= 0` (so -0 too) gives +0, a NaN stays.
            let zero = e.f(0.0);
            let non_positive = e.fcmp(FloatCmp::LessThanOrEqual, t, zero);
            t = e.sel(non_positive, zero, t);
        }
        t
    }
}

/// `2 / sqrt(pi)`, the factor of `erf`'s derivative, as autodiff writes it.
pub const TWO_OVER_SQRT_PI: f32 = std::f32::consts::FRAC_2_SQRT_PI;

/// The floor of `erf`'s derivative's `exp` argument in autodiff's rule (`ERF_GRAD_FLOOR` of
/// `minductor-passes`: ln of the smallest normal `f32`); the code generator matches a GELU
/// gradient only with this constant.
pub const ERF_GRAD_FLOOR: f32 = crate::math::LN_MIN_NORMAL;

/// The gradient of `gelu(x) = x/2 · (1 + erf(x/√2))` at `x` times `g`, in the operations (and
/// roundings) autodiff's rule writes it in, the code generator contracting the first product
/// of the final sum: with `s = x·(1/√2)`, `m = -(s·s)`, `t = m < F` ([`ERF_GRAD_FLOOR`]) and
/// `q = t ? 0 : exp(t ? F : m)`,
/// `fma(g·(erf(s) + 1), 0.5, ((g·(x·0.5))·(q·(2/√π)))·(1/√2))`.
#[inline(always)]
pub(super) fn gelu_backward<L: super::Wide>(e: &mut L, x: L::V, g: L::V) -> L::V {
    let s = e.mulc(x, crate::math::GELU_SCALE);
    let erf = apply(e, MathFn::Erf, s);
    let one_plus = e.addc(erf, 1.0);
    let half_x = e.mulc(x, 0.5);
    gelu_backward_saved(e, s, one_plus, half_x, g)
}

/// [`gelu_backward`] from the values a GELU forward computed on the way and saved for the
/// backward (as autodiff's partitioner keeps them): the `erf` argument `s = x·(1/√2)`,
/// `one_plus = erf(s) + 1` and `half_x = x·0.5`, in the same operations from there on.
#[inline(always)]
pub(super) fn gelu_backward_saved<L: super::Wide>(
    e: &mut L,
    s: L::V,
    one_plus: L::V,
    half_x: L::V,
    g: L::V,
) -> L::V {
    let p = e.mul(g, one_plus);
    let h = e.mul(g, half_x);
    let square = e.mul(s, s);
    let minus = e.neg(square);
    let tiny = e.fcmpc(FloatCmp::LessThan, minus, ERF_GRAD_FLOOR);
    let clamped = e.selc(tiny, ERF_GRAD_FLOOR, minus);
    let gauss = apply(e, MathFn::Exp, clamped);
    let gauss = e.selc(tiny, 0.0, gauss);
    let scaled = e.mulc(gauss, TWO_OVER_SQRT_PI);
    let q = e.mul(h, scaled);
    let q = e.mulc(q, crate::math::GELU_SCALE);
    e.mulc_add(p, 0.5, q)
}

/// The row values `u0`..`u3`, splat.
struct Values<L: Wide>(L::V, L::V, L::V, L::V);

/// `acc` combined with `t` for the shape's reduction (a NaN `t` of a maximum is noted in `nan`).
#[inline(always)]
fn combine<L: Wide, const S: u32>(e: &mut L, acc: L::V, t: L::V, nan: &mut L::V) -> L::V {
    if S & RowShape::SUM != 0 {
        e.add(acc, t)
    } else if S & RowShape::SUM_SQUARES != 0 {
        e.mul_add(t, t, acc)
    } else if S & RowShape::MAX != 0 {
        let unordered = e.fcmp(FloatCmp::Unordered, t, t);
        *nan = e.bor(*nan, unordered);
        let take = e.fcmp(FloatCmp::LessThan, acc, t);
        e.sel(take, t, acc)
    } else {
        acc
    }
}

/// The shape's reduction identity.
const fn identity(s: u32) -> f32 {
    if s & RowShape::MAX != 0 {
        f32::NEG_INFINITY
    } else {
        0.0
    }
}

/// The lanes of `v`, in order.
///
/// # Safety
/// The CPU has `L`'s instruction set.
#[inline(always)]
unsafe fn lanes<L: Wide>(v: L::V) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: `out` holds 16 >= `L::WIDTH` f32s.
    unsafe { L::store(out.as_mut_ptr(), v) };
    out
}

/// Stores a register to `p`, bypassing the caches if `stream`.
///
/// # Safety
/// The CPU has `L`'s instruction set; `p` points to `L::WIDTH` writable f32s, aligned to
/// `L::WIDTH · 4` bytes if `stream`.
#[inline(always)]
unsafe fn store<L: Wide>(p: *mut f32, v: L::V, stream: bool) {
    // SAFETY: the caller's contract above.
    unsafe {
        if stream {
            L::stream(p, v)
        } else {
            L::store(p, v)
        }
    }
}

/// Elements per block of a sum (as the code generator's 4-lane loops' `SUM_BLOCK`).
pub const SUM_BLOCK: usize = 1024;

/// Registers per step of the main loop: independent chains (four accumulators of a sum).
const CHAINS: usize = 4;

/// Runs shape `S` over the row of `a`.
///
/// # Safety
/// The CPU has `L`'s instruction set; `a` holds valid rows of `a.n` elements (see [`RowArgs`]).
#[inline(always)]
unsafe fn run<L: Wide, const S: u32>(mut e: L, a: &RowArgs) -> f32 {
    let n = a.n.max(0) as usize;
    let width = L::WIDTH;
    let u = Values::<L>(e.f(a.u0), e.f(a.u1), e.f(a.u2), e.f(a.u3));
    let init = e.f(identity(S));
    let zero = e.f(0.0);
    let mut nan = e.i(0);
    let mut running = [init; CHAINS];
    let mut compensation = [zero; CHAINS];
    let sums = S & (RowShape::SUM | RowShape::SUM_SQUARES) != 0;
    // Non-temporal stores need `out` aligned to a register; every full register is stored at
    // a multiple of `width` from it.
    let stream = S & RowShape::STORE != 0
        && a.flags & ROW_STREAM != 0
        && (a.out as usize).is_multiple_of(width * std::mem::size_of::<f32>());
    let prefetch_next = a.flags & ROW_PREFETCH_NEXT != 0;
    let block = SUM_BLOCK;
    let mut i = 0;
    while i < n {
        let end = if sums { n.min(i + block) } else { n };
        let mut acc = [init; CHAINS];
        while i + CHAINS * width <= end {
            if prefetch_next {
                for line in (0..CHAINS * width).step_by(16) {
                    // A hint only: `wrapping_add` forms the address without claiming it lies
                    // in any allocation (past the last row it does not).
                    let next = a.x.wrapping_add(n + i + line);
                    crate::cache::prefetch_line(next, crate::cache::Level::L1);
                }
            }
            for (k, acc) in acc.iter_mut().enumerate() {
                let at = i + k * width;
                // SAFETY: `at + width <= end <= n`.
                let t = unsafe { value::<L, S>(&mut e, a, &u, at) };
                if S & RowShape::STORE != 0 {
                    // SAFETY: as above, for `out` (aligned for `stream`, see there).
                    unsafe { store::<L>(a.out.add(at), t, stream) };
                }
                *acc = combine::<L, S>(&mut e, *acc, t, &mut nan);
            }
            i += CHAINS * width;
        }
        while i + width <= end {
            // SAFETY: `i + width <= end <= n`.
            let t = unsafe { value::<L, S>(&mut e, a, &u, i) };
            if S & RowShape::STORE != 0 {
                // SAFETY: as above, for `out` (aligned for `stream`, see there).
                unsafe { store::<L>(a.out.add(i), t, stream) };
            }
            acc[0] = combine::<L, S>(&mut e, acc[0], t, &mut nan);
            i += width;
        }
        if i < end {
            // The last partial register, through buffers padded with zeros.
            let rest = end - i;
            let mut x = [0f32; 16];
            let mut w = [0f32; 16];
            let mut b = [0f32; 16];
            let mut c = [0f32; 16];
            let mut p = [0f32; 16];
            let mut q = [0f32; 16];
            // SAFETY: `rest < width <= 16` elements from `i` on are inside the rows the shape
            // reads; the padded buffers hold 16.
            unsafe {
                std::ptr::copy(a.x.add(i), x.as_mut_ptr(), rest);
                if S & READS_W != 0 {
                    std::ptr::copy(a.w.add(i), w.as_mut_ptr(), rest);
                }
                if S & READS_B != 0 {
                    std::ptr::copy(a.b.add(i), b.as_mut_ptr(), rest);
                }
                if S & READS_C != 0 {
                    std::ptr::copy(a.c.add(i), c.as_mut_ptr(), rest);
                }
                if S & RowShape::PRE_MUL != 0 {
                    std::ptr::copy(a.p.add(i), p.as_mut_ptr(), rest);
                }
                if S & RowShape::PRE_ADD != 0 {
                    std::ptr::copy(a.q.add(i), q.as_mut_ptr(), rest);
                }
            }
            let padded = RowArgs {
                x: x.as_ptr(),
                w: w.as_ptr(),
                b: b.as_ptr(),
                c: c.as_ptr(),
                p: p.as_ptr(),
                q: q.as_ptr(),
                ..*a
            };
            // SAFETY: the padded buffers hold `width` f32s each.
            let t = unsafe { value::<L, S>(&mut e, &padded, &u, 0) };
            // SAFETY: as for `lanes`.
            let mut values = unsafe { lanes::<L>(t) };
            if S & RowShape::STORE != 0 {
                // SAFETY: `rest` elements from `i` are inside `out`'s row.
                unsafe { std::ptr::copy(values.as_ptr(), a.out.add(i), rest) };
            }
            // Lanes past the row reduce as the identity (their square too: zero).
            values[rest..].fill(identity(S));
            // SAFETY: `values` holds 16 >= `width` f32s.
            let t = unsafe { L::load(values.as_ptr()) };
            acc[0] = combine::<L, S>(&mut e, acc[0], t, &mut nan);
            i = end;
        }
        if sums && i < n {
            for k in 0..CHAINS {
                kahan_fold(&mut e, &mut running[k], &mut compensation[k], acc[k]);
            }
        } else if sums {
            // The last block: only the running sums are used after it, so the fold's steps
            // that compute the next compensation are left out (`running + (partial −
            // compensation)`, `kahan_fold`'s sum, the same bits).
            for k in 0..CHAINS {
                let y = e.sub(acc[k], compensation[k]);
                running[k] = e.add(running[k], y);
            }
        } else {
            running = acc;
        }
    }
    if stream {
        // Non-temporal stores are weakly ordered: make them visible before whatever tells
        // another thread that the row is done.
        // SAFETY: the CPU has `L`'s instruction set.
        unsafe { L::fence() };
    }
    if S & (RowShape::SUM | RowShape::SUM_SQUARES | RowShape::MAX) == 0 {
        return 0.0;
    }
    // A fixed order: the chains pairwise, then the lanes pairwise.
    let pair = |e: &mut L, p: L::V, q: L::V, nan: &mut L::V| {
        if sums {
            e.add(p, q)
        } else {
            combine::<L, S>(e, p, q, nan)
        }
    };
    let r01 = pair(&mut e, running[0], running[1], &mut nan);
    let r23 = pair(&mut e, running[2], running[3], &mut nan);
    let r = pair(&mut e, r01, r23, &mut nan);
    // SAFETY: as for `lanes`.
    let mut values = unsafe { lanes::<L>(r) };
    let mut len = width;
    while len > 1 {
        len /= 2;
        for k in 0..len {
            let (p, q) = (values[2 * k], values[2 * k + 1]);
            values[k] = if sums {
                p + q
            } else if p < q {
                q
            } else {
                p
            };
        }
    }
    if S & RowShape::MAX != 0 {
        // SAFETY: as for `lanes`.
        let seen = unsafe { lanes::<L>(nan) };
        if seen[..width].iter().any(|v| v.to_bits() != 0) {
            return f32::NAN;
        }
    }
    values[0]
}

/// The two halves' values of one register ([`run_halves`]). (A function, not a closure: a
/// closure is compiled without the routine's instruction set, and its vector operations then
/// become calls; `#[inline(always)]` puts these into the routine.)
#[inline(always)]
fn halves<L: Wide>(e: &mut L, x: L::V, w: L::V, b: L::V, c: L::V) -> (L::V, L::V) {
    let bc = e.mul(b, c);
    let minus_bc = e.neg(bc);
    let first = e.mul_add(x, w, minus_bc);
    let xc = e.mul(x, c);
    (first, e.mul_add(b, w, xc))
}

/// Both halves of a rotary embedding's head over the row of `a` ([`RowShape::HALVES`]): for
/// each register of the half rows, `x * w + (-(b * c))` and `b * w + x * c`, the first products
/// fused (the operations of `NEG_PRODUCT` and of `ADD_PRODUCT` alone, so the same bits), stored
/// to `out + i` and `out + n + i`; the last partial register through buffers padded with zeros.
///
/// # Safety
/// The CPU has `L`'s instruction set; `x`, `w`, `b` and `c` point to `a.n` readable f32s and
/// `out` to `2 · a.n` writable ones (`x` may be `out` and `b` `out + n`: each register is read
/// before the registers stored from it).
#[inline(always)]
unsafe fn run_halves<L: Wide>(mut e: L, a: &RowArgs) {
    let n = a.n.max(0) as usize;
    let width = L::WIDTH;
    // Non-temporal stores need both halves' registers aligned to a register.
    let stream = a.flags & ROW_STREAM != 0
        && n.is_multiple_of(width)
        && (a.out as usize).is_multiple_of(width * std::mem::size_of::<f32>());
    let mut i = 0;
    while i + width <= n {
        // SAFETY: `i + width <= n`: inside every half row and both halves of `out`; in place,
        // these registers are loaded before the stores below overwrite them.
        unsafe {
            let (x, w) = (L::load(a.x.add(i)), L::load(a.w.add(i)));
            let (b, c) = (L::load(a.b.add(i)), L::load(a.c.add(i)));
            let (first, second) = halves::<L>(&mut e, x, w, b, c);
            store::<L>(a.out.add(i), first, stream);
            store::<L>(a.out.add(n + i), second, stream);
        }
        i += width;
    }
    if i < n {
        let rest = n - i;
        let mut rows = [[0f32; 16]; 4];
        // SAFETY: `rest < width <= 16` elements from `i` on are inside each half row; the
        // padded buffers hold 16, and `rest` elements from `i` and from `n + i` are inside
        // `out`.
        unsafe {
            for (row, from) in rows.iter_mut().zip([a.x, a.w, a.b, a.c]) {
                std::ptr::copy(from.add(i), row.as_mut_ptr(), rest);
            }
            let [x, w, b, c] = [0, 1, 2, 3].map(|k| rows[k].as_ptr());
            let (x, w, b, c) = (L::load(x), L::load(w), L::load(b), L::load(c));
            let (first, second) = halves::<L>(&mut e, x, w, b, c);
            let (first, second) = (lanes::<L>(first), lanes::<L>(second));
            std::ptr::copy(first.as_ptr(), a.out.add(i), rest);
            std::ptr::copy(second.as_ptr(), a.out.add(n + i), rest);
        }
    }
    if stream {
        // As in `run`: the non-temporal stores visible before the row is reported done.
        // SAFETY: the CPU has `L`'s instruction set.
        unsafe { L::fence() };
    }
}

/// The steps that read the row `w`, `b` and `c` ([`value`]): the last partial register copies
/// them, and a run of rows is one row only if they follow each other ([`row_runs`]).
const READS_W: u32 = RowShape::MUL_ROW | RowShape::GELU_GRAD;
/// (`FUSED_SCALE` comes with `ADD_ROW`.)
const READS_B: u32 = RowShape::ADD_ROW | RowShape::ADD_PRODUCT | RowShape::GELU_GRAD_SAVED;
const READS_C: u32 = RowShape::ADD_PRODUCT | RowShape::GELU_GRAD_SAVED | RowShape::SUB_ROW;

/// How a call runs `a`'s rows: the arguments of its first row and the count of rows (at most
/// one for a shape that reduces, whose result is its one row's). Where every row the shape reads
/// and writes starts `n` elements after the one before (a `[.., 56] x [56]` loop nest over
/// contiguous buffers), the rows are one row of `rows · n` elements: the same values, since
/// each element goes through the same steps whatever its row, and the routine's registers run
/// across the rows' ends. (The code generator hands several rows only to shapes that store,
/// and never rows a store writes that another row of the call reads at another index, so
/// running them as one changes no value read.)
#[inline(always)]
fn row_runs<const S: u32>(a: &RowArgs) -> (RowArgs, i64) {
    if RowShape(S).reduces() || a.rows == 1 {
        return (*a, 1);
    }
    if S & RowShape::HALVES != 0 {
        // A head's halves interleave with the next head's: never one long row.
        return (*a, a.rows.max(0));
    }
    let n = a.n.max(0);
    let used = [
        (true, a.x_stride),
        (S & READS_W != 0, a.w_stride),
        (S & READS_B != 0, a.b_stride),
        (S & READS_C != 0, a.c_stride),
        (S & RowShape::PRE_MUL != 0, a.p_stride),
        (S & RowShape::PRE_ADD != 0, a.q_stride),
        (S & RowShape::STORE != 0, a.out_stride),
    ];
    let whole = a.rows > 1 && used.iter().all(|&(read, stride)| !read || stride == n);
    match n.checked_mul(a.rows) {
        Some(total) if whole => (
            RowArgs {
                n: total,
                rows: 1,
                ..*a
            },
            1,
        ),
        _ => (*a, a.rows.max(0)),
    }
}

/// The arguments of row `r` of `first`'s rows (each row pointer moved on by `r` strides).
#[inline(always)]
fn nth_row(first: &RowArgs, r: i64) -> RowArgs {
    // Only addresses are formed here (`wrapping_offset` claims nothing); the routine reads and
    // writes through them under its caller's contract.
    let at = |p: *const f32, stride: i64| p.wrapping_offset((r * stride) as isize);
    RowArgs {
        x: at(first.x, first.x_stride),
        w: at(first.w, first.w_stride),
        b: at(first.b, first.b_stride),
        c: at(first.c, first.c_stride),
        p: at(first.p, first.p_stride),
        q: at(first.q, first.q_stride),
        out: at(first.out, first.out_stride) as *mut f32,
        rows: 1,
        ..*first
    }
}

/// One `extern "C"` routine per shape and instruction set.
macro_rules! row_routines {
    ($($isa:ident, $feature:literal, $name:ident;)*) => {
        $(
            /// # Safety
            /// `args` points to a valid [`RowArgs`] for shape `S` and the CPU has the enabled
            /// target features (checked by `block_isa`).
            #[target_feature(enable = $feature)]
            unsafe extern "C" fn $name<const S: u32>(args: *const RowArgs) -> f32 {
                // A copy, so that the compiler keeps the row pointers in registers (stores
                // through `out` could otherwise change `*args`, as far as it can tell).
                // SAFETY: the caller's contract above.
                let a = unsafe { *args };
                let (first, rows) = row_runs::<S>(&a);
                if S & RowShape::HALVES != 0 {
                    for r in 0..rows {
                        // SAFETY: the caller's contract above: row `r` of `x`, `w`, `b` and
                        // `c` holds `n` elements and of `out` `2n`.
                        unsafe { run_halves::<x86::$isa>(x86::$isa::new(), &nth_row(&first, r)) };
                    }
                    return 0.0;
                }
                if rows == 1 {
                    // SAFETY: the caller's contract above (`first` is `a`, or its rows as one
                    // row where they follow each other).
                    return unsafe { run::<x86::$isa, S>(x86::$isa::new(), &first) };
                }
                for r in 0..rows {
                    // SAFETY: the caller's contract above: row `r` of every row the shape
                    // reads and writes holds `n` elements.
                    unsafe { run::<x86::$isa, S>(x86::$isa::new(), &nth_row(&first, r)) };
                }
                0.0
            }
        )*
    };
}

#[cfg(target_arch = "x86_64")]
row_routines! {
    Avx512, "avx512f,avx512dq,fma", row_avx512;
    Avx2, "avx2,fma", row_avx2;
}

/// The shapes with a routine, each for every instruction set, and [`row_routine`] over them.
macro_rules! shapes {
    ($($bits:expr,)*) => {
        /// Every shape that has a routine (for tests).
        pub const SHAPES: &[u32] = &[$($bits,)*];

        /// The routine of `shape` for `isa`, if the shape has one.
        #[cfg(target_arch = "x86_64")]
        pub fn row_routine(shape: RowShape, isa: super::BlockIsa) -> Option<RowFn> {
            $(
                if shape.0 == $bits {
                    return Some(match isa {
                        super::BlockIsa::Avx512 => row_avx512::<{ $bits }>,
                        super::BlockIsa::Avx2 => row_avx2::<{ $bits }>,
                    });
                }
            )*
            None
        }
    };
}

#[cfg(not(target_arch = "x86_64"))]
pub fn row_routine(_shape: RowShape, _isa: super::BlockIsa) -> Option<RowFn> {
    None
}

use RowShape as R;
const EXP: u32 = RowShape::function(MathFn::Exp);
const SILU: u32 = RowShape::function(MathFn::Silu);
const GELU: u32 = RowShape::function(MathFn::Gelu);
const SIGMOID: u32 = RowShape::function(MathFn::Sigmoid);
const TANH: u32 = RowShape::function(MathFn::Tanh);
const LOG: u32 = RowShape::function(MathFn::Log);
const ERF: u32 = RowShape::function(MathFn::Erf);

shapes! {
    // Plain row reductions: a maximum (softmax), a sum (a mean), a sum of squares (RMS norm),
    // a sum of squared deviations (a variance).
    R::MAX,
    R::SUM,
    R::SUM_SQUARES,
    R::SUB | R::SUM_SQUARES,
    // Softmax: `exp(x - max)` summed and stored, or only summed (log-softmax, logsumexp).
    R::SUB | EXP | R::SUM | R::STORE,
    R::SUB | EXP | R::SUM,
    // Stores: a row scaled (softmax's `e / sum`, RMS norm without weight), normalized
    // (layer norm, with weight and bias or either), RMS norm with weight.
    R::SCALE | R::STORE,
    // Softmax's `exp(x - max) / sum` with the exponentials computed again (its output is not
    // f32, so they were not stored: an f16 or bf16 softmax).
    R::SUB | EXP | R::SCALE | R::STORE,
    R::SUB | R::SCALE | R::STORE,
    R::SUB | R::SCALE | R::MUL_ROW | R::STORE,
    R::SUB | R::SCALE | R::ADD_ROW | R::STORE,
    // A layer norm's affine store (the code generator keeps it a loop on Zen 4, where it
    // measured slower: see `LAYER_NORM_AFFINE_STORE` in `codegen_cpu/src/lower/rows.rs`).
    R::SUB | R::SCALE | R::MUL_ROW | R::ADD_ROW | R::STORE,
    R::SCALE | R::MUL_ROW | R::STORE,
    // Log-softmax's `x - max - log(sum)`, and a row minus a value.
    R::SUB | R::STORE,
    // Pointwise over rows: products and sums of two rows, gated products (SwiGLU's
    // `silu(a) * b`, GELU's and sigmoid's).
    R::MUL_ROW | R::STORE,
    R::ADD_ROW | R::STORE,
    R::MUL_ROW | R::ADD_ROW | R::STORE,
    SILU | R::MUL_ROW | R::STORE,
    GELU | R::MUL_ROW | R::STORE,
    SIGMOID | R::MUL_ROW | R::STORE,
    TANH | R::MUL_ROW | R::STORE,
    // Copies (a transposing copy of attention's output, rotate_half's halves; a negation is
    // `SCALE` by -1).
    R::STORE,
    // Rotary embeddings: `x * cos + rotate_half(x) * sin`, and its halves apart (after
    // `sink_cats`, `x1 * cos + (-x2) * sin` and `x2 * cos + x1 * sin`).
    R::MUL_ROW | R::ADD_PRODUCT | R::STORE,
    R::MUL_ROW | R::ADD_PRODUCT | R::NEG_PRODUCT | R::STORE,
    // Both halves at once, a head's row written in order (rows of half heads apart).
    R::MUL_ROW | R::ADD_PRODUCT | R::NEG_PRODUCT | R::HALVES | R::STORE,
    // An optimizer step: `p - lr * g`.
    R::SCALE | R::FUSED_SCALE | R::ADD_ROW | R::STORE,
    // A function of a row: alone, after a GEMM epilogue's bias (`gelu(acc + bias)`), after a
    // fused `x * y + z`.
    EXP | R::STORE,
    LOG | R::STORE,
    TANH | R::STORE,
    SIGMOID | R::STORE,
    GELU | R::STORE,
    SILU | R::STORE,
    R::PRE_ADD | GELU | R::STORE,
    R::PRE_ADD | SILU | R::STORE,
    R::PRE_ADD | TANH | R::STORE,
    R::PRE_ADD | SIGMOID | R::STORE,
    R::PRE_MUL | R::PRE_ADD | GELU | R::STORE,
    // A GELU forward that also stores what its backward reads (a training step's
    // `gelu(acc + bias)`): the `erf` argument `(acc + bias) * (1/√2)` and `(acc + bias) * 0.5`,
    // and `erf(·) + 1` (with or without the bias).
    R::PRE_ADD | R::SCALE | R::STORE,
    R::PRE_ADD | R::SCALE | R::SCALE_FIRST | ERF | R::OFFSET | R::STORE,
    R::SCALE | R::SCALE_FIRST | ERF | R::OFFSET | R::STORE,
    // A GEMM epilogue's bias, then a residual.
    R::PRE_ADD | R::ADD_ROW | R::STORE,
    // A mean squared error's gradient after a GEMM with a bias: `acc + bias - target`, and
    // twice that times the loss's scale (`g * d + g * d`).
    R::PRE_ADD | R::SUB | R::SUB_ROW | R::STORE,
    R::PRE_ADD | R::SUB | R::SUB_ROW | R::SCALE | R::DOUBLE | R::STORE,
    // GELU's gradient (a training step's backward through `gelu(acc + bias)`).
    R::GELU_GRAD | R::STORE,
    R::PRE_ADD | R::GELU_GRAD | R::STORE,
    // GELU's gradient from the values its forward saved.
    R::GELU_GRAD | R::GELU_GRAD_SAVED | R::STORE,
    // ReLU, of a row or of a sum of two (a bias, a residual).
    R::RELU | R::STORE,
    R::ADD_ROW | R::RELU | R::STORE,
    R::PRE_ADD | R::ADD_ROW | R::RELU | R::STORE,
    // A batch norm in eval mode (`(x - mean) * rstd * weight + bias` per channel), with a
    // residual and a ReLU or either: a convolution's epilogue.
    R::SUB | R::SCALE | R::AFFINE | R::STORE,
    R::SUB | R::SCALE | R::AFFINE | R::RELU | R::STORE,
    R::SUB | R::SCALE | R::AFFINE | R::ADD_ROW | R::STORE,
    R::SUB | R::SCALE | R::AFFINE | R::ADD_ROW | R::RELU | R::STORE,
}

/// `shape` over `args`' row with the routine for `isa` (which must be supported), for tests.
/// Returns `None` when the shape has no routine.
///
/// # Safety
/// `args` describes valid rows for the shape (see [`RowArgs`]).
pub unsafe fn run_row(shape: RowShape, isa: super::BlockIsa, args: &RowArgs) -> Option<f32> {
    super::assert_supported(isa);
    let routine = row_routine(shape, isa)?;
    // SAFETY: the caller's contract; the CPU supports `isa` (asserted above).
    Some(unsafe { routine(args) })
}

#[cfg(test)]
mod tests {
    //! Every shape on every instruction set this CPU has, at row lengths around the register,
    //! chain and block boundaries: stored values bit for bit those of the same operations in
    //! scalar f32 (the function through its block routine), sums within a few ulp of the f64
    //! sum of the same terms, maxima exact.

    use super::*;
    use crate::math::block::{apply_block_to, block_isa, BlockIsa};

    fn lengths() -> Vec<usize> {
        let mut n: Vec<usize> = (0..=70).collect();
        n.extend([127, 128, 129, 1023, 1024, 1025, 2047, 2048, 2049, 3001]);
        n
    }

    fn row(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| 3.0 * ((i as f32 + 1.0) * 0.618 + seed).sin())
            .collect()
    }

    fn isas() -> Vec<BlockIsa> {
        match block_isa() {
            Some(BlockIsa::Avx512) => vec![BlockIsa::Avx512, BlockIsa::Avx2],
            Some(BlockIsa::Avx2) => vec![BlockIsa::Avx2],
            None => vec![],
        }
    }

    /// The values `t` of the module docs, in scalar f32 (the function by `isa`'s routine).
    fn expected(shape: u32, isa: BlockIsa, rows: [&[f32]; 6], u: [f32; 4]) -> Vec<f32> {
        let [x, w, b, c, p, q] = rows;
        let mut t: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let v = match (shape & R::PRE_MUL != 0, shape & R::PRE_ADD != 0) {
                    (true, true) => v.mul_add(p[i], q[i]),
                    (true, false) => v * p[i],
                    (false, true) => v + q[i],
                    (false, false) => v,
                };
                match (shape & R::SUB != 0, shape & R::SUB_ROW != 0) {
                    (true, true) => v - c[i],
                    (true, false) => v - u[0],
                    _ => v,
                }
            })
            .collect();
        if shape & RowShape::GELU_GRAD != 0 {
            let scale = crate::math::GELU_SCALE;
            // The erf argument, `erf(s) + 1` and `x * 0.5`: computed from `t`, or the rows
            // `t`, `b` and `c` (saved by a forward).
            let (s, one_plus, half_x): (Vec<f32>, Vec<f32>, Vec<f32>) =
                if shape & RowShape::GELU_GRAD_SAVED != 0 {
                    (t.clone(), b.to_vec(), c.to_vec())
                } else {
                    let s: Vec<f32> = t.iter().map(|&v| v * scale).collect();
                    let mut erf = s.clone();
                    apply_block_to(MathFn::Erf, isa, &s, &mut erf);
                    let one_plus = erf.iter().map(|&v| v + 1.0).collect();
                    (s, one_plus, t.iter().map(|&v| v * 0.5).collect())
                };
            // `exp` of the floor never matters to these rows (|s| < 9.3, above the floor).
            let minus: Vec<f32> = s.iter().map(|&v| -(v * v)).collect();
            assert!(minus.iter().all(|&m| m >= ERF_GRAD_FLOOR));
            let mut gauss = minus.clone();
            apply_block_to(MathFn::Exp, isa, &minus, &mut gauss);
            return (0..t.len())
                .map(|i| {
                    let p = w[i] * one_plus[i];
                    let h = w[i] * half_x[i];
                    let q = (h * (gauss[i] * TWO_OVER_SQRT_PI)) * scale;
                    p.mul_add(0.5, q)
                })
                .collect();
        }
        let scale_first = shape & RowShape::SCALE != 0 && shape & RowShape::SCALE_FIRST != 0;
        if scale_first {
            t.iter_mut().for_each(|v| *v *= u[1]);
        }
        if let Some(f) = RowShape::math(shape) {
            let args = t.clone();
            apply_block_to(f, isa, &args, &mut t);
        }
        for (i, t) in t.iter_mut().enumerate() {
            if shape & RowShape::FUSED_SCALE != 0 {
                *t = t.mul_add(u[1], b[i]);
                continue;
            }
            if shape & RowShape::SCALE != 0 && !scale_first {
                *t *= u[1];
            }
            if shape & RowShape::DOUBLE != 0 {
                *t += *t;
            }
            if shape & RowShape::AFFINE != 0 {
                *t = t.mul_add(u[2], u[3]);
            }
            if shape & RowShape::OFFSET != 0 {
                *t += u[3];
            }
            let (mul, add) = (
                shape & RowShape::MUL_ROW != 0,
                shape & RowShape::ADD_ROW != 0,
            );
            *t = match (mul, add) {
                (true, _) if shape & RowShape::NEG_PRODUCT != 0 => t.mul_add(w[i], -b[i] * c[i]),
                (true, _) if shape & RowShape::ADD_PRODUCT != 0 => t.mul_add(w[i], b[i] * c[i]),
                (true, true) => t.mul_add(w[i], b[i]),
                (true, false) => *t * w[i],
                (false, true) => *t + b[i],
                (false, false) => *t,
            };
            if shape & RowShape::RELU != 0 && *t <= 0.0 {
                *t = 0.0;
            }
        }
        t
    }

    /// The suite's cases of `streams_stores`, on a 32 MiB cache and on a 300 MiB one.
    #[test]
    fn outputs_stream_when_the_kernel_overflows_the_cache() {
        const M: usize = 1 << 20;
        // layernorm_4096x1024: 16 MiB in, 16 MiB out (and the weights).
        assert!(!streams_past(32 * M, 16 * M, 32 * M + 8192));
        // The train step's weight update: 16 MiB out, 48 MiB in all.
        assert!(streams_past(32 * M, 16 * M, 48 * M));
        // pointwise_gelu_16m: 64 MiB out, 256 MiB in all.
        assert!(streams_past(32 * M, 64 * M, 256 * M));
        // A small output of a large reduction, and every case on a server's cache.
        assert!(!streams_past(32 * M, M, 256 * M));
        assert!(!streams_past(300 * M, 64 * M, 256 * M));
        assert!(streams_past(300 * M, 256 * M, 512 * M));
    }

    #[test]
    fn every_shape_at_every_length_on_every_isa() {
        for isa in isas() {
            // (Both halves of a head, whose rows are twice as long as `n`, have their own test.)
            for &shape in SHAPES.iter().filter(|&&s| s & R::HALVES == 0) {
                for n in lengths() {
                    // Cached stores, then non-temporal ones (the flag) to an aligned row and
                    // to a row one element past alignment (where the routine falls back); the
                    // next row prefetched (past the end of `x`'s allocation: a hint only).
                    let cases = [
                        (false, 0, 0),
                        (true, 0, 0),
                        (false, ROW_STREAM, 0),
                        (true, ROW_STREAM, 0),
                        (false, ROW_STREAM, 1),
                        (false, ROW_PREFETCH_NEXT, 0),
                        (true, ROW_STREAM | ROW_PREFETCH_NEXT, 0),
                    ];
                    for (in_place, flags, shift) in cases {
                        let x = row(n, 0.3);
                        let w = row(n, 1.1);
                        let b = row(n, 2.7);
                        let c = row(n, 4.1);
                        let p = row(n, 5.3);
                        let q = row(n, 6.2);
                        let u = [0.25f32, 1.5, -0.75, 0.125];
                        let want = expected(shape, isa, [&x, &w, &b, &c, &p, &q], u);
                        let mut storage = vec![f32::NAN; n + 32];
                        let start = storage.as_ptr().align_offset(64).min(16) + shift;
                        let out = &mut storage[start..start + n];
                        if in_place {
                            out.copy_from_slice(&x);
                        }
                        let args = RowArgs {
                            x: if in_place { out.as_ptr() } else { x.as_ptr() },
                            w: w.as_ptr(),
                            b: b.as_ptr(),
                            c: c.as_ptr(),
                            out: out.as_mut_ptr(),
                            n: n as i64,
                            u0: u[0],
                            u1: u[1],
                            p: p.as_ptr(),
                            q: q.as_ptr(),
                            u2: u[2],
                            u3: u[3],
                            flags,
                            reserved: 0,
                            ..one_row()
                        };
                        // SAFETY: every row holds `n` f32s; `out` is written only where the
                        // routine read `x` (in place) or is separate.
                        let got = unsafe { run_row(RowShape(shape), isa, &args) }.unwrap();
                        let what = format!(
                            "shape {shape:#x} on {isa:?}, n = {n}, in place {in_place}, \
                             flags {flags}, {shift} past alignment"
                        );
                        let mut outside = storage[..start].iter().chain(&storage[start + n..]);
                        assert!(outside.all(|v| v.is_nan()), "{what}: wrote outside the row");
                        let out = &storage[start..start + n];
                        if shape & RowShape::STORE != 0 {
                            let same = out
                                .iter()
                                .zip(&want)
                                .all(|(a, e)| a.to_bits() == e.to_bits());
                            assert!(same, "{what}: stored values differ");
                        }
                        if shape & RowShape::MAX != 0 {
                            let m = want.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                            assert_eq!(got.to_bits(), m.to_bits(), "{what}");
                        }
                        let squares = shape & RowShape::SUM_SQUARES != 0;
                        if shape & RowShape::SUM != 0 || squares {
                            let terms = want.iter().map(|&t| {
                                if squares {
                                    t as f64 * t as f64
                                } else {
                                    t as f64
                                }
                            });
                            let sum: f64 = terms.clone().sum();
                            let scale: f64 = terms.map(f64::abs).sum::<f64>().max(1e-30);
                            assert!(
                                (got as f64 - sum).abs() <= 1e-6 * scale,
                                "{what}: sum {got} against {sum}"
                            );
                        }
                        if !RowShape(shape).reduces() {
                            assert_eq!(got, 0.0, "{what}");
                        }
                    }
                }
            }
        }
    }

    /// Arguments reading the row `x` (every row pointer at it), storing nothing, with the row
    /// values that leave a value unchanged (`u0` 0, `u1` and `u2` 1, `u3` 0).
    fn reading(x: &[f32]) -> RowArgs {
        RowArgs {
            x: x.as_ptr(),
            w: x.as_ptr(),
            b: x.as_ptr(),
            c: x.as_ptr(),
            out: std::ptr::null_mut(),
            n: x.len() as i64,
            u0: 0.0,
            u1: 1.0,
            p: x.as_ptr(),
            q: x.as_ptr(),
            u2: 1.0,
            u3: 0.0,
            flags: 0,
            reserved: 0,
            ..one_row()
        }
    }

    /// The fields of a call of one row (`rows` 1, every stride 0), with null rows.
    fn one_row() -> RowArgs {
        let null = std::ptr::null();
        RowArgs {
            x: null,
            w: null,
            b: null,
            c: null,
            out: std::ptr::null_mut(),
            n: 0,
            u0: 0.0,
            u1: 1.0,
            p: null,
            q: null,
            u2: 1.0,
            u3: 0.0,
            flags: 0,
            reserved: 0,
            rows: 1,
            x_stride: 0,
            w_stride: 0,
            b_stride: 0,
            c_stride: 0,
            p_stride: 0,
            q_stride: 0,
            out_stride: 0,
        }
    }

    /// A call over several rows stores what one call per row stores, bit for bit, and nothing
    /// else: every shape that only stores, at row lengths around the register boundaries and
    /// the short rows of rotary embeddings (32) and a 56-wide image, with rows that follow
    /// each other (one long row, see `row_runs`), rows apart (padded strides), operands
    /// broadcast along the rows (stride 0, as `cos` and `sin` across heads), in place, and
    /// non-temporal stores.
    #[test]
    fn several_rows_store_what_each_row_stores() {
        for isa in isas() {
            let one_long = |&&s: &&u32| !RowShape(s).reduces() && s & R::HALVES == 0;
            for &shape in SHAPES.iter().filter(one_long) {
                for n in [0usize, 1, 7, 15, 16, 17, 31, 32, 33, 56, 57, 64, 65] {
                    for rows in [0usize, 1, 2, 3, 8] {
                        // (operand stride, broadcast operands' stride, out stride, in place,
                        // the one operand of w, b, c, p, q at the broadcast stride while all
                        // the others follow each other, or None: w, c and q at it)
                        let mut layouts = vec![
                            (n, n, n, false, None),
                            (n, n, n, true, None),
                            (n + 5, 0, n + 3, false, None),
                            (2 * n + 1, n, 2 * n + 1, true, None),
                            (n, 0, n, false, None),
                        ];
                        layouts.extend((0..5).map(|j| (n, 0, n, false, Some(j))));
                        for (stride, broadcast, out_stride, in_place, lone) in layouts {
                            // The stride of operand `j` of w, b, c, p, q.
                            let of = |j: usize| match lone {
                                Some(l) if l == j => broadcast,
                                Some(_) => stride,
                                None if j.is_multiple_of(2) => broadcast,
                                None => stride,
                            };
                            let len = |s: usize| s * rows.saturating_sub(1) + n;
                            let x = row(len(stride), 0.3);
                            let w = row(len(of(0)), 1.1);
                            let b = row(len(of(1)), 2.7);
                            let c = row(len(of(2)), 4.1);
                            let p = row(len(of(3)), 5.3);
                            let q = row(len(of(4)), 6.2);
                            let u = [0.25f32, 1.5, -0.75, 0.125];
                            let out_len = len(out_stride);
                            let mut many = vec![f32::NAN; out_len + 32];
                            let start = many.as_ptr().align_offset(64).min(16);
                            if in_place {
                                many[start..start + out_len]
                                    .copy_from_slice(&row(out_len, 0.3)[..out_len]);
                            }
                            let mut each = many.clone();
                            let x_of = |out: &[f32]| {
                                if in_place {
                                    out[start..].as_ptr()
                                } else {
                                    x.as_ptr()
                                }
                            };
                            let args = |out: &mut [f32]| RowArgs {
                                x: x_of(out),
                                w: w.as_ptr(),
                                b: b.as_ptr(),
                                c: c.as_ptr(),
                                out: out[start..].as_mut_ptr(),
                                n: n as i64,
                                u0: u[0],
                                u1: u[1],
                                p: p.as_ptr(),
                                q: q.as_ptr(),
                                u2: u[2],
                                u3: u[3],
                                flags: ROW_STREAM,
                                reserved: 0,
                                rows: rows as i64,
                                x_stride: if in_place { out_stride } else { stride } as i64,
                                w_stride: of(0) as i64,
                                b_stride: of(1) as i64,
                                c_stride: of(2) as i64,
                                p_stride: of(3) as i64,
                                q_stride: of(4) as i64,
                                out_stride: out_stride as i64,
                            };
                            let all = args(&mut many);
                            // SAFETY: row `r` of every operand lies within its vector (`len`);
                            // in place, `x` is `out` at the same index.
                            unsafe { run_row(RowShape(shape), isa, &all) }.unwrap();
                            let first = args(&mut each);
                            for r in 0..rows as i64 {
                                let one = RowArgs {
                                    rows: 1,
                                    ..nth_row(&first, r)
                                };
                                // SAFETY: as above, for one row.
                                unsafe { run_row(RowShape(shape), isa, &one) }.unwrap();
                            }
                            let what = format!(
                                "shape {shape:#x} on {isa:?}, {rows} rows of {n}, strides \
                                 {stride}/{broadcast}/{out_stride} (apart: {lone:?}), in place {in_place}"
                            );
                            let same = many
                                .iter()
                                .zip(&each)
                                .all(|(a, e)| a.to_bits() == e.to_bits());
                            assert!(same, "{what}: the rows differ from one call per row");
                            if !in_place {
                                // Nothing outside the rows' elements is written.
                                let written = (0..rows)
                                    .flat_map(|r| (0..n).map(move |i| start + r * out_stride + i));
                                let mut outside = vec![true; many.len()];
                                written.for_each(|i| outside[i] = false);
                                let kept =
                                    (many.iter().zip(&outside)).all(|(v, &out)| !out || v.is_nan());
                                assert!(kept, "{what}: wrote outside the rows");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Both halves of a head ([`RowShape::HALVES`]) store, bit for bit, the two shapes apart
    /// (`NEG_PRODUCT` into the first half, `ADD_PRODUCT` into the second, one call each), and
    /// the same operations in scalar f32, at every length on every instruction set: one row
    /// and several, the rows apart (a rotary kernel's heads) or cos and sin broadcast (stride
    /// 0), in place (`x` the head's first half, `b` its second), cached and non-temporal
    /// stores to an aligned row and one past alignment; NaN, both infinities and both zeros
    /// in every operand (NaN where the two forms give NaN); nothing written outside the rows.
    #[test]
    fn both_halves_of_a_head_store_what_the_halves_apart_store() {
        let pair = R::MUL_ROW | R::ADD_PRODUCT | R::NEG_PRODUCT | R::HALVES | R::STORE;
        let first_half = RowShape(pair & !R::HALVES);
        let second_half = RowShape(pair & !(R::HALVES | R::NEG_PRODUCT));
        assert!(SHAPES.contains(&pair));
        let same = |a: &[f32], b: &[f32]| {
            a.len() == b.len()
                && (a.iter().zip(b))
                    .all(|(p, q)| p.to_bits() == q.to_bits() || p.is_nan() && q.is_nan())
        };
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        for isa in isas() {
            for n in lengths() {
                // (rows, operand stride past 2n, cos and sin broadcast, in place, flags, shift)
                let cases = [
                    (1usize, 0usize, false, false, 0, 0),
                    (1, 0, false, true, 0, 0),
                    (1, 0, false, false, ROW_STREAM, 0),
                    (1, 0, false, false, ROW_STREAM, 1),
                    (3, 3, true, false, 0, 0),
                    (3, 5, true, true, ROW_STREAM, 0),
                    (8, 0, true, false, 0, 1),
                    (2, 7, false, false, ROW_STREAM, 0),
                ];
                for (rows, pad, broadcast, in_place, flags, shift) in cases {
                    let head = 2 * n + pad;
                    let len = head * rows;
                    let half = if broadcast { 0 } else { n + 1 };
                    let mut x = row(len, 0.3);
                    let mut w = row(half * rows + n, 1.1);
                    let mut c = row(half * rows + n, 4.1);
                    // Specials in each operand, at positions moving with the length.
                    for (k, v) in specials.into_iter().enumerate() {
                        for (data, at) in [(0, 3 * k), (0, n + 5 * k), (1, 7 * k), (2, 2 * k + 1)] {
                            let data = match data {
                                0 => &mut x,
                                1 => &mut w,
                                _ => &mut c,
                            };
                            if let Some(slot) = data.get_mut(at) {
                                *slot = v;
                            }
                        }
                    }
                    let mut storage = vec![f32::NAN; len + 32];
                    let start = storage.as_ptr().align_offset(64).min(16) + shift;
                    let mut apart = storage.clone();
                    if in_place {
                        storage[start..start + len].copy_from_slice(&x);
                        apart[start..start + len].copy_from_slice(&x);
                    }
                    let args = |out: &mut [f32]| {
                        let out = out[start..].as_mut_ptr();
                        RowArgs {
                            x: if in_place { out } else { x.as_ptr() },
                            w: w.as_ptr(),
                            b: if in_place { out } else { x.as_ptr() }.wrapping_add(n),
                            c: c.as_ptr(),
                            out,
                            n: n as i64,
                            flags,
                            rows: rows as i64,
                            x_stride: head as i64,
                            w_stride: half as i64,
                            b_stride: head as i64,
                            c_stride: half as i64,
                            out_stride: head as i64,
                            ..one_row()
                        }
                    };
                    let all = args(&mut storage);
                    // SAFETY: row `r` of `x` and `b` (its halves) and of `out` lie within
                    // `len` elements, `w` and `c` within theirs.
                    unsafe { run_row(RowShape(pair), isa, &all) }.unwrap();
                    let what = format!(
                        "{isa:?}, {rows} rows of 2 x {n}, padded by {pad}, broadcast \
                         {broadcast}, in place {in_place}, flags {flags}, {shift} past alignment"
                    );
                    // The halves apart, one call per row and half, reading the inputs from
                    // `x` (in place, the same values: each call would overwrite the other's).
                    for r in 0..rows {
                        let (x, w, c) = (&x[r * head..], &w[r * half..], &c[r * half..]);
                        let out = apart[start + r * head..].as_mut_ptr();
                        let halves = [
                            (first_half, x.as_ptr(), x[n..].as_ptr(), out),
                            (
                                second_half,
                                x[n..].as_ptr(),
                                x.as_ptr(),
                                out.wrapping_add(n),
                            ),
                        ];
                        for (shape, x, b, out) in halves {
                            let one = RowArgs {
                                x,
                                w: w.as_ptr(),
                                b,
                                c: c.as_ptr(),
                                out,
                                n: n as i64,
                                flags,
                                ..one_row()
                            };
                            // SAFETY: `n` elements of each row from there, `n` of `out`'s.
                            unsafe { run_row(shape, isa, &one) }.unwrap();
                        }
                    }
                    assert!(
                        same(&storage, &apart),
                        "{what}: differs from the halves apart"
                    );
                    // The same operations in scalar f32, and nothing outside the rows.
                    let mut want = vec![f32::NAN; len + 32];
                    if in_place {
                        want[start..start + len].copy_from_slice(&x);
                    }
                    for r in 0..rows {
                        let (x, w, c) = (&x[r * head..], &w[r * half..], &c[r * half..]);
                        for i in 0..n {
                            let (x1, x2) = (x[i], x[n + i]);
                            want[start + r * head + i] = x1.mul_add(w[i], -(x2 * c[i]));
                            want[start + r * head + n + i] = x2.mul_add(w[i], x1 * c[i]);
                        }
                    }
                    assert!(same(&storage, &want), "{what}: differs from scalar f32");
                }
            }
        }
    }

    /// A sum's order, stated in scalar f32: `CHAINS` registers of `width` lanes accumulate each
    /// block of [`SUM_BLOCK`] (full steps of `CHAINS` registers, then single registers into the
    /// first, then the zero-padded tail into it) by `add(partial, x)`, every block's partial
    /// sums are folded into running sums with Kahan compensation (`kahan_fold`, the last block
    /// included), then the chains are added pairwise and the lanes pairwise.
    fn blocked_sum(x: &[f32], width: usize, add: fn(f32, f32) -> f32) -> f32 {
        let mut running = vec![vec![0f32; width]; CHAINS];
        let mut compensation = vec![vec![0f32; width]; CHAINS];
        for block in x.chunks(SUM_BLOCK) {
            let mut acc = vec![vec![0f32; width]; CHAINS];
            let mut i = 0;
            while i + CHAINS * width <= block.len() {
                for (k, acc) in acc.iter_mut().enumerate() {
                    for (lane, a) in acc.iter_mut().enumerate() {
                        *a = add(*a, block[i + k * width + lane]);
                    }
                }
                i += CHAINS * width;
            }
            while i < block.len() {
                for (lane, a) in acc[0].iter_mut().enumerate() {
                    *a = add(*a, block.get(i + lane).copied().unwrap_or(0.0));
                }
                i += width;
            }
            for k in 0..CHAINS {
                for lane in 0..width {
                    let (r, c) = (&mut running[k][lane], &mut compensation[k][lane]);
                    let y = acc[k][lane] - *c;
                    let t = *r + y;
                    let next = (t - *r) - y;
                    // `kahan_fold`'s `c - c == 0`: finite.
                    *c = if next.is_finite() { next } else { 0.0 };
                    *r = t;
                }
            }
        }
        let mut lanes: Vec<f32> = (0..width)
            .map(|l| (running[0][l] + running[1][l]) + (running[2][l] + running[3][l]))
            .collect();
        while lanes.len() > 1 {
            lanes = lanes.chunks(2).map(|p| p[0] + p[1]).collect();
        }
        lanes[0]
    }

    /// A row's sum and sum of squares are bit for bit [`blocked_sum`], at lengths around the
    /// register, chain and block boundaries and across several blocks.
    #[test]
    fn sums_add_in_their_stated_order() {
        for isa in isas() {
            let width = match isa {
                BlockIsa::Avx512 => 16,
                BlockIsa::Avx2 => 8,
            };
            for n in lengths().into_iter().chain([5000, 4096 + 17]) {
                let x = row(n, 0.25);
                let args = RowArgs {
                    u0: 0.5,
                    ..reading(&x)
                };
                // SAFETY: `x` holds `n` f32s; the shapes read only `x` and store nothing.
                let sum = unsafe { run_row(RowShape(RowShape::SUM), isa, &args) }.unwrap();
                let plain = blocked_sum(&x, width, |a, v| a + v);
                assert_eq!(sum.to_bits(), plain.to_bits(), "{isa:?}, sum of {n}");
                let shape = RowShape(RowShape::SUB | RowShape::SUM_SQUARES);
                // SAFETY: as above.
                let squares = unsafe { run_row(shape, isa, &args) }.unwrap();
                // The square and its addition are one fused multiply-add.
                let terms: Vec<f32> = x.iter().map(|&v| v - 0.5).collect();
                let fused = blocked_sum(&terms, width, |a, t| t.mul_add(t, a));
                assert_eq!(
                    squares.to_bits(),
                    fused.to_bits(),
                    "{isa:?}, sum of squares of {n}"
                );
            }
        }
    }

    #[test]
    fn a_nan_makes_the_maximum_nan_and_sums_reach_infinity() {
        for isa in isas() {
            for n in [1usize, 16, 17, 100, 1500] {
                for at in [0, n / 2, n - 1] {
                    let mut x = row(n, 0.5);
                    x[at] = f32::NAN;
                    let args = reading(&x);
                    // SAFETY: `x` holds `n` f32s; the shape reads only `x`.
                    let m = unsafe { run_row(RowShape(RowShape::MAX), isa, &args) }.unwrap();
                    assert!(m.is_nan(), "{isa:?}: max of {n} with a NaN at {at}: {m}");
                    x[at] = f32::INFINITY;
                    let args = RowArgs {
                        x: x.as_ptr(),
                        ..args
                    };
                    // SAFETY: as above.
                    let s = unsafe { run_row(RowShape(RowShape::SUM), isa, &args) }.unwrap();
                    assert_eq!(
                        s,
                        f32::INFINITY,
                        "{isa:?}: sum of {n} with an infinity at {at}"
                    );
                }
            }
        }
    }
}
