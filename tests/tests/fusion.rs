//! What the compiler does, asserted from its printed artifacts: decompositions, fusion decisions.

use minductor::internals::kernel_ir::{StageAction, Step};
use minductor::internals::{kernel_ir, passes};
use minductor::{compile, interpret, trace, DType, Graph, Tensor};
use minductor_tests::compiled_program as program_of;
use minductor_tests::ramp;
use minductor_tests::Tolerance;
use minductor_tools::workloads::uniform;

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
            StageAction::Scan(_) => "scan",
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
    // The only calls are to math-block routines (`exp` here), where the CPU has them.
    let calls: Vec<&str> = clif.lines().filter(|l| l.contains("call")).collect();
    if minductor::internals::kernels::math::block::block_isa().is_some() {
        assert!(
            !calls.is_empty() && calls.iter().all(|l| l.contains("call_indirect")),
            "exp is computed in math blocks:\n{clif}"
        );
    } else {
        assert!(calls.is_empty(), "kernels make no calls:\n{clif}");
    }
}

/// Math blocks (see `lower.rs`): nested functions (two levels), a function feeding a reduction
/// and a later stage (softmax), a uniform function argument, and row lengths around the block
/// size and the vector widths, against the interpreter.
#[test]
fn math_blocks_match_the_interpreter_at_block_tails() {
    for n in [1usize, 3, 17, 255, 256, 257, 513, 1031] {
        let graph = trace(|t| {
            let x = t.input("x", DType::F32, &[3, n]);
            let s = t.input("s", DType::F32, &[3, 1]);
            let nested = (x.tanh() * 2.0).exp().sigmoid() + s.exp();
            let soft = (&x * 3.0).softmax(-1);
            let gelu = x.gelu() * x.erf().sin() + x.abs().log().cos();
            vec![nested, soft, gelu]
        })
        .unwrap();
        let inputs = vec![
            uniform(&[3, n], -3.0, 3.0, n as u64),
            uniform(&[3, 1], -1.0, 1.0, 7),
        ];
        assert_matches_interpreter(&graph, &inputs, 1e-5);
    }
}

/// Compiled vs the interpreter, within `tol` relative to max(1, |reference|).
fn assert_matches_interpreter(graph: &Graph, inputs: &[Tensor], tol: f64) {
    let want = interpret(graph, inputs).unwrap();
    let got = compile(graph).unwrap().call(inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(tol), &graph.to_string());
}

/// Two buffers live at the same step never overlap in the arena, except an in-place pair at
/// the step where the second overwrites the first.
fn assert_plan_is_safe(program: &kernel_ir::Program) {
    let plan = program.plan.as_ref().expect("planned");
    let range = |b: usize| {
        let buffer = &program.buffers[b];
        let bytes = buffer.numel().unwrap() * buffer.dtype.size_bytes();
        let start = plan.offset(kernel_ir::BufferId(b as u32)).unwrap();
        start..start + bytes
    };
    let planned: Vec<usize> = (0..program.buffers.len())
        .filter(|&b| plan.slot_of[b].is_some())
        .collect();
    for &x in &planned {
        assert!(range(x).end <= plan.arena_bytes);
        for &y in planned.iter().filter(|&&y| y > x) {
            let (Some((dx, lx)), Some((dy, ly))) = (plan.live[x], plan.live[y]) else {
                continue;
            };
            let live_together = dx.max(dy) <= lx.min(ly);
            let (rx, ry) = (range(x), range(y));
            let overlap = rx.start < ry.end && ry.start < rx.end;
            let in_place = plan.in_place.iter().any(|&(into, from, at)| {
                let pair = [into.0 as usize, from.0 as usize];
                pair.contains(&x) && pair.contains(&y) && lx.min(ly) == at
            });
            assert!(
                !(live_together && overlap) || in_place,
                "buf{x} and buf{y} overlap while live\n{program}"
            );
        }
    }
}

#[test]
fn siblings_reading_the_same_input_share_one_loop() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[16, 37]);
        vec![x.exp(), x.sin(), (&x * 3.0).sum(&[1], true)]
    })
    .unwrap();
    let program = program_of(&graph);
    assert_eq!(program.steps.len(), 1, "horizontal fusion:\n{program}");
    let Step::Kernel(k) = &program.steps[0] else {
        panic!("{program}")
    };
    assert_eq!(k.stores().len(), 3, "{program}");
    assert_matches_interpreter(&graph, &[ramp(&[16, 37], 0.0)], 1e-5);
}

#[test]
fn gemm_consumers_run_as_its_epilogue() {
    // linear → bias → gelu → residual: one GEMM step carrying one epilogue kernel.
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[70, 33]);
        let w = t.input("w", DType::F32, &[33, 33]);
        let b = t.input("b", DType::F32, &[33]);
        vec![x.linear(&w, Some(&b)).gelu() * 0.5 + &x]
    })
    .unwrap();
    let program = program_of(&graph);
    assert_eq!(program.steps.len(), 1, "{program}");
    let Step::Matmul(m) = &program.steps[0] else {
        panic!("{program}")
    };
    assert!(m.epilogue.is_some(), "{program}");
    let inputs = [ramp(&[70, 33], 0.0), ramp(&[33, 33], 1.0), ramp(&[33], 2.0)];
    assert_matches_interpreter(&graph, &inputs, 1e-5);

    // A consumer that reads the GEMM output across rows (a transpose) is not an epilogue.
    let graph = trace(|t| {
        let a = t.input("a", DType::F32, &[6, 5]);
        let b = t.input("b", DType::F32, &[5, 6]);
        vec![a.matmul(&b).transpose(0, 1).exp()]
    })
    .unwrap();
    let program = program_of(&graph);
    assert!(
        matches!(&program.steps[0], Step::Matmul(m) if m.epilogue.is_none()),
        "{program}"
    );
    assert_matches_interpreter(&graph, &[ramp(&[6, 5], 0.0), ramp(&[5, 6], 1.0)], 1e-5);
}

#[test]
fn buffer_plan_reuses_dead_slots_and_updates_in_place() {
    // A stack of MLP layers: each layer's intermediates die before the next layer's are born.
    let graph = trace(|t| {
        let mut h = t.input("x", DType::F32, &[32, 64]);
        let w1 = t.input("w1", DType::F32, &[128, 64]);
        let w2 = t.input("w2", DType::F32, &[64, 128]);
        for _ in 0..4 {
            h = (h
                .layer_norm(&[64], None, None, 1e-5)
                .linear(&w1, None)
                .gelu())
            .linear(&w2, None)
                + &h;
        }
        vec![h]
    })
    .unwrap();
    let program = program_of(&graph);
    let plan = program.plan.as_ref().unwrap();
    assert!(
        plan.arena_bytes * 2 <= plan.unshared_bytes,
        "slots are reused:\n{program}"
    );
    assert!(!plan.in_place.is_empty(), "{program}");
    assert!(plan.live_peak_bytes <= plan.arena_bytes);
    assert_plan_is_safe(&program);
    let inputs = [
        ramp(&[32, 64], 0.0),
        ramp(&[128, 64], 1.0),
        ramp(&[64, 128], 2.0),
    ];
    assert_matches_interpreter(&graph, &inputs, 1e-4);
    // The arena is kept between calls, and a second call gives the same result.
    let compiled = compile(&graph).unwrap();
    let first = compiled.call(&inputs).unwrap()[0].to_vec::<f32>().unwrap();
    let second = compiled.call(&inputs).unwrap()[0].to_vec::<f32>().unwrap();
    assert_eq!(first, second);
    assert_eq!(compiled.arena_bytes(), plan.arena_bytes);
}

#[test]
fn buffer_plans_of_attention_are_safe() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[2, 16, 32]);
        let wqkv = t.input("wqkv", DType::F32, &[96, 32]);
        let wo = t.input("wo", DType::F32, &[32, 32]);
        let h = x.layer_norm(&[32], None, None, 1e-5).linear(&wqkv, None);
        let heads = |i: usize| {
            h.slice(
                -1,
                Some((i * 32) as isize),
                Some(((i + 1) * 32) as isize),
                1,
            )
            .reshape(&[2, 16, 4, 8])
            .permute(&[0, 2, 1, 3])
        };
        let (q, k, v) = (heads(0), heads(1), heads(2));
        let attention = (q.matmul(&k.transpose(-2, -1)) * (1.0 / 8f64.sqrt())).softmax(-1);
        let o = attention
            .matmul(&v)
            .permute(&[0, 2, 1, 3])
            .reshape(&[2, 16, 32])
            .linear(&wo, None);
        vec![o + &x]
    })
    .unwrap();
    let program = program_of(&graph);
    assert_plan_is_safe(&program);
    let inputs = [
        ramp(&[2, 16, 32], 0.0),
        ramp(&[96, 32], 1.0),
        ramp(&[32, 32], 2.0),
    ];
    // Outputs reach ~70 in magnitude; the f32 GEMMs' rounding shows at 1e-5 relative.
    assert_matches_interpreter(&graph, &inputs, 1e-3);
}

#[test]
fn two_outputs_of_one_kernel_never_take_the_same_input_slot() {
    // gelu's two uses of softmax's result become sibling kernels merged horizontally; only one
    // of their outputs may overwrite the input in place (found by the random-graph test).
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[2, 2]);
        vec![x.softmax(0).gelu().softmax(1)]
    })
    .unwrap();
    let program = program_of(&graph);
    assert_plan_is_safe(&program);
    let x = Tensor::from_vec(&[2, 2], vec![0.3f32, -1.0, 2.0, 0.5]).unwrap();
    assert_matches_interpreter(&graph, &[x], 1e-5);
}

#[test]
fn an_in_place_store_never_clobbers_what_a_later_store_of_its_stage_reads() {
    // Issue 11's example: after horizontal fusion, `s1 = exp(y)` and `s2 = x·y` share a stage;
    // `s1` must not overwrite `y` while `s2`'s store still reads it.
    let graph = trace(|t| {
        let a = t.input("a", DType::F32, &[8, 8]);
        let b = t.input("b", DType::F32, &[8, 8]);
        let y0 = t.input("y", DType::F32, &[8, 8]);
        let w = t.input("w", DType::F32, &[8, 8]);
        let x = a.matmul(&b);
        let y = y0.sin();
        let s1 = y.exp();
        let s2 = &x * &y;
        vec![s1.matmul(&w), s2.matmul(&w)]
    })
    .unwrap();
    let inputs: Vec<Tensor> = (0..4).map(|i| ramp(&[8, 8], i as f32)).collect();
    assert_matches_interpreter(&graph, &inputs, 1e-5);
}

#[test]
fn a_pointwise_consumer_takes_its_producers_values_in_one_pass() {
    // AdamW's shape: two moments are outputs, and the parameter update reads both. Vertical
    // fusion makes it one kernel that loads each input once; the gradient's producer stores an
    // intermediate that a later store of the same stage reads (the in-place hazard above).
    let graph = trace(|t| {
        let g = t.input("g", DType::F32, &[64, 32]);
        let p = t.input("p", DType::F32, &[64, 32]);
        let m = t.input("m", DType::F32, &[64, 32]);
        let v = t.input("v", DType::F32, &[64, 32]);
        let m2 = &m + (&g - &m) * 0.1;
        let v2 = &v.abs() * 0.999 + &g * &g * 0.001;
        let p2 = &p * 0.9999 - &m2 / (v2.sqrt() + 1e-8) * 0.01;
        vec![p2, m2, v2]
    })
    .unwrap();
    let program = program_of(&graph);
    let kernels = program.kernels().count();
    assert_eq!(kernels, 1, "{program}");
    let inputs: Vec<Tensor> = (0..4).map(|i| ramp(&[64, 32], i as f32 + 2.0)).collect();
    assert_matches_interpreter(&graph, &inputs, 1e-5);
    // The tanh chain the random gradient test found: tanh(x / (y² + 1)) and its derivative.
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[1, 2]);
        let y = t.input("y", DType::F32, &[2]);
        let w = t.input("w", DType::F32, &[1, 2]);
        let loss = ((&x / (&y * &y + 1.0)).tanh() * &w).sum(&[], false);
        let mut outs = vec![loss.clone()];
        outs.extend(loss.grad(&[&x, &y]));
        outs
    })
    .unwrap();
    let inputs = vec![
        Tensor::from_vec(&[1, 2], vec![0.5f32, -0.3]).unwrap(),
        Tensor::from_vec(&[2], vec![0.7f32, 1.2]).unwrap(),
        Tensor::from_vec(&[1, 2], vec![0.9f32, -0.4]).unwrap(),
    ];
    let want = minductor::compile_with(&graph, minductor::Backend::Eager)
        .unwrap()
        .call(&inputs)
        .unwrap();
    let got = compile(&graph).unwrap().call(&inputs).unwrap();
    for (g, w) in got.iter().zip(&want) {
        for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
    }
}

/// `store_once`: softmax's exponentials are computed by the summing stage, stored into the
/// output, and read back by the last stage (one `exp` per element, not two); log_softmax and a
/// softmax over an f16 output (which would round the stored value) keep recomputing.
#[test]
fn softmax_computes_each_exponential_once() {
    let program = |dtype: DType, log: bool| {
        let graph = trace(|t| {
            let x = t.input("x", dtype, &[6, 37]);
            vec![if log {
                x.log_softmax(-1)
            } else {
                x.softmax(-1)
            }]
        })
        .unwrap();
        program_of(&graph)
    };
    let stage_stores = |p: &kernel_ir::Program| -> Vec<usize> {
        let Step::Kernel(k) = &p.steps[0] else {
            panic!("one kernel:\n{p}")
        };
        k.stages.iter().map(|s| s.action.stores().len()).collect()
    };
    let softmax = program(DType::F32, false);
    assert_eq!(stage_stores(&softmax), vec![0, 1, 1], "{softmax}");
    assert!(
        softmax.to_string().contains("reduce_sum e3, store buf1"),
        "{softmax}"
    );
    assert_eq!(stage_stores(&program(DType::F16, false)), vec![0, 0, 1]);
    assert_eq!(stage_stores(&program(DType::F32, true)), vec![0, 0, 1]);
    for n in [1usize, 5, 256, 1031] {
        let graph = trace(|t| {
            let x = t.input("x", DType::F32, &[3, n]);
            vec![(&x * 4.0).softmax(-1), x.softmax(0)]
        })
        .unwrap();
        assert_matches_interpreter(&graph, &[uniform(&[3, n], -5.0, 5.0, 3)], 1e-6);
    }
}
