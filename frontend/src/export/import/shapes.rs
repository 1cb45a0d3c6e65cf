//! Shape helpers shared by the op families: ranges and slices of (possibly symbolic) dims,
//! dropping a dim, static sizes, dim arguments, type promotion and 2-d pairs.

use super::{dims_text, normalize, Args, Importer};
use crate::export::error::ImportError;
use crate::trace::Traced;
use minductor_ir::{DType, Dim, Op, Shape, SizeExpr, SliceFrom};

impl<'a> Importer<'a> {
    /// Elements `start, start + step, ..` (`len` of them) of dim `d` of `x`, by `gather` (for a
    /// symbolic dim, whose static range the IR's slices cannot state).
    pub(super) fn take_range(
        &self,
        x: &Traced,
        d: usize,
        start: usize,
        len: usize,
        step: usize,
    ) -> Traced {
        let rank = x.rank();
        let positions = self.tracer.arange(len, DType::I64);
        let positions = if step == 1 {
            positions
        } else {
            positions * step as f64
        };
        let positions = if start == 0 {
            positions
        } else {
            positions + start as f64
        };
        self.take_along_dim(x, d, &positions, rank)
    }

    /// `x.index_select(d, positions)` for a 1-d i64 `positions`, by a gather along the first dim.
    pub(super) fn take_along_dim(
        &self,
        x: &Traced,
        d: usize,
        positions: &Traced,
        rank: usize,
    ) -> Traced {
        if d == 0 {
            return x.apply(Op::Gather, &[x, positions]);
        }
        let mut perm: Vec<isize> = vec![d as isize];
        perm.extend((0..rank as isize).filter(|&i| i != d as isize));
        let front = x.permute(&perm);
        let gathered = front.apply(Op::Gather, &[&front, positions]);
        // Back: the gathered dim (now 0) returns to `d`.
        let mut back: Vec<isize> = (1..=d as isize).collect();
        back.push(0);
        back.extend(d as isize + 1..rank as isize);
        gathered.permute(&back)
    }

    /// `x[.., start:end:step, ..]` along `dim` with PyTorch's bounds (negative counts from the
    /// end, past-the-end clamps).
    pub(super) fn slice(
        &self,
        x: &Traced,
        dim: i64,
        start: Option<SizeExpr>,
        end: Option<SizeExpr>,
        step: i64,
    ) -> Result<Traced, ImportError> {
        let dims = x.ir_dims();
        let d = self.dim_of(&dims, dim)?;
        if step <= 0 {
            return Err(self.error(format!("step {step} must be positive")));
        }
        let huge = |e: &SizeExpr| e.as_const().is_some_and(|c| c >= i64::MAX / 4);
        let end = end.filter(|e| !huge(e));
        match dims[d] {
            Dim::Static(n)
                if [&start, &end]
                    .iter()
                    .any(|b| b.as_ref().is_some_and(|e| e.as_const().is_none())) =>
            {
                // A static dim sliced to a symbolic bound (`position_ids[:, 0:s0]` of a
                // `[1, 512]` buffer): a gather of the symbolic-length range.
                let size = SizeExpr::Const(n as i64);
                let from_start = |e: Option<SizeExpr>, default: SizeExpr| match e {
                    None => default,
                    Some(e) => match e.as_const() {
                        Some(c) if c < 0 => size.plus(&SizeExpr::Const(c)),
                        Some(c) => SizeExpr::Const(c.min(n as i64)),
                        None => e,
                    },
                };
                let s = from_start(start, SizeExpr::Const(0));
                let e = from_start(end, size.clone());
                self.symbolic_range(x, d, &s, &e, step)
            }
            Dim::Static(n) => {
                let konst =
                    |e: &Option<SizeExpr>, what: &str| -> Result<Option<isize>, ImportError> {
                        match e {
                            None => Ok(None),
                            Some(e) => e
                                .as_const()
                                .map(|c| Some(c.clamp(-(1 << 40), 1 << 40) as isize))
                                .ok_or_else(|| {
                                    self.error(format!(
                                        "{what} {e} of a slice of a static dim of size {n}"
                                    ))
                                }),
                        }
                    };
                Ok(x.slice(
                    d as isize,
                    konst(&start, "start")?,
                    konst(&end, "end")?,
                    step as usize,
                ))
            }
            Dim::Sym(_) => {
                let size = SizeExpr::of_dim(dims[d]);
                let from_start = |e: Option<SizeExpr>, default: SizeExpr| match e {
                    None => default,
                    Some(e) => match e.as_const() {
                        Some(c) if c < 0 => size.plus(&SizeExpr::Const(c)),
                        _ => e,
                    },
                };
                let s = from_start(start, SizeExpr::Const(0));
                let e = from_start(end, size.clone());
                let back = |v: &SizeExpr| size.plus(&v.scale(-1)).as_const();
                if let (Some(a), Some(b)) = (s.as_const(), back(&e)) {
                    if a >= 0 && b >= 0 && step == 1 {
                        if a == 0 && b == 0 {
                            return Ok(x.clone());
                        }
                        return Ok(x.apply(
                            Op::Slice {
                                dim: d,
                                start: a as usize,
                                end: b as usize,
                                step: 1,
                                from: SliceFrom::StartToEnd,
                            },
                            &[x],
                        ));
                    }
                }
                if let (Some(a), Some(b)) = (back(&s), back(&e)) {
                    if a >= b && b >= 0 {
                        return Ok(x.apply(
                            Op::Slice {
                                dim: d,
                                start: a as usize,
                                end: b as usize,
                                step: step as usize,
                                from: SliceFrom::End,
                            },
                            &[x],
                        ));
                    }
                }
                if let (Some(a), Some(b)) = (s.as_const(), e.as_const()) {
                    if 0 <= a && a <= b {
                        let len = ((b - a) as usize).div_ceil(step as usize);
                        return Ok(self.take_range(x, d, a as usize, len, step as usize));
                    }
                }
                self.symbolic_range(x, d, &s, &e, step)
            }
        }
    }

    /// Elements `s..e` (step 1, `s` a number, `e` a size) of dim `d`, by a gather of an `arange`
    /// of the symbolic length `e - s`.
    pub(super) fn symbolic_range(
        &self,
        x: &Traced,
        d: usize,
        s: &SizeExpr,
        e: &SizeExpr,
        step: i64,
    ) -> Result<Traced, ImportError> {
        let length = e.plus(&s.scale(-1));
        let (Some(a), Some(len), 1) = (s.as_const(), Dim::of_expr(&length), step) else {
            return Err(self.error(format!(
                "a slice {s}:{e}:{step} of dim {d} of {} cannot be imported",
                dims_text(&x.ir_dims())
            )));
        };
        if a < 0 {
            return Err(self.error(format!("a slice starting at {a}")));
        }
        let iota = x.apply(
            Op::Iota {
                len,
                dtype: DType::I64,
            },
            &[],
        );
        let positions = if a == 0 { iota } else { iota + a as f64 };
        Ok(self.take_along_dim(x, d, &positions, x.rank()))
    }

    /// `x` without dim `d` (of size 1).
    pub(super) fn drop_dim(&self, x: &Traced, d: usize) -> Traced {
        let mut dims: Shape = x.ir_dims().into_iter().collect();
        dims.remove(d);
        x.reshape_dims(dims)
    }

    pub(super) fn static_size(
        &self,
        x: &Traced,
        d: usize,
        what: &str,
    ) -> Result<usize, ImportError> {
        match x.ir_dims().get(d) {
            Some(Dim::Static(n)) => Ok(*n),
            Some(dim) => Err(self.error(format!(
                "{what} along the symbolic dim {dim} is not supported"
            ))),
            None => Err(self.error(format!("dim {d} out of range"))),
        }
    }

    pub(super) fn dim_arg(
        &self,
        x: &Traced,
        args: &Args<'a>,
        key: &str,
        default: Option<i64>,
    ) -> Result<usize, ImportError> {
        let dim = self.int(args, key, default)?;
        normalize(dim, x.rank())
            .ok_or_else(|| self.error(format!("dim {dim} out of range for rank {}", x.rank())))
    }

    /// `dim` (negative counts from the end) as an index into `dims`, which must not be empty.
    pub(super) fn dim_of(&self, dims: &[Dim], dim: i64) -> Result<usize, ImportError> {
        normalize(dim, dims.len())
            .filter(|_| !dims.is_empty())
            .ok_or_else(|| self.error(format!("dim {dim} out of range for {}", dims_text(dims))))
    }

    /// PyTorch's result dtype of two operands (a float wins, then i64, then bool).
    pub(super) fn promote(&self, tensors: &[Traced]) -> Vec<Traced> {
        let dtypes: Vec<DType> = tensors.iter().filter_map(|t| t.dtype()).collect();
        let target = dtypes
            .iter()
            .copied()
            .find(|d| d.is_float())
            .or_else(|| dtypes.iter().copied().find(|&d| d == DType::I64))
            .unwrap_or(DType::Bool);
        tensors
            .iter()
            .map(|t| {
                if t.dtype() == Some(target) {
                    t.clone()
                } else {
                    t.cast(target)
                }
            })
            .collect()
    }

    pub(super) fn pair(
        &self,
        v: &[i64],
        what: &str,
        default: usize,
    ) -> Result<(usize, usize), ImportError> {
        let bad = || {
            self.error(format!(
                "{what} {v:?} must be one or two non-negative numbers"
            ))
        };
        match v {
            [] => Ok((default, default)),
            [a] if *a >= 0 => Ok((*a as usize, *a as usize)),
            [a, b] if *a >= 0 && *b >= 0 => Ok((*a as usize, *b as usize)),
            _ => Err(bad()),
        }
    }
}
