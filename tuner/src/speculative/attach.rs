//! `autotune tune MODEL --draft FILE…`: after tuning, speculative decoding is measured with the
//! winner's settings (threads, KV-cache types, flash attention, placement), and the profile gets the
//! winning draft — which adds llama-server's speculative flags to its command line — or, when no draft
//! pays, a note with the measured numbers. N-gram speculation (no draft model) is measured too when
//! the workload is one where text repeats (agent, long-prompt), even without `--draft`, and MTP
//! (`draft-mtp`) whenever the target carries MTP heads. Every kind is measured on the workload's
//! prompts and written (`[draft]`, `[ngram]` or `[mtp]`) only when it wins the paired comparison
//! there, so speculation that slows the user's workload is never enabled.

use super::evaluate::{self, Setup};
use super::prompts::Prompt;
use super::search::Winner;
use super::Grid;
use crate::llama::{ContextSettings, ModelSettings};
use anyhow::Context as _;
use profiles::{DraftSettings, MtpSettings, NgramSettings, Profile};
use search_space::gguf::GgufInfo;
use search_space::identity::ModelIdentity;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The draft search, validated (shared by `autotune draft` and `tune --draft`).
#[derive(Debug, Clone)]
pub struct DraftSearch {
    /// Draft model files (`auto` among them: the compatible smaller models beside the target).
    pub drafts: Vec<PathBuf>,
    pub grid: Grid,
    /// N-gram speculation's lengths (empty: not measured).
    pub ngram: super::ngram::NgramGrid,
    pub prompts: Vec<Prompt>,
    /// The prompts are the user's (`--draft-prompts`), not filtered by the workload.
    pub own_prompts: bool,
    /// The workload the choice is made for (its prompt kinds; n-gram only where text repeats).
    pub workload: Option<crate::workload::WorkloadPreset>,
    pub n_gen: u32,
    pub reps: u32,
    pub budget: Duration,
    /// Tie threshold of the final comparison.
    pub noise: f64,
    /// Seed of the final comparison's order; `None`: the profile's creation time.
    pub seed: Option<u64>,
    pub trial_timeout: Duration,
}

/// What of a tuned model the draft search needs: the target's header, the run's RPC servers and
/// budgets.
pub struct Tuned<'a> {
    pub info: &'a search_space::gguf::GgufInfo,
    pub rpc: &'a [String],
    pub budgets: &'a profiles::Budgets,
}

/// Runs the draft search for a tuned model's winner. Returns the sentence for the report's and the
/// profile's notes; sets `profile.draft`, `profile.ngram` or `profile.mtp` when that speculation
/// pays. `show`: print the search's table on stderr.
pub fn attach(
    search: &DraftSearch,
    tuned: &Tuned<'_>,
    profile: &mut Profile,
    stop: &AtomicBool,
    quiet: bool,
    show: bool,
) -> anyhow::Result<Option<String>> {
    let ngram_too = super::workload::text_repeats(search.workload) && !search.ngram.is_empty();
    // The target's own MTP heads need no draft model: tried whenever it has some.
    let mtp_too = super::mtp::heads(tuned.info) > 0;
    if (search.drafts.is_empty() && !ngram_too && !mtp_too) || stop.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let setup = setup(search, tuned, profile, ngram_too);
    let bar = crate::term::bar(
        quiet,
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
    if show {
        eprint!("{}", report.render());
    }
    if report.interrupted || stop.load(Ordering::Relaxed) {
        return Ok(Some("speculative decoding: the draft search was interrupted; run again to measure the drafts".into()));
    }
    match &report.winner {
        Some(win) if win.ngram.is_some() => profile.ngram = ngram_settings(win, &setup),
        Some(win) if win.mtp.is_some() => profile.mtp = mtp_settings(win, &setup),
        Some(win) => profile.draft = Some(draft_settings(win, &setup)?),
        None => {}
    }
    Ok(Some(report.conclusion.clone()))
}

/// What the search measures: the winner's placement and context (for the profile's slots, which
/// get the prompts in whole groups), with n-gram speculation where it is tried.
fn setup(search: &DraftSearch, tuned: &Tuned<'_>, profile: &Profile, ngram_too: bool) -> Setup {
    let slots = profile.workload.n_parallel.max(1);
    let w = &profile.winner;
    let settings = ModelSettings::for_candidate(w, tuned.rpc);
    let context = super::workload::for_slots(
        ContextSettings::for_candidate(w, profile.workload.n_ctx),
        slots,
        longest(search),
    );
    let ngram = if ngram_too {
        search.ngram.clone()
    } else {
        super::ngram::NgramGrid::default()
    };
    Setup {
        target: profile.model.path.clone(),
        target_info: tuned.info.clone(),
        drafts: search.drafts.clone(),
        settings,
        context,
        grid: search.grid.clone(),
        ngram,
        mtp: super::mtp::DEFAULT_N_MAX.to_vec(),
        discover: false,
        prompts: super::workload::fill_slots(
            super::workload::prompts_for(
                search.workload,
                search.prompts.clone(),
                search.own_prompts,
            ),
            slots,
        ),
        n_gen: search.n_gen,
        reps: search.reps,
        noise: search.noise,
        seed: search.seed.unwrap_or(profile.created_unix),
        trial_timeout: search.trial_timeout,
        budget: search.budget,
        budgets: tuned.budgets.clone(),
        llama_version: profile.llama.version.clone(),
    }
}

/// The longest draft the search may measure: a draft model's n_max or n-gram speculation's m.
fn longest(search: &DraftSearch) -> u32 {
    let n_max = search.grid.n_max.iter().max().copied().unwrap_or(0);
    n_max.max(search.ngram.size_m.iter().max().copied().unwrap_or(0))
}

/// The prompt kinds the search measured on, in order, once each.
fn kinds(s: &Setup) -> Vec<String> {
    let mut kinds: Vec<String> = s.prompts.iter().map(|p| p.kind.clone()).collect();
    kinds.dedup();
    kinds
}

/// The profile's record of winning n-gram speculation.
fn ngram_settings(w: &Winner, s: &Setup) -> Option<NgramSettings> {
    let n = w.ngram?;
    let kinds = kinds(s);
    Some(NgramSettings {
        spec_type: super::ngram::NGRAM_SIMPLE.into(),
        size_n: n.size_n,
        size_m: n.size_m,
        kinds,
        acceptance: w.acceptance,
        tokens_per_round: w.tokens_per_round,
        tg_tps: w.tg.median,
        baseline_tg_tps: w.baseline_tg.median,
    })
}

/// The profile's record of winning MTP speculation (the target's own heads).
fn mtp_settings(w: &Winner, s: &Setup) -> Option<MtpSettings> {
    let m = w.mtp?;
    Some(MtpSettings {
        n_max: m.n_max,
        kinds: kinds(s),
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
