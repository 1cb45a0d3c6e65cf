//! The AVX-512 micro-kernel: a 6 × 64 tile of `c` in 24 zmm accumulators. Each step of `k`
//! loads 4 vectors of the `b` panel, broadcasts 6 values of the `a` panel and issues 24
//! independent FMAs (Zen 5 runs 2 per cycle at 4 cycles' latency, so 8 in flight suffice; Zen 4
//! runs one 512-bit FMA per cycle on its two 256-bit pipes). Alone in L1 it runs at the FMA
//! peak on Zen 4 (114 GFLOP/s on one core, `gemm_kernel` example). A 12 × 32 tile (24
//! accumulators, half-width `b` panel) was measured on Zen 4 and lost: 80-96 GFLOP/s against
//! 94-107 on the products of `gemm_shapes` (its `a` micro-panel, streamed from L2, is twice as
//! large per FMA).
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

/// One step of `k`: `acc[i] += a[i] · b[0..64]` for `i < ROWS` (`$a` pointing to `ROWS`
/// readable values, `$b` to 64), or with `rows`, `acc[i] += $w[i][$p] · b[0..64]` (the rows of a
/// weight read in place, [`weight_rows`]); both forms issue the same FMAs, so the two kernels
/// sum alike. A macro, so that it is inlined into `super::steps!` with its target features and the
/// accumulators stay in registers.
macro_rules! step {
    // Both forms: the 4 vectors of `b`, and each row's value broadcast against them.
    (@fma $acc:expr, $b:expr, |$i:ident| $value:expr) => {{
        let b: *const f32 = $b;
        let b0 = _mm512_loadu_ps(b);
        let b1 = _mm512_loadu_ps(b.add(16));
        let b2 = _mm512_loadu_ps(b.add(32));
        let b3 = _mm512_loadu_ps(b.add(48));
        for ($i, row) in $acc.iter_mut().enumerate() {
            let value = _mm512_set1_ps($value);
            row[0] = _mm512_fmadd_ps(value, b0, row[0]);
            row[1] = _mm512_fmadd_ps(value, b1, row[1]);
            row[2] = _mm512_fmadd_ps(value, b2, row[2]);
            row[3] = _mm512_fmadd_ps(value, b3, row[3]);
        }
    }};
    ($acc:expr, rows $w:expr, $p:expr, $b:expr) => {{
        let p: usize = $p;
        step!(@fma $acc, $b, |i| *$w[i].add(p))
    }};
    ($acc:expr, $a:expr, $b:expr) => {{
        let a: *const f32 = $a;
        step!(@fma $acc, $b, |i| *a.add(i))
    }};
}

/// Steps of `k` per pass of the `steps` loop: its scalar bookkeeping (two pointer increments,
/// the count and the branch) once per four steps rather than per step, so fewer of those
/// scalar operations compete with the FMAs for the vector ports. Measured on an Intel Xeon of
/// family 6 model 167 (2 MiB L2, 512-bit FMAs at full rate), one thread, alternated runs:
/// `gemm_kernel 512 44 2` 182-185 → 189-195 GFLOP/s; `gemm_shapes` multiply 6-12% faster
/// ([1024x512]·[512x1408] 150-157 → 168-176 GFLOP/s, [256x1024]·[1024x4096] 149-150 →
/// 159-166). (A loop calling a function per step kept the accumulators in memory: `#[inline]`
/// is only a hint across `target_feature` functions, hence the macros.)
const UNROLL: usize = 4;

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
    {
        // The tile of `c` this call adds to (or overwrites) was last touched a whole sweep of
        // panels ago (in L2 or beyond): ask for its lines now, so they are in L1 when the sums
        // are done. Measured on Zen 4, one thread: +2-6% on products with many panels
        // ([256x1024]·[1024x4096] 88 → 94 GFLOP/s, [2048x512]·[512x2048] 91 → 96).
        for i in 0..ROWS {
            for column in (0..args.cols).step_by(16) {
                // A prefetch never faults; `wrapping_add` forms the address without
                // asserting anything (it is inside the tile anyway).
                _mm_prefetch::<_MM_HINT_T0>(args.c.wrapping_add(i * args.ldc + column) as *const i8);
            }
        }
    }
    super::in_chunks!(args.prefetch, args.kc, |count| {
        // SAFETY: the next `count` of the `kc` steps the panels hold (the caller's): `a` and
        // `b` point to `count · MR` and `count · NR` readable values.
        unsafe { super::steps!(acc, a, b, count) }
    });
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

/// What [`tile_weight_rows`] computes: `c[r][i] (+)= Σ_p w[i][p] · b[p][r]` for `i < rows ≤ MR`
/// (rows of a weight read in place, `w + i · ldw + p`), `r < cols ≤ NR` (the columns of a
/// packed block of `kc · NR` values, value `(p, r)` at `p · NR + r`): the tile of `cᵀ` that
/// [`tile`] would compute with `w` packed as its `a`, stored transposed.
pub(super) struct RowsTileArgs {
    pub kc: usize,
    pub w: *const f32,
    pub ldw: usize,
    pub b: *const f32,
    pub c: *mut f32,
    pub ldc: usize,
    pub rows: usize,
    pub cols: usize,
    pub accumulate: bool,
}

/// [`RowsTileArgs`]' tile.
///
/// # Safety
/// The CPU supports AVX-512F; `w + i · ldw + p` is readable for `i < rows`, `p < kc`; `b`
/// points to `kc · NR` readable values; `1 ≤ rows ≤ MR`, `1 ≤ cols ≤ NR`; `c + r · ldc + i` is
/// writable for every `r < cols`, `i < rows`, touched by no other thread during the call and
/// overlapping neither operand.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile_weight_rows(args: &RowsTileArgs) {
    // SAFETY: forwarded from the caller; `rows` selects the instance reading that many rows.
    unsafe {
        match args.rows {
            6 => weight_rows::<6>(args),
            5 => weight_rows::<5>(args),
            4 => weight_rows::<4>(args),
            3 => weight_rows::<3>(args),
            2 => weight_rows::<2>(args),
            1 => weight_rows::<1>(args),
            rows => unreachable!("an AVX-512 tile of {rows} weight rows"),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn tile_weight_rows(_: &RowsTileArgs) {
    unreachable!("the AVX-512 kernel is never selected off x86-64")
}

/// [`tile_weight_rows`] for `ROWS` rows. The sums are [`tile_rows`]' (`fma(w, b, acc)` is
/// `fma(b, w, acc)`, in the same order of `p`), so a tile equals [`tile`]'s of the same operands
/// packed, bit for bit, but for subnormal weights, which this reads as they are.
///
/// # Safety
/// As [`tile_weight_rows`], with `args.rows == ROWS`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn weight_rows<const ROWS: usize>(args: &RowsTileArgs) {
    let mut acc = [[_mm512_setzero_ps(); 4]; ROWS];
    let w: [*const f32; ROWS] = std::array::from_fn(|i| args.w.wrapping_add(i * args.ldw));
    let mut b = args.b;
    let mut p = 0;
    // SAFETY (the loops): `p < kc`, so `w[i] + p` is readable (the caller's) and `b` points to
    // the block's `(kc - p) · NR` values left.
    unsafe {
        while p + UNROLL <= args.kc {
            step!(acc, rows w, p, b);
            step!(acc, rows w, p + 1, b.add(NR));
            step!(acc, rows w, p + 2, b.add(2 * NR));
            step!(acc, rows w, p + 3, b.add(3 * NR));
            b = b.add(UNROLL * NR);
            p += UNROLL;
        }
        while p < args.kc {
            step!(acc, rows w, p, b);
            b = b.add(NR);
            p += 1;
        }
    }
    // Transposed: 16 columns of `b` at a time, the tile's rows as the columns of a 16 × 16
    // block (the rest zeros), whose rows after `transpose16` are `ROWS` values of one row of `c`.
    // The sums leave their registers through a buffer of their own: indexed by a loop
    // variable, `acc` itself would live in memory, stored after every FMA (measured: half speed).
    let mut sums = [[0f32; NR]; ROWS];
    for (row, sums) in acc.iter().zip(&mut sums) {
        for (v, sum) in row.iter().enumerate() {
            // SAFETY: values `16v .. 16v + 16` of a row of `NR` (64).
            unsafe { _mm512_storeu_ps(sums.as_mut_ptr().add(16 * v), *sum) };
        }
    }
    let mask: __mmask16 = (1u16 << ROWS) - 1;
    for column in (0..NR).step_by(16) {
        if column >= args.cols {
            break;
        }
        let mut block = [_mm512_setzero_ps(); 16];
        for (slot, row) in block.iter_mut().zip(&sums) {
            // SAFETY: values `column .. column + 16` of a row of `NR`.
            *slot = unsafe { _mm512_loadu_ps(row.as_ptr().add(column)) };
        }
        transpose16(&mut block);
        for (r, values) in block.iter().enumerate().take(args.cols - column) {
            // SAFETY: row `column + r < cols`, lanes `0..ROWS` of it: inside the tile the
            // caller gave this call (masked lanes are neither read nor written).
            unsafe {
                let at = args.c.add((column + r) * args.ldc);
                let value = if args.accumulate {
                    _mm512_add_ps(*values, _mm512_maskz_loadu_ps(mask, at))
                } else {
                    *values
                };
                _mm512_mask_storeu_ps(at, mask, value);
            }
        }
    }
}

/// `v` with every subnormal lane replaced by a zero of its sign, as `pack::flushed` does: the
/// packers store operands through it (see `pack.rs`). Three operations on integer lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn flushed16(v: __m512) -> __m512 {
    let bits = _mm512_castps_si512(v);
    let exponent = _mm512_and_si512(bits, _mm512_set1_epi32(0x7f80_0000));
    let tiny = _mm512_cmpeq_epi32_mask(exponent, _mm512_setzero_si512());
    _mm512_castsi512_ps(_mm512_mask_and_epi32(
        bits,
        tiny,
        bits,
        _mm512_set1_epi32(i32::MIN),
    ))
}

/// Packs one panel of a `b` whose columns are contiguous (a transposed operand): row `p` of the
/// panel (`nr` values, a multiple of 16) is `nr / 16` gathers of 16 values, one from each of 16
/// columns, at element `start + j · column_stride + p` of `data` for column `j` of the panel;
/// columns `width..nr` are zeros. Values are stored through [`flushed16`].
///
/// # Safety
/// The CPU supports AVX-512F; `nr` is a multiple of 16; `panel.len() == k · nr`; `width ≤ nr`;
/// `15 · column_stride` fits in an `i32`; and `start + j · column_stride + p < data.len()` for
/// every `j < width`, `p < k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_columns(
    data: &[f32],
    start: usize,
    column_stride: usize,
    k: usize,
    width: usize,
    nr: usize,
    panel: &mut [f32],
) {
    debug_assert!(panel.len() == k * nr && width <= nr && nr.is_multiple_of(16));
    let stride = column_stride as i32;
    let offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(stride),
    );
    for v in 0..nr / 16 {
        let lanes = width.saturating_sub(16 * v).min(16);
        let mask: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
        if lanes == 0 {
            for p in 0..k {
                panel[p * nr + 16 * v..][..16].fill(0.0);
            }
            continue;
        }
        let column = start + 16 * v * column_stride;
        for p in 0..k {
            // SAFETY: lane `j < lanes` reads element `column + j·column_stride + p`, inside
            // `data` by the caller's guarantee (masked lanes read nothing); the offsets fit in
            // i32 (`15·column_stride` does). The store writes values `p·nr + 16v .. + 16` of
            // `panel`, which holds `k·nr` (`16v + 16 ≤ nr`).
            unsafe {
                let base = data.as_ptr().add(column + p);
                let value = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, offsets, base);
                _mm512_storeu_ps(panel.as_mut_ptr().add(p * nr + 16 * v), flushed16(value));
            }
        }
    }
}

/// Transposes the 16 × 16 block `r` in registers: on entry `r[j]` holds column `j` (element
/// `i` of it is row `i`), on return `r[i]` holds row `i`. Four rounds of 16 shuffles: 32-bit
/// and 64-bit interleaves within 128-bit lanes, then two rounds of 128-bit lane shuffles.
/// (Also the attention step's key packing.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for q in 0..8 {
        t[2 * q] = _mm512_unpacklo_ps(r[2 * q], r[2 * q + 1]);
        t[2 * q + 1] = _mm512_unpackhi_ps(r[2 * q], r[2 * q + 1]);
    }
    // u[4g + m], 128-bit lane L: column 4L + m of columns 4g..4g+3 (as rows of the result).
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (a, b, c, d) = (
            _mm512_castps_pd(t[4 * g]),
            _mm512_castps_pd(t[4 * g + 1]),
            _mm512_castps_pd(t[4 * g + 2]),
            _mm512_castps_pd(t[4 * g + 3]),
        );
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for m in 0..4 {
        let x = _mm512_shuffle_f32x4::<0x44>(u[m], u[4 + m]);
        let y = _mm512_shuffle_f32x4::<0xEE>(u[m], u[4 + m]);
        let x2 = _mm512_shuffle_f32x4::<0x44>(u[8 + m], u[12 + m]);
        let y2 = _mm512_shuffle_f32x4::<0xEE>(u[8 + m], u[12 + m]);
        r[m] = _mm512_shuffle_f32x4::<0x88>(x, x2);
        r[4 + m] = _mm512_shuffle_f32x4::<0xDD>(x, x2);
        r[8 + m] = _mm512_shuffle_f32x4::<0x88>(y, y2);
        r[12 + m] = _mm512_shuffle_f32x4::<0xDD>(y, y2);
    }
}

/// Packs a column-contiguous `b` like [`pack_columns`], 16 × 16 blocks at a time: 16 columns'
/// runs of 16 values are loaded (masked past `k`), transposed in registers and stored as 16
/// rows of the panel. Every cache line of `b` is read whole, with one load per 16 values
/// (gathers cost one load per value). Values are stored through [`flushed16`].
///
/// # Safety
/// As [`pack_columns`], except that `column_stride` may be any size.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_columns_transposed(
    data: &[f32],
    start: usize,
    column_stride: usize,
    k: usize,
    width: usize,
    nr: usize,
    panel: &mut [f32],
) {
    debug_assert!(panel.len() == k * nr && width <= nr && nr.is_multiple_of(16));
    // One 16 × 16 block: rows `p0 .. p0 + rows` of the panel's columns `16v .. 16v + 16`, of
    // which `lanes` are `b`'s. `whole` (a literal): all 16 of both, read by plain loads, so
    // that the block stays in registers (the masked form spilled it, and its masks, to the
    // stack); else the loads are masked, all 16 in one loop of constant length (the columns
    // past `lanes` masked off entirely).
    macro_rules! block {
        ($whole:literal, $column:expr, $v:expr, $p0:expr, $rows:expr, $lanes:expr) => {{
            let (column, v, p0, rows, lanes): (usize, usize, usize, usize, usize) =
                ($column, $v, $p0, $rows, $lanes);
            let r = &mut [_mm512_setzero_ps(); 16];
            let mask: __mmask16 = if rows == 16 { !0 } else { (1u16 << rows) - 1 };
            for (j, column_run) in r.iter_mut().enumerate() {
                let at = data.as_ptr().wrapping_add(column + j * column_stride + p0);
                // SAFETY: the unmasked lanes read elements `column + j·column_stride + p0 + i`,
                // `j < lanes ≤ width`, `i < rows ≤ k − p0`: inside `data` by the caller's
                // guarantee; masked lanes read nothing (and `at` of a column past `lanes`,
                // formed by `wrapping_add`, is never read).
                *column_run = unsafe {
                    if $whole {
                        _mm512_loadu_ps(at)
                    } else {
                        _mm512_maskz_loadu_ps(if j < lanes { mask } else { 0 }, at)
                    }
                };
            }
            transpose16(r);
            for (i, row) in r.iter().enumerate().take(if $whole { 16 } else { rows }) {
                // SAFETY: writes values `(p0 + i)·nr + 16v .. + 16` of `panel`, which holds
                // `k·nr` values, `p0 + i < k`, `16v + 16 ≤ nr`.
                unsafe {
                    _mm512_storeu_ps(
                        panel.as_mut_ptr().add((p0 + i) * nr + 16 * v),
                        flushed16(*row),
                    )
                };
            }
        }};
    }
    for v in 0..nr / 16 {
        let lanes = width.saturating_sub(16 * v).min(16);
        let column = start + 16 * v * column_stride;
        let mut p0 = 0;
        if lanes == 16 {
            while p0 + 16 <= k {
                block!(true, column, v, p0, 16, 16);
                p0 += 16;
            }
        }
        for p0 in (p0..k).step_by(16) {
            block!(false, column, v, p0, (k - p0).min(16), lanes);
        }
    }
}

/// Packs `MR` (6) rows of a column-contiguous `a` into one micro-panel: value `(i, p)`, element
/// `start + p · column_stride + i` of `data`, goes to `p · MR + i`; each column by one masked
/// load and one masked store, through [`flushed16`].
///
/// # Safety
/// The CPU supports AVX-512F; `panel.len() == kc · MR`; `start + p · column_stride + MR ≤
/// data.len()` for every `p < kc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_columns6(
    data: &[f32],
    start: usize,
    column_stride: usize,
    kc: usize,
    panel: &mut [f32],
) {
    debug_assert!(panel.len() == kc * MR);
    let mask: __mmask16 = (1 << MR) - 1;
    for p in 0..kc {
        // SAFETY: lanes `0..MR` read elements `start + p·column_stride ..+ MR`, inside `data`
        // (the caller's), and write values `p·MR ..+ MR` of the panel's `kc·MR`; the other lanes
        // are masked off (neither read nor written).
        unsafe {
            let column = data.as_ptr().add(start + p * column_stride);
            let value = _mm512_maskz_loadu_ps(mask, column);
            _mm512_mask_storeu_ps(panel.as_mut_ptr().add(p * MR), mask, flushed16(value));
        }
    }
}

/// Packs `MR` (6) rows of `a`, each a contiguous run of `kc` values, into one micro-panel
/// (value `(i, p)` at `p · MR + i`), 16 columns at a time: the 6 runs of 16 are interleaved in
/// registers (three two-source permutes and two blends per 16 values written), the columns
/// past the last multiple of 16 one by one; every value through [`flushed16`] (or its scalar
/// form). Meanwhile the same columns of the rows starting at `ahead` (a later micro-panel's)
/// are prefetched, a line per row per 16 columns.
///
/// # Safety
/// The CPU supports AVX-512F; `panel.len() == kc · MR`; `starts[i] + kc ≤ data.len()` for
/// every row `i`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_rows6(
    data: &[f32],
    starts: [usize; MR],
    ahead: [usize; MR],
    kc: usize,
    panel: &mut [f32],
) {
    debug_assert!(panel.len() == kc * MR && starts.iter().all(|&s| s + kc <= data.len()));
    // Output vector `v`, lane `e` is value `t = 16v + e` of a block of 96: row `t % 6`, column
    // `t / 6`. Rows come in pairs (0-1, 2-3, 4-5), each pair one two-source permute: index
    // `column + 16 · (row % 2)`; the blends pick the pair of each lane.
    let mut index = [[0i32; 16]; MR];
    let mut masks = [[0u16; 2]; MR];
    for (v, (index, masks)) in index.iter_mut().zip(&mut masks).enumerate() {
        for (e, slot) in index.iter_mut().enumerate() {
            let t = 16 * v + e;
            let (row, column) = (t % MR, t / MR);
            *slot = (column + 16 * (row % 2)) as i32;
            if row / 2 == 1 {
                masks[0] |= 1 << e;
            } else if row / 2 == 2 {
                masks[1] |= 1 << e;
            }
        }
    }
    let index = index.map(|lanes| {
        // SAFETY: `lanes` holds 16 i32 values.
        unsafe { _mm512_loadu_si512(lanes.as_ptr() as *const _) }
    });
    let full = kc / 16 * 16;
    for p0 in (0..full).step_by(16) {
        // SAFETY: `starts[i] + p0 + 16 ≤ starts[i] + kc ≤ data.len()` (the caller's).
        let rows = starts.map(|s| unsafe { _mm512_loadu_ps(data.as_ptr().add(s + p0)) });
        for &row in &ahead {
            // A prefetch never faults; `wrapping_add` forms the address without asserting
            // anything.
            _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().wrapping_add(row + p0) as *const i8);
        }
        for v in 0..MR {
            let pair01 = _mm512_permutex2var_ps(rows[0], index[v], rows[1]);
            let pair23 = _mm512_permutex2var_ps(rows[2], index[v], rows[3]);
            let pair45 = _mm512_permutex2var_ps(rows[4], index[v], rows[5]);
            let value = _mm512_mask_mov_ps(pair01, masks[v][0], pair23);
            let value = _mm512_mask_mov_ps(value, masks[v][1], pair45);
            // SAFETY: writes values `p0·6 + 16v .. + 16` of `panel`, `< (p0 + 16)·6 ≤ kc·6`.
            unsafe { _mm512_storeu_ps(panel.as_mut_ptr().add(p0 * MR + 16 * v), flushed16(value)) };
        }
    }
    for p in full..kc {
        for (i, &s) in starts.iter().enumerate() {
            panel[p * MR + i] = super::pack::flushed(data[s + p]);
        }
    }
}
