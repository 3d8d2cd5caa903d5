//! Streaming detokenization: tokens go in one at a time, text comes out only at complete UTF-8
//! characters (a byte-level BPE token or a SentencePiece `<0xNN>` byte token may carry part of
//! a character; the rest follows in later tokens).
//!
//! The stream is a continuation: unlike [`Tokenizer::decode`](super::Tokenizer::decode), it never
//! strips a SentencePiece leading space, since generated text follows a prompt.

use super::Tokenizer;

/// Incremental decoder over one token stream. Owns a (cheap) clone of its tokenizer.
#[derive(Clone)]
pub struct StreamDecoder {
    tokenizer: Tokenizer,
    pending: Vec<u8>,
    skip_special: bool,
}

impl StreamDecoder {
    pub fn new(tokenizer: &Tokenizer) -> StreamDecoder {
        StreamDecoder {
            tokenizer: tokenizer.clone(),
            pending: Vec::new(),
            skip_special: false,
        }
    }

    /// Control tokens (`<|im_end|>`...) produce no text when `skip` is true.
    pub fn skip_special(mut self, skip: bool) -> StreamDecoder {
        self.skip_special = skip;
        self
    }

    /// Feeds one token; returns the text completed by it (often empty mid-character).
    /// Ids outside the vocabulary produce nothing.
    pub fn push(&mut self, id: u32) -> String {
        if self.skip_special && self.tokenizer.is_control(id) {
            return String::new();
        }
        if let Some(bytes) = self.tokenizer.token_bytes(id) {
            self.pending.extend_from_slice(bytes);
        }
        self.take(false)
    }

    /// Ends the stream: returns what is left, with an incomplete trailing character as U+FFFD.
    pub fn flush(&mut self) -> String {
        self.take(true)
    }

    /// Bytes waiting for the rest of a character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    fn take(&mut self, end: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).expect("valid prefix"));
                    match e.error_len() {
                        // Invalid bytes: they can never become a character.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None if !end => {
                            rest = after;
                            break;
                        }
                        None => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &[];
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}
