//! One prompt's greedy generation, with a draft model, an n-gram draft or the target alone: the
//! draft proposes, the target checks the proposal in one batch, both caches roll back what it
//! rejected, and the accepted tokens are taken (the loop this module's parent describes).

use crate::llama::{Context, LlamaError, Model};
use crate::speculative::logits::{top_with_probability, Choice};
use crate::speculative::round::{rollback_failed, take, target_choices, Generation};
use crate::speculative::DraftParams;
use crate::worker::protocol::{Fault, PromptRun};
use std::time::Instant;

/// One prompt: prompt processing, then greedy generation with or without a draft, one round (draft,
/// check in one batch, roll back the rejected positions, take the accepted tokens) at a time.
pub(super) fn generate(
    model: &Model,
    target: &mut Context,
    mut draft: Option<(&mut Context, DraftParams)>,
    prompt: &[i32],
    g: &Generation,
) -> Result<PromptRun, LlamaError> {
    let n_gen = g.n_gen;
    let mut run = PromptRun {
        prompt_tokens: prompt.len() as u32,
        ..PromptRun::default()
    };
    let first_choice = process_prompt(
        target,
        draft.as_mut().map(|(d, _)| &mut **d),
        prompt,
        g,
        &mut run,
    )?;
    let first = g.followed(0).unwrap_or(first_choice.token());
    let mut seq: Vec<i32> = prompt.to_vec();
    seq.push(first);
    run.tokens.push(first);
    run.choices.push(first_choice);
    // Cells the target's cache holds beyond `seq` (only with a fault): positions carry on after them.
    let mut stale = 0usize;
    let t = Instant::now();
    while run.tokens.len() < n_gen && !model.is_eog(*run.tokens.last().expect("one token")) {
        // The target's cache holds seq[..n_past] (plus `stale` cells); seq[n_past] is the last
        // accepted token.
        let n_past = seq.len() - 1;
        let wanted = n_gen - run.tokens.len() - 1;
        let mut drafted: Vec<i32> = Vec::new();
        if let Some((d, p)) = draft.as_mut() {
            drafted = propose(d, p, &seq, wanted)?;
        } else if let Some(p) = g.ngram {
            // The server's history: the cached tokens, then the last accepted one.
            drafted = crate::speculative::ngram::draft(p, &seq[..n_past], seq[n_past]);
            drafted.truncate(wanted);
        }
        let pos0 = n_past + stale;
        let choices = target_choices(target, seq[n_past], &drafted, pos0, g, run.tokens.len())?;
        if let Some((d, _)) = draft.as_mut() {
            reevaluate(d, seq[n_past], &drafted, n_past)?;
        }
        let accepted = choices.len() - 1;
        run.rounds += 1;
        run.drafted += drafted.len() as u32;
        run.accepted += accepted as u32;
        // Keep the last token and the accepted draft; the rejected positions leave both caches.
        stale += roll_back_target(
            target,
            pos0 + 1 + accepted,
            drafted.len() - accepted,
            g.fault,
        )?;
        if let Some((d, _)) = draft.as_mut() {
            if accepted < drafted.len() && !d.truncate((n_past + 1 + accepted) as i32) {
                return Err(rollback_failed("draft"));
            }
        }
        take(model, &mut run, &mut seq, choices, &drafted[..accepted], g);
    }
    target.synchronize();
    run.gen_seconds = t.elapsed().as_secs_f64();
    Ok(run)
}

/// Prompt processing: the target decodes the prompt (timed) and makes its first choice; the draft,
/// if any, decodes the prompt too.
fn process_prompt(
    target: &mut Context,
    draft: Option<&mut Context>,
    prompt: &[i32],
    g: &Generation,
    run: &mut PromptRun,
) -> Result<Choice, LlamaError> {
    target.clear();
    let t = Instant::now();
    target.decode_at(prompt, 0, false)?;
    target.synchronize();
    run.prompt_seconds = t.elapsed().as_secs_f64();
    let first_choice = g.observe(target.last_logits(), 0);
    if let Some(d) = draft {
        d.clear();
        let t = Instant::now();
        d.decode_at(prompt, 0, false)?;
        d.synchronize();
        run.draft_prompt_seconds = t.elapsed().as_secs_f64();
    }
    Ok(first_choice)
}

/// The draft model's proposal after `seq`, whose last token is not in its cache yet: it decodes that
/// token, then its greedy tokens while its top probability stays at or above p_min, at most n_max
/// (and at most `wanted`), none when fewer than n_min; its cache then drops them all again, as the
/// server's does (the checked batch comes back in [`reevaluate`]).
fn propose(
    d: &mut Context,
    p: &DraftParams,
    seq: &[i32],
    wanted: usize,
) -> Result<Vec<i32>, LlamaError> {
    let mut drafted: Vec<i32> = Vec::new();
    // Drafting more than the tokens still wanted is wasted work.
    let cap = (p.n_max as usize).min(wanted);
    if cap == 0 {
        return Ok(drafted);
    }
    let n_past = seq.len() - 1;
    d.decode_at(&seq[n_past..], n_past as i32, false)?;
    loop {
        let (token, prob) = top_with_probability(d.last_logits());
        if prob < p.p_min {
            break;
        }
        drafted.push(token);
        if drafted.len() >= cap {
            break;
        }
        d.decode_at(&[token], (n_past + drafted.len()) as i32, false)?;
    }
    if !d.truncate(n_past as i32) {
        return Err(rollback_failed("draft"));
    }
    if drafted.len() < p.n_min as usize {
        drafted.clear();
    }
    Ok(drafted)
}

/// The draft decodes the batch the target just checked (the last accepted token and the draft, at
/// `n_past`), as llama-server re-evaluates each of the target's batches on the draft.
fn reevaluate(
    d: &mut Context,
    last: i32,
    drafted: &[i32],
    n_past: usize,
) -> Result<(), LlamaError> {
    let mut batch = Vec::with_capacity(drafted.len() + 1);
    batch.push(last);
    batch.extend_from_slice(drafted);
    d.decode_at(&batch, n_past as i32, false)
}

/// Drops the `rejected` draft positions from the target's cache, keeping `keep` cells, except those
/// a test fault leaves behind; returns how many stale cells stay.
fn roll_back_target(
    target: &mut Context,
    keep: usize,
    rejected: usize,
    fault: Option<Fault>,
) -> Result<usize, LlamaError> {
    if rejected == 0 {
        return Ok(0);
    }
    let kept_stale = match fault {
        None => 0,
        Some(Fault::KeepOneRejectedCell) => 1,
        Some(Fault::KeepRejectedCells) => rejected,
    };
    if kept_stale < rejected && !target.truncate((keep + kept_stale) as i32) {
        return Err(rollback_failed("target"));
    }
    Ok(kept_stale)
}
