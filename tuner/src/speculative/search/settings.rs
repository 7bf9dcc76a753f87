//! What the draft search is given: its settings, and each draft to measure as the worker loads it.

use crate::llama::{ContextSettings, ModelSettings};
use crate::speculative::ngram::NgramGrid;
use crate::speculative::prompts::Prompt;
use crate::speculative::serve::{DraftModel, Fault};
use crate::speculative::{DraftPlacement, Grid};
use std::path::PathBuf;
use std::time::Duration;

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
    pub(super) fn placed(&self, placement: Option<DraftPlacement>) -> &DraftModel {
        self.alternatives
            .iter()
            .find(|m| Some(m.placement()) == placement)
            .unwrap_or(&self.model)
    }
}
