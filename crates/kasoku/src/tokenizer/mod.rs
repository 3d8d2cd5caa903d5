//! Tokenizers (from GGUF metadata or tokenizer.json) and chat templates.
//! (Owner: tokenizer helper. Stub until implemented.)
