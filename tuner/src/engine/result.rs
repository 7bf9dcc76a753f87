//! One candidate's outcome in a run (its repetitions, memory, failure) and the objective the
//! decisions compare: the modelled seconds of one request of the workload.

use crate::measuring::TrialFailure;
use crate::measuring::{LoadReport, Repetition, Workload};
use crate::stats::{self, RoundRate, Sample};
use search_space::Candidate;
use serde::{Deserialize, Serialize};

/// [`CandidateResult::skipped`] of a candidate the time budget left unmeasured.
pub const BUDGET_SPENT: &str = "not measured: time budget spent";

/// One candidate's outcome in the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CandidateResult {
    pub candidate: Candidate,
    /// Memory per device predicted by a dry-run load (llama.cpp's no_alloc), before any real load.
    #[serde(default)]
    pub predicted: Option<LoadReport>,
    pub reps: Vec<Repetition>,
    /// The interleaved round each repetition was measured in (parallel to `reps`; `None` for one
    /// reused from an earlier run), so the decision rule can pair repetitions of the same round.
    #[serde(skip)]
    pub rounds: Vec<Option<u64>>,
    pub load: Option<LoadReport>,
    pub failure: Option<TrialFailure>,
    /// Why it was not measured (budget spent, placement skipped after crashes).
    pub skipped: Option<String>,
    /// Pruned as predicted over a device's memory budget (its reason in `skipped`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub over_budget: bool,
    /// A crash after it had measured: it was measured on, on a fresh worker; a second crash ends it
    /// ([`CandidateResult::failure`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crashed_once: Option<TrialFailure>,
    /// Why it took no more repetitions though it had measured (its placement crashed twice since,
    /// in other candidates): its figures stand on the repetitions it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
    pub seconds: f64,
}

impl CandidateResult {
    pub(crate) fn new(candidate: Candidate) -> Self {
        CandidateResult {
            candidate,
            predicted: None,
            reps: Vec::new(),
            rounds: Vec::new(),
            load: None,
            failure: None,
            skipped: None,
            over_budget: false,
            crashed_once: None,
            halted: None,
            seconds: 0.0,
        }
    }

    pub fn ok(&self) -> bool {
        self.failure.is_none() && self.skipped.is_none() && self.reps.len() >= 2
    }

    /// It did not fit: pruned as over a device's budget, or its load ran out of memory.
    pub fn did_not_fit(&self) -> bool {
        self.over_budget
            || self
                .failure
                .as_ref()
                .is_some_and(TrialFailure::out_of_memory)
    }

    /// What a first visit (the load, then two repetitions) took, told from the figures of
    /// repetitions reused from an earlier run (which cost nothing now): the load's seconds and
    /// each repetition's phases at its rates. The warm-up is not counted: a little short.
    pub(crate) fn visit_seconds_from_figures(&self, w: &Workload) -> f64 {
        let load = self.load.as_ref().map_or(0.0, |l| l.load_seconds);
        load + (self.reps.iter().take(2))
            .map(|r| rep_seconds(r, w))
            .sum::<f64>()
    }

    /// Seconds per request of the workload, per repetition (the objective, lower is better).
    pub fn scores(&self, w: &Workload) -> Vec<f64> {
        self.reps.iter().map(|r| score_seconds(r, w)).collect()
    }

    /// Requests per second per repetition (higher is better), for the statistics.
    pub fn rate_sample(&self, w: &Workload) -> Option<Sample> {
        Sample::new(self.scores(w).iter().map(|s| 1.0 / s).collect()).ok()
    }

    /// Requests per second per repetition, each with its round, for [`stats::decide`].
    pub fn round_rates(&self, w: &Workload) -> Vec<RoundRate> {
        self.reps
            .iter()
            .enumerate()
            .map(|(k, r)| RoundRate {
                round: self.rounds.get(k).copied().flatten(),
                rate: 1.0 / score_seconds(r, w),
            })
            .collect()
    }

    /// The decision rule between two candidates' request rates (paired over shared rounds).
    pub fn compare_with(
        &self,
        other: &CandidateResult,
        w: &Workload,
        noise: f64,
        seed: u64,
    ) -> Option<stats::Comparison> {
        stats::decide(&self.round_rates(w), &other.round_rates(w), noise, seed)
    }

    /// Bytes the load holds ([`LoadReport::held_bytes`]: llama.cpp's figures, its mapped buffers as
    /// the pages inference read), else the dry run's prediction (0 when neither is known).
    pub fn mem_bytes(&self) -> u64 {
        self.load
            .as_ref()
            .or(self.predicted.as_ref())
            .map(|l| l.held_bytes())
            .unwrap_or(0)
    }
}

/// The objective: expected seconds for one request of the workload,
/// `n_prompt / pp + n_gen / tg`, with pp and tg measured at depth when a depth is set (a request in
/// a long chat processes its prompt after what the cache holds, then generates).
pub fn score_seconds(r: &Repetition, w: &Workload) -> f64 {
    let (pp, tg) = if w.depth > 0 {
        (
            r.pp_depth_tps.unwrap_or(r.pp_tps),
            r.tg_depth_tps.unwrap_or(r.tg_tps),
        )
    } else {
        (r.pp_tps, r.tg_tps)
    };
    w.n_prompt as f64 / pp.max(1e-9) + w.n_gen as f64 / tg.max(1e-9)
}

/// What a repetition's phases took, at its rates: the request at no depth, and with a depth the
/// cache filled to it (at the shallow prompt rate) and the request again there; every sequence's
/// (the rates are all sequences' together).
pub(crate) fn rep_seconds(r: &Repetition, w: &Workload) -> f64 {
    let shallow = Workload {
        depth: 0,
        ..w.clone()
    };
    let mut s = score_seconds(r, &shallow);
    if w.depth > 0 && r.tg_depth_tps.is_some() {
        s += f64::from(w.depth) / r.pp_tps.max(1e-9) + score_seconds(r, w);
    }
    s * f64::from(w.n_parallel.max(1))
}

/// Among tied candidates: less memory first, then fewer changed knobs, then the label (stable).
pub(super) fn tie_break(a: &CandidateResult, b: &CandidateResult) -> std::cmp::Ordering {
    a.mem_bytes()
        .cmp(&b.mem_bytes())
        .then(
            a.candidate
                .kv_bytes_factor()
                .total_cmp(&b.candidate.kv_bytes_factor()),
        )
        .then(a.candidate.complexity().cmp(&b.candidate.complexity()))
        .then(a.candidate.cmp(&b.candidate))
}
