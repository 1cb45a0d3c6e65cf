//! Tracing ops with PyTorch's names and semantics built on `arange` (the `iota` prim) and the
//! rest of the op set: `arange` with a start and step, `triu`/`tril`, `argmax`/`argmin`,
//! `max`/`min` along a dim with indices, `cumsum` and `repeat_interleave`.
//!
//! How they compute, so that they decompose, differentiate and fuse like the ops they are made
//! of:
//! - `triu`/`tril` compare a row and a column `arange` (recomputed from the loop index inside the
//!   kernel that reads the mask; no mask buffer).
//! - `argmax(x, d)` is `amin(where(x == amax(x, d), arange, n), d)` (NaN positions count as the
//!   maximum, as in PyTorch): two reduction stages of one kernel over each row, the first index
//!   of the extreme value winning, as PyTorch's. Indices are computed in f32 (exact up to 2^24);
//!   over a longer dim they are i64, and the i64 minimum runs as a fallback step (the reference
//!   interpreter inside the compiled program), the rest staying compiled.
//! - `cumsum(x, d)` is the `cumsum` prim (an i64 one runs as a fallback step): a kernel whose scan stage walks `d` one element at a
//!   time with the running sum in a register (its operand's pointwise producers inlined), the
//!   other dims being its outer loops (split across threads). Its derivative is the reverse
//!   running sum, `Σ g − cumsum(g) + g`.
//! - `repeat_interleave` is an expand of an unsqueezed dim, merged.
//!
//! Bad arguments (out-of-range dims, empty dims for arg-reductions, non-float scans) are trace
//! errors naming the op and the sizes.

use crate::trace::{Traced, Tracer};
use minductor_ir::{DType, Op};

/// The longest dim whose positions an arg-reduction computes in f32 (every integer up to 2^24 is
/// exact in f32).
const ARG_REDUCTION_F32_LIMIT: usize = 1 << 24;

fn normalize(dim: isize, rank: usize) -> Option<usize> {
    let d = if dim < 0 { dim + rank as isize } else { dim };
    (d >= 0 && (d as usize) < rank).then_some(d as usize)
}

impl Tracer {
    /// `torch.arange(start, end, step, dtype=dtype)`: `start + i·step` for
    /// `i in 0..ceil((end − start) / step)`.
    #[track_caller]
    pub fn arange_range(&self, start: f64, end: f64, step: f64, dtype: DType) -> Traced {
        let count = (end - start) / step;
        if step == 0.0 || !count.is_finite() || count < 0.0 {
            let t = self.arange(0, dtype);
            return t.fail_msg(
                "arange",
                format!("cannot step from {start} to {end} by {step}"),
            );
        }
        let n = count.ceil() as usize;
        let iota = self.arange(n, dtype);
        let scaled = if step == 1.0 { iota } else { iota * step };
        if start == 0.0 {
            scaled
        } else {
            scaled + start
        }
    }
}

impl Traced {
    /// A 0-d constant of exactly `self`'s dtype (bool included).
    pub(crate) fn zero_of_own_dtype(&self) -> Traced {
        self.tracer()
            .constant(0.0, self.dtype().unwrap_or(DType::F32))
    }

    /// `(col − row)` of the last two dims as an f32 `[rows, cols]` value, and the dims.
    #[track_caller]
    pub(crate) fn diagonal_offsets(&self, op: &str) -> Result<Traced, Traced> {
        if self.rank() < 2 {
            return Err(self.fail_msg(
                op,
                format!("needs at least 2 dims, found {}", self.describe()),
            ));
        }
        // Symbolic rows or columns stay symbolic (the aranges have their dims' lengths).
        let dims = self.dims();
        let (rows, cols) = (dims[dims.len() - 2].clone(), dims[dims.len() - 1].clone());
        let t = self.tracer();
        let row = t.arange_of(rows, DType::F32).reshape(&[-1, 1]);
        let col = t.arange_of(cols, DType::F32);
        Ok(col - row)
    }

    /// `torch.triu(x, diagonal)`: the elements on and above the `diagonal`-th diagonal of the
    /// last two dims, zeros (false) elsewhere.
    #[track_caller]
    pub fn triu(&self, diagonal: i64) -> Traced {
        match self.diagonal_offsets("triu") {
            Ok(offsets) => offsets
                .ge(diagonal as f64)
                .where_(self, &self.zero_of_own_dtype()),
            Err(t) => t,
        }
    }

    /// `torch.tril(x, diagonal)`: the elements on and below the `diagonal`-th diagonal of the
    /// last two dims, zeros (false) elsewhere.
    #[track_caller]
    pub fn tril(&self, diagonal: i64) -> Traced {
        match self.diagonal_offsets("tril") {
            Ok(offsets) => offsets
                .le(diagonal as f64)
                .where_(self, &self.zero_of_own_dtype()),
            Err(t) => t,
        }
    }

    /// The index (i64) of the first maximum (`largest`) or minimum along `dim`.
    #[track_caller]
    fn arg_extreme(&self, op: &str, dim: isize, keepdim: bool, largest: bool) -> Traced {
        let rank = self.rank();
        let Some(d) = normalize(dim, rank) else {
            return self.fail_msg(op, format!("dim {dim} out of range for rank {rank}"));
        };
        // Only the reduced dim is read as a number (other dims may stay symbolic).
        let n = self.size_at(d);
        if n == 0 {
            return self.fail_msg(
                op,
                format!("cannot take {op} over empty dim {d} of {}", self.describe()),
            );
        }
        let x = match self.dtype() {
            Some(t) if t.is_float() => self.clone(),
            Some(DType::Bool) => return self.fail_msg(op, format!("{op} of a bool tensor")),
            _ => self.cast(DType::F32),
        };
        let extreme = if largest {
            x.amax(&[d as isize], true)
        } else {
            x.amin(&[d as isize], true)
        }
        .detach();
        let mut column = vec![1isize; rank];
        column[d] = n as isize;
        // f32 positions are exact up to 2^24 and keep the whole arg-reduction in one compiled
        // kernel; longer dims take i64 positions, whose minimum runs as a fallback step.
        let exact_in_f32 = n <= ARG_REDUCTION_F32_LIMIT;
        let position_dtype = if exact_in_f32 { DType::F32 } else { DType::I64 };
        let positions = self.tracer().arange(n, position_dtype).reshape(&column);
        let candidates = x.eq(&extreme).where_(&positions, n as f64);
        // A NaN is the extreme (PyTorch's arg-reductions propagate NaN).
        let candidates = x.ne(&x).where_(&positions, &candidates);
        let first = candidates.amin(&[d as isize], keepdim);
        if exact_in_f32 {
            first.cast(DType::I64)
        } else {
            first
        }
    }

    /// `x.argmax(dim, keepdim)`: the index of the first maximum along `dim` (i64).
    #[track_caller]
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Traced {
        self.arg_extreme("argmax", dim, keepdim, true)
    }

    /// `x.argmin(dim, keepdim)`: the index of the first minimum along `dim` (i64).
    #[track_caller]
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Traced {
        self.arg_extreme("argmin", dim, keepdim, false)
    }

    /// `x.max(dim, keepdim)`: the maxima along `dim` and their indices (i64).
    #[track_caller]
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> (Traced, Traced) {
        (self.amax(&[dim], keepdim), self.argmax(dim, keepdim))
    }

    /// `x.min(dim, keepdim)`: the minima along `dim` and their indices (i64).
    #[track_caller]
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> (Traced, Traced) {
        (self.amin(&[dim], keepdim), self.argmin(dim, keepdim))
    }

    /// `x.cumsum(dim)`: running sums along `dim` (floating-point or i64 `x`; an i64 scan runs as
    /// a fallback step of compiled code).
    #[track_caller]
    pub fn cumsum(&self, dim: isize) -> Traced {
        let rank = self.rank();
        let Some(d) = normalize(dim, rank) else {
            return self.fail_msg("cumsum", format!("dim {dim} out of range for rank {rank}"));
        };
        let dtype = self.dtype().unwrap_or(DType::F32);
        if dtype == DType::Bool {
            return self.fail_msg(
                "cumsum",
                format!(
                    "needs a numeric tensor, found {} (cast it to i64 first)",
                    self.describe()
                ),
            );
        }
        self.apply(Op::CumSum { dim: d }, &[self])
    }

    /// `x.repeat_interleave(repeats, dim)`: each slice along `dim` repeated `repeats` times in
    /// place (`[a, b]` → `[a, a, b, b]`).
    #[track_caller]
    pub fn repeat_interleave(&self, repeats: usize, dim: isize) -> Traced {
        let rank = self.rank();
        let Some(d) = normalize(dim, rank) else {
            return self.fail_msg(
                "repeat_interleave",
                format!("dim {dim} out of range for rank {rank}"),
            );
        };
        let shape: Vec<isize> = self.shape().iter().map(|&n| n as isize).collect();
        let mut stretched = shape.clone();
        stretched.insert(d + 1, repeats as isize);
        let mut merged = shape.clone();
        merged[d] *= repeats as isize;
        self.unsqueeze(d as isize + 1)
            .expand(&stretched)
            .reshape(&merged)
    }
}
