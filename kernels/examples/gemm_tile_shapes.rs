//! Which register tile an AVX-512 micro-kernel should have on this core: GFLOP/s of tiles of
//! `ROWS × 16·VECTORS` (`ROWS · VECTORS` zmm accumulators) in the macro-kernel's loops on packed
//! operands (a block of about 264 rows of `a` in L2, 384 columns of `b` in panels of the tile's
//! width, every tile of `c` added to in memory), one thread, CPU time, median of 7. A
//! prototype, not the library's kernel (`gemm_kernel` measures that one). On Zen 5 (family 26
//! model 2, 224.6 GFLOP/s probe peak) every 24-accumulator shape, 6x64, 8x48, 12x32 and 14x32
//! (28), ran at 200-228 GFLOP/s at every depth from 128 to 384, and 28x16 at 155-196, so the
//! library keeps 6x64:
//! `cargo run --release -p minductor-kernels --example gemm_tile_shapes`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::thread_cpu_seconds;

/// `c[0..ROWS, 0..16·VECTORS] += a_panel · b_panel` over `kc` steps.
///
/// # Safety
/// AVX-512F; `a` holds `kc · ROWS` values, `b` `kc · 16 · VECTORS`, and `c` rows `0..ROWS` of
/// `16 · VECTORS` values at stride `ldc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile<const ROWS: usize, const VECTORS: usize>(
    kc: usize,
    mut a: *const f32,
    mut b: *const f32,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: the caller's bounds; every access below is inside them.
    unsafe {
        for i in 0..ROWS {
            for v in 0..VECTORS {
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc + 16 * v) as *const i8);
            }
        }
        let mut acc = [[_mm512_setzero_ps(); VECTORS]; ROWS];
        for _ in 0..kc {
            let mut bv = [_mm512_setzero_ps(); VECTORS];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(b.add(16 * v));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let value = _mm512_set1_ps(*a.add(i));
                for (x, y) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(value, *y, *x);
                }
            }
            a = a.add(ROWS);
            b = b.add(16 * VECTORS);
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, x) in row.iter().enumerate() {
                let at = c.add(i * ldc + 16 * v);
                _mm512_storeu_ps(at, _mm512_add_ps(*x, _mm512_loadu_ps(at)));
            }
        }
    }
}

/// GFLOP/s of the `ROWS × 16·VECTORS` tile at depth `kc`.
#[cfg(target_arch = "x86_64")]
fn measure<const ROWS: usize, const VECTORS: usize>(kc: usize) -> f64 {
    let nr = 16 * VECTORS;
    let micro_panels = 264usize.div_ceil(ROWS);
    let panels = 384 / nr;
    let (m, n) = (micro_panels * ROWS, panels * nr);
    // Each operand from a 64-byte boundary, as the library's packed buffers are.
    let place = |values: Vec<f32>| {
        let mut buffer = vec![0f32; values.len() + 16];
        let skip = buffer.as_ptr().align_offset(64).min(16);
        buffer[skip..skip + values.len()].copy_from_slice(&values);
        (buffer, skip)
    };
    let (a_buffer, a_at) = place(
        (0..micro_panels * ROWS * kc)
            .map(|i| (i % 7) as f32 * 0.125)
            .collect(),
    );
    let (b_buffer, b_at) = place(
        (0..panels * kc * nr)
            .map(|i| (i % 5) as f32 * 0.125)
            .collect(),
    );
    let a = &a_buffer[a_at..a_at + micro_panels * ROWS * kc];
    let b = &b_buffer[b_at..b_at + panels * kc * nr];
    let (mut c_buffer, c_at) = place(vec![0f32; m * n]);
    let c = &mut c_buffer[c_at..c_at + m * n];
    let flop = 2.0 * (m * n * kc) as f64;
    let reps = ((2e8 / flop) as usize).max(1);
    let mut run = || {
        for _ in 0..reps {
            for (q, b_panel) in b.chunks_exact(kc * nr).enumerate() {
                for (r, a_panel) in a.chunks_exact(kc * ROWS).enumerate() {
                    // SAFETY: AVX-512F was detected; the panels hold `kc·ROWS` and `kc·nr`
                    // values; the tile (rows `r·ROWS ..+ ROWS`, columns `q·nr ..+ nr`) is
                    // inside `c`.
                    unsafe {
                        tile::<ROWS, VECTORS>(
                            kc,
                            a_panel.as_ptr(),
                            b_panel.as_ptr(),
                            c.as_mut_ptr().add(r * ROWS * n + q * nr),
                            n,
                        )
                    };
                }
            }
        }
    };
    run();
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let t = thread_cpu_seconds();
            run();
            thread_cpu_seconds() - t
        })
        .collect();
    std::hint::black_box(&c_buffer);
    times.sort_by(f64::total_cmp);
    flop * reps as f64 / times[3] / 1e9
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !is_x86_feature_detected!("avx512f") {
        println!("no AVX-512F on this CPU");
        return;
    }
    for kc in [128, 192, 256, 384] {
        println!(
            "kc {kc:3}: 6x64 {:6.1}  8x48 {:6.1}  12x32 {:6.1}  14x32 {:6.1}  28x16 {:6.1} GFLOP/s",
            measure::<6, 4>(kc),
            measure::<8, 3>(kc),
            measure::<12, 2>(kc),
            measure::<14, 2>(kc),
            measure::<28, 1>(kc),
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("an x86-64 example");
}
