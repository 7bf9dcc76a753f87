//! Flags into validated settings ("low args" → "high args"): each function reads one command's clap
//! groups, checks ranges and files, and returns the value the core runs with. Below `commands/`
//! nothing sees a flag.

use crate::cli::{Cli, CtxArg, DraftSearchArgs, TrialArgs, TuneArgs, WorkloadArgs};
use crate::engine::GateChoice;
use crate::engine::Plan;
use crate::engine::DEFAULT_MAX_KV_KLD;
use crate::exit::{self, Exit};
use crate::inputs::{self, Also};
use crate::measuring::Workload;
use crate::quant::quality::{self, EvalSettings};
use crate::session;
use crate::speculative::attach::DraftSearch;
use crate::speculative::ngram::NgramGrid;
use crate::speculative::{prompts, Grid};
use crate::tuning;
use crate::tuning::joint::Joint;
use crate::workload::WorkloadPreset;
use anyhow::Context as _;
use std::path::Path;

fn usage(m: String) -> anyhow::Error {
    Exit::new(exit::USAGE, m)
}

/// The request shape: the preset's numbers (or llama-bench's pp512/tg128), overridden by explicit
/// flags, named as the profile records it.
pub fn workload(a: &WorkloadArgs, n_ctx: u32) -> Workload {
    let (p, g, d) = a.workload.map(|w| w.numbers()).unwrap_or((512, 128, 0));
    let name = match (
        a.workload,
        a.prompt.is_some() || a.gen.is_some() || a.depth.is_some(),
    ) {
        (Some(w), false) => w.name().to_string(),
        (Some(w), true) => format!("{} (adjusted)", w.name()),
        (None, _) => "custom".to_string(),
    };
    Workload {
        n_ctx,
        n_prompt: a.prompt.unwrap_or(p),
        n_gen: a.gen.unwrap_or(g),
        depth: a.depth.unwrap_or(d),
        n_parallel: a.parallel,
        name,
    }
}

/// The workload's numbers against each other: every request (its depth, then its prompt or its
/// generation) must fit its slot's share of the context.
pub fn check_workload(w: &Workload) -> anyhow::Result<()> {
    let (ctx, prompt, gen, depth, np) = (w.n_ctx, w.n_prompt, w.n_gen, w.depth, w.n_parallel);
    if ctx == 0 || ctx > profiles::MAX_CTX {
        return Err(usage(format!(
            "--ctx {ctx} must be between 1 and {} tokens",
            profiles::MAX_CTX
        )));
    }
    if prompt == 0 || gen == 0 {
        return Err(usage("--prompt and --gen must be at least 1 token".into()));
    }
    check_parallel(np)?;
    let slot = profiles::slot_ctx(ctx, np);
    if prompt as u64 + depth as u64 > slot as u64 || gen as u64 + depth as u64 > slot as u64 {
        let room = if np > 1 {
            format!("each of --parallel {np} slots' {slot} tokens of --ctx {ctx}")
        } else {
            format!("--ctx {ctx}")
        };
        return Err(usage(format!(
            "--depth {depth} plus --prompt {prompt} or --gen {gen} does not fit in {room}: raise --ctx or lower them"
        )));
    }
    Ok(())
}

/// `--parallel`: 1 to llama.cpp's most sequences at once.
pub fn check_parallel(np: u32) -> anyhow::Result<()> {
    if np == 0 || np > profiles::MAX_PARALLEL {
        return Err(usage(format!(
            "--parallel {np} must be between 1 and {} (llama.cpp's most sequences)",
            profiles::MAX_PARALLEL
        )));
    }
    Ok(())
}

fn check_noise(noise: f64) -> anyhow::Result<()> {
    if !(noise > 0.0 && noise < 1.0) {
        return Err(usage(format!(
            "--noise {noise} must be between 0 and 1 (e.g. 0.02 for 2%)"
        )));
    }
    Ok(())
}

/// Seconds since the epoch, the seed of a run that was given none.
fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(1)
}

/// `tune`'s settings (what depends on the machine is resolved when the model is tuned).
pub fn plan(cli: &Cli, a: &TuneArgs) -> anyhow::Result<Plan> {
    let n_ctx = match a.workload.ctx {
        CtxArg::Tokens(n) => n,
        CtxArg::Max => max_ctx_ceiling(&a.model, a.workload.parallel)?,
    };
    let mut workload = workload(&a.workload, n_ctx);
    check_workload(&workload)?;
    check_noise(a.trial.noise)?;
    if a.min_reps < 2 || a.max_reps < a.min_reps {
        return Err(usage(
            "--min-reps must be at least 2 and --max-reps at least --min-reps".into(),
        ));
    }
    if a.ubatch.contains(&0) {
        return Err(usage("--ubatch sizes must be at least 1".into()));
    }
    let (min_reps, max_reps, noise, cap) = if a.quick {
        let cap = tuning::QUICK_CANDIDATE_CAP;
        (a.min_reps.min(3), a.max_reps.min(4), a.trial.noise, cap)
    } else if a.thorough {
        let cap = tuning::THOROUGH_CANDIDATE_CAP;
        (
            a.min_reps.max(5),
            a.max_reps.max(20),
            a.trial.noise.min(0.02),
            cap,
        )
    } else {
        (a.min_reps, a.max_reps, a.trial.noise, tuning::CANDIDATE_CAP)
    };
    if a.quick {
        workload.n_gen = workload.n_gen.min(64);
    }
    Ok(Plan {
        workload,
        ctx_max: a.workload.ctx == CtxArg::Max,
        noise,
        min_reps,
        max_reps,
        candidate_cap: cap,
        time_budget: a.budget.unwrap_or(crate::tuning::DEFAULT_BUDGET),
        time_budget_grows: a.budget.is_none(),
        seed: a.trial.seed.unwrap_or_else(time_seed),
        threads: a.threads.clone(),
        threads_batch: a.threads_batch.clone(),
        n_gpu_layers: a.n_gpu_layers,
        n_cpu_ffn: a.n_cpu_ffn,
        kernels: a.kernels.clone(),
        host_buffers: a.host_buffer.clone(),
        numa: a.numa.clone(),
        op_offload: a.op_offload.clone(),
        kv_offload: a.kv_offload.clone(),
        attn_rot: a.attn_rot.clone(),
        host_ffns: !a.no_cpu_ffn,
        cache_types: a.cache_types.clone(),
        kv_gate: kv_gate(a)?,
        quality_reference: None,
        flash_attn: a.flash_attn.clone(),
        ubatch_options: a.ubatch.clone(),
        rpc: a.devices.rpc.servers.clone(),
        backends: a.backend.clone(),
        mem_budgets: a.devices.mem_budget.clone(),
        mem_margin: a.devices.mem_margin,
        trial_timeout: a.trial.trial_timeout,
        quick: a.quick,
        exhaustive: a.exhaustive,
        fresh: a.fresh,
        resume: a.resume,
        verbose: cli.verbose,
        quiet: cli.quiet,
    })
}

/// The KV-cache quality gate the flags ask for (`--max-kv-kld`, `--no-quality-gate`).
fn kv_gate(a: &TuneArgs) -> anyhow::Result<GateChoice> {
    if a.no_quality_gate {
        return Ok(GateChoice::Off("--no-quality-gate".into()));
    }
    let max = a.max_kv_kld.unwrap_or(DEFAULT_MAX_KV_KLD);
    if !(max.is_finite() && max >= 0.0) {
        return Err(usage(format!(
            "--max-kv-kld {max}: give a mean KL divergence of 0 or more, in nats per token (e.g. 0.02)"
        )));
    }
    // The gate keeps the f16 cache where a quantized one drifts too far: without f16 among the
    // types there is nothing to keep, and a gate asked for would hold nothing.
    if a.max_kv_kld.is_some() && !a.cache_types.contains(&search_space::CacheType::F16) {
        return Err(usage(format!(
            "--max-kv-kld {max} holds a quantized KV cache to the f16 cache's quality, and --cache-types has no f16 to keep where one drifts too far: add f16 to --cache-types, or leave out --max-kv-kld to run the types given as they are"
        )));
    }
    Ok(GateChoice::On(max))
}

/// The most `--ctx max` asks for: the model's trained context for each of the `--parallel` slots.
fn max_ctx_ceiling(model: &Path, parallel: u32) -> anyhow::Result<u32> {
    check_parallel(parallel)?;
    let info = session::inspect_model(model)?;
    let trained = info.context_length.filter(|&n| n > 0).ok_or_else(|| {
        usage(format!(
            "--ctx max: {} does not say the context it was trained with ({}.context_length); give --ctx N",
            model.display(),
            info.architecture
        ))
    })?;
    Ok(trained
        .saturating_mul(parallel as u64)
        .min(profiles::MAX_CTX as u64) as u32)
}

/// `tune`'s choice among quantizations, when any of its flags was given.
pub fn joint(cli: &Cli, a: &TuneArgs) -> anyhow::Result<Option<Joint>> {
    if a.quants.is_empty() && !a.ladder && a.max_kld.is_none() && a.reference.is_none() {
        return Ok(None);
    }
    if a.workload.ctx == CtxArg::Max {
        // Each file would get its own context: their speeds would not compare.
        return Err(usage(
            "--ctx max cannot be combined with --quants, --ladder, --max-kld or --reference (each quantization would be tuned at its own context): give --ctx N".into(),
        ));
    }
    let max_kld = a.max_kld.unwrap_or(crate::quant::DEFAULT_MAX_KLD);
    if !(max_kld.is_finite() && max_kld >= 0.0) {
        return Err(usage(format!(
            "--max-kld {max_kld}: give a divergence in nats per token, at least 0 (e.g. 0.05)"
        )));
    }
    Ok(Some(Joint {
        model: a.model.clone(),
        quants: a.quants.clone(),
        ladder: a.ladder,
        max_kld,
        reference: a.reference.clone(),
        eval: eval_settings(None, a.quality_tokens, 512, None, false, cli)?,
        budget: a.budget.unwrap_or(crate::tuning::DEFAULT_BUDGET),
        json: a.json,
    }))
}

/// The draft search (`draft`, `tune --draft`).
pub fn draft_search(
    a: &DraftSearchArgs,
    trial: &TrialArgs,
    workload: Option<WorkloadPreset>,
) -> anyhow::Result<DraftSearch> {
    inputs::model_files("--draft", &a.draft, Also::Auto)?;
    let grid = Grid::new(
        a.draft_max.clone(),
        a.draft_min.clone(),
        a.draft_p_min.clone(),
    )
    .map_err(usage)?;
    let ngram = if a.no_ngram {
        NgramGrid::default()
    } else {
        NgramGrid::new(a.ngram_n.clone(), a.ngram_m.clone()).map_err(usage)?
    };
    let prompts = match &a.draft_prompts {
        Some(p) => prompts::from_file(p).map_err(|e| usage(format!("--draft-prompts: {e}")))?,
        None => prompts::built_in(),
    };
    if a.draft_gen < 2 {
        return Err(usage("--draft-gen must be at least 2 tokens".into()));
    }
    if a.draft_reps < 2 {
        return Err(usage("--draft-reps must be at least 2".into()));
    }
    Ok(DraftSearch {
        drafts: a.draft.clone(),
        grid,
        ngram,
        prompts,
        own_prompts: a.draft_prompts.is_some(),
        workload,
        n_gen: a.draft_gen,
        reps: a.draft_reps,
        budget: a.draft_budget,
        noise: trial.noise,
        seed: trial.seed,
        trial_timeout: trial.trial_timeout,
    })
}

/// `draft`'s settings: the search, with a seed drawn now when none was given; the noise checked.
pub fn draft_command_search(
    a: &DraftSearchArgs,
    trial: &TrialArgs,
    workload: Option<WorkloadPreset>,
) -> anyhow::Result<DraftSearch> {
    let mut s = draft_search(a, trial, workload)?;
    if !(trial.noise > 0.0 && trial.noise < 1.0) {
        return Err(usage(format!(
            "--noise {} must be between 0 and 1",
            trial.noise
        )));
    }
    s.seed = Some(trial.seed.unwrap_or_else(time_seed));
    Ok(s)
}

/// The quality evaluation (`quality`, `tune --max-kld`): on every offload device, flash attention
/// as llama.cpp chooses.
pub fn eval_settings(
    text: Option<&Path>,
    max_tokens: Option<u32>,
    chunk: u32,
    threads: Option<u32>,
    fresh: bool,
    cli: &Cli,
) -> anyhow::Result<EvalSettings> {
    if chunk < 16 {
        return Err(usage(format!(
            "--chunk {chunk}: use at least 16 tokens (512 is usual)"
        )));
    }
    if max_tokens == Some(0) {
        return Err(usage("the token limit must be at least 1".into()));
    }
    let text = match text {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("--text {}: cannot read", p.display()))?,
        None => quality::EVAL_TEXT.to_string(),
    };
    if text.trim().is_empty() {
        return Err(usage("the evaluation text is empty".into()));
    }
    Ok(EvalSettings {
        text,
        max_tokens,
        chunk,
        scored: None,
        threads: threads.unwrap_or_else(session::default_threads),
        n_gpu_layers: 999,
        devices: Vec::new(),
        with: {
            // What the figures are measured with is read from llama.cpp's devices.
            crate::llama::init(cli.verbose);
            quality::measured_with(999, &[], search_space::FlashAttn::Auto)
        },
        attn_rot: Default::default(),
        kv_offload: Default::default(),
        decide_at: None,
        fresh,
        cache_dir: session::cache_dir(),
        quiet: cli.quiet,
    })
}
