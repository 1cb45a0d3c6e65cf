//! Column sums: the sums down adjacent columns of a row-major block, at the CPU's full vector
//! width. The code generator's outer-reduction order (`lower/outer.rs`) sums a
//! `[rows, columns]` buffer over its rows one group of [`COLUMNS`] columns at a time, 4-lane
//! vectors side by side; a group whose stage is a plain sum of an f32 load takes its sums from
//! this routine instead (a bias gradient, a batch norm's per-channel statistics), called once
//! for up to [`WIDE_COLUMNS`] columns (whole groups).
//!
//! **The same bits as the 4-lane loop.** Every column is summed exactly as the code generator
//! sums it, lane for lane: rows added one after another into a fresh accumulator for each block
//! of [`OUTER_SUM_BLOCK`] rows, each block's partial sum added into a running sum with Kahan
//! compensation (a compensation that is not finite, past an infinity, is dropped). The routine
//! only does it for 16 (AVX-512) or 8 (AVX2) columns per instruction, so a column gives the
//! same bits whether the routine, a 4-lane vector or a scalar tail sums it, at any thread count
//! (which decides where a piece's groups start).
//!
//! **Wide passes.** Rows of a buffer being summed are far apart (16 KiB for a `[256, 4096]`
//! gradient), so a pass down the rows that reads only a group's 128 bytes of each waits on its
//! loads (13 GB/s with the buffer in cache, below): each row is a new page, and the hardware
//! prefetchers follow neither the stride nor, that far apart, the next group's lines. The routine therefore sums
//! 16 registers of columns in one pass down the rows (256 columns on AVX-512, 128 on AVX2: a
//! kilobyte or half of each row), with the running sums and compensations kept apart from the
//! accumulators and touched once per block. Measured with a stand-alone copy of these loops on
//! a Zen 4 VM (a `[256, 4096]` buffer, 1 thread, medians of 31): 32 columns per pass 0.31 ms
//! with the buffer in cache and 0.35-0.43 ms after evicting it, 256 per pass 0.063 and
//! 0.29-0.35 ms (DRAM-bound); a software prefetch 1 to 16 rows ahead gained under 10% when
//! evicted and lost as much when cached, so there is none. In the training step the buffer
//! comes from memory (two GEMMs with 16 MiB outputs ran since it was written): its bias gradient
//! (`mlp_train_step_256`'s k10) went from 0.356 to 0.288 ms at 1 thread, 0.183 to 0.127 ms at 2.

use super::{kahan_fold, x86, Wide};

/// Columns per group of the code generator (`OUTER_SLOTS` vectors of 4 lanes): a call sums a
/// whole number of groups.
pub const COLUMNS: usize = 32;

/// Most columns the code generator hands to one call (whole groups of [`COLUMNS`]): one
/// AVX-512 pass, two AVX2 passes.
pub const WIDE_COLUMNS: usize = 256;

/// Rows a block's accumulator adds before its partial sum goes into the running sum: the code
/// generator's `OUTER_SUM_BLOCK`.
pub const OUTER_SUM_BLOCK: usize = 64;

/// What a column-sum routine reads and writes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ColumnArgs {
    /// The first row's `columns` f32s; row `r` starts `r * row_stride` bytes further.
    pub x: *const f32,
    /// Bytes from one row to the next.
    pub row_stride: i64,
    /// Rows to sum (none: every sum is 0).
    pub rows: i64,
    /// `columns` writable f32s: the sums.
    pub out: *mut f32,
    /// Columns to sum: a multiple of [`COLUMNS`] (the routine sums the whole groups of
    /// `columns` and leaves the rest of `out` alone; none when it is not positive).
    pub columns: i64,
}

/// Byte offsets of [`ColumnArgs`]' fields, for the code that fills one in.
pub const COLUMN_ARGS_X: i32 = 0;
pub const COLUMN_ARGS_STRIDE: i32 = 8;
pub const COLUMN_ARGS_ROWS: i32 = 16;
pub const COLUMN_ARGS_OUT: i32 = 24;
pub const COLUMN_ARGS_COLUMNS: i32 = 32;
pub const COLUMN_ARGS_BYTES: u32 = 40;

const _: () = {
    assert!(std::mem::size_of::<ColumnArgs>() == COLUMN_ARGS_BYTES as usize);
    assert!(std::mem::offset_of!(ColumnArgs, row_stride) == COLUMN_ARGS_STRIDE as usize);
    assert!(std::mem::offset_of!(ColumnArgs, rows) == COLUMN_ARGS_ROWS as usize);
    assert!(std::mem::offset_of!(ColumnArgs, out) == COLUMN_ARGS_OUT as usize);
    assert!(std::mem::offset_of!(ColumnArgs, columns) == COLUMN_ARGS_COLUMNS as usize);
};

/// A column-sum routine (see the module docs).
pub type ColumnFn = unsafe extern "C" fn(args: *const ColumnArgs);

/// Registers of accumulators in a full pass down the rows: 16 of the 32 AVX-512 registers (16
/// of AVX2's 16), so that the loads of a row run side by side.
const PASS_REGISTERS: usize = 16;

/// Sums the columns of `a`: full passes of [`PASS_REGISTERS`] registers, then one pass each of
/// 8, 4 and 2 registers where the remaining columns fill them (the remainder of a whole number
/// of groups is a sum of these).
///
/// # Safety
/// The CPU has `L`'s instruction set; `a` describes readable rows and a writable `out` (see
/// [`ColumnArgs`]).
#[inline(always)]
unsafe fn run<L: Wide>(e: &mut L, a: &ColumnArgs) {
    let columns = (a.columns.max(0) as usize) / COLUMNS * COLUMNS;
    let mut c = 0;
    while columns - c >= PASS_REGISTERS * L::WIDTH {
        // SAFETY: columns `c..c + 16 * WIDTH` lie inside `columns` (the caller's contract).
        unsafe { pass::<L, PASS_REGISTERS>(e, a, c) };
        c += PASS_REGISTERS * L::WIDTH;
    }
    if columns - c >= 8 * L::WIDTH {
        // SAFETY: as above, for `8 * WIDTH` columns.
        unsafe { pass::<L, 8>(e, a, c) };
        c += 8 * L::WIDTH;
    }
    if columns - c >= 4 * L::WIDTH {
        // SAFETY: as above, for `4 * WIDTH` columns.
        unsafe { pass::<L, 4>(e, a, c) };
        c += 4 * L::WIDTH;
    }
    if columns - c >= 2 * L::WIDTH {
        // SAFETY: as above, for `2 * WIDTH` columns.
        unsafe { pass::<L, 2>(e, a, c) };
        c += 2 * L::WIDTH;
    }
    debug_assert!(c == columns, "a whole number of groups is a sum of passes");
}

/// One pass down the rows for the `N * L::WIDTH` columns from column `first`: `N` accumulators
/// per block of rows, folded into running sums (kept out of the loop's registers).
///
/// # Safety
/// As [`run`], and columns `first..first + N * L::WIDTH` are within `a.columns`.
#[inline(always)]
unsafe fn pass<L: Wide, const N: usize>(e: &mut L, a: &ColumnArgs, first: usize) {
    let zero = e.f(0.0);
    let mut running = [zero; N];
    let mut compensation = [zero; N];
    let rows = a.rows.max(0) as usize;
    // SAFETY: column `first` is within the row (the caller's contract).
    let x = unsafe { a.x.add(first) };
    let mut r = 0;
    while r < rows {
        let end = rows.min(r + OUTER_SUM_BLOCK);
        let mut acc = [zero; N];
        while r < end {
            // SAFETY: row `r < rows` holds the pass's columns (the caller's contract).
            let row = unsafe { x.byte_offset(r as isize * a.row_stride as isize) };
            for (k, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `k * WIDTH + WIDTH <= N * WIDTH`, the pass's columns.
                let v = unsafe { L::load(row.add(k * L::WIDTH)) };
                *acc = e.add(*acc, v);
            }
            r += 1;
        }
        for k in 0..N {
            kahan_fold(e, &mut running[k], &mut compensation[k], acc[k]);
        }
    }
    for (k, v) in running.iter().enumerate() {
        // SAFETY: `out` holds the pass's columns from `first` (the caller's contract).
        unsafe { L::store(a.out.add(first + k * L::WIDTH), *v) };
    }
}

macro_rules! column_routines {
    ($($isa:ident, $feature:literal, $name:ident;)*) => {
        $(
            /// # Safety
            /// `args` points to a valid [`ColumnArgs`] and the CPU has the enabled target
            /// features (checked by `block_isa`).
            #[target_feature(enable = $feature)]
            unsafe extern "C" fn $name(args: *const ColumnArgs) {
                // SAFETY: the caller's contract above.
                let a = unsafe { *args };
                // SAFETY: the caller's contract above.
                unsafe { run(&mut x86::$isa::new(), &a) }
            }
        )*
    };
}

#[cfg(target_arch = "x86_64")]
column_routines! {
    Avx512, "avx512f,avx512dq,fma", columns_avx512;
    Avx2, "avx2,fma", columns_avx2;
}

/// The column-sum routine for `isa`.
#[cfg(target_arch = "x86_64")]
pub fn column_routine(isa: super::BlockIsa) -> Option<ColumnFn> {
    Some(match isa {
        super::BlockIsa::Avx512 => columns_avx512,
        super::BlockIsa::Avx2 => columns_avx2,
    })
}

#[cfg(not(target_arch = "x86_64"))]
pub fn column_routine(_isa: super::BlockIsa) -> Option<ColumnFn> {
    None
}

/// The sums of `args`' columns with the routine for `isa` (which must be supported), for tests.
///
/// # Safety
/// `args` describes readable rows and a writable `out` (see [`ColumnArgs`]).
pub unsafe fn run_columns(isa: super::BlockIsa, args: &ColumnArgs) {
    super::assert_supported(isa);
    if let Some(routine) = column_routine(isa) {
        // SAFETY: the caller's contract; the CPU supports `isa` (asserted above).
        unsafe { routine(args) }
    }
}

#[cfg(test)]
mod tests {
    //! Every instruction set this CPU has, at row counts around the block boundary and column
    //! counts that take every kind of pass (full passes, then 8, 4 and 2 registers), with a row
    //! stride wider than the columns: each column's sum bit for bit the scalar form of the same
    //! blocked Kahan sum, infinities and NaN kept, and nothing written past the whole groups.

    use super::*;
    use crate::math::block::{block_isa, BlockIsa};

    /// The code generator's sum of one column, in scalar f32.
    fn column_sum(values: impl Iterator<Item = f32>) -> f32 {
        let values: Vec<f32> = values.collect();
        let (mut running, mut compensation) = (0f32, 0f32);
        for block in values.chunks(OUTER_SUM_BLOCK) {
            let acc = block.iter().fold(0f32, |a, &v| a + v);
            let y = acc - compensation;
            let t = running + y;
            let c = (t - running) - y;
            compensation = if c.is_finite() { c } else { 0.0 };
            running = t;
        }
        running
    }

    #[test]
    fn column_sums_are_the_scalar_blocked_sums_bit_for_bit() {
        let isas = match block_isa() {
            Some(BlockIsa::Avx512) => vec![BlockIsa::Avx512, BlockIsa::Avx2],
            Some(BlockIsa::Avx2) => vec![BlockIsa::Avx2],
            None => vec![],
        };
        for isa in isas {
            for columns in [32usize, 40, 64, 96, 128, 160, 224, 256, 288, 480, 512, 544] {
                let whole = columns / COLUMNS * COLUMNS;
                let width = columns + 5;
                for rows in [0usize, 1, 2, 63, 64, 65, 128, 200, 1000] {
                    let mut x: Vec<f32> = (0..rows * width)
                        .map(|i| 1e3 * ((i as f32 + 1.0) * 0.618).sin() + 1e-3)
                        .collect();
                    if rows > 3 {
                        x[2 * width + 3] = f32::INFINITY;
                        x[3 * width + 7] = f32::NAN;
                        // The last pass's columns too.
                        x[2 * width + whole] = f32::NEG_INFINITY;
                        x[70.min(rows - 1) * width + whole - 1] = f32::INFINITY;
                    }
                    let mut out = vec![f32::NAN; columns + 1];
                    let args = ColumnArgs {
                        x: if rows == 0 {
                            std::ptr::null()
                        } else {
                            x[1..].as_ptr()
                        },
                        row_stride: (width * 4) as i64,
                        rows: rows as i64,
                        out: out.as_mut_ptr(),
                        columns: columns as i64,
                    };
                    // SAFETY: `rows` rows of `width >= columns + 1` f32s from `x[1]`; `out`
                    // holds `columns`.
                    unsafe { run_columns(isa, &args) };
                    for (c, got) in out.iter().enumerate() {
                        if c >= whole {
                            assert!(got.is_nan(), "{isa:?}: column {c} of {columns} written");
                            continue;
                        }
                        let want = column_sum((0..rows).map(|r| x[r * width + 1 + c]));
                        assert!(
                            got.to_bits() == want.to_bits(),
                            "{isa:?}, {rows}x{columns}, column {c}: {got} against {want}"
                        );
                    }
                }
            }
        }
    }
}
