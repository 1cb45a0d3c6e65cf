//! Freezing (`compile_frozen`): weights and batch-norm statistics given at compile time. The
//! frozen compile must equal the interpreter run on the original graph with every input, fold
//! eval batch norm into the convolution's weight (no `rsqrt` left in the compiled graph), take
//! only the other inputs, and turn bad constants into typed errors.

use minductor::internals::ir::{BinaryOp, Op, UnaryOp};
use minductor::internals::kernels::gemm;
use minductor::{
    compile_frozen, compile_frozen_with_options, interpret, trace, Backend, CompileError,
    CompileOptions, ConvOptions, DType, FreezeError, Graph, RuntimeError, Tensor,
};
use minductor_tests::shifted_sine_values;
use minductor_tests::{assert_allclose, assert_same_bits_on_threads, Tolerance};

/// conv → eval batch norm → relu → conv → batch norm → + x → relu, a ResNet basic block, at
/// `channels` channels in `groups` groups on `size`x`size` images.
fn block(batch: usize, channels: usize, size: usize, groups: usize) -> Graph {
    trace(|t| {
        let x = t.input("x", DType::F32, &[batch, channels, size, size]);
        let mut v = x.clone();
        for layer in 1..=2 {
            let w = t.input(
                &format!("w{layer}"),
                DType::F32,
                &[channels, channels / groups, 3, 3],
            );
            let stat = |name: &str| t.input(&format!("{name}{layer}"), DType::F32, &[channels]);
            let (m, var, g, b) = (stat("m"), stat("v"), stat("g"), stat("b"));
            v = v
                .conv2d(&w, None, ConvOptions::default().padding(1).groups(groups))
                .batch_norm(&m, &var, Some(&g), Some(&b), 1e-5);
            v = if layer == 1 {
                v.relu()
            } else {
                (v + &x).relu()
            };
        }
        vec![v]
    })
    .unwrap()
}

/// The block's inputs: `x`, then per layer the weight and the statistics (variances positive).
fn block_inputs(graph: &Graph) -> Vec<Tensor> {
    graph
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let shape = graph.ty(id).static_sizes().unwrap();
            let name = graph.input_name(i);
            match name.chars().next().unwrap() {
                'x' => shifted_sine_values(&shape, 1, 1.0, 0.0),
                'w' => shifted_sine_values(&shape, i as u32, 0.2, 0.0),
                'v' => shifted_sine_values(&shape, i as u32, 0.4, 1.0),
                'g' => shifted_sine_values(&shape, i as u32, 0.3, 1.0),
                _ => shifted_sine_values(&shape, i as u32, 0.2, 0.0),
            }
        })
        .collect()
}

fn frozen_pairs<'a>(graph: &'a Graph, inputs: &[Tensor]) -> Vec<(&'a str, Tensor)> {
    (1..inputs.len())
        .map(|i| (graph.input_name(i), inputs[i].clone()))
        .collect()
}

fn count_unary(graph: &Graph, op: UnaryOp) -> usize {
    graph
        .nodes()
        .iter()
        .filter(|n| n.op == Op::Unary(op))
        .count()
}

#[test]
fn a_frozen_resnet_block_folds_batch_norm_into_the_weights_and_matches_the_interpreter() {
    for (batch, channels, size, groups) in [(2, 8, 7, 1), (1, 6, 5, 2), (3, 4, 9, 1)] {
        let graph = block(batch, channels, size, groups);
        let inputs = block_inputs(&graph);
        let want = interpret(&graph, &inputs).unwrap();
        let compiled = compile_frozen(&graph, &frozen_pairs(&graph, &inputs)).unwrap();
        let context = format!("block {batch}x{channels}x{size}, {groups} groups");
        // Folding moves the batch-norm scale into the weight: another rounding order.
        assert_allclose(
            &compiled.call(&inputs[..1]).unwrap(),
            &want,
            Tolerance::close(1e-4),
            &context,
        );
        // Both convolutions' folded weights are packed once, at compile time.
        assert_eq!(compiled.prepacked_operands(), 2, "{context}");
        let prims = compiled.artifacts().prim_graph.as_ref().unwrap();
        assert_eq!(count_unary(prims, UnaryOp::Rsqrt), 0, "{context}:\n{prims}");
        // No multiply over whole activations is left: the scales are in the weights, and the
        // epilogue of each convolution is one add (then relu).
        let image_multiplies = |g: &Graph| {
            g.nodes()
                .iter()
                .filter(|n| n.op == Op::Binary(BinaryOp::Mul) && n.ty.rank() == 4)
                .count()
        };
        assert_eq!(image_multiplies(prims), 0, "{context}:\n{prims}");
        assert_eq!(
            compiled.graph().inputs().len(),
            1 + compiled.frozen_constants().len()
        );
        // The original graph compiles an rsqrt per batch norm; the frozen one computed them once.
        let unfrozen = minductor::compile(&graph).unwrap();
        let unfrozen_prims = unfrozen.artifacts().prim_graph.as_ref().unwrap();
        assert_eq!(count_unary(unfrozen_prims, UnaryOp::Rsqrt), 2, "{context}");
        assert!(image_multiplies(unfrozen_prims) >= 2, "{context}");
    }
}

#[test]
fn freezing_some_inputs_keeps_the_others_as_call_inputs_on_every_backend() {
    // Freeze only the first layer's weight and the second layer's statistics.
    let graph = block(2, 4, 6, 1);
    let inputs = block_inputs(&graph);
    let want = interpret(&graph, &inputs).unwrap();
    let frozen_names = ["w1", "m2", "v2", "g2", "b2"];
    let frozen: Vec<(&str, Tensor)> = (0..inputs.len())
        .filter(|&i| frozen_names.contains(&graph.input_name(i)))
        .map(|i| (graph.input_name(i), inputs[i].clone()))
        .collect();
    let rest: Vec<Tensor> = (0..inputs.len())
        .filter(|&i| !frozen_names.contains(&graph.input_name(i)))
        .map(|i| inputs[i].clone())
        .collect();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let options = CompileOptions {
            backend,
            ..CompileOptions::default()
        };
        let compiled = compile_frozen_with_options(&graph, &frozen, options).unwrap();
        let names: Vec<&str> = (0..rest.len())
            .map(|i| compiled.graph().input_name(i))
            .collect();
        assert_eq!(
            names,
            ["x", "m1", "v1", "g1", "b1", "w2"],
            "{}",
            backend.name()
        );
        let got = compiled.call(&rest).unwrap();
        assert_allclose(&got, &want, Tolerance::close(1e-4), backend.name());
    }
}

#[test]
fn a_frozen_mlp_computes_its_constant_subgraphs_once() {
    // `w.t() * 2` and `b + 1` depend on frozen inputs only: computed at compile time.
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[5, 12]);
        let w = t.input("w", DType::F32, &[7, 12]);
        let b = t.input("b", DType::F32, &[7]);
        vec![(x.matmul(&(w.transpose(0, 1) * 2.0)) + (b + 1.0)).gelu()]
    })
    .unwrap();
    let inputs = [
        shifted_sine_values(&[5, 12], 1, 1.0, 0.0),
        shifted_sine_values(&[7, 12], 2, 0.5, 0.0),
        shifted_sine_values(&[7], 3, 0.5, 0.0),
    ];
    let want = interpret(&graph, &inputs).unwrap();
    let compiled = compile_frozen(
        &graph,
        &[("w", inputs[1].clone()), ("b", inputs[2].clone())],
    )
    .unwrap();
    assert_allclose(
        &compiled.call(&inputs[..1]).unwrap(),
        &want,
        Tolerance::close(1e-5),
        "frozen mlp",
    );
    let prims = compiled.artifacts().prim_graph.as_ref().unwrap();
    let adds_of_constants = prims
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Binary(_)) && n.ty.rank() == 1)
        .count();
    assert_eq!(adds_of_constants, 0, "b + 1 is folded:\n{prims}");
    assert_eq!(compiled.frozen_constants().len(), 2, "{prims}");
}

#[test]
fn bad_constants_and_bad_calls_are_typed_errors() {
    let graph = block(1, 4, 5, 1);
    let inputs = block_inputs(&graph);
    let pairs = frozen_pairs(&graph, &inputs);
    let unknown = compile_frozen(&graph, &[("nope", inputs[1].clone())]);
    assert!(matches!(
        unknown,
        Err(CompileError::Freeze(FreezeError::UnknownInput { .. }))
    ));
    let twice = compile_frozen(&graph, &[pairs[0].clone(), pairs[0].clone()]);
    assert!(matches!(
        twice,
        Err(CompileError::Freeze(FreezeError::Duplicate { .. }))
    ));
    let wrong_shape = compile_frozen(
        &graph,
        &[("w1", shifted_sine_values(&[4, 4, 3, 2], 1, 1.0, 0.0))],
    );
    assert!(matches!(
        wrong_shape,
        Err(CompileError::Freeze(FreezeError::Mismatch { .. }))
    ));
    let wrong_dtype = compile_frozen(&graph, &[("m1", Tensor::zeros(DType::F16, &[4]))]);
    assert!(matches!(
        wrong_dtype,
        Err(CompileError::Freeze(FreezeError::Mismatch { .. }))
    ));
    let compiled = compile_frozen(&graph, &pairs).unwrap();
    assert!(matches!(
        compiled.call(&inputs),
        Err(RuntimeError::Arity {
            expected: 1,
            found: 11
        })
    ));
    assert!(matches!(
        compiled.call(&[inputs[1].clone()]),
        Err(RuntimeError::Rank { .. } | RuntimeError::Shape { .. })
    ));
    // A frozen compile saves with its constants and loads back frozen: the same call, the
    // same bits, the same arity error.
    let path = std::env::temp_dir().join(format!("minductor-frozen-{}.mind", std::process::id()));
    compiled.save(&path).unwrap();
    let loaded = minductor::load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(
        loaded.frozen_constants().len(),
        compiled.frozen_constants().len()
    );
    assert_eq!(loaded.prepacked_operands(), compiled.prepacked_operands());
    let want = compiled.call(&inputs[..1]).unwrap();
    let got = loaded.call(&inputs[..1]).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            g.to_bytes(),
            w.to_bytes(),
            "the loaded frozen graph differs"
        );
    }
    assert!(matches!(
        loaded.call(&inputs),
        Err(RuntimeError::Arity {
            expected: 1,
            found: 11
        })
    ));
    let with_grad = trace(|t| {
        let x = t.input("x", DType::F32, &[3]);
        let w = t.input("w", DType::F32, &[3]);
        let loss = (&x * &w).sum(&[0], false);
        loss.grad(&[&w])
    })
    .unwrap();
    assert!(matches!(
        compile_frozen(&with_grad, &[("w", shifted_sine_values(&[3], 1, 1.0, 0.0))]),
        Err(CompileError::Freeze(FreezeError::Gradients))
    ));
}

#[test]
fn frozen_golden_models_match_pytorch() {
    // Every model case of ../shared/golden-models with its weights frozen: the first input (the
    // images or the token ids) stays a call input. Shapes come from the files.
    use minductor_tools::golden::{
        build_case, compare, default_golden_models_dir, load_manifest, load_tensors,
    };
    let dir = default_golden_models_dir();
    let cases = load_manifest(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut checked = Vec::new();
    for case in cases.iter().filter(|c| {
        c.name.starts_with("model_")
            || c.name.starts_with("op_conv")
            || c.name.contains("batch_norm")
    }) {
        let (order, graph) = build_case(&case.name, &case.inputs)
            .unwrap_or_else(|| panic!("{}: no builder", case.name));
        let graph = graph.unwrap();
        let tensors = load_tensors(&case.file).unwrap();
        let frozen: Vec<(&str, Tensor)> = order[1..]
            .iter()
            .map(|n| (n.as_str(), tensors[n].clone()))
            .collect();
        let compiled =
            compile_frozen(&graph, &frozen).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let outputs = compiled.call(&[tensors[&order[0]].clone()]).unwrap();
        assert_eq!(outputs.len(), case.outputs.len(), "{}", case.name);
        for (got, spec) in outputs.iter().zip(&case.outputs) {
            // Folding batch norm into the weights rounds in another order than PyTorch: the
            // case's tolerance, doubled.
            let c = compare(got, &tensors[&spec.name], case.rtol * 2.0, case.atol * 2.0);
            assert!(
                c.passed,
                "{} {}: max abs error {}",
                case.name, spec.name, c.max_abs_error
            );
        }
        checked.push(case.name.clone());
    }
    assert!(
        checked.iter().any(|n| n == "model_tiny_resnet") && checked.len() >= 8,
        "{checked:?}"
    );
}

/// Two linear layers whose weights are frozen: `x` of `x_shape` (2-D, or 3-D as a batch of
/// sequences), `features` wide, through `hidden` and `outputs` features.
fn frozen_linears(x_shape: &[usize], hidden: usize, outputs: usize) -> (Graph, Vec<Tensor>) {
    let features = *x_shape.last().unwrap();
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, x_shape);
        let w1 = t.input("w1", DType::F32, &[hidden, features]);
        let b1 = t.input("b1", DType::F32, &[hidden]);
        let w2 = t.input("w2", DType::F32, &[outputs, hidden]);
        vec![x.linear(&w1, Some(&b1)).gelu().linear(&w2, None)]
    })
    .unwrap();
    let inputs = vec![
        shifted_sine_values(x_shape, 1, 1.0, 0.0),
        shifted_sine_values(&[hidden, features], 2, 0.2, 0.0),
        shifted_sine_values(&[hidden], 3, 0.5, 0.0),
        shifted_sine_values(&[outputs, hidden], 4, 0.2, 0.0),
    ];
    (graph, inputs)
}

#[test]
fn frozen_linear_weights_are_packed_once_and_give_the_interpreters_results() {
    // Few rows (on a CPU with a vector kernel read in place, not packed: see
    // `frozen_weights_of_products_of_few_rows_match_the_interpreter`), many rows (row tiles),
    // a stacked batch of sequences, odd widths (panel and register-tile tails), a long K, and
    // products wide enough to be streamed.
    for (x_shape, hidden, outputs) in [
        (vec![5, 37], 70, 19),
        (vec![300, 37], 70, 19),
        (vec![3, 7, 41], 130, 33),
        (vec![64, 300], 96, 17),
        // Wide enough to stream (at least 4 panels per thread): read packed, block by block.
        (vec![50, 64], 600, 520),
        (vec![2, 25, 33], 700, 530),
    ] {
        let (graph, inputs) = frozen_linears(&x_shape, hidden, outputs);
        let want = interpret(&graph, &inputs).unwrap();
        let names = ["w1", "b1", "w2"];
        let pairs: Vec<(&str, Tensor)> = names.iter().copied().zip(inputs[1..].to_vec()).collect();
        let compiled = compile_frozen(&graph, &pairs).unwrap();
        let context = format!("x {x_shape:?}, hidden {hidden}, outputs {outputs}");
        let rows: usize = x_shape[..x_shape.len() - 1].iter().product();
        let few = gemm::prefers_few_rows(gemm::Kernel::detect(), [rows, 1, 1], [1, 1]);
        assert_eq!(
            compiled.prepacked_operands(),
            if few { 0 } else { 2 },
            "{context}"
        );
        let got = compiled.call(&inputs[..1]).unwrap();
        // Against the f64 interpreter, outputs that cancel (sums of 300 products of ~0.1 ending
        // near 0.08) are off by ~1e-5; against the same graph compiled unfrozen (the weight
        // packed at every call, the same micro-kernels) they agree far more closely.
        assert_allclose(&got, &want, Tolerance::close(1e-4), &context);
        let unfrozen = minductor::compile(&graph).unwrap().call(&inputs).unwrap();
        assert_allclose(&got, &unfrozen, Tolerance::close(1e-6), &context);
        // Packed once, used by every call, on any thread count: bitwise the same.
        let one = assert_same_bits_on_threads(&compiled, &inputs[..1], &[2, 3], &context);
        assert_allclose(&one, &got, Tolerance::EXACT, &context);
    }
}

#[test]
fn only_the_gemm_operands_that_are_frozen_are_prepacked() {
    let graph = trace(|t| {
        // More rows than `gemm::FEW_ROWS`, whose products read a frozen `b` in place.
        let x = t.input("x", DType::F32, &[40, 12]);
        let w = t.input("w", DType::F32, &[12, 7]);
        let v = t.input("v", DType::F32, &[7, 5]);
        vec![x.matmul(&w).matmul(&v)]
    })
    .unwrap();
    let inputs = [
        shifted_sine_values(&[40, 12], 1, 1.0, 0.0),
        shifted_sine_values(&[12, 7], 2, 0.5, 0.0),
        shifted_sine_values(&[7, 5], 3, 0.5, 0.0),
    ];
    let want = interpret(&graph, &inputs).unwrap();
    // Only `v` frozen: the first GEMM's `b` is a call input, the second's a constant.
    let compiled = compile_frozen(&graph, &[("v", inputs[2].clone())]).unwrap();
    assert_eq!(compiled.prepacked_operands(), 1);
    let got = compiled.call(&inputs[..2]).unwrap();
    assert_allclose(&got, &want, Tolerance::close(1e-5), "one frozen operand");
}

#[test]
fn frozen_weights_of_products_of_few_rows_match_the_interpreter() {
    // A frozen weight multiplied by at most `gemm::FEW_ROWS` rows is read in place rather than
    // packed at compile time (`Prepacked::new`), by columns (`linear`) and by rows (`matmul`).
    for rows in [1, 4, 12, 13] {
        let graph = trace(|t| {
            let x = t.input("x", DType::F32, &[rows, 70]);
            let w = t.input("w", DType::F32, &[300, 70]);
            let v = t.input("v", DType::F32, &[70, 300]);
            vec![x.linear(&w, None).relu(), x.matmul(&v)]
        })
        .unwrap();
        let inputs: Vec<Tensor> = [vec![rows, 70], vec![300, 70], vec![70, 300]]
            .iter()
            .enumerate()
            .map(|(i, shape)| shifted_sine_values(shape, i as u32 + 1, 0.5, 0.0))
            .collect();
        let want = interpret(&graph, &inputs).unwrap();
        let frozen = compile_frozen(
            &graph,
            &[("w", inputs[1].clone()), ("v", inputs[2].clone())],
        )
        .unwrap();
        let got = assert_same_bits_on_threads(&frozen, &inputs[..1], &[1, 2, 3], "threads");
        assert_allclose(&got, &want, Tolerance::close(1e-4), &format!("{rows} rows"));
    }
}
