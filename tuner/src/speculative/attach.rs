//! `autotune tune MODEL --draft FILE…`: after tuning, speculative decoding is measured with the
//! winner's settings (threads, KV-cache types, flash attention, placement), and the profile gets the
//! winning draft — which adds llama-server's speculative flags to its command line — or, when no draft
//! pays, a note with the measured numbers. N-gram speculation (no draft model) is measured too when
//! the workload is one where text repeats (agent, long-prompt), even without `--draft`; it is
//! measured on the workload's prompts, so it is enabled only where it speeds up that workload.

use super::evaluate::{self, Setup};
use super::search::Winner;
use crate::cli::{Cli, TuneArgs};
use crate::llama::{ContextSettings, ModelSettings};
use anyhow::Context as _;
use profiles::{DraftSettings, NgramSettings, Profile};
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
    let ngram_too = super::workload::text_repeats(args.workload) && !args.speculative.no_ngram;
    if (args.speculative.draft.is_empty() && !ngram_too) || stop.load(Ordering::Relaxed) {
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
        tensor_split: Vec::new(),
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
    let mut search = crate::commands::draft::search_settings(&args.speculative)?;
    if !ngram_too {
        search.ngram = super::ngram::NgramGrid::new(Vec::new(), Vec::new())
            .map_err(|e| crate::exit::Exit::new(crate::exit::USAGE, e))?;
    }
    let own = args.speculative.draft_prompts.is_some();
    let setup = Setup {
        target: profile.model.path.clone(),
        target_info: info.clone(),
        drafts: args.speculative.draft.clone(),
        settings,
        context,
        grid: search.grid,
        ngram: search.ngram,
        discover: false,
        prompts: super::workload::prompts_for(args.workload, search.prompts, own),
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
    match &report.winner {
        Some(win) if win.ngram.is_some() => profile.ngram = ngram_settings(win, &setup),
        Some(win) => profile.draft = Some(draft_settings(win, &setup)?),
        None => {}
    }
    Ok(Some(report.conclusion.clone()))
}

/// The profile's record of winning n-gram speculation.
fn ngram_settings(w: &Winner, s: &Setup) -> Option<NgramSettings> {
    let n = w.ngram?;
    let mut kinds: Vec<String> = s.prompts.iter().map(|p| p.kind.clone()).collect();
    kinds.dedup();
    Some(NgramSettings {
        spec_type: super::search::NGRAM_SIMPLE.into(),
        size_n: n.size_n,
        size_m: n.size_m,
        kinds,
        acceptance: w.acceptance,
        tokens_per_round: w.tokens_per_round,
        tg_tps: w.tg.median,
        baseline_tg_tps: w.baseline_tg.median,
    })
}

/// The profile's record of the winning draft.
fn draft_settings(w: &Winner, s: &Setup) -> anyhow::Result<DraftSettings> {
    let id = ModelIdentity::of_file(&w.draft)
        .with_context(|| format!("{}: cannot read", w.draft.display()))?;
    let info = GgufInfo::inspect(&w.draft).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut model = evaluate::draft_model(&w.draft, &info, &s.settings, &s.context);
    if let Some(p) = w.placement {
        model = model.placed(p);
    }
    let params = w
        .params
        .context("the winning draft has no draft settings")?;
    Ok(DraftSettings {
        path: w.draft.clone(),
        file_name: id.file_name,
        fingerprint: id.fingerprint,
        size_bytes: id.size_bytes,
        file_type: info.file_type_name,
        n_max: params.n_max,
        n_min: params.n_min,
        p_min: (f64::from(params.p_min) * 100.0).round() / 100.0,
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
