//! Column sums: the sums down [`COLUMNS`] adjacent columns of a row-major block, at the CPU's
//! full vector width. The code generator's outer-reduction order (`lower/outer.rs`) sums a
//! `[rows, columns]` buffer over its rows one group of columns at a time, 4-lane vectors side
//! by side; a group whose stage is a plain sum of an f32 load hands the group to this routine
//! instead (a bias gradient, a batch norm's per-channel statistics).
//!
//! **The same bits as the 4-lane loop.** Every column is summed exactly as the code generator
//! sums it, lane for lane: rows added one after another into a fresh accumulator for each block
//! of [`OUTER_SUM_BLOCK`] rows, each block's partial sum added into a running sum with Kahan
//! compensation (a compensation that is not finite, past an infinity, is dropped). The routine
//! only does it for 16 (AVX-512) or 8 (AVX2) columns per instruction, so a column gives the
//! same bits whether the routine, a 4-lane vector or a scalar tail sums it, at any thread count.

use super::{kahan_fold, x86, Wide};

/// Columns per call: the code generator's column group (`OUTER_SLOTS` vectors of 4 lanes).
pub const COLUMNS: usize = 32;

/// Rows a block's accumulator adds before its partial sum goes into the running sum: the code
/// generator's `OUTER_SUM_BLOCK`.
pub const OUTER_SUM_BLOCK: usize = 64;

/// What a column-sum routine reads and writes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ColumnArgs {
    /// The first row's [`COLUMNS`] f32s; row `r` starts `r * row_stride` bytes further.
    pub x: *const f32,
    /// Bytes from one row to the next.
    pub row_stride: i64,
    /// Rows to sum (none: every sum is 0).
    pub rows: i64,
    /// [`COLUMNS`] writable f32s: the sums.
    pub out: *mut f32,
}

/// Byte offsets of [`ColumnArgs`]' fields, for the code that fills one in.
pub const COLUMN_ARGS_X: i32 = 0;
pub const COLUMN_ARGS_STRIDE: i32 = 8;
pub const COLUMN_ARGS_ROWS: i32 = 16;
pub const COLUMN_ARGS_OUT: i32 = 24;
pub const COLUMN_ARGS_BYTES: u32 = 32;

const _: () = {
    assert!(std::mem::size_of::<ColumnArgs>() == COLUMN_ARGS_BYTES as usize);
    assert!(std::mem::offset_of!(ColumnArgs, row_stride) == COLUMN_ARGS_STRIDE as usize);
    assert!(std::mem::offset_of!(ColumnArgs, rows) == COLUMN_ARGS_ROWS as usize);
    assert!(std::mem::offset_of!(ColumnArgs, out) == COLUMN_ARGS_OUT as usize);
};

/// A column-sum routine (see the module docs).
pub type ColumnFn = unsafe extern "C" fn(args: *const ColumnArgs);

/// Most registers a group needs (AVX2: 32 columns in 4 registers of 8).
const MAX_REGISTERS: usize = COLUMNS / 8;

/// Sums the columns of `a`.
///
/// # Safety
/// The CPU has `L`'s instruction set; `a` describes readable rows and a writable `out` (see
/// [`ColumnArgs`]).
#[inline(always)]
unsafe fn run<L: Wide>(mut e: L, a: &ColumnArgs) {
    let registers = COLUMNS / L::WIDTH;
    let zero = e.f(0.0);
    let mut running = [zero; MAX_REGISTERS];
    let mut compensation = [zero; MAX_REGISTERS];
    let rows = a.rows.max(0) as usize;
    let mut r = 0;
    while r < rows {
        let end = rows.min(r + OUTER_SUM_BLOCK);
        let mut acc = [zero; MAX_REGISTERS];
        while r < end {
            // SAFETY: row `r < rows` holds `COLUMNS` readable f32s (the caller's contract).
            let row = unsafe { a.x.byte_offset(r as isize * a.row_stride as isize) };
            for (k, acc) in acc.iter_mut().enumerate().take(registers) {
                // SAFETY: `k * WIDTH + WIDTH <= COLUMNS`.
                let v = unsafe { L::load(row.add(k * L::WIDTH)) };
                *acc = e.add(*acc, v);
            }
            r += 1;
        }
        for k in 0..registers {
            kahan_fold(&mut e, &mut running[k], &mut compensation[k], acc[k]);
        }
    }
    for (k, v) in running.iter().enumerate().take(registers) {
        // SAFETY: `out` holds `COLUMNS` writable f32s (the caller's contract).
        unsafe { L::store(a.out.add(k * L::WIDTH), *v) };
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
                unsafe { run(x86::$isa::new(), &a) }
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
    //! Every instruction set this CPU has, at row counts around the block boundary, with a row
    //! stride wider than the group: each column's sum bit for bit the scalar form of the same
    //! blocked Kahan sum, infinities and NaN kept.

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
        let width = COLUMNS + 5;
        for isa in isas {
            for rows in [0usize, 1, 2, 63, 64, 65, 128, 200, 1000] {
                let mut x: Vec<f32> = (0..rows * width)
                    .map(|i| 1e3 * ((i as f32 + 1.0) * 0.618).sin() + 1e-3)
                    .collect();
                if rows > 3 {
                    x[2 * width + 3] = f32::INFINITY;
                    x[3 * width + 7] = f32::NAN;
                }
                let mut out = vec![f32::NAN; COLUMNS];
                let args = ColumnArgs {
                    x: if rows == 0 {
                        std::ptr::null()
                    } else {
                        x[1..].as_ptr()
                    },
                    row_stride: (width * 4) as i64,
                    rows: rows as i64,
                    out: out.as_mut_ptr(),
                };
                // SAFETY: `rows` rows of `width >= COLUMNS + 1` f32s from `x[1]`; `out` holds
                // `COLUMNS`.
                unsafe { run_columns(isa, &args) };
                for (c, got) in out.iter().enumerate() {
                    let want = column_sum((0..rows).map(|r| x[r * width + 1 + c]));
                    assert!(
                        got.to_bits() == want.to_bits(),
                        "{isa:?}, {rows} rows, column {c}: {got} against {want}"
                    );
                }
            }
        }
    }
}
