//! Tracing: ordinary Rust on [`Traced`] tensors records a [`Graph`].
//!
//! Operators (`+ - * /`, unary `-`) and methods mirror PyTorch's names and argument conventions
//! (negative dims count from the end, `reshape` accepts one `-1`, slices clamp like Python's).
//! An ill-typed op does not panic: the tracer remembers the first error with the caller's source
//! location (`#[track_caller]`), every later op on a poisoned value is skipped, and
//! [`Tracer::finish`] returns the error.
//!
//! Under `jit` the tracer has hooks (`TraceHooks`): `item()`/`to_vec()` become graph breaks that
//! run the graph so far and return real values (the tracer counts live `Traced` handles so the
//! break knows which values Rust code still holds), and reading a symbolic dim as a number
//! (`shape()`, the sizes `reshape`/`slice`/`layer_norm` need) returns its example size and marks
//! the symbol specialized, as does comparing a symbolic [`TracedDim`] (what `dims()` returns).
//! Shape rules keep symbolic dims where they can (the IR dims, `expand`'s `-1`, a `reshape` `-1`
//! that divides the element count exactly, `flatten`, `cat`, `pad`, slices from a start to the
//! end within the least size a dim has), making *derived* symbols (`s0 + 1`, `2*s0`, `s0 - 1`)
//! where a size is an expression of input symbols, and otherwise fail with a trace error, never
//! a panic, so `jit` can fall back to static shapes.

use minductor_ir::{
    shape_string, static_shape, BinaryOp, CompareOp, DType, Dim, Graph, IrError, NodeId, Op,
    ReduceOp, Shape, SizeExpr, SliceFrom, SymId, TensorType, UnaryOp,
};
use std::cell::RefCell;
use std::fmt;
use std::panic::Location;
use std::rc::Rc;

/// An error found while tracing, with the source location of the offending call.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceError {
    pub location: String,
    pub error: IrError,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "trace error at {}: {}", self.location, self.error)
    }
}

impl std::error::Error for TraceError {}

struct TraceState {
    graph: RefCell<Graph>,
    error: RefCell<Option<TraceError>>,
    /// Number of live [`Traced`] handles per node: a graph break materializes the live values.
    live: RefCell<Vec<u32>>,
    /// Installed by `jit`: what `item()`/`to_vec()` and concrete reads of symbolic sizes do.
    hooks: RefCell<Option<Rc<dyn TraceHooks>>>,
}

/// What a tracer driven by `jit` does where plain tracing cannot go on by itself.
pub(crate) trait TraceHooks {
    /// A graph break: runs the graph recorded so far (`live` are the values still held by Rust
    /// code) and returns the values of `node` in row-major order. An `Err` is recorded as the
    /// trace's error (a run that failed, out of memory say, is kept by the hooks, which report
    /// it as the call's error).
    fn graph_break(
        &self,
        graph: &Graph,
        node: NodeId,
        live: &[NodeId],
        what: &str,
        location: &'static Location<'static>,
    ) -> Result<Vec<f64>, IrError>;

    /// The example size of a symbolic dim that Rust code reads as a number; the hook records that
    /// the symbol must be specialized (made static) for the trace to hold.
    fn specialize(&self, sym: SymId, location: &'static Location<'static>) -> Option<usize>;
}

/// Records `error` at `location` in `state` unless an earlier error is already recorded.
fn record_error_in(state: &TraceState, location: &'static Location<'static>, error: IrError) {
    let mut slot = state.error.borrow_mut();
    if slot.is_none() {
        *slot = Some(TraceError {
            location: location.to_string(),
            error,
        });
    }
}

/// The example size of symbol `sym`, read as a number by `what`: under `jit` the hooks record
/// that the symbol must be specialized; without an example size it is a trace error (and 0).
fn size_of_symbol(
    state: &TraceState,
    sym: SymId,
    what: &str,
    location: &'static Location<'static>,
) -> usize {
    // A derived size is read by reading (so specializing) the input symbols it is made of.
    if let Some(definition) = sym.definition() {
        let value = definition.eval(|s| Some(size_of_symbol(state, s, what, location) as i128));
        return value.and_then(|v| usize::try_from(v).ok()).unwrap_or(0);
    }
    let hooks = state.hooks.borrow().clone();
    match hooks.and_then(|h| h.specialize(sym, location)) {
        Some(n) => n,
        None => {
            record_error_in(
                state,
                location,
                IrError::ty(
                    what,
                    format!(
                        "dim s{} is symbolic and has no example size; use dims()",
                        sym.0
                    ),
                ),
            );
            0
        }
    }
}

/// A size every call's value of `d` reaches: its number if static, 2 for an input symbol
/// (`jit` specializes sizes 0 and 1 and guards the rest >= 2), and for a derived one its
/// definition at 2 when no symbol term has a negative coefficient (so the definition grows
/// with every symbol), else 0.
fn least_size(d: Dim) -> usize {
    match d {
        Dim::Static(n) => n,
        Dim::Sym(s) => match s.definition() {
            None => 2,
            Some(e) => {
                let growing = e.terms().iter().all(|(m, c)| m.is_empty() || *c > 0);
                growing
                    .then(|| e.eval(|_| Some(2)))
                    .flatten()
                    .and_then(|v| usize::try_from(v).ok())
                    .unwrap_or(0)
            }
        },
    }
}

/// One dim of a traced value, as [`Traced::dims`] hands it to Rust code.
///
/// A static dim behaves as its number. A symbolic dim stands for every size the compiled graph
/// will be called with, so Rust code that *branches* on it would bake one answer into a graph
/// used for all sizes. Like Dynamo with a `SymInt`, comparing a symbolic dim (`==`, `<`, ... with
/// another dim or a number) or reading it as a number ([`TracedDim::size`]) therefore
/// specializes it: under `jit` the trace is redone with that dim static, so the cache entry's
/// guards require its exact size and a call with another size recompiles instead of taking the
/// recorded branch. Without `jit` (no example size) it is a trace error. Building shapes with
/// symbolic dims (`expand(&[-1, ..])`, `reshape` with `-1`) does not read them.
#[derive(Clone)]
pub struct TracedDim {
    dim: Dim,
    state: Rc<TraceState>,
}

impl TracedDim {
    /// Whether the dim is symbolic (the answer does not depend on its size, so no guard).
    pub fn is_symbolic(&self) -> bool {
        matches!(self.dim, Dim::Sym(_))
    }

    /// The size as a number; specializes a symbolic dim.
    #[track_caller]
    pub fn size(&self) -> usize {
        self.read("dims()[..].size()", Location::caller())
    }

    fn read(&self, what: &str, location: &'static Location<'static>) -> usize {
        match self.dim {
            Dim::Static(n) => n,
            Dim::Sym(s) => size_of_symbol(&self.state, s, what, location),
        }
    }
}

impl PartialEq for TracedDim {
    #[track_caller]
    fn eq(&self, other: &TracedDim) -> bool {
        if self.is_symbolic() && self.dim == other.dim {
            // One symbol: equal at every size (the guards tie dims that share a symbol).
            return true;
        }
        let location = Location::caller();
        self.read("comparing dims", location) == other.read("comparing dims", location)
    }
}

impl PartialEq<usize> for TracedDim {
    #[track_caller]
    fn eq(&self, other: &usize) -> bool {
        self.read("comparing a dim", Location::caller()) == *other
    }
}

impl PartialOrd for TracedDim {
    #[track_caller]
    fn partial_cmp(&self, other: &TracedDim) -> Option<std::cmp::Ordering> {
        if self.is_symbolic() && self.dim == other.dim {
            return Some(std::cmp::Ordering::Equal);
        }
        let location = Location::caller();
        Some(
            self.read("comparing dims", location)
                .cmp(&other.read("comparing dims", location)),
        )
    }
}

impl PartialOrd<usize> for TracedDim {
    #[track_caller]
    fn partial_cmp(&self, other: &usize) -> Option<std::cmp::Ordering> {
        Some(self.read("comparing a dim", Location::caller()).cmp(other))
    }
}

/// Prints the dim without reading it: a number, or the symbol (`s0`).
impl fmt::Display for TracedDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dim)
    }
}

impl fmt::Debug for TracedDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TracedDim({})", self.dim)
    }
}

/// Records a graph. Create inputs with [`Tracer::input`], compute on them, then [`Tracer::finish`].
pub struct Tracer {
    state: Rc<TraceState>,
}

/// A tensor being traced: a handle to a node of the graph under construction.
pub struct Traced {
    state: Rc<TraceState>,
    /// `None` once an error poisoned this value.
    id: Option<NodeId>,
}

/// Traces `f` into a graph: `f` declares its inputs on the tracer and returns its outputs.
pub fn trace(f: impl FnOnce(&Tracer) -> Vec<Traced>) -> Result<Graph, TraceError> {
    let tracer = Tracer::new();
    let outputs = f(&tracer);
    tracer.finish(&outputs)
}

impl Default for Tracer {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracer {
    pub fn new() -> Self {
        Tracer {
            state: Rc::new(TraceState {
                graph: RefCell::new(Graph::new()),
                error: RefCell::new(None),
                live: RefCell::new(Vec::new()),
                hooks: RefCell::new(None),
            }),
        }
    }

    /// Declares an input with a static shape.
    #[track_caller]
    pub fn input(&self, name: &str, dtype: DType, shape: &[usize]) -> Traced {
        self.input_typed(name, TensorType::new(dtype, static_shape(shape)))
    }

    /// A 0-d constant of `dtype`.
    pub fn constant(&self, value: f64, dtype: DType) -> Traced {
        let id = self.state.graph.borrow_mut().constant(value, dtype);
        Traced::handle(&self.state, Some(id))
    }

    /// `torch.arange(end, dtype=dtype)`: `[0, 1, .., end - 1]` (the `iota` prim).
    #[track_caller]
    pub fn arange(&self, end: usize, dtype: DType) -> Traced {
        self.arange_dim(Dim::Static(end), dtype)
    }

    /// `torch.arange(n, dtype)` of a dim that may be symbolic (what [`Traced::dims`] returns):
    /// a symbolic length stays symbolic, so the graph serves every size of it.
    #[track_caller]
    pub fn arange_of(&self, n: TracedDim, dtype: DType) -> Traced {
        self.arange_dim(n.dim, dtype)
    }

    #[track_caller]
    fn arange_dim(&self, len: Dim, dtype: DType) -> Traced {
        Traced::handle(&self.state, None).apply(Op::Iota { len, dtype }, &[])
    }

    /// Declares an input of any type (dims may be symbolic). A type too large for memory is a
    /// trace error.
    #[track_caller]
    pub fn input_typed(&self, name: &str, ty: TensorType) -> Traced {
        let location = Location::caller();
        let id = self.state.graph.borrow_mut().input(name, ty.clone());
        let traced = Traced::handle(&self.state, Some(id));
        if let Err(error) = minductor_ir::check_size(&format!("input `{name}`"), &ty) {
            traced.record_error(location, error);
            return Traced::handle(&self.state, None);
        }
        traced
    }

    pub(crate) fn set_hooks(&self, hooks: Rc<dyn TraceHooks>) {
        *self.state.hooks.borrow_mut() = Some(hooks);
    }

    /// The graph recorded so far (without outputs).
    pub(crate) fn graph_so_far(&self) -> Graph {
        self.state.graph.borrow().clone()
    }

    /// The first error recorded so far, if any.
    pub(crate) fn error(&self) -> Option<TraceError> {
        self.state.error.borrow().clone()
    }

    /// The error recorded by the tracer of an output that is not from this tracer, if any
    /// (a value poisoned on a tracer of its own, such as `Traced::cat(&[])`'s).
    pub(crate) fn foreign_error(&self, outputs: &[Traced]) -> Option<TraceError> {
        outputs
            .iter()
            .filter(|t| !Rc::ptr_eq(&t.state, &self.state))
            .find_map(|t| t.state.error.borrow().clone())
    }

    /// Node ids of `outputs`, or `None` if one is poisoned or from another tracer.
    pub(crate) fn ids_of(&self, outputs: &[Traced]) -> Option<Vec<NodeId>> {
        if outputs.iter().any(|t| !Rc::ptr_eq(&t.state, &self.state)) {
            return None;
        }
        outputs.iter().map(|t| t.id).collect()
    }

    /// Ends tracing: the graph with `outputs`, or the first error met while tracing.
    pub fn finish(self, outputs: &[Traced]) -> Result<Graph, TraceError> {
        if let Some(err) = self.state.error.borrow().clone() {
            return Err(err);
        }
        if let Some(foreign) = outputs.iter().find(|t| !Rc::ptr_eq(&t.state, &self.state)) {
            // A value poisoned on its own tracer (e.g. `Traced::cat(&[])`) reports that error.
            if let Some(err) = foreign.state.error.borrow().clone() {
                return Err(err);
            }
            return Err(TraceError {
                location: "finish".into(),
                error: IrError::ty("finish", "an output belongs to a different tracer"),
            });
        }
        let ids: Option<Vec<NodeId>> = outputs.iter().map(|t| t.id).collect();
        let Some(ids) = ids else {
            // Every poisoning records an error first; say so rather than panic if one did not.
            return Err(TraceError {
                location: "finish".into(),
                error: IrError::ty("finish", "an output is poisoned but no error was recorded"),
            });
        };
        let mut graph = self.state.graph.borrow().clone();
        graph.set_outputs(ids);
        Ok(graph)
    }
}

/// A second operand: a traced tensor or a Rust number (which becomes a 0-d constant).
pub enum Operand<'a> {
    Tensor(&'a Traced),
    Scalar(f64),
}

impl<'a> From<&'a Traced> for Operand<'a> {
    fn from(t: &'a Traced) -> Self {
        Operand::Tensor(t)
    }
}

macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl From<$t> for Operand<'_> {
            fn from(v: $t) -> Self {
                Operand::Scalar(v as f64)
            }
        }
    )*};
}
scalar_operand!(f64, f32, i32, i64);

fn normalize_dim(dim: isize, rank: usize) -> Result<usize, String> {
    if rank == 0 && (dim == 0 || dim == -1) {
        return Ok(0);
    }
    let r = rank as isize;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(format!("dim {dim} out of range for rank {rank}"));
    }
    Ok(d as usize)
}

impl Clone for Traced {
    fn clone(&self) -> Self {
        Traced::handle(&self.state, self.id)
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            if let Ok(mut live) = self.state.live.try_borrow_mut() {
                if let Some(count) = live.get_mut(id.index()) {
                    *count = count.saturating_sub(1);
                }
            }
        }
    }
}

impl Traced {
    /// A new handle to `id`, counted as live until dropped.
    fn handle(state: &Rc<TraceState>, id: Option<NodeId>) -> Traced {
        if let Some(id) = id {
            let mut live = state.live.borrow_mut();
            if live.len() <= id.index() {
                live.resize(id.index() + 1, 0);
            }
            live[id.index()] += 1;
        }
        Traced {
            state: state.clone(),
            id,
        }
    }

    /// A poisoned value that belongs to no user's tracer: a tracer of its own holds `error`.
    fn detached_error(location: &'static Location<'static>, error: IrError) -> Traced {
        let tracer = Tracer::new();
        let t = Traced::handle(&tracer.state, None);
        t.record_error(location, error);
        t
    }

    /// Records `error` at `location` unless an earlier error is already recorded.
    fn record_error(&self, location: &'static Location<'static>, error: IrError) {
        record_error_in(&self.state, location, error);
    }

    /// This value in words for error messages: `input `w1` (f32[4, 8])` or `%7 = mul (f32[4])`.
    pub(crate) fn describe(&self) -> String {
        let Some(id) = self.id else {
            return "a value poisoned by an earlier error".into();
        };
        let graph = self.state.graph.borrow();
        let node = graph.node(id);
        match &node.op {
            Op::Input { name } => format!("input `{name}` ({})", node.ty),
            op => format!("{id} = {} ({})", op.name(), node.ty),
        }
    }

    /// The type of this value (`None` if an earlier error poisoned it). Its dims are the IR's:
    /// comparing them neither guards nor specializes, so a branch on sizes should compare
    /// [`Traced::dims`] instead.
    pub fn ty(&self) -> Option<TensorType> {
        self.id.map(|id| self.state.graph.borrow().ty(id).clone())
    }

    /// Sizes of this value as numbers (empty if poisoned). A symbolic dim reads as its example
    /// size when traced by `jit`, which then specializes that dim (the trace holds for that size
    /// only, as Dynamo does when Python code turns a SymInt into an int); without an example size
    /// it reads as 0 and records a trace error. Use [`Traced::dims`] to keep dims symbolic.
    #[track_caller]
    pub fn shape(&self) -> Vec<usize> {
        let location = Location::caller();
        let Some(ty) = self.ty() else {
            return Vec::new();
        };
        ty.shape
            .iter()
            .map(|d| match d {
                Dim::Static(n) => *n,
                Dim::Sym(s) => self.size_of_symbol(*s, "shape()", location),
            })
            .collect()
    }

    /// Dims of this value as Rust code may use them: static or symbolic (empty if poisoned).
    /// Comparing a symbolic one, or reading it as a number, specializes it (see [`TracedDim`]).
    pub fn dims(&self) -> Vec<TracedDim> {
        self.ir_dims()
            .into_iter()
            .map(|dim| TracedDim {
                dim,
                state: self.state.clone(),
            })
            .collect()
    }

    /// The IR dims, for shape rules that keep symbols symbolic (they never branch on them).
    pub(crate) fn ir_dims(&self) -> Vec<Dim> {
        self.ty().map(|t| t.shape.to_vec()).unwrap_or_default()
    }

    /// Sizes of dims `from..` as numbers, dims before `from` as IR dims (which may stay
    /// symbolic): what a shape rule that computes with the trailing sizes only (convolution,
    /// pooling) reads, so a symbolic batch dim is not specialized.
    #[track_caller]
    pub(crate) fn sizes_after(&self, from: usize) -> (Vec<Dim>, Vec<usize>) {
        let location = Location::caller();
        let dims = self.ir_dims();
        let split = from.min(dims.len());
        let sizes = dims[split..]
            .iter()
            .map(|d| match d {
                Dim::Static(n) => *n,
                Dim::Sym(s) => self.size_of_symbol(*s, "shape()", location),
            })
            .collect();
        (dims[..split].to_vec(), sizes)
    }

    /// The size of dim `d` as a number (a symbolic one is specialized); other dims are not read.
    #[track_caller]
    pub(crate) fn size_at(&self, d: usize) -> usize {
        let location = Location::caller();
        match self.ir_dims().get(d) {
            Some(Dim::Static(n)) => *n,
            Some(Dim::Sym(s)) => self.size_of_symbol(*s, "shape()", location),
            None => 0,
        }
    }

    /// The example size of symbol `sym`, read as a number by `what` (which specializes it).
    fn size_of_symbol(
        &self,
        sym: SymId,
        what: &str,
        location: &'static Location<'static>,
    ) -> usize {
        size_of_symbol(&self.state, sym, what, location)
    }

    /// Reads this value (a graph break under `jit`), its elements in row-major order; `None`
    /// after recording why it cannot.
    fn read(&self, what: &str, location: &'static Location<'static>) -> Option<Vec<f64>> {
        let id = self.id?;
        if self.state.error.borrow().is_some() {
            return None;
        }
        let hooks = self.state.hooks.borrow().clone();
        let Some(hooks) = hooks else {
            self.record_error(
                location,
                IrError::ty(
                    what,
                    "reads a tensor's value, which needs real inputs: call the function through \
                     jit(..) (plain trace() has none)",
                ),
            );
            return None;
        };
        let live: Vec<NodeId> = self
            .state
            .live
            .borrow()
            .iter()
            .enumerate()
            .filter(|(_, &count)| count > 0)
            .map(|(index, _)| NodeId(index as u32))
            .collect();
        let result = {
            let graph = self.state.graph.borrow();
            hooks.graph_break(&graph, id, &live, what, location)
        };
        match result {
            Ok(values) => Some(values),
            Err(error) => {
                self.record_error(location, error);
                None
            }
        }
    }

    /// `x.item()`: the value of a one-element tensor. Under `jit` this is a graph break: the graph
    /// so far is compiled and run, and tracing goes on after it. Returns NaN after recording a
    /// trace error when the value cannot be read (plain `trace`, `fullgraph`, not one element).
    #[track_caller]
    pub fn item(&self) -> f64 {
        let location = Location::caller();
        if let Some(n) = self.ty().and_then(|t| t.numel()) {
            if n != 1 {
                self.record_error(
                    location,
                    IrError::ty(
                        "item()",
                        format!("needs a one-element tensor, found {}", self.ty().unwrap()),
                    ),
                );
                return f64::NAN;
            }
        }
        match self.read("item()", location) {
            Some(values) if values.len() == 1 => values[0],
            Some(values) => {
                self.record_error(
                    location,
                    IrError::ty(
                        "item()",
                        format!(
                            "needs a one-element tensor, found {} elements",
                            values.len()
                        ),
                    ),
                );
                f64::NAN
            }
            None => f64::NAN,
        }
    }

    /// `x.tolist()` flattened: every element in row-major order, as f64. A graph break under
    /// `jit`, like [`Traced::item`]; empty after recording a trace error when it cannot read.
    #[track_caller]
    pub fn to_vec(&self) -> Vec<f64> {
        let location = Location::caller();
        self.read("to_vec()", location).unwrap_or_default()
    }

    pub fn rank(&self) -> usize {
        self.ty().map(|t| t.rank()).unwrap_or(0)
    }

    pub fn dtype(&self) -> Option<DType> {
        self.ty().map(|t| t.dtype)
    }

    #[track_caller]
    pub(crate) fn fail(&self, error: IrError) -> Traced {
        self.record_error(Location::caller(), error);
        Traced::handle(&self.state, None)
    }

    #[track_caller]
    pub(crate) fn fail_msg(&self, op: &str, message: String) -> Traced {
        self.fail(IrError::ty(op, message))
    }

    /// Adds `op(inputs)`; the first operand is `self`'s tracer.
    #[track_caller]
    pub(crate) fn apply(&self, op: Op, inputs: &[&Traced]) -> Traced {
        let mut ids = Vec::with_capacity(inputs.len());
        for t in inputs {
            if !Rc::ptr_eq(&t.state, &self.state) {
                return self.fail_msg(&op.name(), "operands come from different tracers".into());
            }
            match t.id {
                Some(id) => ids.push(id),
                None => return Traced::handle(&self.state, None),
            }
        }
        let result = self.state.graph.borrow_mut().add(op, &ids);
        match result {
            Ok(id) => Traced::handle(&self.state, Some(id)),
            Err(e) => self.fail(e),
        }
    }

    /// The tracer recording this value (to create constants and `arange`s next to it).
    pub fn tracer(&self) -> Tracer {
        Tracer {
            state: self.state.clone(),
        }
    }

    /// A 0-d constant usable against `self`: same float dtype, or f32 next to integers.
    pub(crate) fn constant_like(&self, value: f64) -> Traced {
        let dtype = match self.dtype() {
            Some(d) if d.is_float() => d,
            Some(DType::I64) if value.fract() == 0.0 => DType::I64,
            _ => DType::F32,
        };
        let id = self.state.graph.borrow_mut().constant(value, dtype);
        Traced::handle(&self.state, Some(id))
    }

    fn operand(&self, other: Operand<'_>) -> Traced {
        match other {
            Operand::Tensor(t) => t.clone(),
            Operand::Scalar(v) => self.constant_like(v),
        }
    }

    #[track_caller]
    fn binary<'a>(&self, op: BinaryOp, other: impl Into<Operand<'a>>) -> Traced {
        let other = self.operand(other.into());
        self.apply(Op::Binary(op), &[self, &other])
    }

    #[track_caller]
    fn compare<'a>(&self, op: CompareOp, other: impl Into<Operand<'a>>) -> Traced {
        let other = self.operand(other.into());
        self.apply(Op::Compare(op), &[self, &other])
    }

    #[track_caller]
    fn unary(&self, op: UnaryOp) -> Traced {
        self.apply(Op::Unary(op), &[self])
    }

    // ---- pointwise ----------------------------------------------------------------------------
    #[track_caller]
    pub fn add<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Add, other)
    }
    #[track_caller]
    pub fn sub<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Sub, other)
    }
    #[track_caller]
    pub fn mul<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Mul, other)
    }
    #[track_caller]
    pub fn div<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Div, other)
    }
    #[track_caller]
    pub fn pow<'a>(&self, exponent: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Pow, exponent)
    }
    #[track_caller]
    pub fn maximum<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Maximum, other)
    }
    #[track_caller]
    pub fn minimum<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.binary(BinaryOp::Minimum, other)
    }
    #[track_caller]
    pub fn gt<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Gt, other)
    }
    #[track_caller]
    pub fn ge<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Ge, other)
    }
    #[track_caller]
    pub fn lt<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Lt, other)
    }
    #[track_caller]
    pub fn le<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Le, other)
    }
    #[track_caller]
    pub fn eq<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Eq, other)
    }
    #[track_caller]
    pub fn ne<'a>(&self, other: impl Into<Operand<'a>>) -> Traced {
        self.compare(CompareOp::Ne, other)
    }
    #[track_caller]
    pub fn neg(&self) -> Traced {
        self.unary(UnaryOp::Neg)
    }
    #[track_caller]
    pub fn abs(&self) -> Traced {
        self.unary(UnaryOp::Abs)
    }
    #[track_caller]
    pub fn exp(&self) -> Traced {
        self.unary(UnaryOp::Exp)
    }
    #[track_caller]
    pub fn log(&self) -> Traced {
        self.unary(UnaryOp::Log)
    }
    #[track_caller]
    pub fn sqrt(&self) -> Traced {
        self.unary(UnaryOp::Sqrt)
    }
    #[track_caller]
    pub fn rsqrt(&self) -> Traced {
        self.unary(UnaryOp::Rsqrt)
    }
    #[track_caller]
    pub fn sin(&self) -> Traced {
        self.unary(UnaryOp::Sin)
    }
    #[track_caller]
    pub fn cos(&self) -> Traced {
        self.unary(UnaryOp::Cos)
    }
    #[track_caller]
    pub fn tanh(&self) -> Traced {
        self.unary(UnaryOp::Tanh)
    }
    #[track_caller]
    pub fn erf(&self) -> Traced {
        self.unary(UnaryOp::Erf)
    }
    #[track_caller]
    pub fn sigmoid(&self) -> Traced {
        self.unary(UnaryOp::Sigmoid)
    }
    #[track_caller]
    pub fn reciprocal(&self) -> Traced {
        self.apply(Op::Reciprocal, &[self])
    }
    #[track_caller]
    pub fn relu(&self) -> Traced {
        self.apply(Op::Relu, &[self])
    }
    #[track_caller]
    pub fn silu(&self) -> Traced {
        self.apply(Op::Silu, &[self])
    }
    /// GELU, erf form (PyTorch's default).
    #[track_caller]
    pub fn gelu(&self) -> Traced {
        self.apply(Op::Gelu { tanh: false }, &[self])
    }
    /// GELU, tanh approximation (`approximate='tanh'`).
    #[track_caller]
    pub fn gelu_tanh(&self) -> Traced {
        self.apply(Op::Gelu { tanh: true }, &[self])
    }
    #[track_caller]
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Traced {
        self.apply(Op::Clamp { min, max }, &[self])
    }
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Traced {
        self.apply(Op::Cast { dtype }, &[self])
    }
    /// `torch.where(self, a, b)`: `self` is the bool condition.
    #[track_caller]
    pub fn where_<'a, 'b>(&self, a: impl Into<Operand<'a>>, b: impl Into<Operand<'b>>) -> Traced {
        let (a, b) = (a.into(), b.into());
        let like = match (&a, &b) {
            (Operand::Tensor(t), _) | (_, Operand::Tensor(t)) => (*t).clone(),
            _ => self.constant_like(0.0).cast(DType::F32),
        };
        let (a, b) = (like.operand(a), like.operand(b));
        self.apply(Op::Where, &[self, &a, &b])
    }

    // ---- reductions ---------------------------------------------------------------------------
    #[track_caller]
    fn axes(&self, op: &str, dims: &[isize]) -> Result<Vec<usize>, Traced> {
        let rank = self.rank();
        let mut axes = Vec::new();
        for &d in dims {
            match normalize_dim(d, rank) {
                Ok(a) if rank > 0 => axes.push(a),
                Ok(_) => {}
                Err(m) => return Err(self.fail_msg(op, m)),
            }
        }
        axes.sort_unstable();
        if axes.windows(2).any(|w| w[0] == w[1]) {
            return Err(self.fail_msg(op, format!("dims {dims:?} repeat a dimension")));
        }
        Ok(axes)
    }

    #[track_caller]
    fn reduce(&self, op: ReduceOp, dims: &[isize], keepdim: bool) -> Traced {
        match self.axes("reduce", dims) {
            Ok(axes) => self.apply(Op::Reduce { op, axes, keepdim }, &[self]),
            Err(t) => t,
        }
    }

    /// Sum over `dims` (an empty list sums every dim, like `x.sum()`).
    #[track_caller]
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Traced {
        self.reduce(ReduceOp::Sum, &self.dims_or_all(dims), keepdim)
    }
    #[track_caller]
    pub fn amax(&self, dims: &[isize], keepdim: bool) -> Traced {
        self.reduce(ReduceOp::Max, &self.dims_or_all(dims), keepdim)
    }
    #[track_caller]
    pub fn amin(&self, dims: &[isize], keepdim: bool) -> Traced {
        self.reduce(ReduceOp::Min, &self.dims_or_all(dims), keepdim)
    }
    #[track_caller]
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Traced {
        match self.axes("mean", &self.dims_or_all(dims)) {
            Ok(axes) => self.apply(Op::Mean { axes, keepdim }, &[self]),
            Err(t) => t,
        }
    }
    /// Variance; `unbiased` selects Bessel's correction (PyTorch's default is `true`).
    #[track_caller]
    pub fn var(&self, dims: &[isize], unbiased: bool, keepdim: bool) -> Traced {
        match self.axes("var", &self.dims_or_all(dims)) {
            Ok(axes) => self.apply(
                Op::Var {
                    axes,
                    correction: unbiased as usize,
                    keepdim,
                },
                &[self],
            ),
            Err(t) => t,
        }
    }

    fn dims_or_all(&self, dims: &[isize]) -> Vec<isize> {
        if dims.is_empty() {
            (0..self.rank() as isize).collect()
        } else {
            dims.to_vec()
        }
    }

    #[track_caller]
    pub fn softmax(&self, dim: isize) -> Traced {
        match normalize_dim(dim, self.rank()) {
            Ok(dim) => self.apply(Op::Softmax { dim }, &[self]),
            Err(m) => self.fail_msg("softmax", m),
        }
    }
    #[track_caller]
    pub fn log_softmax(&self, dim: isize) -> Traced {
        match normalize_dim(dim, self.rank()) {
            Ok(dim) => self.apply(Op::LogSoftmax { dim }, &[self]),
            Err(m) => self.fail_msg("log_softmax", m),
        }
    }
    /// `F.layer_norm(x, normalized_shape, weight, bias, eps)`.
    #[track_caller]
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Traced>,
        bias: Option<&Traced>,
        eps: f64,
    ) -> Traced {
        let location = Location::caller();
        let dims = self.ir_dims();
        let k = normalized_shape.len();
        // Only the normalized dims are read as numbers (a symbolic one is specialized).
        let matches = k > 0
            && k <= dims.len()
            && dims[dims.len() - k..]
                .iter()
                .zip(normalized_shape)
                .all(|(d, &n)| match d {
                    Dim::Static(m) => *m == n,
                    Dim::Sym(s) => self.size_of_symbol(*s, "layer_norm", location) == n,
                });
        if !matches {
            return self.fail_msg(
                "layer_norm",
                format!(
                    "normalized_shape {normalized_shape:?} does not match the trailing dims of {}",
                    shape_string(&dims)
                ),
            );
        }
        let op = Op::LayerNorm {
            normalized_rank: k,
            eps,
            has_weight: weight.is_some(),
            has_bias: bias.is_some(),
        };
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        self.apply(op, &inputs)
    }

    // ---- matrix products ----------------------------------------------------------------------
    /// `torch.matmul`: 1-d operands, batch broadcasting.
    #[track_caller]
    pub fn matmul(&self, other: &Traced) -> Traced {
        self.apply(Op::Matmul, &[self, other])
    }
    /// `torch.bmm`: both operands rank 3 with equal batch.
    #[track_caller]
    pub fn bmm(&self, other: &Traced) -> Traced {
        let (a, b) = (self.ir_dims(), other.ir_dims());
        if a.len() != 3 || b.len() != 3 || a[0] != b[0] {
            return self.fail_msg(
                "bmm",
                format!(
                    "expected [b, n, m] and [b, m, p], found {} and {}",
                    shape_string(&a),
                    shape_string(&b)
                ),
            );
        }
        self.matmul(other)
    }
    /// `F.linear(x, weight, bias)`: `x @ weight^T + bias`.
    #[track_caller]
    pub fn linear(&self, weight: &Traced, bias: Option<&Traced>) -> Traced {
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        self.apply(
            Op::Linear {
                has_bias: bias.is_some(),
            },
            &inputs,
        )
    }

    // ---- views and data movement --------------------------------------------------------------
    #[track_caller]
    pub fn permute(&self, dims: &[isize]) -> Traced {
        let rank = self.rank();
        let perm: Result<Vec<usize>, String> =
            dims.iter().map(|&d| normalize_dim(d, rank)).collect();
        match perm {
            Ok(perm) => self.apply(Op::Permute { perm }, &[self]),
            Err(m) => self.fail_msg("permute", m),
        }
    }
    #[track_caller]
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Traced {
        let rank = self.rank();
        match (normalize_dim(dim0, rank), normalize_dim(dim1, rank)) {
            (Ok(a), Ok(b)) => {
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(a, b);
                self.apply(Op::Permute { perm }, &[self])
            }
            (Err(m), _) | (_, Err(m)) => self.fail_msg("transpose", m),
        }
    }
    /// `reshape` with at most one `-1`.
    #[track_caller]
    pub fn reshape(&self, shape: &[isize]) -> Traced {
        let dims = self.ir_dims();
        let known = shape
            .iter()
            .filter(|&&d| d >= 0)
            .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize));
        let Some(known) = known else {
            return self.fail_msg(
                "reshape",
                format!("the sizes {shape:?} multiply past usize::MAX"),
            );
        };
        let holes = shape.iter().filter(|&&d| d == -1).count();
        // With one symbolic dim `s` and static rest `p`, a `-1` that stands for exactly `s`
        // (the known sizes multiply to `p`) stays symbolic; any other reshape of a symbolic
        // shape reads the sizes as numbers, which specializes them.
        let symbols: Vec<Dim> = dims
            .iter()
            .copied()
            .filter(|d| d.as_static().is_none())
            .collect();
        let static_product: usize = dims.iter().filter_map(|d| d.as_static()).product();
        if holes > 1 || shape.iter().any(|&d| d < -1) {
            return self.fail_msg(
                "reshape",
                format!("cannot reshape {} to {shape:?}", shape_string(&dims)),
            );
        }
        // With symbolic dims, a `-1` stands for the element count divided by the known sizes
        // when that division is exact as a polynomial (`[2, s0, 8]` to `[-1, 8]` gives `2*s0`,
        // and back, `[2, -1, 8]` gives `s0`): the products agree for every size.
        let symbolic_hole = (!symbols.is_empty() && holes == 1 && known > 0)
            .then(|| SizeExpr::product(&dims).divide_exactly(known as i64))
            .flatten()
            .and_then(|e| Dim::of_expr(&e));
        let hole = if symbols.len() == 1 && holes == 1 && known == static_product {
            symbols[0]
        } else if let Some(hole) = symbolic_hole {
            hole
        } else {
            let numel: usize = self.shape().iter().product();
            if holes == 1 && (known == 0 || !numel.is_multiple_of(known)) {
                return self.fail_msg(
                    "reshape",
                    format!("cannot reshape {} to {shape:?}", shape_string(&dims)),
                );
            }
            Dim::Static(if holes == 1 { numel / known } else { 0 })
        };
        let sizes: Shape = shape
            .iter()
            .map(|&d| {
                if d == -1 {
                    hole
                } else {
                    Dim::Static(d as usize)
                }
            })
            .collect();
        self.apply(Op::Reshape { shape: sizes }, &[self])
    }
    /// A reshape to IR dims (the type rule checks that the element counts agree as
    /// polynomials), for shape rules that keep symbols symbolic.
    #[track_caller]
    pub(crate) fn reshape_dims(&self, shape: Shape) -> Traced {
        self.apply(Op::Reshape { shape }, &[self])
    }
    /// An expand to IR dims, for shape rules that keep symbols symbolic.
    #[track_caller]
    pub(crate) fn expand_dims(&self, shape: Shape) -> Traced {
        self.apply(Op::Expand { shape }, &[self])
    }
    /// `expand`; `-1` keeps a dimension's size.
    #[track_caller]
    pub fn expand(&self, shape: &[isize]) -> Traced {
        let own = self.ir_dims();
        let lead = shape.len().saturating_sub(own.len());
        let sizes: Shape = shape
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if d < 0 && i >= lead {
                    own[i - lead]
                } else {
                    Dim::Static(d.max(0) as usize)
                }
            })
            .collect();
        self.apply(Op::Expand { shape: sizes }, &[self])
    }
    /// `x[..., start:end:step, ...]` along `dim` with Python's clamping of negative/oversized bounds;
    /// `None` bounds mean the whole range.
    #[track_caller]
    pub fn slice(
        &self,
        dim: isize,
        start: Option<isize>,
        end: Option<isize>,
        step: usize,
    ) -> Traced {
        let location = Location::caller();
        let dims = self.ir_dims();
        let dim = match normalize_dim(dim, dims.len()) {
            Ok(d) if !dims.is_empty() => d,
            Ok(_) => return self.fail_msg("slice", "cannot slice a 0-d tensor".into()),
            Err(m) => return self.fail_msg("slice", m),
        };
        if step == 0 {
            return self.fail_msg("slice", "step must be positive".into());
        }
        // A slice of a symbolic dim whose bounds both count from its end, within the elements
        // every size of the dim has (an input symbol at least 2: `jit` guards sizes >= 2),
        // keeps the dim symbolic: `x[:, -1:]` has a static size and the offset `s0 - 1`.
        let least = least_size(dims[dim]) as isize;
        if let (Dim::Sym(_), Some(s)) = (dims[dim], start) {
            let e = end.unwrap_or(0);
            if (-least..0).contains(&s) && (s..=0).contains(&e) && (end.is_none() || e < 0) {
                return self.apply(
                    Op::Slice {
                        dim,
                        start: s.unsigned_abs(),
                        end: e.unsigned_abs(),
                        step,
                        from: SliceFrom::End,
                    },
                    &[self],
                );
            }
        }
        // A start counted from the start and an end from the end (`x[:, 1:]`, `x[:, 1:-1]`)
        // that leave at least 0 elements of every size keep the dim symbolic: its size is the
        // derived `s0 - 1` (`s0 - 2`).
        if let Dim::Sym(_) = dims[dim] {
            let a = start.unwrap_or(0);
            let e = end.unwrap_or(0);
            if step == 1 && a >= 0 && e <= 0 && a - e <= least {
                if a == 0 && e == 0 {
                    return self.clone();
                }
                return self.apply(
                    Op::Slice {
                        dim,
                        start: a.unsigned_abs(),
                        end: e.unsigned_abs(),
                        step,
                        from: SliceFrom::StartToEnd,
                    },
                    &[self],
                );
            }
        }
        // Only the sliced dim is read as a number (a symbolic one is specialized).
        let size = match dims[dim] {
            Dim::Static(n) => n,
            Dim::Sym(s) => self.size_of_symbol(s, "slice", location),
        } as isize;
        let clamp = |v: isize| (if v < 0 { v + size } else { v }).clamp(0, size) as usize;
        let start = start.map_or(0, clamp);
        let end = end.map_or(size as usize, clamp).max(start);
        self.apply(
            Op::Slice {
                dim,
                start,
                end,
                step,
                from: SliceFrom::Start,
            },
            &[self],
        )
    }
    /// `torch.cat(tensors, dim)`.
    #[track_caller]
    pub fn cat(tensors: &[&Traced], dim: isize) -> Traced {
        let Some(first) = tensors.first() else {
            // No operand means no tracer to record the error in: the result is a poisoned value
            // of a tracer of its own that holds the error, which `Tracer::finish` reports.
            return Traced::detached_error(
                Location::caller(),
                IrError::ty("cat", "needs at least one tensor, got none"),
            );
        };
        match normalize_dim(dim, first.rank()) {
            Ok(dim) => first.apply(Op::Cat { dim }, tensors),
            Err(m) => first.fail_msg("cat", m),
        }
    }
    /// `F.embedding(self, table)`: rows of `table` picked by the i64 indices in `self`.
    #[track_caller]
    pub fn embedding(&self, table: &Traced) -> Traced {
        self.apply(Op::Gather, &[table, self])
    }
}

impl fmt::Debug for Traced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.id, self.ty()) {
            (Some(id), Some(ty)) => write!(f, "Traced({id}: {ty})"),
            _ => f.write_str("Traced(<poisoned>)"),
        }
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl std::ops::$trait<&Traced> for &Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: &Traced) -> Traced {
                self.binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<Traced> for Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: Traced) -> Traced {
                (&self).binary(BinaryOp::$op, &rhs)
            }
        }
        impl std::ops::$trait<&Traced> for Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: &Traced) -> Traced {
                (&self).binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<Traced> for &Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: Traced) -> Traced {
                self.binary(BinaryOp::$op, &rhs)
            }
        }
        impl std::ops::$trait<f64> for &Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: f64) -> Traced {
                self.binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<f64> for Traced {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: f64) -> Traced {
                (&self).binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<&Traced> for f64 {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: &Traced) -> Traced {
                rhs.constant_like(self).binary(BinaryOp::$op, rhs)
            }
        }
        impl std::ops::$trait<Traced> for f64 {
            type Output = Traced;
            #[track_caller]
            fn $method(self, rhs: Traced) -> Traced {
                rhs.constant_like(self).binary(BinaryOp::$op, &rhs)
            }
        }
    };
}
operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl std::ops::Neg for &Traced {
    type Output = Traced;
    #[track_caller]
    fn neg(self) -> Traced {
        self.unary(UnaryOp::Neg)
    }
}

impl std::ops::Neg for Traced {
    type Output = Traced;
    #[track_caller]
    fn neg(self) -> Traced {
        self.unary(UnaryOp::Neg)
    }
}
