//! Size expressions: integer polynomials over symbolic sizes, such as `64*s0`, `s0*s0` or
//! `97*s0 + -97`. The stride of a dim of a contiguous buffer whose later dims are symbolic is one
//! (`[s0, s1, 64]` has strides `[64*s1, 64, 1]`), and so is the offset of a slice counted from
//! the end of a symbolic dim. Inductor keeps these as sympy expressions; ours are a sum of
//! monomials, each an integer times a product of symbols, evaluated once per call from the
//! sizes the inputs bind.

use crate::text::{Cursor, ParseError};
use crate::SymId;
use smallvec::SmallVec;
use std::fmt;

/// A product of symbols (sorted, repeats allowed: `s0*s0`); empty for the constant monomial.
pub type Monomial = SmallVec<[SymId; 2]>;

/// `Σ coefficient · monomial`.
///
/// Invariant (every constructor keeps it, so equal polynomials are equal values and hash
/// alike): an expression without symbols is `Const`; a `Poly` holds at least one term with a
/// symbol, its terms sorted by monomial, no two with the same monomial, none with coefficient 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SizeExpr {
    Const(i64),
    Poly(Vec<(Monomial, i64)>),
}

impl Default for SizeExpr {
    fn default() -> Self {
        SizeExpr::Const(0)
    }
}

impl From<i64> for SizeExpr {
    fn from(n: i64) -> Self {
        SizeExpr::Const(n)
    }
}

impl SizeExpr {
    /// The size of symbol `s`: its definition if it is derived, so every expression reads
    /// input symbols only.
    pub fn symbol(s: SymId) -> SizeExpr {
        match s.definition() {
            Some(e) => e,
            None => SizeExpr::Poly(vec![(SmallVec::from_slice(&[s]), 1)]),
        }
    }

    /// The expression with every derived symbol replaced by its definition.
    pub fn expand_derived(&self) -> SizeExpr {
        match self {
            SizeExpr::Poly(terms)
                if terms.iter().any(|(m, _)| m.iter().any(|s| s.is_derived())) =>
            {
                let mut acc = SizeExpr::Const(0);
                for (m, c) in terms {
                    let term = m
                        .iter()
                        .fold(SizeExpr::Const(*c), |p, &s| p.times(&SizeExpr::symbol(s)));
                    acc = acc.plus(&term);
                }
                acc
            }
            _ => self.clone(),
        }
    }

    /// The size of a dim.
    pub fn of_dim(d: crate::Dim) -> SizeExpr {
        match d {
            crate::Dim::Static(n) => SizeExpr::Const(n as i64),
            crate::Dim::Sym(s) => SizeExpr::symbol(s),
        }
    }

    /// The product of the sizes of `dims` (a buffer's element count).
    pub fn product(dims: &[crate::Dim]) -> SizeExpr {
        dims.iter().fold(SizeExpr::Const(1), |acc, &d| {
            acc.times(&SizeExpr::of_dim(d))
        })
    }

    /// Builds the canonical form of `Σ terms`.
    fn normalize(mut terms: Vec<(Monomial, i64)>) -> SizeExpr {
        for (m, _) in &mut terms {
            m.sort();
        }
        terms.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(Monomial, i64)> = Vec::with_capacity(terms.len());
        for (m, c) in terms {
            match out.last_mut() {
                Some(last) if last.0 == m => last.1 += c,
                _ => out.push((m, c)),
            }
        }
        out.retain(|t| t.1 != 0);
        match out.as_slice() {
            [] => SizeExpr::Const(0),
            [(m, c)] if m.is_empty() => SizeExpr::Const(*c),
            _ => SizeExpr::Poly(out),
        }
    }

    /// The terms, the constant one (empty monomial) first if present.
    pub fn terms(&self) -> Vec<(Monomial, i64)> {
        match self {
            SizeExpr::Const(0) => Vec::new(),
            SizeExpr::Const(c) => vec![(Monomial::new(), *c)],
            SizeExpr::Poly(t) => t.clone(),
        }
    }

    /// The number, if the expression has no symbol.
    pub fn as_const(&self) -> Option<i64> {
        match self {
            SizeExpr::Const(c) => Some(*c),
            SizeExpr::Poly(_) => None,
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == SizeExpr::Const(0)
    }

    /// Whether the expression is the number `n`.
    pub fn is(&self, n: i64) -> bool {
        *self == SizeExpr::Const(n)
    }

    /// `self + other`.
    pub fn plus(&self, other: &SizeExpr) -> SizeExpr {
        match (self, other) {
            (SizeExpr::Const(a), SizeExpr::Const(b)) => SizeExpr::Const(a + b),
            _ => {
                let mut t = self.terms();
                t.extend(other.terms());
                SizeExpr::normalize(t)
            }
        }
    }

    /// `self · other`.
    pub fn times(&self, other: &SizeExpr) -> SizeExpr {
        match (self, other) {
            (SizeExpr::Const(a), SizeExpr::Const(b)) => SizeExpr::Const(a * b),
            _ => {
                let mut t = Vec::new();
                for (ma, ca) in self.terms() {
                    for (mb, cb) in other.terms() {
                        let mut m = ma.clone();
                        m.extend_from_slice(&mb);
                        t.push((m, ca * cb));
                    }
                }
                SizeExpr::normalize(t)
            }
        }
    }

    /// `self · k`.
    pub fn scale(&self, k: i64) -> SizeExpr {
        match self {
            SizeExpr::Const(a) => SizeExpr::Const(a * k),
            SizeExpr::Poly(_) => self.times(&SizeExpr::Const(k)),
        }
    }

    /// `self / k` when every coefficient is a multiple of `k` (`None` otherwise, or for 0).
    pub fn divide_exactly(&self, k: i64) -> Option<SizeExpr> {
        if k == 0 {
            return None;
        }
        let terms = self.terms();
        if terms.iter().any(|(_, c)| c % k != 0) {
            return None;
        }
        Some(SizeExpr::normalize(
            terms.into_iter().map(|(m, c)| (m, c / k)).collect(),
        ))
    }

    /// The symbols the expression reads, sorted and unique.
    pub fn symbols(&self) -> Vec<SymId> {
        let mut out: Vec<SymId> = self
            .terms()
            .into_iter()
            .flat_map(|(m, _)| m.into_iter())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The value for the symbol sizes `size` gives (`None` if one is unknown, or on overflow of
    /// `i128`).
    pub fn eval(&self, size: impl Fn(SymId) -> Option<i128>) -> Option<i128> {
        match self {
            SizeExpr::Const(c) => Some(*c as i128),
            SizeExpr::Poly(terms) => {
                let mut acc: i128 = 0;
                for (m, c) in terms {
                    let mut p = *c as i128;
                    for &s in m {
                        p = p.checked_mul(size(s)?)?;
                    }
                    acc = acc.checked_add(p)?;
                }
                Some(acc)
            }
        }
    }

    /// The value as an `i64` (`None` if a symbol is unknown or the value does not fit).
    pub fn eval_i64(&self, size: impl Fn(SymId) -> Option<i128>) -> Option<i64> {
        self.eval(size).and_then(|v| i64::try_from(v).ok())
    }

    /// Whether the expression is a single term (a number, or a number times symbols): it
    /// prints without parentheses as a factor.
    pub fn is_monomial(&self) -> bool {
        match self {
            SizeExpr::Const(_) => true,
            SizeExpr::Poly(t) => t.len() == 1,
        }
    }

    /// Parses the text `Display` prints: terms joined by ` + `, each a product (`*`) of an
    /// optional integer and symbols `sN`.
    pub fn parse(c: &mut Cursor) -> Result<SizeExpr, ParseError> {
        let mut terms = Vec::new();
        let mut sign = 1;
        loop {
            let (m, coefficient) = parse_term(c)?;
            terms.push((m, sign * coefficient));
            let save = c.clone();
            sign = if c.try_eat(" + ") {
                1
            } else if c.try_eat(" - ") {
                -1
            } else {
                break;
            };
            // A ` + ` or ` - ` not followed by a term belongs to the caller.
            if !c
                .rest()
                .starts_with(|ch: char| ch.is_ascii_digit() || ch == '-' || ch == 's')
            {
                *c = save;
                break;
            }
        }
        Ok(SizeExpr::normalize(terms))
    }
}

/// One monomial: `[int][*sN]...` or `sN[*sN]...`.
fn parse_term(c: &mut Cursor) -> Result<(Monomial, i64), ParseError> {
    let mut coefficient = 1i64;
    let mut m = Monomial::new();
    let mut first = true;
    loop {
        if c.rest().starts_with('s') {
            c.eat("s")?;
            m.push(SymId(c.u32()?));
        } else if first {
            coefficient = c.i64()?;
        } else {
            return Err(c.error("a symbol `sN`"));
        }
        first = false;
        let save = c.clone();
        if !c.try_eat("*") {
            break;
        }
        if !c.rest().starts_with('s') {
            *c = save;
            break;
        }
    }
    Ok((m, coefficient))
}

fn write_term(f: &mut fmt::Formatter<'_>, m: &Monomial, c: i64) -> fmt::Result {
    let syms: Vec<String> = m.iter().map(|s| format!("s{}", s.0)).collect();
    match (c, syms.is_empty()) {
        (_, true) => write!(f, "{c}"),
        (1, false) => write!(f, "{}", syms.join("*")),
        (_, false) => write!(f, "{c}*{}", syms.join("*")),
    }
}

/// A size expression as a dim prints it ([`SizeExpr::as_size`]): symbol terms first, the
/// constant last, negative terms subtracted (`s0 + 1`, `2*s0`, `s0 - 1`). `SizeExpr::parse`
/// reads it back.
pub struct AsSize<'a>(&'a SizeExpr);

impl SizeExpr {
    /// The expression printed the way a dim reads (`s0 - 1` rather than `-1 + s0`).
    pub fn as_size(&self) -> AsSize<'_> {
        AsSize(self)
    }
}

impl fmt::Display for AsSize<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut terms = self.0.terms();
        if terms.is_empty() {
            return f.write_str("0");
        }
        // The constant (empty monomial) sorts first; a size reads better with it last.
        let constant_first = terms[0].0.is_empty() && terms.len() > 1;
        terms.rotate_left(usize::from(constant_first));
        for (i, (m, c)) in terms.iter().enumerate() {
            match (i, *c < 0) {
                (0, _) => write_term(f, m, *c)?,
                (_, false) => {
                    f.write_str(" + ")?;
                    write_term(f, m, *c)?
                }
                (_, true) => {
                    f.write_str(" - ")?;
                    write_term(f, m, -*c)?
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for SizeExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeExpr::Const(c) => write!(f, "{c}"),
            SizeExpr::Poly(terms) => {
                for (i, (m, c)) in terms.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" + ")?;
                    }
                    write_term(f, m, *c)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(i: u32) -> SizeExpr {
        SizeExpr::symbol(SymId(i))
    }

    #[test]
    fn arithmetic_is_canonical() {
        let a = s(0).scale(64).plus(&s(1).times(&s(0)));
        let b = s(0).times(&s(1)).plus(&s(0).scale(64));
        assert_eq!(a, b);
        assert_eq!(s(0).scale(3).plus(&s(0).scale(-3)), SizeExpr::Const(0));
        assert_eq!(
            SizeExpr::Const(2).times(&SizeExpr::Const(5)).as_const(),
            Some(10)
        );
        let sq = s(0).times(&s(0));
        assert_eq!(sq.to_string(), "s0*s0");
        let sizes = |x: SymId| Some([7i128, 5][x.0 as usize]);
        assert_eq!(a.eval(sizes), Some(64 * 7 + 35));
        assert_eq!(sq.eval(|_| None), None);
    }

    #[test]
    fn prints_and_parses_back() {
        for e in [
            SizeExpr::Const(-3),
            s(0).scale(64),
            s(0).times(&s(0)),
            s(0).scale(97).plus(&SizeExpr::Const(-97)),
            s(1).times(&s(0)).scale(-2).plus(&s(2)),
        ] {
            let text = e.to_string();
            let mut c = Cursor::new(&text, 1);
            assert_eq!(SizeExpr::parse(&mut c).unwrap(), e, "{text}");
            assert!(c.is_empty(), "{text}");
        }
    }
}
