//! The cost of handing one parallel step to the thread pool, from outside the pool and from
//! one of its workers (`threads::in_pool`, how a program with splittable steps runs its steps):
//! 2000 steps of two 50 µs pieces, with 0, 20 and 100 µs of serial work between steps (when the
//! gap is long, workers waiting outside a step fall asleep and must be woken). Prints the time
//! per step beyond the 50 µs a piece takes, median of 5 runs.
//!
//! Then the same from a team (`threads::in_team`, how a program with splittable steps runs
//! them now): the pool's other workers spin for each step's pieces for the whole call.
//!
//! `cargo run --release -p minductor-tools --example pool_latency`

use minductor::internals::runtime::threads;
use std::time::Instant;
/// Busy work for `us` microseconds.
fn spin(us: f64) {
    let t = Instant::now();
    while t.elapsed().as_secs_f64() * 1e6 < us {}
}
fn main() {
    minductor::set_num_threads(2).unwrap();
    for gap in [0.0, 20.0, 100.0] {
        let mut best = Vec::new();
        for _ in 0..5 {
            let n = 2000;
            let t = Instant::now();
            for _ in 0..n {
                threads::for_each_chunk(2, |_| spin(50.0));
                spin(gap);
            }
            let per = t.elapsed().as_secs_f64() * 1e6 / n as f64 - gap - 50.0;
            best.push(per);
        }
        best.sort_by(f64::total_cmp);
        println!(
            "gap {gap:5} us: overhead per parallel step (median of 5) {:.1} us",
            best[2]
        );
    }
    // Inside the pool: the same steps from a worker.
    for gap in [0.0, 20.0, 100.0] {
        let r = threads::in_pool(|| {
            let mut best = Vec::new();
            for _ in 0..5 {
                let n = 2000;
                let t = Instant::now();
                for _ in 0..n {
                    threads::for_each_chunk(2, |_| spin(50.0));
                    spin(gap);
                }
                best.push(t.elapsed().as_secs_f64() * 1e6 / n as f64 - gap - 50.0);
            }
            best.sort_by(f64::total_cmp);
            best[2]
        });
        println!("inside the pool, gap {gap:5} us: overhead {r:.1} us");
    }
    // In a team: the same steps, the other workers spinning between them.
    for gap in [0.0, 20.0, 100.0] {
        let r = threads::in_team(|| {
            let mut best = Vec::new();
            for _ in 0..5 {
                let n = 2000;
                let t = Instant::now();
                for _ in 0..n {
                    threads::for_each_chunk(2, |_| spin(50.0));
                    spin(gap);
                }
                best.push(t.elapsed().as_secs_f64() * 1e6 / n as f64 - gap - 50.0);
            }
            best.sort_by(f64::total_cmp);
            best[2]
        });
        println!("in a team, gap {gap:5} us: overhead {r:.1} us");
    }
}
