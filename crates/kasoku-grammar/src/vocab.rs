//! kasoku's tokenizer as llguidance sees it: every token id's bytes in a token trie (control
//! tokens as `0xFF` + their text, which is how llguidance marks special tokens), and
//! tokenization for the text a grammar forces.

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use kasoku::tokenizer::Tokenizer;

/// A tokenizer and its trie over the model's vocabulary.
pub struct Vocab {
    tokenizer: Tokenizer,
    trie: TokTrie,
}

impl Vocab {
    /// `vocab` is the model's vocabulary size (its logits' width, which may exceed the
    /// tokenizer's token count); `eos` the token that ends an answer.
    pub fn new(tokenizer: &Tokenizer, vocab: usize, eos: u32) -> Vocab {
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                if id as usize >= tokenizer.token_count() || bytes.is_empty() {
                    // Padding ids and empty tokens: special tokens no grammar names.
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(format!("<|kasoku_unused_{id}|>").as_bytes());
                    w
                } else if tokenizer.is_control(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(bytes);
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let mut info = TokRxInfo::new(vocab as u32, eos);
        info.tok_bos = tokenizer.bos();
        Vocab {
            tokenizer: tokenizer.clone(),
            trie: TokTrie::from(&info, &words),
        }
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => match self.tokenizer.encode(text, false) {
                Ok(ids) => ids,
                Err(_) => self.trie.greedy_tokenize(s),
            },
            // Part of a character: the trie's greedy spelling.
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
