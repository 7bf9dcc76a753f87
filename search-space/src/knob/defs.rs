//! The knobs of [`super::KNOBS`], one unit type each.

use super::*;

/// A knob's `value` and `set` for a field of a typed value (an enum with llama.cpp's names).
macro_rules! typed_value {
    ($field:ident, $ty:ty) => {
        fn value(&self, c: &Candidate) -> String {
            c.$field.to_string()
        }
        fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
            c.$field = parse::<$ty>(v)?;
            Ok(())
        }
    };
}

/// The most threads a profile may ask for: a sanity bound, far above any machine's cores, that keeps
/// an edited number from reaching llama.cpp.
pub const MAX_THREADS: u32 = 1024;
/// The largest batch (and micro-batch) a profile may ask for: a sanity bound, far above what any
/// device computes in one pass.
pub const MAX_BATCH: u32 = 1 << 20;
/// The most layers a profile may place: a sanity bound, far above any model's layer count.
pub const MAX_GPU_LAYERS: u32 = 10_000;

pub struct Threads;
impl Knob for Threads {
    fn name(&self) -> &'static str {
        "threads"
    }
    fn key(&self) -> &'static str {
        "t"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        None
    }
    fn moves(&self) -> Phases {
        // The prompt's threads are their own knob ([`ThreadsBatch`], its value the count in use).
        Phases::GENERATION
    }
    fn shows(&self) -> Shows {
        Shows::OnShortPrompt
    }
    fn runs_on(&self, backend: &Backend) -> bool {
        backend.name == "CPU"
    }
    fn explain(&self) -> &'static str {
        "threads that generate (-t): generation streams the weights, and saturates the memory bus with fewer threads than the cores"
    }
    fn bounds(&self) -> Option<Bounds> {
        Some(Bounds::new("threads", 1, MAX_THREADS))
    }
    fn value(&self, c: &Candidate) -> String {
        c.threads.to_string()
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        // The prompt's threads held, as the search's threads axis holds them.
        *c = c.with_threads(number("thread count", v)?, c.batch_threads());
        Ok(())
    }
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        vec![ServerOption::with_value("-t", "threads", c.threads)]
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        Some(format!("t={}", c.threads))
    }
}

pub struct ThreadsBatch;
impl Knob for ThreadsBatch {
    fn name(&self) -> &'static str {
        "prompt threads"
    }
    fn key(&self) -> &'static str {
        "tb"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        // The same count as -t: see `is_default`.
        None
    }
    fn moves(&self) -> Phases {
        Phases::PROMPT
    }
    fn shows(&self) -> Shows {
        Shows::OnShortPrompt
    }
    fn runs_on(&self, backend: &Backend) -> bool {
        backend.name == "CPU"
    }
    fn explain(&self) -> &'static str {
        "threads that process the prompt (-tb): compute-bound, so often more than generation wants"
    }
    fn bounds(&self) -> Option<Bounds> {
        Some(Bounds::new("threads_batch", 1, MAX_THREADS))
    }
    fn value(&self, c: &Candidate) -> String {
        c.batch_threads().to_string()
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        *c = c.with_threads(c.threads, number("thread count", v)?);
        Ok(())
    }
    fn is_default(&self, c: &Candidate) -> bool {
        c.threads_batch.is_none()
    }
    fn reset(&self, c: &mut Candidate) {
        c.threads_batch = None;
    }
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        vec![ServerOption::with_value(
            "-tb",
            "threads-batch",
            c.batch_threads(),
        )]
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        c.threads_batch.map(|tb| format!("tb={tb}"))
    }
}

pub struct Batch;
impl Knob for Batch {
    fn name(&self) -> &'static str {
        "batch"
    }
    fn key(&self) -> &'static str {
        "b"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        Some("2048")
    }
    fn moves(&self) -> Phases {
        Phases::PROMPT
    }
    fn explain(&self) -> &'static str {
        "tokens of the prompt submitted at once (-b): at least one micro-batch"
    }
    fn bounds(&self) -> Option<Bounds> {
        Some(Bounds::new("n_batch", 1, MAX_BATCH))
    }
    fn value(&self, c: &Candidate) -> String {
        c.n_batch.to_string()
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        c.n_batch = number("batch size", v)?;
        Ok(())
    }
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        vec![ServerOption::with_value("-b", "batch-size", c.n_batch)]
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        // With the micro-batch: the two read as one setting.
        Some(format!("b={}/{}", c.n_batch, c.n_ubatch))
    }
}

pub struct Ubatch;
impl Knob for Ubatch {
    fn name(&self) -> &'static str {
        "micro-batch"
    }
    fn key(&self) -> &'static str {
        "ub"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        Some("512")
    }
    fn moves(&self) -> Phases {
        Phases::PROMPT
    }
    fn explain(&self) -> &'static str {
        "tokens computed in one pass (-ub): larger is faster on a GPU, and costs compute-buffer memory"
    }
    fn bounds(&self) -> Option<Bounds> {
        Some(Bounds::new("n_ubatch", 1, MAX_BATCH))
    }
    fn value(&self, c: &Candidate) -> String {
        c.n_ubatch.to_string()
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        c.n_ubatch = number("micro-batch size", v)?;
        Ok(())
    }
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        vec![ServerOption::with_value("-ub", "ubatch-size", c.n_ubatch)]
    }
    fn label(&self, _: &Candidate) -> Option<String> {
        None // in the batch's piece
    }
}

/// The K and V caches' types, one knob: the search, the quality gate and explain take them as a
/// pair (`-ctk q8_0 -ctv q4_0` is one setting).
pub struct KvCache;
impl Knob for KvCache {
    fn name(&self) -> &'static str {
        "KV cache"
    }
    fn key(&self) -> &'static str {
        "kv"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        Some("f16/f16")
    }
    fn choices(&self) -> Vec<&'static str> {
        CacheType::ALL.iter().map(|t| t.as_str()).collect()
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn explain(&self) -> &'static str {
        "the K and V caches' types (-ctk, -ctv): a quantized cache holds a longer context or more layers, and changes the output"
    }
    fn value(&self, c: &Candidate) -> String {
        c.kv_label()
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        let (k, v) = v.split_once('/').unwrap_or((v, v));
        c.type_k = parse(k)?;
        c.type_v = parse(v)?;
        Ok(())
    }
    fn lossy(&self, c: &Candidate) -> bool {
        c.kv_lossy()
    }
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        vec![
            ServerOption::with_value("-ctk", "cache-type-k", c.type_k),
            ServerOption::with_value("-ctv", "cache-type-v", c.type_v),
        ]
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        Some(format!("kv={}", c.kv_label()))
    }
}

pub struct Flash;
impl Knob for Flash {
    fn name(&self) -> &'static str {
        "flash attention"
    }
    fn key(&self) -> &'static str {
        "fa"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        Some("auto")
    }
    fn choices(&self) -> Vec<&'static str> {
        vec!["on", "off", "auto"]
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn explain(&self) -> &'static str {
        "flash attention (-fa): fused attention kernels; a quantized V cache needs it"
    }
    typed_value!(flash_attn, FlashAttn);
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        vec![ServerOption::with_value("-fa", "flash-attn", c.flash_attn)]
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        Some(format!("fa={}", c.flash_attn))
    }
}

pub struct GpuLayers;
impl Knob for GpuLayers {
    fn name(&self) -> &'static str {
        "GPU layers"
    }
    fn key(&self) -> &'static str {
        "ngl"
    }
    fn side(&self) -> Side {
        Side::Model
    }
    fn default(&self) -> Option<&'static str> {
        None // llama.cpp's fit places them, by this machine's memory
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn explain(&self) -> &'static str {
        "layers on the offload devices (-ngl): a layer that spills to the host runs at the host's speed"
    }
    fn bounds(&self) -> Option<Bounds> {
        Some(Bounds::new("n_gpu_layers", 0, MAX_GPU_LAYERS))
    }
    fn value(&self, c: &Candidate) -> String {
        c.n_gpu_layers.to_string()
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        c.n_gpu_layers = number("layer count", v)?;
        Ok(())
    }
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        vec![ServerOption::with_value(
            "-ngl",
            "n-gpu-layers",
            c.n_gpu_layers,
        )]
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        Some(format!("ngl={}", c.n_gpu_layers))
    }
}

/// A count of layers some of whose tensors stay in host memory (`--n-cpu-ffn`, `--n-cpu-moe`).
macro_rules! host_layers_knob {
    ($ty:ident, $field:ident, $name:literal, $flag:literal, $long:literal, $label:literal, $explain:literal) => {
        pub struct $ty;
        impl Knob for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn key(&self) -> &'static str {
                $label
            }
            fn side(&self) -> Side {
                Side::Model
            }
            fn default(&self) -> Option<&'static str> {
                Some("0")
            }
            fn moves(&self) -> Phases {
                Phases::BOTH
            }
            fn explain(&self) -> &'static str {
                $explain
            }
            fn bounds(&self) -> Option<Bounds> {
                Some(Bounds::new(stringify!($field), 0, MAX_GPU_LAYERS))
            }
            fn value(&self, c: &Candidate) -> String {
                c.$field.to_string()
            }
            fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
                c.$field = number("layer count", v)?;
                Ok(())
            }
            fn server(&self, c: &Candidate) -> Vec<ServerOption> {
                (c.$field > 0)
                    .then(|| ServerOption::with_value($flag, $long, c.$field))
                    .into_iter()
                    .collect()
            }
            fn label(&self, c: &Candidate) -> Option<String> {
                (c.$field > 0).then(|| format!(concat!($label, "={}"), c.$field))
            }
        }
    };
}

host_layers_knob!(
    CpuFfn,
    n_cpu_ffn,
    "FFNs on the host",
    "--n-cpu-ffn",
    "n-cpu-ffn",
    "cpu-ffn",
    "dense FFN weights of the first N layers kept in host memory, their attention on the devices (--n-cpu-ffn)"
);
host_layers_knob!(
    CpuMoe,
    n_cpu_moe,
    "experts on the host",
    "--n-cpu-moe",
    "n-cpu-moe",
    "cpu-moe",
    "expert weights of the first N layers kept in host memory, the rest of the layer on the devices (--n-cpu-moe)"
);

pub struct Kernels;
impl Knob for Kernels {
    fn name(&self) -> &'static str {
        "kernels"
    }
    fn key(&self) -> &'static str {
        ""
    }
    fn side(&self) -> Side {
        Side::Model
    }
    fn default(&self) -> Option<&'static str> {
        Some("repack")
    }
    fn choices(&self) -> Vec<&'static str> {
        vec!["repack", "plain"]
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn shows(&self) -> Shows {
        Shows::OnShortPrompt
    }
    fn runs_on(&self, backend: &Backend) -> bool {
        backend.name == "CPU"
    }
    fn explain(&self) -> &'static str {
        "the CPU's weight repacking and AMX kernels, or plain ones (--no-repack)"
    }
    typed_value!(kernels, KernelChoice);
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        (c.kernels == KernelChoice::Plain)
            .then(|| ServerOption::flag("--no-repack", "no-repack"))
            .into_iter()
            .collect()
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        Some(c.kernels.to_string())
    }
}

pub struct Host;
impl Knob for Host {
    fn name(&self) -> &'static str {
        "host buffer"
    }
    fn key(&self) -> &'static str {
        "host"
    }
    fn side(&self) -> Side {
        Side::Model
    }
    fn default(&self) -> Option<&'static str> {
        Some("mapped")
    }
    fn choices(&self) -> Vec<&'static str> {
        vec!["mapped", "pinned", "cpu"]
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn runs_on(&self, backend: &Backend) -> bool {
        backend.pinned_host
    }
    fn explain(&self) -> &'static str {
        "where host weights live beside a GPU: the mapped file, the GPU's pinned memory (-lm none) or the CPU's repacking buffers (--no-host)"
    }
    typed_value!(host_buffer, HostBuffer);
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        match c.host_buffer {
            HostBuffer::Mapped => Vec::new(),
            HostBuffer::Pinned => vec![ServerOption::with_value("-lm", "load-mode", "none")],
            HostBuffer::Cpu => vec![ServerOption::flag("--no-host", "no-host")],
        }
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        (!c.host_buffer.is_mapped()).then(|| format!("host={}", c.host_buffer))
    }
}

pub struct KvOffloadKnob;
impl Knob for KvOffloadKnob {
    fn name(&self) -> &'static str {
        "KV offload"
    }
    fn key(&self) -> &'static str {
        "kv-offload"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        Some("on")
    }
    fn choices(&self) -> Vec<&'static str> {
        vec!["on", "off"]
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn explain(&self) -> &'static str {
        "the KV cache on the devices, or in host memory (-nkvo): frees device memory for layers, costs a round trip per layer per token"
    }
    typed_value!(kv_offload, KvOffload);
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        (!c.kv_offload.is_on())
            .then(|| ServerOption::flag("-nkvo", "no-kv-offload"))
            .into_iter()
            .collect()
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        (!c.kv_offload.is_on()).then(|| "nkvo".into())
    }
}

pub struct OpOffloadKnob;
impl Knob for OpOffloadKnob {
    fn name(&self) -> &'static str {
        "op offload"
    }
    fn key(&self) -> &'static str {
        "op-offload"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        Some("on")
    }
    fn choices(&self) -> Vec<&'static str> {
        vec!["on", "off"]
    }
    fn moves(&self) -> Phases {
        // Generation's batches (a token per sequence) stay under the threshold.
        Phases::PROMPT
    }
    fn runs_on(&self, backend: &Backend) -> bool {
        backend.op_offload
    }
    fn explain(&self) -> &'static str {
        "host weights copied to a device for a prompt batch's operations (--no-op-offload turns it off): fast behind a fast bus, the slowest part of the prompt behind a slow one"
    }
    typed_value!(op_offload, OpOffload);
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        (!c.op_offload.is_on())
            .then(|| ServerOption::flag("--no-op-offload", "no-op-offload"))
            .into_iter()
            .collect()
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        (!c.op_offload.is_on()).then(|| "no-op-offload".into())
    }
}

pub struct Devices;
impl Knob for Devices {
    fn name(&self) -> &'static str {
        "devices"
    }
    fn key(&self) -> &'static str {
        "dev"
    }
    fn side(&self) -> Side {
        Side::Model
    }
    fn default(&self) -> Option<&'static str> {
        Some("")
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn explain(&self) -> &'static str {
        "the devices that hold layers (--device), by llama.cpp's names"
    }
    fn value(&self, c: &Candidate) -> String {
        c.devices.join(",")
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        c.devices = names(v);
        Ok(())
    }
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        (!c.devices.is_empty())
            .then(|| ServerOption::with_value("--device", "device", c.devices.join(",")))
            .into_iter()
            .collect()
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        (!c.devices.is_empty()).then(|| format!("dev={}", c.devices.join(",")))
    }
}

pub struct TensorSplit;
impl Knob for TensorSplit {
    fn name(&self) -> &'static str {
        "tensor split"
    }
    fn key(&self) -> &'static str {
        "ts"
    }
    fn side(&self) -> Side {
        Side::Model
    }
    fn default(&self) -> Option<&'static str> {
        Some("")
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn explain(&self) -> &'static str {
        "each device's share of the offloaded layers (-ts)"
    }
    fn value(&self, c: &Candidate) -> String {
        let parts: Vec<String> = c.tensor_split.iter().map(u32::to_string).collect();
        parts.join(",")
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        c.tensor_split = numbers("tensor split share", v)?;
        Ok(())
    }
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        (!c.tensor_split.is_empty())
            .then(|| ServerOption::with_value("-ts", "tensor-split", self.value(c)))
            .into_iter()
            .collect()
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        (!c.tensor_split.is_empty()).then(|| format!("ts={}", self.value(c).replace(',', "/")))
    }
}

pub struct Split;
impl Knob for Split {
    fn name(&self) -> &'static str {
        "split mode"
    }
    fn key(&self) -> &'static str {
        "sm"
    }
    fn side(&self) -> Side {
        Side::Model
    }
    fn default(&self) -> Option<&'static str> {
        Some("layer")
    }
    fn choices(&self) -> Vec<&'static str> {
        vec!["layer", "row", "tensor"]
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn explain(&self) -> &'static str {
        "how layers spread over several devices (-sm): whole layers, rows of every layer, or tensor parallelism"
    }
    typed_value!(split_mode, SplitMode);
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        (!c.split_mode.is_layer())
            .then(|| ServerOption::with_value("-sm", "split-mode", c.split_mode))
            .into_iter()
            .collect()
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        (!c.split_mode.is_layer()).then(|| format!("sm={}", c.split_mode))
    }
}

pub struct NumaKnob;
impl Knob for NumaKnob {
    fn name(&self) -> &'static str {
        "NUMA"
    }
    fn key(&self) -> &'static str {
        "numa"
    }
    fn side(&self) -> Side {
        Side::Process
    }
    fn default(&self) -> Option<&'static str> {
        Some("off")
    }
    fn choices(&self) -> Vec<&'static str> {
        vec!["off", "distribute", "isolate"]
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn shows(&self) -> Shows {
        Shows::OnShortPrompt
    }
    fn runs_on(&self, backend: &Backend) -> bool {
        backend.name == "CPU"
    }
    fn explain(&self) -> &'static str {
        "llama.cpp's NUMA strategy (--numa): threads spread over the nodes or kept on one"
    }
    typed_value!(numa, Numa);
    fn server(&self, c: &Candidate) -> Vec<ServerOption> {
        (!c.numa.is_off())
            .then(|| ServerOption::with_value("--numa", "numa", c.numa))
            .into_iter()
            .collect()
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        (!c.numa.is_off()).then(|| format!("numa={}", c.numa))
    }
}

/// llama.cpp's default batch size from which a device runs a host tensor's operation
/// (`GGML_OP_OFFLOAD_MIN_BATCH`, read by each backend when it registers its devices).
pub const OP_OFFLOAD_MIN_BATCH_DEFAULT: u32 = 32;

/// The batch size from which op offload runs a host tensor's operation on a device: below it the
/// host multiplies its own weights. Read once per process, so a change is a new worker.
pub struct OpOffloadMinBatch;
impl Knob for OpOffloadMinBatch {
    fn name(&self) -> &'static str {
        "op offload threshold"
    }
    fn key(&self) -> &'static str {
        "ob"
    }
    fn side(&self) -> Side {
        Side::Process
    }
    fn default(&self) -> Option<&'static str> {
        Some("32")
    }
    fn moves(&self) -> Phases {
        // Generation's batches are a token per sequence: the threshold moves them only with as
        // many sequences at once, which the search does not try.
        Phases::PROMPT
    }
    fn runs_on(&self, backend: &Backend) -> bool {
        backend.op_offload
    }
    fn explain(&self) -> &'static str {
        "the batch size from which host weights go to a device for a batch's operations (GGML_OP_OFFLOAD_MIN_BATCH): below it the host computes them itself"
    }
    fn bounds(&self) -> Option<Bounds> {
        // No batch is larger than MAX_BATCH, so a threshold above it says what op offload off
        // says; and the backends read the variable with `atoi` into an `int`, which a larger
        // number would overflow.
        Some(Bounds::new("op_offload_min_batch", 1, MAX_BATCH))
    }
    fn value(&self, c: &Candidate) -> String {
        c.op_offload_min_batch
            .unwrap_or(OP_OFFLOAD_MIN_BATCH_DEFAULT)
            .to_string()
    }
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError> {
        let n = number("batch size", v)?;
        c.op_offload_min_batch = (n != OP_OFFLOAD_MIN_BATCH_DEFAULT).then_some(n);
        Ok(())
    }
    fn env(&self, c: &Candidate) -> Option<(&'static str, Option<String>)> {
        let v = c.op_offload_min_batch.map(|n| n.to_string());
        Some(("GGML_OP_OFFLOAD_MIN_BATCH", v))
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        c.op_offload_min_batch.map(|n| format!("ob={n}"))
    }
}

/// The Hadamard rotation llama.cpp applies to a quantized K/V cache (since its PR 21038): better
/// quality for the cache, a few percent of decode. Read when a context's cache is made.
pub struct AttnRotation;
impl Knob for AttnRotation {
    fn name(&self) -> &'static str {
        "attention rotation"
    }
    fn key(&self) -> &'static str {
        "rot"
    }
    fn side(&self) -> Side {
        Side::Context
    }
    fn default(&self) -> Option<&'static str> {
        Some("on")
    }
    fn choices(&self) -> Vec<&'static str> {
        vec!["on", "off"]
    }
    fn moves(&self) -> Phases {
        Phases::BOTH
    }
    fn explain(&self) -> &'static str {
        "the rotation llama.cpp applies to a quantized KV cache (LLAMA_ATTN_ROT_DISABLE=1 turns it off): off is faster and changes the output"
    }
    typed_value!(attn_rot, AttnRot);
    fn lossy(&self, c: &Candidate) -> bool {
        // Only a quantized cache is rotated: off changes nothing else.
        !c.attn_rot.is_on() && c.kv_lossy()
    }
    fn env(&self, c: &Candidate) -> Option<(&'static str, Option<String>)> {
        let v = (!c.attn_rot.is_on()).then(|| "1".to_string());
        Some(("LLAMA_ATTN_ROT_DISABLE", v))
    }
    fn label(&self, c: &Candidate) -> Option<String> {
        (!c.attn_rot.is_on()).then(|| "no-rot".into())
    }
}
