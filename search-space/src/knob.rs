//! llama.cpp's knobs, each defined once: its name, llama.cpp's default, the side it sets, how
//! llama-server is told (a flag or an environment variable), its leaderboard label, the line
//! `explain` uses, whether it is lossy, which phases it can move and which backends run it.
//!
//! ripgrep's shape (`crates/core/flags/defs.rs`): a unit type per knob implementing [`Knob`], and
//! one slice, [`KNOBS`], from which every list is made: llama-server's argv and the environment it
//! needs, the leaderboard label, the model key a worker is keyed by, how far a candidate is from
//! llama.cpp's defaults, what differs between two candidates (and so which phases a measurement must
//! cover), explain's knob findings and `measure`'s value lists. A new knob is a unit type here, a
//! field of [`Candidate`], and its entry in [`KNOBS`]: `docs/architecture.md`'s recipe.

use crate::backend::Backend;
use crate::candidate::Candidate;
use crate::value::{
    AttnRot, CacheType, FlashAttn, HostBuffer, KernelChoice, KvOffload, Numa, OpOffload,
    ParseKnobError, SplitMode,
};

/// When a knob takes effect, which is what a change of it costs to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Read once per process (at backend registration or before the first load): a new worker.
    Process,
    /// Read when the model loads: a new load.
    Model,
    /// Read when a context is created: a new context on the loaded model.
    Context,
}

/// The phases of a request a knob can change the speed of: prompt processing (batches of many
/// tokens), generation (one token per step for each sequence), or both. Also what a repetition
/// timed (the rest of its figures borrowed: `profiles::measurements::Repetition::timed`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Phases {
    pub prompt: bool,
    pub generation: bool,
}

impl Phases {
    pub const NONE: Phases = Phases {
        prompt: false,
        generation: false,
    };
    pub const PROMPT: Phases = Phases {
        prompt: true,
        generation: false,
    };
    pub const GENERATION: Phases = Phases {
        prompt: false,
        generation: true,
    };
    pub const BOTH: Phases = Phases {
        prompt: true,
        generation: true,
    };

    /// Both phases (serde's default: what a repetition timed before phases were chosen).
    pub fn both() -> Phases {
        Phases::BOTH
    }

    pub fn is_both(&self) -> bool {
        *self == Phases::BOTH
    }

    pub fn union(self, other: Phases) -> Phases {
        Phases {
            prompt: self.prompt || other.prompt,
            generation: self.generation || other.generation,
        }
    }
}

/// The shortest request on which a knob's effect on speed shows: what the search may screen a
/// change of it on ([`shows_on_short`]). Generation is screened on a few generated tokens whatever
/// the knob: a token generated is a batch of one at the depth the workload sets, and its rate over
/// 32 tokens is its rate over 128 (the depth, where there is one, is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shows {
    /// On one micro-batch of the prompt: it changes each micro-batch alike (thread counts, the CPU
    /// kernels, a NUMA strategy).
    OnShortPrompt,
    /// Only on the workload's whole prompt: it changes how the prompt is cut into micro-batches,
    /// what attention over it costs, or what a batch sends to a device (batch sizes, flash
    /// attention, the KV cache, op offload, the placement).
    OnWholePrompt,
}

/// One llama-server option: its flag, its long name (the key in a `--models-preset` file) and its
/// value (`None` for a flag that takes none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerOption {
    pub short: &'static str,
    pub long: &'static str,
    pub value: Option<String>,
}

impl ServerOption {
    pub fn with_value(short: &'static str, long: &'static str, value: impl ToString) -> Self {
        ServerOption {
            short,
            long,
            value: Some(value.to_string()),
        }
    }

    pub fn flag(short: &'static str, long: &'static str) -> Self {
        ServerOption {
            short,
            long,
            value: None,
        }
    }
}

/// The whole numbers a counted knob may take, both ends included, and the field of [`Candidate`]
/// (a profile's `[winner]` key) its value is kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub field: &'static str,
    pub min: u32,
    pub max: u32,
}

impl Bounds {
    pub const fn new(field: &'static str, min: u32, max: u32) -> Self {
        Bounds { field, min, max }
    }

    pub fn contains(&self, v: u32) -> bool {
        (self.min..=self.max).contains(&v)
    }
}

/// A counted knob whose value lies outside its row's [`Bounds`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be between {} and {} (found {value})", bounds.min, bounds.max)]
pub struct OutOfBounds {
    pub knob: &'static str,
    pub bounds: Bounds,
    pub value: u32,
}

/// One llama.cpp knob. The defaults of the optional methods fit most knobs; a knob overrides what
/// differs.
pub trait Knob: Sync {
    /// The knob's name in reports, the search's axes and explain ("flash attention").
    fn name(&self) -> &'static str;
    /// The short key its value is shown with (`t` in `t=2`); empty: the value alone (`repack`).
    fn key(&self) -> &'static str;
    /// When a change of it takes effect.
    fn side(&self) -> Side;
    /// llama.cpp's default, written as [`Knob::value`] writes it; `None` where it depends on the
    /// machine (threads, GPU layers).
    fn default(&self) -> Option<&'static str>;
    /// The values it takes by name (`measure`'s value lists); empty for a number or a list.
    fn choices(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// The phases of a request a change of it can speed up or slow down.
    fn moves(&self) -> Phases;
    /// The shortest prompt its effect shows on ([`Shows`]).
    fn shows(&self) -> Shows {
        Shows::OnWholePrompt
    }
    /// Whether `backend`'s devices read it (the backend facts' table says what each runs).
    fn runs_on(&self, _backend: &Backend) -> bool {
        true
    }
    /// One line on what it does, for `explain` and the docs.
    fn explain(&self) -> &'static str;
    /// Where a counted knob's value must lie (`None`: its values are named, or a list): what a
    /// profile read from a file is held to before its value reaches llama.cpp.
    fn bounds(&self) -> Option<Bounds> {
        None
    }
    /// `c`'s value, written as llama.cpp writes it.
    fn value(&self, c: &Candidate) -> String;
    /// `c` with this knob set to `v` (written as [`Knob::value`] writes it, or as llama.cpp's flag
    /// takes it).
    fn set(&self, c: &mut Candidate, v: &str) -> Result<(), ParseKnobError>;
    /// Whether `c` has llama.cpp's default (a knob whose default depends on the machine: yes).
    fn is_default(&self, c: &Candidate) -> bool {
        self.default().is_none_or(|d| self.value(c) == d)
    }
    /// `c` with this knob at llama.cpp's default; where that depends on the machine, at 0: a
    /// neutral value, so that candidates equal after a reset differ only in this knob.
    fn reset(&self, c: &mut Candidate) {
        let d = self.default().unwrap_or("0");
        self.set(c, d)
            .expect("a knob's default is one of its values");
    }
    /// Whether `c`'s value changes the model's output (so it wins only inside the quality gate).
    fn lossy(&self, _c: &Candidate) -> bool {
        false
    }
    /// The llama-server options `c`'s value is passed as (none where it is passed otherwise).
    fn server(&self, _c: &Candidate) -> Vec<ServerOption> {
        Vec::new()
    }
    /// The environment variable this knob is passed as, and `c`'s value for it (`None`: unset, so
    /// that a value the user's shell holds does not leak into a run that means llama.cpp's default).
    fn env(&self, _c: &Candidate) -> Option<(&'static str, Option<String>)> {
        None
    }
    /// Its piece of the leaderboard's label (`None`: shown by another knob's piece, or not at all
    /// at this value).
    fn label(&self, c: &Candidate) -> Option<String>;
}

/// Every knob, in the order llama-server's argv lists them (the order stored profiles were written
/// in, which their check compares word for word). [`LABEL_ORDER`] is the leaderboard's.
pub static KNOBS: [&dyn Knob; 19] = [
    &Threads,
    &ThreadsBatch,
    &Batch,
    &Ubatch,
    &KvCache,
    &Flash,
    &GpuLayers,
    &CpuFfn,
    &CpuMoe,
    &Kernels,
    &Host,
    &KvOffloadKnob,
    &OpOffloadKnob,
    &Devices,
    &TensorSplit,
    &Split,
    &NumaKnob,
    &OpOffloadMinBatch,
    &AttnRotation,
];

/// The leaderboard label's order, by knob name: placement first, then what the host does.
pub static LABEL_ORDER: [&str; 19] = [
    "GPU layers",
    "experts on the host",
    "FFNs on the host",
    "devices",
    "tensor split",
    "split mode",
    "threads",
    "prompt threads",
    "batch",
    "micro-batch",
    "KV cache",
    "flash attention",
    "kernels",
    "host buffer",
    "KV offload",
    "op offload",
    "NUMA",
    "op offload threshold",
    "attention rotation",
];

/// The knob named `name` (as [`Knob::name`] says it).
pub fn by_name(name: &str) -> Option<&'static dyn Knob> {
    KNOBS.iter().copied().find(|k| k.name() == name)
}

/// The knobs whose values differ between `a` and `b`.
pub fn differing<'c>(
    a: &'c Candidate,
    b: &'c Candidate,
) -> impl Iterator<Item = &'static dyn Knob> + 'c {
    KNOBS
        .iter()
        .copied()
        .filter(move |k| k.value(a) != k.value(b))
}

/// The phases a difference between any two of `cs` can move: what a measurement comparing them
/// must cover.
pub fn phases_moved(cs: &[Candidate]) -> Phases {
    let mut out = Phases::NONE;
    for (i, a) in cs.iter().enumerate() {
        for b in &cs[i + 1..] {
            for k in differing(a, b) {
                out = out.union(k.moves());
            }
        }
    }
    out
}

/// Whether every difference between any two of `cs` shows on a short prompt ([`Shows`]): what a
/// screen comparing them may shorten the prompt to.
pub fn shows_on_short(cs: &[Candidate]) -> bool {
    cs.iter().enumerate().all(|(i, a)| {
        (cs[i + 1..].iter()).all(|b| differing(a, b).all(|k| k.shows() == Shows::OnShortPrompt))
    })
}

/// `c` with every knob that changes the model's output at its lossless setting (llama.cpp's
/// default) and every other knob as `c` has it: the lossless twin a lossy winner is measured beside.
/// (Every knob lossy in `c` is reset, not in turn: the rotation of a quantized cache is lossy only
/// beside that cache.)
pub fn lossless_twin(c: &Candidate) -> Candidate {
    let mut twin = c.clone();
    for k in KNOBS.iter().filter(|k| k.lossy(c)) {
        k.reset(&mut twin);
    }
    twin
}

/// The values of the knobs that need a new worker or a new load: candidates equal in it share a
/// loaded model.
pub fn model_key(c: &Candidate) -> Vec<String> {
    KNOBS
        .iter()
        .filter(|k| k.side() != Side::Context)
        .map(|k| k.value(c))
        .collect()
}

/// The environment `c` needs, every environment knob's variable with its value (`None`: unset).
pub fn environment(c: &Candidate) -> Vec<(&'static str, Option<String>)> {
    KNOBS.iter().filter_map(|k| k.env(c)).collect()
}

/// The environment variables `c` sets (those at llama.cpp's default left out): what a server
/// started with `c` needs beside its argv.
pub fn environment_set(c: &Candidate) -> Vec<(&'static str, String)> {
    environment(c)
        .into_iter()
        .filter_map(|(name, v)| v.map(|v| (name, v)))
        .collect()
}

/// The environment variables `c` sets among the knobs of `side` (a worker sets a process's when
/// it starts, a context's before the context is made).
pub fn environment_of(c: &Candidate, side: Side) -> Vec<(String, String)> {
    (KNOBS.iter().filter(|k| k.side() == side))
        .filter_map(|k| k.env(c))
        .filter_map(|(name, v)| v.map(|v| (name.to_string(), v)))
        .collect()
}

/// `c` with each knob of `side` that is passed in the environment set as `env` says (a variable
/// absent: the value that leaves it unset), the inverse of [`environment_of`]: the knob takes the
/// one of its choices, its default or the variable's own value (a number is passed as itself)
/// whose variable reads as `env`'s does.
pub fn set_from_environment(c: &mut Candidate, side: Side, env: &[(String, String)]) {
    for k in KNOBS.iter().filter(|k| k.side() == side) {
        let Some((name, _)) = k.env(c) else { continue };
        let want = (env.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str());
        let mut tries: Vec<&str> = k.choices();
        tries.extend(k.default());
        tries.extend(want);
        let found = tries.into_iter().find_map(|v| {
            let mut tried = c.clone();
            k.set(&mut tried, v).ok()?;
            let read = k.env(&tried).and_then(|(_, v)| v);
            (read.as_deref() == want).then_some(tried)
        });
        if let Some(found) = found {
            *c = found;
        }
    }
}

/// Every variable the knobs of `side` are passed in: what a worker unsets where a run does not set
/// it, so that the user's shell cannot change what a measurement means.
pub fn environment_names(side: Side) -> Vec<&'static str> {
    let d = llama_defaults(1, 0);
    (KNOBS.iter().filter(|k| k.side() == side))
        .filter_map(|k| k.env(&d))
        .map(|(name, _)| name)
        .collect()
}

/// The first of `c`'s counted knobs, in [`KNOBS`]' order, whose value lies outside its row's
/// [`Bounds`]: what a candidate read from a file must not carry to llama.cpp.
pub fn check_bounds(c: &Candidate) -> Result<(), OutOfBounds> {
    for k in KNOBS.iter() {
        let Some(bounds) = k.bounds() else { continue };
        let value: u32 = (k.value(c).parse()).expect("a counted knob's value is its number");
        if !bounds.contains(value) {
            return Err(OutOfBounds {
                knob: k.name(),
                bounds,
                value,
            });
        }
    }
    Ok(())
}

/// Whether any of `c`'s knobs changes the model's output.
pub fn lossy(c: &Candidate) -> bool {
    KNOBS.iter().any(|k| k.lossy(c))
}

/// How many knobs differ from llama.cpp's defaults (knobs whose default depends on the machine
/// left out): ties are broken toward the simpler configuration.
pub fn changed_from_defaults(c: &Candidate) -> u32 {
    KNOBS.iter().filter(|k| !k.is_default(c)).count() as u32
}

/// The leaderboard label, e.g. `ngl=0 t=2 b=2048/512 kv=f16/f16 fa=auto repack`.
pub fn label(c: &Candidate) -> String {
    let pieces = LABEL_ORDER
        .iter()
        .filter_map(|name| by_name(name).and_then(|k| k.label(c)));
    pieces.collect::<Vec<_>>().join(" ")
}

/// llama-server's options for `c`'s knobs, in [`KNOBS`]'s order.
pub fn server_options(c: &Candidate) -> Vec<ServerOption> {
    KNOBS.iter().flat_map(|k| k.server(c)).collect()
}

/// llama.cpp's defaults for a context on this machine: what a user gets without tuning
/// (`llama-server -m model.gguf -t THREADS`), every knob at its table default.
pub fn llama_defaults(threads: u32, n_gpu_layers: u32) -> Candidate {
    let mut c = Candidate::blank(threads, n_gpu_layers);
    for k in KNOBS.iter() {
        if let Some(d) = k.default() {
            k.set(&mut c, d)
                .expect("a knob's default is one of its values");
        }
    }
    c
}

/// What the table says of a candidate, as its methods: the candidate is data the knobs read, so
/// these live with the table and `candidate.rs` needs nothing from it.
impl Candidate {
    /// llama.cpp's defaults for a context on this machine: what a user gets without tuning
    /// (`llama-server -m model.gguf -t THREADS`), the baseline every result is compared with. The
    /// knob table's defaults ([`llama_defaults`]).
    pub fn llama_default(threads: u32, n_gpu_layers: u32) -> Self {
        crate::knob::llama_defaults(threads, n_gpu_layers)
    }

    /// The settings that need a new worker or a model (re)load: candidates equal in this key share
    /// a loaded model ([`model_key`]).
    pub fn model_key(&self) -> Vec<String> {
        model_key(self)
    }

    /// A short human label, e.g. `ngl=0 t=2 b=2048/512 kv=f16/f16 fa=auto repack`: each knob's
    /// piece ([`label`]).
    pub fn label(&self) -> String {
        label(self)
    }

    /// How far this candidate is from llama.cpp's defaults (number of knobs changed): ties are broken
    /// toward the simpler configuration.
    pub fn complexity(&self) -> u32 {
        changed_from_defaults(self)
    }
}

fn parse<T: std::str::FromStr<Err = ParseKnobError>>(v: &str) -> Result<T, ParseKnobError> {
    v.parse()
}

fn number(what: &'static str, v: &str) -> Result<u32, ParseKnobError> {
    v.trim().parse().map_err(|_| ParseKnobError {
        what,
        value: v.to_string(),
        expected: "a whole number".into(),
    })
}

fn numbers(what: &'static str, v: &str) -> Result<Vec<u32>, ParseKnobError> {
    if v.trim().is_empty() {
        return Ok(Vec::new());
    }
    v.split([',', '/']).map(|p| number(what, p)).collect()
}

fn names(v: &str) -> Vec<String> {
    (v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

// ---- the knobs ----

mod defs;
pub use defs::*;

#[cfg(test)]
mod tests;
