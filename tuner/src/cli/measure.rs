//! `measure`'s flags: one configuration, like llama-bench.

use super::knob_value::knob_value;
use super::RpcArgs;
use clap::Args;
use search_space::knob::{self, Knob};
use search_space::{
    AttnRot, CacheType, FlashAttn, HostBuffer, KernelChoice, KvOffload, Numa, OpOffload, SplitMode,
};
use std::path::PathBuf;

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
    /// Tokens in the KV cache before generation is measured again (tg at depth); several comma
    /// separated, like llama-bench's -d 0,4096,16384 (each repetition of each depth interleaved);
    /// 0 = skip
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0")]
    pub depth: Vec<u32>,
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
    #[arg(short = 'b', long = "batch-size", default_value = knob::Batch.default())]
    pub batch: u32,
    /// Physical batch size (-ub)
    #[arg(long = "ubatch-size", visible_alias = "ub", default_value = knob::Ubatch.default())]
    pub ubatch: u32,
    /// K cache type (-ctk)
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = cache_default(),
          value_parser = knob_value::<CacheType>(&knob::KvCache))]
    pub cache_type_k: CacheType,
    /// V cache type (-ctv)
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = cache_default(),
          value_parser = knob_value::<CacheType>(&knob::KvCache))]
    pub cache_type_v: CacheType,
    /// Flash attention (-fa)
    #[arg(long = "flash-attn", visible_alias = "fa", default_value = knob::Flash.default(),
          value_parser = knob_value::<FlashAttn>(&knob::Flash))]
    pub flash_attn: FlashAttn,
    /// CPU kernels: repack (llama.cpp's default) or plain (--no-repack)
    #[arg(long, default_value = knob::Kernels.default(),
          value_parser = knob_value::<KernelChoice>(&knob::Kernels))]
    pub kernels: KernelChoice,
    /// Where host weights live: mapped (llama.cpp's default), pinned (a GPU's pinned host memory:
    /// --load-mode none) or cpu (the CPU's repacking buffers: --no-host)
    #[arg(long = "host-buffer", default_value = knob::Host.default(),
          value_parser = knob_value::<HostBuffer>(&knob::Host))]
    pub host_buffer: HostBuffer,
    /// llama.cpp's NUMA strategy: off (its default), distribute or isolate (--numa); on a machine
    /// with one NUMA node llama.cpp treats them all as off
    #[arg(long, default_value = knob::NumaKnob.default(),
          value_parser = knob_value::<Numa>(&knob::NumaKnob))]
    pub numa: Numa,
    /// Host tensors' operations on a device for large batches: on (llama.cpp's default) or off
    /// (--no-op-offload)
    #[arg(long = "op-offload", default_value = knob::OpOffloadKnob.default(),
          value_parser = knob_value::<OpOffload>(&knob::OpOffloadKnob))]
    pub op_offload: OpOffload,
    /// The batch size from which host tensors' operations run on a device: llama.cpp's
    /// GGML_OP_OFFLOAD_MIN_BATCH, read by its CUDA, Vulkan, Metal and SYCL backends (default 32)
    #[arg(long = "op-offload-min-batch", default_value = knob::OpOffloadMinBatch.default())]
    pub op_offload_min_batch: u32,
    /// The rotation of a quantized KV cache: on (llama.cpp's default) or off
    /// (LLAMA_ATTN_ROT_DISABLE=1: faster, and changes the output)
    #[arg(long = "attn-rot", default_value = knob::AttnRotation.default(),
          value_parser = knob_value::<AttnRot>(&knob::AttnRotation))]
    pub attn_rot: AttnRot,
    /// The KV cache on the offload devices (on, llama.cpp's default) or in host memory (off, -nkvo)
    #[arg(long = "kv-offload", default_value = knob::KvOffloadKnob.default(),
          value_parser = knob_value::<KvOffload>(&knob::KvOffloadKnob))]
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
    /// Dense models: keep the FFN weights of the first N layers in host memory, their attention and
    /// KV cache on the devices (--n-cpu-ffn); at most the model's layer count
    #[arg(long = "n-cpu-ffn", default_value_t = 0)]
    pub n_cpu_ffn: u32,
    /// Put tensors matching a regex on a buffer type, PATTERN=BUFT (-ot; repeatable), e.g.
    /// 'blk\.3\.ffn_.*_exps=CPU'; how a placement from `autotune fit` is reproduced
    #[arg(long = "override-tensor", visible_alias = "ot")]
    pub override_tensor: Vec<String>,
    /// Share of the offloaded layers per non-CPU device, comma separated (-ts), e.g. 3,1
    #[arg(long = "tensor-split", visible_alias = "ts", value_delimiter = ',')]
    pub tensor_split: Vec<u32>,
    /// How the offloaded layers spread over several devices: layer, row (CUDA) or tensor
    /// (tensor parallelism; needs flash attention) (-sm)
    #[arg(long = "split-mode", visible_alias = "sm", default_value = knob::Split.default(),
          value_parser = knob_value::<SplitMode>(&knob::Split))]
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
    #[arg(long, default_value_t = crate::stats::DEFAULT_NOISE, allow_negative_numbers = true)]
    pub noise: f64,
    /// Seed of the random prompt tokens
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

/// The K and V caches' default, each half of the KV cache knob's.
fn cache_default() -> &'static str {
    let pair = knob::KvCache.default().expect("llama.cpp's cache types");
    pair.split('/').next().expect("a type")
}
