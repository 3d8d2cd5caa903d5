//! Sessions, sampling, the decode loop and its statistics.

pub mod sampler;
pub mod stats;
pub mod stop;
