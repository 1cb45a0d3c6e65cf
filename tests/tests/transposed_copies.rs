//! Kernels that copy a transposed view (`codegen_cpu/src/lower/transpose.rs`): a
//! `.t()` materialized, NCHW ↔ NHWC permutes, batched transposes, with tiles cut short both
//! ways and sizes given at run time. Each runs the kernel library's transpose routine (its
//! stage reports the routine's width) and gives the interpreter's values bit for bit, at every
//! thread count (the runtime's pieces cut the last loop's runs anywhere).

use minductor::internals::codegen_cpu::lower::kernel_vector_bits;
use minductor::internals::kernel_ir::{Program, Step};
use minductor::{compile, interpret, DType, Dim, Graph, SymId, Tensor, TensorType, Traced, Tracer};
use minductor_tests::{wide_sine_values, Tolerance};

/// The width the transpose routine copies at here: 512 with AVX-512, 256 with AVX2, else the
/// portable form's 32 (see `lower/transpose.rs`).
fn routine_bits() -> u32 {
    use minductor::internals::codegen_cpu::math::block::{block_isa, BlockIsa};
    match block_isa() {
        Some(BlockIsa::Avx512) => 512,
        Some(BlockIsa::Avx2) => 256,
        None => 32,
    }
}

/// The kernel steps of `program`, by name, with their widths.
fn kernels(program: &Program) -> Vec<(String, Option<u32>)> {
    (program.steps.iter())
        .filter_map(|s| match s {
            Step::Kernel(k) => Some((k.name.clone(), kernel_vector_bits(k, program))),
            _ => None,
        })
        .collect()
}

/// The widths of the kernel steps of `program`.
fn kernel_bits(program: &Program) -> Vec<Option<u32>> {
    kernels(program).into_iter().map(|k| k.1).collect()
}

/// Compiles `graph`, checks it against the interpreter (within `tol`; 0 for copies) and across
/// 1, 2 and 3 threads bit for bit, and returns its program.
fn checked(graph: &Graph, inputs: &[Tensor], tol: f64, context: &str) -> Program {
    let compiled = compile(graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let context = format!("{context}\n{program}");
    let got = minductor_tests::assert_same_bits_on_threads(&compiled, inputs, &[1, 2, 3], &context);
    let want = interpret(graph, inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(tol), &context);
    program
}

/// `f` of `x: [3, t, n]`.
fn of_x(t: Dim, n: usize, f: fn(&Traced) -> Traced) -> Graph {
    let tracer = Tracer::new();
    let shape = vec![Dim::Static(3), t, Dim::Static(n)];
    let x = tracer.input_typed(
        "x",
        TensorType::new(DType::F32, shape.into_iter().collect()),
    );
    tracer.finish(&[f(&x)]).unwrap()
}

/// `f` of `x: [3, t, n]` compiled once with `t` a symbol, checked at three sizes against the
/// interpreter on each size's static graph (within `tol`) and across 1, 2 and 3 threads bit
/// for bit; returns the program.
fn checked_symbolic(n: usize, f: fn(&Traced) -> Traced, tol: f64) -> Program {
    let compiled = compile(&of_x(Dim::Sym(SymId(0)), n, f)).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    for t in [5, 37, 64] {
        let inputs = [wide_sine_values(&[3, t, n], 1)];
        let context = format!("t = {t}\n{program}");
        let got =
            minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[1, 2, 3], &context);
        let want = interpret(&of_x(Dim::Static(t), n, f), &inputs).unwrap();
        minductor_tests::assert_allclose(&got, &want, Tolerance::close(tol), &context);
    }
    program
}

#[test]
fn a_materialized_transpose_runs_the_routine() {
    for (m, n) in [(64, 48), (33, 17), (2, 1000), (40, 2), (100, 300), (16, 16)] {
        let (graph, inputs) = minductor_tests::build_graph(&[&[m, n]], wide_sine_values, |i| {
            vec![i[0].transpose(0, 1)]
        });
        let program = checked(&graph, &inputs, 0.0, &format!("{m}x{n}"));
        assert_eq!(kernel_bits(&program), vec![Some(routine_bits())], "{m}x{n}");
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
        let program = checked(&graph, &inputs, 0.0, &format!("nchw->nhwc {b}x{c}x{h}x{w}"));
        assert_eq!(
            kernel_bits(&program),
            vec![Some(routine_bits())],
            "{b}x{c}x{h}x{w}"
        );
        let (graph, inputs) =
            minductor_tests::build_graph(&[&[b, h, w, c]], wide_sine_values, |i| {
                vec![i[0].permute(&[0, 3, 1, 2])]
            });
        let program = checked(&graph, &inputs, 0.0, &format!("nhwc->nchw {b}x{h}x{w}x{c}"));
        assert_eq!(
            kernel_bits(&program),
            vec![Some(routine_bits())],
            "{b}x{h}x{w}x{c}\n{graph}"
        );
    }
}

/// `[3, t, 40]` → `[3, 40, t]` with `t` a symbol: the routine's strides and extents come from
/// the size at run time; three sizes on one compiled function.
#[test]
fn a_transpose_with_a_symbolic_size_runs_the_routine() {
    let program = checked_symbolic(40, |x| x.transpose(1, 2), 0.0);
    assert_eq!(
        kernel_bits(&program),
        vec![Some(routine_bits())],
        "{program}"
    );
}

/// `split_transposes`: a pointwise kernel over a transposed view gets the view copied first by
/// the routine, then runs over the copy; sizes below the pass's threshold keep one kernel.
#[test]
fn a_pointwise_kernel_over_a_transposed_view_reads_a_copy() {
    for (m, n) in [(256, 128), (130, 200), (64, 1000)] {
        let (graph, inputs) =
            minductor_tests::build_graph(&[&[m, n], &[n, m]], wide_sine_values, |i| {
                vec![i[0].transpose(0, 1).tanh() * 2.0 + &i[1]]
            });
        let ks = kernels(&checked(&graph, &inputs, 1e-6, ""));
        assert_eq!(ks.len(), 2, "{m}x{n}: {ks:?}");
        assert!(ks[0].0.contains("transpose"), "{m}x{n}: {ks:?}");
        assert_eq!(ks[0].1, Some(routine_bits()), "{m}x{n}: {ks:?}");
    }
    // 32 x 32: 1024 elements stay in L1; no copy.
    let (graph, inputs) = minductor_tests::build_graph(&[&[32, 32]], wide_sine_values, |i| {
        vec![i[0].transpose(0, 1) * 2.0]
    });
    assert_eq!(kernels(&checked(&graph, &inputs, 0.0, "32x32")).len(), 1);
}

/// Two uses of one transposed view share one copy; a view broadcast along a loop is copied over
/// the loops it moves with only (`[n, m]` seen as `[m, n]`, added to a `[b, m, n]` tensor).
#[test]
fn transposed_views_are_copied_once_and_without_broadcast_loops() {
    let (b, m, n) = (3, 128, 160);
    let (graph, inputs) =
        minductor_tests::build_graph(&[&[n, m], &[b, m, n]], wide_sine_values, |i| {
            let t = i[0].transpose(0, 1);
            vec![&t * &t.tanh() + &i[1]]
        });
    let program = checked(&graph, &inputs, 1e-6, "shared and broadcast views");
    let copies: Vec<&minductor::internals::kernel_ir::Kernel> = (program.steps.iter())
        .filter_map(|s| match s {
            Step::Kernel(k) if k.name.contains("transpose") => Some(k),
            _ => None,
        })
        .collect();
    assert_eq!(copies.len(), 1, "{program}");
    let extents: Vec<Option<usize>> = copies[0].outer.iter().map(|d| d.as_static()).collect();
    assert_eq!(extents, vec![Some(m)], "{program}");
}

/// Kernels with reduction stages over a transposed view: a layer norm over the channels of an
/// NCHW tensor seen as NHWC (the result NHWC), and a row softmax of `x.t()`. Each gets one copy,
/// which its stages share.
#[test]
fn reductions_over_a_transposed_view_read_a_copy() {
    let (b, c, h, w) = (2, 64, 12, 20);
    let (graph, inputs) =
        minductor_tests::build_graph(&[&[b, c, h, w], &[c], &[c]], wide_sine_values, |i| {
            let nhwc = i[0].permute(&[0, 2, 3, 1]);
            vec![nhwc.layer_norm(&[c], Some(&i[1]), Some(&i[2]), 1e-5)]
        });
    let ks = kernels(&checked(&graph, &inputs, 1e-5, "layer norm"));
    let copies = ks.iter().filter(|k| k.0.contains("transpose")).count();
    assert_eq!(copies, 1, "layer norm: {ks:?}");
    let (graph, inputs) = minductor_tests::build_graph(&[&[200, 160]], wide_sine_values, |i| {
        vec![i[0].transpose(0, 1).softmax(-1)]
    });
    let ks = kernels(&checked(&graph, &inputs, 1e-6, "softmax"));
    let copies = ks.iter().filter(|k| k.0.contains("transpose")).count();
    assert_eq!(copies, 1, "softmax: {ks:?}");
}

/// Transposes of sliced views: the copy starts at an offset into its source, and the rows of a
/// view narrower than its buffer are its buffer's rows apart.
#[test]
fn transposes_of_sliced_views_run_the_routine() {
    let (graph, inputs) = minductor_tests::build_graph(&[&[70, 90]], wide_sine_values, |i| {
        vec![
            i[0].slice(0, Some(3), None, 1).transpose(0, 1),
            i[0].slice(1, Some(5), Some(-2), 1).transpose(0, 1),
        ]
    });
    let program = checked(&graph, &inputs, 0.0, "sliced");
    assert_eq!(
        kernel_bits(&program),
        vec![Some(routine_bits()); 2],
        "sliced"
    );
}

/// `tanh` of `[3, t, 160]` seen as `[3, 160, t]`, `t` a symbol: the copy's buffer has a
/// symbolic dim, and one compiled function serves three sizes.
#[test]
fn a_copy_with_a_symbolic_size_serves_every_size() {
    let program = checked_symbolic(160, |x| x.transpose(1, 2).tanh() * 2.0, 1e-6);
    let names: Vec<String> = kernels(&program).into_iter().map(|k| k.0).collect();
    assert_eq!(names.len(), 2, "{program}");
    assert!(names[0].contains("transpose"), "{program}");
}

/// `x: [shape]` of `dtype`, hashed values in [-2, 2) (integers from -1000 to 999 for i64), some
/// of them bf16's and f16's rounding cases, exact in the type.
fn typed_values(dtype: DType, shape: &[usize]) -> Tensor {
    let f32s = minductor_tests::hashed_values(shape, 7).to_f64_vec();
    let values: Vec<f64> = match dtype {
        DType::I64 => (0..f32s.len())
            .map(|i| (i * 7919 % 2000) as f64 - 1000.0)
            .collect(),
        _ => f32s,
    };
    Tensor::from_f64(dtype, shape, &values).unwrap()
}

/// The one input `x` of `dtype` and `shape`, and `f` of it.
fn typed_graph(dtype: DType, shape: &[usize], f: fn(&Traced) -> Traced) -> (Graph, Vec<Tensor>) {
    let tracer = Tracer::new();
    let x = tracer.input("x", dtype, shape);
    (
        tracer.finish(&[f(&x)]).unwrap(),
        vec![typed_values(dtype, shape)],
    )
}

/// 16-bit (f16, bf16) and 64-bit (i64) elements have routines of their own: a materialized
/// transpose, an NCHW → NHWC permute and a pointwise kernel over a transposed view (which
/// reads a copy) run them, bit for bit the interpreter's values (within rounding for the
/// pointwise kernel) at every thread count, tiles cut short both ways.
#[test]
fn half_and_i64_transposes_run_their_routines() {
    use minductor::internals::kernels::transpose::transpose_bits;
    for dtype in [DType::F16, DType::BF16, DType::I64] {
        let bits = transpose_bits(dtype.size_bytes());
        assert!(bits.is_some(), "{dtype:?}");
        for (m, n) in [(64, 48), (33, 17), (2, 1000), (40, 2), (100, 300)] {
            let (graph, inputs) = typed_graph(dtype, &[m, n], |x| x.transpose(0, 1));
            let program = checked(&graph, &inputs, 0.0, &format!("{dtype:?} {m}x{n}"));
            assert_eq!(kernel_bits(&program), vec![bits], "{dtype:?} {m}x{n}");
        }
        let (graph, inputs) = typed_graph(dtype, &[2, 24, 7, 9], |x| x.permute(&[0, 2, 3, 1]));
        let program = checked(&graph, &inputs, 0.0, &format!("{dtype:?} nchw->nhwc"));
        assert_eq!(kernel_bits(&program), vec![bits], "{dtype:?} nchw->nhwc");
        let (graph, inputs) = typed_graph(dtype, &[130, 200], |x| {
            x.transpose(0, 1).cast(DType::F32).tanh() * 2.0
        });
        let ks = kernels(&checked(&graph, &inputs, 1e-6, &format!("{dtype:?} tanh")));
        assert_eq!(ks.len(), 2, "{dtype:?}: {ks:?}");
        assert!(ks[0].0.contains("transpose"), "{dtype:?}: {ks:?}");
        assert_eq!(ks[0].1, bits, "{dtype:?}: {ks:?}");
    }
}
