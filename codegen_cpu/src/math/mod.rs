//! The transcendental functions as Cranelift IR: the algorithms live in the kernel library
//! (`minductor_kernels::math`, written once over its `Lanes` trait); [`Em`] implements that
//! trait by emitting instructions into the kernel being built, so a kernel computes `exp`, `erf`,
//! ... inline, bit for bit as the library's ahead-of-time block routines do.

mod clif;
#[cfg(test)]
pub(crate) mod tests;

pub use clif::{emit_math, emit_pow};
pub(crate) use clif::{host_has_fma, Em};
pub use minductor_kernels::math::{block, Lanes, MathFn, GELU_SCALE};
