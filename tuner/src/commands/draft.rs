//! `autotune draft TARGET [--draft FILE…]`: which draft model (and which draft settings) make
//! speculative decoding of TARGET faster on this machine, measured against the target alone. Without
//! `--draft`, the smaller compatible models beside TARGET are tried.

use crate::cli::{Cli, DraftArgs, DraftSearchArgs};
use crate::commands::{doctor, tune::inspect_model};
use crate::exit::{self, Exit};
use crate::inputs::{self, Also};
use crate::llama::{ContextSettings, ModelSettings};
use crate::speculative::evaluate::{self, Setup};
use crate::speculative::ngram::NgramGrid;
use crate::speculative::prompts::{self, Prompt};
use crate::speculative::Grid;
use anyhow::Context as _;
use search_space::{CacheType, FlashAttn, KernelChoice};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The validated search flags shared with `tune --draft`.
pub struct SearchFlags {
    pub grid: Grid,
    pub ngram: NgramGrid,
    pub prompts: Vec<Prompt>,
    pub n_gen: u32,
    pub reps: u32,
    pub budget: Duration,
}

pub fn search_settings(a: &DraftSearchArgs) -> anyhow::Result<SearchFlags> {
    let usage = |m: String| Exit::new(exit::USAGE, m);
    inputs::model_files("--draft", &a.draft, Also::Auto)?;
    let grid = Grid::new(
        a.draft_max.clone(),
        a.draft_min.clone(),
        a.draft_p_min.clone(),
    )
    .map_err(usage)?;
    let ngram = if a.no_ngram {
        NgramGrid::new(Vec::new(), Vec::new())
    } else {
        NgramGrid::new(a.ngram_n.clone(), a.ngram_m.clone())
    }
    .map_err(usage)?;
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
    let budget = crate::cli::parse_duration(&a.draft_budget)
        .map_err(|e| usage(format!("--draft-budget: {e}")))?;
    Ok(SearchFlags {
        grid,
        ngram,
        prompts,
        n_gen: a.draft_gen,
        reps: a.draft_reps,
        budget,
    })
}

fn parse<T: std::str::FromStr>(flag: &str, v: &str) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    v.parse::<T>()
        .map_err(|e| Exit::new(exit::USAGE, format!("{flag}: {e}")))
}

pub fn run(cli: &Cli, a: &DraftArgs) -> anyhow::Result<i32> {
    let info = inspect_model(&a.target)?;
    let target = std::fs::canonicalize(&a.target)
        .with_context(|| format!("{}: cannot resolve path", a.target.display()))?;
    let search = search_settings(&a.search)?;
    if !(a.noise > 0.0 && a.noise < 1.0) {
        return Err(Exit::new(
            exit::USAGE,
            format!("--noise {} must be between 0 and 1", a.noise),
        ));
    }
    let stop = crate::quant::interrupt_flag()?;
    let d = doctor::probe(cli.verbose, &[])?;
    let offload = !d.machine.offload_devices().is_empty();
    let n_gpu_layers = a.n_gpu_layers.unwrap_or(if offload {
        info.block_count.unwrap_or(0) + 1
    } else {
        0
    });
    let margin = search_space::size::parse_size(&a.mem_margin)
        .map_err(|e| Exit::new(exit::USAGE, format!("--mem-margin: {e}")))?;
    if let Some(t) = a.threads {
        inputs::threads("--threads", &[t], inputs::logical_cpus())?;
    }
    let threads = a.threads.unwrap_or(d.machine.physical_cores).max(1);
    let longest = search.ngram.size_m.iter().max().copied().unwrap_or(0);
    let longest = longest.max(search.grid.n_max.iter().max().copied().unwrap_or(16));
    let n_batch = 2048u32.max(longest + 1);
    let own_prompts = a.search.draft_prompts.is_some();
    let setup = Setup {
        target,
        target_info: info,
        drafts: a.search.draft.clone(),
        settings: ModelSettings {
            n_gpu_layers,
            devices: Vec::new(),
            use_extra_bufts: parse::<KernelChoice>("--kernels", &a.kernels)?.use_extra_bufts(),
            no_alloc: false,
            rpc: Vec::new(),
            n_cpu_moe: 0,
            tensor_overrides: Vec::new(),
            tensor_split: Vec::new(),
        },
        context: ContextSettings {
            n_ctx: a.ctx,
            n_batch,
            n_ubatch: 512,
            threads,
            type_k: parse::<CacheType>("--cache-type-k", &a.cache_type_k)?,
            type_v: parse::<CacheType>("--cache-type-v", &a.cache_type_v)?,
            flash_attn: parse::<FlashAttn>("--flash-attn", &a.flash_attn)?,
        },
        grid: search.grid,
        ngram: search.ngram,
        discover: true,
        prompts: crate::speculative::workload::prompts_for(a.workload, search.prompts, own_prompts),
        n_gen: search.n_gen,
        reps: search.reps,
        noise: a.noise,
        seed: a.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(1)
        }),
        trial_timeout: crate::cli::parse_duration(&a.trial_timeout)
            .map_err(|e| Exit::new(exit::USAGE, format!("--trial-timeout: {e}")))?,
        budget: search.budget,
        budgets: d
            .machine
            .devices
            .iter()
            .map(|x| (x.name.clone(), x.memory_free.saturating_sub(margin)))
            .collect(),
        llama_version: d.llama_version.clone(),
    };
    if setup.context.n_ctx < 256 {
        return Err(Exit::new(exit::USAGE, "--ctx must be at least 256"));
    }
    let bar = crate::quant::bar(cli.quiet, "{spinner} [{elapsed_precise}] {wide_msg}");
    let progress = |m: &str| match &bar {
        Some(b) => b.set_message(m.to_string()),
        None if cli.verbose => eprintln!("autotune: {m}"),
        None => {}
    };
    let stop_fn = || stop.load(Ordering::Relaxed);
    let report = evaluate::evaluate(&setup, &stop_fn, &progress);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    if report.interrupted || stop.load(Ordering::Relaxed) {
        return Err(Exit::new(
            exit::INTERRUPTED,
            "interrupted; nothing is kept (run again)",
        ));
    }
    Ok(exit::OK)
}
