//! The ops real models need (`arange`, `triu`/`tril`, arg-reductions, `cumsum`,
//! `repeat_interleave`, causal attention, convolution, max pooling): compiled against the
//! reference interpreter at tail lengths and odd sizes, against hand-computed values, through
//! autodiff, and with bad sizes (typed trace errors naming the op and the sizes, never a panic).

use minductor::internals::kernel_ir::Step;
use minductor::{
    compile, compile_with, interpret, trace, Backend, ConvOptions, DType, Graph, Tensor, Traced,
    Tracer,
};

fn values(shape: &[usize], seed: u32) -> Tensor {
    minductor_tests::sine_values(shape, seed, 3.0)
}

/// Compiles `graph` and compares each output with the interpreter's within `tol` (relative to
/// max(1, |want|)); integer outputs must be equal.
fn check(graph: &Graph, inputs: &[Tensor], tol: f64, what: &str) {
    // The interpreter evaluates composites directly; `grad` needs autodiff first (aot_eager).
    let has_grad = graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, minductor::internals::ir::Op::Grad { .. }));
    let want = if has_grad {
        compile_with(graph, Backend::AotEager)
            .unwrap()
            .call(inputs)
            .unwrap()
    } else {
        interpret(graph, inputs).unwrap()
    };
    let got = compile(graph)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .call(inputs)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.shape(), w.shape(), "{what}");
        assert_eq!(g.dtype(), w.dtype(), "{what}");
        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * b.abs().max(1.0);
            assert!(ok, "{what}: element {i}: compiled {a} vs reference {b}");
        }
    }
}

fn build(shapes: &[&[usize]], f: impl FnOnce(&[Traced]) -> Vec<Traced>) -> (Graph, Vec<Tensor>) {
    minductor_tests::build_graph(shapes, values, f)
}

const SIZES: [usize; 6] = [1, 3, 4, 5, 17, 66];

#[test]
fn arange_has_pytorch_values_in_every_dtype() {
    let graph = trace(|t| {
        vec![
            t.arange(6, DType::I64),
            t.arange(5, DType::F32) * 2.0,
            t.arange_range(1.0, 10.0, 3.0, DType::I64),
            t.arange_range(0.5, 2.0, 0.5, DType::F32),
        ]
    })
    .unwrap();
    let want: [&[f64]; 4] = [
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        &[0.0, 2.0, 4.0, 6.0, 8.0],
        &[1.0, 4.0, 7.0],
        &[0.5, 1.0, 1.5],
    ];
    for outputs in [
        interpret(&graph, &[]).unwrap(),
        compile(&graph).unwrap().call(&[]).unwrap(),
    ] {
        assert_eq!(outputs[0].dtype(), DType::I64);
        assert_eq!(outputs[2].dtype(), DType::I64);
        for (got, want) in outputs.iter().zip(want) {
            assert_eq!(got.to_f64_vec(), want);
        }
    }
}

#[test]
fn empty_aranges_and_scans_give_empty_results() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[3, 0]);
        vec![t.arange(0, DType::F32) * 2.0, x.cumsum(1), x.cumsum(0)]
    })
    .unwrap();
    for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(&[Tensor::zeros(DType::F32, &[3, 0])])
            .unwrap();
        assert_eq!(out[0].shape(), &[0]);
        assert_eq!(out[1].shape(), &[3, 0]);
        assert_eq!(out[2].shape(), &[3, 0]);
    }
}

#[test]
fn arange_in_a_kernel_at_every_tail_length() {
    // The index expression vectorizes along the innermost loop (unroll slots, tails) and is
    // read transposed (a strided index) and broadcast.
    for &n in &SIZES {
        for &m in &[1, 2, 7] {
            let (g, inputs) = build(&[&[m, n]], |i| {
                let x = &i[0];
                let t = x.tracer();
                let col = t.arange(n, DType::F32);
                let row = t
                    .arange(m, DType::I64)
                    .reshape(&[m as isize, 1])
                    .cast(DType::F32);
                vec![x + &col * 0.25 - &row, (x * &row).transpose(0, 1) + 1.0]
            });
            check(&g, &inputs, 1e-6, &format!("arange {m}x{n}"));
        }
    }
}

#[test]
fn arange_in_a_gemm_epilogue_split_across_row_tiles() {
    // The epilogue runs on tiles of the GEMM's rows: its loop indices stay absolute.
    let (g, inputs) = build(&[&[600, 64], &[64, 40]], |i| {
        let rows = i[0].tracer().arange(600, DType::F32).reshape(&[600, 1]);
        let cols = i[0].tracer().arange(40, DType::F32);
        vec![(i[0].matmul(&i[1]) + rows * 0.01 - cols).relu()]
    });
    check(&g, &inputs, 1e-4, "arange in an epilogue");
    let compiled = compile(&g).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap();
    assert!(
        program
            .steps
            .iter()
            .any(|s| matches!(s, Step::Matmul(m) if m.epilogue.is_some())),
        "{program}"
    );
}

#[test]
fn triu_and_tril_match_the_interpreter_and_hand_values() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[3, 4]);
        vec![x.triu(1), x.tril(-1), t.ones(&[3, 3], DType::Bool).triu(0)]
    })
    .unwrap();
    let x = Tensor::from_vec(&[3, 4], (1..=12).map(|v| v as f32).collect()).unwrap();
    let out = compile(&graph)
        .unwrap()
        .call(std::slice::from_ref(&x))
        .unwrap();
    assert_eq!(
        out[0].to_f64_vec(),
        [0., 2., 3., 4., 0., 0., 7., 8., 0., 0., 0., 12.]
    );
    assert_eq!(
        out[1].to_f64_vec(),
        [0., 0., 0., 0., 5., 0., 0., 0., 9., 10., 0., 0.]
    );
    assert_eq!(out[2].dtype(), DType::Bool);
    assert_eq!(out[2].to_f64_vec(), [1., 1., 1., 0., 1., 1., 0., 0., 1.]);
    for &n in &SIZES {
        for k in [-2i64, 0, 3] {
            let (g, inputs) = build(&[&[2, 5, n]], |i| vec![i[0].triu(k), i[0].tril(k) * 2.0]);
            check(&g, &inputs, 0.0, &format!("triu/tril k={k} n={n}"));
        }
    }
}

#[test]
fn arg_reductions_pick_the_first_extreme_along_every_dim() {
    for &n in &SIZES {
        let (g, inputs) = build(&[&[3, n, 5]], |i| {
            let x = &i[0];
            let (values, indices) = x.max_dim(1, true);
            let (low, low_at) = x.min_dim(-1, false);
            vec![
                x.argmax(0, false),
                x.argmax(-1, true),
                x.argmin(1, false),
                values,
                indices,
                low,
                low_at,
            ]
        });
        check(&g, &inputs, 0.0, &format!("arg-reductions n={n}"));
    }
    // Ties go to the first position; a NaN is the maximum, as in PyTorch.
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[3, 4]);
        vec![x.argmax(-1, false), x.argmin(-1, false)]
    })
    .unwrap();
    let x = Tensor::from_vec(
        &[3, 4],
        vec![1f32, 5., 5., 0., 2., f32::NAN, 7., 7., -1., -1., 3., -1.],
    )
    .unwrap();
    for out in [
        interpret(&graph, std::slice::from_ref(&x)).unwrap(),
        compile(&graph)
            .unwrap()
            .call(std::slice::from_ref(&x))
            .unwrap(),
    ] {
        assert_eq!(out[0].dtype(), DType::I64);
        assert_eq!(out[0].to_f64_vec(), [1., 1., 2.]);
        assert_eq!(out[1].to_f64_vec(), [3., 1., 0.]);
    }
}

#[test]
fn arg_reductions_compile_to_kernels_not_fallbacks() {
    let (g, _) = build(&[&[7, 19]], |i| vec![i[0].argmax(-1, false)]);
    let compiled = compile(&g).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap();
    assert!(
        program.steps.iter().all(|s| matches!(s, Step::Kernel(_))),
        "{program}"
    );
    assert_eq!(
        program.steps.len(),
        1,
        "one kernel, two reduction stages:\n{program}"
    );
}

#[test]
fn cumsum_along_every_dim_and_its_gradient() {
    for &n in &SIZES {
        let (g, inputs) = build(&[&[3, n, 2]], |i| {
            let x = &i[0];
            vec![x.cumsum(0), x.cumsum(1), x.cumsum(-1)]
        });
        check(&g, &inputs, 1e-5, &format!("cumsum n={n}"));
    }
    // d Σ w·cumsum(x) / dx = reverse cumulative sums of w.
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[4]);
        let w = t.input("w", DType::F32, &[4]);
        let loss = (x.cumsum(0) * &w).sum(&[], false);
        loss.grad(&[&x])
    })
    .unwrap();
    let x = Tensor::from_vec(&[4], vec![0.5f32, -1., 2., 3.]).unwrap();
    let w = Tensor::from_vec(&[4], vec![1f32, 2., 3., 4.]).unwrap();
    let out = compile(&graph).unwrap().call(&[x, w]).unwrap();
    assert_eq!(out[0].to_f64_vec(), [10., 9., 7., 4.]);
}

#[test]
fn cumsum_is_one_scan_kernel_per_output_with_its_producers_inlined() {
    // Big enough to be split across threads (lines are independent).
    let (g, inputs) = build(&[&[300, 257]], |i| {
        let x = &i[0];
        vec![(x * 2.0 + 1.0).cumsum(0), x.exp().cumsum(1)]
    });
    check(&g, &inputs, 1e-4, "cumsum 300x257");
    let compiled = compile(&g).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap();
    assert_eq!(program.steps.len(), 2, "{program}");
    assert!(
        program.steps.iter().all(|s| matches!(s, Step::Kernel(_))),
        "{program}"
    );
    assert_eq!(
        program.to_string().matches("running sum").count(),
        2,
        "{program}"
    );
}

#[test]
fn cumsum_of_a_gemm_output_along_its_rows_and_its_columns() {
    // Along the columns a scan is row-local (it may run on each tile of the GEMM's rows); along
    // the rows it reads every row, after the whole GEMM.
    let (g, inputs) = build(&[&[700, 16], &[16, 24]], |i| {
        let y = i[0].matmul(&i[1]) * 0.05;
        vec![y.cumsum(0), y.cumsum(1)]
    });
    check(&g, &inputs, 1e-4, "cumsum of a GEMM output");
}

#[test]
fn repeat_interleave_repeats_each_slice_in_place() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[2, 3]);
        vec![x.repeat_interleave(2, 0), x.repeat_interleave(3, -1)]
    })
    .unwrap();
    let x = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
    let out = compile(&graph).unwrap().call(&[x]).unwrap();
    assert_eq!(out[0].shape(), &[4, 3]);
    assert_eq!(
        out[0].to_f64_vec(),
        [1., 2., 3., 1., 2., 3., 4., 5., 6., 4., 5., 6.]
    );
    assert_eq!(out[1].shape(), &[2, 9]);
    assert_eq!(
        out[1].to_f64_vec()[..9],
        [1., 1., 1., 2., 2., 2., 3., 3., 3.]
    );
    for &n in &SIZES {
        let (g, inputs) = build(&[&[2, 3, n]], |i| vec![i[0].repeat_interleave(2, 1) * 3.0]);
        check(&g, &inputs, 0.0, &format!("repeat_interleave n={n}"));
    }
}

#[test]
fn causal_attention_at_odd_lengths_and_query_key_lengths_that_differ() {
    for &(l, s) in &[(1, 1), (3, 3), (5, 5), (17, 17), (3, 7), (7, 3)] {
        let (g, inputs) = build(&[&[2, 3, l, 8], &[2, 3, s, 8], &[2, 3, s, 5]], |i| {
            vec![i[0].scaled_dot_product_attention(&i[1], &i[2], None, true)]
        });
        check(&g, &inputs, 2e-5, &format!("causal attention {l}x{s}"));
    }
    // The first query sees the first key only.
    let (g, inputs) = build(&[&[1, 1, 4, 2], &[1, 1, 4, 2], &[1, 1, 4, 3]], |i| {
        vec![i[0].scaled_dot_product_attention(&i[1], &i[2], None, true)]
    });
    let out = compile(&g).unwrap().call(&inputs).unwrap();
    let v = inputs[2].to_f64_vec();
    for (a, b) in out[0].to_f64_vec()[..3].iter().zip(&v[..3]) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
}

#[test]
fn a_bool_attention_mask_keeps_the_positions_where_it_is_true() {
    // The causal mask as a bool `tril` gives the same result as `is_causal`.
    let (g, inputs) = build(&[&[2, 3, 6, 4], &[2, 3, 6, 4], &[2, 3, 6, 5]], |i| {
        let keep = i[0].tracer().ones(&[6, 6], DType::Bool).tril(0);
        vec![
            i[0].scaled_dot_product_attention(&i[1], &i[2], Some(&keep), false),
            i[0].scaled_dot_product_attention(&i[1], &i[2], None, true),
        ]
    });
    check(&g, &inputs, 2e-5, "bool mask");
    let out = compile(&g).unwrap().call(&inputs).unwrap();
    assert_eq!(out[0].to_f64_vec(), out[1].to_f64_vec());
}

#[test]
fn conv2d_over_strides_paddings_dilations_and_groups() {
    // (channels, out channels, kernel, stride, padding, dilation, groups, size)
    let cases = [
        (3, 5, 3, 1, 1, 1, 1, 7),
        (4, 6, 3, 2, 0, 1, 2, 9),
        (2, 3, 2, 3, 1, 2, 1, 11),
        (6, 6, 3, 1, 1, 1, 6, 5),  // depthwise
        (4, 8, 3, 2, 1, 1, 4, 6),  // grouped, two outputs per group
        (5, 7, 1, 1, 0, 1, 1, 13), // 1x1
        (5, 7, 1, 2, 0, 1, 1, 13), // 1x1, strided
        (3, 4, 5, 1, 2, 1, 1, 4),  // kernel larger than the input, padded
    ];
    for (c, o, k, s, p, d, g, size) in cases {
        let options = ConvOptions::default()
            .stride(s)
            .padding(p)
            .dilation(d)
            .groups(g);
        let what = format!("conv2d c={c} o={o} k={k} s={s} p={p} d={d} g={g} size={size}");
        let (graph, inputs) = build(&[&[2, c, size, size + 2], &[o, c / g, k, k], &[o]], |i| {
            vec![
                i[0].conv2d(&i[1], Some(&i[2]), options).relu(),
                i[0].conv2d(&i[1], None, options),
            ]
        });
        check(&graph, &inputs, 2e-5, &what);
    }
}

#[test]
fn conv2d_is_one_implicit_gemm_with_the_bias_and_relu_as_its_epilogue() {
    let (g, _) = build(&[&[2, 3, 9, 9], &[8, 3, 3, 3], &[8]], |i| {
        vec![i[0]
            .conv2d(&i[1], Some(&i[2]), ConvOptions::default().stride(2))
            .relu()]
    });
    let compiled = compile(&g).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap();
    let gemms: Vec<_> = program
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Matmul(m) => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(gemms.len(), 1, "{program}");
    assert_eq!(program.steps.len(), 1, "no im2col copy: {program}");
    assert!(
        gemms[0].epilogue.is_some(),
        "bias and relu run on the GEMM's tiles:\n{program}"
    );
    assert!(
        matches!(program.steps.last(), Some(Step::Matmul(_))),
        "nothing runs after the GEMM:\n{program}"
    );
    // A 1x1 convolution with stride 1 multiplies the input where it lies: no copy at all.
    let (g, _) = build(&[&[2, 16, 5, 7], &[4, 16, 1, 1]], |i| {
        vec![i[0].conv2d(&i[1], None, ConvOptions::default())]
    });
    let compiled = compile(&g).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap();
    assert_eq!(program.steps.len(), 1, "{program}");
}

#[test]
fn graph_text_names_the_new_prims() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[2, 5]);
        vec![x.cumsum(1) + t.arange(5, DType::F32)]
    })
    .unwrap();
    let text = graph.to_string();
    assert!(text.contains("cumsum[dim=1] %0 : f32[2, 5]"), "{text}");
    assert!(text.contains("iota[len=5, f32] : f32[5]"), "{text}");
    let compiled = compile(&graph).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap().to_string();
    assert!(program.contains("running sum of"), "{program}");
    assert!(program.contains("index "), "{program}");
}

#[test]
fn conv1d_and_max_pool2d_match_the_interpreter() {
    for &n in &[5, 8, 40] {
        let (g, inputs) = build(&[&[2, 4, n], &[6, 2, 3], &[6]], |i| {
            let options = ConvOptions::default().padding(1).groups(2).stride(2);
            vec![i[0].conv1d(&i[1], Some(&i[2]), options)]
        });
        check(&g, &inputs, 2e-5, &format!("conv1d n={n}"));
    }
    for &(k, s, p, size) in &[(3, 2, 1, 13), (2, 2, 0, 7), (3, 1, 1, 5), (1, 1, 0, 3)] {
        let (g, inputs) = build(&[&[2, 3, size, size + 1]], |i| {
            vec![i[0].max_pool2d(k, s, p)]
        });
        check(
            &g,
            &inputs,
            0.0,
            &format!("max_pool2d k={k} s={s} p={p} size={size}"),
        );
    }
}

#[test]
fn avg_pool2d_with_strides_and_padding_counts_padded_zeros() {
    // Without padding and stride = kernel it is the reshape-mean `avg_pool2d`.
    for &size in &[4, 7, 9] {
        let (g, inputs) = build(&[&[2, 3, size, size + 1]], |i| {
            vec![i[0].avg_pool2d_with(2, 2, 0) - i[0].avg_pool2d(2)]
        });
        let out = compile(&g).unwrap().call(&inputs).unwrap();
        assert!(
            out[0].to_f64_vec().iter().all(|v| v.abs() < 1e-6),
            "size {size}"
        );
        let (g, inputs) = build(&[&[2, 3, size, size + 1]], |i| {
            vec![i[0].avg_pool2d_with(3, 2, 1)]
        });
        check(&g, &inputs, 1e-6, &format!("avg_pool2d 3/2/1 size {size}"));
    }
    // PyTorch's count_include_pad=True: a corner window of ones over 2x2 real values is 4/9.
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[1, 1, 4, 4]);
        vec![x.avg_pool2d_with(3, 2, 1)]
    })
    .unwrap();
    let ones = Tensor::from_vec(&[1, 1, 4, 4], vec![1f32; 16]).unwrap();
    let out = compile(&graph).unwrap().call(&[ones]).unwrap();
    assert_eq!(out[0].shape(), &[1, 1, 2, 2]);
    assert!((out[0].to_f64_vec()[0] - 4.0 / 9.0).abs() < 1e-6);
    assert!((out[0].to_f64_vec()[1] - 6.0 / 9.0).abs() < 1e-6);
    assert!((out[0].to_f64_vec()[3] - 1.0).abs() < 1e-6);
}

#[test]
fn adaptive_avg_pool2d_at_sizes_that_do_not_divide() {
    // 5 rows into 3 windows: rows 0..2, 1..4, 3..5 (PyTorch's floor/ceil bounds).
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[1, 1, 5, 1]);
        vec![x.adaptive_avg_pool2d((3, 1))]
    })
    .unwrap();
    let x = Tensor::from_vec(&[1, 1, 5, 1], vec![1f32, 2., 3., 4., 5.]).unwrap();
    for backend in [Backend::Eager, Backend::Inductor] {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(std::slice::from_ref(&x))
            .unwrap();
        let v = out[0].to_f64_vec();
        assert_eq!(out[0].shape(), &[1, 1, 3, 1]);
        for (a, b) in v.iter().zip([1.5, 3.0, 4.5]) {
            assert!((a - b).abs() < 1e-6, "{v:?}");
        }
    }
    for &(h, w, oh, ow) in &[(7, 9, 3, 4), (13, 13, 7, 7), (5, 6, 5, 6), (4, 4, 1, 1)] {
        let (g, inputs) = build(&[&[2, 3, h, w]], |i| {
            vec![i[0].adaptive_avg_pool2d((oh, ow))]
        });
        check(
            &g,
            &inputs,
            1e-6,
            &format!("adaptive_avg_pool2d {h}x{w} → {oh}x{ow}"),
        );
    }
}

#[test]
fn new_ops_differentiate_like_their_compositions() {
    // Gradients through conv2d, max_pool2d and causal attention agree between the compiled
    // joint graph and the interpreter.
    let (g, inputs) = build(&[&[2, 3, 6, 6], &[4, 3, 3, 3], &[2, 4, 5, 8]], |i| {
        let y = i[0]
            .conv2d(&i[1], None, ConvOptions::default().padding(1))
            .max_pool2d(2, 2, 0);
        let q = &i[2];
        let a = q.scaled_dot_product_attention(q, q, None, true);
        let loss = (&y * &y).sum(&[], false) + a.sum(&[], false);
        let mut outs = vec![loss.clone()];
        outs.extend(loss.grad(&[&i[0], &i[1], &i[2]]));
        outs
    });
    check(
        &g,
        &inputs,
        1e-4,
        "gradients of conv2d, max_pool2d, attention",
    );
}

fn trace_error(f: fn(&Tracer) -> Vec<Traced>) -> String {
    trace(f).unwrap_err().to_string()
}

#[test]
fn bad_sizes_are_trace_errors_naming_the_op_and_the_sizes() {
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[2, 6, 5, 5]);
        let w = t.input("w", DType::F32, &[4, 2, 3, 3]);
        vec![x.conv2d(&w, None, ConvOptions::default().groups(4))]
    });
    assert!(
        e.contains("conv2d") && e.contains("6 input channels") && e.contains("4 groups"),
        "{e}"
    );
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[2, 6, 5, 5]);
        let w = t.input("w", DType::F32, &[4, 5, 3, 3]);
        vec![x.conv2d(&w, None, ConvOptions::default())]
    });
    assert!(e.contains("conv2d") && e.contains("[4, 5, 3, 3]"), "{e}");
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[1, 2, 4, 4]);
        let w = t.input("w", DType::F32, &[3, 2, 3, 3]);
        vec![x.conv2d(&w, None, ConvOptions::default().dilation(3))]
    });
    assert!(
        e.contains("conv2d") && e.contains("7x7") && e.contains("4x4"),
        "{e}"
    );
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[1, 2, 4, 4]);
        let w = t.input("w", DType::F32, &[3, 2, 3, 3]);
        let b = t.input("b", DType::F32, &[2]);
        vec![x.conv2d(&w, Some(&b), ConvOptions::default())]
    });
    assert!(
        e.contains("conv2d") && e.contains("bias") && e.contains("[3]"),
        "{e}"
    );
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[2, 4, 9]);
        let w = t.input("w", DType::F32, &[3, 4, 3, 3]);
        vec![x.conv1d(&w, None, ConvOptions::default())]
    });
    assert!(e.contains("conv1d") && e.contains("[3, 4, 3, 3]"), "{e}");
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[1, 2, 4, 4]);
        let w = t.input("w", DType::F32, &[3, 2, 3, 3]);
        vec![x.conv2d(&w, None, ConvOptions::default().stride(0))]
    });
    assert!(e.contains("conv2d") && e.contains("stride"), "{e}");
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[1, 2, 4, 4]);
        let w = t.input("w", DType::F32, &[3, 2, 0, 3]);
        vec![x.conv2d(&w, None, ConvOptions::default())]
    });
    assert!(e.contains("conv2d") && e.contains("0x3"), "{e}");
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[1, 2, 3, 3]);
        vec![x.max_pool2d(5, 1, 0)]
    });
    assert!(
        e.contains("max_pool2d") && e.contains("5x5") && e.contains("3x3"),
        "{e}"
    );
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[1, 2, 8, 8]);
        vec![x.max_pool2d(2, 2, 2)]
    });
    assert!(e.contains("max_pool2d") && e.contains("padding 2"), "{e}");
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[3, 4]);
        vec![x.argmax(2, false)]
    });
    assert!(
        e.contains("argmax") && e.contains("dim 2") && e.contains("rank 2"),
        "{e}"
    );
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[3, 0]);
        vec![x.argmin(1, false)]
    });
    assert!(e.contains("argmin") && e.contains("empty dim 1"), "{e}");
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[3, 4]);
        vec![x.cumsum(-3)]
    });
    assert!(e.contains("cumsum") && e.contains("dim -3"), "{e}");
    // An i64 cumsum traces (and runs as a fallback step: tests/tests/fallback.rs); a bool one
    // does not.
    let e = trace_error(|t| {
        let x = t.input("x", DType::Bool, &[3, 4]);
        vec![x.cumsum(0)]
    });
    assert!(e.contains("cumsum") && e.contains("bool[3, 4]"), "{e}");
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[4]);
        vec![x.triu(0)]
    });
    assert!(
        e.contains("triu") && e.contains("2 dims") && e.contains("f32[4]"),
        "{e}"
    );
    let e = trace_error(|t| {
        let x = t.input("x", DType::F32, &[2, 3]);
        vec![x.repeat_interleave(2, 5)]
    });
    assert!(
        e.contains("repeat_interleave") && e.contains("dim 5"),
        "{e}"
    );
    let e = trace_error(|t| {
        let q = t.input("q", DType::F32, &[2, 4, 5, 8]);
        let m = t.input("m", DType::F32, &[2, 3, 5, 5]);
        vec![q.scaled_dot_product_attention(&q, &q, Some(&m), false)]
    });
    assert!(
        e.contains("scaled_dot_product_attention")
            && e.contains("[2, 3, 5, 5]")
            && e.contains("[2, 4, 5, 5]"),
        "{e}"
    );
    let e = trace_error(|t| {
        let q = t.input("q", DType::F32, &[2, 5, 8]);
        let k = t.input("k", DType::F32, &[2, 6, 7]);
        vec![q.scaled_dot_product_attention(&k, &k, None, true)]
    });
    assert!(
        e.contains("scaled_dot_product_attention") && e.contains("[2, 6, 7]"),
        "{e}"
    );
    let e = trace_error(|t| vec![t.arange_range(0.0, 5.0, 0.0, DType::F32)]);
    assert!(e.contains("arange") && e.contains("by 0"), "{e}");
}

#[test]
fn new_ops_on_half_precision_values() {
    for dtype in [DType::F16, DType::BF16] {
        let graph = trace(|t| {
            let x = t.input("x", dtype, &[2, 4, 9, 9]);
            let w = t.input("w", dtype, &[6, 4, 3, 3]);
            let conv = x.conv2d(&w, None, ConvOptions::default().padding(1));
            vec![
                conv.max_pool2d(3, 2, 1),
                x.cumsum(-1),
                x.argmax(1, false),
                x.triu(0),
                t.arange(300, dtype),
            ]
        })
        .unwrap();
        let inputs: Vec<Tensor> = [(&[2usize, 4, 9, 9][..], 1u32), (&[6, 4, 3, 3][..], 2)]
            .iter()
            .map(|(shape, seed)| {
                let v = values(shape, *seed).to_f64_vec();
                let scaled: Vec<f64> = v.iter().map(|x| x * 0.3).collect();
                Tensor::from_f64(dtype, shape, &scaled).unwrap()
            })
            .collect();
        let want = interpret(&graph, &inputs).unwrap();
        let got = compile(&graph).unwrap().call(&inputs).unwrap();
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.dtype(), w.dtype(), "{dtype} output {k}");
            assert_eq!(g.shape(), w.shape(), "{dtype} output {k}");
            for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
                assert!(
                    (a - b).abs() <= 2e-2 * b.abs().max(1.0),
                    "{dtype} output {k}: compiled {a} vs reference {b}"
                );
            }
        }
    }
}

/// PyTorch's max pooling, written out: each output takes the maximum over the input positions
/// its dilated window covers (−inf where it covers none).
fn naive_max_pool(x: &Tensor, o: minductor::PoolOptions, out: (usize, usize)) -> Vec<f32> {
    let s = x.shape().to_vec();
    let data = x.to_vec::<f32>().unwrap();
    let mut result = Vec::new();
    for n in 0..s[0] * s[1] {
        for oy in 0..out.0 {
            for ox in 0..out.1 {
                let mut best = f32::NEG_INFINITY;
                for i in 0..o.kernel {
                    for j in 0..o.kernel {
                        let y = (oy * o.stride + i * o.dilation) as isize - o.padding as isize;
                        let x_ = (ox * o.stride + j * o.dilation) as isize - o.padding as isize;
                        if y >= 0 && x_ >= 0 && (y as usize) < s[2] && (x_ as usize) < s[3] {
                            best = best.max(data[(n * s[2] + y as usize) * s[3] + x_ as usize]);
                        }
                    }
                }
                result.push(best);
            }
        }
    }
    result
}

#[test]
fn max_pool2d_with_dilation_and_ceil_mode_matches_pytorch_semantics() {
    use minductor::PoolOptions;
    // (h, w, options, PyTorch's output size)
    let cases = [
        (7, 7, PoolOptions::new(3).stride(2).padding(1), (4, 4)),
        (7, 8, PoolOptions::new(3).stride(2).ceil_mode(), (3, 4)),
        (6, 6, PoolOptions::new(2).stride(2).ceil_mode(), (3, 3)),
        (5, 6, PoolOptions::new(2).stride(2).ceil_mode(), (3, 3)),
        (
            9,
            10,
            PoolOptions::new(3).stride(2).padding(1).dilation(2),
            (4, 4),
        ),
        (
            9,
            11,
            PoolOptions::new(3)
                .stride(3)
                .padding(1)
                .dilation(2)
                .ceil_mode(),
            (3, 4),
        ),
        (4, 5, PoolOptions::new(2).stride(1), (3, 4)),
    ];
    for (h, w, options, (oh, ow)) in cases {
        let graph = trace(|t| {
            let x = t.input("x", DType::F32, &[2, 3, h, w]);
            vec![x.max_pool2d_with(options)]
        })
        .unwrap_or_else(|e| panic!("{options:?} on {h}x{w}: {e}"));
        let x = values(&[2, 3, h, w], 7);
        let got = compile(&graph)
            .unwrap()
            .call(std::slice::from_ref(&x))
            .unwrap();
        assert_eq!(got[0].shape(), [2, 3, oh, ow], "{options:?} on {h}x{w}");
        assert_eq!(
            got[0].to_vec::<f32>().unwrap(),
            naive_max_pool(&x, options, (oh, ow)),
            "{options:?} on {h}x{w}"
        );
    }
    // A window larger than the padded input, and zero sizes, are trace errors.
    for options in [
        PoolOptions::new(5).dilation(2),
        PoolOptions::new(2).stride(0),
    ] {
        let traced = trace(|t| {
            let x = t.input("x", DType::F32, &[1, 1, 4, 4]);
            vec![x.max_pool2d_with(options)]
        });
        let error = traced
            .expect_err("a bad pooling must not trace")
            .to_string();
        assert!(error.contains("max_pool2d"), "{error}");
    }
}

#[test]
fn cumsum_accumulates_in_f64_like_pytorch() {
    // Found by the 100,000-case random campaign: a running sum of 245 values near 0.1 in f32
    // drifted 2.5e-5 from PyTorch's (whose CPU cumsum accumulates floats in double), which a
    // following `x − max(x)` turned into a relative error of 1e-4. Accumulating in f64 and
    // rounding each element once gives the interpreter's values bit for bit.
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[245, 142]);
        // Exactly rounded steps before the scan (no polynomial approximations): the values
        // summed are the interpreter's, bit for bit.
        let c = ((x.abs() + 1.0) * 0.1).cumsum(0);
        vec![c.clone(), &c - &c.amax(&[1], true)]
    })
    .unwrap();
    let x = values(&[245, 142], 3);
    let want = interpret(&graph, std::slice::from_ref(&x)).unwrap();
    let got = compile(&graph).unwrap().call(&[x]).unwrap();
    minductor_tests::assert_allclose(&got, &want, minductor_tests::Tolerance::EXACT, "cumsum");
}
