//! Command-line flags as clap parses them ("low args"); `commands::*` turns them into validated
//! settings ("high args"). Flag names mirror llama.cpp's where they overlap.

use crate::session::DeviceBudget;
use clap::{Args, Parser, Subcommand};
use search_space::{CacheType, FlashAttn, KernelChoice, KvOffload, OpOffload, SplitMode};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "autotune",
    version,
    about = "Finds the fastest way to run a GGUF model with llama.cpp on this machine",
    long_about = "Finds the fastest way to run a GGUF model with llama.cpp on this machine.\n\n\
        `autotune model.gguf` is short for `autotune tune model.gguf`: it measures real configurations \
        through linked llama.cpp and saves the fastest that fits as a profile.",
    after_help = "Exit codes: 0 ok, 1 error, 2 bad usage, 3 bad model file, 4 nothing could be measured, \
        5 bad profile or store, 6 llama-server refused the profile's arguments, 130 interrupted."
)]
pub struct Cli {
    /// Print llama.cpp's own log lines on stderr (useful when a trial fails)
    #[arg(short, long, global = true)]
    pub verbose: bool,

    /// No progress bar
    #[arg(short, long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure configurations of MODEL and save the fastest as a profile (the default command)
    Tune(Box<TuneArgs>),
    /// Show llama.cpp's devices, backends, CPU variant and system info
    Doctor(DoctorArgs),
    /// List stored profiles, or print one (by model file or profile path)
    Show(ShowArgs),
    /// Measure one configuration (like llama-bench): pp, tg and tg at depth with statistics
    Measure(MeasureArgs),
    /// Print the llama-server command for a profile, or start the server with it and verify its speed
    Apply(ApplyArgs),
    /// Write a profile in another runner's format: args, presets, llama-swap, ollama, json
    Export(ExportArgs),
    /// Serve this machine's CPU as a ggml RPC device (a second device for offload tests, or a
    /// remote machine's share of a model)
    #[command(name = "rpc-serve")]
    RpcServe(RpcServeArgs),
    /// Internal: the worker process that runs trials
    #[command(name = "__worker", hide = true)]
    Worker,
    /// Write other quantizations of a model (a "ladder") with llama.cpp's quantizer
    Quantize(QuantizeArgs),
    /// How far each quantization of a model (and each KV-cache type) drifts from the most precise
    /// file available: KL divergence and top-1 agreement of next-token distributions
    Quality(QualityArgs),
    /// Explain a profile: the memory-bandwidth roofline and a diagnosis (fit, bandwidth, dense or
    /// sparse, prefill, devices, which setting mattered), with charts and a Markdown report
    Explain(ExplainArgs),
    /// Speculative decoding: measure draft models (smaller models of the same family) against the
    /// target alone, with their draft settings, and report which pays
    Draft(Box<DraftArgs>),
    /// llama.cpp's own fit (common_fit_params) under the same budgets: the placement it chooses, its
    /// llama-server flags, and autotune's dry-run prediction of that placement per device
    Fit(crate::commands::fit::FitArgs),
}

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

    /// KV cache types to try (applied to K and V together), e.g. f16,q8_0,q4_0
    #[arg(
        long = "cache-types",
        value_delimiter = ',',
        default_value = "f16,q8_0,q4_0"
    )]
    pub cache_types: Vec<CacheType>,

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

    /// Op offload settings to try where weights stay in host memory: on (llama.cpp's default: large
    /// batches of the host's layers run on the GPU) and off (llama-server's --no-op-offload); only
    /// on a machine with a GPU (RPC devices never take them)
    #[arg(long = "op-offload", value_delimiter = ',', default_value = "on,off")]
    pub op_offload: Vec<OpOffload>,

    /// KV offload settings allowed: on (the KV cache on the GPUs, llama.cpp's default) and off (in
    /// host memory, -nkvo: a fit lever, measured when not every layer fits and it lets more fit)
    #[arg(long = "kv-offload", value_delimiter = ',', default_value = "on,off")]
    pub kv_offload: Vec<KvOffload>,

    /// Physical batch sizes (-ub) to try [default: 512,256,128; with a non-CPU device and a prompt
    /// longer than 512 tokens also 1024, 2048, 4096 up to the prompt's length]
    #[arg(long, value_delimiter = ',')]
    pub ubatch: Vec<u32>,

    /// Layers to offload to non-CPU devices (-ngl); default: all when such a device exists, else 0
    #[arg(long = "n-gpu-layers", visible_alias = "ngl")]
    pub n_gpu_layers: Option<u32>,

    #[command(flatten)]
    pub devices: DeviceArgs,

    /// Measure every combination of the knob values given (grid mode) instead of searching
    #[arg(long)]
    pub exhaustive: bool,

    /// Time budget for the whole run, e.g. 90s, 5m, 1h
    #[arg(long, default_value = "10m", allow_hyphen_values = true, value_parser = parse_duration)]
    pub budget: Duration,

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

    // ---- quantization choice (quant::joint): any of these makes `tune` choose among quantizations ----
    /// Other quantizations of MODEL to choose among (files or folders); each is tuned (--budget is
    /// shared among them, at least 30 s each) and the fastest under --max-kld wins
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub quants: Vec<PathBuf>,
    /// Choose among the quantizations of MODEL found in its folder (see `autotune quality MODEL --list`)
    #[arg(long)]
    pub ladder: bool,
    /// Quality gate, in nats per token: the mean KL divergence from the most precise file that a
    /// weight quantization, and separately a KV-cache type, may add (default 0.05: Q4_K_M-class and
    /// better on mid-size models; lower it to insist on Q6_K/Q8_0-class fidelity)
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

/// The request to optimise for (`tune`): the context size and one representative request.
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// Context size the server will run with (llama.cpp's -c); measured at this size
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: u32,

    /// The kind of request to optimise for: chat (256-token turns, 256 generated, 1024 already in
    /// the cache), long-prompt (3000-token documents, 128 generated), agent (1024-token tool
    /// results, 256 generated, 2048 in the cache). --prompt/--gen/--depth override its numbers.
    /// Without it: 512 prompt, 128 generated, no depth (llama-bench's pp512/tg128)
    #[arg(long)]
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

    /// Memory a device may use, DEVICE=SIZE (e.g. RPC0=300M, CPU=8G); repeatable. Default: its free
    /// memory minus --mem-margin
    #[arg(long = "mem-budget", value_delimiter = ',')]
    pub mem_budget: Vec<DeviceBudget>,

    /// Memory kept free on every device when no --mem-budget is given (llama.cpp's own fit keeps
    /// 1 GiB, which costs whole layers on small cards)
    #[arg(long = "mem-margin", default_value = "256M", value_parser = parse_size)]
    pub mem_margin: u64,
}

/// How candidates are judged and how long one may take (`tune`, `draft`).
#[derive(Debug, Args)]
pub struct TrialArgs {
    /// Relative difference below which two configurations are called a tie
    #[arg(long, default_value_t = crate::stats::DEFAULT_NOISE)]
    pub noise: f64,

    /// Seed of the candidate order shuffle and the prompt tokens (recorded in the report)
    #[arg(long)]
    pub seed: Option<u64>,

    /// A trial that gives no answer within this time is killed and recorded as timed out
    #[arg(
        long = "trial-timeout",
        default_value = "5m",
        allow_hyphen_values = true,
        value_parser = parse_duration
    )]
    pub trial_timeout: Duration,
}

#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The source GGUF file (ideally F16/BF16/F32; a quantized one needs --allow-requantize)
    pub src: PathBuf,
    /// Quantizations to write, comma separated (llama-quantize's names: f16, bf16, q8_0, q6_k,
    /// q5_k_m, q4_k_m, q4_0, …)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "f16,q8_0,q6_k,q5_k_m,q4_k_m,q4_0"
    )]
    pub types: Vec<String>,
    /// Folder to write them to (default: a folder per source under $AUTOTUNE_CACHE_DIR/ladder/)
    #[arg(long = "out-dir")]
    pub out_dir: Option<PathBuf>,
    /// Quantize from an already quantized source: every file then carries the source's rounding too
    /// (an F16 made from it holds the source's weights to within F16 rounding: the highest precision
    /// available)
    #[arg(long = "allow-requantize")]
    pub allow_requantize: bool,
    /// Threads the quantizer uses (default: all CPUs)
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Write files again that already exist
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct QualityArgs {
    /// A GGUF model: its ladder (the other quantizations beside it, or --quants) is evaluated
    pub model: PathBuf,
    /// Quantizations of the model to evaluate instead of those found beside it: files or folders
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub quants: Vec<PathBuf>,
    /// The file to compare against (default: the most precise of the ladder)
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// KV-cache types to evaluate (on the reference's weights), comma separated
    #[arg(
        long = "kv-types",
        value_delimiter = ',',
        default_value = "f16,q8_0,q4_0"
    )]
    pub kv_types: Vec<CacheType>,
    /// Evaluate only the first N tokens of the text (faster, noisier)
    #[arg(long)]
    pub tokens: Option<u32>,
    /// Chunk length: the context each chunk of the text is evaluated in
    #[arg(long, default_value_t = 512)]
    pub chunk: u32,
    /// Evaluation text (default: the English prose, code and dialogue built into autotune)
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Threads (default: the physical cores)
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Only list the ladder: which files were considered and why others were not (runs nothing)
    #[arg(long)]
    pub list: bool,
    /// Evaluate again even when a cached result exists
    #[arg(long)]
    pub fresh: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

/// Workload presets: (prompt, gen, depth) of a representative request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadPreset {
    Chat,
    LongPrompt,
    Agent,
}

impl WorkloadPreset {
    pub fn numbers(self) -> (u32, u32, u32) {
        match self {
            WorkloadPreset::Chat => (256, 256, 1024),
            WorkloadPreset::LongPrompt => (3000, 128, 0),
            WorkloadPreset::Agent => (1024, 256, 2048),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            WorkloadPreset::Chat => "chat",
            WorkloadPreset::LongPrompt => "long-prompt",
            WorkloadPreset::Agent => "agent",
        }
    }
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub rpc: RpcArgs,
}

#[derive(Debug, Args)]
pub struct RpcServeArgs {
    /// Address to listen on (loopback by default: the RPC protocol has no authentication)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on
    #[arg(long, default_value_t = 50052)]
    pub port: u16,
    /// CPU threads the served device computes with
    #[arg(short, long)]
    pub threads: Option<usize>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A model file (its profile for this machine) or a profile file; none = list the store
    pub target: Option<PathBuf>,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// The GGUF model file
    pub model: PathBuf,
    /// Context size (-c)
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: u32,
    /// Prompt tokens (pp figure)
    #[arg(short = 'p', long, default_value_t = 512)]
    pub prompt: u32,
    /// Generated tokens (tg figure)
    #[arg(short = 'n', long, default_value_t = 128)]
    pub gen: u32,
    /// Tokens in the KV cache before generation is measured again (tg at depth); 0 = skip
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: u32,
    /// Sequences decoded at once (-np): N prompts, then N tokens per step; aggregate t/s
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    pub parallel: u32,
    /// Threads (-t)
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Prompt-processing threads (-tb; default: the same as -t)
    #[arg(long = "threads-batch", visible_alias = "tb")]
    pub threads_batch: Option<u32>,
    /// Logical batch size (-b)
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch: u32,
    /// Physical batch size (-ub)
    #[arg(long = "ubatch-size", visible_alias = "ub", default_value_t = 512)]
    pub ubatch: u32,
    /// K cache type (-ctk)
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "f16")]
    pub cache_type_k: CacheType,
    /// V cache type (-ctv)
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "f16")]
    pub cache_type_v: CacheType,
    /// Flash attention: on, off, auto (-fa)
    #[arg(long = "flash-attn", visible_alias = "fa", default_value = "auto")]
    pub flash_attn: FlashAttn,
    /// CPU kernels: repack (llama.cpp's default) or plain (--no-repack)
    #[arg(long, default_value = "repack")]
    pub kernels: KernelChoice,
    /// Host tensors' operations on a device for large batches: on (llama.cpp's default) or off
    /// (--no-op-offload)
    #[arg(long = "op-offload", default_value = "on")]
    pub op_offload: OpOffload,
    /// The KV cache on the offload devices (on, llama.cpp's default) or in host memory (off, -nkvo)
    #[arg(long = "kv-offload", default_value = "on")]
    pub kv_offload: KvOffload,
    /// Layers offloaded to non-CPU devices (-ngl)
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", default_value_t = 0)]
    pub n_gpu_layers: u32,
    /// Devices to use, comma separated (--device)
    #[arg(long = "device", value_delimiter = ',')]
    pub devices: Vec<String>,
    /// MoE: keep the experts of the first N layers in host memory (--n-cpu-moe)
    #[arg(long = "n-cpu-moe", default_value_t = 0)]
    pub n_cpu_moe: u32,
    /// Put tensors matching a regex on a buffer type, PATTERN=BUFT (-ot; repeatable), e.g.
    /// 'blk\.3\.ffn_.*_exps=CPU'; how a placement from `autotune fit` is reproduced
    #[arg(long = "override-tensor", visible_alias = "ot")]
    pub override_tensor: Vec<String>,
    /// Share of the offloaded layers per non-CPU device, comma separated (-ts), e.g. 3,1
    #[arg(long = "tensor-split", visible_alias = "ts", value_delimiter = ',')]
    pub tensor_split: Vec<u32>,
    /// How the offloaded layers spread over several devices: layer, row (CUDA) or tensor
    /// (tensor parallelism; needs flash attention) (-sm)
    #[arg(long = "split-mode", visible_alias = "sm", default_value = "layer")]
    pub split_mode: SplitMode,
    #[command(flatten)]
    pub rpc: RpcArgs,
    /// Also print the memory the dry-run load (no_alloc) predicted beside what the load took. The
    /// dry run always happens: a load predicted to need more than is free (device or RAM) is refused
    /// with exit 4 instead of running the machine out of memory
    #[arg(long)]
    pub predict: bool,
    /// Measured repetitions (after a discarded warm-up)
    #[arg(short = 'r', long, default_value_t = 5)]
    pub reps: u32,
    /// A/A test: measure the configuration as two candidates A and B, every repetition a fresh load,
    /// rounds interleaved, and judge them with the tuner's paired decision rule: on a machine whose
    /// noise the rule handles, the answer is a tie
    #[arg(long)]
    pub twice: bool,
    /// Noise threshold of --twice's decision rule, as a fraction like `tune --noise` (0.02 = 2%)
    #[arg(long, default_value_t = crate::stats::DEFAULT_NOISE)]
    pub noise: f64,
    /// Seed of the random prompt tokens
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A model file (its stored profile for this machine) or a profile file
    pub target: PathBuf,
    /// The llama-server executable (default: `llama-server` on PATH, then the vendor build)
    #[arg(long)]
    pub server: Option<PathBuf>,
    /// Start the server, wait for /health, send a completion and compare its speed with the profile
    #[arg(long)]
    pub exec: bool,
    /// Use a stale profile (other machine, devices, llama.cpp build or model file)
    #[arg(long)]
    pub force: bool,
    /// Address the server listens on (loopback by default)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port the server listens on (0 = pick a free one)
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Relative difference between the server's generation speed and the profile's beyond which to warn.
    /// Generous on purpose: the server samples real text through its HTTP loop while tuning decodes
    /// random tokens in-process, so some tens of percent apart is normal; a bigger gap means a busy
    /// machine or a server that does not run the measured configuration
    #[arg(long, default_value_t = 0.25)]
    pub tolerance: f64,
    /// Stop the server after the check instead of leaving it running in the foreground
    #[arg(long = "check-only")]
    pub check_only: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Extra llama-server arguments, after `--`
    #[arg(last = true)]
    pub extra: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A model file (its stored profile for this machine) or a profile file
    pub target: PathBuf,
    /// args, presets, llama-swap, ollama or json
    #[arg(short, long, default_value = "args")]
    pub format: String,
    /// Write to this file (atomically) instead of stdout
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Export a stale profile anyway
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// A profile file, or a model file (this machine's stored profile for it); none = this
    /// machine's newest stored profile
    pub target: Option<PathBuf>,
    /// Write the charts (SVG: tg and pp against GPU layers, the leaderboard) into this folder
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Write a Markdown report (leaderboard, diagnosis, roofline, chart links) to FILE; the charts
    /// go beside it unless --plot puts them elsewhere
    #[arg(long = "export-markdown", value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,
    /// Print the explanation as JSON
    #[arg(long)]
    pub json: bool,
}

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
    #[arg(long)]
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

/// The subcommand names, for the `autotune model.gguf` short form.
pub const SUBCOMMANDS: &[&str] = &[
    "tune",
    "doctor",
    "show",
    "measure",
    "apply",
    "export",
    "rpc-serve",
    "__worker",
    "help",
    "quantize",
    "quality",
    "explain",
    "draft",
    "fit",
];

/// llama.cpp's multi-letter single-dash flags, which clap cannot express as short flags.
const LLAMA_STYLE_FLAGS: &[&str] = &[
    "-ngl", "-ctk", "-ctv", "-fa", "-ub", "-tb", "-np", "-ot", "-ts",
];

/// `autotune model.gguf …` → `autotune tune model.gguf …`, and `-ngl 8` → `--ngl 8` (not after
/// `--`: what follows it goes to llama-server as written).
pub fn with_default_subcommand(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut args: Vec<std::ffi::OsString> = args
        .into_iter()
        .enumerate()
        .map(|(i, a)| match a.to_str() {
            Some(s) if i < end && LLAMA_STYLE_FLAGS.contains(&s) => format!("-{s}").into(),
            _ => a,
        })
        .collect();
    let has_sub = args
        .iter()
        .skip(1)
        .any(|a| a.to_str().is_some_and(|s| SUBCOMMANDS.contains(&s)));
    let wants_help_or_version = args
        .iter()
        .skip(1)
        .any(|a| matches!(a.to_str(), Some("-h" | "--help" | "-V" | "--version")));
    let has_positional = args
        .iter()
        .skip(1)
        .any(|a| !a.to_string_lossy().starts_with('-'));
    if !has_sub && has_positional && !(wants_help_or_version && args.len() == 2) {
        args.insert(1, "tune".into());
    }
    args
}

/// Parses a size like `256M`, `8G` or plain bytes (search-space's parser), for clap.
fn parse_size(s: &str) -> Result<u64, String> {
    search_space::size::parse_size(s).map_err(|e| e.to_string())
}

/// Parses `90s`, `5m`, `1h`, `1h30m` or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("invalid duration '{s}': write e.g. 90s, 5m, 1h"));
    }
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(std::time::Duration::from_secs_f64(secs));
        }
        return Err(format!("invalid duration '{s}': it must be positive"));
    }
    let mut total = 0.0;
    let mut num = String::new();
    for ch in t.chars() {
        if ch.is_ascii_digit() || ch == '.' {
            num.push(ch);
            continue;
        }
        let v: f64 = num
            .parse()
            .map_err(|_| format!("invalid duration '{s}': write e.g. 90s, 5m, 1h"))?;
        num.clear();
        total += v * match ch {
            's' => 1.0,
            'm' => 60.0,
            'h' => 3600.0,
            _ => {
                return Err(format!(
                    "invalid duration '{s}': unknown unit '{ch}' (use s, m, h)"
                ))
            }
        };
    }
    if !num.is_empty() {
        return Err(format!(
            "invalid duration '{s}': a number needs a unit (s, m, h)"
        ));
    }
    if total <= 0.0 {
        return Err(format!("invalid duration '{s}': it must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_form_inserts_tune() {
        let a = with_default_subcommand(vec!["autotune".into(), "m.gguf".into(), "--quick".into()]);
        assert_eq!(a[1], "tune");
        let a = with_default_subcommand(vec!["autotune".into(), "doctor".into()]);
        assert_eq!(a[1], "doctor");
        let a = with_default_subcommand(vec!["autotune".into(), "--help".into()]);
        assert_eq!(a.len(), 2);
        let a = with_default_subcommand(vec![
            "autotune".into(),
            "measure".into(),
            "m.gguf".into(),
            "-ngl".into(),
            "9".into(),
        ]);
        assert_eq!(a[3], "--ngl");
        // After `--` the words are llama-server's, as written.
        let a = with_default_subcommand(
            ["autotune", "apply", "m.gguf", "-np", "2", "--", "-ngl", "9"]
                .map(Into::into)
                .to_vec(),
        );
        assert_eq!(a[3], "--np");
        assert_eq!(a[6], "-ngl");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("5m").unwrap().as_secs(), 300);
        assert_eq!(parse_duration("1h30m").unwrap().as_secs(), 5400);
        assert_eq!(parse_duration("12").unwrap().as_secs(), 12);
        assert!(parse_duration("-5m").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("5").is_ok());
    }
}
