//! Shapes and views: `view`/`reshape`, `expand`, `permute`, `squeeze`/`unsqueeze`, `flatten`,
//! slices, `select`, `split`/`chunk`/`unbind`, `cat`/`stack` and `repeat`.

use super::{normalize, one, Args, Importer, Value};
use crate::export::error::ImportError;
use crate::trace::Traced;
use minductor_ir::{Dim, Shape, SizeExpr};

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // shapes and data movement
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    "aten.expand.default",
    "aten.permute.default",
    "aten.transpose.int",
    "aten.t.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze.default",
    "aten.flatten.using_ints",
    "aten.unflatten.int",
    "aten.slice.Tensor",
    "aten.select.int",
    "aten.narrow.default",
    "aten.split.Tensor",
    "aten.split_with_sizes.default",
    "aten.chunk.default",
    "aten.unbind.int",
    "aten.cat.default",
    "aten.stack.default",
    "aten.repeat.default",
];

impl<'a> Importer<'a> {
    pub(super) fn import_view(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            // -- shapes and data movement
            "aten.view.default" | "aten._unsafe_view.default" | "aten.reshape.default" => {
                let x = self.tensor(args, "self")?;
                let key = if args.find("size").is_some() {
                    "size"
                } else {
                    "shape"
                };
                let shape = self.target_shape(&x, args, key)?;
                one(x.reshape_dims(shape))
            }
            "aten.expand.default" => {
                let x = self.tensor(args, "self")?;
                let shape = match self.output_type() {
                    Some(t) => t.shape,
                    None => {
                        let sizes = self.sizes(args, "size")?;
                        let own = x.ir_dims();
                        let lead = sizes.len().saturating_sub(own.len());
                        let mut shape = Shape::new();
                        for (i, e) in sizes.iter().enumerate() {
                            if e.as_const() == Some(-1) && i >= lead {
                                shape.push(own[i - lead]);
                            } else {
                                shape.push(
                                    Dim::of_expr(e)
                                        .ok_or_else(|| self.error(format!("size {e}")))?,
                                );
                            }
                        }
                        shape
                    }
                };
                one(x.expand_dims(shape))
            }
            "aten.permute.default" => {
                let x = self.tensor(args, "self")?;
                let dims: Vec<isize> = self
                    .ints(args, "dims", &[])?
                    .iter()
                    .map(|&d| d as isize)
                    .collect();
                one(x.permute(&dims))
            }
            "aten.transpose.int" => {
                let x = self.tensor(args, "self")?;
                let a = self.int(args, "dim0", None)? as isize;
                let b = self.int(args, "dim1", None)? as isize;
                one(x.transpose(a, b))
            }
            "aten.t.default" => {
                let x = self.tensor(args, "self")?;
                one(if x.rank() < 2 { x } else { x.transpose(0, 1) })
            }
            "aten.unsqueeze.default" => {
                let x = self.tensor(args, "self")?;
                one(x.unsqueeze(self.int(args, "dim", None)? as isize))
            }
            "aten.squeeze.dim" | "aten.squeeze.dims" | "aten.squeeze.default" => {
                let x = self.tensor(args, "self")?;
                let dims: Vec<usize> = match op {
                    "aten.squeeze.default" => (0..x.rank()).collect(),
                    "aten.squeeze.dim" => vec![self.dim_arg(&x, args, "dim", None)?],
                    _ => self
                        .reduce_dims(&x, args, "dim")?
                        .iter()
                        .map(|&d| d as usize)
                        .collect(),
                };
                let kept: Shape = x
                    .ir_dims()
                    .into_iter()
                    .enumerate()
                    .filter(|(i, d)| !(dims.contains(i) && *d == Dim::Static(1)))
                    .map(|(_, d)| d)
                    .collect();
                one(x.reshape_dims(kept))
            }
            "aten.flatten.using_ints" => {
                let x = self.tensor(args, "self")?;
                let s = self.int(args, "start_dim", Some(0))? as isize;
                let e = self.int(args, "end_dim", Some(-1))? as isize;
                one(x.flatten(s, e))
            }
            "aten.unflatten.int" => {
                let x = self.tensor(args, "self")?;
                let shape = self.target_shape(&x, args, "sizes")?;
                one(x.reshape_dims(shape))
            }
            "aten.slice.Tensor" => {
                let x = self.tensor(args, "self")?;
                let dim = self.int(args, "dim", Some(0))?;
                let start = self.opt_size(args, "start")?;
                let end = self.opt_size(args, "end")?;
                let step = self.int(args, "step", Some(1))?;
                one(self.slice(&x, dim, start, end, step)?)
            }
            "aten.select.int" => {
                let x = self.tensor(args, "self")?;
                let dim = self.int(args, "dim", None)?;
                let index = self.int(args, "index", None)?;
                one(self.select(&x, dim, index)?)
            }
            "aten.narrow.default" => {
                let x = self.tensor(args, "self")?;
                let dim = self.int(args, "dim", None)?;
                let start = self.size(&args.get(self, "start")?)?;
                let length = self.size(&args.get(self, "length")?)?;
                let end = start.plus(&length);
                one(self.slice(&x, dim, Some(start), Some(end), 1)?)
            }
            "aten.split.Tensor" | "aten.chunk.default" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", Some(0))?;
                let n = self.static_size(&x, d, "split")?;
                let size = if op == "aten.chunk.default" {
                    let chunks = self.int(args, "chunks", None)?.max(1) as usize;
                    n.div_ceil(chunks).max(1)
                } else {
                    self.int(args, "split_size", None)?.max(1) as usize
                };
                let mut sizes = Vec::new();
                let mut at = 0;
                while at < n || sizes.is_empty() {
                    sizes.push(size.min(n - at));
                    at += size;
                }
                self.split_sizes(&x, d as i64, &sizes)
            }
            "aten.split_with_sizes.default" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", Some(0))?;
                let sizes: Vec<usize> = self
                    .ints(args, "split_sizes", &[])?
                    .iter()
                    .map(|&s| s.max(0) as usize)
                    .collect();
                self.split_sizes(&x, d as i64, &sizes)
            }
            "aten.unbind.int" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", Some(0))?;
                let n = self.static_size(&x, d, "unbind")?;
                (0..n)
                    .map(|i| self.select(&x, d as i64, i as i64).map(Value::Tensor))
                    .collect()
            }
            "aten.cat.default" | "aten.stack.default" => {
                let tensors = self.tensors(args, "tensors")?;
                if tensors.is_empty() {
                    return Err(self.error("cat of no tensors"));
                }
                let tensors = self.promote(&tensors);
                let dim = self.int(args, "dim", Some(0))?;
                if op == "aten.stack.default" {
                    let d = normalize(dim, tensors[0].rank() + 1)
                        .ok_or_else(|| self.error(format!("dim {dim} out of range")))?;
                    let expanded: Vec<Traced> =
                        tensors.iter().map(|t| t.unsqueeze(d as isize)).collect();
                    let refs: Vec<&Traced> = expanded.iter().collect();
                    return one(Traced::cat(&refs, d as isize));
                }
                let refs: Vec<&Traced> = tensors.iter().collect();
                one(Traced::cat(&refs, dim as isize))
            }
            "aten.repeat.default" => {
                let x = self.tensor(args, "self")?;
                let repeats = self.ints(args, "repeats", &[])?;
                if repeats.len() < x.rank() || repeats.iter().any(|&r| r < 0) {
                    return Err(self.error(format!("repeats {repeats:?} for rank {}", x.rank())));
                }
                let mut own: Vec<Dim> = vec![Dim::Static(1); repeats.len() - x.rank()];
                own.extend(x.ir_dims());
                let interleaved: Shape = own.iter().flat_map(|&d| [Dim::Static(1), d]).collect();
                let expanded: Shape = own
                    .iter()
                    .zip(&repeats)
                    .flat_map(|(&d, &r)| [Dim::Static(r as usize), d])
                    .collect();
                let merged: Shape = own
                    .iter()
                    .zip(&repeats)
                    .map(|(&d, &r)| {
                        Dim::of_expr(&SizeExpr::of_dim(d).scale(r)).unwrap_or(Dim::Static(0))
                    })
                    .collect();
                one(x
                    .reshape_dims(interleaved)
                    .expand_dims(expanded)
                    .reshape_dims(merged))
            }
            other => Err(self.no_rule(other)),
        }
    }

    /// `x.select(dim, index)`.
    pub(super) fn select(&self, x: &Traced, dim: i64, index: i64) -> Result<Traced, ImportError> {
        let dims = x.ir_dims();
        let d = self.dim_of(&dims, dim)?;
        let end = if index == -1 {
            None
        } else {
            Some(SizeExpr::Const(index + 1))
        };
        let piece = self.slice(x, d as i64, Some(SizeExpr::Const(index)), end, 1)?;
        Ok(self.drop_dim(&piece, d))
    }

    /// Pieces of `sizes` along `dim`.
    pub(super) fn split_sizes(
        &self,
        x: &Traced,
        dim: i64,
        sizes: &[usize],
    ) -> Result<Vec<Value>, ImportError> {
        let mut out = Vec::new();
        let mut at = 0usize;
        for &n in sizes {
            let piece = self.slice(
                x,
                dim,
                Some(SizeExpr::Const(at as i64)),
                Some(SizeExpr::Const((at + n) as i64)),
                1,
            )?;
            out.push(Value::Tensor(piece));
            at += n;
        }
        Ok(out)
    }

    /// The shape of a view-like node's result: PyTorch's recorded type when it can be read,
    /// else the `size` argument with a `-1` solved from the element count.
    pub(super) fn target_shape(
        &mut self,
        x: &Traced,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Shape, ImportError> {
        if let Some(ty) = self.output_type() {
            return Ok(ty.shape);
        }
        let sizes = self.sizes(args, key)?;
        let known: Vec<&SizeExpr> = sizes.iter().filter(|e| e.as_const() != Some(-1)).collect();
        let mut shape = Shape::new();
        for e in &sizes {
            if e.as_const() == Some(-1) {
                let total = SizeExpr::product(&x.ir_dims());
                let k: Option<i64> = known.iter().map(|e| e.as_const()).product();
                let hole = k
                    .filter(|&k| k > 0)
                    .and_then(|k| {
                        if let Some(c) = total.as_const() {
                            (c % k == 0).then_some(SizeExpr::Const(c / k))
                        } else {
                            total.divide_exactly(k)
                        }
                    })
                    .and_then(|e| Dim::of_expr(&e))
                    .ok_or_else(|| self.error(format!("cannot solve the -1 of {sizes:?}")))?;
                shape.push(hole);
            } else {
                shape.push(
                    Dim::of_expr(e).ok_or_else(|| self.error(format!("size {e} is negative")))?,
                );
            }
        }
        Ok(shape)
    }
}
