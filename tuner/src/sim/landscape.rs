//! The simulated hardware and model, noise-free: a roofline of devices and a model's layers, and
//! what one configuration takes (bytes per device) and gives (prompt and generation tokens/s).
//!
//! A model of llama.cpp, not llama.cpp: the shapes are right (generation reads every offloaded
//! byte at its device's bandwidth and the rest at the host's, layers split across GPUs in
//! proportion to their memory, the output layer counted as one more layer, the compute buffer
//! growing with the micro-batch times the vocabulary), the constants are round numbers.

use crate::engine::score_seconds;
use crate::measuring::{DeviceBytes, LoadReport, MeasureRequest, Repetition, Workload};
use search_space::Phases;
use search_space::{CacheType, Candidate, FlashAttn, HostBuffer, KernelChoice, Numa};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// A non-CPU device (a GPU): its memory, read bandwidth, compute for prompt processing and the
/// link to the host (what a CPU-resident weight costs to bring over for a batch).
#[derive(Debug, Clone)]
pub struct Device {
    pub name: String,
    pub mem_bytes: u64,
    pub bandwidth: f64,
    pub flops: f64,
    pub link: f64,
    /// Pinned host memory (CUDA's, Vulkan's): llama.cpp puts host weights there unless `--no-host`.
    pub host_buffer: bool,
    /// Another host's device (an RPC server): the network's one-way latency in seconds, `link` then
    /// being the network's bandwidth. Each step (and each micro-batch of a prompt) sends the
    /// activations there and gets the result back. 0 for a device of this machine, whose bus costs
    /// are in the fixed per-split overhead.
    pub latency: f64,
}

/// One simulated GPU through another backend that drives it (`Vulkan0` beside `CUDA0`): its
/// decode and prompt speeds as factors of the device's own, and the bytes it takes on the device
/// beyond the first backend's (or fewer, negative).
#[derive(Debug, Clone)]
pub struct OtherBackend {
    /// The device it is (an index into [`Landscape::devices`]).
    pub device: usize,
    pub name: String,
    /// Factor on the device's read bandwidth (generation).
    pub decode: f64,
    /// Factor on the device's compute (prompt processing).
    pub prompt: f64,
    /// Bytes a load through it takes on the device beyond one through the first backend (its
    /// buffers, its weights' padding), held with the weights.
    pub overhead: i64,
}

/// The host: memory bandwidth (reached with about half the physical cores), compute per core.
#[derive(Debug, Clone)]
pub struct Host {
    pub bandwidth: f64,
    pub flops_per_core: f64,
    pub physical_cores: u32,
    /// NUMA nodes: `bandwidth` is all of theirs together, which only threads spread over every
    /// node with their pages reach (see [`Landscape::numa_share`]).
    pub numa_nodes: u32,
}

/// Mixture of experts: the share of a layer's bytes that are experts, and the fraction of them
/// one token reads.
#[derive(Debug, Clone, Copy)]
pub struct Moe {
    pub expert_share: f64,
    pub active: f64,
}

/// A model's sizes (bytes as quantized in the file).
#[derive(Debug, Clone)]
pub struct SimModel {
    pub n_layers: u32,
    pub layer_bytes: u64,
    /// K and V at f16 for one token in one layer.
    pub kv_bytes_per_token_layer: u64,
    pub output_bytes: u64,
    pub embd_bytes: u64,
    pub n_embd: u64,
    pub n_vocab: u64,
    pub moe: Option<Moe>,
    /// Mean KL divergence a q8_0/q8_0 KV cache adds over f16 (see [`Landscape::kv_kld`]).
    pub kv_kld_q8: f64,
}

impl SimModel {
    /// A 70B-class dense model at about 4.5 bits a weight: 80 layers, 128k vocabulary, GQA 8×128.
    pub fn llama_70b() -> Self {
        SimModel {
            n_layers: 80,
            layer_bytes: 480 * MIB,
            kv_bytes_per_token_layer: 2 * 8 * 128 * 2,
            output_bytes: 560 * MIB,
            embd_bytes: 560 * MIB,
            n_embd: 8192,
            n_vocab: 128_256,
            moe: None,
            kv_kld_q8: KV_KLD_Q8_8B,
        }
    }

    /// A smaller model of `n_layers` layers of `layer_bytes` with a vocabulary of `n_vocab`.
    pub fn dense(n_layers: u32, layer_bytes: u64, n_vocab: u64) -> Self {
        let n_embd = 4096;
        SimModel {
            n_layers,
            layer_bytes,
            kv_bytes_per_token_layer: 2 * 8 * 128 * 2,
            output_bytes: n_vocab * n_embd * 9 / 16,
            embd_bytes: n_vocab * n_embd * 9 / 16,
            n_embd,
            n_vocab,
            moe: None,
            kv_kld_q8: KV_KLD_Q8_8B,
        }
    }
}

/// A q8_0/q8_0 cache's mean KL divergence on Llama 3 8B (llama.cpp PR 7412: 0.00098 with f16
/// weights, 0.0016 with q8_0 weights), the landscapes' default.
pub const KV_KLD_Q8_8B: f64 = 0.0015;

/// Devices, model, and the measurement's imperfections.
#[derive(Debug, Clone)]
pub struct Landscape {
    pub host: Host,
    pub devices: Vec<Device>,
    pub model: SimModel,
    /// Seconds per generated token outside the matrix reads (kernel launches, sampling).
    pub overhead_s: f64,
    /// Standard deviation of one repetition's multiplicative noise (0.01 = 1%).
    pub noise: f64,
    /// Each load runs up to ±this fraction faster or slower for as long as it lives.
    pub load_spread: f64,
    /// Probability that one repetition crashes its worker.
    pub crash_rate: f64,
    /// Bytes per device llama.cpp's fit does not count that the dry run does: its placement can
    /// end this much over the target it was given (seen: 15 MiB on an RPC device).
    pub fit_undercount: u64,
    /// Its GPUs through other backends: one GPU, two ways to run it ([`OtherBackend`]).
    pub other_backends: Vec<OtherBackend>,
}

/// One place a configuration puts weights: a device, or the host (`device == None`).
#[derive(Debug, Clone, Default)]
pub struct Share {
    pub device: Option<usize>,
    pub name: String,
    pub layers: u32,
    /// Bytes held: weights, KV cache at the run's context, compute buffer.
    pub weights: u64,
    pub kv: u64,
    pub compute: u64,
    /// Weight bytes one generated token reads here.
    pub read_per_token: f64,
    /// Of them, the experts' (a mixture of experts: the share one token routes to).
    pub expert_read: f64,
}

impl Share {
    pub fn bytes(&self) -> u64 {
        self.weights + self.kv + self.compute
    }
}

/// The candidate a request describes (the engine's request carries every knob).
pub fn candidate_of(req: &MeasureRequest) -> Candidate {
    Candidate {
        n_gpu_layers: req.settings.n_gpu_layers,
        n_cpu_moe: req.settings.n_cpu_moe,
        n_cpu_ffn: req.settings.n_cpu_ffn,
        devices: req.settings.devices.clone(),
        tensor_split: req.settings.tensor_split.clone(),
        split_mode: req.settings.split_mode,
        kernels: if req.settings.use_extra_bufts {
            KernelChoice::Repack
        } else {
            KernelChoice::Plain
        },
        threads: req.context.threads,
        threads_batch: req.context.threads_batch,
        n_batch: req.context.n_batch,
        n_ubatch: req.context.n_ubatch,
        type_k: req.context.type_k,
        type_v: req.context.type_v,
        flash_attn: req.context.flash_attn,
        op_offload: req.context.op_offload,
        kv_offload: req.context.kv_offload,
        numa: req.settings.numa,
        host_buffer: req.settings.host_buffer,
        // The landscapes model neither environment knob: the defaults.
        ..Candidate::llama_default(req.context.threads, 0)
    }
}

/// The share of a dense layer's bytes that is its feed-forward network (up, gate and down
/// projections against attention's four: about two thirds in Llama-class models).
pub const FFN_SHARE: f64 = 0.66;

impl Landscape {
    /// Layers living on a device whose dense FFN stays on the host (`--n-cpu-ffn`, counted from the
    /// first layer as llama.cpp's overrides are; layers already on the host are not counted, nor an
    /// MoE model's layers, whose FFNs are experts).
    pub fn host_ffn_layers(&self, c: &Candidate) -> u32 {
        let m = &self.model;
        if m.moe.is_some() || self.used(c).is_empty() {
            return 0;
        }
        let first = m.n_layers - c.n_gpu_layers.min(m.n_layers);
        c.n_cpu_ffn.clamp(first, m.n_layers) - first
    }

    /// The devices a candidate uses (its `--device` list, else all).
    fn used(&self, c: &Candidate) -> Vec<usize> {
        (0..self.devices.len())
            .filter(|&d| {
                c.devices.is_empty()
                    || c.devices.contains(&self.devices[d].name)
                    || self.through(c, d).is_some()
            })
            .collect()
    }

    /// The other backend `c` runs device `d` through, where it names the device by that backend.
    pub fn through(&self, c: &Candidate, d: usize) -> Option<&OtherBackend> {
        (self.other_backends.iter()).find(|o| o.device == d && c.devices.contains(&o.name))
    }

    /// Device `d`'s name as `c` names it.
    fn name_of(&self, c: &Candidate, d: usize) -> String {
        self.through(c, d)
            .map_or_else(|| self.devices[d].name.clone(), |o| o.name.clone())
    }

    /// Device `d`'s read bandwidth through the backend `c` runs it through.
    fn bandwidth_of(&self, c: &Candidate, d: usize) -> f64 {
        self.devices[d].bandwidth * self.through(c, d).map_or(1.0, |o| o.decode)
    }

    /// Device `d`'s compute through the backend `c` runs it through.
    fn flops_of(&self, c: &Candidate, d: usize) -> f64 {
        self.devices[d].flops * self.through(c, d).map_or(1.0, |o| o.prompt)
    }

    /// Whether the host's weights are in the CPU's repacked layout: repack kernels, in the CPU's own
    /// buffers (llama.cpp puts host weights in a used device's pinned memory first, unless
    /// `--no-host`).
    fn host_repacked(&self, c: &Candidate) -> bool {
        let pinned_first = self.used(c).iter().any(|&d| self.devices[d].host_buffer);
        c.kernels == KernelChoice::Repack && (!pinned_first || c.host_buffer == HostBuffer::Cpu)
    }

    /// The link's speed for the host's weights copied over by op offload: the whole link from
    /// pinned memory, about 60% of it from pageable memory (through a staging buffer).
    fn link_from_host(&self, c: &Candidate, d: usize) -> f64 {
        let dev = &self.devices[d];
        let pinned = c.host_buffer == HostBuffer::Pinned
            && self.used(c).iter().any(|&u| self.devices[u].host_buffer);
        dev.link * if pinned { 1.0 } else { 0.6 }
    }

    /// Where every byte goes: the last `-ngl` layers on the devices (split by `-ts`, else by their
    /// memory, as llama.cpp splits by free memory), the
    /// output layer too when `-ngl` exceeds the layer count, the rest and the embeddings on the host;
    /// with `--n-cpu-moe N` the experts of the first N layers stay on the host.
    pub fn shares(&self, c: &Candidate, n_ctx: u32) -> Vec<Share> {
        let m = &self.model;
        let used = self.used(c);
        let on_gpu = if used.is_empty() {
            0
        } else {
            c.n_gpu_layers.min(m.n_layers)
        };
        let output_on_gpu = !used.is_empty() && c.n_gpu_layers > m.n_layers;
        let weight = |k: usize, d: usize| {
            if c.tensor_split.is_empty() {
                self.devices[d].mem_bytes
            } else {
                c.tensor_split.get(k).copied().unwrap_or(0) as u64
            }
        };
        let total_mem: u64 = used.iter().enumerate().map(|(k, &d)| weight(k, d)).sum();
        let first = m.n_layers - on_gpu;
        let (mut out, mut start, mut cum) = (Vec::new(), first, 0u64);
        for (k, &d) in used.iter().enumerate() {
            cum += weight(k, d);
            let end = first + (on_gpu as u64 * cum / total_mem.max(1)) as u32;
            let last = k + 1 == used.len();
            out.push(self.share(Some(d), start, end, last && output_on_gpu, c, n_ctx));
            start = end;
        }
        let mut host = self.share(None, 0, first, !output_on_gpu, c, n_ctx);
        // Experts kept on the host by --n-cpu-moe for layers that live on a device.
        let (exp, active) = m.moe.map_or((0.0, 0.0), |e| (e.expert_share, e.active));
        let kept = c.n_cpu_moe.clamp(first, m.n_layers) - first;
        let bytes = (kept as f64 * m.layer_bytes as f64 * exp) as u64;
        host.weights += bytes + m.embd_bytes;
        host.read_per_token += bytes as f64 * active;
        host.expert_read += bytes as f64 * active;
        // Dense FFNs kept on the host by --n-cpu-ffn for layers that live on a device: read whole
        // for every token, where the layer's attention and KV cache stay on the device.
        let ffn = self.host_ffn_layers(c) as f64 * m.layer_bytes as f64 * FFN_SHARE;
        host.weights += ffn as u64;
        host.read_per_token += ffn;
        // -nkvo: every layer's KV cache in host memory.
        if !c.kv_offload.is_on() {
            for s in &mut out {
                host.kv += std::mem::take(&mut s.kv);
            }
        }
        out.push(host);
        out
    }

    /// Layers `[a, b)` on one place.
    fn share(
        &self,
        device: Option<usize>,
        a: u32,
        b: u32,
        output: bool,
        c: &Candidate,
        n_ctx: u32,
    ) -> Share {
        let m = &self.model;
        let layers = b.saturating_sub(a);
        let (exp, active) = m.moe.map_or((0.0, 1.0), |e| (e.expert_share, e.active));
        // On a device, the experts of layers below --n-cpu-moe are not here, nor the dense FFNs of
        // layers below --n-cpu-ffn.
        let (away, ffn_away) = if device.is_some() {
            (
                c.n_cpu_moe.clamp(a, b.max(a)) - a,
                if m.moe.is_none() {
                    c.n_cpu_ffn.clamp(a, b.max(a)) - a
                } else {
                    0
                },
            )
        } else {
            (0, 0)
        };
        let lb = m.layer_bytes as f64;
        let ffn = ffn_away as f64 * lb * FFN_SHARE;
        let weights = layers as f64 * lb - away as f64 * lb * exp - ffn;
        let expert_read = (layers - away) as f64 * lb * exp * active;
        let read = layers as f64 * lb * (1.0 - exp) + expert_read - ffn;
        let kv = (layers as u64 * n_ctx as u64 * m.kv_bytes_per_token_layer) as f64
            * c.kv_bytes_factor();
        let ub = c.n_ubatch as u64;
        let mut compute = ub * m.n_embd * 4 * 6;
        if c.flash_attn == FlashAttn::Off {
            compute += ub * n_ctx as u64 * 4 * 4;
        }
        let mut out_bytes = 0;
        if output {
            compute += ub * m.n_vocab * 4;
            out_bytes = m.output_bytes;
        }
        let mut weights = weights as u64 + out_bytes;
        if let Some(o) = device.and_then(|d| self.through(c, d)) {
            weights = weights.saturating_add_signed(o.overhead);
        }
        Share {
            device,
            name: device.map_or("CPU".to_string(), |d| self.name_of(c, d)),
            layers,
            weights,
            kv: kv as u64,
            compute,
            read_per_token: read + out_bytes as f64,
            expert_read,
        }
    }

    /// The dry run's answer: bytes per device (the host as `CPU`).
    /// The host's weights are mapped from the file (a real load's `CPU_Mapped` buffer): mapped
    /// and not repacked (a copy in RAM).
    pub fn footprint(&self, c: &Candidate, n_ctx: u32) -> LoadReport {
        let shares = self.shares(c, n_ctx);
        let mapped = (c.host_buffer == HostBuffer::Mapped && !self.host_repacked(c))
            .then(|| {
                shares
                    .iter()
                    .find(|s| s.device.is_none())
                    .map(|s| s.weights)
            })
            .flatten()
            .filter(|&w| w > 0);
        let per_device: Vec<DeviceBytes> = (shares.into_iter())
            .map(|s| DeviceBytes {
                bytes: s.bytes(),
                device: s.name,
            })
            .collect();
        LoadReport {
            reported_bytes: per_device.iter().map(|d| d.bytes).sum(),
            per_device,
            buffers: (mapped.into_iter())
                .map(|bytes| profiles::measurements::BufferReport {
                    buffer: "CPU_Mapped".into(),
                    what: "model".into(),
                    bytes,
                })
                .collect(),
            ..LoadReport::default()
        }
    }

    /// The first device whose memory the configuration exceeds (what llama.cpp would fail on).
    pub fn out_of_memory(&self, c: &Candidate, n_ctx: u32, weights_only: bool) -> Option<String> {
        self.shares(c, n_ctx).into_iter().find_map(|s| {
            let d = &self.devices[s.device?];
            let need = if weights_only { s.weights } else { s.bytes() };
            (need > d.mem_bytes).then(|| {
                format!(
                    "cudaMalloc failed: out of memory ({} MiB on {})",
                    need / MIB,
                    s.name
                )
            })
        })
    }

    /// The host's read bandwidth with `t` threads: saturating at half the physical cores, then 8%
    /// lower by all of them (more threads contend for the same bus), worse again past them
    /// (hyper-threads). Prompt processing is compute-bound and wants every core: so a split thread
    /// count (`-t` half the cores, `-tb` all) beats any single one.
    /// The share of the host's bandwidth generation reaches with a NUMA strategy: all of it on one
    /// node; on several, llama.cpp's default leaves the weights on the node that loaded them, read
    /// by threads on every node (a little over one node's worth), isolate keeps to one node, and
    /// distribute spreads threads and pages over all (a 2-node Threadripper ran about 2x faster
    /// with it than without, llama.cpp issue 13850).
    fn numa_share(&self, numa: Numa) -> f64 {
        let nodes = self.host.numa_nodes.max(1) as f64;
        if nodes == 1.0 {
            return 1.0;
        }
        match numa {
            Numa::Off => 1.1 / nodes,
            Numa::Isolate => 1.0 / nodes,
            Numa::Distribute => 0.9,
        }
    }

    fn host_bandwidth(&self, t: u32) -> f64 {
        let phys = self.host.physical_cores.max(1);
        let half = (phys as f64 / 2.0).max(1.0);
        let reach = (t as f64 / half).min(1.0);
        let contention = 1.0 - 0.08 * ((t as f64 - half) / half).clamp(0.0, 1.0);
        self.host.bandwidth * reach * contention * if t > phys { 0.85 } else { 1.0 }
    }

    /// Seconds of one generation step of `np` sequences (a token each), each with `depth` tokens in
    /// its KV cache: every weight is read once for all of them, each sequence's KV cache for its
    /// own token. With several, a place's matrix products can outlast its reads (3.6 flops a byte,
    /// at the device's compute or the generation threads' cores): decoding becomes compute-bound,
    /// and the host then wants every core. One sequence is left bandwidth-bound (what these
    /// constants give on every landscape here).
    pub fn step_seconds(&self, c: &Candidate, n_ctx: u32, depth: u32, np: u32) -> f64 {
        let m = &self.model;
        let np = np.max(1);
        let shares = self.shares(c, n_ctx);
        let kv_token = m.kv_bytes_per_token_layer as f64 * c.kv_bytes_factor() * depth as f64;
        let quant_kv = if c.type_k.is_quantized() { 1.01 } else { 1.0 };
        let kv_home = c.kv_offload.is_on();
        let mut t = 0.0;
        let mut layers_kv_on_host = 0u32;
        for s in &shares {
            let kv_here = if s.device.is_some() && !kv_home {
                layers_kv_on_host += s.layers;
                0.0
            } else {
                s.layers as f64 * kv_token
            };
            // A step of N tokens reads the experts any of them routes to (routing independent).
            let experts = match self.model.moe {
                Some(e) if e.active > 0.0 => {
                    s.expert_read / e.active * (1.0 - (1.0 - e.active).powi(np as i32))
                }
                _ => s.expert_read,
            };
            let bytes = s.read_per_token - s.expert_read + experts + np as f64 * kv_here;
            let flops = 3.6 * s.read_per_token * np as f64;
            let (read, compute) = match s.device {
                Some(d) => {
                    let fa = if c.flash_attn == FlashAttn::Off {
                        1.0
                    } else {
                        0.99
                    };
                    (
                        bytes / self.bandwidth_of(c, d) * fa * quant_kv,
                        flops / self.flops_of(c, d),
                    )
                }
                None => {
                    let plain = if self.host_repacked(c) { 1.0 } else { 1.03 };
                    let cores = c.threads.min(self.host.physical_cores).max(1) as f64;
                    (
                        bytes / (self.host_bandwidth(c.threads) * self.numa_share(c.numa))
                            * plain
                            * quant_kv,
                        flops * plain / (self.host.flops_per_core * cores),
                    )
                }
            };
            t += if np > 1 { read.max(compute) } else { read };
        }
        // -nkvo: the device layers' attention reads their KV cache from host memory, with a round
        // trip (there and back) per layer.
        let n = layers_kv_on_host as f64;
        t += np as f64 * n * kv_token / self.host_bandwidth(c.threads) + n * 2.0 * 20e-6;
        // Each layer whose FFN stays on the host sends its activations there and back.
        let hops = shares
            .iter()
            .filter(|s| s.layers > 0)
            .count()
            .saturating_sub(1)
            + 2 * self.host_ffn_layers(c) as usize;
        let activations = self.model.n_embd as f64 * 4.0 * np as f64;
        t + hops as f64 * 20e-6
            + self.network_seconds(&shares, activations)
            + self.overhead_s * (1.0 + 0.002 * c.threads as f64)
    }

    /// Seconds the network takes for one pass over `shares`: for each other host holding layers, a
    /// round trip and `bytes` of activations there and back over its link.
    fn network_seconds(&self, shares: &[Share], bytes: f64) -> f64 {
        (shares.iter())
            .filter(|s| s.layers > 0)
            .filter_map(|s| s.device.map(|d| &self.devices[d]))
            .filter(|d| d.latency > 0.0)
            .map(|d| 2.0 * d.latency + 2.0 * bytes / d.link)
            .sum()
    }

    /// Seconds to process an `n`-token prompt: matrix products at each device's compute; the
    /// host's weights are either computed on the host or, with a device present and micro-batches
    /// of 32 or more and op offload on, copied over the link once per micro-batch (llama.cpp's op
    /// offload). A device's efficiency grows with the tokens of a micro-batch (fixed costs per
    /// batch: kernel launches); the host's stops growing at 512 and is 7% lower past it (as the demo
    /// model measured on 2 cores: 373 t/s at -ub 2048, 400 at 512).
    ///
    /// After `depth` tokens in the cache, each prompt token also attends to them: 4 flops per
    /// embedding value per cached token and layer, where the layer runs, half again without flash
    /// attention (the attention matrix written out and read back) and a fifth more with a quantized
    /// cache (dequantized as it is read).
    pub fn prompt_seconds(&self, c: &Candidate, n_ctx: u32, n: u32, depth: u32) -> f64 {
        let ub = c.n_ubatch.max(1) as f64;
        let tokens = ub.min(n.max(1) as f64);
        let eff = tokens / (tokens + 96.0);
        let host_eff = if tokens > 512.0 {
            0.93 * 512.0 / (512.0 + 96.0)
        } else {
            eff
        };
        let batches = (n as f64 / ub).ceil();
        let shares = self.shares(c, n_ctx);
        let used = self.used(c);
        let mut t = batches * 1e-3
            + batches * self.network_seconds(&shares, self.model.n_embd as f64 * 4.0 * tokens);
        let attention_per_layer = 4.0 * self.model.n_embd as f64 * n as f64 * depth as f64;
        let attention_cost = if c.flash_attn == FlashAttn::Off {
            1.5
        } else {
            1.0
        } * if c.type_k.is_quantized() { 1.2 } else { 1.0 };
        for s in &shares {
            let flops = 3.6 * s.read_per_token * n as f64;
            let attention = attention_per_layer * s.layers as f64 * attention_cost;
            t += match s.device {
                Some(d) => attention / (self.flops_of(c, d) * eff),
                None => {
                    let cores = c.batch_threads().min(self.host.physical_cores).max(1) as f64;
                    attention / (self.host.flops_per_core * cores * host_eff)
                }
            };
            t += match s.device {
                Some(d) => {
                    let fa = if c.flash_attn == FlashAttn::Off {
                        1.0
                    } else {
                        0.95
                    };
                    flops / (self.flops_of(c, d) * eff) * fa
                }
                // Repacked weights are not host memory to ggml's scheduler: never offloaded.
                None if !used.is_empty()
                    && c.n_ubatch >= 32
                    && c.op_offload.is_on()
                    && !self.host_repacked(c) =>
                {
                    let d = used[0];
                    batches * s.weights as f64 / self.link_from_host(c, d)
                        + flops / (self.flops_of(c, d) * eff)
                }
                None => {
                    let cores = c.batch_threads().min(self.host.physical_cores).max(1) as f64;
                    let repack = if self.host_repacked(c) { 1.3 } else { 1.0 };
                    flops / (self.host.flops_per_core * cores * repack * host_eff)
                }
            };
        }
        t
    }

    /// The noise-free repetition a configuration would give (with `--parallel N`, the rates of
    /// all N sequences together: their prompts in shared batches, a token of each per step).
    pub fn ideal(&self, c: &Candidate, w: &Workload) -> Repetition {
        let np = w.n_parallel.max(1);
        let prompt = w.n_prompt * np;
        let tg = np as f64 / self.step_seconds(c, w.n_ctx, 0, np);
        Repetition {
            pp_tps: prompt as f64 / self.prompt_seconds(c, w.n_ctx, prompt, 0),
            tg_tps: tg,
            pp_depth_tps: (w.depth > 0)
                .then(|| prompt as f64 / self.prompt_seconds(c, w.n_ctx, prompt, w.depth)),
            tg_depth_tps: (w.depth > 0)
                .then(|| np as f64 / self.step_seconds(c, w.n_ctx, w.depth, np)),
            load: None,
            timed: search_space::Phases::BOTH,
            screen: None,
        }
    }

    /// Seconds one request of the workload takes, noise-free (the objective; lower is better).
    pub fn true_seconds(&self, c: &Candidate, w: &Workload) -> f64 {
        score_seconds(&self.ideal(c, w), w)
    }

    /// Seconds one repetition occupies the machine (prompt, generation, and at depth the cache filled,
    /// the prompt and generation again).
    pub fn rep_seconds(&self, rep: &Repetition, w: &Workload) -> f64 {
        let mut s = w.n_prompt as f64 / rep.pp_tps + w.n_gen as f64 / rep.tg_tps;
        if let Some(d) = rep.tg_depth_tps {
            s += w.depth as f64 / rep.pp_tps + w.n_gen as f64 / d;
        }
        if let Some(p) = rep.pp_depth_tps {
            s += w.n_prompt as f64 / p;
        }
        s * w.n_parallel.max(1) as f64 + 0.05
    }

    /// Seconds the discarded warm-up on a fresh context takes, as the worker runs it: a prompt of
    /// its few tokens (the whole prompt where `whole`), at most a batch per sequence, then 4
    /// generation steps.
    pub fn warm_up_seconds(
        &self,
        ideal: &Repetition,
        w: &Workload,
        n_batch: u32,
        whole: bool,
    ) -> f64 {
        let np = w.n_parallel.max(1);
        let prompt = match whole {
            true => w.n_prompt,
            false => w.n_prompt.min(crate::worker::server::WARM_UP_TOKENS),
        };
        let n = (prompt.min(n_batch / np))
            .min((w.n_ctx / np).saturating_sub(4))
            .max(1);
        (n as f64 / ideal.pp_tps + 4.0 / ideal.tg_tps) * np as f64 + 0.05
    }

    /// Seconds a repetition that times `phases` alone takes: with a depth the cache is filled
    /// whatever is timed after it.
    pub fn timed_seconds(&self, rep: &Repetition, w: &Workload, phases: Phases) -> f64 {
        if phases.is_both() {
            return self.rep_seconds(rep, w);
        }
        let mut s = 0.0;
        if phases.prompt {
            s += w.n_prompt as f64 / rep.pp_tps;
            s += rep.pp_depth_tps.map_or(0.0, |p| w.n_prompt as f64 / p);
        }
        if phases.generation {
            s += w.n_gen as f64 / rep.tg_tps;
            s += rep.tg_depth_tps.map_or(0.0, |d| w.n_gen as f64 / d);
        }
        if rep.tg_depth_tps.is_some() {
            s += w.depth as f64 / rep.pp_tps;
        }
        s * w.n_parallel.max(1) as f64 + 0.05
    }

    /// Seconds one load takes: the file from disk (3 GB/s) and each device's share over its link.
    pub fn load_seconds(&self, c: &Candidate, n_ctx: u32) -> f64 {
        let shares = self.shares(c, n_ctx);
        let disk: u64 = shares.iter().map(|s| s.weights).sum();
        let upload: f64 = shares
            .iter()
            .filter_map(|s| Some(s.weights as f64 / self.devices[s.device?].link))
            .sum();
        1.0 + disk as f64 / 3e9 + upload
    }
}

impl Landscape {
    /// The links to its other hosts' devices as a run measures them before it starts (a round trip
    /// is twice the one-way latency).
    pub fn links(&self) -> Vec<profiles::HostLink> {
        (self.devices.iter())
            .filter(|d| d.latency > 0.0)
            .map(|d| profiles::HostLink {
                endpoint: format!("sim:{}", d.name),
                device: d.name.clone(),
                round_trip_ms: 2.0 * d.latency * 1e3,
                upload_bytes_per_s: d.link,
                download_bytes_per_s: d.link,
                used: false,
            })
            .collect()
    }
}

/// How much a cache type's rounding error counts against a q8_0 cache's: none at 16 bits and
/// more, 1 at q8_0, growing by 2^0.9 a bit below it (q4_0: 12x). The shape of the demo model's
/// figures (q4_0/q4_0 0.110 against q8_0/q8_0 0.0093), not a law.
fn kv_error(t: CacheType) -> f64 {
    if !t.is_quantized() {
        return 0.0;
    }
    2f64.powf(0.9 * (CacheType::Q8_0.bits_per_element() - t.bits_per_element()))
}

impl Landscape {
    /// The mean KL divergence a K/V pair adds over f16 caches: the model's q8_0 figure scaled by
    /// each cache's error, K weighing 0.6 and V 0.4 (K is the more sensitive; llama.cpp PR 7412:
    /// q8_0 K alone 0.0014, q8_0 V alone 0.0007 on Llama 3 8B).
    pub fn kv_kld(&self, type_k: CacheType, type_v: CacheType) -> f64 {
        self.model.kv_kld_q8 * (0.6 * kv_error(type_k) + 0.4 * kv_error(type_v))
    }
}
