//! The settings a model is loaded with and a context is created with (they travel in the worker
//! protocol), and how a search-space candidate becomes them.

use search_space::knob::{self, Side};
use search_space::{CacheType, Candidate, FlashAttn, HostBuffer, KvOffload, OpOffload};
use serde::{Deserialize, Serialize};

/// Model-side settings: a change here needs a new model load.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelSettings {
    pub n_gpu_layers: u32,
    pub devices: Vec<String>,
    pub use_extra_bufts: bool,
    /// Only simulate allocations (dry run): sizes are logged, nothing is computed.
    #[serde(default)]
    pub no_alloc: bool,
    /// ggml RPC servers (`host:port`) to connect before loading: they become devices.
    #[serde(default)]
    pub rpc: Vec<String>,
    /// MoE: expert tensors of the first N layers stay in host memory (llama.cpp's --n-cpu-moe).
    #[serde(default)]
    pub n_cpu_moe: u32,
    /// Dense FFN tensors of the first N layers stay in host memory (llama.cpp's --n-cpu-ffn).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_cpu_ffn: u32,
    /// Tensors whose names match a pattern go to a buffer type (llama.cpp's `-ot PATTERN=BUFT`); the
    /// buffer type is named by its ggml name or its device's name (`CPU`, `RPC0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_overrides: Vec<(String, String)>,
    /// Share of the offloaded layers per non-CPU device (llama.cpp's `-ts`); empty = llama.cpp's default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_split: Vec<u32>,
    /// llama.cpp's `-sm`: whole layers per device, or rows of every layer across devices.
    #[serde(default, skip_serializing_if = "search_space::SplitMode::is_layer")]
    pub split_mode: search_space::SplitMode,
    /// llama.cpp's NUMA strategy (`--numa`): set once per process, before its first load.
    #[serde(default, skip_serializing_if = "search_space::Numa::is_off")]
    pub numa: search_space::Numa,
    /// Host weights mapped (llama.cpp's default), read into a device's pinned host memory
    /// (`--load-mode none`) or in the CPU's own buffer types (`--no-host`).
    #[serde(default, skip_serializing_if = "HostBuffer::is_mapped")]
    pub host_buffer: HostBuffer,
    /// Environment variables the worker process starts with (the knobs llama.cpp reads once per
    /// process, like `GGML_OP_OFFLOAD_MIN_BATCH`); the others of [`Side::Process`] are unset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

impl Default for ModelSettings {
    /// llama.cpp's own defaults on this machine's devices (the knob table's): nothing offloaded,
    /// extra buffer types (weight repack / AMX) on, a real load.
    fn default() -> Self {
        ModelSettings::for_candidate(&Candidate::llama_default(1, 0), &[])
    }
}

/// Sets the variables of the knobs of `side` that `set` holds, and unsets the others: what llama.cpp
/// reads from the environment then means what the measured configuration says, whatever the user's
/// shell holds. A worker calls it for a context's knobs right before it makes the context, on its
/// one thread (ggml's threads read no environment then).
pub fn set_environment(side: Side, set: &[(String, String)]) {
    for name in knob::environment_names(side) {
        match set.iter().find(|(n, _)| n == name) {
            Some((_, v)) => std::env::set_var(name, v),
            None => std::env::remove_var(name),
        }
    }
}

/// The tensor-name pattern of one layer's expert tensors, as llama.cpp's `--n-cpu-moe` writes it
/// (covers the fused `gate_up` tensors and the `chexps` variant too).
pub fn expert_pattern(layer: u32) -> String {
    format!("blk\\.{layer}\\.ffn_(up|down|gate|gate_up)_(ch|)exps")
}

/// The tensor-name pattern of one layer's dense FFN tensors, as llama.cpp's `--n-cpu-ffn` writes it
/// (`LLM_FFN_DENSE_REGEX`: up, down and gate, not the experts).
pub fn dense_ffn_pattern(layer: u32) -> String {
    format!("blk\\.{layer}\\.ffn_(up|down|gate)\\.")
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Context-side settings: a change here needs only a new context.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ContextSettings {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub threads: u32,
    /// Prompt-processing threads when they differ from `threads` (`None`: the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads_batch: Option<u32>,
    pub type_k: CacheType,
    pub type_v: CacheType,
    pub flash_attn: FlashAttn,
    /// Whether ggml may run host tensors' operations on a device for large batches.
    #[serde(default, skip_serializing_if = "OpOffload::is_on")]
    pub op_offload: OpOffload,
    /// The KV cache (and attention) on the offload devices, or in host memory.
    #[serde(default, skip_serializing_if = "KvOffload::is_on")]
    pub kv_offload: KvOffload,
    /// Sequences decoded at once (`n_seq_max`, llama-server's `-np`), each with its own
    /// `n_ctx / sequences` of the KV cache (not unified, as llama-server with `-np` given).
    #[serde(
        default = "profiles::serde_one::one",
        skip_serializing_if = "profiles::serde_one::is_one"
    )]
    pub sequences: u32,
    /// Environment variables set before the context is made (the knobs llama.cpp reads then, like
    /// `LLAMA_ATTN_ROT_DISABLE`); the others of [`Side::Context`] are unset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

impl ModelSettings {
    /// The model side of a search-space candidate: a real load on the candidate's devices, with the
    /// run's RPC servers connected where it offloads layers (with none offloaded nothing goes to a
    /// device: the host alone is measured as it is, over no link, and runs with its servers down).
    /// The one place a candidate becomes model settings.
    pub fn for_candidate(c: &Candidate, rpc: &[String]) -> ModelSettings {
        ModelSettings {
            n_gpu_layers: c.n_gpu_layers,
            devices: c.devices.clone(),
            use_extra_bufts: c.kernels.use_extra_bufts(),
            no_alloc: false,
            rpc: if c.n_gpu_layers > 0 {
                rpc.to_vec()
            } else {
                Vec::new()
            },
            n_cpu_moe: c.n_cpu_moe,
            n_cpu_ffn: c.n_cpu_ffn,
            tensor_overrides: Vec::new(),
            tensor_split: c.tensor_split.clone(),
            split_mode: c.split_mode,
            numa: c.numa,
            host_buffer: c.host_buffer,
            env: knob::environment_of(c, Side::Process),
        }
    }
}

impl ContextSettings {
    /// The context side of a search-space candidate for a context of `n_ctx` tokens.
    pub fn for_candidate(c: &Candidate, n_ctx: u32) -> ContextSettings {
        ContextSettings {
            n_ctx,
            n_batch: c.n_batch,
            n_ubatch: c.n_ubatch,
            threads: c.threads,
            threads_batch: c.threads_batch,
            type_k: c.type_k,
            type_v: c.type_v,
            flash_attn: c.flash_attn,
            op_offload: c.op_offload,
            kv_offload: c.kv_offload,
            sequences: 1,
            env: knob::environment_of(c, Side::Context),
        }
    }

    /// llama.cpp's defaults (the knob table's) for a context of `n_ctx` tokens on `threads`
    /// threads: what a command that measures no configuration of its own runs.
    pub fn defaults(n_ctx: u32, threads: u32) -> ContextSettings {
        ContextSettings::for_candidate(&Candidate::llama_default(threads, 0), n_ctx)
    }

    /// The same with `n` sequences at once.
    pub fn with_sequences(self, n: u32) -> ContextSettings {
        ContextSettings {
            sequences: n.max(1),
            ..self
        }
    }

    /// The same with knobs changed: the candidate these settings stand for, as `edit` leaves it,
    /// made into settings again by [`ContextSettings::for_candidate`], the context and the
    /// sequences kept. The one way to change a knob of settings already made: a field changed by
    /// hand would keep the environment the old values set (an f16 run made from an unrotated
    /// quantized cache's settings would still turn the rotation off).
    pub fn with_knobs(&self, edit: impl FnOnce(&mut Candidate)) -> ContextSettings {
        let mut c = self.candidate();
        edit(&mut c);
        ContextSettings::for_candidate(&c, self.n_ctx).with_sequences(self.sequences)
    }

    /// The candidate these settings stand for on the context's side: the knobs they hold, those
    /// passed in the environment read back through the knob table, every other knob at
    /// llama.cpp's default (which [`ContextSettings::for_candidate`] does not read).
    fn candidate(&self) -> Candidate {
        let mut c = Candidate {
            n_batch: self.n_batch,
            n_ubatch: self.n_ubatch,
            threads: self.threads,
            threads_batch: self.threads_batch,
            type_k: self.type_k,
            type_v: self.type_v,
            flash_attn: self.flash_attn,
            op_offload: self.op_offload,
            kv_offload: self.kv_offload,
            ..Candidate::llama_default(self.threads, 0)
        };
        knob::set_from_environment(&mut c, Side::Context, &self.env);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use search_space::{AttnRot, KvOffload};

    /// Settings made from a candidate and changed by nothing are the same settings: the candidate
    /// they stand for holds every knob the mapping reads, the environment's among them.
    #[test]
    fn settings_changed_by_nothing_are_the_same() {
        let mut q = Candidate::llama_default(4, 0)
            .with_threads(4, 8)
            .with_ubatch(256);
        (q.type_k, q.type_v, q.flash_attn) = (CacheType::Q8_0, CacheType::Q4_0, FlashAttn::On);
        (q.attn_rot, q.kv_offload, q.op_offload) = (AttnRot::Off, KvOffload::Off, OpOffload::Off);
        for c in [Candidate::llama_default(2, 0), q] {
            let s = ContextSettings::for_candidate(&c, 4096).with_sequences(3);
            assert_eq!(s.with_knobs(|_| {}), s);
        }
    }

    /// The f16 run beside an unrotated quantized cache: its environment is made anew, so it does
    /// not turn the rotation off.
    #[test]
    fn a_changed_knob_makes_its_environment_anew() {
        let mut c = Candidate::llama_default(2, 0);
        (c.type_k, c.type_v, c.attn_rot) = (CacheType::Q8_0, CacheType::Q8_0, AttnRot::Off);
        let unrotated = ContextSettings::for_candidate(&c, 4096);
        assert!(!unrotated.env.is_empty());
        let f16 = unrotated.with_knobs(|c| *c = knob::lossless_twin(c));
        assert_eq!((f16.type_k, f16.type_v), (CacheType::F16, CacheType::F16));
        assert!(f16.env.is_empty(), "{:?}", f16.env);
        assert_eq!((f16.n_ctx, f16.threads), (4096, 2));
    }
}
