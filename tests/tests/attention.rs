//! The fused attention step (`Step::Attention`, flash attention): it replaces the scores GEMM,
//! the softmax kernel and the `p·v` GEMM, no `[.., T, S]` buffer exists, and its results match
//! the interpreter's (the prim expansion) at odd sizes, causal or not, with grouped-query heads
//! and with a symbolic sequence length under one compile.

use minductor::internals::codegen_cpu::{compile_program, CodegenError};
use minductor::internals::kernel_ir::VerifyError;
use minductor::internals::kernel_ir::{BufferKind, Program, Step};
use minductor::Executable;
use minductor::{compile, compile_with, interpret, Backend, DType, Graph, Tensor, Traced, Tracer};
use minductor::{Dim, SymId, TensorType};
use minductor_tests::wide_ramp;
use minductor_tests::Tolerance;

/// `sdpa(q, k, v)` with q `[b, h, t, e]`, k `[b, h / group, s, e]`, v `[b, h / group, s, ev]`
/// (k and v repeated along the heads when `group > 1`, as the llama block does); dims given as
/// `Dim`s so the sequence lengths may be symbolic.
fn sdpa_graph(q: &[Dim], k: &[Dim], v: &[Dim], group: usize, causal: bool) -> Graph {
    let tracer = Tracer::new();
    let input = |name: &str, dims: &[Dim]| {
        tracer.input_typed(
            name,
            TensorType::new(DType::F32, dims.iter().copied().collect()),
        )
    };
    let (q, k, v) = (input("q", q), input("k", k), input("v", v));
    let (k, v): (Traced, Traced) = if group > 1 {
        (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    } else {
        (k, v)
    };
    let out = q.scaled_dot_product_attention(&k, &v, None, causal);
    tracer.finish(&[out]).unwrap()
}

fn dims(shape: &[usize]) -> Vec<Dim> {
    shape.iter().map(|&n| Dim::Static(n)).collect()
}

fn program_of(compiled: &minductor::Compiled) -> Program {
    compiled.artifacts().program.clone().unwrap()
}

/// One attention step, no GEMM, and no buffer of `[.., t, s]` (the scores).
fn assert_fused(program: &Program, t: Dim, s: Dim, what: &str) {
    let attention = program
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Attention(_)))
        .count();
    let gemms = program
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Matmul(_)))
        .count();
    assert_eq!((attention, gemms), (1, 0), "{what}:\n{program}");
    for b in program
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Intermediate)
    {
        let n = b.shape.len();
        assert!(
            !(n >= 2 && b.shape[n - 2] == t && b.shape[n - 1] == s),
            "{what}: a scores buffer exists:\n{program}"
        );
    }
}

/// Compiles a static sdpa of q `[b, h, t, e]`, k `[b, h / group, s, e]` and v `[b, h / group,
/// s, ev]` and checks it against the interpreter.
fn check([b, h, t, s, e, ev, group]: [usize; 7], causal: bool) {
    let what = format!("b {b} h {h} t {t} s {s} e {e} ev {ev} group {group} causal {causal}");
    let kv = h / group;
    let graph = sdpa_graph(
        &dims(&[b, h, t, e]),
        &dims(&[b, kv, s, e]),
        &dims(&[b, kv, s, ev]),
        group,
        causal,
    );
    let inputs = [
        wide_ramp(&[b, h, t, e], 0.0),
        wide_ramp(&[b, kv, s, e], 1.0),
        wide_ramp(&[b, kv, s, ev], 2.0),
    ];
    let compiled = compile(&graph).unwrap();
    assert_fused(
        &program_of(&compiled),
        Dim::Static(t),
        Dim::Static(s),
        &what,
    );
    let want = interpret(&graph, &inputs).unwrap();
    let got = compiled.call(&inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-5), &what);
}

#[test]
fn fused_attention_matches_the_interpreter_at_odd_sizes() {
    for &(t, s) in &[
        (1, 1),
        (5, 5),
        (33, 33),
        (70, 70),
        (64, 64),
        (3, 70),
        (70, 1),
    ] {
        for &e in &[8, 17, 64] {
            for causal in [false, true] {
                if causal && t != s {
                    continue;
                }
                check([2, 3, t, s, e, e, 1], causal);
            }
        }
    }
}

#[test]
fn fused_attention_handles_wide_heads_and_a_different_value_width() {
    check([1, 2, 45, 45, 128, 128, 1], true);
    check([1, 2, 45, 77, 128, 24, 1], false);
}

#[test]
fn grouped_query_attention_reads_shared_kv_heads_without_copies() {
    for causal in [false, true] {
        check([2, 4, 37, 37, 16, 16, 2], causal);
        check([1, 6, 9, 9, 8, 8, 3], causal);
    }
    // The k/v operands are views of the kv-head inputs: no repeated copy is written.
    let graph = sdpa_graph(
        &dims(&[1, 4, 8, 16]),
        &dims(&[1, 2, 8, 16]),
        &dims(&[1, 2, 8, 16]),
        2,
        true,
    );
    let program = program_of(&compile(&graph).unwrap());
    assert_eq!(program.steps.len(), 1, "{program}");
    let Step::Attention(a) = &program.steps[0] else {
        panic!("{program}")
    };
    assert_eq!(a.group, 2, "{program}");
}

#[test]
fn a_symbolic_sequence_length_runs_every_length_with_one_compile() {
    let t = Dim::Sym(SymId(0));
    for causal in [false, true] {
        let symbolic = compile(&sdpa_graph(
            &[Dim::Static(2), Dim::Static(2), t, Dim::Static(16)],
            &[Dim::Static(2), Dim::Static(2), t, Dim::Static(16)],
            &[Dim::Static(2), Dim::Static(2), t, Dim::Static(16)],
            1,
            causal,
        ))
        .unwrap();
        assert_fused(&program_of(&symbolic), t, t, "symbolic");
        for n in [2, 3, 7, 32, 33, 65, 130] {
            let shape = [2, 2, n, 16];
            let inputs = [
                wide_ramp(&shape, 0.0),
                wide_ramp(&shape, 1.0),
                wide_ramp(&shape, 2.0),
            ];
            let graph = sdpa_graph(&dims(&shape), &dims(&shape), &dims(&shape), 1, causal);
            let want = interpret(&graph, &inputs).unwrap();
            let got = symbolic.call(&inputs).unwrap();
            minductor_tests::assert_allclose(
                &got,
                &want,
                Tolerance::close(1e-5),
                &format!("t {n} causal {causal}"),
            );
        }
    }
}

#[test]
fn the_attention_step_prints_and_parses_back() {
    // Symbolic lengths (offsets and strides as size expressions), and grouped heads.
    let t = Dim::Sym(SymId(0));
    let symbolic = [Dim::Static(2), Dim::Static(4), t, Dim::Static(8)];
    let cases = [
        (symbolic.to_vec(), symbolic.to_vec(), 1, false),
        (symbolic.to_vec(), symbolic.to_vec(), 1, true),
        (dims(&[2, 4, 5, 8]), dims(&[2, 2, 5, 8]), 2, true),
    ];
    for (q, kv, group, causal) in cases {
        let graph = sdpa_graph(&q, &kv, &kv, group, causal);
        let program = program_of(&compile(&graph).unwrap());
        let text = program.to_string();
        assert!(text.contains("attention buf"), "{text}");
        let parsed: Program = text.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(parsed, program, "{text}");
        assert_eq!(parsed.to_string(), text);
    }
}

#[test]
fn the_verifier_rejects_an_attention_view_outside_its_buffer() {
    let graph = sdpa_graph(
        &dims(&[1, 2, 8, 8]),
        &dims(&[1, 2, 8, 8]),
        &dims(&[1, 2, 8, 8]),
        1,
        false,
    );
    let good = program_of(&compile(&graph).unwrap());
    let inputs = [
        wide_ramp(&[1, 2, 8, 8], 0.0),
        wide_ramp(&[1, 2, 8, 8], 1.0),
        wide_ramp(&[1, 2, 8, 8], 2.0),
    ];
    let out = compile_program(&good).unwrap().run(&inputs).unwrap();
    let want = interpret(&graph, &inputs).unwrap();
    minductor_tests::assert_allclose(&out, &want, Tolerance::close(1e-5), "hand-compiled");
    let mut bad = good.clone();
    let Step::Attention(a) = &mut bad.steps[0] else {
        panic!("{good}")
    };
    a.v.offset = 1.into();
    match compile_program(&bad) {
        Err(CodegenError::Verify(e)) => {
            assert!(matches!(*e, VerifyError::OutOfRange { .. }), "{e}")
        }
        Err(other) => panic!("expected an out-of-range error, got {other}"),
        Ok(_) => panic!("an attention view outside its buffer compiled"),
    }
}

#[test]
fn attention_with_gradients_keeps_the_unfused_form() {
    // The backward reads the probabilities: the pattern must not swallow them.
    let tracer = Tracer::new();
    let q = tracer.input("q", DType::F32, &[1, 2, 6, 8]);
    let k = tracer.input("k", DType::F32, &[1, 2, 6, 8]);
    let v = tracer.input("v", DType::F32, &[1, 2, 6, 8]);
    let out = q.scaled_dot_product_attention(&k, &v, None, true);
    let loss = out.sum(&[], false);
    let mut outs = vec![loss.clone()];
    outs.extend(loss.grad(&[&q, &k, &v]));
    let graph = tracer.finish(&outs).unwrap();
    let inputs = [
        wide_ramp(&[1, 2, 6, 8], 0.0),
        wide_ramp(&[1, 2, 6, 8], 1.0),
        wide_ramp(&[1, 2, 6, 8], 2.0),
    ];
    let compiled = compile(&graph).unwrap();
    let want = compile_with(&graph, Backend::Eager)
        .unwrap()
        .call(&inputs)
        .unwrap();
    let got = compiled.call(&inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-4), "with gradients");
    let program = program_of(&compiled);
    assert!(
        !program
            .steps
            .iter()
            .any(|s| matches!(s, Step::Attention(_))),
        "{program}"
    );
}

#[test]
fn an_additive_mask_broadcast_to_the_scores_is_fused() {
    for (mask_shape, t, causal) in [
        (vec![9usize, 13], 9, false),
        (vec![2, 1, 9, 13], 9, false),
        (vec![13], 9, false),
        (vec![2, 3, 13, 13], 13, true),
    ] {
        let s = 13;
        let tracer = Tracer::new();
        let q = tracer.input("q", DType::F32, &[2, 3, t, 16]);
        let k = tracer.input("k", DType::F32, &[2, 3, s, 16]);
        let v = tracer.input("v", DType::F32, &[2, 3, s, 8]);
        let m = tracer.input("m", DType::F32, &mask_shape);
        let out = q.scaled_dot_product_attention(&k, &v, Some(&m), causal);
        let graph = tracer.finish(&[out]).unwrap();
        let inputs = [
            wide_ramp(&[2, 3, t, 16], 0.0),
            wide_ramp(&[2, 3, s, 16], 1.0),
            wide_ramp(&[2, 3, s, 8], 2.0),
            wide_ramp(&mask_shape, 3.0),
        ];
        let what = format!("mask {mask_shape:?} causal {causal}");
        let compiled = compile(&graph).unwrap();
        let program = program_of(&compiled);
        assert_fused(&program, Dim::Static(t), Dim::Static(s), &what);
        let Some(Step::Attention(a)) = program.steps.last() else {
            panic!("{what}:\n{program}")
        };
        assert!(a.mask.is_some(), "{what}:\n{program}");
        let text = program.to_string();
        assert_eq!(text.parse::<Program>().unwrap(), program, "{text}");
        let want = interpret(&graph, &inputs).unwrap();
        let got = compiled.call(&inputs).unwrap();
        minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-5), &what);
    }
}

/// A bool mask of `shape`: about one position in five false, and with `empty_row` the first
/// row (second-to-last dim) entirely false.
fn bool_mask(shape: &[usize], empty_row: bool) -> Tensor {
    let n: usize = shape.iter().product();
    let cols = shape.last().copied().unwrap_or(1);
    let rows = if shape.len() >= 2 {
        shape[shape.len() - 2]
    } else {
        1
    };
    let data = (0..n)
        .map(|i| {
            let row = (i / cols) % rows;
            !(empty_row && row == 0) && (i * 7 + 3) % 5 != 0
        })
        .collect();
    Tensor::from_vec(shape, data).unwrap()
}

/// `sdpa(q, k, v, bool mask)` (true takes part) or, with `masked_fill`, the same written out:
/// `softmax((q·kᵀ/√e).masked_fill(!mask, -inf))·v` with the negated mask as the input; both
/// fused into one attention step and matching the interpreter, fully masked rows included
/// (NaN, as the prim expansion gives: max −inf, then −inf − −inf).
fn check_bool_mask(
    [b, h, t, s, e, ev, group]: [usize; 7],
    mask_shape: &[usize],
    causal: bool,
    masked_fill: bool,
    empty_row: bool,
) {
    let what = format!(
        "b {b} h {h} t {t} s {s} e {e} ev {ev} group {group} mask {mask_shape:?} causal \
         {causal} masked_fill {masked_fill} empty row {empty_row}"
    );
    let kv = h / group;
    let tracer = Tracer::new();
    let q = tracer.input("q", DType::F32, &[b, h, t, e]);
    let k = tracer.input("k", DType::F32, &[b, kv, s, e]);
    let v = tracer.input("v", DType::F32, &[b, kv, s, ev]);
    let m = tracer.input("m", DType::Bool, mask_shape);
    let (k, v): (Traced, Traced) = if group > 1 {
        (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    } else {
        (k, v)
    };
    let out = if masked_fill {
        assert!(!causal, "the masked_fill form has no causal variant here");
        let scores = q.matmul(&k.transpose(-1, -2)) * (1.0 / (e as f64).sqrt());
        let scores = scores.masked_fill(&m, f64::NEG_INFINITY);
        scores.softmax(-1).matmul(&v)
    } else {
        q.scaled_dot_product_attention(&k, &v, Some(&m), causal)
    };
    let graph = tracer.finish(&[out]).unwrap();
    let mut mask = bool_mask(mask_shape, empty_row);
    if masked_fill {
        // masked_fill drops where true: the same positions as the sdpa form keeps.
        let flipped: Vec<bool> = mask.to_vec::<bool>().unwrap().iter().map(|&x| !x).collect();
        mask = Tensor::from_vec(mask_shape, flipped).unwrap();
    }
    let inputs = [
        wide_ramp(&[b, h, t, e], 0.0),
        wide_ramp(&[b, kv, s, e], 1.0),
        wide_ramp(&[b, kv, s, ev], 2.0),
        mask,
    ];
    let compiled = compile(&graph).unwrap();
    let program = program_of(&compiled);
    let Some(Step::Attention(a)) = program.steps.last() else {
        panic!("{what}:\n{program}")
    };
    assert!(a.mask.is_some(), "{what}:\n{program}");
    assert_fused(&program, Dim::Static(t), Dim::Static(s), &what);
    let text = program.to_string();
    assert_eq!(text.parse::<Program>().unwrap(), program, "{text}");
    let want = interpret(&graph, &inputs).unwrap();
    let got = compiled.call(&inputs).unwrap();
    if empty_row {
        let rows = got[0].to_vec::<f32>().unwrap();
        assert!(rows.iter().any(|x| x.is_nan()), "{what}: no NaN row");
    }
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-5), &what);
}

#[test]
fn a_bool_mask_broadcast_to_the_scores_is_fused() {
    // T != S, key-tile and query-block tails, broadcast shapes, causal on top.
    for (t, s, mask_shape, causal) in [
        (9, 13, vec![9usize, 13], false),
        (9, 13, vec![2, 1, 9, 13], false),
        (9, 13, vec![13], false),
        (9, 13, vec![9, 1], false),
        (70, 130, vec![2, 3, 70, 130], false),
        (67, 67, vec![67, 67], true),
        (1, 65, vec![1, 65], false),
    ] {
        for masked_fill in [false, true] {
            if masked_fill && causal {
                continue;
            }
            for &e in &[8, 17] {
                check_bool_mask(
                    [2, 3, t, s, e, e, 1],
                    &mask_shape,
                    causal,
                    masked_fill,
                    false,
                );
            }
        }
    }
    check_bool_mask([1, 2, 45, 77, 128, 24, 1], &[45, 77], false, false, false);
    check_bool_mask(
        [1, 2, 33, 33, 64, 64, 1],
        &[1, 2, 33, 33],
        true,
        false,
        false,
    );
}

#[test]
fn a_fully_masked_row_gives_what_the_interpreter_gives() {
    for masked_fill in [false, true] {
        check_bool_mask([2, 3, 9, 13, 16, 8, 1], &[9, 13], false, masked_fill, true);
        check_bool_mask(
            [1, 2, 70, 130, 32, 16, 1],
            &[2, 70, 130],
            false,
            masked_fill,
            true,
        );
    }
    check_bool_mask([1, 2, 70, 70, 16, 16, 1], &[70, 70], true, false, true);
}

#[test]
fn a_bool_mask_with_grouped_query_heads_is_fused() {
    for causal in [false, true] {
        check_bool_mask(
            [2, 4, 37, 37, 16, 16, 2],
            &[2, 1, 37, 37],
            causal,
            false,
            false,
        );
        check_bool_mask([1, 6, 9, 9, 8, 8, 3], &[9, 9], causal, false, false);
    }
    check_bool_mask([1, 6, 9, 9, 8, 8, 3], &[9, 9], false, true, false);
}

#[test]
fn attention_results_do_not_depend_on_the_thread_count() {
    // One k/v head of two q heads and 5 query blocks: the work is split into runs of query
    // blocks differently for each thread count.
    let tracer = Tracer::new();
    let q = tracer.input("q", DType::F32, &[1, 2, 300, 24]);
    let k = tracer.input("k", DType::F32, &[1, 1, 150, 24]);
    let v = tracer.input("v", DType::F32, &[1, 1, 150, 16]);
    let m = tracer.input("m", DType::Bool, &[300, 150]);
    let (k, v) = (k.repeat_interleave(2, 1), v.repeat_interleave(2, 1));
    let out = q.scaled_dot_product_attention(&k, &v, Some(&m), true);
    let graph = tracer.finish(&[out]).unwrap();
    let inputs = [
        wide_ramp(&[1, 2, 300, 24], 0.0),
        wide_ramp(&[1, 1, 150, 24], 1.0),
        wide_ramp(&[1, 1, 150, 16], 2.0),
        bool_mask(&[300, 150], false),
    ];
    let compiled = compile(&graph).unwrap();
    assert_fused(
        &program_of(&compiled),
        Dim::Static(300),
        Dim::Static(150),
        "threads",
    );
    minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3, 5], "threads");
    let want = interpret(&graph, &inputs).unwrap();
    let got = compiled.call(&inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-5), "threads");
}

#[test]
fn attention_over_zero_keys_gives_what_the_interpreter_gives() {
    // S = 0: the scores are `[.., t, 0]`, the product with a `[0, ev]` value is all zeros. (The
    // fused step would give NaN rows, but `fuse` forms none here: the empty softmax folds away
    // and the two GEMMs over empty operands remain.)
    for t in [3, 1] {
        let (b, h, e, ev) = (1, 2, 8, 5);
        let graph = sdpa_graph(
            &dims(&[b, h, t, e]),
            &dims(&[b, h, 0, e]),
            &dims(&[b, h, 0, ev]),
            1,
            false,
        );
        let inputs = [
            wide_ramp(&[b, h, t, e], 0.0),
            wide_ramp(&[b, h, 0, e], 1.0),
            wide_ramp(&[b, h, 0, ev], 2.0),
        ];
        let want = interpret(&graph, &inputs).unwrap();
        let got = compile(&graph).unwrap().call(&inputs).unwrap();
        minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-6), &format!("t {t}"));
    }
}

#[test]
fn attention_with_empty_heads_gives_what_the_interpreter_gives() {
    // Head dim 0: every score is 0, each row averages the values. Value width 0: no output.
    for (e, ev, causal) in [(0, 5, false), (0, 5, true), (8, 0, false)] {
        let (b, h, t, s) = (1, 2, 3, 4);
        let graph = sdpa_graph(
            &dims(&[b, h, t, e]),
            &dims(&[b, h, s, e]),
            &dims(&[b, h, s, ev]),
            1,
            causal,
        );
        let inputs = [
            wide_ramp(&[b, h, t, e], 0.0),
            wide_ramp(&[b, h, s, e], 1.0),
            wide_ramp(&[b, h, s, ev], 2.0),
        ];
        let want = interpret(&graph, &inputs).unwrap();
        let got = compile(&graph).unwrap().call(&inputs).unwrap();
        let what = format!("e {e} ev {ev} causal {causal}");
        minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-6), &what);
    }
}

/// Multi-head attention's ending: `sdpa(q, k, v)` of `[b, h, t, d]`, permuted to `[b, t, h,
/// d]` and reshaped to `[b, t, h·d]`, then (with `project`) the output projection `@ w`. With
/// `keep_heads` the attention's own `[b, h, t, d]` result is a graph output too.
fn permuted_sdpa_graph(
    [b, h, t, d]: [usize; 4],
    causal: bool,
    project: bool,
    keep_heads: bool,
) -> Graph {
    let tracer = Tracer::new();
    let (q, k, v) = (
        tracer.input("q", DType::F32, &[b, h, t, d]),
        tracer.input("k", DType::F32, &[b, h, t, d]),
        tracer.input("v", DType::F32, &[b, h, t, d]),
    );
    let heads = q.scaled_dot_product_attention(&k, &v, None, causal);
    let rows = heads
        .permute(&[0, 2, 1, 3])
        .reshape(&[b as isize, t as isize, (h * d) as isize]);
    let mut outputs = vec![if project {
        let w = tracer.input("w", DType::F32, &[h * d, 24]);
        rows.matmul(&w)
    } else {
        rows
    }];
    if keep_heads {
        outputs.push(heads);
    }
    tracer.finish(&outputs).unwrap()
}

/// An attention whose output only the permute back to `[b, t, h, d]` reads writes that layout
/// itself: no copy step is left (the program is the attention, then the projection GEMM when
/// there is one), the attention's output view has the strides `[T·H·D,
/// D, H·D, 1]` (into the `[b, t, h, d]` permute or its `[b, t, h·d]` reshape, whichever is
/// realized), and the results are the same bits at 1, 2 and 3 threads as the previous path
/// (the same graph with the `[b, h, t, d]` result also an output, which keeps the contiguous
/// attention and its copy), and close to the interpreter's.
#[test]
fn an_attention_read_through_a_permute_writes_the_permuted_layout() {
    // Two query blocks (t = 70) and several runs of them at 2 and 3 threads; odd head count.
    let (b, h, t, d) = (2, 3, 70, 16);
    for causal in [false, true] {
        for project in [false, true] {
            let what = format!("causal {causal} project {project}");
            let graph = permuted_sdpa_graph([b, h, t, d], causal, project, false);
            let compiled = compile(&graph).unwrap();
            let program = program_of(&compiled);
            let kernels = program
                .steps
                .iter()
                .filter(|s| matches!(s, Step::Kernel(_)))
                .count();
            assert_eq!(kernels, 0, "{what}: a copy step is left:\n{program}");
            let Step::Attention(a) = &program.steps[0] else {
                panic!("{what}:\n{program}")
            };
            let strides: Vec<i64> = a
                .out
                .strides
                .iter()
                .map(|s| s.as_const().unwrap())
                .collect();
            let (t3, hd) = ((t * h * d) as i64, (h * d) as i64);
            assert_eq!(strides, [t3, d as i64, hd, 1], "{what}:\n{program}");
            // A buffer of the permuted layout (`[b, t, h, d]`, or `[b, t, h·d]`), written whole.
            assert_eq!(
                program.buffer(a.out.buffer).numel(),
                Some(b * t * h * d),
                "{what}:\n{program}"
            );
            assert_eq!(program.steps.len(), 1 + usize::from(project), "{program}");
            // The text form names the view and parses back.
            let text = program.to_string();
            let parsed: Program = text.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(parsed, program, "{text}");

            let mut inputs = vec![
                wide_ramp(&[b, h, t, d], 0.0),
                wide_ramp(&[b, h, t, d], 1.0),
                wide_ramp(&[b, h, t, d], 2.0),
            ];
            if project {
                inputs.push(wide_ramp(&[h * d, 24], 3.0));
            }
            let got =
                minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], &what);
            // The previous path: the contiguous attention, then its copy.
            let before =
                compile(&permuted_sdpa_graph([b, h, t, d], causal, project, true)).unwrap();
            let before_program = program_of(&before);
            assert!(
                before_program
                    .steps
                    .iter()
                    .any(|s| matches!(s, Step::Kernel(_))),
                "{what}: the copy of the kept output is gone:\n{before_program}"
            );
            for threads in [1, 2, 3] {
                minductor::set_num_threads(threads).unwrap();
                let old = before.call(&inputs).unwrap();
                let new = compiled.call(&inputs).unwrap();
                minductor::set_num_threads(0).unwrap();
                let bits = |x: &Tensor| -> Vec<u64> {
                    x.to_f64_vec().iter().map(|v| v.to_bits()).collect()
                };
                assert_eq!(bits(&old[0]), bits(&new[0]), "{what} at {threads} threads");
                assert_eq!(bits(&got[0]), bits(&new[0]), "{what} at {threads} threads");
            }
            let want = interpret(&graph, &inputs).unwrap();
            minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-4), &what);
        }
    }
}

/// The verifier refuses an attention output view whose rows overlap (two threads' items
/// would write one element), and one whose row elements are not contiguous.
#[test]
fn the_verifier_rejects_an_attention_output_view_that_overlaps() {
    let graph = permuted_sdpa_graph([1, 2, 8, 8], false, false, false);
    let good = program_of(&compile(&graph).unwrap());
    for (stride, value) in [(2, 7), (3, 2)] {
        let mut bad = good.clone();
        let Step::Attention(a) = &mut bad.steps[0] else {
            panic!("{good}")
        };
        a.out.strides[stride] = value.into();
        match compile_program(&bad) {
            Err(CodegenError::Verify(e)) => {
                assert!(matches!(*e, VerifyError::Malformed { .. }), "{e}")
            }
            Err(other) => panic!("expected a malformed-program error, got {other}"),
            Ok(_) => panic!("an overlapping attention output view compiled:\n{bad}"),
        }
    }
}

/// With a symbolic sequence length the fold still applies (the output view's strides are size
/// expressions of the length), and every length gives the interpreter's results under the one
/// compile.
#[test]
fn a_symbolic_length_attention_writes_the_permuted_layout() {
    let t = Dim::Sym(SymId(0));
    let (b, h, d) = (2usize, 2usize, 16usize);
    let shape = [Dim::Static(b), Dim::Static(h), t, Dim::Static(d)];
    let graph = |shape: &[Dim]| {
        let tracer = Tracer::new();
        let input = |name: &str| {
            tracer.input_typed(
                name,
                TensorType::new(DType::F32, shape.iter().copied().collect()),
            )
        };
        let (q, k, v) = (input("q"), input("k"), input("v"));
        let out = q
            .scaled_dot_product_attention(&k, &v, None, true)
            .permute(&[0, 2, 1, 3])
            .reshape(&[b as isize, -1, (h * d) as isize]);
        tracer.finish(&[out]).unwrap()
    };
    let symbolic = compile(&graph(&shape)).unwrap();
    let program = program_of(&symbolic);
    assert!(
        !program.steps.iter().any(|s| matches!(s, Step::Kernel(_))),
        "a copy step is left:\n{program}"
    );
    let [Step::Attention(a)] = &program.steps[..] else {
        panic!("one attention step:\n{program}")
    };
    assert!(
        a.out.strides[0].as_const().is_none(),
        "the batch stride is a size expression of the length:\n{program}"
    );
    for n in [2, 7, 65, 130] {
        let sizes = [b, h, n, d];
        let inputs = [
            wide_ramp(&sizes, 0.0),
            wide_ramp(&sizes, 1.0),
            wide_ramp(&sizes, 2.0),
        ];
        let want = interpret(&graph(&dims(&sizes)), &inputs).unwrap();
        let got = minductor_tests::assert_same_bits_on_threads(
            &symbolic,
            &inputs,
            &[2, 3],
            &format!("t {n}"),
        );
        minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-5), &format!("t {n}"));
    }
}
