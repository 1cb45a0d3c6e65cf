//! The implicit-GEMM convolution (`im2col` packed straight into the GEMM's panels) against the
//! reference interpreter at sizes chosen to reach every edge of the packing and blocking: odd
//! heights and widths, output rows shorter than a 16-lane vector (a vector spanning several
//! output rows), panels crossing output rows, channels that are no multiple of the register
//! tile (6 rows) or of 16, more output channels than one block of micro-panels, `C·KH·KW` above
//! the depth block (128), stride 2, dilation, groups, padding 0 and padding wider than the
//! kernel's reach, on one image and on several (split across threads). Where the CPU has
//! AVX-512 (AVX2), 3x3 convolutions of stride 1 with 4 (12) or more channels over images that
//! are not too small run as Winograd F(2x2, 3x3) instead (`gemm::prefers_winograd`, and
//! `gemm::winograd_transform_pays_off` for a weight transformed at every call); the Winograd
//! test below picks such shapes, and asserts that they are picked.

use minductor::internals::ir::Window2d;
use minductor::internals::kernel_ir::{MatmulOperand, Step};
use minductor::internals::kernels::gemm::{
    prefers_winograd, winograd_transform_pays_off, ConvAlgorithm, Kernel,
};
use minductor::{compile, compile_frozen, interpret, ConvOptions, Graph, Tensor, Traced};
use minductor_tests::unit_sine_values;

fn build(shapes: &[&[usize]], f: impl FnOnce(&[Traced]) -> Vec<Traced>) -> (Graph, Vec<Tensor>) {
    minductor_tests::build_graph(shapes, unit_sine_values, f)
}

/// Compiles `graph`, checks that every GEMM reads an implicit im2col (no im2col buffer is
/// written) and compares every output with the interpreter's within `tol` (relative to
/// max(1, |want|)).
fn check_implicit(graph: &Graph, inputs: &[Tensor], tol: f64, what: &str) {
    let want = interpret(graph, inputs).unwrap();
    let compiled = compile(graph).unwrap_or_else(|e| panic!("{what}: {e}"));
    let program = compiled.artifacts().program.as_ref().unwrap();
    for step in &program.steps {
        match step {
            Step::Matmul(m) => assert!(
                matches!(m.b, MatmulOperand::Im2col(_)),
                "{what}: the GEMM reads a materialized operand:\n{program}"
            ),
            Step::Kernel(k) => assert!(
                !k.name.contains("copy"),
                "{what}: a copy kernel runs besides the GEMM:\n{program}"
            ),
            Step::ScatterAdd(_) => panic!("{what}: unexpected scatter-add"),
            Step::Attention(_) => panic!("{what}: unexpected attention"),
            Step::Fallback(fb) => panic!("{what}: unexpected fallback {fb}"),
        }
    }
    let got = compiled
        .call(inputs)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.shape(), w.shape(), "{what}");
        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!(
                (a - b).abs() <= tol * b.abs().max(1.0),
                "{what}: element {i}: compiled {a} vs reference {b}"
            );
        }
    }
}

/// Images, channels, out channels, kernel (h, w), stride, padding, dilation, groups, (h, w).
type Case = (
    usize,
    usize,
    usize,
    (usize, usize),
    usize,
    usize,
    usize,
    usize,
    (usize, usize),
);

#[test]
fn implicit_conv2d_matches_the_interpreter_at_odd_sizes() {
    let cases: [Case; 14] = [
        (1, 3, 5, (3, 3), 1, 1, 1, 1, (7, 9)),
        (2, 7, 13, (3, 3), 1, 1, 1, 1, (11, 5)), // rows of 5: a vector spans 4 rows
        (3, 17, 70, (3, 3), 1, 1, 1, 1, (13, 19)), // 70 rows: 12 micro-panels; K = 153 > 128
        (2, 20, 9, (3, 3), 2, 1, 1, 1, (15, 17)), // stride 2
        (2, 6, 8, (3, 3), 1, 2, 2, 1, (9, 10)),  // dilation 2
        (2, 8, 12, (3, 3), 1, 1, 1, 4, (9, 9)),  // groups
        (2, 5, 7, (3, 3), 1, 0, 1, 1, (8, 71)),  // padding 0, rows longer than a panel
        (1, 4, 6, (2, 4), 1, 3, 1, 1, (3, 5)),   // padding wider than the kernel's reach
        (2, 3, 4, (5, 5), 1, 2, 1, 1, (4, 4)),   // kernel larger than the input
        (2, 9, 11, (1, 3), 1, 1, 1, 1, (1, 37)), // conv1d-like
        (2, 5, 7, (1, 1), 2, 0, 1, 1, (13, 13)), // 1x1, strided
        (2, 4, 4, (3, 3), 2, 1, 2, 2, (10, 11)), // stride, dilation and groups at once
        (4, 64, 64, (3, 3), 1, 1, 1, 1, (12, 12)), // the ResNet block's channels
        (2, 10, 6, (3, 3), 3, 1, 1, 1, (16, 20)), // stride 3
    ];
    for (n, c, o, (kh, kw), s, p, d, g, (h, w)) in cases {
        let options = ConvOptions::default()
            .stride(s)
            .padding(p)
            .dilation(d)
            .groups(g);
        let what =
            format!("conv2d n={n} c={c} o={o} k={kh}x{kw} s={s} p={p} d={d} g={g} size={h}x{w}");
        let (graph, inputs) = build(&[&[n, c, h, w], &[o, c / g, kh, kw], &[o]], |i| {
            vec![
                i[0].conv2d(&i[1], Some(&i[2]), options).relu(),
                i[0].conv2d(&i[1], None, options),
            ]
        });
        check_implicit(&graph, &inputs, 1e-4, &what);
    }
}

#[test]
fn a_resnet_block_is_two_implicit_gemms_with_their_epilogues() {
    let conv = ConvOptions::default().padding(1);
    let (graph, inputs) = build(
        &[
            &[3, 16, 9, 11],
            &[16, 16, 3, 3],
            &[16],
            &[16, 16, 3, 3],
            &[16],
        ],
        |i| {
            let y = i[0].conv2d(&i[1], Some(&i[2]), conv).relu();
            vec![(y.conv2d(&i[3], Some(&i[4]), conv) + &i[0]).relu()]
        },
    );
    check_implicit(&graph, &inputs, 1e-4, "resnet block");
    let compiled = compile(&graph).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap();
    assert_eq!(program.steps.len(), 2, "{program}");
    assert!(
        program
            .steps
            .iter()
            .all(|s| matches!(s, Step::Matmul(m) if m.epilogue.is_some())),
        "{program}"
    );
}

/// Winograd F(2x2, 3x3) convolutions (3x3, stride 1, dilation 1; asserted to be the path taken
/// when this CPU has AVX-512 or AVX2 and `MINDUCTOR_CONV_ALGO` is unset or `auto`) against the
/// interpreter at odd image sizes (partial tiles on the bottom and right), padding 0, 1 and 2,
/// groups, and several images; bitwise the same on 1, 2 and 3 threads (the images are split
/// across threads, each computed alone); and with the weight frozen (transformed once, at
/// compile time), bitwise the same as transformed at every call.
#[test]
fn winograd_conv2d_matches_the_interpreter_on_any_thread_count_and_frozen() {
    // Images, channels, out channels, padding, groups, (h, w).
    // Large enough for the transform of the weight at every call to pay for itself on one
    // image per thread (`winograd_transform_pays_off`).
    let cases = [
        (3, 16, 17, 1, 1, (29, 31)),
        (2, 32, 16, 0, 1, (25, 30)),
        (2, 64, 64, 2, 2, (21, 19)),
        (1, 64, 64, 1, 1, (30, 29)),
        (5, 12, 64, 1, 1, (33, 35)),
    ];
    let kernel = Kernel::detect();
    let winograd_expected = matches!(kernel, Kernel::Avx512 | Kernel::Avx2)
        && ConvAlgorithm::from_env() == ConvAlgorithm::Auto;
    for (n, c, o, p, g, (h, w)) in cases {
        let what = format!("winograd conv2d n={n} c={c} o={o} p={p} g={g} size={h}x{w}");
        let window = Window2d {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [p, p],
            dilation: [1, 1],
        };
        if winograd_expected {
            let out = window.output_size(h, w).unwrap();
            assert!(
                prefers_winograd(ConvAlgorithm::Auto, kernel, &window, c / g, [h, w])
                    && winograd_transform_pays_off(1, c / g, o / g, out),
                "{what}: not a Winograd shape"
            );
        }
        let options = ConvOptions::default().padding(p).groups(g);
        let (graph, inputs) = build(&[&[n, c, h, w], &[o, c / g, 3, 3], &[o]], |i| {
            vec![i[0].conv2d(&i[1], Some(&i[2]), options).relu()]
        });
        check_implicit(&graph, &inputs, 1e-4, &what);
        let compiled = compile(&graph).unwrap();
        let once = compiled.call(&inputs).unwrap()[0].to_vec::<f32>().unwrap();
        for threads in [1, 2, 3] {
            minductor::set_num_threads(threads).unwrap();
            let again = compiled.call(&inputs);
            minductor::set_num_threads(0).unwrap();
            let again = again.unwrap()[0].to_vec::<f32>().unwrap();
            assert!(
                again
                    .iter()
                    .zip(&once)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: {threads} threads give other bits"
            );
        }
        let frozen = compile_frozen(&graph, &[("in1", inputs[1].clone())]).unwrap();
        assert_eq!(frozen.prepacked_operands(), 1, "{what}");
        let got = frozen
            .call(&[inputs[0].clone(), inputs[2].clone()])
            .unwrap()[0]
            .to_vec::<f32>()
            .unwrap();
        assert!(
            got.iter()
                .zip(&once)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: the frozen weight gives other bits"
        );
    }
}

/// Regression: under `auto`, whether a weight transformed at every call pays for itself was
/// judged over the images *each thread* runs, so one graph took Winograd on 1 thread and the
/// implicit GEMM on 2 (two images, 32 channels, 16x16 outputs), and its results differed in
/// the last bits between thread counts. The choice now depends on the shape alone.
#[test]
fn the_convolution_algorithm_does_not_depend_on_the_thread_count() {
    let options = ConvOptions::default().padding(1);
    let (graph, inputs) = build(&[&[2, 32, 16, 16], &[32, 32, 3, 3], &[32]], |i| {
        vec![i[0].conv2d(&i[1], Some(&i[2]), options)]
    });
    let compiled = compile(&graph).unwrap();
    minductor_tests::assert_same_bits_on_threads(
        &compiled,
        &inputs,
        &[1, 2, 3],
        "conv2d of 2 images, 32 channels, 16x16",
    );
}
