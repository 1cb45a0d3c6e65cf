//! Row routines (`codegen_cpu/src/lower/rows.rs`) against the Cranelift loops they replace, in
//! one process (`set_row_kernels`; its own test binary, since the switch is process-wide):
//! stored values of pointwise shapes bit for bit the same (the routines perform the same
//! operations per element, FMAs where the loop contracts), and whole workloads (the LLaMA block,
//! the train step, softmax, layer norm) within the tolerance of their different summation order.

use minductor::internals::codegen_cpu::lower::{
    kernel_vector_bits, set_row_kernels, set_row_shapes_by_cpu, stage_vector_bits,
};
use minductor::internals::kernel_ir::Step;
use minductor::internals::kernels::math::block::block_isa;
use minductor::{compile, Graph, Tensor, Traced};
use minductor_tests::Tolerance;
use std::sync::Mutex;

/// The switch is process-wide and tests run on several threads: one comparison at a time.
static SWITCH: Mutex<()> = Mutex::new(());

fn values(shape: &[usize], seed: u32) -> Tensor {
    minductor_tests::sine_values(shape, seed, 3.0)
}

/// `input` with NaN, -0, 0, +inf and -inf at elements 0, 7, 14, 21 and 28 (those it has).
fn with_specials(input: &Tensor) -> Tensor {
    let mut x = input.to_vec::<f32>().unwrap();
    for (k, v) in [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY]
        .into_iter()
        .enumerate()
    {
        if let Some(slot) = x.get_mut(k * 7) {
            *slot = v;
        }
    }
    Tensor::from_vec(input.shape(), x).unwrap()
}

/// The outputs of `graph` compiled with row routines and without; asserts (`wide`) that with
/// them some kernel (or GEMM epilogue) runs wider than Cranelift's 128 bits (where the CPU has
/// AVX2 or AVX-512).
fn both(graph: &Graph, inputs: &[Tensor], what: &str, wide: bool) -> (Vec<Tensor>, Vec<Tensor>) {
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_row_kernels(true);
    // Every shape with a routine, also those this CPU keeps as loops (`set_row_shapes_by_cpu`).
    set_row_shapes_by_cpu(false);
    let compiled = compile(graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let widest = program
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Kernel(k) => kernel_vector_bits(k, &program),
            Step::Matmul(m) => m
                .epilogue
                .as_ref()
                .and_then(|k| kernel_vector_bits(k, &program)),
            _ => None,
        })
        .max();
    set_row_shapes_by_cpu(true);
    if wide && block_isa().is_some() {
        assert!(widest > Some(128), "{what}: no row routine\n{program}");
    }
    let rows = compiled.call(inputs).unwrap();
    set_row_kernels(false);
    let loops = compile(graph).unwrap().call(inputs).unwrap();
    set_row_kernels(true);
    (rows, loops)
}

#[test]
fn pointwise_shapes_store_the_same_bits_as_the_cranelift_loop() {
    type Build = fn(&[Traced]) -> Vec<Traced>;
    let cases: [(&str, usize, Build); 6] = [
        ("silu(a) * b", 2, |i| vec![i[0].silu().mul(&i[1])]),
        ("a*b + c*d", 4, |i| {
            vec![i[0].mul(&i[1]).add(&i[2].mul(&i[3]))]
        }),
        ("p - g*lr", 2, |i| vec![i[0].sub(&i[1].mul(0.001))]),
        ("(a - 1) * 3 * b", 2, |i| {
            vec![i[0].sub(1.0).mul(3.0).mul(&i[1])]
        }),
        ("a / 7", 1, |i| vec![i[0].div(7.0)]),
        // A layer norm's affine store: `(x - mean) * rstd * weight + bias`.
        ("(a - 1) * 3 * b + c", 3, |i| {
            vec![i[0].sub(1.0).mul(3.0).mul(&i[1]).add(&i[2])]
        }),
    ];
    for (what, operands, f) in cases {
        for &n in &[1usize, 15, 16, 17, 64, 1023, 1025] {
            let shape = [3, n];
            let shapes: Vec<&[usize]> = vec![&shape[..]; operands];
            let (g, inputs) = minductor_tests::build_graph(&shapes, values, f);
            let what = format!("{what} of 3x{n}");
            let (rows, loops) = both(&g, &inputs, &what, true);
            minductor_tests::assert_allclose(&rows, &loops, Tolerance::EXACT, &what);
        }
    }
}

#[test]
fn suite_workloads_agree_with_the_cranelift_loops() {
    for name in [
        "softmax_4096x1024",
        "layernorm_4096x1024",
        "llama_block_4x256x512",
        "mlp_train_step_256",
        "mlp_256x1024x4096",
        "attention_8x256x512",
        "resnet_block_8x64x56",
    ] {
        let w = minductor_tools::workloads::by_name(name).unwrap();
        let (rows, loops) = both(&w.graph, &w.inputs, name, true);
        minductor_tests::assert_allclose(&rows, &loops, Tolerance::close(2e-5), name);
    }
}

/// The shapes that start with a row product or sum (`x * p + q`, a GEMM epilogue's bias before
/// its activation), end with a ReLU, or scale by per-channel values (a batch norm in eval mode),
/// against the Cranelift loop, bit for bit: rows of every tail length, values with NaN, ±0 and
/// infinities where a ReLU meets them.
#[test]
fn epilogue_shapes_store_the_same_bits_as_the_cranelift_loop() {
    type Build = fn(&[Traced]) -> Vec<Traced>;
    // Operand shapes as (rows, columns), with 0 for "n".
    type Shapes = &'static [(usize, usize)];
    let cases: [(&str, Shapes, Build); 11] = [
        ("gelu(a*b + c)", &[(3, 0), (3, 0), (3, 0)], |i| {
            vec![i[0].mul(&i[1]).add(&i[2]).gelu()]
        }),
        ("gelu(a + bias)", &[(3, 0), (1, 0)], |i| {
            vec![i[0].add(&i[1]).gelu()]
        }),
        ("silu(a + bias)", &[(3, 0), (1, 0)], |i| {
            vec![i[0].add(&i[1]).silu()]
        }),
        ("tanh(bias + a)", &[(3, 0), (1, 0)], |i| {
            vec![i[1].add(&i[0]).tanh()]
        }),
        ("sigmoid(a)", &[(3, 0)], |i| vec![i[0].sigmoid()]),
        ("exp(a)", &[(3, 0)], |i| vec![i[0].exp()]),
        ("r + (a + bias)", &[(3, 0), (1, 0), (3, 0)], |i| {
            vec![i[2].add(&i[0].add(&i[1]))]
        }),
        ("relu(a)", &[(3, 0)], |i| vec![i[0].relu()]),
        ("relu(a + r)", &[(3, 0), (3, 0)], |i| {
            vec![i[0].add(&i[1]).relu()]
        }),
        (
            "relu(batch_norm(a))",
            &[(3, 0), (3, 1), (3, 1), (3, 1), (3, 1)],
            |i| {
                vec![i[0]
                    .sub(&i[1])
                    .mul(&i[2].abs().add(1e-5).rsqrt())
                    .mul(&i[3])
                    .add(&i[4])
                    .relu()]
            },
        ),
        (
            "relu(batch_norm(a) + r)",
            &[(3, 0), (3, 1), (3, 1), (3, 1), (3, 1), (3, 0)],
            |i| {
                vec![i[0]
                    .sub(&i[1])
                    .mul(&i[2].abs().add(1e-5).rsqrt())
                    .mul(&i[3])
                    .add(&i[4])
                    .add(&i[5])
                    .relu()]
            },
        ),
    ];
    for (what, operands, f) in cases {
        for &n in &[1usize, 15, 16, 17, 56, 64, 1023, 1025] {
            let shapes: Vec<Vec<usize>> = operands
                .iter()
                .map(|&(r, c)| vec![r, if c == 0 { n } else { c }])
                .collect();
            let shapes: Vec<&[usize]> = shapes.iter().map(|s| &s[..]).collect();
            let (g, mut inputs) = minductor_tests::build_graph(&shapes, values, f);
            // NaN, infinities and both zeros in the first operand (where the ReLU sees them).
            inputs[0] = with_specials(&inputs[0]);
            let what = format!("{what} of 3x{n}");
            // (At n = 1 the per-channel values are rows of one element too: another shape.)
            let (rows, loops) = both(&g, &inputs, &what, n > 1);
            minductor_tests::assert_allclose(&rows, &loops, Tolerance::EXACT, &what);
        }
    }
}

/// Column sums in the outer-reduction order (a bias gradient, `p - lr * g.sum(0)`) by the
/// column routine against the 4-lane loop, bit for bit: row counts around its block of 64,
/// column counts around its group of 32 (the tail columns run the loop) and its calls of up to
/// 256 columns (a full call, a short last one, one of 8 groups less one), with an infinity and
/// a NaN in some columns.
#[test]
fn column_sums_store_the_same_bits_as_the_cranelift_loop() {
    for rows in [1usize, 3, 64, 65, 200] {
        for columns in [32usize, 33, 70, 100, 255, 256, 257, 300, 520, 1001] {
            let (g, mut inputs) =
                minductor_tests::build_graph(&[&[rows, columns], &[columns]], values, |i| {
                    vec![i[1].sub(&i[0].sum(&[0], false).mul(0.001))]
                });
            let mut x = inputs[0].to_vec::<f32>().unwrap();
            if let Some(v) = x.get_mut(columns + 2) {
                *v = f32::INFINITY;
            }
            if let Some(v) = x.get_mut(2 * columns + 5) {
                *v = f32::NAN;
            }
            inputs[0] = Tensor::from_vec(&[rows, columns], x).unwrap();
            let what = format!("column sums of {rows}x{columns}");
            let (wide, loops) = both(&g, &inputs, &what, true);
            minductor_tests::assert_allclose(&wide, &loops, Tolerance::EXACT, &what);
        }
    }
}

/// A column sum whose kernel goes on to read the summed buffer again (`x - x.mean(0)`: the
/// routine sums a call's columns before the groups' store stage runs) and whose columns the
/// runtime splits across threads: the 4-lane loop's bits, at 1 to 3 threads, with a NaN and
/// infinities in some columns.
#[test]
fn column_sums_read_again_by_their_kernel_give_the_loops_bits_on_any_thread_count() {
    for (rows, columns) in [(65usize, 1001usize), (300, 2080)] {
        let (g, mut inputs) = minductor_tests::build_graph(&[&[rows, columns]], values, |i| {
            vec![i[0].sub(&i[0].mean(&[0], true))]
        });
        let mut x = inputs[0].to_vec::<f32>().unwrap();
        x[3 * columns + 300] = f32::NAN;
        x[64 * columns + 7] = f32::INFINITY;
        x[64 * columns + 700] = f32::NEG_INFINITY;
        inputs[0] = Tensor::from_vec(&[rows, columns], x).unwrap();
        let what = format!("x - x.mean(0) of {rows}x{columns}");
        // (The store stage runs Cranelift's loop: the kernel's narrowest stage is 128 bits.)
        let (wide, loops) = both(&g, &inputs, &what, false);
        minductor_tests::assert_allclose(&wide, &loops, Tolerance::EXACT, &what);
        // `stage_vector_bits` lowers the kernel again under the switches of the moment: under
        // the lock too, or another test's loop compile turns the routines off meanwhile.
        let routines_on = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
        let compiled = compile(&g).unwrap();
        if block_isa().is_some() {
            let program = compiled.artifacts().program.clone().unwrap();
            let [Step::Kernel(k)] = program.steps.as_slice() else {
                panic!("{what}: one kernel\n{program}");
            };
            let bits = stage_vector_bits(k, &program);
            assert!(
                bits[0] > Some(128),
                "{what}: no column routine {bits:?}\n{program}"
            );
        }
        drop(routines_on);
        let one = minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], &what);
        minductor_tests::assert_allclose(&one, &wide, Tolerance::EXACT, &what);
    }
}

/// A sum over a middle axis (`[batch, rows, columns]` over the rows: the column loop inside a
/// batch loop) by the column routine against the 4-lane loop, bit for bit, with column counts
/// that end in a short call and a tail.
#[test]
fn middle_axis_sums_store_the_same_bits_as_the_cranelift_loop() {
    for (batch, rows, columns) in [(3usize, 70usize, 300usize), (2, 129, 545)] {
        let (g, mut inputs) =
            minductor_tests::build_graph(&[&[batch, rows, columns]], values, |i| {
                vec![i[0].sum(&[1], false)]
            });
        let mut x = inputs[0].to_vec::<f32>().unwrap();
        x[rows * columns + 5 * columns + 290] = f32::NAN;
        x[rows * columns + 64 * columns + 3] = f32::INFINITY;
        inputs[0] = Tensor::from_vec(&[batch, rows, columns], x).unwrap();
        let what = format!("sum over the middle axis of {batch}x{rows}x{columns}");
        let (wide, loops) = both(&g, &inputs, &what, true);
        minductor_tests::assert_allclose(&wide, &loops, Tolerance::EXACT, &what);
    }
}

/// GELU's gradient as autodiff writes it (`gelu(acc + bias)` backward, a GEMM epilogue of a
/// training step), against the Cranelift loop, bit for bit, at row lengths around the register
/// and block boundaries; with inputs up to 14 too, so that many lanes fall where the
/// derivative's `exp` is flushed (|x| > 13.2).
#[test]
fn gelu_gradient_stores_the_same_bits_as_the_cranelift_loop() {
    let c = std::f64::consts::FRAC_1_SQRT_2;
    for (&n, scale) in [1usize, 15, 16, 17, 64, 1023, 1025]
        .iter()
        .flat_map(|n| [(n, 3.0), (n, 14.0)])
    {
        let values = |shape: &[usize], seed| minductor_tests::sine_values(shape, seed, scale);
        let (g, inputs) = minductor_tests::build_graph(&[&[3, n], &[n], &[3, n]], values, |i| {
            let t = i[0].add(&i[1]);
            let grad = &i[2];
            let s = t.mul(c);
            let p = grad.mul(&s.erf().add(1.0)).mul(0.5);
            let h = grad.mul(&t.mul(0.5));
            let floor = minductor::internals::passes::ERF_GRAD_FLOOR;
            let m = s.mul(&s).neg();
            let tiny = m.lt(floor);
            let gauss = tiny
                .where_(0.0, &tiny.where_(floor, &m).exp())
                .mul(std::f64::consts::FRAC_2_SQRT_PI);
            vec![p.add(&h.mul(&gauss).mul(c))]
        });
        let what = format!("gelu gradient of 3x{n}, scaled by {scale}");
        let (rows, loops) = both(&g, &inputs, &what, n > 1);
        minductor_tests::assert_allclose(&rows, &loops, Tolerance::EXACT, &what);
    }
}

/// A layer norm's affine store is a routine on an AVX-512 CPU with full-width units; where the
/// CPU splits 512-bit operations in two (Zen 4; see `lower/rows.rs`) it is the routine only
/// when its output is under half the last-level cache, else the 4-lane loop. Its two sums are
/// routines on both. Checked on the suite's layer norm (a 16 MiB output) and on a 64 KiB one.
#[test]
fn a_layer_norms_affine_store_follows_the_cpu() {
    use minductor::internals::kernels::cache::l3_bytes;
    use minductor::internals::kernels::math::block::{splits_512_bit_operations, BlockIsa};
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_row_kernels(true);
    let suite = minductor_tools::workloads::by_name("layernorm_4096x1024").unwrap();
    let small = minductor::trace(|t| {
        let x = t.input("x", minductor::DType::F32, &[64, 256]);
        let w = t.input("w", minductor::DType::F32, &[256]);
        let b = t.input("b", minductor::DType::F32, &[256]);
        vec![x.layer_norm(&[256], Some(&w), Some(&b), 1e-5)]
    })
    .unwrap();
    for (graph, output_bytes) in [(&suite.graph, 4096 * 1024 * 4), (&small, 64 * 256 * 4)] {
        let program = minductor_tests::compiled_program(graph);
        let bits: Vec<Option<u32>> = program
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Kernel(k) => Some(kernel_vector_bits(k, &program)),
                _ => None,
            })
            .collect();
        let fits = l3_bytes().is_some_and(|l3| output_bytes < l3 / 2);
        let expected = match block_isa() {
            Some(BlockIsa::Avx512) if !splits_512_bit_operations() || fits => Some(512),
            Some(BlockIsa::Avx2) => Some(256),
            // Zen 4 with a large output (the affine store's loop is the narrowest stage), or
            // no routines at all.
            _ => Some(128),
        };
        assert_eq!(bits, vec![expected], "{program}");
    }
}

/// Stores around the caches (`ROW_STREAM`, chosen for outputs too large for the last-level
/// cache, here forced for every output with `set_stream_bytes`) give the cached stores' bits:
/// rows whose start is aligned to a register (non-temporal stores) and rows that are not (the
/// routine falls back), tails of every length, a GELU and a row product, at 1, 2 and 3 threads.
/// A softmax, whose kernel reads back the exponentials it stores, never streams them. (The
/// routines' own test runs every shape, reductions included, with the flag.)
#[test]
fn streamed_stores_give_the_cached_stores_bits() {
    use minductor::internals::codegen_cpu::lower::stage_streams;
    use minductor::internals::kernels::math::block::rows::set_stream_bytes;
    type Build = fn(&[Traced]) -> Vec<Traced>;
    // (what, operands, graph, whether its stores may stream)
    let cases: [(&str, usize, Build, bool); 3] = [
        (
            "gelu(a*b + c)",
            3,
            |i| vec![i[0].mul(&i[1]).add(&i[2]).gelu()],
            true,
        ),
        ("a * w + b", 3, |i| vec![i[0].mul(&i[1]).add(&i[2])], true),
        ("softmax(a)", 1, |i| vec![i[0].softmax(-1)], false),
    ];
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_row_kernels(true);
    for (what, operands, f, streamable) in cases {
        for n in [1000usize, 1024, 1041] {
            let shape = [37, n];
            let shapes: Vec<&[usize]> = vec![&shape[..]; operands];
            let (g, inputs) = minductor_tests::build_graph(&shapes, values, f);
            let what = format!("{what} of 37x{n}");
            let mut outputs = Vec::new();
            for threshold in [0, usize::MAX] {
                set_stream_bytes(Some(threshold));
                let compiled = compile(&g);
                let program = compiled
                    .as_ref()
                    .ok()
                    .and_then(|c| c.artifacts().program.clone());
                let streams = program.iter().flat_map(|p| &p.steps).any(|s| match s {
                    Step::Kernel(k) => stage_streams(k, program.as_ref().unwrap()).contains(&true),
                    _ => false,
                });
                set_stream_bytes(None);
                let (compiled, program) = (compiled.unwrap(), program.unwrap());
                let expected = streamable && threshold == 0 && block_isa().is_some();
                assert_eq!(
                    streams, expected,
                    "{what}, threshold {threshold}\n{program}"
                );
                let what = format!("{what}, threshold {threshold}");
                outputs.push(minductor_tests::assert_same_bits_on_threads(
                    &compiled,
                    &inputs,
                    &[2, 3],
                    &what,
                ));
            }
            minductor_tests::assert_allclose(&outputs[0], &outputs[1], Tolerance::EXACT, &what);
        }
    }
}

/// A kernel's first row stage prefetches the next row (`ROW_PREFETCH_NEXT`) when its rows follow
/// each other in memory, and no other stage does: a softmax and a layer norm over rows of 1024
/// do; a softmax over the first 1024 columns of rows of 2048 (each row 1024 values after the
/// last ends) does not. The outputs are the same bits at 1, 2 and 3 threads (the routine's own
/// test checks the flag changes no bit).
#[test]
fn only_a_first_stage_over_rows_that_follow_each_other_prefetches_the_next() {
    use minductor::internals::codegen_cpu::lower::stage_prefetches;
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_row_kernels(true);
    type Build = fn(&[Traced]) -> Vec<Traced>;
    // (what, input shape, graph, whether its first stage prefetches)
    let cases: [(&str, [usize; 2], Build, bool); 3] = [
        ("softmax", [37, 1024], |i| vec![i[0].softmax(-1)], true),
        (
            "layer norm",
            [37, 1024],
            |i| vec![i[0].layer_norm(&[1024], None, None, 1e-5)],
            true,
        ),
        (
            "softmax of a column slice",
            [37, 2048],
            |i| vec![i[0].slice(1, Some(0), Some(1024), 1).softmax(-1)],
            false,
        ),
    ];
    for (what, shape, f, prefetches) in cases {
        let (g, inputs) = minductor_tests::build_graph(&[&shape[..]], values, f);
        let compiled = compile(&g).unwrap();
        let program = compiled.artifacts().program.clone().unwrap();
        let kernels: Vec<Vec<bool>> = program
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Kernel(k) => Some(stage_prefetches(k, &program)),
                _ => None,
            })
            .collect();
        let expected = prefetches && block_isa().is_some();
        assert!(!kernels.is_empty(), "{what}: no kernel\n{program}");
        for stages in &kernels {
            assert_eq!(stages[0], expected, "{what}: first stage\n{program}");
            assert!(
                !stages[1..].contains(&true),
                "{what}: a later stage\n{program}"
            );
        }
        minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[1, 2, 3], what);
    }
}

/// The vector width of a row routine on this CPU (`None` without one).
fn row_routine_bits() -> Option<u32> {
    use minductor::internals::kernels::math::block::BlockIsa;
    block_isa().map(|isa| match isa {
        BlockIsa::Avx512 => 512,
        BlockIsa::Avx2 => 256,
    })
}

/// Every kernel of `graph` at the row routines' width (128 without them), and the same bits at
/// 2 and 3 threads as at 1: the kernels' widths.
fn assert_full_width_and_same_bits_on_threads(
    graph: &Graph,
    inputs: &[Tensor],
    what: &str,
) -> Vec<Option<u32>> {
    let widths = kernel_widths(graph);
    assert!(
        widths
            .iter()
            .all(|&w| w == row_routine_bits().or(Some(128))),
        "{what}: {widths:?}"
    );
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let compiled = compile(graph).unwrap();
    minductor_tests::assert_same_bits_on_threads(&compiled, inputs, &[2, 3], what);
    widths
}

/// The narrowest vector width of each kernel and GEMM epilogue of `graph`'s program, as
/// compiled with row routines and the per-CPU choices.
fn kernel_widths(graph: &Graph) -> Vec<Option<u32>> {
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_row_kernels(true);
    let program = minductor_tests::compiled_program(graph);
    program
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Kernel(k) => Some(kernel_vector_bits(k, &program)),
            Step::Matmul(m) => m.epilogue.as_ref().map(|k| kernel_vector_bits(k, &program)),
            _ => None,
        })
        .collect()
}

/// A GELU forward that also stores the values its backward reads, as a training step's
/// partitioner saves them (`s = (a + bias) * (1/√2)`, `erf(s) + 1`, `(a + bias) * 0.5` and the
/// GELU itself, four stores of one stage), against the Cranelift loop bit for bit at every
/// tail length, NaN, infinities and both zeros included; each store is a row routine (the
/// product by `1/√2` before `erf` is `SCALE_FIRST`, the `+ 1` `OFFSET`, the GELU a composite
/// whose inner values have other uses), the same bits at 1, 2 and 3 threads.
#[test]
fn a_gelu_forward_storing_its_saved_values_runs_at_full_width_with_the_loops_bits() {
    type Build = fn(&[Traced]) -> Vec<Traced>;
    let with_bias: Build = |i| {
        let t = i[0].add(&i[1]);
        let s = t.mul(std::f64::consts::FRAC_1_SQRT_2);
        let one_plus = s.erf().add(1.0);
        let half = t.mul(0.5);
        vec![s, one_plus.clone(), half.clone(), half.mul(&one_plus)]
    };
    let without: Build = |i| {
        let s = i[0].mul(std::f64::consts::FRAC_1_SQRT_2);
        vec![s.erf().add(1.0)]
    };
    for (what, operands, f) in [
        ("gelu(a + bias) with its saved values", 2, with_bias),
        ("erf(a * c) + 1", 1, without),
    ] {
        for &n in &[1usize, 15, 16, 17, 64, 1023, 1024, 1025] {
            let shapes: Vec<Vec<usize>> = [vec![3, n], vec![n]][..operands].to_vec();
            let shapes: Vec<&[usize]> = shapes.iter().map(|s| &s[..]).collect();
            let (g, mut inputs) = minductor_tests::build_graph(&shapes, values, f);
            inputs[0] = with_specials(&inputs[0]);
            let what = format!("{what} of 3x{n}");
            let (rows, loops) = both(&g, &inputs, &what, n > 1);
            minductor_tests::assert_allclose(&rows, &loops, Tolerance::EXACT, &what);
            if n == 1024 {
                assert_full_width_and_same_bits_on_threads(&g, &inputs, &what);
            }
        }
    }
}

/// GELU's gradient from the values its forward saved (`erf(s) + 1`, `x * 0.5` and `s`, rows
/// of the backward's epilogue, with the `exp` argument floored at `ERF_GRAD_FLOOR` as autodiff
/// writes it) against the Cranelift loop, bit for bit, with inputs up to 14 too (many lanes
/// past the floor); a row routine (`GELU_GRAD_SAVED`), the same bits at 1, 2 and 3 threads.
#[test]
fn a_gelu_gradient_from_saved_values_runs_at_full_width_with_the_loops_bits() {
    let c = std::f64::consts::FRAC_1_SQRT_2;
    for (&n, scale) in [1usize, 15, 16, 17, 64, 1023, 1024, 1025]
        .iter()
        .flat_map(|n| [(n, 3.0), (n, 14.0)])
    {
        let values = |shape: &[usize], seed| minductor_tests::sine_values(shape, seed, scale);
        let shape = [3, n];
        let shapes: [&[usize]; 4] = [&shape; 4];
        let (g, inputs) = minductor_tests::build_graph(&shapes, values, |i| {
            let (grad, one_plus, half, s) = (&i[0], &i[1], &i[2], &i[3]);
            let p = grad.mul(one_plus).mul(0.5);
            let h = grad.mul(half);
            let floor = minductor::internals::passes::ERF_GRAD_FLOOR;
            let m = s.mul(s).neg();
            let tiny = m.lt(floor);
            let gauss = tiny
                .where_(0.0, &tiny.where_(floor, &m).exp())
                .mul(std::f64::consts::FRAC_2_SQRT_PI);
            vec![p.add(&h.mul(&gauss).mul(c))]
        });
        let what = format!("gelu gradient from saved values of 3x{n}, scaled by {scale}");
        let (rows, loops) = both(&g, &inputs, &what, n > 1);
        minductor_tests::assert_allclose(&rows, &loops, Tolerance::EXACT, &what);
        if n == 1024 {
            let widths = assert_full_width_and_same_bits_on_threads(&g, &inputs, &what);
            assert_eq!(widths.len(), 1, "{what}: {widths:?}");
        }
    }
}

/// A mean squared error's gradient after a linear layer's bias (`d = a + bias - target`
/// stored, and `g * d + g * d` for the loss's scale `g`, as autodiff writes the gradient of
/// a square), against the Cranelift loop bit for bit, NaN, infinities and both zeros
/// included; both stores row routines (`SUB_ROW`, `DOUBLE`), the same bits at 1, 2 and 3
/// threads.
#[test]
fn a_squared_errors_gradient_runs_at_full_width_with_the_loops_bits() {
    for &n in &[1usize, 15, 16, 17, 64, 1023, 1024, 1025] {
        let shapes: [&[usize]; 4] = [&[3, n], &[n], &[3, n], &[]];
        let (g, mut inputs) = minductor_tests::build_graph(&shapes, values, |i| {
            let d = i[0].add(&i[1]).sub(&i[2]);
            let scaled = i[3].div(262144.0).mul(&d);
            vec![d, scaled.add(&scaled)]
        });
        inputs[0] = with_specials(&inputs[0]);
        let what = format!("a squared error's gradient of 3x{n}");
        let (rows, loops) = both(&g, &inputs, &what, n > 1);
        minductor_tests::assert_allclose(&rows, &loops, Tolerance::EXACT, &what);
        if n == 1024 {
            let widths = assert_full_width_and_same_bits_on_threads(&g, &inputs, &what);
            assert_eq!(widths.len(), 1, "{what}: {widths:?}");
        }
    }
}

/// Every GEMM epilogue of the MLP's training step (the GELU forward storing its saved values,
/// the loss gradient, the GELU gradient from the saved values, the weight updates) runs at the
/// row routines' width where the CPU has them (what `minductor report` prints as `vec`).
#[test]
fn the_train_steps_epilogues_run_at_the_row_routines_width() {
    let w = minductor_tools::workloads::by_name("mlp_train_step_256").unwrap();
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_row_kernels(true);
    let program = minductor_tests::compiled_program(&w.graph);
    let epilogues: Vec<(String, Option<u32>)> = program
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Matmul(m) => m
                .epilogue
                .as_ref()
                .map(|k| (k.name.clone(), kernel_vector_bits(k, &program))),
            _ => None,
        })
        .collect();
    assert!(epilogues.len() >= 5, "{epilogues:?}\n{program}");
    let expected = row_routine_bits().or(Some(128));
    assert!(
        epilogues.iter().all(|(_, bits)| *bits == expected),
        "{epilogues:?}\n{program}"
    );
}

/// Rotary embeddings over half heads, as the LLaMA block's: `x1 * cos + (-x2) * sin` and
/// `x2 * cos + x1 * sin` (`cos` and `sin` broadcast across heads), the output permuted to
/// heads first.
fn rotary(i: &[Traced]) -> Vec<Traced> {
    let n = i[0].dims()[3].size() as isize / 2;
    let x1 = i[0].slice(3, None, Some(n), 1);
    let x2 = i[0].slice(3, Some(n), None, 1);
    let first = x1.mul(&i[1]).add(&x2.neg().mul(&i[2]));
    let second = x2.mul(&i[1]).add(&x1.mul(&i[2]));
    vec![Traced::cat(&[&first, &second], 3).permute(&[0, 2, 1, 3])]
}

/// Rows shorter than `SHORT_ROW` (64) in kernels whose one stage only stores: rotary embeddings
/// over half heads ([`rotary`]), and a batch norm with a residual and a ReLU over images
/// (per-channel values, rows that follow each other), at the lengths of the suite (32, 56) and
/// around them. The batch norms run at the row routines' width, one call per run of rows that
/// follow each other (`choose_row_runs` in `lower/rows.rs`; before, such rows kept the 4-lane
/// loop), and so does the rotary kernel, one call per run of heads, each head's two halves in
/// one pass (`HALVES`; before, it kept the loop: its halves apart measured slower); the copy
/// that permutes its output, over short rows apart, keeps the loop. Every kernel stores the
/// loop's bits at 1, 2 and 3 threads.
#[test]
fn short_rows_run_at_full_width_and_store_the_same_bits_as_the_cranelift_loop() {
    type Build = fn(&[Traced]) -> Vec<Traced>;
    let rotary: Build = rotary;
    let batch_norm: Build = |i| {
        vec![i[0]
            .sub(&i[1])
            .mul(&i[2].abs().add(1e-5).rsqrt())
            .mul(&i[3])
            .add(&i[4])
            .add(&i[5])
            .relu()]
    };
    // The same as a convolution's epilogue (the ResNet block's).
    let conv_batch_norm: Build = |i| {
        let options = minductor::ConvOptions {
            padding: 1,
            ..Default::default()
        };
        vec![i[0]
            .conv2d(&i[1], None, options)
            .sub(&i[2])
            .mul(&i[3].abs().add(1e-5).rsqrt())
            .mul(&i[4])
            .add(&i[5])
            .add(&i[6])
            .relu()]
    };
    let bits = match block_isa() {
        Some(minductor::internals::kernels::math::block::BlockIsa::Avx512) => Some(512),
        Some(minductor::internals::kernels::math::block::BlockIsa::Avx2) => Some(256),
        None => None,
    };
    for n in [7usize, 32, 33, 56, 57] {
        let channel = [16, 1, 1];
        let image = [12, 16, n, n];
        // (name, input shapes, graph)
        let cases: [(&str, Vec<Vec<usize>>, Build); 3] = [
            (
                "rotary",
                vec![vec![2, 40, 8, 2 * n], vec![40, 1, n], vec![40, 1, n]],
                rotary,
            ),
            (
                "relu(batch_norm(a) + r)",
                vec![
                    image.to_vec(),
                    channel.to_vec(),
                    channel.to_vec(),
                    channel.to_vec(),
                    channel.to_vec(),
                    image.to_vec(),
                ],
                batch_norm,
            ),
            (
                "relu(batch_norm(conv2d(a)) + r)",
                vec![
                    vec![4, 8, n, n],
                    vec![16, 8, 3, 3],
                    channel.to_vec(),
                    channel.to_vec(),
                    channel.to_vec(),
                    channel.to_vec(),
                    vec![4, 16, n, n],
                ],
                conv_batch_norm,
            ),
        ];
        for (what, shapes, f) in cases {
            let shapes: Vec<&[usize]> = shapes.iter().map(|s| &s[..]).collect();
            let (g, inputs) = minductor_tests::build_graph(&shapes, values, f);
            let what = format!("{what}, rows of {n}");
            let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
            set_row_kernels(true);
            let compiled = compile(&g).unwrap();
            let program = compiled.artifacts().program.clone().unwrap();
            let kernels = program.steps.iter().filter_map(|s| match s {
                Step::Kernel(k) => Some(k),
                Step::Matmul(m) => m.epilogue.as_ref(),
                _ => None,
            });
            for k in kernels {
                if let Some(bits) = bits {
                    // The copy that permutes the rotary output (its rows apart in the load)
                    // keeps the loop over rows shorter than `SHORT_ROW`; every other kernel,
                    // the rotary kernel included, runs at the routines' width.
                    let short = k.stages.iter().any(|st| {
                        matches!(st.extent.as_slice(), [d] if d.as_static().is_some_and(|d| d < 64))
                    });
                    let copy = k.stages.iter().all(|st| st.action.stores().len() == 1);
                    let expected = if what.starts_with("rotary") && short && copy {
                        128
                    } else {
                        bits
                    };
                    assert_eq!(
                        kernel_vector_bits(k, &program),
                        Some(expected),
                        "{what}: a kernel not at {expected} bits\n{program}"
                    );
                }
            }
            let rows =
                minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], &what);
            set_row_kernels(false);
            let loops = compile(&g).unwrap();
            let loops = minductor_tests::assert_same_bits_on_threads(&loops, &inputs, &[2], &what);
            set_row_kernels(true);
            minductor_tests::assert_allclose(&rows, &loops, Tolerance::EXACT, &what);
        }
    }
}

/// Rotary embeddings ([`rotary`]) with NaN, both infinities and both zeros in `x`, `cos` and
/// `sin`, at every half-head length up to 40 and around `SHORT_ROW` (64, where each head row
/// is a call of its own rather than a run of heads), over 8 and over 3 heads: the kernel is one
/// `HALVES` routine call per run of heads (or per head) at the row routines' width, storing the
/// Cranelift loop's bits (NaN where it stores NaN) at 1, 2 and 3 threads.
#[test]
fn rotary_halves_run_at_full_width_with_the_loops_bits_at_every_length() {
    let bits = row_routine_bits();
    let lengths = (1..=40).chain([56, 63, 64, 65, 100]);
    for (n, heads) in lengths.flat_map(|n| [(n, 8), (n, 3)]) {
        let shapes = [vec![2, 24, heads, 2 * n], vec![24, 1, n], vec![24, 1, n]];
        let shapes: Vec<&[usize]> = shapes.iter().map(|s| &s[..]).collect();
        let (g, mut inputs) = minductor_tests::build_graph(&shapes, values, rotary);
        let specials = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY];
        for (input, step) in inputs.iter_mut().zip([7usize, 5, 3]) {
            let shape = input.shape().to_vec();
            let mut v = input.to_vec::<f32>().unwrap();
            for (k, &s) in specials.iter().enumerate() {
                for at in [k * step, v.len() / 2 + k * step + 1] {
                    if let Some(slot) = v.get_mut(at) {
                        *slot = s;
                    }
                }
            }
            *input = Tensor::from_vec(&shape, v).unwrap();
        }
        let what = format!("rotary over {heads} heads of 2 x {n}");
        let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
        set_row_kernels(true);
        let compiled = compile(&g).unwrap();
        let program = compiled.artifacts().program.clone().unwrap();
        let rotaries: Vec<_> = (program.steps.iter())
            .filter_map(|s| match s {
                Step::Kernel(k) if k.stages.iter().any(|st| st.action.stores().len() == 2) => {
                    Some(k)
                }
                _ => None,
            })
            .collect();
        assert_eq!(rotaries.len(), 1, "{what}\n{program}");
        if let Some(bits) = bits {
            assert_eq!(
                stage_vector_bits(rotaries[0], &program),
                vec![Some(bits)],
                "{what}\n{program}"
            );
        }
        let rows = minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], &what);
        set_row_kernels(false);
        let loops = compile(&g).unwrap();
        let loops = minductor_tests::assert_same_bits_on_threads(&loops, &inputs, &[2], &what);
        set_row_kernels(true);
        minductor_tests::assert_allclose(&rows, &loops, Tolerance::EXACT, &what);
        let nan = |t: &Tensor| t.to_vec::<f32>().unwrap().iter().any(|v| v.is_nan());
        assert!(nan(&rows[0]), "{what}: no NaN reached the output");
    }
}
