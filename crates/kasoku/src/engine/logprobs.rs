//! Log-probabilities of emitted tokens (OpenAI's `logprobs` / `top_logprobs`): the chosen
//! token's log-probability under the model's own next-token distribution (the log-softmax of
//! the raw logits, before temperature, penalties or a grammar mask, as vLLM reports them by
//! default), and the most likely alternatives at that position.

/// The most alternatives a caller may ask for (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One emitted token's log-probability and the `top` most likely tokens at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The emitted token.
    pub token: u32,
    /// Its natural-log probability.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, most likely first (ties: the
    /// smaller id first).
    pub top: Vec<(u32, f32)>,
}

/// The log-probability of `token` and of the `top` most likely tokens under `logits`
/// (at most [`MAX_TOP_LOGPROBS`]). Sums run in f64, so the result does not depend on
/// how the logits were reduced.
pub fn token_logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = if max.is_finite() {
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        f64::from(max) + sum.ln()
    } else {
        // Every logit is -inf (or the vector is empty): nothing has probability.
        f64::INFINITY
    };
    let logprob = |l: f32| (f64::from(l) - log_sum) as f32;
    let chosen = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| logprob(l));

    // The `top` largest logits, kept sorted in a short list: one pass over the vocabulary.
    let top = top.min(MAX_TOP_LOGPROBS).min(logits.len());
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (id, &l) in logits.iter().enumerate() {
            // (A NaN logit is no candidate.)
            if l.is_nan() || best.len() == top && l <= best[top - 1].1 {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (id as u32, l));
            best.truncate(top);
        }
    }
    TokenLogprobs {
        token,
        logprob: chosen,
        top: best.into_iter().map(|(id, l)| (id, logprob(l))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_the_log_softmax_and_the_top_is_sorted() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let lp = token_logprobs(&logits, 4, 3);
        assert_eq!(lp.token, 4);
        assert!((f64::from(lp.logprob) - (0.5 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 0], "ties keep the smaller id first");
        assert!((f64::from(lp.top[2].1) - (1.0 - z.ln())).abs() < 1e-6);
        let total: f64 = logits
            .iter()
            .enumerate()
            .map(|(i, _)| f64::from(token_logprobs(&logits, i as u32, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn degenerate_inputs_give_no_probability_rather_than_panics() {
        let lp = token_logprobs(&[f32::NEG_INFINITY; 3], 1, 2);
        assert_eq!(lp.logprob, f32::NEG_INFINITY);
        assert_eq!(lp.top.len(), 2);
        assert_eq!(token_logprobs(&[0.0; 4], 9, 50).logprob, f32::NEG_INFINITY);
        assert_eq!(token_logprobs(&[0.0; 4], 0, 50).top.len(), 4);
        let large = token_logprobs(&[1e30, 0.0], 0, 1);
        assert_eq!(large.logprob, 0.0);
    }
}
