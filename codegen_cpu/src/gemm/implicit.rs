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
                        // Pixels `lo..hi` of the run read inside the row.
                        let lo = (-x0).clamp(0, s.len as isize) as usize;
                        let hi = (w as isize - x0).clamp(lo as isize, s.len as isize) as usize;
                        dest[..lo].fill(0.0);
                        if hi > lo {
                            let from = (x0 + lo as isize) as usize;
                            dest[lo..hi].copy_from_slice(&source[from..from + (hi - lo)]);
                        }
                        dest[hi..].fill(0.0);
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
