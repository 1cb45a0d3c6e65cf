//! Reductions and scans: sums and means, extrema and their indices, `any`/`all`, variance,
//! norms, `logsumexp`, `cumsum`, softmax and log-softmax.

use super::{normalize, one, Args, Importer, Value};
use crate::export::error::ImportError;
use crate::trace::Traced;
use minductor_ir::{DType, Op, Shape};

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // reductions and scans
    "aten.sum.dim_IntList",
    "aten.sum.default",
    "aten.mean.dim",
    "aten.mean.default",
    "aten.amax.default",
    "aten.amin.default",
    "aten.max.dim",
    "aten.min.dim",
    "aten.max.default",
    "aten.min.default",
    "aten.argmax.default",
    "aten.argmin.default",
    "aten.any.dim",
    "aten.any.dims",
    "aten.any.default",
    "aten.all.dim",
    "aten.all.default",
    "aten.var.correction",
    "aten.var.dim",
    "aten.std.correction",
    "aten.std.dim",
    "aten.logsumexp.default",
    "aten.var_mean.correction",
    "aten.std_mean.correction",
    "aten.linalg_vector_norm.default",
    "aten.cumsum.default",
    "aten._softmax.default",
    "aten.softmax.int",
    "aten._safe_softmax.default",
    "aten._log_softmax.default",
    "aten.log_softmax.int",
];

impl<'a> Importer<'a> {
    pub(super) fn import_reduction(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            // -- reductions and scans
            "aten.sum.dim_IntList" | "aten.sum.default" | "aten.mean.dim" | "aten.mean.default" => {
                let mut x = self.tensor(args, "self")?;
                if let Some(d) = self.dtype(args, "dtype")? {
                    x = x.cast(d);
                } else if matches!(x.dtype(), Some(DType::Bool)) {
                    x = x.cast(DType::I64);
                }
                let dims = self.reduce_dims(&x, args, "dim")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                one(if op.starts_with("aten.sum") {
                    x.sum(&dims, keepdim)
                } else {
                    x.mean(&dims, keepdim)
                })
            }
            "aten.amax.default" | "aten.amin.default" | "aten.max.default" | "aten.min.default" => {
                let x = self.tensor(args, "self")?;
                let dims = self.reduce_dims(&x, args, "dim")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let x = if x.dtype() == Some(DType::Bool) {
                    x.cast(DType::I64)
                } else {
                    x
                };
                one(if op.contains("max") {
                    x.amax(&dims, keepdim)
                } else {
                    x.amin(&dims, keepdim)
                })
            }
            "aten.max.dim" | "aten.min.dim" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", None)? as isize;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let (v, i) = if op == "aten.max.dim" {
                    x.max_dim(d, keepdim)
                } else {
                    x.min_dim(d, keepdim)
                };
                Ok(vec![Value::Tensor(v), Value::Tensor(i)])
            }
            "aten.argmax.default" | "aten.argmin.default" => {
                let x = self.tensor(args, "self")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let (x, d) = match self.opt_size(args, "dim")? {
                    Some(_) => {
                        let d = self.dim_arg(&x, args, "dim", None)?;
                        (x, d)
                    }
                    None => (x.flatten(0, -1), 0),
                };
                one(if op == "aten.argmax.default" {
                    x.argmax(d as isize, keepdim)
                } else {
                    x.argmin(d as isize, keepdim)
                })
            }
            "aten.any.dim" | "aten.any.dims" | "aten.any.default" | "aten.all.dim"
            | "aten.all.default" => {
                let x = self.tensor(args, "self")?;
                let dims: Vec<isize> = if op.ends_with(".default") {
                    Vec::new()
                } else if op == "aten.any.dims" {
                    self.reduce_dims(&x, args, "dim")?
                } else {
                    vec![self.dim_arg(&x, args, "dim", None)? as isize]
                };
                let keepdim = self.boolean(args, "keepdim", false)?;
                let b = self.as_bool(&x);
                let f = b.where_(
                    &self.tracer.constant(1.0, DType::F32),
                    &self.tracer.constant(0.0, DType::F32),
                );
                one(if op.contains("any") {
                    f.amax(&dims, keepdim).gt(0.0)
                } else {
                    f.amin(&dims, keepdim).gt(0.0)
                })
            }
            "aten.var.correction"
            | "aten.var.dim"
            | "aten.std.correction"
            | "aten.std.dim"
            | "aten.var_mean.correction"
            | "aten.std_mean.correction" => {
                let x = self.tensor(args, "self")?;
                let mut dims = self.reduce_dims(&x, args, "dim")?;
                if dims.is_empty() {
                    dims = (0..x.rank() as isize).collect();
                }
                let keepdim = self.boolean(args, "keepdim", false)?;
                let correction = if op.ends_with(".dim") {
                    if self.boolean(args, "unbiased", true)? {
                        1
                    } else {
                        0
                    }
                } else {
                    self.float(args, "correction", Some(1.0))? as i64
                };
                if !(0..=1).contains(&correction) {
                    return Err(self.error(format!("correction {correction} (0 or 1 supported)")));
                }
                let mut axes: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
                axes.sort_unstable();
                let var = x.apply(
                    Op::Var {
                        axes,
                        correction: correction as usize,
                        keepdim,
                    },
                    &[&x],
                );
                let spread = if op.starts_with("aten.std") {
                    var.sqrt()
                } else {
                    var
                };
                if op.contains("_mean.") {
                    Ok(vec![
                        Value::Tensor(spread),
                        Value::Tensor(x.mean(&dims, keepdim)),
                    ])
                } else {
                    one(spread)
                }
            }
            "aten.linalg_vector_norm.default" => {
                let mut x = self.tensor(args, "self")?;
                if let Some(d) = self.dtype(args, "dtype")? {
                    x = x.cast(d);
                }
                let order = self.float(args, "ord", Some(2.0))?;
                let dims = self.reduce_dims(&x, args, "dim")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let a = x.abs();
                one(if order == 2.0 {
                    (&a * &a).sum(&dims, keepdim).sqrt()
                } else if order == 1.0 {
                    a.sum(&dims, keepdim)
                } else if order == f64::INFINITY {
                    a.amax(&dims, keepdim)
                } else if order == f64::NEG_INFINITY {
                    a.amin(&dims, keepdim)
                } else if order > 0.0 {
                    a.pow(order).sum(&dims, keepdim).pow(1.0 / order)
                } else {
                    return Err(self.error(format!("vector norm of order {order}")));
                })
            }
            "aten.logsumexp.default" => {
                let x = self.tensor(args, "self")?;
                let dims = self.reduce_dims(&x, args, "dim")?;
                let keepdim = self.boolean(args, "keepdim", false)?;
                let s = x.logsumexp(&dims, true);
                one(self.keep_or_drop(s, x.rank(), &dims, keepdim))
            }
            "aten.cumsum.default" => {
                let mut x = self.tensor(args, "self")?;
                if let Some(d) = self.dtype(args, "dtype")? {
                    x = x.cast(d);
                } else if x.dtype() == Some(DType::Bool) {
                    x = x.cast(DType::I64);
                }
                let d = self.dim_arg(&x, args, "dim", None)?;
                one(x.cumsum(d as isize))
            }
            "aten._softmax.default"
            | "aten.softmax.int"
            | "aten._log_softmax.default"
            | "aten.log_softmax.int"
            | "aten._safe_softmax.default" => {
                let mut x = self.tensor(args, "self")?;
                if let Some(d) = self.dtype(args, "dtype")? {
                    x = x.cast(d);
                }
                let d = self.dim_arg(&x, args, "dim", None)? as isize;
                one(if op.contains("log") {
                    x.log_softmax(d)
                } else if op.contains("safe") {
                    // Rows that are all −inf give zeros instead of NaN.
                    let live = x
                        .ne(f64::NEG_INFINITY)
                        .where_(1.0, 0.0)
                        .amax(&[d], true)
                        .gt(0.0);
                    live.where_(&x.softmax(d), 0.0)
                } else {
                    x.softmax(d)
                })
            }
            other => Err(self.no_rule(other)),
        }
    }

    /// Reduction dims (`None` or empty: every dim).
    pub(super) fn reduce_dims(
        &self,
        x: &Traced,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Vec<isize>, ImportError> {
        let dims = self.opt_ints(args, key)?.unwrap_or_default();
        dims.iter()
            .map(|&d| {
                normalize(d, x.rank()).map(|d| d as isize).ok_or_else(|| {
                    self.error(format!("dim {d} out of range for rank {}", x.rank()))
                })
            })
            .collect()
    }

    pub(super) fn keep_or_drop(
        &self,
        reduced: Traced,
        x_rank: usize,
        dims: &[isize],
        keepdim: bool,
    ) -> Traced {
        if keepdim {
            return reduced;
        }
        let all: Vec<usize> = if dims.is_empty() {
            (0..x_rank).collect()
        } else {
            dims.iter().map(|&d| d as usize).collect()
        };
        let kept: Shape = reduced
            .ir_dims()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !all.contains(i))
            .map(|(_, d)| d)
            .collect();
        reduced.reshape_dims(kept)
    }
}
