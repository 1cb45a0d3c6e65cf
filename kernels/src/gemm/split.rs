//! How a product `c = a · b` splits across threads: the one rule every GEMM path runs by
//! ([`multiply_parallel`](super::multiply_parallel), the streamed products, the executor's row
//! tiles) and that the partition report asks for other thread counts.
//!
//! The output is cut in two dimensions, as oneDNN's and Inductor's C++ GEMM template do: its
//! micro-panels of `mr` rows into `row_groups` runs and its panels of `nr` columns into
//! `panel_groups` runs, one piece per pair. A piece computes every depth block of its tiles with
//! the same micro-kernel calls in the same order whatever the cut, so the split never changes a
//! sum: results are the same bits on every thread count.
//!
//! The cut is chosen by an estimate of the time of the slowest thread: the pieces run in
//! `ceil(pieces / threads)` rounds of the largest piece, whose cost is its padded multiply-adds
//! (`mr × nr` tiles are computed whole) plus the operand it packs for itself: a piece packs its
//! rows of `a` when `b` is packed once and shared ([`Shared::B`]), its columns of `b` when `a`
//! is ([`Shared::A`], the streamed products). Among the cuts within a tenth of the best
//! estimate (the estimate's error), the one giving the most threads a piece wins (a thread
//! left idle is certain; the packing the estimate charges for an extra piece is a guess), then
//! the lowest estimate, then the most pieces (up to 4 per thread) that keep at least
//! [`MIN_PIECE_PANELS`] panels each, then the fewest:
//! - a thread that has run its own share of the pieces steals from the others' (see
//!   `threads::in_team`), so with several pieces per thread a thread slowed by something the
//!   estimate cannot see (another process on its core, a lower clock) leaves its last pieces to
//!   the others;
//! - but a piece prefetches the source of each block of `b` while it computes the block before,
//!   so its first block is packed unprefetched, and a piece of one panel and one depth block
//!   prefetches nothing.
//!
//! Measured on the MLP workload at 2 threads, on a 2-vCPU VM whose vCPUs slow down in turn:
//! with 2 pieces per product ~9.5% of the samples waited for the last piece, with 8 ~4%;
//! medians of eight alternated runs 20.9 ms (2 pieces) against 19.8 (8 and 4 pieces, the rule
//! above), 7 runs of 8 faster. The LLaMA block measured the same either way.

/// The operand packed once per product and shared by every piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shared {
    /// `b` (the packed path): each piece packs its rows of `a`.
    B,
    /// `a` (the streamed path): each piece packs the blocks of `b` of its panels.
    A,
    /// Both ([`super::multiply_shared`]): all of `a` is packed before the pieces run and `b`
    /// once per product, so a piece packs nothing of its own and the cut costs the same however
    /// fine it is.
    Neither,
}

/// Products with fewer flops run on the calling thread: handing out pieces costs more than
/// they save.
pub const PARALLEL_FLOPS_THRESHOLD: usize = 1 << 22;

/// The threads a product of `flops` flops runs on, of `threads` available.
pub fn product_threads(flops: usize, threads: usize) -> usize {
    if flops >= PARALLEL_FLOPS_THRESHOLD {
        threads.max(1)
    } else {
        1
    }
}

/// The fewest panels of `b` a piece keeps when a cut has more pieces than threads (see the
/// module's doc).
const MIN_PIECE_PANELS: usize = 4;

/// What packing one value costs, in multiply-adds: a packed value is loaded and stored once,
/// about as long as 16 to 32 multiply-adds of a vector FMA unit take.
const PACK_COST: u64 = 24;

/// A cut of an `m × n` product into `row_groups × panel_groups` pieces (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProductSplit {
    m: usize,
    n: usize,
    mr: usize,
    nr: usize,
    /// Runs of micro-panels, `1 ≤ row_groups ≤ max(1, ceil(m / mr))`.
    pub row_groups: usize,
    /// Runs of panels, `1 ≤ panel_groups ≤ max(1, ceil(n / nr))`.
    pub panel_groups: usize,
}

impl ProductSplit {
    /// The product as one piece.
    pub fn whole(m: usize, n: usize, mr: usize, nr: usize) -> ProductSplit {
        ProductSplit {
            m,
            n,
            mr,
            nr,
            row_groups: 1,
            panel_groups: 1,
        }
    }

    /// The cut of an `m × n × k` product for `threads` threads and kernel tiles of `mr × nr`
    /// (see the module's doc).
    pub fn choose(
        [m, n, k]: [usize; 3],
        [mr, nr]: [usize; 2],
        threads: usize,
        shared: Shared,
    ) -> ProductSplit {
        let (mr, nr) = (mr.max(1), nr.max(1));
        let micro_panels = m.div_ceil(mr).max(1);
        let panels = n.div_ceil(nr).max(1);
        let threads = threads.max(1);
        let mut best = ProductSplit::whole(m, n, mr, nr);
        if threads == 1 || m == 0 || n == 0 {
            return best;
        }
        // Every candidate cut and its estimate.
        let mut candidates = Vec::new();
        // More pieces than 4 per thread never shorten the slowest thread by much.
        let most = 4 * threads;
        for row_groups in 1..=micro_panels.min(most) {
            for panel_groups in 1..=panels.min(most / row_groups) {
                let split = ProductSplit {
                    row_groups,
                    panel_groups,
                    ..best
                };
                let rows = micro_panels.div_ceil(row_groups) * mr;
                let cols = panels.div_ceil(panel_groups) * nr;
                let own = match shared {
                    Shared::B => rows,
                    Shared::A => cols,
                    Shared::Neither => 0,
                };
                let piece = (rows as u64 * cols as u64 + PACK_COST * own as u64) * k.max(1) as u64;
                let rounds = split.pieces().div_ceil(threads) as u64;
                candidates.push((split, rounds.saturating_mul(piece)));
            }
        }
        let least = candidates.iter().map(|c| c.1).min().unwrap_or(0);
        // Within the estimate's error (a tenth) of the best, every thread should get a piece:
        // the most pieces up to the thread count, then the lowest estimate, then the most
        // pieces (up to 4 per thread, see `most`) that keep at least `MIN_PIECE_PANELS` panels
        // each, then the fewest. (Pieces that pack an operand twice cost more by the estimate,
        // so they never tie.)
        let mut best_key = None;
        for (split, cost) in candidates {
            if cost.saturating_mul(10) > least.saturating_mul(11) {
                continue;
            }
            // More pieces only while each keeps `MIN_PIECE_PANELS` panels; else the fewest.
            let keeps_panels = panels.div_ceil(split.panel_groups) >= MIN_PIECE_PANELS;
            let finer = if keeps_panels { split.pieces() } else { 0 };
            let key = (
                std::cmp::Reverse(split.pieces().min(threads)),
                cost,
                std::cmp::Reverse(finer),
                split.pieces(),
            );
            if best_key.as_ref().is_none_or(|b| key < *b) {
                (best, best_key) = (split, Some(key));
            }
        }
        best
    }

    /// The cut of an `m × n` product into `row_groups × panel_groups` pieces, each clamped to
    /// what the product has (at least 1, at most its micro-panels and panels): a cut
    /// max-autotune timed.
    pub fn with_groups(
        [m, n]: [usize; 2],
        [mr, nr]: [usize; 2],
        row_groups: usize,
        panel_groups: usize,
    ) -> ProductSplit {
        let (mr, nr) = (mr.max(1), nr.max(1));
        ProductSplit {
            m,
            n,
            mr,
            nr,
            row_groups: row_groups.clamp(1, m.div_ceil(mr).max(1)),
            panel_groups: panel_groups.clamp(1, n.div_ceil(nr).max(1)),
        }
    }

    pub fn pieces(&self) -> usize {
        self.row_groups * self.panel_groups
    }

    /// The rows of piece `p` (whole micro-panels; the last piece of a column may hold the
    /// short last one). Pieces `p` with the same `p / panel_groups` share their rows.
    pub fn rows(&self, p: usize) -> std::ops::Range<usize> {
        let group = p / self.panel_groups;
        let micro_panels = self.m.div_ceil(self.mr);
        let start = micro_panels * group / self.row_groups * self.mr;
        let end = micro_panels * (group + 1) / self.row_groups * self.mr;
        start.min(self.m)..end.min(self.m)
    }

    /// The panels of piece `p` (of `ceil(n / nr)`).
    pub fn panels(&self, p: usize) -> std::ops::Range<usize> {
        let group = p % self.panel_groups;
        let panels = self.n.div_ceil(self.nr);
        panels * group / self.panel_groups..panels * (group + 1) / self.panel_groups
    }

    /// The `[m, n]` of the product this cut is for.
    pub fn shape(&self) -> [usize; 2] {
        [self.m, self.n]
    }

    /// The time the slowest thread takes, in multiply-adds, when `threads` threads run the
    /// pieces in rounds (each thread one piece a round: `ceil(pieces / threads)` rounds of the
    /// largest piece), packing not counted: what a cut's balance alone costs.
    pub fn slowest_thread(&self, k: usize, threads: usize) -> u64 {
        let largest = self.work(k).into_iter().max().unwrap_or(0);
        let rounds = self.pieces().div_ceil(threads.max(1)) as u64;
        largest.saturating_mul(rounds)
    }

    /// The multiply-adds of every piece of a product of depth `k`.
    pub fn work(&self, k: usize) -> Vec<u64> {
        (0..self.pieces())
            .map(|p| {
                let panels = self.panels(p);
                let cols =
                    (panels.end * self.nr).min(self.n) - (panels.start * self.nr).min(self.n);
                self.rows(p).len() as u64 * cols as u64 * k as u64
            })
            .collect()
    }
}

/// Splits `0..units` (equal units of work) into the runs of one step's pieces for `threads`
/// threads: one run per thread while there are units enough, else one per unit.
pub fn unit_runs(units: usize, threads: usize) -> Vec<std::ops::Range<usize>> {
    let chunks = threads.max(1).min(units).max(1);
    (0..chunks)
        .map(|c| units * c / chunks..units * (c + 1) / chunks)
        .collect()
}

/// Into how many parts each of `images` images (of `units` equal units of work each) is cut
/// for `threads` threads, as for a product: the slowest thread's estimate (`ceil(images ·
/// parts / threads)` rounds of `ceil(units / parts)` units) within a tenth of the best, the
/// most pieces up to the thread count, then the fewest parts. 1 keeps images whole (then runs
/// of images are the pieces).
pub fn image_parts(images: usize, units: usize, threads: usize) -> usize {
    let threads = threads.max(1);
    if threads == 1 || images == 0 || units <= 1 {
        return 1;
    }
    let cost = |parts: usize| {
        let rounds = if parts == 1 {
            images.div_ceil(threads)
        } else {
            (images * parts).div_ceil(threads)
        };
        rounds * units.div_ceil(parts)
    };
    let most = units.min((4 * threads).div_ceil(images));
    let least = (1..=most).map(cost).min().unwrap_or(0);
    (1..=most)
        .filter(|&p| cost(p) * 10 <= least * 11)
        .min_by_key(|&p| {
            let pieces = if p == 1 {
                images.min(threads)
            } else {
                images * p
            };
            (std::cmp::Reverse(pieces.min(threads)), cost(p), p)
        })
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn imbalance(work: &[u64]) -> f64 {
        let total: u64 = work.iter().sum();
        *work.iter().max().unwrap() as f64 * work.len() as f64 / total as f64
    }

    #[test]
    fn every_row_and_column_is_in_exactly_one_piece() {
        for &(m, n, threads) in &[(1024, 1408, 64), (256, 4096, 16), (7, 5, 3), (1, 1000, 8)] {
            for shared in [Shared::A, Shared::B] {
                let split = ProductSplit::choose([m, n, 64], [6, 64], threads, shared);
                let mut seen = vec![0u8; m * n.div_ceil(64)];
                for p in 0..split.pieces() {
                    for i in split.rows(p) {
                        for q in split.panels(p) {
                            seen[i * n.div_ceil(64) + q] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "{m}x{n} on {threads}");
            }
        }
    }

    #[test]
    fn the_suite_shapes_get_enough_equal_pieces() {
        // The LLaMA block's [1024, 512] · [512, 1408] (22 panels of 64 columns) and the MLP's
        // [256, 1024] · [1024, 4096], for the AVX-512 kernel's 6 × 64 tiles.
        for (m, n, k) in [(1024, 1408, 512), (256, 4096, 1024), (1024, 512, 1408)] {
            for threads in [16, 64] {
                for shared in [Shared::A, Shared::B] {
                    let split = ProductSplit::choose([m, n, k], [6, 64], threads, shared);
                    let work = split.work(k);
                    assert!(work.len() >= threads, "{m}x{n}x{k} on {threads}: {split:?}");
                    assert!(
                        imbalance(&work) <= 1.15,
                        "{m}x{n}x{k} on {threads}: {split:?} {}",
                        imbalance(&work)
                    );
                }
            }
        }
    }

    #[test]
    fn extra_pieces_keep_several_panels() {
        // The MLP's [256, 1024] · [1024, 4096] streamed (a shared) on 2 threads: 64 panels cut
        // into up to 4 pieces a thread, every piece all rows of a (b packed once).
        let split = ProductSplit::choose([256, 4096, 1024], [6, 64], 2, Shared::A);
        assert_eq!((split.row_groups, split.panel_groups), (1, 8), "{split:?}");
        // [288, 1024] · [1024, 4096] (48 micro-panels) with b shared: extra pieces cut the
        // rows, each packing its own.
        let split = ProductSplit::choose([288, 4096, 1024], [6, 64], 2, Shared::B);
        assert_eq!(split.panel_groups, 1, "{split:?}");
        assert!(split.pieces() > 2, "{split:?}");
        // [1024, 512] · [512, 512] streamed: 8 panels keep 4 a piece, one piece a thread.
        let split = ProductSplit::choose([1024, 512, 512], [6, 64], 2, Shared::A);
        assert_eq!((split.row_groups, split.panel_groups), (1, 2), "{split:?}");
        // Every cut still has a piece for each thread where it can.
        for threads in 1..=8 {
            for (m, n) in [(256, 4096), (1024, 512), (1024, 256)] {
                for shared in [Shared::A, Shared::B] {
                    let split = ProductSplit::choose([m, n, 512], [6, 64], threads, shared);
                    assert!(split.pieces() >= threads, "{m}x{n} on {threads}: {split:?}");
                }
            }
        }
    }

    #[test]
    fn one_thread_or_a_tiny_product_is_one_piece() {
        assert_eq!(
            ProductSplit::choose([512, 512, 512], [6, 64], 1, Shared::B).pieces(),
            1
        );
        assert_eq!(product_threads(1000, 16), 1);
        assert_eq!(product_threads(PARALLEL_FLOPS_THRESHOLD, 16), 16);
    }
}
