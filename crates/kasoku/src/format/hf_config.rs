//! Hugging Face config.json / generation_config.json reading (text_config nesting).
//! (Owner: format helper. Stub until implemented.)
