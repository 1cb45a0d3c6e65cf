//! Calls of one compiled graph from several threads at once: each call takes its own arena from
//! the program's pool, so calls run concurrently and every result is the one a lone call gives.

use minductor::{compile, trace, DType, Tensor};
use rayon::prelude::*;

fn graph() -> minductor::Graph {
    // A row kernel with intermediates in the arena: layer_norm then a GEMM and its epilogue.
    trace(|t| {
        let x = t.input("x", DType::F32, &[32, 64]);
        let w = t.input("w", DType::F32, &[48, 64]);
        let h = x.layer_norm(&[64], None, None, 1e-5);
        vec![h.linear(&w, None).gelu().softmax(-1)]
    })
    .unwrap()
}

fn inputs(seed: u64) -> Vec<Tensor> {
    vec![
        minductor_tools::workloads::uniform(&[32, 64], -2.0, 2.0, seed),
        minductor_tools::workloads::uniform(&[48, 64], -0.5, 0.5, 1000 + seed),
    ]
}

#[test]
fn calls_from_several_threads_give_each_callers_result() {
    let compiled = compile(&graph()).unwrap();
    let expected: Vec<Vec<f32>> = (0..8)
        .map(|s| {
            compiled.call(&inputs(s)).unwrap()[0]
                .to_vec::<f32>()
                .unwrap()
        })
        .collect();
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let (compiled, expected) = (&compiled, &expected);
            scope.spawn(move || {
                for round in 0..50u64 {
                    let s = (thread + round) % 8;
                    let got = compiled.call(&inputs(s)).unwrap()[0]
                        .to_vec::<f32>()
                        .unwrap();
                    assert_eq!(got, expected[s as usize], "thread {thread}, round {round}");
                }
            });
        }
    });
}

#[test]
fn calls_from_inside_rayon_tasks_do_not_deadlock() {
    let compiled = compile(&graph()).unwrap();
    let lone: Vec<Vec<f32>> = (0..16)
        .map(|s| {
            compiled.call(&inputs(s)).unwrap()[0]
                .to_vec::<f32>()
                .unwrap()
        })
        .collect();
    let parallel: Vec<Vec<f32>> = (0..16u64)
        .into_par_iter()
        .map(|s| {
            compiled.call(&inputs(s)).unwrap()[0]
                .to_vec::<f32>()
                .unwrap()
        })
        .collect();
    assert_eq!(parallel, lone);
}

#[test]
fn compiled_graphs_are_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<minductor::Compiled>();
}
