//! Times reductions over a non-innermost axis (the outer-reduction loop order): column sums of
//! several shapes, `softmax(dim=0)`, a mean over the middle axis of a 3-D tensor, each as the
//! median of 21 calls, with the achieved read bandwidth. `--program` also prints each program.
//!
//! `cargo run --release --example column_reductions [-- --program]`

use minductor::{compile, DType, Graph, Tensor, Traced, Tracer};
use minductor_tools::workloads::uniform;
use std::time::Instant;

fn case(name: &str, shape: &[usize], f: impl Fn(&Traced) -> Vec<Traced>, print: bool) {
    let tracer = Tracer::new();
    let x = tracer.input("x", DType::F32, shape);
    let outputs = f(&x);
    let graph: Graph = tracer.finish(&outputs).unwrap();
    let input = uniform(shape, -1.0, 1.0, 5);
    let compiled = compile(&graph).unwrap();
    if print {
        println!("{}", compiled.artifacts().program.as_ref().unwrap());
    }
    let inputs = [input];
    let mut times: Vec<f64> = (0..21)
        .map(|_| {
            let t = Instant::now();
            let out: Vec<Tensor> = compiled.call(&inputs).unwrap();
            std::hint::black_box(out);
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let bytes = 4.0 * shape.iter().product::<usize>() as f64;
    println!(
        "{name:<28} {shape:?}: {:8.3} ms, {:6.1} GB/s read",
        median * 1e3,
        bytes / median / 1e9
    );
}

fn main() {
    let print = std::env::args().any(|a| a == "--program");
    for shape in [
        [4096, 256],
        [256, 4096],
        [1024, 256],
        [4096, 1024],
        [100_000, 33],
    ] {
        case("sum(0)", &shape, |x| vec![x.sum(&[0], false)], print);
    }
    for shape in [[4096, 1024], [4096, 1000], [1024, 1024]] {
        case("softmax(0)", &shape, |x| vec![x.softmax(0)], print);
    }
    case("softmax(1)", &[4096, 1024], |x| vec![x.softmax(1)], print);
    case(
        "softmax(0) then softmax(1)",
        &[1024, 1024],
        |x| vec![x.softmax(0).softmax(1)],
        print,
    );
    case(
        "mean over the middle axis",
        &[16, 1024, 256],
        |x| vec![x.mean(&[1], false)],
        print,
    );
    case(
        "argmax(0)",
        &[4096, 256],
        |x| vec![x.argmax(0, false)],
        print,
    );
}
