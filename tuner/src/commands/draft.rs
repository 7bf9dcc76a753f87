//! `autotune draft TARGET [--draft FILE…]`: which draft model (and which draft settings) make
//! speculative decoding of TARGET faster on this machine, measured against the target alone. Without
//! `--draft`, the smaller compatible models beside TARGET are tried.

use super::settings;
use crate::cli::{Cli, DraftArgs};
use crate::exit::{self, Exit};
use crate::inputs;
use crate::llama::{ContextSettings, ModelSettings};
use crate::probe::{self, Probe};
use crate::speculative::attach::DraftSearch;
use crate::speculative::evaluate::{self, Setup};
use crate::{session, term};
use anyhow::Context as _;
use search_space::gguf::GgufInfo;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

pub fn run(cli: &Cli, a: &DraftArgs) -> anyhow::Result<i32> {
    settings::check_parallel(a.parallel)?;
    if a.ctx / a.parallel < 256 {
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "--ctx {} leaves each of --parallel {} slots under 256 tokens",
                a.ctx, a.parallel
            ),
        ));
    }
    let info = session::inspect_model(&a.target)?;
    let target = std::fs::canonicalize(&a.target)
        .with_context(|| format!("{}: cannot resolve path", a.target.display()))?;
    let search = settings::draft_command_search(&a.search, &a.trial, a.workload)?;
    let stop = term::interrupt_flag()?;
    let d = probe::probe(cli.verbose, &[])?;
    let setup = setup(a, target, info, search, &d)?;
    if setup.context.n_ctx < 256 {
        return Err(Exit::new(exit::USAGE, "--ctx must be at least 256"));
    }
    let bar = term::bar(cli.quiet, "{spinner} [{elapsed_precise}] {wide_msg}");
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

/// What to evaluate: the target on this machine (all layers offloaded when there is a device to
/// offload to, unless `--n-gpu-layers` says otherwise), a batch that holds the longest draft, and the
/// search's drafts, grid and prompts.
fn setup(
    a: &DraftArgs,
    target: PathBuf,
    info: GgufInfo,
    search: DraftSearch,
    d: &Probe,
) -> anyhow::Result<Setup> {
    let offload = !d.machine.offload_devices().is_empty();
    let n_gpu_layers = a.n_gpu_layers.unwrap_or(if offload {
        info.block_count.unwrap_or(0) + 1
    } else {
        0
    });
    if let Some(t) = a.threads {
        inputs::threads("--threads", &[t], inputs::logical_cpus())?;
    }
    let threads = a
        .threads
        .unwrap_or(d.machine.llama_default_threads())
        .max(1);
    let longest = search.ngram.size_m.iter().max().copied().unwrap_or(0);
    let longest = longest.max(search.grid.n_max.iter().max().copied().unwrap_or(16));
    Ok(Setup {
        target,
        target_info: info,
        drafts: search.drafts,
        settings: ModelSettings {
            n_gpu_layers,
            use_extra_bufts: a.kernels.use_extra_bufts(),
            ..ModelSettings::default()
        },
        context: context(a, threads, longest),
        grid: search.grid,
        ngram: search.ngram,
        mtp: crate::speculative::mtp::DEFAULT_N_MAX.to_vec(),
        discover: true,
        prompts: crate::speculative::workload::fill_slots(
            crate::speculative::workload::prompts_for(
                search.workload,
                search.prompts,
                search.own_prompts,
            ),
            a.parallel,
        ),
        n_gen: search.n_gen,
        reps: search.reps,
        noise: search.noise,
        seed: search.seed.unwrap_or(1),
        trial_timeout: search.trial_timeout,
        budget: search.budget,
        budgets: session::budgets_of(&[], a.mem_margin, &d.machine)?,
        llama_version: d.llama_version.clone(),
    })
}

/// Both models' context: the flags', with a batch that holds the longest draft of every slot.
fn context(a: &DraftArgs, threads: u32, longest: u32) -> ContextSettings {
    let n_batch = 2048u32.max(longest + 1);
    let flags = ContextSettings::defaults(a.ctx, threads).with_knobs(|c| {
        c.n_batch = n_batch;
        (c.type_k, c.type_v) = (a.cache_type_k, a.cache_type_v);
        c.flash_attn = a.flash_attn;
    });
    crate::speculative::workload::for_slots(flags, a.parallel, longest)
}
