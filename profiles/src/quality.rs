//! The quality record of a run: what the next-token distributions of each quantized K/V cache pair
//! the search wanted to pick drifted from the f16 cache's (KL divergence, top-1 agreement), the gate
//! they were held to, the text and what they were measured with. The engine fills it, the report
//! and the profile carry it, `explain`, `show`, `apply` and `export` read it.

use search_space::{AttnRot, CacheType, Candidate, FlashAttn};
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
    /// The 99.9th percentile: what the worst positions in a thousand saw (absent in records
    /// written before it was kept).
    #[serde(default)]
    pub kld_p999: f64,
    pub kld_max: f64,
    /// Share of positions whose most likely next token is the reference's (0..1).
    pub top1: f64,
    /// Perplexity of the reference and of the model on the evaluation text.
    pub ref_ppl: f64,
    pub ppl: f64,
}

/// What quality figures were measured with, besides the model, the pair and the text: what changes
/// the numbers. llama.cpp has changed its quantized caches between builds (a Hadamard rotation of
/// quantized K and V since its PR 21038; one architecture's q8_0 K cache gave garbage until PR
/// 25391), each backend runs its own kernels, and flash attention computes attention another way.
/// The quality cache is keyed by these, so a figure is never reused where they differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasuredWith {
    /// llama.cpp's build, as the profile's `llama.version` names it, with its commit.
    pub llama: String,
    /// The backends that held the model's layers (`CPU`; `CUDA`; `CUDA+RPC`).
    pub backend: String,
    /// Flash attention as the evaluation's contexts were given it.
    pub flash_attn: FlashAttn,
}

impl MeasuredWith {
    /// "llama.cpp b7400 (commit abc1234), CPU, flash attention auto".
    pub fn describe(&self) -> String {
        format!(
            "llama.cpp {}, {}, flash attention {}",
            self.llama, self.backend, self.flash_attn
        )
    }
}

/// One K/V cache pair held to the gate: its figures against the f16 cache (on the same weights, or
/// on the most precise file of a choice among quantizations), or why they could not be had.
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
    /// What the figures were measured with (absent in profiles written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_with: Option<MeasuredWith>,
    /// The file the figures are against where it is not the model itself (a choice among
    /// quantizations: the most precise one, with an f16 cache): the figures are then those of the
    /// model's weights with this pair, what will run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub against: Option<String>,
    /// The model's weights alone (an f16 cache) against `against`, over the same windows: what the
    /// pair adds is the mean KLD less this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_kld: Option<f64>,
    /// The quantized cache's rotation (off: `LLAMA_ATTN_ROT_DISABLE=1`), which changes its
    /// figures; on in checks written before it was a knob.
    #[serde(default, skip_serializing_if = "AttnRot::is_on")]
    pub attn_rot: AttnRot,
}

impl KvQualityCheck {
    /// `q8_0/q4_0`, with ` no-rot` where the cache is not rotated.
    pub fn label(&self) -> String {
        let rot = if self.attn_rot.is_on() { "" } else { " no-rot" };
        format!("{}/{}{rot}", self.type_k, self.type_v)
    }

    /// Whether this check is of `c`'s lossy settings: its K/V pair, rotated as `c` rotates it.
    pub fn is_for(&self, c: &Candidate) -> bool {
        (self.type_k, self.type_v, self.attn_rot) == (c.type_k, c.type_v, c.attn_rot)
    }

    pub fn kld(&self) -> Option<f64> {
        self.figures.as_ref().map(|f| f.kld_mean)
    }

    /// What the pair adds to the model's next-token distributions: its mean KL divergence, less
    /// what the weights alone add where the figures are against another file. The gated figure.
    pub fn added_kld(&self) -> Option<f64> {
        Some(self.kld()? - self.weights_kld.unwrap_or(0.0))
    }

    /// "mean KLD 0.0093, p99 0.081, top-1 94.0%" (against another file: "…, the weights alone
    /// 0.0300 against F16"), or why there are no figures.
    pub fn describe(&self) -> String {
        match (&self.figures, &self.error) {
            (Some(f), _) => {
                let against = match (&self.against, self.weights_kld) {
                    (Some(a), Some(w)) => format!(
                        " with the weights, against {a} (the weights alone {}: the cache adds {})",
                        fmt_kld(w),
                        fmt_kld(f.kld_mean - w)
                    ),
                    _ => String::new(),
                };
                format!(
                    "mean KLD {}, p99 {}, p99.9 {}, top-1 {:.1}%{against}",
                    fmt_kld(f.kld_mean),
                    fmt_kld(f.kld_p99),
                    fmt_kld(f.kld_p999),
                    100.0 * f.top1
                )
            }
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
    /// The check of `c`'s lossy settings (its K/V pair and their rotation), if they were checked.
    pub fn check(&self, c: &Candidate) -> Option<&KvQualityCheck> {
        self.checks.iter().find(|k| k.is_for(c))
    }
}

impl QualityRecord {
    /// The winner's quality in one line: lossless, its measured figures within the gate (and what
    /// they were measured with), or not checked and why.
    pub fn winner_line(&self, w: &Candidate) -> String {
        let kv = lossy_label(w);
        if !w.kv_lossy() {
            let gate = match (self.max_kv_kld, &self.unchecked) {
                (Some(max), _) => format!(
                    "a quantized cache had to stay within mean KLD {}",
                    fmt_kld(max)
                ),
                (None, Some(why)) => format!("quantized caches were not held to quality: {why}"),
                (None, None) => "no quality gate".into(),
            };
            return format!("kv={kv}: lossless ({gate})");
        }
        match self.check(w) {
            Some(c) if c.passed => {
                let with = (c.measured_with.as_ref()).map_or(String::new(), |m| {
                    format!("; measured with {}", m.describe())
                });
                format!(
                    "kv={kv}: {} against f16, within the gate ({}); {}-token windows of {}{with}",
                    c.describe(),
                    fmt_kld(self.max_kv_kld.unwrap_or(f64::NAN)),
                    self.window,
                    self.text
                )
            }
            Some(c) => format!("kv={kv}: REFUSED by the quality gate: {}", c.describe()),
            None if self.max_kv_kld.is_some() => format!(
                "kv={kv}: quality NOT checked (the gate measured other caches: the profile was \
                 edited after the run?)"
            ),
            None => format!(
                "kv={kv}: quality NOT checked ({})",
                self.unchecked.as_deref().unwrap_or("no gate")
            ),
        }
    }
}

/// The quality line of a profile's winner, for `show`, `apply` and `export`: the record's, or,
/// for a profile written before the gate (no record), "lossless" or a flag on its lossy cache.
/// `model` is the model's path, for the command that checks it.
pub fn quality_line(q: Option<&QualityRecord>, w: &Candidate, model: &str) -> String {
    match q {
        Some(q) => q.winner_line(w),
        None if w.kv_lossy() => format!(
            "kv={}: quality never checked: run `autotune {model}` again",
            lossy_label(w)
        ),
        None => format!("kv={}: lossless", w.kv_label()),
    }
}

/// `w`'s K/V pair as the quality lines name it: ` no-rot` after a quantized pair run unrotated.
fn lossy_label(w: &Candidate) -> String {
    let rot = if w.attn_rot.is_on() || !w.kv_lossy() {
        ""
    } else {
        " no-rot"
    };
    format!("{}{rot}", w.kv_label())
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
