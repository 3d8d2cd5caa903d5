//! Hugging Face safetensors directories (single file or sharded with an index), memory-mapped.
//! (Owner: format helper. Stub until implemented.)
