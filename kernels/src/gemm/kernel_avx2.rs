//! The AVX2 + FMA micro-kernel: a 6 × 16 tile of `c` in 12 ymm accumulators (with 2 vectors of
//! `b` and one broadcast, 15 of the 16 registers). Fewer rows run the same code instantiated
//! for that many rows; fewer columns go through a tile on the stack.

use super::TileArgs;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

pub(super) const MR: usize = 6;
pub(super) const NR: usize = 16;

/// See [`super::Kernel::tile`].
///
/// # Safety
/// The CPU supports AVX2 and FMA, and `args` satisfies [`TileArgs`]' invariants for `MR` and
/// `NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
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
            rows => unreachable!("an AVX2 tile of {rows} rows"),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn tile(_: &TileArgs) {
    unreachable!("the AVX2 kernel is never selected off x86-64")
}

/// `count` steps of `k` of the tile: `acc[i] += a[i] · b` for the next `ROWS` values of the `a`
/// panel and 16 of the `b` panel, moving both on.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `a` and `b` point to `count · MR` and `count · NR` readable
/// values of their panels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn steps<const ROWS: usize>(
    acc: &mut [[__m256; 2]; ROWS],
    a: &mut *const f32,
    b: &mut *const f32,
    count: usize,
) {
    for _ in 0..count {
        // SAFETY: `a` and `b` walk the panels one step of `k` at a time, `count` steps in all,
        // reading `b` values `p·NR .. p·NR + 16` and `a` values `p·MR .. p·MR + ROWS`, inside
        // the values the caller guarantees.
        unsafe {
            let b0 = _mm256_loadu_ps(*b);
            let b1 = _mm256_loadu_ps(b.add(8));
            for (i, row) in acc.iter_mut().enumerate() {
                let value = _mm256_broadcast_ss(&*a.add(i));
                row[0] = _mm256_fmadd_ps(value, b0, row[0]);
                row[1] = _mm256_fmadd_ps(value, b1, row[1]);
            }
            *a = a.add(MR);
            *b = b.add(NR);
        }
    }
}

/// The tile for `ROWS ≤ MR` rows.
///
/// # Safety
/// As [`tile`], with `args.rows == ROWS`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_rows<const ROWS: usize>(args: &TileArgs) {
    let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
    let (mut a, mut b) = (args.a, args.b);
    // The tile of `c` this call adds to (or overwrites) was last touched a whole sweep of
    // panels ago (in L2 or beyond): ask for its lines now, so they are in L1 when the sums are
    // done (as the AVX-512 kernel does). A row of the tile is 16 values, one line when aligned.
    for i in 0..ROWS {
        for column in (0..args.cols).step_by(16) {
            // A prefetch never faults; `wrapping_add` forms the address without asserting
            // anything (it is inside the tile anyway).
            _mm_prefetch::<_MM_HINT_T0>(args.c.wrapping_add(i * args.ldc + column) as *const i8);
        }
    }
    super::in_chunks!(args.prefetch, args.kc, |count| {
        // SAFETY: the next `count` of the `kc` steps the panels hold (the caller's).
        unsafe { steps(&mut acc, &mut a, &mut b, count) }
    });
    if args.cols == NR {
        for (i, row) in acc.iter().enumerate() {
            for (v, &vector) in row.iter().enumerate() {
                // SAFETY: row `i < rows`, columns `8v .. 8v + 8 ≤ NR = cols` of the caller's tile.
                unsafe {
                    let at = args.c.add(i * args.ldc + 8 * v);
                    let value = if args.accumulate {
                        _mm256_add_ps(vector, _mm256_loadu_ps(at))
                    } else {
                        vector
                    };
                    _mm256_storeu_ps(at, value);
                }
            }
        }
        return;
    }
    let mut tile = [[0f32; NR]; ROWS];
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: each stack row holds NR = 16 values, two vectors.
        unsafe {
            _mm256_storeu_ps(tile[i].as_mut_ptr(), row[0]);
            _mm256_storeu_ps(tile[i].as_mut_ptr().add(8), row[1]);
        }
    }
    for (i, values) in tile.iter().enumerate() {
        // SAFETY: row `i < rows`, columns `0..cols` of the caller's tile.
        let out = unsafe { std::slice::from_raw_parts_mut(args.c.add(i * args.ldc), args.cols) };
        for (o, &v) in out.iter_mut().zip(values) {
            *o = if args.accumulate { *o + v } else { v };
        }
    }
}
