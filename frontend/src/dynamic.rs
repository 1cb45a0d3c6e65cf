//! The dynamic-shape policy of `jit`: which input dims are traced symbolic.
//!
//! Each function remembers every input dim's size at its compiles (Dynamo's frame state). With
//! `dynamic: None` (automatic dynamic shapes) a dim whose size differs from an earlier compile's
//! becomes dynamic; `Some(true)` makes every dim dynamic, `Some(false)` none. A dynamic dim is
//! traced as a symbol unless its size is 0 or 1 (always specialized, as Dynamo does) or Rust code
//! once read it as a number (then it stays static). Dims of equal size share one symbol (duck
//! sizing); `guards.rs` ties them at call time.

use minductor_ir::{Dim, Shape, SymId, TensorType};
use minductor_runtime::Tensor;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum DimSeen {
    Static(usize),
    Dynamic,
}

/// What earlier compiles saw of each input's dims (Dynamo's frame state).
#[derive(Clone, Default)]
pub(crate) struct FrameState {
    pub(crate) dims: Vec<Option<Vec<DimSeen>>>,
    /// Dims Rust code read as numbers while symbolic: compiled static from then on.
    pub(crate) forced_static: HashMap<(usize, usize), String>,
}

/// How one call's inputs are typed for tracing.
#[derive(Clone)]
pub(crate) struct Typing {
    pub(crate) types: Vec<TensorType>,
    /// Example size of each symbol.
    pub(crate) hints: HashMap<u32, usize>,
    /// The (input, dim) positions of each symbol.
    pub(crate) positions: HashMap<u32, Vec<(usize, usize)>>,
    /// What the dynamic policy decided, in words, for `explain` and the `dynamic` log.
    pub(crate) notes: Vec<String>,
}

impl FrameState {
    /// Records `inputs`' sizes; returns which dims changed since the last compile.
    pub(crate) fn update(&mut self, names: &[String], inputs: &[Tensor]) -> Vec<String> {
        let mut changed = Vec::new();
        if self.dims.len() < inputs.len() {
            self.dims.resize(inputs.len(), None);
        }
        for (i, t) in inputs.iter().enumerate() {
            match &mut self.dims[i] {
                Some(seen) if seen.len() == t.rank() => {
                    for (d, (s, &n)) in seen.iter_mut().zip(t.shape()).enumerate() {
                        if let DimSeen::Static(old) = *s {
                            if old != n {
                                *s = DimSeen::Dynamic;
                                changed.push(format!(
                                    "input {}, dim {d}: size changed {old} -> {n}; marking it \
                                     dynamic",
                                    names[i]
                                ));
                            }
                        }
                    }
                }
                slot => {
                    *slot = Some(t.shape().iter().map(|&n| DimSeen::Static(n)).collect());
                }
            }
        }
        changed
    }

    pub(crate) fn typing(
        &self,
        names: &[String],
        inputs: &[Tensor],
        dynamic: Option<bool>,
    ) -> Typing {
        let mut symbol_of_size: HashMap<usize, u32> = HashMap::new();
        let mut typing = Typing {
            types: Vec::new(),
            hints: HashMap::new(),
            positions: HashMap::new(),
            notes: Vec::new(),
        };
        for (i, t) in inputs.iter().enumerate() {
            let mut shape = Shape::new();
            for (d, &n) in t.shape().iter().enumerate() {
                let wanted = match dynamic {
                    Some(all) => all,
                    None => matches!(
                        self.dims
                            .get(i)
                            .and_then(|s| s.as_ref())
                            .and_then(|s| s.get(d)),
                        Some(DimSeen::Dynamic)
                    ),
                };
                let forced = self.forced_static.get(&(i, d));
                let dim = if !wanted {
                    Dim::Static(n)
                } else if let Some(why) = forced {
                    typing.notes.push(format!(
                        "input {}, dim {d}: static ({n}), because {why}",
                        names[i]
                    ));
                    Dim::Static(n)
                } else if n < 2 {
                    typing.notes.push(format!(
                        "input {}, dim {d}: size {n} specialized (sizes 0 and 1 are always \
                         specialized)",
                        names[i]
                    ));
                    Dim::Static(n)
                } else {
                    let next = symbol_of_size.len() as u32;
                    let sym = *symbol_of_size.entry(n).or_insert(next);
                    typing.hints.insert(sym, n);
                    typing.positions.entry(sym).or_default().push((i, d));
                    Dim::Sym(SymId(sym))
                };
                shape.push(dim);
            }
            typing.types.push(TensorType::new(t.dtype(), shape));
        }
        for (sym, positions) in &typing.positions {
            let at: Vec<String> = positions
                .iter()
                .map(|(i, d)| format!("input {}, dim {d}", names[*i]))
                .collect();
            typing.notes.push(format!(
                "s{sym} (example {}): {}",
                typing.hints[sym],
                at.join(", ")
            ));
        }
        typing.notes.sort();
        typing
    }
}

pub(crate) fn is_symbolic(types: &[TensorType]) -> bool {
    types.iter().any(|t| t.static_sizes().is_none())
}

pub(crate) fn static_types(inputs: &[Tensor]) -> Vec<TensorType> {
    inputs.iter().map(|t| t.tensor_type()).collect()
}
