//! Kernels that copy a transposed view (`codegen_cpu/src/lower/transpose.rs`): a
//! `.t()` materialized, NCHW ↔ NHWC permutes, batched transposes, with tiles cut short both
//! ways and sizes given at run time. Each runs the kernel library's transpose routine (its
//! stage reports the routine's width) and gives the interpreter's values bit for bit, at every
//! thread count (the runtime's pieces cut the last loop's runs anywhere).

use minductor::internals::codegen_cpu::lower::kernel_vector_bits;
use minductor::internals::kernel_ir::{Program, Step};
use minductor::{compile, interpret, DType, Dim, Graph, SymId, Tensor, TensorType, Traced, Tracer};
use minductor_tests::{wide_sine_values, Tolerance};

/// The width the transpose routine copies at here: 512 with AVX-512, else the portable form's
/// 32 (see `lower/transpose.rs`).
fn routine_bits() -> u32 {
    use minductor::internals::codegen_cpu::math::block::{block_isa, BlockIsa};
    match block_isa() {
        Some(BlockIsa::Avx512) => 512,
        _ => 32,
    }
}

/// The widths of the kernel steps of `program`.
fn kernel_bits(program: &Program) -> Vec<Option<u32>> {
    (program.steps.iter())
        .filter_map(|s| match s {
            Step::Kernel(k) => Some(kernel_vector_bits(k, program)),
            _ => None,
        })
        .collect()
}

/// Compiles `graph`, checks it against the interpreter bit for bit at 1, 2 and 3 threads, and
/// returns its kernels' widths.
fn checked(graph: &Graph, inputs: &[Tensor], context: &str) -> Vec<Option<u32>> {
    let compiled = compile(graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let context = format!("{context}\n{program}");
    let got = minductor_tests::assert_same_bits_on_threads(&compiled, inputs, &[1, 2, 3], &context);
    let want = interpret(graph, inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(0.0), &context);
    kernel_bits(&program)
}

#[test]
fn a_materialized_transpose_runs_the_routine() {
    for (m, n) in [(64, 48), (33, 17), (2, 1000), (40, 2), (100, 300), (16, 16)] {
        let (graph, inputs) = minductor_tests::build_graph(&[&[m, n]], wide_sine_values, |i| {
            vec![i[0].transpose(0, 1)]
        });
        let bits = checked(&graph, &inputs, &format!("{m}x{n}"));
        assert_eq!(bits, vec![Some(routine_bits())], "{m}x{n}");
    }
}

#[test]
fn channel_permutes_run_the_routine() {
    for (b, c, h, w) in [(2, 24, 7, 9), (1, 64, 16, 16), (3, 5, 4, 33)] {
        // NCHW → NHWC, and back.
        let (graph, inputs) =
            minductor_tests::build_graph(&[&[b, c, h, w]], wide_sine_values, |i| {
                vec![i[0].permute(&[0, 2, 3, 1])]
            });
        let bits = checked(&graph, &inputs, &format!("nchw->nhwc {b}x{c}x{h}x{w}"));
        assert_eq!(bits, vec![Some(routine_bits())], "{b}x{c}x{h}x{w}");
        let (graph, inputs) =
            minductor_tests::build_graph(&[&[b, h, w, c]], wide_sine_values, |i| {
                vec![i[0].permute(&[0, 3, 1, 2])]
            });
        let bits = checked(&graph, &inputs, &format!("nhwc->nchw {b}x{h}x{w}x{c}"));
        assert_eq!(bits, vec![Some(routine_bits())], "{b}x{h}x{w}x{c}\n{graph}");
    }
}

/// `[3, t, 40]` → `[3, 40, t]`.
fn transposed(t: Dim) -> Graph {
    let tracer = Tracer::new();
    let shape = vec![Dim::Static(3), t, Dim::Static(40)];
    let x = tracer.input_typed(
        "x",
        TensorType::new(DType::F32, shape.into_iter().collect()),
    );
    let y: Traced = x.transpose(1, 2);
    tracer.finish(&[y]).unwrap()
}

/// The transpose with `t` a symbol: the routine's strides and extents come from the size at run
/// time; three sizes on one compiled function, each against the interpreter on its static graph.
#[test]
fn a_transpose_with_a_symbolic_size_runs_the_routine() {
    let compiled = compile(&transposed(Dim::Sym(SymId(0)))).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    assert_eq!(
        kernel_bits(&program),
        vec![Some(routine_bits())],
        "{program}"
    );
    for t in [5, 37, 64] {
        let inputs = [wide_sine_values(&[3, t, 40], 1)];
        let context = format!("t = {t}\n{program}");
        let got =
            minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[1, 2, 3], &context);
        let want = interpret(&transposed(Dim::Static(t)), &inputs).unwrap();
        minductor_tests::assert_allclose(&got, &want, Tolerance::close(0.0), &context);
    }
}
