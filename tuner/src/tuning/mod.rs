//! Tuning one model file on this machine: validated settings ([`Plan`]) in, a [`Tuned`] out — the
//! engine's [`Run`] with everything a report and a profile need (the model, the machine, the
//! llama.cpp build, the measurement log). `autotune tune` and the quantization ladder both tune
//! through [`tune`]; neither sees flags.

mod backends;
mod ceilings;
pub mod joint;
mod kv_pairs;
mod measurer;
mod output;
mod progress;

pub use output::{complete, nothing_measured, profile_from_run, report_of, save, After};

use crate::busy::{self, Watch};
use crate::engine::context::{self, ContextChoice};
use crate::engine::{Engine, GateChoice, Plan, QualityGate, Run, TuneSettings};
use crate::exit::{self, Exit};
use crate::machine::Machine;
use crate::measuring::Workload;
use crate::probe::{self, Probe};
use crate::session;
use crate::term::Bar;
use crate::worker::WorkerPool;
use anyhow::Context as _;
use measurer::Workers;
use profiles::measurements::{self, MeasurementLog};
use search_space::gguf::GgufInfo;
use search_space::identity::ModelIdentity;
use search_space::{CacheType, HostBuffer, Numa, OpOffload};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The search budget of `--quick` (a ceiling: a shorter budget still wins).
const QUICK_BUDGET: Duration = Duration::from_secs(50);

/// `--budget`'s default: 10 minutes, growing (see [`crate::engine::TuneSettings::time_budget_cap`]) up
/// to [`GROWN_BUDGET_CAP`].
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(600);

/// A candidate with its minimum repetitions gets more only while its time in the group (loads
/// included) is under this (`--thorough`: [`THOROUGH_CANDIDATE_CAP`], `--quick`:
/// [`QUICK_CANDIDATE_CAP`]).
pub const CANDIDATE_CAP: Duration = Duration::from_secs(40);
/// [`CANDIDATE_CAP`] with `--thorough`.
pub const THOROUGH_CANDIDATE_CAP: Duration = Duration::from_secs(120);
/// [`CANDIDATE_CAP`] with `--quick`.
pub const QUICK_CANDIDATE_CAP: Duration = Duration::from_secs(8);

/// The most a default budget grows to, for a model whose configurations take long to measure,
/// where a device takes layers (on the host alone it does not grow).
pub const GROWN_BUDGET_CAP: Duration = Duration::from_secs(1800);

impl Plan {
    /// The engine's settings for `model` on `machine`.
    pub fn settings(
        &self,
        model: &Path,
        machine: &Machine,
        info: &GgufInfo,
        pairs: &kv_pairs::PairSupport,
    ) -> anyhow::Result<TuneSettings> {
        let (threads_options, threads_batch_options, default_threads) =
            self.threads_for(machine)?;
        let offload = !machine.offload_devices().is_empty();
        let n_layers = info.block_count.unwrap_or(0);
        if let Some(n) = self.n_cpu_ffn {
            check_host_ffns(n, n_layers, offload, info.is_moe())?;
        }
        Ok(TuneSettings {
            plan: self.clone(),
            model: model.to_path_buf(),
            // --quick: at most 50 s of search, so with the confirmation and the last repetition in
            // flight the run measures for under a minute.
            time_budget: if self.quick {
                self.time_budget.min(QUICK_BUDGET)
            } else {
                self.time_budget
            },
            // On the host alone the search has no placements, split or backends to walk: the
            // default budget is its cap (a slow model's request is sized down instead, and its
            // axes with nothing to win are skipped).
            time_budget_cap: (self.time_budget_grows && !self.quick && !self.exhaustive).then_some(
                if offload {
                    GROWN_BUDGET_CAP
                } else {
                    DEFAULT_BUDGET
                },
            ),
            threads_options,
            threads_batch_options,
            default_threads,
            n_gpu_layers: match (self.n_gpu_layers, self.n_cpu_ffn) {
                (Some(n), _) => n,
                (None, Some(_)) => n_layers + 1,
                (None, None) if offload => n_layers + 1,
                (None, None) => 0,
            },
            host_buffers: host_buffer_options(self.host_buffers.as_deref(), machine),
            host_buffer_devices: host_buffer_devices(machine),
            numa: numa_options(self.numa.as_deref(), machine.numa_nodes),
            op_offload: op_offload_options(&self.op_offload, machine),
            kv_pairs: kv_pairs::kv_pairs_for(&self.cache_types, machine, pairs),
            quality: self.gate_for(default_threads),
            ubatch_options: ubatch_options(&self.ubatch_options, &self.workload, offload),
            links: Vec::new(),
            mem_budgets: session::budgets_of(&self.mem_budgets, self.mem_margin, machine)?,
            host_memory_devices: (machine.offload_devices().into_iter())
                .chain(machine.other_backends.iter().map(|o| &o.device))
                .filter(|d| d.shares_host_memory())
                .map(|d| d.name.clone())
                .collect(),
            backends: backends::backends_for(self.backends.as_deref(), machine)?,
            n_layers,
            offload,
            moe: info.is_moe(),
            split_modes: crate::engine::split_modes_for(
                &(machine.offload_devices().iter())
                    .map(|d| d.backend.as_str())
                    .collect::<Vec<_>>(),
            ),
            ceilings: crate::measuring::Ceilings::default(),
            // Set once the ceilings are probed ([`resolve`]).
            screen: false,
        })
    }
}

impl Plan {
    /// The thread counts to try for generation and for prompts, and the default among them
    /// (llama.cpp's own where it is tried).
    fn threads_for(&self, machine: &Machine) -> anyhow::Result<(Vec<u32>, Vec<u32>, u32)> {
        let logical = machine.logical_cpus.max(1);
        let cpus = crate::inputs::logical_cpus().max(logical);
        let given = |flag: &str, t: &[u32]| -> anyhow::Result<Vec<u32>> {
            crate::inputs::threads(flag, t, cpus)?;
            Ok(t.to_vec())
        };
        let threads_options = match &self.threads {
            Some(t) => given("--threads", t)?,
            None => thread_options(machine),
        };
        // llama.cpp's default thread count is its "math" cores: the physical cores, or a hybrid
        // CPU's performance cores.
        let llama_default = machine.llama_default_threads();
        let default_threads = if threads_options.contains(&llama_default) {
            llama_default
        } else {
            threads_options[0]
        };
        let threads_batch_options = match &self.threads_batch {
            Some(t) => given("--threads-batch", t)?,
            None => threads_options.clone(),
        };
        Ok((threads_options, threads_batch_options, default_threads))
    }
}

/// The offload devices (through any backend) with pinned host memory.
fn host_buffer_devices(machine: &Machine) -> Vec<String> {
    (machine.offload_devices().into_iter())
        .chain(machine.other_backends.iter().map(|o| &o.device))
        .filter(|d| d.host_buffer)
        .map(|d| d.name.clone())
        .collect()
}

impl Plan {
    /// The quality gate of this plan: as asked, except that K/V types given without f16 were
    /// asked for as they are (there is no lossless cache to fall back to).
    fn gate_for(&self, threads: u32) -> QualityGate {
        let choice = match &self.kv_gate {
            GateChoice::On(_) if !self.cache_types.contains(&CacheType::F16) => {
                GateChoice::Off("the KV cache types were given without f16 (--cache-types)".into())
            }
            c => c.clone(),
        };
        QualityGate {
            reference: self.quality_reference.clone(),
            ..choice.gate(&self.workload, threads)
        }
    }
}

/// `--n-cpu-ffn N` on this model and machine: a dense model's layers, with a device to offload
/// them to.
fn check_host_ffns(n: u32, n_layers: u32, offload: bool, moe: bool) -> anyhow::Result<()> {
    let why = if moe {
        "the model is a mixture of experts: its FFNs are experts, placed by the search (llama.cpp's --n-cpu-moe)".to_string()
    } else if !offload {
        "there is no GPU or RPC device to offload the layers to".to_string()
    } else if n > n_layers {
        format!("the model has {n_layers} layers; give at most {n_layers}")
    } else {
        return Ok(());
    };
    Err(Exit::new(exit::USAGE, format!("--n-cpu-ffn {n}: {why}")))
}

/// The op offload settings worth measuring on `machine`: those asked for where a device other than an
/// RPC server takes layers (RPC devices take no host operations, and without a device there is
/// nothing to offload to), else llama.cpp's default alone (when it was asked for).
fn op_offload_options(asked: &[OpOffload], machine: &Machine) -> Vec<OpOffload> {
    let takes_ops = machine.offload_devices().iter().any(|d| !d.is_rpc());
    if takes_ops || !asked.contains(&OpOffload::On) {
        asked.to_vec()
    } else {
        vec![OpOffload::On]
    }
}

/// Where host weights may live: those asked for, else beside an offload device with pinned host
/// memory (CUDA, Vulkan) llama.cpp's default (mapped), its pinned memory (`--load-mode none`) and the
/// CPU's repacking buffers (`--no-host`), else mapped alone (without such a device the three differ
/// only in whether the file is mapped).
fn host_buffer_options(asked: Option<&[HostBuffer]>, machine: &Machine) -> Vec<HostBuffer> {
    match asked {
        Some(a) => a.to_vec(),
        None if machine.offload_devices().iter().any(|d| d.host_buffer) => {
            vec![HostBuffer::Mapped, HostBuffer::Pinned, HostBuffer::Cpu]
        }
        None => vec![HostBuffer::Mapped],
    }
}

/// The thread counts tried unasked: 1, half the physical cores, the physical cores, every logical
/// CPU, and on a hybrid CPU its performance cores alone (llama.cpp's default there: a 24-core
/// CPU with 8 performance cores would otherwise be tried at 1, 12, 24 and 32 threads, never 8).
fn thread_options(machine: &Machine) -> Vec<u32> {
    let physical = machine.physical_cores.max(1);
    let logical = machine.logical_cpus.max(1);
    let mut v = vec![1, (physical / 2).max(1), physical, logical];
    v.extend(machine.performance_cores);
    v.sort_unstable();
    v.dedup();
    v
}

/// The NUMA strategies to try: those asked for, else on a machine with several NUMA nodes
/// llama.cpp's default (off) and both of its strategies (a 2-node Threadripper ran generation
/// about 2x faster with `--numa distribute`, llama.cpp issue 13850; chunking and page placement
/// can as well make it slower), else off alone (on one node llama.cpp treats them all as off).
fn numa_options(asked: Option<&[Numa]>, nodes: u32) -> Vec<Numa> {
    match asked {
        Some(a) => a.to_vec(),
        None if nodes > 1 => vec![Numa::Off, Numa::Distribute, Numa::Isolate],
        None => vec![Numa::Off],
    }
}

/// The largest micro-batch tried unasked.
const MAX_AUTO_UBATCH: u32 = 4096;

/// The micro-batch sizes to try: those asked for, else llama.cpp's 512 and the smaller 256 and 128
/// (smaller compute buffers: a fit lever), and, where a non-CPU device takes layers and the prompt
/// is longer than 512 tokens (with `--parallel N`, the N prompts processed together), the powers
/// of two above 512 up to the first that holds the whole prompt (at most [`MAX_AUTO_UBATCH`] and
/// the context). A larger micro-batch spreads each batch's
/// fixed costs over more tokens on a GPU (kernel launches, and with op offload the host's weights
/// copied over the link once per batch); on a CPU it does not pay (the demo model, 2048-token
/// prompt, 2 cores: 373 t/s at -ub 2048, 400 at 512) and its compute buffer grows with it.
pub(crate) fn ubatch_options(asked: &[u32], w: &Workload, offload: bool) -> Vec<u32> {
    if !asked.is_empty() {
        return asked.to_vec();
    }
    let mut v = vec![512, 256, 128];
    let mut ub = 1024;
    let prompt = w.n_prompt.saturating_mul(w.n_parallel.max(1));
    while offload && ub <= MAX_AUTO_UBATCH.min(w.n_ctx) && ub / 2 < prompt {
        v.push(ub);
        ub *= 2;
    }
    v
}

/// One model file tuned on this machine.
#[derive(Debug)]
pub struct Tuned {
    /// The model file, canonical.
    pub model: PathBuf,
    pub info: GgufInfo,
    pub identity: ModelIdentity,
    pub probe: Probe,
    pub llama: profiles::LlamaBuild,
    /// The RPC servers the run used as devices.
    pub rpc: Vec<String>,
    /// How `--ctx max` chose the context.
    pub context: Option<ContextChoice>,
    pub run: Run,
    /// Interrupted by the engine or by a signal.
    pub interrupted: bool,
    pub log_path: PathBuf,
    /// Repetitions reused from earlier runs, and appended by this one.
    pub reused: usize,
    pub appended: usize,
    pub elapsed_s: f64,
    /// Other programs' share of the CPUs' time while the engine measured ([`busy`]).
    pub others_cpu: Option<f64>,
    /// The workload asked for, where `--quick` measured a shorter request
    /// ([`ceilings::quick_workload`]).
    pub shortened_from: Option<Workload>,
}

/// How the worker sets up a measurement; a change that alters what a repetition measures bumps it,
/// so the measurement log does not mix the two.
const MEASUREMENT_PROTOCOL: &str = "protocol 2 (server context)";

/// Tunes `model` as `plan` says. Call with the profile store locked (the measurement log is shared
/// with any other run of the same model).
pub fn tune(plan: &Plan, model: &Path, stop: &AtomicBool) -> anyhow::Result<Tuned> {
    // The budget's clock: the probes and the links' measurement count in it.
    let started = Instant::now();
    let info = session::inspect_model(model)?;
    let model = std::fs::canonicalize(model)
        .with_context(|| format!("{}: cannot resolve path", model.display()))?;
    let identity = ModelIdentity::of_file(&model)
        .with_context(|| format!("{}: cannot read", model.display()))?;
    let start_up = Watch::start(&plan.rpc);
    let probe = probe::probe(plan.verbose, &plan.rpc)?;
    for w in &probe.gpu_warnings {
        eprintln!("autotune: warning: {w}");
    }
    // Said before minutes of measuring, while the user can still do something about it.
    let cpus = probe.machine.logical_cpus;
    busy::warn(
        start_up.share(busy::SHORTEST_LOOK),
        cpus,
        "as autotune started",
    );
    let (mut settings, context) = resolve(plan, &model, &probe, &info, stop)?;
    let llama = profiles::LlamaBuild {
        version: probe.llama_version.clone(),
        commit: crate::llama::build_info().1,
        backends: probe.backends.clone(),
        cpu_variant: probe.cpu_variant.clone(),
        system_info: probe.system_info.clone(),
    };
    // The settings' plan: with `--ctx max`, at the context chosen.
    let mut log = open_log(&settings.plan, &identity, &llama, &probe.machine)?;
    let reused = log.previous_count();
    let max_alive = models_at_once(&settings, plan, &info, &probe.machine);
    let stop_fn = || stop.load(Ordering::Relaxed);
    settings.links = measure_links(plan, &probe, &stop_fn);
    let pool = WorkerPool::new(max_alive, plan.trial_timeout);
    let bar = Bar::new(plan.quiet);
    let told = progress::Told {
        bar: &bar,
        quiet: plan.quiet,
    };
    let measuring = Watch::start(&plan.rpc);
    let run = Engine::new(
        settings,
        Box::new(Workers::new(pool, started)),
        Some(&mut log),
        &stop_fn,
        &told,
    )
    .tune(plan.exhaustive);
    let others_cpu = measuring.share(Duration::ZERO);
    bar.finish();
    Ok(Tuned {
        interrupted: run.interrupted || stop.load(Ordering::Relaxed),
        elapsed_s: started.elapsed().as_secs_f64(),
        log_path: log.path().to_path_buf(),
        appended: log.appended,
        reused,
        model,
        info,
        identity,
        probe,
        llama,
        rpc: plan.rpc.clone(),
        context,
        shortened_from: (run.settings.plan.workload.n_prompt != plan.workload.n_prompt
            || run.settings.plan.workload.n_gen != plan.workload.n_gen)
            .then(|| plan.workload.clone()),
        run,
        others_cpu,
    })
}

/// The engine's settings for `plan` on this machine and model: at the context `--ctx max` chooses
/// (and how it chose), with the ceilings probed, and with `--quick` at a request short enough for
/// its minute where the ceilings say the workload's would not be ([`ceilings::quick_workload`]).
fn resolve(
    plan: &Plan,
    model: &Path,
    probe: &Probe,
    info: &GgufInfo,
    stop: &AtomicBool,
) -> anyhow::Result<(TuneSettings, Option<ContextChoice>)> {
    // Each offload device is asked which mixed K/V pairs it runs, once for the run.
    let pairs = kv_pairs::ask_devices(&plan.cache_types, &probe.machine, info);
    let at = |p: &Plan| p.settings(model, &probe.machine, info, &pairs);
    let mut settings = at(plan)?;
    let context = if plan.ctx_max {
        let choice = choose_context(plan, &settings, stop)?;
        let p = Plan {
            workload: Workload {
                n_ctx: choice.n_ctx,
                ..plan.workload.clone()
            },
            ..plan.clone()
        };
        settings = at(&p)?;
        Some(choice)
    } else {
        None
    };
    let ceilings = ceilings::probe(&settings, info);
    if let Some(w) = (plan.quick)
        .then(|| ceilings::quick_workload(&settings.plan.workload, &ceilings))
        .flatten()
    {
        settings = at(&Plan {
            workload: w,
            ..settings.plan.clone()
        })?;
    }
    settings.screen = !plan.exhaustive
        && crate::engine::fidelity::worth_screening(&settings.plan.workload, &ceilings);
    settings.ceilings = ceilings;
    Ok((settings, context))
}

/// Trial workers that may hold a model at once. Two only when they fit comfortably in memory, and
/// never with a non-CPU device: every real load there takes device memory (layers, KV cache,
/// compute buffers), and the budgets are for one load, so at most one trial worker holds a device
/// at a time (dry runs allocate nothing). A ggml RPC server also serves one client at a time.
fn models_at_once(settings: &TuneSettings, plan: &Plan, info: &GgufInfo, m: &Machine) -> usize {
    if !settings.offload
        && plan.rpc.is_empty()
        && info.file_size.saturating_mul(4) < m.ram_available_bytes
    {
        2
    } else {
        1
    }
}

/// The link to each RPC server of the run (none without `--rpc`), said on stderr as measured.
fn measure_links(plan: &Plan, probe: &Probe, stop: &dyn Fn() -> bool) -> Vec<profiles::HostLink> {
    if plan.rpc.is_empty() {
        return Vec::new();
    }
    let devices = crate::hosts::links::rpc_devices(&probe.machine.devices);
    let links = crate::hosts::links::measure(&devices, &plan.rpc, stop);
    if !plan.quiet {
        for l in &links {
            eprintln!(
                "autotune: link to {} ({}): {}",
                l.device,
                l.endpoint,
                l.describe()
            );
        }
    }
    links
}

/// `--ctx max`: the largest context from the workload's least to its most (`settings`' context) at
/// which every layer fits the budgets, by dry runs in a worker of their own.
fn choose_context(
    plan: &Plan,
    settings: &TuneSettings,
    stop: &AtomicBool,
) -> anyhow::Result<ContextChoice> {
    let w = &settings.plan.workload;
    let need = w.depth + w.n_prompt.max(w.n_gen);
    let floor = context::floor_of(need, w.n_parallel, w.n_ctx);
    if !plan.quiet {
        eprintln!(
            "autotune: --ctx max: dry runs for the largest context from {floor} to {} that fits",
            w.n_ctx
        );
    }
    let stop_fn = || stop.load(Ordering::Relaxed);
    let silent = Bar::new(true);
    let pool = WorkerPool::new(1, plan.trial_timeout);
    let mut engine = Engine::new(
        settings.clone(),
        Box::new(Workers::new(pool, Instant::now())),
        None,
        &stop_fn,
        &silent,
    );
    let choice = engine.largest_context(floor, w.n_ctx);
    engine.shutdown();
    if stop.load(Ordering::Relaxed) {
        return Err(Exit::new(
            exit::INTERRUPTED,
            "interrupted while choosing the context",
        ));
    }
    Ok(choice)
}

/// The model's measurement log for the plan's workload, this machine and build (earlier
/// repetitions reused unless `fresh`; `resume` fails when there are none).
fn open_log(
    plan: &Plan,
    identity: &ModelIdentity,
    llama: &profiles::LlamaBuild,
    machine: &Machine,
) -> anyhow::Result<MeasurementLog> {
    let log_path = session::cache_dir()
        .join("measurements")
        .join(format!("{}.jsonl", identity.short()));
    let context = measurements::Context {
        model: identity.fingerprint.clone(),
        // The build's identity includes how llama.cpp was compiled (in the commit string): an -O2
        // build's figures are not an -O3 build's. The protocol tag marks how autotune sets up what
        // it measures: repetitions from before llama-server's context (its sliding-window cache and
        // output reservation) carry other memory figures and are not reused.
        llama: format!(
            "{} {} {} {MEASUREMENT_PROTOCOL}",
            llama.version,
            llama.commit,
            llama.cpu_variant.clone().unwrap_or_default()
        ),
        machine: machine.fingerprint.clone(),
        workload: plan.workload.clone(),
    };
    let log = MeasurementLog::open(&log_path, context, !plan.fresh)
        .with_context(|| format!("cannot open the measurement log {}", log_path.display()))?;
    if plan.resume && log.previous_count() == 0 {
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "--resume: no earlier measurements of this model, workload, machine and llama.cpp build in {}; run without --resume",
                log_path.display()
            ),
        ));
    }
    if log.corrupt_lines > 0 {
        eprintln!(
            "autotune: warning: {} corrupt lines in {} were ignored",
            log.corrupt_lines,
            log_path.display()
        );
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::DeviceInfo;

    pub(crate) fn machine(devices: &[(&str, &str, &str)]) -> Machine {
        Machine::probe(
            devices
                .iter()
                .map(|(name, backend, kind)| DeviceInfo {
                    name: name.to_string(),
                    description: String::new(),
                    backend: backend.to_string(),
                    kind: kind.to_string(),
                    memory_free: 1 << 30,
                    memory_total: 1 << 30,
                    // As ggml's CUDA and Vulkan backends offer pinned host memory.
                    host_buffer: search_space::backend::of(backend).pinned_host,
                })
                .collect(),
        )
    }

    #[test]
    fn numa_strategies_are_searched_on_several_nodes_or_when_asked() {
        assert_eq!(numa_options(None, 1), [Numa::Off]);
        assert_eq!(
            numa_options(None, 2),
            [Numa::Off, Numa::Distribute, Numa::Isolate]
        );
        assert_eq!(
            numa_options(Some(&[Numa::Distribute]), 1),
            [Numa::Distribute]
        );
    }

    #[test]
    fn a_hybrid_cpus_performance_cores_are_a_thread_count_and_llama_cpps_default() {
        let mut m = machine(&[("CPU", "CPU", "cpu")]);
        (m.physical_cores, m.logical_cpus, m.performance_cores) = (24, 32, None);
        assert_eq!(thread_options(&m), [1, 12, 24, 32]);
        assert_eq!(m.llama_default_threads(), 24);
        m.performance_cores = Some(8);
        assert_eq!(thread_options(&m), [1, 8, 12, 24, 32]);
        assert_eq!(m.llama_default_threads(), 8);
    }

    #[test]
    fn host_buffers_are_varied_beside_a_device_with_pinned_host_memory_or_when_asked() {
        let all = [HostBuffer::Mapped, HostBuffer::Pinned, HostBuffer::Cpu];
        let cpu = machine(&[("CPU", "CPU", "cpu")]);
        let rpc = machine(&[("CPU", "CPU", "cpu"), ("RPC0", "RPC", "gpu")]);
        let gpu = machine(&[
            ("CPU", "CPU", "cpu"),
            ("RPC0", "RPC", "gpu"),
            ("CUDA0", "CUDA", "gpu"),
        ]);
        assert_eq!(host_buffer_options(None, &cpu), [HostBuffer::Mapped]);
        assert_eq!(host_buffer_options(None, &rpc), [HostBuffer::Mapped]);
        assert_eq!(host_buffer_options(None, &gpu), all);
        assert_eq!(
            host_buffer_options(Some(&[HostBuffer::Cpu]), &cpu),
            [HostBuffer::Cpu]
        );
    }

    #[test]
    fn op_offload_is_varied_only_where_a_gpu_takes_host_operations() {
        let both = [OpOffload::On, OpOffload::Off];
        let cpu = machine(&[("CPU", "CPU", "cpu")]);
        let rpc = machine(&[("CPU", "CPU", "cpu"), ("RPC0", "RPC", "gpu")]);
        let gpu = machine(&[("CPU", "CPU", "cpu"), ("Vulkan0", "Vulkan", "gpu")]);
        assert_eq!(op_offload_options(&both, &cpu), [OpOffload::On]);
        assert_eq!(op_offload_options(&both, &rpc), [OpOffload::On]);
        assert_eq!(op_offload_options(&both, &gpu), both);
        // What the user pinned is kept.
        assert_eq!(
            op_offload_options(&[OpOffload::Off], &cpu),
            [OpOffload::Off]
        );
    }

    #[test]
    fn micro_batches_above_512_are_tried_only_with_a_device_and_a_longer_prompt() {
        let w = |n_prompt, n_ctx| Workload {
            n_ctx,
            n_prompt,
            n_gen: 128,
            depth: 0,
            n_parallel: 1,
            name: String::new(),
        };
        let small = [512, 256, 128];
        assert_eq!(ubatch_options(&[], &w(3000, 8192), false), small);
        assert_eq!(ubatch_options(&[], &w(512, 8192), true), small);
        assert_eq!(
            ubatch_options(&[], &w(513, 8192), true),
            [512, 256, 128, 1024]
        );
        assert_eq!(
            ubatch_options(&[], &w(2000, 8192), true),
            [512, 256, 128, 1024, 2048]
        );
        assert_eq!(
            ubatch_options(&[], &w(3000, 8192), true),
            [512, 256, 128, 1024, 2048, 4096]
        );
        // N prompts at once are processed together: 4 of 300 tokens fill 1024 and 2048.
        let four = Workload {
            n_parallel: 4,
            ..w(300, 8192)
        };
        assert_eq!(
            ubatch_options(&[], &four, true),
            [512, 256, 128, 1024, 2048]
        );
        // Never past the context (llama.cpp would cut it to n_ctx: the same run twice) or 4096.
        assert_eq!(
            ubatch_options(&[], &w(3000, 2048), true),
            [512, 256, 128, 1024, 2048]
        );
        assert_eq!(
            ubatch_options(&[], &w(30000, 65536), true),
            [512, 256, 128, 1024, 2048, 4096]
        );
        // What the user gave is kept.
        assert_eq!(ubatch_options(&[2048], &w(100, 4096), false), [2048]);
    }
}
