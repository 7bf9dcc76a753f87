//! The worker side of quantizing and of quality evaluation: what `autotune __worker` does for a
//! [`QuantizeRequest`] or a [`QualityRequest`]. Both run llama.cpp code that aborts the process on
//! some failures (a tensor it cannot convert, an allocation that fails), which is why they run in the
//! worker: the parent records the crash as that rung's outcome and goes on.
//!
//! Progress travels through a small file the parent names in the request (`done/total`), read by the
//! parent while it waits, so the one-line-per-request protocol stays as it is.

use super::kld::{self, Accumulator};
use super::windows::Window;
use crate::llama::{self, Context, ContextSettings, Model, ModelSettings};
use crate::worker::protocol::Response;
pub use crate::worker::protocol::{
    QualityAnswer, QualityJob, QualityRequest, QuantizeAnswer, QuantizeRequest,
};
use rayon::prelude::*;
use search_space::{AttnRot, CacheType, Candidate};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn failed(stage: &str, message: impl Into<String>) -> Response {
    Response::Failed {
        stage: stage.into(),
        message: message.into(),
    }
}

fn write_progress(path: &Option<PathBuf>, done: u64, total: u64) {
    if let Some(p) = path {
        let _ = std::fs::write(p, format!("{done}/{total}"));
    }
}

/// Reads a progress file written by the worker: `(done, total)`.
pub fn read_progress(path: &Path) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(path).ok()?;
    let (a, b) = s.trim().split_once('/')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// `[  12/ 236] blk.0.attn_k.weight …` → (12, 236): llama.cpp's per-tensor quantize log line.
fn tensor_progress(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim_start().strip_prefix('[')?;
    let (inside, _) = rest.split_once(']')?;
    let (a, b) = inside.split_once('/')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

pub fn quantize(q: &QuantizeRequest) -> Response {
    let done = Arc::new(AtomicBool::new(false));
    let kept: Arc<Mutex<Vec<String>>> = Arc::default();
    llama::take_log();
    let watcher = {
        let (done, kept, progress) = (Arc::clone(&done), Arc::clone(&kept), q.progress.clone());
        std::thread::spawn(move || {
            let mut last = None;
            loop {
                let finished = done.load(Ordering::Relaxed);
                let lines = llama::take_log();
                if let Some(p) = lines.iter().rev().find_map(|l| tensor_progress(l)) {
                    if last != Some(p) {
                        write_progress(&progress, p.0, p.1);
                        last = Some(p);
                    }
                }
                if let Ok(mut k) = kept.lock() {
                    k.extend(lines);
                    let excess = k.len().saturating_sub(400);
                    k.drain(..excess);
                }
                if finished {
                    break;
                }
                std::thread::sleep(Duration::from_millis(150));
            }
        })
    };
    let t = Instant::now();
    let result = llama::quantize_model(&q.src, &q.dst, q.ftype, q.allow_requantize, q.threads);
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    match result {
        Ok(()) => Response::Quantized(QuantizeAnswer {
            seconds: t.elapsed().as_secs_f64(),
        }),
        Err(e) => {
            let log = kept.lock().map(|k| k.clone()).unwrap_or_default();
            let tail = llama::log_tail(&log);
            failed("quantize", if tail.is_empty() { e } else { tail })
        }
    }
}

thread_local! {
    /// The reference stays loaded between requests (the worker answers them on one thread): a
    /// ladder is compared against one reference. With it, whether it fell back to the CPU.
    static REFERENCE: std::cell::RefCell<Option<(Placed, Arc<Model>, bool)>> = const { std::cell::RefCell::new(None) };
}

/// The model with `n_gpu_layers` on `devices`, and whether it fell back to the CPU.
fn load(path: &Path, n_gpu_layers: u32, devices: &[String]) -> Result<(Arc<Model>, bool), String> {
    let settings = |ngl, devices: &[String]| ModelSettings {
        n_gpu_layers: ngl,
        devices: devices.to_vec(),
        ..Default::default()
    };
    match Model::load(path, &settings(n_gpu_layers, devices)) {
        Ok(m) => Ok((Arc::new(m), false)),
        // Offloading may not fit (two models at once): the CPU alone gives the same figures, slower.
        Err(_) if n_gpu_layers > 0 => Model::load(path, &settings(0, &[llama::NO_DEVICE.into()]))
            .map(|m| (Arc::new(m), true))
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// A file as it was asked to be placed: layers offloaded, and to which devices.
type Placed = (PathBuf, u32, Vec<String>);

/// The reference, loaded as asked or kept from the request before where that asked the same (the
/// same file on the CPU after a request on the devices is another model).
fn reference(
    path: &Path,
    n_gpu_layers: u32,
    devices: &[String],
) -> Result<(Arc<Model>, bool), String> {
    let asked: Placed = (path.to_path_buf(), n_gpu_layers, devices.to_vec());
    REFERENCE.with(|slot| {
        let mut slot = slot.borrow_mut();
        if let Some((p, m, fell_back)) = slot.as_ref() {
            if *p == asked {
                return Ok((Arc::clone(m), *fell_back));
            }
        }
        *slot = None;
        let (m, fell_back) = load(path, n_gpu_layers, devices)?;
        *slot = Some((asked, Arc::clone(&m), fell_back));
        Ok((m, fell_back))
    })
}

/// A job's state in a batch: its model, its accumulated figures and its time, or why it failed.
struct JobState {
    model: Option<Arc<Model>>,
    acc: Accumulator,
    /// Each window's mean KL divergence, for [`kld::decided`].
    window_means: Vec<f64>,
    seconds: f64,
    error: Option<String>,
}

/// Answers a [`QualityRequest`]: loads the reference and each job's model, then compares their
/// logits chunk by chunk over the text and answers with each job's figures. A context the devices
/// cannot hold fails the request at its start (the evaluator asks again on the CPU).
pub fn quality(q: &QualityRequest) -> Response {
    compare(q).map_or_else(|r| r, Response::Quality)
}

/// [`quality`], its failure the worker's answer.
fn compare(q: &QualityRequest) -> Result<QualityAnswer, Response> {
    let fail = |stage: &str, e: String| failed(stage, e);
    let (reference, cpu_fallback) = reference(&q.reference, q.n_gpu_layers, &q.devices)
        .map_err(|e| fail("load", format!("reference {}: {e}", q.reference.display())))?;
    // Where the reference fell back to the CPU, its jobs are compared there too.
    let n_gpu_layers = if cpu_fallback { 0 } else { q.n_gpu_layers };
    let mut jobs = load_jobs(q, &reference, n_gpu_layers);
    let unfit = |e: llama::LlamaError| fail("context", e.to_string());
    let mut ref_ctx = chunk_context(&reference, (CacheType::F16, CacheType::F16), q, AttnRot::On)
        .map_err(unfit)?;
    // Each job's context beside the reference's, as the comparison holds them: one that does not
    // fit the devices fails the request (to be asked again on the CPU), not that job alone.
    for (job, spec) in jobs.iter().zip(&q.jobs) {
        if let Some(m) = job.model.as_ref().filter(|_| n_gpu_layers > 0) {
            drop(chunk_context(m, job_kv(spec), q, q.attn_rot).map_err(unfit)?);
        }
    }
    let tokens = (reference.tokenize(&q.text)).map_err(|e| fail("tokenize", e))?;
    let bos = reference
        .add_bos()
        .then(|| reference.bos())
        .filter(|&b| b >= 0);
    // With `scored`, each window's first tokens only fill the cache: the figures are those of the
    // positions at its end, at the depth a request reaches.
    let windows = super::windows::windows(
        &tokens,
        bos,
        q.n_ctx.max(16) as usize,
        q.scored.map(|s| s as usize),
        q.max_tokens.map(|m| m as usize),
    );
    let total = (windows.len() * jobs.len()) as u64;
    let mut done = 0;
    for (k, window) in windows.iter().enumerate() {
        let progress = |j: usize| write_progress(&q.progress, (k * q.jobs.len() + j) as u64, total);
        compare_chunk(q, &mut jobs, &mut ref_ctx, window, progress)
            .map_err(|e| fail("decode", format!("reference: {e}")))?;
        done = k + 1;
        if q.decide_at.is_some_and(|gate| all_decided(&jobs, gate)) {
            break;
        }
    }
    let windows = &windows[..done];
    write_progress(&q.progress, total, total);
    let window_means = jobs.iter().map(|j| j.window_means.clone()).collect();
    Ok(QualityAnswer {
        results: jobs
            .into_iter()
            .map(|j| match j.error {
                Some(e) => Err(e),
                None => Ok((j.acc.finish(), j.seconds)),
            })
            .collect(),
        tokens: (windows.iter())
            .map(|w| (w.input.len() - usize::from(bos.is_some())) as u64)
            .sum(),
        text_tokens: tokens.len() as u64,
        chunks: windows.len() as u32,
        cpu_fallback,
        window_means,
    })
}

/// A job's K and V cache types.
fn job_kv(spec: &crate::worker::protocol::QualityJob) -> (CacheType, CacheType) {
    (spec.kv, spec.kv_v.unwrap_or(spec.kv))
}

/// Whether every job still evaluated has its verdict against `gate` ([`kld::decided`]); a job that
/// failed has nothing more to say.
fn all_decided(jobs: &[JobState], gate: f64) -> bool {
    (jobs.iter())
        .filter(|j| j.error.is_none())
        .all(|j| kld::decided(&j.window_means, gate))
}

/// Each job's model (the reference itself where the job names it), timed; a model that does not
/// load is that job's failure.
fn load_jobs(q: &QualityRequest, reference: &Arc<Model>, n_gpu_layers: u32) -> Vec<JobState> {
    q.jobs
        .iter()
        .map(|j| {
            let t = Instant::now();
            let model = if j.model == q.reference {
                Ok(Arc::clone(reference))
            } else {
                load(&j.model, n_gpu_layers, &q.devices).map(|(m, _)| m)
            };
            let seconds = t.elapsed().as_secs_f64();
            match model {
                Ok(m) => JobState {
                    model: Some(m),
                    acc: Accumulator::default(),
                    window_means: Vec::new(),
                    seconds,
                    error: None,
                },
                Err(e) => JobState {
                    model: None,
                    acc: Accumulator::default(),
                    window_means: Vec::new(),
                    seconds,
                    error: Some(e),
                },
            }
        })
        .collect()
}

/// A context that decodes a whole chunk of `q` in one batch, with these K and V cache types, `q`'s
/// flash attention and cache placement, and this rotation of a quantized cache (through the knob
/// table, as a measured candidate's).
fn chunk_context(
    m: &Arc<Model>,
    (type_k, type_v): (CacheType, CacheType),
    q: &QualityRequest,
    attn_rot: AttnRot,
) -> Result<Context, llama::LlamaError> {
    let n_ctx = q.n_ctx.max(16);
    let c = Candidate {
        type_k,
        type_v,
        flash_attn: q.flash_attn,
        attn_rot,
        kv_offload: q.kv_offload,
        n_batch: n_ctx,
        n_ubatch: n_ctx.min(512),
        ..Candidate::llama_default(q.threads.max(1), 0)
    };
    Context::new(m, &ContextSettings::for_candidate(&c, n_ctx))
}

/// `ctx` decodes `window` from an empty cache: the skipped positions without outputs, the rest
/// with every position's logits (indexed from 0 at the first scored position).
fn decode(window: &Window, ctx: &mut Context) -> Result<(), llama::LlamaError> {
    ctx.clear();
    if window.skip > 0 {
        ctx.decode_at(&window.input[..window.skip], 0, false)?;
    }
    ctx.decode_at(&window.input[window.skip..], window.skip as i32, true)
}

/// One chunk: the reference decodes the window, then each job still going decodes it and adds its
/// per-position comparison; a job that fails stops there. Each job's time includes its share of
/// the reference's. Fails only when the reference does.
fn compare_chunk(
    q: &QualityRequest,
    jobs: &mut [JobState],
    ref_ctx: &mut Context,
    window: &Window,
    progress: impl Fn(usize),
) -> Result<(), llama::LlamaError> {
    let t = Instant::now();
    decode(window, ref_ctx)?;
    let ref_share = t.elapsed().as_secs_f64() / jobs.len().max(1) as f64;
    for (j, (job, spec)) in jobs.iter_mut().zip(&q.jobs).enumerate() {
        progress(j);
        let Some(model) = job.model.clone().filter(|_| job.error.is_none()) else {
            continue;
        };
        let t = Instant::now();
        // One context at a time: with a large vocabulary each holds hundreds of MB of logits.
        let outcome = chunk_context(&model, job_kv(spec), q, q.attn_rot)
            .map_err(|e| e.to_string())
            .and_then(|mut ctx| compare_logits(ref_ctx, &mut ctx, window));
        let before = job.acc.len();
        match outcome {
            Ok(stats) => stats.into_iter().for_each(|s| job.acc.add(s)),
            Err(e) => job.error = Some(e),
        }
        job.window_means.extend(job.acc.mean_since(before));
        job.seconds += t.elapsed().as_secs_f64() + ref_share;
    }
    Ok(())
}

/// `ctx` decodes the window, and each scored position's logits are compared with the reference's.
fn compare_logits(
    ref_ctx: &Context,
    ctx: &mut Context,
    window: &Window,
) -> Result<Vec<kld::PositionStats>, String> {
    decode(window, ctx).map_err(|e| e.to_string())?;
    let pairs: Vec<(&[f32], &[f32], Option<i32>)> = (0..window.input.len() - window.skip)
        .map(|i| {
            (
                ref_ctx.logits_ith(i as i32),
                ctx.logits_ith(i as i32),
                window.next[window.skip + i],
            )
        })
        .collect();
    if pairs.iter().any(|(a, b, _)| a.is_empty() || b.is_empty()) {
        return Err("llama.cpp returned no logits for a position".to_string());
    }
    Ok(pairs
        .par_iter()
        .map(|(a, b, n)| kld::compare_position(a, b, *n))
        .collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quantize_progress_lines() {
        assert_eq!(
            tensor_progress("[  12/ 236]       blk.0.attn_k.weight - [ 640, 256], type = q4_K, "),
            Some((12, 236))
        );
        assert_eq!(
            tensor_progress("llama_model_quantize_impl: model size = 12 MiB"),
            None
        );
    }
}
