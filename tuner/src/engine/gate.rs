//! The quality gate: a candidate whose K or V cache is quantized changes the model's next-token
//! distributions, so it may win (or be the point an axis goes on from) only when its K/V pair's
//! mean KL divergence from the f16 cache (in a choice among quantizations, from the most precise
//! file, less what the weights alone drift), measured on the real model at the workload's depth,
//! is within the gate; a tie in the run's choice goes to the lossless setting anyway. Each pair
//! is measured once per run, when a candidate with it first stands to be chosen (most runs never
//! measure a pair that could not win), and the measurer caches the figures across runs. The
//! evaluation counts against the run's time budget like any measurement: cut at its end, it leaves
//! the pair unmeasured, and an unmeasured pair never wins.

use super::Engine;
use crate::measuring::KvQualityRequest;
use profiles::{KvQualityCheck, QualityRecord};
use search_space::{knob, Candidate};

impl Engine<'_> {
    /// Whether `c` may be chosen: its caches are lossless, no gate applies, or its K/V pair passed
    /// the gate (measured now when it has not been; an interrupted run measures nothing and lets
    /// no unmeasured pair win).
    pub(crate) fn passes_gate(&mut self, c: &Candidate) -> bool {
        let Some(max) = self.settings.quality.max_kv_kld else {
            return true;
        };
        if !knob::lossy(c) {
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
        (self.kv_checks.iter()).find(|k| k.is_for(c))
    }

    /// Whether `c` was refused by the gate (measured and not within it).
    pub(crate) fn refused(&self, c: &Candidate) -> bool {
        self.kv_check(c).is_some_and(|k| !k.passed)
    }

    fn measure_kv_quality(&mut self, c: &Candidate, max: f64) -> KvQualityCheck {
        let q = &self.settings.quality;
        let req = KvQualityRequest {
            model: self.settings.model.clone(),
            reference: q.reference.clone(),
            type_k: c.type_k,
            type_v: c.type_v,
            flash_attn: c.flash_attn,
            attn_rot: c.attn_rot,
            kv_offload: c.kv_offload,
            window: q.window,
            max_tokens: q.max_tokens,
            decide_at: Some(max),
            threads: q.threads,
            n_gpu_layers: c.n_gpu_layers,
            devices: if c.n_gpu_layers > 0 {
                self.devices_listed(c)
            } else {
                Vec::new()
            },
        };
        let rot = if c.attn_rot.is_on() { "" } else { " no-rot" };
        let label = format!("kv={}{rot}", c.kv_label());
        self.progress.candidate_started(&label, "quality gate");
        let outer = self.stop;
        // Cached figures come back whatever the time left; an evaluation stops at the budget's end.
        self.out_of_time();
        let ends_by = self.settings.time_budget;
        let outcome = self.measurer.get_mut().kv_quality(&req, &outer, ends_by);
        let outcome = outcome.map_err(|e| {
            if self.out_of_time() && !self.interrupted {
                let budget = self.settings.time_budget.as_secs();
                format!("the time budget ({budget} s) ran out first (raise --budget)")
            } else {
                e
            }
        });
        let check = match outcome {
            Ok(a) => KvQualityCheck {
                type_k: c.type_k,
                type_v: c.type_v,
                passed: within(&a.figures, a.weights_kld, max),
                figures: Some(a.figures),
                error: None,
                cached: a.cached,
                seconds: a.seconds,
                measured_with: Some(a.measured_with),
                against: a.against,
                weights_kld: a.weights_kld,
                attn_rot: c.attn_rot,
            },
            Err(e) => KvQualityCheck {
                type_k: c.type_k,
                type_v: c.type_v,
                figures: None,
                passed: false,
                error: Some(e),
                cached: false,
                seconds: 0.0,
                measured_with: None,
                against: None,
                weights_kld: None,
                attn_rot: c.attn_rot,
            },
        };
        let verdict = verdict_of(&check, max);
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
            text: super::settings::TEXT.to_string(),
            window: q.window,
            tokens: q.max_tokens,
            checks: self.kv_checks.clone(),
        }
    }
}

/// What the gate said of a pair, for the progress line.
fn verdict_of(check: &KvQualityCheck, max: f64) -> String {
    if check.passed {
        "within the gate".to_string()
    } else if let Some(f) = check.figures.as_ref().filter(|f| f.kld_mean <= max) {
        format!(
            "its mean within the gate, its 99th percentile ({}) over {} times it ({}): refused",
            profiles::fmt_kld(f.kld_p99),
            TAIL_MULTIPLE,
            profiles::fmt_kld(max)
        )
    } else if check.figures.is_some() {
        format!("over the gate ({}): refused", profiles::fmt_kld(max))
    } else {
        "refused".to_string()
    }
}

/// How many times the mean's gate a pair's 99th percentile may reach. A drift spread evenly over
/// the positions has a tail about ten times its mean (llama.cpp's perplexity README: Llama 3 8B in
/// FP16 against BF16, p99 9x the mean, p99.9 32x); a pair over ten times the gate at its 99th
/// percentile concentrates its damage on a few positions in a hundred, which a passing mean hides
/// (published KV-cache studies found the 99.9th percentile exposing damage the mean did not).
pub const TAIL_MULTIPLE: f64 = 10.0;

/// Whether figures pass a gate of `max` mean KL divergence: the mean within it, and the 99th
/// percentile within [`TAIL_MULTIPLE`] times it. Against another file (`weights`: what the weights
/// alone drift), what the cache adds to the mean; the tail there is the weights' too, and not held
/// to the cache's gate.
pub(crate) fn within(f: &profiles::QualityFigures, weights: Option<f64>, max: f64) -> bool {
    let mean = f.kld_mean - weights.unwrap_or(0.0) <= max;
    let tail = weights.is_some() || f.kld_p99 <= TAIL_MULTIPLE * max;
    mean && tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(mean: f64, p99: f64) -> profiles::QualityFigures {
        profiles::QualityFigures {
            positions: 1024,
            kld_mean: mean,
            kld_se: mean / 20.0,
            kld_median: mean / 3.0,
            kld_p99: p99,
            kld_p999: p99 * 3.0,
            kld_max: p99 * 5.0,
            top1: 0.95,
            ref_ppl: 10.0,
            ppl: 10.5,
        }
    }

    #[test]
    fn a_pair_whose_mean_passes_and_whose_tail_does_not_is_refused() {
        // A q8_0 cache's shape: mean 0.01, p99 eight times it: within a 0.02 gate.
        assert!(within(&figures(0.01, 0.08), None, 0.02));
        // The same mean with damage on one position in a hundred: p99 0.5, over ten times 0.02.
        assert!(!within(&figures(0.01, 0.5), None, 0.02));
        // A mean over the gate fails whatever its tail.
        assert!(!within(&figures(0.03, 0.05), None, 0.02));
        // Against another file the tail is the weights' too: the cache's share of the mean decides.
        assert!(within(&figures(0.04, 0.5), Some(0.03), 0.02));
    }
}
