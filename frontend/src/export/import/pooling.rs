//! Pooling: max, average and adaptive average pooling in 2-d.

use super::{one, Args, Importer, Value};
use crate::export::error::ImportError;
use crate::PoolOptions;

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // matrix products and layers
    "aten.max_pool2d.default",
    "aten.max_pool2d_with_indices.default",
    "aten.avg_pool2d.default",
    "aten.adaptive_avg_pool2d.default",
    "aten._adaptive_avg_pool2d.default",
];

impl<'a> Importer<'a> {
    pub(super) fn import_pool(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            "aten.max_pool2d.default" | "aten.max_pool2d_with_indices.default" => {
                let x = self.tensor(args, "self")?;
                let options = self.pool_options(args)?;
                let y = x.max_pool2d_with(options);
                if op == "aten.max_pool2d.default" {
                    return one(y);
                }
                Ok(vec![
                    Value::Tensor(y),
                    Value::Missing(
                        "the indices of max_pool2d_with_indices are not computed".into(),
                    ),
                ])
            }
            "aten.avg_pool2d.default" => {
                let x = self.tensor(args, "self")?;
                let options = self.pool_options(args)?;
                if options.ceil_mode
                    || !self.boolean(args, "count_include_pad", true)?
                    || self.opt_float(args, "divisor_override")?.is_some()
                {
                    return Err(self.error(
                        "avg_pool2d with ceil_mode, count_include_pad=False or divisor_override",
                    ));
                }
                one(x.avg_pool2d_with(options.kernel, options.stride, options.padding))
            }
            "aten.adaptive_avg_pool2d.default" | "aten._adaptive_avg_pool2d.default" => {
                let x = self.tensor(args, "self")?;
                let size = self.ints(args, "output_size", &[])?;
                let (h, w) = self.pair(&size, "output_size", 1)?;
                one(x.adaptive_avg_pool2d((h, w)))
            }
            other => Err(self.no_rule(other)),
        }
    }

    pub(super) fn pool_options(&self, args: &Args<'a>) -> Result<PoolOptions, ImportError> {
        let kernel = self.ints(args, "kernel_size", &[])?;
        let stride = self.ints(args, "stride", &[])?;
        let padding = self.ints(args, "padding", &[0])?;
        let dilation = self.ints(args, "dilation", &[1])?;
        let square = |v: &[i64], what: &str| -> Result<Option<usize>, ImportError> {
            match v {
                [] => Ok(None),
                [a] if *a >= 0 => Ok(Some(*a as usize)),
                [a, b] if a == b && *a >= 0 => Ok(Some(*a as usize)),
                _ => Err(self.error(format!(
                    "{what} {v:?}: only square pooling windows are supported"
                ))),
            }
        };
        let k =
            square(&kernel, "kernel_size")?.ok_or_else(|| self.error("kernel_size is missing"))?;
        let mut options = PoolOptions::new(k);
        if let Some(s) = square(&stride, "stride")? {
            options = options.stride(s);
        }
        options = options
            .padding(square(&padding, "padding")?.unwrap_or(0))
            .dilation(square(&dilation, "dilation")?.unwrap_or(1));
        if self.boolean(args, "ceil_mode", false)? {
            options = options.ceil_mode();
        }
        Ok(options)
    }
}
