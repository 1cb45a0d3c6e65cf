//! The fused attention routine (`Step::Attention`): flash attention on the CPU, like PyTorch's
//! `aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`.
//!
//! Work items are (batch, block of `QUERY_BLOCK` query rows) pairs, spread over the threads by
//! `for_each_chunk`. An item packs its query rows, then for each block of `KEY_BLOCK` keys (the
//! blocks entirely above the diagonal skipped under a causal mask) packs the keys transposed and
//! the values, computes the score tile `q·kᵀ·scale`, and updates each row's running maximum, its
//! running sum of `exp(score − max)` and its accumulator `Σ p·v` (rescaled by `exp(old max − new
//! max)` when the maximum grows). The output row is the accumulator over the sum. The `[T, S]`
//! scores never exist beyond one tile. Every output row is computed by one item in a fixed order,
//! so results do not depend on the thread count.
//!
//! Both products of a tile (`q·kᵀ` and `p·v`) run on packed, contiguous blocks: with AVX-512
//! (detected at run time) a register-blocked 4 × 64 micro-kernel of FMAs (`std::arch`), else
//! portable loops. Exponentials use the crate's block math routines (`math::block`: the error the
//! kernels document) where the CPU has them, else `f32::exp`.

use crate::math::block::{block_routine, BlockFn};
use crate::math::MathFn;
use crate::scatter::View;
use minductor_runtime::RuntimeError;
use std::sync::Mutex;

/// Query rows per work item.
const QUERY_BLOCK: usize = 32;
/// Keys per score tile.
const KEY_BLOCK: usize = 64;

/// The sizes of one attention: `q [batch.., t, e]`, `k [batch_kv.., s, e]`, `v [batch_kv.., s,
/// ev]`, `out [batch.., t, ev]` (contiguous); q head `h` (the last batch dim) reads k/v head
/// `h / group`.
pub(crate) struct AttentionShape<'a> {
    pub batch: &'a [usize],
    pub t: usize,
    pub s: usize,
    pub e: usize,
    pub ev: usize,
    pub group: usize,
    pub scale: f32,
    pub causal: bool,
}

/// `out = softmax(q·kᵀ·scale [causal])·v`. Checks every view against its buffer and `out`'s
/// length first (an error, and nothing written, when one does not fit); then all accesses are
/// checked slice indexing.
pub(crate) fn attention(
    q: View<'_, f32>,
    k: View<'_, f32>,
    v: View<'_, f32>,
    mask: Option<View<'_, f32>>,
    shape: &AttentionShape<'_>,
    out: &mut [f32],
) -> Result<(), RuntimeError> {
    attention_on(q, k, v, mask, shape, out, has_avx512())
}

/// [`attention`], with the AVX-512 micro-kernel only when `avx512` (which the caller has
/// checked the CPU supports).
fn attention_on(
    q: View<'_, f32>,
    k: View<'_, f32>,
    v: View<'_, f32>,
    mask: Option<View<'_, f32>>,
    shape: &AttentionShape<'_>,
    out: &mut [f32],
    avx512: bool,
) -> Result<(), RuntimeError> {
    let n = shape.batch.len();
    let group = shape.group.max(1);
    let mut kv_batch = shape.batch.to_vec();
    if let Some(last) = kv_batch.last_mut() {
        *last /= group;
    }
    let with = |b: &[usize], rows: usize, cols: usize| {
        let mut d = b.to_vec();
        d.extend([rows, cols]);
        d
    };
    q.check(&with(shape.batch, shape.t, shape.e), "attention q")?;
    k.check(&with(&kv_batch, shape.s, shape.e), "attention k")?;
    v.check(&with(&kv_batch, shape.s, shape.ev), "attention v")?;
    if let Some(mask) = &mask {
        mask.check(&with(shape.batch, shape.t, shape.s), "attention mask")?;
    }
    let batches: usize = shape.batch.iter().product();
    let matrix = shape.t * shape.ev;
    if out.len() != batches * matrix {
        return Err(RuntimeError::Unsupported(format!(
            "attention: the output holds {} elements, not {}",
            out.len(),
            batches * matrix
        )));
    }
    if matrix == 0 {
        return Ok(());
    }
    let blocks = shape.t.div_ceil(QUERY_BLOCK);
    let items: Vec<Mutex<&mut [f32]>> = out
        .chunks_mut(matrix)
        .flat_map(|m| m.chunks_mut(QUERY_BLOCK * shape.ev))
        .map(Mutex::new)
        .collect();
    let exp = block_routine(MathFn::Exp);
    // The element offset of batch `b` (row-major over `dims`) in a view.
    let base = |view: &View<'_, f32>, dims: &[usize], mut b: usize| -> i64 {
        let mut offset = view.offset;
        for d in (0..dims.len()).rev() {
            offset += (b % dims[d]) as i64 * view.strides[d];
            b /= dims[d];
        }
        offset
    };
    // Keys transposed (`[e][s]`) and values (`[s][ev]`), packed once per k/v batch and shared
    // by every query block (and every q head of a group).
    let (s, e, ev) = (shape.s, shape.e, shape.ev);
    let kv_batches: usize = kv_batch.iter().product();
    let mut keys = vec![0f32; kv_batches * e * s];
    let mut values = vec![0f32; kv_batches * s * ev];
    {
        let packs: Vec<Mutex<(&mut [f32], &mut [f32])>> = keys
            .chunks_mut((e * s).max(1))
            .zip(values.chunks_mut((s * ev).max(1)))
            .map(Mutex::new)
            .collect();
        minductor_runtime::threads::for_each_chunk(packs.len(), |b| {
            let mut pack = packs[b].lock().unwrap_or_else(|p| p.into_inner());
            let (kt, vp) = &mut *pack;
            let (kb, vb) = (base(&k, &kv_batch, b), base(&v, &kv_batch, b));
            for j in 0..s {
                for c in 0..e {
                    kt[c * s + j] = element(&k, kb, j, c);
                }
                for c in 0..ev {
                    vp[j * ev + c] = element(&v, vb, j, c);
                }
            }
        });
    }
    minductor_runtime::threads::for_each_chunk(items.len(), |item| {
        let (b, block) = (item / blocks, item % blocks);
        // q head h reads k/v head h / group: k/v batch `b / group` when the heads are the
        // last batch dim.
        let kv = if n == 0 { 0 } else { b / group };
        let mut rows = items[item].lock().unwrap_or_else(|p| p.into_inner());
        let tile = Tile {
            q: &q,
            q_base: base(&q, shape.batch, b),
            mask: mask.as_ref().map(|m| (m, base(m, shape.batch, b))),
            keys: &keys[kv * e * s..(kv + 1) * e * s],
            values: &values[kv * s * ev..(kv + 1) * s * ev],
            shape,
            first_row: block * QUERY_BLOCK,
            exp,
            avx512,
        };
        tile_body(&tile, &mut rows);
    });
    Ok(())
}

/// Element `(row, col)` of the matrix at `base` of `view` (checked indexing).
fn element(view: &View<'_, f32>, base: i64, row: usize, col: usize) -> f32 {
    let r = view.strides.len() - 2;
    view.data[(base + row as i64 * view.strides[r] + col as i64 * view.strides[r + 1]) as usize]
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One work item: a block of query rows of one batch.
struct Tile<'a> {
    q: &'a View<'a, f32>,
    /// The element offset of this batch's q matrix.
    q_base: i64,
    /// The additive mask and the element offset of this batch's `[t, s]` matrix in it.
    mask: Option<(&'a View<'a, f32>, i64)>,
    /// This batch's keys, transposed: `[e][s]`.
    keys: &'a [f32],
    /// This batch's values: `[s][ev]`.
    values: &'a [f32],
    shape: &'a AttentionShape<'a>,
    first_row: usize,
    exp: Option<BlockFn>,
    /// The CPU has AVX-512F (the tile products use it).
    avx512: bool,
}

/// `c[i][j] (+)= Σ_l a[i·lda + l] · b[l·ldb + j]` for `i < rows`, `j < cols`, `l < depth`: the
/// two products of a tile (scores `q·kᵀ` with `kᵀ` packed, and `p·v`).
struct Product<'a> {
    a: &'a [f32],
    lda: usize,
    b: &'a [f32],
    ldb: usize,
    depth: usize,
    rows: usize,
    cols: usize,
    ldc: usize,
}

impl Product<'_> {
    /// Checks every index the product reads and writes (so the AVX-512 form may read unchecked).
    fn fits(&self, c: &[f32]) -> bool {
        let last = |rows: usize, ld: usize, cols: usize| {
            (rows > 0 && cols > 0).then(|| (rows - 1) * ld + cols - 1)
        };
        let inside = |data: &[f32], end: Option<usize>| end.is_none_or(|e| e < data.len());
        self.cols <= self.ldb
            && self.cols <= self.ldc
            && self.depth <= self.lda
            && inside(self.a, last(self.rows, self.lda, self.depth))
            && inside(self.b, last(self.depth, self.ldb, self.cols))
            && inside(c, last(self.rows, self.ldc, self.cols))
    }

    fn run(&self, c: &mut [f32], accumulate: bool, avx512: bool) {
        assert!(
            self.fits(c),
            "attention: a tile product outside its packed buffers"
        );
        if avx512 {
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: the CPU has AVX-512F (checked by the caller at run time), and `fits`
                // checked every index the routine touches.
                unsafe { avx512::product(self, c, accumulate) };
                return;
            }
        }
        for i in 0..self.rows {
            let row = &mut c[i * self.ldc..i * self.ldc + self.cols];
            if !accumulate {
                row.fill(0.0);
            }
            for l in 0..self.depth {
                let x = self.a[i * self.lda + l];
                let b = &self.b[l * self.ldb..l * self.ldb + self.cols];
                for (o, &y) in row.iter_mut().zip(b) {
                    *o += x * y;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::Product;
    use std::arch::x86_64::*;

    /// Register-blocked: 4 rows × 64 columns (16 zmm accumulators) at a time, column tails
    /// through masks.
    ///
    /// # Safety
    /// The CPU has AVX-512F, and `p.fits(c)`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn product(p: &Product<'_>, c: &mut [f32], accumulate: bool) {
        let mut i = 0;
        while i < p.rows {
            let rows = (p.rows - i).min(4);
            let mut j = 0;
            while j < p.cols {
                let cols = (p.cols - j).min(64);
                match rows {
                    4 => block::<4>(p, c, i, j, cols, accumulate),
                    3 => block::<3>(p, c, i, j, cols, accumulate),
                    2 => block::<2>(p, c, i, j, cols, accumulate),
                    _ => block::<1>(p, c, i, j, cols, accumulate),
                }
                j += 64;
            }
            i += 4;
        }
    }

    /// # Safety
    /// As [`product`]; rows `i..i + R` and columns `j..j + cols` are inside the product.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block<const R: usize>(
        p: &Product<'_>,
        c: &mut [f32],
        i: usize,
        j: usize,
        cols: usize,
        accumulate: bool,
    ) {
        let masks: [__mmask16; 4] = std::array::from_fn(|v| {
            let n = cols.saturating_sub(v * 16).min(16);
            ((1u32 << n) - 1) as __mmask16
        });
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let cp = c.as_mut_ptr();
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, a) in row.iter_mut().enumerate() {
                    *a = _mm512_maskz_loadu_ps(masks[v], cp.add((i + r) * p.ldc + j + v * 16));
                }
            }
        }
        let (ap, bp) = (p.a.as_ptr(), p.b.as_ptr());
        for l in 0..p.depth {
            let b = bp.add(l * p.ldb + j);
            let bv: [__m512; 4] =
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], b.add(v * 16)));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*ap.add((i + r) * p.lda + l));
                for (a, &y) in row.iter_mut().zip(&bv) {
                    *a = _mm512_fmadd_ps(x, y, *a);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &a) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(cp.add((i + r) * p.ldc + j + v * 16), masks[v], a);
            }
        }
    }
}

/// `data = exp(data)`.
fn exp_in_place(exp: Option<BlockFn>, data: &mut [f32]) {
    match exp {
        // SAFETY: `data` is a valid mutable slice of `data.len()` f32s and `block_routine` only
        // returns routines the CPU supports.
        Some(routine) => unsafe { routine(data.as_mut_ptr(), data.len() as i64) },
        None => data.iter_mut().for_each(|x| *x = x.exp()),
    }
}

/// Lanes of the vectorized row loops (a fixed order of partial results, so sums and maxima are
/// the same on every run).
const LANES: usize = 16;

/// `row *= scale`, returning the maximum (−inf for an empty row).
fn scale_and_max(row: &mut [f32], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (m, x) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *x *= scale;
            *m = if *x > *m { *x } else { *m };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for x in chunks.into_remainder() {
        *x *= scale;
        max = max.max(*x);
    }
    lanes.iter().fold(max, |a, &b| a.max(b))
}

/// `Σ row`, in `LANES` partial sums added in order.
fn lane_sum(row: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (s, &x) in lanes.iter_mut().zip(chunk) {
            *s += x;
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    lanes.iter().sum::<f32>() + tail
}

fn tile_body(tile: &Tile<'_>, out: &mut [f32]) {
    let sh = tile.shape;
    let (e, ev) = (sh.e, sh.ev);
    let rows = out.len() / ev;
    let t0 = tile.first_row;
    // Packed query rows [rows][e].
    let mut qp = vec![0f32; rows * e];
    for i in 0..rows {
        for c in 0..e {
            qp[i * e + c] = element(tile.q, tile.q_base, t0 + i, c);
        }
    }
    let mut acc = vec![0f32; rows * ev];
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut sum = vec![0f32; rows];
    // The score tile [rows][KEY_BLOCK], then its probabilities.
    let mut scores = vec![0f32; rows * KEY_BLOCK];
    // Each row's rescaling exponent, then factor.
    let mut rescale = vec![0f32; rows];
    // Keys after the last row's position take part in no row under a causal mask.
    let keys = if sh.causal { sh.s.min(t0 + rows) } else { sh.s };
    let mut s0 = 0;
    while s0 < keys {
        let bk = KEY_BLOCK.min(keys - s0);
        Product {
            a: &qp,
            lda: e,
            b: &tile.keys[s0..],
            ldb: sh.s,
            depth: e,
            rows,
            cols: bk,
            ldc: bk,
        }
        .run(&mut scores, false, tile.avx512);
        // Per row: scale, mask, the new running maximum, `score − max` (then one exp call over
        // the whole tile), and the rescaling exponent `old max − new max` (one more call).
        for i in 0..rows {
            let t = t0 + i;
            // Keys of this block the row sees.
            let seen = if sh.causal {
                bk.min((t + 1).saturating_sub(s0))
            } else {
                bk
            };
            let row = &mut scores[i * bk..(i + 1) * bk];
            let block_max = match tile.mask {
                None => scale_and_max(&mut row[..seen], sh.scale),
                Some((mask, base)) => {
                    for (j, x) in row[..seen].iter_mut().enumerate() {
                        *x = *x * sh.scale + element(mask, base, t, s0 + j);
                    }
                    row[..seen].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
                }
            };
            row[seen..].fill(f32::NEG_INFINITY);
            let new_max = max[i].max(block_max);
            if new_max == f32::NEG_INFINITY {
                // Nothing seen yet (or every score is −inf): no probability mass, no rescaling.
                row.fill(f32::NEG_INFINITY);
                rescale[i] = 0.0;
                continue;
            }
            row[..seen].iter_mut().for_each(|s| *s -= new_max);
            rescale[i] = max[i] - new_max;
            max[i] = new_max;
        }
        exp_in_place(tile.exp, &mut scores[..rows * bk]);
        exp_in_place(tile.exp, &mut rescale[..rows]);
        for i in 0..rows {
            let r = rescale[i];
            if r != 1.0 {
                sum[i] *= r;
                acc[i * ev..(i + 1) * ev].iter_mut().for_each(|a| *a *= r);
            }
            sum[i] += lane_sum(&scores[i * bk..(i + 1) * bk]);
        }
        Product {
            a: &scores,
            lda: bk,
            b: &tile.values[s0 * ev..],
            ldb: ev,
            depth: bk,
            rows,
            cols: ev,
            ldc: ev,
        }
        .run(&mut acc, true, tile.avx512);
        s0 += bk;
    }
    for i in 0..rows {
        let inverse = 1.0 / sum[i];
        for (o, &a) in out[i * ev..(i + 1) * ev]
            .iter_mut()
            .zip(&acc[i * ev..(i + 1) * ev])
        {
            *o = a * inverse;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook form: scores, a row softmax in f64, then `p·v`.
    fn reference(q: &[f32], k: &[f32], v: &[f32], sh: &AttentionShape<'_>) -> Vec<f32> {
        let heads: usize = sh.batch.iter().product();
        let kv_heads = heads / sh.group;
        let mut out = vec![0f32; heads * sh.t * sh.ev];
        for h in 0..heads {
            let (qh, kh) = (h * sh.t * sh.e, (h / sh.group) * sh.s * sh.e);
            let vh = (h / sh.group) * sh.s * sh.ev;
            assert!(h / sh.group < kv_heads);
            for t in 0..sh.t {
                let keys = if sh.causal { sh.s.min(t + 1) } else { sh.s };
                let scores: Vec<f64> = (0..keys)
                    .map(|j| {
                        (0..sh.e)
                            .map(|c| (q[qh + t * sh.e + c] * k[kh + j * sh.e + c]) as f64)
                            .sum::<f64>()
                            * sh.scale as f64
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = p.iter().sum();
                for c in 0..sh.ev {
                    let o: f64 = (0..keys).map(|j| p[j] * v[vh + j * sh.ev + c] as f64).sum();
                    out[(h * sh.t + t) * sh.ev + c] = (o / sum) as f32;
                }
            }
        }
        out
    }

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 + 1.0) * 0.37 + seed).sin())
            .collect()
    }

    /// The portable loops and (where the CPU has it) the AVX-512 micro-kernel, at sizes that
    /// leave row and column tails, against the reference.
    #[test]
    fn portable_and_avx512_forms_match_the_reference() {
        for &(t, s, e, ev, group, causal) in &[
            (1, 1, 8, 8, 1, false),
            (37, 37, 17, 9, 2, true),
            (70, 130, 64, 64, 1, false),
            (65, 65, 128, 20, 1, true),
        ] {
            let batch = [2usize, 2 * group];
            let kv = [2usize, 2];
            let (qn, kn, vn) = (4 * group * t * e, 4 * s * e, 4 * s * ev);
            let (q, k, v) = (data(qn, 0.0), data(kn, 1.0), data(vn, 2.0));
            let sh = AttentionShape {
                batch: &batch,
                t,
                s,
                e,
                ev,
                group,
                scale: 1.0 / (e as f32).sqrt(),
                causal,
            };
            let want = reference(&q, &k, &v, &sh);
            let strides = |rows: usize, cols: usize, heads: usize| {
                vec![
                    (heads * rows * cols) as i64,
                    (rows * cols) as i64,
                    cols as i64,
                    1,
                ]
            };
            let (qs, ks, vs) = (
                strides(t, e, batch[1]),
                strides(s, e, kv[1]),
                strides(s, ev, kv[1]),
            );
            let mut forms = vec![false];
            if has_avx512() {
                forms.push(true);
            }
            for avx512 in forms {
                let mut out = vec![0f32; want.len()];
                let view = |data, strides| View {
                    data,
                    offset: 0,
                    strides,
                };
                attention_on(
                    view(&q, &qs),
                    view(&k, &ks),
                    view(&v, &vs),
                    None,
                    &sh,
                    &mut out,
                    avx512,
                )
                .unwrap();
                for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "t {t} s {s} e {e} ev {ev} avx512 {avx512}: element {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
