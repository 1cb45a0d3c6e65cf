//! A workload-characterization backend: it receives each graph `jit` captures, prints it as a
//! table with op counts and estimated bytes, and returns the graph's reference execution.
//!
//! `cargo run --release --example custom_backend`

use minductor::internals::ir::{Graph, Op, TensorType};
use minductor::{
    jit, reference_executable, CompileError, CompiledFn, CustomBackend, JitBackend, Tensor, Traced,
};
use std::collections::BTreeMap;

/// Bytes as a polynomial in the symbolic dims: monomial (sorted symbol names) -> coefficient.
type Bytes = BTreeMap<Vec<String>, usize>;

/// Bytes of a value of type `ty`: `numel * dtype size`, symbolic when a dim is.
fn bytes(ty: &TensorType) -> Bytes {
    let mut coefficient = ty.dtype.size_bytes();
    let mut symbols = Vec::new();
    for d in &ty.shape {
        match d.as_static() {
            Some(n) => coefficient *= n,
            None => symbols.push(d.to_string()),
        }
    }
    symbols.sort();
    BTreeMap::from([(symbols, coefficient)])
}

fn add(mut a: Bytes, b: Bytes) -> Bytes {
    for (k, v) in b {
        *a.entry(k).or_insert(0) += v;
    }
    a
}

fn show(bytes: &Bytes) -> String {
    let terms: Vec<String> = bytes
        .iter()
        .filter(|(_, &c)| c > 0)
        .map(|(syms, c)| {
            std::iter::once(c.to_string())
                .chain(syms.iter().cloned())
                .collect::<Vec<_>>()
                .join("*")
        })
        .collect();
    if terms.is_empty() {
        "0".to_string()
    } else {
        terms.join(" + ")
    }
}

struct Characterize;

impl CustomBackend for Characterize {
    fn name(&self) -> String {
        "characterize".to_string()
    }

    fn compile(
        &self,
        graph: &Graph,
        example_inputs: &[TensorType],
    ) -> Result<CompiledFn, CompileError> {
        let inputs: Vec<String> = example_inputs.iter().map(|t| t.to_string()).collect();
        println!(
            "graph with {} nodes, inputs ({})",
            graph.len(),
            inputs.join(", ")
        );
        println!(
            "{:<6} {:<14} {:<22} {:>12}",
            "node", "op", "type", "bytes out"
        );
        let mut per_op: BTreeMap<String, (usize, Bytes)> = BTreeMap::new();
        for (id, node) in graph.ids().zip(graph.nodes()) {
            let out = bytes(&node.ty);
            println!(
                "{:<6} {:<14} {:<22} {:>12}",
                id.to_string(),
                node.op.name(),
                node.ty.to_string(),
                show(&out)
            );
            if !matches!(node.op, Op::Input { .. } | Op::Constant { .. }) {
                let entry = per_op.entry(node.op.name()).or_default();
                entry.0 += 1;
                entry.1 = add(std::mem::take(&mut entry.1), out);
            }
        }
        println!("{:<14} {:>6} {:>12}", "op", "count", "bytes out");
        for (op, (count, total)) in &per_op {
            println!("{op:<14} {count:>6} {:>12}", show(total));
        }
        let sum = |types: Vec<&TensorType>| types.into_iter().map(bytes).fold(Bytes::new(), add);
        println!(
            "inputs {} B, outputs {} B, every value materialized (eager) {} B\n",
            show(&sum(example_inputs.iter().collect())),
            show(&sum(graph.outputs().iter().map(|&o| graph.ty(o)).collect())),
            show(&sum(graph.nodes().iter().map(|n| &n.ty).collect()))
        );
        Ok(reference_executable(graph))
    }
}

fn block(x: &[Traced]) -> Vec<Traced> {
    let h = x[0].linear(&x[1], Some(&x[2])).gelu();
    vec![h.layer_norm(&[64], None, None, 1e-5).softmax(-1)]
}

fn values(shape: &[usize], seed: f32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(
        shape,
        (0..n).map(|i| (i as f32 * 0.1 + seed).sin()).collect(),
    )
    .expect("shape matches data")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let f = jit(block)
        .backend(JitBackend::custom(Characterize))
        .input_names(&["x", "w", "b"])
        .name("block");
    let (w, b) = (values(&[64, 32], 1.0), values(&[64], 2.0));
    for batch in [8, 16, 24, 32] {
        let out = f.call(&[values(&[batch, 32], 0.0), w.clone(), b.clone()])?;
        println!("batch {batch}: output {:?}", out[0].shape());
    }
    let stats = f.stats();
    println!(
        "\ncompiles {}, symbolic {}, cache hits {}, recompiles {:?}",
        stats.compiles, stats.symbolic_compiles, stats.cache_hits, stats.recompiles
    );
    println!("\n{}", f.explain(&[values(&[40, 32], 0.0), w, b])?);
    Ok(())
}
