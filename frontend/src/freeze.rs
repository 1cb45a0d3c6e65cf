//! Freezing, like Inductor's `freezing=True`: some inputs (weights, batch-norm statistics) are
//! given at compile time, as constants.
//!
//! `compile_frozen(&graph, &[("w", w), …])` decomposes the graph, lets `passes::freeze` fold
//! every affine chain after a convolution into the convolution's weight (eval batch norm: the
//! epilogue keeps one add) and split off everything that depends on frozen values only, runs
//! that part once with the reference interpreter, and compiles the rest. The frozen inputs
//! leave the call: `call` takes the other inputs, in graph order, and the compiled object feeds
//! the folded values after them.
//!
//! A frozen compile does not go through the compile cache. It saves as an artifact whose
//! `constants` section carries the folded values (`artifact.rs`), and loads back frozen: the
//! loaded graph takes the same inputs and packs the same GEMM operands once.

use crate::compile::{compile_from, verified, CompileError, CompileOptions, Compiled, Start};
use minductor_ir::{Graph, Op};
use minductor_passes::{decompose, freeze, simplify};
use minductor_runtime::{interpret, RuntimeError, Tensor};
use std::time::Instant;
use thiserror::Error;
use tracing::info;

#[derive(Debug, Error)]
pub enum FreezeError {
    #[error("cannot freeze `{name}`: the graph has no input of that name (inputs: {inputs})")]
    UnknownInput { name: String, inputs: String },
    #[error("cannot freeze `{name}` twice")]
    Duplicate { name: String },
    #[error("cannot freeze `{name}`: expected {expected}, found {found}")]
    Mismatch {
        name: String,
        expected: String,
        found: String,
    },
    #[error("cannot freeze a graph with gradients (freezing is for inference)")]
    Gradients,
    #[error("evaluating the frozen constants failed: {0}")]
    Evaluate(#[from] RuntimeError),
}

/// Compiles `graph` with the default backend, the inputs named in `constants` frozen to the
/// given values.
pub fn compile_frozen(
    graph: &Graph,
    constants: &[(&str, Tensor)],
) -> Result<Compiled, CompileError> {
    compile_frozen_with_options(graph, constants, CompileOptions::default())
}

/// Compiles `graph` with `options`, the inputs named in `constants` frozen to the given values.
pub fn compile_frozen_with_options(
    graph: &Graph,
    constants: &[(&str, Tensor)],
    options: CompileOptions,
) -> Result<Compiled, CompileError> {
    crate::logging::init_lazily();
    graph.verify()?;
    if graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::Grad { .. }))
    {
        return Err(FreezeError::Gradients.into());
    }
    let started = Instant::now();
    let count = graph.inputs().len();
    let mut values: Vec<Option<Tensor>> = vec![None; count];
    for (name, value) in constants {
        let index = (0..count)
            .find(|&i| graph.input_name(i) == *name)
            .ok_or_else(|| FreezeError::UnknownInput {
                name: name.to_string(),
                inputs: (0..count)
                    .map(|i| graph.input_name(i))
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        if values[index].is_some() {
            return Err(FreezeError::Duplicate {
                name: name.to_string(),
            }
            .into());
        }
        let want = graph.ty(graph.inputs()[index]);
        let matches =
            value.dtype() == want.dtype && want.static_sizes().as_deref() == Some(value.shape());
        if !matches {
            return Err(FreezeError::Mismatch {
                name: name.to_string(),
                expected: want.to_string(),
                found: format!("{}{:?}", value.dtype(), value.shape()),
            }
            .into());
        }
        values[index] = Some(value.clone());
    }
    let frozen: Vec<bool> = values.iter().map(Option::is_some).collect();
    let decomposed = verified("decompose", decompose(graph))?;
    let prims = verified("simplify", simplify(&decomposed))?;
    let split = freeze(&prims, &frozen);
    let run = verified("freeze", split.run.clone())?;
    verified("freeze", split.constants.clone())?;
    let frozen_values: Vec<Tensor> = values.into_iter().flatten().collect();
    let roots = interpret(&split.constants, &frozen_values).map_err(FreezeError::from)?;
    info!(
        target: "minductor::graph",
        "froze {} inputs: {} affine chains folded into GEMM weights, {} constants computed once",
        frozen_values.len(),
        split.folded_chains,
        roots.len()
    );
    let mut compiled = compile_from(Start::Prims(&run), options)?;
    compiled.set_frozen(roots, started.elapsed());
    info!(
        target: "minductor::graph",
        "frozen: {} GEMM operands packed once at compile time",
        compiled.prepacked_operands()
    );
    Ok(compiled)
}
