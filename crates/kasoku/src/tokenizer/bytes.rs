//! Token → bytes: the text each token stands for, as raw bytes (a token may hold part of a
//! UTF-8 character). Byte-level BPE vocabularies spell bytes with GPT-2's printable alphabet;
//! SentencePiece vocabularies write spaces as `▁` and unknown bytes as `<0xNN>` tokens.

use std::collections::HashMap;

/// How a vocabulary spells the bytes of its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelling {
    /// GPT-2 byte-level BPE (`Ġ` is a space, `Ċ` a newline...).
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xNN>` is byte NN.
    SentencePiece,
    /// Tokens are their own UTF-8 text.
    Plain,
}

/// GPT-2's byte → printable character map: printable Latin-1 bytes map to themselves, the
/// other 68 bytes to U+0100.. in byte order.
pub fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            b as char
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are chars");
            next += 1;
            c
        };
    }
    map
}

/// The inverse of [`byte_to_char`].
pub fn char_to_byte() -> HashMap<char, u8> {
    byte_to_char()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// Parses a SentencePiece byte token `<0xNN>`.
pub fn parse_byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The bytes of one vocabulary token. `verbatim` tokens (control and user-defined tokens) are
/// their own text whatever the spelling.
pub fn token_bytes(
    piece: &str,
    spelling: Spelling,
    verbatim: bool,
    inverse: &HashMap<char, u8>,
) -> Vec<u8> {
    if verbatim {
        return piece.as_bytes().to_vec();
    }
    match spelling {
        Spelling::ByteLevel => {
            let mapped: Option<Vec<u8>> = piece.chars().map(|c| inverse.get(&c).copied()).collect();
            // A token outside the byte alphabet is taken as literal text.
            mapped.unwrap_or_else(|| piece.as_bytes().to_vec())
        }
        Spelling::SentencePiece => match parse_byte_token(piece) {
            Some(b) => vec![b],
            None => piece.replace('\u{2581}', " ").into_bytes(),
        },
        Spelling::Plain => piece.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_alphabet() {
        let m = byte_to_char();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[b'\t' as usize], 'ĉ');
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(m[0xAD], 'Ń');
        let inv = char_to_byte();
        assert_eq!(inv.len(), 256);
        assert_eq!(
            token_bytes("ĠHello", Spelling::ByteLevel, false, &inv),
            b" Hello"
        );
        assert_eq!(
            token_bytes("ĠðŁ", Spelling::ByteLevel, false, &inv),
            [b' ', 0xF0, 0x9F]
        );
        assert_eq!(
            token_bytes("<|im_end|>", Spelling::ByteLevel, true, &inv),
            b"<|im_end|>"
        );
    }

    #[test]
    fn sentencepiece_pieces() {
        let inv = char_to_byte();
        assert_eq!(
            token_bytes("▁Hello▁world", Spelling::SentencePiece, false, &inv),
            b" Hello world"
        );
        assert_eq!(
            token_bytes("<0x0A>", Spelling::SentencePiece, false, &inv),
            b"\n"
        );
        assert_eq!(
            token_bytes("<0xE6>", Spelling::SentencePiece, false, &inv),
            [0xE6]
        );
        assert_eq!(parse_byte_token("<0xZZ>"), None);
        assert_eq!(parse_byte_token("<0x1>"), None);
    }
}
