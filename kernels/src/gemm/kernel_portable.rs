//! The portable micro-kernel: a 4 × 16 tile of `c` in plain arrays, which the compiler
//! vectorizes for the baseline target (SSE2 on x86-64). The fallback when neither AVX2 nor
//! AVX-512 is present, and a reference for the others in tests.

use super::TileArgs;

pub(super) const MR: usize = 4;
pub(super) const NR: usize = 16;

/// See [`super::Kernel::tile`].
///
/// # Safety
/// `args` satisfies [`TileArgs`]' invariants for `MR` and `NR`.
pub(super) unsafe fn tile(args: &TileArgs) {
    // SAFETY: the caller guarantees `kc·MR` values behind `a` and `kc·NR` behind `b`.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(args.a, args.kc * MR),
            std::slice::from_raw_parts(args.b, args.kc * NR),
        )
    };
    let mut acc = [[0f32; NR]; MR];
    for (a, b) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for (row, &value) in acc.iter_mut().zip(a) {
            for (r, &x) in row.iter_mut().zip(b) {
                *r += value * x;
            }
        }
    }
    for (i, values) in acc.iter().take(args.rows).enumerate() {
        // SAFETY: row `i < rows`, columns `0..cols` of the caller's tile.
        let out = unsafe { std::slice::from_raw_parts_mut(args.c.add(i * args.ldc), args.cols) };
        for (o, &v) in out.iter_mut().zip(values) {
            *o = if args.accumulate { *o + v } else { v };
        }
    }
}
