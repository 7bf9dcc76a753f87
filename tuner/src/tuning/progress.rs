//! What a user sees of a tune as it runs: the progress bar, and the lines the engine's data turn
//! into on it (the run's time said before the search goes beyond llama.cpp's defaults, the axes the
//! ceilings leave unmeasured), rendered by `report::time`.

use crate::measuring::{Progress, Repetition, SkippedAxis, TimePlan};
use crate::report::time::{plan_line, skipped_line};
use crate::term::Bar;
use std::time::Duration;

/// The bar, and the engine's plan and skips said on it (not with `--quiet`).
pub(super) struct Told<'a> {
    pub bar: &'a Bar,
    pub quiet: bool,
}

impl Progress for Told<'_> {
    fn candidate_started(&self, label: &str, axis: &str) {
        self.bar.candidate_started(label, axis);
    }
    fn repetition(&self, label: &str, rep: &Repetition) {
        self.bar.repetition(label, rep);
    }
    fn failed(&self, label: &str, failure: &str) {
        self.bar.failed(label, failure);
    }
    fn stopped(&self, label: &str, why: &str) {
        self.bar.stopped(label, why);
    }
    fn best(&self, label: &str, margin: Option<f64>, elapsed: Duration, budget: Duration) {
        self.bar.best(label, margin, elapsed, budget);
    }
    fn note(&self, line: &str) {
        self.bar.note(line);
    }
    fn plan(&self, plan: &TimePlan) {
        self.bar.set_time_left(Duration::from_secs_f64(
            (plan.budget_s - plan.at_s).max(0.0),
        ));
        if !self.quiet {
            self.bar.note(&format!("time: {}", plan_line(plan)));
        }
    }
    fn skipped(&self, axis: &SkippedAxis) {
        if !self.quiet {
            self.bar.note(&skipped_line(axis));
        }
    }
}
