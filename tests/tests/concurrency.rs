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

/// A `jit` function runs its cached code without holding its cache's lock, so calls from
/// several threads run at once; a graph break whose value picks one of two paths makes calls
/// miss and merge new paths into the entry others are replaying meanwhile. Every call gets the
/// result of its own path.
#[test]
fn jit_calls_from_several_threads_with_a_graph_break_give_each_callers_result() {
    use minductor::{jit, Traced};
    let f = jit(|x: &[Traced]| {
        // A break: the branch Rust takes depends on the value read (a bool: two paths).
        if x[0].sum(&[0, 1], false).gt(0.0).item() > 0.5 {
            vec![(&x[0] * 2.0).exp()]
        } else {
            vec![(&x[0] * -1.0).tanh()]
        }
    });
    let input = |seed: u64| {
        let t = minductor_tools::workloads::uniform(&[8, 16], -1.0, 1.0, seed);
        // Shifted up or down so the sum's sign follows the seed's parity.
        let shift = if seed.is_multiple_of(2) { 2.0 } else { -2.0 };
        let values: Vec<f32> = t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v + shift)
            .collect();
        Tensor::from_vec(&[8, 16], values).unwrap()
    };
    let want = |seed: u64| -> Vec<f32> {
        let x = input(seed).to_vec::<f32>().unwrap();
        if seed.is_multiple_of(2) {
            x.iter().map(|v| (v * 2.0).exp()).collect()
        } else {
            x.iter().map(|v| (v * -1.0).tanh()).collect()
        }
    };
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let f = &f;
            scope.spawn(move || {
                for round in 0..40u64 {
                    let seed = thread + round;
                    let got = f.call(&[input(seed)]).unwrap()[0].to_vec::<f32>().unwrap();
                    for (i, (g, w)) in got.iter().zip(want(seed)).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                            "thread {thread}, round {round}, element {i}: {g} vs {w}"
                        );
                    }
                }
            });
        }
    });
    let stats = f.stats();
    assert_eq!(stats.calls, 160, "{stats:?}");
    assert!(stats.cache_hits >= 150, "{stats:?}");
}
