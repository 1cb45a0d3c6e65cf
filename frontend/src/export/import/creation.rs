//! Creation: `arange`, `full`/`zeros`/`ones`/`empty` and their `_like` and `new_` forms, `scalar_tensor`.

use super::{one, Args, Importer, Value};
use crate::export::error::ImportError;
use crate::export::json::Json;
use crate::trace::Traced;
use minductor_ir::{DType, Dim, Op, Shape, SizeExpr};

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // creation
    "aten.arange.default",
    "aten.arange.start",
    "aten.arange.start_step",
    "aten.full.default",
    "aten.full_like.default",
    "aten.zeros.default",
    "aten.ones.default",
    "aten.empty.memory_format",
    "aten.zeros_like.default",
    "aten.ones_like.default",
    "aten.empty_like.default",
    "aten.new_ones.default",
    "aten.new_zeros.default",
    "aten.new_full.default",
    "aten.new_empty.default",
    "aten.scalar_tensor.default",
    "aten.fill.Scalar",
    "aten.zero.default",
];

impl<'a> Importer<'a> {
    pub(super) fn import_creation(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            // -- creation
            "aten.arange.default" | "aten.arange.start" | "aten.arange.start_step" => {
                let start = args.find("start");
                let end_arg = args.get(self, "end")?;
                let step_arg = args.find("step");
                let is_int =
                    |a: &Json| matches!(a.union().map(|(k, _)| k), Ok("as_int") | Ok("as_sym_int"));
                let all_int = start.as_ref().is_none_or(is_int)
                    && is_int(&end_arg)
                    && step_arg.as_ref().is_none_or(is_int);
                let dtype = match self.dtype(args, "dtype")? {
                    Some(d) => d,
                    None => match self.output_type() {
                        Some(t) => t.dtype,
                        None if all_int => DType::I64,
                        None => DType::F32,
                    },
                };
                if all_int {
                    let s = match &start {
                        Some(a) => self.size(a)?,
                        None => SizeExpr::Const(0),
                    };
                    let e = self.size(&end_arg)?;
                    let st = match &step_arg {
                        Some(a) => self.size(a)?,
                        None => SizeExpr::Const(1),
                    };
                    let (Some(step), Some(s0)) = (st.as_const(), s.as_const()) else {
                        return Err(self.error("a symbolic start or step of arange"));
                    };
                    if step == 1 {
                        let len = e.plus(&SizeExpr::Const(-s0));
                        let dim = Dim::of_expr(&len).unwrap_or(Dim::Static(0));
                        let iota = self
                            .tracer
                            .constant(0.0, dtype)
                            .apply(Op::Iota { len: dim, dtype }, &[]);
                        return one(if s0 == 0 { iota } else { iota + s0 as f64 });
                    }
                    let Some(e0) = e.as_const() else {
                        return Err(self.error("arange to a symbolic end with a step other than 1"));
                    };
                    return one(self
                        .tracer
                        .arange_range(s0 as f64, e0 as f64, step as f64, dtype));
                }
                let s = match &start {
                    Some(a) => self.number(a)?,
                    None => 0.0,
                };
                let e = self.number(&end_arg)?;
                let st = match &step_arg {
                    Some(a) => self.number(a)?,
                    None => 1.0,
                };
                one(self.tracer.arange_range(s, e, st, dtype))
            }
            "aten.full.default" => {
                let fill = args.get(self, "fill_value")?;
                let value = self.number(&fill)?;
                let dtype = self.creation_dtype(args, Some(&fill))?;
                let shape = self.creation_shape(args, "size")?;
                one(self.filled(shape, value, dtype))
            }
            "aten.zeros.default" | "aten.ones.default" | "aten.empty.memory_format" => {
                let dtype = self.creation_dtype(args, None)?;
                let shape = self.creation_shape(args, "size")?;
                let value = if op == "aten.ones.default" { 1.0 } else { 0.0 };
                one(self.filled(shape, value, dtype))
            }
            "aten.full_like.default"
            | "aten.zeros_like.default"
            | "aten.ones_like.default"
            | "aten.empty_like.default"
            | "aten.fill.Scalar"
            | "aten.zero.default" => {
                let x = self.tensor(args, "self")?;
                let value = match op {
                    "aten.full_like.default" => self.float(args, "fill_value", None)?,
                    "aten.fill.Scalar" => self.float(args, "value", None)?,
                    "aten.ones_like.default" => 1.0,
                    _ => 0.0,
                };
                let dtype = self
                    .dtype(args, "dtype")?
                    .or(x.dtype())
                    .unwrap_or(DType::F32);
                one(self.filled(x.ir_dims().into_iter().collect(), value, dtype))
            }
            "aten.new_ones.default"
            | "aten.new_zeros.default"
            | "aten.new_full.default"
            | "aten.new_empty.default" => {
                let x = self.tensor(args, "self")?;
                let value = match op {
                    "aten.new_ones.default" => 1.0,
                    "aten.new_full.default" => self.float(args, "fill_value", None)?,
                    _ => 0.0,
                };
                let dtype = self
                    .dtype(args, "dtype")?
                    .or(x.dtype())
                    .unwrap_or(DType::F32);
                let shape = self.creation_shape(args, "size")?;
                one(self.filled(shape, value, dtype))
            }
            "aten.scalar_tensor.default" => {
                let value = self.float(args, "s", None)?;
                let dtype = self.dtype(args, "dtype")?.unwrap_or(DType::F32);
                one(self.tracer.constant(value, dtype))
            }
            other => Err(self.no_rule(other)),
        }
    }

    pub(super) fn creation_shape(
        &mut self,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Shape, ImportError> {
        let sizes = self.sizes(args, key)?;
        self.dims_of(&sizes)
    }

    pub(super) fn filled(&self, shape: Shape, value: f64, dtype: DType) -> Traced {
        let c = self.tracer.constant(value, dtype);
        if shape.is_empty() {
            c
        } else {
            c.expand_dims(shape)
        }
    }

    /// The dtype of a creation op: its `dtype` argument, else PyTorch's recorded one, else
    /// from the fill value.
    pub(super) fn creation_dtype(
        &mut self,
        args: &Args<'a>,
        fill: Option<&Json>,
    ) -> Result<DType, ImportError> {
        if let Some(d) = self.dtype(args, "dtype")? {
            return Ok(d);
        }
        if let Some(ty) = self.output_type() {
            return Ok(ty.dtype);
        }
        Ok(match fill.map(|f| f.union()).transpose()?.map(|(k, _)| k) {
            Some("as_bool") => DType::Bool,
            Some("as_int") => DType::I64,
            _ => DType::F32,
        })
    }
}
