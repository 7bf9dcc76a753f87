//! `autotune tune MODEL` (and the short form `autotune MODEL`): check the model, measure
//! configurations in worker processes, print the leaderboard, and save the winner as a profile.

use crate::cli::{parse_duration, Cli, TuneArgs};
use crate::engine::{Engine, Progress, TuneSettings};
use crate::exit::{self, Exit};
use crate::inputs::{self, Also};
use crate::pool::WorkerPool;
use crate::report::{self, ModelSummary, Report};
use crate::worker::{Repetition, Workload};
use crate::{commands::doctor, machine::Machine};
use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use profiles::measurements::{self, MeasurementLog};
use profiles::{Figures, Profile, Store};
use search_space::gguf::GgufInfo;
use search_space::identity::ModelIdentity;
use search_space::{CacheType, FlashAttn, KernelChoice};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Reads and validates the flags into the engine's settings ("low args" → "high args").
/// The request shape: the preset's numbers (or llama-bench's pp512/tg128), overridden by explicit flags.
pub fn workload_numbers(args: &TuneArgs) -> (u32, u32, u32, String) {
    let (p, g, d) = args.workload.map(|w| w.numbers()).unwrap_or((512, 128, 0));
    let name = match (
        args.workload,
        args.prompt.is_some() || args.gen.is_some() || args.depth.is_some(),
    ) {
        (Some(w), false) => w.name().to_string(),
        (Some(w), true) => format!("{} (adjusted)", w.name()),
        (None, _) => "custom".to_string(),
    };
    (
        args.prompt.unwrap_or(p),
        args.gen.unwrap_or(g),
        args.depth.unwrap_or(d),
        name,
    )
}

/// The search budget of `--quick` (a ceiling: a shorter --budget still wins).
const QUICK_BUDGET: Duration = Duration::from_secs(50);

fn settings(
    args: &TuneArgs,
    model: &std::path::Path,
    machine: &Machine,
    n_gpu_layers: u32,
) -> anyhow::Result<TuneSettings> {
    let usage = |m: String| Exit::new(exit::USAGE, m);
    let (prompt, gen, depth, _) = workload_numbers(args);
    if args.ctx == 0 {
        return Err(usage("--ctx must be at least 1".into()));
    }
    if prompt == 0 || gen == 0 {
        return Err(usage("--prompt and --gen must be at least 1 token".into()));
    }
    if prompt as u64 + depth as u64 > args.ctx as u64 || gen as u64 + depth as u64 > args.ctx as u64
    {
        return Err(usage(format!(
            "--depth {depth} plus --prompt {prompt} or --gen {gen} does not fit in --ctx {}: raise --ctx or lower them",
            args.ctx
        )));
    }
    if !(args.noise > 0.0 && args.noise < 1.0) {
        return Err(usage(format!(
            "--noise {} must be between 0 and 1 (e.g. 0.02 for 2%)",
            args.noise
        )));
    }
    if args.min_reps < 2 || args.max_reps < args.min_reps {
        return Err(usage(
            "--min-reps must be at least 2 and --max-reps at least --min-reps".into(),
        ));
    }
    let budget = parse_duration(&args.budget).map_err(|e| usage(format!("--budget: {e}")))?;
    let trial_timeout =
        parse_duration(&args.trial_timeout).map_err(|e| usage(format!("--trial-timeout: {e}")))?;
    let _ = trial_timeout;
    let cache_types = args
        .cache_types
        .iter()
        .map(|s| s.parse::<CacheType>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| usage(format!("--cache-types: {e}")))?;
    let flash_attn = args
        .flash_attn
        .iter()
        .map(|s| s.parse::<FlashAttn>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| usage(format!("--flash-attn: {e}")))?;
    let kernels = args
        .kernels
        .iter()
        .map(|s| s.parse::<KernelChoice>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| usage(format!("--kernels: {e}")))?;
    if args.ubatch.iter().any(|&u| u == 0) {
        return Err(usage("--ubatch sizes must be at least 1".into()));
    }
    let logical = machine.logical_cpus.max(1);
    let physical = machine.physical_cores.max(1);
    let threads_options = match &args.threads {
        Some(t) => {
            inputs::threads("--threads", t, inputs::logical_cpus().max(logical as u32))?;
            t.clone()
        }
        None => {
            let mut v = vec![1, (physical / 2).max(1), physical, logical];
            v.sort_unstable();
            v.dedup();
            v
        }
    };
    // llama.cpp's default thread count is the number of physical cores (its "math" cores).
    let default_threads = if threads_options.contains(&physical) {
        physical
    } else {
        threads_options[0]
    };
    let (min_reps, max_reps, mut noise) = if args.quick {
        (args.min_reps.min(3), args.max_reps.min(4), args.noise)
    } else if args.thorough {
        (args.min_reps.max(5), args.max_reps.max(20), args.noise)
    } else {
        (args.min_reps, args.max_reps, args.noise)
    };
    if args.thorough {
        noise = noise.min(0.02);
    }
    let per_candidate = if args.quick {
        8
    } else if args.thorough {
        120
    } else {
        40
    };
    Ok(TuneSettings {
        model: model.to_path_buf(),
        workload: Workload {
            n_ctx: args.ctx,
            n_prompt: prompt,
            n_gen: if args.quick { gen.min(64) } else { gen },
            depth,
        },
        noise,
        min_reps,
        max_reps,
        candidate_cap: Duration::from_secs(per_candidate),
        // --quick: at most 50 s of search, so with the confirmation and the last repetition in
        // flight the run measures for under a minute.
        budget: if args.quick {
            budget.min(QUICK_BUDGET)
        } else {
            budget
        },
        seed: args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(1)
        }),
        threads_options,
        default_threads,
        n_gpu_layers,
        n_gpu_layers_pinned: args.n_gpu_layers.is_some(),
        kernels,
        cache_types,
        flash_attn,
        ubatch_options: args.ubatch.clone(),
        rpc: args.rpc.clone(),
        budgets: budgets(args, machine)?,
        n_layers: 0,
        offload: !machine.offload_devices().is_empty(),
        moe: false,
        quick: args.quick,
    })
}

/// Memory budget per device: `--mem-budget DEV=SIZE`, else free memory minus `--mem-margin`.
fn budgets(args: &TuneArgs, machine: &Machine) -> anyhow::Result<Vec<(String, u64)>> {
    budgets_of(&args.mem_budget, &args.mem_margin, machine)
}

/// Budgets from `--mem-budget` values and `--mem-margin` (shared with `autotune fit`).
pub fn budgets_of(
    mem_budget: &[String],
    mem_margin: &str,
    machine: &Machine,
) -> anyhow::Result<Vec<(String, u64)>> {
    let usage = |m: String| Exit::new(exit::USAGE, m);
    let margin = search_space::size::parse_size(mem_margin)
        .map_err(|e| usage(format!("--mem-margin: {e}")))?;
    let mut explicit = Vec::new();
    for item in mem_budget {
        let (dev, size) = item.split_once('=').ok_or_else(|| {
            usage(format!(
                "--mem-budget '{item}': write DEVICE=SIZE, e.g. RPC0=300M"
            ))
        })?;
        if !machine.devices.iter().any(|d| d.name == dev) {
            let names: Vec<&str> = machine.devices.iter().map(|d| d.name.as_str()).collect();
            return Err(usage(format!(
                "--mem-budget: unknown device '{dev}' (devices: {})",
                names.join(", ")
            )));
        }
        let bytes = search_space::size::parse_size(size)
            .map_err(|e| usage(format!("--mem-budget {dev}: {e}")))?;
        explicit.push((dev.to_string(), bytes));
    }
    Ok(machine
        .devices
        .iter()
        .map(|d| {
            let b = explicit
                .iter()
                .find(|(n, _)| *n == d.name)
                .map(|(_, b)| *b)
                .unwrap_or_else(|| d.memory_free.saturating_sub(margin));
            (d.name.clone(), b)
        })
        .collect())
}

/// Inspects the model header safely before llama.cpp sees the file.
pub fn inspect_model(path: &std::path::Path) -> anyhow::Result<GgufInfo> {
    GgufInfo::inspect(path).map_err(|e| Exit::new(exit::BAD_MODEL, e.to_string()))
}

struct Bar(Option<ProgressBar>);

impl Progress for Bar {
    fn candidate_started(&self, label: &str, axis: &str) {
        if let Some(b) = &self.0 {
            b.set_prefix(axis.to_string());
            b.set_message(label.to_string());
        }
    }
    fn repetition(&self, _label: &str, rep: &Repetition) {
        if let Some(b) = &self.0 {
            b.inc(1);
            b.set_prefix(format!("pp {:.0} tg {:.1}", rep.pp_tps, rep.tg_tps));
        }
    }
    fn failed(&self, label: &str, failure: &str) {
        match &self.0 {
            Some(b) => b.println(format!("trial failed: {label}: {failure}")),
            None => eprintln!("autotune: trial failed: {label}: {failure}"),
        }
    }
    fn best(&self, label: &str, margin: Option<f64>, elapsed: Duration, budget: Duration) {
        let left = budget.saturating_sub(elapsed).as_secs();
        let m = margin
            .map(|m| format!(", {:+.1}% over the runner-up", m * 100.0))
            .unwrap_or_default();
        if let Some(b) = &self.0 {
            b.println(format!("best so far: {label}{m} ({left} s of budget left)"));
        }
    }
}

/// Files named for later stages (quantizations, a reference, drafts) are checked first, not after
/// minutes of tuning.
fn check_named_files(args: &TuneArgs) -> anyhow::Result<()> {
    inspect_model(&args.model)?;
    inputs::model_files("--quants", &args.quants, Also::Folders)?;
    inputs::model_files("--draft", &args.speculative.draft, Also::Auto)?;
    let reference: Vec<_> = args.reference.iter().cloned().collect();
    inputs::model_files("--reference", &reference, Also::Nothing)
}

pub fn run(cli: &Cli, args: &TuneArgs) -> anyhow::Result<i32> {
    check_named_files(args)?;
    // ---- quantization choice (quant::joint): --quants / --ladder / --max-kld / --reference ----
    if crate::quant::joint::wants_joint(args) {
        return crate::quant::joint::run(cli, args);
    }
    // ---- end of quantization choice ----
    let info = inspect_model(&args.model)?;
    let model_path = std::fs::canonicalize(&args.model)
        .with_context(|| format!("{}: cannot resolve path", args.model.display()))?;
    let identity = ModelIdentity::of_file(&model_path)
        .with_context(|| format!("{}: cannot read", model_path.display()))?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("cannot install the interrupt handler")?;
    }

    let doctor = doctor::probe(cli.verbose, &args.rpc)?;
    for w in &doctor.gpu_warnings {
        eprintln!("autotune: warning: {w}");
    }
    let machine = doctor.machine.clone();
    let offload = !machine.offload_devices().is_empty();
    let n_layers = info.block_count.unwrap_or(0);
    let n_gpu_layers = args
        .n_gpu_layers
        .unwrap_or(if offload { n_layers + 1 } else { 0 });
    let mut settings = settings(args, &model_path, &machine, n_gpu_layers)?;
    settings.n_layers = n_layers;
    settings.moe = info.is_moe();
    let workload_name = workload_numbers(args).3;

    let llama_build = profiles::LlamaBuild {
        version: doctor.llama_version.clone(),
        commit: crate::llama::build_info().1,
        backends: doctor.backends.clone(),
        cpu_variant: doctor.cpu_variant.clone(),
        system_info: doctor.system_info.clone(),
    };

    let store = Store::open(Store::default_dir()?).context("cannot open the profile store")?;
    let _lock = match store.try_lock()? {
        Some(g) => g,
        None => {
            eprintln!(
                "autotune: another autotune run holds the store lock; waiting for it to finish"
            );
            // Polled rather than a blocking lock(), so Ctrl-C still works while waiting.
            loop {
                if stop.load(Ordering::Relaxed) {
                    return Err(Exit::new(
                        exit::INTERRUPTED,
                        "interrupted while waiting for the store lock; nothing was measured",
                    ));
                }
                if let Some(g) = store.try_lock()? {
                    break g;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };

    let log_path = cache_dir()
        .join("measurements")
        .join(format!("{}.jsonl", identity.short()));
    let log_context = measurements::Context {
        model: identity.fingerprint.clone(),
        // The build's identity includes how llama.cpp was compiled (in the commit string): an -O2
        // build's figures are not an -O3 build's.
        llama: format!(
            "{} {} {}",
            llama_build.version,
            llama_build.commit,
            llama_build.cpu_variant.clone().unwrap_or_default()
        ),
        machine: machine.fingerprint.clone(),
        workload: settings.workload.clone(),
    };
    let mut log = MeasurementLog::open(&log_path, log_context, !args.fresh)
        .with_context(|| format!("cannot open the measurement log {}", log_path.display()))?;
    let reused = log.previous_count();
    if args.resume && reused == 0 {
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "--resume: no earlier measurements of this model, workload, machine and llama.cpp build in {}; run without --resume",
                log_path.display()
            ),
        )
        .into());
    }
    if log.corrupt_lines > 0 {
        eprintln!(
            "autotune: warning: {} corrupt lines in {} were ignored",
            log.corrupt_lines,
            log_path.display()
        );
    }

    let show_bar = !cli.quiet && std::io::stderr().is_terminal();
    let bar = Bar(show_bar.then(|| {
        let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {pos} reps · {prefix} · {wide_msg}",
            )
            .expect("valid template"),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b
    }));

    // Two models loaded at once only when they fit comfortably in memory.
    // With RPC devices one worker at a time: a ggml RPC server serves one client at a time.
    let max_alive =
        if args.rpc.is_empty() && info.file_size.saturating_mul(4) < machine.ram_available_bytes {
            2
        } else {
            1
        };
    let timeout = parse_duration(&args.trial_timeout).map_err(|e| Exit::new(exit::USAGE, e))?;
    let pool = WorkerPool::new(max_alive, timeout);
    let stop_fn = {
        let stop = Arc::clone(&stop);
        move || stop.load(Ordering::Relaxed)
    };
    let budget = settings.budget;
    let seed = settings.seed;
    let noise = settings.noise;
    let workload = settings.workload.clone();
    let started = std::time::Instant::now();
    let mut engine = Engine::new(settings, pool, Some(&mut log), &stop_fn, &bar);
    let mut winner = if args.exhaustive {
        engine.run_exhaustive()
    } else {
        engine.run()
    };
    let baseline = engine.baseline();
    let mut confirm_drift = Vec::new();
    let mut confirmed = Vec::new();
    if let Some(w) = winner.clone() {
        if !engine.interrupted {
            let board = report::leaderboard(&engine.results, &workload, noise, seed);
            let runner_up = board
                .iter()
                .filter(|e| e.figures.is_some())
                .map(|e| e.candidate.clone())
                .find(|c| c != &w);
            confirmed = std::iter::once(w.clone())
                .chain(runner_up.clone())
                .collect();
            // The confirmation rounds run within the budget (they stop when it is spent).
            confirm_drift = engine
                .confirm(&w, runner_up.as_ref())
                .into_iter()
                .map(|(c, d)| (c.label(), d))
                .collect();
            if let Some(b) = engine.choose(
                &board
                    .iter()
                    .filter(|e| e.figures.is_some())
                    .map(|e| e.candidate.clone())
                    .collect::<Vec<_>>(),
            ) {
                winner = Some(b);
            }
        }
    }
    engine.shutdown();
    let interrupted = engine.interrupted || stop.load(Ordering::Relaxed);
    let budget_spent = engine.budget_spent;
    let results = std::mem::take(&mut engine.results);
    drop(engine);
    if let Some(b) = &bar.0 {
        b.finish_and_clear();
    }

    let board = report::leaderboard(&results, &workload, noise, seed);
    let figures_of = |c: &search_space::Candidate| -> Option<Figures> {
        results
            .iter()
            .find(|r| &r.candidate == c)
            .and_then(|r| report::figures(r, &workload))
    };
    let winner_figures = winner.as_ref().and_then(figures_of);
    let baseline_figures = figures_of(&baseline);
    let versus_defaults = winner
        .as_ref()
        .and_then(|w| report::versus_defaults(&results, w, &baseline, &workload, noise, seed));
    let mut notes = doctor.gpu_warnings.clone();
    for r in results.iter().filter(|r| r.failure.is_some()) {
        if let Some(crate::trial::TrialFailure::Crashed { name, .. }) = &r.failure {
            notes.push(report::one_line(&format!(
                "{} crashed ({name}); recorded and skipped",
                r.candidate.label()
            )));
        }
    }
    if results
        .iter()
        .any(|r| r.skipped.as_deref().is_some_and(|s| s.contains("budget")))
    {
        notes.push(format!(
            "the time budget ({} s) ran out before every candidate was measured; raise --budget",
            budget.as_secs()
        ));
    }

    let mut report = Report {
        model: ModelSummary {
            path: model_path.clone(),
            architecture: info.architecture.clone(),
            file_type: info.file_type_name.clone(),
            layers: info.block_count,
            parameters: info.parameter_count,
            size_bytes: info.file_size,
            trained_context: info.context_length,
            experts: info.expert_count,
            fingerprint: identity.fingerprint.clone(),
        },
        machine: machine.clone(),
        gpus: doctor.gpus.clone(),
        gpu_warnings: doctor.gpu_warnings.clone(),
        winner_devices: winner
            .as_ref()
            .map(|w| report::devices_of(w, &machine))
            .unwrap_or_default(),
        llama: llama_build.clone(),
        workload: workload.clone(),
        seed,
        noise,
        elapsed_s: started.elapsed().as_secs_f64(),
        budget_s: budget.as_secs_f64(),
        interrupted,
        budget_spent,
        measured: results.iter().filter(|r| r.ok()).count(),
        failed: results.iter().filter(|r| r.failure.is_some()).count(),
        reused_repetitions: reused,
        leaderboard: board.clone(),
        winner: winner.clone(),
        winner_figures: winner_figures.clone(),
        baseline: Some(baseline.clone()),
        baseline_figures: baseline_figures.clone(),
        versus_defaults,
        confirm_drift,
        confirmed,
        profile_path: None,
        measurement_log: Some(log.path().to_path_buf()),
        notes,
        memory: report::memory_rows(&results),
    };

    if interrupted {
        emit(&report, args)?;
        eprintln!(
            "autotune: interrupted; {} measurements kept in {}. Run the same command again (or add --resume) to continue: it reuses them.",
            log.appended + reused,
            log.path().display()
        );
        return Ok(exit::INTERRUPTED);
    }
    let (Some(winner), Some(figures)) = (winner, winner_figures) else {
        emit(&report, args)?;
        if !results.is_empty()
            && results.iter().all(|r| {
                r.skipped
                    .as_deref()
                    .is_some_and(|s| s.starts_with("pruned"))
            })
        {
            let reason = results
                .iter()
                .find_map(|r| r.skipped.clone())
                .unwrap_or_default();
            return Err(Exit::new(
                exit::NOTHING_MEASURED,
                format!(
                    "{}: no configuration fits the memory budgets ({reason}); nothing was loaded",
                    model_path.display()
                ),
            ));
        }
        return Err(Exit::new(
            exit::NOTHING_MEASURED,
            format!(
                "{}: no configuration could be measured (see the statuses above)",
                model_path.display()
            ),
        ));
    };

    let profile_workload = profiles::Workload {
        n_ctx: workload.n_ctx,
        n_prompt: workload.n_prompt,
        n_gen: workload.n_gen,
        depth: workload.depth,
        name: workload_name.to_string(),
    };
    let mut profile = Profile {
        schema_version: profiles::SCHEMA_VERSION,
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        autotune_version: env!("CARGO_PKG_VERSION").to_string(),
        server_args: Vec::new(),
        // The RPC servers the winner's layers live on: llama-server needs them (`--rpc`).
        rpc: if winner.n_gpu_layers > 0 {
            args.rpc.clone()
        } else {
            Vec::new()
        },
        notes: report.notes.clone(),
        model: profiles::ModelRef {
            path: model_path.clone(),
            file_name: identity.file_name.clone(),
            fingerprint: identity.fingerprint.clone(),
            size_bytes: identity.size_bytes,
            architecture: info.architecture.clone(),
            file_type: info.file_type_name.clone(),
        },
        machine: profiles::MachineRef {
            fingerprint: machine.fingerprint.clone(),
            hostname: machine.hostname.clone(),
            cpu: machine.cpu.clone(),
            physical_cores: machine.physical_cores,
            logical_cpus: machine.logical_cpus,
            ram_bytes: machine.ram_bytes,
            os: machine.os.clone(),
            devices: machine
                .devices
                .iter()
                .map(|d| profiles::DeviceRef {
                    name: d.name.clone(),
                    description: d.description.clone(),
                    kind: d.kind.clone(),
                    backend: d.backend.clone(),
                    memory_total: d.memory_total,
                })
                .collect(),
            gpus: doctor.gpus.iter().map(|g| g.name.clone()).collect(),
        },
        llama: llama_build,
        workload: profile_workload,
        winner,
        figures,
        baseline: baseline_figures,
        roofline: None,
        leaderboard: board,
        draft: None,
        ngram: None,
    };
    // Speculative decoding (--draft): measured with the winner's settings; the draft or a note.
    if let Some(note) = crate::speculative::attach::attach(
        cli,
        args,
        &info,
        &mut profile,
        &budgets(args, &machine)?,
        &stop,
    )? {
        report.notes.push(note.clone());
        profile.notes.push(note);
    }
    // The winner's bandwidth roofline (a ~1 s probe, now that the workers are gone), for `explain`.
    profile.roofline = Some(crate::commands::explain::roofline_for_run(
        &info, &profile, &args.rpc,
    ));
    profile.refresh_server_args();
    profile
        .validate(false)
        .map_err(|e| anyhow::anyhow!("internal error: the new profile does not validate: {e}"))?;
    if !args.no_save {
        let path = store.save(&profile).context("cannot save the profile")?;
        report.profile_path = Some(path);
    }
    if let Some(out) = &args.out {
        let text = profile.to_toml()?;
        profiles::write_atomic(out, &text)
            .with_context(|| format!("cannot write {}", out.display()))?;
        if report.profile_path.is_none() {
            report.profile_path = Some(out.clone());
        }
    }
    emit(&report, args)?;
    crate::commands::explain::after_tune(args, &profile, report.profile_path.as_deref());
    Ok(exit::OK)
}

fn emit(report: &Report, args: &TuneArgs) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", report.render(args.top));
    }
    Ok(())
}

/// autotune's cache directory (measurement logs, demo model, built tools).
pub fn cache_dir() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("AUTOTUNE_CACHE_DIR") {
        return d.into();
    }
    directories::ProjectDirs::from("", "", "autotune")
        .map(|p| p.cache_dir().to_path_buf())
        .unwrap_or_else(|| std::env::temp_dir().join("autotune-cache"))
}
