//! The benchmark suite (`minductor_tools::workloads`) and its harness (`minductor_tools::bench`): every
//! workload builds, compiles, and agrees with eager at reduced sizes; the cost figures follow
//! from the graphs' types.

use minductor::{compile_with, Backend};
use minductor_tools::bench::{compare, run_workload, BenchOptions};
use minductor_tools::probe::{FmaPeak, MachineProbe};
use minductor_tools::workloads::{
    attention, by_name, layer_norm, llama_block, mlp_workload, pointwise_gelu_sweep, resnet_block,
    softmax_sweep, Bound, Workload, SUITE,
};
use std::time::Duration;

/// Every output's bytes plus every input's bytes, from the graph's own types.
fn bytes_from_types(workload: &Workload) -> u64 {
    let graph = &workload.graph;
    let elements = |id| {
        let sizes = graph.node(id).ty.static_sizes().expect("static shapes");
        sizes.iter().product::<usize>() as u64
    };
    let inputs: u64 = graph.inputs().iter().map(|&id| elements(id)).sum();
    let outputs: u64 = graph.outputs().iter().map(|&id| elements(id)).sum();
    4 * (inputs + outputs)
}

fn small_workloads() -> Vec<Workload> {
    let mut all = pointwise_gelu_sweep(&[1, 3, 4, 1000, 4099]).unwrap();
    all.extend(softmax_sweep(&[1, 3, 17], 33).unwrap());
    all.push(layer_norm(5, 37).unwrap());
    all.push(mlp_workload(4, 16, 64).unwrap());
    all.push(attention(2, 8, 16, 4, 32).unwrap());
    all.push(resnet_block(2, 4, 7).unwrap());
    all.push(llama_block(2, 9, 32, 4, 2, 40).unwrap());
    all
}

#[test]
fn each_workload_compiles_and_agrees_with_eager_at_small_sizes() {
    for workload in small_workloads() {
        let eager = compile_with(&workload.graph, Backend::Eager).unwrap();
        let compiled = compile_with(&workload.graph, Backend::Inductor)
            .unwrap_or_else(|e| panic!("{}: {e}", workload.name));
        let expected = eager.call(&workload.inputs).unwrap();
        let found = compiled.call(&workload.inputs).unwrap();
        let error = compare(&workload.name, &expected, &found).unwrap_or_else(|e| panic!("{e}"));
        assert!(error < 1e-4, "{}: max abs error {error}", workload.name);
        assert_eq!(
            workload.bytes_moved,
            bytes_from_types(&workload),
            "{}",
            workload.name
        );
    }
}

/// A probe with round figures (the harness's arithmetic is checked against them).
fn test_probe() -> MachineProbe {
    MachineProbe {
        machine: "test".into(),
        threads: 1,
        copy_bytes: 1 << 20,
        copy_gb_per_s: 10.0,
        gemm_size: 64,
        gemm_gflops: 50.0,
        gemm_gflops_all_threads: 50.0,
        fma_peaks: vec![FmaPeak {
            bits: 512,
            gflops: 60.0,
            gflops_all_threads: 60.0,
        }],
        measured_at_unix_s: 0,
        contention: None,
    }
}

#[test]
fn harness_times_both_backends_and_reports_consistent_figures() {
    let probe = test_probe();
    let options = BenchOptions {
        budget: Duration::ZERO,
        min_iterations: 2,
    };
    for workload in small_workloads() {
        let result = run_workload(&workload, &probe, None, options).unwrap();
        assert_eq!(result.eager.iterations, 2);
        assert!(result.eager.median_ms > 0.0 && result.compiled.median_ms > 0.0);
        let ratio = result.eager.median_ms / result.compiled.median_ms;
        assert!((result.speedup - ratio).abs() <= 1e-9 * ratio);
        let seconds = result.compiled.median_ms / 1e3;
        let (work, peak) = match workload.bound {
            Bound::Memory => (workload.bytes_moved as f64, probe.copy_gb_per_s),
            Bound::Compute => (workload.flops as f64, 60.0),
        };
        let achieved = work / seconds / 1e9;
        assert!((result.compiled.achieved - achieved).abs() <= 1e-9 * achieved);
        assert!((result.compiled.fraction_of_peak - achieved / peak).abs() <= 1e-9);
        assert!(!result.kernels.is_empty(), "{}", workload.name);
        assert_eq!(result.compiled.peak_bytes, None);
    }
}

/// `minductor bench --mode`: the compiled backend is compiled in the mode asked for (checked
/// against eager, as every bench run is), and max-autotune's choices are kept.
#[test]
fn the_harness_compiles_in_the_mode_asked_for() {
    use minductor::Mode;
    use minductor_tools::bench::PreparedWorkload;
    let options = BenchOptions {
        budget: Duration::ZERO,
        min_iterations: 1,
    };
    for workload in small_workloads() {
        for mode in [Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune] {
            let mut prepared = PreparedWorkload::new(&workload, mode).unwrap();
            prepared.time_round(options).unwrap();
            let result = prepared.finish(&test_probe(), None).unwrap();
            assert!(
                result.compiled.median_ms > 0.0,
                "{} in {mode}",
                workload.name
            );
        }
    }
}

#[test]
fn suite_names_build_with_the_stated_sizes_and_costs() {
    for name in SUITE {
        let workload = by_name(name).unwrap();
        assert_eq!(workload.name, name);
        assert_eq!(workload.bytes_moved, bytes_from_types(&workload), "{name}");
        let inputs: Vec<_> = workload.graph.inputs().to_vec();
        assert_eq!(inputs.len(), workload.inputs.len(), "{name}");
        for (&id, tensor) in inputs.iter().zip(&workload.inputs) {
            assert_eq!(workload.graph.node(id).ty, tensor.tensor_type(), "{name}");
        }
    }
    assert_eq!(by_name("pointwise_gelu_16m").unwrap().elements, 1 << 24);
    assert_eq!(by_name("pointwise_gelu_16m").unwrap().bytes_moved, 16 << 24);
    assert_eq!(
        by_name("mlp_256x1024x4096").unwrap().flops,
        2 * 2 * 256 * 1024 * 4096
    );
    let attention = by_name("attention_8x256x512").unwrap();
    let (tokens, w, m) = (8 * 256u64, 512u64, 2048u64);
    let expected = 2 * tokens * 3 * w * w // qkv
        + 2 * 2 * 8 * 8 * 256 * 256 * 64 // q·kᵀ and p·v over 8 batches × 8 heads
        + 2 * tokens * w * w // output projection
        + 2 * 2 * tokens * w * m; // MLP
    assert_eq!(attention.flops, expected);
    assert_eq!(attention.bound, Bound::Compute);
    // Two 3x3 convolutions of 64 → 64 channels over 8 images of 56x56: 3.7 GFLOP.
    let resnet = by_name("resnet_block_8x64x56").unwrap();
    assert_eq!(resnet.flops, 2 * 2 * 8 * 64 * 56 * 56 * 64 * 9);
    let llama = by_name("llama_block_4x256x512").unwrap();
    let (tokens, w, kv, m) = (4 * 256u64, 512u64, 256u64, 1408u64);
    let expected = 2 * tokens * w * w + 2 * 2 * tokens * kv * w // q, k, v
        + 2 * 2 * 4 * 8 * 256 * 256 * 64 // q·kᵀ and p·v over 4 batches × 8 heads
        + 2 * tokens * w * w // output projection
        + 3 * 2 * tokens * w * m; // SwiGLU MLP
    assert_eq!(llama.flops, expected);
}

#[test]
fn unknown_workload_names_are_a_typed_error() {
    let error = by_name("pointwise_gelu_2m").unwrap_err().to_string();
    assert!(
        error.contains("pointwise_gelu_2m") && error.contains("softmax_4096x1024"),
        "{error}"
    );
}

#[test]
fn inputs_are_deterministic_and_in_range() {
    let a = by_name("layernorm_4096x1024").unwrap();
    let b = by_name("layernorm_4096x1024").unwrap();
    for (x, y) in a.inputs.iter().zip(&b.inputs) {
        assert_eq!(x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    }
    let x = a.inputs[0].to_vec::<f32>().unwrap();
    assert!(x.iter().all(|v| (-2.0..2.0).contains(v)));
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
    assert!(
        mean.abs() < 0.01,
        "mean {mean} of a uniform(-2, 2) sample of 4M values"
    );
}

#[test]
fn compare_rejects_outputs_out_of_tolerance_nan_and_wrong_shapes() {
    use minductor::Tensor;
    let want = vec![Tensor::from_vec(&[3], vec![1.0f32, -100.0, 0.0]).unwrap()];
    let close = vec![Tensor::from_vec(&[3], vec![1.0005f32, -100.05, 0.0009]).unwrap()];
    let error = compare("w", &want, &close).unwrap();
    assert!((error - 0.05).abs() < 1e-4, "{error}");
    let far = vec![Tensor::from_vec(&[3], vec![1.0f32, -100.2, 0.0]).unwrap()];
    let message = compare("w", &want, &far).unwrap_err().to_string();
    assert!(message.contains("element 1"), "{message}");
    let nan = vec![Tensor::from_vec(&[3], vec![1.0f32, -100.0, f32::NAN]).unwrap()];
    assert!(compare("w", &want, &nan).is_err());
    let shape = vec![Tensor::from_vec(&[1, 3], vec![1.0f32, -100.0, 0.0]).unwrap()];
    assert!(compare("w", &want, &shape).is_err());
    assert!(compare("w", &want, &[]).is_err());
}

/// `minductor bench --pt2`: every case of the `.pt2` manifest becomes a workload of its stored
/// user inputs, compiled with weights frozen on inductor and on eager, checked against each other
/// and timed.
#[test]
fn the_pt2_bench_times_every_case_on_both_backends() {
    use minductor_tools::bench::PreparedWorkload;
    use minductor_tools::pt2::{default_exported_dir, load_pt2_manifest, pt2_workloads};
    let dir = default_exported_dir();
    let cases = load_pt2_manifest(&dir).unwrap();
    let programs = pt2_workloads(&dir, None).unwrap();
    assert!(!cases.is_empty());
    assert_eq!(programs.len(), cases.len(), "a case was left out");
    let options = BenchOptions {
        budget: Duration::ZERO,
        min_iterations: 2,
    };
    for (p, case) in programs.iter().zip(&cases) {
        assert_eq!(p.workload.name, case.name);
        assert_eq!(p.workload.inputs.len(), case.inputs.len(), "{}", case.name);
        let mut prepared =
            PreparedWorkload::from_program(&p.workload, &p.program, minductor::Mode::Default)
                .unwrap();
        prepared.time_round(options).unwrap();
        let result = prepared.finish(&test_probe(), None).unwrap();
        assert_eq!(result.compiled.backend, "inductor", "{}", case.name);
        assert_eq!(result.eager.backend, "eager", "{}", case.name);
        assert_eq!(result.compiled.iterations, 2, "{}", case.name);
        assert!(result.eager.median_ms > 0.0 && result.compiled.median_ms > 0.0);
        assert!(!result.kernels.is_empty(), "{}: no kernels", case.name);
        assert!(result.max_abs_error <= 1e-3, "{}", case.name);
    }
    let err = pt2_workloads(&dir, Some(&["no_such_case".to_string()]))
        .err()
        .expect("an unknown case name is an error");
    assert!(err.contains("no_such_case"), "{err}");
}
