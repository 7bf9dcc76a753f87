//! What a run needs to know, in two layers: the [`Plan`] (the flags validated, what to tune for
//! and how, machine-independent) and the [`TuneSettings`] the engine reads (the plan, and what it
//! comes to on this machine for this model: the space of every knob the search may vary, the
//! budgets per device, the quality gate a quantized KV cache is held to). The engine changes only
//! the default time budget, and the context where `--ctx max` has it search for one.

use crate::measuring::{Ceilings, Workload};
use profiles::{Budgets, DeviceBudget};
use search_space::backend;
use search_space::{
    AttnRot, CacheType, FlashAttn, HostBuffer, KernelChoice, KvOffload, Numa, OpOffload, SplitMode,
};
use std::path::PathBuf;
use std::time::Duration;

/// What to tune for and how: the flags validated (`commands/settings.rs` builds it; nothing here
/// sees clap), the same on any machine and for any model. What it comes to on this machine for this
/// model (thread counts, layers, budgets per device) is resolved into [`TuneSettings`] by
/// `Plan::settings` (in `tuning`), which keeps the plan whole beside it: nothing is copied twice.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The request measured, named as the profile records it.
    pub workload: Workload,
    /// `--ctx max`: the workload's context is the most asked for (the trained context times the
    /// slots); `tuning::tune` measures at the largest that fits (see [`super::context`]).
    pub ctx_max: bool,
    pub noise: f64,
    pub min_reps: u32,
    pub max_reps: u32,
    pub candidate_cap: Duration,
    /// The whole run's time as asked (`--quick` caps it: [`TuneSettings::time_budget`] is the
    /// budget in force).
    pub time_budget: Duration,
    /// The budget is the default (no `--budget`): it may grow for a slow model.
    pub time_budget_grows: bool,
    pub seed: u64,
    /// Thread counts to try; `None`: 1, half the cores, the cores, all CPUs.
    pub threads: Option<Vec<u32>>,
    /// Prompt-processing thread counts to try; `None`: those of `threads`.
    pub threads_batch: Option<Vec<u32>>,
    /// Pinned GPU layers; `None`: all when a non-CPU device exists, else 0.
    pub n_gpu_layers: Option<u32>,
    /// Pinned host FFN layers (every layer offloaded, `--n-cpu-ffn`); `None`: searched.
    pub n_cpu_ffn: Option<u32>,
    pub kernels: Vec<KernelChoice>,
    /// Host buffers to try; `None`: `tuning` chooses for the machine.
    pub host_buffers: Option<Vec<HostBuffer>>,
    /// NUMA strategies to try; `None`: `tuning` chooses for the machine's nodes.
    pub numa: Option<Vec<Numa>>,
    /// Op offload settings to try (only `on` is measured without a GPU:
    /// [`TuneSettings::op_offload`]).
    pub op_offload: Vec<OpOffload>,
    /// KV offload settings allowed (`off`: the KV cache in host memory, a fit lever).
    pub kv_offload: Vec<KvOffload>,
    /// Rotations of a quantized cache allowed (`off` is lossy).
    pub attn_rot: Vec<AttnRot>,
    /// Dense FFNs in host memory (`--n-cpu-ffn`) may be a placement (not `--no-cpu-ffn`).
    pub host_ffns: bool,
    pub cache_types: Vec<CacheType>,
    /// The quality gate asked for (a quantized K/V cache wins only within it).
    pub kv_gate: GateChoice,
    /// The file the gate measures against, where it is not the model: in a choice among
    /// quantizations, the most precise one (the combination that will run is measured against it).
    pub quality_reference: Option<PathBuf>,
    pub flash_attn: Vec<FlashAttn>,
    /// Micro-batch sizes to try; empty: `tuning` chooses for the machine and workload
    /// ([`TuneSettings::ubatch_options`]).
    pub ubatch_options: Vec<u32>,
    pub rpc: Vec<String>,
    /// The backends a GPU several of them drive is measured through (`--backend`, ggml's names or
    /// any case of them); `None`: every one that drives a GPU.
    pub backends: Option<Vec<String>>,
    /// `--mem-budget` as given ([`TuneSettings::mem_budgets`]: every device's, resolved).
    pub mem_budgets: Vec<DeviceBudget>,
    pub mem_margin: u64,
    pub trial_timeout: Duration,
    /// `--quick`: fewer placements (the most layers that fit, half, none), a shorter budget.
    pub quick: bool,
    pub exhaustive: bool,
    /// Ignore earlier measurements; `resume`: fail when there are none.
    pub fresh: bool,
    pub resume: bool,
    pub verbose: bool,
    pub quiet: bool,
}

/// Everything a run needs to know: the [`Plan`], and what it comes to on this machine for this
/// model. What the plan says as it is (the workload, the protocol, the seed, the kernels, the flash
/// attention modes, the RPC servers, `--quick`) is read through `plan`.
#[derive(Debug, Clone)]
pub struct TuneSettings {
    pub plan: Plan,
    pub model: PathBuf,
    /// Total time for the run, in force (the plan's, `--quick`'s cap applied, grown by the engine
    /// for a slow model); what is not measured by then is reported as such.
    pub time_budget: Duration,
    /// `Some(cap)` for the default budget: once the baseline's first visit (its load, warm-up and
    /// two repetitions) shows what one configuration costs, the budget grows to [`super::VISITS`] such
    /// visits where that is more, up to `cap` (a 70B model on four GPUs takes half a minute a
    /// visit, and 10 minutes then end before the KV-cache axis).
    pub time_budget_cap: Option<Duration>,
    pub threads_options: Vec<u32>,
    /// Prompt-processing thread counts (`-tb`) for the prompt-threads axis.
    pub threads_batch_options: Vec<u32>,
    pub default_threads: u32,
    /// GPU layers: all that fit by default (searched downward from there when a non-CPU device
    /// exists); one count the user pinned with --n-gpu-layers is measured as given, never searched.
    pub n_gpu_layers: u32,
    /// Where host weights live (`mapped` alone unless a device with pinned host memory takes part
    /// or the user asked for more): varied where weights stay in host memory.
    pub host_buffers: Vec<HostBuffer>,
    /// The offload devices with pinned host memory (CUDA, Vulkan; not RPC servers): beside any of
    /// them llama.cpp puts host weights in that memory unless `--no-host`, so the CPU kernel choice
    /// changes nothing there.
    pub host_buffer_devices: Vec<String>,
    /// llama.cpp's NUMA strategies to try (`off` alone unless the machine has several NUMA nodes
    /// or the user asked for more).
    pub numa: Vec<Numa>,
    /// Op offload settings to try; only candidates that leave weights in host memory are varied
    /// (with every weight on a device nothing is left to offload).
    pub op_offload: Vec<OpOffload>,
    /// The K/V cache pairs searched (`search_space::kv_pairs` of the types given: each type for
    /// both, and K one step more precise than V where every device's backend runs the pair).
    pub kv_pairs: Vec<(CacheType, CacheType)>,
    /// How quantized caches are held to quality (`Engine::passes_gate`).
    pub quality: QualityGate,
    /// Micro-batch sizes to try: the plan's, or chosen for the machine and the workload.
    pub ubatch_options: Vec<u32>,

    /// The link to each device of the plan's RPC servers, measured before the run (empty without
    /// them): how the split search ranks hosts (`engine/hosts.rs`).
    pub links: Vec<profiles::HostLink>,
    /// Bytes each device may hold (device name → bytes); a candidate predicted to need more on any
    /// device is pruned without being loaded. A GPU several backends drive has one budget, which
    /// names it through each (`DeviceBudget::same_gpu`).
    pub mem_budgets: Budgets,
    /// The backends a GPU several of them drive is measured through (ggml's names: `CUDA`,
    /// `Vulkan`), the first where the search starts; fewer than two: no backend axis.
    pub backends: Vec<String>,
    /// The offload devices whose memory is the host's RAM (an integrated GPU, llvmpipe): what they
    /// and the host hold together is held to the host's budget, memory that is one memory being
    /// budgeted once.
    pub host_memory_devices: Vec<String>,
    /// Layers of the model (offload goes up to n_layers + 1, the output layer).
    pub n_layers: u32,
    /// Whether a non-CPU device exists to offload layers to.
    pub offload: bool,
    /// Whether the model is a mixture of experts (expert placement is searched).
    pub moe: bool,
    /// Split modes besides whole layers per device that the split group measures (`-sm row`,
    /// `-sm tensor`): where two or more GPUs of one backend run them ([`split_modes_for`]). The
    /// simulator cannot model either, so its runs offer none.
    pub split_modes: Vec<SplitMode>,
    /// The most each phase of a request could reach here, probed before the run (none where the
    /// probes cannot bound it: an offload device, a model the caches hold): an axis that could not
    /// gain beyond the noise by them is not measured (`engine/ceiling.rs`).
    pub ceilings: Ceilings,
    /// Whether the search screens candidates on a request shorter than the workload's and
    /// confirms the finalists on the workload's own (`engine/fidelity.rs`): where a request takes
    /// long even at the ceilings ([`super::worth_screening`]); not in grid mode.
    pub screen: bool,
}

impl TuneSettings {
    /// The GPU layers are pinned, not searched: by --n-gpu-layers, or by --n-cpu-ffn (every layer
    /// offloaded).
    pub fn n_gpu_layers_pinned(&self) -> bool {
        self.plan.n_gpu_layers.is_some() || self.plan.n_cpu_ffn.is_some()
    }
}

/// The split modes besides whole layers to measure on these offload devices' backends (one entry
/// per device): rows of every layer (`-sm row`, CUDA's) and tensor parallelism (`-sm tensor`,
/// llama.cpp's experimental mode, which needs flash attention and an f16 cache) where two or more
/// GPUs of one backend exist (not RPC servers, whose backend this machine does not know).
pub fn split_modes_for(backends: &[&str]) -> Vec<SplitMode> {
    let count = |b: &str| backends.iter().filter(|x| **x == b).count();
    let with = |can: fn(&backend::Backend) -> bool| {
        (backends.iter()).any(|b| can(&backend::of(b)) && count(b) >= 2)
    };
    let mut out = Vec::new();
    if with(|b| b.row_split) {
        out.push(SplitMode::Row);
    }
    if with(|b| b.tensor_split) {
        out.push(SplitMode::Tensor);
    }
    out
}

/// The default gate: the mean KL divergence (nats per token) a quantized K/V cache may add over
/// the f16 cache. On Llama 3 8B (llama.cpp PR 7412's table) a q8_0/q8_0 cache adds about 0.001 and
/// q8_0 weights with a q8_0/q8_0 cache 0.0016; weights at Q6_K add 0.0057, at Q5_K_M 0.011 and at
/// Q4_K_M 0.029 (llama.cpp PR 6936's table). 0.02 is twenty times a q8_0 cache there, between what
/// Q5_K_M and Q4_K_M weights cost (not the step from 6 to 5 bits a weight, about 0.005): q8_0
/// caches pass (on the 270M demo model 0.009), 4-bit caches that change one next token in five
/// (the demo model's q4_0: 0.110, top-1 81%) do not. Where a q4_0 cache lands on a 7-8B model was
/// not measured (docs/quality.md).
pub const DEFAULT_MAX_KV_KLD: f64 = 0.02;

/// Positions compared at the end of each window: their logits are what the evaluation holds in
/// memory at a time (a 262k vocabulary: 512 MiB a context).
pub const SCORED_POSITIONS: u32 = 512;

/// What the user asked of the gate (`--max-kv-kld`, `--no-quality-gate`), before the workload and
/// the machine make it a [`QualityGate`].
#[derive(Debug, Clone, PartialEq)]
pub enum GateChoice {
    /// Hold quantized caches to this mean KL divergence.
    On(f64),
    /// No gate, and why (said in the report and the profile).
    Off(String),
}

impl GateChoice {
    /// The gate for `workload`, with `threads` for the evaluation.
    pub fn gate(&self, workload: &Workload, threads: u32) -> QualityGate {
        match self {
            GateChoice::On(max) => QualityGate::on(*max, workload, threads),
            GateChoice::Off(why) => QualityGate::off(why, workload, threads),
        }
    }
}

/// How a run holds quantized caches to quality (validated from the flags).
#[derive(Debug, Clone, PartialEq)]
pub struct QualityGate {
    /// The gate; `None`: no gate (see `unchecked`).
    pub max_kv_kld: Option<f64>,
    /// Why there is no gate, for the report and the profile.
    pub unchecked: Option<String>,
    /// Tokens of each window of the evaluation text: a request's context, from
    /// [`window_for`].
    pub window: u32,
    /// Tokens of the text evaluated (whole windows).
    pub max_tokens: u32,
    pub threads: u32,
    /// The file the figures are against ([`Plan::quality_reference`]); `None`: the model.
    pub reference: Option<PathBuf>,
}

impl QualityGate {
    /// The default gate (or `max_kv_kld`) for `workload`.
    pub fn on(max_kv_kld: f64, workload: &Workload, threads: u32) -> Self {
        let window = window_for(workload);
        QualityGate {
            max_kv_kld: Some(max_kv_kld),
            unchecked: None,
            window,
            max_tokens: tokens_for(window),
            threads,
            reference: None,
        }
    }

    /// No gate, and why.
    pub fn off(why: &str, workload: &Workload, threads: u32) -> Self {
        QualityGate {
            max_kv_kld: None,
            unchecked: Some(why.to_string()),
            ..Self::on(0.0, workload, threads)
        }
    }
}

/// The window a request's cache fills: its depth, prompt and generation, rounded up to whole
/// [`SCORED_POSITIONS`] (at least one), however deep: the positions scored at its end are at the
/// workload's depth (a quantized cache hurts more as it fills). Where the built-in text is shorter
/// than the windows, each is filled with the text cycled before a segment held out of it
/// (`quant::windows`).
pub fn window_for(w: &Workload) -> u32 {
    let need = (w.depth + w.n_prompt + w.n_gen).max(1);
    need.div_ceil(SCORED_POSITIONS) * SCORED_POSITIONS
}

/// Tokens evaluated for a window: at least four windows' worth of scored positions (2048 tokens
/// at 512), else two whole windows (what the text holds).
fn tokens_for(window: u32) -> u32 {
    (2 * window).max(4 * SCORED_POSITIONS)
}

/// What the figures are measured on.
pub const TEXT: &str = "autotune's evaluation text (English prose, code and dialogue)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_modes_are_offered_where_two_gpus_of_one_backend_run_them() {
        use SplitMode::*;
        assert_eq!(split_modes_for(&["CUDA", "CUDA"]), [Row, Tensor]);
        assert_eq!(split_modes_for(&["Vulkan", "Vulkan"]), [Tensor]);
        assert!(split_modes_for(&["CUDA"]).is_empty());
        assert!(split_modes_for(&["CUDA", "Vulkan"]).is_empty());
        assert!(split_modes_for(&["RPC", "RPC"]).is_empty());
    }

    fn w(depth: u32, n_prompt: u32, n_gen: u32) -> Workload {
        Workload {
            n_ctx: 32768,
            n_prompt,
            n_gen,
            depth,
            n_parallel: 1,
            name: String::new(),
        }
    }

    #[test]
    fn the_window_is_a_requests_context_rounded_up_to_whole_scored_positions_however_deep() {
        assert_eq!(window_for(&w(0, 128, 32)), 512);
        assert_eq!(window_for(&w(0, 512, 128)), 1024);
        assert_eq!(window_for(&w(1024, 256, 256)), 1536);
        // A 16k-deep chat is judged at 16k: its scored positions begin past 16,384 tokens.
        let deep = window_for(&w(16384, 512, 128));
        assert_eq!(deep, 17408);
        assert!(deep - SCORED_POSITIONS >= 16384 + 512);
        assert_eq!(window_for(&w(100_000, 512, 128)), 100_864);
        assert_eq!(tokens_for(512), 2048);
        assert_eq!(tokens_for(4096), 8192);
        assert_eq!(tokens_for(deep), 2 * deep);
    }
}
