//! The AVX-512 micro-kernel: a 6 × 64 tile of `c` in 24 zmm accumulators. Each step of `k`
//! loads 4 vectors of the `b` panel, broadcasts 6 values of the `a` panel and issues 24
//! independent FMAs (Zen 5 runs 2 per cycle at 4 cycles' latency, so 8 in flight suffice).
//! Tails: fewer rows run the same code instantiated for that many rows (no wasted FMAs);
//! fewer columns store through a lane mask.

use super::TileArgs;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

pub(super) const MR: usize = 6;
pub(super) const NR: usize = 64;

/// See [`super::Kernel::tile`].
///
/// # Safety
/// The CPU supports AVX-512F, and `args` satisfies [`TileArgs`]' invariants for `MR` and `NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile(args: &TileArgs) {
    // SAFETY: forwarded from the caller; `rows` selects the instance reading that many rows.
    unsafe {
        match args.rows {
            6 => tile_rows::<6>(args),
            5 => tile_rows::<5>(args),
            4 => tile_rows::<4>(args),
            3 => tile_rows::<3>(args),
            2 => tile_rows::<2>(args),
            1 => tile_rows::<1>(args),
            rows => unreachable!("an AVX-512 tile of {rows} rows"),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn tile(_: &TileArgs) {
    unreachable!("the AVX-512 kernel is never selected off x86-64")
}

/// The tile for `ROWS ≤ MR` rows.
///
/// # Safety
/// As [`tile`], with `args.rows == ROWS`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile_rows<const ROWS: usize>(args: &TileArgs) {
    let mut acc = [[_mm512_setzero_ps(); 4]; ROWS];
    let (mut a, mut b) = (args.a, args.b);
    for _ in 0..args.kc {
        // SAFETY: `a` and `b` walk the panels one step of `k` at a time, `kc` steps in all:
        // `b` reads values `p·NR .. p·NR + 64` and `a` values `p·MR .. p·MR + ROWS` of panels
        // holding `kc·NR` and `kc·MR` values.
        unsafe {
            let b0 = _mm512_loadu_ps(b);
            let b1 = _mm512_loadu_ps(b.add(16));
            let b2 = _mm512_loadu_ps(b.add(32));
            let b3 = _mm512_loadu_ps(b.add(48));
            for (i, row) in acc.iter_mut().enumerate() {
                let value = _mm512_set1_ps(*a.add(i));
                row[0] = _mm512_fmadd_ps(value, b0, row[0]);
                row[1] = _mm512_fmadd_ps(value, b1, row[1]);
                row[2] = _mm512_fmadd_ps(value, b2, row[2]);
                row[3] = _mm512_fmadd_ps(value, b3, row[3]);
            }
            a = a.add(MR);
            b = b.add(NR);
        }
    }
    for (v, column) in (0..NR).step_by(16).enumerate() {
        if column >= args.cols {
            break;
        }
        let lanes = (args.cols - column).min(16);
        let mask: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
        for (i, row) in acc.iter().enumerate() {
            // SAFETY: row `i < rows`, lanes `column .. column + lanes ≤ cols` of `c`: inside
            // the tile the caller gave this call (masked lanes are neither read nor written).
            unsafe {
                let at = args.c.add(i * args.ldc + column);
                let value = if args.accumulate {
                    _mm512_add_ps(row[v], _mm512_maskz_loadu_ps(mask, at))
                } else {
                    row[v]
                };
                _mm512_mask_storeu_ps(at, mask, value);
            }
        }
    }
}

/// Packs one panel of a `b` whose columns are contiguous (a transposed operand): row `p` of the
/// panel (`NR` values) is 4 gathers of 16 values, one from each of 16 columns, at element
/// `start + j · column_stride + p` of `data` for column `j` of the panel; columns `width..NR`
/// are zeros.
///
/// # Safety
/// The CPU supports AVX-512F; `panel.len() == k · NR`; `width ≤ NR`; `15 · column_stride` fits
/// in an `i32`; and `start + j · column_stride + p < data.len()` for every `j < width`, `p < k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_columns(
    data: &[f32],
    start: usize,
    column_stride: usize,
    k: usize,
    width: usize,
    panel: &mut [f32],
) {
    debug_assert!(panel.len() == k * NR && width <= NR);
    let stride = column_stride as i32;
    let offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(stride),
    );
    for v in 0..NR / 16 {
        let lanes = width.saturating_sub(16 * v).min(16);
        let mask: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
        if lanes == 0 {
            for p in 0..k {
                panel[p * NR + 16 * v..][..16].fill(0.0);
            }
            continue;
        }
        let column = start + 16 * v * column_stride;
        for p in 0..k {
            // SAFETY: lane `j < lanes` reads element `column + j·column_stride + p`, inside
            // `data` by the caller's guarantee (masked lanes read nothing); the offsets fit in
            // i32 (`15·column_stride` does). The store writes values `p·NR + 16v .. + 16` of
            // `panel`, which holds `k·NR`.
            unsafe {
                let base = data.as_ptr().add(column + p);
                let value = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, offsets, base);
                _mm512_storeu_ps(panel.as_mut_ptr().add(p * NR + 16 * v), value);
            }
        }
    }
}
