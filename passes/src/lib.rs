//! The pass pipeline: `decompose` → `simplify` → `fuse`, the kernel IR that `fuse` produces, and
//! `program_cost`, a static cost model of that IR.
//!
//! Each pass is one file with one entry function from one data structure to the next; each data
//! structure prints as text.

pub mod cost;
mod decompose;
mod fuse;
pub mod kernel;
mod simplify;

pub use cost::program_cost;
pub use decompose::decompose;
pub use fuse::fuse;
pub use simplify::simplify;
