//! Every case of `../shared/golden-models` (or `$MINDUCTOR_GOLDEN_MODELS_DIR`) on every
//! backend, against PyTorch: the runner must build each one (nothing skipped), every case in
//! `models::SUPPORTED` must run and pass, and no case may fail.

use minductor::golden::{default_golden_models_dir, models, run_golden, Outcome};
use minductor::Backend;

#[test]
fn supported_golden_model_cases_match_pytorch_on_every_backend() {
    let dir = default_golden_models_dir();
    let report = run_golden(
        &dir,
        &[Backend::Eager, Backend::AotEager, Backend::Inductor],
    )
    .unwrap_or_else(|e| panic!("cannot read golden cases in {}: {e}", dir.display()));
    println!("{}", report.render());
    assert_eq!(
        report.failed(),
        0,
        "golden-models failures:\n{}",
        report.render()
    );
    assert_eq!(
        report.skipped(),
        0,
        "golden-models cases skipped:\n{}",
        report.render()
    );
    for case in models::SUPPORTED {
        let runs: Vec<_> = report.results.iter().filter(|r| r.case == case).collect();
        assert_eq!(runs.len(), 3, "{case} is missing from the manifest");
        for r in runs {
            assert_eq!(r.outcome, Outcome::Pass, "{case} on {:?}", r.backend);
        }
    }
}
