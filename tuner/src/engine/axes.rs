//! The axes of the coordinate descent: each knob's variants from the current best, within the
//! space the user allowed, and the full grid for `--exhaustive`.

use super::TuneSettings;
use search_space::{Candidate, FlashAttn, HostBuffer, KernelChoice, OpOffload};

/// `v` when the user allowed it (or allowed anything), else the first value the user gave.
pub(super) fn pick<T: Copy + PartialEq>(options: &[T], v: T) -> T {
    if options.is_empty() || options.contains(&v) {
        v
    } else {
        options[0]
    }
}

/// `c` with every knob the user restricted moved into the search space (the first value given when
/// `c`'s is not among them): the defaults stay llama.cpp's as the reference, but the placements
/// measured beside them use only what the user allowed (`--ubatch 128` is never loaded at 512).
pub(crate) fn in_space(s: &TuneSettings, c: &Candidate) -> Candidate {
    let (type_k, type_v) = pick(&s.kv_pairs, (c.type_k, c.type_v));
    let mut out = Candidate {
        kernels: pick(&s.plan.kernels, c.kernels),
        host_buffer: pick(&s.host_buffers, c.host_buffer),
        numa: pick(&s.numa, c.numa),
        op_offload: pick(&s.op_offload, c.op_offload),
        kv_offload: pick(&s.plan.kv_offload, c.kv_offload),
        flash_attn: pick(&s.plan.flash_attn, c.flash_attn),
        n_ubatch: pick(&s.ubatch_options, c.n_ubatch),
        type_k,
        type_v,
        ..c.clone()
    };
    out.n_batch = out.n_batch.max(out.n_ubatch);
    let mut out = out.with_threads(
        pick(&s.threads_options, c.threads),
        pick(&s.threads_batch_options, c.batch_threads()),
    );
    if out.type_v.is_quantized() && out.flash_attn == FlashAttn::Off {
        out.flash_attn = pick(
            &s.plan
                .flash_attn
                .iter()
                .copied()
                .filter(|&f| f != FlashAttn::Off)
                .collect::<Vec<_>>(),
            FlashAttn::Auto,
        );
    }
    out
}

/// Generation threads, the prompt's held where they are (generation is bandwidth-bound and often
/// fastest with fewer threads than the compute-bound prompt wants; the next axis varies those).
pub(super) fn vary_threads(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    s.threads_options
        .iter()
        .map(|&t| from.with_threads(t, from.batch_threads()))
        .collect()
}
/// Prompt-processing threads (`-tb`), the generation threads held, where the host multiplies
/// weights.
pub(super) fn vary_threads_batch(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    if !host_computes(s, from) {
        return Vec::new();
    }
    s.threads_batch_options
        .iter()
        .map(|&tb| from.with_threads(from.threads, tb))
        .collect()
}
/// CPU kernels (weight repack or plain), where the host multiplies weights in its own buffers
/// (beside a device's pinned host memory, only with `--no-host`: see [`pinned_memory_in_use`]).
pub(super) fn vary_kernels(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    if !host_computes(s, from) || pinned_memory_in_use(s, from) {
        return Vec::new();
    }
    s.plan
        .kernels
        .iter()
        .map(|&k| Candidate {
            kernels: k,
            ..from.clone()
        })
        .collect()
}
/// llama.cpp's NUMA strategies, where the host multiplies weights and more than one is allowed
/// (by default on a machine with several NUMA nodes: see `machine::numa_nodes`).
pub(super) fn vary_numa(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    if !host_computes(s, from) || s.numa.len() < 2 {
        return Vec::new();
    }
    s.numa
        .iter()
        .map(|&numa| Candidate {
            numa,
            ..from.clone()
        })
        .collect()
}

/// One axis of the coordinate descent: the candidates that differ from `from` in its knob.
pub(super) type Vary = fn(&TuneSettings, &Candidate) -> Vec<Candidate>;

/// The axes of the coordinate descent after the placement and the split, in order. Where layers
/// stay on the host, [`HOST_AXES`] come before the split too.
pub(super) const AXES: [(&str, Vary); 9] = [
    ("op offload", vary_op_offload),
    ("host buffer", vary_host_buffer),
    ("threads", vary_threads),
    // Right after the threads: on several nodes the strategy can double generation.
    ("numa", vary_numa),
    ("prompt threads", vary_threads_batch),
    ("kernels", vary_kernels),
    ("flash attention", vary_flash_attn),
    ("kv cache", vary_cache),
    ("batch", vary_batch),
];

/// The axes that set how the host serves the layers it keeps, measured before the split where
/// layers stay on the host: the host's share of every token is then most of the token's time, and
/// the split moves only what the devices hold (and takes a slow model's budget: each device alone,
/// the rows, the steps). Generation threads first (every token), then where the weights live and
/// op offload (the prompt's batches). Measured again from the split's best in [`AXES`]; unchanged,
/// they cost nothing more. Threads first beat the order of [`AXES`] on `bench/vs-tuners` (the
/// figures: docs/benchmarks.md, "The figures behind the search's choices").
pub(super) const HOST_AXES: [(&str, Vary); 3] = [
    ("threads", vary_threads),
    ("host buffer", vary_host_buffer),
    ("op offload", vary_op_offload),
];

/// Whether `c` leaves weights in host memory that ggml could offload a batch's operations for:
/// fewer layers than the model's on the devices, or experts kept on the CPU.
pub(super) fn host_weights(s: &TuneSettings, c: &Candidate) -> bool {
    s.offload && (c.n_gpu_layers <= s.n_layers || c.n_cpu_moe > 0 || c.n_cpu_ffn > 0)
}

/// Whether the host multiplies any of `c`'s weights: always without a device to offload to, else
/// where weights stay in host memory. With every layer on the devices the CPU kernels and the
/// prompt's thread count change nothing (the token embeddings the host keeps are looked up, not
/// multiplied), and measuring such ties costs the most repetitions of all.
pub(super) fn host_computes(s: &TuneSettings, c: &Candidate) -> bool {
    !s.offload || host_weights(s, c)
}
/// Whether llama.cpp puts `c`'s host weights in a device's pinned host memory instead of the CPU's
/// own buffer types (which alone repack): a device of `c`'s that has such memory takes part and
/// `--no-host` is not set. The CPU kernel choice then changes nothing.
pub(crate) fn pinned_memory_in_use(s: &TuneSettings, c: &Candidate) -> bool {
    c.host_buffer != HostBuffer::Cpu
        && s.offload
        && (s.host_buffer_devices.iter()).any(|d| c.devices.is_empty() || c.devices.contains(d))
}

/// Whether ggml's scheduler may copy `c`'s host weights to a device for a batch's operations (op
/// offload): the knob on, and those weights not repacked in the CPU's own buffers (repacked
/// weights are not host memory to the scheduler, whatever the knob says).
pub(crate) fn offloads_host_ops(s: &TuneSettings, c: &Candidate) -> bool {
    let repacked = c.kernels == KernelChoice::Repack && !pinned_memory_in_use(s, c);
    c.op_offload.is_on() && !repacked
}

/// Where host weights live (mapped, pinned, the CPU's buffers), where weights stay in host memory.
pub(super) fn vary_host_buffer(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    if !host_weights(s, from) {
        return Vec::new();
    }
    s.host_buffers
        .iter()
        .map(|&host_buffer| Candidate {
            host_buffer,
            ..from.clone()
        })
        .collect()
}

pub(super) fn vary_op_offload(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    if !host_weights(s, from) {
        return Vec::new();
    }
    s.op_offload
        .iter()
        .map(|&op_offload| Candidate {
            op_offload,
            ..from.clone()
        })
        .collect()
}
pub(super) fn vary_flash_attn(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    s.plan
        .flash_attn
        .iter()
        .map(|&f| Candidate {
            flash_attn: f,
            ..from.clone()
        })
        .collect()
}
/// Every K/V cache pair of the search ([`TuneSettings::kv_pairs`]), with flash attention where
/// the V cache is quantized (llama.cpp needs it there).
pub(crate) fn vary_cache(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    let fa = if from.flash_attn == FlashAttn::Off {
        FlashAttn::Auto
    } else {
        from.flash_attn
    };
    s.kv_pairs
        .iter()
        .map(|&(type_k, type_v)| {
            let flash_attn = if type_v.is_quantized() {
                fa
            } else {
                from.flash_attn
            };
            Candidate {
                type_k,
                type_v,
                flash_attn,
                ..from.clone()
            }
        })
        .collect()
}
/// Micro-batch sizes; where weights stay on the host, those above the current one also with the
/// other op offload setting: op offload copies the host's weights once per micro-batch, so over a
/// slow link it can lose at 512 (where the op offload axis chose) and win at 2048, with a quarter
/// of the copies. Turned on from host weights in the CPU's repacked buffers (which are never
/// offloaded, whatever the knob says: on there is off), it comes with each other host buffer
/// allowed.
pub(super) fn vary_batch(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    let at = |ub: u32, op_offload: OpOffload, host_buffer: HostBuffer| Candidate {
        op_offload,
        host_buffer,
        ..from.with_ubatch(ub)
    };
    let mut out: Vec<Candidate> = s
        .ubatch_options
        .iter()
        .map(|&ub| at(ub, from.op_offload, from.host_buffer))
        .collect();
    if host_weights(s, from) {
        let hosts: Vec<HostBuffer> = if from.host_buffer == HostBuffer::Cpu {
            let others = s.host_buffers.iter().filter(|&&h| h != HostBuffer::Cpu);
            others.copied().collect()
        } else {
            vec![from.host_buffer]
        };
        let offloads = offloads_host_ops(s, from);
        for &ub in s.ubatch_options.iter().filter(|&&ub| ub > from.n_ubatch) {
            for &o in s.op_offload.iter().filter(|&&o| o.is_on() != offloads) {
                let with = |h: &HostBuffer| at(ub, o, *h);
                match o {
                    OpOffload::On => {
                        out.extend((hosts.iter().map(with)).filter(|c| offloads_host_ops(s, c)))
                    }
                    OpOffload::Off => out.push(at(ub, o, from.host_buffer)),
                }
            }
        }
    }
    out
}

/// The Cartesian product of the declared knob values (invalid combinations left out).
pub fn grid(s: &TuneSettings, base: &Candidate) -> Vec<Candidate> {
    let mut out = Vec::new();
    for &threads in &s.threads_options {
        for &kernels in &s.plan.kernels {
            for &flash_attn in &s.plan.flash_attn {
                for &(type_k, type_v) in &s.kv_pairs {
                    for &ub in &s.ubatch_options {
                        let c = Candidate {
                            threads,
                            kernels,
                            flash_attn,
                            type_k,
                            type_v,
                            ..base.with_ubatch(ub)
                        };
                        if c.validate().is_ok() {
                            out.push(c);
                        }
                    }
                }
            }
        }
    }
    // NUMA strategies only where the host computes: elsewhere they are the same run.
    if host_computes(s, base) && s.numa.len() > 1 {
        out = (out.iter())
            .flat_map(|c| {
                s.numa
                    .iter()
                    .map(move |&numa| Candidate { numa, ..c.clone() })
            })
            .collect();
    }
    // Op offload and host buffers only where weights stay on the host: elsewhere their settings
    // are the same run.
    let (ops, hosts) = if host_weights(s, base) {
        (s.op_offload.clone(), s.host_buffers.clone())
    } else {
        (vec![base.op_offload], vec![base.host_buffer])
    };
    let out: Vec<Candidate> = (ops.iter())
        .flat_map(|&op_offload| {
            out.iter().map(move |c| Candidate {
                op_offload,
                ..c.clone()
            })
        })
        .collect();
    (hosts.iter())
        .flat_map(|&host_buffer| {
            out.iter().map(move |c| Candidate {
                host_buffer,
                ..c.clone()
            })
        })
        .collect()
}

/// The fit lever that puts the most layers on the devices at `start`'s micro-batch with the KV cache
/// kept there (a smaller micro-batch costs prompt speed, `-nkvo` a round trip per layer for every
/// token), when it reaches more than `start`'s own KV cache does: visited right after the baseline,
/// so a budget that ends in the first round has measured it. On an H200 with half the memory full
/// offload needs, a 60 s tune measured llama.cpp's placement, q8_0 at one layer more and one layer
/// fewer, and never reached q4_0 at two layers more, 24% faster than the baseline with 150 s.
pub(crate) fn strongest_lever(group: &[Candidate], start: &Candidate) -> Option<Candidate> {
    let alike = |c: &&Candidate| c.n_ubatch == start.n_ubatch && c.kv_offload == start.kv_offload;
    let unchanged = (group.iter().filter(alike))
        .filter(|c| c.type_k == start.type_k && c.type_v == start.type_v)
        .map(|c| c.n_gpu_layers)
        .max()?;
    (group.iter().filter(alike))
        .filter(|c| c.n_gpu_layers > unchanged)
        .max_by_key(|c| c.n_gpu_layers)
        .cloned()
}
