//! The worker side of `draft-mtp`: the draft-verify loop of [`super::serve`] with the target's own
//! multi-token-prediction head as the drafter (llama.cpp's MTP drafter, [`MtpDrafter`]).
//!
//! As llama-server runs it, greedy: the target decodes the prompt and the MTP context catches up
//! on it (`process`); each round the head drafts up to n_max tokens after the last accepted one, its
//! drafting steps leave the MTP cache, the target checks the last token and the draft in one batch
//! (the same [`target_choices`] as a draft model's), the MTP context processes that batch too, is
//! told how many were accepted, and both caches roll back the rejected positions. The baseline is
//! the target alone in [`super::serve`]: the drafter's target context emits hidden states, which a
//! baseline must not pay for.

use super::request::{failed, prompt_set};
use super::round::{rollback_failed, take, target_choices, Generation};
use super::together::{self, Slot};
use crate::llama::{ContextSettings, LlamaError, Model, MtpDrafter, MtpWant, SeqToken};
use crate::worker::protocol::{MtpParams, PromptRun, Response, SpeculateAnswer, SpeculateRequest};
use std::sync::Arc;
use std::time::Instant;

/// A drafter kept between requests with the settings it was made for.
pub struct Drafter {
    context: ContextSettings,
    params: MtpParams,
    drafter: MtpDrafter,
}

/// What is wrong with an MTP request's settings, if anything.
pub fn request_error(r: &SpeculateRequest) -> Option<String> {
    let p = r.mtp?;
    if r.draft.is_some() || r.ngram.is_some() || r.follow.is_some() {
        return Some("MTP drafts alone: no draft model, n-gram or followed output with it".into());
    }
    if r.fault.is_some() {
        return Some("the test faults apply to draft models and n-gram speculation".into());
    }
    if p.n_max == 0 || p.n_max + 1 > r.context.n_batch {
        return Some(format!(
            "MTP n_max {} must be at least 1 and below n_batch {}",
            p.n_max, r.context.n_batch
        ));
    }
    None
}

/// Answers an MTP request: the target `model` is loaded with its MTP layers (by the caller); the
/// drafter kept in `mtp` is (re)made for these settings, then every prompt is generated, after a
/// warm-up when anything was made afresh.
pub(super) fn speculate(
    model: Arc<Model>,
    mtp: &mut Option<Drafter>,
    r: &SpeculateRequest,
    p: MtpParams,
    fresh: bool,
) -> Response {
    let mut fresh = fresh;
    if mtp
        .as_ref()
        .is_none_or(|d| d.context != r.context || d.params != p)
    {
        *mtp = None;
        match MtpDrafter::new(&model, &r.context, p.n_max) {
            Ok(drafter) => {
                *mtp = Some(Drafter {
                    context: r.context.clone(),
                    params: p,
                    drafter,
                })
            }
            Err(e) => return failed("context", format!("MTP drafter: {e}")),
        }
        fresh = true;
    }
    let d = &mut mtp.as_mut().expect("made above").drafter;
    let prompts = match prompt_set(&model, r) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let n_batch = r.context.n_batch;
    // One request at a time, or groups of `slots` generated together.
    let slots = r.context.sequences.max(1) as usize;
    let mut run_all = || -> Result<Vec<PromptRun>, LlamaError> {
        if fresh {
            // Warm-up, discarded.
            let g = generation(4);
            match slots {
                1 => drop(generate(&model, d, &prompts[0], &g, n_batch)?),
                _ => drop(generate_together(
                    &model,
                    d,
                    &prompts[..slots],
                    &g,
                    n_batch,
                )?),
            }
        }
        let g = generation(r.n_gen as usize);
        if slots == 1 {
            return (prompts.iter())
                .map(|t| generate(&model, d, t, &g, n_batch))
                .collect();
        }
        let mut runs = Vec::with_capacity(prompts.len());
        for group in prompts.chunks(slots) {
            runs.extend(generate_together(&model, d, group, &g, n_batch)?);
        }
        Ok(runs)
    };
    match run_all() {
        Ok(runs) => Response::Speculated(SpeculateAnswer {
            runs,
            warmed_up: fresh,
        }),
        Err(e) => failed("decode", e.to_string()),
    }
}

fn generation(n_gen: usize) -> Generation<'static> {
    Generation {
        n_gen,
        follow: None,
        fault: None,
        ngram: None,
    }
}

/// One prompt with MTP drafting, one round at a time.
fn generate(
    model: &Model,
    d: &mut MtpDrafter,
    prompt: &[i32],
    g: &Generation,
    n_batch: u32,
) -> Result<PromptRun, LlamaError> {
    let mut run = PromptRun {
        prompt_tokens: prompt.len() as u32,
        ..PromptRun::default()
    };
    d.clear();
    let first_choice = process_prompt(d, 0, prompt, g, n_batch, &mut run)?;
    let first = first_choice.token();
    let mut seq: Vec<i32> = prompt.to_vec();
    seq.push(first);
    run.tokens.push(first);
    run.choices.push(first_choice);
    let t = Instant::now();
    while run.tokens.len() < g.n_gen && !model.is_eog(*run.tokens.last().expect("one token")) {
        let n_past = seq.len() - 1;
        let wanted = g.n_gen - run.tokens.len() - 1;
        let mut drafted = Vec::new();
        let mut pending = false;
        if wanted > 0 {
            drafted = d.draft(n_past as i32, seq[n_past], &seq[..n_past])?;
            pending = !drafted.is_empty();
            drafted.truncate(wanted);
        }
        // Drafting decoded its steps into the MTP cache; the verified batch replaces them.
        if !d.truncate_draft(n_past as i32) {
            return Err(rollback_failed("MTP"));
        }
        let choices = target_choices(
            d.target(),
            seq[n_past],
            &drafted,
            n_past,
            g,
            run.tokens.len(),
        )?;
        let mut batch = vec![seq[n_past]];
        batch.extend_from_slice(&drafted);
        d.process(&batch, n_past as i32)?;
        let accepted = choices.len() - 1;
        if pending {
            d.accept(0, accepted as u16)?;
        }
        run.rounds += 1;
        run.drafted += drafted.len() as u32;
        run.accepted += accepted as u32;
        let keep = (n_past + 1 + accepted) as i32;
        if accepted < drafted.len() && !(d.target().truncate(keep) && d.truncate_draft(keep)) {
            return Err(rollback_failed("target or MTP"));
        }
        take(model, &mut run, &mut seq, choices, &drafted[..accepted], g);
    }
    d.target().synchronize();
    run.gen_seconds = t.elapsed().as_secs_f64();
    Ok(run)
}

/// Prompt processing of sequence `seq`, a batch at a time: the target decodes (timed as its prompt
/// processing), the MTP context catches up on the same batch (timed as the draft's), then the
/// drafter begins.
fn process_prompt(
    d: &mut MtpDrafter,
    seq: i32,
    prompt: &[i32],
    g: &Generation,
    n_batch: u32,
    run: &mut PromptRun,
) -> Result<super::logits::Choice, LlamaError> {
    let step = n_batch.max(1) as usize;
    for (c, chunk) in prompt.chunks(step).enumerate() {
        let pos0 = (c * step) as i32;
        let t = Instant::now();
        d.target().decode_seq_at(chunk, pos0, seq, false)?;
        d.target().synchronize();
        run.prompt_seconds += t.elapsed().as_secs_f64();
        let batch: Vec<SeqToken> = (chunk.iter().enumerate())
            .map(|(i, &token)| SeqToken {
                token,
                pos: pos0 + i as i32,
                seq,
                logits: true,
            })
            .collect();
        let t = Instant::now();
        d.process_seq(&batch)?;
        d.target().synchronize();
        run.draft_prompt_seconds += t.elapsed().as_secs_f64();
    }
    let first = g.observe(d.target().last_logits(), 0);
    d.begin(seq, prompt)?;
    Ok(first)
}

/// Several prompts at once, one sequence each (llama-server's slots with `draft-mtp`): each round
/// the head drafts for every slot in shared batches and the MTP cache drops the drafted positions;
/// the target checks every slot's last token and draft in one batch ([`together::verify`]), the MTP
/// context processes that batch, each slot's draft is answered with its accepted count, and each
/// slot's caches roll back its own rejected positions. Times as in [`together`]: each prompt's run
/// carries an Nth of the group's generation time.
fn generate_together(
    model: &Model,
    d: &mut MtpDrafter,
    prompts: &[Vec<i32>],
    g: &Generation,
    n_batch: u32,
) -> Result<Vec<PromptRun>, LlamaError> {
    d.clear();
    let mut slots = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let mut run = PromptRun {
            prompt_tokens: p.len() as u32,
            ..PromptRun::default()
        };
        let first = process_prompt(d, i as i32, p, g, n_batch, &mut run)?;
        slots.push(Slot::new(i as i32, p, first, run));
    }
    let t = Instant::now();
    loop {
        let active = together::active(&slots, model, g.n_gen);
        if active.is_empty() {
            break;
        }
        let drafted = propose(d, &slots, &active, g.n_gen)?;
        let (batch, choices) = together::verify(d.target(), &slots, &active, &drafted, g)?;
        d.process_seq(&batch)?;
        for ((&i, drafted), choices) in active.iter().zip(&drafted).zip(choices) {
            if !drafted.is_empty() {
                d.accept(slots[i].seq, (choices.len() - 1) as u16)?;
            }
            let (target, mtp) = d.contexts();
            together::finish_round(model, target, Some(mtp), &mut slots[i], drafted, choices, g)?;
        }
    }
    d.target().synchronize();
    Ok(together::runs_sharing(slots, t.elapsed().as_secs_f64()))
}

/// The head's drafts for the `active` slots, in their order (none for a slot that wants no more
/// than the target's next token), drafted together; the drafted positions leave the MTP cache.
fn propose(
    d: &mut MtpDrafter,
    slots: &[Slot],
    active: &[usize],
    n_gen: usize,
) -> Result<Vec<Vec<i32>>, LlamaError> {
    let mut drafting = Vec::new();
    let mut wants = Vec::new();
    for (k, &i) in active.iter().enumerate() {
        let s = &slots[i];
        let wanted = n_gen.saturating_sub(s.run.tokens.len() + 1);
        if wanted == 0 {
            continue;
        }
        let n_past = s.tokens.len() - 1;
        drafting.push(k);
        wants.push(MtpWant {
            seq: s.seq,
            n_max: wanted,
            n_past: n_past as i32,
            last: s.tokens[n_past],
            history: &s.tokens[..n_past],
        });
    }
    let mut drafted = vec![Vec::new(); active.len()];
    if !wants.is_empty() {
        for (k, draft) in drafting.into_iter().zip(d.draft_many(&wants)?) {
            drafted[k] = draft;
        }
    }
    for &i in active {
        let s = &slots[i];
        if !d.truncate_draft_seq(s.seq, (s.tokens.len() - 1) as i32) {
            return Err(rollback_failed("MTP"));
        }
    }
    Ok(drafted)
}
