//! `autotune tune MODEL --draft FILE…`: after tuning, speculative decoding is measured with the
//! winner's settings (threads, KV-cache types, flash attention, placement), and the profile gets the
//! winning draft — which adds llama-server's speculative flags to its command line — or, when no draft
//! pays, a note with the measured numbers.

use super::evaluate::{self, Setup};
use super::search::Winner;
use crate::cli::{Cli, TuneArgs};
use crate::llama::{ContextSettings, ModelSettings};
use anyhow::Context as _;
use profiles::{DraftSettings, Profile};
use search_space::gguf::GgufInfo;
use search_space::identity::ModelIdentity;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs the draft search when `--draft` was given. Returns the sentence for the report's and the
/// profile's notes; sets `profile.draft` when a draft pays.
pub fn attach(
    cli: &Cli,
    args: &TuneArgs,
    info: &GgufInfo,
    profile: &mut Profile,
    budgets: &[(String, u64)],
    stop: &AtomicBool,
) -> anyhow::Result<Option<String>> {
    if args.speculative.draft.is_empty() || stop.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let w = &profile.winner;
    let settings = ModelSettings {
        n_gpu_layers: w.n_gpu_layers,
        devices: w.devices.clone(),
        use_extra_bufts: w.kernels.use_extra_bufts(),
        no_alloc: false,
        rpc: args.rpc.clone(),
        n_cpu_moe: w.n_cpu_moe,
        tensor_overrides: Vec::new(),
        tensor_split: w.tensor_split.clone(),
        split_mode: w.split_mode,
    };
    let context = ContextSettings {
        n_ctx: profile.workload.n_ctx,
        n_batch: w.n_batch,
        n_ubatch: w.n_ubatch,
        threads: w.threads,
        type_k: w.type_k,
        type_v: w.type_v,
        flash_attn: w.flash_attn,
    };
    let search = crate::commands::draft::search_settings(&args.speculative)?;
    let setup = Setup {
        target: profile.model.path.clone(),
        target_info: info.clone(),
        drafts: args.speculative.draft.clone(),
        settings,
        context,
        grid: search.grid,
        prompts: search.prompts,
        n_gen: search.n_gen,
        reps: search.reps,
        noise: args.noise,
        seed: args.seed.unwrap_or(profile.created_unix),
        trial_timeout: crate::cli::parse_duration(&args.trial_timeout)
            .map_err(|e| crate::exit::Exit::new(crate::exit::USAGE, e))?,
        budget: search.budget,
        budgets: budgets.to_vec(),
        llama_version: profile.llama.version.clone(),
    };
    let bar = crate::quant::bar(
        cli.quiet,
        "{spinner} [{elapsed_precise}] speculative decoding: {wide_msg}",
    );
    let progress = |m: &str| {
        if let Some(b) = &bar {
            b.set_message(m.to_string());
        }
    };
    let stop_fn = || stop.load(Ordering::Relaxed);
    let report = evaluate::evaluate(&setup, &stop_fn, &progress);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if !cli.quiet && !args.json {
        eprint!("{}", report.render());
    }
    if report.interrupted || stop.load(Ordering::Relaxed) {
        return Ok(Some("speculative decoding: the draft search was interrupted; run again to measure the drafts".into()));
    }
    if let Some(win) = &report.winner {
        profile.draft = Some(draft_settings(win, &setup)?);
    }
    Ok(Some(report.conclusion.clone()))
}

/// The profile's record of the winning draft.
fn draft_settings(w: &Winner, s: &Setup) -> anyhow::Result<DraftSettings> {
    let id = ModelIdentity::of_file(&w.draft)
        .with_context(|| format!("{}: cannot read", w.draft.display()))?;
    let info = GgufInfo::inspect(&w.draft).map_err(|e| anyhow::anyhow!("{e}"))?;
    let model = evaluate::draft_model(&w.draft, &info, &s.settings, &s.context).placed(w.placement);
    Ok(DraftSettings {
        path: w.draft.clone(),
        file_name: id.file_name,
        fingerprint: id.fingerprint,
        size_bytes: id.size_bytes,
        file_type: info.file_type_name,
        n_max: w.params.n_max,
        n_min: w.params.n_min,
        p_min: (f64::from(w.params.p_min) * 100.0).round() / 100.0,
        n_gpu_layers: model.settings.n_gpu_layers,
        devices: model.settings.devices,
        type_k: model.context.type_k,
        type_v: model.context.type_v,
        acceptance: w.acceptance,
        tokens_per_round: w.tokens_per_round,
        tg_tps: w.tg.median,
        baseline_tg_tps: w.baseline_tg.median,
        mem_bytes: w.mem_bytes,
    })
}
