//! `sink_cats` (`passes/src/sink_cats.rs`): pointwise ops move onto the pieces of the `cat`s
//! they read. Each case compares the interpreter on the graph before and after the pass (the
//! same operations on the same values: the same bits), counts the `cat`s left and their sizes,
//! and compares the compiled graph with the interpreter.

use minductor::internals::ir::Op;
use minductor::internals::passes::{decompose, simplify, sink_cats};
use minductor::{compile, interpret, Graph, Tensor, Traced};
use minductor_tests::Tolerance;

fn build(shapes: &[&[usize]], f: impl FnOnce(&[Traced]) -> Vec<Traced>) -> (Graph, Vec<Tensor>) {
    minductor_tests::build_graph(
        shapes,
        |shape, seed| minductor_tests::sine_values(shape, seed, 2.0),
        f,
    )
}

/// The element count of every `cat` of `graph`, in order.
fn cat_sizes(graph: &Graph) -> Vec<usize> {
    (graph.nodes().iter())
        .filter(|n| matches!(n.op, Op::Cat { .. }))
        .map(|n| n.ty.numel().expect("static shapes"))
        .collect()
}

/// The prim graph of `graph` before and after `sink_cats`, checked to compute the same bits,
/// and the compiled graph checked against the interpreter.
fn sunk(graph: &Graph, inputs: &[Tensor], what: &str) -> (Graph, Graph) {
    let prims = simplify(&decompose(graph));
    let after = sink_cats(&prims);
    after
        .verify()
        .unwrap_or_else(|e| panic!("{what}: {e}\n{after}"));
    let want = interpret(&prims, inputs).unwrap();
    let got = interpret(&after, inputs).unwrap();
    minductor_tests::assert_allclose(&got, &want, Tolerance::EXACT, what);
    let compiled = compile(graph).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = compiled.call(inputs).unwrap();
    let reference = interpret(graph, inputs).unwrap();
    minductor_tests::assert_allclose(&got, &reference, Tolerance::close(1e-5), what);
    (prims, after)
}

/// Rotary embeddings over `x: [2, 3, t, d]` with `cos` and `sin` tables of `[t, d / 2]`:
/// `x * cat(cos, cos) + cat(-x2, x1) * cat(sin, sin)`.
fn rotary(t: usize, d: usize) -> (Graph, Vec<Tensor>) {
    let half = d / 2;
    build(&[&[2, 3, t, d], &[t, half], &[t, half]], |i| {
        let (x, cos, sin) = (&i[0], &i[1], &i[2]);
        let x1 = x.slice(-1, None, Some(half as isize), 1);
        let x2 = x.slice(-1, Some(half as isize), None, 1);
        let cos = Traced::cat(&[cos, cos], -1);
        let sin = Traced::cat(&[sin, sin], -1);
        vec![x * &cos + Traced::cat(&[&-x2, &x1], -1) * &sin]
    })
}

/// Rotary embeddings, `x * cat(cos, cos) + cat(-x2, x1) * cat(sin, sin)`: after the pass the
/// only `cat` left is the result's, and the rotated copy is gone.
#[test]
fn rotary_embeddings_keep_one_cat() {
    for (t, d) in [(5, 8), (3, 2), (4, 64)] {
        let (g, inputs) = rotary(t, d);
        let what = format!("rotary embeddings over {t}x{d}");
        let (before, after) = sunk(&g, &inputs, &what);
        assert_eq!(cat_sizes(&before).len(), 3, "{what}\n{before}");
        assert_eq!(cat_sizes(&after), vec![2 * 3 * t * d], "{what}\n{after}");
        let output = after.node(after.outputs()[0]);
        assert!(matches!(output.op, Op::Cat { .. }), "{what}\n{after}");
    }
}

/// A `cat` a GEMM also reads stays; its pointwise reader does not move.
#[test]
fn a_cat_another_op_needs_stays() {
    let (g, inputs) = build(&[&[4, 3], &[4, 5], &[8, 6]], |i| {
        let c = Traced::cat(&[&i[0], &i[1]], -1);
        vec![c.matmul(&i[2]), c.tanh()]
    });
    let (before, after) = sunk(&g, &inputs, "a cat read by a GEMM");
    assert_eq!(cat_sizes(&after), cat_sizes(&before), "{after}");
}

/// A small `cat` broadcast into a larger product that a reduction reads stays: moving it would
/// make a `cat` of the product's size.
#[test]
fn a_broadcast_cat_before_a_reduction_stays() {
    let (g, inputs) = build(&[&[6, 7, 10], &[4], &[6]], |i| {
        let c = Traced::cat(&[&i[1], &i[2]], -1);
        vec![(&i[0] * &c).sum(&[-1], false)]
    });
    let (before, after) = sunk(&g, &inputs, "a broadcast cat before a sum");
    assert_eq!(cat_sizes(&after), cat_sizes(&before), "{after}");
    assert_eq!(cat_sizes(&after), vec![10], "{after}");
}

/// Two reductions over pointwise functions of one `cat`: moving it would make two `cat`s of its
/// size where there was one.
#[test]
fn a_cat_two_chains_read_stays() {
    let (g, inputs) = build(&[&[6, 3], &[6, 4]], |i| {
        let c = Traced::cat(&[&i[0], &i[1]], -1);
        vec![c.tanh().sum(&[-1], false), c.exp().sum(&[-1], false)]
    });
    let (before, after) = sunk(&g, &inputs, "a cat two reductions read");
    assert_eq!(cat_sizes(&after), cat_sizes(&before), "{after}");
}

/// Pointwise chains over `cat`s of the same pieces run on the pieces (one `cat` left, the
/// result's); `cat`s split differently are read as they are.
#[test]
fn chains_run_on_pieces_of_the_same_split_only() {
    let (g, inputs) = build(&[&[5, 3], &[5, 4], &[5, 2]], |i| {
        let a = Traced::cat(&[&i[0], &i[1]], -1);
        let b = Traced::cat(&[&(&i[0] * 0.5), &i[1].exp()], -1);
        vec![(&a * 2.0 + &b).tanh()]
    });
    let (_, after) = sunk(&g, &inputs, "a chain over cats of one split");
    assert_eq!(cat_sizes(&after), vec![35], "{after}");

    let (g, inputs) = build(&[&[5, 3], &[5, 4], &[5, 2], &[5, 5]], |i| {
        let a = Traced::cat(&[&i[0], &i[1]], -1);
        let b = Traced::cat(&[&i[2], &i[3]], -1);
        vec![(&a + &b).sigmoid()]
    });
    let (before, after) = sunk(&g, &inputs, "cats of two splits");
    assert_eq!(cat_sizes(&after), cat_sizes(&before), "{after}");
}

/// The rotary kernel stores its two halves into one buffer: split over every outer loop, since
/// each iteration's halves fill a window of their own (`Kernel::stores_apart`); halves moved to
/// overlap windows of other iterations split over the first loop only.
#[test]
fn the_halves_of_a_rotary_kernel_split_over_every_loop() {
    use minductor::internals::ir::SizeExpr;
    use minductor::internals::kernel_ir::StageAction;
    let d = 16;
    let (g, _) = rotary(6, d);
    let half = d / 2;
    let program = compile(&g).unwrap().artifacts().program.clone().unwrap();
    let mut kernel = (program.kernels())
        .find(|k| k.stores().len() == 1 && k.stages[0].action.stores().len() == 2)
        .unwrap_or_else(|| panic!("a kernel stores both halves\n{program}"))
        .clone();
    let out = kernel.stores()[0];
    assert!(kernel.stores_apart(out), "{program}");
    assert_eq!(kernel.split_loops(), kernel.outer.len(), "{program}");
    // The second half written a quarter further on: into the next iteration's window.
    let StageAction::Store(stores) = &mut kernel.stages[0].action else {
        panic!("the halves are a store stage")
    };
    stores[1].index.offset = stores[1]
        .index
        .offset
        .plus(&SizeExpr::Const(half as i64 / 2 + half as i64));
    assert!(!kernel.stores_apart(out));
    assert_eq!(kernel.split_loops(), 1);
}
