//! One configuration to measure (`Candidate`), its knobs' values typed ([`crate::value`]), and the
//! combinations llama.cpp refuses (`validate`).
//!
//! Names and values mirror llama.cpp's (`-t`, `-b`, `-ub`, `-ctk`, `-ctv`, `-fa`, `-ngl`, `--no-repack`)
//! so a user can read a candidate as the llama-server flags it stands for.

use crate::value::{
    AttnRot, CacheType, FlashAttn, HostBuffer, KernelChoice, KvOffload, Numa, OpOffload, SplitMode,
};
use serde::{Deserialize, Serialize};

/// One configuration of llama.cpp to measure: model-side settings (which need a model load) and
/// context-side settings (which only need a new context on an already loaded model).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Candidate {
    /// Layers offloaded to the non-CPU devices (`-ngl`); 0 on a CPU-only machine.
    pub n_gpu_layers: u32,
    /// MoE models: the expert tensors of the first N layers stay in host memory (llama.cpp's
    /// `--n-cpu-moe N`); 0 = experts go where their layer goes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_cpu_moe: u32,
    /// Dense models: the FFN tensors of the first N layers stay in host memory while their
    /// attention and KV cache go with the layer (llama.cpp's `--n-cpu-ffn N`); 0 = each layer's FFN
    /// goes where its layer goes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_cpu_ffn: u32,
    /// Devices to use, by llama.cpp's device name (`--device`); empty = llama.cpp's default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Share of the offloaded layers per device (`-ts`), in the order of `devices` (all non-CPU
    /// devices when that is empty); empty = llama.cpp's split, by each device's free memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_split: Vec<u32>,
    /// `-sm`: whole layers per device (the default) or rows of every layer across the devices.
    #[serde(default, skip_serializing_if = "SplitMode::is_layer")]
    pub split_mode: SplitMode,
    /// Extra CPU buffer types (weight repack / AMX) or plain kernels (`--no-repack`).
    pub kernels: KernelChoice,
    /// Where host weights live beside a device with pinned host memory (`--load-mode none`,
    /// `--no-host`): see [`HostBuffer`].
    #[serde(default, skip_serializing_if = "HostBuffer::is_mapped")]
    pub host_buffer: HostBuffer,
    /// Generation threads (`-t`).
    pub threads: u32,
    /// Prompt-processing threads (`-tb`) where they differ from `threads`; `None`: the same count
    /// (llama.cpp's default). Generation streams weights and saturates the memory bus with fewer
    /// threads than the compute-bound prompt needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads_batch: Option<u32>,
    /// Logical batch size (`-b`).
    pub n_batch: u32,
    /// Physical batch size (`-ub`).
    pub n_ubatch: u32,
    /// K cache type (`-ctk`).
    pub type_k: CacheType,
    /// V cache type (`-ctv`).
    pub type_v: CacheType,
    /// Flash attention (`-fa`).
    pub flash_attn: FlashAttn,
    /// Host operations offloaded to a device for large batches (`--no-op-offload` when off).
    #[serde(default, skip_serializing_if = "OpOffload::is_on")]
    pub op_offload: OpOffload,
    /// The KV cache on the offload devices (default) or in host memory (`-nkvo`).
    #[serde(default, skip_serializing_if = "KvOffload::is_on")]
    pub kv_offload: KvOffload,
    /// llama.cpp's NUMA strategy (`--numa`); off is its default.
    #[serde(default, skip_serializing_if = "Numa::is_off")]
    pub numa: Numa,
    /// The batch size from which a device runs a host tensor's operations
    /// (`GGML_OP_OFFLOAD_MIN_BATCH`); `None`: llama.cpp's default (32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_offload_min_batch: Option<u32>,
    /// The rotation of a quantized K/V cache (`LLAMA_ATTN_ROT_DISABLE=1` when off).
    #[serde(default, skip_serializing_if = "AttnRot::is_on")]
    pub attn_rot: AttnRot,
}

/// Why a candidate cannot be run at all (independent of the machine).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCandidate {
    #[error("threads must be at least 1")]
    ZeroThreads,
    #[error("batch sizes must be at least 1 (n_batch={n_batch}, n_ubatch={n_ubatch})")]
    ZeroBatch { n_batch: u32, n_ubatch: u32 },
    #[error("n_ubatch ({n_ubatch}) cannot exceed n_batch ({n_batch})")]
    UbatchOverBatch { n_batch: u32, n_ubatch: u32 },
    #[error("a quantized V cache ({type_v}) needs flash attention; use -fa on or auto")]
    QuantizedVWithoutFlashAttn { type_v: CacheType },
    #[error("a tensor split needs a share above 0 for at least one device")]
    EmptyTensorSplit,
    #[error("split mode tensor needs flash attention; use -fa on or auto")]
    TensorParallelWithoutFlashAttn,
    #[error(
        "split mode tensor takes no quantized KV cache ({type_k}/{type_v}); use -ctk f16 -ctv f16"
    )]
    TensorParallelWithQuantizedCache {
        type_k: CacheType,
        type_v: CacheType,
    },
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Candidate {
    /// A candidate for the knob table to set its defaults on; every value here is overwritten
    /// by [`crate::knob::llama_defaults`] but the machine's (threads, GPU layers).
    pub(crate) fn blank(threads: u32, n_gpu_layers: u32) -> Self {
        Candidate {
            n_gpu_layers,
            n_cpu_moe: 0,
            n_cpu_ffn: 0,
            devices: Vec::new(),
            tensor_split: Vec::new(),
            split_mode: SplitMode::Layer,
            kernels: KernelChoice::Plain,
            host_buffer: HostBuffer::Mapped,
            threads,
            threads_batch: None,
            n_batch: 0,
            n_ubatch: 0,
            type_k: CacheType::F32,
            type_v: CacheType::F32,
            flash_attn: FlashAttn::Off,
            op_offload: OpOffload::Off,
            kv_offload: KvOffload::Off,
            numa: Numa::Off,
            op_offload_min_batch: None,
            attn_rot: AttnRot::Off,
        }
    }

    pub fn validate(&self) -> Result<(), InvalidCandidate> {
        if self.threads == 0 || self.threads_batch == Some(0) {
            return Err(InvalidCandidate::ZeroThreads);
        }
        if self.n_batch == 0 || self.n_ubatch == 0 {
            return Err(InvalidCandidate::ZeroBatch {
                n_batch: self.n_batch,
                n_ubatch: self.n_ubatch,
            });
        }
        if self.n_ubatch > self.n_batch {
            return Err(InvalidCandidate::UbatchOverBatch {
                n_batch: self.n_batch,
                n_ubatch: self.n_ubatch,
            });
        }
        if self.type_v.is_quantized() && self.flash_attn == FlashAttn::Off {
            return Err(InvalidCandidate::QuantizedVWithoutFlashAttn {
                type_v: self.type_v,
            });
        }
        if !self.tensor_split.is_empty() && self.tensor_split.iter().all(|&v| v == 0) {
            return Err(InvalidCandidate::EmptyTensorSplit);
        }
        if self.split_mode == SplitMode::Tensor && self.flash_attn == FlashAttn::Off {
            return Err(InvalidCandidate::TensorParallelWithoutFlashAttn);
        }
        if self.split_mode == SplitMode::Tensor && self.kv_lossy() {
            return Err(InvalidCandidate::TensorParallelWithQuantizedCache {
                type_k: self.type_k,
                type_v: self.type_v,
            });
        }
        Ok(())
    }

    /// The threads that process prompts (`-tb`): [`Candidate::threads_batch`], else `threads`.
    pub fn batch_threads(&self) -> u32 {
        self.threads_batch.unwrap_or(self.threads)
    }

    /// The same candidate with `threads` generation and `batch` prompt threads, `threads_batch`
    /// left `None` when they are the same count (one spelling per configuration).
    pub fn with_threads(&self, threads: u32, batch: u32) -> Candidate {
        Candidate {
            threads,
            threads_batch: (batch != threads).then_some(batch),
            ..self.clone()
        }
    }

    /// The same candidate with micro-batches of `ub` tokens, the logical batch raised to hold one.
    pub fn with_ubatch(&self, ub: u32) -> Candidate {
        Candidate {
            n_ubatch: ub,
            n_batch: self.n_batch.max(ub),
            ..self.clone()
        }
    }

    /// Relative KV-cache memory (f16/f16 = 1.0), for breaking ties toward less memory.
    pub fn kv_bytes_factor(&self) -> f64 {
        (self.type_k.bits_per_element() + self.type_v.bits_per_element()) / 32.0
    }

    /// Whether the K or the V cache is quantized: the model's next-token distributions change, so
    /// such a candidate wins only inside a measured quality gate.
    pub fn kv_lossy(&self) -> bool {
        self.type_k.is_quantized() || self.type_v.is_quantized()
    }

    /// The K/V cache pair as llama.cpp's flags name it (`q8_0/q4_0`).
    pub fn kv_label(&self) -> String {
        format!("{}/{}", self.type_k, self.type_v)
    }
}

/// The K/V cache pairs to search from the types given (in their order): each type for both, then,
/// where `mixed` allows the pair, K one step more precise than V among the types given (the K cache
/// is the more sensitive: `-ctk q8_0 -ctv q4_0` keeps most of q8_0's quality at less memory).
pub fn kv_pairs(
    types: &[CacheType],
    mixed: impl Fn(CacheType, CacheType) -> bool,
) -> Vec<(CacheType, CacheType)> {
    let mut out: Vec<(CacheType, CacheType)> = types.iter().map(|&t| (t, t)).collect();
    let mut by_bits = types.to_vec();
    by_bits.sort_by(|a, b| b.bits_per_element().total_cmp(&a.bits_per_element()));
    by_bits.dedup();
    for w in by_bits.windows(2) {
        let (k, v) = (w[0], w[1]);
        if k.bits_per_element() > v.bits_per_element() && mixed(k, v) {
            out.push((k, v));
        }
    }
    out.dedup();
    out
}

#[cfg(test)]
mod tests;
