//! The typed values of llama.cpp's knobs (a K/V cache type, flash attention, the split mode, ...),
//! named and parsed as llama.cpp's flags take them: what a [`crate::Candidate`] holds and the knob
//! table reads and writes.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A KV-cache element type, as llama.cpp's `--cache-type-k/-v` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q5_1,
    Q5_0,
    Q4_1,
    Q4_0,
    Iq4Nl,
}

impl CacheType {
    pub const ALL: [CacheType; 9] = [
        CacheType::F32,
        CacheType::F16,
        CacheType::Bf16,
        CacheType::Q8_0,
        CacheType::Q5_1,
        CacheType::Q5_0,
        CacheType::Q4_1,
        CacheType::Q4_0,
        CacheType::Iq4Nl,
    ];

    /// The name llama.cpp's command line uses.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
            CacheType::Bf16 => "bf16",
            CacheType::Q8_0 => "q8_0",
            CacheType::Q5_1 => "q5_1",
            CacheType::Q5_0 => "q5_0",
            CacheType::Q4_1 => "q4_1",
            CacheType::Q4_0 => "q4_0",
            CacheType::Iq4Nl => "iq4_nl",
        }
    }

    /// Bits per element, for ordering by memory (ties are broken toward less memory).
    pub fn bits_per_element(self) -> f64 {
        match self {
            CacheType::F32 => 32.0,
            CacheType::F16 | CacheType::Bf16 => 16.0,
            CacheType::Q8_0 => 8.5,
            CacheType::Q5_1 => 6.0,
            CacheType::Q5_0 => 5.5,
            CacheType::Q4_1 => 5.0,
            CacheType::Q4_0 | CacheType::Iq4Nl => 4.5,
        }
    }

    /// A quantized cache type needs flash attention for the V cache in llama.cpp.
    pub fn is_quantized(self) -> bool {
        !matches!(self, CacheType::F32 | CacheType::F16 | CacheType::Bf16)
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown name for a knob value; the message lists the accepted ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} '{value}' (expected one of: {expected})")]
pub struct ParseKnobError {
    pub what: &'static str,
    pub value: String,
    pub expected: String,
}

impl FromStr for CacheType {
    type Err = ParseKnobError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        CacheType::ALL
            .into_iter()
            .find(|t| t.as_str() == lower)
            .ok_or_else(|| ParseKnobError {
                what: "cache type",
                value: s.to_string(),
                expected: CacheType::ALL.map(|t| t.as_str()).join(", "),
            })
    }
}

/// Flash attention, as llama.cpp's `-fa on|off|auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlashAttn {
    Off,
    On,
    Auto,
}

impl FlashAttn {
    pub fn as_str(self) -> &'static str {
        match self {
            FlashAttn::Off => "off",
            FlashAttn::On => "on",
            FlashAttn::Auto => "auto",
        }
    }
}

impl fmt::Display for FlashAttn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FlashAttn {
    type Err = ParseKnobError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" => Ok(FlashAttn::Off),
            "on" | "1" | "true" => Ok(FlashAttn::On),
            "auto" => Ok(FlashAttn::Auto),
            _ => Err(ParseKnobError {
                what: "flash attention setting",
                value: s.to_string(),
                expected: "on, off, auto".into(),
            }),
        }
    }
}

/// How llama.cpp spreads the offloaded layers over several devices (`-sm`): whole layers per device
/// (`layer`, its default, one device works at a time), every layer's matrices split by rows across
/// the devices (`row`, CUDA only: all devices work on every layer, at the cost of a sync per layer),
/// or tensor parallelism (`tensor`, llama.cpp's experimental mode: weights and KV cache split across
/// the devices, which compute every layer together; it needs flash attention, and llama.cpp's own
/// fit does not support it).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    #[default]
    Layer,
    Row,
    Tensor,
}

impl SplitMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SplitMode::Layer => "layer",
            SplitMode::Row => "row",
            SplitMode::Tensor => "tensor",
        }
    }
    pub fn is_layer(&self) -> bool {
        *self == SplitMode::Layer
    }
}

impl fmt::Display for SplitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SplitMode {
    type Err = ParseKnobError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "layer" => Ok(SplitMode::Layer),
            "row" => Ok(SplitMode::Row),
            "tensor" => Ok(SplitMode::Tensor),
            _ => Err(ParseKnobError {
                what: "split mode",
                value: s.to_string(),
                expected: "layer, row, tensor".into(),
            }),
        }
    }
}

/// The CPU kernel choice: llama.cpp's "extra buffer types" (weight repacking into interleaved layouts,
/// and the AMX kernels on CPUs that have AMX). `Repack` is llama.cpp's default; `Plain` is what
/// llama-server's `--no-repack` and llama-bench's `--repack 0` select. On some machines the extra
/// kernels are faster, on others they are slower, and on some they crash (SIGILL in an AMX kernel when
/// the OS has not enabled AMX tiles): so this is a knob to measure, not an assumption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelChoice {
    Repack,
    Plain,
}

impl KernelChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            KernelChoice::Repack => "repack",
            KernelChoice::Plain => "plain",
        }
    }
    pub fn use_extra_bufts(self) -> bool {
        matches!(self, KernelChoice::Repack)
    }
}

impl fmt::Display for KernelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KernelChoice {
    type Err = ParseKnobError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "repack" | "on" | "1" => Ok(KernelChoice::Repack),
            "plain" | "no-repack" | "off" | "0" => Ok(KernelChoice::Plain),
            _ => Err(ParseKnobError {
                what: "kernel choice",
                value: s.to_string(),
                expected: "repack, plain".into(),
            }),
        }
    }
}

/// Where the weights left in host memory live when a device with a host buffer type (CUDA's and
/// Vulkan's pinned memory) takes part. llama.cpp lists that pinned buffer before the CPU's own
/// buffer types for host weights, so:
///
/// - `Mapped` (llama.cpp's default, `--load-mode auto`): the model file mapped; the pinned buffer
///   is set aside for a mapping, so host weights are pageable memory, and the CPU's repacked and
///   AMX kernels are not used for them whatever `--repack` says.
/// - `Pinned` (`--load-mode none`): the weights read into the device's pinned host buffer: copies
///   for op offload (each prompt batch brings the host's weights over) run at the link's full
///   speed, where pageable memory goes through a staging buffer; plain CPU kernels.
/// - `Cpu` (`--no-host`): the CPU's own buffer types first, so host weights are repacked for its
///   faster kernels (generation and small batches on the CPU); repacked weights are not host memory
///   to ggml's scheduler, so their prompt batches stay on the CPU instead of being offloaded.
///
/// Which is fastest depends on the prompt's length, the link and the CPU: measured. Without such a
/// device (CPU alone, RPC servers) the three are the same but for `Pinned` not mapping the file.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HostBuffer {
    #[default]
    Mapped,
    Pinned,
    Cpu,
}

impl HostBuffer {
    pub fn as_str(self) -> &'static str {
        match self {
            HostBuffer::Mapped => "mapped",
            HostBuffer::Pinned => "pinned",
            HostBuffer::Cpu => "cpu",
        }
    }
    pub fn is_mapped(&self) -> bool {
        *self == HostBuffer::Mapped
    }
}

impl fmt::Display for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HostBuffer {
    type Err = ParseKnobError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mapped" | "mmap" | "auto" => Ok(HostBuffer::Mapped),
            "pinned" | "none" => Ok(HostBuffer::Pinned),
            "cpu" | "no-host" => Ok(HostBuffer::Cpu),
            _ => Err(ParseKnobError {
                what: "host buffer",
                value: s.to_string(),
                expected: "mapped, pinned, cpu".into(),
            }),
        }
    }
}

/// llama.cpp's NUMA strategy (`--numa`), set once per process before the model loads. On a
/// machine with several NUMA nodes, `distribute` spreads threads over every node and `isolate`
/// keeps them on the node the process started on; both also turn off llama.cpp's prefetch of the
/// mapped weights (so pages land on the node that touches them first) and its matmul chunking.
/// Whether that is faster depends on the machine and the model, so it is measured. On a single
/// node llama.cpp treats both as off. (`numactl`, the CPU map of a `numactl` wrapper, needs that
/// wrapper around llama-server: not a setting of its own.)
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Numa {
    #[default]
    Off,
    Distribute,
    Isolate,
}

impl Numa {
    pub fn as_str(self) -> &'static str {
        match self {
            Numa::Off => "off",
            Numa::Distribute => "distribute",
            Numa::Isolate => "isolate",
        }
    }
    pub fn is_off(&self) -> bool {
        *self == Numa::Off
    }
}

impl fmt::Display for Numa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Numa {
    type Err = ParseKnobError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "none" | "disabled" => Ok(Numa::Off),
            "distribute" => Ok(Numa::Distribute),
            "isolate" => Ok(Numa::Isolate),
            _ => Err(ParseKnobError {
                what: "NUMA strategy",
                value: s.to_string(),
                expected: "off, distribute, isolate".into(),
            }),
        }
    }
}

/// An on/off llama.cpp setting that is on by default: the enum, its names (`on`/`off`, also
/// `1`/`0` and `true`/`false` when parsed) and `is_on` (for `skip_serializing_if`).
macro_rules! on_off_knob {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
        )]
        #[serde(rename_all = "lowercase")]
        pub enum $name {
            #[default]
            On,
            Off,
        }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self {
                    $name::On => "on",
                    $name::Off => "off",
                }
            }
            pub fn is_on(&self) -> bool {
                *self == $name::On
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParseKnobError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.trim().to_ascii_lowercase().as_str() {
                    "on" | "1" | "true" => Ok($name::On),
                    "off" | "0" | "false" => Ok($name::Off),
                    _ => Err(ParseKnobError {
                        what: $what,
                        value: s.to_string(),
                        expected: "on, off".into(),
                    }),
                }
            }
        }
    };
}

on_off_knob!(
    /// Whether llama.cpp may run a host tensor's operations on a device (`op_offload`,
    /// llama-server's `--no-op-offload` turns it off). With weights left in host memory (partial
    /// offload, experts on the CPU), ggml's scheduler copies them to the GPU for every batch of 32
    /// tokens or more and multiplies there: on a fast GPU behind a fast bus that speeds prompt
    /// processing up; on a slow device, or a slow link, it is the slowest part of the prompt (300x
    /// slower on a CPU-emulated Vulkan device). Generation (one token per batch) never offloads, and
    /// RPC devices never take such operations.
    OpOffload,
    "op offload"
);

on_off_knob!(
    /// Where the KV cache lives when layers are offloaded (llama.cpp's `offload_kqv`;
    /// llama-server's `-nkvo` keeps it in host memory). On the device by default; in host memory
    /// the attention of every layer runs on the CPU, which frees the device's KV bytes for more
    /// layers: a fit lever, measured, since it costs a round trip per layer for every token (half
    /// the generation speed on a loopback RPC device).
    KvOffload,
    "KV offload"
);

on_off_knob!(
    /// The Hadamard rotation llama.cpp applies to a quantized K/V cache before storing it (on
    /// since llama.cpp's PR 21038; `LLAMA_ATTN_ROT_DISABLE=1` turns it off). It improves a
    /// quantized cache's quality and costs some decode speed (about 7% per llama.cpp's PR 25382);
    /// an f16 cache is never rotated, so off changes nothing there.
    AttnRot,
    "attention rotation"
);
