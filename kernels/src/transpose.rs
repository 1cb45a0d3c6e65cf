//! Transposed copies: a `[rows, columns]` block of 2-, 4- or 8-byte elements (f16 and bf16;
//! f32; i64), columns contiguous, stored as its transpose, rows contiguous. The code generator
//! hands a kernel that only copies a transposed view (`x.t().contiguous()`, an NCHW ↔ NHWC
//! permute, or the copy that `passes::split_transposes` takes out of a pointwise kernel) to this
//! routine, one call per run of the kernel's last outer loop.
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
//! Other element sizes have their own tiles: 16-bit elements 16 × 16 in 256-bit registers
//! (AVX2, on AVX-512 machines too), 64-bit ones 8 × 8 in 512-bit registers (AVX-512) or 4 × 4
//! in 256-bit ones (AVX2). Without a tile of its own an f16 or bf16 copy was an elementwise
//! loop converting every element to f32 and back: `x.t()` of a 2048 × 2048 bf16 tensor took
//! 19.0 ms, an f32 one 1.5 ms (1 thread, Zen 4).
//!
//! The elements are copied as bit patterns (loads, shuffles and stores do not touch a value's
//! bits), so the result is exactly the elementwise copy's.

/// What a transposed copy reads and writes: element `(r, c)` of the block (`r < rows`, `c <
/// columns`) is read at `src + size · c + r · src_row_stride` bytes and written at `dst +
/// size · r + c · dst_row_stride` bytes, `size` the element's bytes (the routine's: see
/// [`transpose_routine`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TransposeArgs {
    pub src: *const u8,
    /// Bytes from one row of the source to the next (any sign).
    pub src_row_stride: i64,
    pub dst: *mut u8,
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

/// The element sizes (bytes) a routine exists for.
pub const TRANSPOSE_SIZES: [usize; 3] = [2, 4, 8];

/// The routine for elements of `bytes` bytes on this CPU (`None` for a size without one: see
/// [`TRANSPOSE_SIZES`]): for 32-bit elements 16 × 16 register transposes with AVX-512, 8 × 8
/// ones with AVX2; for 16-bit ones 16 × 16 with AVX2 (or AVX-512); for 64-bit ones 8 × 8 with
/// AVX-512, 4 × 4 with AVX2; else the portable form. `MINDUCTOR_MATH_BLOCKS=0` (no
/// ahead-of-time routines) selects the portable form.
pub fn transpose_routine(bytes: usize) -> Option<TransposeFn> {
    chosen(bytes).map(|(routine, _)| routine)
}

/// The vector width (bits) [`transpose_routine`]'s form for `bytes` copies at: 512, 256, or
/// the element's bits for the portable form (for reports); `None` where there is no routine.
pub fn transpose_bits(bytes: usize) -> Option<u32> {
    chosen(bytes).map(|(_, bits)| bits)
}

/// The form for `bytes`-byte elements on this CPU and its width.
fn chosen(bytes: usize) -> Option<(TransposeFn, u32)> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::math::block::{block_isa, BlockIsa};
        match (block_isa(), bytes) {
            (Some(BlockIsa::Avx512), 4) => return Some((transpose32_avx512_entry, 512)),
            (Some(BlockIsa::Avx512), 8) => return Some((transpose64_avx512_entry, 512)),
            (Some(BlockIsa::Avx512 | BlockIsa::Avx2), 2) => {
                return Some((transpose16_avx2_entry, 256))
            }
            (Some(BlockIsa::Avx2), 4) => return Some((transpose32_avx2_entry, 256)),
            (Some(BlockIsa::Avx2), 8) => return Some((transpose64_avx2_entry, 256)),
            _ => {}
        }
    }
    portable(bytes).map(|routine| (routine, 8 * bytes as u32))
}

/// The portable form for `bytes`-byte elements.
fn portable(bytes: usize) -> Option<TransposeFn> {
    match bytes {
        2 => Some(transpose16_portable),
        4 => Some(transpose32_portable),
        8 => Some(transpose64_portable),
        _ => None,
    }
}

/// Every form this CPU can run for `bytes`-byte elements, by name (for tests that compare
/// them).
pub fn transpose_forms(bytes: usize) -> Vec<(&'static str, TransposeFn)> {
    let mut forms: Vec<(&'static str, TransposeFn)> = portable(bytes)
        .map(|routine| ("portable", routine))
        .into_iter()
        .collect();
    #[cfg(target_arch = "x86_64")]
    {
        let avx2: Option<TransposeFn> = match bytes {
            2 => Some(transpose16_avx2_entry),
            4 => Some(transpose32_avx2_entry),
            8 => Some(transpose64_avx2_entry),
            _ => None,
        };
        let avx512: Option<TransposeFn> = match bytes {
            4 => Some(transpose32_avx512_entry),
            8 => Some(transpose64_avx512_entry),
            _ => None,
        };
        if let (true, Some(f)) = (std::is_x86_feature_detected!("avx2"), avx2) {
            forms.push(("avx2", f));
        }
        if let (true, Some(f)) = (std::is_x86_feature_detected!("avx512f"), avx512) {
            forms.push(("avx512", f));
        }
    }
    forms
}

/// The portable form: each 16 × 16 tile goes through a local tile, its source rows copied in
/// whole, then its result rows copied out whole, so that each line is read or written once, at
/// once (element by element, a tile's 16 source lines would have to stay in L1 together, and
/// at power-of-two strides they share one set). `T` is an integer of the element's size.
///
/// # Safety
/// As [`TransposeFn`], for elements of `T`'s size.
unsafe fn transpose_tiles<T: Copy + Default>(a: &TransposeArgs) {
    let (rows, columns) = (a.rows.max(0) as usize, a.columns.max(0) as usize);
    let (src, dst) = (a.src as *const T, a.dst as *mut T);
    let mut tile = [[T::default(); TILE]; TILE];
    for c0 in (0..columns).step_by(TILE) {
        let width = (columns - c0).min(TILE);
        for r0 in (0..rows).step_by(TILE) {
            let height = (rows - r0).min(TILE);
            for (r, line) in tile.iter_mut().enumerate().take(height) {
                for (c, x) in line.iter_mut().enumerate().take(width) {
                    // SAFETY: `(r0 + r, c0 + c)` is an element of the block, readable at its
                    // source address (the routine's contract).
                    *x = unsafe {
                        let row = src.byte_offset((r0 + r) as isize * a.src_row_stride as isize);
                        row.add(c0 + c).read_unaligned()
                    };
                }
            }
            for c in 0..width {
                for (r, line) in tile.iter().enumerate().take(height) {
                    // SAFETY: as above, writable at its destination address.
                    unsafe {
                        let row = dst.byte_offset((c0 + c) as isize * a.dst_row_stride as isize);
                        row.add(r0 + r).write_unaligned(line[c]);
                    }
                }
            }
        }
    }
}

/// [`transpose_tiles`] for 16-bit elements.
///
/// # Safety
/// As [`TransposeFn`].
unsafe extern "C" fn transpose16_portable(args: *const TransposeArgs) {
    // SAFETY: the caller passes a valid `TransposeArgs` (the routine's contract).
    unsafe { transpose_tiles::<u16>(&*args) }
}

/// [`transpose_tiles`] for 32-bit elements.
///
/// # Safety
/// As [`TransposeFn`].
unsafe extern "C" fn transpose32_portable(args: *const TransposeArgs) {
    // SAFETY: the caller passes a valid `TransposeArgs` (the routine's contract).
    unsafe { transpose_tiles::<u32>(&*args) }
}

/// [`transpose_tiles`] for 64-bit elements.
///
/// # Safety
/// As [`TransposeFn`].
unsafe extern "C" fn transpose64_portable(args: *const TransposeArgs) {
    // SAFETY: the caller passes a valid `TransposeArgs` (the routine's contract).
    unsafe { transpose_tiles::<u64>(&*args) }
}

#[cfg(target_arch = "x86_64")]
use x86::{
    transpose16_avx2_entry, transpose32_avx2_entry, transpose32_avx512_entry,
    transpose64_avx2_entry, transpose64_avx512_entry,
};

/// The register forms: one loop over tiles ([`x86::tiles`]) and, per form, how a tile row is
/// loaded and stored and how a tile is transposed ([`x86::Form`]).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{TransposeArgs, PREFETCH};
    use std::arch::x86_64::*;

    /// `T × T` tiles in registers of type `V`, elements of `SIZE` bytes. Every method is
    /// `#[inline(always)]` so that it compiles inside the `#[target_feature]` function that runs
    /// [`tiles`] for the form, with that instruction set.
    pub(super) trait Form<const T: usize> {
        type V: Copy;
        /// An integer of the element's size (for the portable tiles at the edges).
        type Elem: Copy + Default;
        const SIZE: usize;
        /// Whether loads and stores can be cut short (masked): else only whole tiles run here.
        const MASKED: bool;
        /// Whether the first tile of columns ends at a 64-byte boundary of the source (when its
        /// rows are aligned alike), so that every later tile reads whole lines.
        const ALIGN_FIRST: bool;
        /// Whether each tile's source lines are prefetched [`PREFETCH`] tiles ahead.
        const PREFETCH: bool;
        fn zero() -> Self::V;
        /// The first `width` elements (`1..=T`; `T` unless `MASKED`) at `row`, the others 0.
        ///
        /// # Safety
        /// The CPU has the form's instruction set; `width` elements are readable at `row`.
        unsafe fn load(row: *const u8, width: usize) -> Self::V;
        /// The first `height` elements (`1..=T`) of `v` to `row`.
        ///
        /// # Safety
        /// The CPU has the form's instruction set; `height` elements are writable at `row`.
        unsafe fn store(row: *mut u8, height: usize, v: Self::V);
        /// The columns of the tile of rows `r`.
        fn transpose(r: &[Self::V; T]) -> [Self::V; T];
    }

    /// The transposed copy `a` in tiles of `F`: tiles of columns (the result's rows), each down
    /// all the rows a tile at a time: rows loaded (cut at the block's columns), transposed,
    /// stored as rows of the result (cut at the block's rows). A form without masked moves
    /// (`F::MASKED` false) runs the whole tiles only, and the block's edges past them go through
    /// the portable tiles.
    ///
    /// # Safety
    /// The CPU has `F`'s instruction set; `a` as [`super::TransposeFn`] for `F::SIZE`-byte
    /// elements.
    #[inline(always)]
    pub(super) unsafe fn tiles<const T: usize, F: Form<T>>(a: &TransposeArgs) {
        let (rows, columns) = (a.rows.max(0) as usize, a.columns.max(0) as usize);
        if !F::MASKED {
            let (whole_rows, whole_columns) = (rows - rows % T, columns - columns % T);
            for c0 in (0..whole_columns).step_by(T) {
                for r0 in (0..whole_rows).step_by(T) {
                    // SAFETY: a whole tile of the block.
                    unsafe { tile::<T, F>(a, r0, c0, T, T) };
                }
            }
            // SAFETY (both): the parts start at elements of the block and lie inside it.
            if whole_columns < columns && rows > 0 {
                unsafe {
                    let rest = part(a, F::SIZE, 0, whole_columns, rows, columns - whole_columns);
                    super::transpose_tiles::<F::Elem>(&rest);
                }
            }
            if whole_rows < rows && whole_columns > 0 {
                unsafe {
                    let rest = part(a, F::SIZE, whole_rows, 0, rows - whole_rows, whole_columns);
                    super::transpose_tiles::<F::Elem>(&rest);
                }
            }
            return;
        }
        // Elements before the next 64-byte boundary of the first row (the first tile's width).
        let first = match (F::ALIGN_FIRST, (a.src as usize) % F::SIZE) {
            (true, 0) => (T - (a.src as usize / F::SIZE) % T) % T,
            _ => 0,
        };
        let mut c0 = 0;
        while c0 < columns {
            let width = match (c0, first) {
                (0, f) if f > 0 => f,
                _ => T,
            }
            .min(columns - c0);
            for r0 in (0..rows).step_by(T) {
                // SAFETY: rows `r0..r0 + height`, columns `c0..c0 + width` of the block.
                unsafe { tile::<T, F>(a, r0, c0, width, (rows - r0).min(T)) };
            }
            c0 += width;
        }
    }

    /// The tile of `a` at row `r0` and column `c0`, `height` rows of `width` columns (each
    /// `1..=T`), its source lines [`PREFETCH`] tiles ahead asked for (`F::PREFETCH`).
    ///
    /// # Safety
    /// As [`tiles`]; the tile lies inside the block.
    #[inline(always)]
    unsafe fn tile<const T: usize, F: Form<T>>(
        a: &TransposeArgs,
        r0: usize,
        c0: usize,
        width: usize,
        height: usize,
    ) {
        let (ss, ds) = (a.src_row_stride as isize, a.dst_row_stride as isize);
        let size = F::SIZE;
        if F::PREFETCH && r0 + PREFETCH * T + T <= a.rows as usize {
            for k in 0..T {
                // A hint only: the address need not be valid.
                let row = (a.src.wrapping_add(size * c0))
                    .wrapping_byte_offset((r0 + PREFETCH * T + k) as isize * ss);
                _mm_prefetch::<_MM_HINT_T0>(row as *const i8);
            }
        }
        let rows: [F::V; T] = std::array::from_fn(|k| match k < height {
            // SAFETY: row `r0 + k` of the block, its columns `c0..c0 + width`.
            true => unsafe {
                let row = a.src.add(size * c0).byte_offset((r0 + k) as isize * ss);
                F::load(row, width)
            },
            false => F::zero(),
        });
        for (j, v) in F::transpose(&rows).into_iter().enumerate().take(width) {
            // SAFETY: column `c0 + j` is row `c0 + j` of the result; its elements `r0..r0 +
            // height` are the block's.
            unsafe {
                let row = a.dst.byte_offset((c0 + j) as isize * ds).add(size * r0);
                F::store(row, height, v);
            }
        }
    }

    /// The part of `a`'s block from row `r0` and column `c0` on, `rows` × `columns` of it, for
    /// elements of `size` bytes.
    ///
    /// # Safety
    /// `a` as [`super::TransposeFn`]; `r0 < a.rows` and `c0 < a.columns` (the part's first
    /// element is one of the block's).
    unsafe fn part(
        a: &TransposeArgs,
        size: usize,
        r0: usize,
        c0: usize,
        rows: usize,
        columns: usize,
    ) -> TransposeArgs {
        // SAFETY: element `(r0, c0)` of the block is readable at this source address and
        // writable at this destination address (the contract).
        let (src, dst) = unsafe {
            (
                a.src
                    .add(size * c0)
                    .byte_offset(r0 as isize * a.src_row_stride as isize),
                a.dst
                    .add(size * r0)
                    .byte_offset(c0 as isize * a.dst_row_stride as isize),
            )
        };
        TransposeArgs {
            src,
            dst,
            rows: rows as i64,
            columns: columns as i64,
            ..*a
        }
    }

    /// `(1 << n) - 1`: the lanes of a mask below `n` (at most 16).
    #[inline(always)]
    fn below(n: usize) -> u32 {
        (1u32 << n) - 1
    }

    /// 32-bit elements, 16 × 16 tiles in 512-bit registers transposed with the GEMM's
    /// `transpose16`, loads and stores masked at the block's edges. Measured on `x.t()` at 1
    /// thread (Zen 4, buffers on huge pages): the prefetch took 2048 × 2048 from 1.54–1.55 ms to
    /// 1.47–1.48, 4000 × 1008 from 1.89–1.96 to 1.47–1.71; 2 and 4 tiles ahead were no better.
    /// (Streaming the stores around the caches was no faster on 2048 × 2048 and twice as slow
    /// on 512 × 512.)
    struct F32x16;

    impl Form<16> for F32x16 {
        type V = __m512;
        type Elem = u32;
        const SIZE: usize = 4;
        const MASKED: bool = true;
        const ALIGN_FIRST: bool = true;
        const PREFETCH: bool = true;
        #[inline(always)]
        fn zero() -> __m512 {
            // SAFETY: runs inside `transpose32_avx512` (AVX-512F).
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(row: *const u8, width: usize) -> __m512 {
            // SAFETY: the contract; masked lanes are neither read nor faulted on.
            unsafe { _mm512_maskz_loadu_ps(below(width) as __mmask16, row as *const f32) }
        }
        #[inline(always)]
        unsafe fn store(row: *mut u8, height: usize, v: __m512) {
            // SAFETY: the contract; masked lanes are not written.
            unsafe { _mm512_mask_storeu_ps(row as *mut f32, below(height) as __mmask16, v) }
        }
        #[inline(always)]
        fn transpose(r: &[__m512; 16]) -> [__m512; 16] {
            let mut t = *r;
            // SAFETY: runs inside `transpose32_avx512` (AVX-512F).
            unsafe { crate::gemm::transpose16(&mut t) };
            t
        }
    }

    /// 32-bit elements, 8 × 8 tiles in 256-bit registers, masks made of lane comparisons. A tile
    /// reads half of each source line; the other half is read by the next tile of columns, from
    /// L2. Measured on `x.t()` at 1 thread (Zen 4, `MINDUCTOR_MATH_BLOCKS=avx2`): 2048 × 2048 in
    /// 2.50–2.58 ms (the AVX-512 form 1.4–1.6, the portable one 6.7–7.7, the 4-lane loop 22.8);
    /// two tiles side by side (whole source lines) took 2.9–3.8 ms, and a prefetch gained
    /// nothing.
    struct F32x8;

    /// The lanes of an 8 × 32-bit register below `n`, as a mask of AVX2's masked moves.
    #[inline(always)]
    fn mask32(n: usize) -> __m256i {
        // SAFETY: runs inside an AVX2 form.
        unsafe {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes)
        }
    }

    impl Form<8> for F32x8 {
        type V = __m256;
        type Elem = u32;
        const SIZE: usize = 4;
        const MASKED: bool = true;
        const ALIGN_FIRST: bool = false;
        const PREFETCH: bool = false;
        #[inline(always)]
        fn zero() -> __m256 {
            // SAFETY: runs inside `transpose32_avx2` (AVX2).
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(row: *const u8, width: usize) -> __m256 {
            // SAFETY: the contract; masked lanes are neither read nor faulted on.
            unsafe { _mm256_maskload_ps(row as *const f32, mask32(width)) }
        }
        #[inline(always)]
        unsafe fn store(row: *mut u8, height: usize, v: __m256) {
            // SAFETY: the contract; masked lanes are not written.
            unsafe { _mm256_maskstore_ps(row as *mut f32, mask32(height), v) }
        }
        /// 32-bit and 64-bit interleaves within 128-bit lanes, then lane swaps.
        #[inline(always)]
        fn transpose(r: &[__m256; 8]) -> [__m256; 8] {
            // SAFETY: runs inside `transpose32_avx2` (AVX2).
            unsafe {
                let t: [__m256; 8] = std::array::from_fn(|i| {
                    let p = 2 * (i / 2);
                    match i % 2 {
                        0 => _mm256_unpacklo_ps(r[p], r[p + 1]),
                        _ => _mm256_unpackhi_ps(r[p], r[p + 1]),
                    }
                });
                // `u[2q + m]`, q = 0..4 over (t0, t2), (t1, t3), (t4, t6), (t5, t7).
                let u: [__m256; 8] = std::array::from_fn(|i| {
                    let q = i / 2;
                    let (x, y) = (t[4 * (q / 2) + q % 2], t[4 * (q / 2) + q % 2 + 2]);
                    match i % 2 {
                        0 => _mm256_shuffle_ps::<0x44>(x, y),
                        _ => _mm256_shuffle_ps::<0xEE>(x, y),
                    }
                });
                std::array::from_fn(|j| match j < 4 {
                    true => _mm256_permute2f128_ps::<0x20>(u[j], u[j + 4]),
                    false => _mm256_permute2f128_ps::<0x31>(u[j - 4], u[j]),
                })
            }
        }
    }

    /// 16-bit elements, 16 × 16 tiles in 256-bit registers (a source row's 16 elements, half a
    /// line), prefetched as [`F32x16`]. AVX2 has no 16-bit masked moves: the block's edges past
    /// the whole tiles go through the portable tiles. Two tiles side by side, reading whole source
    /// lines, were slower: `x.t()` of bf16 2048 × 2048 in 2.96 ms against 1.51, 4000 × 1008 in
    /// 1.51 against 0.67 (1 thread, Zen 4).
    struct U16x16;

    impl Form<16> for U16x16 {
        type V = __m256i;
        type Elem = u16;
        const SIZE: usize = 2;
        const MASKED: bool = false;
        const ALIGN_FIRST: bool = false;
        const PREFETCH: bool = true;
        #[inline(always)]
        fn zero() -> __m256i {
            // SAFETY: runs inside `transpose16_avx2` (AVX2).
            unsafe { _mm256_setzero_si256() }
        }
        #[inline(always)]
        unsafe fn load(row: *const u8, _: usize) -> __m256i {
            // SAFETY: the contract (`MASKED` false: whole rows of 16 only).
            unsafe { _mm256_loadu_si256(row as *const __m256i) }
        }
        #[inline(always)]
        unsafe fn store(row: *mut u8, _: usize, v: __m256i) {
            // SAFETY: the contract (`MASKED` false: whole rows of 16 only).
            unsafe { _mm256_storeu_si256(row as *mut __m256i, v) }
        }
        /// 16-, 32- and 64-bit interleaves within 128-bit lanes (after them register `8o + c`
        /// holds column `c` of rows `8o..8o + 8` in its low lane and column `c + 8` in its
        /// high lane), then lane swaps.
        #[inline(always)]
        fn transpose(r: &[__m256i; 16]) -> [__m256i; 16] {
            // SAFETY: runs inside `transpose16_avx2` (AVX2).
            unsafe {
                // `a[2p + h]`: rows 2p and 2p + 1 interleaved, columns 4h..4h + 4 (and 8 more).
                let a: [__m256i; 16] = std::array::from_fn(|i| {
                    let p = i / 2;
                    match i % 2 {
                        0 => _mm256_unpacklo_epi16(r[2 * p], r[2 * p + 1]),
                        _ => _mm256_unpackhi_epi16(r[2 * p], r[2 * p + 1]),
                    }
                });
                // `b[4q + 2h + m]`: rows 4q..4q + 4, columns 4h + 2m and 4h + 2m + 1 (and 8
                // more).
                let b: [__m256i; 16] = std::array::from_fn(|i| {
                    let (q, h, m) = (i / 4, (i / 2) % 2, i % 2);
                    let (u, w) = (a[4 * q + h], a[4 * q + 2 + h]);
                    match m {
                        0 => _mm256_unpacklo_epi32(u, w),
                        _ => _mm256_unpackhi_epi32(u, w),
                    }
                });
                // `c[8o + k]`: rows 8o..8o + 8, column k (and k + 8), k = 4h + 2m + n.
                let c: [__m256i; 16] = std::array::from_fn(|i| {
                    let (o, k) = (i / 8, i % 8);
                    let (h, m, n) = (k / 4, (k / 2) % 2, k % 2);
                    let (u, w) = (b[8 * o + 2 * h + m], b[8 * o + 4 + 2 * h + m]);
                    match n {
                        0 => _mm256_unpacklo_epi64(u, w),
                        _ => _mm256_unpackhi_epi64(u, w),
                    }
                });
                std::array::from_fn(|j| match j < 8 {
                    true => _mm256_permute2x128_si256::<0x20>(c[j], c[8 + j]),
                    false => _mm256_permute2x128_si256::<0x31>(c[j - 8], c[j]),
                })
            }
        }
    }

    /// 64-bit elements, 8 × 8 tiles in 512-bit registers (a source row's 8 elements are a
    /// whole line when aligned), masked at the edges, prefetched as [`F32x16`]; transposed by
    /// 64-bit interleaves within 128-bit lanes and two rounds of lane shuffles.
    struct U64x8;

    impl Form<8> for U64x8 {
        type V = __m512i;
        type Elem = u64;
        const SIZE: usize = 8;
        const MASKED: bool = true;
        const ALIGN_FIRST: bool = false;
        const PREFETCH: bool = true;
        #[inline(always)]
        fn zero() -> __m512i {
            // SAFETY: runs inside `transpose64_avx512` (AVX-512F).
            unsafe { _mm512_setzero_si512() }
        }
        #[inline(always)]
        unsafe fn load(row: *const u8, width: usize) -> __m512i {
            // SAFETY: the contract; masked lanes are neither read nor faulted on.
            unsafe { _mm512_maskz_loadu_epi64(below(width) as __mmask8, row as *const i64) }
        }
        #[inline(always)]
        unsafe fn store(row: *mut u8, height: usize, v: __m512i) {
            // SAFETY: the contract; masked lanes are not written.
            unsafe { _mm512_mask_storeu_epi64(row as *mut i64, below(height) as __mmask8, v) }
        }
        #[inline(always)]
        fn transpose(r: &[__m512i; 8]) -> [__m512i; 8] {
            // SAFETY: runs inside `transpose64_avx512` (AVX-512F).
            unsafe {
                // `x[2p + h]`: lane L holds column 2L + h of rows 2p and 2p + 1.
                let x: [__m512i; 8] = std::array::from_fn(|i| {
                    let p = i / 2;
                    match i % 2 {
                        0 => _mm512_unpacklo_epi64(r[2 * p], r[2 * p + 1]),
                        _ => _mm512_unpackhi_epi64(r[2 * p], r[2 * p + 1]),
                    }
                });
                let mut out = [_mm512_setzero_si512(); 8];
                for h in 0..2 {
                    let even = _mm512_shuffle_i64x2::<0x88>(x[h], x[2 + h]);
                    let odd = _mm512_shuffle_i64x2::<0xDD>(x[h], x[2 + h]);
                    let even2 = _mm512_shuffle_i64x2::<0x88>(x[4 + h], x[6 + h]);
                    let odd2 = _mm512_shuffle_i64x2::<0xDD>(x[4 + h], x[6 + h]);
                    out[h] = _mm512_shuffle_i64x2::<0x88>(even, even2);
                    out[4 + h] = _mm512_shuffle_i64x2::<0xDD>(even, even2);
                    out[2 + h] = _mm512_shuffle_i64x2::<0x88>(odd, odd2);
                    out[6 + h] = _mm512_shuffle_i64x2::<0xDD>(odd, odd2);
                }
                out
            }
        }
    }

    /// 64-bit elements, 4 × 4 tiles in 256-bit registers, masks made of lane comparisons,
    /// transposed by 64-bit interleaves and lane swaps.
    struct U64x4;

    /// The lanes of a 4 × 64-bit register below `n`, as a mask of AVX2's masked moves.
    #[inline(always)]
    fn mask64(n: usize) -> __m256i {
        // SAFETY: runs inside an AVX2 form.
        unsafe {
            let lanes = _mm256_setr_epi64x(0, 1, 2, 3);
            _mm256_cmpgt_epi64(_mm256_set1_epi64x(n as i64), lanes)
        }
    }

    impl Form<4> for U64x4 {
        type V = __m256i;
        type Elem = u64;
        const SIZE: usize = 8;
        const MASKED: bool = true;
        const ALIGN_FIRST: bool = false;
        const PREFETCH: bool = false;
        #[inline(always)]
        fn zero() -> __m256i {
            // SAFETY: runs inside `transpose64_avx2` (AVX2).
            unsafe { _mm256_setzero_si256() }
        }
        #[inline(always)]
        unsafe fn load(row: *const u8, width: usize) -> __m256i {
            // SAFETY: the contract; masked lanes are neither read nor faulted on.
            unsafe { _mm256_maskload_epi64(row as *const i64, mask64(width)) }
        }
        #[inline(always)]
        unsafe fn store(row: *mut u8, height: usize, v: __m256i) {
            // SAFETY: the contract; masked lanes are not written.
            unsafe { _mm256_maskstore_epi64(row as *mut i64, mask64(height), v) }
        }
        #[inline(always)]
        fn transpose(r: &[__m256i; 4]) -> [__m256i; 4] {
            // SAFETY: runs inside `transpose64_avx2` (AVX2).
            unsafe {
                let t = [
                    _mm256_unpacklo_epi64(r[0], r[1]),
                    _mm256_unpackhi_epi64(r[0], r[1]),
                    _mm256_unpacklo_epi64(r[2], r[3]),
                    _mm256_unpackhi_epi64(r[2], r[3]),
                ];
                [
                    _mm256_permute2x128_si256::<0x20>(t[0], t[2]),
                    _mm256_permute2x128_si256::<0x20>(t[1], t[3]),
                    _mm256_permute2x128_si256::<0x31>(t[0], t[2]),
                    _mm256_permute2x128_si256::<0x31>(t[1], t[3]),
                ]
            }
        }
    }

    /// The routines: [`tiles`] of each form compiled with its instruction set.
    macro_rules! routine {
        ($entry:ident, $features:literal, $t:literal, $form:ty) => {
            /// # Safety
            /// As [`super::TransposeFn`].
            pub(crate) unsafe extern "C" fn $entry(args: *const TransposeArgs) {
                #[target_feature(enable = $features)]
                unsafe fn run(a: &TransposeArgs) {
                    // SAFETY: the caller's contract, with the instruction set enabled here.
                    unsafe { tiles::<$t, $form>(a) }
                }
                // SAFETY: `transpose_routine` hands this form out only where the CPU has the
                // instruction set `run` enables, and `transpose_forms` only after detecting it;
                // the arguments are the caller's contract.
                unsafe { run(&*args) }
            }
        };
    }

    routine!(transpose32_avx512_entry, "avx512f", 16, F32x16);
    routine!(transpose32_avx2_entry, "avx2", 8, F32x8);
    routine!(transpose16_avx2_entry, "avx2", 16, U16x16);
    routine!(transpose64_avx512_entry, "avx512f", 8, U64x8);
    routine!(transpose64_avx2_entry, "avx2", 4, U64x4);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every routine, for every element size, against the definition, on blocks with partial
    /// tiles both ways, strides wider than the block, a misaligned start and negative strides.
    #[test]
    fn transposes_every_shape() {
        check::<u16>(2, |i| 0x4000 + i as u16);
        check::<u32>(4, |i| 0x4000_0000 + i as u32);
        check::<u64>(8, |i| 0x4000_0000_0000_0000 + ((i as u64) << 20) + i as u64);
        for bytes in [0, 1, 3, 16] {
            assert!(transpose_routine(bytes).is_none() && transpose_forms(bytes).is_empty());
        }
    }

    /// [`transposes_every_shape`] for elements of `T` (`bytes` bytes), source element `i`
    /// holding `value(i)` (never 0).
    fn check<T: Copy + Default + PartialEq + std::fmt::Debug>(bytes: usize, value: fn(usize) -> T) {
        assert_eq!(std::mem::size_of::<T>(), bytes);
        let forms = transpose_forms(bytes);
        let chosen = transpose_routine(bytes).expect("a routine") as *const ();
        assert!(
            forms.iter().any(|(_, f)| *f as *const () == chosen),
            "the chosen form is tested"
        );
        let size = bytes as i64;
        for (name, routine) in forms {
            for (rows, columns, src_pad, dst_pad, skew) in [
                (1, 1, 0, 0, 0),
                (16, 16, 0, 0, 0),
                (17, 33, 3, 5, 1),
                (40, 7, 0, 2, 7),
                (5, 64, 16, 0, 0),
                (64, 48, 0, 0, 5),
                (35, 50, 1, 3, 3),
                (0, 9, 0, 0, 0),
            ] {
                for flip in [false, true] {
                    let src_stride = columns + src_pad;
                    let dst_stride = rows + dst_pad;
                    let src: Vec<T> = (0..skew + rows * src_stride).map(value).collect();
                    let mut dst = vec![T::default(); columns * dst_stride + 1];
                    // With `flip`, the source rows are walked last to first.
                    let (first_row, src_row_stride) = match flip {
                        false => (0, src_stride as i64 * size),
                        true => (rows.saturating_sub(1), -(src_stride as i64) * size),
                    };
                    let args = TransposeArgs {
                        src: src[skew + first_row * src_stride..].as_ptr().cast(),
                        src_row_stride,
                        dst: dst.as_mut_ptr().cast(),
                        dst_row_stride: dst_stride as i64 * size,
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
                                T::default()
                            };
                            assert_eq!(
                                got, want,
                                "{name} ({bytes} bytes): {rows}x{columns} flip {flip}, \
                                 element ({r}, {c})"
                            );
                        }
                    }
                    assert_eq!(
                        dst[columns * dst_stride],
                        T::default(),
                        "{name} ({bytes} bytes): wrote past the block"
                    );
                }
            }
        }
    }
}
