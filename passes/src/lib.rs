//! The pass pipeline: `decompose` → `simplify` → `fuse`, and the kernel IR that `fuse` produces.
//!
//! Each pass is one file with one entry function from one data structure to the next; each data
//! structure prints as text.

mod decompose;
mod fuse;
pub mod kernel;
mod simplify;

pub use decompose::decompose;
pub use fuse::fuse;
pub use simplify::simplify;
