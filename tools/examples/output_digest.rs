//! Prints one line per golden case and suite workload: its name, a 64-bit FNV-1a digest of the
//! bits of every output the inductor backend computes (outputs contiguous, in order) and one of
//! the Cranelift IR of its kernels. Two builds that print the same lines computed bitwise the same
//! results (and emitted the same code); a refactoring that must not change behaviour is checked by
//! diffing the output before and after:
//! `cargo run --release -p minductor-tools --example output_digest -- [threads] > digest.txt`.

use minductor::{compile_with, Backend, Compiled, Tensor};
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

/// `clif` with every hexadecimal number of 9 characters or more (digits and `_` separators: an address of a math block
/// routine, a lookup table) replaced by `0x?`, so the text is the same in every process.
fn without_addresses(clif: &str) -> String {
    let mut out = String::with_capacity(clif.len());
    let mut rest = clif;
    while let Some(at) = rest.find("0x") {
        out.push_str(&rest[..at + 2]);
        let digits = rest[at + 2..]
            .bytes()
            .take_while(|b| b.is_ascii_hexdigit() || *b == b'_')
            .count();
        if digits >= 9 {
            out.push('?');
        } else {
            out.push_str(&rest[at + 2..at + 2 + digits]);
        }
        rest = &rest[at + 2 + digits..];
    }
    out.push_str(rest);
    out
}

/// The digest of the kernels' Cranelift IR, in program order.
fn code_digest(compiled: &Compiled) -> String {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for (name, clif) in &compiled.artifacts().cranelift_ir {
        fnv1a(&mut hash, name.as_bytes());
        fnv1a(&mut hash, without_addresses(clif).as_bytes());
    }
    format!("{hash:016x}")
}

/// `outputs-digest code-digest` of `compiled` on `inputs`, or the error.
fn line(compiled: Result<Compiled, String>, inputs: &[Tensor]) -> String {
    compiled
        .and_then(|c| {
            let outputs = c.call(inputs).map_err(|e| e.to_string())?;
            Ok(format!("{} {}", digest(&outputs), code_digest(&c)))
        })
        .unwrap_or_else(|e| format!("error: {e}"))
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
            let compiled = compile_with(&graph, Backend::Inductor).map_err(|e| e.to_string());
            println!("{} {}", case.name, line(compiled, &inputs));
        }
    }
    for name in workloads::SUITE {
        let workload = workloads::by_name(name).expect("suite workload");
        let compiled = compile_with(&workload.graph, Backend::Inductor).map_err(|e| e.to_string());
        println!("{name} {}", line(compiled, &workload.inputs));
    }
}
