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

/// One step of `k`: `acc[i] += a[i] · b[0..16]` for `i < ROWS` (`$a` pointing to `ROWS`
/// readable values, `$b` to 16). A macro, so that it is inlined into `super::steps!` with the kernel's
/// target features and the accumulators stay in registers (as in the AVX-512 kernel).
macro_rules! step {
    ($acc:expr, $a:expr, $b:expr) => {{
        let (a, b): (*const f32, *const f32) = ($a, $b);
        let b0 = _mm256_loadu_ps(b);
        let b1 = _mm256_loadu_ps(b.add(8));
        for (i, row) in $acc.iter_mut().enumerate() {
            let value = _mm256_broadcast_ss(&*a.add(i));
            row[0] = _mm256_fmadd_ps(value, b0, row[0]);
            row[1] = _mm256_fmadd_ps(value, b1, row[1]);
        }
    }};
}

/// Steps of `k` per pass of the `steps` loop, as in the AVX-512 kernel: the loop's scalar
/// bookkeeping (two pointer increments, the count and the branch) once per four steps rather
/// than per step. Measured on Zen 3 (family 25 model 1), one thread, `gemm_kernel 256 44 8`
/// alternated with the loop of one step per pass, 16 pairs on a noisy host: faster in 12, the
/// mean ratio 1.05 (best runs 86.8 against 83.9 GFLOP/s).
const UNROLL: usize = 4;

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
        // SAFETY: the next `count` of the `kc` steps the panels hold (the caller's): `a` and
        // `b` point to `count · MR` and `count · NR` readable values.
        unsafe { super::steps!(acc, a, b, count) }
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

/// `v` with every subnormal lane replaced by a zero of its sign, as `pack::flushed` does: the
/// packers store operands through it (see `pack.rs`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn flushed8(v: __m256) -> __m256 {
    let bits = _mm256_castps_si256(v);
    let exponent = _mm256_and_si256(bits, _mm256_set1_epi32(0x7f80_0000));
    let tiny = _mm256_cmpeq_epi32(exponent, _mm256_setzero_si256());
    // Where `tiny`, the sign bit alone; elsewhere every bit.
    let keep = _mm256_or_si256(
        _mm256_set1_epi32(i32::MIN),
        _mm256_xor_si256(tiny, _mm256_set1_epi32(-1)),
    );
    _mm256_castsi256_ps(_mm256_and_si256(bits, keep))
}

/// Transposes the 8 × 8 block whose row `j` is `r[j]`: afterwards `r[i]` holds lane `i` of
/// every former row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: &mut [__m256; 8]) {
    let t: [__m256; 8] = std::array::from_fn(|q| {
        let (pair, high) = (q / 2, q % 2 == 1);
        if high {
            _mm256_unpackhi_ps(r[2 * pair], r[2 * pair + 1])
        } else {
            _mm256_unpacklo_ps(r[2 * pair], r[2 * pair + 1])
        }
    });
    // `t[2g + h]`: rows `2g, 2g + 1` interleaved, lanes `2h, 2h + 1` of each 128-bit half.
    let s = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    // `s[q]` (`q < 4`): lanes `q` and `q + 4` of rows 0-3; `s[4 + q]` the same of rows 4-7.
    for q in 0..4 {
        r[q] = _mm256_permute2f128_ps::<0x20>(s[q], s[4 + q]);
        r[4 + q] = _mm256_permute2f128_ps::<0x31>(s[q], s[4 + q]);
    }
}

/// Packs one panel of a `b` whose columns are contiguous (a transposed operand, `x · wᵀ`'s
/// `wᵀ`): value `(p, j)` of the panel, element `start + j · column_stride + p` of `data`, goes
/// to `p · nr + j` for `j < width`; columns `width..nr` are zeros. Blocks of 8 columns × 8
/// rows are loaded as 8 runs of 8 values (whole cache lines read by one load per 8 values),
/// transposed in registers and stored as 8 rows of the panel; the rows past the last multiple
/// of 8 and a last partial group of columns go one value at a time. Every value goes through
/// [`flushed8`] (or its scalar form). Reads and writes go through checked slices.
///
/// # Safety
/// The CPU supports AVX2. (`panel.len() == k · nr`, `nr` a multiple of 8, and every element
/// read inside `data` are checked, by panics.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pack_columns_transposed(
    data: &[f32],
    start: usize,
    column_stride: usize,
    k: usize,
    width: usize,
    nr: usize,
    panel: &mut [f32],
) {
    assert!(panel.len() == k * nr && width <= nr && nr.is_multiple_of(8));
    for v in 0..nr / 8 {
        let lanes = width.saturating_sub(8 * v).min(8);
        let column = start + 8 * v * column_stride;
        let mut p0 = 0;
        if lanes == 8 {
            while p0 + 8 <= k {
                let mut r: [__m256; 8] = std::array::from_fn(|j| {
                    let at = column + j * column_stride + p0;
                    let run = &data[at..at + 8];
                    // SAFETY: `run` holds 8 values.
                    unsafe { _mm256_loadu_ps(run.as_ptr()) }
                });
                transpose8(&mut r);
                for (i, row) in r.iter().enumerate() {
                    let out = &mut panel[(p0 + i) * nr + 8 * v..][..8];
                    // SAFETY: `out` holds 8 values.
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), flushed8(*row)) };
                }
                p0 += 8;
            }
        }
        for p in p0..k {
            let out = &mut panel[p * nr + 8 * v..][..8];
            for (j, value) in out.iter_mut().enumerate() {
                *value = if j < lanes {
                    super::pack::flushed(data[column + j * column_stride + p])
                } else {
                    0.0
                };
            }
        }
    }
}

/// Packs `MR` (6) rows of `a`, each a contiguous run of `kc` values from `starts[i]`, into one
/// micro-panel (value `(i, p)` at `p · MR + i`), 8 columns at a time: the 6 runs of 8 (and two
/// of zeros) are transposed in registers and each column's 6 values stored by one 8-lane store
/// whose last 2 lanes the next column's store overwrites (the panel's last column, and the
/// columns past the last multiple of 8, one value at a time); every value through
/// [`flushed8`] (or its scalar form). Reads and writes go through checked slices.
///
/// # Safety
/// The CPU supports AVX2. (`panel.len() == kc · MR` and the runs inside `data` are checked, by
/// panics.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pack_rows6(data: &[f32], starts: [usize; MR], kc: usize, panel: &mut [f32]) {
    assert_eq!(panel.len(), kc * MR);
    let rows = starts.map(|s| &data[s..s + kc]);
    let full = kc / 8 * 8;
    for p0 in (0..full).step_by(8) {
        let mut r: [__m256; 8] = std::array::from_fn(|i| match rows.get(i) {
            // SAFETY: `p0 + 8 ≤ kc`, the run's length.
            Some(row) => unsafe { _mm256_loadu_ps(row[p0..p0 + 8].as_ptr()) },
            None => _mm256_setzero_ps(),
        });
        transpose8(&mut r);
        for (q, column) in r.iter().enumerate() {
            let at = (p0 + q) * MR;
            if let Some(out) = panel.get_mut(at..at + 8) {
                // SAFETY: `out` holds 8 values; lanes 6 and 7 (zeros) land on the next column's
                // first two, which its own store (or the scalar tail) writes afterwards.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), flushed8(*column)) };
            } else {
                let mut lanes = [0f32; 8];
                // SAFETY: `lanes` holds 8 values.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), flushed8(*column)) };
                panel[at..at + MR].copy_from_slice(&lanes[..MR]);
            }
        }
    }
    for p in full..kc {
        for (i, row) in rows.iter().enumerate() {
            panel[p * MR + i] = super::pack::flushed(row[p]);
        }
    }
}
