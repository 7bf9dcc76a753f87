//! One round of the draft-verify loop, the pieces every loop shares (one prompt in
//! [`super::serve`], several at once in [`super::together`], MTP's in [`super::mtp_serve`]): what a
//! generation does besides choosing greedily ([`Generation`]), the target's check of a draft in one
//! batch ([`target_choices`], [`choices_at`]), taking the accepted tokens ([`take`]) and the error
//! when a cache cannot roll back.

use super::logits::{choice, Choice};
use super::ngram::NgramParams;
use crate::llama::{Context, LlamaError, Model};
use crate::worker::protocol::{Fault, PromptRun};

/// What one prompt's generation does besides choosing greedily.
pub(in crate::speculative) struct Generation<'a> {
    /// Tokens to generate (fewer when the text ends).
    pub(in crate::speculative) n_gen: usize,
    /// Feed these tokens instead of the target's choices (no draft).
    pub(in crate::speculative) follow: Option<&'a [i32]>,
    pub(in crate::speculative) fault: Option<Fault>,
    /// Draft by n-gram lookup in the text so far (no draft model).
    pub(in crate::speculative) ngram: Option<NgramParams>,
}

impl Generation<'_> {
    /// The discarded warm-up's generation: a few tokens, nothing followed.
    pub(in crate::speculative) fn warm_up(ngram: Option<NgramParams>) -> Generation<'static> {
        Generation {
            n_gen: 4,
            follow: None,
            fault: None,
            ngram,
        }
    }

    /// The token followed as generated token i, if any.
    pub(in crate::speculative) fn followed(&self, i: usize) -> Option<i32> {
        self.follow.and_then(|f| f.get(i)).copied()
    }

    /// The target's choice for generated token i, with the logit of the token followed there.
    pub(in crate::speculative) fn observe(&self, logits: &[f32], i: usize) -> Choice {
        let mut c = choice(logits);
        if let Some(t) = self.followed(i) {
            c.followed_logit = usize::try_from(t).ok().and_then(|t| logits.get(t)).copied();
        }
        c
    }
}

/// The error when llama.cpp cannot remove positions from the `what` (target or draft) KV cache.
pub(in crate::speculative) fn rollback_failed(what: &str) -> LlamaError {
    LlamaError::Decode {
        status: -1,
        log: format!("llama.cpp could not roll back the {what} KV cache"),
    }
}

/// The target decodes the last accepted token and the draft in one batch at `pos0`: its choice
/// after each accepted draft token, then its own next one (`generated`: the tokens so far).
pub(in crate::speculative) fn target_choices(
    target: &mut Context,
    last: i32,
    drafted: &[i32],
    pos0: usize,
    g: &Generation,
    generated: usize,
) -> Result<Vec<Choice>, LlamaError> {
    let mut batch = Vec::with_capacity(drafted.len() + 1);
    batch.push(last);
    batch.extend_from_slice(drafted);
    target.decode_at(&batch, pos0 as i32, true)?;
    choices_at(target, 0, drafted, g, generated)
}

/// The target's choices after a decode whose outputs from batch index `at` on are one sequence's
/// last accepted token and `drafted`: its choice after each accepted draft token, then its own next
/// one (`generated`: the sequence's tokens so far).
pub(in crate::speculative) fn choices_at(
    target: &Context,
    at: usize,
    drafted: &[i32],
    g: &Generation,
    generated: usize,
) -> Result<Vec<Choice>, LlamaError> {
    let mut choices: Vec<Choice> = Vec::with_capacity(drafted.len() + 1);
    loop {
        let accepted = choices.len();
        let logits = target.logits_ith((at + accepted) as i32);
        if logits.is_empty() {
            return Err(LlamaError::Decode {
                status: -1,
                log: format!("no logits for batch position {}", at + accepted),
            });
        }
        let choice = g.observe(logits, generated + accepted);
        let token = choice.token();
        choices.push(choice);
        if accepted >= drafted.len() || drafted[accepted] != token {
            break;
        }
    }
    Ok(choices)
}

/// Takes a round's tokens into the output, up to n_gen or the end of the text: the accepted draft
/// tokens, which are the target's choices, then the target's next token (or the one followed).
pub(in crate::speculative) fn take(
    model: &Model,
    run: &mut PromptRun,
    seq: &mut Vec<i32>,
    choices: Vec<Choice>,
    accepted: &[i32],
    g: &Generation,
) {
    for (j, choice) in choices.into_iter().enumerate() {
        if run.tokens.len() >= g.n_gen || model.is_eog(*run.tokens.last().expect("one token")) {
            break;
        }
        let token = if j < accepted.len() {
            accepted[j]
        } else {
            g.followed(run.tokens.len()).unwrap_or(choice.token())
        };
        seq.push(token);
        run.tokens.push(token);
        run.choices.push(choice);
    }
}
