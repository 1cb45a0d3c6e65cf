//! Pointwise ops: unary math and activations, binary arithmetic with type promotion,
//! comparisons, logical ops, `where` and `masked_fill`.

use super::{one, Args, Importer, Operand, Value};
use crate::export::error::ImportError;
use crate::trace::Traced;
use minductor_ir::DType;

/// The targets imported here.
pub(super) const TARGETS: &[&str] = &[
    // pointwise unary
    "aten.abs.default",
    "aten.neg.default",
    "aten.exp.default",
    "aten.exp2.default",
    "aten.expm1.default",
    "aten.log.default",
    "aten.log1p.default",
    "aten.log2.default",
    "aten.log10.default",
    "aten.sqrt.default",
    "aten.rsqrt.default",
    "aten.sin.default",
    "aten.cos.default",
    "aten.tan.default",
    "aten.sinh.default",
    "aten.cosh.default",
    "aten.tanh.default",
    "aten.erf.default",
    "aten.sigmoid.default",
    "aten.reciprocal.default",
    "aten.square.default",
    "aten.sign.default",
    "aten.trunc.default",
    "aten.floor.default",
    "aten.ceil.default",
    "aten.isnan.default",
    "aten.isinf.default",
    "aten.logical_not.default",
    "aten.bitwise_not.default",
    "aten.relu.default",
    "aten.relu6.default",
    "aten.silu.default",
    "aten.gelu.default",
    "aten.mish.default",
    "aten.hardtanh.default",
    "aten.hardsigmoid.default",
    "aten.hardswish.default",
    "aten.leaky_relu.default",
    "aten.elu.default",
    "aten.softplus.default",
    "aten.clamp.default",
    "aten.clamp.Tensor",
    "aten.clamp_min.default",
    "aten.clamp_max.default",
    "aten.pow.Tensor_Scalar",
    "aten.pow.Tensor_Tensor",
    "aten.pow.Scalar",
    // pointwise binary
    "aten.add.Tensor",
    "aten.add.Scalar",
    "aten.sub.Tensor",
    "aten.sub.Scalar",
    "aten.rsub.Scalar",
    "aten.rsub.Tensor",
    "aten.mul.Tensor",
    "aten.mul.Scalar",
    "aten.div.Tensor",
    "aten.div.Scalar",
    "aten.div.Tensor_mode",
    "aten.remainder.Tensor",
    "aten.remainder.Scalar",
    "aten.maximum.default",
    "aten.minimum.default",
    "aten.eq.Tensor",
    "aten.eq.Scalar",
    "aten.ne.Tensor",
    "aten.ne.Scalar",
    "aten.lt.Tensor",
    "aten.lt.Scalar",
    "aten.le.Tensor",
    "aten.le.Scalar",
    "aten.gt.Tensor",
    "aten.gt.Scalar",
    "aten.ge.Tensor",
    "aten.ge.Scalar",
    "aten.logical_and.default",
    "aten.logical_or.default",
    "aten.logical_xor.default",
    "aten.bitwise_and.Tensor",
    "aten.bitwise_or.Tensor",
    "aten.bitwise_xor.Tensor",
    "aten.__and__.Tensor",
    "aten.__or__.Tensor",
    "aten.where.self",
    "aten.where.ScalarSelf",
    "aten.where.ScalarOther",
    "aten.where.Scalar",
    "aten.masked_fill.Scalar",
    "aten.masked_fill.Tensor",
];

impl<'a> Importer<'a> {
    pub(super) fn import_pointwise(
        &mut self,
        op: &str,
        args: &Args<'a>,
    ) -> Result<Vec<Value>, ImportError> {
        match op {
            // -- pointwise unary
            "aten.abs.default" => one(self.tensor(args, "self")?.abs()),
            "aten.neg.default" => one(self.tensor(args, "self")?.neg()),
            "aten.exp.default" => one(self.tensor(args, "self")?.exp()),
            "aten.exp2.default" => one((self.tensor(args, "self")? * std::f64::consts::LN_2).exp()),
            "aten.expm1.default" => one(self.tensor(args, "self")?.exp() - 1.0),
            "aten.log.default" => one(self.tensor(args, "self")?.log()),
            "aten.log1p.default" => one((self.tensor(args, "self")? + 1.0).log()),
            "aten.log2.default" => one(self.tensor(args, "self")?.log() * std::f64::consts::LOG2_E),
            "aten.log10.default" => {
                one(self.tensor(args, "self")?.log() * std::f64::consts::LOG10_E)
            }
            "aten.sqrt.default" => one(self.tensor(args, "self")?.sqrt()),
            "aten.rsqrt.default" => one(self.tensor(args, "self")?.rsqrt()),
            "aten.sin.default" => one(self.tensor(args, "self")?.sin()),
            "aten.cos.default" => one(self.tensor(args, "self")?.cos()),
            "aten.tan.default" => {
                let x = self.tensor(args, "self")?;
                one(x.sin() / x.cos())
            }
            "aten.sinh.default" | "aten.cosh.default" => {
                let x = self.tensor(args, "self")?;
                let (a, b) = (x.exp(), x.neg().exp());
                one(if op == "aten.sinh.default" {
                    (a - b) * 0.5
                } else {
                    (a + b) * 0.5
                })
            }
            "aten.tanh.default" => one(self.tensor(args, "self")?.tanh()),
            "aten.erf.default" => one(self.tensor(args, "self")?.erf()),
            "aten.sigmoid.default" => one(self.tensor(args, "self")?.sigmoid()),
            "aten.reciprocal.default" => one(self.tensor(args, "self")?.reciprocal()),
            "aten.square.default" => {
                let x = self.tensor(args, "self")?;
                one(&x * &x)
            }
            "aten.sign.default" => {
                let x = self.tensor(args, "self")?;
                let zero = x.full_like(0.0);
                one(x.gt(0.0).where_(1.0, &x.lt(0.0).where_(-1.0, &zero)))
            }
            "aten.trunc.default" => {
                let x = self.tensor(args, "self")?;
                one(self.trunc(&x))
            }
            "aten.floor.default" | "aten.ceil.default" => {
                let x = self.tensor(args, "self")?;
                let t = self.trunc(&x);
                if !x.dtype().is_some_and(|d| d.is_float()) {
                    return one(x);
                }
                one(if op == "aten.floor.default" {
                    x.lt(&t).where_(&(&t - 1.0), &t)
                } else {
                    x.gt(&t).where_(&(&t + 1.0), &t)
                })
            }
            "aten.isnan.default" => {
                let x = self.tensor(args, "self")?;
                one(x.ne(&x))
            }
            "aten.isinf.default" => one(self.tensor(args, "self")?.abs().eq(f64::INFINITY)),
            "aten.logical_not.default" | "aten.bitwise_not.default" => {
                let x = self.tensor(args, "self")?;
                if op == "aten.bitwise_not.default" && x.dtype() != Some(DType::Bool) {
                    return Err(self.error("bitwise_not of an integer tensor is not supported"));
                }
                let b = self.as_bool(&x);
                one(b.where_(&self.bool_constant(false), &self.bool_constant(true)))
            }
            "aten.relu.default" => one(self.tensor(args, "self")?.relu()),
            "aten.relu6.default" => one(self.tensor(args, "self")?.clamp(Some(0.0), Some(6.0))),
            "aten.silu.default" => one(self.tensor(args, "self")?.silu()),
            "aten.gelu.default" => {
                let x = self.tensor(args, "self")?;
                match self.string(args, "approximate")?.as_deref() {
                    None | Some("none") => one(x.gelu()),
                    Some("tanh") => one(x.gelu_tanh()),
                    Some(other) => Err(self.error(format!("gelu approximate={other:?}"))),
                }
            }
            "aten.mish.default" => {
                let x = self.tensor(args, "self")?;
                let softplus = (x.exp() + 1.0).log();
                one(&x * &softplus.tanh())
            }
            "aten.hardtanh.default" => {
                let x = self.tensor(args, "self")?;
                let lo = self.float(args, "min_val", Some(-1.0))?;
                let hi = self.float(args, "max_val", Some(1.0))?;
                one(x.clamp(Some(lo), Some(hi)))
            }
            "aten.hardsigmoid.default" => {
                let x = self.tensor(args, "self")?;
                one((x / 6.0 + 0.5).clamp(Some(0.0), Some(1.0)))
            }
            "aten.hardswish.default" => {
                let x = self.tensor(args, "self")?;
                one(&x * &(&x / 6.0 + 0.5).clamp(Some(0.0), Some(1.0)))
            }
            "aten.leaky_relu.default" => {
                let x = self.tensor(args, "self")?;
                let slope = self.float(args, "negative_slope", Some(0.01))?;
                one(x.gt(0.0).where_(&x, &(&x * slope)))
            }
            "aten.elu.default" => {
                let x = self.tensor(args, "self")?;
                let alpha = self.float(args, "alpha", Some(1.0))?;
                let scale = self.float(args, "scale", Some(1.0))?;
                let input_scale = self.float(args, "input_scale", Some(1.0))?;
                let negative = ((&x * input_scale).exp() - 1.0) * (alpha * scale);
                one(x.gt(0.0).where_(&(&x * scale), &negative))
            }
            "aten.softplus.default" => {
                let x = self.tensor(args, "self")?;
                let beta = self.float(args, "beta", Some(1.0))?;
                let threshold = self.float(args, "threshold", Some(20.0))?;
                let bx = &x * beta;
                let soft = ((bx.exp() + 1.0).log()) / beta;
                one(bx.gt(threshold).where_(&x, &soft))
            }
            "aten.clamp.default" | "aten.clamp_min.default" | "aten.clamp_max.default" => {
                let x = self.tensor(args, "self")?;
                let (lo, hi) = match op {
                    "aten.clamp_min.default" => (self.opt_float(args, "min")?, None),
                    "aten.clamp_max.default" => (None, self.opt_float(args, "max")?),
                    _ => (self.opt_float(args, "min")?, self.opt_float(args, "max")?),
                };
                one(x.clamp(lo, hi))
            }
            "aten.clamp.Tensor" => {
                let x = self.tensor(args, "self")?;
                let mut y = x.clone();
                if let Some(lo) = self.opt_tensor(args, "min")? {
                    y = y.maximum(&lo);
                }
                if let Some(hi) = self.opt_tensor(args, "max")? {
                    y = y.minimum(&hi);
                }
                one(y)
            }
            "aten.pow.Tensor_Scalar" => {
                let x = self.tensor(args, "self")?;
                let e = self.float(args, "exponent", None)?;
                one(self.pow(&x, e))
            }
            "aten.pow.Tensor_Tensor" => {
                let x = self.tensor(args, "self")?;
                let e = self.tensor(args, "exponent")?;
                one(x.pow(&e))
            }
            "aten.pow.Scalar" => {
                let base = self.float(args, "self", None)?;
                let e = self.tensor(args, "exponent")?;
                one(e.constant_like(base).pow(&e))
            }

            // -- pointwise binary
            "aten.add.Tensor" | "aten.add.Scalar" | "aten.sub.Tensor" | "aten.sub.Scalar"
            | "aten.rsub.Scalar" | "aten.rsub.Tensor" => {
                let x = self.tensor(args, "self")?;
                let other = self.operand(args, "other")?;
                let alpha = self.float(args, "alpha", Some(1.0))?;
                let y = self.operand_tensor(&x, other);
                let scaled = |t: &Traced| if alpha == 1.0 { t.clone() } else { t * alpha };
                one(match op {
                    "aten.add.Tensor" | "aten.add.Scalar" => &x + &scaled(&y),
                    "aten.sub.Tensor" | "aten.sub.Scalar" => &x - &scaled(&y),
                    _ => &y - &scaled(&x),
                })
            }
            "aten.mul.Tensor" | "aten.mul.Scalar" => {
                let x = self.tensor(args, "self")?;
                let y = self.operand(args, "other")?;
                let y = self.operand_tensor(&x, y);
                if x.dtype() == Some(DType::Bool) && y.dtype() == Some(DType::Bool) {
                    return one(x.where_(&y, &self.bool_constant(false)));
                }
                one(&x * &y)
            }
            "aten.div.Tensor" | "aten.div.Scalar" | "aten.div.Tensor_mode" => {
                let x = self.tensor(args, "self")?;
                let y = self.operand(args, "other")?;
                let y = self.operand_tensor(&x, y);
                // True division is floating-point, as PyTorch's.
                let float = |t: &Traced| match t.dtype() {
                    Some(d) if d.is_float() => t.clone(),
                    _ => t.cast(DType::F32),
                };
                let q = float(&x) / float(&y);
                match self.string(args, "rounding_mode")?.as_deref() {
                    None => one(q),
                    Some("trunc") => one(self.trunc(&q)),
                    Some("floor") => {
                        let t = self.trunc(&q);
                        one(q.lt(&t).where_(&(&t - 1.0), &t))
                    }
                    Some(other) => Err(self.error(format!("rounding_mode {other:?}"))),
                }
            }
            "aten.remainder.Tensor" | "aten.remainder.Scalar" => {
                let x = self.tensor(args, "self")?;
                let y = self.operand(args, "other")?;
                let y = self.operand_tensor(&x, y);
                if !x.dtype().is_some_and(|d| d.is_float()) {
                    return Err(self.error("remainder of integer tensors is not supported"));
                }
                // Python's modulo: x - floor(x / y) * y (the sign of y).
                let q = &x / &y;
                let t = self.trunc(&q);
                let floor = q.lt(&t).where_(&(&t - 1.0), &t);
                one(&x - &(&floor * &y))
            }
            "aten.maximum.default" | "aten.minimum.default" => {
                let x = self.tensor(args, "self")?;
                let y = self.tensor(args, "other")?;
                one(if op == "aten.maximum.default" {
                    x.maximum(&y)
                } else {
                    x.minimum(&y)
                })
            }
            "aten.eq.Tensor" | "aten.eq.Scalar" | "aten.ne.Tensor" | "aten.ne.Scalar"
            | "aten.lt.Tensor" | "aten.lt.Scalar" | "aten.le.Tensor" | "aten.le.Scalar"
            | "aten.gt.Tensor" | "aten.gt.Scalar" | "aten.ge.Tensor" | "aten.ge.Scalar" => {
                let x = self.tensor(args, "self")?;
                let y = self.operand(args, "other")?;
                let y = self.operand_tensor(&x, y);
                let (x, y) = match (x.dtype(), y.dtype()) {
                    (Some(a), Some(b)) if a != b => {
                        let p = self.promote(&[x, y]);
                        (p[0].clone(), p[1].clone())
                    }
                    _ => (x, y),
                };
                let name = op.split('.').nth(1).unwrap_or("");
                one(match name {
                    "eq" => x.eq(&y),
                    "ne" => x.ne(&y),
                    "lt" => x.lt(&y),
                    "le" => x.le(&y),
                    "gt" => x.gt(&y),
                    _ => x.ge(&y),
                })
            }
            "aten.logical_and.default"
            | "aten.logical_or.default"
            | "aten.logical_xor.default"
            | "aten.bitwise_and.Tensor"
            | "aten.bitwise_or.Tensor"
            | "aten.bitwise_xor.Tensor"
            | "aten.__and__.Tensor"
            | "aten.__or__.Tensor" => {
                let x = self.tensor(args, "self")?;
                let y = self.tensor(args, "other")?;
                let bitwise = op.contains("bitwise") || op.contains("__");
                if bitwise && (x.dtype() != Some(DType::Bool) || y.dtype() != Some(DType::Bool)) {
                    return Err(
                        self.error("bitwise ops on integer tensors are not supported (bool only)")
                    );
                }
                let (a, b) = (self.as_bool(&x), self.as_bool(&y));
                one(if op.contains("and") {
                    a.where_(&b, &self.bool_constant(false))
                } else if op.contains("xor") {
                    a.ne(&b)
                } else {
                    a.where_(&self.bool_constant(true), &b)
                })
            }
            "aten.where.self"
            | "aten.where.ScalarSelf"
            | "aten.where.ScalarOther"
            | "aten.where.Scalar" => {
                let c = self.tensor(args, "condition")?;
                let c = self.as_bool(&c);
                let a = self.operand(args, "self")?;
                let b = self.operand(args, "other")?;
                let (a, b) = match (a, b) {
                    (Operand::Tensor(a), Operand::Tensor(b)) => {
                        let p = self.promote(&[a, b]);
                        (p[0].clone(), p[1].clone())
                    }
                    (Operand::Tensor(a), b) => {
                        let b = self.operand_tensor(&a, b);
                        (a, b)
                    }
                    (a, Operand::Tensor(b)) => {
                        let a = self.operand_tensor(&b, a);
                        (a, b)
                    }
                    (Operand::Number(a), Operand::Number(b)) => {
                        let dtype = self.output_type().map_or(DType::F32, |t| t.dtype);
                        (
                            self.tracer.constant(a, dtype),
                            self.tracer.constant(b, dtype),
                        )
                    }
                };
                one(c.where_(&a, &b))
            }
            "aten.masked_fill.Scalar" | "aten.masked_fill.Tensor" => {
                let x = self.tensor(args, "self")?;
                let mask = self.tensor(args, "mask")?;
                let value = self.operand(args, "value")?;
                let v = match value {
                    Operand::Tensor(t) => match (t.dtype(), x.dtype()) {
                        (Some(a), Some(b)) if a != b => t.cast(b),
                        _ => t,
                    },
                    Operand::Number(v) => match x.dtype() {
                        Some(d) => self.tracer.constant(v, d),
                        None => x.constant_like(v),
                    },
                };
                one(self.as_bool(&mask).where_(&v, &x))
            }
            other => Err(self.no_rule(other)),
        }
    }

    pub(super) fn pow(&self, x: &Traced, exponent: f64) -> Traced {
        // Small integer powers multiply (exact for negative bases, as PyTorch's).
        if exponent == 1.0 {
            x.clone()
        } else if exponent == 2.0 {
            x * x
        } else if exponent == 3.0 {
            &(x * x) * x
        } else if exponent == 4.0 {
            let square = x * x;
            &square * &square
        } else if exponent == 0.5 {
            x.sqrt()
        } else if exponent == -0.5 {
            x.rsqrt()
        } else if exponent == -1.0 {
            x.reciprocal()
        } else if exponent == 0.0 {
            x.full_like(1.0)
        } else {
            x.pow(exponent)
        }
    }

    pub(super) fn trunc(&self, x: &Traced) -> Traced {
        match x.dtype() {
            Some(d) if d.is_float() => x.cast(DType::I64).cast(d),
            _ => x.clone(),
        }
    }
}
