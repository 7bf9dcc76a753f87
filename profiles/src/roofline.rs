//! The bandwidth roofline recorded with a profile: what one generated token of the winning
//! configuration reads from memory, and how fast this machine's CPU reads memory.
//!
//! Token generation reads every active weight once per token (plus the KV cache), so
//! `bandwidth / bytes per token` is a ceiling on generation speed; how close the measured speed gets
//! to it says whether a faster configuration can exist at all. The tuner computes these figures from
//! the GGUF header and a bandwidth probe when it writes the profile; `autotune explain` reads them
//! back, so a profile explains itself without the model file.

use serde::{Deserialize, Serialize};

/// Figures of one generated token of the profile's winner. Byte counts are estimates from tensor
/// sizes (see the tuner's `explain::roofline` for how each is derived).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// Layers of the model (`{arch}.block_count`).
    pub layers: u32,
    /// Parameters in the file.
    pub parameters: u64,
    /// Parameters used for one token: all but the token-embedding table (one row of it) and, for a
    /// mixture of experts, the unused experts.
    pub active_parameters: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_used_count: Option<u32>,
    /// Bytes of weights read per generated token.
    pub weight_bytes: u64,
    /// Bytes of KV cache read per generated token, with `kv_tokens` tokens in the cache.
    pub kv_bytes: u64,
    /// Mean number of tokens in the KV cache while the generation speed was measured.
    pub kv_tokens: u32,
    /// KV-cache bytes of one cached token over all layers (K and V, the winner's cache types).
    pub kv_bytes_per_cached_token: u64,
    /// Every layer reads K and V of every cached token (attention in each layer, no sliding window,
    /// no compressed cache), so a token with `d` tokens cached reads `d × kv_bytes_per_cached_token`
    /// of KV cache; false where that is not known (and in profiles written before it was recorded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kv_grows: bool,
    /// Of `weight_bytes + kv_bytes`, what the CPU reads from RAM with the winner's placement (the rest
    /// sits on offload devices).
    pub cpu_bytes: u64,
    /// The CPU's measured memory read bandwidth in bytes per second; absent when not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_bandwidth: Option<f64>,
    /// How the bandwidth was measured, in one line.
    #[serde(default)]
    pub bandwidth_method: String,
    /// The memory read bandwidth of each non-CPU device of the run, measured with that device's own
    /// kernels; empty when there was none (or for profiles written before it was measured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_bandwidth: Vec<DeviceBandwidth>,
}

/// One device's measured memory read bandwidth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceBandwidth {
    /// llama.cpp's device name (`CUDA0`, `RPC0`, ...).
    pub device: String,
    pub bytes_per_s: f64,
    /// How it was measured, in one line.
    pub method: String,
}

impl Roofline {
    /// Bytes read per generated token: weights and KV cache.
    pub fn bytes_per_token(&self) -> u64 {
        self.weight_bytes.saturating_add(self.kv_bytes)
    }

    /// Whether the model is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.expert_count.is_some_and(|n| n > 1)
    }
}
