//! Symbolic dims anywhere in a shape (not only the outermost): strides and offsets become size
//! expressions (`7*s0`, `s0*s0`) that kernels and GEMMs compute from the call's sizes. Each test
//! compiles a function once with symbolic dims and compares several odd sizes of that one
//! compile with the reference interpreter on a static trace at the same sizes.

use minductor::internals::kernel_ir::Step;
use minductor::{compile, interpret, DType, Graph, RuntimeError, Tensor, Traced, Tracer};
use minductor::{Dim, SymId, TensorType};
use minductor_tests::Tolerance;

fn ramp(shape: &[usize], seed: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| ((i as f32) * 0.37 + seed).sin() * 1.5)
        .collect();
    Tensor::from_vec(shape, data).unwrap()
}

/// A dim of a test input: a number, or symbol `s0`/`s1`.
#[derive(Clone, Copy)]
enum D {
    N(usize),
    S0,
    S1,
}
use D::{N, S0, S1};

type Body = dyn Fn(&[Traced]) -> Vec<Traced>;

/// Traces `f` over f32 inputs of `shapes`; `sizes` = `Some((s0, s1))` makes the trace static.
fn build(shapes: &[&[D]], sizes: Option<(usize, usize)>, f: &Body) -> Graph {
    let tracer = Tracer::new();
    let inputs: Vec<Traced> = shapes
        .iter()
        .enumerate()
        .map(|(i, dims)| {
            let shape = dims
                .iter()
                .map(|d| match (d, sizes) {
                    (N(n), _) => Dim::Static(*n),
                    (S0, Some((a, _))) => Dim::Static(a),
                    (S1, Some((_, b))) => Dim::Static(b),
                    (S0, None) => Dim::Sym(SymId(0)),
                    (S1, None) => Dim::Sym(SymId(1)),
                })
                .collect();
            tracer.input_typed(&format!("in{i}"), TensorType::new(DType::F32, shape))
        })
        .collect();
    let outputs = f(&inputs);
    tracer.finish(&outputs).unwrap()
}

/// One symbolic compile of `f`, called at every `(s0, s1)` of `sizes` and compared with the
/// interpreter (relative and absolute tolerance 1e-4). Returns the compiled program's text.
fn check_sizes(shapes: &[&[D]], sizes: &[(usize, usize)], f: &Body) -> String {
    let compiled = compile(&build(shapes, None, f)).unwrap();
    for &(a, b) in sizes {
        let inputs: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, dims)| {
                let shape: Vec<usize> = dims
                    .iter()
                    .map(|d| match d {
                        N(n) => *n,
                        S0 => a,
                        S1 => b,
                    })
                    .collect();
                ramp(&shape, i as f32)
            })
            .collect();
        let want = interpret(&build(shapes, Some((a, b)), f), &inputs).unwrap();
        let got = compiled.call(&inputs).unwrap();
        minductor_tests::assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-4),
            &format!("s0 = {a}, s1 = {b}"),
        );
    }
    let text = compiled.artifacts().program.as_ref().unwrap().to_string();
    // The program text parses back to the same program (symbolic strides included).
    let parsed: minductor::internals::kernel_ir::Program = text.parse().unwrap();
    assert_eq!(parsed.to_string(), text);
    if std::env::var_os("SHOW_PROGRAMS").is_some() {
        println!("{text}");
    }
    text
}

/// Odd sizes, and one large enough (above 2^15 elements) that kernels split their first outer
/// loop across threads and GEMMs tile their rows.
const SIZES: &[(usize, usize)] = &[
    (2, 3),
    (5, 7),
    (13, 2),
    (31, 17),
    (3, 64),
    (129, 5),
    (1500, 41),
];

#[test]
fn pointwise_over_a_symbolic_inner_dim() {
    let text = check_sizes(&[&[N(3), S0, N(7)], &[N(3), S0, N(7)]], SIZES, &|i| {
        vec![(&i[0] * &i[1]).exp() + &i[0], (&i[0] - 0.5).tanh()]
    });
    assert!(text.contains("7*s0*o0"), "{text}");
}

#[test]
fn transpose_of_symbolic_dims() {
    // [s0, 5, s1] → [s1, s0, 5]: every stride of the load is a size expression.
    let text = check_sizes(&[&[S0, N(5), S1]], SIZES, &|i| {
        vec![i[0].permute(&[2, 0, 1]) * 2.0 + 1.0]
    });
    assert!(text.contains("5*s1"), "{text}");
}

#[test]
fn reductions_along_and_across_a_symbolic_inner_dim() {
    check_sizes(&[&[N(3), S0, N(6)]], SIZES, &|i| {
        let x = &i[0];
        vec![
            x.sum(&[1], false),
            x.softmax(1),
            x.softmax(-1),
            x.mean(&[1, 2], true),
            x.amax(&[1], false),
        ]
    });
}

#[test]
fn gemm_with_symbolic_m_n_and_k() {
    // Batched q·kᵀ [2, s0, 8] @ [2, 8, s0] → [2, s0, s0]; then a product over k = s0.
    let text = check_sizes(&[&[N(2), S0, N(8)], &[N(2), S0, N(8)]], SIZES, &|i| {
        let (q, k) = (&i[0], &i[1]);
        let scores = q.matmul(&k.transpose(1, 2));
        vec![scores.clone(), scores.softmax(-1).matmul(k)]
    });
    assert!(text.contains("s0*s0"), "{text}");
    // The softmax over the score rows [s0, s0] runs as the first GEMM's epilogue: a symbolic row
    // stride `s0*s0` is proven row-local for every size.
    assert!(text.contains("epilogue of buf2: kernel"), "{text}");
}

#[test]
fn gemm_with_a_symbolic_batch_stride_and_two_symbols() {
    // [s1, s0, 4] @ [4, 6] (broadcast weight), then [s1, 6, s0] @ [s1, s0, 4]: batch strides
    // `4*s0`, k = s0.
    check_sizes(&[&[S1, S0, N(4)], &[N(4), N(6)]], SIZES, &|i| {
        let (x, w) = (&i[0], &i[1]);
        let y = x.matmul(w);
        vec![y.clone(), y.transpose(1, 2).matmul(x).gelu()]
    });
}

#[test]
fn causal_attention_over_a_symbolic_sequence() {
    // Scores [2, 3, s0, s0] never exist: one fused attention step over views with symbolic
    // strides, the causal mask applied by position (not compared from two aranges).
    let text = check_sizes(
        &[
            &[N(2), N(3), S0, N(8)],
            &[N(2), N(3), S0, N(8)],
            &[N(2), N(3), S0, N(8)],
        ],
        SIZES,
        &|i| vec![i[0].scaled_dot_product_attention(&i[1], &i[2], None, true)],
    );
    assert!(text.contains("attention buf3 = q buf0"), "{text}");
    assert!(text.contains("strides [24*s0, 8*s0, 8, 1]"), "{text}");
    assert!(text.contains(" causal group 1"), "{text}");
}

#[test]
fn masks_and_aranges_of_symbolic_dims() {
    check_sizes(&[&[S0, S1], &[S1]], SIZES, &|i| {
        let x = &i[0];
        let t = x.tracer();
        let dims = x.dims();
        let rows = t.arange_of(dims[0].clone(), DType::F32).reshape(&[-1, 1]);
        let cols = t.arange_of(dims[1].clone(), DType::I64);
        vec![
            x.triu(0),
            x.tril(-1),
            x * &rows + &i[1],
            (&cols + &cols).cast(DType::F32) - x,
        ]
    });
}

#[test]
fn slices_counted_from_the_end_of_a_symbolic_dim() {
    // x[:, -1:], x[:, -2:-1] of [3, s0, 5]: static sizes, offsets `5*s0 - 5` and `5*s0 - 10`
    // (printed constant term first).
    let text = check_sizes(&[&[N(3), S0, N(5)]], SIZES, &|i| {
        let x = &i[0];
        vec![
            x.slice(1, Some(-1), None, 1).squeeze(1) * 2.0,
            x.slice(1, Some(-2), Some(-1), 1) + x.slice(1, Some(-1), None, 1),
            x.slice(1, Some(-2), None, 1).softmax(1),
        ]
    });
    assert!(text.contains("-5 + 5*s0"), "{text}");
}

#[test]
fn a_symbol_too_small_for_a_slice_from_its_end_is_a_typed_error() {
    // `compile` has no guards: a call binding s0 = 1 to `x[:, -2:]` is refused by the kernel-IR
    // verifier at bind time (the slice would start at element -1), before any kernel runs.
    let compiled = compile(&build(&[&[N(3), S0, N(5)]], None, &|i| {
        vec![i[0].slice(1, Some(-2), None, 1) * 2.0]
    }))
    .unwrap();
    compiled.call(&[ramp(&[3, 2, 5], 0.0)]).unwrap();
    let err = compiled.call(&[ramp(&[3, 1, 5], 0.0)]).unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidProgram(_)), "{err}");
}

#[test]
fn a_symbol_bound_to_two_sizes_is_a_typed_error() {
    // Two inputs share s0 (in a middle dim): a call that binds it to two sizes is refused
    // before any kernel runs.
    let compiled = compile(&build(
        &[&[N(2), S0, N(3)], &[N(2), S0, N(3)]],
        None,
        &|i| vec![&i[0] + &i[1]],
    ))
    .unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    assert!(program.steps.iter().all(|s| matches!(s, Step::Kernel(_))));
    let err = compiled
        .call(&[ramp(&[2, 4, 3], 0.0), ramp(&[2, 5, 3], 1.0)])
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Shape { .. }), "{err}");
}

#[test]
fn a_program_with_symbolic_strides_saves_and_loads() {
    // The artifact holds the program as text (strides `8*s0`, `s0*s0`); the loaded program
    // is verified again and gives the same results at other sizes.
    let f: &Body = &|i| {
        let (q, k) = (&i[0], &i[1]);
        vec![q.matmul(&k.transpose(1, 2)).softmax(-1).matmul(k)]
    };
    let shapes: &[&[D]] = &[&[N(2), S0, N(8)], &[N(2), S0, N(8)]];
    let compiled = compile(&build(shapes, None, f)).unwrap();
    let bytes = minductor::Artifact::of(&compiled).unwrap().to_bytes();
    let loaded = minductor::load_bytes(&bytes).unwrap();
    for n in [3, 17] {
        let inputs = [ramp(&[2, n, 8], 0.0), ramp(&[2, n, 8], 1.0)];
        let want = interpret(&build(shapes, Some((n, 1)), f), &inputs).unwrap();
        minductor_tests::assert_allclose(
            &loaded.call(&inputs).unwrap(),
            &want,
            Tolerance::close(1e-4),
            &format!("loaded, s0 = {n}"),
        );
    }
}

#[test]
fn a_wrong_symbolic_stride_is_caught_by_the_verifier_at_bind_time() {
    // A hand-edited program whose load stride is `8*s0` where the buffer's is `7*s0`: at compile
    // time the range depends on s0 and cannot be checked; the first call binds s0 and the
    // verifier refuses the program before any kernel runs (the load would pass the end).
    use minductor::internals::codegen_cpu::compile_program;
    use minductor::internals::kernel_ir::Program;
    use minductor::Executable;
    let compiled = compile(&build(&[&[N(3), S0, N(7)]], None, &|i| {
        vec![(&i[0] * 2.0).exp()]
    }))
    .unwrap();
    let text = compiled.artifacts().program.as_ref().unwrap().to_string();
    assert!(text.contains("load buf0[7*s0*o0"), "{text}");
    let bad: Program = text
        .replace("load buf0[7*s0*o0", "load buf0[8*s0*o0")
        .parse()
        .unwrap();
    let program = compile_program(&bad).unwrap();
    let err = program.run(&[ramp(&[3, 5, 7], 0.0)]).unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidProgram(_)), "{err}");
    assert!(err.to_string().contains("outside"), "{err}");
}

#[test]
fn jit_guards_tie_the_dims_a_symbolic_graph_relates() {
    // `q @ kᵀ` then a softmax over the scores: the trace relies on q and k having the same
    // length (the scores are [2, s0, s0]) and the same head size. Once the length is symbolic,
    // equal lengths hit the cache; lengths that differ fail the guard tying them (a recompile
    // for a new, still valid, graph), and head sizes that differ are a typed error.
    use minductor::{jit, DType};
    let f = jit(|x: &[Traced]| vec![x[0].matmul(&x[1].transpose(1, 2)).softmax(-1)]);
    let check = |lq: usize, lk: usize| {
        let inputs = [ramp(&[2, lq, 8], 0.0), ramp(&[2, lk, 8], 1.0)];
        let tracer = Tracer::new();
        let (q, k) = (
            tracer.input("q", DType::F32, &[2, lq, 8]),
            tracer.input("k", DType::F32, &[2, lk, 8]),
        );
        let graph = tracer
            .finish(&[q.matmul(&k.transpose(1, 2)).softmax(-1)])
            .unwrap();
        let want = interpret(&graph, &inputs).unwrap();
        let got = f.call(&inputs).unwrap();
        minductor_tests::assert_allclose(
            &got,
            &want,
            Tolerance::close(1e-4),
            &format!("lengths {lq}, {lk}"),
        );
    };
    check(7, 7);
    check(9, 9);
    assert_eq!((f.stats().compiles, f.stats().symbolic_compiles), (2, 1));
    check(23, 23);
    assert_eq!(
        f.stats().compiles,
        2,
        "equal lengths reuse the symbolic graph"
    );
    check(11, 12);
    assert_eq!(f.stats().compiles, 3, "{:?}", f.stats());
    assert!(
        f.stats().recompiles.last().unwrap().contains("dim 1"),
        "{:?}",
        f.stats()
    );
    let err = f
        .call(&[ramp(&[2, 5, 8], 0.0), ramp(&[2, 5, 9], 1.0)])
        .unwrap_err();
    assert!(err.to_string().contains("matmul"), "{err}");
}
