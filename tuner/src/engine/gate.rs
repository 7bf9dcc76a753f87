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
use std::time::Instant;

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
        let left = self.settings.time_budget.saturating_sub(self.elapsed());
        let until = Instant::now().checked_add(left);
        let stop = move || outer() || until.is_some_and(|u| Instant::now() >= u);
        let outcome = self.measurer.get_mut().kv_quality(&req, &stop);
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
                // Against another file, what the cache adds to what the weights alone drift.
                passed: a.figures.kld_mean - a.weights_kld.unwrap_or(0.0) <= max,
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
            text: super::settings::TEXT.to_string(),
            window: q.window,
            tokens: q.max_tokens,
            checks: self.kv_checks.clone(),
        }
    }
}
