//! The nesting of a kernel's outer loops (`choose_loop_order`, `passes/src/loop_order.rs`): a
//! kernel loading a transposed view and storing contiguously (rotary embeddings on a projection
//! `[b, t, h·d]` read as `[b, h, t, d]`) runs its outer loops in the load's address order; a
//! copy transposing the other way keeps its order; a kernel split over its first loop only
//! keeps that loop first. Every case compares with the interpreter, and across thread counts
//! bit for bit.

use minductor::internals::kernel_ir::{Program, Step};
use minductor::{compile, interpret, DType, Dim, Graph, SymId, Tensor, TensorType, Traced, Tracer};
use minductor_tests::{wide_sine_values, Tolerance};

/// The outer extents of each kernel step of `program` (static sizes).
fn outer_loops(program: &Program) -> Vec<Vec<usize>> {
    (program.steps.iter())
        .filter_map(|s| match s {
            Step::Kernel(k) => Some(k.outer.iter().map(|d| d.as_static().unwrap()).collect()),
            _ => None,
        })
        .collect()
}

/// Compiles `graph`, returns the outer extents of its kernels, and checks the results against
/// the interpreter and across thread counts.
fn compiled_loops(graph: &Graph, inputs: &[Tensor]) -> Vec<Vec<usize>> {
    let compiled = compile(graph).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let got = minductor_tests::assert_same_bits_on_threads(&compiled, inputs, &[2, 3], "threads");
    let want = interpret(graph, inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-6), &program.to_string());
    outer_loops(&program)
}

/// `x` `[b, t, h·d]` seen as `[b, h, t, d]`, times `cos` `[t, d]` plus `tanh(x)` times `sin`:
/// the rotary kernel's accesses.
#[test]
fn a_kernel_loading_a_transposed_view_nests_its_loops_in_the_loads_order() {
    for (b, t, h, d) in [(2, 64, 8, 32), (1, 40, 3, 48), (3, 16, 4, 64)] {
        let (graph, inputs) = minductor_tests::build_graph(
            &[&[b, t, h * d], &[t, d], &[t, d]],
            wide_sine_values,
            |i| {
                let q = (i[0].reshape(&[b as isize, t as isize, h as isize, d as isize]))
                    .permute(&[0, 2, 1, 3]);
                vec![&q * &i[1] + &q.tanh() * &i[2]]
            },
        );
        let loops = compiled_loops(&graph, &inputs);
        assert_eq!(loops, vec![vec![b, t, h]], "{b}x{t}x{h}x{d}");
    }
}

/// Attention's output `[b, h, t, d]` copied to `[b, t, h, d]` (then read as `[b, t, h·d]`):
/// the store is one stream and the load `h` streams, and the copy keeps that order (nested
/// `b, h, t`, its store would be `t` streams 1 KiB apart).
#[test]
fn a_copy_storing_a_transposed_view_keeps_the_stores_order() {
    let (b, t, h, d) = (2, 64, 8, 32);
    let (graph, inputs) = minductor_tests::build_graph(&[&[b, h, t, d]], wide_sine_values, |i| {
        let o = i[0]
            .permute(&[0, 2, 1, 3])
            .reshape(&[b as isize, t as isize, (h * d) as isize]);
        vec![o.tanh()]
    });
    // The copy (then `tanh` over `[b, t]` rows of `h·d`).
    let loops = compiled_loops(&graph, &inputs);
    assert_eq!(loops[0], vec![b, t, h], "{graph}");
}

/// The rotary kernel's graph with sequence length `seq`: `x` `[b, seq, h·d]` seen as `[b, h,
/// seq, d]`, times `cos` plus `tanh(x)` times `sin`.
fn rotary(b: usize, seq: Dim, h: usize, d: usize) -> Graph {
    let tracer = Tracer::new();
    let typed = |shape: Vec<Dim>| TensorType::new(DType::F32, shape.into_iter().collect());
    let x = tracer.input_typed("x", typed(vec![Dim::Static(b), seq, Dim::Static(h * d)]));
    let cos = tracer.input_typed("cos", typed(vec![seq, Dim::Static(d)]));
    let sin = tracer.input_typed("sin", typed(vec![seq, Dim::Static(d)]));
    let q = x
        .reshape(&[b as isize, -1, h as isize, d as isize])
        .permute(&[0, 2, 1, 3]);
    tracer.finish(&[&q * &cos + &q.tanh() * &sin]).unwrap()
}

/// The rotary kernel with a symbolic sequence length (one compile for every length): the
/// nesting is chosen with the length counted as `SIZE_HINT`, and every length computes the
/// interpreter's values on a static graph of that length.
#[test]
fn a_symbolic_sequence_length_gets_the_same_nesting() {
    let (b, h, d) = (2, 8, 32);
    let seq = Dim::Sym(SymId(0));
    let compiled = compile(&rotary(b, seq, h, d)).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let outer: Vec<&Vec<Dim>> = (program.steps.iter())
        .filter_map(|s| match s {
            Step::Kernel(k) => Some(&k.outer),
            _ => None,
        })
        .collect();
    assert_eq!(
        outer,
        [&vec![Dim::Static(b), seq, Dim::Static(h)]],
        "{program}"
    );
    for t in [1, 5, 64, 130] {
        let inputs = [
            wide_sine_values(&[b, t, h * d], 0),
            wide_sine_values(&[t, d], 1),
            wide_sine_values(&[t, d], 2),
        ];
        let got = compiled.call(&inputs).unwrap();
        let want = interpret(&rotary(b, Dim::Static(t), h, d), &inputs).unwrap();
        minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-6), &format!("t={t}"));
    }
}

/// Rotary embeddings on `x` `[t, h·d]` seen as `[h, t, d]`, `x · cat(cos, cos) + cat(−x2, x1) ·
/// cat(sin, sin)` (`rotate_half`): after `sink_cats`, one kernel storing both halves of each row, over outer
/// loops `[h, t]`. With a static `t` its stores are proved apart and it splits over both
/// loops, so it takes the nesting `[t, h]` (the load in order); with a symbolic `t` it splits
/// over its first loop only, which stays first.
fn rotate_half(seq: Dim, h: usize, d: usize) -> Graph {
    let tracer = Tracer::new();
    let typed = |shape: Vec<Dim>| TensorType::new(DType::F32, shape.into_iter().collect());
    let x = tracer.input_typed("x", typed(vec![seq, Dim::Static(h * d)]));
    let cos = tracer.input_typed("cos", typed(vec![seq, Dim::Static(d / 2)]));
    let sin = tracer.input_typed("sin", typed(vec![seq, Dim::Static(d / 2)]));
    let q = x.reshape(&[-1, h as isize, d as isize]).permute(&[1, 0, 2]);
    let half = (d / 2) as isize;
    let (q1, q2) = (
        q.slice(-1, None, Some(half), 1),
        q.slice(-1, Some(half), None, 1),
    );
    let rotated = Traced::cat(&[&-q2, &q1], -1);
    let (cos, sin) = (
        Traced::cat(&[&cos, &cos], -1),
        Traced::cat(&[&sin, &sin], -1),
    );
    tracer.finish(&[&q * &cos + rotated * &sin]).unwrap()
}

#[test]
fn a_kernel_split_over_its_first_loop_only_keeps_that_loop_first() {
    let (h, d, t) = (8, 64, 48);
    let kernels = |graph: &Graph| -> (Vec<Vec<Dim>>, usize) {
        let compiled = compile(graph).unwrap();
        let program = compiled.artifacts().program.clone().unwrap();
        let (outer, split): (Vec<Vec<Dim>>, Vec<usize>) = (program.steps.iter())
            .filter_map(|s| match s {
                Step::Kernel(k) if k.outer.len() == 2 => Some((k.outer.clone(), k.split_loops())),
                _ => None,
            })
            .unzip();
        assert_eq!(outer.len(), 1, "one rotary kernel\n{program}");
        (outer, split[0])
    };
    let (outer, split) = kernels(&rotate_half(Dim::Static(t), h, d));
    assert_eq!(
        (outer[0].clone(), split),
        (vec![Dim::Static(t), Dim::Static(h)], 2)
    );
    let seq = Dim::Sym(SymId(0));
    let symbolic = rotate_half(seq, h, d);
    let (outer, split) = kernels(&symbolic);
    assert_eq!((outer[0].clone(), split), (vec![Dim::Static(h), seq], 1));
    let compiled = compile(&symbolic).unwrap();
    for t in [1, 7, 48] {
        let inputs = [
            wide_sine_values(&[t, h * d], 0),
            wide_sine_values(&[t, d / 2], 1),
            wide_sine_values(&[t, d / 2], 2),
        ];
        let got = minductor_tests::assert_same_bits_on_threads(&compiled, &inputs, &[2, 3], "t");
        let want = interpret(&rotate_half(Dim::Static(t), h, d), &inputs).unwrap();
        minductor_tests::assert_allclose(&got, &want, Tolerance::close(1e-6), &format!("t={t}"));
    }
}

/// Found by the random graphs (`SwappedSoftmax` then `CatStepped(1)` on `[12, 13, 11]`): a
/// kernel storing both pieces of a `cat` into one buffer, split over its first loop only,
/// whose stores the verifier proves apart per row of that first loop. A nesting that put
/// another loop first (even one with more iterations) broke that proof, and the compile
/// failed in the verifier. Such a kernel keeps its first loop first.
#[test]
fn a_cat_kernel_split_over_its_first_loop_compiles_and_matches() {
    let (graph, inputs) = minductor_tests::build_graph(&[&[12, 13, 11]], wide_sine_values, |i| {
        let v = i[0].transpose(0, 1).softmax(-1).transpose(0, 1);
        vec![Traced::cat(&[&v, &(&v * 0.5)], 1).slice(1, None, None, 2)]
    });
    let loops = compiled_loops(&graph, &inputs);
    assert!(!loops.is_empty(), "{graph}");
}
