//! The fused attention routine (`Step::Attention`): flash attention on the CPU, like PyTorch's
//! `aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`.
//!
//! Work items are (k/v head, run of query blocks) pairs, spread over the threads by
//! `for_each_chunk`; an item computes its blocks for every q head sharing the k/v head. It
//! packs the keys transposed, in tiles of `KEY_BLOCK` (`[e][KEY_BLOCK]` each, contiguous), and
//! the values unless they already are rows one after another, into a buffer of its thread
//! that stays in cache while its blocks read it; the keys are packed times the scale (folded in
//! once per key). A block of query rows (`AttentionTiling::query_block`, 64 unless
//! max-autotune chose another) reads its rows where they are (packing them only when a row's
//! elements are not contiguous), then for each key tile (the tiles entirely above the diagonal
//! skipped under a causal mask) computes the scores `q·kᵀ`, applies the mask (an additive f32
//! mask, or a bool one: masked scores are −inf; with the causal limit as one bit per key of
//! the tile), and updates each row's running maximum, its running sum of `exp(score − max)`
//! and its accumulator `Σ p·v` (rescaled by `exp(old max − new max)`). The output row is the
//! accumulator over the sum; a row that sees no key gives NaN (0/0), as the prim expansion
//! does (−inf − −inf). The `[T, S]` scores never exist beyond one tile. Every output row is
//! computed by one block in a fixed order, whatever the item and thread, so results do not
//! depend on the thread count.
//!
//! With AVX-512 (F, DQ and FMA, detected at run time) a block works on `GROUP` rows at a
//! time: their scores stay in registers (a `GROUP × 64` micro-kernel of FMAs), the softmax step
//! runs on those registers (mask, row maxima, the rescaling factors of the group in one
//! register, exponentials by a short form for non-positive arguments, within 3 ulp:
//! `avx512::exp_nonpositive`), and `p·v` is a second register-blocked micro-kernel that
//! rescales the accumulator rows as it loads them and, on the last key tile, writes the output
//! rows (accumulator over sum) from its registers. With AVX2 and FMA but not AVX-512 the
//! same algorithm runs on 8-lane registers (`avx2`): sixteen registers cannot hold a group's
//! `GROUP × 64` scores, so the score micro-kernel computes `GROUP × 16` of them at a time (12
//! accumulators, as the AVX2 GEMM tile), masks them in registers and folds them into the rows'
//! maxima, and leaves them in the group's probability tile (in L1), which the softmax step
//! turns into probabilities in place (the same `exp` on 8 lanes, `avx2::exp_nonpositive`,
//! within 3 ulp); `p·v` is a `GROUP × 16` micro-kernel over the value columns. Elsewhere
//! portable loops compute the same steps a tile at a time, with the block math routine (or
//! `f32::exp`). [`Form`] names the three; each gives bitwise the same results at every thread
//! count and tiling, but the forms round differently from one another (their sums run over
//! other lane counts).

use crate::math::block::{block_routine, BlockFn};
use crate::math::MathFn;
use crate::scatter::View;
use minductor_ir::LayoutFault;
use minductor_runtime::RuntimeError;
use std::sync::Mutex;

/// Keys per score tile (at most 64: a row's bool mask of a tile is one `u64`). Fixed, unlike
/// the query block: every row visits the key tiles `0, 64, 128, ...` in this order and its
/// online softmax rescales once per tile, so another key block would round differently.
const KEY_BLOCK: usize = 64;

/// How an attention's work is cut: `query_block` query rows per block (the rows that share one
/// pass over each key tile), and about `items_per_thread` work items per thread (see
/// [`ItemPlan`]). Every tiling gives bitwise the same results: each output row is computed by
/// one block, over the key tiles in the same order, with the same operations in the same order
/// (under a causal mask the tiles past a row's diagonal add nothing to it: its probabilities
/// there are 0 and it skips their values), and a row's operations in the micro-kernels are the
/// same whichever place of a group of rows it takes. Only the speed differs, so max-autotune
/// times a few.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionTiling {
    /// Query rows per block: a multiple of 4, at least 4 (the micro-kernels take rows in
    /// groups of 6, the last group of a block shorter; any block gives the same bits).
    pub query_block: usize,
    /// Work items per thread the split aims for (at least 1).
    pub items_per_thread: usize,
}

impl AttentionTiling {
    /// The tiling the library uses unless told otherwise: blocks of 64 rows, four items a
    /// thread.
    pub const DEFAULT: AttentionTiling = AttentionTiling {
        query_block: 64,
        items_per_thread: 4,
    };

    /// The query blocks max-autotune may time.
    pub const QUERY_BLOCKS: [usize; 3] = [32, 64, 128];

    /// The work items per thread max-autotune may time.
    pub const ITEMS_PER_THREAD: [usize; 3] = [2, 4, 8];

    /// A tiling of `query_block` rows (a multiple of 4, from 4 to 4096) and `items_per_thread`
    /// items (1 to 64); `None` outside those.
    pub fn new(query_block: usize, items_per_thread: usize) -> Option<AttentionTiling> {
        let fits = query_block.is_multiple_of(4)
            && (4..=4096).contains(&query_block)
            && (1..=64).contains(&items_per_thread);
        fits.then_some(AttentionTiling {
            query_block,
            items_per_thread,
        })
    }

    /// Every tiling max-autotune times: each of [`Self::QUERY_BLOCKS`] with each of
    /// [`Self::ITEMS_PER_THREAD`], the default first.
    pub fn candidates() -> Vec<AttentionTiling> {
        let mut out = vec![AttentionTiling::DEFAULT];
        for query_block in AttentionTiling::QUERY_BLOCKS {
            for items_per_thread in AttentionTiling::ITEMS_PER_THREAD {
                let tiling = AttentionTiling {
                    query_block,
                    items_per_thread,
                };
                if tiling != AttentionTiling::DEFAULT {
                    out.push(tiling);
                }
            }
        }
        out
    }

    /// The tiling with its fields brought into range (a public struct may hold anything).
    fn checked(self) -> AttentionTiling {
        AttentionTiling {
            query_block: self.query_block.clamp(4, 4096).next_multiple_of(4),
            items_per_thread: self.items_per_thread.clamp(1, 64),
        }
    }
}

impl Default for AttentionTiling {
    fn default() -> Self {
        AttentionTiling::DEFAULT
    }
}

/// The sizes of one attention: `q [batch.., t, e]`, `k [batch_kv.., s, e]`, `v [batch_kv.., s,
/// ev]`, `out [batch.., t, ev]` (contiguous); q head `h` (the last batch dim) reads k/v head
/// `h / group`.
pub struct AttentionShape<'a> {
    pub batch: &'a [usize],
    pub t: usize,
    pub s: usize,
    pub e: usize,
    pub ev: usize,
    pub group: usize,
    pub scale: f32,
    pub causal: bool,
}

/// How a mask buffer enters the scores (the kernel IR's `MaskKind`, which the executor maps to
/// this one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskKind {
    /// f32 values added to the scaled scores.
    Add,
    /// Bool: true takes part.
    Keep,
    /// Bool: true is dropped.
    Drop,
}

/// A mask seen with the scores' shape `[batch.., t, s]` (stride 0 where it broadcasts).
pub enum Mask<'a> {
    /// Added to the scaled scores.
    Add(View<'a, f32>),
    /// Bool (one byte, nonzero is true): the scores where it is false are −inf (PyTorch's bool
    /// `attn_mask`: true takes part).
    Keep(View<'a, u8>),
    /// Bool: the scores where it is true are −inf (`masked_fill(mask, -inf)`).
    Drop(View<'a, u8>),
}

/// A mask buffer's elements, by type.
#[derive(Clone, Copy)]
pub enum MaskData<'a> {
    F32(&'a [f32]),
    /// One byte an element, nonzero is true.
    Bool(&'a [u8]),
}

impl<'a> Mask<'a> {
    /// The mask of `kind` on `data` (an error when the element type does not fit the kind).
    pub fn new(
        kind: MaskKind,
        data: MaskData<'a>,
        offset: i64,
        strides: &'a [i64],
    ) -> Result<Self, RuntimeError> {
        Ok(match (kind, data) {
            (MaskKind::Add, MaskData::F32(data)) => Mask::Add(View {
                data,
                offset,
                strides,
            }),
            (MaskKind::Keep, MaskData::Bool(data)) => Mask::Keep(View {
                data,
                offset,
                strides,
            }),
            (MaskKind::Drop, MaskData::Bool(data)) => Mask::Drop(View {
                data,
                offset,
                strides,
            }),
            _ => {
                return Err(RuntimeError::Unsupported(format!(
                    "attention: a {kind:?} mask of the wrong element type"
                )))
            }
        })
    }

    fn check(&self, shape: &[usize]) -> Result<(), RuntimeError> {
        match self {
            Mask::Add(m) => m.check(shape, "attention mask"),
            Mask::Keep(m) | Mask::Drop(m) => m.check(shape, "attention mask"),
        }
    }

    fn strides(&self) -> (i64, &[i64]) {
        match self {
            Mask::Add(m) => (m.offset, m.strides),
            Mask::Keep(m) | Mask::Drop(m) => (m.offset, m.strides),
        }
    }
}

/// `out = softmax(q·kᵀ·scale [+ mask] [causal])·v`, cut into work by `tiling` (which changes
/// no result), into the contiguous `out [batch.., t, ev]`. Checks every view against its buffer
/// and `out`'s length first (an error, and nothing written, when one does not fit); then all
/// accesses are checked slice indexing or inside the query rows and packed buffers an item
/// asserts the sizes of. [`attention_into`] writes another layout.
pub fn attention(
    q: View<'_, f32>,
    k: View<'_, f32>,
    v: View<'_, f32>,
    mask: Option<Mask<'_>>,
    shape: &AttentionShape<'_>,
    tiling: AttentionTiling,
    out: &mut [f32],
) -> Result<(), RuntimeError> {
    attention_on(q, k, v, mask, shape, tiling, out, Form::detect())
}

/// [`attention`] in the micro-kernels' `form` (which the caller has checked the CPU supports:
/// [`Form::is_supported`]).
#[allow(clippy::too_many_arguments)]
fn attention_on(
    q: View<'_, f32>,
    k: View<'_, f32>,
    v: View<'_, f32>,
    mask: Option<Mask<'_>>,
    shape: &AttentionShape<'_>,
    tiling: AttentionTiling,
    out: &mut [f32],
    form: Form,
) -> Result<(), RuntimeError> {
    let batches: usize = shape.batch.iter().product();
    let need = batches * shape.t * shape.ev;
    if out.len() != need {
        return Err(RuntimeError::Unsupported(format!(
            "attention: the output holds {} elements, not {need}",
            out.len(),
        )));
    }
    let strides = contiguous_strides(shape);
    let out = OutView {
        data: out,
        offset: 0,
        strides: &strides,
    };
    attention_view_on(q, k, v, mask, shape, tiling, out, form)
}

/// [`attention`] into the view `out` of `[batch.., t, ev]`: a layout its consumer wants, such
/// as `[b, t, h, ev]` for a `[b, h, t, ev]` attention (row `t` of head `h` at
/// `((b·T + t)·H + h)·ev`), so that no copy permutes it afterwards. The view must keep each row's
/// `ev` elements contiguous and give every element its own place ([`OutView::check`]: an
/// error, and nothing written, otherwise); elements of `data` outside the view are left as
/// they are. Each output row is written by one work item (the same bits as [`attention`], at
/// every thread count).
pub fn attention_into(
    q: View<'_, f32>,
    k: View<'_, f32>,
    v: View<'_, f32>,
    mask: Option<Mask<'_>>,
    shape: &AttentionShape<'_>,
    tiling: AttentionTiling,
    out: OutView<'_>,
) -> Result<(), RuntimeError> {
    attention_view_on(q, k, v, mask, shape, tiling, out, Form::detect())
}

/// The row-major strides of `[batch.., t, ev]`.
fn contiguous_strides(shape: &AttentionShape<'_>) -> Vec<i64> {
    let mut dims = shape.batch.to_vec();
    dims.extend([shape.t, shape.ev]);
    let mut strides = vec![0i64; dims.len()];
    let mut step = 1i64;
    for d in (0..dims.len()).rev() {
        strides[d] = step;
        step = step.saturating_mul(dims[d] as i64);
    }
    strides
}

/// Where an attention writes its output `[batch.., t, ev]`: element `[b.., r, c]` at `offset +
/// Σ index·stride` of `data`.
pub struct OutView<'a> {
    pub data: &'a mut [f32],
    pub offset: i64,
    pub strides: &'a [i64],
}

impl OutView<'_> {
    /// Checks that every position of `shape` (`[batch.., t, ev]`) addresses an element of
    /// `data`, that a row's `ev` elements are contiguous (column stride 1), that no stride is
    /// negative, and that no two positions share an element: with the dims of more than one
    /// position sorted by stride, each stride is past everything the smaller ones reach (so
    /// the rows handed to different work items never overlap).
    fn check(&self, shape: &[usize]) -> Result<(), RuntimeError> {
        let n = shape.len();
        let fail = |why: String| {
            Err(RuntimeError::BufferCheck(format!(
                "attention output: {why}"
            )))
        };
        if self.strides.len() != n || n < 2 {
            return fail(format!("{} strides for {} dims", self.strides.len(), n));
        }
        let strides: Vec<i128> = self.strides.iter().map(|&s| s as i128).collect();
        let reach = match minductor_ir::distinct_places(shape, &strides) {
            Ok(0) => return Ok(()),
            Ok(reach) => reach,
            Err(LayoutFault::ColumnsApart(stride)) => {
                return fail(format!(
                    "the columns of a row are {stride} apart, not contiguous"
                ))
            }
            Err(LayoutFault::Negative(stride)) => {
                return fail(format!("a negative stride {stride}"))
            }
            Err(LayoutFault::SharedPlace) => {
                return fail(format!(
                    "strides {:?} for {shape:?} give two positions one element",
                    self.strides
                ))
            }
            Err(LayoutFault::Overflow) => return fail("overflow".into()),
        };
        let offset = self.offset as i128;
        let high = offset.checked_add(reach - 1);
        if offset < 0 || high.is_none_or(|h| h >= self.data.len() as i128) {
            return fail(format!(
                "the view reaches outside its buffer (elements {}..{} of {})",
                self.offset,
                offset.saturating_add(reach),
                self.data.len()
            ));
        }
        Ok(())
    }
}

/// Output rows that one work item writes, and no one else: row `r` is the `ev` contiguous f32s
/// from `ptr + r·stride`. Made only by [`OutView::runs`], which hands every row of a checked
/// view to one `OutRows`; so, like a `&mut [f32]`, it is the one handle to its elements while
/// it lives (`'a` borrows the view's data mutably).
struct OutRows<'a> {
    ptr: *mut f32,
    stride: usize,
    rows: usize,
    ev: usize,
    _data: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: an `OutRows` owns its rows exclusively (see the type), as a `&mut [f32]` would.
unsafe impl Send for OutRows<'_> {}

impl<'a> OutRows<'a> {
    /// Row `r` (panics past the last).
    fn row(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows, "attention: output row {r} of {}", self.rows);
        // SAFETY: row `r` is `ev` elements of this `OutRows` alone (see the type).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * self.stride), self.ev) }
    }

    /// The rows cut into runs of `rows` (the last one shorter), each borrowing its own.
    fn blocks(&mut self, rows: usize) -> Vec<OutRows<'_>> {
        let rows = rows.max(1);
        (0..self.rows.div_ceil(rows))
            .map(|i| OutRows {
                // In bounds: row `i·rows` is one of this `OutRows`'s.
                ptr: self.ptr.wrapping_add(i * rows * self.stride),
                stride: self.stride,
                rows: rows.min(self.rows - i * rows),
                ev: self.ev,
                _data: std::marker::PhantomData,
            })
            .collect()
    }
}

impl<'a> OutView<'a> {
    /// Each batch's rows, cut into runs of `run_rows` rows: `[batch][run]`. The view must have
    /// passed [`OutView::check`] for `[batches.., t, ev]`, which makes the runs disjoint.
    fn runs(
        &mut self,
        batch: &[usize],
        t: usize,
        ev: usize,
        run_rows: usize,
    ) -> Vec<Vec<OutRows<'_>>> {
        let n = batch.len();
        let row_stride = if t > 1 { self.strides[n] as usize } else { 0 };
        let batches: usize = batch.iter().product();
        let ptr = self.data.as_mut_ptr();
        (0..batches)
            .map(|b| {
                let start = base(self.offset, self.strides, batch, b) as usize;
                (0..t.div_ceil(run_rows.max(1)))
                    .map(|run| OutRows {
                        // In bounds: the check saw every row of the view.
                        ptr: ptr.wrapping_add(start + run * run_rows * row_stride),
                        stride: row_stride,
                        rows: run_rows.min(t - run * run_rows),
                        ev,
                        _data: std::marker::PhantomData,
                    })
                    .collect()
            })
            .collect()
    }
}

/// [`attention_into`] in the micro-kernels' `form` (which the caller has checked the CPU
/// supports: [`Form::is_supported`]).
#[allow(clippy::too_many_arguments)]
fn attention_view_on(
    q: View<'_, f32>,
    k: View<'_, f32>,
    v: View<'_, f32>,
    mask: Option<Mask<'_>>,
    shape: &AttentionShape<'_>,
    tiling: AttentionTiling,
    mut out: OutView<'_>,
    form: Form,
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
        mask.check(&with(shape.batch, shape.t, shape.s))?;
    }
    out.check(&with(shape.batch, shape.t, shape.ev))?;
    let matrix = shape.t * shape.ev;
    if matrix == 0 || shape.batch.contains(&0) {
        return Ok(());
    }
    if shape.s == 0 {
        // No keys: each output row is a sum over nothing, 0 (what the prim graph computes: a
        // product of an empty probability row with an empty value matrix).
        for head in out.runs(shape.batch, shape.t, shape.ev, shape.t) {
            for mut rows in head {
                for r in 0..rows.rows {
                    rows.row(r).fill(0.0);
                }
            }
        }
        return Ok(());
    }
    // Work items (see `work_items`): each packs its k/v head's keys (transposed) and, unless
    // they are rows one after another, its values into a buffer of its thread, which stays in
    // that core's cache while the item's blocks read it; where the work is split does not
    // change any result.
    let (s, e, ev) = (shape.s, shape.e, shape.ev);
    let plan = ItemPlan::new(shape, minductor_runtime::threads::num_threads(), tiling);
    let query_block = plan.query_block;
    let run_rows = plan.run_blocks * query_block;
    // Per q head, its output rows split into runs; each item takes the runs it computes.
    let mut per_head: Vec<Vec<Option<OutRows>>> = out
        .runs(shape.batch, shape.t, ev, run_rows)
        .into_iter()
        .map(|runs| runs.into_iter().map(Some).collect())
        .collect();
    let work = plan.items();
    // Each item's (q head, run, output rows) triples, taken by the thread running it.
    type Parts<'o> = Mutex<Vec<(usize, usize, OutRows<'o>)>>;
    let items: Vec<Parts> = work
        .iter()
        .map(|item| {
            let parts = item
                .parts
                .iter()
                .filter_map(|&(b, run)| per_head[b][run].take().map(|out| (b, run, out)))
                .collect();
            Mutex::new(parts)
        })
        .collect();
    let exp = block_routine(MathFn::Exp);
    let (v_rows, v_cols) = (v.strides[n], v.strides[n + 1]);
    // Values are read in place only when their rows follow one another. Rows further apart
    // (a `[b, t, 3, h, e]` projection's, 3·h·e apart) map a key tile's 64 rows onto a few sets
    // of L1 (at 6 KiB apart, 8 sets of 12 ways for 256 lines), so every group of query rows
    // would read the tile from L2 again. Packed, attention_8x256x512's layout ran 10-12% faster
    // alone (`PROJECTED=1 cargo run --release -p minductor-kernels --example attention_speed`,
    // alternated runs), though within noise in the workload's `minductor report`.
    let v_in_place = v_cols == 1 && v_rows == ev as i64;
    // One query row a head (a decoder's step): the vector forms read each key row where it
    // is, a dot product with the row (`avx512::direct_scores`, `avx2::direct_scores`), instead
    // of packing the keys transposed, which for one row cost more than the scores (53% of the
    // step's profile). Chosen by the shape alone, never the thread count.
    let (k_rows, k_cols) = (k.strides[n], k.strides[n + 1]);
    let vector = matches!(form, Form::Avx512 | Form::Avx2);
    let keys_in_place = vector && shape.t == 1 && k_cols == 1 && k_rows > 0;
    let failed = crate::scratch::FirstError::new();
    let run_item = |item: usize| {
        let kv = work[item].kv;
        let mut outs = items[item].lock().unwrap_or_else(|p| p.into_inner());
        // Keys after a run's last row take part in no row under a causal mask.
        let keys = outs
            .iter()
            .map(|(_, run, o)| {
                let last = run * run_rows + o.rows;
                if shape.causal {
                    s.min(last)
                } else {
                    s
                }
            })
            .max()
            .unwrap_or(0);
        PACK.with(|cell| {
            let mut pack = cell.take();
            let key_len = if keys_in_place { 0 } else { keys_len(s, e) };
            let value_len = if v_in_place { 0 } else { s * ev };
            // Sized by the keys (`s`, which an expanded view makes as large as it likes):
            // out of memory is this call's error.
            let prepared = key_len
                .checked_add(value_len)
                .ok_or(crate::scratch::ScratchError::OutOfMemory {
                    bytes: usize::MAX,
                    what: "attention's packed keys and values",
                })
                .and_then(|len| pack.prepare(len, "attention's packed keys and values"));
            if let Err(error) = prepared {
                cell.set(pack);
                failed.record(Err(error));
                return;
            }
            // Columns `0..keys` of `kt` and rows `0..keys` of `vp` are written here, and the
            // blocks read no others.
            let (kt, vp) = pack.as_mut_slice().split_at_mut(key_len);
            let vp = &mut vp[..value_len];
            let kb = base(k.offset, k.strides, &kv_batch, kv);
            if !keys_in_place {
                pack_transposed(&k, kb, keys, e, shape.scale, kt, form);
            }
            // In bounds: `k.check` saw the whole view, and batch `kv` starts inside it.
            let key_rows = keys_in_place.then(|| (&k.data[kb as usize..], k_rows as usize));
            let vb = base(v.offset, v.strides, &kv_batch, kv);
            if !v_in_place {
                for j in 0..keys {
                    let packed = &mut vp[j * ev..(j + 1) * ev];
                    if v_cols == 1 {
                        // A contiguous row (inside the view, which `v.check` saw whole).
                        let start = (vb + j as i64 * v_rows) as usize;
                        packed.copy_from_slice(&v.data[start..start + ev]);
                    } else {
                        for (o, x) in packed.iter_mut().zip(row(&v, vb, j, ev)) {
                            *o = x;
                        }
                    }
                }
            }
            let (values, value_rows) = if v_in_place {
                // In bounds: `v.check` saw the whole view, and batch `kv` starts inside it.
                (&v.data[vb as usize..], v_rows as usize)
            } else {
                (&vp[..], ev)
            };
            for (b, run, out) in outs.iter_mut() {
                let (b, first_row) = (*b, *run * run_rows);
                for (i, mut block) in out.blocks(query_block).into_iter().enumerate() {
                    let tile = Tile {
                        q: &q,
                        q_base: base(q.offset, q.strides, shape.batch, b),
                        mask: mask.as_ref().map(|m| {
                            let (offset, strides) = m.strides();
                            (m, base(offset, strides, shape.batch, b))
                        }),
                        keys: kt,
                        key_rows,
                        values,
                        value_rows,
                        shape,
                        first_row: first_row + i * query_block,
                    };
                    match form {
                        // SAFETY: the CPU has AVX-512F, AVX-512DQ and FMA (the form is only
                        // chosen after `Form::is_supported` said so).
                        #[cfg(target_arch = "x86_64")]
                        Form::Avx512 => unsafe { avx512::item(&tile, &mut block) },
                        // SAFETY: the CPU has AVX2 and FMA (as above).
                        #[cfg(target_arch = "x86_64")]
                        Form::Avx2 => unsafe { avx2::item(&tile, &mut block) },
                        _ => portable_item(&tile, exp, &mut block),
                    }
                }
            }
            failed.record(pack.check("attention's packed keys and values"));
            cell.set(pack);
        });
    };
    if plan.serial {
        (0..items.len()).for_each(run_item);
    } else {
        minductor_runtime::threads::for_each_chunk(items.len(), run_item);
    }
    Ok(failed.into_result()?)
}

/// How an attention's work splits into items on some number of threads: the one rule both
/// running it and the partition report follow.
///
/// Each q head's query blocks (of the tiling's `query_block` rows) are cut into `runs` runs of
/// `run_blocks` blocks (the last one shorter), only as far as needed to give every thread a few
/// items (the tiling's `items_per_thread`, four by default, counting a run of every k/v head;
/// each run packs its keys and values again). Under a causal mask a query block
/// visits the keys up to its last row, so later blocks cost more: runs are then paired, the
/// first with the last, the second with the one before it, ..., so every item costs about the
/// same. An item computes its runs for every q head sharing its k/v head (one packing of
/// them), unless that leaves fewer than two items a thread: then each q head is an item of
/// its own.
#[derive(Clone, Copy, Debug)]
struct ItemPlan {
    /// Whether the items run one after the other on the calling thread: one thread, or too
    /// little work to pay for handing items to others (see [`MIN_THREAD_WORK`]).
    serial: bool,
    query_block: usize,
    kv_batches: usize,
    group: usize,
    runs: usize,
    run_blocks: usize,
    paired: bool,
    per_head: bool,
}

/// Multiply-adds (`q·kᵀ` and `p·v`) a thread should get at least before an attention is
/// split across threads: about 4 µs of one core's work, where handing items to the pool's
/// workers from outside a team costs tens of microseconds (a small model's attention took
/// 22 µs at 2 threads against 3 µs at 1 before this: ops_mix.pt2, `pt2_profile`).
const MIN_THREAD_WORK: u64 = 1 << 18;

/// One work item: k/v head `kv`, and the (q head, run) pairs it computes.
struct WorkItem {
    kv: usize,
    parts: Vec<(usize, usize)>,
}

impl ItemPlan {
    fn new(shape: &AttentionShape<'_>, threads: usize, tiling: AttentionTiling) -> ItemPlan {
        let tiling = tiling.checked();
        // As many threads as have `MIN_THREAD_WORK` multiply-adds each (at least one).
        let work = (shape.batch.iter().product::<usize>() as u64)
            .saturating_mul(shape.t as u64)
            .saturating_mul(shape.s as u64)
            .saturating_mul((shape.e + shape.ev) as u64);
        let threads = threads
            .max(1)
            .min((work / MIN_THREAD_WORK).clamp(1, usize::MAX as u64) as usize);
        let group = shape.group.max(1);
        let kv_batches = shape.batch.iter().product::<usize>() / group;
        let blocks = shape.t.div_ceil(tiling.query_block).max(1);
        let runs = (tiling.items_per_thread * threads)
            .div_ceil(kv_batches.max(1))
            .clamp(1, blocks);
        let run_blocks = blocks.div_ceil(runs).max(1);
        let runs = blocks.div_ceil(run_blocks);
        let paired = shape.causal && runs >= 2;
        let per_kv = if paired { runs.div_ceil(2) } else { runs };
        ItemPlan {
            serial: threads == 1,
            query_block: tiling.query_block,
            kv_batches,
            group,
            runs,
            run_blocks,
            paired,
            per_head: group > 1 && kv_batches * per_kv < 2 * threads,
        }
    }

    /// The items, in order: by k/v head, then (if per q head) q head, then run (pair).
    fn items(&self) -> Vec<WorkItem> {
        let run_sets: Vec<Vec<usize>> = if self.paired {
            (0..self.runs.div_ceil(2))
                .map(|r| {
                    let last = self.runs - 1 - r;
                    if last == r {
                        vec![r]
                    } else {
                        vec![r, last]
                    }
                })
                .collect()
        } else {
            (0..self.runs).map(|r| vec![r]).collect()
        };
        let mut items = Vec::new();
        for kv in 0..self.kv_batches {
            // q heads `kv·group..(kv + 1)·group` read k/v head `kv`.
            let heads = kv * self.group..(kv + 1) * self.group;
            let head_sets: Vec<Vec<usize>> = if self.per_head {
                heads.map(|b| vec![b]).collect()
            } else {
                vec![heads.collect()]
            };
            for head_set in &head_sets {
                for runs in &run_sets {
                    items.push(WorkItem {
                        kv,
                        parts: head_set
                            .iter()
                            .flat_map(|&b| runs.iter().map(move |&r| (b, r)))
                            .collect(),
                    });
                }
            }
        }
        items
    }
}

/// The multiply-adds (`q·kᵀ` and the product with `v`) of each work item an attention of
/// `shape` runs on `threads` threads cut by `tiling` (see [`ItemPlan`]); under a causal mask a
/// query block visits the keys up to its last row.
pub fn attention_pieces(
    shape: &AttentionShape<'_>,
    threads: usize,
    tiling: AttentionTiling,
) -> Vec<u64> {
    let plan = ItemPlan::new(shape, threads, tiling);
    let query_block = plan.query_block;
    let blocks = shape.t.div_ceil(query_block);
    let run_work = |run: usize| -> u64 {
        (run * plan.run_blocks..((run + 1) * plan.run_blocks).min(blocks))
            .map(|block| {
                let rows = query_block.min(shape.t - block * query_block);
                let keys = if shape.causal {
                    shape.s.min(block * query_block + rows)
                } else {
                    shape.s
                };
                (rows * keys * (shape.e + shape.ev)) as u64
            })
            .sum::<u64>()
    };
    let items: Vec<u64> = plan
        .items()
        .iter()
        .map(|item| item.parts.iter().map(|&(_, run)| run_work(run)).sum())
        .collect();
    if plan.serial {
        // One piece: the items run in order on the calling thread.
        vec![items.iter().sum()]
    } else {
        items
    }
}

thread_local! {
    /// The packed keys and values of the item a thread runs, kept for its next item (no
    /// fresh pages to fault in, and in the thread's cache).
    static PACK: std::cell::Cell<crate::scratch::Scratch> = const { std::cell::Cell::new(crate::scratch::Scratch::new()) };
}

/// Elements of the packed keys: `s` keys in tiles of `KEY_BLOCK`, each tile `[e][KEY_BLOCK]`
/// (key `j`, column `c` at [`key_index`]), so that a tile's rows are contiguous and the tile
/// is one block of memory (no cache set conflicts between its rows).
fn keys_len(s: usize, e: usize) -> usize {
    s.div_ceil(KEY_BLOCK) * e * KEY_BLOCK
}

/// Where key `j`, column `c` is in the packed keys.
fn key_index(j: usize, c: usize, e: usize) -> usize {
    (j / KEY_BLOCK) * e * KEY_BLOCK + c * KEY_BLOCK + j % KEY_BLOCK
}

/// Packs rows `j < keys` of the `[s, e]` matrix at `base` of `k`, times `scale`, transposed
/// in tiles (see [`keys_len`]). The scale is folded in here, once per key and item, rather
/// than into the queries: a k/v head's keys serve every query row of the item (and, grouped,
/// several q heads), and the queries are then read where they are.
#[allow(clippy::too_many_arguments)]
fn pack_transposed(
    k: &View<'_, f32>,
    base: i64,
    keys: usize,
    e: usize,
    scale: f32,
    kt: &mut [f32],
    form: Form,
) {
    let n = k.strides.len();
    let (rs, cs) = (k.strides[n - 2], k.strides[n - 1]);
    if cs == 1 && rs >= 0 && e > 0 {
        // Rows of `e` contiguous elements, 16 at a time (a run inside one tile, as 16 divides
        // `KEY_BLOCK`): each column of the run is written as 16 contiguous elements (one cache
        // line) from 16 rows in cache.
        const KEYS: usize = 16;
        let mut j0 = 0;
        while j0 < keys {
            let n = KEYS.min(keys - j0);
            // In bounds: `k.check` saw the whole view, and these are rows of it.
            let starts: [usize; KEYS] =
                std::array::from_fn(|r| (base + (j0 + r.min(n - 1)) as i64 * rs) as usize);
            match form {
                // SAFETY: the CPU has AVX-512F (the form is only chosen after
                // `Form::is_supported` said so); the routine checks its bounds.
                #[cfg(target_arch = "x86_64")]
                Form::Avx512 => unsafe { avx512::pack_keys(k.data, &starts, n, e, scale, j0, kt) },
                // SAFETY: the CPU has AVX2 (as above); the routine checks its bounds.
                #[cfg(target_arch = "x86_64")]
                Form::Avx2 => unsafe { avx2::pack_keys(k.data, &starts, n, e, scale, j0, kt) },
                _ => pack_rows(k.data, &starts, n, e, scale, j0, kt),
            }
            j0 += n;
        }
    } else {
        for j in 0..keys {
            for (c, x) in row(k, base, j, e).enumerate() {
                kt[key_index(j, c, e)] = x * scale;
            }
        }
    }
}

/// The portable form of the vector `pack_keys`: keys `j0..j0 + n` (`n <= 16`, a run inside
/// one tile) times `scale` into `kt`, key `j0 + r` at `data[starts[r]..starts[r] + e]`
/// (checked indexing).
fn pack_rows(
    data: &[f32],
    starts: &[usize; 16],
    n: usize,
    e: usize,
    scale: f32,
    j0: usize,
    kt: &mut [f32],
) {
    let rows: [&[f32]; 16] = std::array::from_fn(|r| &data[starts[r]..starts[r] + e]);
    for c in 0..e {
        let at = key_index(j0, c, e);
        for (o, r) in kt[at..at + n].iter_mut().zip(&rows) {
            *o = r[c] * scale;
        }
    }
}

/// The element offset of batch `b` (row-major over `dims`) in a view of `offset` and
/// `strides` (the batch dims first).
fn base(offset: i64, strides: &[i64], dims: &[usize], mut b: usize) -> i64 {
    let mut offset = offset;
    for d in (0..dims.len()).rev() {
        offset += (b % dims[d]) as i64 * strides[d];
        b /= dims[d];
    }
    offset
}

/// Elements `(r, 0..cols)` of the matrix at `base` of `view` (checked indexing).
fn row<'a, T: Copy>(
    view: &'a View<'_, T>,
    base: i64,
    r: usize,
    cols: usize,
) -> impl Iterator<Item = T> + 'a {
    let n = view.strides.len();
    let (rs, cs) = (view.strides[n - 2], view.strides[n - 1]);
    let start = base + r as i64 * rs;
    (0..cols).map(move |c| view.data[(start + c as i64 * cs) as usize])
}

/// The forms of the attention micro-kernels (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// AVX-512F, DQ and FMA: 16 lanes, a group's `GROUP × 64` scores in registers.
    Avx512,
    /// AVX2 and FMA: 8 lanes, a group's scores 16 keys a pass.
    Avx2,
    /// Portable loops, a tile at a time.
    Portable,
}

impl Form {
    /// Every form, widest first.
    pub const ALL: [Form; 3] = [Form::Avx512, Form::Avx2, Form::Portable];

    /// The widest form this CPU supports (what [`attention`] and [`attention_into`] run).
    pub fn detect() -> Form {
        Form::ALL
            .into_iter()
            .find(|f| f.is_supported())
            .unwrap_or(Form::Portable)
    }

    /// Whether this CPU has what the form is compiled for.
    pub fn is_supported(self) -> bool {
        match self {
            Form::Avx512 => has_avx512(),
            Form::Avx2 => has_avx2(),
            Form::Portable => true,
        }
    }

    /// The width of its vectors in bits, for `minductor report` (the portable loops' as 128:
    /// the baseline SSE the compiler gives them).
    pub fn bits(self) -> u32 {
        match self {
            Form::Avx512 => 512,
            Form::Avx2 => 256,
            Form::Portable => 128,
        }
    }
}

/// The CPU has what the AVX2 form uses (AVX2 and FMA; the form is compiled with both).
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx2") && has!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The CPU has what the AVX-512 form uses (F, DQ and FMA; the form is compiled with all three).
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f") && has!("avx512dq") && has!("fma")
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
    /// The mask and the element offset of this batch's `[t, s]` matrix in it.
    mask: Option<(&'a Mask<'a>, i64)>,
    /// This batch's keys, packed transposed in tiles (`key_index`), unless `key_rows`.
    keys: &'a [f32],
    /// This batch's keys where they are: key `j` at `j * stride`, `e` contiguous elements
    /// (read by the vector forms' one-row groups; see `keys_in_place`).
    key_rows: Option<(&'a [f32], usize)>,
    /// This batch's values: row `j` at `j * value_rows`, `ev` contiguous elements.
    values: &'a [f32],
    value_rows: usize,
    shape: &'a AttentionShape<'a>,
    first_row: usize,
}

impl Tile<'_> {
    /// The item's query rows, as a slice and the distance between its rows: where the rows
    /// are contiguous (and not reversed), the view's data from the first row on; else packed,
    /// `[rows][e]`. (The scale is in the packed keys: [`pack_transposed`].)
    fn queries(&self, rows: usize) -> (std::borrow::Cow<'_, [f32]>, usize) {
        let e = self.shape.e;
        let n = self.q.strides.len();
        let (rs, cs) = (self.q.strides[n - 2], self.q.strides[n - 1]);
        if e == 0 {
            return (std::borrow::Cow::Borrowed(&[]), 0);
        }
        if (cs == 1 || e == 1) && rs >= 0 {
            // In bounds: `q.check` saw the whole view, and these are rows of it.
            let start = (self.q_base + self.first_row as i64 * rs) as usize;
            return (
                std::borrow::Cow::Borrowed(&self.q.data[start..]),
                rs as usize,
            );
        }
        let mut qp = vec![0f32; rows * e];
        for (i, packed) in qp.chunks_exact_mut(e.max(1)).enumerate() {
            for (o, x) in packed
                .iter_mut()
                .zip(row(self.q, self.q_base, self.first_row + i, e))
            {
                *o = x;
            }
        }
        (std::borrow::Cow::Owned(qp), e)
    }

    /// The keys of rows `0..rows` visible in the tile of `bk` keys at `s0`: bit `j` of
    /// `keep[i]` (causal and bool masks), and with an additive mask its values `add[i *
    /// KEY_BLOCK + j]`.
    fn mask_tile(&self, rows: usize, s0: usize, bk: usize, keep: &mut [u64], add: &mut [f32]) {
        let sh = self.shape;
        let t0 = self.first_row;
        for (i, bits) in keep[..rows].iter_mut().enumerate() {
            let seen = if sh.causal {
                bk.min((t0 + i + 1).saturating_sub(s0))
            } else {
                bk
            };
            *bits = if seen >= 64 { !0 } else { (1u64 << seen) - 1 };
        }
        let Some((mask, mb)) = self.mask else {
            return;
        };
        let cols = |view_strides: &[i64], i: usize| {
            let n = view_strides.len();
            mb + (t0 + i) as i64 * view_strides[n - 2] + s0 as i64 * view_strides[n - 1]
        };
        match mask {
            Mask::Add(m) => {
                for i in 0..rows {
                    let start = cols(m.strides, i);
                    let cs = m.strides[m.strides.len() - 1];
                    for (j, o) in add[i * KEY_BLOCK..i * KEY_BLOCK + bk]
                        .iter_mut()
                        .enumerate()
                    {
                        *o = m.data[(start + j as i64 * cs) as usize];
                    }
                }
            }
            Mask::Keep(m) | Mask::Drop(m) => {
                let drop = matches!(mask, Mask::Drop(_));
                for (i, bits) in keep[..rows].iter_mut().enumerate() {
                    let start = cols(m.strides, i);
                    let cs = m.strides[m.strides.len() - 1];
                    let mut visible = 0u64;
                    for j in 0..bk {
                        let set = m.data[(start + j as i64 * cs) as usize] != 0;
                        visible |= ((set != drop) as u64) << j;
                    }
                    *bits &= visible;
                }
            }
        }
    }
}

/// `data = exp(data)`.
fn exp_in_place(exp: Option<BlockFn>, data: &mut [f32]) {
    match exp {
        // SAFETY: `data` is a valid mutable slice of `data.len()` f32s and `block_routine` only
        // returns routines the CPU supports.
        Some(routine) => unsafe {
            let p = data.as_mut_ptr();
            routine(p, p, data.len() as i64)
        },
        None => data.iter_mut().for_each(|x| *x = x.exp()),
    }
}

/// Lanes of the vectorized row loops (a fixed order of partial results, so sums and maxima are
/// the same on every run).
const LANES: usize = 16;

/// The maximum of `row` (−inf for an empty row).
fn lane_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
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

/// `c[i][j] (+)= Σ_l a[i·lda + l] · b[l·ldb + j]` for `i < rows`, `j < cols`, `l < depth`
/// (checked indexing): the two products of a portable tile.
#[allow(clippy::too_many_arguments)]
fn product(
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    depth: usize,
    rows: usize,
    cols: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..rows {
        let row = &mut c[i * ldc..i * ldc + cols];
        if !accumulate {
            row.fill(0.0);
        }
        for l in 0..depth {
            let x = a[i * lda + l];
            for (o, &y) in row.iter_mut().zip(&b[l * ldb..l * ldb + cols]) {
                *o += x * y;
            }
        }
    }
}

/// One item with portable loops, a tile at a time.
fn portable_item(tile: &Tile<'_>, exp: Option<BlockFn>, out: &mut OutRows<'_>) {
    let sh = tile.shape;
    let (e, ev) = (sh.e, sh.ev);
    let rows = out.rows;
    let t0 = tile.first_row;
    let (qs, q_rows) = tile.queries(rows);
    let mut acc = vec![0f32; rows * ev];
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut sum = vec![0f32; rows];
    // The score tile [rows][KEY_BLOCK], then its probabilities.
    let mut scores = vec![0f32; rows * KEY_BLOCK];
    let mut keep = vec![0u64; rows];
    let mut add = vec![0f32; rows * KEY_BLOCK];
    // Each row's rescaling exponent, then factor.
    let mut rescale = vec![0f32; rows];
    // Keys after the last row's position take part in no row under a causal mask.
    let keys = if sh.causal { sh.s.min(t0 + rows) } else { sh.s };
    let additive = matches!(tile.mask, Some((Mask::Add(_), _)));
    let mut s0 = 0;
    while s0 < keys {
        let bk = KEY_BLOCK.min(keys - s0);
        tile.mask_tile(rows, s0, bk, &mut keep, &mut add);
        product(
            &qs,
            q_rows,
            &tile.keys[key_index(s0, 0, e)..],
            KEY_BLOCK,
            e,
            rows,
            bk,
            &mut scores,
            KEY_BLOCK,
            false,
        );
        // Per row: mask, the new running maximum, `score − max` (then one exp call over the
        // whole tile), and the rescaling exponent `old max − new max` (one more call).
        for i in 0..rows {
            let row = &mut scores[i * KEY_BLOCK..(i + 1) * KEY_BLOCK];
            for (j, x) in row.iter_mut().enumerate() {
                if j >= bk || keep[i] >> j & 1 == 0 {
                    *x = f32::NEG_INFINITY;
                } else if additive {
                    *x += add[i * KEY_BLOCK + j];
                }
            }
            let new_max = max[i].max(lane_max(row));
            if new_max == f32::NEG_INFINITY {
                // Nothing seen yet (or every score is −inf): no probability mass, no rescaling.
                rescale[i] = 0.0;
                continue;
            }
            row.iter_mut().for_each(|s| *s -= new_max);
            rescale[i] = max[i] - new_max;
            max[i] = new_max;
        }
        exp_in_place(exp, &mut scores);
        exp_in_place(exp, &mut rescale);
        for i in 0..rows {
            let r = rescale[i];
            if r != 1.0 {
                sum[i] *= r;
                acc[i * ev..(i + 1) * ev].iter_mut().for_each(|a| *a *= r);
            }
            sum[i] += lane_sum(&scores[i * KEY_BLOCK..(i + 1) * KEY_BLOCK]);
        }
        let values = &tile.values[s0 * tile.value_rows..];
        if sh.causal {
            // Row by row, the keys up to the row's own position only: the others have p = 0,
            // and skipping them makes the row's sums the same whatever block it is in (a
            // product of 0 with an infinite value would be NaN).
            for i in 0..rows {
                let seen = bk.min((t0 + i + 1).saturating_sub(s0));
                product(
                    &scores[i * KEY_BLOCK..],
                    KEY_BLOCK,
                    values,
                    tile.value_rows,
                    seen,
                    1,
                    ev,
                    &mut acc[i * ev..],
                    ev,
                    true,
                );
            }
        } else {
            product(
                &scores,
                KEY_BLOCK,
                values,
                tile.value_rows,
                bk,
                rows,
                ev,
                &mut acc,
                ev,
                true,
            );
        }
        s0 += bk;
    }
    finish(&acc, &sum, out);
}

/// `out = acc / sum`, row by row.
fn finish(acc: &[f32], sum: &[f32], out: &mut OutRows<'_>) {
    let ev = out.ev;
    for (i, &s) in sum.iter().enumerate() {
        let inverse = 1.0 / s;
        for (o, &a) in out.row(i).iter_mut().zip(&acc[i * ev..(i + 1) * ev]) {
            *o = a * inverse;
        }
    }
}

/// The vector forms' `exp` (`exp_nonpositive`):
/// `e^r ≈ 1 + r·(c1 + r·(c2 + r·(c3 + r·(c4 + r·c5))))` on `|r| <= ln 2 / 2`, a minimax fit
/// of relative error 9.5e-8 with the coefficients rounded to f32 (a Lawson iteration over
/// 4001 Chebyshev points; PyTorch's `exp_u20` uses the same polynomial).
#[cfg(target_arch = "x86_64")]
const EXP_POLY: [f32; 5] = [
    0.999_999_7,
    0.499_991_5,
    0.166_676_36,
    0.041_897_93,
    0.008_290_315,
];
/// `ln 2` in two parts: `n · LN2_HI` is exact for `|n| < 2^15`.
#[cfg(target_arch = "x86_64")]
const LN2_HI: f32 = 0.693_359_4;
#[cfg(target_arch = "x86_64")]
const LN2_LO: f32 = -2.121_944_4e-4;

/// Query rows per micro-kernel call of both vector forms (each `groups`' doc says why 6).
#[cfg(target_arch = "x86_64")]
const GROUP: usize = 6;

/// Steps per pass of the vector forms' loops over the head dim and over the keys: their
/// scalar bookkeeping once per four steps, as in the GEMM kernels.
#[cfg(target_arch = "x86_64")]
const UNROLL: usize = 4;

/// `$body` for `$l` in `0..$n` in order, [`UNROLL`] of them per pass of the loop, then the rest
/// one at a time (the same steps in the same order either way): the vector forms' loops over
/// the head dim (`scores`) and over the keys every row takes (`p·v`). A macro, so that the
/// body is compiled with the calling micro-kernel's target features and its accumulators stay
/// in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! unrolled {
    ($n:expr, |$l:ident| $body:expr) => {{
        let n: usize = $n;
        let mut at = 0;
        while at + UNROLL <= n {
            {
                let $l = at;
                $body
            }
            {
                let $l = at + 1;
                $body
            }
            {
                let $l = at + 2;
                $body
            }
            {
                let $l = at + 3;
                $body
            }
            at += UNROLL;
        }
        while at < n {
            let $l = at;
            $body;
            at += 1;
        }
    }};
}

/// What a group of rows reads, all checked once per item (see [`vector_item`]).
#[cfg(target_arch = "x86_64")]
struct Operands<'a> {
    /// The item's query rows: row `r` at `r * q_rows`, `e` elements.
    qs: &'a [f32],
    q_rows: usize,
    e: usize,
    /// Keys packed transposed in tiles (`key_index`), unless `key_rows`.
    keys: &'a [f32],
    /// Keys where they are (key `j` at `j * stride`, `e` elements), and the scale the packed
    /// keys hold.
    key_rows: Option<(&'a [f32], usize)>,
    scale: f32,
    /// Values: row `j` at `j * value_rows`, `ev` elements.
    values: &'a [f32],
    value_rows: usize,
    ev: usize,
    /// The visible keys of each row of the tile (bit per key).
    keep: &'a [u64],
    /// The additive mask tile `[rows][KEY_BLOCK]`, if any.
    add: Option<&'a [f32]>,
    /// Under a causal mask, the position of the item's first row (else `None`).
    causal_from: Option<usize>,
}

/// The running state of the item's rows, and where they end (`lanes`: the vector form's
/// lanes, see [`vector_item`]).
#[cfg(target_arch = "x86_64")]
struct Rows<'a> {
    acc: &'a mut [f32],
    /// Row `i`'s maximum at `i` (`lanes` readable from any row of a group).
    max: &'a mut [f32],
    /// Row `i`'s sum as `lanes` partial sums at `lanes·i`.
    sum: &'a mut [f32],
    /// The item's output rows (`ev` each, `out_rows` apart), written by the last key
    /// tile: the accumulator over the sum (what [`finish`] computes), straight from the
    /// registers.
    out: *mut f32,
    out_rows: usize,
}

/// A vector form's micro-kernels for the `n ≤ GROUP` rows from `r0` against one key tile
/// (`avx512::groups`, `avx2::groups`).
#[cfg(target_arch = "x86_64")]
type GroupFn = unsafe fn(
    usize,
    &Operands<'_>,
    &mut Rows<'_>,
    &mut [f32; GROUP * KEY_BLOCK],
    usize,
    usize,
    usize,
    bool,
);

/// One item (see the module documentation) by a vector form of `lanes` lanes whose
/// micro-kernels are `group`: the item's running state, its mask tiles key tile by key tile,
/// and `group` on each `GROUP` rows of it.
///
/// # Safety
/// The CPU has the features `group` is compiled for.
#[cfg(target_arch = "x86_64")]
unsafe fn vector_item(tile: &Tile<'_>, out: &mut OutRows<'_>, lanes: usize, group: GroupFn) {
    let sh = tile.shape;
    let (e, ev, s) = (sh.e, sh.ev, sh.s);
    let rows = out.rows;
    let t0 = tile.first_row;
    let (qs, q_rows) = tile.queries(rows);
    let mut acc = vec![0f32; rows * ev];
    // Each row's running maximum (`lanes` more: a group's are loaded as `lanes` values).
    let mut max = vec![f32::NEG_INFINITY; rows + lanes];
    // Each row's running sum as `lanes` partial sums (added up once, for the output).
    let mut sum = vec![0f32; rows * lanes];
    let mut keep = vec![0u64; rows];
    let additive = matches!(tile.mask, Some((Mask::Add(_), _)));
    let mut add = vec![0f32; if additive { rows * KEY_BLOCK } else { 0 }];
    let mut p = [0f32; GROUP * KEY_BLOCK];
    // The bounds every pointer below stays within (the packed buffers are built with
    // exactly these sizes; checked here so that a mistake panics instead of reading out of
    // bounds).
    assert!(
        (e == 0
            || (rows - 1)
                .checked_mul(q_rows)
                .and_then(|x| x.checked_add(e))
                .is_some_and(|need| qs.len() >= need))
            && match tile.key_rows {
                Some((keys, stride)) => {
                    rows == 1 && (s == 0 || e == 0 || keys.len() >= (s - 1) * stride + e)
                }
                None => tile.keys.len() >= keys_len(s, e),
            }
            && (s == 0 || tile.values.len() >= (s - 1) * tile.value_rows + ev)
            && acc.len() >= rows * ev
            && out.ev == ev
            && max.len() >= rows + lanes
            && sum.len() >= rows * lanes,
        "attention: an item's packed buffers are too small"
    );
    let keys_end = if sh.causal { s.min(t0 + rows) } else { s };
    if keys_end == 0 {
        // No key for any row (not reached: `s > 0` here and a causal block sees its own
        // rows): 0/0, as the tiles would give.
        finish(&acc, &vec![0.0; rows], out);
        return;
    }
    let mut s0 = 0;
    while s0 < keys_end {
        let bk = KEY_BLOCK.min(keys_end - s0);
        tile.mask_tile(rows, s0, bk, &mut keep, &mut add);
        let ops = Operands {
            qs: &qs,
            q_rows,
            e,
            keys: tile.keys,
            key_rows: tile.key_rows,
            scale: sh.scale,
            values: tile.values,
            value_rows: tile.value_rows,
            ev,
            keep: &keep,
            add: additive.then_some(&add[..]),
            causal_from: sh.causal.then_some(t0),
        };
        let mut state = Rows {
            acc: &mut acc,
            max: &mut max,
            sum: &mut sum,
            // The rows `out` owns: `rows` of `ev` elements, `out.stride` apart.
            out: out.ptr,
            out_rows: out.stride,
        };
        let last = s0 + bk == keys_end;
        let mut r0 = 0;
        while r0 < rows {
            // SAFETY: the caller's CPU contract; rows `r0..r0 + n` are the item's, keys
            // `s0..s0 + bk` are inside `s` (`bk <= KEY_BLOCK`), and the buffers hold the sizes
            // asserted above.
            unsafe {
                group(
                    (rows - r0).min(GROUP),
                    &ops,
                    &mut state,
                    &mut p,
                    r0,
                    s0,
                    bk,
                    last,
                )
            };
            r0 += GROUP;
        }
        s0 += bk;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{key_index, Operands, OutRows, Rows, Tile, GROUP, KEY_BLOCK, UNROLL};
    use super::{EXP_POLY, LN2_HI, LN2_LO};
    use crate::math::LN_MIN_NORMAL;
    use std::arch::x86_64::*;

    /// One item (see the module documentation).
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512DQ and FMA.
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    pub(super) unsafe fn item(tile: &Tile<'_>, out: &mut OutRows<'_>) {
        // SAFETY: the CPU has what `groups` needs (the caller's).
        unsafe { super::vector_item(tile, out, 16, groups) }
    }

    /// [`group`] for the `n ≤ GROUP` rows from `r0`: `GROUP × 64` scores in 4·`GROUP`
    /// registers (24 of the 32), each step of either product 4 loads of keys or values and
    /// `GROUP` broadcasts for `4·GROUP` FMAs, as the GEMM's 6 × 64 tile.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512DQ and FMA; the arguments satisfy [`group`]'s contract
    /// for `N = n`.
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn groups(
        n: usize,
        ops: &Operands<'_>,
        state: &mut Rows<'_>,
        p: &mut [f32; GROUP * KEY_BLOCK],
        r0: usize,
        s0: usize,
        bk: usize,
        last: bool,
    ) {
        // SAFETY: forwarded; `n` selects the instance for that many rows.
        unsafe {
            match n {
                1 => group::<1>(ops, state, p, r0, s0, bk, last),
                2 => group::<2>(ops, state, p, r0, s0, bk, last),
                3 => group::<3>(ops, state, p, r0, s0, bk, last),
                4 => group::<4>(ops, state, p, r0, s0, bk, last),
                5 => group::<5>(ops, state, p, r0, s0, bk, last),
                _ => group::<GROUP>(ops, state, p, r0, s0, bk, last),
            }
        }
    }

    /// Packs keys `j0..j0 + n` (`n <= 16`, `j0` a multiple of 16: a run inside one key tile)
    /// times `scale` into `kt` at [`key_index`]; key `j0 + r` is `data[starts[r]..starts[r] +
    /// e]`. Sixteen columns at a time: 16 rows loaded, transposed in registers, and each
    /// column's 16 keys stored as one vector (the same values as the scalar loop: `x · scale`).
    ///
    /// # Safety
    /// The CPU has AVX-512F. (Bounds are checked here.)
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_keys(
        data: &[f32],
        starts: &[usize; 16],
        n: usize,
        e: usize,
        scale: f32,
        j0: usize,
        kt: &mut [f32],
    ) {
        assert!(
            n <= 16
                && j0.is_multiple_of(16)
                && starts[..n].iter().all(|&at| at + e <= data.len())
                && (n == 0 || e == 0 || key_index(j0 + n - 1, e - 1, e) < kt.len()),
            "attention: packing keys out of bounds"
        );
        let sv = _mm512_set1_ps(scale);
        let stored = lanes(n);
        let mut c0 = 0;
        while c0 < e {
            let width = lanes(e - c0);
            // SAFETY: the CPU contract; the masked loads read columns `c0..e` of rows `< n`
            // (asserted inside `data`), the stores lanes `< n` of columns `< e` (asserted
            // inside `kt`: a column's run of 16 stays in its tile as `j0 % 16 == 0`).
            unsafe {
                let mut block: [__m512; 16] = std::array::from_fn(|r| {
                    if r < n {
                        let x = _mm512_maskz_loadu_ps(width, data.as_ptr().add(starts[r] + c0));
                        _mm512_mul_ps(x, sv)
                    } else {
                        _mm512_setzero_ps()
                    }
                });
                // Row `r` of the block is key `j0 + r`; after, `block[c]` is column `c0 + c`.
                crate::gemm::transpose16(&mut block);
                for (c, &column) in block.iter().enumerate().take(e - c0) {
                    let at = key_index(j0, c0 + c, e);
                    _mm512_mask_storeu_ps(kt.as_mut_ptr().add(at), stored, column);
                }
            }
            c0 += 16;
        }
    }

    /// `exp` of the 16 lanes of `x`, for `x <= 0` (a score minus its row's maximum, an old
    /// maximum minus a new one): `−inf` gives 0 exactly (a masked key), and so does every `x`
    /// below −87.34, where the result would be subnormal (as autodiff's `erf` derivative does:
    /// a subnormal probability would cost an Intel core a microcode assist in every FMA of
    /// `p·v` reading it; next to the row's largest probability, 1, it changes no sum); NaN
    /// gives NaN. Within 3 ulp of `exp` elsewhere (2 measured: the test
    /// `attention_exp_is_within_3_ulp`), in 12 vector
    /// operations, where the block math's general-purpose `exp` takes 19 (clamping both ways):
    /// the attention step computes one per score, and the swap took attention_8x256x512's step
    /// from 13.0-13.1 to 12.4-12.5 ms at 1 thread. As `math::block`: `n = round(x·log2 e)`,
    /// `r = x − n·ln 2` in two steps, `e^r` by [`EXP_POLY`], times `2^n` (`scalef`). Callable
    /// where AVX-512F and FMA are enabled (elsewhere the compiler asks for `unsafe`).
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    pub(super) fn exp_nonpositive(x: __m512) -> __m512 {
        // Below `LN_MIN_NORMAL` the result is 0 (the lanes `keep` leaves out), and the
        // argument is clamped there, so that no lane forms a subnormal on the way; `max`
        // keeps its second operand when one is NaN, and "not less than" holds for NaN, so NaN
        // stays NaN.
        let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(LN_MIN_NORMAL));
        let x = _mm512_max_ps(_mm512_set1_ps(LN_MIN_NORMAL), x);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_POLY[4]);
        for &c in EXP_POLY[..4].iter().rev() {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
        _mm512_maskz_scalef_ps(keep, p, n)
    }

    /// `(1 << n) - 1` for `n <= 16`.
    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        ((1u32 << n.min(16)) - 1) as __mmask16
    }

    /// The sum of the 16 lanes, in a fixed order.
    #[inline(always)]
    unsafe fn hsum(v: __m512) -> f32 {
        // SAFETY: register operations the caller's target features provide.
        unsafe {
            let a = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b0100_1110>(v, v));
            let a = _mm512_add_ps(a, _mm512_shuffle_f32x4::<0b1011_0001>(a, a));
            let a = _mm512_add_ps(a, _mm512_permute_ps::<0b0100_1110>(a));
            let a = _mm512_add_ps(a, _mm512_permute_ps::<0b1011_0001>(a));
            _mm512_cvtss_f32(a)
        }
    }

    /// The scores of `N` query rows at `qp` (`q_rows` apart, `e` elements each) against the
    /// first `16·V` keys of the packed key tile at `kp` (`[e][KEY_BLOCK]`), keys past
    /// `key_lanes` 0; the other registers 0.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `qp` points to `(N − 1)·q_rows + e` and `kp` to `e·KEY_BLOCK`
    /// readable f32s.
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    #[inline]
    unsafe fn scores<const N: usize, const V: usize>(
        qp: *const f32,
        q_rows: usize,
        kp: *const f32,
        e: usize,
        key_lanes: &[__mmask16; 4],
    ) -> [[__m512; 4]; N] {
        let mut x = [[_mm512_setzero_ps(); 4]; N];
        // SAFETY: the contract; masked loads touch only their enabled lanes.
        unsafe {
            let q: [*const f32; N] = std::array::from_fn(|r| qp.add(r * q_rows));
            // Column `l` of the rows against the tile's keys.
            macro_rules! column {
                ($l:expr) => {{
                    let l: usize = $l;
                    let b = kp.add(l * KEY_BLOCK);
                    let bv: [__m512; V] =
                        std::array::from_fn(|v| _mm512_maskz_loadu_ps(key_lanes[v], b.add(v * 16)));
                    for (row, &q) in x.iter_mut().zip(&q) {
                        let a = _mm512_set1_ps(*q.add(l));
                        for (acc, &y) in row.iter_mut().zip(&bv) {
                            *acc = _mm512_fmadd_ps(a, y, *acc);
                        }
                    }
                }};
            }
            unrolled!(e, |l| column!(l));
        }
        x
    }

    /// One query row's scores against `bk ≤ KEY_BLOCK` keys read where they are (key `j` at
    /// `k + j · stride`, `e` contiguous values), as [`scores`] gives them from packed keys:
    /// `(q · k_j) · scale` in lane `j % 16` of register `j / 16`, 0 past `bk`. Each key's dot
    /// product runs in 16 lanes over `e` (masked at its end), and sixteen keys' lanes are
    /// summed at once by a transposing reduction (pairs of registers unpacked and added,
    /// twice, then the four 128-bit quarters twice), so one register holds their sixteen
    /// scores; the sums are in that order, not the packed form's (a product at a time along
    /// `e`), and the scale multiplies the sum instead of each key.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512DQ and FMA; `q` points to `e` values, and each of the
    /// `bk` keys to `e` values.
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    unsafe fn direct_scores(
        q: *const f32,
        k: *const f32,
        stride: usize,
        e: usize,
        scale: f32,
        bk: usize,
    ) -> [__m512; 4] {
        let mut x = [_mm512_setzero_ps(); 4];
        // SAFETY (the pointer reads): the contract; masked loads touch only their lanes.
        unsafe {
            let scale = _mm512_set1_ps(scale);
            for (v, x) in x.iter_mut().enumerate().take(bk.div_ceil(16)) {
                let first = v * 16;
                let keys = bk.min(first + 16) - first;
                // Lane-wise partial dot products of the block's keys (0 past `keys`: their
                // loads have no lanes, from key 0's row). Sixteen every time, so that the
                // accumulators stay in registers (a loop of `keys` kept them on the stack).
                let rows: [*const f32; 16] = std::array::from_fn(|j| {
                    if j < keys {
                        k.add((first + j) * stride)
                    } else {
                        k
                    }
                });
                let live: [__mmask16; 16] = std::array::from_fn(|j| if j < keys { !0 } else { 0 });
                let mut acc = [_mm512_setzero_ps(); 16];
                let mut c = 0;
                while c < e {
                    let m = lanes(e - c);
                    let qv = _mm512_maskz_loadu_ps(m, q.add(c));
                    for j in 0..16 {
                        let kv = _mm512_maskz_loadu_ps(m & live[j], rows[j].add(c));
                        acc[j] = _mm512_fmadd_ps(qv, kv, acc[j]);
                    }
                    c += 16;
                }
                // Pairs: each 128-bit quarter of `t[i]` holds keys 2i and 2i + 1's partial
                // sums of that quarter, lanes interleaved ([a0+a2, b0+b2, a1+a3, b1+b3]).
                let t: [__m512; 8] = std::array::from_fn(|i| {
                    let (a, b) = (acc[2 * i], acc[2 * i + 1]);
                    _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
                });
                // Quads: each quarter of `u[i]` holds keys 4i..4i + 4's sums of that quarter.
                let u: [__m512; 4] = std::array::from_fn(|i| {
                    let (a, b) = (_mm512_castps_pd(t[2 * i]), _mm512_castps_pd(t[2 * i + 1]));
                    _mm512_add_ps(
                        _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                        _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
                    )
                });
                // The four quarters of each key's sums added: quarters 0+1 and 2+3 of a pair
                // of registers, then of those.
                let half = |a: __m512, b: __m512| {
                    _mm512_add_ps(
                        _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                        _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
                    )
                };
                *x = _mm512_mul_ps(half(half(u[0], u[1]), half(u[2], u[3])), scale);
            }
        }
        x
    }

    /// Rows `r0..r0 + N` against the keys `s0..s0 + bk`: scores, softmax step, `p·v`; on the
    /// `last` key tile of the item the rows' outputs (accumulator over sum) go to `state.out`.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512DQ and FMA; `N <= GROUP` (checked when compiled); `r0 +
    /// N` rows are inside `ops.qs` (`q_rows` apart, `e` each), `state.acc` (`ev` per row)
    /// and `state.out` (`ev` per row, `state.out_rows` apart, the rows' own), `state.max`, `state.sum`, `ops.keep` and `ops.add` (`KEY_BLOCK` per
    /// row); `s0 + bk <= s`, `s0` a multiple of `KEY_BLOCK`, `bk <= KEY_BLOCK`; `ops.keys`
    /// holds `keys_len(s, e)` elements and `ops.values` `(s − 1)·value_rows + ev`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    unsafe fn group<const N: usize>(
        ops: &Operands<'_>,
        state: &mut Rows<'_>,
        p: &mut [f32; GROUP * KEY_BLOCK],
        r0: usize,
        s0: usize,
        bk: usize,
        last: bool,
    ) {
        // `p` holds `GROUP` rows.
        const { assert!(N <= GROUP) };
        let (e, ev) = (ops.e, ops.ev);
        let key_lanes: [__mmask16; 4] = std::array::from_fn(|v| lanes(bk.saturating_sub(v * 16)));
        let neg = _mm512_set1_ps(f32::NEG_INFINITY);
        // SAFETY (all pointer reads and writes below): the index bounds of the contract;
        // masked loads and stores touch only their enabled lanes (keys `< bk`, columns `< ev`).
        unsafe {
            // Under a causal mask the keys after the group's last row have p = 0 in every row:
            // neither product needs them. And `p·v` takes each row's keys up to its own
            // position only, as the portable form does (`0 · v` would be NaN for an infinite
            // value), so that a row's sums do not depend on the rows that share its group: key
            // `s0 + l` is for the rows from `(s0 + l) − first_row` on (every row's below
            // `every_row`).
            let (seen, every_row, first_row) = match ops.causal_from {
                Some(t0) => (
                    bk.min((t0 + r0 + N).saturating_sub(s0)),
                    bk.min((t0 + r0 + 1).saturating_sub(s0)),
                    t0 + r0,
                ),
                None => (bk, bk, 0),
            };
            let mut alpha = [1f32; 16];
            if seen > 0 {
                // Scores: x[r] = q[r0 + r] · kᵀ[.., s0..s0 + seen] (0 after `seen`).
                let (qp, kp) = (
                    ops.qs.as_ptr().add(r0 * ops.q_rows),
                    ops.keys.as_ptr().add(key_index(s0, 0, e)),
                );
                let q_rows = ops.q_rows;
                let mut x = match ops.key_rows {
                    // One row (the only rows there are when the keys are in place).
                    Some((keys, stride)) if N == 1 => {
                        let kr = keys.as_ptr().add(s0 * stride);
                        let x = direct_scores(qp, kr, stride, e, ops.scale, bk);
                        std::array::from_fn(|_| x)
                    }
                    _ => match seen.div_ceil(16) {
                        1 => scores::<N, 1>(qp, q_rows, kp, e, &key_lanes),
                        2 => scores::<N, 2>(qp, q_rows, kp, e, &key_lanes),
                        3 => scores::<N, 3>(qp, q_rows, kp, e, &key_lanes),
                        _ => scores::<N, 4>(qp, q_rows, kp, e, &key_lanes),
                    },
                };
                softmax_step::<N>(ops, state, &mut x, p, &key_lanes, r0, &mut alpha, neg);
            }
            // Else (every key of the tile is past the group's rows: a causal mask) the rows
            // are as they were: their probabilities here are 0, their maxima and sums stay,
            // and only the last tile has anything to do, to write them out.
            if seen == 0 && !last {
                return;
            }
            // acc[r] = acc[r]·alpha[r] + p[r]·v[s0..s0 + seen], 64 columns at a time; on the
            // last tile, out[r] = that / sum[r].
            let rescale = alpha[..N].iter().any(|&a| a != 1.0);
            let mut inverse = [0f32; N];
            if last {
                for (r, inverse) in inverse.iter_mut().enumerate() {
                    *inverse = 1.0 / hsum(_mm512_loadu_ps(state.sum.as_ptr().add((r0 + r) * 16)));
                }
            }
            let vp = ops.values.as_ptr().add(s0 * ops.value_rows);
            let ap = state.acc.as_mut_ptr().add(r0 * ev);
            let op = state.out.add(r0 * state.out_rows);
            let pp = p.as_ptr();
            let mut j = 0;
            while j < ev {
                let col_lanes: [__mmask16; 4] =
                    std::array::from_fn(|v| lanes((ev - j).saturating_sub(v * 16)));
                let mut o = [[_mm512_setzero_ps(); 4]; N];
                for (r, row) in o.iter_mut().enumerate() {
                    let scale = _mm512_set1_ps(alpha[r]);
                    for (v, acc) in row.iter_mut().enumerate() {
                        let old = _mm512_maskz_loadu_ps(col_lanes[v], ap.add(r * ev + j + v * 16));
                        // `old · 1` is `old`: the multiply only where a factor differs.
                        *acc = if rescale {
                            _mm512_mul_ps(old, scale)
                        } else {
                            old
                        };
                    }
                }
                // Key `l` for the rows from `first` on: `o[r] += p[r][l] · v[s0 + l]`.
                macro_rules! key {
                    ($l:expr, $first:expr) => {{
                        let (l, first): (usize, usize) = ($l, $first);
                        let b = vp.add(l * ops.value_rows + j);
                        let bv: [__m512; 4] = std::array::from_fn(|v| {
                            _mm512_maskz_loadu_ps(col_lanes[v], b.add(v * 16))
                        });
                        // Every row, each tested, and `p` read by pointer (as the AVX2 form:
                        // `skip(first)` and a bounds check per read cost the AVX2 loop its
                        // registers).
                        for (r, row) in o.iter_mut().enumerate() {
                            if r >= first {
                                let a = _mm512_set1_ps(*pp.add(r * KEY_BLOCK + l));
                                for (acc, &y) in row.iter_mut().zip(&bv) {
                                    *acc = _mm512_fmadd_ps(a, y, *acc);
                                }
                            }
                        }
                    }};
                }
                unrolled!(every_row, |l| key!(l, 0));
                // Past the first row's position, each key for the rows at or after it only.
                for l in every_row..seen {
                    key!(l, (s0 + l).saturating_sub(first_row));
                }
                for (r, row) in o.iter().enumerate() {
                    let inv = _mm512_set1_ps(inverse[r]);
                    for (v, &acc) in row.iter().enumerate() {
                        let at = r * ev + j + v * 16;
                        if last {
                            _mm512_mask_storeu_ps(
                                op.add(r * state.out_rows + j + v * 16),
                                col_lanes[v],
                                _mm512_mul_ps(acc, inv),
                            );
                        } else {
                            _mm512_mask_storeu_ps(ap.add(at), col_lanes[v], acc);
                        }
                    }
                }
                j += 64;
            }
        }
    }

    /// The softmax step of rows `r0..r0 + N` on their scores `x`: each row's mask, the new
    /// maxima of the group's rows and their rescaling factors `exp(old max − new max)` in
    /// one register each (into `alpha`; 1 where the maximum stays), then `p = exp(x − max)`
    /// into `p` and the rows' partial sums.
    ///
    /// # Safety
    /// As [`group`], and `state.max` holds 16 elements from `r0`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    #[inline]
    unsafe fn softmax_step<const N: usize>(
        ops: &Operands<'_>,
        state: &mut Rows<'_>,
        x: &mut [[__m512; 4]; N],
        p: &mut [f32; GROUP * KEY_BLOCK],
        key_lanes: &[__mmask16; 4],
        r0: usize,
        alpha: &mut [f32; 16],
        neg: __m512,
    ) {
        // SAFETY: as `group`.
        unsafe {
            let mut tile_max = [neg; GROUP];
            for (r, row) in x.iter_mut().enumerate() {
                let i = r0 + r;
                let keep = ops.keep[i];
                for (v, xv) in row.iter_mut().enumerate() {
                    if let Some(add) = ops.add {
                        let m = _mm512_maskz_loadu_ps(
                            key_lanes[v],
                            add.as_ptr().add(i * KEY_BLOCK + v * 16),
                        );
                        *xv = _mm512_add_ps(*xv, m);
                    }
                    if keep != u64::MAX {
                        *xv = _mm512_mask_blend_ps((keep >> (v * 16)) as __mmask16, neg, *xv);
                    }
                }
                tile_max[r] =
                    _mm512_max_ps(_mm512_max_ps(row[0], row[1]), _mm512_max_ps(row[2], row[3]));
            }
            // Lane r < N: row r0 + r. `max` keeps its second operand when one is NaN, so a
            // row's maximum stays what it was where its scores' is NaN (as `f32::max` did).
            let old = _mm512_loadu_ps(state.max.as_ptr().add(r0));
            let new = _mm512_max_ps(group_max::<N>(&tile_max), old);
            // `old − new` where the maximum grew (−inf when nothing was visible before: factor
            // 0), else 0 (factor 1; also where both are −inf). Lanes past the group's rows hold
            // other rows' maxima: 0 there too, as their `old − new` may be any value (one far
            // below −87 made a subnormal factor, which costs an Intel core a microcode assist).
            let same = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(new, old);
            let factors = exp_nonpositive(_mm512_maskz_sub_ps(!same & lanes(N), old, new));
            _mm512_storeu_ps(alpha.as_mut_ptr(), factors);
            _mm512_mask_storeu_ps(state.max.as_mut_ptr().add(r0), lanes(N), new);
            let mut new_max = [0f32; 16];
            _mm512_storeu_ps(new_max.as_mut_ptr(), new);
            for (r, row) in x.iter().enumerate() {
                let i = r0 + r;
                let pr = p.as_mut_ptr().add(r * KEY_BLOCK);
                if new_max[r] == f32::NEG_INFINITY {
                    // Nothing visible yet: no probability mass, nothing to rescale (alpha 1).
                    for v in 0..4 {
                        _mm512_storeu_ps(pr.add(v * 16), _mm512_setzero_ps());
                    }
                    continue;
                }
                let nv = _mm512_set1_ps(new_max[r]);
                let pv: [__m512; 4] =
                    std::array::from_fn(|v| exp_nonpositive(_mm512_sub_ps(row[v], nv)));
                for (v, &y) in pv.iter().enumerate() {
                    _mm512_storeu_ps(pr.add(v * 16), y);
                }
                let total = _mm512_add_ps(_mm512_add_ps(pv[0], pv[1]), _mm512_add_ps(pv[2], pv[3]));
                let sp = state.sum.as_mut_ptr().add(i * 16);
                let sum = _mm512_fmadd_ps(_mm512_loadu_ps(sp), _mm512_set1_ps(alpha[r]), total);
                _mm512_storeu_ps(sp, sum);
            }
        }
    }

    /// The maxima of the first `N` registers of `m` in lanes 0 to `N − 1`: [`hmax4`] of the
    /// first four, and past four rows [`hmax4`] of the next two (in its places 0 and 1, so each
    /// row's maximum is taken in the same order whichever place it has) blended into lanes 4
    /// and 5.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn group_max<const N: usize>(m: &[__m512; GROUP]) -> __m512 {
        const { assert!(GROUP == 6) };
        let low = hmax4([m[0], m[1], m[2], m[3]]);
        if N <= 4 {
            return low;
        }
        let high = hmax4([m[4], m[5], m[4], m[5]]);
        _mm512_mask_blend_ps(0b11_0000, low, high)
    }

    /// The maxima of the four registers `m` in lanes 0 to 3 (and again in each 128-bit lane):
    /// interleaves within 128-bit lanes, then across them, 13 operations for the four.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn hmax4(m: [__m512; 4]) -> __m512 {
        // Lane k of `a`: the maxima of m0's and of m1's elements 4k, 4k + 2 and of their
        // 4k + 1, 4k + 3, interleaved (`b`: m2's and m3's).
        let a = _mm512_max_ps(
            _mm512_unpacklo_ps(m[0], m[1]),
            _mm512_unpackhi_ps(m[0], m[1]),
        );
        let b = _mm512_max_ps(
            _mm512_unpacklo_ps(m[2], m[3]),
            _mm512_unpackhi_ps(m[2], m[3]),
        );
        let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
        // Lane k: the maxima of m0..m3 over their 128-bit lane k.
        let c = _mm512_max_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        );
        let c = _mm512_max_ps(c, _mm512_shuffle_f32x4::<0b0100_1110>(c, c));
        _mm512_max_ps(c, _mm512_shuffle_f32x4::<0b1011_0001>(c, c))
    }
}

/// The AVX2 form: the AVX-512 form's steps on 8-lane registers. Sixteen of them cannot hold a
/// group's `GROUP × 64` scores (48 registers), so the score product runs on `GROUP` rows × 16
/// keys at a time (12 accumulators, 2 key loads and a broadcast: 15 registers, the GEMM's
/// AVX2 tile), four passes for a key tile, each masking its scores in registers and storing
/// them to the group's `p` tile (in L1) while folding them into the rows' maxima; the softmax
/// step then reads the tile back once, turning it into probabilities in place. `p·v` is the
/// same `GROUP` × 16 blocking over value columns.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{key_index, Operands, OutRows, Rows, Tile, GROUP, KEY_BLOCK, UNROLL};
    use super::{EXP_POLY, LN2_HI, LN2_LO};
    use crate::math::LN_MIN_NORMAL;
    use std::arch::x86_64::*;

    /// Keys per pass of the score product (two registers per row).
    const CHUNK: usize = 16;

    /// One item (see the module documentation).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn item(tile: &Tile<'_>, out: &mut OutRows<'_>) {
        // SAFETY: the CPU has what `groups` needs (the caller's).
        unsafe { super::vector_item(tile, out, 8, groups) }
    }

    /// [`group`] for the `n ≤ GROUP` rows from `r0`: `GROUP` rows × 16 columns (keys or value
    /// columns) are 12 accumulators of the 16 registers, each step 2 loads and `GROUP`
    /// broadcasts for 12 FMAs.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the arguments satisfy [`group`]'s contract
    /// for `N = n`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn groups(
        n: usize,
        ops: &Operands<'_>,
        state: &mut Rows<'_>,
        p: &mut [f32; GROUP * KEY_BLOCK],
        r0: usize,
        s0: usize,
        bk: usize,
        last: bool,
    ) {
        // SAFETY: forwarded; `n` selects the instance for that many rows.
        unsafe {
            match n {
                1 => group::<1>(ops, state, p, r0, s0, bk, last),
                2 => group::<2>(ops, state, p, r0, s0, bk, last),
                3 => group::<3>(ops, state, p, r0, s0, bk, last),
                4 => group::<4>(ops, state, p, r0, s0, bk, last),
                5 => group::<5>(ops, state, p, r0, s0, bk, last),
                _ => group::<GROUP>(ops, state, p, r0, s0, bk, last),
            }
        }
    }

    /// Packs keys `j0..j0 + n` (`n <= 16`, `j0` a multiple of 16: a run inside one key tile)
    /// times `scale` into `kt` at [`key_index`]; key `j0 + r` is `data[starts[r]..starts[r] +
    /// e]`. Eight keys by eight columns at a time: 8 rows loaded, transposed in registers, and
    /// each column's 8 keys stored as one vector (the same values as the scalar loop: `x ·
    /// scale`).
    ///
    /// # Safety
    /// The CPU has AVX2. (Bounds are checked here.)
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pack_keys(
        data: &[f32],
        starts: &[usize; 16],
        n: usize,
        e: usize,
        scale: f32,
        j0: usize,
        kt: &mut [f32],
    ) {
        assert!(
            n <= 16
                && j0.is_multiple_of(16)
                && starts[..n].iter().all(|&at| at + e <= data.len())
                && (n == 0 || e == 0 || key_index(j0 + n - 1, e - 1, e) < kt.len()),
            "attention: packing keys out of bounds"
        );
        let sv = _mm256_set1_ps(scale);
        for half in (0..n).step_by(8) {
            let keys = (n - half).min(8);
            let stored = lanes(keys);
            let mut c0 = 0;
            while c0 < e {
                let width = e - c0;
                let columns = lanes(width);
                // SAFETY: the CPU contract; the loads read columns `c0..e` of rows `half +
                // r < n` (asserted inside `data`; masked past `e`), the stores lanes `< keys`
                // of columns `< e` (asserted inside `kt`: a column's run of 8 from `j0 +
                // half` stays in its tile as `j0 % 16 == 0`).
                unsafe {
                    let mut block: [__m256; 8] = std::array::from_fn(|r| {
                        if r < keys {
                            let at = data.as_ptr().add(starts[half + r] + c0);
                            let x = if width >= 8 {
                                _mm256_loadu_ps(at)
                            } else {
                                _mm256_maskload_ps(at, columns)
                            };
                            _mm256_mul_ps(x, sv)
                        } else {
                            _mm256_setzero_ps()
                        }
                    });
                    // Row `r` of the block is key `j0 + half + r`; after, `block[c]` is column
                    // `c0 + c`.
                    transpose8(&mut block);
                    for (c, &column) in block.iter().enumerate().take(width) {
                        let at = kt.as_mut_ptr().add(key_index(j0 + half, c0 + c, e));
                        if keys == 8 {
                            _mm256_storeu_ps(at, column);
                        } else {
                            _mm256_maskstore_ps(at, stored, column);
                        }
                    }
                }
                c0 += 8;
            }
        }
    }

    /// Transposes the 8 × 8 block `r` (row `i` in `r[i]`) in place.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn transpose8(r: &mut [__m256; 8]) {
        // Rows 2i and 2i + 1 interleaved: `lo[i]` their elements 0, 1 (4, 5 in the high
        // half), `hi[i]` their 2, 3 (6, 7).
        let lo: [__m256; 4] = std::array::from_fn(|i| _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]));
        let hi: [__m256; 4] = std::array::from_fn(|i| _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]));
        // Column c of rows 4h..4h + 4 in the low half of `col[h][c]`, column c + 4 in its high
        // half.
        let col: [[__m256; 4]; 2] = std::array::from_fn(|h| {
            let (a, b) = (2 * h, 2 * h + 1);
            [
                _mm256_shuffle_ps::<0x44>(lo[a], lo[b]),
                _mm256_shuffle_ps::<0xEE>(lo[a], lo[b]),
                _mm256_shuffle_ps::<0x44>(hi[a], hi[b]),
                _mm256_shuffle_ps::<0xEE>(hi[a], hi[b]),
            ]
        });
        for c in 0..4 {
            r[c] = _mm256_permute2f128_ps::<0x20>(col[0][c], col[1][c]);
            r[c + 4] = _mm256_permute2f128_ps::<0x31>(col[0][c], col[1][c]);
        }
    }

    /// `exp` of the 8 lanes of `x`, for `x <= 0`: [`super::avx512::exp_nonpositive`]'s steps
    /// and constants on 8 lanes (so the same bits, which the test compares on a CPU with both
    /// forms). `−inf` and every `x` below −87.34 give +0 (where the result would be
    /// subnormal), NaN gives NaN; within 3 ulp of `exp` elsewhere (1.97 measured on the
    /// test `attention_exp_is_within_3_ulp`'s points). `scalef` becomes a multiply by `2^n` built
    /// in the exponent field: after the clamp `n` is in `[−126, 0]`, so `2^n` is a normal
    /// float and the product rounds once, as `scalef` does. 16 vector operations. Callable
    /// where AVX2 and FMA are enabled (elsewhere the compiler asks for `unsafe`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn exp_nonpositive(x: __m256) -> __m256 {
        let min = _mm256_set1_ps(LN_MIN_NORMAL);
        // Lanes below `LN_MIN_NORMAL` give 0, and their argument is clamped there so that no
        // lane forms a subnormal on the way; `max` keeps its second operand when one is NaN,
        // and "not less than" holds for NaN, so NaN stays NaN.
        let keep = _mm256_cmp_ps::<_CMP_NLT_UQ>(x, min);
        let x = _mm256_max_ps(min, x);
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_POLY[4]);
        for &c in EXP_POLY[..4].iter().rev() {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
        // `2^n`: the biased exponent `n + 127` (in `[1, 127]`; for a NaN lane whatever the
        // conversion gives, and the product stays NaN).
        let biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased));
        _mm256_and_ps(_mm256_mul_ps(p, pow2), keep)
    }

    /// All ones in lanes `0..n` (`n` clamped to 8), zeros after: the masks of `maskload` and
    /// `maskstore`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn lanes(n: usize) -> __m256i {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n.min(8) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// All ones in lane `k` where bit `k` of `bits` is set.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn bit_lanes(bits: u8) -> __m256 {
        let each = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let set = _mm256_and_si256(_mm256_set1_epi32(bits as i32), each);
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, each))
    }

    /// The sum of the 8 lanes, in a fixed order.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let a = _mm256_add_ps(v, _mm256_permute2f128_ps::<1>(v, v));
        let a = _mm256_add_ps(a, _mm256_permute_ps::<0b0100_1110>(a));
        let a = _mm256_add_ps(a, _mm256_permute_ps::<0b1011_0001>(a));
        _mm256_cvtss_f32(a)
    }

    /// The maximum of the 8 lanes, in a fixed order (`max` of the two operands each step,
    /// keeping the second when one is NaN, as everywhere in this form).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn hmax(v: __m256) -> f32 {
        let a = _mm256_max_ps(v, _mm256_permute2f128_ps::<1>(v, v));
        let a = _mm256_max_ps(a, _mm256_permute_ps::<0b0100_1110>(a));
        let a = _mm256_max_ps(a, _mm256_permute_ps::<0b1011_0001>(a));
        _mm256_cvtss_f32(a)
    }

    /// One query row's scores against the `keys ≤ 16` keys of a chunk read where they are
    /// (key `j` at `k + j · stride`, `e` contiguous values), as [`scores`] gives them from
    /// packed keys but 0 past `keys`: `(q · k_j) · scale` in lane `j % 8` of register `j / 8`.
    /// Each key's dot product runs in 8 lanes over `e` (masked at its end), and eight keys'
    /// lanes are summed at once by a transposing reduction (pairs unpacked and added, twice,
    /// then the two 128-bit halves), as the AVX-512 form's `direct_scores` does for sixteen.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `q` points to `e` values, and each of the `keys` keys to `e`
    /// values.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn direct_scores(
        q: *const f32,
        k: *const f32,
        stride: usize,
        e: usize,
        scale: f32,
        keys: usize,
    ) -> [__m256; 2] {
        let mut x = [_mm256_setzero_ps(); 2];
        // SAFETY (the pointer reads): the contract; masked loads touch only their lanes.
        unsafe {
            let scale = _mm256_set1_ps(scale);
            let none = _mm256_setzero_si256();
            for (h, x) in x.iter_mut().enumerate() {
                let first = h * 8;
                // Eight every time (dead keys' loads have no lanes, from key 0's row), so that
                // the accumulators stay in registers.
                let rows: [*const f32; 8] = std::array::from_fn(|j| {
                    if first + j < keys {
                        k.add((first + j) * stride)
                    } else {
                        k
                    }
                });
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut c = 0;
                while c < e {
                    let m = lanes(e - c);
                    let qv = _mm256_maskload_ps(q.add(c), m);
                    for j in 0..8 {
                        let live = if first + j < keys { m } else { none };
                        let kv = _mm256_maskload_ps(rows[j].add(c), live);
                        acc[j] = _mm256_fmadd_ps(qv, kv, acc[j]);
                    }
                    c += 8;
                }
                let pair = |a: __m256, b: __m256| {
                    _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b))
                };
                let t: [__m256d; 4] =
                    std::array::from_fn(|i| _mm256_castps_pd(pair(acc[2 * i], acc[2 * i + 1])));
                let quad = |a: __m256d, b: __m256d| {
                    _mm256_add_ps(
                        _mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                        _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)),
                    )
                };
                // Each 128-bit half of `u0` holds keys 0..4's sums of that half, of `u1` 4..8's.
                let (u0, u1) = (quad(t[0], t[1]), quad(t[2], t[3]));
                let sums = _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(u0, u1),
                    _mm256_permute2f128_ps::<0x31>(u0, u1),
                );
                *x = _mm256_mul_ps(sums, scale);
            }
        }
        x
    }

    /// The scores of `N` query rows at `qp` (`q_rows` apart, `e` elements each) against the
    /// 16 keys at `kp` of a packed key tile (rows of `KEY_BLOCK`), each `q · k` summed over
    /// the columns in order by FMAs. Keys past the tile's visible ones are read too (they are
    /// inside the tile) and masked by the caller.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `qp` points to `(N − 1)·q_rows + e` readable f32s and `kp` to
    /// `(e − 1)·KEY_BLOCK + 16` (when `e > 0`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn scores<const N: usize>(
        qp: *const f32,
        q_rows: usize,
        kp: *const f32,
        e: usize,
    ) -> [[__m256; 2]; N] {
        let mut x = [[_mm256_setzero_ps(); 2]; N];
        // SAFETY: the contract (column `l < e` of each row, keys `l·KEY_BLOCK + 0..16`).
        unsafe {
            let q: [*const f32; N] = std::array::from_fn(|r| qp.add(r * q_rows));
            // Column `l` of the rows against keys `l·KEY_BLOCK ..+ 16`.
            macro_rules! column {
                ($l:expr) => {{
                    let l: usize = $l;
                    let b = kp.add(l * KEY_BLOCK);
                    let (b0, b1) = (_mm256_loadu_ps(b), _mm256_loadu_ps(b.add(8)));
                    for (row, &q) in x.iter_mut().zip(&q) {
                        let a = _mm256_broadcast_ss(&*q.add(l));
                        row[0] = _mm256_fmadd_ps(a, b0, row[0]);
                        row[1] = _mm256_fmadd_ps(a, b1, row[1]);
                    }
                }};
            }
            unrolled!(e, |l| column!(l));
        }
        x
    }

    /// Rows `r0..r0 + N` against the keys `s0..s0 + bk`: scores, softmax step, `p·v`; on the
    /// `last` key tile of the item the rows' outputs (accumulator over sum) go to `state.out`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `N <= GROUP` (checked when compiled); `r0 + N` rows are
    /// inside `ops.qs` (`q_rows` apart, `e` each), `state.acc` (`ev` per row) and `state.out`
    /// (`ev` per row, `state.out_rows` apart, the rows' own), `state.max` (and 8 readable from
    /// `r0`), `state.sum` (8 per row), `ops.keep` and `ops.add` (`KEY_BLOCK` per row); `s0 +
    /// bk <= s`, `s0` a multiple of `KEY_BLOCK`, `bk <= KEY_BLOCK`; `ops.keys` holds
    /// `keys_len(s, e)` elements and `ops.values` `(s − 1)·value_rows + ev`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn group<const N: usize>(
        ops: &Operands<'_>,
        state: &mut Rows<'_>,
        p: &mut [f32; GROUP * KEY_BLOCK],
        r0: usize,
        s0: usize,
        bk: usize,
        last: bool,
    ) {
        // `p` holds `GROUP` rows.
        const { assert!(N <= GROUP) };
        let (e, ev) = (ops.e, ops.ev);
        let neg = _mm256_set1_ps(f32::NEG_INFINITY);
        // SAFETY (all pointer reads and writes below): the index bounds of the contract; the
        // key loads stay inside the tile at `s0` (whole in `keys_len`), the masked loads and
        // stores touch only their enabled lanes (columns `< ev`).
        unsafe {
            // As the AVX-512 form: under a causal mask neither product needs the keys after
            // the group's last row, and `p·v` takes each row's keys up to its own position
            // only (key `s0 + l` for the rows from `(s0 + l) − first_row` on; every row's
            // below `every_row`), so that a row's sums do not depend on the rows that share
            // its group.
            let (seen, every_row, first_row) = match ops.causal_from {
                Some(t0) => (
                    bk.min((t0 + r0 + N).saturating_sub(s0)),
                    bk.min((t0 + r0 + 1).saturating_sub(s0)),
                    t0 + r0,
                ),
                None => (bk, bk, 0),
            };
            let mut alpha = [1f32; 8];
            if seen > 0 {
                let qp = ops.qs.as_ptr().add(r0 * ops.q_rows);
                let kp = ops.keys.as_ptr().add(key_index(s0, 0, e));
                // Each row's masked scores over the tile, 16 keys a pass: into `p` (as
                // scores) and into the row's maximum register `m`. A pass past `seen` has no
                // visible key in any row of the group: its scores are −inf, not computed (the
                // same values and the same `max` steps as if they were).
                let mut m = [neg; N];
                for c in 0..KEY_BLOCK / CHUNK {
                    let at = c * CHUNK;
                    let x = if at < seen {
                        let mut x = match ops.key_rows {
                            // One row (the only rows there are when the keys are in place).
                            Some((keys, stride)) if N == 1 => {
                                let kr = keys.as_ptr().add((s0 + at) * stride);
                                let visible = (bk - at).min(CHUNK);
                                let x = direct_scores(qp, kr, stride, e, ops.scale, visible);
                                std::array::from_fn(|_| x)
                            }
                            _ => scores::<N>(qp, ops.q_rows, kp.add(at), e),
                        };
                        for (r, row) in x.iter_mut().enumerate() {
                            let i = r0 + r;
                            let keep = ops.keep[i];
                            for (h, xv) in row.iter_mut().enumerate() {
                                let j = at + 8 * h;
                                if let Some(add) = ops.add {
                                    let added =
                                        _mm256_loadu_ps(add.as_ptr().add(i * KEY_BLOCK + j));
                                    *xv = _mm256_add_ps(*xv, added);
                                }
                                if keep != u64::MAX {
                                    *xv = _mm256_blendv_ps(neg, *xv, bit_lanes((keep >> j) as u8));
                                }
                                _mm256_storeu_ps(p.as_mut_ptr().add(r * KEY_BLOCK + j), *xv);
                            }
                        }
                        x
                    } else {
                        [[neg; 2]; N]
                    };
                    for (m, row) in m.iter_mut().zip(&x) {
                        *m = _mm256_max_ps(_mm256_max_ps(row[0], row[1]), *m);
                    }
                }
                softmax_step::<N>(state, &m, p, seen, r0, &mut alpha);
            }
            // Else (every key of the tile is past the group's rows: a causal mask) the rows
            // are as they were, and only the last tile has anything to do, to write them out.
            if seen == 0 && !last {
                return;
            }
            // acc[r] = acc[r]·alpha[r] + p[r]·v[s0..s0 + seen], 16 columns at a time; on the
            // last tile, out[r] = that / sum[r].
            let rescale = alpha[..N].iter().any(|&a| a != 1.0);
            let mut inverse = [0f32; N];
            if last {
                for (r, inverse) in inverse.iter_mut().enumerate() {
                    *inverse = 1.0 / hsum(_mm256_loadu_ps(state.sum.as_ptr().add((r0 + r) * 8)));
                }
            }
            let values = ValueRows {
                p: p.as_ptr(),
                alpha: &alpha,
                inverse: &inverse,
                r0,
                s0,
                rescale,
                last,
                every_row,
                seen,
                first_row,
            };
            let mut j = 0;
            while j < ev {
                // Whole 16 columns load and store plainly, the tail masked: two instances, so
                // that the loops over the keys test neither.
                if ev - j >= 16 {
                    value_columns::<N, true>(ops, state, &values, j);
                } else {
                    value_columns::<N, false>(ops, state, &values, j);
                }
                j += 16;
            }
        }
    }

    /// What [`value_columns`] needs of its [`group`]: the group's probabilities `p`
    /// (`GROUP · KEY_BLOCK`), its rows' rescaling factors and (on the `last` key tile) inverse
    /// sums, and which keys each row takes (see `group`).
    struct ValueRows<'a, const N: usize> {
        p: *const f32,
        alpha: &'a [f32; 8],
        inverse: &'a [f32; N],
        r0: usize,
        s0: usize,
        rescale: bool,
        last: bool,
        every_row: usize,
        seen: usize,
        first_row: usize,
    }

    /// Columns `j..j + 16` (those below `ev`) of [`group`]'s `p·v`: `acc[r] = acc[r]·alpha[r] +
    /// p[r]·v[s0..s0 + seen]`, or on the `last` tile `out[r] = that · inverse[r]`. `WHOLE`: all
    /// 16 columns are below `ev` (plain loads and stores; else masked).
    ///
    /// # Safety
    /// As [`group`], whose values `g` holds; `j < ev`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn value_columns<const N: usize, const WHOLE: bool>(
        ops: &Operands<'_>,
        state: &mut Rows<'_>,
        g: &ValueRows<'_, N>,
        j: usize,
    ) {
        let ev = ops.ev;
        let ValueRows {
            p,
            alpha,
            inverse,
            r0,
            s0,
            rescale,
            last,
            every_row,
            seen,
            first_row,
        } = *g;
        // SAFETY: as `group` (the same reads and writes as its loop over the columns did).
        unsafe {
            let vp = ops.values.as_ptr().add(s0 * ops.value_rows);
            let ap = state.acc.as_mut_ptr().add(r0 * ev);
            let op = state.out.add(r0 * state.out_rows);
            let cols = [lanes(ev - j), lanes((ev - j).saturating_sub(8))];
            {
                macro_rules! load {
                    ($at:expr, $h:expr) => {
                        if WHOLE {
                            _mm256_loadu_ps($at)
                        } else {
                            _mm256_maskload_ps($at, cols[$h])
                        }
                    };
                }
                let mut o = [[_mm256_setzero_ps(); 2]; N];
                for (r, row) in o.iter_mut().enumerate() {
                    let scale = _mm256_set1_ps(alpha[r]);
                    for (h, acc) in row.iter_mut().enumerate() {
                        let old = load!(ap.add(r * ev + j + 8 * h), h);
                        // `old · 1` is `old`: the multiply only where a factor differs.
                        *acc = if rescale {
                            _mm256_mul_ps(old, scale)
                        } else {
                            old
                        };
                    }
                }
                // Key `l` for the rows from `first` on: `o[r] += p[r][l] · v[s0 + l]`.
                macro_rules! key {
                    ($l:expr, $first:expr) => {{
                        let (l, first): (usize, usize) = ($l, $first);
                        let b = vp.add(l * ops.value_rows + j);
                        let bv = [load!(b, 0), load!(b.add(8), 1)];
                        // Every row, each tested (not `skip(first)`: a loop from a variable row
                        // kept the accumulators in memory rather than in registers).
                        for (r, row) in o.iter_mut().enumerate() {
                            if r >= first {
                                let a = _mm256_broadcast_ss(&*p.add(r * KEY_BLOCK + l));
                                row[0] = _mm256_fmadd_ps(a, bv[0], row[0]);
                                row[1] = _mm256_fmadd_ps(a, bv[1], row[1]);
                            }
                        }
                    }};
                }
                unrolled!(every_row, |l| key!(l, 0));
                // Past the first row's position, each key for the rows at or after it only.
                for l in every_row..seen {
                    key!(l, (s0 + l).saturating_sub(first_row));
                }
                for (r, row) in o.iter().enumerate() {
                    let inv = _mm256_set1_ps(inverse[r]);
                    for (h, &acc) in row.iter().enumerate() {
                        let (at, y) = if last {
                            (
                                op.add(r * state.out_rows + j + 8 * h),
                                _mm256_mul_ps(acc, inv),
                            )
                        } else {
                            (ap.add(r * ev + j + 8 * h), acc)
                        };
                        if WHOLE {
                            _mm256_storeu_ps(at, y);
                        } else {
                            _mm256_maskstore_ps(at, cols[h], y);
                        }
                    }
                }
            }
        }
    }

    /// The softmax step of rows `r0..r0 + N` whose masked scores are in `p` (keys `< seen`;
    /// the others −inf) and their maxima in `m`: the new maxima and the rescaling factors
    /// `exp(old max − new max)` of the group in one register (into `alpha`; 1 where the
    /// maximum stays), then `p = exp(x − max)` in place and the rows' partial sums.
    ///
    /// # Safety
    /// As [`group`].
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn softmax_step<const N: usize>(
        state: &mut Rows<'_>,
        m: &[__m256; N],
        p: &mut [f32; GROUP * KEY_BLOCK],
        seen: usize,
        r0: usize,
        alpha: &mut [f32; 8],
    ) {
        // SAFETY: as `group`.
        unsafe {
            // Lane r < N: row r0 + r (−inf after). `max` keeps its second operand when one is
            // NaN, so a row's maximum stays what it was where its scores' is NaN.
            let mut tile_max = [f32::NEG_INFINITY; 8];
            for (t, &m) in tile_max.iter_mut().zip(m) {
                *t = hmax(m);
            }
            let old = _mm256_loadu_ps(state.max.as_ptr().add(r0));
            let new = _mm256_max_ps(_mm256_loadu_ps(tile_max.as_ptr()), old);
            // `old − new` where the maximum grew (−inf when nothing was visible before: factor
            // 0), else 0 (factor 1; also where both are −inf, and in the lanes past the
            // group's rows, whose difference is not even formed).
            let same = _mm256_cmp_ps::<_CMP_EQ_OQ>(new, old);
            let grew = _mm256_andnot_ps(same, _mm256_castsi256_ps(lanes(N)));
            let diff = _mm256_sub_ps(_mm256_and_ps(old, grew), _mm256_and_ps(new, grew));
            _mm256_storeu_ps(alpha.as_mut_ptr(), exp_nonpositive(diff));
            let mut new_max = [0f32; 8];
            _mm256_storeu_ps(new_max.as_mut_ptr(), new);
            state.max[r0..r0 + N].copy_from_slice(&new_max[..N]);
            // The 8-key registers that hold a visible key of some row; past them every
            // probability is exp(−inf) = 0, so they are left as zeros (`x + 0` is `x` in the
            // sums), and `p·v` reads no key at or past `seen`.
            let vectors = seen.div_ceil(8);
            for (r, &max) in new_max[..N].iter().enumerate() {
                let i = r0 + r;
                let pr = p.as_mut_ptr().add(r * KEY_BLOCK);
                if max == f32::NEG_INFINITY {
                    // Nothing visible yet: no probability mass, nothing to rescale (alpha 1).
                    for v in 0..vectors {
                        _mm256_storeu_ps(pr.add(v * 8), _mm256_setzero_ps());
                    }
                    continue;
                }
                let nv = _mm256_set1_ps(max);
                let mut pv = [_mm256_setzero_ps(); 8];
                for (v, y) in pv.iter_mut().enumerate().take(vectors) {
                    *y = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(pr.add(v * 8)), nv));
                    _mm256_storeu_ps(pr.add(v * 8), *y);
                }
                let total = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(pv[0], pv[1]), _mm256_add_ps(pv[2], pv[3])),
                    _mm256_add_ps(_mm256_add_ps(pv[4], pv[5]), _mm256_add_ps(pv[6], pv[7])),
                );
                let sp = state.sum.as_mut_ptr().add(i * 8);
                let sum = _mm256_fmadd_ps(_mm256_loadu_ps(sp), _mm256_set1_ps(alpha[r]), total);
                _mm256_storeu_ps(sp, sum);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a test mask does to the score of (head, row, key): `Some(added)` takes part.
    type Visible<'a> = &'a dyn Fn(usize, usize, usize) -> Option<f64>;

    /// The textbook form: scores, a row softmax in f64, then `p·v` (NaN for a row that sees no
    /// key, as the prim expansion gives).
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        sh: &AttentionShape<'_>,
        visible: Visible<'_>,
    ) -> Vec<f32> {
        let heads: usize = sh.batch.iter().product();
        let mut out = vec![0f32; heads * sh.t * sh.ev];
        for h in 0..heads {
            let (qh, kh) = (h * sh.t * sh.e, (h / sh.group) * sh.s * sh.e);
            let vh = (h / sh.group) * sh.s * sh.ev;
            for t in 0..sh.t {
                let keys = if sh.causal { sh.s.min(t + 1) } else { sh.s };
                let scores: Vec<f64> = (0..keys)
                    .map(|j| match visible(h, t, j) {
                        Some(added) => {
                            (0..sh.e)
                                .map(|c| (q[qh + t * sh.e + c] * k[kh + j * sh.e + c]) as f64)
                                .sum::<f64>()
                                * sh.scale as f64
                                + added
                        }
                        None => f64::NEG_INFINITY,
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores
                    .iter()
                    .map(|&s| {
                        if s == f64::NEG_INFINITY {
                            0.0
                        } else {
                            (s - max).exp()
                        }
                    })
                    .collect();
                let sum: f64 = p.iter().sum();
                for c in 0..sh.ev {
                    let o: f64 = (0..keys).map(|j| p[j] * v[vh + j * sh.ev + c] as f64).sum();
                    out[(h * sh.t + t) * sh.ev + c] = (o / sum) as f32;
                }
            }
        }
        out
    }

    /// The forms to test on this CPU: portable, and AVX-512 and AVX2 where it has them.
    fn forms() -> Vec<Form> {
        Form::ALL.into_iter().filter(|f| f.is_supported()).collect()
    }

    /// The strides of a contiguous `[2, heads, rows, cols]` tensor.
    fn head_strides(rows: usize, cols: usize, heads: usize) -> Vec<i64> {
        vec![
            (heads * rows * cols) as i64,
            (rows * cols) as i64,
            cols as i64,
            1,
        ]
    }

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 + 1.0) * 0.37 + seed).sin())
            .collect()
    }

    /// Queries and keys read through views whose rows are not contiguous (stored `[.., e, t]`
    /// and seen transposed: the queries are packed and the keys take the scalar packing),
    /// and keys of more than 16 rows with a partial last run, in every form, against the
    /// reference on the same values stored contiguously.
    #[test]
    fn transposed_queries_and_keys_match_the_reference() {
        for &(t, s, e, ev, causal) in &[(19, 37, 20, 24, false), (45, 45, 33, 16, true)] {
            let batch = [2usize, 2];
            let (q, k, v) = (
                data(4 * t * e, 0.5),
                data(4 * s * e, 1.5),
                data(4 * s * ev, 2.5),
            );
            let sh = AttentionShape {
                batch: &batch,
                t,
                s,
                e,
                ev,
                group: 1,
                scale: 0.3,
                causal,
            };
            let want = reference(&q, &k, &v, &sh, &|_: usize, _: usize, _: usize| Some(0.0));
            // `x [4][rows][cols]` stored as `[4][cols][rows]`, and the strides that read it back.
            let transposed = |x: &[f32], rows: usize, cols: usize| -> (Vec<f32>, Vec<i64>) {
                let mut out = vec![0f32; x.len()];
                for h in 0..4 {
                    for r in 0..rows {
                        for c in 0..cols {
                            out[h * rows * cols + c * rows + r] = x[h * rows * cols + r * cols + c];
                        }
                    }
                }
                let m = (rows * cols) as i64;
                (out, vec![2 * m, m, 1, rows as i64])
            };
            let (qt, qs) = transposed(&q, t, e);
            let (kt, ks) = transposed(&k, s, e);
            let vs = head_strides(s, ev, 2);
            let forms = forms();
            for form in forms {
                let view = |data, strides| View {
                    data,
                    offset: 0,
                    strides,
                };
                let mut out = vec![0f32; want.len()];
                attention_on(
                    view(&qt, &qs),
                    view(&kt, &ks),
                    view(&v, &vs),
                    None,
                    &sh,
                    AttentionTiling::DEFAULT,
                    &mut out,
                    form,
                )
                .unwrap();
                for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "t {t} s {s} {form:?}: element {i}: {g} vs {w}"
                    );
                }
            }
        }
    }

    /// The attention step's `exp` of each vector form the CPU has (the AVX-512 and the AVX2
    /// `exp_nonpositive`) against `f64::exp`: within 3 ulp of the f32 result over `[−110, 0]`
    /// (every 61st float, and every float in `[−1, 0]` a 16th apart in bits), 0 for `−inf`
    /// and below −104, 1 for ±0, NaN for NaN; and the two forms give the same bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn attention_exp_is_within_3_ulp() {
        use crate::math::LN_MIN_NORMAL;
        use std::arch::x86_64::*;
        type Exp16 = fn(&[f32; 16]) -> [f32; 16];
        let avx512: Exp16 = |x| {
            let mut out = [0f32; 16];
            // SAFETY: the CPU has AVX-512F and FMA (only called after `has_avx512`); 16 lanes
            // in and out.
            unsafe {
                let y = avx512::exp_nonpositive(_mm512_loadu_ps(x.as_ptr()));
                _mm512_storeu_ps(out.as_mut_ptr(), y);
            }
            out
        };
        let avx2: Exp16 = |x| {
            let mut out = [0f32; 16];
            for h in 0..2 {
                // SAFETY: the CPU has AVX2 and FMA (only called after `has_avx2`); 8 lanes in
                // and out at `8·h` of 16.
                unsafe {
                    let y = avx2::exp_nonpositive(_mm256_loadu_ps(x.as_ptr().add(8 * h)));
                    _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), y);
                }
            }
            out
        };
        let mut forms: Vec<(&str, Exp16)> = Vec::new();
        if has_avx512() {
            forms.push(("avx512", avx512));
        }
        if has_avx2() {
            forms.push(("avx2", avx2));
        }
        let ulp = |want: f64| -> f64 {
            let w = want as f32;
            let next = f32::from_bits(w.to_bits() + 1);
            (next as f64 - w as f64).max(f32::from_bits(1) as f64)
        };
        // Negative floats' bits grow with their magnitude: -0 is 0x8000_0000, -110 about
        // 0xc2dc_0000.
        let bits = |lo: u32, hi: u32, step: usize| (lo..=hi).step_by(step).map(f32::from_bits);
        let inputs: Vec<f32> = bits(0x8000_0000, (-110f32).to_bits(), 61)
            .chain(bits(0x8000_0000, (-1f32).to_bits(), 16))
            .collect();
        let mut results: Vec<Vec<u32>> = Vec::new();
        for &(name, exp16) in &forms {
            let mut worst = 0f64;
            let mut got = Vec::with_capacity(inputs.len());
            for chunk in inputs.chunks(16) {
                let mut x = [0f32; 16];
                x[..chunk.len()].copy_from_slice(chunk);
                let y = exp16(&x);
                for (&x, &y) in x.iter().zip(&y).take(chunk.len()) {
                    got.push(y.to_bits());
                    if x < LN_MIN_NORMAL {
                        // Where the result would be subnormal: +0.
                        assert_eq!(y.to_bits(), 0, "{name}: exp({x:e}) = {y:e}, not +0");
                        continue;
                    }
                    let want = (x as f64).exp();
                    let err = (y as f64 - want).abs() / ulp(want);
                    worst = worst.max(err);
                    assert!(
                        err <= 3.0,
                        "{name}: exp({x:e}) = {y:e}, want {want:e} ({err} ulp)"
                    );
                }
            }
            assert!(worst > 0.0);
            eprintln!("{name}: worst {worst:.3} ulp");
            results.push(got);
            let below = f32::from_bits(LN_MIN_NORMAL.to_bits() + 1);
            let specials = [
                f32::NEG_INFINITY,
                -104.0,
                -200.0,
                -0.0,
                0.0,
                below,
                f32::NAN,
            ];
            let mut x = [0f32; 16];
            x[..specials.len()].copy_from_slice(&specials);
            let y = exp16(&x);
            assert_eq!(&y[..6], &[0.0, 0.0, 0.0, 1.0, 1.0, 0.0], "{name}");
            assert!(y[6].is_nan(), "{name}");
            assert!(
                exp16(&[LN_MIN_NORMAL; 16])[0] >= f32::MIN_POSITIVE,
                "{name}"
            );
        }
        if let [a, b] = &results[..] {
            assert!(a == b, "the AVX-512 and AVX2 exps differ");
        }
    }

    /// The portable loops and (where the CPU has them) the AVX-512 and AVX2 micro-kernels, at
    /// sizes that leave row and column tails, without a mask and with each kind of mask
    /// (broadcast over batch dims; the bool ones with a row that sees no key), against the
    /// reference.
    #[test]
    fn every_form_matches_the_reference() {
        for &(t, s, e, ev, group, causal) in &[
            (1, 1, 8, 8, 1, false),
            // One query row (a decoder's step), whose keys the AVX-512 form reads in place:
            // key blocks with tails, head dims with tails and of 1, grouped heads.
            (1, 15, 17, 9, 1, false),
            (1, 200, 64, 64, 1, false),
            (1, 65, 80, 20, 2, false),
            (1, 130, 16, 33, 3, true),
            (1, 64, 1, 8, 1, false),
            (37, 37, 17, 9, 2, true),
            (70, 130, 64, 64, 1, false),
            (65, 65, 128, 20, 1, true),
            (131, 67, 32, 16, 1, false),
            (33, 200, 40, 80, 3, true),
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
            let (qs, ks, vs) = (
                head_strides(t, e, batch[1]),
                head_strides(s, e, kv[1]),
                head_strides(s, ev, kv[1]),
            );
            // An additive mask [2, 1, t, s] and a bool one [t, s] (row 1 all false, when there
            // is a row 1), broadcast over the heads (and the batch).
            let added = data(2 * t * s, 3.0);
            let kept: Vec<u8> = (0..t * s)
                .map(|i| u8::from(i / s != 1 && (i * 7 + 3) % 5 != 0))
                .collect();
            let add_strides = [(t * s) as i64, 0, s as i64, 1];
            let keep_strides = [0, 0, s as i64, 1];
            let heads = batch[1];
            let plain = |_: usize, _: usize, _: usize| Some(0.0);
            let additive = |h: usize, t_: usize, j: usize| {
                Some(added[(h / heads) * t * s + t_ * s + j] as f64)
            };
            let keep = |_: usize, t_: usize, j: usize| (kept[t_ * s + j] != 0).then_some(0.0);
            let drop = |_: usize, t_: usize, j: usize| (kept[t_ * s + j] == 0).then_some(0.0);
            let cases: [(&str, Visible<'_>); 4] = [
                ("none", &plain),
                ("add", &additive),
                ("keep", &keep),
                ("drop", &drop),
            ];
            for (name, visible) in cases {
                let want = reference(&q, &k, &v, &sh, visible);
                let forms = forms();
                for form in forms {
                    let mut out = vec![0f32; want.len()];
                    let view = |data, strides| View {
                        data,
                        offset: 0,
                        strides,
                    };
                    let bools = |data| View {
                        data,
                        offset: 0,
                        strides: &keep_strides[..],
                    };
                    let mask = match name {
                        "add" => Some(Mask::Add(view(&added, &add_strides[..]))),
                        "keep" => Some(Mask::Keep(bools(&kept))),
                        "drop" => Some(Mask::Drop(bools(&kept))),
                        _ => None,
                    };
                    attention_on(
                        view(&q, &qs),
                        view(&k, &ks),
                        view(&v, &vs),
                        mask,
                        &sh,
                        AttentionTiling::DEFAULT,
                        &mut out,
                        form,
                    )
                    .unwrap();
                    let mut nan = 0;
                    for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                        nan += usize::from(w.is_nan());
                        assert!(
                            (g - w).abs() <= 1e-5 * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()),
                            "t {t} s {s} e {e} ev {ev} mask {name} {form:?}: \
                             element {i}: {g} vs {w}"
                        );
                    }
                    // The bool masks leave row 1 (of every head) without a key.
                    let empty = if matches!(name, "keep") && t > 1 {
                        4 * group * ev
                    } else {
                        0
                    };
                    assert!(nan >= empty, "mask {name}: {nan} NaNs");
                }
            }
        }
    }

    /// Under a causal mask a row reads no value of a later key, even through a probability of
    /// 0: with an infinite or NaN value in key row `j`, every row before `j` stays finite, in
    /// every form and under every tiling (including blocks whose row groups cross a key
    /// tile).
    #[test]
    fn causal_rows_never_read_a_later_keys_value() {
        let (t, e, ev) = (150, 16, 8);
        let batch = [1usize, 2];
        let (q, k) = (data(2 * t * e, 0.0), data(2 * t * e, 1.0));
        let sh = AttentionShape {
            batch: &batch,
            t,
            s: t,
            e,
            ev,
            group: 1,
            scale: 0.25,
            causal: true,
        };
        let (qs, vs) = (head_strides(t, e, 2), head_strides(t, ev, 2));
        let mut tilings = AttentionTiling::candidates();
        tilings.extend([
            AttentionTiling::new(4, 1).unwrap(),
            AttentionTiling::new(36, 64).unwrap(),
        ]);
        for (j, bad_value) in [1, 5, 63, 64, 65, 66, 100, 149]
            .into_iter()
            .flat_map(|j| [(j, f32::INFINITY), (j, f32::NAN)])
        {
            let mut v = data(2 * t * ev, 2.0);
            v[j * ev + 3] = bad_value;
            for form in forms() {
                for &tiling in &tilings {
                    let view = |data, strides| View {
                        data,
                        offset: 0,
                        strides,
                    };
                    let mut out = vec![0f32; 2 * t * ev];
                    attention_on(
                        view(&q, &qs),
                        view(&k, &qs),
                        view(&v, &vs),
                        None,
                        &sh,
                        tiling,
                        &mut out,
                        form,
                    )
                    .unwrap();
                    let bad = out[..j * ev].iter().position(|x| !x.is_finite());
                    assert!(
                        bad.is_none(),
                        "value {bad_value} at key {j}, {form:?}, {tiling:?}: row {:?} \
                         is not finite",
                        bad.map(|i| i / ev)
                    );
                    // The rows from `j` on see it.
                    assert!(!out[j * ev + 3].is_finite());
                }
            }
        }
    }

    /// Every tiling max-autotune may choose (and a few odd ones) gives bitwise the default's
    /// results, in the portable and (where the CPU has them) the AVX-512 and AVX2 forms, with
    /// and without masks, causal or not, at odd sequence lengths, and under a causal mask with
    /// an infinite value in a key row that earlier rows must not see (a block that reaches
    /// past a row's diagonal must not multiply it by 0).
    #[test]
    fn every_tiling_gives_the_default_bits() {
        let mut tilings = AttentionTiling::candidates();
        tilings.extend([
            AttentionTiling::new(4, 1).unwrap(),
            AttentionTiling::new(36, 64).unwrap(),
            AttentionTiling::new(256, 3).unwrap(),
        ]);
        assert_eq!(AttentionTiling::new(30, 4), None);
        assert_eq!(AttentionTiling::new(64, 0), None);
        for &(t, s, e, ev, group, causal) in &[
            (37, 37, 17, 9, 2, true),
            (201, 201, 24, 20, 1, true),
            (131, 67, 32, 16, 1, false),
            (150, 190, 16, 70, 2, false),
            (97, 130, 8, 8, 1, true),
        ] {
            let batch = [2usize, 2 * group];
            let kv = [2usize, 2];
            let (q, k) = (data(4 * group * t * e, 0.0), data(4 * s * e, 1.0));
            let mut v = data(4 * s * ev, 2.0);
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
            let (qs, ks, vs) = (
                head_strides(t, e, batch[1]),
                head_strides(s, e, kv[1]),
                head_strides(s, ev, kv[1]),
            );
            let added = data(t * s, 3.0);
            let kept: Vec<u8> = (0..t * s).map(|i| u8::from((i * 7 + 3) % 5 != 0)).collect();
            let mask_strides = [0, 0, s as i64, 1];
            let mut values = vec![v.clone()];
            if causal {
                // Key row s − 3 of the first k/v head: infinite in column 1.
                v[(s - 3) * ev + 1] = f32::INFINITY;
                values.push(v.clone());
            }
            let forms = forms();
            for v in &values {
                for name in ["none", "add", "keep"] {
                    for &form in &forms {
                        let run = |tiling: AttentionTiling| {
                            let view = |data, strides| View {
                                data,
                                offset: 0,
                                strides,
                            };
                            let mask = match name {
                                "add" => Some(Mask::Add(view(&added, &mask_strides[..]))),
                                "keep" => Some(Mask::Keep(View {
                                    data: &kept[..],
                                    offset: 0,
                                    strides: &mask_strides[..],
                                })),
                                _ => None,
                            };
                            let mut out = vec![0f32; 4 * group * t * ev];
                            attention_on(
                                view(&q, &qs),
                                view(&k, &ks),
                                view(v, &vs),
                                mask,
                                &sh,
                                tiling,
                                &mut out,
                                form,
                            )
                            .unwrap();
                            out
                        };
                        let want = run(AttentionTiling::DEFAULT);
                        for &tiling in &tilings {
                            let got = run(tiling);
                            let differ = got
                                .iter()
                                .zip(&want)
                                .position(|(g, w)| g.to_bits() != w.to_bits());
                            assert!(
                                differ.is_none(),
                                "t {t} s {s} causal {causal} mask {name} {form:?} \
                                 {tiling:?}: element {differ:?} differs"
                            );
                        }
                    }
                }
            }
        }
    }

    /// No keys (S = 0): every output element is a sum over nothing, 0, as in the prim graph.
    #[test]
    fn attention_over_no_keys_writes_zeros() {
        let (t, e, ev) = (5, 8, 3);
        let sh = AttentionShape {
            batch: &[2],
            t,
            s: 0,
            e,
            ev,
            group: 1,
            scale: 0.5,
            causal: false,
        };
        let q = data(2 * t * e, 0.0);
        let empty: [f32; 0] = [];
        let view = |data, strides| View {
            data,
            offset: 0,
            strides,
        };
        let (qs, ks, vs) = (
            [(t * e) as i64, e as i64, 1],
            [0i64, e as i64, 1],
            [0i64, ev as i64, 1],
        );
        let forms = forms();
        for form in forms {
            let mut out = vec![f32::NAN; 2 * t * ev];
            attention_on(
                view(&q, &qs),
                view(&empty, &ks),
                view(&empty, &vs),
                None,
                &sh,
                AttentionTiling::DEFAULT,
                &mut out,
                form,
            )
            .unwrap();
            assert!(out.iter().all(|&x| x == 0.0), "{form:?}: {out:?}");
        }
    }

    /// A head dim of 0: every score is 0, so each output row is the mean of the value rows
    /// (of the visible ones, under the causal mask).
    #[test]
    fn attention_with_a_head_dim_of_zero_averages_the_values() {
        let (t, s, ev) = (3, 4, 5);
        let v = data(s * ev, 2.0);
        let empty: [f32; 0] = [];
        let view = |data, strides| View {
            data,
            offset: 0,
            strides,
        };
        let (qs, ks, vs) = ([0i64, 0, 1], [0i64, 0, 1], [0i64, ev as i64, 1]);
        for causal in [false, true] {
            let sh = AttentionShape {
                batch: &[1],
                t,
                s,
                e: 0,
                ev,
                group: 1,
                scale: 0.5,
                causal,
            };
            let forms = forms();
            for form in forms {
                let mut out = vec![f32::NAN; t * ev];
                attention_on(
                    view(&empty, &qs),
                    view(&empty, &ks),
                    view(&v, &vs),
                    None,
                    &sh,
                    AttentionTiling::DEFAULT,
                    &mut out,
                    form,
                )
                .unwrap();
                for row in 0..t {
                    let keys = if causal { row + 1 } else { s };
                    for c in 0..ev {
                        let want = (0..keys).map(|j| v[j * ev + c]).sum::<f32>() / keys as f32;
                        let got = out[row * ev + c];
                        assert!(
                            (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                            "causal {causal} {form:?} row {row} col {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// An output view in the layout a consumer of `[b, h, t, ev]` wants, `[b, t, h, ev]` (row
    /// `t` of head `h` at `((b·T + t)·H + h)·ev`), at an offset inside a larger buffer: the same
    /// bits as the contiguous output at each place, in every form, causal or not, at several
    /// tilings (so runs and blocks end mid-buffer), and nothing outside the view is written.
    /// A view whose rows overlap, or whose columns are not contiguous, is refused before
    /// anything is written.
    #[test]
    fn a_strided_output_view_gets_the_contiguous_bits() {
        let (heads, t, s, e, ev) = (3usize, 70usize, 70usize, 16usize, 12usize);
        let batch = [2usize, heads];
        let (q, k, v) = (
            data(2 * heads * t * e, 0.0),
            data(2 * heads * s * e, 1.0),
            data(2 * heads * s * ev, 2.0),
        );
        let (qs, ks, vs) = (
            head_strides(t, e, heads),
            head_strides(s, e, heads),
            head_strides(s, ev, heads),
        );
        let view = |data, strides| View {
            data,
            offset: 0,
            strides,
        };
        let permuted = [(t * heads * ev) as i64, ev as i64, (heads * ev) as i64, 1];
        let offset = 5usize;
        let len = 2 * heads * t * ev;
        for causal in [false, true] {
            let sh = AttentionShape {
                batch: &batch,
                t,
                s,
                e,
                ev,
                group: 1,
                scale: 0.25,
                causal,
            };
            for &form in &forms() {
                for tiling in [
                    AttentionTiling::DEFAULT,
                    AttentionTiling::new(4, 64).unwrap(),
                    AttentionTiling::new(32, 8).unwrap(),
                ] {
                    let mut want = vec![0f32; len];
                    attention_on(
                        view(&q, &qs),
                        view(&k, &ks),
                        view(&v, &vs),
                        None,
                        &sh,
                        tiling,
                        &mut want,
                        form,
                    )
                    .unwrap();
                    let mut got = vec![f32::NAN; len + offset + 3];
                    attention_view_on(
                        view(&q, &qs),
                        view(&k, &ks),
                        view(&v, &vs),
                        None,
                        &sh,
                        tiling,
                        OutView {
                            data: &mut got,
                            offset: offset as i64,
                            strides: &permuted,
                        },
                        form,
                    )
                    .unwrap();
                    let what = format!("causal {causal} {form:?} {tiling:?}");
                    for b in 0..2 {
                        for h in 0..heads {
                            for r in 0..t {
                                for c in 0..ev {
                                    let w = want[((b * heads + h) * t + r) * ev + c];
                                    let g = got[offset + ((b * t + r) * heads + h) * ev + c];
                                    assert_eq!(w.to_bits(), g.to_bits(), "{what}: {b} {h} {r} {c}");
                                }
                            }
                        }
                    }
                    let outside = got[..offset].iter().chain(&got[offset + len..]);
                    assert!(outside.into_iter().all(|x| x.is_nan()), "{what}");
                }
            }
            // Rows one element too close (they would overlap), and strided columns.
            for bad in [
                [permuted[0], permuted[1], ev as i64 - 1, 1],
                [permuted[0], permuted[1], permuted[2], 2],
                [permuted[0], 0, permuted[2], 1],
            ] {
                let mut out = vec![f32::NAN; 4 * len];
                let result = attention_into(
                    view(&q, &qs),
                    view(&k, &ks),
                    view(&v, &vs),
                    None,
                    &sh,
                    AttentionTiling::DEFAULT,
                    OutView {
                        data: &mut out,
                        offset: 0,
                        strides: &bad,
                    },
                );
                assert!(
                    matches!(result, Err(RuntimeError::BufferCheck(_))),
                    "{bad:?}: {result:?}"
                );
                assert!(out.iter().all(|x| x.is_nan()), "{bad:?} wrote");
            }
        }
    }
}
