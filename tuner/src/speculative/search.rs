//! Measuring draft settings against the target alone, and choosing.
//!
//! Everything runs in one worker process, so the target stays loaded and the draft and the baseline
//! see the same machine. The search, per compatible draft:
//!
//! 1. the grid's first stage: for each p_min, n_max in ascending order, one pass over the prompt set
//!    each; a line stops where a longer draft is slower than the shorter one by more than the noise
//!    (longer drafts only waste more work from there);
//! 2. the other n_min values for the draft's best setting whose p_min can cut drafts short;
//! 3. a baseline pass after each draft, so drift shows.
//!
//! Then each draft's fastest setting and the baseline are measured again in `reps` interleaved,
//! shuffled rounds (the seed is recorded), and a setting wins only when the whole bootstrap interval
//! of its paired ratio to the baseline lies above the noise threshold (`stats::compare_paired`); a
//! draft that loses is reported with that interval too.
//! Acceptance needs no repetition: with greedy decoding it is a property of the two models and the
//! text, the same in every pass. So is the output, which [`super::verify`] checks against the target
//! alone after each setting's first pass: a setting whose output differs beyond near ties of rounding
//! never wins.
//!
//! The parts: [`settings`] is what the search is given, [`outcome`] what it records and chooses,
//! [`runner`] the worker and the clock it measures with; this file walks the drafts (a draft model's
//! grid here, n-gram speculation's in [`super::ngram_search`], MTP's in [`super::mtp_search`]) and
//! [`confirm`] runs the final comparison. The strategies and the parts import from the parts, never
//! from this file, so the dependencies run one way.

use super::DraftParams;
use runner::{file_name, Runner};
use std::time::Instant;

mod confirm;
pub(super) mod outcome;
pub(super) mod runner;
pub(super) mod settings;

pub use outcome::{DraftEntry, Outcome, Trial, Winner};
pub use settings::{Candidate, SearchSettings};

/// Measures the baseline and every candidate in `entries` whose status is `measured`
/// (`candidates[i]` belongs to `entries[i]`; n-gram speculation's entry has none), and chooses.
pub fn run(
    s: &SearchSettings,
    candidates: &[Option<Candidate>],
    entries: &mut [DraftEntry],
    stop: &dyn Fn() -> bool,
    progress: &dyn Fn(&str),
) -> Result<Outcome, String> {
    let mut r = Runner {
        s,
        worker: None,
        stop,
        progress,
        started: Instant::now(),
        grid_share: 1.0,
        reference: Vec::new(),
    };
    let mut baseline = Trial::new(None, None, "baseline");
    progress("the target alone (baseline)");
    let first = r
        .pass(None)
        .map_err(|e| format!("the target alone could not be measured: {e}"))?;
    r.record(&mut baseline, &first);
    r.reference = first;

    let measured = |e: &DraftEntry, c: &Option<Candidate>| {
        e.status == "measured" && (c.is_some() || e.needs_no_draft())
    };
    let turns = entries
        .iter()
        .zip(candidates)
        .filter(|(e, c)| measured(e, c))
        .count()
        .max(1);
    let mut turn = 0;
    for (entry, cand) in entries.iter_mut().zip(candidates) {
        if !measured(entry, cand) {
            continue;
        }
        turn += 1;
        r.grid_share = turn as f64 / turns as f64;
        match cand {
            Some(cand) => measure_draft(&mut r, cand, entry),
            None if entry.is_mtp() => super::mtp_search::measure(&mut r, entry),
            None => super::ngram_search::measure(&mut r, entry),
        }
        if r.out_of_time().is_none() {
            (r.progress)("the target alone (baseline, again)");
            if let Ok(runs) = r.pass(None) {
                r.record(&mut baseline, &runs);
            }
        }
    }
    Ok(finish(r, candidates, entries, baseline))
}

/// After the grids: entries left unmeasured say so, then the final comparison chooses.
fn finish(
    mut r: Runner,
    candidates: &[Option<Candidate>],
    entries: &mut [DraftEntry],
    baseline: Trial,
) -> Outcome {
    r.grid_share = 1.0;
    // A draft whose every setting was skipped was not measured, whatever the checks said.
    for entry in entries.iter_mut() {
        if entry.status == "measured"
            && !entry.trials.is_empty()
            && entry.trials.iter().all(|t| t.skipped.is_some())
        {
            entry.status = format!(
                "not measured: {}",
                entry.trials[0].skipped.clone().unwrap_or_default()
            );
        }
    }
    let interrupted = (r.stop)();
    let budget_spent = r.out_of_time().is_some() && !interrupted;
    let mut outcome = Outcome {
        baseline,
        confirm_baseline: Vec::new(),
        winner: None,
        budget_spent,
        interrupted,
        confirm_error: None,
    };
    if !interrupted {
        confirm::confirm(&mut r, candidates, entries, &mut outcome);
    }
    outcome
}

/// One draft model: its grid, the other n_min values, then its other placements.
fn measure_draft(r: &mut Runner, cand: &Candidate, entry: &mut DraftEntry) {
    let best = draft_grid(r, cand, entry);
    if let Some((_, best)) = best {
        let home = Some(cand.model.placement());
        for params in r.s.grid.n_min_variants(best) {
            let mut t = Trial::new(Some(params), home, "n_min");
            r.measure_once(&mut t, Some((&cand.model, params)), &cand.model.path);
            entry.trials.push(t);
        }
    }
    // The draft's other placements, with the best settings so far.
    let best = entry
        .trials
        .iter()
        .filter(|t| t.ok())
        .max_by(|a, b| {
            a.median_tg()
                .unwrap_or(0.0)
                .total_cmp(&b.median_tg().unwrap_or(0.0))
        })
        .and_then(|t| t.params);
    if let Some(best) = best {
        for alt in &cand.alternatives {
            let mut t = Trial::new(Some(best), Some(alt.placement()), "placement");
            r.measure_once(&mut t, Some((alt, best)), &alt.path);
            entry.trials.push(t);
        }
    }
}

/// The grid's first stage for one draft: each line until it slows down. Returns the fastest.
fn draft_grid(
    r: &mut Runner,
    cand: &Candidate,
    entry: &mut DraftEntry,
) -> Option<(f64, DraftParams)> {
    let s = r.s;
    let home = Some(cand.model.placement());
    let mut best: Option<(f64, DraftParams)> = None;
    let mut failures = 0;
    for line in s.grid.first_stage() {
        let mut previous: Option<(f64, u32)> = None;
        for (k, params) in line.iter().enumerate() {
            let mut t = Trial::new(Some(*params), home, "grid");
            if let Some(why) = r.out_of_time() {
                t.skipped = Some(why);
                entry.trials.push(t);
                continue;
            }
            (r.progress)(&format!(
                "{} {}",
                file_name(&cand.model.path),
                params.label()
            ));
            match r.pass(Some((&cand.model, *params))) {
                Ok(runs) => r.record(&mut t, &runs),
                Err(e) => {
                    failures += 1;
                    let fatal = failures >= 2
                        || e.starts_with("llama.cpp refused at load")
                        || e.starts_with("llama.cpp refused at context")
                        || e.starts_with(crate::worker::memory::SHORT_OF_MEMORY);
                    t.failure = Some(e);
                    entry.trials.push(t);
                    if fatal {
                        entry.status = format!("failed: {}", t_fail(&entry.trials));
                        return best;
                    }
                    continue;
                }
            }
            let tg = t.median_tg().unwrap_or(0.0);
            if best.is_none_or(|(b, _)| tg > b) {
                best = Some((tg, *params));
            }
            let slower = previous.filter(|&(p, _)| tg < p * (1.0 - s.noise));
            entry.trials.push(t);
            if let Some((_, n)) = slower {
                for rest in &line[k + 1..] {
                    let mut skip = Trial::new(Some(*rest), home, "grid");
                    skip.skipped = Some(format!("longer drafts got slower from n_max {n} on"));
                    entry.trials.push(skip);
                }
                break;
            }
            previous = Some((tg, params.n_max));
        }
    }
    best
}

/// The last failure of a draft's trials.
fn t_fail(trials: &[Trial]) -> String {
    trials
        .iter()
        .rev()
        .find_map(|t| t.failure.clone())
        .unwrap_or_default()
}
