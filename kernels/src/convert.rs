//! Half-precision conversions a block at a time: `n` f16 or bf16 elements widened to f32, or `n`
//! f32s narrowed to f16 or bf16, by ahead-of-time routines at the CPU's full vector width.
//!
//! **Why.** A compiled kernel computes in f32; a stage that loads or stores f16 or bf16 converts
//! every element. Cranelift has no F16C instructions, so the code generator converts with
//! integer operations on 4 lanes (`codegen_cpu/src/convert.rs`): about 15 for an f16 load and 25
//! for a store. `x * 2` on a 2048 × 2048 f16 tensor took 4.0 ms that way, against 0.7 ms in f32
//! and 0.36–0.46 ms in PyTorch (1 thread, Zen 4). The code generator instead converts a block
//! of a stage's loop at a time with these routines (one call per block before the stage's body,
//! or after it for a store; see `lower/blocks.rs`), and the body reads and writes f32 blocks.
//!
//! **Same bits as the inline form.** The routines give exactly the inline conversions' results,
//! NaNs included, so a kernel's result does not depend on which converted it: f16 with the
//! hardware's conversions (F16C's `vcvtph2ps` and `vcvtps2ph` rounding to nearest-even, which
//! make a NaN quiet and keep the top of its payload, as the inline form does), bf16 with the
//! inline form's integer steps (a shift to widen; to narrow, round to nearest-even on the bits
//! and quiet a NaN keeping its top bits), or where the CPU has AVX512_BF16 its conversion
//! instruction, which gives those bits for every input but a subnormal one. The test
//! `conversions_match_the_definitions` checks every f16 and bf16 and a sweep of f32s against a
//! scalar statement of those rules.

/// A conversion routine: `n` elements at `src` to `n` elements at `dst` (halves are 2 bytes,
/// f32s 4).
///
/// # Safety
/// `src` holds `n` readable elements of the source type and `dst` `n` writable ones of the
/// destination type, not overlapping.
pub type ConvertFn = unsafe extern "C" fn(src: *const u8, dst: *mut u8, n: i64);

/// The 16-bit float formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    F16,
    Bf16,
}

/// The vector forms: 512-bit (AVX-512F) or 256-bit (AVX2 and F16C). `Avx512Bf16` is the
/// 512-bit form with AVX512_BF16's conversion to bf16 (`vcvtne2ps2bf16`: 32 lanes rounded to
/// nearest-even in one instruction, where the integer steps take about ten and a two-uop
/// pack per 16): it treats subnormal inputs as zero, so a group holding one takes the integer
/// steps, and the bits stay the inline form's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    Avx512,
    Avx512Bf16,
    Avx2,
}

/// The form this CPU runs: the block routines' instruction set (`math::block::block_isa`, so
/// that `MINDUCTOR_MATH_BLOCKS` turns these off and narrows them too), with F16C for AVX2.
fn isa() -> Option<Isa> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::math::block::{block_isa, BlockIsa};
        use std::arch::is_x86_feature_detected as has;
        match block_isa() {
            Some(BlockIsa::Avx512) if has!("avx512bf16") && has!("avx512dq") => {
                return Some(Isa::Avx512Bf16)
            }
            Some(BlockIsa::Avx512) => return Some(Isa::Avx512),
            Some(BlockIsa::Avx2) if std::arch::is_x86_feature_detected!("f16c") => {
                return Some(Isa::Avx2)
            }
            _ => {}
        }
    }
    None
}

/// The routine widening `half` to f32 on this CPU, or `None` (no vector form: the code
/// generator converts inline).
pub fn widen_routine(half: Half) -> Option<ConvertFn> {
    isa().map(|isa| widen_form(half, isa))
}

/// The routine narrowing f32 to `half` on this CPU, or `None`.
pub fn narrow_routine(half: Half) -> Option<ConvertFn> {
    isa().map(|isa| narrow_form(half, isa))
}

/// The routine rounding f32s to `half`'s values (narrowed and widened back, as the inline
/// form's cast does) on this CPU, or `None`. It has the math block routines' signature: the
/// code generator computes an f16 or bf16 cast in a chain of f32 operations (each of PyTorch's
/// half-precision operations rounds its result) a block at a time with it.
pub fn round_routine(half: Half) -> Option<crate::math::block::BlockFn> {
    isa().map(|isa| round_form(half, isa))
}

fn widen_form(half: Half, isa: Isa) -> ConvertFn {
    #[cfg(target_arch = "x86_64")]
    {
        match (half, isa) {
            (Half::F16, Isa::Avx512 | Isa::Avx512Bf16) => x86::f16_to_f32_avx512_entry,
            (Half::Bf16, Isa::Avx512 | Isa::Avx512Bf16) => x86::bf16_to_f32_avx512_entry,
            (Half::F16, Isa::Avx2) => x86::f16_to_f32_avx2_entry,
            (Half::Bf16, Isa::Avx2) => x86::bf16_to_f32_avx2_entry,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (half, isa);
        unreachable!("no vector forms off x86-64")
    }
}

fn narrow_form(half: Half, isa: Isa) -> ConvertFn {
    #[cfg(target_arch = "x86_64")]
    {
        match (half, isa) {
            (Half::F16, Isa::Avx512 | Isa::Avx512Bf16) => x86::f32_to_f16_avx512_entry,
            (Half::Bf16, Isa::Avx512) => x86::f32_to_bf16_avx512_entry,
            (Half::Bf16, Isa::Avx512Bf16) => x86::f32_to_bf16_avx512bf16_entry,
            (Half::F16, Isa::Avx2) => x86::f32_to_f16_avx2_entry,
            (Half::Bf16, Isa::Avx2) => x86::f32_to_bf16_avx2_entry,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (half, isa);
        unreachable!("no vector forms off x86-64")
    }
}

fn round_form(half: Half, isa: Isa) -> crate::math::block::BlockFn {
    #[cfg(target_arch = "x86_64")]
    {
        match (half, isa) {
            (Half::F16, Isa::Avx512 | Isa::Avx512Bf16) => x86::round_f16_avx512_entry,
            (Half::Bf16, Isa::Avx512) => x86::round_bf16_avx512_entry,
            (Half::Bf16, Isa::Avx512Bf16) => x86::round_bf16_avx512bf16_entry,
            (Half::F16, Isa::Avx2) => x86::round_f16_avx2_entry,
            (Half::Bf16, Isa::Avx2) => x86::round_bf16_avx2_entry,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (half, isa);
        unreachable!("no vector forms off x86-64")
    }
}

/// Every form this CPU can run, by name, as `(name, half, widen, narrow, round)` (for tests).
#[allow(clippy::type_complexity)]
pub fn convert_forms() -> Vec<(
    &'static str,
    Half,
    ConvertFn,
    ConvertFn,
    crate::math::block::BlockFn,
)> {
    let mut forms = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let mut isas = Vec::new();
        if has!("avx2") && has!("f16c") {
            isas.push(("avx2", Isa::Avx2));
        }
        if has!("avx512f") {
            isas.push(("avx512", Isa::Avx512));
        }
        if has!("avx512f") && has!("avx512dq") && has!("avx512bf16") {
            isas.push(("avx512bf16", Isa::Avx512Bf16));
        }
        for (name, isa) in isas {
            for half in [Half::F16, Half::Bf16] {
                let (widen, narrow) = (widen_form(half, isa), narrow_form(half, isa));
                forms.push((name, half, widen, narrow, round_form(half, isa)));
            }
        }
    }
    forms
}

/// Runs `body(src, dst)` on each whole group of `L` elements of a conversion from `S` to `D`
/// elements, then on the last partial group through zero-padded local copies (the vector forms
/// read and write whole groups only).
///
/// # Safety
/// As [`ConvertFn`] for `S` and `D` elements; `body` reads `L` elements at its source pointer
/// and writes `L` at its destination.
#[inline(always)]
unsafe fn groups<S: Copy + Default, D: Copy + Default, const L: usize>(
    src: *const u8,
    dst: *mut u8,
    n: i64,
    mut body: impl FnMut(*const S, *mut D),
) {
    let n = n.max(0) as usize;
    let (src, dst) = (src as *const S, dst as *mut D);
    let whole = n - n % L;
    let mut i = 0;
    while i < whole {
        // SAFETY: elements `i..i + L` are inside both arrays (`i + L <= n`).
        unsafe { body(src.add(i), dst.add(i)) };
        i += L;
    }
    if whole < n {
        let (mut s, mut d) = ([S::default(); L], [D::default(); L]);
        // SAFETY: elements `whole..n` are inside both arrays; the local copies hold `L`.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(whole), s.as_mut_ptr(), n - whole);
            body(s.as_ptr(), d.as_mut_ptr());
            std::ptr::copy_nonoverlapping(d.as_ptr(), dst.add(whole), n - whole);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::groups;
    use std::arch::x86_64::*;

    /// Rounding to nearest-even (the `vcvtps2ph` immediate; floating-point exceptions are
    /// masked).
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT;

    /// bf16 bits of 16 f32 lanes `x` (upper 16 bits zero), as the inline form: round to
    /// nearest-even on the bits; a NaN keeps its top bits, made quiet.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn bf16_bits512(x: __m512i) -> __m512i {
        let hi = _mm512_srli_epi32::<16>(x);
        let odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        let r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd);
        let r = _mm512_srli_epi32::<16>(r);
        let nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x0040));
        let u = _mm512_and_si512(x, _mm512_set1_epi32(0x7fff_ffff));
        let is_nan = _mm512_cmpgt_epi32_mask(u, _mm512_set1_epi32(0x7f80_0000));
        _mm512_mask_blend_epi32(is_nan, r, nan)
    }

    /// [`bf16_bits512`] on 8 lanes.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn bf16_bits256(x: __m256i) -> __m256i {
        let hi = _mm256_srli_epi32::<16>(x);
        let odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
        let r = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd);
        let r = _mm256_srli_epi32::<16>(r);
        let nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
        let u = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff_ffff));
        let is_nan = _mm256_cmpgt_epi32(u, _mm256_set1_epi32(0x7f80_0000));
        _mm256_blendv_epi8(r, nan, is_nan)
    }

    macro_rules! entry {
        ($name:ident, $inner:ident) => {
            /// # Safety
            /// As [`super::ConvertFn`]; the CPU has the form's instruction set (the selection
            /// and `convert_forms` hand it out only then).
            pub(crate) unsafe extern "C" fn $name(src: *const u8, dst: *mut u8, n: i64) {
                // SAFETY: the CPU contract and the caller's bounds.
                unsafe { $inner(src, dst, n) }
            }
        };
    }

    entry!(f16_to_f32_avx512_entry, f16_to_f32_avx512);
    entry!(bf16_to_f32_avx512_entry, bf16_to_f32_avx512);
    entry!(f32_to_f16_avx512_entry, f32_to_f16_avx512);
    entry!(f32_to_bf16_avx512_entry, f32_to_bf16_avx512);
    entry!(f32_to_bf16_avx512bf16_entry, f32_to_bf16_avx512bf16);
    entry!(f16_to_f32_avx2_entry, f16_to_f32_avx2);
    entry!(bf16_to_f32_avx2_entry, bf16_to_f32_avx2);
    entry!(f32_to_f16_avx2_entry, f32_to_f16_avx2);
    entry!(f32_to_bf16_avx2_entry, f32_to_bf16_avx2);

    macro_rules! round_entry {
        ($name:ident, $inner:ident) => {
            /// # Safety
            /// As [`crate::math::block::BlockFn`]; the CPU has the form's instruction set (the
            /// selection and the tests hand it out only then).
            pub(crate) unsafe extern "C" fn $name(src: *const f32, dst: *mut f32, n: i64) {
                // SAFETY: the CPU contract and the caller's bounds.
                unsafe { $inner(src.cast(), dst.cast(), n) }
            }
        };
    }

    round_entry!(round_f16_avx512_entry, round_f16_avx512);
    round_entry!(round_bf16_avx512_entry, round_bf16_avx512);
    round_entry!(round_bf16_avx512bf16_entry, round_bf16_avx512bf16);
    round_entry!(round_f16_avx2_entry, round_f16_avx2);
    round_entry!(round_bf16_avx2_entry, round_bf16_avx2);

    #[target_feature(enable = "avx512f")]
    unsafe fn round_f16_avx512(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<f32, f32, 16>(src, dst, n, |s, d| {
                let h = _mm512_cvtps_ph::<NEAREST>(_mm512_loadu_ps(s));
                _mm512_storeu_ps(d, _mm512_cvtph_ps(h));
            })
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn round_bf16_avx512(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<f32, f32, 16>(src, dst, n, |s, d| {
                let bits = bf16_bits512(_mm512_loadu_si512(s as *const __m512i));
                _mm512_storeu_si512(d as *mut __m512i, _mm512_slli_epi32::<16>(bits));
            })
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    unsafe fn round_f16_avx2(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<f32, f32, 8>(src, dst, n, |s, d| {
                let h = _mm256_cvtps_ph::<NEAREST>(_mm256_loadu_ps(s));
                _mm256_storeu_ps(d, _mm256_cvtph_ps(h));
            })
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn round_bf16_avx2(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<f32, f32, 8>(src, dst, n, |s, d| {
                let bits = bf16_bits256(_mm256_loadu_si256(s as *const __m256i));
                _mm256_storeu_si256(d as *mut __m256i, _mm256_slli_epi32::<16>(bits));
            })
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn f16_to_f32_avx512(src: *const u8, dst: *mut u8, n: i64) {
        // SAFETY (all the bodies below): `groups` hands each body 16 readable and 16 writable
        // elements.
        unsafe {
            groups::<u16, f32, 16>(src, dst, n, |s, d| {
                let h = _mm256_loadu_si256(s as *const __m256i);
                _mm512_storeu_ps(d, _mm512_cvtph_ps(h));
            })
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn bf16_to_f32_avx512(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<u16, f32, 16>(src, dst, n, |s, d| {
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(s as *const __m256i));
                _mm512_storeu_si512(d as *mut __m512i, _mm512_slli_epi32::<16>(h));
            })
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn f32_to_f16_avx512(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<f32, u16, 16>(src, dst, n, |s, d| {
                let h = _mm512_cvtps_ph::<NEAREST>(_mm512_loadu_ps(s));
                _mm256_storeu_si256(d as *mut __m256i, h);
            })
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn f32_to_bf16_avx512(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<f32, u16, 16>(src, dst, n, |s, d| {
                let bits = bf16_bits512(_mm512_loadu_si512(s as *const __m512i));
                _mm256_storeu_si256(d as *mut __m256i, _mm512_cvtepi32_epi16(bits));
            })
        }
    }

    /// Whether any of the 32 lanes of `x` and `y` is subnormal (`vcvtne2ps2bf16` would read
    /// it as zero).
    #[target_feature(enable = "avx512f,avx512dq")]
    #[inline]
    fn subnormal(x: __m512, y: __m512) -> bool {
        const SUBNORMAL: i32 = 0x20;
        _mm512_fpclass_ps_mask::<SUBNORMAL>(x) | _mm512_fpclass_ps_mask::<SUBNORMAL>(y) != 0
    }

    /// The 32 lanes of `x` (bf16 lanes 0..16) and `y` (16..32) rounded to bf16, one per
    /// 16-bit lane: by `vcvtne2ps2bf16`, or by the integer steps when a lane is subnormal.
    #[target_feature(enable = "avx512f,avx512dq,avx512bf16")]
    #[inline]
    fn narrow32(x: __m512, y: __m512) -> __m512i {
        if subnormal(x, y) {
            let half = |v: __m512| _mm512_cvtepi32_epi16(bf16_bits512(_mm512_castps_si512(v)));
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(half(x)), half(y))
        } else {
            // SAFETY: both types are 64 bytes of plain bits.
            unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(y, x)) }
        }
    }

    #[target_feature(enable = "avx512f,avx512dq,avx512bf16")]
    unsafe fn f32_to_bf16_avx512bf16(src: *const u8, dst: *mut u8, n: i64) {
        // SAFETY: the caller's bounds (`ConvertFn`); `groups` hands the body whole groups of
        // 32 readable f32s and 32 writable halves; the CPU has the enabled features.
        unsafe {
            groups::<f32, u16, 32>(src, dst, n, |s, d| {
                let h = narrow32(_mm512_loadu_ps(s), _mm512_loadu_ps(s.add(16)));
                _mm512_storeu_si512(d as *mut __m512i, h);
            })
        }
    }

    #[target_feature(enable = "avx512f,avx512dq,avx512bf16")]
    unsafe fn round_bf16_avx512bf16(src: *const u8, dst: *mut u8, n: i64) {
        // SAFETY: as `f32_to_bf16_avx512bf16`, with 32 writable f32s a group.
        unsafe {
            groups::<f32, f32, 32>(src, dst, n, |s, d| {
                let h = narrow32(_mm512_loadu_ps(s), _mm512_loadu_ps(s.add(16)));
                // bf16 lane `i` back to f32 lane `i`: its bits in the top half.
                let low = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(h));
                let high = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(h));
                _mm512_storeu_si512(d as *mut __m512i, _mm512_slli_epi32::<16>(low));
                _mm512_storeu_si512(d.add(16) as *mut __m512i, _mm512_slli_epi32::<16>(high));
            })
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_to_f32_avx2(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<u16, f32, 8>(src, dst, n, |s, d| {
                let h = _mm_loadu_si128(s as *const __m128i);
                _mm256_storeu_ps(d, _mm256_cvtph_ps(h));
            })
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn bf16_to_f32_avx2(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<u16, f32, 8>(src, dst, n, |s, d| {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(s as *const __m128i));
                _mm256_storeu_si256(d as *mut __m256i, _mm256_slli_epi32::<16>(h));
            })
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f32_to_f16_avx2(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<f32, u16, 8>(src, dst, n, |s, d| {
                let h = _mm256_cvtps_ph::<NEAREST>(_mm256_loadu_ps(s));
                _mm_storeu_si128(d as *mut __m128i, h);
            })
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn f32_to_bf16_avx2(src: *const u8, dst: *mut u8, n: i64) {
        unsafe {
            groups::<f32, u16, 8>(src, dst, n, |s, d| {
                let bits = bf16_bits256(_mm256_loadu_si256(s as *const __m256i));
                // Lanes hold at most 0xffff: the unsigned saturating pack keeps them.
                let (lo, hi) = (
                    _mm256_castsi256_si128(bits),
                    _mm256_extracti128_si256::<1>(bits),
                );
                _mm_storeu_si128(d as *mut __m128i, _mm_packus_epi32(lo, hi));
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// The inline form's f16 → f32: exact; a NaN made quiet, its payload kept.
    fn f16_to_f32(h: u16) -> u32 {
        let x = f16::from_bits(h);
        if x.is_nan() {
            ((h as u32 & 0x8000) << 16) | 0x7fc0_0000 | ((h as u32 & 0x03ff) << 13)
        } else {
            f32::from(x).to_bits()
        }
    }

    /// The inline form's f32 → f16: nearest-even; a NaN made quiet with its top payload bits.
    fn f32_to_f16(x: u32) -> u16 {
        let f = f32::from_bits(x);
        if f.is_nan() {
            (((x >> 16) & 0x8000) | 0x7e00 | ((x & 0x007f_ffff) >> 13)) as u16
        } else {
            f16::from_f32(f).to_bits()
        }
    }

    /// The inline form's f32 → bf16: nearest-even on the bits; a NaN keeps its top bits, quiet.
    fn f32_to_bf16(x: u32) -> u16 {
        let f = f32::from_bits(x);
        if f.is_nan() {
            ((x >> 16) | 0x0040) as u16
        } else {
            bf16::from_f32(f).to_bits()
        }
    }

    /// Runs `routine` on `src` (as bytes) into a fresh `D` array one longer, and checks the
    /// element past the end is untouched.
    fn run<S: Copy, D: Copy + Default + PartialEq + std::fmt::Debug>(
        routine: ConvertFn,
        src: &[S],
    ) -> Vec<D> {
        let mut dst = vec![D::default(); src.len() + 1];
        // SAFETY: `src` holds `len` elements and `dst` more; they do not overlap.
        unsafe {
            routine(
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                src.len() as i64,
            )
        };
        assert_eq!(dst[src.len()], D::default(), "wrote past the end");
        dst.truncate(src.len());
        dst
    }

    /// Every form against the inline form's rules: every f16 and bf16 widened, and f32s
    /// narrowed (every 251st bit pattern, both signs, with NaNs, infinities, subnormals and the
    /// rounding ties), at lengths that leave every partial group.
    #[test]
    fn conversions_match_the_definitions() {
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        let mut f32s: Vec<u32> = (0..=u32::MAX).step_by(251).collect();
        f32s.extend([
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0x7fc0_0000,
            0xffbf_ffff,
            0x0000_0001,
            0x477f_f000,
            0x477f_efff,
            0x3f80_1000,
            0x3f80_3000,
            0x3f80_8000,
            0x3f81_8000,
            0x3380_0000,
            0x3300_0001,
            0x387f_c000,
        ]);
        let forms = convert_forms();
        for (name, half, widen, narrow, round) in forms {
            for len in [halves.len(), 1, 15, 17, 0] {
                let got: Vec<u32> = run(widen, &halves[..len]);
                for (&h, &g) in halves.iter().zip(&got) {
                    let want = match half {
                        Half::F16 => f16_to_f32(h),
                        Half::Bf16 => (h as u32) << 16,
                    };
                    assert_eq!(g, want, "{name} {half:?}: widen {h:#06x}");
                }
            }
            for len in [f32s.len(), 3, 9, 16] {
                let got: Vec<u16> = run(narrow, &f32s[..len]);
                for (&x, &g) in f32s.iter().zip(&got) {
                    let want = match half {
                        Half::F16 => f32_to_f16(x),
                        Half::Bf16 => f32_to_bf16(x),
                    };
                    assert_eq!(g, want, "{name} {half:?}: narrow {x:#010x}");
                }
                let mut rounded = vec![0u32; len + 1];
                // SAFETY: `f32s` holds `len` elements and `rounded` more; no overlap.
                unsafe {
                    round(
                        f32s.as_ptr().cast(),
                        rounded.as_mut_ptr().cast(),
                        len as i64,
                    )
                };
                assert_eq!(rounded[len], 0, "{name} {half:?}: rounded past the end");
                for (&x, &g) in f32s.iter().zip(&rounded[..len]) {
                    let want = match half {
                        Half::F16 => f16_to_f32(f32_to_f16(x)),
                        Half::Bf16 => (f32_to_bf16(x) as u32) << 16,
                    };
                    assert_eq!(g, want, "{name} {half:?}: round {x:#010x}");
                }
            }
        }
    }
}
