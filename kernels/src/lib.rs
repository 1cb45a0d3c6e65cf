//! The kernel library: every routine compiled ahead of time with `std::arch` (AVX-512, AVX2, and
//! a portable fallback, chosen at run time from the CPU's features) that compiled programs call.
//!
//! - [`gemm`]: packing, cache blocking and micro-kernels of our GEMM, the implicit GEMM that
//!   packs convolution panels straight from the input, and the Winograd F(2x2, 3x3) convolution;
//! - [`convert`]: f16 and bf16 widened to f32 and narrowed back, a block at a time (with
//!   AVX512_BF16's conversion where the CPU has it);
//! - [`attention`]: the fused scaled-dot-product attention step (online softmax over key blocks);
//! - [`math`]: the transcendental functions written once over [`math::Lanes`] (the code
//!   generator implements it for Cranelift IR) and their ahead-of-time block routines;
//! - [`scatter`]: the scatter-add of `gather`'s and `take_along`'s derivatives;
//! - [`scratch`]: the kernels' scratch buffers (fallible, and guarded in checking mode);
//! - [`transpose`]: copies of transposed views of 2-, 4- and 8-byte elements in register tiles
//!   (16 × 16 for 16-bit elements, and for 32-bit ones on AVX-512; smaller ones on AVX2 and for
//!   64-bit elements).
//!
//! Architecture invariant: this crate knows nothing of graphs, kernel IR or Cranelift. Its
//! entry points take plain slices and shapes, check (or state in their `# Safety` section) the
//! bounds they rely on, and every `unsafe` block says why it is sound.

pub mod attention;
pub mod cache;
pub mod convert;
pub mod gemm;
pub mod math;
pub mod scatter;
pub mod scratch;
pub mod transpose;
