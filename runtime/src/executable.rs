//! What every backend's compiled artifact implements, and the input checks all of them share.

use crate::{RuntimeError, Tensor};
use minductor_ir::{shape_string, DType, Dim, Graph};

/// The environment variable holding a default memory limit for calls (see
/// [`memory_limit_from_env`]).
pub const MEMORY_LIMIT_VAR: &str = "MINDUCTOR_MEMORY_LIMIT";

/// `MINDUCTOR_MEMORY_LIMIT` read as a byte count (`1073741824`, `512M`, `4G`, `1T`: binary
/// multiples), or `None` when it is unset, empty or unreadable (an unreadable value is logged
/// nowhere and ignored: a limit that cannot be read is no limit).
pub fn memory_limit_from_env() -> Option<usize> {
    std::env::var(MEMORY_LIMIT_VAR)
        .ok()
        .and_then(|v| parse_memory_size(&v))
}

/// A byte count with an optional binary suffix (`K`, `M`, `G`, `T`, optionally followed by
/// `B` or `iB`): `"512M"` is 536870912. `None` if it is not one or overflows.
pub fn parse_memory_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number: usize = number.parse().ok()?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return None,
    };
    number.checked_mul(1usize << shift)
}

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

    /// Times each step as `profile` does, with every GEMM's epilogue left out: the products
    /// alone (the report's "product" column, so that a GEMM step's time can be told apart from
    /// its epilogue's). The values the epilogues would have written are not written, so the
    /// later steps compute from whatever their buffers held and no outputs are returned.
    /// Default (a backend without steps of its own): `profile`'s timings.
    fn profile_products(&self, inputs: &[Tensor]) -> Result<Vec<StepTiming>, RuntimeError> {
        Ok(self.profile(inputs)?.1)
    }

    /// Bytes a call on `inputs` would allocate, at most (its arena, outputs and copies, or the
    /// interpreter's values), checked against a memory limit before the call starts; `None`
    /// when the executable cannot tell. Inputs are those `run` takes (already checked).
    fn memory_needed(&self, inputs: &[Tensor]) -> Result<Option<usize>, RuntimeError> {
        let _ = inputs;
        Ok(None)
    }

    /// Bytes this executable keeps allocated between calls (its buffer arenas); 0 if none.
    fn arena_bytes(&self) -> usize {
        0
    }

    /// How a call on `inputs` would split each step into pieces on `threads` threads, without
    /// running any step: the executor's own splitting rules, asked for another thread count.
    /// Backends without steps of their own have nothing to split.
    fn partition(
        &self,
        inputs: &[Tensor],
        threads: usize,
    ) -> Result<Vec<StepPartition>, RuntimeError> {
        let _ = (inputs, threads);
        Err(RuntimeError::Unsupported(
            "this backend runs no steps of its own to split across threads".into(),
        ))
    }

    /// Told that every call will feed `constants` as inputs `first..first + constants.len()`
    /// (a frozen compile's constants, contiguous), the executable may prepare work that depends
    /// only on them once, now (the compiled program packs the GEMM operands they are). Returns
    /// how many such preparations it made; this default makes none. Calls stay correct whatever
    /// inputs they are given: prepared work is used only when a call's input is the very tensor
    /// it was prepared from.
    fn prepare_constants(&mut self, first: usize, constants: &[Tensor]) -> usize {
        let _ = (first, constants);
        0
    }

    /// Runs like `run`, writing output `i` into `outputs[i]`: a tensor the caller hands in (from
    /// an earlier call, say) with the output's dtype and shape, contiguous and not sharing its
    /// storage with any other tensor ([`output_destination`]). On an error the outputs may
    /// hold partial results. This default runs `run` and copies each result in; executables
    /// that can write the caller's memory directly (compiled programs) override it.
    fn run_into(&self, inputs: &[Tensor], outputs: &mut [Tensor]) -> Result<(), RuntimeError> {
        let results = self.run(inputs)?;
        if results.len() != outputs.len() {
            return Err(RuntimeError::OutputBufferCount {
                expected: results.len(),
                found: outputs.len(),
            });
        }
        let mut destinations = Vec::with_capacity(results.len());
        for (index, (result, out)) in results.iter().zip(outputs.iter_mut()).enumerate() {
            destinations.push(output_destination(
                index,
                result.dtype(),
                result.shape(),
                out,
            )?);
        }
        for (result, destination) in results.iter().zip(destinations) {
            let bytes = result.contiguous().to_bytes();
            // SAFETY: `output_destination` checked that the destination is the first element
            // of a contiguous, uniquely owned tensor of the result's dtype and shape, so it holds
            // exactly `bytes.len()` bytes; `bytes` is a fresh vector, so the ranges are disjoint.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), destination, bytes.len()) };
        }
        Ok(())
    }
}

/// Checks that `out` can receive output `index`, of `dtype` and `shape`, in place: the same
/// dtype and shape, contiguous, and its storage shared with no other tensor (so writing it
/// changes no other tensor, the call's inputs included). Returns a pointer to its first element,
/// valid for `shape`'s elements of `dtype` while `out` is borrowed.
pub fn output_destination(
    index: usize,
    dtype: DType,
    shape: &[usize],
    out: &mut Tensor,
) -> Result<*mut u8, RuntimeError> {
    let fail = |found: String| RuntimeError::OutputBuffer {
        index,
        expected: format!("a contiguous, unshared {dtype}{shape:?}"),
        found,
    };
    if out.dtype() != dtype || out.shape() != shape {
        return Err(fail(format!("{}{:?}", out.dtype(), out.shape())));
    }
    if !out.is_contiguous() {
        return Err(fail(format!(
            "a non-contiguous view (strides {:?})",
            out.strides()
        )));
    }
    out.data_mut_ptr()
        .ok_or_else(|| fail("a tensor sharing its storage with another tensor".to_string()))
}

/// Wall time of one step of a call (a kernel, or a GEMM with its epilogue).
#[derive(Clone, Debug)]
pub struct StepTiming {
    pub name: String,
    pub time: std::time::Duration,
}

/// How one step of a call splits across threads: the work of each piece the executor hands to
/// the thread pool, in the step's own unit (multiply-adds for GEMMs and attention, elements
/// visited for loop kernels). Each piece runs on one thread: a team runs each thread's share
/// in order, then the threads steal (see [`StepPartition::schedule_overhead`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StepPartition {
    /// The step's name, as [`StepTiming`] spells it.
    pub name: String,
    /// The work of each piece; one piece when the step runs on the calling thread.
    pub pieces: Vec<u64>,
    /// What a unit of `pieces` counts.
    pub unit: WorkUnit,
}

/// What the work of a [`StepPartition`]'s pieces counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkUnit {
    /// Elements a kernel (or a scatter-add, or a fallback step) computes.
    Elements,
    /// Multiply-adds of a GEMM or of the fused attention.
    MultiplyAdds,
}

impl std::fmt::Display for WorkUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WorkUnit::Elements => "elements",
            WorkUnit::MultiplyAdds => "multiply-adds",
        })
    }
}

impl StepPartition {
    /// The step's whole work, the sum of its pieces'.
    pub fn total(&self) -> u64 {
        self.pieces
            .iter()
            .fold(0u64, |acc, &w| acc.saturating_add(w))
    }

    /// The largest piece's work over the mean piece's (1 when the pieces are equal, or when
    /// there is no work).
    pub fn imbalance(&self) -> f64 {
        let total = self.total();
        let largest = self.pieces.iter().copied().max().unwrap_or(0);
        if total == 0 {
            return 1.0;
        }
        largest as f64 * self.pieces.len() as f64 / total as f64
    }

    /// The longest any of `threads` threads works when the pieces are run as a team runs them
    /// (`threads::in_team`), on threads of equal speed, over the work of a perfect split
    /// (`total / threads`): 1 is perfect, 2 means the step takes twice as long as it could.
    /// Each thread runs its own contiguous share of the pieces in order, then steals the last
    /// unclaimed piece of the next threads' shares; whichever thread is free first claims
    /// first.
    pub fn schedule_overhead(&self, threads: usize) -> f64 {
        let threads = threads.max(1);
        let total = self.total();
        if total == 0 {
            return 1.0;
        }
        let chunks = self.pieces.len();
        // Each thread's unclaimed pieces, `front..back`, and the time it is free.
        let mut shares: Vec<(usize, usize)> = (0..threads)
            .map(|t| (chunks * t / threads, chunks * (t + 1) / threads))
            .collect();
        let mut free = vec![0u64; threads];
        let mut finished = vec![false; threads];
        while let Some(t) = (0..threads)
            .filter(|&t| !finished[t])
            .min_by_key(|&t| (free[t], t))
        {
            let claimed = (0..threads).find_map(|offset| {
                let owner = (t + offset) % threads;
                let (front, back) = &mut shares[owner];
                if front >= back {
                    return None;
                }
                Some(if offset == 0 {
                    *front += 1;
                    *front - 1
                } else {
                    *back -= 1;
                    *back
                })
            });
            match claimed {
                Some(piece) => free[t] = free[t].saturating_add(self.pieces[piece]),
                None => finished[t] = true,
            }
        }
        let longest = free.into_iter().max().unwrap_or(0);
        longest as f64 * threads as f64 / total as f64
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(pieces: &[u64]) -> StepPartition {
        StepPartition {
            name: "step".to_string(),
            pieces: pieces.to_vec(),
            unit: WorkUnit::Elements,
        }
    }

    #[test]
    fn the_schedule_runs_each_share_in_order_then_steals_from_the_back() {
        // Equal pieces, as many as threads or a multiple: perfect.
        assert_eq!(partition(&[5; 8]).schedule_overhead(4), 1.0);
        assert_eq!(partition(&[5; 8]).schedule_overhead(8), 1.0);
        // Shares [1, 1, 1] and [1, 4, 4]: thread 0 runs its three, then steals the last 4 of
        // thread 1's share while thread 1 runs its middle 4: 7 of a perfect 6.
        let p = partition(&[1, 1, 1, 1, 4, 4]);
        assert!((p.schedule_overhead(2) - 7.0 * 2.0 / 12.0).abs() < 1e-12);
        // Fewer pieces than threads: the largest piece bounds the step.
        assert!((partition(&[3, 1]).schedule_overhead(4) - 3.0 * 4.0 / 4.0).abs() < 1e-12);
        // No work.
        assert_eq!(partition(&[0, 0]).schedule_overhead(2), 1.0);
    }
}
