//! The kernel IR: the loop-level program that `fuse` makes from a prim graph and the code
//! generator lowers (Inductor's loop bodies and scheduler nodes, in small).
//!
//! - [`kernel`]: the types: a [`Program`] of [`Step`]s (loop kernels, extern GEMMs, attention,
//!   scatter-adds, fallback steps) over numbered [`Buffer`]s; printed by `Display`;
//! - [`plan`]: the buffer plan (arena slots) that `plan_buffers` attaches to a program;
//! - the text parser (`Program: FromStr`, [`parse_kernel`]): every program prints and parses back;
//! - [`verify_program`]: the verifier run after every kernel-IR pass and before any machine code
//!   runs; it re-derives what it checks and shares no code with the passes it checks;
//! - [`cost`]: a static cost model (bytes moved, FLOPs) of each step.
//!
//! Architecture invariant: this crate depends on the graph IR only. It knows no pass, no machine
//! and no code generator.

pub mod cost;
pub mod kernel;
mod parse;
pub mod plan;
mod verify;

pub use cost::program_cost;
pub use kernel::*;
pub use parse::parse_kernel;
pub use plan::BufferPlan;
pub use verify::{program_dims, verify_program, VerifyError};
