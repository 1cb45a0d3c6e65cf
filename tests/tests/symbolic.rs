//! Symbolic (dynamic) batch dims on the inductor backend: one compiled program serves every size,
//! tails included, and agrees with a static compile of the same function at each size.

use minductor::internals::kernel_ir::Step;
use minductor::{compile, interpret, DType, Graph, RuntimeError, Tensor, Traced, Tracer};
use minductor::{Dim, SymId, TensorType};
use minductor_tests::slow_ramp;
use minductor_tests::Tolerance;

type Body = dyn Fn(&[Traced]) -> Vec<Traced>;

/// Traces `f` over inputs whose first dim is `batch` (symbolic `s0` when `None`) and whose other
/// dims are `shapes`, followed by static `weights`.
fn build(batch: Option<usize>, shapes: &[&[usize]], weights: &[&[usize]], f: &Body) -> Graph {
    let tracer = Tracer::new();
    let mut inputs: Vec<Traced> = shapes
        .iter()
        .enumerate()
        .map(|(i, rest)| {
            let mut shape: Vec<Dim> = vec![batch.map_or(Dim::Sym(SymId(0)), Dim::Static)];
            shape.extend(rest.iter().map(|&n| Dim::Static(n)));
            tracer.input_typed(
                &format!("in{i}"),
                TensorType::new(DType::F32, shape.into_iter().collect()),
            )
        })
        .collect();
    for (i, w) in weights.iter().enumerate() {
        inputs.push(tracer.input(&format!("w{i}"), DType::F32, w));
    }
    let outputs = f(&inputs);
    tracer.finish(&outputs).unwrap()
}

/// One symbolic compile, checked at many batch sizes against the interpreter on a static graph.
fn check_every_size(shapes: &[&[usize]], weights: &[&[usize]], f: &Body) -> Graph {
    let symbolic = compile(&build(None, shapes, weights, f)).unwrap();
    for batch in (1..=19).chain([64, 257, 1031]) {
        let inputs: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, rest)| {
                let mut shape = vec![batch];
                shape.extend_from_slice(rest);
                slow_ramp(&shape, i as f32)
            })
            .chain(weights.iter().map(|w| slow_ramp(w, 7.0)))
            .collect();
        let want = interpret(&build(Some(batch), shapes, weights, f), &inputs).unwrap();
        let got = symbolic.call(&inputs).unwrap();
        minductor_tests::assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-4),
            &format!("batch {batch}"),
        );
    }
    symbolic.artifacts().prim_graph.clone().unwrap()
}

#[test]
fn row_kernels_over_a_symbolic_batch() {
    check_every_size(&[&[37], &[37]], &[], &|i| {
        let (x, y) = (&i[0], &i[1]);
        vec![
            (x + y).softmax(-1),
            x.layer_norm(&[37], None, None, 1e-5),
            (x * y).gelu(),
        ]
    });
}

#[test]
fn reductions_over_the_symbolic_dim() {
    // mean and var over a symbolic axis divide by a count computed in the kernel.
    check_every_size(&[&[5]], &[], &|i| {
        let x = &i[0];
        vec![
            x.mean(&[0], false),
            x.var(&[0], true, true),
            x.sum(&[0, 1], false),
        ]
    });
}

#[test]
fn gemm_with_epilogue_over_a_symbolic_batch() {
    // linear → gelu → linear + residual on a dynamic batch: GEMMs split by rows, epilogues fused.
    let prims = check_every_size(&[&[33]], &[&[48, 33], &[48], &[48, 33]], &|i| {
        let (x, w1, b1, w2) = (&i[0], &i[1], &i[2], &i[3]);
        vec![x.linear(w1, Some(b1)).gelu().matmul(w2) + x]
    });
    assert!(prims.to_string().contains("s0"), "{prims}");
    let graph = build(None, &[&[33]], &[&[48, 33], &[48], &[48, 33]], &|i| {
        let (x, w1, b1, w2) = (&i[0], &i[1], &i[2], &i[3]);
        vec![x.linear(w1, Some(b1)).gelu().matmul(w2) + x]
    });
    let program = minductor_tests::compiled_program(&graph);
    let epilogues = program
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Matmul(m) if m.epilogue.is_some()))
        .count();
    assert_eq!(epilogues, 2, "{program}");
}

#[test]
fn one_dimensional_symbolic_pointwise() {
    check_every_size(&[&[]], &[], &|i| vec![(&i[0] * 0.5).erf() + &i[0]]);
}

#[test]
fn a_symbol_must_have_one_size_across_inputs() {
    let graph = build(None, &[&[4], &[4]], &[], &|i| vec![&i[0] + &i[1]]);
    let compiled = compile(&graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    assert!(program.steps.iter().all(|s| matches!(s, Step::Kernel(_))));
    let err = compiled
        .call(&[slow_ramp(&[3, 4], 0.0), slow_ramp(&[5, 4], 1.0)])
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Shape { .. }), "{err}");
    assert!(err.to_string().contains("s0 = 3"), "{err}");
}
