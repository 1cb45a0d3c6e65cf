//! End-to-end tests live in `tests/`. This library holds what they share: one comparison of
//! outputs, used by every test that checks results against a reference.

use minductor::{Compiled, DType, Graph, Tensor, Traced, Tracer};

/// The kernel program the pipeline's scheduling passes make of `graph` (simplified, fused,
/// buffers planned), for tests that print, parse or compile programs directly.
pub fn fused_and_planned(graph: &Graph) -> minductor::internals::kernel_ir::Program {
    use minductor::internals::passes::{fuse, plan_buffers, simplify};
    let mut program = fuse(&simplify(graph)).expect("the graph fuses");
    program.plan = Some(plan_buffers(&program));
    program
}

/// The kernel program `minductor::compile` made of `graph` (every pass, planned), for tests that
/// inspect or break it.
pub fn compiled_program(graph: &Graph) -> minductor::internals::kernel_ir::Program {
    let compiled = minductor::compile(graph).expect("the graph compiles");
    compiled
        .artifacts()
        .program
        .clone()
        .expect("a kernel program")
}

/// The widest vector width (bits) this CPU runs row routines, GEMM and attention at: 512 with
/// AVX-512, 256 with AVX2, else Cranelift's 128-bit loops.
pub fn widest_bits() -> u32 {
    use minductor::internals::kernels::math::block::{block_isa, BlockIsa};
    match block_isa() {
        Some(BlockIsa::Avx512) => 512,
        Some(BlockIsa::Avx2) => 256,
        None => 128,
    }
}

/// The vector width of every stage of `program`'s kernel steps, in order (see
/// `lower::stage_vector_bits`; GEMM epilogues are not kernel steps).
pub fn kernel_stage_bits(program: &minductor::internals::kernel_ir::Program) -> Vec<Option<u32>> {
    use minductor::internals::codegen_cpu::lower::stage_vector_bits;
    use minductor::internals::kernel_ir::Step;
    (program.steps.iter())
        .flat_map(|s| match s {
            Step::Kernel(k) => stage_vector_bits(k, program),
            _ => Vec::new(),
        })
        .collect()
}

/// How close a result must be to the reference: `|got - want| <= atol + rtol · |want|` for each
/// element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    /// Bit-for-bit equal values (NaN matching NaN).
    pub const EXACT: Tolerance = Tolerance {
        rtol: 0.0,
        atol: 0.0,
    };

    /// `tol` relative to `max(1, |want|)`, roughly: `rtol = atol = tol`.
    pub fn close(tol: f64) -> Tolerance {
        Tolerance {
            rtol: tol,
            atol: tol,
        }
    }
}

/// Compares outputs with a reference: the same number of outputs, and for each the same shape,
/// the same dtype and every element within `tol`. NaN matches only NaN (a NaN where a number is
/// expected, or a number where NaN is expected, is a mismatch); infinities must match exactly.
/// Returns the first difference in words, prefixed with `context`.
pub fn compare_outputs(
    got: &[Tensor],
    want: &[Tensor],
    tol: Tolerance,
    context: &str,
) -> Result<(), String> {
    compare_with_slack(got, want, None, tol, context)
}

/// The relative step by which [`nudged`] moves each input element: 2^-20, about 8 f32 ulps.
pub const NUDGE: f64 = 1.0 / (1u64 << 20) as f64;

/// `inputs` with every f32 and f64 element moved by [`NUDGE`] relative to itself, up or down by a
/// hash of its position; other dtypes (integers, bools, f16 and bf16, which a step this small
/// would not move) are unchanged. With [`compare_outputs_conditioned`].
pub fn nudged(inputs: &[Tensor]) -> Vec<Tensor> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if !matches!(t.dtype(), DType::F32 | DType::F64) {
                return t.clone();
            }
            let values: Vec<f64> = (t.to_f64_vec().into_iter().enumerate())
                .map(|(e, v)| {
                    let up = (e as u64 ^ ((i as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    v * (1.0 + if up >> 63 == 1 { NUDGE } else { -NUDGE })
                })
                .collect();
            Tensor::from_f64(t.dtype(), t.shape(), &values).expect("same dtype and shape")
        })
        .collect()
}

/// [`compare_outputs`] for a test's oracle that must not fail on ill-conditioned values: each
/// element may also differ by `4 · |want − at_nudged|`, where `at_nudged` is the reference at
/// [`nudged`] inputs. An element the graph amplifies rounding into (a layer norm of two nearly
/// equal values divides their difference, known to a few ulps, by a tiny deviation) moves
/// with the nudge by about as much as f32 rounding of its operands moves it, while a
/// well-conditioned element barely moves and keeps the plain tolerance. A nudged reference
/// that is NaN or infinite where `want` is not gives no slack.
pub fn compare_outputs_conditioned(
    got: &[Tensor],
    want: &[Tensor],
    at_nudged: &[Tensor],
    tol: Tolerance,
    context: &str,
) -> Result<(), String> {
    if at_nudged.len() != want.len() {
        return Err(format!(
            "{context}: the nudged reference has {} outputs, expected {}",
            at_nudged.len(),
            want.len()
        ));
    }
    compare_with_slack(got, want, Some(at_nudged), tol, context)
}

fn compare_with_slack(
    got: &[Tensor],
    want: &[Tensor],
    at_nudged: Option<&[Tensor]>,
    tol: Tolerance,
    context: &str,
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{context}: {} outputs, expected {}",
            got.len(),
            want.len()
        ));
    }
    for (o, (g, w)) in got.iter().zip(want).enumerate() {
        if g.shape() != w.shape() {
            return Err(format!(
                "{context}: output {o}: shape {:?}, expected {:?}",
                g.shape(),
                w.shape()
            ));
        }
        if g.dtype() != w.dtype() {
            return Err(format!(
                "{context}: output {o}: dtype {}, expected {}",
                g.dtype(),
                w.dtype()
            ));
        }
        let want_values = w.to_f64_vec();
        let slack: Vec<f64> = match at_nudged.map(|n| &n[o]) {
            Some(n) if n.shape() == w.shape() => (n.to_f64_vec().iter().zip(&want_values))
                .map(|(n, w)| {
                    let d = 4.0 * (n - w).abs();
                    if d.is_finite() {
                        d
                    } else {
                        0.0
                    }
                })
                .collect(),
            _ => vec![0.0; want_values.len()],
        };
        for (e, ((a, b), s)) in (g.to_f64_vec().iter().zip(want_values).zip(slack)).enumerate() {
            let ok = if a.is_nan() || b.is_nan() {
                a.is_nan() && b.is_nan()
            } else if a.is_infinite() || b.is_infinite() {
                *a == b
            } else {
                (a - b).abs() <= tol.atol + tol.rtol * b.abs() + s
            };
            if !ok {
                let slack = if s > 0.0 {
                    format!(", slack {s:e} from the nudged reference")
                } else {
                    String::new()
                };
                return Err(format!(
                    "{context}: output {o}, element {e}: {a}, expected {b} (rtol {}, atol {}{slack})",
                    tol.rtol, tol.atol
                ));
            }
        }
    }
    Ok(())
}

/// [`compare_outputs`], panicking with the first difference.
#[track_caller]
pub fn assert_allclose(got: &[Tensor], want: &[Tensor], tol: Tolerance, context: &str) {
    if let Err(message) = compare_outputs(got, want, tol, context) {
        panic!("{message}");
    }
}

/// Smooth, deterministic f32 test data: element `i` of the flattened tensor is
/// `sin((i + first)·step + phase)·scale + offset`, evaluated in f32 in that order (the named
/// helpers below are the waves the tests use).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Wave {
    pub first: f32,
    pub step: f32,
    pub phase: f32,
    pub scale: f32,
    pub offset: f32,
}

impl Wave {
    /// `sin(i·step + phase)`.
    pub fn new(step: f32, phase: f32) -> Wave {
        Wave {
            first: 0.0,
            step,
            phase,
            scale: 1.0,
            offset: 0.0,
        }
    }

    /// Counts `i` from `first` instead of 0.
    pub fn first(self, first: f32) -> Wave {
        Wave { first, ..self }
    }

    /// Multiplies every value by `scale`.
    pub fn scale(self, scale: f32) -> Wave {
        Wave { scale, ..self }
    }

    /// Adds `offset` to every (scaled) value.
    pub fn offset(self, offset: f32) -> Wave {
        Wave { offset, ..self }
    }

    /// The f32 tensor of `shape`.
    pub fn tensor(self, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|i| {
                ((i as f32 + self.first) * self.step + self.phase).sin() * self.scale + self.offset
            })
            .collect();
        Tensor::from_vec(shape, data).unwrap()
    }
}

/// The common ramp: element `i` is `sin(0.37·i + seed)`, in [-1, 1].
pub fn ramp(shape: &[usize], seed: f32) -> Tensor {
    Wave::new(0.37, seed).tensor(shape)
}

/// [`ramp`] times `scale`: `scale · sin(0.37·i + seed)`.
pub fn ramp_scaled(shape: &[usize], seed: f32, scale: f32) -> Tensor {
    Wave::new(0.37, seed).scale(scale).tensor(shape)
}

/// [`ramp`] counted from 1: `sin(0.37·(i + 1) + seed)` (the jit tests' inputs).
pub fn ramp_from_one(shape: &[usize], seed: f32) -> Tensor {
    Wave::new(0.37, seed).first(1.0).tensor(shape)
}

/// [`ramp_scaled`] computed in f64 and rounded once: `(scale · sin(0.37·i + seed)) as f32`.
pub fn ramp_f64(shape: &[usize], seed: f64, scale: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| ((i as f64 * 0.37 + seed).sin() * scale) as f32)
        .collect();
    Tensor::from_vec(shape, data).unwrap()
}

/// A wider ramp counted from 1: `2 · sin(0.37·(i + 1) + 1.7·seed)` (the attention tests' q, k,
/// v).
pub fn wide_ramp(shape: &[usize], seed: f32) -> Tensor {
    Wave::new(0.37, seed * 1.7)
        .first(1.0)
        .scale(2.0)
        .tensor(shape)
}

/// A slower ramp with a larger range: `2 · sin(0.61·i + seed)` (the symbolic-size tests).
pub fn slow_ramp(shape: &[usize], seed: f32) -> Tensor {
    Wave::new(0.61, seed).scale(2.0).tensor(shape)
}

/// Smooth, seeded test data: element `i` is `amplitude · sin((i + 1)·0.618 + 1.3·seed)`.
pub fn sine_values(shape: &[usize], seed: u32, amplitude: f32) -> Tensor {
    Wave::new(0.618, seed as f32 * 1.3)
        .first(1.0)
        .scale(amplitude)
        .tensor(shape)
}

/// [`sine_values`] shifted: `scale · sin((i + 1)·0.618 + 1.3·seed) + offset`.
pub fn shifted_sine_values(shape: &[usize], seed: u32, scale: f32, offset: f32) -> Tensor {
    Wave::new(0.618, seed as f32 * 1.3)
        .first(1.0)
        .scale(scale)
        .offset(offset)
        .tensor(shape)
}

/// [`sine_values`] with amplitude 3: `3 · sin((i + 1)·0.618 + 1.3·seed)`.
pub fn wide_sine_values(shape: &[usize], seed: u32) -> Tensor {
    sine_values(shape, seed, 3.0)
}

/// [`sine_values`] with amplitude 1: `sin((i + 1)·0.618 + 1.3·seed)`.
pub fn unit_sine_values(shape: &[usize], seed: u32) -> Tensor {
    sine_values(shape, seed, 1.0)
}

/// Hashed data on a grid of 1/250 in [-2, 2): element `i` is
/// `((i·2654435761 + 97·seed) mod 1000) / 250 − 2`. Not smooth: neighbours are unrelated, and
/// exact ties and zeros occur (the random graph tests' inputs).
pub fn hashed_values(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let values = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 250.0) - 2.0)
        .collect();
    Tensor::from_vec(shape, values).unwrap()
}

/// The graph of `f` over f32 inputs `in0, in1, …` of `shapes`, and inputs for it: input `i`
/// is `values(shapes[i], i)`.
pub fn build_graph(
    shapes: &[&[usize]],
    values: impl Fn(&[usize], u32) -> Tensor,
    f: impl FnOnce(&[Traced]) -> Vec<Traced>,
) -> (Graph, Vec<Tensor>) {
    let tracer = Tracer::new();
    let inputs: Vec<Traced> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| tracer.input(&format!("in{i}"), DType::F32, s))
        .collect();
    let outputs = f(&inputs);
    let tensors = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| values(s, i as u32))
        .collect();
    (tracer.finish(&outputs).unwrap(), tensors)
}

/// Calls `compiled` on `inputs` on one thread, then on each of `threads` threads, and panics
/// unless every call's outputs are bit for bit the first's (signed zeros and NaNs included):
/// how a step splits its work over threads must not change a result. Returns the one-thread
/// outputs. The thread count is restored to the default afterwards, even on a panic.
#[track_caller]
pub fn assert_same_bits_on_threads(
    compiled: &Compiled,
    inputs: &[Tensor],
    threads: &[usize],
    context: &str,
) -> Vec<Tensor> {
    /// Restores the default thread count when dropped.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = minductor::set_num_threads(0);
        }
    }
    let _restore = Restore;
    let run = |n: usize| {
        minductor::set_num_threads(n).unwrap();
        compiled.call(inputs).unwrap()
    };
    let bits = |outputs: &[Tensor]| -> Vec<Vec<u64>> {
        outputs
            .iter()
            .map(|t| t.to_f64_vec().iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    let one = run(1);
    for &n in threads {
        let many = run(n);
        assert!(
            bits(&one) == bits(&many),
            "{context}: {n} threads give other bits than 1 thread"
        );
    }
    one
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(values: &[f32]) -> Tensor {
        Tensor::from_vec(&[values.len()], values.to_vec()).unwrap()
    }

    #[test]
    fn compares_counts_shapes_dtypes_values_and_nan() {
        let ok = |g: &[Tensor], w: &[Tensor]| compare_outputs(g, w, Tolerance::close(1e-3), "c");
        assert!(ok(&[t(&[1.0, f32::NAN])], &[t(&[1.0005, f32::NAN])]).is_ok());
        assert!(ok(&[t(&[1.0])], &[t(&[1.0]), t(&[1.0])])
            .unwrap_err()
            .contains("1 outputs, expected 2"));
        assert!(ok(&[t(&[1.0, 2.0])], &[t(&[1.0])])
            .unwrap_err()
            .contains("shape"));
        let i = Tensor::from_vec(&[1], vec![1i64]).unwrap();
        assert!(ok(&[i], &[t(&[1.0])]).unwrap_err().contains("dtype"));
        assert!(ok(&[t(&[f32::NAN])], &[t(&[1.0])]).is_err());
        assert!(ok(&[t(&[1.0])], &[t(&[f32::NAN])]).is_err());
        assert!(ok(&[t(&[f32::INFINITY])], &[t(&[f32::NEG_INFINITY])]).is_err());
        assert!(ok(&[t(&[1.1])], &[t(&[1.0])])
            .unwrap_err()
            .contains("output 0, element 0: 1.100000023841858, expected 1"));
    }
}
