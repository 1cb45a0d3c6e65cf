//! Data movement by position: advanced indexing, `index_select`, `gather`, `embedding`,
//! `constant_pad_nd`, `tril`/`triu`, `roll`, nearest upsampling and `diff`.

use super::{normalize, one, Args, Importer, Value};
use crate::export::error::ImportError;
use crate::trace::Traced;
use minductor_ir::{DType, Dim, Op, Shape, SizeExpr};

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // shapes and data movement
    "aten.index.Tensor",
    "aten.index_select.default",
    "aten.gather.default",
    "aten.embedding.default",
    "aten.constant_pad_nd.default",
    "aten.tril.default",
    "aten.triu.default",
    "aten.diff.default",
    "aten.roll.default",
    "aten.upsample_nearest2d.default",
    "aten.upsample_nearest2d.vec",
];

impl<'a> Importer<'a> {
    pub(super) fn import_indexing(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            "aten.index.Tensor" => {
                let x = self.tensor(args, "self")?;
                let indices = self.opt_tensors(args, "indices")?;
                one(self.index(&x, &indices)?)
            }
            "aten.index_select.default" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", None)?;
                let index = self.tensor(args, "index")?;
                let index = if index.rank() == 0 {
                    index.reshape(&[1])
                } else {
                    index
                };
                let mut indices: Vec<Option<Traced>> = vec![None; d];
                indices.push(Some(index));
                one(self.index(&x, &indices)?)
            }
            "aten.gather.default" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", None)?;
                let index = self.tensor(args, "index")?;
                one(x.gather(d as isize, &index))
            }
            "aten.embedding.default" => {
                let weight = self.tensor(args, "weight")?;
                let indices = self.tensor(args, "indices")?;
                let indices = if indices.dtype() == Some(DType::I64) {
                    indices
                } else {
                    indices.cast(DType::I64)
                };
                one(indices.embedding(&weight))
            }
            "aten.constant_pad_nd.default" => {
                let x = self.tensor(args, "self")?;
                let pad: Vec<isize> = self
                    .ints(args, "pad", &[])?
                    .iter()
                    .map(|&p| p as isize)
                    .collect();
                let value = self.float(args, "value", Some(0.0))?;
                one(x.pad(&pad, value))
            }
            "aten.tril.default" | "aten.triu.default" => {
                let x = self.tensor(args, "self")?;
                let k = self.int(args, "diagonal", Some(0))?;
                one(if op == "aten.tril.default" {
                    x.tril(k)
                } else {
                    x.triu(k)
                })
            }
            "aten.roll.default" => {
                let x = self.tensor(args, "self")?;
                let shifts = self.ints(args, "shifts", &[])?;
                let dims = self.ints(args, "dims", &[])?;
                let (mut y, flat) = if dims.is_empty() {
                    (x.flatten(0, -1), true)
                } else {
                    (x.clone(), false)
                };
                let dims = if flat { vec![0] } else { dims };
                if shifts.len() != dims.len() {
                    return Err(self.error(format!("shifts {shifts:?} for dims {dims:?}")));
                }
                for (&shift, &dim) in shifts.iter().zip(&dims) {
                    let d = normalize(dim, y.rank())
                        .ok_or_else(|| self.error(format!("dim {dim} out of range")))?;
                    let n = self.static_size(&y, d, "roll")? as i64;
                    if n == 0 {
                        continue;
                    }
                    let s = shift.rem_euclid(n);
                    if s == 0 {
                        continue;
                    }
                    let tail = self.slice(&y, d as i64, Some(SizeExpr::Const(n - s)), None, 1)?;
                    let head = self.slice(&y, d as i64, None, Some(SizeExpr::Const(n - s)), 1)?;
                    y = Traced::cat(&[&tail, &head], d as isize);
                }
                one(if flat {
                    y.reshape_dims(x.ir_dims().into_iter().collect())
                } else {
                    y
                })
            }
            "aten.upsample_nearest2d.default" | "aten.upsample_nearest2d.vec" => {
                let x = self
                    .tensor(args, "self")
                    .or_else(|_| self.tensor(args, "input"))?;
                if x.rank() != 4 {
                    return Err(self.error("upsample_nearest2d needs [N, C, H, W]"));
                }
                let (h, w) = (
                    self.static_size(&x, 2, "upsampling")?,
                    self.static_size(&x, 3, "upsampling")?,
                );
                let out = match self.output_type() {
                    Some(t) => (
                        t.shape.get(2).and_then(|d| d.as_static()),
                        t.shape.get(3).and_then(|d| d.as_static()),
                    ),
                    None => (None, None),
                };
                let (Some(oh), Some(ow)) = out else {
                    return Err(self.error("upsample_nearest2d without a static output size"));
                };
                // PyTorch's nearest index: floor(i * in / out) (scales given: floor(i / scale)).
                let scales: Vec<f64> = match args.find("scale_factors") {
                    Some(a) if a.union()?.0 == "as_floats" => a
                        .union()?
                        .1
                        .array()?
                        .iter()
                        .map(|v| v.float())
                        .collect::<Result<_, _>>()?,
                    _ => {
                        let sh = self.opt_float(args, "scales_h")?;
                        let sw = self.opt_float(args, "scales_w")?;
                        match (sh, sw) {
                            (Some(a), Some(b)) => vec![a, b],
                            _ => Vec::new(),
                        }
                    }
                };
                let ratio = |i: usize, n: usize, o: usize| match scales.get(i) {
                    Some(&s) if s > 0.0 => 1.0 / s,
                    _ => n as f64 / o as f64,
                };
                let mut y = x.clone();
                for (axis, n, o, r) in [(2, h, oh, ratio(0, h, oh)), (3, w, ow, ratio(1, w, ow))] {
                    let positions = (self.tracer.arange(o, DType::F32) * (r as f32 as f64))
                        .cast(DType::I64)
                        .minimum(&self.tracer.constant((n - 1) as f64, DType::I64));
                    y = self.take_along_dim(&y, axis, &positions, 4);
                }
                one(y)
            }
            "aten.diff.default" => {
                let x = self.tensor(args, "self")?;
                let n = self.int(args, "n", Some(1))?;
                let d = self.dim_arg(&x, args, "dim", Some(-1))?;
                let mut pieces = Vec::new();
                if let Some(p) = self.opt_tensor(args, "prepend")? {
                    pieces.push(p);
                }
                pieces.push(x.clone());
                if let Some(a) = self.opt_tensor(args, "append")? {
                    pieces.push(a);
                }
                let mut y = if pieces.len() == 1 {
                    x.clone()
                } else {
                    let pieces = self.promote(&pieces);
                    let refs: Vec<&Traced> = pieces.iter().collect();
                    Traced::cat(&refs, d as isize)
                };
                if y.dtype() == Some(DType::Bool) {
                    return Err(self.error("diff of a bool tensor is not supported"));
                }
                for _ in 0..n.max(0) {
                    let hi = self.slice(&y, d as i64, Some(SizeExpr::Const(1)), None, 1)?;
                    let lo = self.slice(&y, d as i64, None, Some(SizeExpr::Const(-1)), 1)?;
                    y = hi - lo;
                }
                one(y)
            }
            other => Err(self.no_rule(other)),
        }
    }

    /// `x[indices]` (`aten.index.Tensor`): integer index tensors for some dims (broadcast
    /// together), `None` for dims taken whole. The indexed dims are flattened into one and the
    /// broadcast linear position gathers from it (negative positions count from the end).
    pub(super) fn index(
        &self,
        x: &Traced,
        indices: &[Option<Traced>],
    ) -> Result<Traced, ImportError> {
        let rank = x.rank();
        if indices.len() > rank {
            return Err(self.error(format!("{} indices for rank {rank}", indices.len())));
        }
        let positions: Vec<usize> = (0..indices.len())
            .filter(|&i| indices[i].is_some())
            .collect();
        if positions.is_empty() {
            return Ok(x.clone());
        }
        let mut index_tensors = Vec::new();
        for &p in &positions {
            let t = indices[p]
                .clone()
                .expect("positions lists the Some entries");
            match t.dtype() {
                Some(DType::Bool) => {
                    return Err(self.error(
                        "indexing with a bool mask has a data-dependent shape (not supported)",
                    ))
                }
                Some(DType::I64) => index_tensors.push(t),
                _ => index_tensors.push(t.cast(DType::I64)),
            }
        }
        let adjacent = positions.windows(2).all(|w| w[1] == w[0] + 1);
        let mut perm: Vec<isize> = positions.iter().map(|&p| p as isize).collect();
        perm.extend(
            (0..rank)
                .filter(|i| !positions.contains(i))
                .map(|i| i as isize),
        );
        let identity = perm.iter().enumerate().all(|(i, &p)| i as isize == p);
        let front = if identity {
            x.clone()
        } else {
            x.permute(&perm)
        };
        let dims = front.ir_dims();
        let m = positions.len();
        let mut linear: Option<Traced> = None;
        for (j, idx) in index_tensors.iter().enumerate() {
            let size = self.size_tensor(x, dims[j]);
            let wrapped = idx.lt(0.0).where_(&(idx + &size), idx);
            let stride = Dim::of_expr(&SizeExpr::product(&dims[j + 1..m]))
                .ok_or_else(|| self.error("a negative size"))?;
            let term = if stride == Dim::Static(1) {
                wrapped
            } else {
                &wrapped * &self.size_tensor(x, stride)
            };
            linear = Some(match linear {
                None => term,
                Some(l) => l + term,
            });
        }
        let linear = linear.expect("at least one index");
        let flat = if m == 1 {
            front
        } else {
            let merged = Dim::of_expr(&SizeExpr::product(&dims[..m]))
                .ok_or_else(|| self.error("a negative size"))?;
            let shape: Shape = std::iter::once(merged)
                .chain(dims[m..].iter().copied())
                .collect();
            front.reshape_dims(shape)
        };
        let out = flat.apply(Op::Gather, &[&flat, &linear]);
        let p0 = positions[0];
        if adjacent && p0 > 0 {
            // The broadcast index dims take the place of the indexed dims.
            let out_rank = out.rank();
            let nb = out_rank - (rank - m);
            let mut back: Vec<isize> = (nb..nb + p0).map(|i| i as isize).collect();
            back.extend((0..nb).map(|i| i as isize));
            back.extend((nb + p0..out_rank).map(|i| i as isize));
            return Ok(out.permute(&back));
        }
        Ok(out)
    }
}
