//! Bad input never panics: wrong arity, dtype, rank or shape at `call`, ill-typed ops at trace
//! time, non-contiguous, empty and out-of-range inputs each give a typed error or the right answer.

use minductor::{compile_with, interpret, trace, Backend, DType, RuntimeError, Tensor, Tracer};
use minductor_tests::ramp;

const BACKENDS: [Backend; 3] = [Backend::Eager, Backend::AotEager, Backend::Inductor];

fn add_graph() -> minductor::Graph {
    trace(|t| {
        let x = t.input("x", DType::F32, &[2, 3]);
        let y = t.input("y", DType::F32, &[2, 3]);
        vec![(&x + &y).exp()]
    })
    .unwrap()
}

#[test]
fn wrong_arity_names_expected_and_found() {
    for backend in BACKENDS {
        let c = compile_with(&add_graph(), backend).unwrap();
        let err = c.call(&[ramp(&[2, 3], 0.0)]).unwrap_err();
        assert_eq!(
            err,
            RuntimeError::Arity {
                expected: 2,
                found: 1
            }
        );
        assert_eq!(err.to_string(), "expected 2 inputs, got 1");
    }
}

#[test]
fn wrong_dtype_names_the_input() {
    for backend in BACKENDS {
        let c = compile_with(&add_graph(), backend).unwrap();
        let bad = Tensor::from_vec(&[2, 3], vec![0i64; 6]).unwrap();
        let err = c.call(&[ramp(&[2, 3], 0.0), bad]).unwrap_err();
        assert_eq!(err.to_string(), "input `y`: expected dtype f32, found i64");
    }
}

#[test]
fn wrong_rank_and_shape_name_the_input() {
    for backend in BACKENDS {
        let c = compile_with(&add_graph(), backend).unwrap();
        let err = c.call(&[ramp(&[6], 0.0), ramp(&[2, 3], 0.0)]).unwrap_err();
        assert!(
            matches!(err, RuntimeError::Rank { ref name, expected: 2, found: 1, .. } if name == "x"),
            "{err}"
        );
        let err = c
            .call(&[ramp(&[2, 3], 0.0), ramp(&[3, 2], 0.0)])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "input `y`: expected shape [2, 3], found [3, 2]"
        );
    }
}

#[test]
fn ill_typed_ops_are_reported_at_trace_time_with_location() {
    let err = trace(|t| {
        let a = t.input("a", DType::F32, &[3, 4]);
        let b = t.input("b", DType::F32, &[5, 6]);
        vec![a.matmul(&b)]
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("matmul: inner dimensions differ: [3, 4] @ [5, 6]"),
        "{text}"
    );
    assert!(text.contains("bad_input.rs:"), "location missing: {text}");

    let err = trace(|t| {
        let a = t.input("a", DType::F32, &[3]);
        let b = t.input("b", DType::F32, &[4]);
        // The first error wins; later ops on the poisoned value are skipped.
        vec![(&a + &b).exp().sum(&[0], false)]
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("add: cannot broadcast shapes [3] and [4]"),
        "{err}"
    );

    let err = trace(|t| vec![t.input("x", DType::F32, &[2, 3]).reshape(&[4, -1])]).unwrap_err();
    assert!(
        err.to_string().contains("cannot reshape [2, 3] to [4, -1]"),
        "{err}"
    );

    let err = trace(|t| vec![t.input("x", DType::F32, &[2, 3]).softmax(2)]).unwrap_err();
    assert!(
        err.to_string().contains("dim 2 out of range for rank 2"),
        "{err}"
    );

    let err = trace(|t| vec![t.input("x", DType::I64, &[2]).exp()]).unwrap_err();
    assert!(
        err.to_string().contains("expected a floating-point tensor"),
        "{err}"
    );
}

#[test]
fn non_contiguous_inputs_give_the_right_answer() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[3, 4]);
        vec![(&x * 2.0).softmax(-1)]
    })
    .unwrap();
    let base = ramp(&[4, 3], 0.0);
    let x = base.permute(&[1, 0]).unwrap();
    assert!(!x.is_contiguous());
    let want = interpret(&graph, &[x.contiguous()]).unwrap();
    for backend in BACKENDS {
        let got = compile_with(&graph, backend)
            .unwrap()
            .call(std::slice::from_ref(&x))
            .unwrap();
        assert_eq!(got[0].to_vec::<f32>().unwrap().len(), 12);
        for (g, w) in got[0]
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .zip(want[0].to_vec::<f32>().unwrap())
        {
            assert!((g - w).abs() <= 1e-6, "{backend:?}: {g} vs {w}");
        }
    }
}

#[test]
fn empty_tensors_compute_empty_or_neutral_results() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[0, 5]);
        let w = t.input("w", DType::F32, &[5, 0]);
        vec![
            x.exp().sum(&[1], false),
            x.sum(&[0], false),
            x.matmul(&w),
            w.softmax(-1),
        ]
    })
    .unwrap();
    let inputs = [
        Tensor::zeros(DType::F32, &[0, 5]),
        Tensor::zeros(DType::F32, &[5, 0]),
    ];
    for backend in BACKENDS {
        let out = compile_with(&graph, backend)
            .unwrap()
            .call(&inputs)
            .unwrap();
        assert_eq!(out[0].shape(), &[0]);
        assert_eq!(
            out[1].to_vec::<f32>().unwrap(),
            vec![0.0; 5],
            "{backend:?}: sum over an empty dim is 0"
        );
        assert_eq!(out[2].shape(), &[0, 0]);
        assert_eq!(out[3].shape(), &[5, 0]);
    }
}

#[test]
fn out_of_range_embedding_index_is_an_error() {
    let tracer = Tracer::new();
    let idx = tracer.input("idx", DType::I64, &[3]);
    let table = tracer.input("table", DType::F32, &[4, 2]);
    let out = idx.embedding(&table);
    let graph = tracer.finish(&[out]).unwrap();
    let table = ramp(&[4, 2], 0.0);
    for backend in BACKENDS {
        let c = compile_with(&graph, backend).unwrap();
        let ok = c
            .call(&[
                Tensor::from_vec(&[3], vec![3i64, 0, 1]).unwrap(),
                table.clone(),
            ])
            .unwrap();
        assert_eq!(ok[0].shape(), &[3, 2]);
        let err = c
            .call(&[
                Tensor::from_vec(&[3], vec![0i64, 4, 1]).unwrap(),
                table.clone(),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("index 4"), "{backend:?}: {err}");
        let err = c
            .call(&[
                Tensor::from_vec(&[3], vec![-1i64, 0, 1]).unwrap(),
                table.clone(),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("index -1"), "{backend:?}: {err}");
    }
}

#[test]
fn unknown_backend_is_a_typed_error() {
    let err = "tvm".parse::<Backend>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown backend `tvm` (expected eager, aot_eager or inductor)"
    );
}

#[test]
fn symbolic_dims_are_a_typed_error_not_a_panic() {
    use minductor::{Dim, SymId, TensorType};
    let tracer = Tracer::new();
    let x = tracer.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Sym(SymId(0)), Dim::Static(4)].into_iter().collect(),
        ),
    );
    let graph = tracer.finish(&[x.softmax(-1)]).unwrap();
    let err = compile_with(&graph, Backend::AotEager)
        .err()
        .expect("the prim interpreter needs static shapes");
    assert!(err.to_string().contains("symbolic dims"), "{err}");
    // An embedding table with a symbolic row count is compiled (the bound of its index check
    // and of the kernel's clamp is the symbol's size at each call): right rows for indices in
    // range, at two table lengths, and a typed error for one past the table.
    let tracer = Tracer::new();
    let table = tracer.input_typed(
        "table",
        TensorType::new(
            DType::F32,
            [Dim::Sym(SymId(0)), Dim::Static(4)].into_iter().collect(),
        ),
    );
    let ids = tracer.input("ids", DType::I64, &[3]);
    let lookup = tracer.finish(&[ids.embedding(&table)]).unwrap();
    let compiled = compile_with(&lookup, Backend::Inductor).unwrap();
    assert!(
        compiled.fallbacks().is_empty(),
        "{:?}",
        compiled.fallbacks()
    );
    for length in [5, 9] {
        let table_values = ramp(&[length, 4], 0.0);
        let ids = Tensor::from_vec(&[3], vec![4i64, 0, 2]).unwrap();
        let got = compiled.call(&[table_values.clone(), ids]).unwrap();
        let rows = table_values.to_vec::<f32>().unwrap();
        let want: Vec<f32> = [4, 0, 2]
            .iter()
            .flat_map(|&r| rows[r * 4..r * 4 + 4].to_vec())
            .collect();
        assert_eq!(got[0].to_vec::<f32>().unwrap(), want, "{length} rows");
        let past_the_end = Tensor::from_vec(&[3], vec![0i64, length as i64, 1]).unwrap();
        let err = compiled.call(&[table_values, past_the_end]).unwrap_err();
        assert!(matches!(err, RuntimeError::Data(_)), "{length} rows: {err}");
    }
    let eager = compile_with(&graph, Backend::Eager).unwrap();
    let err = eager.call(&[ramp(&[3, 4], 0.0)]).unwrap_err();
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err}");
}

#[test]
fn integer_reductions_compile_as_fallback_steps() {
    let graph = trace(|t| vec![t.input("i", DType::I64, &[4, 3]).sum(&[1], false)]).unwrap();
    let input = [Tensor::from_vec(&[4, 3], (0..12i64).collect()).unwrap()];
    for backend in [Backend::Inductor, Backend::Eager] {
        let compiled = compile_with(&graph, backend).unwrap();
        let out = compiled.call(&input).unwrap();
        assert_eq!(out[0].to_vec::<i64>().unwrap(), vec![3, 12, 21, 30]);
    }
    let compiled = compile_with(&graph, Backend::Inductor).unwrap();
    let fallbacks = compiled.fallbacks();
    assert!(
        fallbacks.len() == 1 && fallbacks[0].contains("reductions over i64"),
        "{fallbacks:?}"
    );
}

#[test]
fn new_ops_reject_bad_sizes_with_errors_naming_the_op() {
    let err = |f: fn(&minductor::Tracer) -> Vec<minductor::Traced>| {
        minductor::trace(f).unwrap_err().to_string()
    };
    let e = err(|t| {
        let x = t.input("x", DType::F32, &[2, 16, 5, 5]);
        vec![x.group_norm(3, None, None, 1e-5)]
    });
    assert!(
        e.contains("group_norm") && e.contains("16 channels") && e.contains("3 groups"),
        "{e}"
    );
    let e = err(|t| {
        let x = t.input("x", DType::F32, &[2, 3, 4, 4]);
        vec![x.avg_pool2d(5)]
    });
    assert!(
        e.contains("avg_pool2d") && e.contains("5x5") && e.contains("[2, 3, 4, 4]"),
        "{e}"
    );
    let e = err(|t| {
        let x = t.input("x", DType::F32, &[2, 3]);
        vec![x.pad(&[1, 2, 3], 0.0)]
    });
    assert!(e.contains("pad") && e.contains("[1, 2, 3]"), "{e}");
    let e = err(|t| {
        let x = t.input("x", DType::F32, &[2, 3]);
        let i = t.input("i", DType::I64, &[2, 2]);
        vec![x.index_select(0, &i)]
    });
    assert!(e.contains("index_select") && e.contains("1-d"), "{e}");
    let e = err(|t| {
        let x = t.input("x", DType::F32, &[4, 6]);
        let i = t.input("i", DType::I64, &[4, 2]);
        vec![x.gather(1, &i.cast(DType::F32))]
    });
    assert!(e.contains("take_along") && e.contains("i64"), "{e}");
}

#[test]
fn out_of_range_indices_of_index_select_and_gather_are_errors_on_every_backend() {
    let graph = minductor::trace(|t| {
        let x = t.input("x", DType::F32, &[4, 3]);
        let i = t.input("i", DType::I64, &[2]);
        vec![x.index_select(0, &i)]
    })
    .unwrap();
    let x = Tensor::zeros(DType::F32, &[4, 3]);
    for bad in [4i64, -1] {
        let i = Tensor::from_vec(&[2], vec![0i64, bad]).unwrap();
        for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
            let err = compile_with(&graph, backend)
                .unwrap()
                .call(&[x.clone(), i.clone()])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&bad.to_string()) && err.contains("out of range"),
                "{backend:?}: {err}"
            );
        }
    }
}

#[test]
fn embedding_indices_reaching_the_gather_through_a_view_are_range_checked() {
    // Issue 11, defect 2: index 9 into a 4-row table through a reshape returned row 3, and a
    // 0-row table read before its buffer.
    for rows in [4usize, 0] {
        let graph = minductor::trace(|t| {
            let ids = t.input("ids", DType::I64, &[2, 2]);
            let table = t.input("table", DType::F32, &[rows, 3]);
            vec![ids.reshape(&[4]).embedding(&table)]
        })
        .unwrap();
        let ids = Tensor::from_vec(&[2, 2], vec![0i64, 1, 9, 2]).unwrap();
        let table = Tensor::zeros(DType::F32, &[rows, 3]);
        for backend in [Backend::Eager, Backend::AotEager, Backend::Inductor] {
            let err = compile_with(&graph, backend)
                .unwrap()
                .call(&[ids.clone(), table.clone()])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("out of range"),
                "{backend:?}, {rows} rows: {err}"
            );
        }
    }
}
