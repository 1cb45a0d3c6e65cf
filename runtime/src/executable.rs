//! What every backend's compiled artifact implements, and the input checks all of them share.

use crate::{RuntimeError, Tensor};
use minductor_ir::{shape_string, Dim, Graph};

/// A compiled graph ready to run. `run` takes the graph inputs in order and returns its outputs.
/// Calls may come from several threads at once: an executable keeps per-call state (arenas) in
/// a pool, not behind one lock held for the call.
pub trait Executable: Send + Sync {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError>;

    /// Runs like `run`, and times each step (one entry for the whole call if the backend has no
    /// steps of its own).
    fn profile(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<StepTiming>), RuntimeError> {
        let started = std::time::Instant::now();
        let outputs = self.run(inputs)?;
        let timing = StepTiming {
            name: "graph".to_string(),
            time: started.elapsed(),
        };
        Ok((outputs, vec![timing]))
    }

    /// Bytes this executable keeps allocated between calls (its buffer arenas); 0 if none.
    fn arena_bytes(&self) -> usize {
        0
    }
}

/// Wall time of one step of a call (a kernel, or a GEMM with its epilogue).
#[derive(Clone, Debug)]
pub struct StepTiming {
    pub name: String,
    pub time: std::time::Duration,
}

/// Checks arity, dtype, rank and static sizes of `inputs` against the graph's declared inputs.
/// The error names the input, what was expected and what was found.
pub fn check_inputs(graph: &Graph, inputs: &[Tensor]) -> Result<(), RuntimeError> {
    if inputs.len() != graph.inputs().len() {
        return Err(RuntimeError::Arity {
            expected: graph.inputs().len(),
            found: inputs.len(),
        });
    }
    for (index, (tensor, &id)) in inputs.iter().zip(graph.inputs()).enumerate() {
        // The name is only built for an error: a call that passes allocates nothing here.
        let name = || graph.input_name(index).to_string();
        let want = graph.ty(id);
        if tensor.dtype() != want.dtype {
            return Err(RuntimeError::DType {
                name: name(),
                expected: want.dtype.to_string(),
                found: tensor.dtype().to_string(),
            });
        }
        if tensor.rank() != want.rank() {
            return Err(RuntimeError::Rank {
                name: name(),
                expected: want.rank(),
                found: tensor.rank(),
                shape: tensor.shape().to_vec(),
            });
        }
        let matches = want
            .shape
            .iter()
            .zip(tensor.shape())
            .all(|(d, &n)| match d {
                Dim::Static(s) => *s == n,
                Dim::Sym(_) => true,
            });
        if !matches {
            return Err(RuntimeError::Shape {
                name: name(),
                expected: shape_string(&want.shape),
                found: tensor.shape().to_vec(),
            });
        }
    }
    Ok(())
}
