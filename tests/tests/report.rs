//! The fusion report: one row group per compiled step, costs from the kernel IR, times measured.

use minductor::{trace, DType, Tensor};
use minductor_tools::report::fusion_report;

#[test]
fn report_lists_every_step_with_its_cost_and_time() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[16, 80]);
        let w = t.input("w", DType::F32, &[24, 80]);
        vec![x.linear(&w, None).gelu(), x.softmax(-1)]
    })
    .unwrap();
    let inputs = [
        Tensor::from_vec(&[16, 80], (0..16 * 80).map(|i| (i as f32).sin()).collect()).unwrap(),
        Tensor::from_vec(&[24, 80], (0..24 * 80).map(|i| (i as f32).cos()).collect()).unwrap(),
    ];
    let report = fusion_report(&graph, &inputs, 3, None).unwrap();
    // The GEMM carries gelu as its epilogue; softmax is one kernel.
    assert_eq!(report.steps.len(), 2, "{report}");
    let gemm = report
        .steps
        .iter()
        .find(|s| s.costs.len() == 2)
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(gemm.costs[0].flops, 2 * 16 * 24 * 80);
    let softmax = report.steps.iter().find(|s| s.costs.len() == 1).unwrap();
    // softmax reads x once, writes its output and reads it back once (the exponentials the
    // summing stage stored: `store_once`).
    assert_eq!(softmax.costs[0].bytes_read, 2 * 16 * 80 * 4);
    assert_eq!(softmax.costs[0].bytes_written, 16 * 80 * 4);
    let text = report.to_string();
    for step in &report.steps {
        for cost in &step.costs {
            assert!(text.contains(&cost.name), "{text}");
        }
    }
    assert!(text.contains("GFLOP/s") && text.contains("GB/s"), "{text}");
    // Each row's vector width, from the CPU's features detected at run time: every stage of
    // softmax runs as a row routine at the widest width there is (its rows of 80 are past
    // `SHORT_ROW`, below which a stage without a function keeps the 4-lane loop).
    let widest = minductor_tests::widest_bits();
    assert_eq!(softmax.vector_bits, vec![Some(widest)], "{text}");
    assert_eq!(gemm.vector_bits.len(), 2, "{text}");
    assert!(text.contains(" vec "), "{text}");
    // The GEMM's product alone is timed too (its epilogue left out); the kernel has none.
    assert!(
        gemm.product.is_some() && softmax.product.is_none(),
        "{text}"
    );
    assert!(text.contains("product"), "{text}");
}

/// `Compiled::profile_products` times the same steps as `profile`, and leaves the calls after it
/// computing the graph's results.
#[test]
fn products_alone_are_timed_step_by_step_and_later_calls_still_match() {
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[70, 40]);
        let w = t.input("w", DType::F32, &[300, 40]);
        vec![(x.linear(&w, None).gelu() * 2.0).sum(&[-1], false)]
    })
    .unwrap();
    let inputs = [
        Tensor::from_vec(
            &[70, 40],
            (0..70 * 40).map(|i| (i as f32 * 0.1).sin()).collect(),
        )
        .unwrap(),
        Tensor::from_vec(
            &[300, 40],
            (0..300 * 40).map(|i| (i as f32 * 0.3).cos()).collect(),
        )
        .unwrap(),
    ];
    let compiled = minductor::compile(&graph).unwrap();
    let want = compiled.call(&inputs).unwrap();
    let (_, steps) = compiled.profile(&inputs).unwrap();
    let products = compiled.profile_products(&inputs).unwrap();
    let names = |t: &[minductor::StepTiming]| t.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&steps), names(&products));
    let got = compiled.call(&inputs).unwrap();
    assert_eq!(
        got[0].to_vec::<f32>().unwrap(),
        want[0].to_vec::<f32>().unwrap()
    );
}

/// `report --mode max-autotune`: the report of a program compiled in that mode lists the
/// choice of every tuned step (the GEMM's plan, the attention's tiling), and says so in its
/// text; the default mode lists none.
#[test]
fn a_max_autotune_report_lists_its_choices() {
    use minductor::Mode;
    use minductor_tools::report::StepTimer;
    let graph = trace(|t| {
        let x = t.input("x", DType::F32, &[2, 4, 70, 16]);
        let w = t.input("w", DType::F32, &[16, 16]);
        let q = x.matmul(&w);
        vec![q.scaled_dot_product_attention(&x, &x, None, true)]
    })
    .unwrap();
    let ramp = |shape: &[usize], seed: f32| {
        let n: usize = shape.iter().product();
        Tensor::from_vec(
            shape,
            (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect(),
        )
        .unwrap()
    };
    let inputs = [ramp(&[2, 4, 70, 16], 0.0), ramp(&[16, 16], 1.0)];
    let mut timer = StepTimer::new_in(&graph, Mode::MaxAutotune).unwrap();
    timer.time(&inputs, 1).unwrap();
    let report = timer.finish(None);
    let steps: Vec<&str> = report.autotune.iter().map(|(s, _)| s.as_str()).collect();
    assert!(
        steps.iter().any(|s| s.starts_with("attention_"))
            && steps.iter().any(|s| s.starts_with("matmul_")),
        "{report}"
    );
    let text = report.to_string();
    assert!(text.contains("max-autotune chose: "), "{text}");
    for (step, choice) in &report.autotune {
        assert!(text.contains(&format!("{step} {choice}")), "{text}");
    }
    let mut timer = StepTimer::new(&graph).unwrap();
    timer.time(&inputs, 1).unwrap();
    let report = timer.finish(None);
    assert!(report.autotune.is_empty());
    assert!(!report.to_string().contains("max-autotune"), "{report}");
}
