//! The worker protocol: every request the parent sends `autotune __worker` and every answer, one JSON
//! line each. Types only: the child's dispatch is `worker::server`, each feature's handler lives in
//! its feature module and depends on this file alone.

use crate::llama::{ContextSettings, ModelSettings};
pub use crate::measuring::{FitAnswer, FitRequest, GiveUp, MeasureRequest};
use crate::measuring::{LoadReport, Repetition};
use search_space::CacheType;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// One repetition (pp, tg and, with depth, tg at depth). The first request on a fresh context
    /// runs a discarded warm-up first.
    Measure(MeasureRequest),
    /// Load the model and create the context without running anything: the memory that takes.
    Footprint(MeasureRequest),
    Quit,
    /// Write a quantization of a model with llama.cpp's quantizer (`autotune quantize`).
    Quantize(QuantizeRequest),
    /// Compare a model's next-token distributions with a reference's (`autotune quality`).
    Quality(QualityRequest),
    /// Is a draft model's vocabulary compatible with a target's (`autotune draft`)?
    DraftCheck(CheckRequest),
    /// Greedy generation over a prompt set, with a draft model (speculative decoding) or without.
    Speculate(Box<SpeculateRequest>),
    /// The memory of a draft (or target) for speculative decoding, from a dry run; answered `Footprint`.
    SpecFootprint(FootprintRequest),
    /// llama.cpp's own fit (`common_fit_params`) under given budgets (`autotune fit`).
    LlamaFit(FitRequest),
    /// The read bandwidth of a device's memory with its own kernels (`explain`'s roofline).
    Bandwidth(BandwidthRequest),
    /// The link to a device (an RPC server's network): round trip, rates each way.
    Link(LinkRequest),
    /// The f16-cache reference's greedy choice at each position of a sequence (`apply --exec
    /// --check-only`).
    Greedy(GreedyRequest),
    /// Facts placed deep in a full context and asked for at its end (`autotune verify`).
    Retrieval(Box<RetrievalRequest>),
    /// Which mixed K/V cache pairs each device runs flash attention over (`llama::runs_kv_pair`).
    KvPairs(KvPairsRequest),
    /// The CPU's matrix-multiply peak on a weight type (a prompt's ceiling).
    Matmul(MatmulRequest),
}

/// Ask each device which of `pairs` it runs with an attention of `shape`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KvPairsRequest {
    pub devices: Vec<String>,
    pub pairs: Vec<(CacheType, CacheType)>,
    pub shape: crate::llama::AttentionShape,
}

/// Measure the CPU's matrix-multiply rate on weights of one ggml type (`llama::cpu_matmul_rate`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatmulRequest {
    pub ggml_type: u32,
    pub threads: u32,
    /// Timed passes at most; fewer once `time_limit_ms` has gone by (always at least one).
    pub passes: u32,
    pub time_limit_ms: u64,
}

/// Measure the link to a device (`llama::device_link`); RPC servers are connected first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkRequest {
    pub device: String,
    pub rpc: Vec<String>,
    /// Bytes each timed write and read moves.
    pub bytes: u64,
    pub round_trips: u32,
    pub passes: u32,
}

/// Measure a device's memory read bandwidth; RPC servers are connected first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BandwidthRequest {
    pub device: String,
    pub rpc: Vec<String>,
    /// Size of the matrix read.
    pub bytes: u64,
    /// Timed passes at most; fewer once `time_limit_ms` has gone by (always at least one).
    pub passes: u32,
    pub time_limit_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    Measured(Box<Repetition>),
    Footprint(LoadReport),
    /// llama.cpp refused (returned an error) without crashing.
    Failed {
        stage: String,
        message: String,
    },
    /// The repetition passed its [`MeasureRequest::give_up`] limit and was stopped; the worker and
    /// its model live on. `load`: the memory of the load it stopped on, when it loaded for it.
    GaveUp {
        limit: GiveUp,
        load: Option<Box<LoadReport>>,
    },
    Quantized(QuantizeAnswer),
    Quality(QualityAnswer),
    /// The reference's most likely token at each position asked for.
    Greedy {
        top1: Vec<i32>,
    },
    Retrieved(RetrievalAnswer),
    /// Each device asked, with the pairs it runs.
    KvPairs {
        runs: Vec<(String, Vec<(CacheType, CacheType)>)>,
    },
    DraftCheck(CheckAnswer),
    Speculated(SpeculateAnswer),
    Fitted(FitAnswer),
    /// Bytes per second (the best pass), the bytes each pass read, and the passes timed.
    Bandwidth {
        bytes_per_s: f64,
        bytes: u64,
        passes: u32,
    },
    /// Multiply-adds a second (two operations each) of the best pass and buffer type, which one,
    /// and the passes timed.
    Matmul {
        flops_per_s: f64,
        buffer: String,
        passes: u32,
    },
    /// The link's median round trip (seconds) and best rates each way (bytes per second).
    Link {
        round_trip_s: f64,
        upload_bytes_per_s: f64,
        download_bytes_per_s: f64,
        bytes: u64,
    },
}

// ---- Quantization and quality (`quant::serve`) ----

/// Quantize `src` into `dst` (written as is: the parent writes to a temporary name and renames).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuantizeRequest {
    pub src: PathBuf,
    pub dst: PathBuf,
    /// The `llama_ftype` number (`general.file_type`).
    pub ftype: u32,
    pub allow_requantize: bool,
    pub threads: u32,
    /// Where to write `done/total` tensors while working.
    pub progress: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuantizeAnswer {
    pub seconds: f64,
}

/// One comparison: `model` with a `kv` cache against the reference with an f16 cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityJob {
    pub model: PathBuf,
    /// The K cache's type, and the V cache's when it differs (`None`: the same as K).
    pub kv: CacheType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_v: Option<CacheType>,
}

/// Compare every job against `reference` on `text`. The jobs share the reference's pass over each
/// chunk: its decode (the costliest part, the reference being the largest file) is done once for all.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityRequest {
    pub reference: PathBuf,
    pub jobs: Vec<QualityJob>,
    pub text: String,
    /// Use at most this many tokens of the text.
    pub max_tokens: Option<u32>,
    /// Chunk length (the context size of every context).
    pub n_ctx: u32,
    /// Compare only the last this many positions of each chunk (the rest fill the cache): figures
    /// at a depth, with the logits of a few hundred positions held at a time. `None`: every one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scored: Option<u32>,
    pub threads: u32,
    /// Layers to offload when a non-CPU device exists (0 = CPU only).
    pub n_gpu_layers: u32,
    /// The devices they go to (empty: llama.cpp's default, every one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Flash attention in every context (the reference's and each job's).
    #[serde(default = "flash_attn_auto")]
    pub flash_attn: search_space::FlashAttn,
    /// The rotation of each job's quantized cache (`off`: `LLAMA_ATTN_ROT_DISABLE=1` when its
    /// context is made).
    #[serde(default, skip_serializing_if = "search_space::AttnRot::is_on")]
    pub attn_rot: search_space::AttnRot,
    /// Where every context keeps its cache (`off`: in host memory, `-nkvo`), as the candidate does.
    #[serde(default, skip_serializing_if = "search_space::KvOffload::is_on")]
    pub kv_offload: search_space::KvOffload,
    /// Where to write `done/total` (chunks × jobs) while working.
    pub progress: Option<PathBuf>,
    /// A gate each job's mean KL divergence is held to: the evaluation stops after the window
    /// where every job's is on one side of it with 95% confidence ([`crate::quant::kld::decided`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decide_at: Option<f64>,
}

/// llama.cpp's default, for requests that do not say.
fn flash_attn_auto() -> search_space::FlashAttn {
    search_space::FlashAttn::Auto
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityAnswer {
    /// One per job, in order: its figures and its share of the time, or why it failed.
    pub results: Vec<Result<(QualityFigures, f64), String>>,
    /// Tokens of the text evaluated, and the chunks they were cut into.
    pub tokens: u64,
    /// Tokens of the whole text (more than `tokens` when a limit was given).
    pub text_tokens: u64,
    pub chunks: u32,
    /// The reference did not load with its layers offloaded and was evaluated on the CPU.
    #[serde(default)]
    pub cpu_fallback: bool,
    /// Each job's windows' mean KL divergences, in order (what [`crate::quant::kld::decided`]
    /// decides on).
    #[serde(default)]
    pub window_means: Vec<Vec<f64>>,
}

// ---- Checks of a profile's output (`quant::checks`) ----

/// The model with f16 caches (on the CPU: the server holds the devices) decodes `tokens`; its most
/// likely next token at every position from `from` on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GreedyRequest {
    pub model: PathBuf,
    pub tokens: Vec<i32>,
    pub from: usize,
    pub threads: u32,
}

/// One fact: the sentence placed in the text, the question asked at the end (leading into the
/// answer), and the answer it must give.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fact {
    pub sentence: String,
    pub question: String,
    pub answer: String,
}

/// Retrieval with the model as `settings` and `context` load and run it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RetrievalRequest {
    pub model: PathBuf,
    pub settings: ModelSettings,
    pub context: ContextSettings,
    pub filler: String,
    pub facts: Vec<Fact>,
    /// Where each fact is placed, as a share of the context.
    pub depth: f64,
    pub n_gen: u32,
}

/// Each fact's answer, as text, and the context's tokens.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RetrievalAnswer {
    pub answers: Vec<String>,
    pub tokens: u32,
}

// ---- Speculative decoding (`speculative::serve`) ----

/// Can `draft` serve `target`? Both are loaded vocabulary-only.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckRequest {
    pub target: PathBuf,
    pub draft: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckAnswer {
    /// None when compatible.
    pub incompatible: Option<Incompatibility>,
}

/// The memory of a model with a context, from a dry-run load (no_alloc): what llama.cpp's own
/// accounting says per device. `n_outputs_max` as [`DraftModel::n_outputs_max`] for a draft.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FootprintRequest {
    pub path: PathBuf,
    pub settings: ModelSettings,
    pub context: ContextSettings,
    pub n_outputs_max: u32,
}

/// A draft model as the worker loads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftModel {
    pub path: PathBuf,
    pub settings: ModelSettings,
    pub context: ContextSettings,
}

impl DraftModel {
    /// Outputs per batch of the draft's context: it only ever needs each sequence's last token's
    /// logits (llama-server's draft context has the same limit: one per slot).
    pub fn n_outputs_max(&self) -> u32 {
        self.context.sequences.max(1)
    }

    /// Its GPU layers and KV-cache types.
    pub fn placement(&self) -> DraftPlacement {
        DraftPlacement {
            n_gpu_layers: self.settings.n_gpu_layers,
            type_k: self.context.type_k,
            type_v: self.context.type_v,
        }
    }

    /// The same draft placed otherwise.
    pub fn placed(&self, p: DraftPlacement) -> DraftModel {
        let mut m = self.clone();
        m.settings.n_gpu_layers = p.n_gpu_layers;
        m.context = m
            .context
            .with_knobs(|c| (c.type_k, c.type_v) = (p.type_k, p.type_v));
        m
    }
}

/// Generate `n_gen` tokens (fewer when the model ends the text) after each prompt, greedily.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpeculateRequest {
    pub target: PathBuf,
    pub settings: ModelSettings,
    pub context: ContextSettings,
    /// None: the target alone (the baseline).
    pub draft: Option<(DraftModel, DraftParams)>,
    /// N-gram speculation instead of a draft model ([`crate::speculative::ngram`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ngram: Option<NgramParams>,
    /// The target's own multi-token-prediction heads draft ([`crate::speculative::mtp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpParams>,
    pub prompts: Vec<String>,
    pub n_gen: u32,
    /// The target alone (no draft) decodes these tokens, one list per prompt, one token at a time,
    /// instead of its own choices, and records at each position what it would have chosen: the
    /// reference for a draft's output past the point where it first differs from the target alone's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<Vec<Vec<i32>>>,
    /// Test only: a deliberate bug in the rollback, to prove that the output check catches one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
}

/// A deliberate rollback bug (tests only, never a setting): the target's KV cache keeps rejected draft
/// tokens, and the loop's positions carry on after them, so llama.cpp sees a consistent sequence and
/// does not refuse it: the target just attends to text that is not there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Rejected draft tokens are never removed from the target's cache.
    KeepRejectedCells,
    /// The rollback is off by one: the first rejected draft token stays in the target's cache.
    KeepOneRejectedCell,
}

impl Fault {
    /// Its name in `AUTOTUNE_SPECULATIVE_FAULT` and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KeepRejectedCells => "keep-rejected-cells",
            Fault::KeepOneRejectedCell => "keep-one-rejected-cell",
        }
    }

    /// From `AUTOTUNE_SPECULATIVE_FAULT` (`keep-rejected-cells`, `keep-one-rejected-cell`), which only
    /// the end-to-end tests set.
    pub fn from_env() -> Option<Fault> {
        let v = std::env::var("AUTOTUNE_SPECULATIVE_FAULT").ok()?;
        let f = serde_json::from_value(serde_json::Value::String(v.clone())).ok();
        if f.is_none() {
            eprintln!(
                "autotune: warning: AUTOTUNE_SPECULATIVE_FAULT={v} is not a test fault; ignored"
            );
        }
        f
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpeculateAnswer {
    pub runs: Vec<PromptRun>,
    /// A model or context was (re)created for this request, and a discarded warm-up ran first.
    pub warmed_up: bool,
}

/// One prompt's generation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptRun {
    pub prompt_tokens: u32,
    /// The generated tokens (the first comes from the prompt's logits).
    pub tokens: Vec<i32>,
    /// The target's best tokens at each generated token (the first is its choice; when following a
    /// given output, the token it would have chosen).
    pub choices: Vec<Choice>,
    /// The target's prompt processing.
    pub prompt_seconds: f64,
    /// The draft's prompt processing (0 without a draft).
    pub draft_prompt_seconds: f64,
    /// Generation after the first token, synchronised: what effective generation speed is made of.
    pub gen_seconds: f64,
    /// Target decodes during generation: one per verification round (one per token without a draft).
    pub rounds: u32,
    /// Draft tokens proposed, and how many of them the target accepted.
    pub drafted: u32,
    pub accepted: u32,
}

impl PromptRun {
    /// Tokens generated by the timed loop (all but the first).
    pub fn loop_tokens(&self) -> u32 {
        self.tokens.len().saturating_sub(1) as u32
    }
}

// Data the features exchange with their workers, defined here so that the protocol depends on no
// feature (each feature re-exports its own; their methods live with the feature).

/// llama.cpp's `SPEC_VOCAB_MAX_SIZE_DIFFERENCE`.
pub const SPEC_VOCAB_MAX_SIZE_DIFFERENCE: u64 = 128;

/// The figures of a whole evaluation (a record of the profile's).
pub use profiles::QualityFigures;

/// Why a draft cannot serve a target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Incompatibility {
    #[error("the tokenizers differ (target '{target}', draft '{draft}'): pick a draft of the same model family")]
    Tokenizer { target: String, draft: String },
    #[error("the vocabulary types differ (target {target}, draft {draft}): pick a draft of the same model family")]
    VocabType { target: String, draft: String },
    #[error(
        "the vocabulary sizes differ by {difference} tokens (target {target}, draft {draft}; llama.cpp allows \
         {SPEC_VOCAB_MAX_SIZE_DIFFERENCE}): pick a draft of the same model family"
    )]
    VocabSize {
        target: u64,
        draft: u64,
        difference: u64,
    },
    #[error("BOS handling differs (target: add {target_add}, id {target}; draft: add {draft_add}, id {draft})")]
    Bos {
        target_add: bool,
        target: i32,
        draft_add: bool,
        draft: i32,
    },
    #[error("EOS handling differs (target: add {target_add}, id {target}; draft: add {draft_add}, id {draft})")]
    Eos {
        target_add: bool,
        target: i32,
        draft_add: bool,
        draft: i32,
    },
    #[error("token {id} differs (target {target:?}, draft {draft:?}): the vocabularies are not the same")]
    TokenText {
        id: i32,
        target: String,
        draft: String,
    },
    #[error("the draft has no vocabulary (no tokenizer.ggml.tokens in its header)")]
    NoVocabulary,
}

/// The target's best tokens at one position, with their logits: its greedy choice first. Logits
/// differ by the log of the probability ratio, so differences between them are in nats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// Up to `speculative::logits::TOP_K` (token, logit), best first.
    pub top: Vec<(i32, f32)>,
    /// When following a given output: the logit of the token followed, which need not be among `top`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub followed_logit: Option<f32>,
}

/// Where the draft runs and how it caches: its own GPU layers (llama-server's `-ngld`) and its
/// KV-cache types (`-ctkd`/`-ctvd`). Searched after the draft settings: by default the draft follows
/// the target (all layers offloaded when the target offloads any, the target's KV types), and the
/// alternatives that fit (the draft on the CPU, a q8_0 draft KV cache) are measured with the best
/// draft settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraftPlacement {
    pub n_gpu_layers: u32,
    pub type_k: CacheType,
    pub type_v: CacheType,
}

/// How the draft drafts, as llama-server's `--spec-draft-n-max`, `--spec-draft-n-min` and
/// `--spec-draft-p-min` name it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DraftParams {
    /// Most tokens drafted per round.
    pub n_max: u32,
    /// A draft shorter than this is thrown away (the target decodes one token alone instead).
    pub n_min: u32,
    /// Drafting stops when the draft's top token is less likely than this (greedy confidence).
    pub p_min: f32,
}

/// ngram-simple's settings, as llama-server's `--spec-ngram-simple-size-n/-size-m` name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NgramParams {
    /// Length of the n-gram looked up in the history (the server's default: 12).
    pub size_n: u32,
    /// Most tokens drafted after a match (the server's default: 48).
    pub size_m: u32,
}

/// draft-mtp's settings, as llama-server's `--spec-draft-n-max` names its one knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MtpParams {
    /// Most tokens the MTP head drafts per round.
    pub n_max: u32,
}
