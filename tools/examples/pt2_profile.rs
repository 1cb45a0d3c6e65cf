//! Where a `.pt2` case's call spends its time: each step's mean wall time over 300 profiled
//! calls (`Compiled::profile`) of the case compiled with its weights frozen, slowest first, with
//! the fallback steps (nodes the interpreter runs) among them:
//! `cargo run --release -p minductor-tools --example pt2_profile -- tiny_gpt2 [THREADS [DIR]]`
//! (THREADS: one per physical core by default; DIR: `../shared/exported`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args
        .next()
        .ok_or("usage: pt2_profile CASE [THREADS [DIR]]")?;
    if let Some(threads) = args.next() {
        minductor::set_num_threads(threads.parse()?)?;
    }
    let dir = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(minductor_tools::pt2::default_exported_dir);
    let case = minductor_tools::pt2::pt2_workloads(&dir, Some(&[name]))?.remove(0);
    let program = case.program.compile()?;
    let compiled = program
        .compiled()
        .ok_or("no compiled program for symbolic sizes")?;
    const CALLS: u32 = 300;
    let mut steps: Vec<(String, f64)> = Vec::new();
    for _ in 0..CALLS {
        let (_, timings) = compiled.profile(&case.workload.inputs)?;
        for t in timings {
            match steps.iter_mut().find(|(n, _)| *n == t.name) {
                Some(step) => step.1 += t.time.as_secs_f64(),
                None => steps.push((t.name, t.time.as_secs_f64())),
            }
        }
    }
    steps.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = steps.iter().map(|s| s.1).sum();
    let per_call = |seconds: f64| seconds / f64::from(CALLS) * 1e6;
    println!(
        "{}: {:.1} us per call over {} steps",
        case.workload.name,
        per_call(total),
        steps.len()
    );
    for (name, seconds) in &steps {
        println!("{name:<50} {:>8.2} us", per_call(*seconds));
    }
    Ok(())
}
