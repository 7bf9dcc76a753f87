//! `tune`'s flags, and the groups other subcommands share with it: the workload, RPC servers,
//! devices and budgets, trial limits.

use super::{parse_duration, parse_size, workload_preset, DraftSearchArgs, TrialArgs};
use crate::session::DeviceBudget;
use crate::workload::WorkloadPreset;
use clap::Args;
use search_space::{CacheType, FlashAttn, HostBuffer, KernelChoice, KvOffload, Numa, OpOffload};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct TuneArgs {
    /// The GGUF model file to tune
    pub model: PathBuf,

    #[command(flatten)]
    pub workload: WorkloadArgs,

    /// Thread counts to try, comma separated (default: 1, half the cores, the cores, all CPUs), for
    /// generation (-t) and then for the prompt (-tb)
    #[arg(short = 't', long, value_delimiter = ',')]
    pub threads: Option<Vec<u32>>,

    /// Prompt-processing thread counts to try (-tb; default: those of --threads); measured only
    /// where the host multiplies weights
    #[arg(long = "threads-batch", visible_alias = "tb", value_delimiter = ',')]
    pub threads_batch: Option<Vec<u32>>,

    /// KV cache types to try, e.g. f16,q8_0,q4_0: each for K and V together, and K one step more
    /// precise than V (-ctk q8_0 -ctv q4_0) where the devices' backends run such pairs
    #[arg(
        long = "cache-types",
        value_delimiter = ',',
        default_value = "f16,q8_0,q4_0"
    )]
    pub cache_types: Vec<CacheType>,

    /// Quality gate of a quantized KV cache: the most mean KL divergence (nats per token) it may add
    /// over f16, measured on this model, for it to win [default: 0.02: q8_0 caches pass, caches that
    /// change the model's next tokens do not]
    #[arg(
        long = "max-kv-kld",
        value_name = "KLD",
        allow_hyphen_values = true,
        conflicts_with = "no_quality_gate"
    )]
    pub max_kv_kld: Option<f64>,

    /// Let a quantized KV cache win on speed alone, without measuring its quality (the report and
    /// the profile then say quality was not checked)
    #[arg(long = "no-quality-gate")]
    pub no_quality_gate: bool,

    /// Flash attention settings to try: on, off, auto
    #[arg(
        long = "flash-attn",
        value_delimiter = ',',
        default_value = "auto,on,off"
    )]
    pub flash_attn: Vec<FlashAttn>,

    /// CPU kernel choices to try: repack (llama.cpp's extra buffer types: weight repack / AMX) and
    /// plain (llama-server's --no-repack)
    #[arg(long, value_delimiter = ',', default_value = "repack,plain")]
    pub kernels: Vec<KernelChoice>,

    /// Where host weights live, choices to try where weights stay in host memory: mapped
    /// (llama.cpp's default), pinned (a GPU's pinned host memory: --load-mode none) and cpu (the
    /// CPU's repacking buffers: --no-host) [default: all three beside a CUDA or Vulkan device, else
    /// mapped]
    #[arg(long = "host-buffer", value_delimiter = ',')]
    pub host_buffer: Option<Vec<HostBuffer>>,

    /// llama.cpp's NUMA strategies to try (--numa): off (its default), distribute (threads spread
    /// over every node), isolate (threads on the node the server starts on) [default: all three on
    /// a machine with several NUMA nodes, else off]
    #[arg(long, value_delimiter = ',')]
    pub numa: Option<Vec<Numa>>,

    /// Op offload settings to try where weights stay in host memory: on (llama.cpp's default: large
    /// batches of the host's layers run on the GPU) and off (llama-server's --no-op-offload); only
    /// on a machine with a GPU (RPC devices never take them)
    #[arg(long = "op-offload", value_delimiter = ',', default_value = "on,off")]
    pub op_offload: Vec<OpOffload>,

    /// KV offload settings allowed: on (the KV cache on the GPUs, llama.cpp's default) and off (in
    /// host memory, -nkvo: a fit lever, measured when not every layer fits and it lets more fit)
    #[arg(long = "kv-offload", value_delimiter = ',', default_value = "on,off")]
    pub kv_offload: Vec<KvOffload>,

    /// Rotations of a quantized KV cache to try: on (llama.cpp's default) and off
    /// (LLAMA_ATTN_ROT_DISABLE=1: faster decode, and it changes the output, so off wins only within
    /// the quality gate); measured where the best so far has a quantized cache
    #[arg(long = "attn-rot", value_delimiter = ',', default_value = "on,off")]
    pub attn_rot: Vec<search_space::AttnRot>,

    /// Do not measure placements that keep a dense model's FFN weights in host memory with every
    /// layer's attention and KV cache on the GPUs (llama.cpp's --n-cpu-ffn; measured by default
    /// where not every layer fits)
    #[arg(long = "no-cpu-ffn")]
    pub no_cpu_ffn: bool,

    /// Physical batch sizes (-ub) to try [default: 512,256,128; with a non-CPU device and a prompt
    /// longer than 512 tokens also 1024, 2048, 4096 up to the prompt's length]
    #[arg(long, value_delimiter = ',')]
    pub ubatch: Vec<u32>,

    /// Layers to offload to non-CPU devices (-ngl); default: all when such a device exists, else 0
    #[arg(long = "n-gpu-layers", visible_alias = "ngl")]
    pub n_gpu_layers: Option<u32>,

    /// Keep the FFN weights of the first N layers of a dense model in host memory, every layer
    /// offloaded (--n-cpu-ffn; pins the placement, as --n-gpu-layers does: the other axes are
    /// searched around it) [default: searched where not every layer fits]
    #[arg(long = "n-cpu-ffn", conflicts_with_all = ["n_gpu_layers", "no_cpu_ffn"])]
    pub n_cpu_ffn: Option<u32>,

    #[command(flatten)]
    pub devices: DeviceArgs,

    /// Backends to measure a GPU through where several drive it (CUDA and Vulkan on an NVIDIA
    /// machine with both modules), comma separated, the first where the search starts; e.g.
    /// `--backend vulkan` to tune through Vulkan alone [default: every backend that drives a GPU]
    #[arg(long = "backend", value_name = "BACKEND", value_delimiter = ',')]
    pub backend: Option<Vec<String>>,

    /// Measure every combination of the knob values given (grid mode) instead of searching
    #[arg(long)]
    pub exhaustive: bool,

    /// Time budget for the whole run, e.g. 90s, 5m, 1h [default: 10m, growing up to 30m for a
    /// model whose every configuration takes long to load and measure: 40 times the first's cost]
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration)]
    pub budget: Option<Duration>,

    /// About a minute: fewer repetitions, shorter generation
    #[arg(long, conflicts_with = "thorough")]
    pub quick: bool,

    /// Longer: more repetitions and a tighter stopping rule (use on a quiet machine)
    #[arg(long)]
    pub thorough: bool,

    /// Minimum measured repetitions per configuration (after a discarded warm-up)
    #[arg(long = "min-reps", default_value_t = 3)]
    pub min_reps: u32,

    /// Maximum repetitions per configuration
    #[arg(long = "max-reps", default_value_t = 10)]
    pub max_reps: u32,

    #[command(flatten)]
    pub trial: TrialArgs,

    /// Ignore measurements of earlier runs (by default they are reused when still valid)
    #[arg(long, conflicts_with = "resume")]
    pub fresh: bool,

    /// Continue an interrupted run (Ctrl-C): reuse what it measured and measure only the rest. Running
    /// the same command again does the same; --resume also fails when there is nothing to resume
    #[arg(long)]
    pub resume: bool,

    /// Also write the profile to this file
    #[arg(short, long)]
    pub out: Option<PathBuf>,

    /// Do not save the profile in the profile store
    #[arg(long = "no-save")]
    pub no_save: bool,

    /// Print the report as JSON instead of a table
    #[arg(long)]
    pub json: bool,

    /// Rows of the leaderboard to print
    #[arg(long, default_value_t = 10)]
    pub top: usize,

    // ---- quantization choice (tuning::joint): any of these makes `tune` choose among quantizations ----
    /// Other quantizations of MODEL to choose among (files or folders); each is tuned (what --budget
    /// has left after the quality table is shared among them) and the fastest under --max-kld wins
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub quants: Vec<PathBuf>,
    /// Choose among the quantizations of MODEL found in its folder (see `autotune quality MODEL --list`)
    #[arg(long)]
    pub ladder: bool,
    /// Quality gate of the weights, in nats per token: the mean KL divergence from the most precise
    /// file that a weight quantization may add (default 0.05: Q4_K_M-class and better on mid-size
    /// models; lower it to insist on Q6_K/Q8_0-class fidelity); a KV cache is held to --max-kv-kld
    /// on the weights that will run
    #[arg(long = "max-kld")]
    pub max_kld: Option<f64>,
    /// The file quality is measured against (default: the most precise of the quantizations)
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Evaluate quality on only the first N tokens of the evaluation text (faster, noisier)
    #[arg(long = "quality-tokens")]
    pub quality_tokens: Option<u32>,

    /// Write charts (SVG: tg and pp against GPU layers, the leaderboard) beside the saved profile
    #[arg(long)]
    pub plot: bool,

    /// Write a Markdown report (leaderboard, diagnosis, roofline, chart links) to FILE, with the
    /// charts beside it (or beside the profile with --plot)
    #[arg(long = "export-markdown", value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,

    /// Speculative decoding (`--draft FILE…`): measured with the winner's settings after tuning
    #[command(flatten)]
    pub speculative: DraftSearchArgs,
}

/// `--ctx`: a number of tokens, or the most that fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtxArg {
    Tokens(u32),
    Max,
}

fn parse_ctx(s: &str) -> Result<CtxArg, String> {
    if s.eq_ignore_ascii_case("max") {
        return Ok(CtxArg::Max);
    }
    s.parse().map(CtxArg::Tokens).map_err(|_| {
        format!("'{s}': give a number of tokens (e.g. 8192) or max (the most that fits)")
    })
}

/// The request to optimise for (`tune`): the context size and one representative request.
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// Context size the server will run with (llama.cpp's -c); measured at this size. `max`: the
    /// largest context up to the model's trained one (times --parallel) at which every layer and its
    /// KV cache fit the budgets (the offload devices' when there are any, else RAM), found by dry runs
    #[arg(short = 'c', long = "ctx", default_value = "4096", value_parser = parse_ctx)]
    pub ctx: CtxArg,

    /// The kind of request to optimise for: chat (256-token turns, 256 generated, 1024 already in
    /// the cache), long-prompt (3000-token documents, 128 generated), agent (1024-token tool
    /// results, 256 generated, 2048 in the cache). --prompt/--gen/--depth override its numbers.
    /// Without it: 512 prompt, 128 generated, no depth (llama-bench's pp512/tg128)
    #[arg(long, value_parser = workload_preset())]
    pub workload: Option<WorkloadPreset>,

    /// Prompt tokens of a representative request (prompt processing is measured at this length)
    #[arg(short = 'p', long)]
    pub prompt: Option<u32>,

    /// Tokens generated per request (generation speed is measured over this many)
    #[arg(short = 'n', long)]
    pub gen: Option<u32>,

    /// Tokens already in the KV cache when generation is measured (a long chat); 0 = none
    #[arg(short = 'd', long)]
    pub depth: Option<u32>,

    /// Requests served at once (llama-server's -np slots, each with ctx/N of the context): the
    /// prompts and generations of N requests are measured together, and the figures are theirs
    /// together (aggregate t/s)
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    pub parallel: u32,
}

/// ggml RPC servers as devices (`tune`, `fit`, `measure`, `doctor`).
#[derive(Debug, Args)]
pub struct RpcArgs {
    /// ggml RPC servers to use as devices, host:port comma separated (see `autotune rpc-serve`)
    #[arg(long = "rpc", value_name = "RPC", value_delimiter = ',')]
    pub servers: Vec<String>,
}

/// The devices a run may use and the memory it may take on each (`tune`, `fit`).
#[derive(Debug, Args)]
pub struct DeviceArgs {
    #[command(flatten)]
    pub rpc: RpcArgs,

    /// Memory a device may use, DEVICE=SIZE (e.g. RPC0=300M, CPU=8G); repeatable. A GPU two backends
    /// drive has one budget, given by either name (CUDA0 or Vulkan0). Default: its free memory minus
    /// --mem-margin
    #[arg(long = "mem-budget", value_delimiter = ',')]
    pub mem_budget: Vec<DeviceBudget>,

    /// Memory kept free on every device when no --mem-budget is given (llama.cpp's own fit keeps
    /// 1 GiB, which costs whole layers on small cards)
    #[arg(long = "mem-margin", default_value = "256M", value_parser = parse_size)]
    pub mem_margin: u64,
}
