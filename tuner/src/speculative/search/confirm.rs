//! The draft search's last step: each draft's fastest setting and the target alone measured again
//! in interleaved, shuffled rounds (the seed is recorded), and the winner chosen by the paired
//! comparison of those rounds ([`stats::compare_paired`]).

use super::outcome::{DraftEntry, Outcome, Trial, Winner};
use super::runner::{kind_rates, rate, Runner};
use super::settings::{Candidate, SearchSettings};
use crate::speculative::mtp::progress_label;
use crate::speculative::serve::PromptRun;
use crate::stats::{self, Sample, Verdict};

/// Most settings in the final comparison (each adds a pass to every round).
const MAX_FINALISTS: usize = 3;

/// A finalist of the interleaved comparison: (its first-pass speed, draft entry, trial index).
type Finalist = (f64, usize, usize);

/// One pass's generation speed per prompt kind.
type KindRates = Vec<(String, f64)>;

/// The final comparison's figures per slot (the baseline, then each finalist): the speed of each
/// round, and per round its speed per prompt kind.
struct Rounds {
    tg: Vec<Vec<f64>>,
    by_kind: Vec<Vec<KindRates>>,
}

/// The final, interleaved comparison: each draft's fastest setting against the baseline.
pub(super) fn confirm(
    r: &mut Runner,
    candidates: &[Option<Candidate>],
    entries: &mut [DraftEntry],
    outcome: &mut Outcome,
) {
    let baseline_tg = outcome.baseline.median_tg().unwrap_or(0.0);
    let ranked = finalists(entries, baseline_tg);
    if ranked.is_empty() {
        return;
    }
    let Some(rounds) = final_rounds(r, candidates, entries, &ranked, outcome) else {
        return;
    };
    set_kind_rates(&mut outcome.baseline, &rounds.by_kind[0]);
    for (slot, &(_, e, i)) in ranked.iter().enumerate() {
        set_kind_rates(&mut entries[e].trials[i], &rounds.by_kind[slot + 1]);
    }
    outcome.confirm_baseline = rounds.tg[0].clone();
    outcome.baseline.tg_tps.extend(&rounds.tg[0]);
    for (slot, &(_, e, i)) in ranked.iter().enumerate() {
        entries[e].trials[i].tg_tps.extend(&rounds.tg[slot + 1]);
    }
    outcome.winner = judge(r.s, candidates, entries, &ranked, &rounds.tg);
}

/// The finalists, fastest first: each draft's fastest setting, unless it is so slow that no
/// repetition could change the verdict (under half the baseline's speed).
fn finalists(entries: &[DraftEntry], baseline_tg: f64) -> Vec<Finalist> {
    let mut ranked: Vec<Finalist> = entries
        .iter()
        .enumerate()
        .filter_map(|(e, entry)| {
            entry
                .trials
                .iter()
                .enumerate()
                .filter(|(_, t)| t.ok())
                .map(|(i, t)| (t.median_tg().unwrap_or(0.0), e, i))
                .max_by(|a, b| a.0.total_cmp(&b.0))
        })
        .filter(|&(tg, _, _)| tg > baseline_tg * 0.5)
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranked.truncate(MAX_FINALISTS);
    ranked
}

/// The interleaved, shuffled rounds over the baseline (slot 0) and the finalists. None when the
/// user stopped them or a pass failed (noted in `outcome`): an unpaired round would bias the
/// comparison.
fn final_rounds(
    r: &mut Runner,
    candidates: &[Option<Candidate>],
    entries: &[DraftEntry],
    ranked: &[Finalist],
    outcome: &mut Outcome,
) -> Option<Rounds> {
    let s = r.s;
    let reps = s.reps.max(2) as usize;
    let mut rounds = Rounds {
        tg: vec![Vec::new(); ranked.len() + 1],
        by_kind: vec![Vec::new(); ranked.len() + 1],
    };
    for round in 0..reps {
        let order = stats::shuffled_order(ranked.len() + 1, s.seed.wrapping_add(round as u64));
        for &slot in &order {
            if (r.stop)() {
                outcome.interrupted = true;
                return None;
            }
            let finalist = slot.checked_sub(1).map(|f| ranked[f]);
            let report = r.progress;
            let progress = |what: &str| {
                report(&format!(
                    "final comparison, round {}/{reps}: {what}",
                    round + 1
                ))
            };
            match final_pass(r, candidates, entries, finalist, progress) {
                Ok(runs) => {
                    rounds.tg[slot].push(rate(&runs));
                    rounds.by_kind[slot].push(kind_rates(&runs, &s.prompts, s.context.sequences));
                }
                Err(e) => {
                    outcome.confirm_error = Some(format!(
                        "the final comparison stopped in round {}: {e}",
                        round + 1
                    ));
                    return None;
                }
            }
        }
    }
    Some(rounds)
}

/// One pass of the final comparison: the target alone (no finalist), an n-gram setting, or a
/// draft at its setting and placement.
fn final_pass(
    r: &mut Runner,
    candidates: &[Option<Candidate>],
    entries: &[DraftEntry],
    finalist: Option<Finalist>,
    progress: impl Fn(&str),
) -> Result<Vec<PromptRun>, String> {
    let Some((_, e, i)) = finalist else {
        progress("the target alone");
        return r.pass(None);
    };
    let trial = &entries[e].trials[i];
    if let Some(p) = trial.ngram {
        progress(&p.label());
        return r.pass_ngram(p);
    }
    if let Some(p) = trial.mtp {
        progress(&progress_label(p));
        return r.pass_mtp(p);
    }
    let cand = candidates[e]
        .as_ref()
        .expect("measured entries have candidates");
    let params = trial.params.expect("draft trials have params");
    let model = cand.placed(trial.placement);
    progress(&format!("{} {}", params.label(), model.placement().label()));
    r.pass(Some((model, params)))
}

/// Each finalist's paired comparison with the baseline (kept on its trial), and the winner: the
/// best ratio among those faster beyond the noise whose output is the target alone's.
fn judge(
    s: &SearchSettings,
    candidates: &[Option<Candidate>],
    entries: &mut [DraftEntry],
    ranked: &[Finalist],
    rounds: &[Vec<f64>],
) -> Option<Winner> {
    let mut best: Option<Winner> = None;
    for (slot, &(_, e, i)) in ranked.iter().enumerate() {
        let ours = &rounds[slot + 1];
        let Ok(cmp) =
            stats::compare_paired(ours, &rounds[0], s.noise, stats::DEFAULT_CONFIDENCE, s.seed)
        else {
            continue;
        };
        let trial = &mut entries[e].trials[i];
        trial.versus_baseline = Some(cmp);
        let (Ok(tg), Ok(base)) = (Sample::new(ours.clone()), Sample::new(rounds[0].clone())) else {
            continue;
        };
        if cmp.verdict != Verdict::Faster || trial.output.differs() {
            continue;
        }
        if best.as_ref().is_none_or(|b| cmp.ratio > b.comparison.ratio) {
            best = Some(Winner {
                draft: entries[e].path.clone(),
                params: trial.params,
                placement: candidates[e]
                    .as_ref()
                    .map(|c| c.placed(trial.placement).placement()),
                ngram: trial.ngram,
                mtp: trial.mtp,
                tg: tg.summary(),
                baseline_tg: base.summary(),
                comparison: cmp,
                acceptance: trial.acceptance,
                tokens_per_round: trial.tokens_per_round,
                mem_bytes: entries[e].mem_bytes.unwrap_or(0),
            });
        }
    }
    best
}

/// A finalist's (or the baseline's) per-kind speed: the median of the interleaved rounds, which
/// ran side by side with the others', replacing the first pass's.
fn set_kind_rates(t: &mut Trial, rounds: &[Vec<(String, f64)>]) {
    for k in &mut t.per_kind {
        let v: Vec<f64> = rounds
            .iter()
            .filter_map(|r| r.iter().find(|(n, _)| *n == k.kind).map(|x| x.1))
            .collect();
        if let Ok(sample) = Sample::new(v) {
            k.tg_tps = sample.summary().median;
        }
    }
}
