//! What the compiler does, asserted from its printed artifacts: decompositions, fusion decisions.

use minductor::passes::kernel::{StageAction, Step};
use minductor::{compile, passes, trace, DType, Graph};

fn program_of(graph: &Graph) -> passes::kernel::Program {
    compile(graph).unwrap().artifacts().program.clone().unwrap()
}

#[test]
fn softmax_decomposes_to_prims_with_max_subtraction() {
    let graph = trace(|t| vec![t.input("x", DType::F32, &[4, 8]).softmax(-1)]).unwrap();
    let prims = passes::simplify(&passes::decompose(&graph));
    assert_eq!(
        prims.to_string(),
        "graph(x: f32[4, 8]) {
  %0 = input[x] : f32[4, 8]
  %1 = reduce_max[axes=[1], keepdim=true] %0 : f32[4, 1]
  %2 = sub %0, %1 : f32[4, 8]
  %3 = exp %2 : f32[4, 8]
  %4 = reduce_sum[axes=[1], keepdim=true] %3 : f32[4, 1]
  %5 = div %3, %4 : f32[4, 8]
  return %5
}"
    );
}

#[test]
fn softmax_is_one_kernel_over_a_row() {
    let graph = trace(|t| vec![t.input("x", DType::F32, &[4, 7, 37]).softmax(-1)]).unwrap();
    let program = program_of(&graph);
    assert_eq!(program.steps.len(), 1, "{program}");
    let Step::Kernel(k) = &program.steps[0] else {
        panic!("{program}")
    };
    let kinds: Vec<&str> = k
        .stages
        .iter()
        .map(|s| match &s.action {
            StageAction::Reduce { .. } => "reduce",
            StageAction::Store(_) => "store",
        })
        .collect();
    assert_eq!(kinds, ["reduce", "reduce", "store"], "{program}");
    assert_eq!(k.outer.len(), 2, "outer loops are the two kept dims");
}

#[test]
fn layer_norm_is_one_kernel_and_pointwise_chains_fuse() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[8, 33]);
        let g = t.input("g", DType::F32, &[33]);
        let b = t.input("b", DType::F32, &[33]);
        vec![x.layer_norm(&[33], Some(&g), Some(&b), 1e-5)]
    })
    .unwrap();
    assert_eq!(program_of(&graph).steps.len(), 1);

    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[1031]);
        let w = t.input("w", DType::F32, &[1031]);
        let b = t.input("b", DType::F32, &[1031]);
        vec![(&x * &w + &b).gelu()]
    })
    .unwrap();
    let program = program_of(&graph);
    assert_eq!(
        program.steps.len(),
        1,
        "gelu(x*w+b) is one kernel:\n{program}"
    );
}

#[test]
fn views_are_index_arithmetic_not_copies() {
    // A transposed operand of matmul and a permuted operand of a pointwise op cost no copy kernel.
    let graph = trace(|t| {
        let a = t.input("a", DType::F32, &[5, 7]);
        let b = t.input("b", DType::F32, &[9, 7]);
        vec![a.matmul(&b.transpose(0, 1)).transpose(0, 1) * 2.0]
    })
    .unwrap();
    let program = program_of(&graph);
    assert_eq!(
        program.steps.len(),
        2,
        "one GEMM and one pointwise kernel:\n{program}"
    );
    assert!(matches!(program.steps[0], Step::Matmul(_)));
}

#[test]
fn contiguous_pointwise_kernels_use_f32x4_loads_and_stores() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[1031]);
        vec![(&x * 2.0).exp()]
    })
    .unwrap();
    let compiled = compile(&graph).unwrap();
    let (_, clif) = &compiled.artifacts().cranelift_ir[0];
    assert!(clif.contains("load.f32x4"), "no vector load:\n{clif}");
    assert!(
        clif.contains("store") && clif.contains("f32x4"),
        "no vector store:\n{clif}"
    );
    assert!(!clif.contains("call"), "kernels make no calls:\n{clif}");
}
