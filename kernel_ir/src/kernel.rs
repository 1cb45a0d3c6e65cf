//! The kernel (loop-level) IR that `fuse` produces and `codegen_cpu` lowers: Inductor's loop
//! body, in small.
//!
//! A [`Program`] is a list of [`Step`]s over numbered [`Buffer`]s: loop kernels, extern GEMMs
//! and scatter-adds, and fallback steps (one graph node the reference interpreter runs on its
//! buffers, [`FallbackStep`]). A [`Kernel`] is a loop nest:
//! `outer` loops (the kernel's iteration domain, the first of which the runtime may split across
//! threads), and inside them a sequence of [`Stage`]s, each a loop nest of its own (`extent`)
//! whose innermost loop is the one vectorised (in the default [`LoopOrder`]; in the
//! outer-reduction order the last outer loop is, and the stages run inside it). A stage either
//! reduces a scalar expression to one value per outer iteration (readable by later stages as
//! [`Expr::StageResult`]) or stores expressions to buffers. Expressions form a DAG of scalar ops over `load(buffer, affine index)`.
//!
//! Loop extents are [`Dim`]s that reach the compiled code as runtime arguments (`params`);
//! index coefficients (strides) and offsets are [`SizeExpr`]s: numbers, or polynomials in the
//! symbolic sizes, whose symbols also reach the compiled code as arguments (after the extents)
//! and which it computes once per call, before any loop.

use minductor_ir::{
    BinaryOp, CompareOp, DType, Dim, NodeId, Op, ReduceOp, SizeExpr, SymId, UnaryOp, Window2d,
};
use smallvec::SmallVec;
use std::fmt::{self, Write};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExprId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferKind {
    /// Graph input `n`, handed in by the caller.
    Input(usize),
    /// Allocated fresh for each call and handed to the caller (possibly as several outputs).
    Output,
    /// Lives only during a call; the runtime keeps it between calls.
    Intermediate,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub dtype: DType,
    /// Logical shape; buffers are contiguous row-major.
    pub shape: Vec<Dim>,
    pub kind: BufferKind,
    /// The graph node whose value this buffer holds.
    pub node: NodeId,
}

impl Buffer {
    /// Elements, if every dim is static (and the count fits: `None` on overflow).
    pub fn numel(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |acc, d| acc.checked_mul(d.as_static()?))
    }
}

/// A loop variable of a kernel: an outer loop, or an inner loop of the stage being evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Var {
    Outer(u32),
    Inner(u32),
}

/// `offset + Σ coefficient · var`, in elements. Coefficients and the offset are size
/// expressions: numbers, or polynomials in the symbolic sizes (`64*s0·o1`, the stride of a dim
/// in front of a symbolic one), which the compiled code computes once per call from its size
/// arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Affine {
    pub offset: SizeExpr,
    /// Sorted by var, no two with the same var, no zero coefficient.
    pub terms: SmallVec<[(Var, SizeExpr); 4]>,
}

impl Affine {
    pub fn constant(offset: i64) -> Self {
        Affine {
            offset: SizeExpr::Const(offset),
            terms: SmallVec::new(),
        }
    }

    pub fn var(v: Var) -> Self {
        Affine {
            offset: SizeExpr::Const(0),
            terms: smallvec::smallvec![(v, SizeExpr::Const(1))],
        }
    }

    /// `self * k`.
    pub fn scale(&self, k: i64) -> Affine {
        self.scale_by(&SizeExpr::Const(k))
    }

    /// `self * k` for a size expression `k`.
    pub fn scale_by(&self, k: &SizeExpr) -> Affine {
        if k.is_zero() {
            return Affine::constant(0);
        }
        Affine {
            offset: self.offset.times(k),
            terms: self
                .terms
                .iter()
                .map(|(v, c)| (*v, c.times(k)))
                .filter(|t| !t.1.is_zero())
                .collect(),
        }
    }

    /// `self + other`, with like terms combined and zero terms dropped (kept sorted by var).
    pub fn plus(&self, other: &Affine) -> Affine {
        let mut terms = self.terms.clone();
        for (v, c) in &other.terms {
            match terms.iter_mut().find(|(w, _)| w == v) {
                Some(t) => t.1 = t.1.plus(c),
                None => terms.push((*v, c.clone())),
            }
        }
        terms.retain(|t| !t.1.is_zero());
        terms.sort_by_key(|t| t.0);
        Affine {
            offset: self.offset.plus(&other.offset),
            terms,
        }
    }

    /// Coefficient of `v` (0 if absent).
    pub fn coefficient(&self, v: Var) -> SizeExpr {
        self.terms
            .iter()
            .find(|t| t.0 == v)
            .map_or(SizeExpr::Const(0), |t| t.1.clone())
    }

    /// Whether `v` moves the index (its coefficient is not 0).
    pub fn uses(&self, v: Var) -> bool {
        self.terms.iter().any(|t| t.0 == v)
    }

    /// If this is exactly one variable with coefficient 1 and no offset, that variable.
    pub fn as_var(&self) -> Option<Var> {
        match self.terms.as_slice() {
            [(v, c)] if c.is(1) && self.offset.is_zero() => Some(*v),
            _ => None,
        }
    }

    /// Every size expression of the index (the offset, then the coefficients).
    pub fn size_exprs(&self) -> impl Iterator<Item = &SizeExpr> {
        std::iter::once(&self.offset).chain(self.terms.iter().map(|t| &t.1))
    }
}

/// Types values take inside a kernel. Floating buffers of any width compute in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarType {
    F32,
    I64,
    Bool,
}

impl ScalarType {
    /// The type a buffer of `dtype` computes in. (`fuse` refuses f64 graphs before asking.)
    pub fn of(dtype: DType) -> ScalarType {
        match dtype {
            DType::F64 | DType::F32 | DType::F16 | DType::BF16 => ScalarType::F32,
            DType::I64 => ScalarType::I64,
            DType::Bool => ScalarType::Bool,
        }
    }
}

/// A data-dependent part of a load index: `clamp(value, 0, bound - 1) * stride` (embedding).
/// The bound is the table's rows: a number, or a size expression of the call's symbols (a
/// table whose length follows the input, as a mask's or a position table's).
#[derive(Clone, Debug, PartialEq)]
pub struct Indirect {
    pub value: ExprId,
    pub stride: i64,
    pub bound: SizeExpr,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Load {
        buffer: BufferId,
        index: Affine,
        indirect: Option<Indirect>,
    },
    Constant {
        value: f64,
        ty: ScalarType,
    },
    /// The value reduction stage `n` produced for the current outer iteration.
    StageResult(u32),
    /// The value of an affine function of the loop variables (`arange`), as the expression's
    /// type (f32 or i64).
    Index(Affine),
    Unary(UnaryOp, ExprId),
    Binary(BinaryOp, ExprId, ExprId),
    Compare(CompareOp, ExprId, ExprId),
    Where(ExprId, ExprId, ExprId),
    /// Conversion to `dtype`'s value set (f16/bf16 round, i64 truncates, bool tests != 0).
    Cast(DType, ExprId),
}

impl Expr {
    /// The expressions this one reads: operands, and a load's data-dependent index (not a
    /// `StageResult`, which is a value an earlier stage computed).
    pub fn operands(&self) -> SmallVec<[ExprId; 3]> {
        match self {
            Expr::Load { indirect, .. } => indirect.iter().map(|i| i.value).collect(),
            Expr::Unary(_, a) | Expr::Cast(_, a) => SmallVec::from_slice(&[*a]),
            Expr::Binary(_, a, b) | Expr::Compare(_, a, b) => SmallVec::from_slice(&[*a, *b]),
            Expr::Where(c, a, b) => SmallVec::from_slice(&[*c, *a, *b]),
            Expr::Constant { .. } | Expr::StageResult(_) | Expr::Index(_) => SmallVec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Store {
    pub buffer: BufferId,
    pub index: Affine,
    pub value: ExprId,
}

#[derive(Clone, Debug, PartialEq)]
pub enum StageAction {
    /// Reduces `value` over the stage's loops; `stores` are values the same loop also stores
    /// element by element (a costly value a later stage reuses: see `store_once`).
    Reduce {
        op: ReduceOp,
        value: ExprId,
        stores: Vec<Store>,
    },
    Store(Vec<Store>),
    /// Stores, at each iteration of the stage's loops (in order, one at a time), the running
    /// sum of `value` since the stage began: a scan (`cumsum`) along the stage's loops.
    Scan(Store),
}

impl StageAction {
    /// The stage's stores (a reduction's extra stores, a store stage's, or the one store of a
    /// scan, which writes the running sum of its value rather than the value).
    pub fn stores(&self) -> &[Store] {
        match self {
            StageAction::Reduce { stores, .. } | StageAction::Store(stores) => stores,
            StageAction::Scan(store) => std::slice::from_ref(store),
        }
    }

    /// [`StageAction::stores`], to change in place (a renumbering, a renaming of loops).
    pub fn stores_mut(&mut self) -> &mut [Store] {
        match self {
            StageAction::Reduce { stores, .. } | StageAction::Store(stores) => stores,
            StageAction::Scan(store) => std::slice::from_mut(store),
        }
    }

    /// The values the stage computes: the reduced value first, then each stored one.
    pub fn roots(&self) -> Vec<ExprId> {
        let mut roots = match self {
            StageAction::Reduce { value, .. } => vec![*value],
            StageAction::Store(_) | StageAction::Scan(_) => Vec::new(),
        };
        roots.extend(self.stores().iter().map(|st| st.value));
        roots
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    /// Inner loop extents, outermost first (empty: evaluated once per outer iteration).
    pub extent: Vec<Dim>,
    pub action: StageAction,
}

/// The loop order a kernel's code runs its loops in (the iterations and their results are
/// the same; only the vectorised loop and the nesting differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum LoopOrder {
    /// Each stage's innermost loop is the vectorised one, inside the outer loops (rows).
    #[default]
    Inner,
    /// Inductor's outer-reduction order, for reductions over a non-innermost axis (column
    /// sums): the *last outer* loop is the vectorised one, in groups of columns, and every
    /// stage's loops run inside it, one row of the group at a time, each reduction keeping a
    /// vector of partial results per group (one per column). Requires at least one outer loop
    /// and no scan stage (`verify_program` checks). Printed `order=outer_reduction`.
    OuterReduction,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub outer: Vec<Dim>,
    /// Which loop is vectorised (see [`LoopOrder`]).
    pub order: LoopOrder,
    pub stages: Vec<Stage>,
    pub exprs: Vec<Expr>,
    /// Type of each expression, parallel to `exprs`.
    pub types: Vec<ScalarType>,
    /// Graph nodes this kernel computes (fused), for dumps.
    pub nodes: Vec<NodeId>,
}

/// Whether a transposed copy of `dtype` elements runs as the kernel library's transpose
/// routine, which copies bit patterns of 2, 4 or 8 bytes: f16, bf16, f32 and i64 (an elementwise
/// copy of these keeps every bit, but for a signalling NaN's quiet bit). f64 is not: compiled
/// kernels compute it in f32, so the routine's exact copy would differ from the loop's.
pub fn transposed_copy_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I64)
}

impl Kernel {
    pub fn expr(&self, id: ExprId) -> &Expr {
        &self.exprs[id.0 as usize]
    }

    pub fn ty(&self, id: ExprId) -> ScalarType {
        self.types[id.0 as usize]
    }

    /// Every size in the order the compiled function reads them from `params`: loop extents of
    /// outer loops, then each stage's loops.
    /// outer loops, then each stage's loops, then each symbol an index's coefficients or offset
    /// read ([`Kernel::index_symbols`]).
    pub fn params(&self) -> Vec<Dim> {
        let mut p = self.outer.clone();
        for s in &self.stages {
            p.extend_from_slice(&s.extent);
        }
        p.extend(self.index_symbols().into_iter().map(Dim::Sym));
        p
    }

    /// Every index of the kernel: loads, `index` values and stores.
    pub fn indices(&self) -> impl Iterator<Item = &Affine> {
        let exprs = self.exprs.iter().filter_map(|e| match e {
            Expr::Load { index, .. } | Expr::Index(index) => Some(index),
            _ => None,
        });
        let stores = self
            .stages
            .iter()
            .flat_map(|s| s.action.stores().iter().map(|st| &st.index));
        exprs.chain(stores)
    }

    /// Every size expression the kernel's code computes: its indices' coefficients and offsets,
    /// and the bounds of its data-dependent loads.
    pub fn size_exprs(&self) -> impl Iterator<Item = &SizeExpr> {
        let bounds = self.exprs.iter().filter_map(|e| match e {
            Expr::Load {
                indirect: Some(ind),
                ..
            } => Some(&ind.bound),
            _ => None,
        });
        self.indices().flat_map(|i| i.size_exprs()).chain(bounds)
    }

    /// The symbols the kernel's size expressions read ([`Kernel::size_exprs`]), sorted and
    /// unique.
    pub fn index_symbols(&self) -> Vec<SymId> {
        let mut out: Vec<SymId> = self.size_exprs().flat_map(|e| e.symbols()).collect();
        out.sort();
        out.dedup();
        out
    }

    /// Expressions reachable from `roots` through [`Expr::operands`], each once.
    pub fn reachable(&self, roots: &[ExprId]) -> Vec<ExprId> {
        let mut seen = vec![false; self.exprs.len()];
        let mut stack: Vec<ExprId> = roots.to_vec();
        let mut out = Vec::new();
        while let Some(id) = stack.pop() {
            match seen.get_mut(id.0 as usize) {
                Some(s) if !*s => *s = true,
                _ => continue,
            }
            out.push(id);
            stack.extend(self.expr(id).operands());
        }
        out
    }

    /// Buffers the kernel loads from, sorted and unique.
    pub fn loads(&self) -> Vec<BufferId> {
        let mut out: Vec<BufferId> = self
            .exprs
            .iter()
            .filter_map(|e| match e {
                Expr::Load { buffer, .. } => Some(*buffer),
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// How many leading outer loops a step's kernel splits across threads, as one range over
    /// their iterations in row-major order (the compiled function's `start..end`): every outer
    /// loop in the inner order, so that a `[4, 256] x [512]` row kernel has 1024 rows to share
    /// rather than 4. Only the first where a buffer takes several stores (a cat's operands:
    /// the verifier proves those disjoint per row of the first loop) unless
    /// [`Kernel::stores_apart`] proves each iteration of all the outer loops writes its own
    /// elements of it, and in the outer-reduction order (its last loop is the vectorised
    /// columns). A GEMM epilogue is run on blocks of its first loop, whatever this says (see
    /// [`MatmulStep::epilogue`]).
    pub fn split_loops(&self) -> usize {
        if self.outer.is_empty() {
            return 0;
        }
        let mut stored = Vec::new();
        for s in &self.stages {
            for st in s.action.stores() {
                if stored.contains(&st.buffer) && !self.stores_apart(st.buffer) {
                    return 1;
                }
                stored.push(st.buffer);
            }
        }
        match self.order {
            LoopOrder::Inner => self.outer.len(),
            LoopOrder::OuterReduction => 1,
        }
    }

    /// The outer loop along which `self` copies a transposed view, if it is such a copy: inner
    /// loop order; one stage, over one loop, storing one buffer contiguously along that loop
    /// with a plain load of another buffer of the same type (f32, f16, bf16 or i64: see
    /// [`transposed_copy_dtype`]) that is contiguous (coefficient 1) along this outer loop and
    /// strided along the stage's loop; this outer loop moves the store.
    /// `choose_loop_order` makes that loop the last, and the code generator then runs each run of
    /// it as one call of the kernel library's transpose routine (16 × 16 tiles transposed in
    /// registers; see `codegen_cpu/src/lower/transpose.rs`).
    pub fn transposed_copy(&self, program: &Program) -> Option<usize> {
        if self.order != LoopOrder::Inner || self.stages.len() != 1 {
            return None;
        }
        let stage = &self.stages[0];
        let StageAction::Store(stores) = &stage.action else {
            return None;
        };
        let ([store], 1) = (stores.as_slice(), stage.extent.len()) else {
            return None;
        };
        let Expr::Load {
            buffer: src,
            index: load,
            indirect: None,
        } = self.expr(store.value)
        else {
            return None;
        };
        let dtype = program.buffer(*src).dtype;
        if *src == store.buffer
            || !transposed_copy_dtype(dtype)
            || program.buffer(store.buffer).dtype != dtype
        {
            return None;
        }
        let inner = Var::Inner(0);
        let (along, across) = (load.coefficient(inner), store.index.coefficient(inner));
        if along.is(1) || along.is_zero() || !across.is(1) {
            return None;
        }
        (0..self.outer.len()).find(|&o| {
            let o = Var::Outer(o as u32);
            load.coefficient(o).is(1) && !store.index.coefficient(o).is_zero()
        })
    }

    /// Whether the stores to `buffer`, all sizes static, write each iteration of the outer
    /// loops (all of them) into a window of its own: every store moves with the same outer
    /// terms; every store's elements of one iteration (its offset plus its inner terms over
    /// their extents) lie in `[0, c)` past the iteration's base, `c` the smallest outer
    /// coefficient; and the outer terms sorted by coefficient form a mixed-radix number over
    /// those windows (each coefficient exceeds the span of the smaller ones plus the window).
    /// A rotary embedding's halves, `[.., 64*o2 + i0]` and `[.., 64*o2 + i0 + 32]` over 32
    /// elements each, qualify: their windows fill `[0, 64)`.
    pub fn stores_apart(&self, buffer: BufferId) -> bool {
        let outer_terms = |st: &Store| -> Vec<(Var, SizeExpr)> {
            (st.index.terms.iter())
                .filter(|(v, _)| matches!(v, Var::Outer(_)))
                .cloned()
                .collect()
        };
        let mut shared: Option<Vec<(Var, SizeExpr)>> = None;
        let mut top: i128 = -1;
        for stage in &self.stages {
            for st in stage
                .action
                .stores()
                .iter()
                .filter(|st| st.buffer == buffer)
            {
                let terms = outer_terms(st);
                if shared.as_ref().is_some_and(|s| *s != terms) {
                    return false;
                }
                shared = Some(terms);
                let Some(mut low) = st.index.offset.as_const().map(i128::from) else {
                    return false;
                };
                let mut high = low;
                for (v, c) in st.index.terms.iter() {
                    let Var::Inner(i) = v else { continue };
                    let (Some(c), Some(n)) = (
                        c.as_const().map(i128::from),
                        stage.extent.get(*i as usize).and_then(|d| d.as_static()),
                    ) else {
                        return false;
                    };
                    let span = c * (n as i128 - 1).max(0);
                    if span < 0 {
                        low += span;
                    } else {
                        high += span;
                    }
                }
                if low < 0 {
                    return false;
                }
                top = top.max(high);
            }
        }
        // The outer terms: each above the window and the smaller ones.
        let mut radix: Vec<(i128, usize)> = Vec::new();
        for (v, c) in shared.unwrap_or_default() {
            let Var::Outer(i) = v else { continue };
            let (Some(c), Some(n)) = (
                c.as_const().map(i128::from),
                self.outer.get(i as usize).and_then(|d| d.as_static()),
            ) else {
                return false;
            };
            radix.push((c, n));
        }
        // Every outer loop of more than one iteration moves the stores.
        let moved = |i: usize| {
            self.outer[i].as_static() == Some(1)
                || self.stages.iter().all(|stage| {
                    (stage.action.stores().iter())
                        .filter(|st| st.buffer == buffer)
                        .all(|st| st.index.uses(Var::Outer(i as u32)))
                })
        };
        (0..self.outer.len()).all(moved) && mixed_radix(radix, top)
    }

    /// Buffers the kernel stores to, in the order its stages first store them.
    pub fn stores(&self) -> Vec<BufferId> {
        let mut out = Vec::new();
        for s in &self.stages {
            for st in s.action.stores() {
                if !out.contains(&st.buffer) {
                    out.push(st.buffer);
                }
            }
        }
        out
    }

    /// Buffers read or written, sorted and unique: the compiled function's pointer table.
    pub fn buffers(&self) -> Vec<BufferId> {
        let mut out = self.loads();
        out.extend(self.stores());
        out.sort();
        out.dedup();
        out
    }
}

/// Whether `Σ cᵢ·vᵢ` over `0 <= vᵢ < nᵢ` (the `(cᵢ, nᵢ)` of `terms`), plus any offset in
/// `[0, below]`, takes a different value at every point: sorted by coefficient, each term of
/// more than one value exceeds the largest value of the smaller terms (and `below`).
pub(crate) fn mixed_radix(mut terms: Vec<(i128, usize)>, below: i128) -> bool {
    terms.sort();
    let mut span = below;
    for (c, n) in terms {
        if n > 1 && c <= span {
            return false;
        }
        span += c * (n as i128 - 1).max(0);
    }
    true
}

/// `out[batch..., m, n] = a[batch..., m, k] @ b[batch..., k, n]` on strided views, by an extern GEMM.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulStep {
    pub a: StridedView,
    pub b: MatmulOperand,
    pub out: BufferId,
    pub node: NodeId,
    /// Pointwise consumers of the output, run on each block of rows right after the GEMM wrote
    /// it (while it is in cache). Its first outer loop is the output's first dim.
    pub epilogue: Option<Kernel>,
}

/// The right operand of a GEMM: a buffer seen through a view, or the im2col of a buffer that is
/// never written out (the GEMM packs its panels from the source itself: an implicit GEMM).
#[derive(Clone, Debug, PartialEq)]
pub enum MatmulOperand {
    View(StridedView),
    Im2col(Im2colView),
}

impl MatmulOperand {
    /// The buffer the operand reads.
    pub fn buffer(&self) -> BufferId {
        match self {
            MatmulOperand::View(v) => v.buffer,
            MatmulOperand::Im2col(v) => v.source,
        }
    }

    /// The operand's shape as the GEMM sees it: `[batch..., k, n]`.
    pub fn shape(&self) -> &[Dim] {
        match self {
            MatmulOperand::View(v) => &v.shape,
            MatmulOperand::Im2col(v) => &v.shape,
        }
    }
}

impl fmt::Display for MatmulOperand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatmulOperand::View(v) => write!(
                f,
                "{}{:?}+{} strides {}",
                v.buffer,
                v.shape,
                v.offset,
                size_list(&v.strides)
            ),
            MatmulOperand::Im2col(v) => write!(
                f,
                "im2col[{}, groups={}]({}){:?}",
                v.window, v.groups, v.source, v.shape
            ),
        }
    }
}

/// `im2col(source)` (see `Op::Im2col`) seen as `shape = [N, groups, C/groups·KH·KW, OH·OW]`:
/// element `(n, g, r, l)` is element `(n, g·C/groups·KH·KW + r, l)` of the im2col of the
/// contiguous `source` buffer `[N, C, H, W]`. Only a GEMM's right operand takes this form.
#[derive(Clone, Debug, PartialEq)]
pub struct Im2colView {
    pub source: BufferId,
    pub window: Window2d,
    pub groups: usize,
    pub shape: Vec<Dim>,
}

/// A buffer seen through a view: element `[i...]` lives at `offset + Σ i_d · strides[d]`.
#[derive(Clone, Debug, PartialEq)]
pub struct StridedView {
    pub buffer: BufferId,
    pub offset: SizeExpr,
    pub shape: Vec<Dim>,
    pub strides: Vec<SizeExpr>,
}

/// Row-major strides of a contiguous buffer of `shape`, as size expressions (a stride in front
/// of a symbolic dim is a product with its symbol: `[s0, s1, 64]` has `[64*s1, 64, 1]`).
pub fn contiguous_strides(shape: &[Dim]) -> Vec<SizeExpr> {
    let mut strides = vec![SizeExpr::Const(1); shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        let next = match shape[d + 1] {
            Dim::Static(n) => SizeExpr::Const(n.max(1) as i64),
            Dim::Sym(_) => SizeExpr::of_dim(shape[d + 1]),
        };
        strides[d] = strides[d + 1].times(&next);
    }
    strides
}

impl StridedView {
    /// `buffer` seen whole as the contiguous row-major `shape` (offset 0, [`contiguous_strides`]).
    pub fn contiguous(buffer: BufferId, shape: &[Dim]) -> StridedView {
        StridedView {
            buffer,
            offset: SizeExpr::Const(0),
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
        }
    }

    /// The offset and strides for the symbol sizes `size` gives (`None` if one is unknown or
    /// a value does not fit an `i64`).
    pub fn bind(&self, size: impl Fn(SymId) -> Option<i128> + Copy) -> Option<(i64, Vec<i64>)> {
        let offset = self.offset.eval_i64(size)?;
        let strides = self
            .strides
            .iter()
            .map(|s| s.eval_i64(size))
            .collect::<Option<Vec<i64>>>()?;
        Some((offset, strides))
    }
}

/// `out = zeros; out[p with p[dim] = index[p]] += src[p]` for every position `p` of `src` in
/// row-major order, by an extern routine (Inductor falls back to ATen's `scatter_add` likewise).
/// `index` is seen with `src`'s shape (stride 0 where it broadcasts); an index outside
/// `0..out.shape[dim]` is a runtime error. The output is f32.
#[derive(Clone, Debug, PartialEq)]
pub struct ScatterAddStep {
    pub index: StridedView,
    pub src: StridedView,
    pub out: BufferId,
    pub dim: usize,
    pub node: NodeId,
}

/// Fused scaled dot-product attention (flash attention): `out = softmax(q·kᵀ·scale [causal])·v`
/// computed per block of query rows with an online softmax over blocks of keys, so the `[.., T,
/// S]` scores never exist in memory. `fuse` makes it from the prim expansion of
/// `scaled_dot_product_attention` (two GEMMs around a row softmax) when nothing else reads the
/// scores.
///
/// Invariants (checked by `verify_program`): `q` is `[batch.., T, E]`, `k` `[batch_kv.., S, E]`,
/// `v` `[batch_kv.., S, Ev]` and `out` (a view of an f32 buffer, not an input, none of the
/// operands) `[batch.., T, Ev]`, all f32; `out` keeps a row's `Ev` elements contiguous (its last
/// stride 1) and gives every element its own place, so each output row is one thread's; `batch_kv` equals `batch` except its last dim, which is
/// `batch`'s divided by `group` (grouped-query attention: q head `h` reads k/v head `h / group`);
/// every view stays inside its buffer for the bound sizes. With `causal`, key `s` takes part in
/// query row `t` only when `s <= t` (PyTorch's `is_causal`, the mask `ones(T, S).tril()`).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionStep {
    pub q: StridedView,
    pub k: StridedView,
    pub v: StridedView,
    /// Where the output goes: usually its buffer whole (`StridedView::contiguous`), or, when
    /// `fuse` folded the copy that permuted it, the layout that copy wrote (`[b, h, t, d]`
    /// into a `[b, t, h·d]` buffer: strides `[T·H·D, D, H·D, 1]`).
    pub out: StridedView,
    pub scale: f32,
    pub causal: bool,
    /// A mask seen with the scores' shape `[batch.., T, S]` (stride 0 where it broadcasts),
    /// applied after the scale as `mask_kind` says.
    pub mask: Option<StridedView>,
    /// How `mask` applies: an f32 mask added, or a bool one selecting the scores that take part.
    pub mask_kind: MaskKind,
    /// How many q heads share one k/v head (1 without grouped-query attention).
    pub group: usize,
    /// The final GEMM `p·v` the step computes.
    pub node: NodeId,
    /// Every graph node the step computes (the scores GEMM, scale, mask, softmax, `p·v`).
    pub nodes: Vec<NodeId>,
}

/// How an attention step's mask applies to the scaled scores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MaskKind {
    /// An f32 mask, added (PyTorch's float `attn_mask`).
    #[default]
    Add,
    /// A bool mask: the scores where it is false are −inf (PyTorch's bool `attn_mask`: true
    /// takes part), i.e. `where(mask, scores, -inf)`.
    Keep,
    /// A bool mask: the scores where it is true are −inf (`scores.masked_fill(mask, -inf)`),
    /// i.e. `where(mask, -inf, scores)`.
    Drop,
}

/// A graph node the code generator cannot compile (an integer reduction, an integer scan, a
/// scatter-add of a non-f32 value), run by the reference interpreter on its operands' buffers,
/// like Inductor falling back to an ATen kernel. Compiled steps before and after it still run
/// compiled; this one runs on the calling thread.
///
/// Invariants (checked by `verify_program`): `op` is a prim whose type rule, applied to the
/// types of the `inputs` buffers in order, gives exactly the type of `out`; `out` is not an input
/// and is none of `inputs`.
#[derive(Clone, Debug, PartialEq)]
pub struct FallbackStep {
    pub op: Op,
    /// The operands' buffers, in the op's operand order (a buffer may appear more than once).
    pub inputs: Vec<BufferId>,
    pub out: BufferId,
    pub node: NodeId,
    /// Why the node is not compiled, in words (for `explain`, the dumps and logs); one line.
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Kernel(Kernel),
    Matmul(MatmulStep),
    ScatterAdd(ScatterAddStep),
    Attention(AttentionStep),
    Fallback(FallbackStep),
}

impl Step {
    /// Buffers the step reads (a GEMM's operands, then its epilogue's loads).
    pub fn reads(&self) -> Vec<BufferId> {
        match self {
            Step::Kernel(k) => k.loads(),
            Step::Matmul(m) => {
                let mut r = vec![m.a.buffer, m.b.buffer()];
                if let Some(e) = &m.epilogue {
                    r.extend(e.loads());
                }
                r
            }
            Step::ScatterAdd(sc) => vec![sc.index.buffer, sc.src.buffer],
            Step::Attention(a) => {
                let mut r = vec![a.q.buffer, a.k.buffer, a.v.buffer];
                r.extend(a.mask.iter().map(|m| m.buffer));
                r
            }
            Step::Fallback(fb) => fb.inputs.clone(),
        }
    }

    /// Buffers the step writes, in order (a GEMM's output before its epilogue's).
    pub fn writes(&self) -> Vec<BufferId> {
        match self {
            Step::Kernel(k) => k.stores(),
            Step::Matmul(m) => {
                let mut w = vec![m.out];
                if let Some(e) = &m.epilogue {
                    w.extend(e.stores());
                }
                w
            }
            Step::ScatterAdd(sc) => vec![sc.out],
            Step::Attention(a) => vec![a.out.buffer],
            Step::Fallback(fb) => vec![fb.out],
        }
    }
}

/// Before step `step` runs, every i64 in `buffer` must lie in `0..bound` (embedding indices);
/// the runtime reports a typed error otherwise. Indices computed inside a kernel are clamped.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexCheck {
    pub buffer: BufferId,
    /// A number, or a size expression of the call's symbols.
    pub bound: SizeExpr,
    pub step: usize,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Program {
    pub buffers: Vec<Buffer>,
    pub steps: Vec<Step>,
    pub index_checks: Vec<IndexCheck>,
    /// For each graph output, the buffer holding it.
    pub outputs: Vec<BufferId>,
    /// Arena slots of the intermediates (set by `plan_buffers`).
    pub plan: Option<crate::plan::BufferPlan>,
}

impl Program {
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.0 as usize]
    }

    /// This program with its steps rearranged: `origin[i]` lists the original steps that new
    /// step `i` contains (a merge or a move), so index checks follow their steps.
    pub fn with_steps(&self, steps: Vec<Step>, origin: &[Vec<usize>]) -> Program {
        let mut index_checks = self.index_checks.clone();
        for check in &mut index_checks {
            check.step = origin
                .iter()
                .position(|o| o.contains(&check.step))
                .expect("every original step lives in one new step");
        }
        Program {
            steps,
            index_checks,
            ..self.clone()
        }
    }

    /// Every kernel, epilogues included, in execution order.
    pub fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        self.steps.iter().filter_map(|s| match s {
            Step::Kernel(k) => Some(k),
            Step::Matmul(m) => m.epilogue.as_ref(),
            Step::ScatterAdd(_) | Step::Attention(_) | Step::Fallback(_) => None,
        })
    }

    /// Every fallback step (a node run by the interpreter), in execution order.
    pub fn fallbacks(&self) -> impl Iterator<Item = &FallbackStep> {
        self.steps.iter().filter_map(|s| match s {
            Step::Fallback(fb) => Some(fb),
            _ => None,
        })
    }
}

// ---- text format -----------------------------------------------------------------------------

impl fmt::Display for FallbackStep {
    /// `fallback buf4 = reduce_sum[axes=[1], keepdim=false](buf2) (node %5) because REASON`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inputs: Vec<String> = self.inputs.iter().map(|b| b.to_string()).collect();
        write!(
            f,
            "fallback {} = {}({}) (node {}) because {}",
            self.out,
            self.op,
            inputs.join(", "),
            self.node,
            self.reason
        )
    }
}

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Var::Outer(i) => write!(f, "o{i}"),
            Var::Inner(i) => write!(f, "i{i}"),
        }
    }
}

impl fmt::Display for Affine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self
            .terms
            .iter()
            .map(|(v, c)| match c {
                c if c.is(1) => v.to_string(),
                c if c.is_monomial() => format!("{c}*{v}"),
                c => format!("({c})*{v}"),
            })
            .collect();
        if !self.offset.is_zero() || parts.is_empty() {
            parts.push(self.offset.to_string());
        }
        f.write_str(&parts.join(" + "))
    }
}

/// `[a, b, …]` of size expressions (a view's strides).
pub fn size_list(v: &[SizeExpr]) -> String {
    let items: Vec<String> = v.iter().map(|e| e.to_string()).collect();
    format!("[{}]", items.join(", "))
}

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "buf{}", self.0)
    }
}

fn dims(d: &[Dim]) -> String {
    format!(
        "[{}]",
        d.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| n.to_string()).collect();
        let order = match self.order {
            LoopOrder::Inner => "",
            LoopOrder::OuterReduction => " order=outer_reduction",
        };
        writeln!(
            f,
            "kernel {} outer={}{order} fuses {}",
            self.name,
            dims(&self.outer),
            nodes.join(" ")
        )?;
        for (i, e) in self.exprs.iter().enumerate() {
            let mut line = String::new();
            match e {
                Expr::Load {
                    buffer,
                    index,
                    indirect,
                } => {
                    write!(line, "load {buffer}[{index}")?;
                    if let Some(ind) = indirect {
                        write!(
                            line,
                            " + {}*clamp(e{}, 0, {})",
                            ind.stride, ind.value.0, ind.bound
                        )?;
                    }
                    line.push(']');
                }
                Expr::Constant { value, .. } => write!(line, "{value:?}")?,
                Expr::StageResult(s) => write!(line, "stage{s}")?,
                Expr::Index(index) => write!(line, "index {index}")?,
                Expr::Unary(op, a) => {
                    write!(line, "{} e{}", format!("{op:?}").to_lowercase(), a.0)?
                }
                Expr::Binary(op, a, b) => write!(
                    line,
                    "{} e{}, e{}",
                    format!("{op:?}").to_lowercase(),
                    a.0,
                    b.0
                )?,
                Expr::Compare(op, a, b) => write!(
                    line,
                    "{} e{}, e{}",
                    format!("{op:?}").to_lowercase(),
                    a.0,
                    b.0
                )?,
                Expr::Where(c, a, b) => write!(line, "where e{}, e{}, e{}", c.0, a.0, b.0)?,
                Expr::Cast(d, a) => write!(line, "cast[{d}] e{}", a.0)?,
            }
            writeln!(f, "  e{i}: {:?} = {line}", self.types[i])?;
        }
        for (i, s) in self.stages.iter().enumerate() {
            match &s.action {
                StageAction::Reduce { op, value, stores } => {
                    write!(
                        f,
                        "  stage{i} over {}: reduce_{} e{}",
                        dims(&s.extent),
                        format!("{op:?}").to_lowercase(),
                        value.0
                    )?;
                    for st in stores {
                        write!(f, ", store {}[{}] = e{}", st.buffer, st.index, st.value.0)?;
                    }
                    writeln!(f)?;
                }
                StageAction::Scan(st) => writeln!(
                    f,
                    "  stage{i} over {}: store {}[{}] = running sum of e{}",
                    dims(&s.extent),
                    st.buffer,
                    st.index,
                    st.value.0
                )?,
                StageAction::Store(stores) if stores.is_empty() => {
                    writeln!(f, "  stage{i} over {}: no stores", dims(&s.extent))?
                }
                StageAction::Store(stores) => {
                    for st in stores {
                        writeln!(
                            f,
                            "  stage{i} over {}: store {}[{}] = e{}",
                            dims(&s.extent),
                            st.buffer,
                            st.index,
                            st.value.0
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "buffers:")?;
        for (i, b) in self.buffers.iter().enumerate() {
            writeln!(
                f,
                "  buf{i}: {}{} {:?} (node {})",
                b.dtype,
                dims(&b.shape),
                b.kind,
                b.node
            )?;
        }
        for step in &self.steps {
            match step {
                Step::Kernel(k) => write!(f, "{k}")?,
                Step::Matmul(m) => writeln!(
                    f,
                    "matmul {} = {}{:?}+{} strides {} @ {} (node {})",
                    m.out,
                    m.a.buffer,
                    m.a.shape,
                    m.a.offset,
                    size_list(&m.a.strides),
                    m.b,
                    m.node
                )?,
                Step::ScatterAdd(sc) => writeln!(
                    f,
                    "scatter_add {}[dim {}] += {}{:?}+{} strides {} at indices {}+{} strides {} (node {})",
                    sc.out,
                    sc.dim,
                    sc.src.buffer,
                    sc.src.shape,
                    sc.src.offset,
                    size_list(&sc.src.strides),
                    sc.index.buffer,
                    sc.index.offset,
                    size_list(&sc.index.strides),
                    sc.node
                )?,
                Step::Attention(a) => {
                    let view = |v: &StridedView| {
                        format!(
                            "{}{:?}+{} strides {}",
                            v.buffer,
                            v.shape,
                            v.offset,
                            size_list(&v.strides)
                        )
                    };
                    let nodes: Vec<String> = a.nodes.iter().map(|n| n.to_string()).collect();
                    // The output buffer whole prints as its name alone.
                    let whole = StridedView::contiguous(
                        a.out.buffer,
                        &self.buffer(a.out.buffer).shape,
                    );
                    let out = if a.out == whole {
                        a.out.buffer.to_string()
                    } else {
                        view(&a.out)
                    };
                    writeln!(
                        f,
                        "attention {} = q {} k {} v {}{} scale {:?}{} group {} nodes [{}] (node {})",
                        out,
                        view(&a.q),
                        view(&a.k),
                        view(&a.v),
                        a.mask.as_ref().map_or(String::new(), |m| {
                            let kind = match a.mask_kind {
                                MaskKind::Add => "",
                                MaskKind::Keep => "keep ",
                                MaskKind::Drop => "drop ",
                            };
                            format!(" mask {kind}{}", view(m))
                        }),
                        a.scale,
                        if a.causal { " causal" } else { "" },
                        a.group,
                        nodes.join(", "),
                        a.node
                    )?
                }
                Step::Fallback(fb) => writeln!(f, "{fb}")?,
            }
            if let Step::Matmul(MatmulStep {
                out,
                epilogue: Some(e),
                ..
            }) = step
            {
                write!(f, "epilogue of {out}: {e}")?;
            }
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| o.to_string()).collect();
        writeln!(f, "outputs: {}", outs.join(", "))?;
        for check in &self.index_checks {
            writeln!(
                f,
                "index check: {} in 0..{} before step {}",
                check.buffer, check.bound, check.step
            )?;
        }
        if let Some(plan) = &self.plan {
            write!(f, "{plan}")?;
        }
        Ok(())
    }
}
