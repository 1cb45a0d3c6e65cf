//! Matrix products and convolutions: `linear`, `addmm`/`baddbmm`, `mm`/`matmul`/`bmm`, convolution
//! and `scaled_dot_product_attention`.

use super::{one, Args, Importer, Value};
use crate::conv::Window;
use crate::export::error::ImportError;
use crate::trace::Traced;
use crate::ConvOptions;

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // matrix products and layers
    "aten.linear.default",
    "aten.addmm.default",
    "aten.mm.default",
    "aten.bmm.default",
    "aten.matmul.default",
    "aten.baddbmm.default",
    "aten.conv1d.default",
    "aten.conv2d.default",
    "aten.convolution.default",
    "aten.scaled_dot_product_attention.default",
];

impl<'a> Importer<'a> {
    pub(super) fn import_linalg(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            // -- matrix products and layers
            "aten.linear.default" => {
                let x = self.tensor(args, "input")?;
                let w = self.tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                one(x.linear(&w, b.as_ref()))
            }
            "aten.addmm.default" | "aten.baddbmm.default" => {
                let bias = self.tensor(args, "self")?;
                let (a, b) = if op == "aten.addmm.default" {
                    (self.tensor(args, "mat1")?, self.tensor(args, "mat2")?)
                } else {
                    (self.tensor(args, "batch1")?, self.tensor(args, "batch2")?)
                };
                let beta = self.float(args, "beta", Some(1.0))?;
                let alpha = self.float(args, "alpha", Some(1.0))?;
                let mut product = a.matmul(&b);
                if alpha != 1.0 {
                    product = product * alpha;
                }
                one(if beta == 0.0 {
                    product
                } else if beta == 1.0 {
                    product + bias
                } else {
                    product + bias * beta
                })
            }
            "aten.mm.default" | "aten.matmul.default" => {
                let x = self.tensor(args, "self")?;
                let key = if args.find("mat2").is_some() {
                    "mat2"
                } else {
                    "other"
                };
                one(x.matmul(&self.tensor(args, key)?))
            }
            "aten.bmm.default" => {
                let x = self.tensor(args, "self")?;
                one(x.bmm(&self.tensor(args, "mat2")?))
            }
            "aten.conv1d.default" | "aten.conv2d.default" | "aten.convolution.default" => {
                let x = self.tensor(args, "input")?;
                let w = self.tensor(args, "weight")?;
                let b = self.opt_tensor(args, "bias")?;
                if self.boolean(args, "transposed", false)? {
                    return Err(self.error("transposed convolution is not supported"));
                }
                let stride = self.ints(args, "stride", &[1])?;
                let padding = match self.string(args, "padding")?.as_deref() {
                    Some("valid") => vec![0],
                    Some(other) => {
                        return Err(self.error(format!("padding={other:?} is not supported")))
                    }
                    None => self.ints(args, "padding", &[0])?,
                };
                let dilation = self.ints(args, "dilation", &[1])?;
                let groups = self.int(args, "groups", Some(1))?;
                one(self.convolution(&x, &w, b.as_ref(), &stride, &padding, &dilation, groups)?)
            }
            "aten.scaled_dot_product_attention.default" => {
                let q = self.tensor(args, "query")?;
                let mut k = self.tensor(args, "key")?;
                let mut v = self.tensor(args, "value")?;
                let mask = self.opt_tensor(args, "attn_mask")?;
                if self.float(args, "dropout_p", Some(0.0))? != 0.0 {
                    return Err(self.error("attention dropout (export the module in eval mode)"));
                }
                let causal = self.boolean(args, "is_causal", false)?;
                let scale = self.opt_float(args, "scale")?;
                if self.boolean(args, "enable_gqa", false)? && q.rank() >= 3 {
                    let hq = self.static_size(&q, q.rank() - 3, "grouped-query attention")?;
                    let hk = self.static_size(&k, k.rank() - 3, "grouped-query attention")?;
                    if hk != hq && hk > 0 && hq % hk == 0 {
                        let r = hq / hk;
                        k = k.repeat_interleave(r, -3);
                        v = v.repeat_interleave(r, -3);
                    }
                }
                let head = self.static_size(&q, q.rank().saturating_sub(1), "attention")?;
                let q = match scale {
                    Some(s)
                        if (s - 1.0 / (head as f64).sqrt()).abs() > 1e-12 * s.abs().max(1.0) =>
                    {
                        &q * (s * (head as f64).sqrt())
                    }
                    _ => q,
                };
                one(q.scaled_dot_product_attention(&k, &v, mask.as_ref(), causal))
            }
            other => Err(self.no_rule(other)),
        }
    }

    /// A convolution of a 3-d (1-d conv) or 4-d (2-d conv) input.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn convolution(
        &self,
        x: &Traced,
        weight: &Traced,
        bias: Option<&Traced>,
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        groups: i64,
    ) -> Result<Traced, ImportError> {
        if groups <= 0 {
            return Err(self.error(format!("groups {groups} must be positive")));
        }
        match x.rank() {
            4 => {
                let window = Window {
                    stride: self.pair(stride, "stride", 1)?,
                    padding: self.pair(padding, "padding", 0)?,
                    dilation: self.pair(dilation, "dilation", 1)?,
                };
                Ok(x.convolution("convolution", weight, bias, window, groups as usize))
            }
            3 => {
                let one = |v: &[i64], what: &str, default: usize| -> Result<usize, ImportError> {
                    Ok(self.pair(v, what, default)?.0)
                };
                let options = ConvOptions::default()
                    .stride(one(stride, "stride", 1)?)
                    .padding(one(padding, "padding", 0)?)
                    .dilation(one(dilation, "dilation", 1)?)
                    .groups(groups as usize);
                let window = Window {
                    stride: (1, options.stride),
                    padding: (0, options.padding),
                    dilation: (1, options.dilation),
                };
                let out = x.unsqueeze(2).convolution(
                    "conv1d",
                    &weight.unsqueeze(2),
                    bias,
                    window,
                    options.groups,
                );
                Ok(self.drop_dim(&out, 2))
            }
            r => Err(self.error(format!("convolution of a rank-{r} input is not supported"))),
        }
    }
}
