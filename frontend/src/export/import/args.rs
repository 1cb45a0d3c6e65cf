//! Argument decoding: a node's named arguments read as tensors, sizes, numbers, flags and
//! dtypes, with PyTorch's defaults for omitted ones.

use super::{Args, Importer, Operand, Value};
use crate::export::archive::dtype_of_code;
use crate::export::error::ImportError;
use crate::export::json::Json;
use crate::trace::Traced;
use minductor_ir::{DType, Dim, Op, Shape, SizeExpr, SliceFrom, TensorType};

impl<'a> Importer<'a> {
    pub(super) fn value_of(&self, name: &str) -> Result<Value, ImportError> {
        self.env
            .get(name)
            .cloned()
            .ok_or_else(|| self.error(format!("reads `{name}`, which no earlier node defines")))
    }

    pub(super) fn tensor_named(&self, name: &str) -> Result<Traced, ImportError> {
        match self.value_of(name)? {
            Value::Tensor(t) => Ok(t),
            Value::Missing(why) => Err(self.error(format!("reads `{name}`: {why}"))),
            _ => Err(self.error(format!("`{name}` is not a tensor"))),
        }
    }

    pub(super) fn tensor(&self, args: &Args<'a>, key: &str) -> Result<Traced, ImportError> {
        self.opt_tensor(args, key)?
            .ok_or_else(|| self.error(format!("argument `{key}` is missing")))
    }

    pub(super) fn opt_tensor(
        &self,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Option<Traced>, ImportError> {
        let Some(arg) = args.find(key) else {
            return Ok(None);
        };
        let (kind, v) = arg.union()?;
        match kind {
            "as_none" => Ok(None),
            "as_tensor" => Ok(Some(self.tensor_named(v.get("name")?.str()?)?)),
            "as_optional_tensor" => match v.union()? {
                ("as_tensor", t) => Ok(Some(self.tensor_named(t.get("name")?.str()?)?)),
                _ => Ok(None),
            },
            other => Err(self.error(format!("argument `{key}` is `{other}`, expected a tensor"))),
        }
    }

    pub(super) fn opt_tensors(
        &self,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Vec<Option<Traced>>, ImportError> {
        let Some(arg) = args.find(key) else {
            return Err(self.error(format!("argument `{key}` is missing")));
        };
        let (kind, v) = arg.union()?;
        let mut out = Vec::new();
        for item in v.array()? {
            match kind {
                "as_tensors" => out.push(Some(self.tensor_named(item.get("name")?.str()?)?)),
                "as_optional_tensors" => match item.union()? {
                    ("as_tensor", t) => out.push(Some(self.tensor_named(t.get("name")?.str()?)?)),
                    _ => out.push(None),
                },
                other => {
                    return Err(
                        self.error(format!("argument `{key}` is `{other}`, expected tensors"))
                    )
                }
            }
        }
        Ok(out)
    }

    pub(super) fn tensors(&self, args: &Args<'a>, key: &str) -> Result<Vec<Traced>, ImportError> {
        self.opt_tensors(args, key)?
            .into_iter()
            .map(|t| t.ok_or_else(|| self.error(format!("`{key}` holds a None"))))
            .collect()
    }

    /// A size argument: an int or a `SymInt` (`{"as_sym_int": {"as_name": ..}}`).
    pub(super) fn size(&self, arg: &Json) -> Result<SizeExpr, ImportError> {
        let (kind, v) = arg.union()?;
        match kind {
            "as_int" => Ok(SizeExpr::Const(v.int()?)),
            "as_sym_int" => match v.union()? {
                ("as_int", n) => Ok(SizeExpr::Const(n.int()?)),
                ("as_name", n) => match self.value_of(n.str()?)? {
                    Value::Size(e) => Ok(e),
                    Value::Number(x) if x.fract() == 0.0 => Ok(SizeExpr::Const(x as i64)),
                    _ => Err(self.error(format!("`{}` is not a size", n.str()?))),
                },
                (other, _) => Err(self.error(format!("unknown SymInt argument `{other}`"))),
            },
            other => Err(self.error(format!("expected a size, found `{other}`"))),
        }
    }

    pub(super) fn opt_size(
        &self,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Option<SizeExpr>, ImportError> {
        match args.find(key) {
            None => Ok(None),
            Some(a) if a.union()?.0 == "as_none" => Ok(None),
            Some(a) => self.size(&a).map(Some),
        }
    }

    pub(super) fn sizes(&self, args: &Args<'a>, key: &str) -> Result<Vec<SizeExpr>, ImportError> {
        let Some(arg) = args.find(key) else {
            return Err(self.error(format!("argument `{key}` is missing")));
        };
        let (kind, v) = arg.union()?;
        match kind {
            "as_ints" => v
                .array()?
                .iter()
                .map(|i| Ok(SizeExpr::Const(i.int()?)))
                .collect(),
            "as_sym_ints" => v
                .array()?
                .iter()
                .map(|item| {
                    let wrapped = serde_json::json!({ "as_sym_int": item.value });
                    self.size(&Json::new(&wrapped, &item.path))
                })
                .collect(),
            "as_int" | "as_sym_int" => Ok(vec![self.size(&arg)?]),
            other => Err(self.error(format!("argument `{key}` is `{other}`, expected sizes"))),
        }
    }

    pub(super) fn int(
        &self,
        args: &Args<'a>,
        key: &str,
        default: Option<i64>,
    ) -> Result<i64, ImportError> {
        match self.opt_size(args, key)? {
            Some(e) => e
                .as_const()
                .ok_or_else(|| self.error(format!("argument `{key}` = {e} must be a number"))),
            None => default.ok_or_else(|| self.error(format!("argument `{key}` is missing"))),
        }
    }

    pub(super) fn ints(
        &self,
        args: &Args<'a>,
        key: &str,
        default: &[i64],
    ) -> Result<Vec<i64>, ImportError> {
        match args.find(key) {
            None => Ok(default.to_vec()),
            Some(a) if a.union()?.0 == "as_none" => Ok(default.to_vec()),
            Some(_) => self
                .sizes(args, key)?
                .iter()
                .map(|e| {
                    e.as_const()
                        .ok_or_else(|| self.error(format!("argument `{key}` holds the size {e}")))
                })
                .collect(),
        }
    }

    pub(super) fn opt_ints(
        &self,
        args: &Args<'a>,
        key: &str,
    ) -> Result<Option<Vec<i64>>, ImportError> {
        match args.find(key) {
            None => Ok(None),
            Some(a) if a.union()?.0 == "as_none" => Ok(None),
            Some(_) => self.ints(args, key, &[]).map(Some),
        }
    }

    pub(super) fn number(&self, arg: &Json) -> Result<f64, ImportError> {
        let (kind, v) = arg.union()?;
        match kind {
            "as_float" | "as_int" | "as_bool" => v.float(),
            "as_sym_int" | "as_sym_float" => match v.union()? {
                ("as_name", n) => match self.value_of(n.str()?)? {
                    Value::Number(x) => Ok(x),
                    Value::Size(e) => e.as_const().map(|c| c as f64).ok_or_else(|| {
                        self.error(format!("`{e}` is a symbolic size used as a number"))
                    }),
                    _ => Err(self.error("expected a number")),
                },
                (_, x) => x.float(),
            },
            other => Err(self.error(format!("expected a number, found `{other}`"))),
        }
    }

    pub(super) fn float(
        &self,
        args: &Args<'a>,
        key: &str,
        default: Option<f64>,
    ) -> Result<f64, ImportError> {
        match args.find(key) {
            Some(a) if a.union()?.0 != "as_none" => self.number(&a),
            _ => default.ok_or_else(|| self.error(format!("argument `{key}` is missing"))),
        }
    }

    pub(super) fn opt_float(&self, args: &Args<'a>, key: &str) -> Result<Option<f64>, ImportError> {
        match args.find(key) {
            Some(a) if a.union()?.0 != "as_none" => self.number(&a).map(Some),
            _ => Ok(None),
        }
    }

    pub(super) fn boolean(
        &self,
        args: &Args<'a>,
        key: &str,
        default: bool,
    ) -> Result<bool, ImportError> {
        match args.find(key) {
            Some(a) => match a.union()? {
                ("as_bool", v) => v.bool(),
                ("as_none", _) => Ok(default),
                ("as_int", v) => Ok(v.int()? != 0),
                (other, _) => {
                    Err(self.error(format!("argument `{key}` is `{other}`, expected a bool")))
                }
            },
            None => Ok(default),
        }
    }

    pub(super) fn string(&self, args: &Args<'a>, key: &str) -> Result<Option<String>, ImportError> {
        match args.find(key) {
            Some(a) => match a.union()? {
                ("as_string", v) => Ok(Some(v.str()?.to_string())),
                _ => Ok(None),
            },
            None => Ok(None),
        }
    }

    pub(super) fn dtype(&self, args: &Args<'a>, key: &str) -> Result<Option<DType>, ImportError> {
        match args.find(key) {
            Some(a) => match a.union()? {
                ("as_scalar_type", v) => dtype_of_code(v.int()?, key).map(Some),
                _ => Ok(None),
            },
            None => Ok(None),
        }
    }

    /// A tensor or a number (`other` of `add.Tensor`, `self` of `where.ScalarSelf`).
    pub(super) fn operand(&self, args: &Args<'a>, key: &str) -> Result<Operand, ImportError> {
        let Some(arg) = args.find(key) else {
            return Err(self.error(format!("argument `{key}` is missing")));
        };
        match arg.union()?.0 {
            "as_tensor" | "as_optional_tensor" => Ok(Operand::Tensor(self.tensor(args, key)?)),
            _ => Ok(Operand::Number(self.number(&arg)?)),
        }
    }

    /// `operand` as a tensor next to `like` (a number becomes a 0-d constant of a dtype that
    /// does not promote `like`).
    pub(super) fn operand_tensor(&self, like: &Traced, op: Operand) -> Traced {
        match op {
            Operand::Tensor(t) => t,
            Operand::Number(v) => like.constant_like(v),
        }
    }

    pub(super) fn bool_constant(&self, value: bool) -> Traced {
        self.tracer
            .constant(f64::from(u8::from(value)), DType::Bool)
    }

    pub(super) fn as_bool(&self, t: &Traced) -> Traced {
        if t.dtype() == Some(DType::Bool) {
            t.clone()
        } else {
            t.ne(0.0)
        }
    }

    /// The dims of `sizes` (which must not be negative).
    pub(super) fn dims_of(&self, sizes: &[SizeExpr]) -> Result<Shape, ImportError> {
        sizes
            .iter()
            .map(|e| Dim::of_expr(e).ok_or_else(|| self.error(format!("size {e} is negative"))))
            .collect()
    }

    /// A 0-d i64 tensor holding the size `dim` (a sum of ones when it is symbolic).
    pub(super) fn size_tensor(&self, like: &Traced, dim: Dim) -> Traced {
        match dim {
            Dim::Static(n) => self.tracer.constant(n as f64, DType::I64),
            Dim::Sym(_) => {
                let _ = like;
                // The last element of `0, 1, .., size`: an iota and a view, which compile (a sum
                // of ones would be an i64 reduction, which runs interpreted), and exact at size 0.
                let len = SizeExpr::of_dim(dim).plus(&SizeExpr::Const(1));
                let Some(len) = Dim::of_expr(&len) else {
                    // Not reached (a size plus one is positive); the sum says the same.
                    return self
                        .tracer
                        .constant(1.0, DType::I64)
                        .expand_dims(std::iter::once(dim).collect())
                        .sum(&[0], false);
                };
                let iota = self.tracer.constant(0.0, DType::I64).apply(
                    Op::Iota {
                        len,
                        dtype: DType::I64,
                    },
                    &[],
                );
                let last = iota.apply(
                    Op::Slice {
                        dim: 0,
                        start: 1,
                        end: 0,
                        step: 1,
                        from: SliceFrom::End,
                    },
                    &[&iota],
                );
                last.reshape(&[])
            }
        }
    }

    /// The type PyTorch recorded for the node's first output (for sizes written as `-1`).
    pub(super) fn output_type(&mut self) -> Option<TensorType> {
        let name = self.context.first_output.clone()?;
        self.meta_type(&name).ok().flatten()
    }
}
