//! Normalizations: batch norm (eval mode), layer norm and group norm, with the `native_` forms
//! whose statistics outputs are not computed.

use super::{one, Args, Importer, Value};
use crate::export::error::ImportError;
use minductor_ir::Dim;

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // matrix products and layers
    "aten.batch_norm.default",
    "aten.native_batch_norm.default",
    "aten._native_batch_norm_legit_no_training.default",
    "aten.layer_norm.default",
    "aten.native_layer_norm.default",
    "aten.group_norm.default",
    "aten.native_group_norm.default",
];

impl<'a> Importer<'a> {
    pub(super) fn import_norm(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            "aten.batch_norm.default"
            | "aten.native_batch_norm.default"
            | "aten._native_batch_norm_legit_no_training.default" => {
                let x = self.tensor(args, "input")?;
                let w = self.opt_tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                let mean = self.opt_tensor(args, "running_mean")?;
                let var = self.opt_tensor(args, "running_var")?;
                if self.boolean(args, "training", false)? {
                    return Err(
                        self.error("batch norm in training mode (export the module in eval mode)")
                    );
                }
                let (Some(mean), Some(var)) = (mean, var) else {
                    return Err(self.error("batch norm without running statistics"));
                };
                let eps = self.float(args, "eps", Some(1e-5))?;
                let y = x.batch_norm(&mean, &var, w.as_ref(), b.as_ref(), eps);
                if op == "aten.batch_norm.default" {
                    return one(y);
                }
                Ok(vec![
                    Value::Tensor(y),
                    Value::Missing("the saved mean of a batch norm is not computed".into()),
                    Value::Missing("the saved inverse std of a batch norm is not computed".into()),
                ])
            }
            "aten.layer_norm.default" | "aten.native_layer_norm.default" => {
                let x = self.tensor(args, "input")?;
                let shape: Vec<usize> = self
                    .ints(args, "normalized_shape", &[])?
                    .iter()
                    .map(|&n| n.max(0) as usize)
                    .collect();
                let w = self.opt_tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                let eps = self.float(args, "eps", Some(1e-5))?;
                let y = x.layer_norm(&shape, w.as_ref(), b.as_ref(), eps);
                if op == "aten.layer_norm.default" {
                    return one(y);
                }
                Ok(vec![
                    Value::Tensor(y),
                    Value::Missing("the mean output of native_layer_norm is not computed".into()),
                    Value::Missing("the rstd output of native_layer_norm is not computed".into()),
                ])
            }
            "aten.group_norm.default" | "aten.native_group_norm.default" => {
                let x = self.tensor(args, "input")?;
                let groups = if op == "aten.group_norm.default" {
                    self.int(args, "num_groups", None)?
                } else {
                    self.int(args, "group", None)?
                };
                let w = self.opt_tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                let eps = self.float(args, "eps", Some(1e-5))?;
                let dims = x.ir_dims();
                if dims.len() < 2 || groups <= 0 {
                    return Err(self.error("group norm needs [N, C, ..] and positive groups"));
                }
                let c = self.static_size(&x, 1, "group norm")?;
                let g = groups as usize;
                if c % g != 0 {
                    return Err(self.error(format!("{c} channels do not split into {g} groups")));
                }
                let mut rest = c / g;
                for d in 2..dims.len() {
                    rest *= self.static_size(&x, d, "group norm")?;
                }
                let grouped = x.reshape_dims(
                    [dims[0], Dim::Static(g), Dim::Static(rest)]
                        .into_iter()
                        .collect(),
                );
                let normalized = grouped.layer_norm(&[rest], None, None, eps);
                let mut y = normalized.reshape_dims(dims.iter().copied().collect());
                let mut per_channel: Vec<isize> = vec![1; dims.len() - 1];
                per_channel[0] = -1;
                if let Some(w) = w {
                    y = y * w.reshape(&per_channel);
                }
                if let Some(b) = b {
                    y = y + b.reshape(&per_channel);
                }
                if op == "aten.group_norm.default" {
                    return one(y);
                }
                Ok(vec![
                    Value::Tensor(y),
                    Value::Missing("the mean output of native_group_norm is not computed".into()),
                    Value::Missing("the rstd output of native_group_norm is not computed".into()),
                ])
            }
            other => Err(self.no_rule(other)),
        }
    }
}
