//! Accuracy of long f32 reductions: sums accumulate in blocks (`lower.rs`, `SUM_BLOCK`), a
//! cascade like PyTorch's, so the error grows with the number of blocks, not of elements.

use minductor::{compile, trace, DType, Tensor};
use minductor_tools::workloads::uniform;

/// PyTorch's f32 sum of 402,653,184 ones is exact; a single accumulator per lane stops
/// counting at 2^24 per lane (a sum of 2^28 or more ones comes out short).
#[test]
fn sum_of_402653184_ones_is_exact() {
    let n = 402_653_184usize;
    let graph = trace(|t| vec![t.input("x", DType::F32, &[n]).sum(&[0], false)]).unwrap();
    let ones = Tensor::from_vec(&[n], vec![1.0f32; n]).unwrap();
    let out = compile(&graph).unwrap().call(&[ones]).unwrap();
    assert_eq!(out[0].to_f64_vec(), vec![n as f64]);
}

/// The mean of 8M uniform values in [0, 1) within 1e-7 relative of the f64 mean (PyTorch's
/// error is 3e-8), as a full reduction and as row means of a [4, 2M] matrix.
#[test]
fn mean_of_8m_uniform_values_is_within_1e_7() {
    let n = 8 << 20;
    let x = uniform(&[n], 0.0, 1.0, 11);
    let exact = x.to_f64_vec().iter().sum::<f64>() / n as f64;
    let graph = trace(|t| vec![t.input("x", DType::F32, &[n]).mean(&[0], false)]).unwrap();
    let got = compile(&graph)
        .unwrap()
        .call(std::slice::from_ref(&x))
        .unwrap()[0]
        .to_f64_vec()[0];
    assert!(
        ((got - exact) / exact).abs() <= 1e-7,
        "mean {got} vs f64 {exact}: relative error {:e}",
        ((got - exact) / exact).abs()
    );

    let rows = Tensor::from_vec(
        &[4, n / 4],
        x.to_f64_vec()
            .iter()
            .map(|&v| v as f32)
            .collect::<Vec<f32>>(),
    )
    .unwrap();
    let graph = trace(|t| vec![t.input("x", DType::F32, &[4, n / 4]).mean(&[1], false)]).unwrap();
    let got = compile(&graph)
        .unwrap()
        .call(std::slice::from_ref(&rows))
        .unwrap()[0]
        .to_f64_vec();
    let values = rows.to_f64_vec();
    for (r, g) in got.iter().enumerate() {
        let row = &values[r * n / 4..(r + 1) * n / 4];
        let exact = row.iter().sum::<f64>() / row.len() as f64;
        assert!(
            ((g - exact) / exact).abs() <= 1e-7,
            "row {r}: {g} vs {exact}"
        );
    }
}

/// Infinities and NaN survive the blocked, compensated sum: inf (whatever block it is in and
/// however many blocks follow), -inf + inf = NaN, NaN stays NaN; also for rows (sum over the
/// inner dim) and columns (sum over the outer one).
#[test]
fn blocked_sums_keep_infinities_and_nan() {
    let n = 5000;
    for (specials, want) in [
        (vec![(3, f32::INFINITY)], f64::INFINITY),
        (vec![(4999, f32::NEG_INFINITY)], f64::NEG_INFINITY),
        (
            vec![(10, f32::INFINITY), (4000, f32::NEG_INFINITY)],
            f64::NAN,
        ),
        (vec![(2048, f32::NAN)], f64::NAN),
    ] {
        let mut values = vec![0.5f32; n];
        for &(i, v) in &specials {
            values[i] = v;
        }
        let x = Tensor::from_vec(&[n], values.clone()).unwrap();
        let graph = trace(|t| vec![t.input("x", DType::F32, &[n]).sum(&[0], false)]).unwrap();
        let got = compile(&graph).unwrap().call(&[x]).unwrap()[0].to_f64_vec()[0];
        let same = (got.is_nan() && want.is_nan()) || got == want;
        assert!(same, "{specials:?}: {got} instead of {want}");

        let cols = Tensor::from_vec(&[n, 1], values).unwrap();
        let graph = trace(|t| vec![t.input("x", DType::F32, &[n, 1]).sum(&[0], false)]).unwrap();
        let got = compile(&graph).unwrap().call(&[cols]).unwrap()[0].to_f64_vec()[0];
        let same = (got.is_nan() && want.is_nan()) || got == want;
        assert!(same, "{specials:?} as a column: {got} instead of {want}");
    }
}
