//! CPU compute kernels. Each kernel has a portable path and, where it pays, an AVX2/FMA path
//! chosen at run time; both compute the same function and are tested against each other.

pub mod activation;
pub mod attention;
pub mod conv1d;
pub mod gated_delta;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod threads;
