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

use super::ngram::{NgramGrid, NgramParams};
use super::prompts::Prompt;
use super::serve::{DraftModel, Fault, PromptRun};
use super::verify::OutputCheck;
use super::{DraftParams, DraftPlacement, Grid};
use crate::llama::{ContextSettings, ModelSettings};
use crate::stats::{Comparison, Summary};
use crate::worker::protocol::MtpParams;
use crate::worker::Worker;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod confirm;
mod runner;

pub struct SearchSettings {
    pub target: PathBuf,
    pub settings: ModelSettings,
    pub context: ContextSettings,
    pub grid: Grid,
    /// N-gram settings to measure (empty: no n-gram speculation).
    pub ngram: NgramGrid,
    /// MTP draft lengths to measure, ascending (empty: the target has no MTP heads, or not tried).
    pub mtp: Vec<u32>,
    pub prompts: Vec<Prompt>,
    /// Tokens generated per prompt.
    pub n_gen: u32,
    /// Interleaved rounds of the final comparison (at least 2).
    pub reps: u32,
    pub noise: f64,
    pub seed: u64,
    /// The deadline of one prompt's generation (a pass over the prompt set gets one per prompt).
    pub trial_timeout: Duration,
    /// Time for the whole search. The grid gets two thirds of it (what is left unmeasured then is
    /// marked skipped); the final comparison always runs its rounds.
    pub budget: Duration,
    /// Test only: a deliberate rollback bug in the draft loop ([`Fault`]).
    pub fault: Option<Fault>,
}

/// One configuration measured: the target alone (`params: None`) or with a draft.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    pub params: Option<DraftParams>,
    /// N-gram speculation's settings (no draft model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngram: Option<NgramParams>,
    /// MTP's settings (the target's own heads draft).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpParams>,
    /// The draft's GPU layers and KV types (None for the target alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<DraftPlacement>,
    /// `grid`, `n_min`, `placement` or `baseline`.
    pub stage: String,
    /// Effective generation speed of each pass over the prompt set (tokens/s), the final
    /// comparison's rounds included.
    pub tg_tps: Vec<f64>,
    /// Accepted / drafted tokens.
    pub acceptance: f64,
    /// Accepted draft tokens per verification round.
    pub mean_accepted: f64,
    /// Tokens produced per target decode (accepted draft tokens + the target's own).
    pub tokens_per_round: f64,
    /// The draft's prompt processing relative to the target's.
    pub draft_pp_overhead: f64,
    pub per_kind: Vec<KindAcceptance>,
    /// The output against the target alone's (from the first pass): `same_output`, `identical`,
    /// `near_ties`, `divergence`, `max_logit_gap`.
    #[serde(flatten)]
    pub output: OutputCheck,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// Set for the finalists: the paired comparison with the baseline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versus_baseline: Option<Comparison>,
}

#[derive(Debug, Clone, Serialize)]
pub struct KindAcceptance {
    pub kind: String,
    pub drafted: u64,
    pub accepted: u64,
    pub acceptance: f64,
    /// Effective generation speed of this kind's prompts: the median of the final comparison's
    /// interleaved rounds for its finalists and the baseline, else the first pass; 0 when several
    /// requests ran at once (their group's time is not one kind's).
    pub tg_tps: f64,
}

impl Trial {
    fn new(params: Option<DraftParams>, placement: Option<DraftPlacement>, stage: &str) -> Trial {
        Trial {
            params,
            ngram: None,
            mtp: None,
            placement,
            stage: stage.into(),
            tg_tps: Vec::new(),
            acceptance: 0.0,
            mean_accepted: 0.0,
            tokens_per_round: 0.0,
            draft_pp_overhead: 0.0,
            per_kind: Vec::new(),
            output: OutputCheck::new(),
            failure: None,
            skipped: None,
            versus_baseline: None,
        }
    }

    /// Median generation speed over its passes.
    pub fn median_tg(&self) -> Option<f64> {
        let mut v = self.tg_tps.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    /// An n-gram trial.
    pub fn ngram(params: NgramParams, stage: &str) -> Trial {
        Trial {
            ngram: Some(params),
            ..Trial::new(None, None, stage)
        }
    }

    /// An MTP trial.
    pub fn mtp(params: MtpParams, stage: &str) -> Trial {
        Trial {
            mtp: Some(params),
            ..Trial::new(None, None, stage)
        }
    }

    /// Its settings in words.
    pub fn label(&self) -> String {
        if let Some(m) = self.mtp {
            return super::mtp::label(m);
        }
        match (self.ngram, self.params) {
            (Some(n), _) => n.label(),
            (None, Some(p)) => p.label(),
            (None, None) => "alone".into(),
        }
    }

    /// With speculation (a draft model or n-gram), not the target alone.
    pub fn speculates(&self) -> bool {
        self.params.is_some() || self.ngram.is_some() || self.mtp.is_some()
    }

    pub fn ok(&self) -> bool {
        self.failure.is_none() && self.skipped.is_none() && !self.tg_tps.is_empty()
    }
}

/// A draft to measure, as the worker loads it.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The default placement (the draft follows the target).
    pub model: DraftModel,
    /// Other placements that fit beside the target, tried with the best draft settings.
    pub alternatives: Vec<DraftModel>,
}

impl Candidate {
    /// The model as a trial placed it.
    fn placed(&self, placement: Option<DraftPlacement>) -> &DraftModel {
        self.alternatives
            .iter()
            .find(|m| Some(m.placement()) == placement)
            .unwrap_or(&self.model)
    }
}

/// The outcome for one draft file.
#[derive(Debug, Clone, Serialize)]
pub struct DraftEntry {
    /// The draft file, or [`NGRAM_SIMPLE`] for n-gram speculation.
    pub path: PathBuf,
    /// llama-server's `--spec-type`: `draft-simple` or `ngram-simple`.
    pub spec_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_type: Option<String>,
    pub size_bytes: u64,
    /// `measured`, `incompatible: …`, `does not fit: …`, `failed: …`, `not measured: …`.
    pub status: String,
    /// The draft's memory (dry run: weights, KV cache, compute buffers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_bytes: Option<u64>,
    pub trials: Vec<Trial>,
}

/// The name n-gram speculation's entry carries (llama-server's `--spec-type`).
pub const NGRAM_SIMPLE: &str = "ngram-simple";
/// The name the MTP entry carries (llama-server's `--spec-type`).
pub const DRAFT_MTP: &str = "draft-mtp";

impl DraftEntry {
    /// The entry of n-gram speculation, measured whenever the grid has settings.
    pub fn ngram() -> DraftEntry {
        DraftEntry {
            path: PathBuf::from(NGRAM_SIMPLE),
            spec_type: NGRAM_SIMPLE.into(),
            file_type: None,
            size_bytes: 0,
            status: "measured".into(),
            mem_bytes: None,
            trials: Vec::new(),
        }
    }

    pub fn is_ngram(&self) -> bool {
        self.spec_type == NGRAM_SIMPLE
    }

    /// The entry of the target's own MTP heads, measured when it has some.
    pub fn mtp() -> DraftEntry {
        DraftEntry {
            path: PathBuf::from(DRAFT_MTP),
            spec_type: DRAFT_MTP.into(),
            ..DraftEntry::ngram()
        }
    }

    pub fn is_mtp(&self) -> bool {
        self.spec_type == DRAFT_MTP
    }

    /// Measured without a draft model (n-gram or MTP).
    pub fn needs_no_draft(&self) -> bool {
        self.is_ngram() || self.is_mtp()
    }
}

/// The chosen setting: a draft model's, or n-gram speculation's (`ngram` set, `params` and
/// `placement` then unused and absent from the JSON).
#[derive(Debug, Clone, Serialize)]
pub struct Winner {
    /// The draft file, or `ngram-simple`.
    pub draft: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<DraftParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<DraftPlacement>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngram: Option<NgramParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpParams>,
    pub tg: Summary,
    pub baseline_tg: Summary,
    /// Median of the paired ratios, minus 1 (0.25: 25 % faster), with its interval.
    pub comparison: Comparison,
    pub acceptance: f64,
    pub tokens_per_round: f64,
    pub mem_bytes: u64,
}

impl Winner {
    /// Its settings in words: the draft's and its placement's, or n-gram's.
    pub fn label(&self) -> String {
        if let Some(m) = self.mtp {
            return super::mtp::label(m);
        }
        match (self.ngram, self.params, self.placement) {
            (Some(n), _, _) => n.label(),
            (None, Some(p), Some(x)) => format!("{}, {}", p.label(), x.label()),
            (None, Some(p), None) => p.label(),
            (None, None, _) => "?".into(),
        }
    }

    /// Whether this trial of this entry is the winner.
    pub fn is(&self, entry: &DraftEntry, t: &Trial) -> bool {
        self.draft == entry.path
            && self.params == t.params
            && self.ngram == t.ngram
            && self.mtp == t.mtp
            && (self.ngram.is_some() || self.mtp.is_some() || self.placement == t.placement)
    }
}

/// What the search measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub baseline: Trial,
    /// Baseline passes of the final comparison, paired with the finalists' rounds.
    pub confirm_baseline: Vec<f64>,
    pub winner: Option<Winner>,
    pub budget_spent: bool,
    pub interrupted: bool,
    /// Why the final comparison stopped early (no winner is chosen then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm_error: Option<String>,
}

pub(super) struct Runner<'a> {
    pub(super) s: &'a SearchSettings,
    worker: Option<Worker>,
    pub(super) stop: &'a dyn Fn() -> bool,
    pub(super) progress: &'a dyn Fn(&str),
    started: Instant,
    /// The grid's share of the budget used up to the end of the current draft's turn: each draft
    /// gets an equal share, and what one leaves unused passes to the next.
    grid_share: f64,
    /// The target alone's first pass: what every draft setting's output is checked against.
    reference: Vec<PromptRun>,
}

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
            None if entry.is_mtp() => super::mtp::measure(&mut r, entry),
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

/// Effective generation speed of a pass: loop tokens over loop time, all prompts together.
fn rate(runs: &[PromptRun]) -> f64 {
    let tokens: u64 = runs.iter().map(|r| u64::from(r.loop_tokens())).sum();
    let seconds: f64 = runs.iter().map(|r| r.gen_seconds).sum();
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// Generation speed per prompt kind of one pass; none when several requests ran at once
/// (`slots` > 1): a group's prompts share its time, which is no one kind's.
fn kind_rates(runs: &[PromptRun], prompts: &[Prompt], slots: u32) -> Vec<(String, f64)> {
    if slots > 1 {
        return Vec::new();
    }
    let mut kinds: Vec<&str> = prompts.iter().map(|p| p.kind.as_str()).collect();
    kinds.dedup();
    kinds
        .into_iter()
        .map(|k| {
            let of_kind: Vec<PromptRun> = runs
                .iter()
                .zip(prompts)
                .filter(|(_, p)| p.kind == k)
                .map(|(r, _)| r.clone())
                .collect();
            (k.to_string(), rate(&of_kind))
        })
        .collect()
}

/// The last failure of a draft's trials.
fn t_fail(trials: &[Trial]) -> String {
    trials
        .iter()
        .rev()
        .find_map(|t| t.failure.clone())
        .unwrap_or_default()
}

fn file_name(p: &std::path::Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
