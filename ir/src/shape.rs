//! Shapes whose dimensions are either known numbers or named symbols.
//!
//! Symbolic dimensions are part of the type from the start so that dynamic shapes never need an
//! IR rewrite: a kernel reads its sizes from runtime arguments whether they are static or not.

use crate::{DType, SizeExpr};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::fmt;
use std::sync::{OnceLock, RwLock};

/// A symbolic size, e.g. `s0`. Its value is bound at call time.
///
/// A symbol is either an *input* symbol, which a graph input's dim binds (`s0`, numbered from
/// 0), or a *derived* one: a size expression over input symbols, such as `s0 + 1` (a `cat` of a
/// KV cache with one new token), `2*s0` (a flatten of `[2, s0, 8]`) or `s0 + -1` (`x[:, 1:]`).
/// Derived symbols are interned by their expression in one process-wide table
/// ([`SymId::derive`]), so two ops deriving the same size get the same symbol and their shapes
/// compare equal, `Dim` stays `Copy`, and no graph or program has to carry a table: a derived
/// symbol prints as its definition (`f32[1, 2, s0 + 1, 8]`) and parses back to the same id in
/// the same process. Its value is the definition evaluated on the input symbols' sizes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SymId(pub u32);

/// Ids at and above this one are derived symbols (indices into [`DERIVED`] plus this base).
const DERIVED_BASE: u32 = 1 << 31;

/// The definitions of derived symbols. Invariant: `exprs[i]` is a polynomial over input symbols
/// only, with at least one symbol, and not a single input symbol with coefficient 1 (that is
/// the input symbol itself); `ids` maps each definition back to its index.
#[derive(Default)]
struct DerivedTable {
    exprs: Vec<SizeExpr>,
    ids: HashMap<SizeExpr, u32>,
}

static DERIVED: OnceLock<RwLock<DerivedTable>> = OnceLock::new();

fn derived_table() -> &'static RwLock<DerivedTable> {
    DERIVED.get_or_init(Default::default)
}

impl SymId {
    /// Whether the symbol is defined by an expression over input symbols.
    pub fn is_derived(self) -> bool {
        self.0 >= DERIVED_BASE
    }

    /// The definition of a derived symbol (over input symbols), `None` for an input symbol.
    pub fn definition(self) -> Option<SizeExpr> {
        if !self.is_derived() {
            return None;
        }
        let table = derived_table().read().unwrap_or_else(|e| e.into_inner());
        let expr = table.exprs.get((self.0 - DERIVED_BASE) as usize);
        Some(
            expr.expect("a derived SymId is only made by SymId::derive")
                .clone(),
        )
    }

    /// The symbol standing for `expr` (a polynomial with at least one symbol): the input symbol
    /// itself if `expr` is one, else the derived symbol interned for it. Derived symbols in
    /// `expr` are expanded first, so definitions only read input symbols.
    pub fn derive(expr: &SizeExpr) -> SymId {
        let expr = expr.expand_derived();
        if let SizeExpr::Poly(terms) = &expr {
            if let [(m, 1)] = terms.as_slice() {
                if let [s] = m.as_slice() {
                    return *s;
                }
            }
        }
        assert!(
            expr.as_const().is_none(),
            "SymId::derive of the constant {expr}: use Dim::of_expr"
        );
        let lock = derived_table();
        if let Some(&i) = lock
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .ids
            .get(&expr)
        {
            return SymId(DERIVED_BASE + i);
        }
        let mut table = lock.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = table.ids.get(&expr) {
            return SymId(DERIVED_BASE + i);
        }
        let i = u32::try_from(table.exprs.len())
            .ok()
            .filter(|&i| i < DERIVED_BASE)
            .expect("fewer than 2^31 derived symbols");
        table.exprs.push(expr.clone());
        table.ids.insert(expr, i);
        SymId(DERIVED_BASE + i)
    }

    /// For a derived symbol defined as `c*x + k` (one input symbol `x`, degree 1, `c > 0`):
    /// `(x, c, k)`.
    fn linear_form(self) -> Option<(SymId, i64, i64)> {
        let terms = self.definition()?.terms();
        let (k, (m, c)) = match terms.as_slice() {
            [t] => (0, t.clone()),
            [(empty, k), t] if empty.is_empty() => (*k, t.clone()),
            _ => return None,
        };
        match m.as_slice() {
            [x] if c > 0 => Some((*x, c, k)),
            _ => None,
        }
    }

    /// The input symbol a dim of this derived size binds, when its definition is `c*x + k`
    /// (see [`SymId::solve`]).
    pub fn solvable_input(self) -> Option<SymId> {
        self.linear_form().map(|(x, _, _)| x)
    }

    /// For a derived symbol defined as `c*x + k`: the input symbol `x` and its size when this
    /// symbol's size is `size`, if that is a whole number at least 0. This is how an input
    /// whose dim is derived (a value carried across a graph break, `[3, s0 + 1, 4]`) binds
    /// `s0`.
    pub fn solve(self, size: usize) -> Option<(SymId, usize)> {
        let (x, c, k) = self.linear_form()?;
        let rest = i128::try_from(size).ok()? - k as i128;
        let c = c as i128;
        if rest < 0 || rest % c != 0 {
            return None;
        }
        Some((x, usize::try_from(rest / c).ok()?))
    }

    /// The input symbols the symbol's value depends on: itself, or those of its definition.
    pub fn inputs(self) -> Vec<SymId> {
        match self.definition() {
            Some(e) => e.symbols(),
            None => vec![self],
        }
    }

    /// The symbol's value, given the sizes of input symbols (`None` if one is unknown, the
    /// value overflows `i128`, or, for a derived symbol, it is negative).
    pub fn eval(self, size: impl Fn(SymId) -> Option<i128>) -> Option<i128> {
        match self.definition() {
            Some(e) => e.eval(size).filter(|&v| v >= 0),
            None => size(self),
        }
    }
}

/// An input symbol prints as `SymId(0)`, a derived one as its definition: `SymId(s0 + 1)`
/// (`Cursor::dim_debug` reads both).
impl fmt::Debug for SymId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.definition() {
            Some(e) => write!(f, "SymId({})", e.as_size()),
            None => write!(f, "SymId({})", self.0),
        }
    }
}

/// One dimension of a shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Static(usize),
    Sym(SymId),
}

impl Dim {
    /// The size if it is known at compile time.
    pub fn as_static(self) -> Option<usize> {
        match self {
            Dim::Static(n) => Some(n),
            Dim::Sym(_) => None,
        }
    }

    /// The dim of size `expr`: static for a number (`None` if it is negative), the symbol
    /// itself for a single input symbol, else a derived symbol ([`SymId::derive`]).
    pub fn of_expr(expr: &SizeExpr) -> Option<Dim> {
        match expr.expand_derived() {
            SizeExpr::Const(n) => usize::try_from(n).ok().map(Dim::Static),
            e => Some(Dim::Sym(SymId::derive(&e))),
        }
    }

    /// The size for the input symbol sizes `size` gives (`None` if one is unknown, or the
    /// value of a derived symbol is negative or overflows).
    pub fn eval(self, size: impl Fn(SymId) -> Option<i128>) -> Option<i128> {
        match self {
            Dim::Static(n) => Some(n as i128),
            Dim::Sym(s) => s.eval(size),
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Static(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Sym(s) => match s.definition() {
                Some(e) => write!(f, "{}", e.as_size()),
                None => write!(f, "s{}", s.0),
            },
        }
    }
}

pub type Shape = SmallVec<[Dim; 4]>;

/// Builds a static shape from sizes.
pub fn static_shape(sizes: &[usize]) -> Shape {
    sizes.iter().map(|&n| Dim::Static(n)).collect()
}

/// The type of a tensor value: element type and shape. Values are always logically contiguous;
/// strides are a matter of the buffers kernels read, not of the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Shape) -> Self {
        TensorType { dtype, shape }
    }

    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Shape::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Sizes of every dimension, if none is symbolic.
    pub fn static_sizes(&self) -> Option<Vec<usize>> {
        self.shape.iter().map(|d| d.as_static()).collect()
    }

    /// Number of elements, if static (and representable: `None` if the product overflows).
    pub fn numel(&self) -> Option<usize> {
        self.static_sizes()
            .and_then(|s| s.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n)))
    }

    /// Bytes of the static dims times the element size: the whole size when every dim is
    /// static, a factor of it otherwise. `None` past [`MAX_TENSOR_BYTES`].
    pub fn static_bytes(&self) -> Option<usize> {
        checked_bytes(
            self.shape.iter().filter_map(|d| d.as_static()),
            self.dtype.size_bytes(),
        )
    }
}

/// The largest byte size of any tensor: what one allocation can hold (`isize::MAX`). Types past
/// it are rejected when they are made (`infer_type`, `Graph::verify`), so products of static
/// sizes of a verified graph cannot overflow.
pub const MAX_TENSOR_BYTES: usize = isize::MAX as usize;

/// `Π sizes · element_bytes`, or `None` if it overflows or exceeds [`MAX_TENSOR_BYTES`].
pub fn checked_bytes(
    sizes: impl IntoIterator<Item = usize>,
    element_bytes: usize,
) -> Option<usize> {
    sizes
        .into_iter()
        .try_fold(element_bytes, |acc, n| acc.checked_mul(n))
        .filter(|&b| b <= MAX_TENSOR_BYTES)
}

/// Checks that the static part of `ty` fits in [`MAX_TENSOR_BYTES`]; the error names `op`.
pub fn check_size(op: &str, ty: &TensorType) -> Result<(), crate::IrError> {
    match ty.static_bytes() {
        Some(_) => Ok(()),
        None => Err(crate::IrError::ty(
            op,
            format!("{ty} holds more than {MAX_TENSOR_BYTES} bytes (its size overflows)"),
        )),
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// NumPy broadcasting of two shapes; `None` when a pair of dimensions is incompatible.
pub fn broadcast_shapes(a: &[Dim], b: &[Dim]) -> Option<Shape> {
    let rank = a.len().max(b.len());
    let mut out = Shape::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            Dim::Static(1)
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            Dim::Static(1)
        };
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (Dim::Static(1), y) => y,
            (x, Dim::Static(1)) => x,
            _ => return None,
        });
    }
    Some(out)
}

/// Why a strided layout fails [`distinct_places`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutFault {
    /// The last dim, of more than one position, has this stride instead of 1.
    ColumnsApart(i128),
    /// A dim of more than one position has this negative stride.
    Negative(i128),
    /// Two positions address one element.
    SharedPlace,
    /// The elements the layout spans do not fit an `i128`.
    Overflow,
}

/// Checks that the layout `strides` of `sizes` (one stride a dim) keeps the last dim's
/// elements contiguous (stride 1, where it has more than one position) and gives every
/// position its own element: with the dims of more than one position sorted by stride (none
/// negative), each stride is past everything the smaller ones reach. Returns how many
/// elements from the first position's the layout spans (0 when it has no positions). The
/// kernel IR's verifier and the kernels that take such a layout at run time both ask this.
pub fn distinct_places(sizes: &[usize], strides: &[i128]) -> Result<i128, LayoutFault> {
    debug_assert_eq!(sizes.len(), strides.len());
    if sizes.contains(&0) {
        return Ok(0);
    }
    if let (Some(&n), Some(&stride)) = (sizes.last(), strides.last()) {
        if n > 1 && stride != 1 {
            return Err(LayoutFault::ColumnsApart(stride));
        }
    }
    let mut dims: Vec<(i128, usize)> = Vec::with_capacity(sizes.len());
    for (&n, &stride) in sizes.iter().zip(strides) {
        if n > 1 {
            if stride < 0 {
                return Err(LayoutFault::Negative(stride));
            }
            dims.push((stride, n));
        }
    }
    dims.sort_unstable();
    // Elements `0..reach` from the first position's are what the dims so far address.
    let mut reach: i128 = 1;
    for (stride, n) in dims {
        if stride < reach {
            return Err(LayoutFault::SharedPlace);
        }
        reach = stride
            .checked_mul(n as i128 - 1)
            .and_then(|span| span.checked_add(reach))
            .ok_or(LayoutFault::Overflow)?;
    }
    Ok(reach)
}

/// Formats a shape as `[a, b, c]` for error messages.
pub fn shape_string(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::Cursor;

    fn s(i: u32) -> SizeExpr {
        SizeExpr::symbol(SymId(i))
    }

    #[test]
    fn derived_symbols_are_interned_by_their_expression() {
        let plus_one = Dim::of_expr(&s(0).plus(&SizeExpr::Const(1))).unwrap();
        let again = Dim::of_expr(&SizeExpr::Const(1).plus(&s(0))).unwrap();
        assert_eq!(plus_one, again);
        assert_ne!(plus_one, Dim::of_expr(&s(0).scale(2)).unwrap());
        assert_eq!(plus_one.to_string(), "s0 + 1");
        // A definition reads input symbols only: `(s0 + 1) + 1` is `s0 + 2`.
        let plus_two = Dim::of_expr(&SizeExpr::of_dim(plus_one).plus(&SizeExpr::Const(1)));
        assert_eq!(plus_two.unwrap().to_string(), "s0 + 2");
        // Numbers are static dims, a lone input symbol is itself, negative sizes are none.
        assert_eq!(Dim::of_expr(&SizeExpr::Const(4)), Some(Dim::Static(4)));
        assert_eq!(Dim::of_expr(&s(3)), Some(Dim::Sym(SymId(3))));
        assert_eq!(Dim::of_expr(&SizeExpr::Const(-1)), None);
        let sizes = |x: SymId| Some([6i128, 3][x.0 as usize]);
        assert_eq!(plus_one.eval(sizes), Some(7));
        let minus = Dim::of_expr(&s(1).plus(&SizeExpr::Const(-4))).unwrap();
        assert_eq!(minus.to_string(), "s1 - 4");
        assert_eq!(minus.eval(sizes), None, "3 - 4 is no size");
    }

    #[test]
    fn derived_dims_print_and_parse_back_in_both_spellings() {
        let dims = [
            Dim::of_expr(&s(0).plus(&SizeExpr::Const(1))).unwrap(),
            Dim::of_expr(&s(0).scale(2).plus(&SizeExpr::Const(-2))).unwrap(),
            Dim::of_expr(&s(0).times(&s(1)).scale(3)).unwrap(),
            Dim::Sym(SymId(2)),
            Dim::Static(5),
        ];
        for d in dims {
            let text = d.to_string();
            let mut c = Cursor::new(&text, 1);
            assert_eq!(c.dim().unwrap(), d, "{text}");
            assert!(c.is_empty(), "{text}");
            let debug = format!("{d:?}");
            let mut c = Cursor::new(&debug, 1);
            assert_eq!(c.dim_debug().unwrap(), d, "{debug}");
            assert!(c.is_empty(), "{debug}");
        }
    }

    #[test]
    fn a_linear_derived_size_solves_for_its_symbol() {
        let d = |e: SizeExpr| match Dim::of_expr(&e).unwrap() {
            Dim::Sym(s) => s,
            Dim::Static(_) => unreachable!("symbolic"),
        };
        assert_eq!(
            d(s(0).plus(&SizeExpr::Const(1))).solve(7),
            Some((SymId(0), 6))
        );
        assert_eq!(d(s(0).scale(2)).solve(8), Some((SymId(0), 4)));
        assert_eq!(d(s(0).scale(2)).solve(7), None);
        assert_eq!(d(s(0).plus(&SizeExpr::Const(3))).solve(2), None);
        assert_eq!(d(s(0).times(&s(1))).solve(6), None);
    }
}
