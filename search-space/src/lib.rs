//! What can vary in a llama.cpp configuration (`Candidate` and its knobs), what a model file is (`gguf`)
//! and which file it is (`identity`), and how byte sizes are written by users (`size`).
//!
//! This crate knows nothing of llama.cpp at run time: it is pure data and validation, so it can be
//! tested (and fuzzed) without building llama.cpp.

pub mod backend;
pub mod candidate;
pub mod gguf;
pub mod identity;
pub mod knob;
pub mod size;
pub mod testfiles;
pub mod value;

pub use candidate::{kv_pairs, Candidate};
pub use knob::{Knob, Phases, ServerOption, Shows, Side, KNOBS};
pub use value::{
    AttnRot, CacheType, FlashAttn, HostBuffer, KernelChoice, KvOffload, Numa, OpOffload, SplitMode,
};
