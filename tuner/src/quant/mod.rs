//! Choosing a quantization with a quality gate: find or make the other quantizations of a model
//! (its "ladder"), measure how far each one's next-token distributions drift from the most precise
//! file available (KL divergence, top-1 agreement), do the same for the KV-cache types, and pick the
//! fastest configuration whose weights and KV cache both stay under the gate.
//!
//! The parts: [`ladder`] finds the rungs beside a model (header reading only), [`make`] writes new
//! rungs with llama.cpp's quantizer, [`kld`] is the arithmetic of the comparison, [`serve`] is the
//! worker-side code that runs llama.cpp for both, [`quality`] runs and caches the evaluations
//! ([`windows`] cuts the text into them), [`checks`] and [`retrieval`] check a profile's output
//! (the f16 reference's greedy tokens, facts retrieved from deep in a full context),
//! `tuning::joint` tunes each rung (like `tune`, in this process, one file at a time) and [`choice`]
//! picks under the gate and reports.

pub mod checks;
pub mod choice;
pub mod kld;
pub mod ladder;
pub mod make;
pub mod quality;
pub mod retrieval;
pub mod serve;
pub mod windows;

/// The gate's default: mean KL divergence (nats per token) a weight or KV-cache quantization may add
/// over the reference. 0.05 keeps what is usually called "near lossless to good" (on 7-8B models
/// Q8_0 ≈ 0.001, Q6_K ≈ 0.005, Q5_K_M ≈ 0.01, Q4_K_M ≈ 0.03) and rejects the 3- and 2-bit types
/// (≈ 0.1-0.4), whose damage shows in everyday use. Small models suffer more from the same type.
pub const DEFAULT_MAX_KLD: f64 = 0.05;

use crate::measuring::TrialFailure;
use crate::worker::Worker;
use crate::worker::{Request, Response};
use indicatif::ProgressBar;
use std::path::Path;
use std::time::Duration;

/// Sends one request to `worker` and waits, drawing the `done/total` the worker writes to
/// `progress` on `bar`; `interrupted` (true after SIGINT/SIGTERM) kills the worker and ends the wait.
pub(crate) fn call_with_progress(
    worker: &mut Worker,
    request: &Request,
    progress: &Path,
    bar: Option<&ProgressBar>,
    interrupted: &dyn Fn() -> bool,
    timeout: Duration,
) -> Result<Response, TrialFailure> {
    let _ = std::fs::remove_file(progress);
    let poll = || {
        if let (Some(b), Some((done, total))) = (bar, serve::read_progress(progress)) {
            b.set_length(total.max(1));
            b.set_position(done);
        }
        interrupted()
    };
    let result = worker.call(request, timeout, &poll);
    let _ = std::fs::remove_file(progress);
    result
}
