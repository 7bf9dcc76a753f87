//! What a tuning run found and how it ended (`Engine::tune`'s answer), and where its baseline's
//! placement came from: the records reports and profiles are built from.

use super::result::CandidateResult;
use super::settings::TuneSettings;
use search_space::Candidate;
use serde::{Deserialize, Serialize};

/// Where the baseline's placement came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineSource {
    /// llama.cpp's defaults as they are: no device to offload to, or layers the user pinned.
    Defaults,
    /// llama-server's default placement: llama.cpp's fit under the run's budgets.
    LlamaFit,
    /// llama.cpp's fit gave no placement that could be measured: the most layers that fit by
    /// autotune's dry runs, at llama.cpp's split.
    DryRunFit,
}

/// The baseline's placement as a report and a profile name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselinePlacement {
    pub source: BaselineSource,
    /// What the headline compares the winner with ("llama.cpp's --fit placement").
    pub label: String,
    /// Why the fit was not used, or how its answer became a candidate when not exactly.
    pub note: Option<String>,
}

impl BaselinePlacement {
    pub fn new(source: BaselineSource, note: Option<String>) -> Self {
        let label = match source {
            BaselineSource::Defaults => "llama.cpp's defaults",
            BaselineSource::LlamaFit => "llama.cpp's --fit placement",
            BaselineSource::DryRunFit => "llama.cpp's defaults at the most layers that fit",
        };
        BaselinePlacement {
            source,
            label: label.to_string(),
            note,
        }
    }

    /// The baseline in a few words, beside the winner's figures ("winner vs defaults").
    pub fn short(&self) -> &str {
        match self.source {
            BaselineSource::LlamaFit => "llama.cpp's --fit",
            _ => "defaults",
        }
    }

    /// The leaderboard's tag for the baseline's row.
    pub fn tag(&self) -> &str {
        match self.source {
            // Unchanged from before the fit was asked, so CPU-only reports read as they did.
            BaselineSource::Defaults => "llama.cpp defaults",
            _ => &self.label,
        }
    }
}

/// What a tuning run found: every candidate's outcome, the winner after the confirmation rounds, and
/// how the run ended. Reports and profiles are built from it (`tuning`), never from flags.
#[derive(Debug, Clone)]
pub struct Run {
    pub settings: TuneSettings,
    pub results: Vec<CandidateResult>,
    pub winner: Option<Candidate>,
    /// llama.cpp's defaults as this run measured them (with an offload device, its fit's placement).
    pub baseline: Candidate,
    pub baseline_placement: BaselinePlacement,
    /// Relative drift of the winner and the runner-up over the confirmation rounds, by label.
    pub confirm_drift: Vec<(String, f64)>,
    /// The candidates the confirmation rounds re-measured (winner first).
    pub confirmed: Vec<Candidate>,
    pub interrupted: bool,
    pub budget_spent: bool,
    /// The search's axes the budget left unmeasured.
    pub not_reached: Vec<String>,
    /// The quality gate and every K/V pair held to it.
    pub quality: profiles::QualityRecord,
    /// Where the default budget grew: the seconds one visit of the baseline took (told from its
    /// figures where its repetitions were reused).
    pub visit_seconds: Option<f64>,
    /// Where a GPU shows through several backends: the configuration measured through each
    /// (`engine/backends.rs`); empty where each GPU has one backend or the axis was not reached.
    pub backends: Vec<BackendTried>,
    /// The run's time as said before the search went beyond llama.cpp's defaults.
    pub time_plan: Option<crate::measuring::TimePlan>,
    /// The axes not measured: the ceilings left nothing beyond the noise to win there.
    pub skipped_axes: Vec<crate::measuring::SkippedAxis>,
    /// A lossy finalist beside its lossless twin, as the confirmation measured them.
    pub twin: Option<TwinVerdict>,
}

/// One backend's configuration in the backend axis.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendTried {
    /// The ggml backend (`CUDA`, `Vulkan`).
    pub backend: String,
    pub candidate: Candidate,
    /// The axis chose it: the search went on through this backend.
    pub chosen: bool,
}

/// What the confirmation found for a lossy winner's lossless twin, for the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TwinVerdict {
    /// The lossy candidate and its twin, by label.
    pub lossy: String,
    pub twin: String,
    /// The lossy one's requests a second over the twin's, less one (0.05: 5% faster), on the
    /// confirmation's rounds; `None` where either was not measured enough to compare.
    pub ratio: Option<f64>,
    /// Which of the two the run chose.
    pub chose_lossy: bool,
}
