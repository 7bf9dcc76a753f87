//! The axes of the coordinate descent: each knob's variants from the current best, within the
//! space the user allowed, and the full grid for `--exhaustive`.

use super::TuneSettings;
use search_space::{Candidate, FlashAttn, OpOffload};

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
    let kv = pick(&s.cache_types, c.type_k);
    let mut out = Candidate {
        kernels: pick(&s.kernels, c.kernels),
        numa: pick(&s.numa, c.numa),
        op_offload: pick(&s.op_offload, c.op_offload),
        kv_offload: pick(&s.kv_offload, c.kv_offload),
        flash_attn: pick(&s.flash_attn, c.flash_attn),
        n_ubatch: pick(&s.ubatch_options, c.n_ubatch),
        type_k: kv,
        type_v: if s.cache_types.contains(&c.type_v) {
            c.type_v
        } else {
            kv
        },
        ..c.clone()
    };
    out.n_batch = out.n_batch.max(out.n_ubatch);
    let mut out = out.with_threads(
        pick(&s.threads_options, c.threads),
        pick(&s.threads_batch_options, c.batch_threads()),
    );
    if out.type_v.is_quantized() && out.flash_attn == FlashAttn::Off {
        out.flash_attn = pick(
            &s.flash_attn
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
/// CPU kernels (weight repack or plain), where the host multiplies weights.
pub(super) fn vary_kernels(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    if !host_computes(s, from) {
        return Vec::new();
    }
    s.kernels
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

/// Whether `c` leaves weights in host memory that ggml could offload a batch's operations for:
/// fewer layers than the model's on the devices, or experts kept on the CPU.
pub(super) fn host_weights(s: &TuneSettings, c: &Candidate) -> bool {
    s.offload && (c.n_gpu_layers <= s.n_layers || c.n_cpu_moe > 0)
}

/// Whether the host multiplies any of `c`'s weights: always without a device to offload to, else
/// where weights stay in host memory. With every layer on the devices the CPU kernels and the
/// prompt's thread count change nothing (the token embeddings the host keeps are looked up, not
/// multiplied), and measuring such ties costs the most repetitions of all.
pub(super) fn host_computes(s: &TuneSettings, c: &Candidate) -> bool {
    !s.offload || host_weights(s, c)
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
    s.flash_attn
        .iter()
        .map(|&f| Candidate {
            flash_attn: f,
            ..from.clone()
        })
        .collect()
}
pub(super) fn vary_cache(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    let fa = if from.flash_attn == FlashAttn::Off {
        FlashAttn::Auto
    } else {
        from.flash_attn
    };
    s.cache_types
        .iter()
        .map(|&t| {
            let flash_attn = if t.is_quantized() {
                fa
            } else {
                from.flash_attn
            };
            Candidate {
                type_k: t,
                type_v: t,
                flash_attn,
                ..from.clone()
            }
        })
        .collect()
}
/// Micro-batch sizes; where weights stay on the host, those above the current one also with the
/// other op offload setting: op offload copies the host's weights once per micro-batch, so over a
/// slow link it can lose at 512 (where the op offload axis chose) and win at 2048, with a quarter
/// of the copies.
pub(super) fn vary_batch(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    let at = |ub: u32, op_offload: OpOffload| Candidate {
        op_offload,
        ..from.with_ubatch(ub)
    };
    let mut out: Vec<Candidate> = s
        .ubatch_options
        .iter()
        .map(|&ub| at(ub, from.op_offload))
        .collect();
    if host_weights(s, from) {
        for &ub in s.ubatch_options.iter().filter(|&&ub| ub > from.n_ubatch) {
            let other = s.op_offload.iter().filter(|&&o| o != from.op_offload);
            out.extend(other.map(|&o| at(ub, o)));
        }
    }
    out
}

/// The Cartesian product of the declared knob values (invalid combinations left out).
pub fn grid(s: &TuneSettings, base: &Candidate) -> Vec<Candidate> {
    let mut out = Vec::new();
    for &threads in &s.threads_options {
        for &kernels in &s.kernels {
            for &flash_attn in &s.flash_attn {
                for &t in &s.cache_types {
                    for &ub in &s.ubatch_options {
                        let c = Candidate {
                            threads,
                            kernels,
                            flash_attn,
                            type_k: t,
                            type_v: t,
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
    // Op offload only where weights stay on the host: elsewhere both settings are the same run.
    let ops = if host_weights(s, base) {
        s.op_offload.clone()
    } else {
        vec![base.op_offload]
    };
    ops.iter()
        .flat_map(|&op_offload| {
            out.iter().map(move |c| Candidate {
                op_offload,
                ..c.clone()
            })
        })
        .collect()
}
