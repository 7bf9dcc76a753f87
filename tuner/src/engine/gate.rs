//! The quality gate: a candidate whose K or V cache is quantized changes the model's next-token
//! distributions, so it may win, or win a tie, only when its K/V pair's mean KL divergence from
//! the f16 cache, measured on the real model at the workload's depth, is within the gate. Each pair
//! is measured once per run, when a candidate with it first stands to be chosen (most runs never
//! measure a pair that could not win), and the measurer caches the figures across runs.

use super::Engine;
use crate::worker::Workload;
use profiles::{KvQualityCheck, QualityFigures, QualityRecord};
use search_space::{CacheType, Candidate};
use std::path::PathBuf;

/// The default gate: the mean KL divergence (nats per token) a quantized K/V cache may add over
/// the f16 cache. On Llama 3 8B (llama.cpp PR 7412's table) a q8_0/q8_0 cache adds about 0.001 and
/// q8_0 weights with a q8_0/q8_0 cache 0.0016; weights at Q5_K_M add 0.011 and at Q4_K_M 0.029
/// (llama.cpp PR 6936's table). 0.02 lets a cache cost at most what going from 6 to 5 bits a
/// weight costs: q8_0 caches pass (on the 270M demo model 0.009), 4-bit caches that change one
/// next token in five (the demo model's q4_0: 0.110, top-1 81%) do not.
pub const DEFAULT_MAX_KV_KLD: f64 = 0.02;

/// Positions compared at the end of each window: their logits are what the evaluation holds in
/// memory at a time (a 262k vocabulary: 512 MiB a context).
pub const SCORED_POSITIONS: u32 = 512;

/// What the user asked of the gate (`--max-kv-kld`, `--no-quality-gate`), before the workload and
/// the machine make it a [`QualityGate`].
#[derive(Debug, Clone, PartialEq)]
pub enum GateChoice {
    /// Hold quantized caches to this mean KL divergence.
    On(f64),
    /// No gate, and why (said in the report and the profile).
    Off(String),
}

impl GateChoice {
    /// The gate for `workload`, with `threads` for the evaluation.
    pub fn gate(&self, workload: &Workload, threads: u32) -> QualityGate {
        match self {
            GateChoice::On(max) => QualityGate::on(*max, workload, threads),
            GateChoice::Off(why) => QualityGate::off(why, workload, threads),
        }
    }
}

/// How a run holds quantized caches to quality (validated from the flags).
#[derive(Debug, Clone, PartialEq)]
pub struct QualityGate {
    /// The gate; `None`: no gate (see `unchecked`).
    pub max_kv_kld: Option<f64>,
    /// Why there is no gate, for the report and the profile.
    pub unchecked: Option<String>,
    /// Tokens of each window of the evaluation text: a request's context, from
    /// [`window_for`].
    pub window: u32,
    /// Tokens of the text evaluated (whole windows).
    pub max_tokens: u32,
    pub threads: u32,
}

impl QualityGate {
    /// The default gate (or `max_kv_kld`) for `workload`.
    pub fn on(max_kv_kld: f64, workload: &Workload, threads: u32) -> Self {
        let window = window_for(workload);
        QualityGate {
            max_kv_kld: Some(max_kv_kld),
            unchecked: None,
            window,
            max_tokens: tokens_for(window),
            threads,
        }
    }

    /// No gate, and why.
    pub fn off(why: &str, workload: &Workload, threads: u32) -> Self {
        QualityGate {
            max_kv_kld: None,
            unchecked: Some(why.to_string()),
            ..Self::on(0.0, workload, threads)
        }
    }
}

/// The window a request's cache fills: its depth, prompt and generation, rounded up to a power of
/// two from 512 to 4096 tokens (a quantized cache hurts more as it fills; past 4096 the built-in
/// text has too few tokens for a second window).
pub fn window_for(w: &Workload) -> u32 {
    let need = w.depth + w.n_prompt + w.n_gen;
    need.clamp(512, 4096).next_power_of_two().min(4096)
}

/// Tokens evaluated for a window: at least four windows' worth of scored positions (2048 tokens
/// at 512), else two whole windows (what the text holds).
fn tokens_for(window: u32) -> u32 {
    (2 * window).max(4 * SCORED_POSITIONS)
}

/// What the measurer evaluates: the model with a K/V pair against the same model with f16.
#[derive(Debug, Clone)]
pub struct KvQualityRequest {
    pub model: PathBuf,
    pub type_k: CacheType,
    pub type_v: CacheType,
    pub window: u32,
    pub max_tokens: u32,
    pub threads: u32,
    /// Layers on the offload devices: the candidate's, which its budgets hold (the evaluation
    /// falls back to the CPU where the model does not load so).
    pub n_gpu_layers: u32,
}

/// The measurer's answer.
#[derive(Debug, Clone)]
pub struct KvQualityAnswer {
    pub figures: QualityFigures,
    pub cached: bool,
    pub seconds: f64,
}

impl Engine<'_> {
    /// Whether `c` may be chosen: its caches are lossless, no gate applies, or its K/V pair passed
    /// the gate (measured now when it has not been; an interrupted run measures nothing and lets
    /// no unmeasured pair win).
    pub(crate) fn passes_gate(&mut self, c: &Candidate) -> bool {
        let Some(max) = self.settings.quality.max_kv_kld else {
            return true;
        };
        if !c.kv_lossy() {
            return true;
        }
        if let Some(done) = self.kv_check(c) {
            return done.passed;
        }
        if (self.stop)() {
            self.interrupted = true;
            return false;
        }
        let check = self.measure_kv_quality(c, max);
        if (self.stop)() {
            // Cut short: measured again when the run resumes, never a verdict of its own.
            self.interrupted = true;
            return false;
        }
        let passed = check.passed;
        self.kv_checks.push(check);
        passed
    }

    /// The gate's verdict on `c`'s K/V pair, when it was measured.
    pub(crate) fn kv_check(&self, c: &Candidate) -> Option<&KvQualityCheck> {
        (self.kv_checks.iter()).find(|k| k.type_k == c.type_k && k.type_v == c.type_v)
    }

    /// Whether `c` was refused by the gate (measured and not within it).
    pub(crate) fn refused(&self, c: &Candidate) -> bool {
        self.kv_check(c).is_some_and(|k| !k.passed)
    }

    fn measure_kv_quality(&mut self, c: &Candidate, max: f64) -> KvQualityCheck {
        let q = &self.settings.quality;
        let req = KvQualityRequest {
            model: self.settings.model.clone(),
            type_k: c.type_k,
            type_v: c.type_v,
            window: q.window,
            max_tokens: q.max_tokens,
            threads: q.threads,
            n_gpu_layers: c.n_gpu_layers,
        };
        let label = format!("kv={}", c.kv_label());
        self.progress.candidate_started(&label, "quality gate");
        let stop = self.stop;
        let outcome = self.measurer.kv_quality(&req, stop);
        let check = match outcome {
            Ok(a) => KvQualityCheck {
                type_k: c.type_k,
                type_v: c.type_v,
                passed: a.figures.kld_mean <= max,
                figures: Some(a.figures),
                error: None,
                cached: a.cached,
                seconds: a.seconds,
            },
            Err(e) => KvQualityCheck {
                type_k: c.type_k,
                type_v: c.type_v,
                figures: None,
                passed: false,
                error: Some(e),
                cached: false,
                seconds: 0.0,
            },
        };
        let verdict = if check.passed {
            "within the gate".to_string()
        } else if check.figures.is_some() {
            format!("over the gate ({}): refused", profiles::fmt_kld(max))
        } else {
            "refused".to_string()
        };
        self.progress
            .note(&format!("quality {label}: {}, {verdict}", check.describe()));
        check
    }

    /// The run's quality record: the gate, the text and every pair checked.
    pub fn quality_record(&self) -> QualityRecord {
        let q = &self.settings.quality;
        QualityRecord {
            max_kv_kld: q.max_kv_kld,
            unchecked: q.unchecked.clone(),
            text: TEXT.to_string(),
            window: q.window,
            tokens: q.max_tokens,
            checks: self.kv_checks.clone(),
        }
    }
}

/// What the figures are measured on.
pub const TEXT: &str = "autotune's evaluation text (English prose, code and dialogue)";

#[cfg(test)]
mod tests {
    use super::*;

    fn w(depth: u32, n_prompt: u32, n_gen: u32) -> Workload {
        Workload {
            n_ctx: 32768,
            n_prompt,
            n_gen,
            depth,
            n_parallel: 1,
        }
    }

    #[test]
    fn the_window_is_a_requests_context_rounded_up_within_512_to_4096() {
        assert_eq!(window_for(&w(0, 128, 32)), 512);
        assert_eq!(window_for(&w(0, 512, 128)), 1024);
        assert_eq!(window_for(&w(1024, 256, 256)), 2048);
        assert_eq!(window_for(&w(16384, 512, 128)), 4096);
        assert_eq!(tokens_for(512), 2048);
        assert_eq!(tokens_for(4096), 8192);
    }
}
