//! The performance issue's width target as a test: every step of the suite with at least
//! 0.1 ms of work runs at the widest vector width this CPU has (512 bits on an AVX-512
//! machine: row routines, the AVX-512 GEMM micro-kernel, the AVX-512 attention form; 256 with
//! AVX2 only), the width `minductor report` prints in its `vec` column. The work is the cost
//! model's on the partition report's reference core (`report::reference_ms`), not a timing, so the same steps are checked on every machine.
//!
//! The one per-CPU choice that runs a step narrower on purpose, a layer norm's affine store
//! over an output of half the last-level cache or more on a core that splits 512-bit
//! operations (Zen 4; `codegen_cpu/src/lower/rows.rs`, `LAYER_NORM_AFFINE_STORE`, measured
//! slower there), is turned off here (`set_row_shapes_by_cpu(false)`), as it is on every other
//! CPU: what this asserts is that a full-width form takes every such step, so that no change
//! drops one of them to Cranelift's 4-lane loops unnoticed.

use minductor::compile;
use minductor::internals::codegen_cpu::lower::{set_row_shapes_by_cpu, step_vector_bits};
use minductor::internals::kernel_ir::cost::program_cost;
use minductor_tools::report::reference_ms;
use minductor_tools::workloads::{by_name, SUITE};

const LEAST_MS: f64 = 0.1;

#[test]
fn every_suite_step_of_a_tenth_of_a_millisecond_runs_at_full_width() {
    let widest = minductor_tests::widest_bits();
    // This test is its file's only one: the switch affects no other test's compiles.
    set_row_shapes_by_cpu(false);
    let (mut checked, mut failures) = (0, Vec::new());
    for name in SUITE {
        let workload = by_name(name).unwrap();
        let compiled = compile(&workload.graph).unwrap();
        let program = compiled.artifacts().program.clone().unwrap();
        let mut costs = program_cost(&program).into_iter();
        for step in &program.steps {
            for bits in step_vector_bits(step, &program) {
                let cost = costs.next().expect("a cost row per width row");
                let ms = reference_ms(std::slice::from_ref(&cost));
                if ms < LEAST_MS {
                    continue;
                }
                checked += 1;
                if bits != Some(widest) {
                    failures.push(format!(
                        "{name}: {} ({ms:.2} ms) at {bits:?} bits, not {widest}",
                        cost.name
                    ));
                }
            }
        }
        assert!(
            costs.next().is_none(),
            "{name}: more cost rows than width rows"
        );
    }
    set_row_shapes_by_cpu(true);
    // The suite's GEMMs, attention steps, norms, softmax and pointwise kernels.
    assert!(checked >= 30, "only {checked} steps checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
