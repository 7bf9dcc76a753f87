//! Choosing a quantization with a quality gate: find or make the other quantizations of a model
//! (its "ladder"), measure how far each one's next-token distributions drift from the most precise
//! file available (KL divergence, top-1 agreement), do the same for the KV-cache types, and pick the
//! fastest configuration whose weights and KV cache both stay under the gate.
//!
//! The parts: [`ladder`] finds the rungs beside a model (header reading only), [`make`] writes new
//! rungs with llama.cpp's quantizer, [`kld`] is the arithmetic of the comparison, [`serve`] is the
//! worker-side code that runs llama.cpp for both, [`quality`] runs and caches the evaluations,
//! [`joint`] tunes each rung (the ordinary `tune`, one child process per file) and [`choice`]
//! picks under the gate and reports.

pub mod choice;
pub mod joint;
pub mod kld;
pub mod ladder;
pub mod make;
pub mod quality;
pub mod serve;

/// The gate's default: mean KL divergence (nats per token) a weight or KV-cache quantization may add
/// over the reference. 0.05 keeps what is usually called "near lossless to good" (on 7-8B models
/// Q8_0 ≈ 0.001, Q6_K ≈ 0.005, Q5_K_M ≈ 0.01, Q4_K_M ≈ 0.03) and rejects the 3- and 2-bit types
/// (≈ 0.1-0.4), whose damage shows in everyday use. Small models suffer more from the same type.
pub const DEFAULT_MAX_KLD: f64 = 0.05;

use crate::trial::{TrialFailure, Worker};
use crate::worker::{Request, Response};
use indicatif::ProgressBar;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Sends one request to `worker` and waits, drawing the `done/total` the worker writes to
/// `progress` on `bar`; `interrupted` (set by SIGINT/SIGTERM) kills the worker and ends the wait.
pub(crate) fn call_with_progress(
    worker: &mut Worker,
    request: &Request,
    progress: &Path,
    bar: Option<&ProgressBar>,
    interrupted: &AtomicBool,
    timeout: Duration,
) -> Result<Response, TrialFailure> {
    let _ = std::fs::remove_file(progress);
    let poll = || {
        if let (Some(b), Some((done, total))) = (bar, serve::read_progress(progress)) {
            b.set_length(total.max(1));
            b.set_position(done);
        }
        interrupted.load(Ordering::Relaxed)
    };
    let result = worker.call(request, timeout, &poll);
    let _ = std::fs::remove_file(progress);
    result
}

/// A flag set by SIGINT and SIGTERM, so a long quantization or evaluation stops cleanly.
pub(crate) fn interrupt_flag() -> anyhow::Result<std::sync::Arc<AtomicBool>> {
    use anyhow::Context as _;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, std::sync::Arc::clone(&stop))
            .context("cannot install the interrupt handler")?;
    }
    Ok(stop)
}

/// A progress bar on stderr when it is a terminal and not `--quiet`.
pub(crate) fn bar(quiet: bool, template: &str) -> Option<ProgressBar> {
    use std::io::IsTerminal;
    (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        b.set_style(indicatif::ProgressStyle::with_template(template).expect("valid template"));
        b.enable_steady_tick(Duration::from_millis(200));
        b
    })
}
