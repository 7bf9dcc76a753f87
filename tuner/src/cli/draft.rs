//! `draft`'s flags, and the draft search settings `tune --draft` shares.

use super::{parse_duration, parse_size, workload_preset, TrialArgs};
use crate::workload::WorkloadPreset;
use clap::Args;
use search_space::{CacheType, FlashAttn, KernelChoice};
use std::path::PathBuf;
use std::time::Duration;

/// Speculative-decoding search flags, shared by `autotune draft` and `autotune tune`.
#[derive(Debug, Clone, Args)]
pub struct DraftSearchArgs {
    /// Draft models for speculative decoding: smaller models with the target's vocabulary (the same
    /// family, or a lower-bit quantization of the same model), comma separated; `auto` = the compatible
    /// smaller models beside the target. With `tune`, the winner gets the fastest draft that beats the
    /// target alone (or a note saying none does)
    #[arg(long = "draft", value_delimiter = ',', num_args = 1.., value_name = "FILE")]
    pub draft: Vec<PathBuf>,
    /// Draft lengths to try (llama-server's --spec-draft-n-max): longer drafts win more per round
    /// when the draft is usually right and waste more when it is not
    #[arg(long = "draft-max", value_delimiter = ',', default_value = "4,8,16")]
    pub draft_max: Vec<u32>,
    /// Shortest draft worth verifying (--spec-draft-n-min); only matters with a --draft-p-min above 0
    #[arg(long = "draft-min", value_delimiter = ',', default_value = "0,2")]
    pub draft_min: Vec<u32>,
    /// Draft confidence thresholds to try (--spec-draft-p-min): drafting stops when the draft's top
    /// token is less likely than this
    #[arg(
        long = "draft-p-min",
        value_delimiter = ',',
        default_value = "0,0.5,0.8"
    )]
    pub draft_p_min: Vec<f32>,
    /// Tokens generated per prompt of the prompt set (more: steadier acceptance figures, longer runs)
    #[arg(long = "draft-gen", default_value_t = 48)]
    pub draft_gen: u32,
    /// N-gram lookup lengths to try for n-gram speculation without a draft model (llama-server's
    /// --spec-type ngram-simple --spec-ngram-simple-size-n): shorter ones match more often, longer
    /// ones match more surely
    #[arg(long = "ngram-n", value_delimiter = ',', default_value = "4,12")]
    pub ngram_n: Vec<u32>,
    /// N-gram draft lengths to try (--spec-ngram-simple-size-m): the most tokens copied after a match
    #[arg(long = "ngram-m", value_delimiter = ',', default_value = "8,16,48")]
    pub ngram_m: Vec<u32>,
    /// Do not measure n-gram speculation (only draft models)
    #[arg(long = "no-ngram")]
    pub no_ngram: bool,
    /// Prompt set to measure on, a TOML file of [[prompt]] name/kind/text tables (default: the
    /// built-in code, chat, summarisation and repetitive-text prompts)
    #[arg(long = "draft-prompts", value_name = "FILE")]
    pub draft_prompts: Option<PathBuf>,
    /// Interleaved rounds of the final comparison with the target alone
    #[arg(long = "draft-reps", default_value_t = 3)]
    pub draft_reps: u32,
    /// Time for the draft search, e.g. 90s, 5m (settings left unmeasured are reported as skipped)
    #[arg(
        long = "draft-budget",
        default_value = "5m",
        allow_hyphen_values = true,
        value_parser = parse_duration
    )]
    pub draft_budget: Duration,
}

#[derive(Debug, Args)]
#[command(
    mut_arg("noise", |a| a.help("Relative difference below which the draft and the target alone are called a tie")),
    mut_arg("seed", |a| a.help("Seed of the order of the final comparison (recorded in the report)")),
    mut_arg("trial_timeout", |a| a.help(
        "Deadline of one prompt's generation (a pass over the prompt set gets one per prompt): a \
         worker that gives no answer in time is killed and the setting recorded as failed"
    ))
)]
pub struct DraftArgs {
    /// The target model (the one whose output counts)
    pub target: PathBuf,
    /// Measure and choose for this workload's prompts: chat (chat), agent (code and repetitive
    /// text), long-prompt (summarisation); default: every built-in prompt. Ignored with --draft-prompts
    #[arg(long, value_parser = workload_preset())]
    pub workload: Option<WorkloadPreset>,
    #[command(flatten)]
    pub search: DraftSearchArgs,
    /// Context size of both models (-c)
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: u32,
    /// Requests served at once (-np): the prompts are generated N at a time, one slot each with
    /// ctx/N of the context, and speeds are those of all N together
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    pub parallel: u32,
    /// Threads (-t; default: the physical cores)
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// K cache type of both models (-ctk)
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "f16")]
    pub cache_type_k: CacheType,
    /// V cache type of both models (-ctv)
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "f16")]
    pub cache_type_v: CacheType,
    /// Flash attention: on, off, auto (-fa)
    #[arg(long = "flash-attn", visible_alias = "fa", default_value = "auto")]
    pub flash_attn: FlashAttn,
    /// CPU kernels: repack (llama.cpp's default) or plain (--no-repack)
    #[arg(long, default_value = "repack")]
    pub kernels: KernelChoice,
    /// Target layers on non-CPU devices (-ngl; default: all when such a device exists); the draft
    /// follows (all its layers when the target offloads)
    #[arg(long = "n-gpu-layers", visible_alias = "ngl")]
    pub n_gpu_layers: Option<u32>,
    /// Memory kept free on every device: target and draft together must fit in the rest
    #[arg(long = "mem-margin", default_value = "256M", value_parser = parse_size)]
    pub mem_margin: u64,
    #[command(flatten)]
    pub trial: TrialArgs,
    /// Print the report as JSON instead of a table
    #[arg(long)]
    pub json: bool,
}
