//! The workload a profile was tuned for, as it records it: the server's context and the request
//! measured, with the preset's name; and the context of one slot of several.

use serde::{Deserialize, Serialize};

/// What was measured: the context size the server is started with, and the benchmark shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    pub n_ctx: u32,
    pub n_prompt: u32,
    pub n_gen: u32,
    /// Tokens already in the context when generation at depth is measured.
    pub depth: u32,
    /// Requests served at once (`--parallel`); the figures are then those of all of them together.
    #[serde(
        default = "crate::serde_one::one",
        skip_serializing_if = "crate::serde_one::is_one"
    )]
    pub n_parallel: u32,
    pub name: String,
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
