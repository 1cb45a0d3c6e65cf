//! Losses with PyTorch's names and semantics (mean reduction), built from traced ops so that
//! `grad` differentiates them like any other code: `mse_loss`, `nll_loss`, `cross_entropy` on
//! class indices (with `label_smoothing` and `ignore_index`), and `gather` (`torch.gather`).

use crate::trace::Traced;
use minductor_ir::{DType, Op};

/// Options of [`Traced::cross_entropy_with`], PyTorch's defaults in `Default`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyOptions {
    /// Targets equal to this class contribute nothing, and are not counted in the mean.
    pub ignore_index: i64,
    /// Mixes the one-hot target with the uniform distribution: `(1 − ε)·nll + ε·mean(−log p)`.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            ignore_index: -100,
            label_smoothing: 0.0,
        }
    }
}

impl Traced {
    /// `F.mse_loss(self, target)`: the mean of the squared differences.
    #[track_caller]
    pub fn mse_loss(&self, target: &Traced) -> Traced {
        let d = self - target;
        (&d * &d).mean(&[], false)
    }

    /// `torch.gather(self, dim, index)`: `out[p] = self[p with p[dim] = index[p]]`; `index` is
    /// i64, of `self`'s rank and sizes except along `dim`. An index out of range is an error
    /// when the graph runs.
    #[track_caller]
    pub fn gather(&self, dim: isize, index: &Traced) -> Traced {
        let rank = self.rank() as isize;
        let d = if dim < 0 { dim + rank } else { dim };
        if d < 0 || d >= rank {
            return self.fail_msg("gather", format!("dim {dim} out of range for rank {rank}"));
        }
        self.apply(Op::TakeAlong { dim: d as usize }, &[self, index])
    }

    /// `F.nll_loss(self, target)` on log-probabilities `[N, C]` and class indices `[N]`.
    #[track_caller]
    pub fn nll_loss(&self, target: &Traced) -> Traced {
        self.class_loss("nll_loss", target, CrossEntropyOptions::default())
    }

    /// `F.cross_entropy(self, target)` on logits `[N, C]` and class indices `[N]`.
    #[track_caller]
    pub fn cross_entropy(&self, target: &Traced) -> Traced {
        self.cross_entropy_with(target, CrossEntropyOptions::default())
    }

    /// `F.cross_entropy(self, target, ignore_index=.., label_smoothing=..)`.
    #[track_caller]
    pub fn cross_entropy_with(&self, target: &Traced, options: CrossEntropyOptions) -> Traced {
        self.log_softmax(1)
            .class_loss("cross_entropy", target, options)
    }

    /// The mean over non-ignored rows of `−(1 − ε)·logp[i, y_i] − ε/C·Σ_c logp[i, c]`.
    #[track_caller]
    fn class_loss(&self, what: &str, target: &Traced, options: CrossEntropyOptions) -> Traced {
        let (Some(ty), Some(target_ty)) = (self.ty(), target.ty()) else {
            return self.clone();
        };
        if ty.rank() != 2 || target_ty.rank() != 1 || ty.shape[0] != target_ty.shape[0] {
            return self.fail_msg(
                what,
                format!(
                    "expected scores [N, C] and class indices [N], found {} and {}",
                    self.describe(),
                    target.describe()
                ),
            );
        }
        if target_ty.dtype != DType::I64 {
            return self.fail_msg(
                what,
                format!("class indices must be i64, found {}", target.describe()),
            );
        }
        if !(0.0..=1.0).contains(&options.label_smoothing) {
            return self.fail_msg(
                what,
                format!(
                    "label_smoothing must be in [0, 1], found {}",
                    options.label_smoothing
                ),
            );
        }
        let dims = self.ir_dims();
        let valid = target.ne(options.ignore_index);
        // Ignored rows read class 0 (their loss is masked out), so every index is in range.
        let safe = valid.where_(target, 0i64);
        let column = safe.reshape(&[-1, 1]);
        let picked = self.gather(1, &column).reshape(&[-1]);
        let weight = valid.cast(ty.dtype);
        let count = weight.sum(&[], false);
        let nll = -(&picked * &weight).sum(&[], false) / &count;
        if options.label_smoothing == 0.0 {
            return nll;
        }
        let classes = match dims[1].as_static() {
            Some(c) => c as f64,
            None => {
                return self.fail_msg(what, "label smoothing over a symbolic class count".into())
            }
        };
        let smooth = -(self.sum(&[1], false) * &weight).sum(&[], false) / &count;
        nll * (1.0 - options.label_smoothing) + smooth * (options.label_smoothing / classes)
    }
}
