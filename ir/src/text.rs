//! Reading the IR text formats back: a [`ParseError`] that names the line, and a small
//! [`Cursor`] over one line that the graph parser (here) and the kernel-program parser
//! (`minductor_kernel_ir`) share.
//!
//! The formats are the `Display` output of the IRs; a parser accepts exactly what the printer
//! writes (print → parse → print is the identity), and anything else is a `ParseError`, never a
//! panic.

use crate::{DType, Dim, SizeExpr, SymId};
use thiserror::Error;

/// Why a text does not parse: the 1-based line and what was expected there.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl ParseError {
    pub fn new(line: usize, message: impl Into<String>) -> Self {
        ParseError {
            line,
            message: message.into(),
        }
    }
}

/// A position in one line of text. Every method either consumes what it expects or returns an
/// error naming the line, what it expected and what it found.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    rest: &'a str,
    line: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `text`, which is line `line` (1-based) of its document.
    pub fn new(text: &'a str, line: usize) -> Self {
        Cursor { rest: text, line }
    }

    /// What is left of the line.
    pub fn rest(&self) -> &'a str {
        self.rest
    }

    pub fn line(&self) -> usize {
        self.line
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// An error at this line: `expected …, found …`.
    pub fn error(&self, expected: &str) -> ParseError {
        let found: String = self.rest.chars().take(40).collect();
        let found = if found.is_empty() {
            "the end of the line".to_string()
        } else {
            format!("`{found}`")
        };
        ParseError::new(self.line, format!("expected {expected}, found {found}"))
    }

    /// Consumes `token` if the text continues with it.
    pub fn try_eat(&mut self, token: &str) -> bool {
        match self.rest.strip_prefix(token) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    /// Consumes `token` or fails.
    pub fn eat(&mut self, token: &str) -> Result<(), ParseError> {
        if self.try_eat(token) {
            Ok(())
        } else {
            Err(self.error(&format!("`{token}`")))
        }
    }

    /// Fails unless the whole line has been consumed.
    pub fn end(&self) -> Result<(), ParseError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.error("the end of the line"))
        }
    }

    /// Consumes and returns everything up to the first `token` (which is consumed too).
    pub fn until(&mut self, token: &str) -> Result<&'a str, ParseError> {
        match self.rest.find(token) {
            Some(at) => {
                let taken = &self.rest[..at];
                self.rest = &self.rest[at + token.len()..];
                Ok(taken)
            }
            None => Err(self.error(&format!("`{token}`"))),
        }
    }

    /// Consumes the longest prefix of characters satisfying `keep`.
    pub fn take_while(&mut self, keep: impl Fn(char) -> bool) -> &'a str {
        let end = self
            .rest
            .char_indices()
            .find(|&(_, c)| !keep(c))
            .map_or(self.rest.len(), |(i, _)| i);
        let taken = &self.rest[..end];
        self.rest = &self.rest[end..];
        taken
    }

    /// A word of letters, digits, `_` and `.` (op names, dtypes, kernel names).
    pub fn word(&mut self) -> Result<&'a str, ParseError> {
        let w = self.take_while(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        if w.is_empty() {
            Err(self.error("a name"))
        } else {
            Ok(w)
        }
    }

    /// An unsigned decimal number.
    pub fn usize(&mut self) -> Result<usize, ParseError> {
        let save = self.clone();
        let digits = self.take_while(|c| c.is_ascii_digit());
        digits.parse().map_err(|_| save.error("a number"))
    }

    /// A `u32` (ids).
    pub fn u32(&mut self) -> Result<u32, ParseError> {
        let save = self.clone();
        let digits = self.take_while(|c| c.is_ascii_digit());
        digits.parse().map_err(|_| save.error("a 32-bit number"))
    }

    /// A signed decimal number.
    pub fn i64(&mut self) -> Result<i64, ParseError> {
        let save = self.clone();
        let negative = self.try_eat("-");
        let digits = self.take_while(|c| c.is_ascii_digit());
        let text = if negative {
            format!("-{digits}")
        } else {
            digits.to_string()
        };
        text.parse().map_err(|_| save.error("an integer"))
    }

    /// A floating-point number as Rust's `{:?}` or `{:e}` prints an `f64` (`1.0`, `-inf`,
    /// `NaN`, `1e-5`), up to the next `stop` character or the end of the line.
    pub fn f64(&mut self, stop: &[char]) -> Result<f64, ParseError> {
        let save = self.clone();
        let text = self.take_while(|c| !stop.contains(&c));
        text.parse().map_err(|_| save.error("a number"))
    }

    /// `true` or `false`.
    pub fn bool(&mut self) -> Result<bool, ParseError> {
        if self.try_eat("true") {
            Ok(true)
        } else if self.try_eat("false") {
            Ok(false)
        } else {
            Err(self.error("`true` or `false`"))
        }
    }

    /// A dtype in its short spelling (`f32`, `i64`, `bool`, …).
    pub fn dtype(&mut self) -> Result<DType, ParseError> {
        let save = self.clone();
        let w = self.take_while(|c| c.is_ascii_alphanumeric());
        match w {
            "f64" | "f32" | "f16" | "bf16" | "i64" | "bool" => {
                Ok(DType::parse(w).expect("a short dtype name"))
            }
            _ => Err(save.error("a dtype")),
        }
    }

    /// A dim as `Display` prints it: `8`, `s0`, or a derived symbol's definition (`s0 + 1`,
    /// `2*s0`).
    pub fn dim(&mut self) -> Result<Dim, ParseError> {
        let save = self.clone();
        let expr = SizeExpr::parse(self)?;
        Dim::of_expr(&expr).ok_or_else(|| save.error("a size that is not negative"))
    }

    /// A dim as `Debug` prints it: `Static(8)` or `Sym(SymId(0))`.
    pub fn dim_debug(&mut self) -> Result<Dim, ParseError> {
        if self.try_eat("Static(") {
            let n = self.usize()?;
            self.eat(")")?;
            Ok(Dim::Static(n))
        } else {
            self.eat("Sym(SymId(")?;
            // An input symbol prints as its number, a derived one as its definition.
            let save = self.clone();
            let s = match SizeExpr::parse(self)? {
                SizeExpr::Const(n) => {
                    SymId(u32::try_from(n).map_err(|_| save.error("a symbol number"))?)
                }
                e => SymId::derive(&e),
            };
            self.eat("))")?;
            Ok(Dim::Sym(s))
        }
    }

    /// `[item, item, …]`, each item read by `item`.
    pub fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        self.eat("[")?;
        let mut out = Vec::new();
        if self.try_eat("]") {
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            if self.try_eat("]") {
                return Ok(out);
            }
            self.eat(", ")?;
        }
    }

    /// A shape as `Display` prints it: `[4, s0, 8]`.
    pub fn dims(&mut self) -> Result<Vec<Dim>, ParseError> {
        self.list(|c| c.dim())
    }

    /// A tensor type as `Display` prints it: `f32[4, s0]`.
    pub fn tensor_type(&mut self) -> Result<crate::TensorType, ParseError> {
        let dtype = self.dtype()?;
        let shape = self.dims()?;
        Ok(crate::TensorType::new(dtype, shape.into()))
    }
}
