//! Implicit GEMM for convolutions: `c = a · im2col(x)` without writing the im2col out.
//!
//! The right operand is the im2col of a channel group of one image (`Op::Im2col`), `k = C·KH·KW`
//! rows by `n = OH·OW` columns. Instead of packing panels of a materialized matrix, each panel of
//! `nr` output pixels is packed straight from the `[C, H, W]` planes of the image: one row per
//! `(channel, kernel offset)`, a run of input pixels per output row the panel covers (a copy at
//! stride 1), zeros where the window reads the padding.
//!
//! Blocking is chosen for a convolution's shapes (few output channels `m`, a long pixel axis
//! `n`): `a` (the weight, `m × k`) is packed once per product into [`PackedA`] (shared by every
//! image, as the weight is) and stays in L2; every panel of `b` is packed into a per-thread
//! buffer of `k · nr` values (L2-sized for `k` in the low thousands), used at once by every
//! micro-panel of `a` and then overwritten by the next one, so the packed operand never goes
//! to memory. Per panel, `k` is walked in blocks of `KC` rows (a block of the panel, `KC · nr`
//! values, stays in L1 while the micro-panels of `a` pass by), and the `m × nr` output tile
//! they accumulate stays in L1 across the blocks.
//!
//! Safety: the micro-kernel calls rest on [`Im2colRef::new`] (the image's planes lie inside
//! the slice), [`PackedA`]'s size (from the same shapes the loops run over) and
//! [`MatrixMut::new`] (the output rows lie inside theirs).

use super::{pack, AlignedBuffer, GemmError, Kernel, MatrixMut, MatrixRef, TileArgs, KC};
use minductor_ir::Window2d;

/// The im2col of `channels` consecutive `h × w` planes starting at `offset` in `data`, seen as a
/// `channels·KH·KW × OH·OW` matrix (see `Op::Im2col`); every plane lies inside `data` (checked
/// by [`Im2colRef::new`]).
#[derive(Clone, Copy, Debug)]
pub struct Im2colRef<'a> {
    data: &'a [f32],
    offset: usize,
    channels: usize,
    size: [usize; 2],
    window: Window2d,
    out: [usize; 2],
}

impl<'a> Im2colRef<'a> {
    /// The im2col of planes `offset..offset + channels·h·w` of `data`, checked to lie inside it
    /// and the window to fit the planes.
    pub fn new(
        data: &'a [f32],
        offset: usize,
        channels: usize,
        [h, w]: [usize; 2],
        window: Window2d,
    ) -> Result<Self, GemmError> {
        let out = window
            .output_size(h, w)
            .ok_or(GemmError::Window { window, h, w })?;
        let end = channels
            .checked_mul(h)
            .and_then(|n| n.checked_mul(w))
            .and_then(|n| n.checked_add(offset));
        match end {
            Some(end) if end <= data.len() => Ok(Im2colRef {
                data,
                offset,
                channels,
                size: [h, w],
                window,
                out,
            }),
            _ => Err(GemmError::OutOfBounds {
                what: "im2col source",
                low: offset as i64,
                high: end.map_or(i64::MAX, |e| e as i64 - 1),
                len: data.len(),
            }),
        }
    }

    /// `[k, n]`: `channels·KH·KW` rows, `OH·OW` columns.
    pub fn shape(&self) -> [usize; 2] {
        [
            self.channels * self.window.taps(),
            self.out[0] * self.out[1],
        ]
    }
}

/// `a` (`m × k`) packed for one kernel: for every block of `KC` columns starting at `depth`,
/// `ceil(m / mr)` micro-panels of `mr · kc` values (value `(i, p)` of micro-panel `r` at
/// `depth · padded_m + r · mr · kc + (p − depth) · mr + i`, `padded_m = ceil(m / mr) · mr`),
/// rows past `m` zero.
pub struct PackedA {
    kernel: Kernel,
    m: usize,
    k: usize,
    values: AlignedBuffer,
}

impl PackedA {
    /// Packs all of `a` for `kernel`.
    pub fn pack(a: &MatrixRef, kernel: Kernel) -> Result<PackedA, GemmError> {
        if !kernel.is_supported() {
            return Err(GemmError::Unsupported(kernel));
        }
        let [m, k] = a.shape();
        let mr = kernel.mr();
        let padded_m = m.div_ceil(mr) * mr;
        let mut values = AlignedBuffer::new();
        values.reserve(padded_m * k);
        let all = values.as_mut_slice();
        for depth in (0..k).step_by(KC) {
            let kc = KC.min(k - depth);
            let block = &mut all[depth * padded_m..][..padded_m * kc];
            pack::pack_a(a, 0..m, depth..depth + kc, mr, block);
        }
        Ok(PackedA {
            kernel,
            m,
            k,
            values,
        })
    }

    pub fn shape(&self) -> [usize; 2] {
        [self.m, self.k]
    }
}

thread_local! {
    /// Each thread's buffer for one packed panel of an im2col, kept between calls.
    static PANEL: std::cell::Cell<AlignedBuffer> = const { std::cell::Cell::new(AlignedBuffer::new()) };
}

/// `c = a · b` on the calling thread, `b` the im2col of an image (see the module doc).
pub fn multiply_im2col(a: &PackedA, b: &Im2colRef, c: &mut MatrixMut) -> Result<(), GemmError> {
    let [k, n] = b.shape();
    let m = a.m;
    if a.k != k || c.rows != m || c.cols != n {
        return Err(GemmError::Shape {
            a: a.shape(),
            b: b.shape(),
            c: c.shape(),
        });
    }
    let kernel = a.kernel;
    let (mr, nr) = (kernel.mr(), kernel.nr());
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        for i in 0..m {
            c.data[i * c.row_stride..][..n].fill(0.0);
        }
        return Ok(());
    }
    let padded_m = m.div_ceil(mr) * mr;
    let packed_a = &a.values.lines_as_slice()[..padded_m * k];
    let ldc = c.row_stride;
    let c_base = c.data.as_mut_ptr();
    PANEL.with(|cell| {
        let mut panel = cell.take();
        panel.reserve(k * nr);
        let values = panel.as_mut_slice();
        let mut segments = Vec::new();
        for q in 0..n.div_ceil(nr) {
            let cols = nr.min(n - q * nr);
            pack_im2col_panel(b, q * nr, cols, nr, values, &mut segments);
            for depth in (0..k).step_by(KC) {
                let kc = KC.min(k - depth);
                let b_block = &values[depth * nr..][..kc * nr];
                let a_block = &packed_a[depth * padded_m..][..padded_m * kc];
                for (r, a_panel) in a_block.chunks_exact(mr * kc).enumerate() {
                    let args = TileArgs {
                        kc,
                        a: a_panel.as_ptr(),
                        b: b_block.as_ptr(),
                        // SAFETY: row `r·mr < m`, column `q·nr < n`: inside `c`, whose
                        // `m` rows of `n` values `row_stride` apart `MatrixMut::new` checked.
                        c: unsafe { c_base.add(r * mr * ldc + q * nr) },
                        ldc,
                        rows: mr.min(m - r * mr),
                        cols,
                        accumulate: depth > 0,
                    };
                    // SAFETY: `PackedA::pack` checked the kernel is supported; the panels are
                    // slices of `kc·mr` and `kc·nr` values; `rows ≤ mr`, `cols ≤ nr` stay
                    // inside `m × n`, which `c` (borrowed uniquely) holds.
                    unsafe { kernel.tile(&args) };
                }
            }
        }
        cell.set(panel);
    });
    Ok(())
}

/// A run of a panel's columns that lie in one output row: columns `column..column + len` of
/// the panel are output pixels `(row, first..first + len)`.
struct Segment {
    column: usize,
    row: usize,
    first: usize,
    len: usize,
}

/// Packs columns `start..start + cols` of `b` as one panel of `k · nr` values into `out` (value
/// `(p, j)` at `p · nr + j`; columns `cols..nr` zero).
fn pack_im2col_panel(
    b: &Im2colRef,
    start: usize,
    cols: usize,
    nr: usize,
    out: &mut [f32],
    segments: &mut Vec<Segment>,
) {
    let [h, w] = b.size;
    let ow = b.out[1];
    let window = &b.window;
    segments.clear();
    let mut column = 0;
    while column < cols {
        let pixel = start + column;
        let (row, first) = (pixel / ow, pixel % ow);
        let len = (ow - first).min(cols - column);
        segments.push(Segment {
            column,
            row,
            first,
            len,
        });
        column += len;
    }
    #[cfg(target_arch = "x86_64")]
    if window.stride[1] == 1 && nr % 16 == 0 && Kernel::Avx512.is_supported() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { pack_unit_stride_avx512(b, cols, nr, out, segments) };
        return;
    }
    let [kh, kw] = window.kernel;
    let plane_len = h * w;
    let [sh, sw] = window.stride;
    let [dh, dw] = window.dilation;
    let [ph, pw] = window.padding;
    let mut p = 0;
    for channel in 0..b.channels {
        let plane = &b.data[b.offset + channel * plane_len..][..plane_len];
        for i in 0..kh {
            for j in 0..kw {
                let row_out = &mut out[p * nr..][..nr];
                row_out[cols..].fill(0.0);
                for s in segments.iter() {
                    let dest = &mut row_out[s.column..][..s.len];
                    // Input row and first input column, before removing the padding.
                    let y = (s.row * sh + i * dh) as isize - ph as isize;
                    if y < 0 || y >= h as isize {
                        dest.fill(0.0);
                        continue;
                    }
                    let source = &plane[y as usize * w..][..w];
                    let x0 = (s.first * sw + j * dw) as isize - pw as isize;
                    if sw == 1 {
                        copy_run(dest, source, x0);
                    } else {
                        for (t, value) in dest.iter_mut().enumerate() {
                            let x = x0 + (t * sw) as isize;
                            *value = if x >= 0 && x < w as isize {
                                source[x as usize]
                            } else {
                                0.0
                            };
                        }
                    }
                }
                p += 1;
            }
        }
    }
}

/// `dest[t] = source[x0 + t]` where `0 ≤ x0 + t < source.len()`, else zero: a run of one
/// input row at stride 1, padding included.
fn copy_run(dest: &mut [f32], source: &[f32], x0: isize) {
    #[cfg(target_arch = "x86_64")]
    if Kernel::Avx512.is_supported() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { copy_run_avx512(dest, source, x0) };
        return;
    }
    let w = source.len() as isize;
    let lo = (-x0).clamp(0, dest.len() as isize) as usize;
    let hi = (w - x0).clamp(lo as isize, dest.len() as isize) as usize;
    dest[..lo].fill(0.0);
    if hi > lo {
        let from = (x0 + lo as isize) as usize;
        dest[lo..hi].copy_from_slice(&source[from..from + (hi - lo)]);
    }
    dest[hi..].fill(0.0);
}

/// [`copy_run`] 16 values at a time: a load masked to the lanes inside `source` (masked lanes
/// are neither read nor able to fault) and a store masked to the lanes inside `dest`.
///
/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy_run_avx512(dest: &mut [f32], source: &[f32], x0: isize) {
    use std::arch::x86_64::*;
    let (len, w) = (dest.len(), source.len() as isize);
    let mut t = 0;
    while t < len {
        let lanes = (len - t).min(16);
        let inside_dest: u32 = (1u32 << lanes) - 1;
        let first = x0 + t as isize;
        let (lo, hi) = ((-first).clamp(0, 16), (w - first).clamp(0, 16));
        let inside_source: u32 = if hi > lo {
            ((1u32 << hi) - 1) & !((1u32 << lo) - 1)
        } else {
            0
        };
        // SAFETY: lane `l` is loaded only if `0 ≤ first + l < w` (inside `source`) and stored
        // only if `t + l < len` (inside `dest`); `wrapping_offset` forms the base pointer
        // without asserting it lies inside the slice.
        unsafe {
            let value = _mm512_maskz_loadu_ps(
                (inside_source & inside_dest) as __mmask16,
                source.as_ptr().wrapping_offset(first),
            );
            _mm512_mask_storeu_ps(dest.as_mut_ptr().add(t), inside_dest as __mmask16, value);
        }
        t += 16;
    }
}

/// [`pack_im2col_panel`] for a unit column stride, 16 values at a time. For every kernel offset
/// and vector of the panel row, the loads that fill it are planned once per panel: one per
/// output row the vector's pixels lie in, masked to the lanes whose input pixel is inside the
/// image (masked lanes are neither read nor able to fault; the rest stay zero). Each channel
/// then runs the same loads, a plane further on.
///
/// # Safety
/// The CPU supports AVX-512F; `nr` is a multiple of 16; `segments` are the panel's (as
/// [`pack_im2col_panel`] made them) and `out` holds `k · nr` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_unit_stride_avx512(
    b: &Im2colRef,
    cols: usize,
    nr: usize,
    out: &mut [f32],
    segments: &[Segment],
) {
    use std::arch::x86_64::*;
    let [h, w] = b.size;
    let window = &b.window;
    let [kh, kw] = window.kernel;
    let [dh, dw] = window.dilation;
    let [ph, pw] = window.padding;
    let sh = window.stride[0];
    let vectors = nr / 16;
    // Loads `(plane offset of the vector's lane 0, lane mask)`, grouped by (offset, vector).
    let mut loads: Vec<(isize, __mmask16)> = Vec::new();
    let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(kh * kw * vectors);
    for i in 0..kh {
        for j in 0..kw {
            for v in 0..vectors {
                let first_load = loads.len();
                let lanes = 16 * v..16 * v + 16;
                for s in segments {
                    let y = (s.row * sh + i * dh) as isize - ph as isize;
                    if y < 0 || y >= h as isize {
                        continue;
                    }
                    let x0 = (s.first + j * dw) as isize - pw as isize;
                    // Panel columns whose input pixel is inside the row.
                    let lo = s.column as isize + (-x0).max(0);
                    let hi = s.column as isize + (w as isize - x0).min(s.len as isize);
                    let (lo, hi) = (lo.max(lanes.start as isize), hi.min(lanes.end.min(cols) as isize));
                    if lo >= hi {
                        continue;
                    }
                    let (lo, hi) = (lo as usize - lanes.start, hi as usize - lanes.start);
                    let mask = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as __mmask16;
                    // Column `t` of the segment reads plane element `y·w + x0 + t − column`.
                    let base = y * w as isize + x0 - s.column as isize + lanes.start as isize;
                    loads.push((base, mask));
                }
                ranges.push((first_load, loads.len()));
            }
        }
    }
    let plane_len = h * w;
    let taps = kh * kw;
    for channel in 0..b.channels {
        let plane = &b.data[b.offset + channel * plane_len..][..plane_len];
        let rows = &mut out[channel * taps * nr..][..taps * nr];
        for (vector, &(from, to)) in rows.chunks_exact_mut(16).zip(&ranges) {
            let mut value = _mm512_setzero_ps();
            for &(base, mask) in &loads[from..to] {
                // SAFETY: every lane the mask keeps reads plane element `base + lane`, which the
                // plan above put inside the row `y` (`0 ≤ y < h`, `0 ≤ x < w`) of this plane;
                // `wrapping_offset` forms the base pointer without asserting it is inside.
                value = unsafe {
                    _mm512_mask_loadu_ps(value, mask, plane.as_ptr().wrapping_offset(base))
                };
            }
            // SAFETY: `vector` is a chunk of 16 values of `out`.
            unsafe { _mm512_storeu_ps(vector.as_mut_ptr(), value) };
        }
    }
}
