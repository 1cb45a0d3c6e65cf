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
//! to memory. Per panel, `k` is walked in depth blocks of `kc` rows ([`Kernel::kc`]; a block
//! of the panel, `kc · nr` values, stays in L2 while the micro-panels of `a` pass by), and the
//! `m × nr` output tile they accumulate stays in L1 across the blocks.
//!
//! Safety: the micro-kernel calls rest on [`Im2colRef::new`] (the image's planes lie inside
//! the slice), [`PackedA`]'s size (from the same shapes the loops run over) and
//! [`MatrixMut::new`] (the output rows lie inside theirs).

use super::{pack, AlignedBuffer, GemmError, Kernel, MatrixMut, MatrixRef, TileArgs};
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

    pub fn channels(&self) -> usize {
        self.channels
    }

    pub fn window(&self) -> Window2d {
        self.window
    }

    /// `[h, w]`: the size of each input plane.
    pub fn size(&self) -> [usize; 2] {
        self.size
    }

    /// `[OH, OW]`: the size of the output plane.
    pub fn out_size(&self) -> [usize; 2] {
        self.out
    }

    /// The `h · w` values of channel `channel < channels` (inside `data`, checked by
    /// [`Im2colRef::new`]).
    pub(super) fn plane(&self, channel: usize) -> &'a [f32] {
        assert!(
            channel < self.channels,
            "channel {channel} of {}",
            self.channels
        );
        let len = self.size[0] * self.size[1];
        &self.data[self.offset + channel * len..][..len]
    }

    /// `[k, n]`: `channels·KH·KW` rows, `OH·OW` columns.
    pub fn shape(&self) -> [usize; 2] {
        [
            self.channels * self.window.taps(),
            self.out[0] * self.out[1],
        ]
    }
}

/// `a` (`m × k`) packed for one kernel: for every depth block of `kc` columns starting at `depth`,
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
        values.prepare(padded_m * k, "weight")?;
        let all = values.as_mut_slice();
        let kc_block = kernel.kc(k);
        for depth in (0..k).step_by(kc_block) {
            let kc = kc_block.min(k - depth);
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

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }
}

thread_local! {
    /// Each thread's buffer for one packed panel of an im2col, kept between calls.
    static PANEL: std::cell::Cell<AlignedBuffer> = const { std::cell::Cell::new(AlignedBuffer::new()) };
}

/// `c = a · b` on the calling thread, `b` the im2col of an image (see the module doc).
pub fn multiply_im2col(a: &PackedA, b: &Im2colRef, c: &mut MatrixMut) -> Result<(), GemmError> {
    let n = b.shape()[1];
    check_im2col(a, b, c.shape())?;
    // SAFETY: the shapes agree (checked), and `c`, borrowed uniquely for the call, holds every
    // row of `n` columns `row_stride` apart (`MatrixMut::new`).
    unsafe { multiply_im2col_columns(a, b, c.data.as_mut_ptr(), c.row_stride, 0..n) }
}

/// Checks that `a` (`m × k`, packed) times `b` (`k × n`) makes an output of `c_shape`.
pub fn check_im2col(a: &PackedA, b: &Im2colRef, c_shape: [usize; 2]) -> Result<(), GemmError> {
    let [k, n] = b.shape();
    if a.k != k || c_shape != [a.m, n] {
        return Err(GemmError::Shape {
            a: a.shape(),
            b: b.shape(),
            c: c_shape,
        });
    }
    Ok(())
}

/// Columns `columns` of `c = a · b` (the rest untouched): panels of `nr` columns from
/// `columns.start` on, each column summed as [`multiply_im2col`] sums it (so pieces of columns
/// computed apart give the same bits as the whole).
///
/// # Safety
/// `check_im2col(a, b, [m, n])` passed; `columns.end ≤ n`; `c + i · ldc + j` is writable for
/// every `i < m` and `j` in `columns`, touched by no one else during the call.
///
/// Fails only when this thread's panel buffer cannot be allocated (`OutOfMemory`), or in
/// checking mode when a write outside it is found (`BufferCheck`).
pub unsafe fn multiply_im2col_columns(
    a: &PackedA,
    b: &Im2colRef,
    c: *mut f32,
    ldc: usize,
    columns: std::ops::Range<usize>,
) -> Result<(), GemmError> {
    let k = b.shape()[0];
    let m = a.m;
    let kernel = a.kernel;
    let nr = kernel.nr();
    if m == 0 || columns.is_empty() {
        return Ok(());
    }
    if k == 0 {
        for i in 0..m {
            // SAFETY: row `i`, columns `columns` are the caller's.
            unsafe {
                std::slice::from_raw_parts_mut(c.add(i * ldc + columns.start), columns.len())
            }
            .fill(0.0);
        }
        return Ok(());
    }
    PANEL.with(|cell| {
        let mut panel = cell.take();
        if let Err(e) = panel.prepare(k * nr, "im2col panel") {
            cell.set(panel);
            return Err(e.into());
        }
        let values = panel.as_mut_slice();
        let mut segments = Vec::new();
        let mut start = columns.start;
        while start < columns.end {
            let cols = nr.min(columns.end - start);
            pack_im2col_panel(b, start, cols, nr, values, &mut segments);
            // SAFETY: `a` is `m × k` packed (the caller checked the shapes), the panel holds
            // `k · nr` values, and columns `start..start + cols` of every row are the
            // caller's.
            unsafe { multiply_panel(a, values, c.add(start), ldc, cols) };
            start += cols;
        }
        let checked = panel.check("im2col panel");
        cell.set(panel);
        Ok(checked?)
    })
}

/// `c[0..m, 0..cols] = a · panel` by the micro-kernel: `panel` is one packed panel of `b`
/// (`k · nr` values, value `(p, j)` at `p · nr + j`), `k` walked in depth blocks of
/// [`Kernel::kc`], each block's `m × cols` tile of `c` in L1 across the blocks.
///
/// # Safety
/// `a` is `m × k` packed for a supported kernel, `panel` holds at least `k · nr` values, `m`,
/// `k` and `cols ≤ nr` are at least 1, and `c + i · ldc + j` is writable for `i < m`,
/// `j < cols`, touched by no one else during the call and overlapping neither operand.
pub(super) unsafe fn multiply_panel(
    a: &PackedA,
    panel: &[f32],
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    let (m, k, kernel) = (a.m, a.k, a.kernel);
    let (mr, nr) = (kernel.mr(), kernel.nr());
    let padded_m = m.div_ceil(mr) * mr;
    let packed_a = &a.values.as_slice()[..padded_m * k];
    let kc_block = kernel.kc(k);
    for depth in (0..k).step_by(kc_block) {
        let kc = kc_block.min(k - depth);
        let b_block = &panel[depth * nr..][..kc * nr];
        let a_block = &packed_a[depth * padded_m..][..padded_m * kc];
        for (r, a_panel) in a_block.chunks_exact(mr * kc).enumerate() {
            let args = TileArgs {
                kc,
                a: a_panel.as_ptr(),
                b: b_block.as_ptr(),
                // SAFETY: row `r·mr < m`: inside the caller's `m × cols` tile.
                c: unsafe { c.add(r * mr * ldc) },
                ldc,
                rows: mr.min(m - r * mr),
                cols,
                accumulate: depth > 0,
                prefetch: super::Lines::NONE,
            };
            // SAFETY: `PackedA::pack` checked the kernel is supported; the panels are slices
            // of `kc·mr` and `kc·nr` values; `rows ≤ mr`, `cols ≤ nr` stay inside the
            // caller's tile.
            unsafe { kernel.tile(&args) };
        }
    }
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
    if window.stride[1] == 1 && nr.is_multiple_of(16) && Kernel::Avx512.is_supported() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { pack_unit_stride_avx512(b, cols, nr, out, segments) };
        return;
    }
    pack_scalar(b, cols, nr, out, segments);
}

/// [`pack_im2col_panel`] one run (stride 1) or one value (other strides) at a time.
fn pack_scalar(b: &Im2colRef, cols: usize, nr: usize, out: &mut [f32], segments: &[Segment]) {
    let [h, w] = b.size;
    let window = &b.window;
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
                    let (lo, hi) = (
                        lo.max(lanes.start as isize),
                        hi.min(lanes.end.min(cols) as isize),
                    );
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
    // Every vector runs the same number of loads (the most any needs, padded with empty masks
    // at offset 0, which read nothing), so the loop below has no branch that depends on the
    // panel's geometry. Measured on Zen 4 (64 channels of 56x56, 3x3, one thread): the packing
    // took 0.256 ms of 2.26 ms per image with a variable count, 0.236 ms with this; the rest of
    // its cost is the traffic of the panel (147 KiB) between L1 and L2.
    let most = ranges
        .iter()
        .map(|&(from, to)| to - from)
        .max()
        .unwrap_or(0);
    let mut plan: Vec<(isize, __mmask16)> = Vec::with_capacity(ranges.len() * most);
    for &(from, to) in &ranges {
        plan.extend_from_slice(&loads[from..to]);
        plan.extend(std::iter::repeat_n((0, 0), most - (to - from)));
    }
    // SAFETY: forwarded: `plan` holds `most` loads per vector of the panel, each inside its
    // plane's row for the lanes its mask keeps; `out` holds `k · nr` values.
    unsafe {
        match most {
            0 => out.fill(0.0),
            1 => run_plan::<1>(b, nr, out, &plan),
            2 => run_plan::<2>(b, nr, out, &plan),
            3 => run_plan::<3>(b, nr, out, &plan),
            _ => run_plan_any(b, nr, out, &plan, most),
        }
    }
}

/// Fills the panel from a plan of `LOADS` masked loads per vector (see
/// [`pack_unit_stride_avx512`]), the same plan for every channel, a plane further on.
///
/// # Safety
/// The CPU supports AVX-512F; `plan` holds `LOADS` loads for each of the `taps · nr / 16`
/// vectors of one channel's rows, each reading, for the lanes its mask keeps, plane elements
/// `base + lane` inside the plane; `out` holds `channels · taps · nr` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn run_plan<const LOADS: usize>(
    b: &Im2colRef,
    nr: usize,
    out: &mut [f32],
    plan: &[(isize, std::arch::x86_64::__mmask16)],
) {
    use std::arch::x86_64::*;
    let plane_len = b.size[0] * b.size[1];
    let taps = b.window.taps();
    for channel in 0..b.channels {
        let plane = &b.data[b.offset + channel * plane_len..][..plane_len];
        let rows = &mut out[channel * taps * nr..][..taps * nr];
        for (vector, loads) in rows.chunks_exact_mut(16).zip(plan.chunks_exact(LOADS)) {
            let mut value = _mm512_setzero_si512();
            for &(base, mask) in loads {
                // SAFETY: every lane the mask keeps reads plane element `base + lane`, inside
                // this plane (the caller's plan); masked lanes are neither read nor able to
                // fault; `wrapping_offset` forms the pointer without asserting it is inside.
                // The loads of one vector keep disjoint lanes: OR merges them.
                let part =
                    unsafe { _mm512_maskz_loadu_ps(mask, plane.as_ptr().wrapping_offset(base)) };
                value = _mm512_or_si512(value, _mm512_castps_si512(part));
            }
            // SAFETY: `vector` is a chunk of 16 values of `out`.
            unsafe { _mm512_storeu_ps(vector.as_mut_ptr(), _mm512_castsi512_ps(value)) };
        }
    }
}

/// [`run_plan`] for any number of loads per vector (windows over rows narrower than a
/// vector).
///
/// # Safety
/// As [`run_plan`], with `loads` loads per vector.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn run_plan_any(
    b: &Im2colRef,
    nr: usize,
    out: &mut [f32],
    plan: &[(isize, std::arch::x86_64::__mmask16)],
    loads: usize,
) {
    use std::arch::x86_64::*;
    let plane_len = b.size[0] * b.size[1];
    let taps = b.window.taps();
    for channel in 0..b.channels {
        let plane = &b.data[b.offset + channel * plane_len..][..plane_len];
        let rows = &mut out[channel * taps * nr..][..taps * nr];
        for (vector, loads) in rows.chunks_exact_mut(16).zip(plan.chunks_exact(loads)) {
            let mut value = _mm512_setzero_si512();
            for &(base, mask) in loads {
                // SAFETY: as in `run_plan`.
                let part =
                    unsafe { _mm512_maskz_loadu_ps(mask, plane.as_ptr().wrapping_offset(base)) };
                value = _mm512_or_si512(value, _mm512_castps_si512(part));
            }
            // SAFETY: `vector` is a chunk of 16 values of `out`.
            unsafe { _mm512_storeu_ps(vector.as_mut_ptr(), _mm512_castsi512_ps(value)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + seed * 13) % 23) as f32 / 11.0 - 1.0)
            .collect()
    }

    /// Every kernel this CPU has (and with it the scalar packing, for the narrower ones) against
    /// a naive convolution summed in f64, and the AVX-512 packing against the scalar one.
    #[test]
    fn every_kernel_and_packing_matches_a_naive_convolution() {
        // (channels, out channels, kernel, stride, padding, dilation, (h, w))
        let cases = [
            (3, 5, [3, 3], 1, 1, 1, [7, 9]),
            (7, 13, [3, 3], 1, 1, 1, [11, 5]),
            (17, 8, [3, 3], 2, 1, 1, [13, 19]),
            (4, 7, [3, 3], 1, 2, 2, [9, 71]),
            (2, 3, [5, 5], 1, 2, 1, [4, 4]),
            (5, 6, [1, 3], 3, 0, 1, [3, 40]),
        ];
        for (c, o, kernel, s, p, d, [h, w]) in cases {
            let window = Window2d {
                kernel,
                stride: [s, s],
                padding: [p, p],
                dilation: [d, d],
            };
            let [oh, ow] = window.output_size(h, w).unwrap();
            let (k, n) = (c * window.taps(), oh * ow);
            let (x, weight) = (values(c * h * w, 1), values(o * k, 2));
            let mut want = vec![0f64; o * n];
            for (r, row) in want.chunks_mut(n).enumerate() {
                for (l, value) in row.iter_mut().enumerate() {
                    let (y0, x0) = ((l / ow) * s, (l % ow) * s);
                    for ci in 0..c {
                        for i in 0..kernel[0] {
                            for j in 0..kernel[1] {
                                let (y, xx) = (y0 + i * d, x0 + j * d);
                                if y < p || xx < p || y - p >= h || xx - p >= w {
                                    continue;
                                }
                                let tap = (ci * kernel[0] + i) * kernel[1] + j;
                                *value += weight[r * k + tap] as f64
                                    * x[(ci * h + y - p) * w + xx - p] as f64;
                            }
                        }
                    }
                }
            }
            let b = Im2colRef::new(&x, 0, c, [h, w], window).unwrap();
            for kernel in Kernel::ALL.into_iter().filter(|k| k.is_supported()) {
                let a = MatrixRef::row_major(&weight, o, k).unwrap();
                let packed = PackedA::pack(&a, kernel).unwrap();
                let mut got = vec![f32::NAN; o * n];
                multiply_im2col(
                    &packed,
                    &b,
                    &mut MatrixMut::row_major(&mut got, o, n).unwrap(),
                )
                .unwrap();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0),
                        "{kernel:?} {window}: element {i}: {g} vs {w}"
                    );
                }
            }
            // Both packings of every panel agree.
            let nr = 64;
            let mut segments = Vec::new();
            for start in (0..n).step_by(nr) {
                let cols = nr.min(n - start);
                let (mut fast, mut plain) = (vec![f32::NAN; k * nr], vec![f32::NAN; k * nr]);
                pack_im2col_panel(&b, start, cols, nr, &mut fast, &mut segments);
                pack_scalar(&b, cols, nr, &mut plain, &segments);
                assert_eq!(fast, plain, "{window}, panel at {start}");
            }
        }
    }

    #[test]
    fn sources_outside_their_slice_and_windows_that_do_not_fit_are_errors() {
        let window = Window2d {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
        };
        let x = vec![0f32; 2 * 5 * 5];
        assert!(matches!(
            Im2colRef::new(&x, 1, 2, [5, 5], window),
            Err(GemmError::OutOfBounds { .. })
        ));
        assert!(matches!(
            Im2colRef::new(&x, 0, 2, [2, 5], window),
            Err(GemmError::Window { .. })
        ));
    }
}
