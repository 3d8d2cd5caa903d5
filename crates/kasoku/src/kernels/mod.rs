//! CPU compute kernels. Each kernel has a portable path and, where it pays, SIMD paths picked
//! from the instruction set detected once at startup ([`simd::Isa`]); the paths compute the
//! same function and are tested against each other. Each op is a folder: `mod.rs` (its API
//! and portable code), its SIMD files (`avx2.rs`, `vnni.rs`) and `tests.rs`; the matrix
//! products have one folder per format family, each implementing `matmul::Format`. [`fused`]
//! holds the epilogues (RMSNorm, SwiGLU, attention) that write the rotated int8 activations of
//! kasoku's formats directly for the next product.
//!
//! Tasks on the worker pool ([`threads`]) write their outputs through [`threads::parts`], so
//! kernels hold no raw pointers; memory is reused from call to call (`scratch`, and work areas
//! that the caller lends the pool's threads), so a call whose shapes were seen before
//! allocates nothing, on any thread (`tests/kernels_no_alloc.rs`). Every `unsafe` block says
//! why it is sound (clippy's `undocumented_unsafe_blocks`, denied for the whole workspace in
//! the root Cargo.toml).

pub mod activation;
pub mod attention;
pub mod conv1d;
pub mod fused;
pub mod gated_delta;
pub mod matmul;
pub mod norm;
pub mod rope;
mod scratch;
pub mod simd;
pub mod threads;
