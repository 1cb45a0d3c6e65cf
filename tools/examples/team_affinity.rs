//! Whether a team's step reads the rows its threads wrote in the step before from their own
//! cores' caches: pairs of steps in one team, the first writing a `[rows, 1024]` buffer in the
//! pieces a GEMM's two-dimensional split makes (`threads` groups of rows times 4 groups of
//! columns, numbered row group first), the second reading it back in `8 · threads` pieces of
//! whole rows (the row kernel after the GEMM that wrote its input). Prints the read step's
//! bandwidth (median of 200 pairs) and the share of the bytes it read that the same thread had
//! written, for a buffer that fits in the cores' L2 caches together and for one 8 times larger.
//! Compare the team's static shares with first-come claiming:
//!
//! `cargo run --release -p minductor-tools --example team_affinity`
//! `MINDUCTOR_TEAM_SCHEDULE=dynamic cargo run --release -p minductor-tools --example team_affinity`

use minductor::internals::kernels::cache;
use minductor::internals::runtime::threads;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const COLS: usize = 1024;
const COLUMN_GROUPS: usize = 4;

/// Which thread ran each piece: a small id per thread.
fn thread_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static ID: usize = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|id| *id)
}

/// A buffer shared by the pieces of a step, each writing only its own part.
struct Shared(*mut f32);
// SAFETY: every piece writes only its own disjoint part of the buffer, and a step's pieces all
// finish before the next step starts.
unsafe impl Sync for Shared {}

impl Shared {
    fn at(&self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// (read GB/s, share of the bytes read that the reading thread wrote) for `bytes`.
fn pairs(bytes: usize, threads: usize) -> (f64, f64) {
    let rows = (bytes / 4 / COLS).max(8 * threads);
    let mut data = vec![0f32; rows * COLS];
    let shared = Shared(data.as_mut_ptr());
    // Who wrote each (row, column group), and how many bytes were read where they were written.
    let writer: Vec<AtomicUsize> = (0..rows * COLUMN_GROUPS)
        .map(|_| AtomicUsize::new(0))
        .collect();
    let local = AtomicUsize::new(0);
    let (mut times, rounds, read_pieces) = (Vec::new(), 200, 8 * threads);
    threads::in_team(|| {
        for round in 0..rounds {
            threads::for_each_chunk(threads * COLUMN_GROUPS, |p| {
                let (group, columns) = (p / COLUMN_GROUPS, p % COLUMN_GROUPS);
                let width = COLS / COLUMN_GROUPS;
                for row in rows * group / threads..rows * (group + 1) / threads {
                    writer[row * COLUMN_GROUPS + columns].store(thread_id(), Ordering::Relaxed);
                    // SAFETY: piece `p` writes only its block of rows and columns, inside the
                    // `rows · COLS` buffer; no two pieces share a block.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(
                            shared.at(row * COLS + columns * width),
                            width,
                        )
                    };
                    for (i, x) in out.iter_mut().enumerate() {
                        *x = (i + round) as f32;
                    }
                }
            });
            let t = Instant::now();
            threads::for_each_chunk(read_pieces, |p| {
                let range = rows * p / read_pieces..rows * (p + 1) / read_pieces;
                let mine = (range.start * COLUMN_GROUPS..range.end * COLUMN_GROUPS)
                    .filter(|&w| writer[w].load(Ordering::Relaxed) == thread_id())
                    .count();
                local.fetch_add(mine, Ordering::Relaxed);
                // SAFETY: this step only reads, inside the buffer.
                let values = unsafe {
                    std::slice::from_raw_parts(shared.at(range.start * COLS), range.len() * COLS)
                };
                // Sixteen sums at once, so that the loop is vectorised and the reads, not the
                // additions, set its speed.
                let mut sums = [0f32; 16];
                for chunk in values.chunks_exact(16) {
                    for (s, x) in sums.iter_mut().zip(chunk) {
                        *s += x;
                    }
                }
                std::hint::black_box(sums);
            });
            times.push(t.elapsed().as_secs_f64());
        }
    });
    drop(data);
    times.sort_by(f64::total_cmp);
    (
        (rows * COLS * 4) as f64 / times[times.len() / 2] / 1e9,
        local.load(Ordering::Relaxed) as f64 / (rounds * rows * COLUMN_GROUPS) as f64,
    )
}

fn main() {
    let threads = threads::num_threads().max(2);
    minductor::set_num_threads(threads).unwrap();
    let l2 = cache::l2_bytes().unwrap_or(1 << 20);
    let schedule = std::env::var("MINDUCTOR_TEAM_SCHEDULE").unwrap_or_else(|_| "static".into());
    println!(
        "{threads} threads, L2 {} KiB per core, schedule {schedule}",
        l2 >> 10
    );
    for (label, bytes) in [
        ("fits the L2s", l2 * threads / 2),
        ("8x the L2s", l2 * threads * 4),
    ] {
        let (gbs, local) = pairs(bytes, threads);
        println!(
            "{label:>12}: {:6} KiB: read {gbs:6.1} GB/s, {:5.1}% of it written by the same thread",
            bytes >> 10,
            local * 100.0
        );
    }
}
