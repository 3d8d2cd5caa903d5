//! The mutator: turns a seed into a nearby input. Each call applies one to four of: bit flips,
//! random bytes, an "interesting" integer (0, -1, 2^7..2^63 edges) written little-endian over
//! 1/2/4/8 bytes (GGUF and safetensors headers are little-endian counts and offsets), the
//! same as decimal text over a run of ASCII digits (JSON numbers), byte insertion and deletion,
//! a duplicated or removed chunk, splicing with another seed, a word of the target's dictionary
//! (keywords of its format) inserted or written over, and truncation. Edits land in the
//! first 8 KiB three times out of four: that is where every format keeps its structure (GGUF
//! metadata, safetensors header, JSON), while tensor data beyond is plain numbers.

/// A small, fast, seedable generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Integers that sit on edges: zero, one, sign bits, all ones, powers of two near limits.
const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    7,
    8,
    16,
    31,
    32,
    64,
    127,
    128,
    255,
    256,
    1023,
    1024,
    4095,
    4096,
    32767,
    32768,
    65535,
    65536,
    1 << 20,
    1 << 24,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    1 << 40,
    (1 << 63) - 1,
    1 << 63,
    u64::MAX,
    u64::MAX - 1,
];

/// Offsets edits prefer (where the structure is).
const HEAD: usize = 8 << 10;

/// A position in `0..=len` for an edit, within the first [`HEAD`] bytes 3 times out of 4.
fn position(rng: &mut Rng, len: usize) -> usize {
    if len > HEAD && !rng.chance(4) {
        rng.below(HEAD + 1)
    } else {
        rng.below(len + 1)
    }
}

/// One mutation of `data` (the others: seeds to splice with; words: the target's dictionary).
fn mutate_once(data: &mut Vec<u8>, others: &[&[u8]], words: &[&str], rng: &mut Rng) {
    let len = data.len();
    match rng.below(12) {
        // A dictionary word, inserted or written over.
        9 | 10 if !words.is_empty() => {
            let word = words[rng.below(words.len())].as_bytes();
            let at = position(rng, len);
            if rng.chance(2) {
                data.splice(at..at, word.iter().copied());
            } else {
                let end = (at + word.len()).min(len);
                data.splice(at..end, word.iter().copied());
            }
        }
        // Flip a bit.
        0 if len > 0 => {
            let at = position(rng, len - 1);
            data[at] ^= 1 << rng.below(8);
        }
        // A random byte.
        1 if len > 0 => {
            let at = position(rng, len - 1);
            data[at] = rng.next_u64() as u8;
        }
        // An interesting integer, little-endian, 1/2/4/8 bytes, maybe negated.
        2 | 3 if len > 0 => {
            let mut v = INTERESTING[rng.below(INTERESTING.len())];
            if rng.chance(4) {
                v = v.wrapping_neg();
            }
            let width = [1, 2, 4, 8][rng.below(4)];
            let at = position(rng, len.saturating_sub(width));
            let end = (at + width).min(len);
            data[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
        }
        // An interesting integer as decimal text over a run of digits (JSON numbers).
        4 if len > 0 => {
            let at = position(rng, len - 1);
            let Some(start) = (at..len).find(|&i| data[i].is_ascii_digit()) else {
                return;
            };
            let end = (start..len)
                .find(|&i| !data[i].is_ascii_digit())
                .unwrap_or(len);
            let v = INTERESTING[rng.below(INTERESTING.len())];
            let text = match rng.below(4) {
                0 => format!("-{v}"),
                1 => format!("{v}e300"),
                _ => v.to_string(),
            };
            data.splice(start..end, text.into_bytes());
        }
        // Insert random bytes.
        5 => {
            let at = position(rng, len);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, bytes);
        }
        // Delete bytes.
        6 if len > 0 => {
            let at = position(rng, len - 1);
            let n = (1 + rng.below(16)).min(len - at);
            data.drain(at..at + n);
        }
        // Duplicate a chunk.
        7 if len > 0 => {
            let at = position(rng, len - 1);
            let n = (1 + rng.below(64)).min(len - at);
            let chunk = data[at..at + n].to_vec();
            let to = position(rng, len);
            data.splice(to..to, chunk);
        }
        // Splice: our head, another seed's tail.
        8 if !others.is_empty() => {
            let other = others[rng.below(others.len())];
            let cut = position(rng, len);
            let from = rng.below(other.len() + 1);
            data.truncate(cut);
            data.extend_from_slice(&other[from..]);
        }
        // Truncate.
        _ => {
            let cut = position(rng, len);
            data.truncate(cut);
        }
    }
}

/// A mutant of `seed`: one to four mutations.
pub fn mutate(seed: &[u8], others: &[&[u8]], words: &[&str], rng: &mut Rng) -> Vec<u8> {
    let mut data = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        mutate_once(&mut data, others, words, rng);
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutants_differ_and_stay_near_the_seed() {
        let seed: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let other = b"{\"a\": 12345}".to_vec();
        let mut rng = Rng::new(7);
        let (mut changed, mut words) = (0, 0);
        for _ in 0..1000 {
            let m = mutate(&seed, &[&other], &["word"], &mut rng);
            changed += usize::from(m != seed);
            assert!(m.len() <= seed.len() + 4 * 64);
            words += usize::from(m.windows(4).any(|w| w == b"word"));
        }
        assert!(changed > 950, "{changed}");
        assert!(words > 100, "{words}");
        // Decimal edits rewrite numbers in JSON text.
        let mut numbers = 0;
        for _ in 0..2000 {
            let m = mutate(&other, &[], &[], &mut rng);
            let text = String::from_utf8_lossy(&m);
            numbers += usize::from(!text.contains("12345") && text.contains("{\"a\": "));
        }
        assert!(numbers > 20, "{numbers}");
    }
}
