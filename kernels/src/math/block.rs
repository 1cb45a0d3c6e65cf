//! The math algorithms compiled ahead of time for wide vectors, called by kernels on blocks.
//!
//! Cranelift emits 128-bit vectors only, so an inline `exp` or `erf` runs 4 lanes per
//! instruction where the CPU has 16 (AVX-512) or 8 (AVX2). As Inductor's C++ calls Sleef, a
//! kernel whose loop computes such a function hands a block of arguments to a routine here
//! (see `lower.rs`, "math blocks"), which runs the very same algorithm (`super::exp`, …) on
//! one AVX-512 register (16 lanes) or AVX2 register (8 lanes) at a time: the [`Lanes`]
//! operations map one to one onto `std::arch` intrinsics, inlined into `#[target_feature]`
//! routines. The operations and their order are those of the inline form, so the results
//! agree bit for bit (tested in `tests.rs`) and one accuracy table covers both.
//!
//! A routine is chosen once per process by [`block_routine`]: AVX-512F with DQ, else AVX2 with FMA,
//! else none (then kernels keep the inline form, which is as wide as a plain SSE routine).

use super::{FloatCmp, IntCmp};
use super::{Lanes, MathFn};

pub mod columns;
pub mod rows;

/// The signature of a block routine: `dst[0..n] = f(src[0..n])`, in place when `dst == src`.
pub type BlockFn = unsafe extern "C" fn(src: *const f32, dst: *mut f32, n: i64);

/// A [`Lanes`] implementation on one x86 vector register of 32-bit lanes (floats, i32s or
/// masks of all ones / all zeros, by use, like the untyped registers of the inline form).
/// Its methods are only sound to call where the CPU has the instruction set: inside the
/// `#[target_feature]` routines below, after [`block_isa`] checked it.
/// Adds a block's partial sums `partial` into `running` with Kahan compensation, lane by lane,
/// as the code generator's `kahan_add` does: the compensation keeps what each addition rounded
/// away and takes it off the next block's partial sum; past an infinity it is NaN (inf - inf)
/// and is dropped. Shared by the row and column routines, whose sums must keep those bits.
#[inline(always)]
fn kahan_fold<L: Lanes>(e: &mut L, running: &mut L::V, compensation: &mut L::V, partial: L::V) {
    let zero = e.f(0.0);
    let y = e.sub(partial, *compensation);
    let t = e.add(*running, y);
    let rounded = e.sub(t, *running);
    let c = e.sub(rounded, y);
    let d = e.sub(c, c);
    let finite = e.fcmp(FloatCmp::Equal, d, zero);
    *compensation = e.sel(finite, c, zero);
    *running = t;
}

trait Wide: Lanes + Sized {
    /// Lanes per register.
    const WIDTH: usize;
    /// Loads `Self::WIDTH` f32s.
    ///
    /// # Safety
    /// `p` points to `Self::WIDTH` readable f32s.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Stores `Self::WIDTH` f32s.
    ///
    /// # Safety
    /// `p` points to `Self::WIDTH` writable f32s.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// Stores `Self::WIDTH` f32s with a non-temporal hint (around the caches).
    ///
    /// # Safety
    /// `p` points to `Self::WIDTH` writable f32s and is aligned to `Self::WIDTH · 4` bytes.
    unsafe fn stream(p: *mut f32, v: Self::V);
    /// Orders the non-temporal stores before it before every store after it.
    ///
    /// # Safety
    /// The CPU has the instruction set (as every method).
    unsafe fn fence();
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! `Avx512` (16 lanes) and `Avx2` (8 lanes). Every method is `#[inline(always)]` so that
    //! it is compiled inside the `#[target_feature]` routine that calls it; the `unsafe`
    //! blocks rely on that routine's feature check (see [`super::Wide`]).
    use super::super::{FloatCmp, IntCmp};
    use super::{Lanes, Wide};
    use std::arch::x86_64::*;

    /// AVX-512F/DQ with FMA lanes. Only made by [`Avx512::new`], whose caller vouches for the
    /// CPU, so every method's `unsafe` intrinsic runs on a CPU that has it.
    pub(in crate::math) struct Avx512(());

    impl Avx512 {
        /// # Safety
        /// The CPU has AVX-512F, AVX-512DQ and FMA (the routines that call this are
        /// `#[target_feature]` functions chosen only after `block_isa` detected them).
        #[inline(always)]
        pub(in crate::math) unsafe fn new() -> Self {
            Avx512(())
        }
    }

    macro_rules! f512 {
        ($op:ident, $a:expr, $b:expr) => {
            _mm512_castps_si512($op(_mm512_castsi512_ps($a), _mm512_castsi512_ps($b)))
        };
    }

    impl Lanes for Avx512 {
        type V = __m512i;
        #[inline(always)]
        fn f(&mut self, c: f32) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_set1_epi32(c.to_bits() as i32) }
        }
        #[inline(always)]
        fn i(&mut self, c: i32) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_set1_epi32(c) }
        }
        #[inline(always)]
        fn add(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { f512!(_mm512_add_ps, a, b) }
        }
        #[inline(always)]
        fn sub(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { f512!(_mm512_sub_ps, a, b) }
        }
        #[inline(always)]
        fn mul(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { f512!(_mm512_mul_ps, a, b) }
        }
        #[inline(always)]
        fn div(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { f512!(_mm512_div_ps, a, b) }
        }
        /// Always fused: routines exist only for CPUs with FMA, where the inline form fuses.
        #[inline(always)]
        fn mul_add(&mut self, a: __m512i, b: __m512i, c: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe {
                _mm512_castps_si512(_mm512_fmadd_ps(
                    _mm512_castsi512_ps(a),
                    _mm512_castsi512_ps(b),
                    _mm512_castsi512_ps(c),
                ))
            }
        }
        #[inline(always)]
        fn abs(&mut self, a: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_and_si512(a, _mm512_set1_epi32(0x7fff_ffff)) }
        }
        #[inline(always)]
        fn neg(&mut self, a: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_xor_si512(a, _mm512_set1_epi32(i32::MIN)) }
        }
        #[inline(always)]
        fn bits(&mut self, x: __m512i) -> __m512i {
            x
        }
        #[inline(always)]
        fn float(&mut self, i: __m512i) -> __m512i {
            i
        }
        #[inline(always)]
        fn iadd(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_add_epi32(a, b) }
        }
        #[inline(always)]
        fn isub(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_sub_epi32(a, b) }
        }
        #[inline(always)]
        fn band(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_and_si512(a, b) }
        }
        #[inline(always)]
        fn bor(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_or_si512(a, b) }
        }
        #[inline(always)]
        fn bxor(&mut self, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_xor_si512(a, b) }
        }
        #[inline(always)]
        fn shl(&mut self, a: __m512i, n: i64) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_sllv_epi32(a, _mm512_set1_epi32(n as i32)) }
        }
        #[inline(always)]
        fn ushr(&mut self, a: __m512i, n: i64) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_srlv_epi32(a, _mm512_set1_epi32(n as i32)) }
        }
        #[inline(always)]
        fn sshr(&mut self, a: __m512i, n: i64) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_srav_epi32(a, _mm512_set1_epi32(n as i32)) }
        }
        #[inline(always)]
        fn i2f(&mut self, i: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_castps_si512(_mm512_cvtepi32_ps(i)) }
        }
        #[inline(always)]
        fn fcmp(&mut self, cc: FloatCmp, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe {
                let (a, b) = (_mm512_castsi512_ps(a), _mm512_castsi512_ps(b));
                let k = match cc {
                    FloatCmp::Equal => _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b),
                    FloatCmp::NotEqual => _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(a, b),
                    FloatCmp::LessThan => _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b),
                    FloatCmp::LessThanOrEqual => _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, b),
                    FloatCmp::GreaterThan => _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b),
                    FloatCmp::GreaterThanOrEqual => _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b),
                    FloatCmp::Unordered => _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, b),
                    FloatCmp::Ordered => _mm512_cmp_ps_mask::<_CMP_ORD_Q>(a, b),
                };
                // `vpmovm2d`: no input but the mask. (A zero-masked all-ones `vpternlogd`, what
                // `maskz_mov` of -1 compiles to, also reads its destination register, and that
                // false dependency chained every iteration of the routine's loop to the last.)
                _mm512_movm_epi32(k)
            }
        }
        #[inline(always)]
        fn icmp(&mut self, cc: IntCmp, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe {
                let k = match cc {
                    IntCmp::Equal => _mm512_cmpeq_epi32_mask(a, b),
                    IntCmp::NotEqual => _mm512_cmpneq_epi32_mask(a, b),
                    IntCmp::SignedLessThan => _mm512_cmplt_epi32_mask(a, b),
                    IntCmp::SignedLessThanOrEqual => _mm512_cmple_epi32_mask(a, b),
                    IntCmp::SignedGreaterThan => _mm512_cmpgt_epi32_mask(a, b),
                    IntCmp::SignedGreaterThanOrEqual => _mm512_cmpge_epi32_mask(a, b),
                };
                // `vpmovm2d`: no input but the mask. (A zero-masked all-ones `vpternlogd`, what
                // `maskz_mov` of -1 compiles to, also reads its destination register, and that
                // false dependency chained every iteration of the routine's loop to the last.)
                _mm512_movm_epi32(k)
            }
        }
        /// `vminps c, x` is `c < x ? c : x`, the default's very definition (NaN `x` kept).
        #[inline(always)]
        fn minc(&mut self, x: __m512i, c: f32) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { f512!(_mm512_min_ps, self.f(c), x) }
        }
        /// `vmaxps c, x` is `c > x ? c : x`, the default's `x < c ? c : x`.
        #[inline(always)]
        fn maxc(&mut self, x: __m512i, c: f32) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { f512!(_mm512_max_ps, self.f(c), x) }
        }
        /// `vscalefps`: `p * 2^n` rounded once, subnormal and overflowing results included.
        #[inline(always)]
        fn scale_pow2(&mut self, p: __m512i, n: __m512i, _: __m512i) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { f512!(_mm512_scalef_ps, p, n) }
        }
        /// `vpermps`: the index's low 4 bits pick one of the 16 entries.
        #[inline(always)]
        fn lookup(&mut self, table: &'static [f32; 16], idx: __m512i) -> __m512i {
            // SAFETY: `table` holds 16 readable f32s.
            unsafe {
                _mm512_castps_si512(_mm512_permutexvar_ps(idx, _mm512_loadu_ps(table.as_ptr())))
            }
        }
        #[inline(always)]
        fn sel(&mut self, m: __m512i, t: __m512i, f: __m512i) -> __m512i {
            // `m ? t : f` for masks of all ones / all zeros lanes, as a blend under the mask's
            // sign bits: LLVM takes the compare's mask register directly (the `vpmovm2d` /
            // `vpmovd2m` pair folds away), and `vpblendmd` does not overwrite an operand, as
            // the bitwise `vpternlogd` did (a copy of a constant per select).
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_mask_blend_epi32(_mm512_movepi32_mask(m), f, t) }
        }
    }

    impl Wide for Avx512 {
        const WIDTH: usize = 16;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512i {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_castps_si512(_mm512_loadu_ps(p)) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512i) {
            // SAFETY: an `Avx512` exists only on a CPU with AVX-512F/DQ and FMA (`Avx512::new`).
            unsafe { _mm512_storeu_ps(p, _mm512_castsi512_ps(v)) }
        }
        #[inline(always)]
        unsafe fn stream(p: *mut f32, v: __m512i) {
            // SAFETY: as `store`; the caller aligned `p` to 64 bytes.
            unsafe { _mm512_stream_ps(p, _mm512_castsi512_ps(v)) }
        }
        #[inline(always)]
        unsafe fn fence() {
            // SAFETY: SSE is part of x86-64.
            unsafe { _mm_sfence() }
        }
    }

    /// AVX2 with FMA lanes. Only made by [`Avx2::new`], whose caller vouches for the CPU.
    pub(in crate::math) struct Avx2(());

    impl Avx2 {
        /// # Safety
        /// The CPU has AVX2 and FMA (checked by `block_isa` before any routine using it runs).
        #[inline(always)]
        pub(in crate::math) unsafe fn new() -> Self {
            Avx2(())
        }
    }

    macro_rules! f256 {
        ($op:ident, $a:expr, $b:expr) => {
            _mm256_castps_si256($op(_mm256_castsi256_ps($a), _mm256_castsi256_ps($b)))
        };
    }

    impl Lanes for Avx2 {
        type V = __m256i;
        /// `vminps c, x` is `c < x ? c : x`, the default's very definition (NaN `x` kept).
        #[inline(always)]
        fn minc(&mut self, x: __m256i, c: f32) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { f256!(_mm256_min_ps, self.f(c), x) }
        }
        /// `vmaxps c, x` is `c > x ? c : x`, the default's `x < c ? c : x`.
        #[inline(always)]
        fn maxc(&mut self, x: __m256i, c: f32) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { f256!(_mm256_max_ps, self.f(c), x) }
        }
        #[inline(always)]
        fn f(&mut self, c: f32) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_set1_epi32(c.to_bits() as i32) }
        }
        #[inline(always)]
        fn i(&mut self, c: i32) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_set1_epi32(c) }
        }
        #[inline(always)]
        fn add(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { f256!(_mm256_add_ps, a, b) }
        }
        #[inline(always)]
        fn sub(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { f256!(_mm256_sub_ps, a, b) }
        }
        #[inline(always)]
        fn mul(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { f256!(_mm256_mul_ps, a, b) }
        }
        #[inline(always)]
        fn div(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { f256!(_mm256_div_ps, a, b) }
        }
        #[inline(always)]
        fn mul_add(&mut self, a: __m256i, b: __m256i, c: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe {
                _mm256_castps_si256(_mm256_fmadd_ps(
                    _mm256_castsi256_ps(a),
                    _mm256_castsi256_ps(b),
                    _mm256_castsi256_ps(c),
                ))
            }
        }
        #[inline(always)]
        fn abs(&mut self, a: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_and_si256(a, _mm256_set1_epi32(0x7fff_ffff)) }
        }
        #[inline(always)]
        fn neg(&mut self, a: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_xor_si256(a, _mm256_set1_epi32(i32::MIN)) }
        }
        #[inline(always)]
        fn bits(&mut self, x: __m256i) -> __m256i {
            x
        }
        #[inline(always)]
        fn float(&mut self, i: __m256i) -> __m256i {
            i
        }
        #[inline(always)]
        fn iadd(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_add_epi32(a, b) }
        }
        #[inline(always)]
        fn isub(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_sub_epi32(a, b) }
        }
        #[inline(always)]
        fn band(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_and_si256(a, b) }
        }
        #[inline(always)]
        fn bor(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_or_si256(a, b) }
        }
        #[inline(always)]
        fn bxor(&mut self, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_xor_si256(a, b) }
        }
        #[inline(always)]
        fn shl(&mut self, a: __m256i, n: i64) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_sllv_epi32(a, _mm256_set1_epi32(n as i32)) }
        }
        #[inline(always)]
        fn ushr(&mut self, a: __m256i, n: i64) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_srlv_epi32(a, _mm256_set1_epi32(n as i32)) }
        }
        #[inline(always)]
        fn sshr(&mut self, a: __m256i, n: i64) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_srav_epi32(a, _mm256_set1_epi32(n as i32)) }
        }
        #[inline(always)]
        fn i2f(&mut self, i: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_castps_si256(_mm256_cvtepi32_ps(i)) }
        }
        #[inline(always)]
        fn fcmp(&mut self, cc: FloatCmp, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe {
                let (a, b) = (_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
                _mm256_castps_si256(match cc {
                    FloatCmp::Equal => _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b),
                    FloatCmp::NotEqual => _mm256_cmp_ps::<_CMP_NEQ_UQ>(a, b),
                    FloatCmp::LessThan => _mm256_cmp_ps::<_CMP_LT_OQ>(a, b),
                    FloatCmp::LessThanOrEqual => _mm256_cmp_ps::<_CMP_LE_OQ>(a, b),
                    FloatCmp::GreaterThan => _mm256_cmp_ps::<_CMP_GT_OQ>(a, b),
                    FloatCmp::GreaterThanOrEqual => _mm256_cmp_ps::<_CMP_GE_OQ>(a, b),
                    FloatCmp::Unordered => _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b),
                    FloatCmp::Ordered => _mm256_cmp_ps::<_CMP_ORD_Q>(a, b),
                })
            }
        }
        #[inline(always)]
        fn icmp(&mut self, cc: IntCmp, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe {
                let ones = _mm256_set1_epi32(-1);
                match cc {
                    IntCmp::Equal => _mm256_cmpeq_epi32(a, b),
                    IntCmp::NotEqual => _mm256_xor_si256(_mm256_cmpeq_epi32(a, b), ones),
                    IntCmp::SignedLessThan => _mm256_cmpgt_epi32(b, a),
                    IntCmp::SignedLessThanOrEqual => {
                        _mm256_xor_si256(_mm256_cmpgt_epi32(a, b), ones)
                    }
                    IntCmp::SignedGreaterThan => _mm256_cmpgt_epi32(a, b),
                    IntCmp::SignedGreaterThanOrEqual => {
                        _mm256_xor_si256(_mm256_cmpgt_epi32(b, a), ones)
                    }
                }
            }
        }
        /// Two `vpermps` (each picks by the index's low 3 bits from one half of the table),
        /// blended by bit 3.
        #[inline(always)]
        fn lookup(&mut self, table: &'static [f32; 16], idx: __m256i) -> __m256i {
            // SAFETY: `table` holds 16 readable f32s, two halves of 8.
            unsafe {
                let low = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table.as_ptr()), idx);
                let high = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table.as_ptr().add(8)), idx);
                let upper = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx));
                _mm256_castps_si256(_mm256_blendv_ps(low, high, upper))
            }
        }
        #[inline(always)]
        fn sel(&mut self, m: __m256i, t: __m256i, f: __m256i) -> __m256i {
            // `m ? t : f` for masks of all ones / all zeros lanes (what the compares give, and
            // what the AVX-512 form assumes too), as one blend under the mask's sign bits: one
            // operation where the bitwise `and`, `andnot`, `or` took three. `erf` selects four
            // times per register.
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe {
                _mm256_castps_si256(_mm256_blendv_ps(
                    _mm256_castsi256_ps(f),
                    _mm256_castsi256_ps(t),
                    _mm256_castsi256_ps(m),
                ))
            }
        }
    }

    impl Wide for Avx2 {
        const WIDTH: usize = 8;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256i {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_castps_si256(_mm256_loadu_ps(p)) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256i) {
            // SAFETY: an `Avx2` exists only on a CPU with AVX2 and FMA (`Avx2::new`).
            unsafe { _mm256_storeu_ps(p, _mm256_castsi256_ps(v)) }
        }
        #[inline(always)]
        unsafe fn stream(p: *mut f32, v: __m256i) {
            // SAFETY: as `store`; the caller aligned `p` to 32 bytes.
            unsafe { _mm256_stream_ps(p, _mm256_castsi256_ps(v)) }
        }
        #[inline(always)]
        unsafe fn fence() {
            // SAFETY: SSE is part of x86-64.
            unsafe { _mm_sfence() }
        }
    }
}

/// Methods of [`Twice`] that apply the inner method to each half of their vector operands.
macro_rules! twice_methods {
    ($($name:ident($($arg:ident),*);)*) => {
        $(
            #[inline(always)]
            fn $name(&mut self, $($arg: Self::V),*) -> Self::V {
                [self.0.$name($($arg[0]),*), self.0.$name($($arg[1]),*)]
            }
        )*
    };
}

/// Two registers at once: every operation is applied to both, one after the other, so that
/// the instruction stream interleaves two independent chains. One register's chain (some 40
/// dependent operations for `erf`, with 4-cycle FMAs) is longer than the CPU's scheduler can
/// look past, so a routine over single registers ran at its latency, not its throughput.
/// The operations per lane are unchanged, and so are the results.
struct Twice<L>(L);

impl<L: Lanes> Lanes for Twice<L> {
    type V = [L::V; 2];
    #[inline(always)]
    fn f(&mut self, c: f32) -> Self::V {
        let v = self.0.f(c);
        [v, v]
    }
    #[inline(always)]
    fn i(&mut self, c: i32) -> Self::V {
        let v = self.0.i(c);
        [v, v]
    }
    twice_methods! {
        add(a, b); sub(a, b); mul(a, b); div(a, b); mul_add(a, b, c); abs(a); neg(a); bits(a);
        float(a); iadd(a, b); isub(a, b); band(a, b); bor(a, b); bxor(a, b); i2f(a);
        sel(m, t, f);
    }
    #[inline(always)]
    fn lookup(&mut self, table: &'static [f32; 16], idx: Self::V) -> Self::V {
        [self.0.lookup(table, idx[0]), self.0.lookup(table, idx[1])]
    }
    #[inline(always)]
    fn shl(&mut self, a: Self::V, n: i64) -> Self::V {
        [self.0.shl(a[0], n), self.0.shl(a[1], n)]
    }
    #[inline(always)]
    fn ushr(&mut self, a: Self::V, n: i64) -> Self::V {
        [self.0.ushr(a[0], n), self.0.ushr(a[1], n)]
    }
    #[inline(always)]
    fn sshr(&mut self, a: Self::V, n: i64) -> Self::V {
        [self.0.sshr(a[0], n), self.0.sshr(a[1], n)]
    }
    #[inline(always)]
    fn fcmp(&mut self, cc: FloatCmp, a: Self::V, b: Self::V) -> Self::V {
        [self.0.fcmp(cc, a[0], b[0]), self.0.fcmp(cc, a[1], b[1])]
    }
    #[inline(always)]
    fn icmp(&mut self, cc: IntCmp, a: Self::V, b: Self::V) -> Self::V {
        [self.0.icmp(cc, a[0], b[0]), self.0.icmp(cc, a[1], b[1])]
    }
    // The methods an instruction set may override (one instruction where the default takes
    // several) go to its own.
    #[inline(always)]
    fn minc(&mut self, x: Self::V, c: f32) -> Self::V {
        [self.0.minc(x[0], c), self.0.minc(x[1], c)]
    }
    #[inline(always)]
    fn maxc(&mut self, x: Self::V, c: f32) -> Self::V {
        [self.0.maxc(x[0], c), self.0.maxc(x[1], c)]
    }
    #[inline(always)]
    fn scale_pow2(&mut self, p: Self::V, n: Self::V, n_i: Self::V) -> Self::V {
        [
            self.0.scale_pow2(p[0], n[0], n_i[0]),
            self.0.scale_pow2(p[1], n[1], n_i[1]),
        ]
    }
}

impl<L: Wide> Wide for Twice<L> {
    const WIDTH: usize = 2 * L::WIDTH;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: `p` points to `2 * L::WIDTH` readable f32s (this method's contract).
        unsafe { [L::load(p), L::load(p.add(L::WIDTH))] }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: `p` points to `2 * L::WIDTH` writable f32s (this method's contract).
        unsafe {
            L::store(p, v[0]);
            L::store(p.add(L::WIDTH), v[1]);
        }
    }
    #[inline(always)]
    unsafe fn stream(p: *mut f32, v: Self::V) {
        // SAFETY: as `store`; `p` is aligned to twice `L`'s register, so `p + L::WIDTH` is to one.
        unsafe {
            L::stream(p, v[0]);
            L::stream(p.add(L::WIDTH), v[1]);
        }
    }
    #[inline(always)]
    unsafe fn fence() {
        // SAFETY: the caller's contract.
        unsafe { L::fence() }
    }
}

/// `f` on one register.
#[inline(always)]
fn apply<L: Wide>(e: &mut L, f: MathFn, x: L::V) -> L::V {
    super::apply(e, f, x)
}

/// `dst = f(src)` a register at a time; the last partial register is padded with zeros.
///
/// # Safety
/// The CPU has `L`'s instruction set; `src` points to `n` readable f32s and `dst` to `n`
/// writable ones, the same ones or others that do not overlap them.
#[inline(always)]
unsafe fn run<L: Wide>(e: L, f: MathFn, src: *const f32, dst: *mut f32, n: usize) {
    // Two registers at a time, then the last whole register and the padded tail one at a time.
    let pairs = n / (2 * L::WIDTH) * (2 * L::WIDTH);
    let mut twice = Twice(e);
    for i in (0..pairs).step_by(2 * L::WIDTH) {
        // SAFETY: `i + 2 * L::WIDTH <= n`; each register is read before it is written, so an
        // in-place call reads every value before it is replaced.
        unsafe {
            let x = Twice::<L>::load(src.add(i));
            let y = apply(&mut twice, f, x);
            Twice::<L>::store(dst.add(i), y);
        }
    }
    // SAFETY: the caller's contract, for the rest of the range.
    unsafe { run_single(twice.0, f, src.add(pairs), dst.add(pairs), n - pairs) }
}

/// `dst = f(src)` one register at a time; the last partial register is padded with zeros.
///
/// # Safety
/// As for [`run`].
#[inline(always)]
unsafe fn run_single<L: Wide>(mut e: L, f: MathFn, src: *const f32, dst: *mut f32, n: usize) {
    let whole = n / L::WIDTH * L::WIDTH;
    for i in (0..whole).step_by(L::WIDTH) {
        // SAFETY: `i + L::WIDTH <= n`.
        unsafe {
            let x = L::load(src.add(i));
            let y = apply(&mut e, f, x);
            L::store(dst.add(i), y);
        }
    }
    let rest = n - whole;
    if rest > 0 {
        let mut padded = [0f32; 16];
        // SAFETY: `rest < L::WIDTH <= 16` values from `whole` on are inside both ranges, and
        // `padded` holds 16 >= `L::WIDTH` f32s.
        unsafe {
            std::ptr::copy(src.add(whole), padded.as_mut_ptr(), rest);
            let x = L::load(padded.as_ptr());
            let y = apply(&mut e, f, x);
            L::store(padded.as_mut_ptr(), y);
            std::ptr::copy(padded.as_ptr(), dst.add(whole), rest);
        }
    }
}

/// One `extern "C"` routine per function and instruction set.
macro_rules! routines {
    ($($name:ident => $f:expr, $isa:ident, $feature:literal;)*) => {
        $(
            /// # Safety
            /// `src` points to `n` initialized f32s and `dst` to `n` writable ones, the same
            /// or not overlapping them (any `n <= 0` does nothing), and the CPU has the enabled
            /// target features (checked by [`block_isa`]).
            #[target_feature(enable = $feature)]
            unsafe extern "C" fn $name(src: *const f32, dst: *mut f32, n: i64) {
                if n <= 0 {
                    return;
                }
                // SAFETY: the caller's contract above.
                unsafe { run(x86::$isa::new(), $f, src, dst, n as usize) }
            }
        )*
    };
}

#[cfg(target_arch = "x86_64")]
routines! {
    exp_avx512 => MathFn::Exp, Avx512, "avx512f,avx512dq,fma";
    log_avx512 => MathFn::Log, Avx512, "avx512f,avx512dq,fma";
    tanh_avx512 => MathFn::Tanh, Avx512, "avx512f,avx512dq,fma";
    erf_avx512 => MathFn::Erf, Avx512, "avx512f,avx512dq,fma";
    sin_avx512 => MathFn::Sin, Avx512, "avx512f,avx512dq,fma";
    cos_avx512 => MathFn::Cos, Avx512, "avx512f,avx512dq,fma";
    sigmoid_avx512 => MathFn::Sigmoid, Avx512, "avx512f,avx512dq,fma";
    gelu_avx512 => MathFn::Gelu, Avx512, "avx512f,avx512dq,fma";
    silu_avx512 => MathFn::Silu, Avx512, "avx512f,avx512dq,fma";
    exp_avx2 => MathFn::Exp, Avx2, "avx2,fma";
    log_avx2 => MathFn::Log, Avx2, "avx2,fma";
    tanh_avx2 => MathFn::Tanh, Avx2, "avx2,fma";
    erf_avx2 => MathFn::Erf, Avx2, "avx2,fma";
    sin_avx2 => MathFn::Sin, Avx2, "avx2,fma";
    cos_avx2 => MathFn::Cos, Avx2, "avx2,fma";
    sigmoid_avx2 => MathFn::Sigmoid, Avx2, "avx2,fma";
    gelu_avx2 => MathFn::Gelu, Avx2, "avx2,fma";
    silu_avx2 => MathFn::Silu, Avx2, "avx2,fma";
}

/// Which instruction set the block routines use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockIsa {
    Avx512,
    Avx2,
}

/// The best instruction set this CPU offers the routines, or `None` (no routines: kernels
/// compute inline). For comparisons, `MINDUCTOR_MATH_BLOCKS=0` turns them off and
/// `MINDUCTOR_MATH_BLOCKS=avx2` keeps them at 256 bits on an AVX-512 CPU.
pub fn block_isa() -> Option<BlockIsa> {
    static ISA: std::sync::OnceLock<Option<BlockIsa>> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("MINDUCTOR_MATH_BLOCKS").is_ok_and(|v| v == "0") {
            return None;
        }
        if std::env::var("MINDUCTOR_MATH_BLOCKS").is_ok_and(|v| v == "avx2") {
            return detect().map(|_| BlockIsa::Avx2);
        }
        detect()
    })
}

/// Whether this CPU executes 512-bit vector operations as two 256-bit halves: AMD's Zen 4
/// (family 0x19 with AVX-512), whose 512-bit FMA rate is its 256-bit rate (the probe measures
/// 116 GFLOP/s at both on the development VM). On such a core a 512-bit routine gains nothing
/// over a narrower loop where the work is memory-bound, and one shape measured slower (see
/// `lower/rows.rs`). Read from CPUID at run time.
pub fn splits_512_bit_operations() -> bool {
    static SPLITS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SPLITS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid;
            // CPUID leaves 0 and 1 exist on every x86-64 CPU.
            let (vendor, signature) = (__cpuid(0), __cpuid(1).eax);
            let amd =
                (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
            // The family: the base field, plus the extended one when the base is 0xf.
            let base = (signature >> 8) & 0xf;
            let family = if base == 0xf {
                base + ((signature >> 20) & 0xff)
            } else {
                base
            };
            amd && family == 0x19 && std::arch::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Option<BlockIsa> {
    use std::arch::is_x86_feature_detected as has;
    if has!("avx512f") && has!("avx512dq") && has!("fma") {
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
        (BlockIsa::Avx512, MathFn::Gelu) => gelu_avx512,
        (BlockIsa::Avx512, MathFn::Silu) => silu_avx512,
        (BlockIsa::Avx2, MathFn::Exp) => exp_avx2,
        (BlockIsa::Avx2, MathFn::Log) => log_avx2,
        (BlockIsa::Avx2, MathFn::Tanh) => tanh_avx2,
        (BlockIsa::Avx2, MathFn::Erf) => erf_avx2,
        (BlockIsa::Avx2, MathFn::Sin) => sin_avx2,
        (BlockIsa::Avx2, MathFn::Cos) => cos_avx2,
        (BlockIsa::Avx2, MathFn::Sigmoid) => sigmoid_avx2,
        (BlockIsa::Avx2, MathFn::Gelu) => gelu_avx2,
        (BlockIsa::Avx2, MathFn::Silu) => silu_avx2,
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

/// Panics unless this CPU supports `isa`'s routines.
fn assert_supported(isa: BlockIsa) {
    let supported = match isa {
        BlockIsa::Avx512 => detect() == Some(BlockIsa::Avx512),
        BlockIsa::Avx2 => detect().is_some(),
    };
    assert!(supported, "{isa:?} routines need a CPU that has {isa:?}");
}

/// `data = f(data)` with the routine for `isa` (which must be supported: see [`block_isa`]),
/// for tests and benchmarks.
pub fn apply_block(f: MathFn, isa: BlockIsa, data: &mut [f32]) {
    assert_supported(isa);
    let p = data.as_mut_ptr();
    // SAFETY: `data` is a valid mutable slice of `data.len()` f32s (in place), and the CPU
    // supports `isa` (asserted above).
    unsafe { routine(f, isa)(p, p, data.len() as i64) }
}

/// `dst = f(src)` with the routine for `isa` (which must be supported), out of place, for
/// tests. Panics if the lengths differ.
pub fn apply_block_to(f: MathFn, isa: BlockIsa, src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "apply_block_to: lengths differ");
    assert_supported(isa);
    // SAFETY: `src` and `dst` are valid slices of the same length; a shared and a mutable
    // borrow never overlap; the CPU supports `isa` (asserted above).
    unsafe { routine(f, isa)(src.as_ptr(), dst.as_mut_ptr(), src.len() as i64) }
}
