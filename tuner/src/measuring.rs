//! The measuring contract: what the engine asks of whatever measures for it, and what comes back.
//! A measurer runs one repetition of a configuration, a dry run of its memory, llama.cpp's own fit,
//! a device's bandwidth probe and a K/V cache pair's quality; the engine reports its progress
//! through [`Progress`]. The worker processes (`tuning`'s `Workers`, real llama.cpp) and the simulator
//! (`sim::SimMeasurer`, tests and the benches) implement it; the engine sees only this module.
//! The records the answers carry live in `profiles::measurements` (they are written to the
//! measurement log as they arrive) and are re-exported here.

/// The type of [`FitAnswer::devices`], which the simulator's fit writes.
#[cfg(test)]
pub use crate::llama::fit::FitDevice;
pub use crate::llama::fit::{FitAnswer, FitRequest, TensorOverride};
pub use crate::llama::{ContextSettings, ModelSettings};
pub use profiles::measurements::{
    DeviceBytes, LoadReport, Repetition, Screen, TrialFailure, Workload,
};
pub use profiles::QualityFigures;
use search_space::{CacheType, FlashAttn, Phases};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasureRequest {
    pub model: PathBuf,
    pub settings: ModelSettings,
    pub context: ContextSettings,
    pub workload: Workload,
    /// Seed of the random prompt tokens.
    pub seed: u64,
    /// Device memory (non-CPU devices) the dry run predicted for this configuration: the worker
    /// refuses a real load when less than this is free right before it (other processes, the
    /// tuner's own included, may hold memory the budgets did not see). Empty: no check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect: Vec<DeviceBytes>,
    /// Where the repetition stops ([`Response::GaveUp`]) once its own time proves it slower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub give_up: Option<GiveUp>,
    /// The phases to time (both by default): a group whose candidates differ only in knobs that
    /// cannot move one phase times the other alone ([`Repetition::timed`]).
    #[serde(default = "Phases::both", skip_serializing_if = "Phases::is_both")]
    pub phases: Phases,
}

/// A repetition's limit: more than `limit_ms` per request of the workload (its timed phases, the
/// warm-up not counted) and it cannot win, `limit_ms` being a multiple of `best_ms`, the best median
/// measured so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiveUp {
    pub limit_ms: u64,
    pub best_ms: u64,
}

/// What the measurer evaluates: the model with a K/V pair against the same model with f16, or
/// against the most precise file of a choice among quantizations (with f16 caches).
#[derive(Debug, Clone)]
pub struct KvQualityRequest {
    pub model: PathBuf,
    /// The file the figures are against; `None`: the model itself.
    pub reference: Option<PathBuf>,
    pub type_k: CacheType,
    pub type_v: CacheType,
    /// Flash attention as the candidate runs it (it changes the numbers).
    pub flash_attn: FlashAttn,
    /// The quantized cache's rotation as the candidate runs it.
    pub attn_rot: search_space::AttnRot,
    /// Where the candidate keeps its cache (`-nkvo`: in host memory).
    pub kv_offload: search_space::KvOffload,
    pub window: u32,
    /// Tokens evaluated at most: fewer where the verdict against `decide_at` is decided first.
    pub max_tokens: u32,
    /// The gate the figures are held to ([`crate::quant::kld::decided`]).
    pub decide_at: Option<f64>,
    pub threads: u32,
    /// Layers on the offload devices: the candidate's, which its budgets hold (the evaluation
    /// falls back to the CPU where the model does not load so).
    pub n_gpu_layers: u32,
    /// The devices the candidate's layers go to (empty: llama.cpp's default, every one).
    pub devices: Vec<String>,
}

/// The measurer's answer.
#[derive(Debug, Clone)]
pub struct KvQualityAnswer {
    /// The model with the pair against the reference.
    pub figures: QualityFigures,
    /// The model's weights alone against the reference, where the reference is another file.
    pub weights_kld: Option<f64>,
    /// The reference's file type where it is another file (`F16`).
    pub against: Option<String>,
    pub measured_with: profiles::MeasuredWith,
    pub cached: bool,
    pub seconds: f64,
}

/// Progress callbacks, so the CLI can draw a bar without the engine knowing about terminals.
pub trait Progress {
    fn candidate_started(&self, label: &str, axis: &str);
    fn repetition(&self, label: &str, rep: &Repetition);
    fn failed(&self, label: &str, failure: &str);
    /// A first repetition stopped as several times slower than the best (not a failure).
    fn stopped(&self, label: &str, why: &str) {
        self.failed(label, why)
    }
    fn best(&self, label: &str, margin: Option<f64>, elapsed: Duration, budget: Duration);
    /// A line worth the user's eye as it happens (a quality gate's verdict).
    fn note(&self, _line: &str) {}
    /// The run's time, set once llama.cpp's defaults are measured, before anything else is.
    fn plan(&self, _plan: &TimePlan) {}
    /// An axis left unmeasured: its best case could not beat the best so far beyond the noise.
    fn skipped(&self, _axis: &SkippedAxis) {}
}

/// The most each phase of a request could reach on this machine for this model, as the probes
/// found it: the prompt at the matrix-multiply peak of the machine's own kernels over the
/// multiplications a token needs, generation at the memory's read bandwidth over the bytes a token
/// reads (the roofline). Either may be unknown (`None`): no axis that moves it is then judged by it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ceilings {
    /// Prompt tokens a second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tps: Option<f64>,
    /// Generated tokens a second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_tps: Option<f64>,
    /// How each was found, one line each (the probes' methods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub method: Vec<String>,
}

/// The run's time as it is said before the search goes beyond llama.cpp's defaults: what one
/// request costs here, the budget in force and the time the search expects to take within it, and
/// how far the defaults are from the ceilings (the most the search could still gain).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimePlan {
    /// Seconds one request of the workload takes with llama.cpp's defaults (their median).
    pub request_s: f64,
    /// Seconds their first visit took: a load, the warm-up and two requests.
    pub visit_s: f64,
    /// Seconds one more repetition takes (their median): the request, and with a depth the cache
    /// filled first, for every sequence.
    pub repetition_s: f64,
    /// Seconds their load took (a first visit of a configuration whose model is not loaded pays
    /// one; one that changes only context settings does not).
    #[serde(default)]
    pub load_s: f64,
    /// Seconds of their first visit that were neither the load nor a repetition: the warm-up and
    /// the context's making, which every new context pays.
    #[serde(default)]
    pub warm_up_s: f64,
    /// Their prompt and generation rates (medians), which price a request of any size.
    #[serde(default)]
    pub pp_tps: f64,
    #[serde(default)]
    pub tg_tps: f64,
    /// The time budget in force, fixed from here on.
    pub budget_s: f64,
    /// What the search is expected to take, at most the budget: every axis with candidates, each
    /// new candidate a visit and its further repetitions, the confirmation rounds.
    pub expected_s: f64,
    /// What the quality gate's evaluation would add, said apart: it runs only where a quantized
    /// KV cache would win (on the host alone, seldom), and on a 7B it is minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_s: Option<f64>,
    /// The defaults' prompt rate as a share of the prompt's ceiling, where one is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_share: Option<f64>,
    /// The defaults' generation rate as a share of generation's ceiling, where one is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_share: Option<f64>,
    /// The most a request could still gain over the defaults (both phases at their ceilings,
    /// relative: 0.12 = 12% faster), where both ceilings are known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_most: Option<f64>,
    /// Where the budget came from.
    pub budget_from: BudgetFrom,
    /// The run's time when this was said (seconds).
    pub at_s: f64,
}

/// Where a run's time budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetFrom {
    /// `--budget`, `--quick`'s cap or `--exhaustive`'s.
    Given,
    /// The default, which the request's cost did not grow.
    Default,
    /// The default grown from what the defaults' first visit cost.
    Grown,
}

/// An axis of the search left unmeasured because its best case (every phase it can move at its
/// ceiling) could not beat the best so far by more than the noise threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedAxis {
    pub axis: String,
    /// The most a request could have gained on it (relative: 0.01 = 1% faster).
    pub at_most: f64,
}

/// What the engine measures through: on a user's run the worker processes running llama.cpp
/// ([`Workers`]); in tests and `bench/search-sim` a simulated landscape (`sim`). The engine's
/// clock is the measurer's too, so a simulated run spends simulated seconds of its budget.
pub trait Measurer {
    /// One repetition of the workload for a request, loading its model first when needed.
    fn measure(
        &mut self,
        req: &MeasureRequest,
        stop: &dyn Fn() -> bool,
    ) -> Result<Repetition, TrialFailure>;
    /// The dry run's memory per device for a request (nothing allocated); `Err` with the reason.
    fn footprint(
        &mut self,
        req: &MeasureRequest,
        stop: &dyn Fn() -> bool,
    ) -> Result<LoadReport, String>;
    /// llama.cpp's own fit (`common_fit_params`, llama-server's default `--fit`) asked for its
    /// placement under the request's budgets and context; `Err` with the reason when it gave none.
    fn llama_fit(&mut self, req: &FitRequest, stop: &dyn Fn() -> bool)
        -> Result<FitAnswer, String>;
    /// Each device's memory read bandwidth in bytes per second (its own kernels over a matrix in
    /// its memory, as `explain` measures it, within half the device's budget in bytes; through
    /// `rpc`'s servers where those are the devices); a device whose probe failed is left out.
    fn device_bandwidths(
        &mut self,
        devices: &[(String, u64)],
        rpc: &[String],
    ) -> Vec<(String, f64)>;
    /// The next-token distributions of the model with a K/V cache pair against the same model with
    /// f16 caches ([`gate`]); `Err` with the reason when they could not be had, or when `stop`
    /// says so or [`Self::elapsed`] reaches `ends_by` (the run's budget) first.
    fn kv_quality(
        &mut self,
        req: &KvQualityRequest,
        stop: &dyn Fn() -> bool,
        ends_by: Duration,
    ) -> Result<KvQualityAnswer, String>;
    /// How often the placement of this request has crashed its worker.
    fn crashes_for(&self, req: &MeasureRequest) -> u32;
    /// Lets go of every loaded model, so the next repetition runs on a fresh load.
    fn unload(&mut self);
    /// Ends every worker (the end of the run).
    fn shutdown(&mut self);
    /// Time since the run started (wall time for real, simulated seconds for the simulator).
    fn elapsed(&self) -> Duration;
}
