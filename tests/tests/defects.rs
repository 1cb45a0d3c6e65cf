//! Regression tests for issue 11's defects 3 to 7, each on the smallest graph or program that
//! showed it (defect 8, the JIT code leak, is `jit_memory.rs`: it measures the process's
//! resident memory, so it runs alone in its own test binary).

use minductor::internals::codegen_cpu::{compile_program, CodegenError};
use minductor::internals::kernel_ir::VerifyError;
use minductor::internals::kernel_ir::{Program, ScalarType, Step};
use minductor::Executable;
use minductor::{
    compile, interpret, jit, trace, CompileError, CompiledFn, DType, Graph, JitBackend, JitError,
    RuntimeError, Tensor, Traced, Tracer,
};
use minductor::{Dim, SymId, TensorType};
use minductor_tests::compiled_program as program_of;
use minductor_tests::ramp;

// ---- defect 3: sizes that overflow ------------------------------------------------------------

#[test]
fn expand_to_2_pow_62_rows_is_a_trace_error_not_a_wrapped_byte_count() {
    let err = trace(|t| {
        let x = t.input("x", DType::F32, &[1, 8]);
        vec![x.expand(&[1 << 62, 8])]
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("expand") && text.contains("overflows"),
        "{text}"
    );
    assert!(text.contains("defects.rs:"), "location missing: {text}");
}

#[test]
fn reshape_sizes_whose_product_overflows_are_a_trace_error() {
    let err = trace(|t| {
        let x = t.input("x", DType::F32, &[4]);
        vec![x.reshape(&[1 << 33, 1 << 33, -1])]
    })
    .unwrap_err();
    assert!(err.to_string().contains("reshape"), "{err}");
}

#[test]
fn an_input_whose_byte_count_overflows_is_a_trace_error() {
    let err = trace(|t| vec![t.input("x", DType::F32, &[1 << 40, 1 << 40]).exp()]).unwrap_err();
    assert!(err.to_string().contains("input `x`"), "{err}");
}

#[test]
fn tensors_whose_byte_count_overflows_are_typed_errors() {
    let huge = [1usize << 62, 8];
    assert!(matches!(
        Tensor::try_zeros(DType::F32, &huge),
        Err(RuntimeError::SizeOverflow(_))
    ));
    assert!(matches!(
        Tensor::for_overwrite(DType::F32, &huge),
        Err(RuntimeError::SizeOverflow(_))
    ));
    // The element count wraps to 0 in usize: an empty Vec must not pass for it.
    assert!(matches!(
        Tensor::from_vec::<f32>(&[1 << 32, 1 << 32], Vec::new()),
        Err(RuntimeError::SizeOverflow(_))
    ));
    assert!(matches!(
        Tensor::from_bytes(DType::I64, &[1 << 61, 4], &[]),
        Err(RuntimeError::SizeOverflow(_))
    ));
}

#[test]
fn a_symbolic_size_whose_byte_count_overflows_at_call_time_is_a_typed_error() {
    // [s0, 2^58] f32 is 2^60 bytes per unit of s0: fine to compile, 2^64 bytes for s0 = 16.
    let tracer = Tracer::new();
    let s0 = Dim::Sym(SymId(0));
    let x = tracer.input_typed(
        "x",
        TensorType::new(DType::F32, [s0, Dim::Static(1)].into_iter().collect()),
    );
    let y = x.expand(&[-1, 1 << 58]);
    let graph = tracer.finish(&[y]).unwrap();
    let compiled = compile(&graph).unwrap();
    let err = compiled.call(&[ramp(&[16, 1], 0.0)]).unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::SizeOverflow(_) | RuntimeError::InvalidProgram(_)
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("overflow") || err.to_string().contains("isize::MAX"),
        "{err}"
    );
}

// ---- defect 4: panics from the public API -----------------------------------------------------

#[test]
fn cat_of_no_tensors_is_a_trace_error() {
    let err = trace(|_| vec![Traced::cat(&[], 0)]).unwrap_err();
    assert!(
        err.to_string().contains("cat: needs at least one tensor"),
        "{err}"
    );
    // Under jit too.
    let f = jit(|_: &[Traced]| vec![Traced::cat(&[], 0)]);
    let err = f.call(&[ramp(&[2], 0.0)]).unwrap_err();
    assert!(matches!(err, JitError::Trace(_)), "{err}");
}

#[test]
fn finish_given_an_output_of_another_tracer_is_an_error() {
    let mine = Tracer::new();
    let _x = mine.input("x", DType::F32, &[2]);
    let other = Tracer::new();
    let y = other.input("y", DType::F32, &[2]);
    // A healthy value of another tracer.
    let err = Tracer::new().finish(&[y.exp()]).unwrap_err();
    assert!(err.to_string().contains("different tracer"), "{err}");
    // A poisoned value of another tracer: its own error is reported (this used to panic).
    let poisoned = y.matmul(&other.input("z", DType::F32, &[3, 3]));
    let err = mine.finish(&[poisoned]).unwrap_err();
    assert!(err.to_string().contains("matmul"), "{err}");
}

#[test]
fn a_custom_backend_returning_the_wrong_outputs_is_an_error() {
    fn backend_returning(
        outputs: fn(&[Tensor]) -> Vec<Tensor>,
    ) -> impl Fn(&Graph, &[TensorType]) -> Result<CompiledFn, CompileError> + Send + Sync {
        move |_graph: &Graph, _types: &[TensorType]| -> Result<CompiledFn, CompileError> {
            Ok(Box::new(move |inputs: &[Tensor]| Ok(outputs(inputs))))
        }
    }
    let model = |x: &[Traced]| vec![x[0].exp(), x[0].sin()];
    let none = jit(model).backend(JitBackend::custom(backend_returning(|_| Vec::new())));
    let err = none.call(&[ramp(&[3], 0.0)]).unwrap_err();
    assert!(matches!(err, JitError::Runtime(_)), "{err}");
    assert!(
        err.to_string()
            .contains("backend `custom` returned 0 outputs; the graph has 2"),
        "{err}"
    );
    let wrong_dtype = jit(model).backend(JitBackend::custom(backend_returning(|_| {
        vec![
            Tensor::zeros(DType::I64, &[3]),
            Tensor::zeros(DType::F32, &[3]),
        ]
    })));
    let err = wrong_dtype.call(&[ramp(&[3], 0.0)]).unwrap_err();
    assert!(matches!(err, JitError::Runtime(_)), "{err}");
    assert!(
        err.to_string()
            .contains("output 0: expected f32[3], found i64[3]"),
        "{err}"
    );
    // And a well-behaved custom backend still runs.
    let good = jit(model).backend(JitBackend::custom(backend_returning(|x| {
        vec![x[0].clone(), x[0].clone()]
    })));
    let out = good.call(&[ramp(&[3], 0.0)]).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].to_f64_vec(), ramp(&[3], 0.0).to_f64_vec());
}

fn exp_program() -> Program {
    program_of(
        &trace(|t| {
            let x = t.input("x", DType::F32, &[8]);
            vec![x.exp()]
        })
        .unwrap(),
    )
}

fn first_kernel(program: &mut Program) -> &mut minductor::internals::kernel_ir::Kernel {
    match &mut program.steps[0] {
        Step::Kernel(k) => k,
        _ => panic!("the first step of this program is a kernel"),
    }
}

#[test]
fn a_symbol_that_appears_only_in_a_loop_extent_is_rejected_not_a_panic() {
    let good = exp_program();
    let out = compile_program(&good)
        .unwrap()
        .run(&[ramp(&[8], 0.0)])
        .unwrap();
    let want: Vec<f64> = ramp(&[8], 0.0)
        .to_f64_vec()
        .iter()
        .map(|v| v.exp())
        .collect();
    for (g, w) in out[0].to_f64_vec().iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs(), "{g} vs {w}");
    }
    // From a graph: an expand to a symbol no input has is a typed error on every backend.
    let mut graph = Graph::new();
    let x = graph.input(
        "x",
        TensorType::new(DType::F32, minductor::internals::ir::static_shape(&[1, 3])),
    );
    let shape = [Dim::Sym(SymId(9)), Dim::Static(3)].into_iter().collect();
    let y = graph
        .add(minductor::internals::ir::Op::Expand { shape }, &[x])
        .unwrap();
    graph.set_outputs(vec![y]);
    for backend in [minductor::Backend::Eager, minductor::Backend::Inductor] {
        let result = minductor::compile_with(&graph, backend).and_then(|c| {
            c.call(&[ramp(&[1, 3], 0.0)])
                .map_err(|e| CompileError::Unsupported {
                    backend: "call",
                    what: e.to_string(),
                })
        });
        let Err(err) = result else {
            panic!("{backend:?}: an unbound symbol ran");
        };
        assert!(err.to_string().contains("s9"), "{backend:?}: {err}");
    }
    let mut bad = good.clone();
    first_kernel(&mut bad).stages[0].extent[0] = Dim::Sym(SymId(3));
    match compile_program(&bad) {
        Err(CodegenError::Verify(e)) if *e == VerifyError::UnboundSymbol(Dim::Sym(SymId(3))) => {}
        Err(other) => panic!("expected an unbound-symbol error, got {other}"),
        Ok(_) => panic!("a program with an unbound symbol compiled"),
    }
}

// ---- defect 5: the Element trait and bool bytes ------------------------------------------------

#[test]
fn bool_tensors_from_raw_bytes_hold_only_0_and_1() {
    let mut t = Tensor::from_bytes(DType::Bool, &[4], &[0, 2, 255, 1]).unwrap();
    assert_eq!(t.to_bytes(), vec![0, 1, 1, 1]);
    assert_eq!(
        t.data_mut::<bool>().unwrap().to_vec(),
        vec![false, true, true, true]
    );
    assert_eq!(t.to_vec::<bool>().unwrap(), vec![false, true, true, true]);
}

#[test]
fn a_bool_tensor_for_overwrite_never_sees_recycled_bytes() {
    // A large block the caller drops goes to the block cache; a bool tensor of the same byte size
    // must not pick it up with its old bytes (0x3f here), which are not valid bools.
    let bytes = 4 << 20;
    let mut f = Tensor::for_overwrite(DType::F32, &[bytes / 4]).unwrap();
    f.data_mut::<f32>().unwrap().fill(0.75); // 0x3f400000
    drop(f);
    let b = Tensor::for_overwrite(DType::Bool, &[bytes]).unwrap();
    assert!(b.to_bytes().iter().all(|&x| x <= 1));
}

#[test]
fn data_mut_refuses_another_dtype_or_a_shared_or_strided_tensor() {
    let mut t = ramp(&[2, 3], 0.0);
    assert!(t.data_mut::<i64>().is_none());
    let shared = t.clone();
    assert!(t.data_mut::<f32>().is_none());
    drop(shared);
    assert_eq!(t.data_mut::<f32>().unwrap().len(), 6);
    let mut transposed = t.permute(&[1, 0]).unwrap();
    drop(t);
    assert!(transposed.data_mut::<f32>().is_none());
}

// ---- defect 6: the kernel-IR verifier ------------------------------------------------------------

#[test]
fn the_verifier_rejects_an_out_of_range_store() {
    let mut bad = exp_program();
    // store buf1[i0 + 1] over i0 in 0..8: element 8 of an 8-element buffer.
    let k = first_kernel(&mut bad);
    let minductor::internals::kernel_ir::StageAction::Store(stores) = &mut k.stages[0].action
    else {
        panic!("stage 0 stores")
    };
    stores[0].index.offset = 1.into();
    match compile_program(&bad) {
        Err(CodegenError::Verify(e))
            if matches!(
                *e,
                VerifyError::OutOfRange {
                    min: 1,
                    max: 8,
                    len: 8,
                    ..
                }
            ) => {}
        Err(other) => panic!("expected an out-of-range error, got {other}"),
        Ok(_) => panic!("an out-of-range store compiled"),
    }
}

#[test]
fn the_verifier_rejects_an_out_of_range_load_with_symbolic_sizes_at_call_time() {
    let tracer = Tracer::new();
    let x = tracer.input_typed(
        "x",
        TensorType::new(DType::F32, [Dim::Sym(SymId(0))].into_iter().collect()),
    );
    let y = x.exp();
    let good = program_of(&tracer.finish(&[y]).unwrap());
    let mut bad = good.clone();
    let k = first_kernel(&mut bad);
    let load = k
        .exprs
        .iter_mut()
        .find_map(|e| match e {
            minductor::internals::kernel_ir::Expr::Load { index, .. } => Some(index),
            _ => None,
        })
        .unwrap();
    load.offset = (-1).into();
    // The range depends on s0: compile_program cannot prove it wrong, the call must refuse it.
    let compiled = compile_program(&bad).unwrap();
    match compiled.run(&[ramp(&[5], 0.0)]) {
        Err(RuntimeError::InvalidProgram(m)) => assert!(m.contains("outside"), "{m}"),
        other => panic!("expected an invalid-program error, got {other:?}"),
    }
    assert_eq!(
        compile_program(&good)
            .unwrap()
            .run(&[ramp(&[5], 0.0)])
            .unwrap()[0]
            .shape(),
        &[5]
    );
}

/// `a = x @ w; b = x @ exp(w); (a + b) @ w`: three intermediates, two live at once, one in
/// place (the add's output takes `a`'s slot).
fn matmul_program() -> Program {
    program_of(
        &trace(|t| {
            let x = t.input("x", DType::F32, &[8, 8]);
            let w = t.input("w", DType::F32, &[8, 8]);
            let a = x.matmul(&w);
            let b = x.matmul(&w.exp());
            vec![(&a + &b).matmul(&w)]
        })
        .unwrap(),
    )
}

#[test]
fn the_verifier_accepts_the_planned_matmul_program_and_it_runs_right() {
    let program = matmul_program();
    let (x, w) = (ramp(&[8, 8], 0.0), ramp(&[8, 8], 0.0));
    let out = compile_program(&program)
        .unwrap()
        .run(&[x.clone(), w.clone()])
        .unwrap();
    let want = minductor::interpret(
        &trace(|t| {
            let x = t.input("x", DType::F32, &[8, 8]);
            let w = t.input("w", DType::F32, &[8, 8]);
            vec![(x.matmul(&w) + x.matmul(&w.exp())).matmul(&w)]
        })
        .unwrap(),
        &[x, w],
    )
    .unwrap();
    for (g, w) in out[0].to_f64_vec().iter().zip(want[0].to_f64_vec()) {
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
    }
}

#[test]
fn the_verifier_rejects_an_undersized_slot() {
    let mut bad = matmul_program();
    let plan = bad.plan.as_mut().unwrap();
    plan.slots[1].bytes = 4;
    match compile_program(&bad) {
        Err(CodegenError::Verify(e)) => match *e {
            VerifyError::Plan(m) => assert!(m.contains("too few"), "{m}"),
            other => panic!("expected a plan error, got {other}"),
        },
        Err(other) => panic!("expected a plan error, got {other}"),
        Ok(_) => panic!("an undersized slot compiled"),
    }
}

#[test]
fn the_verifier_rejects_slots_shared_by_overlapping_lifetimes() {
    let mut bad = matmul_program();
    let plan = bad.plan.as_mut().unwrap();
    // Move the second slot's buffer (exp(w), live over steps 1..=2) into the first slot, whose
    // buffer (x @ w) is live over steps 0..=2.
    let moved = plan.slots[1].members.remove(0);
    plan.slots[0].members.push(moved);
    plan.slot_of[moved.0 as usize] = Some(0);
    match compile_program(&bad) {
        Err(CodegenError::Verify(e)) => match *e {
            VerifyError::Plan(m) => assert!(m.contains("while both are live"), "{m}"),
            other => panic!("expected a plan error, got {other}"),
        },
        Err(other) => panic!("expected a plan error, got {other}"),
        Ok(_) => panic!("overlapping slots compiled"),
    }
}

#[test]
fn the_verifier_rejects_an_in_place_pair_the_kernel_does_not_allow() {
    let mut bad = matmul_program();
    // Claim that the add's output may overwrite exp(w)'s slot in place at step 2: exp(w) is read
    // whole by the GEMM of that step, so it is not safe.
    let plan = bad.plan.as_mut().unwrap();
    let (into, _, step) = plan.in_place[0];
    let from = plan.slots[1].members[0];
    let own = plan.slot_of[into.0 as usize].unwrap();
    plan.slots[own].members.retain(|&m| m != into);
    plan.slots[1].members.push(into);
    plan.slot_of[into.0 as usize] = Some(1);
    plan.in_place = vec![(into, from, step)];
    match compile_program(&bad) {
        Err(CodegenError::Verify(e)) => assert!(matches!(*e, VerifyError::Plan(_)), "{e}"),
        Err(other) => panic!("expected a plan error, got {other}"),
        Ok(_) => panic!("an unsafe in-place pair compiled"),
    }
}

#[test]
fn the_verifier_rejects_a_gemm_view_outside_its_buffer() {
    let mut bad = matmul_program();
    let Step::Matmul(m) = &mut bad.steps[0] else {
        panic!("the first step is a GEMM")
    };
    m.a.offset = 1.into();
    match compile_program(&bad) {
        Err(CodegenError::Verify(e)) => {
            assert!(matches!(*e, VerifyError::OutOfRange { .. }), "{e}")
        }
        Err(other) => panic!("expected an out-of-range error, got {other}"),
        Ok(_) => panic!("a GEMM view outside its buffer compiled"),
    }
}

#[test]
fn the_verifier_rejects_ops_the_lowering_has_no_rule_for_instead_of_panicking() {
    // exp over i64 buffers: well-typed as far as the expression types go, but code generation
    // has no integer exp (it used to reach an `unreachable!`).
    let mut bad = exp_program();
    for b in &mut bad.buffers {
        b.dtype = DType::I64;
    }
    let k = first_kernel(&mut bad);
    k.types = vec![ScalarType::I64; k.exprs.len()];
    match compile_program(&bad) {
        Err(CodegenError::Verify(e)) => {
            assert!(e.to_string().contains("Exp is not defined on I64"), "{e}")
        }
        Err(other) => panic!("expected a verifier error, got {other}"),
        Ok(_) => panic!("an integer exp compiled"),
    }
}

#[test]
fn the_verifier_rejects_rows_that_store_the_same_elements() {
    // exp(w) is a kernel over 8 rows (split across threads when large), storing row o0 at
    // 8*o0 + i0. With the row term dropped every row writes elements 0..8: still in range,
    // but threads would race on them.
    let mut bad = matmul_program();
    let Step::Kernel(k) = &mut bad.steps[1] else {
        panic!("the second step is the exp kernel")
    };
    let minductor::internals::kernel_ir::StageAction::Store(stores) = &mut k.stages[0].action
    else {
        panic!("stage 0 stores")
    };
    stores[0]
        .index
        .terms
        .retain(|(v, _)| *v != minductor::internals::kernel_ir::Var::Outer(0));
    match compile_program(&bad) {
        Err(CodegenError::Verify(e)) => match *e {
            VerifyError::Malformed { message, .. } => {
                assert!(message.contains("may store the same element"), "{message}")
            }
            other => panic!("expected a malformed-program error, got {other}"),
        },
        Err(other) => panic!("expected a malformed-program error, got {other}"),
        Ok(_) => panic!("a racy kernel compiled"),
    }
}

// ---- defect 7: branching on symbolic dims ------------------------------------------------------

// The eager backend runs graphs with any symbolic dims (inductor specializes a symbolic dim that
// is not a buffer's outermost, which would hide the defect).
fn eager() -> JitBackend {
    "eager".parse().unwrap()
}

#[test]
fn a_jit_function_branching_on_a_dim_comparison_takes_the_right_branch_on_every_call() {
    let f = jit(|x: &[Traced]| {
        let d = x[0].dims();
        if d[0] == d[1] {
            vec![&x[0] * 2.0]
        } else {
            vec![&x[0] * 3.0]
        }
    })
    .backend(eager())
    .dynamic(Some(true));
    for (shape, factor) in [
        ([3, 4], 3.0f32),
        ([5, 5], 2.0),
        ([6, 7], 3.0),
        ([7, 7], 2.0),
    ] {
        let x = ramp(&shape, 0.0);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let want: Vec<f64> = x
            .to_f64_vec()
            .iter()
            .map(|&v| (v as f32 * factor) as f64)
            .collect();
        assert_eq!(out[0].to_f64_vec(), want, "shape {shape:?}");
    }
}

#[test]
fn a_jit_function_comparing_a_dim_with_a_number_takes_the_right_branch_on_every_call() {
    for backend in [eager(), JitBackend::default()] {
        let f = jit(|x: &[Traced]| {
            let d = x[0].dims();
            if d[0] > 4 {
                vec![x[0].exp()]
            } else {
                vec![x[0].sin()]
            }
        })
        .backend(backend)
        .dynamic(Some(true));
        for rows in [3usize, 6, 2, 9] {
            let x = ramp(&[rows, 1], 0.0);
            let out = f.call(std::slice::from_ref(&x)).unwrap();
            let want: Vec<f64> = x
                .to_f64_vec()
                .iter()
                .map(|&v| {
                    if rows > 4 {
                        (v as f32).exp() as f64
                    } else {
                        (v as f32).sin() as f64
                    }
                })
                .collect();
            for (g, w) in out[0].to_f64_vec().iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "rows {rows}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn comparing_dims_that_share_a_symbol_keeps_them_symbolic() {
    // Equal dims get one symbol (duck sizing) whose guard ties them, so `==` needs no
    // specialization: one symbolic compile serves every square size.
    let f = jit(|x: &[Traced]| {
        let d = x[0].dims();
        assert!(d[0] == d[1]);
        vec![x[0].exp()]
    })
    .backend(eager())
    .dynamic(Some(true));
    for n in [3usize, 5, 8] {
        f.call(&[ramp(&[n, n], 0.0)]).unwrap();
    }
    let stats = f.stats();
    assert_eq!(
        (stats.compiles, stats.symbolic_compiles),
        (1, 1),
        "{stats:?}"
    );
}

// ---- found on the way: an in-place store before a later store that reads the input ------------

#[test]
fn an_in_place_store_never_precedes_a_later_store_reading_the_overwritten_input() {
    // The gradient of softmax(tanh(x - mean(x, 0))) fuses a kernel storing exp(t - max) in
    // place of t, then 1 - t² (the tanh derivative) from t. With block math (exp computed a
    // block at a time, stores reloading their loads) the second store read the overwritten t:
    // the gradient came out wrong. Found by the random autodiff test after the merge.
    let graph = {
        let t = Tracer::new();
        let x = t.input("x", DType::F32, &[2, 2]);
        let w = t.input("w", DType::F32, &[2, 2]);
        let v = (&x - x.mean(&[0], true)).tanh().softmax(1);
        let loss = (&v * &w).sum(&[], false);
        let mut outs = vec![loss.clone()];
        outs.extend(loss.grad(&[&x]));
        t.finish(&outs).unwrap()
    };
    let inputs = [
        Tensor::from_vec(&[2, 2], vec![0.3f32, -1.2, 0.7, 1.1]).unwrap(),
        Tensor::from_vec(&[2, 2], vec![0.5f32, -0.4, 0.9, -0.8]).unwrap(),
    ];
    let want = minductor::compile_with(&graph, minductor::Backend::Eager)
        .unwrap()
        .call(&inputs)
        .unwrap();
    let got = compile(&graph).unwrap().call(&inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, minductor_tests::Tolerance::close(1e-5), "grad");
}

/// Found by the random-graph campaign: indices computed in the graph are realized and checked
/// before the step that gathers with them; horizontal fusion merged the step computing them
/// into that step, so the check read the slot's stale bytes (here an f32 left by `cat`) and
/// reported garbage indices out of range. Merges that would do that are refused, and the
/// kernel-IR verifier rejects a step checking indices it computes.
#[test]
fn computed_indices_are_checked_after_they_are_computed() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[1]);
        let v = Traced::cat(&[&x, &-&x], 0).slice(0, None, None, 2);
        let positions = t.arange(1, DType::I64);
        vec![v.index_select(0, &(positions * -1.0 + 0.0))]
    })
    .unwrap();
    let x = Tensor::from_vec(&[1], vec![1.5f32]).unwrap();
    let got = compile(&graph)
        .unwrap()
        .call(std::slice::from_ref(&x))
        .unwrap();
    let want = interpret(&graph, &[x]).unwrap();
    minductor_tests::assert_allclose(&got, &want, minductor_tests::Tolerance::close(0.0), "");
}
