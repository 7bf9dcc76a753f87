//! The axes of the coordinate descent: each knob's variants from the current best, within the
//! space the user allowed, and the full grid for `--exhaustive`.

use super::TuneSettings;
use search_space::knob::{self, Knob};
use search_space::{AttnRot, Candidate, FlashAttn, HostBuffer, KernelChoice, OpOffload};

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
    out.attn_rot = rotation(s, &out, c.attn_rot);
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

/// The rotation `c` runs with inside the user's space: where its cache is quantized, `r` when the
/// user allowed it (else the first allowed); an f16 cache is never rotated, so llama.cpp's default
/// (one spelling of one configuration).
fn rotation(s: &TuneSettings, c: &Candidate, r: AttnRot) -> AttnRot {
    match c.kv_lossy() {
        true => pick(&s.plan.attn_rot, r),
        false => AttnRot::On,
    }
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

/// One axis of the search: the descent's variants from a best along a knob of the table, and
/// the grid's values (`--exhaustive`). What a group of its variants can move (prompt, generation)
/// the knob table says from what differs among them (`search_space::knob::phases_moved`).
#[derive(Clone, Copy)]
pub(crate) struct Axis {
    /// The axis's name in progress lines, the log and "not reached" notes.
    pub name: &'static str,
    /// The descent's variants of a best along this axis.
    pub vary: Vary,
    /// The grid's values of a candidate along this axis, `None` where the grid holds the axis
    /// where the base has it (the descent varies it from the best found).
    pub grid: Option<Vary>,
}

impl Axis {
    const fn new(name: &'static str, vary: Vary) -> Axis {
        Axis {
            name,
            vary,
            grid: None,
        }
    }

    const fn in_grid(self, grid: Vary) -> Axis {
        Axis {
            grid: Some(grid),
            ..self
        }
    }
}

const OP_OFFLOAD: Axis = Axis::new("op offload", vary_op_offload).in_grid(grid_op_offload);
const HOST_BUFFER: Axis = Axis::new("host buffer", vary_host_buffer).in_grid(grid_host_buffer);
const THREADS: Axis = Axis::new("threads", vary_threads).in_grid(grid_threads);
const NUMA: Axis = Axis::new("numa", vary_numa).in_grid(grid_numa);
const PROMPT_THREADS: Axis = Axis::new("prompt threads", vary_threads_batch);
const KERNELS: Axis = Axis::new("kernels", vary_kernels).in_grid(grid_kernels);
const FLASH_ATTN: Axis = Axis::new("flash attention", vary_flash_attn).in_grid(grid_flash_attn);
const KV_CACHE: Axis = Axis::new("kv cache", vary_cache).in_grid(grid_cache);
const BATCH: Axis = Axis::new("batch", vary_batch).in_grid(grid_batch);
const ATTN_ROTATION: Axis = Axis::new("attention rotation", vary_attn_rot);
const OFFLOAD_THRESHOLD: Axis = Axis::new("op offload threshold", vary_offload_threshold);

/// The axes of the coordinate descent after the placement and the split, in order. Where layers
/// stay on the host, [`HOST_AXES`] come before the split too. The grid of `--exhaustive` is the
/// product of their grid values ([`grid`]).
pub(crate) const AXES: [Axis; 11] = [
    OP_OFFLOAD,
    HOST_BUFFER,
    THREADS,
    // Right after the threads: on several nodes the strategy can double generation.
    NUMA,
    PROMPT_THREADS,
    KERNELS,
    FLASH_ATTN,
    KV_CACHE,
    // Right after the cache: only a quantized one is rotated.
    ATTN_ROTATION,
    BATCH,
    // After the micro-batch, which sets the batches the threshold divides.
    OFFLOAD_THRESHOLD,
];

/// The axes that set how the host serves the layers it keeps, measured before the split where
/// layers stay on the host: the host's share of every token is then most of the token's time, and
/// the split moves only what the devices hold (and takes a slow model's budget: each device alone,
/// the rows, the steps). Generation threads first (every token), then where the weights live and
/// op offload (the prompt's batches). Measured again from the split's best in [`AXES`]; unchanged,
/// they cost nothing more. Threads first beat the order of [`AXES`] on `bench/vs-tuners` (the
/// figures: docs/benchmarks.md, "The figures behind the search's choices").
pub(crate) const HOST_AXES: [Axis; 3] = [THREADS, HOST_BUFFER, OP_OFFLOAD];

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
/// Flash attention's settings; on the host alone `auto` and `on` are one run, and only the one
/// `from` has is measured: llama.cpp resolves `auto` to on where every layer's device runs flash
/// attention over the cache's types (llama-context.cpp's `resolve`), and the CPU runs it over all.
pub(super) fn vary_flash_attn(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    let same_run = |f: FlashAttn| {
        !s.offload
            && f != from.flash_attn
            && f != FlashAttn::Off
            && from.flash_attn != FlashAttn::Off
    };
    (s.plan.flash_attn.iter())
        .filter(|&&f| !same_run(f))
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
            let c = Candidate {
                type_k,
                type_v,
                flash_attn,
                ..from.clone()
            };
            Candidate {
                attn_rot: rotation(s, &c, from.attn_rot),
                ..c
            }
        })
        .collect()
}
/// The rotation of a quantized cache on and off, where `from`'s cache is quantized (an f16 cache is
/// never rotated: the two would be the same run).
pub(super) fn vary_attn_rot(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    if !from.kv_lossy() || s.plan.attn_rot.len() < 2 {
        return Vec::new();
    }
    each(&s.plan.attn_rot, from, |c, r| c.attn_rot = r)
}

/// The op-offload thresholds that change where `from`'s prompt batches run: llama.cpp's (32), and
/// above each batch size the workload makes that the default offloads, but the largest, one more
/// (those batches and smaller stay on the host, the larger go to the device: the crossover
/// llama.cpp's issue 27425 asks for). Where the workload's batches are all one size (a 512-token
/// prompt at `-ub 512`), or op offload does not run (no host weights a device would take, the
/// knob off), no threshold differs from another and nothing is measured.
pub(super) fn vary_offload_threshold(s: &TuneSettings, from: &Candidate) -> Vec<Candidate> {
    let read_by = |device: &str| {
        let backend = search_space::backend::of(search_space::backend::of_device(device));
        knob::OpOffloadMinBatch.runs_on(&backend)
    };
    let devices: Vec<&str> = match from.devices.is_empty() {
        true => s.mem_budgets.offload().map(|b| b.device.as_str()).collect(),
        false => from.devices.iter().map(String::as_str).collect(),
    };
    let read = devices.into_iter().any(read_by);
    if !read || !host_weights(s, from) || !offloads_host_ops(s, from) {
        return Vec::new();
    }
    let w = &s.plan.workload;
    let mut sizes = ubatch_sizes(w.n_prompt, from.n_batch, from.n_ubatch);
    sizes.extend(ubatch_sizes(w.depth, from.n_batch, from.n_ubatch));
    let default = knob::OP_OFFLOAD_MIN_BATCH_DEFAULT;
    let Some(&largest) = sizes.iter().max() else {
        return Vec::new();
    };
    let mut thresholds = vec![default];
    thresholds.extend(
        (sizes.iter())
            .filter(|&&b| b >= default && b < largest)
            .map(|b| b + 1),
    );
    if thresholds.len() < 2 {
        return Vec::new();
    }
    each(&thresholds, from, |c, t| {
        c.op_offload_min_batch = (t != default).then_some(t)
    })
}

/// The micro-batch sizes `tokens` are decoded in: batches of `n_batch`, each cut into micro-batches
/// of `n_ubatch`.
pub(crate) fn ubatch_sizes(
    tokens: u32,
    n_batch: u32,
    n_ubatch: u32,
) -> std::collections::BTreeSet<u32> {
    let mut out = std::collections::BTreeSet::new();
    let (n_batch, n_ubatch) = (n_batch.max(1), n_ubatch.max(1));
    let mut left = tokens;
    while left > 0 {
        let batch = left.min(n_batch);
        if batch >= n_ubatch {
            out.insert(n_ubatch);
        }
        if batch % n_ubatch > 0 {
            out.insert(batch % n_ubatch);
        }
        left -= batch;
    }
    out
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

/// The Cartesian product of the declared knob values (invalid combinations left out): each axis
/// of [`AXES`] with grid values, in the grid's order (the outermost first).
pub fn grid(s: &TuneSettings, base: &Candidate) -> Vec<Candidate> {
    // Outermost first: where weights live, then the host's strategy, then the knobs every
    // configuration has. The order is the grid's measuring order before the shuffle.
    const ORDER: [Axis; 8] = [
        HOST_BUFFER,
        OP_OFFLOAD,
        NUMA,
        THREADS,
        KERNELS,
        FLASH_ATTN,
        KV_CACHE,
        BATCH,
    ];
    let mut out = vec![base.clone()];
    for axis in ORDER {
        let values = axis.grid.expect("the grid's axes have grid values");
        out = (out.iter())
            .flat_map(|c| match values(s, c) {
                v if v.is_empty() => vec![c.clone()],
                v => v,
            })
            .collect();
    }
    out.retain(|c| c.validate().is_ok());
    out
}

/// The grid's values along one knob: `c` with each value `set` puts in.
fn each<T: Copy>(values: &[T], c: &Candidate, set: impl Fn(&mut Candidate, T)) -> Vec<Candidate> {
    (values.iter())
        .map(|&v| {
            let mut c = c.clone();
            set(&mut c, v);
            c
        })
        .collect()
}

fn grid_threads(s: &TuneSettings, c: &Candidate) -> Vec<Candidate> {
    each(&s.threads_options, c, |c, t| c.threads = t)
}
fn grid_kernels(s: &TuneSettings, c: &Candidate) -> Vec<Candidate> {
    each(&s.plan.kernels, c, |c, k| c.kernels = k)
}
fn grid_flash_attn(s: &TuneSettings, c: &Candidate) -> Vec<Candidate> {
    each(&s.plan.flash_attn, c, |c, f| c.flash_attn = f)
}
fn grid_cache(s: &TuneSettings, c: &Candidate) -> Vec<Candidate> {
    each(&s.kv_pairs, c, |c, (k, v)| {
        (c.type_k, c.type_v) = (k, v);
        c.attn_rot = rotation(s, c, c.attn_rot);
    })
}
fn grid_batch(s: &TuneSettings, c: &Candidate) -> Vec<Candidate> {
    each(&s.ubatch_options, c, |c, ub| *c = c.with_ubatch(ub))
}
/// NUMA strategies only where the host computes: elsewhere they are the same run.
fn grid_numa(s: &TuneSettings, c: &Candidate) -> Vec<Candidate> {
    if !host_computes(s, c) || s.numa.len() < 2 {
        return Vec::new();
    }
    each(&s.numa, c, |c, n| c.numa = n)
}
/// Op offload and host buffers only where weights stay on the host: elsewhere their settings are
/// the same run.
fn grid_op_offload(s: &TuneSettings, c: &Candidate) -> Vec<Candidate> {
    if !host_weights(s, c) {
        return Vec::new();
    }
    each(&s.op_offload, c, |c, o| c.op_offload = o)
}
fn grid_host_buffer(s: &TuneSettings, c: &Candidate) -> Vec<Candidate> {
    if !host_weights(s, c) {
        return Vec::new();
    }
    each(&s.host_buffers, c, |c, h| c.host_buffer = h)
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
