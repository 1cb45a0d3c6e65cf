//! The partition report's targets on the suite: every step with at least 1 ms of work on one
//! thread (by the cost model, on the reference core of `report::REFERENCE_GFLOPS` and
//! `REFERENCE_GB_PER_S`, not by timing) splits into at least T pieces whose largest holds at
//! most 1.15 times the mean, at T = 16 and T = 64. The pieces come from the executor's own
//! splitting rules (`Compiled::partition`), so a change that serialises a step, or cuts it
//! into too few or uneven pieces for a many-core machine, fails here on any machine.

use minductor_tools::report::partition_report;
use minductor_tools::workloads::{by_name, SUITE};

const COUNTS: [usize; 2] = [16, 64];
const MOST_IMBALANCE: f64 = 1.15;
const LEAST_MS: f64 = 1.0;

#[test]
fn every_heavy_step_of_the_suite_splits_evenly_for_16_and_64_threads() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for name in SUITE {
        let workload = by_name(name).unwrap();
        let report = partition_report(&workload.graph, &workload.inputs, &COUNTS).unwrap();
        for step in &report.steps {
            // Whatever the thread count, the pieces hold the step's whole work.
            let totals: Vec<u64> = step.partitions.iter().map(|p| p.total()).collect();
            assert!(
                totals.windows(2).all(|w| w[0] == w[1]),
                "{name} {}: the pieces' work differs between thread counts: {totals:?}",
                step.name
            );
            if step.reference_ms() < LEAST_MS {
                continue;
            }
            checked += 1;
            for (p, &t) in step.partitions.iter().zip(&COUNTS) {
                if p.pieces.len() < t || p.imbalance() > MOST_IMBALANCE {
                    failures.push(format!(
                        "{name} {} ({:.2} ms): {} pieces, imbalance {:.3} at {t} threads",
                        step.name,
                        step.reference_ms(),
                        p.pieces.len(),
                        p.imbalance()
                    ));
                }
            }
        }
    }
    // The suite has heavy steps (its GEMMs, convolutions and attention at least).
    assert!(checked >= 10, "only {checked} steps of >= {LEAST_MS} ms");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn one_thread_runs_every_step_as_one_piece() {
    for name in [
        "mlp_256x1024x4096",
        "softmax_4096x1024",
        "resnet_block_8x64x56",
    ] {
        let workload = by_name(name).unwrap();
        let report = partition_report(&workload.graph, &workload.inputs, &[1]).unwrap();
        for step in &report.steps {
            assert_eq!(step.partitions[0].pieces.len(), 1, "{name} {}", step.name);
        }
    }
}

/// Lighter steps still split for many cores: every step with at least 0.15 ms of work on the
/// reference core gets at least 16 pieces at 16 and 64 threads, whatever its outer loops (a
/// LLaMA block's `[4, 256] x [512]` RMS norm and `[4, 8, 256] x [64]` rotary kernels once ran
/// in 4 pieces, one per batch row: their outer loops are now split as one flattened range).
#[test]
fn steps_of_a_tenth_of_a_millisecond_split_into_16_pieces() {
    let mut failures = Vec::new();
    for name in SUITE {
        let workload = by_name(name).unwrap();
        let report = partition_report(&workload.graph, &workload.inputs, &COUNTS).unwrap();
        for step in &report.steps {
            if step.reference_ms() < 0.15 {
                continue;
            }
            for (p, &t) in step.partitions.iter().zip(&COUNTS) {
                if p.pieces.len() < 16 || p.imbalance() > MOST_IMBALANCE {
                    failures.push(format!(
                        "{name} {} ({:.2} ms): {} pieces, imbalance {:.3} at {t} threads",
                        step.name,
                        step.reference_ms(),
                        p.pieces.len(),
                        p.imbalance()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
