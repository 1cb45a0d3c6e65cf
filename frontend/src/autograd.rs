//! Gradients inside traced code, functional like `torch.autograd.grad` / `torch.func.grad`.
//!
//! `loss.grad(&[&w, &b])` records one `grad` node per value; the traced graph then holds the
//! forward and the request for its backward, and `passes::autodiff` expands the request into the
//! joint graph when the graph is compiled (on every backend). A value the loss does not depend on
//! gets zeros (as `torch.func.grad` gives); integer and bool values, and a non-scalar loss without
//! output gradients, are trace errors naming the value.

use crate::trace::Traced;
use minductor_ir::Op;

impl Traced {
    /// Gradients of this scalar with respect to each of `wrt`, in order.
    #[track_caller]
    pub fn grad(&self, wrt: &[&Traced]) -> Vec<Traced> {
        if let Some(ty) = self.ty() {
            if ty.rank() != 0 {
                let message = format!(
                    "{} is not a scalar: give the gradient of each output element with \
                     grad_with(output_grad, wrt)",
                    self.describe()
                );
                return vec![self.fail_msg("grad", message); wrt.len()];
            }
        }
        self.gradients(None, wrt)
    }

    /// Gradients of this value with respect to each of `wrt`, given the gradient of the final
    /// result with respect to this value (`torch.autograd.grad(out, wrt, grad_outputs)`).
    #[track_caller]
    pub fn grad_with(&self, output_grad: &Traced, wrt: &[&Traced]) -> Vec<Traced> {
        if let (Some(ty), Some(seed)) = (self.ty(), output_grad.ty()) {
            if ty != seed {
                let message = format!(
                    "the output gradient {} must have the type of {}",
                    output_grad.describe(),
                    self.describe()
                );
                return vec![self.fail_msg("grad", message); wrt.len()];
            }
        }
        self.gradients(Some(output_grad), wrt)
    }

    /// The same value with no gradient flowing through it (`x.detach()`).
    #[track_caller]
    pub fn detach(&self) -> Traced {
        self.apply(Op::Detach, &[self])
    }

    #[track_caller]
    fn gradients(&self, seed: Option<&Traced>, wrt: &[&Traced]) -> Vec<Traced> {
        if let Some(ty) = self.ty() {
            if !ty.dtype.is_float() {
                let message = format!(
                    "cannot differentiate {}: only floating-point values have gradients",
                    self.describe()
                );
                return vec![self.fail_msg("grad", message); wrt.len()];
            }
        }
        for w in wrt {
            if let Some(ty) = w.ty() {
                if !ty.dtype.is_float() {
                    let message = format!(
                        "cannot take the gradient with respect to {}: only floating-point \
                         values have gradients",
                        w.describe()
                    );
                    return vec![self.fail_msg("grad", message); wrt.len()];
                }
            }
        }
        let mut operands: Vec<&Traced> = vec![self];
        operands.extend(seed);
        operands.extend(wrt.iter().copied());
        (0..wrt.len())
            .map(|index| {
                self.apply(
                    Op::Grad {
                        index,
                        seeded: seed.is_some(),
                    },
                    &operands,
                )
            })
            .collect()
    }
}
