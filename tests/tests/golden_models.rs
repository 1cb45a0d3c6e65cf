//! Every case of `../shared/golden-models` (or `$MINDUCTOR_GOLDEN_MODELS_DIR`) on every
//! backend, against PyTorch: the runner must build each one (nothing skipped), every case in
//! `models::SUPPORTED` must run and pass, and no case may fail.

use minductor::Backend;
use minductor_tools::golden::{default_golden_models_dir, models, run_golden, Outcome};

#[test]
fn supported_golden_model_cases_match_pytorch_on_every_backend() {
    let dir = default_golden_models_dir();
    let report = run_golden(
        &dir,
        &[Backend::Eager, Backend::AotEager, Backend::Inductor],
    )
    .unwrap_or_else(|e| panic!("cannot read golden cases in {}: {e}", dir.display()));
    println!("{}", report.render());
    assert_eq!(
        report.failed(),
        0,
        "golden-models failures:\n{}",
        report.render()
    );
    assert_eq!(
        report.skipped(),
        0,
        "golden-models cases skipped:\n{}",
        report.render()
    );
    for case in models::SUPPORTED {
        let runs: Vec<_> = report.results.iter().filter(|r| r.case == case).collect();
        assert_eq!(runs.len(), 3, "{case} is missing from the manifest");
        for r in runs {
            assert_eq!(r.outcome, Outcome::Pass, "{case} on {:?}", r.backend);
        }
    }
}

/// One `jit` function serves the GPT-style decoder at the three sequence lengths of the golden
/// cases (same weights), each call matching PyTorch: the first length compiles static, the
/// second makes the sequence dim symbolic (strides `144*s0`, scores `[2, 4, s0, s0]`, the causal
/// mask from aranges of `s0`, the last position at offset `s0 - 1`), and the third reuses it.
#[test]
fn one_jit_function_serves_the_gpt_sweep() {
    use minductor::{jit, Traced};
    use minductor_tools::golden::{compare, load_manifest, load_tensors};
    use std::collections::HashMap;
    let dir = default_golden_models_dir();
    let cases: Vec<_> = load_manifest(&dir)
        .unwrap()
        .into_iter()
        .filter(|c| c.name.starts_with("model_gpt_tiny_t"))
        .collect();
    assert_eq!(cases.len(), 3);
    let gpt = jit(|x: &[Traced]| {
        let named: HashMap<String, Traced> = models::GPT_INPUTS
            .iter()
            .zip(x)
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect();
        models::gpt_forward(&named)
    })
    .input_names(models::GPT_INPUTS);
    for case in &cases {
        let tensors = load_tensors(&case.file).unwrap();
        let inputs: Vec<_> = models::GPT_INPUTS
            .iter()
            .map(|n| tensors[*n].clone())
            .collect();
        let outputs = gpt.call(&inputs).unwrap();
        for (got, spec) in outputs.iter().zip(&case.outputs) {
            let c = compare(got, &tensors[&spec.name], case.rtol, case.atol);
            assert!(
                c.passed,
                "{} {}: max abs error {}",
                case.name, spec.name, c.max_abs_error
            );
        }
    }
    let stats = gpt.stats();
    println!("gpt sweep through one jit function: {stats:?}");
    assert_eq!(stats.calls, 3);
    assert!(stats.compiles <= 2, "{stats:?}");
    assert_eq!(stats.symbolic_compiles, 1, "{stats:?}");
    assert_eq!(stats.eager_fallbacks(), 0, "{stats:?}");
}

/// The model builders read every size from their inputs: at other batch sizes, image sizes and
/// sequence lengths (random weights), the compiled models agree with the interpreter.
#[test]
fn model_builders_run_at_other_shapes() {
    use minductor::{compile_with, DType, Tensor};
    use minductor_tools::golden::{build_case, load_manifest, TensorSpec};
    use minductor_tools::workloads::uniform;
    let cases = load_manifest(&default_golden_models_dir()).unwrap();
    // (case, input, new shape)
    let changes: [(&str, &str, &[usize]); 5] = [
        ("model_resnet_basic_block", "x", &[3, 16, 7, 9]),
        ("model_tiny_resnet", "x", &[1, 3, 20, 24]),
        ("model_llama_block", "x", &[3, 6, 64]),
        ("model_gpt_tiny_t7", "idx", &[3, 5]),
        ("op_sdpa_causal", "q", &[2, 4, 3, 16]),
    ];
    for (name, input, shape) in changes {
        let case = cases.iter().find(|c| c.name == name).unwrap();
        let specs: Vec<TensorSpec> = case
            .inputs
            .iter()
            .map(|s| TensorSpec {
                shape: if s.name == input {
                    shape.to_vec()
                } else {
                    s.shape.clone()
                },
                ..s.clone()
            })
            .collect();
        let (order, graph) = build_case(name, &specs).unwrap();
        let graph = graph.unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs: Vec<Tensor> = order
            .iter()
            .enumerate()
            .map(|(seed, n)| {
                let s = specs.iter().find(|s| &s.name == n).unwrap();
                match s.dtype {
                    // Token ids within the vocabulary (the rows of `wte`).
                    DType::I64 => {
                        let count: usize = s.shape.iter().product();
                        Tensor::from_vec(
                            &s.shape,
                            (0..count as i64).map(|i| (i * 7) % 97).collect(),
                        )
                        .unwrap()
                    }
                    _ => uniform(&s.shape, -0.5, 0.5, seed as u64 + 1),
                }
            })
            .collect();
        let want = compile_with(&graph, Backend::Eager)
            .unwrap()
            .call(&inputs)
            .unwrap();
        let got = compile_with(&graph, Backend::Inductor)
            .unwrap()
            .call(&inputs)
            .unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape(), "{name}");
            let c = minductor_tools::golden::compare(g, w, 1e-4, 1e-4);
            assert!(
                c.passed,
                "{name} at {input} {shape:?}: max abs error {}",
                c.max_abs_error
            );
        }
    }
}

/// The GPT-style decoder's weights and a prompt of `length` tokens per sequence (ids within the
/// vocabulary), in `GPT_INPUTS` order.
fn gpt_inputs(length: usize) -> Vec<minductor::Tensor> {
    use minductor::Tensor;
    use minductor_tools::golden::load_tensors;
    let tensors =
        load_tensors(&default_golden_models_dir().join("model_gpt_tiny_t7.safetensors")).unwrap();
    let batch = tensors["idx"].shape()[0];
    let ids: Vec<i64> = (0..(batch * length) as i64)
        .map(|i| (i * 31 + 5) % 97)
        .collect();
    let mut inputs = vec![Tensor::from_vec(&[batch, length], ids).unwrap()];
    inputs.extend(models::GPT_INPUTS[1..].iter().map(|n| tensors[*n].clone()));
    inputs
}

fn gpt_jit() -> minductor::Jit<impl Fn(&[minductor::Traced]) -> Vec<minductor::Traced>> {
    use minductor::{jit, Traced};
    use std::collections::HashMap;
    jit(|x: &[Traced]| {
        let named: HashMap<String, Traced> = models::GPT_INPUTS
            .iter()
            .zip(x)
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect();
        models::gpt_forward(&named)
    })
    .input_names(models::GPT_INPUTS)
}

/// The symbolic GPT graph at lengths from 2 (the smallest a symbolic dim takes) to 64 (every
/// row of the position table), checked against the interpreter on a static trace of each
/// length: logits within 1e-4, the argmax tokens equal where the top two logits are apart.
#[test]
fn the_symbolic_gpt_graph_matches_the_interpreter_at_every_length() {
    use minductor::{compile_with, Backend, DType};
    use minductor_tools::golden::{build_case, TensorSpec};
    let gpt = gpt_jit();
    for length in [7, 13, 2, 3, 5, 31, 40, 63, 64] {
        let inputs = gpt_inputs(length);
        let got = gpt.call(&inputs).unwrap();
        let specs: Vec<TensorSpec> = models::GPT_INPUTS
            .iter()
            .zip(&inputs)
            .map(|(n, t)| TensorSpec {
                name: n.to_string(),
                shape: t.shape().to_vec(),
                dtype: t.dtype(),
            })
            .collect();
        let (_, graph) = build_case("model_gpt_tiny_t7", &specs).unwrap();
        let want = compile_with(&graph.unwrap(), Backend::Eager)
            .unwrap()
            .call(&inputs)
            .unwrap();
        let c = minductor_tools::golden::compare(&got[0], &want[0], 1e-4, 1e-4);
        assert!(
            c.passed,
            "length {length}: logits max abs error {}",
            c.max_abs_error
        );
        assert_eq!(got[1].dtype(), DType::I64);
        let logits = want[0].to_vec::<f32>().unwrap();
        let vocabulary = want[0].shape()[2];
        let (tokens, expected) = (
            got[1].to_vec::<i64>().unwrap(),
            want[1].to_vec::<i64>().unwrap(),
        );
        for (s, (&t, &e)) in tokens.iter().zip(&expected).enumerate() {
            let row = &logits[((s + 1) * length - 1) * vocabulary..][..vocabulary];
            let mut sorted = row.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted[0] - sorted[1] > 1e-3 {
                assert_eq!(t, e, "length {length}, sequence {s}");
            }
        }
    }
    let stats = gpt.stats();
    assert_eq!(
        (stats.compiles, stats.symbolic_compiles),
        (2, 1),
        "{stats:?}"
    );
    assert_eq!(stats.eager_fallbacks(), 0, "{stats:?}");
}

/// Sizes the symbolic GPT graph cannot take are a recompile or a typed error, never a wrong
/// answer or an access outside a buffer: length 1 (below the symbolic guard's 2) compiles a
/// static specialization, and length 65 (past the 64 rows of the position table) is an
/// embedding index out of range.
#[test]
fn gpt_lengths_outside_the_symbolic_graph_recompile_or_fail_typed() {
    let gpt = gpt_jit();
    gpt.call(&gpt_inputs(7)).unwrap();
    gpt.call(&gpt_inputs(9)).unwrap();
    assert_eq!(gpt.stats().symbolic_compiles, 1);
    let one = gpt.call(&gpt_inputs(1)).unwrap();
    assert_eq!(one[0].shape()[1], 1);
    assert_eq!(gpt.stats().compiles, 3, "{:?}", gpt.stats());
    let err = gpt.call(&gpt_inputs(65)).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    assert_eq!(gpt.stats().compiles, 3, "{:?}", gpt.stats());
}

/// `explain` on the GPT function once its sequence length is symbolic shows the symbolic shapes
/// and the guards that keep them valid.
#[test]
fn explain_shows_the_symbolic_gpt_shapes_and_guards() {
    let gpt = gpt_jit();
    gpt.call(&gpt_inputs(7)).unwrap();
    gpt.call(&gpt_inputs(11)).unwrap();
    let report = gpt.explain(&gpt_inputs(12)).unwrap();
    let text = report.to_string();
    assert!(text.contains("symbolic shapes: idx: i64[2, s0]"), "{text}");
    assert!(text.contains("input idx, dim 1: s0 >= 2"), "{text}");
    assert!(text.contains(", symbolic"), "{text}");
}
