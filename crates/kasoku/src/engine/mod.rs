//! Sessions, sampling, the decode loop and its statistics.
