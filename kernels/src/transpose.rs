//! Transposed copies: a `[rows, columns]` block of 32-bit elements, columns contiguous, stored
//! as its transpose, rows contiguous. The code generator hands a kernel that only copies a
//! transposed view (`x.t().contiguous()`, an NCHW ↔ NHWC permute, or the copy that
//! `passes::split_transposes` takes out of a pointwise kernel) to this routine, one call per
//! run of the kernel's last outer loop.
//!
//! **Why a routine.** Elementwise, such a copy reads along its vectorised loop elements a whole
//! row apart: each is another cache line, and where the row length is a power of two the lines
//! of one pass all fall in a few sets of the L1 and L2 caches, so a line is evicted before the
//! next of its 16 elements is wanted. `x.t() * 2` on 2048 × 2048 took 22.8 ms that way against
//! 0.67 ms for `x * 2` (1 thread, Zen 4). The AVX-512 form loads 16 rows of 16 columns (every
//! line read whole, at once), transposes them in registers (the GEMM's `transpose16`) and
//! stores 16 rows of the result, so no line has to wait in a cache for its next use (the AVX2
//! form does the same with 8 × 8 tiles). Inductor's
//! C++ back end does the same for such loops (`CppTile2DKernel`, 16 × 16 tiles transposed in
//! registers).
//!
//! The elements are copied as bit patterns (loads, shuffles and stores do not touch a value's
//! bits), so the result is exactly the elementwise copy's.

/// What a transposed copy reads and writes: element `(r, c)` of the block (`r < rows`, `c <
/// columns`) is read at `src + 4 c + r · src_row_stride` bytes and written at `dst + 4 r + c ·
/// dst_row_stride` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TransposeArgs {
    pub src: *const u32,
    /// Bytes from one row of the source to the next (any sign).
    pub src_row_stride: i64,
    pub dst: *mut u32,
    /// Bytes from one row of the result (a column of the source) to the next (any sign).
    pub dst_row_stride: i64,
    /// Rows of the source (none when not positive).
    pub rows: i64,
    /// Columns of the source (none when not positive).
    pub columns: i64,
}

/// Byte offsets of [`TransposeArgs`]' fields, for the code that fills one in.
pub const TRANSPOSE_ARGS_SRC: i32 = 0;
pub const TRANSPOSE_ARGS_SRC_STRIDE: i32 = 8;
pub const TRANSPOSE_ARGS_DST: i32 = 16;
pub const TRANSPOSE_ARGS_DST_STRIDE: i32 = 24;
pub const TRANSPOSE_ARGS_ROWS: i32 = 32;
pub const TRANSPOSE_ARGS_COLUMNS: i32 = 40;
pub const TRANSPOSE_ARGS_BYTES: u32 = 48;

const _: () = {
    assert!(std::mem::size_of::<TransposeArgs>() == TRANSPOSE_ARGS_BYTES as usize);
    assert!(
        std::mem::offset_of!(TransposeArgs, src_row_stride) == TRANSPOSE_ARGS_SRC_STRIDE as usize
    );
    assert!(std::mem::offset_of!(TransposeArgs, dst) == TRANSPOSE_ARGS_DST as usize);
    assert!(
        std::mem::offset_of!(TransposeArgs, dst_row_stride) == TRANSPOSE_ARGS_DST_STRIDE as usize
    );
    assert!(std::mem::offset_of!(TransposeArgs, rows) == TRANSPOSE_ARGS_ROWS as usize);
    assert!(std::mem::offset_of!(TransposeArgs, columns) == TRANSPOSE_ARGS_COLUMNS as usize);
};

/// A transposed-copy routine (see the module docs).
///
/// # Safety
/// `args` points to a [`TransposeArgs`] whose every element `(r, c)` is readable at its source
/// address and writable at its destination address, and the two sets do not overlap.
pub type TransposeFn = unsafe extern "C" fn(args: *const TransposeArgs);

/// Elements per side of a tile.
const TILE: usize = 16;

/// Tiles ahead (down the rows) whose source lines are prefetched: each is in another page, so
/// the hardware prefetchers do not fetch them. Measured on `x.t()` copies at 1 thread (Zen 4,
/// buffers on huge pages): 2048 × 2048 in 1.47-1.48 ms against 1.54-1.55 without, 4000 × 1008
/// in 1.47-1.71 against 1.89-1.96; 2 and 4 tiles ahead were no better. (Streaming the stores
/// around the caches was no faster on 2048 × 2048 and twice as slow on 512 × 512.)
const PREFETCH: usize = 1;

/// The routine for this CPU: 16 × 16 register transposes with AVX-512, 8 × 8 ones with AVX2,
/// else the portable form.
/// `MINDUCTOR_MATH_BLOCKS=0` (no ahead-of-time routines) selects the portable form.
pub fn transpose_routine() -> TransposeFn {
    chosen().0
}

/// The vector width (bits) [`transpose_routine`]'s form copies at: 512, 256, or 32 for the
/// portable form (for reports).
pub fn transpose_bits() -> u32 {
    chosen().1
}

/// The form for this CPU and its width.
fn chosen() -> (TransposeFn, u32) {
    #[cfg(target_arch = "x86_64")]
    match crate::math::block::block_isa() {
        Some(crate::math::block::BlockIsa::Avx512) => return (transpose_avx512_entry, 512),
        Some(crate::math::block::BlockIsa::Avx2) => return (transpose_avx2_entry, 256),
        None => {}
    }
    (transpose_portable, 32)
}

/// Every form this CPU can run, by name (for tests that compare them).
pub fn transpose_forms() -> Vec<(&'static str, TransposeFn)> {
    let mut forms: Vec<(&'static str, TransposeFn)> = vec![("portable", transpose_portable)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            forms.push(("avx2", transpose_avx2_entry));
        }
        if std::is_x86_feature_detected!("avx512f") {
            forms.push(("avx512", transpose_avx512_entry));
        }
    }
    forms
}

/// The portable form: each 16 × 16 tile goes through a local tile, its source rows copied in
/// whole, then its result rows copied out whole, so that each line is read or written once, at
/// once (element by element, a tile's 16 source lines would have to stay in L1 together, and
/// at power-of-two strides they share one set).
///
/// # Safety
/// As [`TransposeFn`].
pub unsafe extern "C" fn transpose_portable(args: *const TransposeArgs) {
    // SAFETY: the caller passes a valid `TransposeArgs` (the routine's contract).
    let a = unsafe { *args };
    let (rows, columns) = (a.rows.max(0) as usize, a.columns.max(0) as usize);
    let mut tile = [[0u32; TILE]; TILE];
    for c0 in (0..columns).step_by(TILE) {
        let width = (columns - c0).min(TILE);
        for r0 in (0..rows).step_by(TILE) {
            let height = (rows - r0).min(TILE);
            for (r, line) in tile.iter_mut().enumerate().take(height) {
                for (c, x) in line.iter_mut().enumerate().take(width) {
                    // SAFETY: `(r0 + r, c0 + c)` is an element of the block, readable at its
                    // source address (the routine's contract).
                    *x = unsafe {
                        let row = a
                            .src
                            .byte_offset((r0 + r) as isize * a.src_row_stride as isize);
                        row.add(c0 + c).read_unaligned()
                    };
                }
            }
            for c in 0..width {
                for (r, line) in tile.iter().enumerate().take(height) {
                    // SAFETY: as above, writable at its destination address.
                    unsafe {
                        let row = a
                            .dst
                            .byte_offset((c0 + c) as isize * a.dst_row_stride as isize);
                        row.add(r0 + r).write_unaligned(line[c]);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn transpose_avx512_entry(args: *const TransposeArgs) {
    // SAFETY: `transpose_routine` hands this form out only where the CPU has AVX-512F; the
    // arguments are the caller's contract.
    unsafe { transpose_avx512(&*args) }
}

/// Tiles of 16 columns (the result's rows), each down all the rows in steps of 16: 16 source
/// rows loaded (masked past the block's columns), transposed, stored as 16 rows of the result
/// (masked past the block's rows). The first tile of columns ends where the source's lines do
/// (when its rows are 64-byte aligned alike), so that every later tile reads whole lines.
///
/// # Safety
/// The CPU has AVX-512F; `a` as [`TransposeFn`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_avx512(a: &TransposeArgs) {
    use std::arch::x86_64::*;
    let (rows, columns) = (a.rows.max(0) as usize, a.columns.max(0) as usize);
    let (src, dst) = (a.src as *const f32, a.dst as *mut f32);
    let (ss, ds) = (a.src_row_stride as isize, a.dst_row_stride as isize);
    // Elements before the next 64-byte boundary of the first row (the first tile's width).
    let first = match (src as usize) % 4 {
        0 => (TILE - (src as usize / 4) % TILE) % TILE,
        _ => 0,
    };
    let mut c0 = 0;
    while c0 < columns {
        let width = match (c0, first) {
            (0, f) if f > 0 => f,
            _ => TILE,
        }
        .min(columns - c0);
        let column_mask: __mmask16 = ((1u32 << width) - 1) as __mmask16;
        let mut r0 = 0;
        while r0 < rows {
            let height = (rows - r0).min(TILE);
            let row_mask: __mmask16 = ((1u32 << height) - 1) as __mmask16;
            let mut v = [_mm512_setzero_ps(); TILE];
            if PREFETCH > 0 && r0 + PREFETCH * TILE + TILE <= rows {
                for k in 0..TILE {
                    // A hint only: the address need not be valid.
                    let row = src
                        .add(c0)
                        .wrapping_byte_offset((r0 + PREFETCH * TILE + k) as isize * ss);
                    _mm_prefetch::<_MM_HINT_T0>(row as *const i8);
                }
            }
            for (k, v) in v.iter_mut().enumerate().take(height) {
                // SAFETY: row `r0 + k < rows`; the mask keeps the load to columns `c0..c0 +
                // width` of it, elements of the block (masked lanes are neither read nor
                // faulted on).
                *v = unsafe {
                    let row = src.add(c0).byte_offset((r0 + k) as isize * ss);
                    if width == TILE {
                        _mm512_loadu_ps(row)
                    } else {
                        _mm512_maskz_loadu_ps(column_mask, row)
                    }
                };
            }
            crate::gemm::transpose16(&mut v);
            for (j, v) in v.iter().enumerate().take(width) {
                // SAFETY: column `c0 + j < columns` is row `c0 + j` of the result; the mask keeps
                // the store to its elements `r0..r0 + height`, inside the block.
                unsafe {
                    let row = dst.byte_offset((c0 + j) as isize * ds).add(r0);
                    if height == TILE {
                        _mm512_storeu_ps(row, *v);
                    } else {
                        _mm512_mask_storeu_ps(row, row_mask, *v);
                    }
                }
            }
            r0 += TILE;
        }
        c0 += width;
    }
}

#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn transpose_avx2_entry(args: *const TransposeArgs) {
    // SAFETY: `transpose_routine` hands this form out only where the CPU has AVX2 (the block
    // routines' `BlockIsa::Avx2`), and `transpose_forms` only after detecting it; the
    // arguments are the caller's contract.
    unsafe { transpose_avx2(&*args) }
}

/// The AVX2 form: as [`transpose_avx512`], with 8 × 8 tiles and masks made of lane
/// comparisons. A tile reads half of each source line; the other half is read by the next tile
/// of columns, from L2. Measured on `x.t()` copies at 1 thread (Zen 4, `MINDUCTOR_MATH_BLOCKS=
/// avx2`): 2048 × 2048 in 2.50–2.58 ms (the AVX-512 form 1.4–1.6, the portable one 6.7–7.7, the
/// 4-lane loop 22.8); two tiles side by side (whole source lines) took 2.9–3.8 ms, and a
/// prefetch as the AVX-512 form's gained nothing.
///
/// # Safety
/// The CPU has AVX2; `a` as [`TransposeFn`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(a: &TransposeArgs) {
    use std::arch::x86_64::*;
    const T: usize = 8;
    let (rows, columns) = (a.rows.max(0) as usize, a.columns.max(0) as usize);
    let (src, dst) = (a.src as *const f32, a.dst as *mut f32);
    let (ss, ds) = (a.src_row_stride as isize, a.dst_row_stride as isize);
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mask = |n: usize| _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
    let mut c0 = 0;
    while c0 < columns {
        let width = (columns - c0).min(T);
        let column_mask = mask(width);
        let mut r0 = 0;
        while r0 < rows {
            let height = (rows - r0).min(T);
            let mut r = [_mm256_setzero_ps(); T];
            for (k, r) in r.iter_mut().enumerate().take(height) {
                // SAFETY: row `r0 + k < rows`; the mask keeps the load to columns `c0..c0 +
                // width` of it (masked lanes are neither read nor faulted on).
                *r = unsafe {
                    let row = src.add(c0).byte_offset((r0 + k) as isize * ss);
                    if width == T {
                        _mm256_loadu_ps(row)
                    } else {
                        _mm256_maskload_ps(row, column_mask)
                    }
                };
            }
            let row_mask = mask(height);
            for (j, v) in transpose8(&r).iter().enumerate().take(width) {
                // SAFETY: column `c0 + j < columns` is row `c0 + j` of the result; the mask
                // keeps the store to its elements `r0..r0 + height`, inside the block.
                unsafe {
                    let row = dst.byte_offset((c0 + j) as isize * ds).add(r0);
                    if height == T {
                        _mm256_storeu_ps(row, *v);
                    } else {
                        _mm256_maskstore_ps(row, row_mask, *v);
                    }
                }
            }
            r0 += T;
        }
        c0 += width;
    }
}

/// The 8 × 8 transpose of rows `r`: its columns. 32-bit and 64-bit interleaves within 128-bit
/// lanes, then lane swaps.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: &[std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let t = [
        _mm256_unpacklo_ps(r[0], r[1]),
        _mm256_unpackhi_ps(r[0], r[1]),
        _mm256_unpacklo_ps(r[2], r[3]),
        _mm256_unpackhi_ps(r[2], r[3]),
        _mm256_unpacklo_ps(r[4], r[5]),
        _mm256_unpackhi_ps(r[4], r[5]),
        _mm256_unpacklo_ps(r[6], r[7]),
        _mm256_unpackhi_ps(r[6], r[7]),
    ];
    let u = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    [
        _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
        _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every routine against the definition, on blocks with partial tiles both ways, strides
    /// wider than the block, a misaligned start and negative strides.
    #[test]
    fn transposes_every_shape() {
        let forms = transpose_forms();
        let chosen = transpose_routine() as *const ();
        assert!(
            forms.iter().any(|(_, f)| *f as *const () == chosen),
            "the chosen form is tested"
        );
        for (name, routine) in forms {
            for (rows, columns, src_pad, dst_pad, skew) in [
                (1, 1, 0, 0, 0),
                (16, 16, 0, 0, 0),
                (17, 33, 3, 5, 1),
                (40, 7, 0, 2, 7),
                (5, 64, 16, 0, 0),
                (64, 48, 0, 0, 5),
                (0, 9, 0, 0, 0),
            ] {
                for flip in [false, true] {
                    let src_stride = columns + src_pad;
                    let dst_stride = rows + dst_pad;
                    let src: Vec<u32> = (0..skew + rows * src_stride)
                        .map(|i| 0x4000_0000 + i as u32)
                        .collect();
                    let mut dst = vec![0u32; columns * dst_stride + 1];
                    // With `flip`, the source rows are walked last to first.
                    let (first_row, src_row_stride) = match flip {
                        false => (0, src_stride as i64 * 4),
                        true => (rows.saturating_sub(1), -(src_stride as i64) * 4),
                    };
                    let args = TransposeArgs {
                        src: src[skew + first_row * src_stride..].as_ptr(),
                        src_row_stride,
                        dst: dst.as_mut_ptr(),
                        dst_row_stride: dst_stride as i64 * 4,
                        rows: rows as i64,
                        columns: columns as i64,
                    };
                    // SAFETY: every element of the block lies inside `src` and `dst` (the
                    // shapes above), which do not overlap.
                    unsafe { routine(&args) };
                    for c in 0..columns {
                        for r in 0..dst_stride {
                            let got = dst[c * dst_stride + r];
                            let want = if r < rows {
                                let row = if flip { rows - 1 - r } else { r };
                                src[skew + row * src_stride + c]
                            } else {
                                0
                            };
                            assert_eq!(
                                got, want,
                                "{name}: {rows}x{columns} flip {flip}, element ({r}, {c})"
                            );
                        }
                    }
                    assert_eq!(dst[columns * dst_stride], 0, "{name}: wrote past the block");
                }
            }
        }
    }
}
