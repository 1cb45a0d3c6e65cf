//! Golden text snapshots (insta) of what the compiler makes of a few graphs: the prim graph, the
//! kernel table (`program_cost`) and the buffer plan. Any change in decomposition, fusion or
//! planning shows up in review as a diff of `tests/snapshots/*.snap`
//! (`INSTA_UPDATE=always cargo test -p minductor-tests --test dump_snapshots`, or `cargo insta
//! review`, to accept one).
//!
//! The Cranelift IR is not snapshotted: it changes with every codegen detail.

use minductor::internals::kernel_ir::cost::program_cost;
use minductor::{compile, dump, interpret, trace, Compiled, DType, Graph, Tensor};
use minductor_tools::golden::{build_case, TensorSpec};

/// The three texts, under headers, for one snapshot per graph.
fn dump_text(graph: &Graph) -> String {
    let compiled = compile(graph).unwrap();
    let artifacts = compiled.artifacts();
    let prims = artifacts.prim_graph.as_ref().unwrap();
    let program = artifacts.program.as_ref().unwrap();
    format!(
        "== prim graph ==\n{prims}\n\n== kernels ==\n{}\n== buffer plan ==\n{}",
        dump::kernel_table(prims, program),
        dump::buffer_plan(program)
    )
}

/// The snapshotted program also computes the right thing.
fn check_against_interpreter(compiled: &Compiled, inputs: &[Tensor]) {
    let got = compiled.call(inputs).unwrap();
    let want = interpret(compiled.graph(), inputs).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        let worst = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
            .fold(0.0, f64::max);
        assert!(
            worst < 1e-4,
            "compiled differs from the interpreter by {worst}"
        );
    }
}

fn ramp(shape: &[usize], seed: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|i| ((i as f64 * 0.37 + seed).sin() * 0.5) as f32)
        .collect();
    Tensor::from_vec(shape, data).unwrap()
}

fn pointwise_chain() -> Graph {
    trace(|t| {
        let x = t.input("x", DType::F32, &[4, 32]);
        let w = t.input("w", DType::F32, &[32]);
        let b = t.input("b", DType::F32, &[32]);
        vec![(&x * &w + &b).gelu()]
    })
    .unwrap()
}

#[test]
fn pointwise_chain_dump() {
    let graph = pointwise_chain();
    insta::assert_snapshot!(dump_text(&graph));
}

#[test]
fn pointwise_chain_costs_each_input_once_and_the_output_once() {
    // Derived from the shapes, independently of the cost model: one kernel reads x, w and b once
    // and writes the output once.
    let graph = pointwise_chain();
    let compiled = compile(&graph).unwrap();
    let costs = program_cost(compiled.artifacts().program.as_ref().unwrap());
    assert_eq!(costs.len(), 1);
    assert_eq!(costs[0].bytes_read, (4 * 32 + 32 + 32) * 4);
    assert_eq!(costs[0].bytes_written, 4 * 32 * 4);
    let inputs = [ramp(&[4, 32], 0.0), ramp(&[32], 1.0), ramp(&[32], 2.0)];
    check_against_interpreter(&compiled, &inputs);
}

#[test]
fn softmax_dump() {
    let graph = trace(|t| vec![t.input("x", DType::F32, &[8, 32]).softmax(-1)]).unwrap();
    check_against_interpreter(&compile(&graph).unwrap(), &[ramp(&[8, 32], 0.5)]);
    insta::assert_snapshot!(dump_text(&graph));
}

#[test]
fn layer_norm_dump() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[8, 32]);
        let g = t.input("g", DType::F32, &[32]);
        let b = t.input("b", DType::F32, &[32]);
        vec![x.layer_norm(&[32], Some(&g), Some(&b), 1e-5)]
    })
    .unwrap();
    insta::assert_snapshot!(dump_text(&graph));
}

#[test]
fn mlp_dump() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[4, 16]);
        let w1 = t.input("w1", DType::F32, &[64, 16]);
        let b1 = t.input("b1", DType::F32, &[64]);
        let w2 = t.input("w2", DType::F32, &[16, 64]);
        let b2 = t.input("b2", DType::F32, &[16]);
        vec![x.linear(&w1, Some(&b1)).gelu().linear(&w2, Some(&b2))]
    })
    .unwrap();
    let inputs = [
        ramp(&[4, 16], 0.0),
        ramp(&[64, 16], 1.0),
        ramp(&[64], 2.0),
        ramp(&[16, 64], 3.0),
        ramp(&[16], 4.0),
    ];
    check_against_interpreter(&compile(&graph).unwrap(), &inputs);
    insta::assert_snapshot!(dump_text(&graph));
}

/// The golden runner's pre-LN transformer block (4 heads) at batch 2, sequence 8, width 16,
/// MLP width 32.
fn transformer_block() -> (Graph, Vec<Vec<usize>>) {
    let (width, hidden) = (16, 32);
    let shapes: Vec<(&str, Vec<usize>)> = vec![
        ("x", vec![2, 8, width]),
        ("g1", vec![width]),
        ("bb1", vec![width]),
        ("wqkv", vec![3 * width, width]),
        ("bqkv", vec![3 * width]),
        ("wo", vec![width, width]),
        ("bo", vec![width]),
        ("g2", vec![width]),
        ("bb2", vec![width]),
        ("w1", vec![hidden, width]),
        ("b1", vec![hidden]),
        ("w2", vec![width, hidden]),
        ("b2", vec![width]),
    ];
    let specs: Vec<TensorSpec> = shapes
        .iter()
        .map(|(name, shape)| TensorSpec {
            name: name.to_string(),
            dtype: DType::F32,
            shape: shape.clone(),
        })
        .collect();
    let (order, graph) = build_case("model_transformer_block", &specs).unwrap();
    let order_shapes = order
        .iter()
        .map(|n| shapes.iter().find(|s| s.0 == n).unwrap().1.clone())
        .collect();
    (graph.unwrap(), order_shapes)
}

#[test]
fn transformer_block_dump() {
    let (graph, shapes) = transformer_block();
    let inputs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| ramp(s, i as f64))
        .collect();
    check_against_interpreter(&compile(&graph).unwrap(), &inputs);
    insta::assert_snapshot!(dump_text(&graph));
}
