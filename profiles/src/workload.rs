//! The workload: the server's context and the request measured, with the preset's name — what a run
//! measures, its measurement log is keyed on (without the name) and its profile records; and the
//! context of one slot of several.

use serde::{Deserialize, Serialize};

/// What is measured: the context size the server is started with, and the benchmark shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Workload {
    /// Context size the server will run with (`-c`).
    pub n_ctx: u32,
    /// Prompt tokens processed per request.
    pub n_prompt: u32,
    /// Tokens generated per request.
    pub n_gen: u32,
    /// Tokens already in the KV cache when generation is measured at depth (0 = no depth figure).
    pub depth: u32,
    /// Requests served at once (llama-server's `--parallel` slots, each with `n_ctx / n_parallel`
    /// of the context): prompt and generation rates are then those of all sequences together.
    #[serde(
        default = "crate::serde_one::one",
        skip_serializing_if = "crate::serde_one::is_one"
    )]
    pub n_parallel: u32,
    /// The preset's name, "… (adjusted)" or "custom" (empty where only the numbers matter: a
    /// measurement log's key, a request to a worker).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

impl Workload {
    /// The numbers alone: what measurements are keyed on (two presets of the same shape measure
    /// the same thing, and logs written before workloads carried names still match).
    pub fn shape(&self) -> Workload {
        Workload {
            name: String::new(),
            ..self.clone()
        }
    }
}

/// The context of one of `np` slots, as llama.cpp sizes it: `n_ctx / np`, rounded up to a multiple
/// of 256 when there are several.
pub fn slot_ctx(ctx: u32, np: u32) -> u32 {
    if np <= 1 {
        ctx
    } else {
        (ctx / np).div_ceil(256) * 256
    }
}
