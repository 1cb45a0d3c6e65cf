//! The pass pipeline: `decompose` → `autodiff` → `simplify` → `partition` (joint graphs) → `fuse` → `fuse_horizontal` → `fuse_epilogues`
//! → `store_once` → `choose_loop_order` → `plan_buffers`, `verify_program` (the kernel-IR verifier, run after each
//! kernel-IR pass and before code generation), the kernel IR that `fuse` produces, and
//! `program_cost`, a static cost model
//! of that IR.
//!
//! Each pass is one file with one entry function from one data structure to the next; each data
//! structure prints as text.

mod attention;
mod autodiff;
pub mod cost;
mod decompose;
mod epilogue;
mod freeze;
mod fuse;
mod horizontal;
pub mod kernel;
mod loop_order;
mod parse_program;
mod partition;
pub mod plan_buffers;
mod simplify;
mod store_once;
mod verify;

pub use autodiff::{autodiff, AutodiffError, Joint};
pub use cost::program_cost;
pub use decompose::decompose;
pub use epilogue::fuse_epilogues;
pub use freeze::{freeze, Frozen};
pub use fuse::{fuse, FuseError};
pub use horizontal::fuse_horizontal;
pub use loop_order::{choose_loop_order, wants_outer_reduction};
pub use parse_program::parse_kernel;
pub use partition::{partition, Partition, PartitionOptions, SavedValue};
pub use plan_buffers::plan_buffers;
pub use simplify::simplify;
pub use store_once::store_once;
pub use verify::{program_dims, verify_program, VerifyError};
