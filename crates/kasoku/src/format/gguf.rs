//! GGUF reader (v2 and v3), memory-mapped: metadata, tensor infos, alignment, validation.
//! (Owner: format helper. Stub until implemented.)
