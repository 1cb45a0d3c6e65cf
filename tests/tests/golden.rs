//! Every forward case of the PyTorch golden manifest, on every backend.
//!
//! The manifest is `../shared/golden` (or `$MINDUCTOR_GOLDEN_DIR`); shapes come from its files.

use minductor::golden::{default_golden_dir, run_golden, Outcome};
use minductor::Backend;

#[test]
fn every_forward_golden_case_matches_pytorch_on_every_backend() {
    let dir = default_golden_dir();
    let report = run_golden(
        &dir,
        &[Backend::Eager, Backend::AotEager, Backend::Inductor],
    )
    .unwrap_or_else(|e| panic!("cannot read golden cases in {}: {e}", dir.display()));
    println!("{}", report.render());
    assert!(report.passed() > 0, "no golden case ran");
    assert_eq!(report.failed(), 0, "golden failures:\n{}", report.render());
    // Only the gradient cases may be skipped (autodiff does not exist yet); any other skip means
    // the runner lost a case.
    for r in &report.results {
        if let Outcome::Skip(_) = r.outcome {
            assert!(
                r.case.starts_with("train_"),
                "forward case {} was skipped",
                r.case
            );
        }
    }
}
