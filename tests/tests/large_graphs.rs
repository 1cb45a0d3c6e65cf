//! Large graphs: a GPT-style decoder of 96 layers (over 4000 traced nodes) compiles and computes
//! what the reference interpreter computes, code generation on several threads makes the same
//! machine code as on one, and scheduling a deep training step does work linear in its depth
//! (counted, not timed). How long compiles take is the compile benchmark's business
//! (`minductor compile`), not a test's.

use minductor::internals::codegen_cpu::compile_program;
use minductor::internals::passes::{fuse, fuse_counting, FuseStats};
use minductor::{compile_with, set_num_threads, Backend};
use minductor_tests::{assert_allclose, Tolerance};
use minductor_tools::workloads::{gpt_decoder, gpt_decoder_train_step};

#[test]
fn a_96_layer_decoder_compiles_and_matches_the_interpreter() {
    let decoder = gpt_decoder(96).unwrap();
    let nodes = decoder.graph.nodes().len();
    assert!(nodes > 4000, "the 96-layer decoder has {nodes} nodes");
    let compiled = compile_with(&decoder.graph, Backend::Inductor).unwrap();
    let program = compiled.artifacts().program.as_ref().unwrap();
    // Every layer keeps its kernels, GEMMs and attention: nothing was lost on the way.
    assert!(
        program.steps.len() > 96 * 7,
        "{} steps",
        program.steps.len()
    );
    let found = compiled.call(&decoder.inputs).unwrap();
    let eager = compile_with(&decoder.graph, Backend::Eager).unwrap();
    let expected = eager.call(&decoder.inputs).unwrap();
    // The logits after 96 layers (f32 throughout, summation orders differing from the
    // interpreter's), and the argmax tokens exactly.
    assert_allclose(
        &found[..1],
        &expected[..1],
        Tolerance::close(1e-3),
        "logits",
    );
    assert_allclose(&found[1..], &expected[1..], Tolerance::EXACT, "next tokens");
}

#[test]
fn a_compile_records_each_pass_with_its_time_and_sizes() {
    let decoder = gpt_decoder(2).unwrap();
    let compiled = compile_with(&decoder.graph, Backend::Inductor).unwrap();
    let artifacts = compiled.artifacts();
    let passes: Vec<&str> = artifacts.pass_times.iter().map(|p| p.pass).collect();
    let expected = [
        "decompose",
        "simplify",
        "sink_cats",
        "fuse",
        "verify_program",
        "fuse_horizontal",
        "verify_program",
        "fuse_epilogues",
        "verify_program",
        "store_once",
        "verify_program",
        "split_transposes",
        "verify_program",
        "choose_loop_order",
        "verify_program",
        "plan_buffers",
        "verify_program",
        "codegen",
    ];
    assert_eq!(passes, expected);
    let prims = artifacts.prim_graph.as_ref().unwrap();
    let program = artifacts.program.as_ref().unwrap();
    let of = |name: &str| {
        artifacts
            .pass_times
            .iter()
            .find(|p| p.pass == name)
            .unwrap()
    };
    // `sink_cats` simplifies again, which may drop nodes the first `simplify` left dead.
    assert!(of("simplify").nodes >= prims.len());
    assert_eq!(of("sink_cats").nodes, prims.len());
    assert_eq!(of("fuse").nodes, prims.len());
    let codegen = of("codegen");
    assert_eq!(codegen.steps, program.steps.len());
    assert_eq!(codegen.kernels, program.kernels().count());
    // The passes take part of the compile's time, none more than all of it.
    let total: std::time::Duration = artifacts.pass_times.iter().map(|p| p.time).sum();
    assert!(
        total <= compiled.compile_time(),
        "{total:?} > {:?}",
        compiled.compile_time()
    );
    assert!(codegen.to_string().starts_with("codegen "), "{codegen}");

    // A training step also runs autodiff and partition.
    let step = minductor_tools::workloads::gpt_decoder_train_step(1, 1e-3).unwrap();
    let compiled = compile_with(&step.graph, Backend::Inductor).unwrap();
    let passes: Vec<&str> = compiled
        .artifacts()
        .pass_times
        .iter()
        .map(|p| p.pass)
        .collect();
    assert_eq!(
        passes[..4],
        ["decompose", "autodiff", "simplify", "partition"]
    );
}

/// Restores the default thread count when dropped (also on a panic).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = set_num_threads(0);
    }
}

#[test]
fn code_generation_on_several_threads_makes_the_code_of_one_thread() {
    let _restore = Restore;
    let decoder = gpt_decoder(8).unwrap();
    let compiled = compile_with(&decoder.graph, Backend::Inductor).unwrap();
    let program = compiled.artifacts().program.clone().unwrap();
    let code = |threads: usize| -> Vec<(String, String, u64)> {
        set_num_threads(threads).unwrap();
        let compiled = compile_program(&program).unwrap();
        compiled
            .kernels()
            .map(|k| (k.name.clone(), k.clif.clone(), k.code_hash))
            .collect()
    };
    let serial = code(1);
    assert!(serial.len() > 8 * 3, "{} kernels", serial.len());
    for threads in [2, 3, 8] {
        let parallel = code(threads);
        assert_eq!(parallel.len(), serial.len());
        for (p, s) in parallel.iter().zip(&serial) {
            assert_eq!(p.0, s.0, "kernel order on {threads} threads");
            assert_eq!(p.1, s.1, "{}: CLIF on {threads} threads", s.0);
            assert_eq!(p.2, s.2, "{}: machine code on {threads} threads", s.0);
        }
    }
    // And the program computes the same bits whichever compile runs it.
    set_num_threads(3).unwrap();
    let again = compile_with(&decoder.graph, Backend::Inductor).unwrap();
    set_num_threads(0).unwrap();
    let a = compiled.call(&decoder.inputs).unwrap();
    let b = again.call(&decoder.inputs).unwrap();
    assert_allclose(&a, &b, Tolerance::EXACT, "compiled on 3 threads");
}

/// The prim graph of the decoder's SGD step at `layers` layers (after autodiff and partition,
/// what `fuse` schedules), its `fuse` work and its program's step count.
fn fused_train_step(layers: usize) -> (usize, usize, FuseStats) {
    let step = gpt_decoder_train_step(layers, 1e-3).unwrap();
    let compiled = compile_with(&step.graph, Backend::AotEager).unwrap();
    let prims = compiled.artifacts().prim_graph.clone().unwrap();
    let (program, stats) = fuse_counting(&prims).unwrap();
    assert_eq!(program, fuse(&prims).unwrap(), "fuse_counting is fuse");
    (prims.len(), program.steps.len(), stats)
}

/// Scheduling a training step builds each kernel a bounded number of times, however deep the
/// model. The optimizer updates at the end of the graph each realize a gradient deep inside the
/// backward (a bias's column sum, a layer norm's parameter gradient); a scheduler that rebuilt
/// every step after such a node built the whole backward again per parameter, so its builds grew
/// with the square of the depth (measured: 3,213 builds at 4 layers, 38,493 at 16, for 1,106 and
/// 4,022 prim nodes). Builds, not time, are compared, so the test cannot fail on a slow machine.
#[test]
fn scheduling_a_deep_training_step_builds_each_kernel_a_bounded_number_of_times() {
    let (shallow_nodes, shallow_steps, shallow) = fused_train_step(4);
    let (deep_nodes, deep_steps, deep) = fused_train_step(16);
    assert!(
        deep_nodes > 3 * shallow_nodes,
        "{deep_nodes} vs {shallow_nodes} nodes"
    );
    // Each realized node's steps are built once, and again only when a retry changes what
    // their build read: at both depths, fewer builds than 1.5 per step of the program...
    for (builds, steps) in [(shallow.builds, shallow_steps), (deep.builds, deep_steps)] {
        assert!(
            2 * builds < 3 * steps,
            "{builds} builds for {steps} steps (4 and 16 layers: {shallow:?}, {deep:?})"
        );
    }
    // ...and per graph node, as many at 16 layers as at 4 (within 10%): linear in the depth.
    let per_node = |s: FuseStats, nodes: usize| s.builds as f64 / nodes as f64;
    let (shallow_rate, deep_rate) = (per_node(shallow, shallow_nodes), per_node(deep, deep_nodes));
    assert!(
        deep_rate <= 1.1 * shallow_rate,
        "builds per node: {shallow_rate:.3} at 4 layers, {deep_rate:.3} at 16 ({shallow:?}, {deep:?})"
    );
    // Retries (each a realized gradient or fallback) grow with the graph, not faster.
    assert!(
        deep.retries * shallow_nodes <= 11 * deep_nodes * shallow.retries / 10,
        "retries: {} at 4 layers, {} at 16",
        shallow.retries,
        deep.retries
    );
}
