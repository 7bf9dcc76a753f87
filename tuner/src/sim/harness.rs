//! Runs the engine on a simulated landscape the way `autotune tune` runs it (search, confirmation of
//! the winner and runner-up, the final choice), for the engine's tests and `bench/search-sim`.

use super::{Device, Host, Landscape, SimMeasurer, SimModel, Trace, GIB, MIB};
use crate::engine::baseline::{BaselinePlacement, FitPlacement};
use crate::engine::DEFAULT_MAX_KV_KLD;
use crate::engine::{
    self, CandidateResult, Engine, GateChoice, Plan, Progress, QualityGate, TuneSettings,
};
use crate::measuring::FitRequest;
use crate::measuring::{Repetition, Workload};
use search_space::{
    CacheType, Candidate, FlashAttn, HostBuffer, KernelChoice, KvOffload, OpOffload,
};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// The margin `autotune tune` keeps free on each device by default.
pub const MARGIN: u64 = 256 * MIB;

/// Progress that draws nothing.
pub struct Quiet;

impl Progress for Quiet {
    fn candidate_started(&self, _: &str, _: &str) {}
    fn repetition(&self, _: &str, _: &Repetition) {}
    fn failed(&self, _: &str, _: &str) {}
    fn best(&self, _: &str, _: Option<f64>, _: Duration, _: Duration) {}
}

/// A 70B-class model on `n` GPUs of `mem` bytes each (24 GB-class bandwidth), a 16-core host,
/// 1% noise, no load offsets, no crashes.
pub fn gpus(n: usize, mem: u64) -> Landscape {
    Landscape {
        host: Host {
            bandwidth: 80e9,
            flops_per_core: 60e9,
            physical_cores: 16,
            numa_nodes: 1,
        },
        devices: (0..n)
            .map(|i| Device {
                name: format!("CUDA{i}"),
                mem_bytes: mem,
                bandwidth: 900e9,
                flops: 80e12,
                link: 25e9,
                host_buffer: true,
                latency: 0.0,
            })
            .collect(),
        model: SimModel::llama_70b(),
        overhead_s: 0.5e-3,
        noise: 0.01,
        load_spread: 0.0,
        crash_rate: 0.0,
        fit_undercount: 0,
        other_backends: Vec::new(),
    }
}

/// `autotune tune`'s defaults for this landscape (16 physical cores, 32 logical), budgets of each
/// device's memory less the default margin.
pub fn settings(land: &Landscape, seed: u64) -> TuneSettings {
    let offload = !land.devices.is_empty();
    let workload = Workload {
        n_ctx: 4096,
        n_prompt: 512,
        n_gen: 128,
        depth: 0,
        n_parallel: 1,
        name: String::new(),
    };
    let cache_types = [CacheType::F16, CacheType::Q8_0, CacheType::Q4_0];
    TuneSettings {
        plan: plan(workload.clone(), seed, &cache_types),
        model: "simulated.gguf".into(),
        ubatch_options: crate::tuning::ubatch_options(&[], &workload, offload),
        time_budget: Duration::from_secs(4 * 3600),
        time_budget_cap: None,
        threads_options: vec![1, 8, 16, 32],
        threads_batch_options: vec![1, 8, 16, 32],
        default_threads: 16,
        n_gpu_layers: if offload { land.model.n_layers + 1 } else { 0 },
        host_buffers: if land.devices.iter().any(|d| d.host_buffer) {
            vec![HostBuffer::Mapped, HostBuffer::Pinned, HostBuffer::Cpu]
        } else {
            vec![HostBuffer::Mapped]
        },
        host_buffer_devices: (land.devices.iter())
            .filter(|d| d.host_buffer)
            .map(|d| d.name.clone())
            .collect(),
        numa: vec![search_space::Numa::Off],
        op_offload: if offload {
            vec![OpOffload::On, OpOffload::Off]
        } else {
            vec![OpOffload::On]
        },
        // As a CUDA build without GGML_CUDA_FA_ALL_QUANTS runs them: K and V of one type beside a
        // GPU; every pair on the CPU alone.
        kv_pairs: search_space::kv_pairs(&cache_types, |_, _| !offload),
        quality: QualityGate::on(DEFAULT_MAX_KV_KLD, &workload, 16),
        links: land.links(),
        mem_budgets: budgets(land),
        host_memory_devices: Vec::new(),
        backends: backends(land),
        n_layers: land.model.n_layers,
        offload,
        moe: land.model.moe.is_some(),
        // The simulator models neither -sm row nor -sm tensor: they are measured on real devices.
        split_modes: Vec::new(),
        // What the probes would find where the host alone computes (none beside a device).
        ceilings: land.ceilings(&workload),
        screen: crate::engine::fidelity::worth_screening(&workload, &land.ceilings(&workload)),
    }
}

/// `autotune tune`'s plan unasked (what its flags default to), at `workload` with `seed`.
fn plan(workload: Workload, seed: u64, cache_types: &[CacheType]) -> Plan {
    Plan {
        workload,
        ctx_max: false,
        noise: 0.02,
        min_reps: 3,
        max_reps: 10,
        candidate_cap: crate::tuning::CANDIDATE_CAP,
        time_budget: Duration::from_secs(4 * 3600),
        time_budget_grows: false,
        seed,
        threads: None,
        threads_batch: None,
        n_gpu_layers: None,
        n_cpu_ffn: None,
        kernels: vec![KernelChoice::Repack, KernelChoice::Plain],
        host_buffers: None,
        numa: None,
        op_offload: vec![OpOffload::On, OpOffload::Off],
        kv_offload: vec![KvOffload::On, KvOffload::Off],
        // The landscapes model no rotation: a rotation axis would measure ties.
        attn_rot: vec![search_space::AttnRot::On],
        host_ffns: true,
        cache_types: cache_types.to_vec(),
        kv_gate: GateChoice::On(DEFAULT_MAX_KV_KLD),
        quality_reference: None,
        flash_attn: vec![FlashAttn::Auto, FlashAttn::On, FlashAttn::Off],
        ubatch_options: Vec::new(),
        rpc: Vec::new(),
        backends: None,
        mem_budgets: Vec::new(),
        mem_margin: MARGIN,
        trial_timeout: Duration::from_secs(300),
        quick: false,
        exhaustive: false,
        fresh: false,
        resume: false,
        verbose: false,
        quiet: true,
    }
}

/// Each device's memory less the default margin, a GPU seen through several backends named by
/// each (one budget per GPU, as `autotune tune` gives it).
pub fn budgets(land: &Landscape) -> profiles::Budgets {
    let mut b: profiles::Budgets = (land.devices.iter())
        .map(|d| (d.name.clone(), d.mem_bytes.saturating_sub(MARGIN)))
        .collect();
    for o in &land.other_backends {
        b.0[o.device].same_gpu.push(o.name.clone());
    }
    b
}

/// The backends of the backend axis: where a GPU shows through others, each backend that drives
/// one so seen, the listed device's first.
pub fn backends(land: &Landscape) -> Vec<String> {
    let backend = |n: &str| crate::engine::backend_of_device(n).to_string();
    let mut out: Vec<String> = Vec::new();
    for o in &land.other_backends {
        for b in [backend(&land.devices[o.device].name), backend(&o.name)] {
            if !out.contains(&b) {
                out.push(b);
            }
        }
    }
    out
}

/// What one simulated run left behind.
pub struct SimRun {
    pub results: Vec<CandidateResult>,
    pub winner: Option<Candidate>,
    /// The winner of the search before the confirmation rounds.
    pub searched: Option<Candidate>,
    pub runner_up: Option<Candidate>,
    pub baseline: Candidate,
    pub baseline_placement: BaselinePlacement,
    pub drift: Vec<(Candidate, f64)>,
    pub trace: Rc<RefCell<Trace>>,
    /// The quality gate and the K/V pairs held to it.
    pub quality: profiles::QualityRecord,
    pub budget_spent: bool,
    /// The axes the budget ran out before.
    pub not_reached: Vec<String>,
    pub seconds: f64,
    /// The budget at the end (a default one may have grown) and the visit it grew on.
    pub budget: Duration,
    pub visit_seconds: Option<f64>,
    /// What the backend axis measured.
    pub backends: Vec<crate::engine::BackendTried>,
    /// The run's time as said once the defaults were measured.
    pub time_plan: Option<crate::measuring::TimePlan>,
    /// The axes the ceilings left nothing to win on.
    pub skipped_axes: Vec<crate::measuring::SkippedAxis>,
}

/// How the run searches: coordinate descent, or every placement × every knob value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Search,
    Grid,
}

/// Tunes on the landscape: the search (or the grid), then confirm and choose, as `tune` does.
pub fn tune(
    land: Landscape,
    s: TuneSettings,
    crashing: Option<fn(&Candidate) -> bool>,
    mode: Mode,
) -> SimRun {
    let seed = s.plan.seed;
    let mut m = SimMeasurer::new(land, seed);
    m.crashing = crashing;
    tune_with(m, s, mode)
}

/// [`tune`] through a measurer set up by the caller (a failing llama.cpp fit, say).
pub fn tune_with(m: SimMeasurer, s: TuneSettings, mode: Mode) -> SimRun {
    tune_logged(m, s, mode, None)
}

/// [`tune_with`], appending to (and reusing what is in) a measurement log, as `tune` does.
pub fn tune_logged(
    m: SimMeasurer,
    s: TuneSettings,
    mode: Mode,
    log: Option<&mut profiles::measurements::MeasurementLog>,
) -> SimRun {
    let trace = Rc::clone(&m.trace);
    let stop = || false;
    let mut e = Engine::new(s, Box::new(m), log, &stop, &Quiet);
    let searched = match mode {
        Mode::Search => e.run(),
        Mode::Grid => full_grid(&mut e),
    };
    let done = e.conclude(searched.clone());
    let (winner, drift) = (done.winner, done.drift);
    // The runner-up the confirmation measured beside the winner (not the defaults nor a twin).
    let runner_up = done.confirmed.get(1).cloned();
    let (baseline, baseline_placement) = e.baseline_and_placement();
    SimRun {
        baseline,
        baseline_placement,
        budget_spent: e.budget_spent,
        not_reached: std::mem::take(&mut e.not_reached),
        seconds: e.elapsed().as_secs_f64(),
        budget: e.settings.time_budget,
        visit_seconds: e.visit_seconds,
        backends: std::mem::take(&mut e.backend_trials),
        time_plan: e.time_plan.take(),
        skipped_axes: std::mem::take(&mut e.skipped_axes),
        quality: e.quality_record(),
        results: std::mem::take(&mut e.results),
        winner,
        searched,
        runner_up,
        drift,
        trace,
    }
}

/// Every placement the search would consider × every combination of the knob values, measured in
/// one group with the same protocol, then the same decision rule.
fn full_grid(e: &mut Engine) -> Option<Candidate> {
    let base = e.baseline();
    let start = e.placement_start(&base);
    let mut placements = e.placement_group(&start);
    if !placements.contains(&base) {
        placements.push(base.clone());
    }
    let mut all: Vec<Candidate> = Vec::new();
    for p in &placements {
        for c in engine::grid(&e.settings, p) {
            if !all.contains(&c) && e.check_fit(&c).is_ok() {
                all.push(c);
            }
        }
    }
    e.measure_group(&all, "grid");
    e.choose(&all)
}

/// `c` with the experts of one layer fewer on the host (it has some there).
pub fn one_host_expert_layer_fewer(c: &Candidate) -> Candidate {
    Candidate {
        n_cpu_moe: c.n_cpu_moe - 1,
        ..c.clone()
    }
}

/// Whether `c` may win under the run's quality gate: lossless caches, no gate, or its K/V pair's
/// divergence on the landscape within it.
pub fn within_gate(land: &Landscape, s: &TuneSettings, c: &Candidate) -> bool {
    !c.kv_lossy() || (s.quality.max_kv_kld).is_none_or(|max| land.kv_kld(c.type_k, c.type_v) <= max)
}

/// Whether a candidate fits every device's budget (by the model, as the dry run would say).
pub fn fits(land: &Landscape, s: &TuneSettings, c: &Candidate) -> bool {
    land.footprint(c, s.plan.workload.n_ctx)
        .per_device
        .iter()
        .all(|d| (s.mem_budgets.of(&d.device)).is_none_or(|b| d.bytes <= b))
}

/// The most GPU layers that fit with `c`'s other settings, found by trying every count.
pub fn max_fit(land: &Landscape, s: &TuneSettings, c: &Candidate) -> Option<u32> {
    (0..=land.model.n_layers + 1).rev().find(|&n| {
        fits(
            land,
            s,
            &Candidate {
                n_gpu_layers: n,
                ..c.clone()
            },
        )
    })
}

/// llama.cpp's fit placement on the landscape under the run's budgets and context, as a candidate of
/// llama.cpp's defaults: the baseline a run must measure when a device exists.
pub fn llama_fit(land: &Landscape, s: &TuneSettings) -> Candidate {
    let req = FitRequest {
        model: s.model.clone(),
        rpc: Vec::new(),
        n_ctx: s.plan.workload.n_ctx,
        sequences: s.plan.workload.n_parallel,
        budgets: s.mem_budgets.clone(),
        default_margin: u64::MAX,
    };
    let (answer, _) = land.llama_fit(&req);
    let defaults = Candidate::llama_default(s.default_threads, s.n_gpu_layers);
    FitPlacement::of(&answer, land.model.n_layers)
        .candidate(&defaults, &answer)
        .expect("the simulated fit's placement is a candidate")
        .0
}

/// Bytes of `GIB` as a float, for messages.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

/// The result of candidate `c` in the run, if it was measured or tried.
pub fn result<'r>(run: &'r SimRun, c: &Candidate) -> Option<&'r CandidateResult> {
    run.results.iter().find(|r| &r.candidate == c)
}

/// Runs `f` on an engine measuring the landscape (for tests of one group at a time).
pub fn with_engine<T>(land: Landscape, s: TuneSettings, f: impl FnOnce(&mut Engine) -> T) -> T {
    let stop = || false;
    let m = SimMeasurer::new(land, s.plan.seed);
    let mut e = Engine::new(s, Box::new(m), None, &stop, &Quiet);
    f(&mut e)
}
