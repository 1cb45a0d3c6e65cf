//! Whether a call runs as a team (`CompiledProgram::runs_as_team`): its own test binary, since
//! it sets the process-wide thread count and asserts what depends on it.

use minductor::Executable;

/// A call runs as a team only when splitting its steps saves more than waking the team costs:
/// never at one thread, not for a small program at two (it runs on the caller, its pieces in
/// order), and for a large pointwise kernel at two; the small program's results are the same
/// bits either way.
#[test]
fn only_calls_that_gain_from_it_run_as_a_team() {
    use minductor::internals::codegen_cpu::compile_program;
    let program_of = |n: usize| {
        let (graph, inputs) = minductor_tests::build_graph(
            &[&[n], &[n]],
            |shape, seed| minductor_tests::sine_values(shape, seed, 2.0),
            |i| vec![i[0].mul(&i[1]).add(&i[0]).gelu()],
        );
        let program = minductor_tests::fused_and_planned(&graph);
        (compile_program(&program).unwrap(), inputs)
    };
    let (small, small_inputs) = program_of(40_000);
    let (large, large_inputs) = program_of(1 << 20);
    minductor::set_num_threads(1).unwrap();
    let serial = small.run(&small_inputs).unwrap();
    let verdicts = [
        small.runs_as_team(&small_inputs),
        large.runs_as_team(&large_inputs),
    ];
    minductor::set_num_threads(2).unwrap();
    let two = [
        small.runs_as_team(&small_inputs),
        large.runs_as_team(&large_inputs),
    ];
    let again = small.run(&small_inputs).unwrap();
    minductor::set_num_threads(0).unwrap();
    assert_eq!(verdicts, [false, false], "one thread");
    assert_eq!(two, [false, true], "two threads");
    let bits = |t: &[minductor::Tensor]| t[0].to_vec::<f32>().unwrap();
    assert_eq!(bits(&serial), bits(&again));
}

/// A decoder's attention step, one query row per head against 512 keys, is 2 MiB of multiply-
/// adds on an output of only 2048 elements: it runs as a team at two threads (it ran on the
/// caller alone when a program's splitting was judged by its attention's output size).
#[test]
fn an_attention_of_one_query_row_against_many_keys_runs_as_a_team() {
    use minductor::internals::codegen_cpu::compile_program;
    let (graph, inputs) = minductor_tests::build_graph(
        &[&[4, 8, 1, 64], &[4, 8, 512, 64], &[4, 8, 512, 64]],
        |shape, seed| minductor_tests::sine_values(shape, seed, 1.0),
        |i| {
            let scores = (i[0].matmul(&i[1].transpose(2, 3)) * 0.125).softmax(-1);
            vec![scores.matmul(&i[2])]
        },
    );
    let program = minductor_tests::compiled_program(&graph);
    assert!(
        program
            .steps
            .iter()
            .any(|s| matches!(s, minductor::internals::kernel_ir::Step::Attention(_))),
        "the scores, softmax and product fuse into one attention step"
    );
    let compiled = compile_program(&program).unwrap();
    minductor::set_num_threads(2).unwrap();
    let team = compiled.runs_as_team(&inputs);
    minductor::set_num_threads(0).unwrap();
    assert!(team);
}
