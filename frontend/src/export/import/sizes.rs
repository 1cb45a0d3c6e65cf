//! Sizes and assertions: `sym_size`, `sym_numel`, the runtime assertions (no-ops: the guards
//! check ranges) and `_operator` arithmetic on sizes.

use super::{Args, Importer, Value};
use crate::export::error::ImportError;
use minductor_ir::SizeExpr;

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // sizes and assertions
    "aten.sym_size.int",
    "aten.sym_numel.default",
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten._assert_async.msg",
    "aten.sym_constrain_range.default",
    "aten.sym_constrain_range_for_size.default",
    "_operator.add",
    "_operator.sub",
    "_operator.mul",
    "_operator.floordiv",
    "_operator.neg",
    "_operator.eq",
    "_operator.ne",
    "_operator.lt",
    "_operator.le",
    "_operator.gt",
    "_operator.ge",
];

impl<'a> Importer<'a> {
    pub(super) fn import_size_op(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            // -- sizes and assertions
            "aten.sym_size.int" => {
                let x = self.tensor(args, "self")?;
                let d = self.dim_arg(&x, args, "dim", None)?;
                Ok(vec![Value::Size(SizeExpr::of_dim(x.ir_dims()[d]))])
            }
            "aten.sym_numel.default" => {
                let x = self.tensor(args, "self")?;
                Ok(vec![Value::Size(SizeExpr::product(&x.ir_dims()))])
            }
            "aten._assert_tensor_metadata.default"
            | "aten._assert_scalar.default"
            | "aten._assert_async.msg"
            | "aten.sym_constrain_range.default"
            | "aten.sym_constrain_range_for_size.default" => Ok(vec![]),
            "_operator.add" | "_operator.sub" | "_operator.mul" | "_operator.floordiv" => {
                let a = self.size(&args.get(self, "a")?)?;
                let b = self.size(&args.get(self, "b")?)?;
                let v = match op {
                    "_operator.add" => a.plus(&b),
                    "_operator.sub" => a.plus(&b.scale(-1)),
                    "_operator.mul" => a.times(&b),
                    _ => match (a.as_const(), b.as_const()) {
                        (Some(x), Some(y)) if y != 0 => SizeExpr::Const(x.div_euclid(y)),
                        (_, Some(y)) if y > 0 => a.divide_exactly(y).ok_or_else(|| {
                            self.error(format!("{a} // {y} is not exact for every size"))
                        })?,
                        _ => return Err(self.error(format!("cannot divide {a} by {b}"))),
                    },
                };
                Ok(vec![Value::Size(v)])
            }
            "_operator.eq" | "_operator.ne" | "_operator.lt" | "_operator.le" | "_operator.gt"
            | "_operator.ge" => Ok(vec![Value::Missing(
                "a comparison of sizes (only assertions may read it)".into(),
            )]),
            "_operator.neg" => {
                let a = self.size(&args.get(self, "a")?)?;
                Ok(vec![Value::Size(a.scale(-1))])
            }
            other => Err(self.no_rule(other)),
        }
    }
}
