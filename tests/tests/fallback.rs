//! Fallback steps: a node no kernel computes (integer reductions and scans, an arg-reduction
//! over a dim longer than 2^24) runs as a `Step::Fallback` — the reference interpreter on the
//! step's buffers — inside the compiled program, with compiled kernels before and after it.
//! Results are compared with the interpreter; `explain`, the dump, the program text and saved
//! artifacts show and keep the fallback; the verifier rejects malformed fallback steps.

use minductor::internals::ir::{Dim, Op, ReduceOp, SymId, TensorType};
use minductor::internals::kernel_ir::verify_program;
use minductor::internals::kernel_ir::{BufferId, Program, Step};
use minductor::{compile, interpret, jit, load_bytes, Artifact, DType, Graph, Tensor, Tracer};
use minductor_tests::ramp_scaled;
use minductor_tests::{assert_allclose, Tolerance};

fn integers(shape: &[usize], seed: i64) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n as i64).map(|i| (i * 7 + seed) % 23 - 11).collect();
    Tensor::from_vec(shape, data).unwrap()
}

/// Compiles `graph`, checks it against the interpreter (floats within 1e-5, integers exactly:
/// every integer output here is small) and returns the program.
fn check(graph: &Graph, inputs: &[Tensor], what: &str) -> Program {
    let compiled = compile(graph).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = compiled
        .call(inputs)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = interpret(graph, inputs).unwrap();
    assert_allclose(&got, &want, Tolerance::close(1e-5), what);
    compiled.artifacts().program.clone().unwrap()
}

/// The op names of the fallback steps, and whether a kernel runs before the first and after the
/// last of them.
fn fallback_ops(program: &Program) -> (Vec<String>, bool, bool) {
    let positions: Vec<usize> = program
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Step::Fallback(_)))
        .map(|(i, _)| i)
        .collect();
    let ops = program.fallbacks().map(|f| f.op.name()).collect();
    let kernel_at = |i: usize| matches!(program.steps[i], Step::Kernel(_) | Step::Matmul(_));
    let before = positions.first().is_some_and(|&p| (0..p).any(kernel_at));
    let after = positions
        .last()
        .is_some_and(|&p| (p + 1..program.steps.len()).any(kernel_at));
    (ops, before, after)
}

/// `x·3` truncated to i64, its row sum (a fallback), and compiled float work on both sides.
fn integer_sum_graph(op: ReduceOp, keepdim: bool) -> Graph {
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[8, 33]);
    let as_int = (&x * 3.0).cast(DType::I64);
    let reduced = match op {
        ReduceOp::Sum => as_int.sum(&[1], keepdim),
        ReduceOp::Max => as_int.amax(&[1], keepdim),
        ReduceOp::Min => as_int.amin(&[1], keepdim),
    };
    let back = reduced.cast(DType::F32) * 0.5 + x.sum(&[1], keepdim).exp().tanh();
    t.finish(&[back, reduced]).unwrap()
}

#[test]
fn integer_reductions_run_as_fallbacks_between_compiled_kernels() {
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        for keepdim in [false, true] {
            let what = format!("{op:?} keepdim={keepdim}");
            let graph = integer_sum_graph(op, keepdim);
            let program = check(&graph, &[ramp_scaled(&[8, 33], 0.3, 5.0)], &what);
            let (ops, before, after) = fallback_ops(&program);
            let name = format!("reduce_{}", format!("{op:?}").to_lowercase());
            assert_eq!(ops, vec![name], "{what}: {program}");
            assert!(before && after, "{what}: kernels on both sides\n{program}");
        }
    }
}

#[test]
fn integer_reductions_over_every_axis_and_of_integer_inputs() {
    let t = Tracer::new();
    let i = t.input("i", DType::I64, &[5, 7, 3]);
    let all = i.sum(&[], false);
    let middle = i.amax(&[1], true);
    let ends = (&i * 2.0).amin(&[0, 2], false);
    let graph = t.finish(&[all, middle, ends]).unwrap();
    let program = check(&graph, &[integers(&[5, 7, 3], 4)], "i64 input");
    assert_eq!(program.fallbacks().count(), 3, "{program}");
    // A reduction straight from an input reads the caller's buffer: no copy kernel.
    let first = program.fallbacks().next().unwrap();
    assert!(
        matches!(
            program.buffer(first.inputs[0]).kind,
            minductor::internals::kernel_ir::BufferKind::Input(0)
        ),
        "{program}"
    );
}

/// An i64 cumsum (a mask's running count: position ids) compiles to an i64 scan kernel, no
/// fallback, equal to the interpreter along every dim, wrapping on overflow as PyTorch does.
#[test]
fn integer_cumsum_compiles_as_an_i64_scan() {
    for dim in [0isize, 1, -1] {
        let t = Tracer::new();
        let x = t.input("x", DType::F32, &[6, 9]);
        let counts = x.gt(0.0).cast(DType::I64);
        let running = counts.cumsum(dim);
        let scaled = running.cast(DType::F32) * &x;
        let graph = t.finish(&[scaled.softmax(-1), running]).unwrap();
        let what = format!("cumsum dim {dim}");
        let program = check(&graph, &[ramp_scaled(&[6, 9], 1.1, 5.0)], &what);
        let (ops, _, _) = fallback_ops(&program);
        assert!(ops.is_empty(), "{what}: {ops:?}\n{program}");
    }
    // Hand-computed: running sums of i64 rows, the second past i64::MAX (wrapping).
    let t = Tracer::new();
    let i = t.input("i", DType::I64, &[2, 4]);
    let graph = t.finish(&[i.cumsum(1)]).unwrap();
    let compiled = compile(&graph).unwrap();
    assert!(
        compiled.fallbacks().is_empty(),
        "{:?}",
        compiled.fallbacks()
    );
    let values = vec![3i64, -1, 5, 10, i64::MAX, 1, 1, -3];
    let out = compiled
        .call(&[Tensor::from_vec(&[2, 4], values).unwrap()])
        .unwrap();
    assert_eq!(
        out[0].to_vec::<i64>().unwrap(),
        vec![3, 2, 7, 17, i64::MAX, i64::MIN, i64::MIN + 1, i64::MAX - 1]
    );
}

#[test]
fn bool_cumsum_is_a_trace_error_naming_the_op() {
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[3]);
    let err = t.finish(&[x.gt(0.0).cumsum(0)]).unwrap_err().to_string();
    assert!(err.contains("cumsum") && err.contains("bool"), "{err}");
}

#[test]
fn argmax_over_a_dim_longer_than_2_pow_24_falls_back_for_its_i64_minimum() {
    let n = (1usize << 24) + 5;
    let t = Tracer::new();
    let x = t.input("x", DType::F32, &[n]);
    let graph = t.finish(&[x.argmax(0, false), x.argmin(0, true)]).unwrap();
    let mut data: Vec<f32> = (0..n).map(|i| ((i % 1000) as f32) * 0.001).collect();
    // The maximum sits beyond 2^24, where f32 positions would round; two minima, the first wins.
    data[n - 1] = 7.0;
    data[(1 << 24) + 1] = -3.0;
    data[(1 << 24) + 3] = -3.0;
    let x = Tensor::from_vec(&[n], data).unwrap();
    let compiled = compile(&graph).unwrap();
    let got = compiled.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(got[0].to_vec::<i64>().unwrap(), vec![n as i64 - 1]);
    assert_eq!(got[1].to_vec::<i64>().unwrap(), vec![(1 << 24) + 1]);
    let want = interpret(&graph, &[x]).unwrap();
    assert_allclose(&got, &want, Tolerance::EXACT, "argmax 2^24 + 5");
    let program = compiled.artifacts().program.as_ref().unwrap();
    let ops: Vec<String> = program.fallbacks().map(|f| f.op.name()).collect();
    assert_eq!(ops, vec!["reduce_min", "reduce_min"], "{program}");
}

/// A graph whose batch dim is symbolic, with an integer reduction inside (a fallback step) and
/// an i64 scan over the symbolic dim (compiled).
fn symbolic_graph() -> Graph {
    let t = Tracer::new();
    let x = t.input_typed(
        "x",
        TensorType::new(
            DType::F32,
            [Dim::Sym(SymId(0)), Dim::Static(12)].into_iter().collect(),
        ),
    );
    let counts = x.gt(0.5).cast(DType::I64).sum(&[1], true);
    let y = counts.cast(DType::F32) + x.softmax(-1);
    t.finish(&[y, counts.cumsum(0)]).unwrap()
}

#[test]
fn fallbacks_bind_symbolic_sizes_at_each_call() {
    let graph = symbolic_graph();
    let compiled = compile(&graph).unwrap();
    assert_eq!(compiled.fallbacks().len(), 1, "{:?}", compiled.fallbacks());
    let mut reference = minductor::reference_executable(&graph);
    for batch in [3, 17, 1] {
        let x = ramp_scaled(&[batch, 12], batch as f32, 5.0);
        let got = compiled.call(std::slice::from_ref(&x)).unwrap();
        let want = reference(&[x]).unwrap();
        assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-5),
            &format!("batch {batch}"),
        );
    }
}

#[test]
fn program_text_and_artifacts_keep_fallback_steps() {
    let graph = symbolic_graph();
    let compiled = compile(&graph).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap();
    let text = program.to_string();
    assert!(
        text.contains("fallback buf") && text.contains("because reductions over i64 values"),
        "{text}"
    );
    let parsed: Program = text.parse().unwrap();
    assert_eq!(&parsed, program);
    assert_eq!(parsed.to_string(), text);

    let bytes = Artifact::of(&compiled).unwrap().to_bytes();
    let loaded = load_bytes(&bytes).unwrap();
    assert_eq!(loaded.fallbacks(), compiled.fallbacks());
    for batch in [2, 9] {
        let x = ramp_scaled(&[batch, 12], 0.7, 5.0);
        let got = loaded.call(std::slice::from_ref(&x)).unwrap();
        let want = compiled.call(&[x]).unwrap();
        assert_allclose(&got, &want, Tolerance::EXACT, "loaded artifact");
    }
}

#[test]
fn explain_and_the_dump_list_each_fallback_with_op_and_reason() {
    let f = jit(|x: &[minductor::Traced]| {
        let counts = x[0].gt(0.0).cast(minductor::DType::I64);
        vec![counts.sum(&[1], false), x[0].relu()]
    })
    .input_names(&["x"]);
    let inputs = [ramp_scaled(&[4, 10], 0.2, 5.0)];
    let report = f.explain(&inputs).unwrap();
    assert_eq!(report.graphs.len(), 1);
    assert_eq!(report.graphs[0].fallbacks.len(), 1, "{report}");
    let text = report.to_string();
    assert!(
        text.contains("Fallbacks (1, run by the reference interpreter)")
            && text.contains("reduce_sum[axes=[1], keepdim=false] because reductions over i64"),
        "{text}"
    );
    let out = f.call(&inputs).unwrap();
    assert_eq!(
        out[0].to_vec::<i64>().unwrap(),
        interpret(&report.graphs[0].graph, &inputs).unwrap()[0]
            .to_vec::<i64>()
            .unwrap()
    );

    let graph = integer_sum_graph(ReduceOp::Max, false);
    let compiled = compile(&graph).unwrap();
    let dir = std::env::temp_dir().join(format!("minductor-fallback-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    minductor::dump::dump_compiled(&dir, &compiled);
    let kernels = std::fs::read_to_string(dir.join("kernels.txt")).unwrap();
    assert!(
        kernels.contains("fallback")
            && kernels.contains("fallbacks (run by the reference interpreter):")
            && kernels.contains("reduce_max[axes=[1], keepdim=false] because reductions over i64"),
        "{kernels}"
    );
    let program = std::fs::read_to_string(dir.join("3_program.txt")).unwrap();
    assert!(program.contains("fallback buf"), "{program}");
    let dot = std::fs::read_to_string(dir.join("graph.dot")).unwrap();
    assert!(dot.contains("fallback_reduce_max"), "{dot}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_verifier_checks_fallback_steps() {
    let graph = integer_sum_graph(ReduceOp::Sum, false);
    let compiled = compile(&graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let position = program
        .steps
        .iter()
        .position(|s| matches!(s, Step::Fallback(_)))
        .unwrap();
    let edit = |change: &dyn Fn(&mut minductor::internals::kernel_ir::FallbackStep)| {
        let mut p = program.clone();
        let Step::Fallback(fb) = &mut p.steps[position] else {
            unreachable!()
        };
        change(fb);
        verify_program(&p, &[])
            .expect_err("a malformed fallback step")
            .to_string()
    };
    let e = edit(&|fb| {
        fb.op = Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keepdim: false,
        }
    });
    assert!(e.contains("the op gives"), "{e}");
    let e = edit(&|fb| fb.inputs.push(BufferId(0)));
    assert!(e.contains("does not apply to its operands"), "{e}");
    let e = edit(&|fb| fb.inputs = vec![fb.out]);
    assert!(e.contains("reads its own output"), "{e}");
    let e = edit(&|fb| fb.out = BufferId(0));
    assert!(e.contains("writes input"), "{e}");
    let e = edit(&|fb| fb.inputs = vec![BufferId(999)]);
    assert!(e.contains("does not exist"), "{e}");
    // Reading a buffer a later step writes.
    let mut p = program.clone();
    let fallback = p.steps.remove(position);
    p.steps.insert(0, fallback);
    p.plan = None;
    let e = verify_program(&p, &[]).unwrap_err().to_string();
    assert!(e.contains("before any step writes it"), "{e}");
}

#[test]
fn f64_values_run_as_fallbacks_and_f32_work_around_them_stays_compiled() {
    let t = Tracer::new();
    let x = t.input("x", DType::F64, &[6, 10]);
    let w = t.input("w", DType::F32, &[8, 10]);
    // f64 work (constants and an arange included), a cast into f32, compiled f32 work, and an
    // f32 value cast back to f64 as an output.
    let ramp64 = t.arange(10, DType::F64) * 0.5;
    let y = ((&x * 1.5 + &ramp64).softmax(-1) + 1e-3).log();
    let z = y.cast(DType::F32).linear(&w, None).gelu().softmax(-1);
    let back = z.sum(&[1], false).cast(DType::F64) + x.amax(&[1], false);
    let graph = t.finish(&[y, z, back]).unwrap();
    let x = Tensor::from_vec(
        &[6, 10],
        (0..60)
            .map(|i| ((i as f64) * 0.731).sin() * 4.0)
            .collect::<Vec<f64>>(),
    )
    .unwrap();
    let inputs = [x, ramp_scaled(&[8, 10], 0.9, 5.0)];
    let program = check(&graph, &inputs, "f64 graph");
    assert!(program.fallbacks().count() >= 5, "{program}");
    assert!(
        program
            .fallbacks()
            .all(|f| f.reason.contains("f64 values are not compiled")),
        "{program}"
    );
    assert!(
        program
            .steps
            .iter()
            .any(|s| matches!(s, Step::Matmul(_) | Step::Kernel(_))),
        "the f32 part is compiled\n{program}"
    );
    let ops: Vec<String> = program.fallbacks().map(|f| f.op.name()).collect();
    assert!(
        ops.iter().any(|o| o == "constant") && ops.iter().any(|o| o == "iota"),
        "{ops:?}"
    );
    // The f64 outputs are the interpreter's to the bit: it computed them.
    let got = compile(&graph).unwrap().call(&inputs).unwrap();
    let want = interpret(&graph, &inputs).unwrap();
    assert_allclose(&got[..1], &want[..1], Tolerance::EXACT, "f64 output");
    // The program (constants and an f64 arange as fallback steps) prints and parses back.
    let parsed: Program = program.to_string().parse().unwrap();
    assert_eq!(parsed, program);
}

#[test]
fn a_jit_function_with_a_fallback_compiles_a_symbolic_batch() {
    let f = jit(|x: &[minductor::Traced]| {
        let counts = x[0].gt(0.0).cast(DType::I64).sum(&[1], true);
        vec![counts.cast(DType::F32) + x[0].softmax(-1), counts.cumsum(0)]
    })
    .input_names(&["x"]);
    // Automatic dynamic shapes: static at 5, symbolic batch at 9 (a recompile), a hit at 2.
    for batch in [5, 9, 2] {
        let x = ramp_scaled(&[batch, 12], batch as f32, 5.0);
        let got = f.call(std::slice::from_ref(&x)).unwrap();
        let static_graph = {
            let t = Tracer::new();
            let xt = t.input("x", DType::F32, &[batch, 12]);
            let counts = xt.gt(0.0).cast(DType::I64).sum(&[1], true);
            t.finish(&[counts.cast(DType::F32) + xt.softmax(-1), counts.cumsum(0)])
                .unwrap()
        };
        let want = interpret(&static_graph, &[x]).unwrap();
        assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-5),
            &format!("batch {batch}"),
        );
    }
    let stats = f.stats();
    assert_eq!(
        (stats.compiles, stats.symbolic_compiles, stats.cache_hits),
        (2, 1, 1),
        "{stats:?}"
    );
    assert!(stats.dynamic_fallbacks.is_empty(), "{stats:?}");
}
