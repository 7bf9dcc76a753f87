//! The quality record of a run: what the next-token distributions of each quantized K/V cache pair
//! the search wanted to pick drifted from the f16 cache's (KL divergence, top-1 agreement), the gate
//! they were held to, and the text they were measured on. The engine fills it, the report and the
//! profile carry it, `explain` reads it.

use search_space::CacheType;
use serde::{Deserialize, Serialize};

/// The figures of a whole evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityFigures {
    /// Positions compared (every token of every chunk).
    pub positions: u64,
    /// Mean KL divergence from the reference, nats per token (the gated figure).
    pub kld_mean: f64,
    /// Standard error of that mean.
    pub kld_se: f64,
    pub kld_median: f64,
    pub kld_p99: f64,
    pub kld_max: f64,
    /// Share of positions whose most likely next token is the reference's (0..1).
    pub top1: f64,
    /// Perplexity of the reference and of the model on the evaluation text.
    pub ref_ppl: f64,
    pub ppl: f64,
}

/// One K/V cache pair held to the gate: its figures against the f16 cache on the same weights, or
/// why they could not be had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvQualityCheck {
    pub type_k: CacheType,
    pub type_v: CacheType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<QualityFigures>,
    /// Whether the pair may win: its mean KL divergence is within the gate (never when the
    /// evaluation failed).
    pub passed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Read from the quality cache rather than evaluated in this run.
    #[serde(default)]
    pub cached: bool,
    /// Seconds the evaluation took (0 when cached).
    #[serde(default)]
    pub seconds: f64,
}

impl KvQualityCheck {
    /// `q8_0/q4_0`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.type_k, self.type_v)
    }

    pub fn kld(&self) -> Option<f64> {
        self.figures.as_ref().map(|f| f.kld_mean)
    }

    /// "mean KLD 0.0093, p99 0.081, top-1 94.0%", or why there are no figures.
    pub fn describe(&self) -> String {
        match (&self.figures, &self.error) {
            (Some(f), _) => format!(
                "mean KLD {}, p99 {}, top-1 {:.1}%",
                fmt_kld(f.kld_mean),
                fmt_kld(f.kld_p99),
                100.0 * f.top1
            ),
            (None, Some(e)) => format!("not measured: {e}"),
            (None, None) => "not measured".to_string(),
        }
    }
}

/// How the run held lossy settings to quality: the gate (or why there was none), the text the
/// figures come from, and every pair checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityRecord {
    /// The most mean KL divergence (nats per token) a quantized K/V cache may add over the f16
    /// cache and still win; absent when no gate applied (see `unchecked`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_kld: Option<f64>,
    /// Why quantized caches were not held to a gate (`--no-quality-gate`, types given without f16,
    /// the quantization ladder's own gate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchecked: Option<String>,
    /// What the figures were measured on.
    pub text: String,
    /// Tokens of each window (a request's context: depth, prompt and generation, rounded up).
    pub window: u32,
    /// Tokens of the text evaluated.
    pub tokens: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<KvQualityCheck>,
}

impl QualityRecord {
    /// The check of a K/V pair, if it was checked.
    pub fn check(&self, type_k: CacheType, type_v: CacheType) -> Option<&KvQualityCheck> {
        self.checks
            .iter()
            .find(|c| c.type_k == type_k && c.type_v == type_v)
    }
}

/// A KL divergence as the quality tables print it: four decimals, scientific below 0.0001.
pub fn fmt_kld(k: f64) -> String {
    if k == 0.0 {
        "0".into()
    } else if k < 0.0001 {
        format!("{k:.2e}")
    } else {
        format!("{k:.4}")
    }
}
