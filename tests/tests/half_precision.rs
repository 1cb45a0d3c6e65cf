//! Kernels over f16 and bf16 tensors: their loads and stores contiguous along a stage's loop are
//! converted a block at a time by the kernel library's routines, and a half-precision
//! operation's rounding in a chain of f32 operations is a math block (`lower/blocks.rs`,
//! `minductor_kernels::convert`); row stages (softmax, layer norm) widen their half rows for the
//! row routines and narrow their output rows (`lower/rows.rs`), in chunks of `HALF_ROW` elements
//! past that length. Each graph runs at lengths that end blocks short (1, 17, 257, 1000), cross
//! a sum's block of 1024 (1030) and exceed `HALF_ROW` (8200, and 20000: two whole chunks and a
//! part), against the interpreter within one rounding of the half type (it computes in f64 and
//! rounds once per operation, the kernels in f32), and bit for bit across 1, 2 and 3 threads.

use minductor::internals::codegen_cpu::lower::{HALF_CHUNKS, HALF_ROW};
use minductor::{compile, interpret, DType, Graph, Tensor, Traced, Tracer};
use minductor_tests::{hashed_values, Tolerance};

/// `f` of `x: [3, n]` of `dtype`, with `x`'s values the hashed ones rounded to `dtype`.
fn graph(dtype: DType, n: usize, f: fn(&Traced, DType) -> Vec<Traced>) -> (Graph, Vec<Tensor>) {
    let tracer = Tracer::new();
    let x = tracer.input("x", dtype, &[3, n]);
    let values = hashed_values(&[3, n], 5).to_f64_vec();
    (
        tracer.finish(&f(&x, dtype)).unwrap(),
        vec![Tensor::from_f64(dtype, &[3, n], &values).unwrap()],
    )
}

/// Half an ulp of `dtype` at 1, relative (the interpreter and the kernels may round a value
/// near a tie apart), twice over for the operations' rounding of each other's results.
fn tolerance(dtype: DType) -> Tolerance {
    Tolerance::close(match dtype {
        DType::F16 => 2.0 * 2f64.powi(-10),
        _ => 2.0 * 2f64.powi(-7),
    })
}

fn check(f: fn(&Traced, DType) -> Vec<Traced>, what: &str) {
    const {
        assert!(
            HALF_ROW < 8200 && 2 * HALF_ROW < 20000 && 20000 < 3 * HALF_ROW,
            "the long rows are one chunk and a part, and two chunks and a part"
        )
    };
    for dtype in [DType::F16, DType::BF16] {
        for n in [1, 17, 257, 1000, 1030, 8200, 20000] {
            let (graph, inputs) = graph(dtype, n, f);
            checked(
                &graph,
                &inputs,
                dtype,
                &format!("{what}, {dtype:?}, n = {n}"),
            );
        }
    }
}

/// `graph` on `inputs` compiled: bit for bit the same on 1, 2 and 3 threads, and within one
/// rounding of `dtype` of the interpreter.
fn checked(graph: &Graph, inputs: &[Tensor], dtype: DType, what: &str) {
    let context = format!("{what}\n{graph}");
    let compiled = compile(graph).unwrap();
    let got = minductor_tests::assert_same_bits_on_threads(&compiled, inputs, &[1, 2, 3], &context);
    let want = interpret(graph, inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, tolerance(dtype), &context);
}

/// Pointwise chains in the half type: each operation rounds (a math block of its own), loads
/// and stores convert, `tanh` and `gelu` are math blocks reading converted values.
#[test]
fn pointwise_chains_in_half_precision() {
    check(|x, _| vec![x * 2.0], "x * 2");
    check(|x, _| vec![(x * 3.0 + 1.0).tanh() - x], "tanh(3x + 1) - x");
    check(|x, _| vec![(x * 2.0 + 1.0).gelu(), x.abs()], "gelu, abs");
}

/// Row reductions over half-precision rows (softmax, layer norm, a sum to f32), and a half
/// result of an f32 computation.
#[test]
fn reductions_over_half_precision_rows() {
    check(|x, _| vec![x.softmax(-1)], "softmax");
    check(
        |x, _| {
            let n = x.shape()[1];
            vec![x.layer_norm(&[n], None, None, 1e-5)]
        },
        "layer norm",
    );
    check(
        |x, dtype| {
            let f = x.cast(DType::F32);
            vec![f.sum(&[-1], false), (f.exp() * 0.5).cast(dtype)]
        },
        "sum in f32, exp to half",
    );
}

/// The row stages of an f16 or bf16 softmax and layer norm run the row routines (the CPU's
/// full width), in chunks of `HALF_ROW` elements past that, and the 4-lane loop with block
/// conversions past `HALF_CHUNKS` chunks.
#[test]
fn half_rows_run_the_row_routines() {
    use minductor::internals::codegen_cpu::math::block::{block_isa, BlockIsa};
    let Some(isa) = block_isa() else {
        return; // No routines on this CPU: nothing to check.
    };
    let row_bits = match isa {
        BlockIsa::Avx512 => 512,
        BlockIsa::Avx2 => 256,
    };
    let graphs: [fn(&Traced, DType) -> Vec<Traced>; 2] = [
        |x, _| vec![x.softmax(-1)],
        |x, _| vec![x.layer_norm(&[x.shape()[1]], None, None, 1e-5)],
    ];
    for dtype in [DType::F16, DType::BF16] {
        for f in graphs {
            for (n, want) in [
                (1000, row_bits),
                (8200, row_bits),
                (HALF_ROW * HALF_CHUNKS + 1, 128),
            ] {
                let (graph, _) = graph(dtype, n, f);
                let program = minductor_tests::compiled_program(&graph);
                let bits = minductor_tests::kernel_stage_bits(&program);
                assert_eq!(
                    bits.last(),
                    Some(&Some(want)),
                    "{dtype:?}, n = {n}\n{program}"
                );
                if n <= HALF_ROW * HALF_CHUNKS {
                    assert!(bits.iter().all(|&b| b == Some(want)), "{bits:?}\n{program}");
                }
            }
        }
    }
}

/// A half softmax keeps its exponentials in an f32 stack row (the row stash of `lower/rows.rs`:
/// its sum stores them, its last stage scales them): bit for bit the f32 softmax of the same
/// values rounded once to the half type, from half and from f32 inputs, at lengths ending
/// blocks short, crossing a sum's block and at `HALF_ROW`.
#[test]
fn a_half_softmax_is_its_f32_softmax_rounded_once() {
    for dtype in [DType::F16, DType::BF16] {
        for n in [1, 17, 257, 1030, HALF_ROW] {
            for input in [dtype, DType::F32] {
                let tracer = Tracer::new();
                let x = tracer.input("x", input, &[3, n]);
                let half = tracer.finish(&[x.softmax(-1).cast(dtype)]).unwrap();
                let tracer = Tracer::new();
                let x = tracer.input("x", input, &[3, n]);
                let single = tracer.finish(&[x.cast(DType::F32).softmax(-1)]).unwrap();
                let values = hashed_values(&[3, n], 7).to_f64_vec();
                let inputs = [Tensor::from_f64(input, &[3, n], &values).unwrap()];
                let got = compile(&half).unwrap().call(&inputs).unwrap();
                let f32_result = compile(&single).unwrap().call(&inputs).unwrap();
                let rounded =
                    Tensor::from_f64(dtype, &[3, n], &f32_result[0].to_f64_vec()).unwrap();
                minductor_tests::assert_allclose(
                    &got,
                    &[rounded],
                    Tolerance::EXACT,
                    &format!("{dtype:?} softmax of {input:?}, n = {n}\n{half}"),
                );
            }
        }
    }
}

/// Rows past `HALF_ROW` with several half operands per call (a layer norm's half weight and
/// bias, a product of two half rows): each operand's chunk is widened into its own stack row.
#[test]
fn long_half_rows_with_several_operands() {
    for dtype in [DType::F16, DType::BF16] {
        for n in [HALF_ROW + 1, 2 * HALF_ROW + 5] {
            let tracer = Tracer::new();
            let x = tracer.input("x", dtype, &[2, n]);
            let y = tracer.input("y", dtype, &[2, n]);
            let (w, b) = (
                tracer.input("w", dtype, &[n]),
                tracer.input("b", dtype, &[n]),
            );
            let graph = tracer
                .finish(&[
                    x.layer_norm(&[n], Some(&w), Some(&b), 1e-5),
                    (&x * &y).sum(&[-1], false),
                    (&x * &w).softmax(-1),
                ])
                .unwrap();
            let typed = |shape: &[usize], seed| {
                let values = hashed_values(shape, seed).to_f64_vec();
                Tensor::from_f64(dtype, shape, &values).unwrap()
            };
            let inputs = [
                typed(&[2, n], 21),
                typed(&[2, n], 22),
                typed(&[n], 23),
                typed(&[n], 24),
            ];
            checked(&graph, &inputs, dtype, &format!("{dtype:?}, n = {n}"));
        }
    }
}

/// Half rows under several outer loops (`[2, 5, n]` softmaxes and a layer norm with half
/// weight and bias, their loops flattened into one range for the threads): the stages share
/// the rows they widen, each operand its own.
#[test]
fn half_rows_under_several_outer_loops() {
    for dtype in [DType::F16, DType::BF16] {
        for n in [17, 300] {
            let tracer = Tracer::new();
            let x = tracer.input("x", dtype, &[2, 5, n]);
            let y = tracer.input("y", dtype, &[2, 5, n]);
            let (w, b) = (
                tracer.input("w", dtype, &[n]),
                tracer.input("b", dtype, &[n]),
            );
            let graph = tracer
                .finish(&[
                    x.softmax(-1),
                    x.layer_norm(&[n], Some(&w), Some(&b), 1e-5),
                    (&x + &y).softmax(-1),
                    // One kernel: `y`'s rows, then `x`'s and `y`'s in its last stages.
                    y.softmax(-1),
                    (&x + &y).sum(&[-1], false),
                    (&x * &y).sum(&[-1], false),
                    (x.softmax(-1) * 2.0).softmax(1),
                ])
                .unwrap();
            let typed = |shape: &[usize], seed| {
                let values = hashed_values(shape, seed).to_f64_vec();
                Tensor::from_f64(dtype, shape, &values).unwrap()
            };
            let inputs = [
                typed(&[2, 5, n], 9),
                typed(&[2, 5, n], 10),
                typed(&[n], 11),
                typed(&[n], 12),
            ];
            checked(&graph, &inputs, dtype, &format!("{dtype:?}, n = {n}"));
        }
    }
}
