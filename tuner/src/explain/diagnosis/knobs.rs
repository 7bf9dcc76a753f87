//! "Which setting mattered": for each knob, the best measured rate with each of its values, the
//! other knobs held at the winner's, and how much the best value gained over the worst.

use super::finding::measured;
use profiles::Profile;
use search_space::Candidate;
use serde::Serialize;

/// What one knob changed: among candidates that differ only in it, the best and worst value.
#[derive(Debug, Clone, Serialize)]
pub struct KnobEffect {
    pub knob: &'static str,
    pub best: String,
    pub best_s: f64,
    pub worst: String,
    pub worst_s: f64,
    /// `worst_s / best_s - 1`: how much slower a request is with the worst value.
    pub slower: f64,
    /// Values of the knob compared.
    pub values: usize,
    /// Whether the compared candidates are the winner and its neighbours along this knob (else
    /// candidates around an earlier best of the search).
    pub around_winner: bool,
    /// The winner's value, when it is not the best one (a tie broken toward less memory or the
    /// simpler configuration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winner_value: Option<String>,
}

/// The knobs of a candidate, for "which setting mattered".
#[derive(Debug, Clone, Copy)]
enum Knob {
    GpuLayers,
    Devices,
    Threads,
    ThreadsBatch,
    Kernels,
    HostBuffer,
    Numa,
    OpOffload,
    KvOffload,
    FlashAttn,
    KvCache,
    Ubatch,
    Batch,
}

const KNOBS: [Knob; 13] = [
    Knob::GpuLayers,
    Knob::Devices,
    Knob::Threads,
    Knob::ThreadsBatch,
    Knob::Kernels,
    Knob::HostBuffer,
    Knob::Numa,
    Knob::OpOffload,
    Knob::KvOffload,
    Knob::FlashAttn,
    Knob::KvCache,
    Knob::Ubatch,
    Knob::Batch,
];

impl Knob {
    fn name(self) -> &'static str {
        match self {
            Knob::GpuLayers => "GPU layers",
            Knob::Devices => "devices",
            Knob::Threads => "threads",
            Knob::ThreadsBatch => "prompt threads",
            Knob::Kernels => "kernels",
            Knob::HostBuffer => "host buffer",
            Knob::Numa => "NUMA",
            Knob::OpOffload => "op offload",
            Knob::KvOffload => "KV offload",
            Knob::FlashAttn => "flash attention",
            Knob::KvCache => "KV cache",
            Knob::Ubatch => "micro-batch",
            Knob::Batch => "batch",
        }
    }

    fn value(self, c: &Candidate) -> String {
        match self {
            Knob::GpuLayers => format!("ngl={}", c.n_gpu_layers),
            Knob::Devices if c.devices.is_empty() => "dev=default".into(),
            Knob::Devices => format!("dev={}", c.devices.join(",")),
            Knob::Threads => format!("t={}", c.threads),
            Knob::ThreadsBatch => format!("tb={}", c.batch_threads()),
            Knob::Kernels => c.kernels.to_string(),
            Knob::HostBuffer => format!("host={}", c.host_buffer),
            Knob::Numa => format!("numa={}", c.numa),
            Knob::OpOffload => format!("op-offload={}", c.op_offload),
            Knob::KvOffload => format!("kv-offload={}", c.kv_offload),
            Knob::FlashAttn => format!("fa={}", c.flash_attn),
            Knob::KvCache => format!("kv={}/{}", c.type_k, c.type_v),
            Knob::Ubatch => format!("ub={}", c.n_ubatch),
            Knob::Batch => format!("b={}", c.n_batch),
        }
    }

    /// `c` with this knob set to a fixed value: candidates equal after clearing differ only in it.
    fn cleared(self, c: &Candidate) -> Candidate {
        let mut c = c.clone();
        match self {
            Knob::GpuLayers => c.n_gpu_layers = 0,
            Knob::Devices => c.devices.clear(),
            // The prompt's threads held, as the search's threads axis holds them.
            Knob::Threads => {
                c.threads_batch = Some(c.batch_threads());
                c.threads = 0;
            }
            Knob::ThreadsBatch => c.threads_batch = None,
            Knob::Kernels => c.kernels = search_space::KernelChoice::Repack,
            Knob::HostBuffer => c.host_buffer = search_space::HostBuffer::Mapped,
            Knob::Numa => c.numa = search_space::Numa::Off,
            Knob::OpOffload => c.op_offload = search_space::OpOffload::On,
            Knob::KvOffload => c.kv_offload = search_space::KvOffload::On,
            Knob::FlashAttn => c.flash_attn = search_space::FlashAttn::Auto,
            Knob::KvCache => {
                c.type_k = search_space::CacheType::F16;
                c.type_v = search_space::CacheType::F16;
            }
            Knob::Ubatch => c.n_ubatch = 0,
            Knob::Batch => c.n_batch = 0,
        }
        c
    }
}

/// For each knob varied in the run, its best and worst value among candidates that differ only in
/// it: around the winner when the run measured such neighbours, else around the base with the most
/// values measured (coordinate descent varies each knob from the best found so far, so a knob tried
/// before a later change has neighbours of an earlier best, not of the winner). Most effect first.
pub fn knob_effects(profile: &Profile) -> Vec<KnobEffect> {
    let mut out: Vec<KnobEffect> = KNOBS
        .into_iter()
        // On one node llama.cpp runs every NUMA strategy as off: what differs is noise.
        .filter(|knob| !matches!(knob, Knob::Numa) || profile.machine.numa_nodes > 1)
        .filter_map(|knob| {
            let value = |c: &Candidate| knob.value(c);
            knob_effect(profile, knob, |c| knob.cleared(c), value)
                .or_else(|| match knob {
                    // A grid (or an earlier profile) varies both thread counts together.
                    Knob::Threads => {
                        let key = |c: &Candidate| Candidate {
                            threads: 0,
                            threads_batch: None,
                            ..c.clone()
                        };
                        knob_effect(profile, knob, key, value)
                    }
                    _ => None,
                })
                .map(|(effect, _)| effect)
        })
        .collect();
    out.extend(
        FIT_LEVERS
            .into_iter()
            .filter_map(|(knob, name)| lever_effect(profile, knob, name)),
    );
    out.sort_by(|a, b| b.slower.total_cmp(&a.slower));
    out
}

/// The settings that shrink what a device must hold, so that more layers fit: each is also compared
/// with the GPU layers it lets fit, since the search measures a lever at its most layers. On an H200
/// with half the memory full offload needs, `kv=q4_0/q4_0` at ngl=17 against `kv=f16/f16` at its 15
/// was a 24% faster request; no two candidates there differed in the KV cache alone.
const FIT_LEVERS: [(Knob, &str); 3] = [
    (Knob::KvCache, "KV cache with the layers it fits"),
    (Knob::Ubatch, "micro-batch with the layers it fits"),
    (Knob::KvOffload, "KV offload with the layers it fits"),
];

/// A fit lever's effect: candidates that differ in `knob` and the GPU layers, each of the knob's
/// values at its best measured layer count. Only where those counts differ (else the knob alone
/// says the same).
fn lever_effect(profile: &Profile, knob: Knob, name: &'static str) -> Option<KnobEffect> {
    let key = |c: &Candidate| Candidate {
        n_gpu_layers: 0,
        ..knob.cleared(c)
    };
    let label = |c: &Candidate| format!("{} ngl={}", knob.value(c), c.n_gpu_layers);
    let (mut effect, [best, worst]) = knob_effect(profile, knob, key, label)?;
    if best == worst {
        return None;
    }
    effect.knob = name;
    Some(effect)
}

/// One measured value of a knob in a group: its value, how it is shown (with the GPU layers when the
/// group varies them too), and the best request time measured with it, at `layers`.
struct Value {
    value: String,
    label: String,
    score_s: f64,
    layers: u32,
}

/// `knob`'s effect among candidates equal under `key` (which clears the knob, and may clear the GPU
/// layers too: each value then counts at its best layer count), each value shown by `label`; with
/// the GPU layers of the best and the worst value.
fn knob_effect(
    profile: &Profile,
    knob: Knob,
    key: impl Fn(&Candidate) -> Candidate,
    label: impl Fn(&Candidate) -> String,
) -> Option<(KnobEffect, [u32; 2])> {
    let mut groups: Vec<(Candidate, Vec<Value>)> = Vec::new();
    for (e, f) in measured(profile) {
        let key = key(&e.candidate);
        let v = Value {
            value: knob.value(&e.candidate),
            label: label(&e.candidate),
            score_s: f.score_s,
            layers: e.candidate.n_gpu_layers,
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, vs)) => match vs.iter_mut().find(|x| x.value == v.value) {
                Some(x) if v.score_s < x.score_s => *x = v,
                Some(_) => {}
                None => vs.push(v),
            },
            None => groups.push((key, vec![v])),
        }
    }
    let winner_key = key(&profile.winner);
    let chosen = groups
        .iter()
        .find(|(k, v)| *k == winner_key && v.len() > 1)
        .map(|g| (g, true))
        .or_else(|| {
            groups
                .iter()
                .filter(|(_, v)| v.len() > 1)
                .max_by(|a, b| {
                    a.1.len()
                        .cmp(&b.1.len())
                        .then(best_of(&b.1).total_cmp(&best_of(&a.1)))
                })
                .map(|g| (g, false))
        });
    let ((_, values), around_winner) = chosen?;
    let best = values
        .iter()
        .min_by(|a, b| a.score_s.total_cmp(&b.score_s))
        .expect("two values");
    let worst = values
        .iter()
        .max_by(|a, b| a.score_s.total_cmp(&b.score_s))
        .expect("two values");
    let winner_value = knob.value(&profile.winner);
    let effect = KnobEffect {
        knob: knob.name(),
        best: best.label.clone(),
        best_s: best.score_s,
        worst: worst.label.clone(),
        worst_s: worst.score_s,
        slower: worst.score_s / best.score_s.max(1e-12) - 1.0,
        values: values.len(),
        around_winner,
        winner_value: (around_winner && winner_value != best.value).then_some(winner_value),
    };
    Some((effect, [best.layers, worst.layers]))
}

fn best_of(values: &[Value]) -> f64 {
    values
        .iter()
        .map(|v| v.score_s)
        .fold(f64::INFINITY, f64::min)
}
