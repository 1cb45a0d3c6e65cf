//! The IR texts parse back: for every golden case (both manifests), the captured graph and the
//! kernel program print → parse → print to the same text and parse to the same structure, and
//! the parsed program compiles and computes the same outputs, bit for bit, as the one the
//! compiler made. Then passes as text in, text out.

use minductor::internals::codegen_cpu::compile_program;
use minductor::internals::kernel_ir::{BufferKind, Program};
use minductor::internals::passes::{fuse, fuse_horizontal, plan_buffers, simplify};
use minductor::Executable;
use minductor::{compile, Graph, Tensor};
use minductor_tests::{compare_outputs, Tolerance};
use minductor_tools::golden::{
    build_case, default_golden_dir, default_golden_models_dir, load_manifest, load_tensors,
};

/// `text` → parse → print, which must give `text` again; returns the parsed value.
fn round_trip<T>(text: &str, what: &str) -> T
where
    T: std::str::FromStr + std::fmt::Display,
    T::Err: std::fmt::Display,
{
    let parsed: T = text
        .parse()
        .unwrap_or_else(|e| panic!("{what} does not parse: {e}\n{text}"));
    let again = parsed.to_string();
    assert_eq!(again, text, "{what}: print → parse → print differs");
    parsed
}

/// Runs `program` compiled afresh on `inputs`, adding ones for a joint graph's tangent inputs
/// (program inputs past the graph's), as `Compiled` does.
fn run_program(program: &Program, inputs: &[Tensor]) -> Vec<Tensor> {
    let compiled = compile_program(program).expect("the parsed program compiles");
    let mut all = inputs.to_vec();
    let mut extra: Vec<_> = program
        .buffers
        .iter()
        .filter_map(|b| match b.kind {
            BufferKind::Input(n) if n >= inputs.len() => Some((n, b.dtype)),
            _ => None,
        })
        .collect();
    extra.sort_by_key(|e| e.0);
    for (n, dtype) in extra {
        assert_eq!(n, all.len(), "tangent inputs follow the graph's inputs");
        all.push(Tensor::from_f64(dtype, &[], &[1.0]).unwrap());
    }
    compiled.run(&all).expect("the parsed program runs")
}

#[test]
fn every_golden_graph_and_program_round_trips_and_runs_the_same() {
    let mut checked = 0;
    for dir in [default_golden_dir(), default_golden_models_dir()] {
        let cases = load_manifest(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for case in &cases {
            // Optimizer-step cases are built by `TrainStep` rather than `build_case`.
            let Some((order, graph)) = build_case(&case.name, &case.inputs) else {
                continue;
            };
            let graph = graph.unwrap();
            let parsed: Graph = round_trip(&graph.to_string(), &case.name);
            if !graph.to_string().contains("NaN") {
                assert_eq!(parsed, graph, "{}: the parsed graph differs", case.name);
            }
            let compiled = compile(&parsed).unwrap();
            let program = compiled.artifacts().program.clone().unwrap();
            let parsed_program: Program = round_trip(&program.to_string(), &case.name);
            assert_eq!(
                parsed_program, program,
                "{}: parsed program differs",
                case.name
            );
            if let Some(prims) = &compiled.artifacts().prim_graph {
                round_trip::<Graph>(&prims.to_string(), &case.name);
            }

            let tensors = load_tensors(&case.file).unwrap();
            let inputs: Vec<Tensor> = order.iter().map(|n| tensors[n].clone()).collect();
            let want = compiled.call(&inputs).unwrap();
            let got = run_program(&parsed_program, &inputs);
            compare_outputs(&got, &want, Tolerance::EXACT, &case.name).unwrap();
            checked += 1;
        }
    }
    println!("{checked} golden cases round-trip");
    assert!(checked > 40, "only {checked} golden cases were built");
}

#[test]
fn malformed_texts_are_errors_naming_the_line() {
    let good =
        "graph(x: f32[4]) {\n  %0 = input[x] : f32[4]\n  %1 = exp %0 : f32[4]\n  return %1\n}";
    good.parse::<Graph>().unwrap();
    for (bad, line) in [
        ("", 1),
        (
            "graph(x: f32[4]) {\n  %0 = input[x] : f32[4]\n  %1 = exp %0 : f32[5]\n  return %1\n}",
            3,
        ),
        (
            "graph(x: f32[4]) {\n  %0 = input[x] : f32[4]\n  %1 = exp %7 : f32[4]\n  return %1\n}",
            3,
        ),
        (
            "graph(x: f32[4]) {\n  %0 = input[x] : f32[4]\n  %2 = exp %0 : f32[4]\n  return %2\n}",
            3,
        ),
        (
            "graph(x: f32[4]) {\n  %0 = input[x] : f32[4]\n  %1 = frobnicate %0 : f32[4]\n",
            3,
        ),
        (
            "graph(x: f32[4]) {\n  %0 = input[x] : f32[4]\n  return %0\n",
            4,
        ),
    ] {
        let err = bad.parse::<Graph>().unwrap_err();
        assert_eq!(err.line, line, "{bad:?}: {err}");
    }
    let err = "buffers:\n  buf0: f32[4] Input(0) (node %0)\nkernel k outer=[4] fuses %1\n  e0: F32 = load buf3[o0]\noutputs: buf0\n"
        .parse::<Program>()
        .unwrap_err();
    assert_eq!(err.line, 4, "{err}");
    assert!(err.to_string().contains("declared buffers"), "{err}");
}

/// A graph pass as text in, text out: `simplify` folds `x * 1` and `x + 0` away, merges the two
/// equal `exp`s (CSE) and drops the dead `sin`. The constants that only the folded nodes used
/// stay: `simplify` decides what is dead before it rewrites (a second run drops them).
#[test]
fn simplify_text_in_text_out() {
    let input = "graph(x: f32[2, 3]) {
  %0 = input[x] : f32[2, 3]
  %1 = constant[1.0] : f32[]
  %2 = mul %0, %1 : f32[2, 3]
  %3 = constant[0.0] : f32[]
  %4 = add %2, %3 : f32[2, 3]
  %5 = exp %4 : f32[2, 3]
  %6 = exp %0 : f32[2, 3]
  %7 = sub %5, %6 : f32[2, 3]
  %8 = sin %0 : f32[2, 3]
  return %7
}";
    let graph: Graph = input.parse().unwrap();
    let once = "graph(x: f32[2, 3]) {
  %0 = input[x] : f32[2, 3]
  %1 = constant[1.0] : f32[]
  %2 = constant[0.0] : f32[]
  %3 = exp %0 : f32[2, 3]
  %4 = sub %3, %3 : f32[2, 3]
  return %4
}";
    assert_eq!(simplify(&graph).to_string(), once);
    let twice = "graph(x: f32[2, 3]) {
  %0 = input[x] : f32[2, 3]
  %1 = exp %0 : f32[2, 3]
  %2 = sub %1, %1 : f32[2, 3]
  return %2
}";
    assert_eq!(simplify(&once.parse().unwrap()).to_string(), twice);
}

/// A kernel-IR pass as text in, text out: `fuse_horizontal` merges the two sibling kernels that
/// read `buf0` over the same outer loop into one (one pass over the rows), and `plan_buffers`
/// then plans the program (nothing to place: no intermediates).
#[test]
fn fuse_horizontal_and_plan_buffers_text_in_text_out() {
    let input = "buffers:
  buf0: f32[8, 16] Input(0) (node %0)
  buf1: f32[8] Output (node %1)
  buf2: f32[8] Output (node %2)
kernel k0_reduce_sum outer=[8] fuses %1
  e0: F32 = load buf0[16*o0 + i0]
  e1: F32 = stage0
  stage0 over [16]: reduce_sum e0
  stage1 over []: store buf1[o0] = e1
kernel k1_reduce_max outer=[8] fuses %2
  e0: F32 = load buf0[16*o0 + i0]
  e1: F32 = stage0
  stage0 over [16]: reduce_max e0
  stage1 over []: store buf2[o0] = e1
outputs: buf1, buf2
";
    let expected = "buffers:
  buf0: f32[8, 16] Input(0) (node %0)
  buf1: f32[8] Output (node %1)
  buf2: f32[8] Output (node %2)
kernel k0_reduce_sum_reduce_max outer=[8] fuses %1 %2
  e0: F32 = load buf0[16*o0 + i0]
  e1: F32 = stage0
  e2: F32 = stage2
  stage0 over [16]: reduce_sum e0
  stage1 over []: store buf1[o0] = e1
  stage2 over [16]: reduce_max e0
  stage3 over []: store buf2[o0] = e2
outputs: buf1, buf2
arena 0 bytes in 0 slots (unshared 0 bytes, live peak 0 bytes)
";
    let program: Program = input.parse().unwrap();
    let mut merged = fuse_horizontal(&program);
    merged.plan = Some(plan_buffers(&merged));
    assert_eq!(merged.to_string(), expected);
    // And the input is what `fuse` makes of the graph it came from.
    let graph: Graph = "graph(x: f32[8, 16]) {
  %0 = input[x] : f32[8, 16]
  %1 = reduce_sum[axes=[1], keepdim=false] %0 : f32[8]
  %2 = reduce_max[axes=[1], keepdim=false] %0 : f32[8]
  return %1, %2
}"
    .parse()
    .unwrap();
    assert_eq!(fuse(&graph).unwrap().to_string(), input);
}

/// Derived dims print as their definitions (`s0 + 1` of a cat, `2*s0 + 2` of a flatten, `s0 - 1`
/// of `x[:, 1:]`) and parse back to the same symbols: the graph text, and the kernel program
/// `fuse` makes of it, round trip, and the parsed program computes what the compiled one does.
#[test]
fn a_graph_with_derived_dims_round_trips() {
    let text = "graph(x: f32[2, s0, 8], row: f32[2, 1, 8]) {
  %0 = input[x] : f32[2, s0, 8]
  %1 = input[row] : f32[2, 1, 8]
  %2 = cat[dim=1] %0, %1 : f32[2, s0 + 1, 8]
  %3 = exp %2 : f32[2, s0 + 1, 8]
  %4 = reshape[[2*s0 + 2, 8]] %3 : f32[2*s0 + 2, 8]
  %5 = slice[dim=1, 1:end-0:1] %0 : f32[2, s0 - 1, 8]
  %6 = cat[dim=1] %5, %1, %1 : f32[2, s0 + 1, 8]
  %7 = add %2, %6 : f32[2, s0 + 1, 8]
  return %4, %7
}";
    let graph: Graph = round_trip(text, "graph with derived dims");
    graph.verify().unwrap();
    let program = minductor_tests::fused_and_planned(&graph);
    let parsed: Program = round_trip(&program.to_string(), "program with derived dims");
    assert_eq!(parsed, program);
    let compiled = compile(&graph).unwrap();
    for length in [2, 5, 40] {
        let inputs = [
            minductor_tests::sine_values(&[2, length, 8], 1, 1.0),
            minductor_tests::sine_values(&[2, 1, 8], 2, 1.0),
        ];
        let want = compiled.call(&inputs).unwrap();
        assert_eq!(want[0].shape(), &[2 * length + 2, 8]);
        assert_eq!(want[1].shape(), &[2, length + 1, 8]);
        let context = format!("length {length}");
        compare_outputs(
            &run_program(&parsed, &inputs),
            &want,
            Tolerance::close(0.0),
            &context,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// `fuse` on a graph that was not decomposed (reachable through `internals`) runs its composite
/// ops as fallback steps instead of panicking, and the program computes what the pipeline's does.
#[test]
fn fuse_runs_composites_it_meets_as_fallback_steps() {
    let (graph, inputs) = minductor_tests::build_graph(
        &[&[4, 33], &[33]],
        |shape, seed| minductor_tests::sine_values(shape, seed, 2.0),
        |i| {
            vec![i[0]
                .softmax(-1)
                .add(&i[1])
                .layer_norm(&[33], Some(&i[1]), None, 1e-5)]
        },
    );
    let mut program = fuse(&graph).unwrap();
    program.plan = Some(plan_buffers(&program));
    assert!(
        program.to_string().contains("fallback"),
        "composites run as fallback steps:\n{program}"
    );
    let want = compile(&graph).unwrap().call(&inputs).unwrap();
    compare_outputs(
        &run_program(&program, &inputs),
        &want,
        Tolerance::close(1e-6),
        "softmax and layer norm as fallback steps",
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A gather from a table whose rows are symbolic prints its bound and its index check as size
/// expressions (`clamp(e1, 0, s0)`, `in 0..2*s0`), which parse back to the same program, and the
/// parsed program computes what the compiled one does.
#[test]
fn a_gather_from_a_symbolic_table_round_trips() {
    let text = "graph(table: f32[s0, 4], ids: i64[s1]) {
  %0 = input[table] : f32[s0, 4]
  %1 = input[ids] : i64[s1]
  %2 = gather %0, %1 : f32[s1, 4]
  %3 = reshape[[4*s0]] %0 : f32[4*s0]
  %4 = gather %3, %1 : f32[s1]
  return %2, %4
}";
    let graph: Graph = round_trip(text, "graph gathering from symbolic tables");
    graph.verify().unwrap();
    let program = minductor_tests::fused_and_planned(&graph);
    let printed = program.to_string();
    assert!(
        printed.contains("clamp(") && printed.contains("index check"),
        "{printed}"
    );
    let parsed: Program = round_trip(&printed, "program gathering from symbolic tables");
    assert_eq!(parsed, program);
    let compiled = compile(&graph).unwrap();
    assert!(
        compiled.fallbacks().is_empty(),
        "{:?}",
        compiled.fallbacks()
    );
    for rows in [3, 7] {
        let inputs = [
            minductor_tests::sine_values(&[rows, 4], 1, 1.0),
            Tensor::from_vec(&[5], vec![0i64, rows as i64 - 1, 1, 2, 0]).unwrap(),
        ];
        let want = compiled.call(&inputs).unwrap();
        let table = inputs[0].to_vec::<f32>().unwrap();
        let first: Vec<f32> = [0, rows - 1, 1, 2, 0]
            .iter()
            .flat_map(|&r| table[r * 4..r * 4 + 4].to_vec())
            .collect();
        assert_eq!(want[0].to_vec::<f32>().unwrap(), first, "{rows} rows");
        let flat: Vec<f32> = [0, rows - 1, 1, 2, 0].iter().map(|&i| table[i]).collect();
        assert_eq!(want[1].to_vec::<f32>().unwrap(), flat, "{rows} rows");
        compare_outputs(
            &run_program(&parsed, &inputs),
            &want,
            Tolerance::close(0.0),
            &format!("{rows} rows"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}
