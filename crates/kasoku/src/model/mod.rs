//! Architectures assembled from parts (embedding, mixers, MLP, head) and their per-layer state.
//! (Owner: model helper. Stub until implemented.)
