//! Every case of the PyTorch golden manifest (forward, gradients and optimizer steps), on every
//! backend.
//!
//! The manifest is `../shared/golden` (or `$MINDUCTOR_GOLDEN_DIR`); shapes come from its files.

use minductor::Backend;
use minductor_tools::golden::{default_golden_dir, run_golden, Outcome};

#[test]
fn every_golden_case_matches_pytorch_on_every_backend() {
    let dir = default_golden_dir();
    let report = run_golden(
        &dir,
        &[Backend::Eager, Backend::AotEager, Backend::Inductor],
    )
    .unwrap_or_else(|e| panic!("cannot read golden cases in {}: {e}", dir.display()));
    println!("{}", report.render());
    assert!(report.passed() > 0, "no golden case ran");
    assert_eq!(report.failed(), 0, "golden failures:\n{}", report.render());
    // Nothing may be skipped: a skip means the runner lost a case.
    let skipped: Vec<&str> = report
        .results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Skip(_)))
        .map(|r| r.case.as_str())
        .collect();
    assert!(skipped.is_empty(), "golden cases skipped: {skipped:?}");
}
