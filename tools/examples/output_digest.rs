//! Prints one line per golden case and suite workload: its name and a 64-bit FNV-1a digest of the
//! bits of every output the inductor backend computes (outputs contiguous, in order). Two builds
//! that print the same lines computed bitwise the same results; a refactoring that must not change
//! behaviour is checked by diffing the output before and after:
//! `cargo run --release -p minductor-tools --example output_digest -- [threads] > digest.txt`.

use minductor::{compile_with, Backend, Tensor};
use minductor_tools::golden::{self, build_case, load_manifest, load_tensors};
use minductor_tools::workloads;

fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *hash ^= u64::from(b);
        *hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

fn digest(outputs: &[Tensor]) -> String {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for t in outputs {
        fnv1a(&mut hash, &t.to_bytes());
    }
    format!("{hash:016x}")
}

fn main() {
    let threads = std::env::args()
        .nth(1)
        .map(|t| t.parse().expect("threads: a number"))
        .unwrap_or(2);
    minductor::set_num_threads(threads).expect("thread count");
    for dir in [
        golden::default_golden_dir(),
        golden::default_golden_models_dir(),
    ] {
        let Ok(cases) = load_manifest(&dir) else {
            eprintln!("no manifest in {}", dir.display());
            continue;
        };
        for case in cases {
            let Some((order, Ok(graph))) = build_case(&case.name, &case.inputs) else {
                continue;
            };
            let Ok(tensors) = load_tensors(&case.file) else {
                continue;
            };
            let Some(inputs) = order
                .iter()
                .map(|n| tensors.get(n).cloned())
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let line = match compile_with(&graph, Backend::Inductor)
                .map_err(|e| e.to_string())
                .and_then(|c| c.call(&inputs).map_err(|e| e.to_string()))
            {
                Ok(outputs) => digest(&outputs),
                Err(e) => format!("error: {e}"),
            };
            println!("{} {line}", case.name);
        }
    }
    for name in workloads::SUITE {
        let workload = workloads::by_name(name).expect("suite workload");
        let line = match compile_with(&workload.graph, Backend::Inductor)
            .map_err(|e| e.to_string())
            .and_then(|c| c.call(&workload.inputs).map_err(|e| e.to_string()))
        {
            Ok(outputs) => digest(&outputs),
            Err(e) => format!("error: {e}"),
        };
        println!("{name} {line}");
    }
}
