//! The steps that call ahead-of-time code instead of a JIT kernel: GEMMs (with their epilogue
//! kernels run tile by tile), implicit-GEMM convolutions, fused attention and scatter-add.

use super::execute::{
    call_kernel_rows, kernel_pieces, read_f32, run_pieces, SharedPointers, Symbols,
};
use super::{CompiledKernel, Split};
use minductor_ir::DType;
use minductor_kernel_ir::{
    AttentionStep, BufferId, BufferKind, Im2colView, MaskKind, MatmulOperand, MatmulStep, Program,
    ScatterAddStep, StridedView,
};
use minductor_kernels::attention::{
    attention_into, AttentionShape, AttentionTiling, Mask, MaskData, OutView,
};
use minductor_kernels::gemm;
use minductor_kernels::scatter::{scatter_add, View};
use minductor_runtime::{threads, RuntimeError, Tensor};
use std::sync::Mutex;

/// The tiling of an attention on `threads` threads: max-autotune's choice (`tuned`) when it was
/// timed on this thread count, else the default.
fn attention_tiling(tuned: Split, threads: usize) -> AttentionTiling {
    match tuned {
        Split::Attention(a) if a.threads == threads => a.tiling().unwrap_or_default(),
        _ => AttentionTiling::DEFAULT,
    }
}

/// Runs a fused attention step on its buffers, tiled as `tuned` says (see
/// [`attention_tiling`]).
pub(super) fn run_attention(
    a: &AttentionStep,
    tuned: Split,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let numel = |id: BufferId| symbols.elements(program, id);
    // The mask's strides live outside any `Option`, always initialized (empty without a
    // mask): as `Option<(MaskData, i64, Vec<i64>)>`, whose `None` leaves the `Vec` unwritten,
    // the optimized drop glue tested the `Vec`'s capacity before the tag, a branch on
    // uninitialized stack memory that valgrind memcheck reported (issue 22).
    // SAFETY: each pointer is the start of a live buffer holding its planned number of f32
    // elements for this call's sizes (`run_steps`; `verify_program` checked that all four are
    // f32 buffers). The output is written by this step alone and overlaps no operand: the
    // verifier rejects an attention reading its own output, `plan_buffers` never places an
    // attention's output in place of a buffer it reads, and live buffers' slots are disjoint.
    // Every index the routine reads is checked against these slices; it writes only the
    // elements of the output view (`attention_into` checks it inside the output buffer, each
    // element its own place, before writing), the whole buffer being this step's alone.
    let (mask_data, mask_offset, mask_strides) = match &a.mask {
        None => (None, 0, Vec::new()),
        Some(m) => {
            let (offset, strides) = symbols.view(m, a.out.buffer)?;
            let n = numel(m.buffer);
            // SAFETY: as for q, k and v below (a buffer the step only reads; `verify_program`
            // checked that it is f32 for an additive mask, else bool: one byte an element).
            let data = unsafe {
                match a.mask_kind {
                    MaskKind::Add => MaskData::F32(read_f32(pointers, m.buffer, n)),
                    MaskKind::Keep | MaskKind::Drop => MaskData::Bool(std::slice::from_raw_parts(
                        pointers[m.buffer.0 as usize] as *const u8,
                        n,
                    )),
                }
            };
            (Some(data), offset, strides)
        }
    };
    // SAFETY: the pointers' contract stated at the top of this function.
    let (q, k, v, out) = unsafe {
        let read = |id: BufferId| read_f32(pointers, id, numel(id));
        (
            read(a.q.buffer),
            read(a.k.buffer),
            read(a.v.buffer),
            std::slice::from_raw_parts_mut(
                pointers[a.out.buffer.0 as usize] as *mut f32,
                numel(a.out.buffer),
            ),
        )
    };
    let (q_offset, q_strides) = symbols.view(&a.q, a.out.buffer)?;
    let (k_offset, k_strides) = symbols.view(&a.k, a.out.buffer)?;
    let (v_offset, v_strides) = symbols.view(&a.v, a.out.buffer)?;
    let (out_offset, out_strides) = symbols.view(&a.out, a.out.buffer)?;
    let q_shape = symbols.sizes(&a.q.shape);
    let k_shape = symbols.sizes(&a.k.shape);
    let v_shape = symbols.sizes(&a.v.shape);
    let rank = q_shape.len();
    if rank < 2 || k_shape.len() != rank || v_shape.len() != rank {
        return Err(RuntimeError::Unsupported(format!(
            "attention into {}: operands of ranks {}, {}, {}",
            a.out.buffer,
            rank,
            k_shape.len(),
            v_shape.len()
        )));
    }
    let shape = AttentionShape {
        batch: &q_shape[..rank - 2],
        t: q_shape[rank - 2],
        s: k_shape[rank - 2],
        e: q_shape[rank - 1],
        ev: v_shape[rank - 1],
        group: a.group,
        scale: a.scale,
        causal: a.causal,
    };
    let mask = match mask_data {
        Some(data) => Some(Mask::new(
            mask_kind(a.mask_kind),
            data,
            mask_offset,
            &mask_strides,
        )?),
        None => None,
    };
    let view = |data, offset, strides| View {
        data,
        offset,
        strides,
    };
    attention_into(
        view(q, q_offset, &q_strides),
        view(k, k_offset, &k_strides),
        view(v, v_offset, &v_strides),
        mask,
        &shape,
        attention_tiling(tuned, threads::num_threads()),
        OutView {
            data: out,
            offset: out_offset,
            strides: &out_strides,
        },
    )
}

/// A GEMM's failure as the call's error: out of memory stays `OutOfMemory`.
fn gemm_error(out: BufferId, e: gemm::GemmError) -> RuntimeError {
    match e {
        gemm::GemmError::OutOfMemory { bytes, what } => {
            RuntimeError::out_of_memory(bytes, format!("matmul {out}: packed {what}"))
        }
        gemm::GemmError::BufferCheck(message) => {
            RuntimeError::BufferCheck(format!("matmul {out}: {message}"))
        }
        e => RuntimeError::Unsupported(format!("matmul {out}: {e}")),
    }
}

/// The multiply-adds of each work item of attention step `a` (tiled as `tuned` says) for a
/// call with these sizes on `threads` threads (the partition report).
pub(super) fn attention_pieces_of(
    a: &AttentionStep,
    tuned: Split,
    symbols: &Symbols,
    threads: usize,
) -> Vec<u64> {
    let (q, k, v) = (
        symbols.sizes(&a.q.shape),
        symbols.sizes(&a.k.shape),
        symbols.sizes(&a.v.shape),
    );
    let rank = q.len();
    if rank < 2 || k.len() != rank || v.len() != rank {
        return vec![0];
    }
    minductor_kernels::attention::attention_pieces(
        &AttentionShape {
            batch: &q[..rank - 2],
            t: q[rank - 2],
            s: k[rank - 2],
            e: q[rank - 1],
            ev: v[rank - 1],
            group: a.group,
            scale: a.scale,
            causal: a.causal,
        },
        threads,
        attention_tiling(tuned, threads),
    )
}

/// Runs a scatter-add step on its buffers.
pub(super) fn run_scatter_add(
    sc: &ScatterAddStep,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let numel = |id: BufferId| symbols.elements(program, id);
    let (index_len, src_len, out_len) =
        (numel(sc.index.buffer), numel(sc.src.buffer), numel(sc.out));
    // SAFETY: each pointer is the start of a live buffer holding its planned number of elements
    // of its dtype for this call's sizes (`run_steps`): i64 indices, f32 source and output
    // (`fuse` only emits f32 scatter-adds). The output is written by this step alone and does
    // not overlap either operand: `plan_buffers` never places a scatter-add's output in place of
    // a buffer it reads, and live buffers' slots are disjoint.
    let (index, src, out) = unsafe {
        (
            std::slice::from_raw_parts(
                pointers[sc.index.buffer.0 as usize] as *const i64,
                index_len,
            ),
            read_f32(pointers, sc.src.buffer, src_len),
            std::slice::from_raw_parts_mut(pointers[sc.out.0 as usize] as *mut f32, out_len),
        )
    };
    let shape = symbols.sizes(&sc.src.shape);
    let out_shape = symbols.sizes(&program.buffer(sc.out).shape);
    let (index_offset, index_strides) = symbols.view(&sc.index, sc.out)?;
    let (src_offset, src_strides) = symbols.view(&sc.src, sc.out)?;
    scatter_add(
        View {
            data: index,
            offset: index_offset,
            strides: &index_strides,
        },
        View {
            data: src,
            offset: src_offset,
            strides: &src_strides,
        },
        &shape,
        out,
        &out_shape,
        sc.dim,
    )
}

/// Output units (rows, or indices of the first batch dim) per tile: one tile's GEMM output and
/// its epilogue stay in cache together.
const TILE_BYTES: usize = 256 << 10;

/// A GEMM operand packed once, when the program learned its value (a frozen weight,
/// [`prepare_constants`](minductor_runtime::Executable::prepare_constants)), so calls skip
/// packing it: a linear layer's `b`, or a convolution's weight (the implicit GEMM's `a`, packed
/// per group). A call uses it only when the operand's buffer is bound to the very storage it was
/// packed from.
pub(in crate::program) struct Prepacked {
    /// May read `_source`'s storage; declared first, so it is dropped before it.
    packed: Packed,
    /// The address of the constant's first element, which a call binds to the operand's buffer.
    address: usize,
    /// Keeps the constant's storage alive for `packed` (and its address unique to it). Shared
    /// with the frozen compile's own copy (and `Tensor` writes only storage it owns alone), so
    /// no one writes it meanwhile.
    _source: Tensor,
}

enum Packed {
    /// A linear layer's weight, `b` of a 2-D product (batch dims broadcast).
    B(gemm::PackedB<'static>),
    /// A convolution's weight, `a` of an implicit GEMM: one packing per channel group.
    ConvWeight(Vec<gemm::PackedA>),
    /// A convolution's weight transformed for Winograd: one per channel group.
    WinogradWeight(Vec<gemm::WinogradWeight>),
}

impl Prepacked {
    /// Packs `m`'s weight operand if it is a constant: program input `first + i`, given as
    /// `constants[i]` (f32, contiguous), read through a view of static strides (whose batch dims
    /// broadcast, for a `b`).
    pub(in crate::program) fn new(
        m: &MatmulStep,
        program: &Program,
        first: usize,
        constants: &[Tensor],
    ) -> Option<Prepacked> {
        let buffer = match &m.b {
            MatmulOperand::View(view) => view.buffer,
            MatmulOperand::Im2col(_) => m.a.buffer,
        };
        let BufferKind::Input(n) = program.buffer(buffer).kind else {
            return None;
        };
        let source = constants.get(n.checked_sub(first)?)?.clone();
        let expected = program.buffer(buffer);
        let same_type = source.dtype() == DType::F32
            && expected.dtype == DType::F32
            && expected
                .shape
                .iter()
                .map(|d| d.as_static())
                .collect::<Option<Vec<_>>>()?
                == source.shape();
        if !same_type || !source.is_contiguous() || source.numel() == 0 {
            return None;
        }
        // SAFETY: `source` is a contiguous f32 tensor of `numel` elements, so its first
        // element's address starts that many f32s of live storage. The storage stays alive and
        // unwritten for as long as the slice is used: the slice is used only while packing and
        // by a packed `b` (whose `MatrixRef` range `MatrixRef::new` checks against it), which
        // `packed` holds and drops before `_source`, which holds the storage; and a tensor's
        // storage is written only through a tensor owning it alone, which `_source`'s share
        // rules out.
        let data: &'static [f32] =
            unsafe { std::slice::from_raw_parts(source.data_ptr() as *const f32, source.numel()) };
        let kernel = gemm::Kernel::detect();
        let packed = match &m.b {
            MatmulOperand::View(view) => {
                let shape: Vec<usize> = view
                    .shape
                    .iter()
                    .map(|d| d.as_static())
                    .collect::<Option<_>>()?;
                let (offset, strides) = view.bind(|_| None)?;
                let batch = shape.len().checked_sub(2)?;
                if !(0..batch).all(|d| strides[d] == 0 || shape[d] == 1) {
                    return None;
                }
                let b = gemm::MatrixRef::new(
                    data,
                    offset,
                    [shape[batch], shape[batch + 1]],
                    [strides[batch], strides[batch + 1]],
                    "b",
                )
                .ok()?;
                // A product of few rows reads `b` in place (`plan_matmul`): nothing to pack
                // when `a`'s rows are static and that few.
                let rows: Option<usize> =
                    m.a.shape
                        .iter()
                        .rev()
                        .skip(1)
                        .map(|d| d.as_static())
                        .product();
                let b_2d = [strides[batch], strides[batch + 1]];
                if rows.is_some_and(|rows| {
                    gemm::prefers_few_rows(kernel, [rows, shape[batch], shape[batch + 1]], b_2d)
                }) {
                    return None;
                }
                Packed::B(gemm::PackedB::pack(&b, kernel, threads::num_threads()).ok()?)
            }
            MatmulOperand::Im2col(im2col) => {
                // `a` is [1, groups, rows, k] (see `run_implicit_matmul`).
                let shape: Vec<usize> =
                    m.a.shape
                        .iter()
                        .map(|d| d.as_static())
                        .collect::<Option<_>>()?;
                let (offset, strides) = m.a.bind(|_| None)?;
                let &[_, groups, rows, k] = &shape[..] else {
                    return None;
                };
                let group_weight = |g: usize| {
                    gemm::MatrixRef::new(
                        data,
                        offset + g as i64 * strides[1],
                        [rows, k],
                        [strides[2], strides[3]],
                        "a",
                    )
                    .ok()
                };
                // Transformed for Winograd if the calls will take that path (the image's size
                // is static), else packed for the implicit GEMM.
                let source: Option<Vec<usize>> = program
                    .buffer(im2col.source)
                    .shape
                    .iter()
                    .map(|d| d.as_static())
                    .collect();
                let winograd = match source.as_deref() {
                    Some(&[_, channels, h, w]) => gemm::prefers_winograd(
                        gemm::ConvAlgorithm::from_env(),
                        kernel,
                        &im2col.window,
                        channels / groups.max(1),
                        [h, w],
                    ),
                    _ => false,
                };
                if winograd {
                    Packed::WinogradWeight(
                        (0..groups)
                            .map(|g| {
                                gemm::WinogradWeight::transform(&group_weight(g)?, kernel).ok()
                            })
                            .collect::<Option<Vec<_>>>()?,
                    )
                } else {
                    Packed::ConvWeight(
                        (0..groups)
                            .map(|g| gemm::PackedA::pack(&group_weight(g)?, kernel).ok())
                            .collect::<Option<Vec<_>>>()?,
                    )
                }
            }
        };
        Some(Prepacked {
            packed,
            address: source.data_ptr() as usize,
            _source: source,
        })
    }

    /// Whether the weight was transformed for Winograd.
    pub(in crate::program) fn is_winograd(&self) -> bool {
        matches!(self.packed, Packed::WinogradWeight(_))
    }

    /// The packing, if `pointer` (what this call bound to the operand's buffer) is the
    /// constant's storage.
    fn for_pointer(&self, pointer: *mut u8) -> Option<&Packed> {
        (pointer as usize == self.address).then_some(&self.packed)
    }
}

/// The sizes of a plain (not implicit) GEMM step for one call.
struct MatmulSizes {
    a_shape: Vec<usize>,
    b_shape: Vec<usize>,
    batch: usize,
    rows: usize,
    k: usize,
    cols: usize,
    /// Matrices in the batch (1 for a 2-D product).
    count: usize,
}

impl MatmulSizes {
    fn new(m: &MatmulStep, b: &StridedView, symbols: &Symbols) -> MatmulSizes {
        let (a_shape, b_shape) = (symbols.sizes(&m.a.shape), symbols.sizes(&b.shape));
        let batch = a_shape.len() - 2;
        MatmulSizes {
            rows: a_shape[batch],
            k: a_shape[batch + 1],
            cols: b_shape[batch + 1],
            count: a_shape[..batch].iter().product(),
            a_shape,
            b_shape,
            batch,
        }
    }

    /// Saturating: only decides whether to split the GEMM across threads.
    fn flops(&self) -> usize {
        [self.count, self.rows, self.k, self.cols]
            .iter()
            .fold(2usize, |acc, &n| acc.saturating_mul(n))
    }
}

/// How a GEMM step runs for one call on some number of threads: the one place its path and
/// its cut are decided, for running it and for the partition report.
pub(super) enum MatmulPlan {
    /// One 2-D product of `rows` rows (all of a stacked batch's), cut by `split` (streamed:
    /// `a` packed once and shared; with `shares`, `b` too: `gemm::multiply_shared`), on
    /// `threads` threads. With `tiles` (the pieces hold whole rows) each piece runs the
    /// epilogue on its rows, tile by tile, right after computing them; else the epilogue runs
    /// over all rows after the product.
    Product {
        rows: usize,
        k: usize,
        streams: bool,
        shares: bool,
        tiles: bool,
        split: gemm::ProductSplit,
        threads: usize,
    },
    /// One 2-D product `a · wᵀ` of `rows × k` by `k × cols` with the weight `w` read in place
    /// (`gemm::multiply_weight_rows`), split by columns across `threads` threads; the epilogue
    /// runs over all rows after it.
    WeightRows { shape: [usize; 3], threads: usize },
    /// One 2-D product of at most `gemm::FEW_ROWS` rows, `rows × k` by `k × cols` (`shape`),
    /// with `b` (strides `b_strides`) read in place (`gemm::multiply_few_rows`), its columns
    /// split across up to `threads` threads; the epilogue runs over all rows after it.
    FewRows {
        shape: [usize; 3],
        b_strides: [i64; 2],
        threads: usize,
    },
    /// A batch of products, the first batch dim's units in runs, one run per piece, each
    /// matrix on the piece's thread; `unit_work` multiply-adds per unit. With `few_rows`, each
    /// matrix reads its `b` in place (`gemm::multiply_few_rows`), else packs it.
    Units {
        runs: Vec<std::ops::Range<usize>>,
        unit_work: u64,
        few_rows: bool,
    },
}

impl MatmulPlan {
    /// The multiply-adds of every piece.
    pub(super) fn pieces(&self) -> Vec<u64> {
        match self {
            MatmulPlan::Product { k, split, .. } => split.work(*k),
            MatmulPlan::WeightRows { shape, threads } => gemm::weight_rows_pieces(*shape, *threads),
            MatmulPlan::FewRows {
                shape,
                b_strides,
                threads,
            } => gemm::few_rows_pieces(gemm::Kernel::detect(), *shape, *b_strides, *threads),
            MatmulPlan::Units {
                runs, unit_work, ..
            } => runs.iter().map(|r| r.len() as u64 * unit_work).collect(),
        }
    }
}

/// Whether the batch of products of `sizes` is one product of `count · rows` rows: they share
/// one `b` and their `a` matrices follow one another at the same row stride (a linear layer
/// over a batch of sequences). As one product, each block of `b` is packed once for all of
/// them, and the product's rows and columns cut into as many pieces as the threads need,
/// where the batch alone might have fewer units than threads.
fn is_stacked(sizes: &MatmulSizes, a_strides: &[i64], b_strides: &[i64]) -> bool {
    let (batch, rows) = (sizes.batch, sizes.rows);
    let row_stride = a_strides[batch];
    batch > 0
        && (0..batch).all(|d| {
            let below = sizes.a_shape[d + 1..batch].iter().product::<usize>() * rows;
            (b_strides[d] == 0 || sizes.b_shape[d] == 1)
                && (sizes.a_shape[d] == 1 || a_strides[d] == row_stride * below as i64)
        })
}

/// The plan of a GEMM of `sizes` on `threads` threads (see [`MatmulPlan`]): max-autotune's
/// choice (`tuned`) when it was timed on this thread count, else the default. `a_strides` and
/// `b_strides` are the operands' strides for this call; with `prepacked_b`, `b` was packed
/// beforehand (it is read packed, never in place).
fn plan_matmul(
    sizes: &MatmulSizes,
    a_strides: &[i64],
    b_strides: &[i64],
    prepacked_b: bool,
    kernel: gemm::Kernel,
    threads: usize,
    tuned: Split,
) -> MatmulPlan {
    let stacked = is_stacked(sizes, a_strides, b_strides);
    let available = threads;
    let tuned = match tuned {
        Split::Gemm(g) if g.threads == threads => Some(g),
        _ => None,
    };
    let threads = match tuned {
        Some(_) => threads,
        None => gemm::product_threads(sizes.flops(), threads),
    };
    // The rows of the one 2-D product this step is (all of a stacked batch's).
    let product_rows = if stacked {
        sizes.count * sizes.rows
    } else {
        sizes.rows
    };
    let streams = tuned.map_or_else(
        || gemm::prefers_streaming(kernel, product_rows, sizes.cols, sizes.k, threads),
        |g| g.streams,
    );
    if stacked || sizes.batch == 0 {
        // The strides of the 2-D product: its operands' last two dims.
        let (batch, in_place_shape) = (sizes.batch, [product_rows, sizes.k, sizes.cols]);
        let b_2d = [b_strides[batch], b_strides[batch + 1]];
        // A few rows read `b` in place, in the order it is stored (its bytes, not its
        // multiply-adds, set the threads it takes), even where it was packed beforehand: read
        // once, its packed panels would cost as much, and a packed product of few rows gives
        // its only tile all of the next block's prefetches.
        if gemm::prefers_few_rows(kernel, in_place_shape, b_2d) {
            return MatmulPlan::FewRows {
                shape: in_place_shape,
                b_strides: b_2d,
                threads: available,
            };
        }
        if tuned.is_none()
            && !prepacked_b
            && gemm::prefers_weight_rows(kernel, in_place_shape, a_strides[batch + 1], b_2d)
        {
            return MatmulPlan::WeightRows {
                shape: in_place_shape,
                threads,
            };
        }
        let shape = [product_rows, sizes.cols, sizes.k];
        let tiles = [kernel.mr(), kernel.nr()];
        let split = match tuned {
            _ if streams => {
                gemm::streaming_split(kernel, product_rows, sizes.cols, sizes.k, threads)
            }
            Some(g) => gemm::ProductSplit::with_groups(
                [product_rows, sizes.cols],
                tiles,
                g.row_groups,
                g.panel_groups,
            ),
            None => gemm::ProductSplit::choose(shape, tiles, threads, gemm::Shared::B),
        };
        // Where the packed path's cut leaves the slowest thread at least 5% more than a cut
        // with both operands shared would (on many threads, rows whose micro-panels do not
        // divide among them: the LLaMA block's 171 on 64 threads), both are shared instead.
        // On the suite at 1, 2 and 16 threads the packed path's cut is within 3.1% of even and
        // stays.
        // No cut beats an even share, so a packed cut within 5% of one is kept without
        // searching the shared cuts (the same answer, and one search a call, not two).
        let slowest = |s: &gemm::ProductSplit| s.slowest_thread(sizes.k, threads);
        let even = (product_rows as u64 * sizes.cols as u64 * sizes.k as u64)
            .div_ceil(threads.max(1) as u64);
        let (split, shares) = match tuned {
            None if !streams && slowest(&split).saturating_mul(19) > even.saturating_mul(20) => {
                let shared =
                    gemm::ProductSplit::choose(shape, tiles, threads, gemm::Shared::Neither);
                if slowest(&shared).saturating_mul(20) < slowest(&split).saturating_mul(19) {
                    (shared, true)
                } else {
                    (split, false)
                }
            }
            _ => (split, false),
        };
        return MatmulPlan::Product {
            rows: product_rows,
            k: sizes.k,
            streams,
            shares,
            // A stacked batch's rows belong to several matrices: its epilogue runs after.
            tiles: !streams && !shares && !stacked && split.panel_groups == 1,
            split,
            threads,
        };
    }
    let units = sizes.a_shape[0];
    let unit_work = (sizes.count / units.max(1)) as u64
        * sizes.rows as u64
        * sizes.cols as u64
        * sizes.k as u64;
    // Matrices of few rows read their `b` in place: its bytes set the threads.
    let b_2d = [b_strides[sizes.batch], b_strides[sizes.batch + 1]];
    let few_rows = gemm::prefers_few_rows(kernel, [sizes.rows, sizes.k, sizes.cols], b_2d);
    let threads = match tuned {
        None if few_rows => {
            let b_bytes = sizes.count * sizes.k * sizes.cols * std::mem::size_of::<f32>();
            gemm::few_rows_threads(b_bytes, available)
        }
        _ => threads,
    };
    MatmulPlan::Units {
        runs: gemm::unit_runs(units, threads),
        unit_work,
        few_rows,
    }
}

/// The plan of GEMM step `m` for a call with these sizes on `threads` threads, and the
/// multiply-adds of its pieces (the partition report).
pub(super) fn matmul_pieces(
    m: &MatmulStep,
    prepacked_winograd: bool,
    prepacked_b: bool,
    tuned: Split,
    program: &Program,
    symbols: &Symbols,
    threads: usize,
) -> Result<Vec<u64>, RuntimeError> {
    let b = match &m.b {
        MatmulOperand::View(view) => view,
        MatmulOperand::Im2col(view) => {
            return Ok(
                implicit_plan(m, view, program, symbols, prepacked_winograd, threads)?.pieces(),
            )
        }
    };
    let sizes = MatmulSizes::new(m, b, symbols);
    let (_, a_strides) = symbols.view(&m.a, m.out)?;
    let (_, b_strides) = symbols.view(b, m.out)?;
    let kernel = gemm::Kernel::detect();
    let plan = plan_matmul(
        &sizes,
        &a_strides,
        &b_strides,
        prepacked_b,
        kernel,
        threads,
        tuned,
    );
    Ok(plan.pieces())
}

/// Runs `out = a @ b` with our GEMM (`crate::gemm`) as [`plan_matmul`] decides: one 2-D
/// product cut into rows and columns of tiles, whose pieces run the epilogue on their rows
/// tile by tile when they hold whole rows (else it runs after the product); or a batch of
/// products, each on one thread. `b` is packed once per product (block by block as the first
/// piece to need each block gets to it, shared by every piece), or streamed (each block packed
/// into a per-thread buffer right before its use), or was packed at compile time.
pub(super) fn run_matmul(
    m: &MatmulStep,
    epilogue: Option<&CompiledKernel>,
    prepacked: Option<&Prepacked>,
    tuned: Split,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let b_view_of_step = match &m.b {
        MatmulOperand::View(view) => view,
        MatmulOperand::Im2col(view) => {
            return run_implicit_matmul(m, view, epilogue, prepacked, program, symbols, pointers)
        }
    };
    let sizes = MatmulSizes::new(m, b_view_of_step, symbols);
    let (a_shape, batch) = (&sizes.a_shape, sizes.batch);
    let (rows, k, cols, count) = (sizes.rows, sizes.k, sizes.cols, sizes.count);
    let (a_offset, a_strides) = symbols.view(&m.a, m.out)?;
    let (b_offset, b_strides) = symbols.view(b_view_of_step, m.out)?;
    debug_assert!(program.buffer(m.out).dtype == DType::F32);
    let numel = |id: BufferId| symbols.elements(program, id);
    // SAFETY: each pointer is the start of a live buffer holding its planned number of f32s for
    // this call's sizes (`run_steps`; `fuse` only emits f32 GEMMs). The operands are only read
    // during this step. The output is written only through the tiles below, each made from
    // `c` for rows no other thread touches, and overlaps neither operand: `plan_buffers` never
    // places a GEMM's output in place of a buffer the GEMM reads, and live slots are disjoint.
    let (a_data, b_data) = unsafe {
        (
            read_f32(pointers, m.a.buffer, numel(m.a.buffer)),
            read_f32(
                pointers,
                b_view_of_step.buffer,
                numel(b_view_of_step.buffer),
            ),
        )
    };
    let c = SendPtr(pointers[m.out.0 as usize]);
    assert!(
        numel(m.out) == count * rows * cols,
        "a GEMM's output holds its product"
    );
    let a_view = |offset: i64| {
        gemm::MatrixRef::new(
            a_data,
            offset,
            [rows, k],
            [a_strides[batch], a_strides[batch + 1]],
            "a",
        )
    };
    let b_view = |offset: i64| {
        gemm::MatrixRef::new(
            b_data,
            offset,
            [k, cols],
            [b_strides[batch], b_strides[batch + 1]],
            "b",
        )
    };
    // Output rows `start..end` of batch matrix `index`, as the unique borrow of those values.
    let c_rows = |index: usize, start: usize, end: usize| {
        let first = index * rows * cols + start * cols;
        // SAFETY: `first + (end - start)·cols ≤ count·rows·cols`, the output's length (asserted
        // above); callers ask for disjoint rows on different threads and drop each tile before
        // its epilogue runs.
        let values = unsafe {
            std::slice::from_raw_parts_mut((c.get() as *mut f32).add(first), (end - start) * cols)
        };
        gemm::MatrixMut::row_major(values, end - start, cols)
    };
    let gemm_error = |e| gemm_error(m.out, e);

    let units = a_shape[0];
    let unit_bytes = count * rows * cols * std::mem::size_of::<f32>() / units.max(1);
    // At least 128 rows of a 2-D product: every tile streams all of packed `b` once, which costs
    // more than keeping the tile's output in L2 for the epilogue saves (measured on the MLP).
    let min_tile = if batch == 0 { 128 } else { 1 };
    let tile = (TILE_BYTES / unit_bytes.max(1))
        .max(min_tile)
        .min(units.max(1));
    let mut table = Vec::new();
    if let Some(e) = epilogue {
        table.extend(e.buffers.iter().map(|id| pointers[id.0 as usize]));
    }
    let epilogue = epilogue.map(|e| (e, e.bind(symbols)));
    let shared = SharedPointers(table.as_ptr());
    let threads = threads::num_threads();
    let kernel = gemm::Kernel::detect();
    // The epilogue over every row at once, split across the threads (after a product whose
    // pieces split columns).
    let epilogue_on_all_rows = || {
        if let Some((epilogue, bound)) = &epilogue {
            let pieces = kernel_pieces(epilogue.split, bound, threads);
            run_pieces(epilogue, bound, shared, &pieces);
        }
    };

    let row_stride = a_strides[batch];
    // `b` packed at compile time, if this call's `b` is the constant it was packed from: the
    // products read it instead of packing it (streamed ones block by block, in the same order).
    let prepacked =
        match prepacked.and_then(|p| p.for_pointer(pointers[b_view_of_step.buffer.0 as usize])) {
            Some(Packed::B(packed)) if packed.shape() == [k, cols] => Some(packed),
            _ => None,
        };
    let plan = plan_matmul(
        &sizes,
        &a_strides,
        &b_strides,
        prepacked.is_some(),
        kernel,
        threads,
        tuned,
    );
    let (product_rows, streams, shares, tiles, split, gemm_threads) = match &plan {
        MatmulPlan::Product {
            rows,
            streams,
            shares,
            tiles,
            split,
            threads,
            ..
        } => (*rows, *streams, *shares, *tiles, *split, *threads),
        // `b` read in place: a weight's rows (`a · wᵀ` of many rows) or few rows of `a`.
        MatmulPlan::WeightRows { shape, threads } | MatmulPlan::FewRows { shape, threads, .. } => {
            let [rows, k, _] = *shape;
            let a = gemm::MatrixRef::new(
                a_data,
                a_offset,
                [rows, k],
                [row_stride, a_strides[batch + 1]],
                "a",
            )
            .map_err(gemm_error)?;
            let b = b_view(b_offset).map_err(gemm_error)?;
            {
                // The output's unique borrow ends here, before the epilogue reads its rows.
                let mut out = c_rows(0, 0, rows).map_err(gemm_error)?;
                match plan {
                    MatmulPlan::WeightRows { .. } => {
                        gemm::multiply_weight_rows(kernel, &a, &b, &mut out, *threads)
                    }
                    _ => gemm::multiply_few_rows(kernel, &a, &b, &mut out, *threads),
                }
                .map_err(gemm_error)?;
            }
            epilogue_on_all_rows();
            return Ok(());
        }
        MatmulPlan::Units { runs, few_rows, .. } => {
            // A batch of products: each unit of the first batch dim holds `inner` matrices;
            // each is packed and multiplied on its piece's thread (`b` is packed once and
            // reused while consecutive matrices share it, as a broadcast operand does), the
            // epilogue after each tile of units.
            let inner: usize = a_shape[1..batch].iter().product();
            // Matrices of few rows read theirs in place, one thread each (`gemm::few_rows`).
            let few_rows = *few_rows;
            let run_units = |start: usize, end: usize| -> Result<(), RuntimeError> {
                let mut packed: Option<(i64, gemm::PackedB)> = None;
                let mut s = start;
                while s < end {
                    let e = (s + tile).min(end);
                    for n in s * inner..e * inner {
                        // Decompose the flat batch index into per-dim offsets.
                        let (mut rest, mut a_off, mut b_off) = (n, a_offset, b_offset);
                        for d in (0..batch).rev() {
                            let i = (rest % a_shape[d]) as i64;
                            rest /= a_shape[d];
                            a_off += i * a_strides[d];
                            b_off += i * b_strides[d];
                        }
                        if few_rows {
                            let (a, b) = (a_view(a_off), b_view(b_off));
                            let mut out = c_rows(n, 0, rows).map_err(gemm_error)?;
                            gemm::multiply_few_rows(
                                kernel,
                                &a.map_err(gemm_error)?,
                                &b.map_err(gemm_error)?,
                                &mut out,
                                1,
                            )
                            .map_err(gemm_error)?;
                            continue;
                        }
                        if packed.as_ref().is_none_or(|(at, _)| *at != b_off) {
                            // Return the old buffer to the pool before taking one.
                            drop(packed.take());
                            let b = b_view(b_off).map_err(gemm_error)?;
                            packed =
                                Some((b_off, gemm::PackedB::lazy(&b, kernel).map_err(gemm_error)?));
                        }
                        let (_, b) = packed.as_ref().expect("packed above");
                        let mut out = c_rows(n, 0, rows).map_err(gemm_error)?;
                        gemm::multiply(&a_view(a_off).map_err(gemm_error)?, b, &mut out)
                            .map_err(gemm_error)?;
                    }
                    if let Some((epilogue, bound)) = &epilogue {
                        call_kernel_rows(epilogue, bound, shared, s as i64, e as i64);
                    }
                    s = e;
                }
                Ok(())
            };
            return in_runs(runs, run_units);
        }
    };
    // One 2-D product (a stacked batch: `count · rows` rows of `a` at one row stride).
    let a = gemm::MatrixRef::new(
        a_data,
        a_offset,
        [product_rows, k],
        [row_stride, a_strides[batch + 1]],
        "a",
    )
    .map_err(gemm_error)?;
    let b = b_view(b_offset).map_err(gemm_error)?;
    if streams {
        {
            // The output's unique borrow ends here, before the epilogue reads its rows.
            let mut out = c_rows(0, 0, product_rows).map_err(gemm_error)?;
            match prepacked {
                Some(packed) => gemm::multiply_streaming_packed(&a, packed, &mut out, gemm_threads),
                None => gemm::multiply_streaming(kernel, &a, &b, &mut out, gemm_threads),
            }
            .map_err(gemm_error)?;
        }
        epilogue_on_all_rows();
        return Ok(());
    }
    // Packed at compile time, or as the pieces need it, once, by whichever thread gets to each
    // block first.
    let packed_here = match prepacked {
        Some(_) => None,
        None => Some(gemm::PackedB::lazy(&b, kernel).map_err(gemm_error)?),
    };
    let packed = prepacked
        .or(packed_here.as_ref())
        .expect("packed at compile time or here");
    if shares {
        {
            // The output's unique borrow ends here, before the epilogue reads its rows.
            let mut out = c_rows(0, 0, product_rows).map_err(gemm_error)?;
            gemm::multiply_shared(&a, packed, &mut out, &split, gemm_threads)
                .map_err(gemm_error)?;
        }
        epilogue_on_all_rows();
        return Ok(());
    }
    if !tiles {
        {
            // The output's unique borrow ends here, before the epilogue reads its rows.
            let mut out = c_rows(0, 0, product_rows).map_err(gemm_error)?;
            gemm::multiply_split(&a, packed, &mut out, &split).map_err(gemm_error)?;
        }
        epilogue_on_all_rows();
        return Ok(());
    }
    // Each piece holds whole rows: it runs them tile by tile, each tile's epilogue right after.
    let panels = cols.div_ceil(kernel.nr());
    let pieces = split.pieces();
    let run_rows = |piece: usize| {
        let range = split.rows(piece);
        let first_panel = panels * piece / pieces;
        let mut s = range.start;
        while s < range.end {
            let e = (s + tile).min(range.end);
            {
                // The tile's unique borrow ends before its epilogue reads the rows.
                let mut out = c_rows(0, s, e).expect("rows inside the output");
                gemm::multiply_from(&a.rows(s, e), packed, &mut out, first_panel)
                    .expect("shapes agree");
            }
            if let Some((epilogue, bound)) = &epilogue {
                call_kernel_rows(epilogue, bound, shared, s as i64, e as i64);
            }
            s = e;
        }
    };
    if pieces > 1 {
        threads::for_each_chunk(pieces, run_rows);
    } else {
        run_rows(0);
    }
    Ok(())
}

/// Runs `out = a @ im2col(x)` (a convolution, `b` an [`Im2colView`]) with the implicit GEMM
/// (`gemm::multiply_im2col`), or as Winograd F(2x2, 3x3) (`gemm::multiply_winograd`) where
/// `gemm::prefers_winograd` picks it: the output's first dim (images) is split across threads,
/// each image's channel groups run one after the other on its thread, and the epilogue follows
/// each tile of images. `a` (the weight) is packed (or transformed) once per group and call,
/// unless it was once for all calls (a frozen weight, `prepacked`).
fn run_implicit_matmul(
    m: &MatmulStep,
    b: &Im2colView,
    epilogue: Option<&CompiledKernel>,
    prepacked: Option<&Prepacked>,
    program: &Program,
    symbols: &Symbols,
    pointers: &[*mut u8],
) -> Result<(), RuntimeError> {
    let a_shape = symbols.sizes(&m.a.shape);
    let b_shape = symbols.sizes(&b.shape);
    let source_shape = symbols.sizes(&program.buffer(b.source).shape);
    let numel = |id: BufferId| symbols.elements(program, id);
    let gemm_error = |e| gemm_error(m.out, e);
    let (&[images, groups, k, cols], &[_, channels, h, w]) = (&b_shape[..], &source_shape[..])
    else {
        return Err(RuntimeError::Unsupported(format!(
            "matmul {}: an im2col operand {b_shape:?} of a source {source_shape:?}",
            m.out
        )));
    };
    let rows = a_shape[2];
    let group_channels = channels / groups.max(1);
    let (a_offset, a_strides) = symbols.view(&m.a, m.out)?;
    // SAFETY: each pointer is the start of a live buffer holding its planned number of f32s for
    // this call's sizes (`run_steps`; `fuse` only emits f32 GEMMs). The operands are only read
    // during this step; the output is written only through the per-matrix borrows below, each
    // on one thread, and overlaps neither operand (`plan_buffers` never places a GEMM's output
    // in place of a buffer it reads; live slots are disjoint).
    let (a_data, x_data) = unsafe {
        (
            read_f32(pointers, m.a.buffer, numel(m.a.buffer)),
            read_f32(pointers, b.source, numel(b.source)),
        )
    };
    let c = SendPtr(pointers[m.out.0 as usize]);
    let matrix = rows * cols;
    assert!(
        numel(m.out) == images * groups * matrix,
        "a GEMM's output holds its product"
    );
    let kernel = gemm::Kernel::detect();
    // The weight of each group, packed (or transformed) once, for all calls or here, and
    // shared by every image and thread.
    let prepacked = prepacked.and_then(|p| p.for_pointer(pointers[m.a.buffer.0 as usize]));
    let prepacked_winograd = matches!(prepacked, Some(Packed::WinogradWeight(_)));
    let plan = implicit_plan(
        m,
        b,
        program,
        symbols,
        prepacked_winograd,
        threads::num_threads(),
    )?;
    let winograd = plan.winograd;
    let group_weight = |g: usize| {
        let offset = a_offset + g as i64 * a_strides[1];
        gemm::MatrixRef::new(a_data, offset, [rows, k], [a_strides[2], a_strides[3]], "a")
    };
    let fits = |shape: [usize; 2]| shape == [rows, k];
    let packed_here;
    let weights = match prepacked {
        Some(Packed::ConvWeight(packed))
            if !winograd && packed.len() == groups && packed.iter().all(|p| fits(p.shape())) =>
        {
            ConvWeights::Im2col(packed)
        }
        Some(Packed::WinogradWeight(packed))
            if winograd && packed.len() == groups && packed.iter().all(|p| fits(p.shape())) =>
        {
            ConvWeights::Winograd(packed)
        }
        _ if winograd => {
            packed_here = PackedHere::Winograd(
                (0..groups)
                    .map(|g| gemm::WinogradWeight::transform(&group_weight(g)?, kernel))
                    .collect::<Result<_, _>>()
                    .map_err(gemm_error)?,
            );
            packed_here.weights()
        }
        _ => {
            packed_here = PackedHere::Im2col(
                (0..groups)
                    .map(|g| gemm::PackedA::pack(&group_weight(g)?, kernel))
                    .collect::<Result<_, _>>()
                    .map_err(gemm_error)?,
            );
            packed_here.weights()
        }
    };
    let mut table = Vec::new();
    if let Some(e) = epilogue {
        table.extend(e.buffers.iter().map(|id| pointers[id.0 as usize]));
    }
    let epilogue = epilogue.map(|e| (e, e.bind(symbols)));
    let shared = SharedPointers(table.as_ptr());
    let unit_bytes = groups * matrix * std::mem::size_of::<f32>();
    let tile = (TILE_BYTES / unit_bytes.max(1)).clamp(1, images.max(1));
    // The input of `image`'s group `g`, and the output matrix it makes.
    let group_input = |image: usize, g: usize| {
        let plane_offset = (image * channels + g * group_channels) * h * w;
        gemm::Im2colRef::new(x_data, plane_offset, group_channels, [h, w], b.window)
            .map_err(gemm_error)
    };
    if plan.pieces.iter().all(|(_, units)| units.is_none()) {
        // Whole images: each piece runs its images tile by tile, each tile's epilogue right
        // after.
        let run_images = |start: usize, end: usize| -> Result<(), RuntimeError> {
            let mut s = start;
            while s < end {
                let e = (s + tile).min(end);
                for image in s..e {
                    for g in 0..groups {
                        let x = group_input(image, g)?;
                        let first = (image * groups + g) * matrix;
                        // SAFETY: `first + matrix ≤ images·groups·matrix`, the output's length
                        // (asserted above); each (image, group) matrix is borrowed by one
                        // thread only, and the borrow ends before the epilogue reads the rows.
                        let values = unsafe {
                            std::slice::from_raw_parts_mut((c.get() as *mut f32).add(first), matrix)
                        };
                        let mut out =
                            gemm::MatrixMut::row_major(values, rows, cols).map_err(gemm_error)?;
                        match weights {
                            ConvWeights::Im2col(a) => gemm::multiply_im2col(&a[g], &x, &mut out),
                            ConvWeights::Winograd(a) => {
                                gemm::multiply_winograd(&a[g], &x, &mut out)
                            }
                        }
                        .map_err(gemm_error)?;
                    }
                }
                if let Some((epilogue, bound)) = &epilogue {
                    call_kernel_rows(epilogue, bound, shared, s as i64, e as i64);
                }
                s = e;
            }
            Ok(())
        };
        let runs: Vec<_> = plan.pieces.iter().map(|(r, _)| r.clone()).collect();
        return in_runs(&runs, run_images);
    }
    // Parts of images: each piece computes its columns (or Winograd tiles) of one image's
    // every group; the epilogue runs over all images after.
    let run_part = |piece: usize| -> Result<(), RuntimeError> {
        let (images, units) = &plan.pieces[piece];
        let units = units.clone().expect("parts of images");
        for image in images.clone() {
            for g in 0..groups {
                let x = group_input(image, g)?;
                // SAFETY (for both calls): the matrix of (image, group) starts at `first`, and
                // `first + matrix ≤ images·groups·matrix`, the output's length (asserted
                // above); the checks passed; the pieces' columns (tiles) of a matrix are
                // disjoint, so each output element is written by one piece; nothing reads the
                // output before every piece is done.
                let first = (image * groups + g) * matrix;
                let c_matrix = (c.get() as *mut f32).wrapping_add(first);
                match weights {
                    ConvWeights::Im2col(a) => {
                        gemm::check_im2col(&a[g], &x, [rows, cols]).map_err(gemm_error)?;
                        let columns =
                            (units.start * CONV_UNIT).min(cols)..(units.end * CONV_UNIT).min(cols);
                        // SAFETY: as stated above, for this piece's columns.
                        unsafe { gemm::multiply_im2col_columns(&a[g], &x, c_matrix, cols, columns) }
                            .map_err(gemm_error)?
                    }
                    ConvWeights::Winograd(a) => {
                        let count =
                            gemm::check_winograd(&a[g], &x, [rows, cols]).map_err(gemm_error)?;
                        let tiles = (units.start * CONV_UNIT).min(count)
                            ..(units.end * CONV_UNIT).min(count);
                        // SAFETY: as stated above, for this piece's tiles.
                        unsafe { gemm::multiply_winograd_tiles(&a[g], &x, c_matrix, cols, tiles) }
                            .map_err(gemm_error)?
                    }
                }
            }
        }
        Ok(())
    };
    let failure: Mutex<Option<RuntimeError>> = Mutex::new(None);
    threads::for_each_chunk(plan.pieces.len(), |piece| {
        if let Err(e) = run_part(piece) {
            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    if let Some((epilogue, bound)) = &epilogue {
        let pieces = kernel_pieces(epilogue.split, bound, threads::num_threads());
        run_pieces(epilogue, bound, shared, &pieces);
    }
    Ok(())
}

/// Output columns (implicit GEMM) or 2×2 tiles (Winograd) of one image per unit of a
/// convolution's split: a multiple of 16, so every piece's panels start where the whole
/// image's would (the AVX-512 transforms take 16 tiles at a time).
const CONV_UNIT: usize = 16;

/// How a convolution step runs on some number of threads: its path (Winograd or the implicit
/// GEMM) and its pieces, the one place both are decided, for running it and for the partition
/// report. A piece is a run of whole images (each image's channel groups on the piece's
/// thread), or, when there are too few images for the threads, a part of one image: a run of
/// its units of [`CONV_UNIT`] output columns (Winograd: tiles), cut by `gemm::image_parts`.
pub(super) struct ImplicitPlan {
    winograd: bool,
    pieces: Vec<(std::ops::Range<usize>, Option<std::ops::Range<usize>>)>,
    /// Units of one image, and its multiply-adds (those of the direct product).
    units: usize,
    image_work: u64,
}

impl ImplicitPlan {
    /// The multiply-adds of every piece (a part of an image: its share of the units).
    fn pieces(&self) -> Vec<u64> {
        self.pieces
            .iter()
            .map(|(images, units)| match units {
                None => images.len() as u64 * self.image_work,
                Some(units) => {
                    (self.image_work as u128 * units.len() as u128 / self.units.max(1) as u128)
                        as u64
                }
            })
            .collect()
    }
}

/// The plan of convolution step `m` (`b` its im2col operand) for a call with these sizes on
/// `threads` threads; `prepacked_winograd`: the weight was transformed for Winograd once for
/// all calls.
fn implicit_plan(
    m: &MatmulStep,
    b: &Im2colView,
    program: &Program,
    symbols: &Symbols,
    prepacked_winograd: bool,
    threads: usize,
) -> Result<ImplicitPlan, RuntimeError> {
    let rows = symbols.sizes(&m.a.shape).get(2).copied().unwrap_or(0);
    let source = symbols.sizes(&program.buffer(b.source).shape);
    let (&[images, groups, k, cols], &[_, channels, h, w]) =
        (&symbols.sizes(&b.shape)[..], &source[..])
    else {
        return Err(RuntimeError::Unsupported(format!(
            "matmul {}: an im2col operand of rank {} of a source of rank {}",
            m.out,
            b.shape.len(),
            source.len()
        )));
    };
    let group_channels = channels / groups.max(1);
    let flops = [images, groups, rows, k, cols]
        .iter()
        .fold(2usize, |acc, &n| acc.saturating_mul(n));
    let threads = gemm::product_threads(flops, threads);
    // Winograd F(2x2, 3x3) where the window allows it and it is expected to be faster,
    // transforming the weight here included (under `auto`; unless it was transformed for all
    // calls) over all the images of the call. Not over the images of a thread: the two paths
    // sum in different orders, and the choice must not depend on the thread count.
    let algorithm = gemm::ConvAlgorithm::from_env();
    let kernel = gemm::Kernel::detect();
    let winograd = gemm::prefers_winograd(algorithm, kernel, &b.window, group_channels, [h, w])
        && (algorithm != gemm::ConvAlgorithm::Auto
            || prepacked_winograd
            || b.window.output_size(h, w).is_some_and(|out| {
                gemm::winograd_transform_pays_off(images, group_channels, rows, out)
            }));
    let units = if winograd {
        let [oh, ow] = b.window.output_size(h, w).unwrap_or([0, 0]);
        (oh.div_ceil(2) * ow.div_ceil(2)).div_ceil(CONV_UNIT)
    } else {
        cols.div_ceil(CONV_UNIT)
    };
    let parts = gemm::image_parts(images, units, threads);
    let pieces = if parts == 1 {
        gemm::unit_runs(images, threads)
            .into_iter()
            .map(|r| (r, None))
            .collect()
    } else {
        (0..images)
            .flat_map(|image| {
                (0..parts).map(move |p| {
                    (
                        image..image + 1,
                        Some(units * p / parts..units * (p + 1) / parts),
                    )
                })
            })
            .collect()
    };
    Ok(ImplicitPlan {
        winograd,
        pieces,
        units,
        image_work: [groups, rows, k, cols]
            .iter()
            .fold(1u64, |acc, &n| acc.saturating_mul(n as u64)),
    })
}

/// A convolution's weights, one per channel group, as the path that runs it reads them.
#[derive(Clone, Copy)]
enum ConvWeights<'a> {
    Im2col(&'a [gemm::PackedA]),
    Winograd(&'a [gemm::WinogradWeight]),
}

/// A convolution's weights packed for one call (when they were not packed for all calls).
enum PackedHere {
    Im2col(Vec<gemm::PackedA>),
    Winograd(Vec<gemm::WinogradWeight>),
}

impl PackedHere {
    fn weights(&self) -> ConvWeights<'_> {
        match self {
            PackedHere::Im2col(packed) => ConvWeights::Im2col(packed),
            PackedHere::Winograd(packed) => ConvWeights::Winograd(packed),
        }
    }
}

/// Runs `run` over each of `runs` (one piece each), across the threads when there are several.
/// An error of any run is the step's (the last one recorded, if several fail).
fn in_runs(
    runs: &[std::ops::Range<usize>],
    run: impl Fn(usize, usize) -> Result<(), RuntimeError> + Sync,
) -> Result<(), RuntimeError> {
    match runs {
        [] => return Ok(()),
        [only] => return run(only.start, only.end),
        _ => {}
    }
    let failure: Mutex<Option<RuntimeError>> = Mutex::new(None);
    threads::for_each_chunk(runs.len(), |piece| {
        if let Err(e) = run(runs[piece].start, runs[piece].end) {
            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    });
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The output pointer handed to the GEMM threads.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: the buffers outlive the step; threads write disjoint rows of the output (see
// `run_matmul`) and only read the operands.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// A method, so closures capture the whole `Send + Sync` wrapper rather than its field.
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// The kernel library's name for the kernel IR's mask kind.
fn mask_kind(kind: MaskKind) -> minductor_kernels::attention::MaskKind {
    use minductor_kernels::attention::MaskKind as Library;
    match kind {
        MaskKind::Add => Library::Add,
        MaskKind::Keep => Library::Keep,
        MaskKind::Drop => Library::Drop,
    }
}
