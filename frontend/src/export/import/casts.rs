//! Identities and casts: aliases, clones, eval-mode dropout, dtype conversions, `copy`.

use super::{one, Args, Importer, Value};
use crate::export::error::ImportError;
use minductor_ir::DType;

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // identities and casts
    "aten.alias.default",
    "aten.clone.default",
    "aten.contiguous.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.dropout.default",
    "aten.native_dropout.default",
    "aten.feature_dropout.default",
    "aten._to_copy.default",
    "aten.to.dtype",
    "aten.to.dtype_layout",
    "aten.to.device",
    "aten.to.other",
    "aten.type_as.default",
    "aten.copy.default",
];

impl<'a> Importer<'a> {
    pub(super) fn import_cast(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            // -- identities and casts
            "aten.alias.default"
            | "aten.clone.default"
            | "aten.contiguous.default"
            | "aten.detach.default"
            | "aten.lift_fresh_copy.default" => one(self.tensor(args, "self")?),
            "aten.dropout.default" | "aten.feature_dropout.default" => {
                let x = self.tensor(args, "input")?;
                let p = self.float(args, "p", Some(0.0))?;
                if self.boolean(args, "train", false)? && p > 0.0 {
                    return Err(
                        self.error("dropout in training mode (export the module in eval mode)")
                    );
                }
                one(x)
            }
            "aten.native_dropout.default" => {
                let x = self.tensor(args, "input")?;
                let p = self.float(args, "p", Some(0.0))?;
                if self.boolean(args, "train", false)? && p > 0.0 {
                    return Err(
                        self.error("dropout in training mode (export the module in eval mode)")
                    );
                }
                let mask = x.full_like(1.0).cast(DType::Bool);
                Ok(vec![Value::Tensor(x), Value::Tensor(mask)])
            }
            "aten._to_copy.default"
            | "aten.to.dtype"
            | "aten.to.dtype_layout"
            | "aten.to.device" => {
                let x = self.tensor(args, "self")?;
                match self.dtype(args, "dtype")? {
                    Some(d) if Some(d) != x.dtype() => one(x.cast(d)),
                    _ => one(x),
                }
            }
            "aten.to.other" | "aten.type_as.default" => {
                let x = self.tensor(args, "self")?;
                let other = self.tensor(args, "other")?;
                match other.dtype() {
                    Some(d) if Some(d) != x.dtype() => one(x.cast(d)),
                    _ => one(x),
                }
            }
            "aten.copy.default" => {
                let x = self.tensor(args, "self")?;
                let src = self.tensor(args, "src")?;
                let src = match x.dtype() {
                    Some(d) if Some(d) != src.dtype() => src.cast(d),
                    _ => src,
                };
                one(src.expand_dims(x.ir_dims().into_iter().collect()))
            }
            other => Err(self.no_rule(other)),
        }
    }
}
