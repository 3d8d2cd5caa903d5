//! Whole generations on the GPU for the checks and benchmarks: greedy plain decoding, and
//! speculative decoding with prompt lookup or a drafter, whose output must equal plain
//! decoding's token for token.

use super::*;

pub fn generate_plain(
    m: &CudaModel,
    st: &mut CudaState,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    generate_greedy(m, st, prompt, n, None, &mut |t| {
        out.push(t);
        true
    })?;
    Ok(out)
}

/// Statistics of a speculative run.
#[derive(Clone, Debug, Default)]
pub struct SpecRun {
    pub tokens: Vec<u32>,
    pub passes: usize,
    pub drafted: usize,
    pub accepted: usize,
}

/// Greedy speculative decoding on the GPU with `drafter` (which runs on the host): per cycle
/// one verification (one graph launch, one synchronisation) and a queued commit. The output
/// equals [`generate_plain`]'s token for token (each row's arithmetic is batch-invariant).
pub fn generate_speculative(
    m: &CudaModel,
    st: &mut CudaState,
    prompt: &[u32],
    n: usize,
    drafter: &mut dyn kasoku::spec::Drafter,
    budget: usize,
    max_depth: usize,
) -> Result<SpecRun> {
    let mut tokens = Vec::new();
    let mut run = generate_greedy(
        m,
        st,
        prompt,
        n,
        Some(Drafting {
            drafter,
            budget,
            max_depth,
        }),
        &mut |t| {
            tokens.push(t);
            true
        },
    )?;
    run.tokens = tokens;
    Ok(run)
}

/// A drafter for [`generate_greedy`] and the size of the trees it may propose.
pub struct Drafting<'a> {
    pub drafter: &'a mut dyn kasoku::spec::Drafter,
    /// Most draft nodes besides the root.
    pub budget: usize,
    /// Deepest draft path.
    pub max_depth: usize,
}

/// Greedy decoding on the GPU after `prompt` (appended to what `st` holds), at most `n`
/// tokens, each handed to `on_token` as soon as it is known; `on_token` returning false
/// stops the generation there (tokens already verified after it are not emitted). With a
/// drafter, each cycle verifies its tree in one pass; the tokens are the same either way.
/// The returned counts' `tokens` is left empty (the caller has them).
pub fn generate_greedy(
    m: &CudaModel,
    st: &mut CudaState,
    prompt: &[u32],
    n: usize,
    mut drafting: Option<Drafting<'_>>,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<SpecRun> {
    use kasoku::spec::{Accepted, DeviceTaps, DraftRequest, Features};
    let err = |e: kasoku::spec::DraftError| Error::Invalid(e.to_string());
    let mut run = SpecRun::default();
    if n == 0 {
        return Ok(run);
    }
    // A drafter reading the target's layer outputs (DFlash) gets them for every prompt row
    // and every committed token.
    let tap_layers = drafting
        .as_ref()
        .map(|d| d.drafter.tap_layers())
        .unwrap_or_default();
    st.set_tap_layers(m, &tap_layers)?;
    let wants_taps = !tap_layers.is_empty();
    // A drafter on this GPU reads the recorded rows in place (a prompt of one pass too):
    // nothing crosses to the host.
    let in_place = wants_taps
        && drafting
            .as_ref()
            .zip(st.device_taps())
            .is_some_and(|(d, v)| {
                d.drafter
                    .reads_device_taps(v as &(dyn std::any::Any + Send + Sync))
            });
    let prompt_in_place = in_place && prompt.len() <= PREFILL_ROWS;
    let (mut taps, mut chunk_taps) = (Vec::new(), Vec::new());
    let mut first = 0;
    for chunk in prompt.chunks(PREFILL_ROWS) {
        first = st.prefill(m, chunk)?;
        if wants_taps && !prompt_in_place {
            let rows: Vec<usize> = (0..chunk.len()).collect();
            st.tap_rows(m, &rows, &mut chunk_taps)?;
            taps.extend_from_slice(&chunk_taps);
        }
    }
    if let Some(d) = drafting.as_mut() {
        let rows: Vec<usize> = (0..prompt.len()).collect();
        let f = match st.device_taps().filter(|_| prompt_in_place) {
            Some(v) => Features {
                device_taps: Some(DeviceTaps {
                    source: v,
                    rows: &rows,
                }),
                ..Features::default()
            },
            None => Features {
                hidden: None,
                taps: wants_taps.then_some(&taps[..]),
                device_taps: None,
            },
        };
        d.drafter.start(prompt, f).map_err(err)?;
    }
    let mut history = prompt.to_vec();
    history.push(first);
    let mut emitted = 1;
    if !on_token(first) {
        return Ok(run);
    }
    while emitted < n {
        let token = *history.last().expect("one token");
        if st.len + 1 >= st.max_len {
            break;
        }
        let Some(d) = drafting.as_mut() else {
            let t = st.step(m, token)?;
            run.passes += 1;
            history.push(t);
            emitted += 1;
            if !on_token(t) {
                break;
            }
            continue;
        };
        let room = (st.max_len - st.len)
            .saturating_sub(1)
            .min(MAX_TREE - 1)
            .min(d.budget);
        d.drafter.catch_up(&history).map_err(err)?;
        let mut tree = d
            .drafter
            .draft(&DraftRequest {
                tokens: &history,
                budget: room,
                max_depth: d.max_depth,
            })
            .map_err(err)?;
        if tree.is_empty() || tree.token(0) != token || tree.len() > room + 1 {
            tree = TokenTree::chain(&[token]);
        }
        let ids = st.verify(m, &tree)?;
        let (mut node, mut path, mut new) = (0, vec![0usize], Vec::new());
        loop {
            let t = ids[node];
            new.push(t);
            match tree.child_with(node, t) {
                Some(c) => {
                    node = c;
                    path.push(c);
                }
                None => break,
            }
        }
        if wants_taps && !in_place {
            st.tap_rows(m, &path, &mut taps)?;
        }
        st.commit(m, &path)?;
        run.passes += 1;
        run.drafted += tree.len() - 1;
        run.accepted += path.len() - 1;
        let committed: Vec<u32> = path.iter().map(|&i| tree.token(i)).collect();
        // In place: the path's rows as the verification recorded them (the commit runs no
        // pass; the drafter's reads queue before the next one).
        let features = match st.device_taps().filter(|_| in_place) {
            Some(v) => Features {
                device_taps: Some(DeviceTaps {
                    source: v,
                    rows: &path,
                }),
                ..Features::default()
            },
            None => Features {
                hidden: None,
                taps: wants_taps.then_some(&taps[..]),
                device_taps: None,
            },
        };
        d.drafter
            .accept(&Accepted {
                tokens: &committed,
                committed_len: st.len,
                features,
            })
            .map_err(err)?;
        history.extend_from_slice(&new);
        for t in new {
            if emitted == n {
                return Ok(run);
            }
            emitted += 1;
            if !on_token(t) {
                return Ok(run);
            }
        }
    }
    Ok(run)
}
