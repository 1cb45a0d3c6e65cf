//! The cost of handing one parallel step to the thread pool: from outside the pool, from one of
//! its workers (`threads::in_pool`), and from a team (`threads::in_team`, how a program with
//! splittable steps runs them: the pool's other workers spin for each step's pieces for the
//! whole call). 2000 steps of two 50 µs pieces, with 0, 20 and 100 µs of serial work between
//! steps (when the gap is long, rayon's idle workers fall asleep and must be woken). Prints the
//! time per step beyond the 50 µs a piece takes, median of 5 runs.
//!
//! `cargo run --release -p minductor-tools --example pool_latency`

use minductor::internals::runtime::threads;
use std::time::Instant;

/// Busy work for `us` microseconds.
fn spin(us: f64) {
    let t = Instant::now();
    while t.elapsed().as_secs_f64() * 1e6 < us {}
}

/// The overhead per parallel step with `gap` µs of serial work between steps, median of 5.
fn overhead(gap: f64) -> f64 {
    let mut runs = Vec::new();
    for _ in 0..5 {
        let n = 2000;
        let t = Instant::now();
        for _ in 0..n {
            threads::for_each_chunk(2, |_| spin(50.0));
            spin(gap);
        }
        runs.push(t.elapsed().as_secs_f64() * 1e6 / n as f64 - gap - 50.0);
    }
    runs.sort_by(f64::total_cmp);
    runs[2]
}

fn main() {
    minductor::set_num_threads(2).unwrap();
    for gap in [0.0, 20.0, 100.0] {
        println!(
            "from outside the pool, gap {gap:5} us: overhead per step {:.1} us",
            overhead(gap)
        );
    }
    for gap in [0.0, 20.0, 100.0] {
        let us = threads::in_pool(|| overhead(gap));
        println!("inside the pool,       gap {gap:5} us: overhead per step {us:.1} us");
    }
    for gap in [0.0, 20.0, 100.0] {
        let us = threads::in_team(|| overhead(gap));
        println!("in a team,             gap {gap:5} us: overhead per step {us:.1} us");
    }
}
