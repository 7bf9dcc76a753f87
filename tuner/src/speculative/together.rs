//! Speculative decoding for several requests at once (`--parallel N`): N prompts decoded as the N
//! sequences of one context, llama-server's slots, the way its `draft-simple` serves them
//! ([`super::serve`] for one); `ngram-simple` drafts each slot from its own text instead. Each round
//! the draft proposes for every slot in shared batches (each slot's last accepted token, then one
//! token per slot still drafting, each step) and its cache drops the drafted positions again; the
//! target checks every slot's last token and draft in one batch, the draft decodes that same batch
//! after it, and each slot's caches roll back its own rejected positions. The target alone runs the same loop without a draft: one token per slot each step,
//! which is how a server generates for N clients.
//!
//! Times are those of the N together: each prompt's run carries an Nth of its group's generation
//! time, so the search's rate (tokens over seconds, summed over runs) is the aggregate rate of N
//! requests at once. Prompts are processed one slot at a time (their logits are read as they end).

use super::logits::{top_with_probability, Choice};
use super::round::{choices_at, rollback_failed, take, Generation};
use super::DraftParams;
use crate::llama::{Context, LlamaError, Model, SeqToken};
use crate::worker::protocol::PromptRun;
use std::time::Instant;

/// One slot: its sequence, what it holds and what it has produced.
pub(super) struct Slot {
    pub(super) seq: i32,
    /// The prompt and the tokens taken so far; the last is not yet in either cache.
    pub(super) tokens: Vec<i32>,
    pub(super) run: PromptRun,
}

impl Slot {
    /// Sequence `seq` after its prompt, with the target's first choice.
    pub(super) fn new(seq: i32, prompt: &[i32], first: Choice, mut run: PromptRun) -> Slot {
        let mut tokens = prompt.to_vec();
        tokens.push(first.token());
        run.tokens.push(first.token());
        run.choices.push(first);
        Slot { seq, tokens, run }
    }

    fn done(&self, model: &Model, n_gen: usize) -> bool {
        self.run.tokens.len() >= n_gen || model.is_eog(*self.run.tokens.last().expect("one token"))
    }

    /// Tokens it may still draft this round (none past the tokens wanted).
    fn cap(&self, p: &DraftParams, n_gen: usize) -> usize {
        (p.n_max as usize).min(n_gen.saturating_sub(self.run.tokens.len() + 1))
    }
}

/// The slots still generating (fewer than `n_gen` tokens, no end of generation yet), in order.
pub(super) fn active(slots: &[Slot], model: &Model, n_gen: usize) -> Vec<usize> {
    (0..slots.len())
        .filter(|&i| !slots[i].done(model, n_gen))
        .collect()
}

/// Each slot's run, carrying an Nth of the group's `seconds` of generation: the slots generated
/// together, so the search's rate (tokens over seconds, summed over runs) is the group's.
pub(super) fn runs_sharing(slots: Vec<Slot>, seconds: f64) -> Vec<PromptRun> {
    let share = seconds / slots.len().max(1) as f64;
    (slots.into_iter())
        .map(|mut s| {
            s.run.gen_seconds = share;
            s.run
        })
        .collect()
}

/// Generates over `prompts` at once, one sequence each, with or without a draft.
pub(super) fn generate_together(
    model: &Model,
    target: &mut Context,
    mut draft: Option<(&mut Context, DraftParams)>,
    prompts: &[Vec<i32>],
    g: &Generation,
) -> Result<Vec<PromptRun>, LlamaError> {
    target.clear();
    if let Some((d, _)) = draft.as_mut() {
        d.clear();
    }
    let mut slots = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let d = draft.as_mut().map(|(d, _)| &mut **d);
        slots.push(start(target, d, i as i32, p, g)?);
    }
    let t = Instant::now();
    loop {
        let active = active(&slots, model, g.n_gen);
        if active.is_empty() {
            break;
        }
        let drafted = match (draft.as_mut(), g.ngram) {
            (Some((d, p)), _) => propose(d, p, &slots, &active, g.n_gen)?,
            (None, Some(p)) => ngram_drafts(p, &slots, &active, g.n_gen),
            (None, None) => vec![Vec::new(); active.len()],
        };
        let (batch, choices) = verify(target, &slots, &active, &drafted, g)?;
        if let Some((d, _)) = draft.as_mut() {
            // llama-server re-evaluates every batch the target decodes on the draft, with an output
            // for its last token only.
            let last = batch.len() - 1;
            let again: Vec<SeqToken> = (batch.iter().enumerate())
                .map(|(j, t)| SeqToken {
                    logits: j == last,
                    ..*t
                })
                .collect();
            d.decode_one_batch(&again)?;
        }
        for ((&i, drafted), choices) in active.iter().zip(&drafted).zip(choices) {
            let d = draft.as_mut().map(|(d, _)| &mut **d);
            finish_round(model, target, d, &mut slots[i], drafted, choices, g)?;
        }
    }
    target.synchronize();
    Ok(runs_sharing(slots, t.elapsed().as_secs_f64()))
}

/// A slot's round after the check: its counts, the rejected positions out of both caches, and the
/// accepted draft and the target's next token taken.
pub(super) fn finish_round(
    model: &Model,
    target: &mut Context,
    draft: Option<&mut Context>,
    s: &mut Slot,
    drafted: &[i32],
    choices: Vec<Choice>,
    g: &Generation,
) -> Result<(), LlamaError> {
    let accepted = choices.len() - 1;
    s.run.rounds += 1;
    s.run.drafted += drafted.len() as u32;
    s.run.accepted += accepted as u32;
    // The last token and the accepted draft stay; the rejected positions leave both caches.
    let keep = (s.tokens.len() + accepted) as i32;
    if accepted < drafted.len() {
        if !target.truncate_seq(s.seq, keep) {
            return Err(rollback_failed("target"));
        }
        if draft.is_some_and(|d| !d.truncate_seq(s.seq, keep)) {
            return Err(rollback_failed("draft"));
        }
    }
    take(
        model,
        &mut s.run,
        &mut s.tokens,
        choices,
        &drafted[..accepted],
        g,
    );
    Ok(())
}

/// A slot's prompt: the target decodes it as sequence `seq` (timed) and chooses the first token;
/// the draft, if any, decodes it too.
fn start(
    target: &mut Context,
    draft: Option<&mut Context>,
    seq: i32,
    prompt: &[i32],
    g: &Generation,
) -> Result<Slot, LlamaError> {
    let mut run = PromptRun {
        prompt_tokens: prompt.len() as u32,
        ..PromptRun::default()
    };
    let t = Instant::now();
    target.decode_seq_at(prompt, 0, seq, false)?;
    target.synchronize();
    run.prompt_seconds = t.elapsed().as_secs_f64();
    let first = g.observe(target.last_logits(), 0);
    if let Some(d) = draft {
        let t = Instant::now();
        d.decode_seq_at(prompt, 0, seq, false)?;
        d.synchronize();
        run.draft_prompt_seconds = t.elapsed().as_secs_f64();
    }
    Ok(Slot::new(seq, prompt, first, run))
}

/// The draft's proposals for the `active` slots, in their order: greedy while its top probability
/// stays at or above p_min, at most n_max each, none when shorter than n_min. Every step is one
/// batch of all the slots still drafting: first each one's last accepted token, then its last
/// drafted one. The drafted positions leave the draft's cache again afterwards, as in the server.
fn propose(
    d: &mut Context,
    p: &DraftParams,
    slots: &[Slot],
    active: &[usize],
    n_gen: usize,
) -> Result<Vec<Vec<i32>>, LlamaError> {
    let mut drafted = vec![Vec::new(); active.len()];
    let mut batch: Vec<SeqToken> = Vec::new();
    // (index into `active`, its output's index in the batch)
    let mut drafting: Vec<(usize, usize)> = Vec::new();
    for (k, &i) in active.iter().enumerate() {
        let s = &slots[i];
        if s.cap(p, n_gen) == 0 {
            continue;
        }
        let n_past = s.tokens.len() - 1;
        batch.push(SeqToken {
            token: s.tokens[n_past],
            pos: n_past as i32,
            seq: s.seq,
            logits: true,
        });
        drafting.push((k, batch.len() - 1));
    }
    let started: Vec<usize> = drafting.iter().map(|&(k, _)| k).collect();
    while !drafting.is_empty() {
        d.decode_one_batch(&batch)?;
        batch.clear();
        let mut still = Vec::new();
        for &(k, at) in &drafting {
            let s = &slots[active[k]];
            let (token, prob) = top_with_probability(d.logits_ith(at as i32));
            if prob < p.p_min {
                continue;
            }
            drafted[k].push(token);
            if drafted[k].len() >= s.cap(p, n_gen) {
                continue;
            }
            batch.push(SeqToken {
                token,
                pos: (s.tokens.len() - 1 + drafted[k].len()) as i32,
                seq: s.seq,
                logits: true,
            });
            still.push((k, batch.len() - 1));
        }
        drafting = still;
    }
    for k in started {
        let s = &slots[active[k]];
        if !d.truncate_seq(s.seq, (s.tokens.len() - 1) as i32) {
            return Err(rollback_failed("draft"));
        }
    }
    for d in &mut drafted {
        if d.len() < p.n_min as usize {
            d.clear();
        }
    }
    Ok(drafted)
}

/// N-gram speculation's drafts for the `active` slots: each looks its own text up (the server's
/// `ngram-simple` drafts every slot from that slot's tokens), no more than the tokens it still wants.
fn ngram_drafts(
    p: super::ngram::NgramParams,
    slots: &[Slot],
    active: &[usize],
    n_gen: usize,
) -> Vec<Vec<i32>> {
    active
        .iter()
        .map(|&i| {
            let s = &slots[i];
            let n_past = s.tokens.len() - 1;
            let mut d = super::ngram::draft(p, &s.tokens[..n_past], s.tokens[n_past]);
            d.truncate(n_gen.saturating_sub(s.run.tokens.len() + 1));
            d
        })
        .collect()
}

/// The target decodes every active slot's last token and draft in one batch; for each slot, its
/// choice after each accepted draft token, then its own next one. Returns the batch too.
pub(super) fn verify(
    target: &mut Context,
    slots: &[Slot],
    active: &[usize],
    drafted: &[Vec<i32>],
    g: &Generation,
) -> Result<(Vec<SeqToken>, Vec<Vec<Choice>>), LlamaError> {
    let mut batch: Vec<SeqToken> = Vec::new();
    let mut offsets = Vec::with_capacity(active.len());
    for (&i, d) in active.iter().zip(drafted) {
        let s = &slots[i];
        let pos0 = s.tokens.len() - 1;
        offsets.push(batch.len());
        for (j, &token) in std::iter::once(&s.tokens[pos0]).chain(d).enumerate() {
            batch.push(SeqToken {
                token,
                pos: (pos0 + j) as i32,
                seq: s.seq,
                logits: true,
            });
        }
    }
    target.decode_one_batch(&batch)?;
    let mut out = Vec::with_capacity(active.len());
    for ((&i, d), &at) in active.iter().zip(drafted).zip(&offsets) {
        out.push(choices_at(target, at, d, g, slots[i].run.tokens.len())?);
    }
    Ok((batch, out))
}
