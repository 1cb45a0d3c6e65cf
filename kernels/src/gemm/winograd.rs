//! Winograd F(2×2, 3×3) convolution: `c = a · im2col(x)` for a 3×3 window of stride 1 and
//! dilation 1 (any padding), with 16 products of depth `C` in place of one of depth `9·C`:
//! 2.25 times fewer multiplies than the implicit GEMM ([`super::multiply_im2col`]).
//!
//! Method (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). The
//! output plane is cut into tiles of 2×2 pixels (`ceil(OH/2) · ceil(OW/2)` of them; a tile
//! past the bottom or right edge computes pixels no one stores). Tile `(ty, tx)` reads the
//! 4×4 input patch at rows `2·ty − ph ..`, columns `2·tx − pw ..` (zeros outside the image).
//! With `G` (4×3), `Bᵀ` (4×4) and `Aᵀ` (2×4) the F(2, 3) matrices:
//! - the weight of output channel `k` and input channel `c` becomes `U = G g Gᵀ` (4×4),
//!   16 matrices `U_ξ` of `K × C`, one per position `ξ` of the 4×4 ([`WinogradWeight`]);
//! - each patch `d` of channel `c` becomes `V = Bᵀ d B`, 16 matrices `V_ξ` of `C × tiles`;
//! - `M_ξ = U_ξ · V_ξ` (16 GEMMs by the micro-kernels of [`Kernel`]);
//! - every tile's 2×2 outputs are `Aᵀ M A`, from its 16 values `M_ξ[k, tile]`.
//!
//! Accuracy: the transforms of `d` and `M` only add and subtract (exact up to one rounding
//! each), and `U` is computed in f64 and rounded once; but `U` mixes each filter's 9 taps, so an
//! output's rounding error scales with `Σ |x| · max |w|` over its terms (`max |w|` the largest
//! tap of the term's filter), not with `Σ |x| · |w|` as a direct sum's does: a padded corner
//! whose few taps are small carries the rounding of the larger taps, which cancel only in exact
//! arithmetic. The tests bound the error against an f64 direct convolution by `1e-6` of that
//! scale (measured: at most 2.0e-7 over 88 shapes of 1 to 64 channels).
//!
//! Blocking: the weight's 16 transformed matrices are packed once per product into
//! [`PackedA`] (once for all calls for a frozen weight) and shared by every image and thread.
//! The tiles of an image are walked in blocks of `nr` (the micro-kernel's panel width; tiles in
//! row-major order, a block may span tile rows). For each block, on the calling thread:
//! 1. the input transform writes the 16 panels `V_ξ` (`C · nr` values each, value `(c, j)` at
//!    `c · nr + j`: the packed-`b` layout of [`TileArgs`]) into a per-thread buffer, one cache
//!    line apart ([`spaced`]);
//! 2. for each `ξ` the micro-kernel multiplies the packed `U_ξ` by panel `V_ξ` into `M_ξ`
//!    (`K × nr`, a second per-thread buffer), depth blocks of [`Kernel::kc`] as the implicit
//!    GEMM does;
//! 3. the output transform reads the 16 `M_ξ` of each tile and writes its 2×2 pixels into `c`.
//!
//! While the products run, the input rows of the next block and the output rows of this one
//! are prefetched into L2, a sixteenth with each product (both transforms otherwise wait for
//! memory: on the ResNet block, 2 threads, the step went from 13.1-13.4 to 12.0-12.2 ms).
//!
//! For 64 channels in and out (a ResNet stage), both buffers hold 256 KiB, and the packed
//! weight another 256 KiB: all three stay in L2 (1 MiB on Zen 4) from one block to the next.
//! With AVX-512, both transforms run on 16 tiles at once (16 consecutive columns of a block,
//! cut into pieces where they cross a row of tiles): the input transform reads each row of the
//! patches of a piece's tiles as 34 consecutive input values (three masked loads, lanes outside
//! the image zero) and four permutes, and the output transform writes each row of a piece's
//! outputs as 32 consecutive values (two permutes, two masked stores). Measured on Zen 4, one
//! thread, 64 channels of 56x56 (`conv_probe`): 1.21 ms per image, against 2.26 ms for the
//! implicit GEMM; one masked gather per patch value of 16 tiles took 1.50-1.63 ms, most of it
//! the gathers. With AVX2 (and no AVX-512) they run on 8 tiles at once the same way: each row
//! of a piece's patches is 18 consecutive input values, loaded as columns `0..16` and `2..18`
//! (plain loads inside the image, masked ones at its edges) and split into even and odd
//! columns by a shuffle and a permute each; each row of outputs is interleaved by two unpacks
//! and two permutes into 16 consecutive values (plain stores, masked ones at the edges of a
//! piece). With the AVX2 kernel (`nr = 16`) both buffers hold 64 KiB and the packed weight
//! 256 KiB (L2: 512 KiB on Zen 3); perf puts 65-70% of the time in the micro-kernel (about
//! 1.1 ms for the 103 MFLOP of an image, near the FMA peak). Measured on Zen 3, one thread,
//! 64 channels of 56x56 (`conv_probe`): 1.62-1.73 ms per image, against 3.66-3.90 ms for the
//! implicit GEMM and 5.08-5.32 ms with the plain transforms. Without
//! either they run tile by tile in plain code that does the same additions in the same order,
//! so all give the same bits.
//!
//! Safety: the micro-kernel calls rest on [`PackedA`]'s size (from the shapes checked in
//! [`multiply_winograd`]) and the per-thread buffers' sizes (made from the same shapes); the
//! masked loads on their masks keeping only columns `0..w` of rows `0..h` (made with the
//! pieces) and [`Im2colRef::new`] (the planes lie inside the slice); the masked stores on
//! theirs keeping only columns `0..OW` of rows `0..OH` and [`MatrixMut::new`] (the rows of `c`
//! lie inside its slice); the AVX2 transforms' plain loads and stores on the pieces' bits
//! showing every column they touch inside the image or the output.

use super::implicit::{multiply_panel, Im2colRef, PackedA};
use super::{AlignedBuffer, GemmError, Kernel, MatrixMut, MatrixRef};
use minductor_ir::Window2d;
use std::sync::OnceLock;

/// Values of a transformed 4×4 tile (positions `ξ = 4·i + j`).
const POSITIONS: usize = 16;
/// Tiles per vector of the AVX-512 transforms.
const LANES: usize = 16;
/// Tiles per vector of the AVX2 transforms.
const AVX2_LANES: usize = 8;

/// The distance between consecutive panels `V_ξ` (or products `M_ξ`) of `len` values in the
/// per-thread buffers: one cache line more than `len`. With `len` a multiple of 4 KiB (64
/// channels and `nr = 16`), the 16 values of a tile, one in each panel, would otherwise all
/// fall in one set of the L1 cache (8 ways on Zen 3): the transforms' 16 stores (and 16
/// loads) of each tile evicted each other.
fn spaced(len: usize) -> usize {
    len + 16
}

/// How a convolution is computed, as `MINDUCTOR_CONV_ALGO` asks (read once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvAlgorithm {
    /// The implicit GEMM over im2col panels, always.
    Im2col,
    /// Winograd F(2×2, 3×3) wherever the window allows it (3×3, stride 1, dilation 1).
    Winograd,
    /// Winograd where [`prefers_winograd`]'s rule expects it to be faster (the default, also
    /// for an unknown value).
    Auto,
}

impl ConvAlgorithm {
    /// `MINDUCTOR_CONV_ALGO=im2col|winograd|auto`, read on the first call.
    pub fn from_env() -> ConvAlgorithm {
        static CHOSEN: OnceLock<ConvAlgorithm> = OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("MINDUCTOR_CONV_ALGO").as_deref() {
            Ok("im2col") => ConvAlgorithm::Im2col,
            Ok("winograd") => ConvAlgorithm::Winograd,
            _ => ConvAlgorithm::Auto,
        })
    }
}

/// Whether [`multiply_winograd`] can compute a window: 3×3, stride 1, dilation 1.
pub fn is_winograd_window(window: &Window2d) -> bool {
    window.kernel == [3, 3] && window.stride == [1, 1] && window.dilation == [1, 1]
}

/// Whether a convolution of `channels` input channels (per group) over an `h × w` image should
/// run as Winograd with `kernel`, under `algorithm` (the count of output channels mattered
/// less in the measurements: on Zen 4 1, 3, 8 and 64 all won; on Zen 3 few input channels
/// into 64 output channels lost, see below).
///
/// The rule for [`ConvAlgorithm::Auto`]: the AVX-512 kernel and transforms with at least 4
/// input channels, or the AVX2 kernel and transforms with at least 12 (the other pairs are
/// not measured: the implicit GEMM stays theirs), and at most 90% of the implicit GEMM's
/// panel-steps. Winograd runs 16 products of depth `C` over `ceil(tiles / nr)` panels, the
/// implicit GEMM one of depth `9·C` over `ceil(OH·OW / nr)`; a small image leaves most of
/// Winograd's one panel empty (7×7: 16 tiles of 64 columns). The rule depends on the CPU and
/// the shapes only, never on the thread count.
///
/// Measured on Zen 4 (AVX-512), one thread, one image (`conv_probe`, ms per image, implicit
/// → Winograd): 64→64 56×56 2.26 → 1.21, 28×28 0.59 → 0.35, 14×14 0.18 → 0.09; 12×12 0.134
/// → 0.087, 10×10 and 9×9 (18 against 16 panel-steps) 0.091 → 0.085, 8×8 (9 against 16;
/// 128 channels) 0.170 → 0.308; 256→256 7×7 0.67 → 1.23; 16→16 56×56 0.196 → 0.127, 8→8
/// 0.080 → 0.048, 64→1 0.267 → 0.173, 4→64 0.172 → 0.161, 3→64 0.141 → 0.150.
///
/// Measured on Zen 3 (AVX2, `nr = 16`), the same way (two runs each, the faster; the machine
/// was shared): 64→64 56×56 3.91 → 1.70, 28×28 0.99 → 0.44, 14×14 0.30 → 0.14, 12×12 0.21 →
/// 0.10, 10×10 0.17 → 0.075, 9×9 0.20 → 0.089, 7×7 0.10 → 0.035, 6×6 0.10 → 0.045, 4×4
/// (excluded: 16 against 9 panel-steps) 0.040 → 0.038, 256→256 4×4 0.35 → 0.43; 128→128 8×8
/// 0.28 → 0.11; 256→256 7×7 1.04 → 0.41; 32→32 14×14 0.105 → 0.048; 16→64 14×14 0.072 →
/// 0.054, 7×7 0.025 → 0.014; 12→64 56×56 0.97 → 0.69, 28×28 0.18 → 0.13, 14×14 0.054 →
/// 0.049; 16→16 56×56 0.73 → 0.32; 64→1 1.19 → 0.31. Below 12 channels into 64 the products
/// are too shallow for the output transform of 64 channels: 10→64 14×14 0.046 → 0.047, 8→64
/// 56×56 0.47 → 0.39 but 14×14 0.036 → 0.043, 6→64 56×56 0.36 → 0.35, 5→64 0.30 → 0.32,
/// 4→64 0.375 → 0.486, 3→64 0.30 → 0.46 (while 8→8 56×56 0.19 → 0.10 and 4→4 0.083 → 0.060
/// won; the output channels are not known here).
pub fn prefers_winograd(
    algorithm: ConvAlgorithm,
    kernel: Kernel,
    window: &Window2d,
    channels: usize,
    [h, w]: [usize; 2],
) -> bool {
    if !is_winograd_window(window) {
        return false;
    }
    let Some([oh, ow]) = window.output_size(h, w) else {
        return false;
    };
    match algorithm {
        ConvAlgorithm::Im2col => false,
        ConvAlgorithm::Winograd => true,
        ConvAlgorithm::Auto => {
            let nr = kernel.nr();
            let tiles = oh.div_ceil(2) * ow.div_ceil(2);
            let winograd = POSITIONS * tiles.div_ceil(nr);
            let implicit = 9 * (oh * ow).div_ceil(nr);
            let fewest_channels = match (kernel, Transforms::detect()) {
                (Kernel::Avx512, Transforms::Avx512) => 4,
                (Kernel::Avx2, Transforms::Avx2) => 12,
                _ => return false,
            };
            channels >= fewest_channels && winograd * 10 <= implicit * 9
        }
    }
}

/// Whether transforming a weight of `out_channels × channels` filters for one call pays for
/// itself over the call's `images` images of `OH × OW` outputs (a frozen weight is transformed
/// once, at compile time, and needs no such check). It is judged over all the images, not
/// those each thread runs: the choice of algorithm must not depend on the thread count, or
/// results would differ between thread counts (Winograd and the implicit GEMM round
/// differently). Measured on Zen 4
/// (`conv_probe`): the transform takes about `10 µs + 20 ns` per filter (64×64: 0.08 ms,
/// 32×32: 0.039, 16×16: 0.015), and Winograd saves about 40% of the implicit GEMM's time,
/// which runs at about 100 GFLOP/s: `0.4 · 18 · K · C · OH · OW / 1e11` s per image. The tiny
/// ResNet of the examples (2 images on 2 threads, 16 to 32 channels) lost 3-5% with every
/// eligible weight transformed at every call.
pub fn winograd_transform_pays_off(
    images: usize,
    channels: usize,
    out_channels: usize,
    [oh, ow]: [usize; 2],
) -> bool {
    let filters = (channels * out_channels) as f64;
    let saved_ns = images as f64 * 0.072 * filters * (oh * ow) as f64;
    let cost_ns = 10_000.0 + 20.0 * filters;
    saved_ns > cost_ns
}

/// A convolution weight transformed for Winograd: `U_ξ = (G g Gᵀ)_ξ` for the 16 positions,
/// each a `K × C` matrix packed for one kernel.
pub struct WinogradWeight {
    out_channels: usize,
    channels: usize,
    /// `U_ξ` at index `ξ`; each `out_channels × channels`.
    positions: Vec<PackedA>,
}

impl WinogradWeight {
    /// Transforms and packs a weight seen as the `K × 9·C` matrix `a` of the implicit GEMM
    /// (column `9·c + 3·i + j` holds tap `(i, j)` of channel `c`): first into a buffer of `K`
    /// rows of 16 runs of `C` values (`U_ξ[k, c]` at `(16·k + ξ)·C + c`), then each `U_ξ`
    /// packed from it through strides. Measured on Zen 4 (64 channels in and out, one thread):
    /// 0.08-0.11 ms (0.23 when each `U_ξ` was a matrix of its own; splitting the rows and the
    /// packings across 2 threads measured no faster); the implicit GEMM packs its weight in
    /// 0.01 ms.
    pub fn transform(a: &MatrixRef, kernel: Kernel) -> Result<WinogradWeight, GemmError> {
        let [out_channels, depth] = a.shape();
        if !depth.is_multiple_of(9) {
            return Err(GemmError::Shape {
                a: a.shape(),
                b: [depth, 0],
                c: [out_channels, 0],
            });
        }
        let channels = depth / 9;
        let row_len = POSITIONS * channels;
        let mut buffer = AlignedBuffer::take(out_channels * row_len, "Winograd weight")?;
        let u = buffer.as_mut_slice();
        for (k, values) in u.chunks_exact_mut(row_len.max(1)).enumerate() {
            for c in 0..channels {
                let mut g = [[0f64; 3]; 3];
                for (i, taps) in g.iter_mut().enumerate() {
                    for (j, value) in taps.iter_mut().enumerate() {
                        *value = a.data[a.at(k, 9 * c + 3 * i + j)] as f64;
                    }
                }
                for (xi, value) in weight_transform(&g).into_iter().enumerate() {
                    values[xi * channels + c] = value as f32;
                }
            }
        }
        let u = buffer.as_slice();
        let positions = (0..POSITIONS)
            .map(|xi| {
                let matrix = MatrixRef::new(
                    u,
                    (xi * channels) as i64,
                    [out_channels, channels],
                    [row_len as i64, 1],
                    "transformed weight",
                )?;
                PackedA::pack(&matrix, kernel)
            })
            .collect::<Result<Vec<_>, _>>();
        super::give_back(buffer);
        Ok(WinogradWeight {
            out_channels,
            channels,
            positions: positions?,
        })
    }

    /// `[K, 9·C]`: the shape of the weight matrix it was made from.
    pub fn shape(&self) -> [usize; 2] {
        [self.out_channels, 9 * self.channels]
    }

    pub fn kernel(&self) -> Kernel {
        self.positions[0].kernel()
    }
}

/// `G g Gᵀ` for one 3×3 `g`, position `4·i + j` at index `4·i + j`, in f64 (rounded once).
fn weight_transform(g: &[[f64; 3]; 3]) -> [f64; POSITIONS] {
    // G = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]].
    let g_rows = |v: [f64; 3]| {
        [
            v[0],
            (v[0] + v[1] + v[2]) / 2.0,
            (v[0] - v[1] + v[2]) / 2.0,
            v[2],
        ]
    };
    // Rows of `G g` (4×3): column by column of `g`.
    let mut t = [[0f64; 3]; 4];
    for j in 0..3 {
        let column = g_rows([g[0][j], g[1][j], g[2][j]]);
        for i in 0..4 {
            t[i][j] = column[i];
        }
    }
    let mut out = [0f64; POSITIONS];
    for i in 0..4 {
        let row = g_rows(t[i]);
        out[4 * i..4 * i + 4].copy_from_slice(&row);
    }
    out
}

/// `Bᵀ x` for 4 values `x` (a column of a patch, or a row of one as `x B`), on any lane type
/// with `$add` and `$sub`: `Bᵀ = [[1, 0, −1, 0], [0, 1, 1, 0], [0, −1, 1, 0], [0, 1, 0, −1]]`.
/// The transforms are macros over one such step, so the plain and the AVX-512 code are the
/// same additions in the same order, and give the same bits.
macro_rules! b_transform {
    ($x0:expr, $x1:expr, $x2:expr, $x3:expr, $add:expr, $sub:expr) => {{
        let (x0, x1, x2, x3) = ($x0, $x1, $x2, $x3);
        [$sub(x0, x2), $add(x1, x2), $sub(x2, x1), $sub(x1, x3)]
    }};
}

/// `Aᵀ x` for 4 values `x`: `Aᵀ = [[1, 1, 1, 0], [0, 1, −1, −1]]`.
macro_rules! a_transform {
    ($x0:expr, $x1:expr, $x2:expr, $x3:expr, $add:expr, $sub:expr) => {{
        let (x0, x1, x2, x3) = ($x0, $x1, $x2, $x3);
        [$add($add(x0, x1), x2), $sub($sub(x1, x2), x3)]
    }};
}

/// `V = Bᵀ d B` for one 4×4 patch `d` (position `4·r + s` at index `4·r + s`): each row of the
/// patch first (`d B`, along `s`), then each column.
fn input_transform(d: [f32; POSITIONS]) -> [f32; POSITIONS] {
    let (add, sub) = (|x: f32, y: f32| x + y, |x: f32, y: f32| x - y);
    let mut t = [0f32; POSITIONS];
    for r in 0..4 {
        let row = b_transform!(d[4 * r], d[4 * r + 1], d[4 * r + 2], d[4 * r + 3], add, sub);
        t[4 * r..4 * r + 4].copy_from_slice(&row);
    }
    let mut v = [0f32; POSITIONS];
    for s in 0..4 {
        let column = b_transform!(t[s], t[4 + s], t[8 + s], t[12 + s], add, sub);
        for (r, value) in column.into_iter().enumerate() {
            v[4 * r + s] = value;
        }
    }
    v
}

/// `Y = Aᵀ M A` for one tile's 16 values `m` (position `4·r + s` at index `4·r + s`): each
/// column first (`Aᵀ M`), then each of the two rows; output `(y, x)` at index `2·y + x`.
fn output_transform(m: [f32; POSITIONS]) -> [f32; 4] {
    let (add, sub) = (|x: f32, y: f32| x + y, |x: f32, y: f32| x - y);
    let mut t = [0f32; 8];
    for c in 0..4 {
        let [top, bottom] = a_transform!(m[c], m[4 + c], m[8 + c], m[12 + c], add, sub);
        t[c] = top;
        t[4 + c] = bottom;
    }
    let mut y = [0f32; 4];
    for r in 0..2 {
        let row = a_transform!(t[4 * r], t[4 * r + 1], t[4 * r + 2], t[4 * r + 3], add, sub);
        y[2 * r..2 * r + 2].copy_from_slice(&row);
    }
    y
}

thread_local! {
    /// Each thread's 16 panels `V_ξ` of one block of tiles, kept between calls.
    static PANELS: std::cell::Cell<AlignedBuffer> = const { std::cell::Cell::new(AlignedBuffer::new()) };
    /// Each thread's 16 products `M_ξ` of one block of tiles, kept between calls.
    static PRODUCTS: std::cell::Cell<AlignedBuffer> = const { std::cell::Cell::new(AlignedBuffer::new()) };
}

/// The geometry of one image's tiles.
#[derive(Clone, Copy)]
struct Tiles {
    /// Input plane size.
    h: usize,
    w: usize,
    /// Output plane size.
    oh: usize,
    ow: usize,
    /// Padding before the first row and column.
    ph: usize,
    pw: usize,
    /// Tiles per row of tiles: `ceil(OW / 2)`.
    across: usize,
}

impl Tiles {
    /// Tile `t`'s first output pixel `(row, column)`.
    fn origin(&self, t: usize) -> (usize, usize) {
        (2 * (t / self.across), 2 * (t % self.across))
    }

    /// The plane index of patch value `(r, s)` of tile `t`, if inside the image.
    fn input_at(&self, t: usize, r: usize, s: usize) -> Option<usize> {
        let (y, x) = self.origin(t);
        let y = (y + r).checked_sub(self.ph).filter(|&y| y < self.h)?;
        let x = (x + s).checked_sub(self.pw).filter(|&x| x < self.w)?;
        Some(y * self.w + x)
    }

    /// The input rows that tiles `start..start + cols` read (`cols ≥ 1`).
    fn input_rows(&self, start: usize, cols: usize) -> std::ops::Range<usize> {
        let (first, last) = (start / self.across, (start + cols - 1) / self.across);
        let end = (2 * last + 4).saturating_sub(self.ph).min(self.h);
        (2 * first).saturating_sub(self.ph).min(end)..end
    }

    /// The output rows that tiles `start..start + cols` write (`cols ≥ 1`).
    fn output_rows(&self, start: usize, cols: usize) -> std::ops::Range<usize> {
        let (first, last) = (start / self.across, (start + cols - 1) / self.across);
        2 * first..(2 * last + 2).min(self.oh)
    }

    /// The output index of pixel `(r, s)` (each 0 or 1) of tile `t`, if inside the output.
    fn output_at(&self, t: usize, r: usize, s: usize) -> Option<usize> {
        let (y, x) = self.origin(t);
        let (y, x) = (y + r, x + s);
        (y < self.oh && x < self.ow).then_some(y * self.ow + x)
    }
}

/// `c = a · b` on the calling thread, `b` the im2col of an image under a 3×3, stride 1,
/// dilation 1 window and `a` its weight transformed (see the module doc).
pub fn multiply_winograd(
    a: &WinogradWeight,
    b: &Im2colRef,
    c: &mut MatrixMut,
) -> Result<(), GemmError> {
    multiply_winograd_with(a, b, c, Transforms::detect())
}

/// Which code runs the input and output transforms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transforms {
    /// 16 tiles at a time (AVX-512F, and a panel width that is a multiple of 16).
    Avx512,
    /// 8 tiles at a time (AVX2 and FMA, and a panel width that is a multiple of 8).
    Avx2,
    /// One tile at a time.
    Plain,
}

impl Transforms {
    /// Every kind, widest first.
    #[cfg(test)]
    const ALL: [Transforms; 3] = [Transforms::Avx512, Transforms::Avx2, Transforms::Plain];

    /// The widest transforms this CPU runs.
    fn detect() -> Transforms {
        [Transforms::Avx512, Transforms::Avx2]
            .into_iter()
            .find(|t| t.is_supported())
            .unwrap_or(Transforms::Plain)
    }

    /// Whether this CPU has the features the transforms are compiled for.
    fn is_supported(self) -> bool {
        match self {
            Transforms::Avx512 => Kernel::Avx512.is_supported(),
            Transforms::Avx2 => Kernel::Avx2.is_supported(),
            Transforms::Plain => true,
        }
    }

    /// Tiles per vector: the panel width must be a multiple of it.
    fn width(self) -> usize {
        match self {
            Transforms::Avx512 => LANES,
            Transforms::Avx2 => AVX2_LANES,
            Transforms::Plain => 1,
        }
    }
}

fn multiply_winograd_with(
    a: &WinogradWeight,
    b: &Im2colRef,
    c: &mut MatrixMut,
    transforms: Transforms,
) -> Result<(), GemmError> {
    let count = check_winograd(a, b, c.shape())?;
    let out = Planes {
        data: c.data.as_mut_ptr(),
        row_stride: c.row_stride,
    };
    // SAFETY: the shapes agree (checked), and `c`, borrowed uniquely for the call, holds every
    // row of `n` values `row_stride` apart (`MatrixMut::new`).
    unsafe { winograd_tiles_with(a, b, out, 0..count, transforms) }
}

/// Checks that `a` (a transformed `K × C` weight) and `b` (the im2col of a `C`-channel image
/// under a Winograd window) make an output of `c_shape`; returns the image's tile count.
pub fn check_winograd(
    a: &WinogradWeight,
    b: &Im2colRef,
    c_shape: [usize; 2],
) -> Result<usize, GemmError> {
    let [k, n] = b.shape();
    let window = b.window();
    let [h, w] = b.size();
    if !is_winograd_window(&window) {
        return Err(GemmError::Window { window, h, w });
    }
    if a.channels != b.channels() || c_shape != [a.out_channels, n] {
        return Err(GemmError::Shape {
            a: a.shape(),
            b: [k, n],
            c: c_shape,
        });
    }
    Ok(winograd_tile_count(b))
}

/// The 2×2 output tiles of `b`'s image (the units [`multiply_winograd_tiles`] takes).
pub fn winograd_tile_count(b: &Im2colRef) -> usize {
    let [oh, ow] = b.out_size();
    oh.div_ceil(2) * ow.div_ceil(2)
}

/// The output of a convolution as raw rows (one per output channel): `data + k · row_stride`
/// starts channel `k`'s plane.
#[derive(Clone, Copy)]
struct Planes {
    data: *mut f32,
    row_stride: usize,
}

/// The outputs of tiles `tiles` (row-major over the output, 2×2 pixels each) of `c = a ⊛ b`,
/// written at `c + k · ldc + pixel` (the other pixels untouched); every pixel is computed as
/// [`multiply_winograd`] computes it, so pieces of tiles computed apart give the same bits as
/// the whole.
///
/// # Safety
/// `check_winograd(a, b, [K, n])` passed; `tiles.end` is at most the tile count;
/// `c + k · ldc + j` is writable for every `k < K` and every pixel `j < n` of these tiles,
/// touched by no one else during the call and overlapping neither operand.
pub unsafe fn multiply_winograd_tiles(
    a: &WinogradWeight,
    b: &Im2colRef,
    c: *mut f32,
    ldc: usize,
    tiles: std::ops::Range<usize>,
) -> Result<(), GemmError> {
    let out = Planes {
        data: c,
        row_stride: ldc,
    };
    // SAFETY: the caller's.
    unsafe { winograd_tiles_with(a, b, out, tiles, Transforms::detect()) }
}

/// [`multiply_winograd_tiles`] with the given transforms.
///
/// # Safety
/// As [`multiply_winograd_tiles`], `out` for `c` and `ldc`.
unsafe fn winograd_tiles_with(
    a: &WinogradWeight,
    b: &Im2colRef,
    out: Planes,
    range: std::ops::Range<usize>,
    transforms: Transforms,
) -> Result<(), GemmError> {
    let n = b.shape()[1];
    let window = b.window();
    let [h, w] = b.size();
    let (out_channels, channels) = (a.out_channels, a.channels);
    if out_channels == 0 || n == 0 || range.is_empty() {
        return Ok(());
    }
    let [oh, ow] = b.out_size();
    let tiles = Tiles {
        h,
        w,
        oh,
        ow,
        ph: window.padding[0],
        pw: window.padding[1],
        across: ow.div_ceil(2),
    };
    if channels == 0 {
        for k in 0..out_channels {
            for t in range.clone() {
                for q in 0..4 {
                    if let Some(at) = tiles.output_at(t, q / 2, q % 2) {
                        // SAFETY: pixel `at` of tile `t` in plane `k`: the caller's.
                        unsafe { *out.data.add(k * out.row_stride + at) = 0.0 };
                    }
                }
            }
        }
        return Ok(());
    }
    let kernel = a.kernel();
    let nr = kernel.nr();
    let count = range.end;
    // The vector transforms index planes and output rows with i32 lanes.
    let transforms = if nr.is_multiple_of(transforms.width())
        && h * w <= i32::MAX as usize
        && n <= i32::MAX as usize
    {
        transforms
    } else {
        Transforms::Plain
    };
    let panel_len = spaced(channels * nr);
    let product_len = spaced(out_channels * nr);
    PANELS.with(|panels_cell| {
        PRODUCTS.with(|products_cell| {
            let (mut panels, mut products) = (panels_cell.take(), products_cell.take());
            let prepared = panels
                .prepare(POSITIONS * panel_len, "Winograd input tiles")
                .and_then(|()| products.prepare(POSITIONS * product_len, "Winograd products"));
            if let Err(e) = prepared {
                panels_cell.set(panels);
                products_cell.set(products);
                return Err(e.into());
            }
            let (v, m) = (panels.as_mut_slice(), products.as_mut_slice());
            for start in range.clone().step_by(nr) {
                let cols = nr.min(count - start);
                match transforms {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: AVX-512F is present (`Transforms::detect`), `nr` is a multiple
                    // of 16, planes are within i32 (checked above); `v` holds 16 panels of
                    // `spaced(C · nr)` values.
                    Transforms::Avx512 => unsafe {
                        transform_input_avx512(b, &tiles, start, cols, nr, v)
                    },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: AVX2 and FMA are present (`Transforms::detect`), `nr` is a
                    // multiple of 8, planes are within i32 (checked above); `v` holds 16
                    // panels of `spaced(C · nr)` values.
                    Transforms::Avx2 => unsafe {
                        transform_input_avx2(b, &tiles, start, cols, nr, v)
                    },
                    _ => transform_input(b, &tiles, start, cols, nr, v),
                }
                // While the products run, the input rows of the next block and the output
                // rows of this one are asked for, a sixteenth with each product.
                let next = start + nr;
                let next_input = if next < count {
                    tiles.input_rows(next, nr.min(count - next))
                } else {
                    0..0
                };
                let output = tiles.output_rows(start, cols);
                for (xi, u) in a.positions.iter().enumerate() {
                    for channel in channels * xi / POSITIONS..channels * (xi + 1) / POSITIONS {
                        prefetch(&b.plane(channel)[next_input.start * w..next_input.end * w]);
                    }
                    for k in out_channels * xi / POSITIONS..out_channels * (xi + 1) / POSITIONS {
                        for at in (output.start * ow..output.end * ow).step_by(16) {
                            // A prefetch is only a hint, and the address is inside plane `k`.
                            super::prefetch_line(out.data.wrapping_add(k * out.row_stride + at));
                        }
                    }
                    let panel = &v[xi * panel_len..][..panel_len];
                    let product = &mut m[xi * product_len..][..product_len];
                    // SAFETY: `u` is `K × C` packed (the shapes checked above), `panel` holds
                    // `C · nr` values, and `product` holds `K` rows of `nr` values, `cols ≤ nr`
                    // of each written; it is borrowed uniquely here.
                    unsafe { multiply_panel(u, panel, product.as_mut_ptr(), nr, cols) };
                }
                match transforms {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: AVX-512F is present, `nr` is a multiple of 16, output rows are
                    // within i32 (checked above); `m` holds 16 products of `spaced(K · nr)` values;
                    // the pixels of tiles `start..start + cols` are the caller's.
                    Transforms::Avx512 => unsafe {
                        transform_output_avx512(m, &tiles, start, cols, nr, out_channels, out)
                    },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: AVX2 and FMA are present, `nr` is a multiple of 8, output rows
                    // are within i32 (checked above); `m` holds 16 products of `spaced(K · nr)`
                    // values; the pixels of tiles `start..start + cols` are the caller's.
                    Transforms::Avx2 => unsafe {
                        transform_output_avx2(m, &tiles, start, cols, nr, out_channels, out)
                    },
                    // SAFETY: as above.
                    _ => unsafe { transform_output(m, &tiles, start, cols, nr, out_channels, out) },
                }
            }
            let checked = panels
                .check("Winograd input tiles")
                .and_then(|()| products.check("Winograd products"));
            panels_cell.set(panels);
            products_cell.set(products);
            Ok(checked?)
        })
    })
}

/// Asks the caches (L2) for the lines of `values`.
fn prefetch(values: &[f32]) {
    for line in values.chunks(16) {
        super::prefetch_line(line.as_ptr());
    }
}

/// Writes the 16 panels `V_ξ` of tiles `start..start + cols` into `v` (panel `ξ` at
/// `ξ · spaced(C · nr)`, value `(c, j)` at `c · nr + j`; columns `cols..nr` zero), one tile at a time.
fn transform_input(
    b: &Im2colRef,
    tiles: &Tiles,
    start: usize,
    cols: usize,
    nr: usize,
    v: &mut [f32],
) {
    let channels = b.channels();
    let plane_len = tiles.h * tiles.w;
    let panel_len = spaced(channels * nr);
    for channel in 0..channels {
        let plane = b.plane(channel);
        debug_assert_eq!(plane.len(), plane_len);
        for j in 0..nr {
            let mut d = [0f32; POSITIONS];
            if j < cols {
                for (rs, value) in d.iter_mut().enumerate() {
                    if let Some(at) = tiles.input_at(start + j, rs / 4, rs % 4) {
                        *value = plane[at];
                    }
                }
            }
            let values = input_transform(d);
            for (xi, value) in values.into_iter().enumerate() {
                v[xi * panel_len + channel * nr + j] = value;
            }
        }
    }
}

/// Writes the outputs of tiles `start..start + cols` from their 16 products `M_ξ` in `m`
/// (product `ξ` at `ξ · spaced(K · nr)`, value `(k, j)` at `k · nr + j`), one tile at a time.
///
/// # Safety
/// `c + k · row_stride + pixel` is writable for every `k < out_channels` and every pixel of
/// tiles `start..start + cols`, touched by no one else during the call.
unsafe fn transform_output(
    m: &[f32],
    tiles: &Tiles,
    start: usize,
    cols: usize,
    nr: usize,
    out_channels: usize,
    c: Planes,
) {
    let product_len = spaced(out_channels * nr);
    for k in 0..out_channels {
        let row = c.data.wrapping_add(k * c.row_stride);
        for j in 0..cols {
            let mut values = [0f32; POSITIONS];
            for (xi, value) in values.iter_mut().enumerate() {
                *value = m[xi * product_len + k * nr + j];
            }
            let y = output_transform(values);
            for (q, value) in y.into_iter().enumerate() {
                if let Some(at) = tiles.output_at(start + j, q / 2, q % 2) {
                    // SAFETY: pixel `at` of tile `start + j` in plane `k`: the caller's.
                    unsafe { *row.add(at) = value };
                }
            }
        }
    }
}

/// A run of lanes of one vector of a block (`width` consecutive tiles: 16 for AVX-512, 8 for
/// AVX2) whose tiles lie in one row of tiles: lanes `lo..hi` of vector `vector` are tiles
/// `(row, shift + lane)`.
#[cfg(target_arch = "x86_64")]
struct Piece {
    vector: usize,
    row: usize,
    /// Lanes `lo..hi`, as bits.
    lanes: u16,
    shift: isize,
    /// The input transform's loads, as bits of the `2·width + 2` input columns from
    /// `2·shift − pw` on that the lanes read inside the image.
    load: u64,
    /// The output transform's stores, as bits of the `2·width` output columns from `2·shift`
    /// on that the lanes write inside the output.
    store: u64,
}

#[cfg(target_arch = "x86_64")]
impl Piece {
    /// The pieces of tiles `start..start + cols` for vectors of `width ≤ 16` lanes, in the
    /// order of their vectors.
    fn of_block(tiles: &Tiles, start: usize, cols: usize, width: usize) -> Vec<Piece> {
        debug_assert!(width <= 16);
        let mut pieces = Vec::new();
        let mut j = 0;
        while j < cols {
            let (row, column) = ((start + j) / tiles.across, (start + j) % tiles.across);
            let end = j + (tiles.across - column).min(cols - j);
            // The run of tiles `j..end` of the block lies in one row: cut it at vectors.
            let mut at = j;
            while at < end {
                let lo = at % width;
                let hi = width.min(lo + end - at);
                let shift = (column + at - j) as isize - lo as isize;
                let lanes = (lo..hi).fold(0u16, |mask, lane| mask | 1 << lane);
                let mut load = 0u64;
                let first = 2 * shift - tiles.pw as isize;
                for position in 2 * lo..2 * hi + 2 {
                    let x = first + position as isize;
                    if x >= 0 && x < tiles.w as isize {
                        load |= 1 << position;
                    }
                }
                let mut store = 0u64;
                for position in 2 * lo..2 * hi {
                    if 2 * shift + (position as isize) < tiles.ow as isize {
                        store |= 1 << position;
                    }
                }
                pieces.push(Piece {
                    vector: at / width,
                    row,
                    lanes,
                    shift,
                    load,
                    store,
                });
                at += hi - lo;
            }
            j = end;
        }
        pieces
    }
}

/// [`transform_input`] 16 tiles at a time. For each row `r` of the patches of a piece's
/// tiles (one row of tiles), 34 consecutive values of one input row hold the 4 values of
/// every tile: three masked loads (lanes outside the image stay zero) and four permutes give
/// the values at columns `2·i + s` for lane `i` and `s = 0..4`, whose `d B` (the first pass of
/// the transform) goes to the piece's lanes; the second pass combines the four rows.
///
/// # Safety
/// The CPU supports AVX-512F; `nr` is a multiple of 16; `v` holds `16 · spaced(C · nr)` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transform_input_avx512(
    b: &Im2colRef,
    tiles: &Tiles,
    start: usize,
    cols: usize,
    nr: usize,
    v: &mut [f32],
) {
    use std::arch::x86_64::*;
    let pieces = Piece::of_block(tiles, start, cols, LANES);
    let channels = b.channels();
    let panel_len = spaced(channels * nr);
    assert!(
        v.len() >= POSITIONS * panel_len,
        "the panels' buffer holds 16 panels"
    );
    let (add, sub) = (|x, y| _mm512_add_ps(x, y), |x, y| _mm512_sub_ps(x, y));
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    // Lanes 1..16 of the first operand, then lane 0 (1) of the second.
    let next_even = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    let next_odd = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17);
    let (h, w) = (tiles.h as isize, tiles.w as isize);
    let out = v.as_mut_ptr();
    for channel in 0..channels {
        let plane = b.plane(channel).as_ptr();
        let mut next_piece = 0;
        for vector in 0..nr / LANES {
            let mut u = [_mm512_setzero_ps(); POSITIONS];
            while let Some(piece) = pieces.get(next_piece).filter(|p| p.vector == vector) {
                next_piece += 1;
                let first = 2 * piece.shift - tiles.pw as isize;
                for r in 0..4 {
                    let y = (2 * piece.row + r) as isize - tiles.ph as isize;
                    if y < 0 || y >= h {
                        continue;
                    }
                    let row = plane.wrapping_offset(y * w + first);
                    let [mask_a, mask_b, mask_c] =
                        [0, 16, 32].map(|bit| (piece.load >> bit) as u16);
                    // SAFETY: the lanes each mask keeps read input columns `0..w` of row
                    // `y < h` of this channel's plane (`Piece::of_block`); masked lanes are
                    // neither read nor able to fault, and `wrapping_offset` forms the
                    // pointers without asserting they are inside.
                    let (a, b, c) = unsafe {
                        (
                            _mm512_maskz_loadu_ps(mask_a, row),
                            _mm512_maskz_loadu_ps(mask_b, row.wrapping_add(16)),
                            _mm512_maskz_loadu_ps(mask_c, row.wrapping_add(32)),
                        )
                    };
                    let d0 = _mm512_permutex2var_ps(a, evens, b);
                    let d1 = _mm512_permutex2var_ps(a, odds, b);
                    let d2 = _mm512_permutex2var_ps(d0, next_even, c);
                    let d3 = _mm512_permutex2var_ps(d1, next_odd, c);
                    let values = b_transform!(d0, d1, d2, d3, add, sub);
                    for (s, value) in values.into_iter().enumerate() {
                        u[4 * r + s] = _mm512_mask_mov_ps(u[4 * r + s], piece.lanes, value);
                    }
                }
            }
            for s in 0..4 {
                let column = b_transform!(u[s], u[4 + s], u[8 + s], u[12 + s], add, sub);
                for (r, value) in column.into_iter().enumerate() {
                    let xi = 4 * r + s;
                    // SAFETY: `xi · spaced(C · nr) + channel · nr + vector · 16 + 16 ≤ 16 · spaced(C · nr)`,
                    // inside `v` (asserted above).
                    unsafe {
                        _mm512_storeu_ps(
                            out.add(xi * panel_len + channel * nr + vector * LANES),
                            value,
                        )
                    };
                }
            }
        }
    }
}

/// [`transform_output`] 16 tiles at a time: the first pass (`Aᵀ M`) on the 16 products of a
/// vector of tiles, the second on each row; then, for each piece of the vector (one row of
/// tiles), the two outputs of each tile in a row of outputs are interleaved into 32
/// consecutive columns and stored through masks (columns of the piece's lanes, inside the
/// output).
///
/// # Safety
/// The CPU supports AVX-512F; `nr` is a multiple of 16; `m` holds `16 · spaced(K · nr)` values;
/// `c + k · row_stride + pixel` is writable for every `k < out_channels` and every pixel of
/// tiles `start..start + cols`, touched by no one else during the call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transform_output_avx512(
    m: &[f32],
    tiles: &Tiles,
    start: usize,
    cols: usize,
    nr: usize,
    out_channels: usize,
    c: Planes,
) {
    use std::arch::x86_64::*;
    let pieces = Piece::of_block(tiles, start, cols, LANES);
    let product_len = spaced(out_channels * nr);
    assert!(
        m.len() >= POSITIONS * product_len,
        "the products' buffer holds 16 products"
    );
    let (add, sub) = (|x, y| _mm512_add_ps(x, y), |x, y| _mm512_sub_ps(x, y));
    let low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for k in 0..out_channels {
        let plane = c.data.wrapping_add(k * c.row_stride);
        let mut next_piece = 0;
        for vector in 0..cols.div_ceil(LANES) {
            let mut values = [_mm512_setzero_ps(); POSITIONS];
            for (xi, value) in values.iter_mut().enumerate() {
                // SAFETY: `xi · spaced(K · nr) + k · nr + vector · 16 + 16 ≤ 16 · spaced(K · nr)`, inside `m`
                // (asserted above).
                *value = unsafe {
                    _mm512_loadu_ps(m.as_ptr().add(xi * product_len + k * nr + vector * LANES))
                };
            }
            let mut t = [_mm512_setzero_ps(); 8];
            for s in 0..4 {
                let [top, bottom] = a_transform!(
                    values[s],
                    values[4 + s],
                    values[8 + s],
                    values[12 + s],
                    add,
                    sub
                );
                t[s] = top;
                t[4 + s] = bottom;
            }
            let mut y = [_mm512_setzero_ps(); 4];
            for r in 0..2 {
                let row =
                    a_transform!(t[4 * r], t[4 * r + 1], t[4 * r + 2], t[4 * r + 3], add, sub);
                y[2 * r] = row[0];
                y[2 * r + 1] = row[1];
            }
            while let Some(piece) = pieces.get(next_piece).filter(|p| p.vector == vector) {
                next_piece += 1;
                for r in 0..2 {
                    let row = 2 * piece.row + r;
                    if row >= tiles.oh {
                        continue;
                    }
                    let first = plane.wrapping_offset((row * tiles.ow) as isize + 2 * piece.shift);
                    let [mask_low, mask_high] = [0, 16].map(|bit| (piece.store >> bit) as u16);
                    // SAFETY: the lanes each mask keeps write output columns `0..OW` of row
                    // `row < OH` of this output channel's row of `c` (`Piece::of_block`),
                    // inside `c` (`MatrixMut::new`), borrowed uniquely; masked lanes are
                    // neither written nor able to fault.
                    unsafe {
                        _mm512_mask_storeu_ps(
                            first,
                            mask_low,
                            _mm512_permutex2var_ps(y[2 * r], low, y[2 * r + 1]),
                        );
                        _mm512_mask_storeu_ps(
                            first.wrapping_add(16),
                            mask_high,
                            _mm512_permutex2var_ps(y[2 * r], high, y[2 * r + 1]),
                        );
                    }
                }
            }
        }
    }
}

/// The AVX2 masks of one [`Piece`] of 8 lanes: its lanes (for the blend of the input
/// transform), its four input loads (columns `0..8`, `8..16`, `2..10` and `10..18` from
/// `2·shift − pw`) and its two output stores (columns `0..8` and `8..16` from `2·shift`); no
/// load or store masks when every column is read or written (all 8 lanes, inside the image or
/// the output), as plain loads and stores then do.
#[cfg(target_arch = "x86_64")]
struct Avx2Masks {
    all_lanes: bool,
    lanes: std::arch::x86_64::__m256,
    loads: Option<[std::arch::x86_64::__m256i; 4]>,
    stores: Option<[std::arch::x86_64::__m256i; 2]>,
}

#[cfg(target_arch = "x86_64")]
impl Avx2Masks {
    /// # Safety
    /// The CPU supports AVX2.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn of(piece: &Piece) -> Avx2Masks {
        use std::arch::x86_64::*;
        // Bits `0..8` of `bits` as lanes of all ones or zeros.
        let mask = |bits: u64| {
            let select = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
            let bits = _mm256_set1_epi32((bits & 0xff) as i32);
            _mm256_cmpeq_epi32(_mm256_and_si256(bits, select), select)
        };
        let (load, store) = (piece.load, piece.store);
        Avx2Masks {
            all_lanes: piece.lanes == 0xff,
            lanes: _mm256_castsi256_ps(mask(piece.lanes as u64)),
            loads: (load & 0x3_ffff != 0x3_ffff).then(|| {
                [
                    mask(load),
                    mask(load >> 8),
                    mask(load >> 2),
                    mask(load >> 10),
                ]
            }),
            stores: (store & 0xffff != 0xffff).then(|| [mask(store), mask(store >> 8)]),
        }
    }
}

/// [`transform_input`] 8 tiles at a time, as [`transform_input_avx512`] does 16: for each row
/// `r` of the patches of a piece's tiles, the 18 consecutive input values from the first
/// tile's column hold the 4 values of every tile; loads of columns `0..16` and `2..18` (masked
/// when some lie outside the image, those lanes zero), each split into its even and odd
/// columns (a shuffle and a permute each), give the values at columns `2·i + s` for lane `i`
/// and `s = 0..4`, whose `d B` goes to the piece's lanes; the second pass combines the four
/// rows. The same additions in the same order as the others: the same bits.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `nr` is a multiple of 8; `v` holds `16 · spaced(C · nr)` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transform_input_avx2(
    b: &Im2colRef,
    tiles: &Tiles,
    start: usize,
    cols: usize,
    nr: usize,
    v: &mut [f32],
) {
    use std::arch::x86_64::*;
    let pieces = Piece::of_block(tiles, start, cols, AVX2_LANES);
    // SAFETY: the CPU supports AVX2 (the caller's).
    let masks: Vec<Avx2Masks> = pieces.iter().map(|p| unsafe { Avx2Masks::of(p) }).collect();
    let channels = b.channels();
    let panel_len = spaced(channels * nr);
    assert!(
        v.len() >= POSITIONS * panel_len,
        "the panels' buffer holds 16 panels"
    );
    let (add, sub) = (|x, y| _mm256_add_ps(x, y), |x, y| _mm256_sub_ps(x, y));
    // The even and the odd values of 16 consecutive ones, `lo` the first 8: a shuffle leaves
    // `lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6` (the odd ones likewise), a permute of its pairs puts
    // them in order.
    let evens = |lo, hi| {
        let pairs = _mm256_castps_pd(_mm256_shuffle_ps::<0x88>(lo, hi));
        _mm256_castpd_ps(_mm256_permute4x64_pd::<0xd8>(pairs))
    };
    let odds = |lo, hi| {
        let pairs = _mm256_castps_pd(_mm256_shuffle_ps::<0xdd>(lo, hi));
        _mm256_castpd_ps(_mm256_permute4x64_pd::<0xd8>(pairs))
    };
    let (h, w) = (tiles.h as isize, tiles.w as isize);
    let out = v.as_mut_ptr();
    for channel in 0..channels {
        let plane = b.plane(channel).as_ptr();
        let mut next_piece = 0;
        for vector in 0..nr / AVX2_LANES {
            let mut u = [_mm256_setzero_ps(); POSITIONS];
            while let Some(piece) = pieces.get(next_piece).filter(|p| p.vector == vector) {
                let masks = &masks[next_piece];
                next_piece += 1;
                let first = 2 * piece.shift - tiles.pw as isize;
                for r in 0..4 {
                    let y = (2 * piece.row + r) as isize - tiles.ph as isize;
                    if y < 0 || y >= h {
                        continue;
                    }
                    let row = plane.wrapping_offset(y * w + first);
                    let (a, b, c, d) = match &masks.loads {
                        // SAFETY: all 18 columns from `first` lie in `0..w` (the piece's
                        // load bits), in row `y < h` of this channel's plane, inside the
                        // slice (`Im2colRef::new`).
                        None => unsafe {
                            (
                                _mm256_loadu_ps(row),
                                _mm256_loadu_ps(row.add(8)),
                                _mm256_loadu_ps(row.add(2)),
                                _mm256_loadu_ps(row.add(10)),
                            )
                        },
                        // SAFETY: the lanes each mask keeps read input columns `0..w` of row
                        // `y < h` of this channel's plane (`Piece::of_block`); masked lanes
                        // are neither read nor able to fault, and `wrapping_offset` and
                        // `wrapping_add` form the pointers without asserting they are inside.
                        Some([ma, mb, mc, md]) => unsafe {
                            (
                                _mm256_maskload_ps(row, *ma),
                                _mm256_maskload_ps(row.wrapping_add(8), *mb),
                                _mm256_maskload_ps(row.wrapping_add(2), *mc),
                                _mm256_maskload_ps(row.wrapping_add(10), *md),
                            )
                        },
                    };
                    let values =
                        b_transform!(evens(a, b), odds(a, b), evens(c, d), odds(c, d), add, sub);
                    for (s, value) in values.into_iter().enumerate() {
                        u[4 * r + s] = if masks.all_lanes {
                            value
                        } else {
                            _mm256_blendv_ps(u[4 * r + s], value, masks.lanes)
                        };
                    }
                }
            }
            for s in 0..4 {
                let column = b_transform!(u[s], u[4 + s], u[8 + s], u[12 + s], add, sub);
                for (r, value) in column.into_iter().enumerate() {
                    let xi = 4 * r + s;
                    // SAFETY: `xi · spaced(C · nr) + channel · nr + vector · 8 + 8 ≤ 16 · spaced(C · nr)`,
                    // inside `v` (asserted above).
                    unsafe {
                        _mm256_storeu_ps(
                            out.add(xi * panel_len + channel * nr + vector * AVX2_LANES),
                            value,
                        )
                    };
                }
            }
        }
    }
}

/// [`transform_output`] 8 tiles at a time, as [`transform_output_avx512`] does 16: the two
/// passes on the 16 products of a vector of tiles; then, for each piece of the vector, the
/// two outputs of each tile in a row of outputs are interleaved into 16 consecutive columns
/// (an unpack of each half and two cross-half permutes) and stored, through masks when some
/// columns are outside the piece's lanes or the output.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `nr` is a multiple of 8; `m` holds `16 · spaced(K · nr)` values;
/// `c + k · row_stride + pixel` is writable for every `k < out_channels` and every pixel of
/// tiles `start..start + cols`, touched by no one else during the call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transform_output_avx2(
    m: &[f32],
    tiles: &Tiles,
    start: usize,
    cols: usize,
    nr: usize,
    out_channels: usize,
    c: Planes,
) {
    use std::arch::x86_64::*;
    let pieces = Piece::of_block(tiles, start, cols, AVX2_LANES);
    // SAFETY: the CPU supports AVX2 (the caller's).
    let masks: Vec<Avx2Masks> = pieces.iter().map(|p| unsafe { Avx2Masks::of(p) }).collect();
    let product_len = spaced(out_channels * nr);
    assert!(
        m.len() >= POSITIONS * product_len,
        "the products' buffer holds 16 products"
    );
    let (add, sub) = (|x, y| _mm256_add_ps(x, y), |x, y| _mm256_sub_ps(x, y));
    for k in 0..out_channels {
        let plane = c.data.wrapping_add(k * c.row_stride);
        let mut next_piece = 0;
        for vector in 0..cols.div_ceil(AVX2_LANES) {
            let mut values = [_mm256_setzero_ps(); POSITIONS];
            for (xi, value) in values.iter_mut().enumerate() {
                // SAFETY: `xi · spaced(K · nr) + k · nr + vector · 8 + 8 ≤ 16 · spaced(K · nr)`, inside `m`
                // (asserted above).
                *value = unsafe {
                    _mm256_loadu_ps(
                        m.as_ptr()
                            .add(xi * product_len + k * nr + vector * AVX2_LANES),
                    )
                };
            }
            let mut t = [_mm256_setzero_ps(); 8];
            for s in 0..4 {
                let [top, bottom] = a_transform!(
                    values[s],
                    values[4 + s],
                    values[8 + s],
                    values[12 + s],
                    add,
                    sub
                );
                t[s] = top;
                t[4 + s] = bottom;
            }
            let mut y = [_mm256_setzero_ps(); 4];
            for r in 0..2 {
                let row =
                    a_transform!(t[4 * r], t[4 * r + 1], t[4 * r + 2], t[4 * r + 3], add, sub);
                y[2 * r] = row[0];
                y[2 * r + 1] = row[1];
            }
            while let Some(piece) = pieces.get(next_piece).filter(|p| p.vector == vector) {
                let masks = &masks[next_piece];
                next_piece += 1;
                for r in 0..2 {
                    let row = 2 * piece.row + r;
                    if row >= tiles.oh {
                        continue;
                    }
                    let first = plane.wrapping_offset((row * tiles.ow) as isize + 2 * piece.shift);
                    // `x0 y0 x1 y1 | x4 y4 x5 y5` and `x2 y2 x3 y3 | x6 y6 x7 y7`, then the
                    // first halves of both and the second halves of both.
                    let low = _mm256_unpacklo_ps(y[2 * r], y[2 * r + 1]);
                    let high = _mm256_unpackhi_ps(y[2 * r], y[2 * r + 1]);
                    let (left, right) = (
                        _mm256_permute2f128_ps::<0x20>(low, high),
                        _mm256_permute2f128_ps::<0x31>(low, high),
                    );
                    match &masks.stores {
                        // SAFETY: all 16 columns from `2·shift` are the piece's and lie in
                        // `0..OW` (its store bits), in row `row < OH` of this output channel's
                        // row of `c` (`MatrixMut::new`), borrowed uniquely.
                        None => unsafe {
                            _mm256_storeu_ps(first, left);
                            _mm256_storeu_ps(first.add(8), right);
                        },
                        // SAFETY: the lanes each mask keeps write output columns `0..OW` of
                        // row `row < OH` of this output channel's row of `c`
                        // (`Piece::of_block`), inside `c` (`MatrixMut::new`), borrowed
                        // uniquely; masked lanes are neither written nor able to fault.
                        Some([mask_left, mask_right]) => unsafe {
                            _mm256_maskstore_ps(first, *mask_left, left);
                            _mm256_maskstore_ps(first.wrapping_add(8), *mask_right, right);
                        },
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::tests::values;

    /// A direct convolution summed in f64: for every output, the value and `Σ |x| · max |w|`
    /// over its terms, `max |w|` the largest magnitude of the term's 3×3 filter: the scale of
    /// Winograd's rounding errors. (A direct convolution's errors are relative to `Σ |x| · |w|`;
    /// Winograd's are not, since the transformed weight mixes a filter's 9 taps: an output
    /// whose few terms have small weights, at a padded corner, can carry the rounding of the
    /// filter's larger taps times its inputs, which cancel only in exact arithmetic.)
    fn direct(
        x: &[f32],
        weight: &[f32],
        [c, k]: [usize; 2],
        [h, w]: [usize; 2],
        padding: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let (oh, ow) = (h + 2 * padding - 2, w + 2 * padding - 2);
        let (mut want, mut scale) = (vec![0f64; k * oh * ow], vec![0f64; k * oh * ow]);
        for o in 0..k {
            for y in 0..oh {
                for xx in 0..ow {
                    let at = (o * oh + y) * ow + xx;
                    for ci in 0..c {
                        for i in 0..3 {
                            for j in 0..3 {
                                let (iy, ix) = (y + i, xx + j);
                                if iy < padding || ix < padding {
                                    continue;
                                }
                                let (iy, ix) = (iy - padding, ix - padding);
                                if iy >= h || ix >= w {
                                    continue;
                                }
                                let filter = &weight[(o * c + ci) * 9..][..9];
                                let a = filter[i * 3 + j] as f64;
                                let b = x[(ci * h + iy) * w + ix] as f64;
                                want[at] += a * b;
                                let largest = filter.iter().fold(0f32, |m, v| m.max(v.abs()));
                                scale[at] += largest as f64 * b.abs();
                            }
                        }
                    }
                }
            }
        }
        (want, scale)
    }

    fn window(padding: usize) -> Window2d {
        Window2d {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [padding, padding],
            dilation: [1, 1],
        }
    }

    /// Winograd of `c` channels into `k` over an `h × w` image with `kernel` and `transforms`,
    /// its output rows `row_stride` apart (the values in between must stay untouched).
    fn winograd(
        x: &[f32],
        weight: &[f32],
        [c, k]: [usize; 2],
        [h, w]: [usize; 2],
        padding: usize,
        kernel: Kernel,
        transforms: Transforms,
    ) -> Vec<f32> {
        let window = window(padding);
        let [oh, ow] = window.output_size(h, w).unwrap();
        let n = oh * ow;
        let a = MatrixRef::row_major(weight, k, 9 * c).unwrap();
        let transformed = WinogradWeight::transform(&a, kernel).unwrap();
        // The image after 5 values of another, to test the offset.
        let mut source = vec![7.0; 5];
        source.extend_from_slice(x);
        let b = Im2colRef::new(&source, 5, c, [h, w], window).unwrap();
        let row_stride = n + 3;
        let mut got = vec![f32::NAN; k * row_stride];
        let mut out = MatrixMut::new(&mut got, [k, n], row_stride).unwrap();
        multiply_winograd_with(&transformed, &b, &mut out, transforms).unwrap();
        for row in got.chunks(row_stride) {
            assert!(row[n..].iter().all(|v| v.is_nan()), "wrote past a row");
        }
        got.chunks(row_stride)
            .flat_map(|row| row[..n].iter().copied())
            .collect()
    }

    /// The vector transforms this CPU runs (each is compared with [`Transforms::Plain`]).
    fn vector_transforms() -> impl Iterator<Item = Transforms> {
        Transforms::ALL
            .into_iter()
            .filter(|t| *t != Transforms::Plain && t.is_supported())
    }

    /// The largest error of `got` relative to the scale of each output.
    fn relative_error(got: &[f32], want: &[f64], scale: &[f64]) -> f64 {
        got.iter()
            .zip(want.iter().zip(scale))
            .map(|(&g, (&w, &s))| (g as f64 - w).abs() / s.max(1e-30))
            .fold(0.0, f64::max)
    }

    /// Every kernel this CPU has, with both transforms, against a direct convolution in f64,
    /// at image sizes that leave partial tiles (odd sizes) and blocks spanning tile rows, with
    /// padding 0, 1 and 2 and channel counts around the register tile. The error of each
    /// output is bounded by `1e-6` relative to its scale (see [`direct`]; the measured worst
    /// case is printed: 2.0e-7 on these shapes).
    #[test]
    fn winograd_matches_a_direct_convolution_at_odd_sizes() {
        let sizes = [1, 2, 3, 5, 7, 8];
        let channels = [[1, 1], [3, 17], [17, 3], [64, 64], [17, 64], [1, 64]];
        let (mut worst, mut worst_implicit) = (0f64, 0f64);
        let mut case = 0;
        for h in sizes {
            for w in sizes {
                for padding in 0..3 {
                    if window(padding).output_size(h, w).is_none() {
                        continue;
                    }
                    case += 1;
                    let [c, k] = channels[case % channels.len()];
                    let x = values(c * h * w, case as u64);
                    let weight = values(k * c * 9, case as u64 + 1000);
                    let (want, scale) = direct(&x, &weight, [c, k], [h, w], padding);
                    let bound = 1e-6;
                    // The implicit GEMM's error on the same scale, for comparison.
                    let implicit = {
                        let a = MatrixRef::row_major(&weight, k, 9 * c).unwrap();
                        let packed = PackedA::pack(&a, Kernel::detect()).unwrap();
                        let b = Im2colRef::new(&x, 0, c, [h, w], window(padding)).unwrap();
                        let n = b.shape()[1];
                        let mut got = vec![0f32; k * n];
                        let mut out = MatrixMut::row_major(&mut got, k, n).unwrap();
                        super::super::multiply_im2col(&packed, &b, &mut out).unwrap();
                        got
                    };
                    worst_implicit = worst_implicit.max(relative_error(&implicit, &want, &scale));
                    for kernel in Kernel::ALL.into_iter().filter(|k| k.is_supported()) {
                        let mut results = Vec::new();
                        let all = std::iter::once(Transforms::Plain).chain(vector_transforms());
                        for transforms in all {
                            let got =
                                winograd(&x, &weight, [c, k], [h, w], padding, kernel, transforms);
                            let error = relative_error(&got, &want, &scale);
                            assert!(
                                error <= bound,
                                "{c}->{k} channels, {h}x{w}, padding {padding}, {kernel:?}, \
                                 {transforms:?}: relative error {error:e} above {bound:e}"
                            );
                            worst = worst.max(error);
                            results.push(got);
                        }
                        // All transforms do the same additions in the same order.
                        for (got, transforms) in results[1..].iter().zip(vector_transforms()) {
                            assert!(
                                results[0]
                                    .iter()
                                    .zip(got)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{c}->{k} channels, {h}x{w}, padding {padding}, {kernel:?}: \
                                 {transforms:?} and plain transforms disagree"
                            );
                        }
                    }
                }
            }
        }
        eprintln!(
            "worst error relative to sum |x| max |w| over {case} shapes: winograd {worst:e}, \
             implicit GEMM {worst_implicit:e}"
        );
    }

    /// Images with many blocks of tiles (the last one partial), more output channels than one
    /// block of micro-panels and more channels than one depth block ([`Kernel::kc`]).
    #[test]
    fn winograd_matches_a_direct_convolution_over_many_blocks_and_deep_channels() {
        for ([c, k], [h, w], padding) in [
            ([64, 64], [56, 56], 1),
            ([300, 7], [9, 11], 1),
            ([5, 70], [31, 17], 0),
        ] {
            let x = values(c * h * w, 3);
            let weight = values(k * c * 9, 4);
            let (want, scale) = direct(&x, &weight, [c, k], [h, w], padding);
            let bound = 1e-6;
            for kernel in Kernel::ALL.into_iter().filter(|k| k.is_supported()) {
                let plain = winograd(
                    &x,
                    &weight,
                    [c, k],
                    [h, w],
                    padding,
                    kernel,
                    Transforms::Plain,
                );
                for transforms in std::iter::once(Transforms::Plain).chain(vector_transforms()) {
                    let got = winograd(&x, &weight, [c, k], [h, w], padding, kernel, transforms);
                    let error = relative_error(&got, &want, &scale);
                    assert!(
                        error <= bound,
                        "{c}->{k} channels, {h}x{w}, {kernel:?}, {transforms:?}: relative \
                         error {error:e}"
                    );
                    assert!(
                        got.iter()
                            .zip(&plain)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{c}->{k} channels, {h}x{w}, {kernel:?}: {transforms:?} and plain \
                         transforms disagree"
                    );
                    eprintln!(
                        "{c}->{k} channels, {h}x{w}, {kernel:?}, {transforms:?}: relative error \
                         {error:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn other_windows_and_mismatched_shapes_are_errors() {
        let x = vec![0f32; 2 * 5 * 5];
        let weight = vec![0f32; 3 * 2 * 9];
        let a = MatrixRef::row_major(&weight, 3, 18).unwrap();
        let transformed = WinogradWeight::transform(&a, Kernel::Portable).unwrap();
        let mut strided = window(1);
        strided.stride = [2, 2];
        let b = Im2colRef::new(&x, 0, 2, [5, 5], strided).unwrap();
        let mut got = vec![0f32; 3 * 9];
        let mut out = MatrixMut::row_major(&mut got, 3, 9).unwrap();
        assert!(matches!(
            multiply_winograd(&transformed, &b, &mut out),
            Err(GemmError::Window { .. })
        ));
        let b = Im2colRef::new(&x, 0, 2, [5, 5], window(1)).unwrap();
        assert!(matches!(
            multiply_winograd(&transformed, &b, &mut out),
            Err(GemmError::Shape { .. })
        ));
        let not_3x3 = MatrixRef::row_major(&weight, 3, 17).unwrap();
        assert!(WinogradWeight::transform(&not_3x3, Kernel::Portable).is_err());
    }
}
