//! What the draft search measures and chooses: each configuration's [`Trial`], each draft file's
//! [`DraftEntry`], the [`Winner`] and the whole [`Outcome`] (the report's figures, as JSON too).

use crate::speculative::mtp::{self, MtpParams, DRAFT_MTP};
use crate::speculative::ngram::{NgramParams, NGRAM_SIMPLE};
use crate::speculative::verify::OutputCheck;
use crate::speculative::{DraftParams, DraftPlacement};
use crate::stats::{Comparison, Summary};
use serde::Serialize;
use std::path::PathBuf;

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
    pub(super) fn new(
        params: Option<DraftParams>,
        placement: Option<DraftPlacement>,
        stage: &str,
    ) -> Trial {
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
            return mtp::label(m);
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
            return mtp::label(m);
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
