//! What the worker's generation loops share about a request ([`super::serve`]'s for a draft model,
//! n-gram speculation or the target alone, [`super::mtp_serve`]'s for MTP): its prompts as tokens,
//! cut to fit the context, and the answer for a stage that failed.

use crate::llama::Model;
use crate::worker::protocol::{Response, SpeculateRequest};

/// The worker's answer when a request's `stage` (load, context, tokenize, decode…) failed.
pub(in crate::speculative) fn failed(stage: &str, message: impl Into<String>) -> Response {
    Response::Failed {
        stage: stage.into(),
        message: message.into(),
    }
}

/// The request's prompts as tokens, each cut so that the generation (and, with a fault, the stale
/// cells it leaves) still fits the context.
pub(in crate::speculative) fn prompt_set(
    model: &Model,
    r: &SpeculateRequest,
) -> Result<Vec<Vec<i32>>, Response> {
    let n_max = r
        .draft
        .as_ref()
        .map(|(_, p)| p.n_max)
        .or(r.ngram.map(|p| p.size_m))
        .or(r.mtp.map(|p| p.n_max))
        .unwrap_or(0);
    let mut reserve = r.n_gen + n_max + 2;
    if r.fault.is_some() {
        // Rejected tokens left in the cache take positions too: at most n_max per round.
        reserve += r.n_gen * n_max;
    }
    // Each sequence holds its share of the context (llama.cpp's KV streams, not unified).
    let per_sequence = r.context.n_ctx / r.context.sequences.max(1);
    let mut prompts = Vec::with_capacity(r.prompts.len());
    for text in &r.prompts {
        match prompt_tokens(model, text, per_sequence.saturating_sub(reserve)) {
            Ok(t) => prompts.push(t),
            Err(e) => return Err(failed("tokenize", e)),
        }
    }
    if prompts.is_empty() {
        return Err(failed("settings", "no prompts"));
    }
    Ok(prompts)
}

/// The prompt's tokens with BOS where the vocabulary wants one, cut to its last `max` tokens.
fn prompt_tokens(model: &Model, text: &str, max: u32) -> Result<Vec<i32>, String> {
    let mut tokens = model.tokenize(text)?;
    let bos = model.add_bos().then(|| model.bos()).filter(|&b| b >= 0);
    let room = (max as usize)
        .saturating_sub(usize::from(bos.is_some()))
        .max(1);
    if tokens.len() > room {
        tokens.drain(..tokens.len() - room);
    }
    let mut out: Vec<i32> = bos.into_iter().collect();
    out.extend(tokens);
    if out.is_empty() {
        return Err("the prompt has no tokens".into());
    }
    Ok(out)
}
