//! Row stages at full vector width (`codegen_cpu/src/lower/rows.rs`, routines in
//! `math/block/rows.rs`): softmax, log-softmax, layer norm (with and without weight and bias),
//! RMS norm and SwiGLU's `silu(a) * b` over rows of lengths around every register, chain and
//! block boundary, against the reference interpreter; bit for bit the same on 1, 2 and 3
//! threads; and the report's vector width, which on an AVX-512 machine must be 512 for these
//! kernels (256 with AVX2 only, 128 without either).

use minductor::internals::codegen_cpu::lower::{kernel_vector_bits, set_row_shapes_by_cpu};
use minductor::internals::kernel_ir::Step;
use minductor::{compile, interpret, Graph, Tensor, Traced};
use minductor_tests::Tolerance;
use std::sync::Mutex;

fn values(shape: &[usize], seed: u32) -> Tensor {
    minductor_tests::sine_values(shape, seed, 3.0)
}

fn build(shapes: &[&[usize]], f: impl FnOnce(&[Traced]) -> Vec<Traced>) -> (Graph, Vec<Tensor>) {
    minductor_tests::build_graph(shapes, values, f)
}

/// Row lengths around the boundaries: one lane, an AVX2 and an AVX-512 register, the four
/// registers of a step, a sum's block of 1024, and two blocks plus a tail.
const LENGTHS: [usize; 16] = [
    1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 1023, 1024, 1025, 2100,
];

/// Serializes the tests' switch of `set_row_shapes_by_cpu` (one process, tests on threads).
static SWITCH: Mutex<()> = Mutex::new(());

/// Compiles `graph` with every row stage that has a routine taking it, at every row length
/// (`set_row_shapes_by_cpu(false)`: rows shorter than `SHORT_ROW` keep the loop otherwise, and
/// `tests/tests/short_rows.rs` checks that form), checks that every kernel runs at
/// `minductor_tests::widest_bits()` when `wide` (the row routines took every stage), compares with the
/// interpreter within `tol`, and checks the same bits on 1, 2 and 3 threads.
fn check(graph: &Graph, inputs: &[Tensor], tol: f64, wide: bool, what: &str) {
    let want = interpret(graph, inputs).unwrap();
    // The widths are asked for under the same setting (the report's answer follows it).
    let (compiled, widths) = {
        let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
        set_row_shapes_by_cpu(false);
        let compiled = compile(graph).unwrap_or_else(|e| panic!("{what}: {e}"));
        let program = compiled.artifacts().program.clone().unwrap();
        let widths: Vec<(String, Option<u32>)> = (program.steps.iter())
            .filter_map(|step| match step {
                Step::Kernel(k) => Some((k.name.clone(), kernel_vector_bits(k, &program))),
                _ => None,
            })
            .collect();
        set_row_shapes_by_cpu(true);
        (compiled, widths)
    };
    let program = compiled.artifacts().program.clone().unwrap();
    if wide && std::env::var("MINDUCTOR_ROW_KERNELS").is_err() {
        for (name, bits) in widths {
            assert_eq!(
                bits,
                Some(minductor_tests::widest_bits()),
                "{what}: kernel {name} is not at full width\n{program}"
            );
        }
    }
    let got = minductor_tests::assert_same_bits_on_threads(&compiled, inputs, &[2, 3], what);
    minductor_tests::assert_allclose(
        &got,
        &want,
        Tolerance::close(tol),
        &format!("{what}\n{program}"),
    );
}

#[test]
fn softmax_and_log_softmax_rows_at_every_tail_length() {
    for &n in &LENGTHS {
        for rows in [1, 5] {
            let (g, inputs) = build(&[&[rows, n]], |i| vec![i[0].softmax(-1)]);
            check(&g, &inputs, 1e-6, true, &format!("softmax of {rows}x{n}"));
            let (g, inputs) = build(&[&[rows, n]], |i| vec![i[0].log_softmax(-1)]);
            check(
                &g,
                &inputs,
                1e-5,
                false,
                &format!("log_softmax of {rows}x{n}"),
            );
        }
    }
}

#[test]
fn layer_norm_rows_at_every_tail_length() {
    for &n in &LENGTHS {
        let (g, inputs) = build(&[&[3, n], &[n], &[n]], |i| {
            vec![i[0].layer_norm(&[n], Some(&i[1]), Some(&i[2]), 1e-5)]
        });
        // The affine store stays a 4-lane loop (see the shapes in `math/block/rows.rs`).
        check(&g, &inputs, 2e-5, false, &format!("layer_norm of 3x{n}"));
        let (g, inputs) = build(&[&[3, n]], |i| {
            vec![i[0].layer_norm(&[n], None, None, 1e-5)]
        });
        check(
            &g,
            &inputs,
            2e-5,
            true,
            &format!("plain layer_norm of 3x{n}"),
        );
        let (g, inputs) = build(&[&[3, n], &[n]], |i| {
            vec![i[0].layer_norm(&[n], Some(&i[1]), None, 1e-5)]
        });
        check(
            &g,
            &inputs,
            2e-5,
            true,
            &format!("weighted layer_norm of 3x{n}"),
        );
    }
}

#[test]
fn rms_norm_and_gated_products_at_every_tail_length() {
    for &n in &LENGTHS {
        // LLaMA's RMSNorm: x * rsqrt(mean(x²) + eps) * w.
        let (g, inputs) = build(&[&[4, n], &[n]], |i| {
            let x = &i[0];
            let r = x.mul(x).mean(&[-1], true).add(1e-6).rsqrt();
            vec![x.mul(&r).mul(&i[1])]
        });
        check(&g, &inputs, 2e-5, true, &format!("rms_norm of 4x{n}"));
        // SwiGLU's silu(a) * b.
        let (g, inputs) = build(&[&[2, n], &[2, n]], |i| vec![i[0].silu().mul(&i[1])]);
        check(&g, &inputs, 1e-5, false, &format!("silu(a) * b of 2x{n}"));
    }
}

/// Rows with a NaN or an infinity: the maximum is NaN (every element of a NaN row), an
/// infinite row's softmax is what the interpreter gives.
#[test]
fn softmax_rows_with_nan_and_infinity() {
    for &n in &[1usize, 17, 100] {
        for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut v: Vec<f32> = values(&[2, n], 0).to_vec().unwrap();
            v[n / 2] = special;
            let x = Tensor::from_vec(&[2, n], v).unwrap();
            let (g, _) = build(&[&[2, n]], |i| vec![i[0].softmax(-1)]);
            check(
                &g,
                std::slice::from_ref(&x),
                1e-6,
                true,
                &format!("softmax of 2x{n} with {special}"),
            );
        }
    }
}

/// Rotary embeddings as the LLaMA block writes them (`x * cos + rotate_half(x) * sin`, with
/// `rotate_half(x) = cat(-x2, x1)`: a stage of two stores, a negation and a copy), a transposing
/// copy, a sum of two products and an SGD step, at head widths and lengths around the
/// boundaries.
#[test]
fn rotary_copies_and_optimizer_steps_at_every_tail_length() {
    for &n in &[2usize, 16, 18, 32, 34, 64, 66, 130] {
        let half = (n / 2) as isize;
        let (g, inputs) = build(&[&[2, 3, 5, n], &[5, n], &[5, n]], |i| {
            let x = &i[0];
            let x1 = x.slice(-1, Some(0), Some(half), 1);
            let x2 = x.slice(-1, Some(half), None, 1);
            let rotated = Traced::cat(&[&x2.neg(), &x1], -1);
            let y = x.mul(&i[1]).add(&rotated.mul(&i[2]));
            vec![y.transpose(1, 2).mul(2.0)]
        });
        check(&g, &inputs, 1e-5, false, &format!("rotary over 2x3x5x{n}"));
    }
    for &n in &LENGTHS {
        let (g, inputs) = build(&[&[3, n], &[3, n], &[3, n], &[3, n]], |i| {
            vec![i[0].mul(&i[1]).add(&i[2].mul(&i[3]))]
        });
        check(&g, &inputs, 1e-5, false, &format!("a*b + c*d of 3x{n}"));
        let (g, inputs) = build(&[&[3, n], &[3, n]], |i| vec![i[0].sub(&i[1].mul(0.001))]);
        check(&g, &inputs, 1e-6, false, &format!("p - g*lr of 3x{n}"));
        let (g, inputs) = build(&[&[3, n]], |i| vec![i[0].transpose(0, 1).neg()]);
        check(&g, &inputs, 0.0, false, &format!("-xᵀ of 3x{n}"));
    }
}
