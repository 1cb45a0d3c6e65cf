//! The shapes of a decoder's step, one token (or a few) at a time: linear layers of a few rows
//! (`linear → gelu → linear`), a batch of products against a cache of keys and values
//! (`q · kᵀ`, then `· v`), and the fused attention of one query row against 512 keys. Each
//! case is compiled once and timed at every thread count given, in rounds that alternate the
//! products of few rows (`gemm::few_rows`) with the packed path they replaced
//! (`gemm::set_few_rows(false)`), so a noisy moment of the machine falls on both; the median
//! microseconds a call of each (the attention has no switch: its one form).
//! `cargo run --release -p minductor-tools --example decode_shapes -- [threads,…] [rounds]`
//! (default `1,2` and 6).

use minductor::internals::kernels::gemm::set_few_rows;
use minductor::{compile, trace, Compiled, DType, Graph, Tensor};
use minductor_tools::workloads::{mlp_workload, uniform};
use std::time::Instant;

/// The median seconds of `runs` calls.
fn median_call(compiled: &Compiled, inputs: &[Tensor], runs: usize) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            compiled.call(inputs).expect("the case runs");
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `q [4, 8, rows, 64]` against `k`, `v [4, 8, 512, 64]`: the products alone, or softmax'd
/// (which fuses into one attention step).
fn cache_case(
    rows: usize,
    attention: bool,
) -> Result<(Graph, Vec<Tensor>), Box<dyn std::error::Error>> {
    let graph = trace(|t| {
        let q = t.input("q", DType::F32, &[4, 8, rows, 64]);
        let k = t.input("k", DType::F32, &[4, 8, 512, 64]);
        let v = t.input("v", DType::F32, &[4, 8, 512, 64]);
        let scores = q.matmul(&k.transpose(2, 3));
        let p = if attention {
            (scores * 0.125).softmax(-1)
        } else {
            scores
        };
        vec![p.matmul(&v)]
    })?;
    let inputs = [
        vec![4, 8, rows, 64],
        vec![4, 8, 512, 64],
        vec![4, 8, 512, 64],
    ]
    .iter()
    .enumerate()
    .map(|(i, shape)| uniform(shape, -1.0, 1.0, i as u64 + 1))
    .collect();
    Ok((graph, inputs))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: Vec<usize> = match args.next() {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 2],
    };
    let rounds: usize = args.next().map_or(Ok(6), |a| a.parse())?;
    let mut cases: Vec<(String, Graph, Vec<Tensor>, bool)> = Vec::new();
    for rows in [1, 4, 12] {
        for (width, hidden) in [(512, 2048), (1024, 4096)] {
            let w = mlp_workload(rows, width, hidden)?;
            let name = format!("linear-gelu-linear {rows} x {width}/{hidden}");
            cases.push((name, w.graph, w.inputs, true));
        }
    }
    for rows in [1, 4] {
        let (graph, inputs) = cache_case(rows, false)?;
        cases.push((
            format!("q·kᵀ·v, q {rows} row(s), 512 keys"),
            graph,
            inputs,
            true,
        ));
    }
    let (graph, inputs) = cache_case(1, true)?;
    cases.push((
        "attention, 1 query row, 512 keys".into(),
        graph,
        inputs,
        false,
    ));
    println!("median µs a call, few-rows products against the packed path ({rounds} rounds)");
    for &t in &threads {
        minductor::set_num_threads(t)?;
        println!("{t} thread(s):");
        for (name, graph, inputs, switch) in &cases {
            let compiled = compile(graph)?;
            let (mut few, mut packed) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                set_few_rows(true);
                few.push(median_call(&compiled, inputs, 30));
                if *switch {
                    set_few_rows(false);
                    packed.push(median_call(&compiled, inputs, 30));
                    set_few_rows(true);
                }
            }
            let few = median(few) * 1e6;
            if packed.is_empty() {
                println!("  {name:<44} {few:>9.1}");
            } else {
                let packed = median(packed) * 1e6;
                println!(
                    "  {name:<44} {few:>9.1}  packed {packed:>9.1}  ({:.2}x)",
                    packed / few
                );
            }
        }
    }
    Ok(())
}
