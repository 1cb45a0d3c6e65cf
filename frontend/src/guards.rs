//! Guards: the conditions under which a cached specialization of a `jit` function is valid.
//!
//! Like Dynamo's `TENSOR_MATCH` guards, each input is checked for dtype, rank, each dim, and
//! contiguity (our stand-in for strides: compiled code reads row-major buffers). A static dim must
//! equal the size it was compiled for; a symbolic dim must be at least 2 (sizes 0 and 1 are always
//! specialized, as Dynamo does) and, when several dims share a symbol (duck sizing: dims of equal
//! size at compile time get one symbol), equal to the first dim with that symbol.
//!
//! [`Guards::check`] is the cache-hit path: no allocation, one pass over the inputs.
//! [`Guards::failure`] says in words which guard failed, for the `recompiles` log and stats.

use minductor_ir::{DType, Dim, TensorType};
use minductor_runtime::Tensor;
use smallvec::SmallVec;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum DimGuard {
    /// The size must equal this.
    Equals(usize),
    /// Symbolic `s{sym}`: size >= 2, and equal to `(input, dim)` when that is `Some` (the first
    /// dim carrying the same symbol).
    Symbolic {
        sym: u32,
        same_as: Option<(usize, usize)>,
    },
}

#[derive(Clone, Debug)]
pub(crate) struct InputGuard {
    pub name: String,
    pub dtype: DType,
    pub dims: SmallVec<[DimGuard; 4]>,
    pub contiguous: bool,
}

/// The guards of one cache entry.
#[derive(Clone, Debug)]
pub(crate) struct Guards {
    pub inputs: Vec<InputGuard>,
}

impl Guards {
    /// Guards for inputs traced with `types` (names in `names`); `contiguous` per input.
    pub fn new(names: &[String], types: &[TensorType], contiguous: &[bool]) -> Guards {
        let mut first: Vec<(u32, usize, usize)> = Vec::new();
        let inputs = types
            .iter()
            .enumerate()
            .map(|(i, ty)| InputGuard {
                name: names[i].clone(),
                dtype: ty.dtype,
                dims: ty
                    .shape
                    .iter()
                    .enumerate()
                    .map(|(d, dim)| match dim {
                        Dim::Static(n) => DimGuard::Equals(*n),
                        Dim::Sym(s) => {
                            let same_as = first
                                .iter()
                                .find(|(sym, _, _)| *sym == s.0)
                                .map(|&(_, i, d)| (i, d));
                            if same_as.is_none() {
                                first.push((s.0, i, d));
                            }
                            DimGuard::Symbolic { sym: s.0, same_as }
                        }
                    })
                    .collect(),
                contiguous: contiguous[i],
            })
            .collect();
        Guards { inputs }
    }

    /// Whether every guard holds for `inputs` (the cache-hit path).
    #[inline]
    pub fn check(&self, inputs: &[Tensor]) -> bool {
        if inputs.len() != self.inputs.len() {
            return false;
        }
        for (guard, tensor) in self.inputs.iter().zip(inputs) {
            let shape = tensor.shape();
            if tensor.dtype() != guard.dtype || shape.len() != guard.dims.len() {
                return false;
            }
            for (dim, &n) in guard.dims.iter().zip(shape) {
                match *dim {
                    DimGuard::Equals(want) if want != n => return false,
                    DimGuard::Equals(_) => {}
                    DimGuard::Symbolic { same_as, .. } => {
                        if n < 2 {
                            return false;
                        }
                        if let Some((i, d)) = same_as {
                            if inputs[i].shape()[d] != n {
                                return false;
                            }
                        }
                    }
                }
            }
            if tensor.is_contiguous() != guard.contiguous {
                return false;
            }
        }
        true
    }

    /// The first guard that fails for `inputs`, in words; `None` if all hold.
    pub fn failure(&self, inputs: &[Tensor]) -> Option<String> {
        if inputs.len() != self.inputs.len() {
            return Some(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                inputs.len()
            ));
        }
        for (guard, tensor) in self.inputs.iter().zip(inputs) {
            let name = &guard.name;
            if tensor.dtype() != guard.dtype {
                return Some(format!(
                    "input {name}: expected dtype {}, got {}",
                    guard.dtype,
                    tensor.dtype()
                ));
            }
            if tensor.rank() != guard.dims.len() {
                return Some(format!(
                    "input {name}: expected rank {}, got {} (shape {:?})",
                    guard.dims.len(),
                    tensor.rank(),
                    tensor.shape()
                ));
            }
            for (d, (dim, &n)) in guard.dims.iter().zip(tensor.shape()).enumerate() {
                match *dim {
                    DimGuard::Equals(want) if want != n => {
                        return Some(format!("input {name}, dim {d}: expected {want}, got {n}"))
                    }
                    DimGuard::Equals(_) => {}
                    DimGuard::Symbolic { sym, same_as } => {
                        if n < 2 {
                            return Some(format!(
                                "input {name}, dim {d}: expected size >= 2 (symbolic s{sym}; \
                                 sizes 0 and 1 are specialized), got {n}"
                            ));
                        }
                        if let Some((i, e)) = same_as {
                            let other = inputs[i].shape()[e];
                            if other != n {
                                return Some(format!(
                                    "input {name}, dim {d}: expected the size of input {}, dim \
                                     {e} (s{sym} = {other}), got {n}",
                                    self.inputs[i].name
                                ));
                            }
                        }
                    }
                }
            }
            if tensor.is_contiguous() != guard.contiguous {
                return Some(if guard.contiguous {
                    format!(
                        "input {name}: expected contiguous, got strides {:?}",
                        tensor.strides()
                    )
                } else {
                    format!("input {name}: expected non-contiguous, got contiguous")
                });
            }
        }
        None
    }

    /// Every guard in words, one per line, for `explain` and the `guards` log.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for guard in &self.inputs {
            let dims: Vec<String> = guard
                .dims
                .iter()
                .map(|d| match d {
                    DimGuard::Equals(n) => n.to_string(),
                    DimGuard::Symbolic { sym, .. } => format!("s{sym}"),
                })
                .collect();
            lines.push(format!(
                "input {}: dtype {}, shape [{}], {}",
                guard.name,
                guard.dtype,
                dims.join(", "),
                if guard.contiguous {
                    "contiguous"
                } else {
                    "non-contiguous"
                }
            ));
            for (d, dim) in guard.dims.iter().enumerate() {
                if let DimGuard::Symbolic { sym, same_as } = dim {
                    let mut line = format!("input {}, dim {d}: s{sym} >= 2", guard.name);
                    if let Some((i, e)) = same_as {
                        line += &format!(" and == input {}, dim {e}", self.inputs[*i].name);
                    }
                    lines.push(line);
                }
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minductor_ir::{static_shape, SymId};

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| ["x", "y"][i].to_string()).collect()
    }

    #[test]
    fn static_guard_names_input_dim_expected_and_got() {
        let ty = TensorType::new(DType::F32, static_shape(&[256, 4]));
        let guards = Guards::new(&names(1), &[ty], &[true]);
        let ok = Tensor::zeros(DType::F32, &[256, 4]);
        let bad = Tensor::zeros(DType::F32, &[128, 4]);
        assert!(guards.check(std::slice::from_ref(&ok)));
        assert_eq!(guards.failure(&[ok]), None);
        assert!(!guards.check(std::slice::from_ref(&bad)));
        assert_eq!(
            guards.failure(&[bad]).unwrap(),
            "input x, dim 0: expected 256, got 128"
        );
        let half = Tensor::zeros(DType::F16, &[256, 4]);
        assert_eq!(
            guards.failure(&[half]).unwrap(),
            "input x: expected dtype f32, got f16"
        );
        let transposed = Tensor::zeros(DType::F32, &[4, 256])
            .permute(&[1, 0])
            .unwrap();
        assert!(!guards.check(std::slice::from_ref(&transposed)));
        assert!(guards
            .failure(&[transposed])
            .unwrap()
            .starts_with("input x: expected contiguous"));
    }

    #[test]
    fn symbolic_guard_accepts_any_size_from_two_and_ties_duck_sized_dims() {
        let s0 = Dim::Sym(SymId(0));
        let x = TensorType::new(DType::F32, [s0, Dim::Static(3)].into_iter().collect());
        let y = TensorType::new(DType::F32, [s0].into_iter().collect());
        let guards = Guards::new(&names(2), &[x, y], &[true, true]);
        for n in [2, 7, 1000] {
            let inputs = [
                Tensor::zeros(DType::F32, &[n, 3]),
                Tensor::zeros(DType::F32, &[n]),
            ];
            assert!(guards.check(&inputs), "size {n}");
        }
        let one = [
            Tensor::zeros(DType::F32, &[1, 3]),
            Tensor::zeros(DType::F32, &[1]),
        ];
        assert!(!guards.check(&one));
        assert!(guards.failure(&one).unwrap().contains("expected size >= 2"));
        let unequal = [
            Tensor::zeros(DType::F32, &[4, 3]),
            Tensor::zeros(DType::F32, &[5]),
        ];
        assert!(!guards.check(&unequal));
        assert_eq!(
            guards.failure(&unequal).unwrap(),
            "input y, dim 0: expected the size of input x, dim 0 (s0 = 4), got 5"
        );
    }
}
