//! What a strategy may read: the run's settings, what is measured so far, the time left, and dry
//! runs (which allocate nothing and measure nothing). Strategies propose groups from a [`View`];
//! only the loop ([`Engine::drive`]) measures and chooses, so nothing a strategy holds can.

use super::group::Group;
use super::{Axis, Engine, TuneSettings};
use crate::measuring::{Progress, SkippedAxis};
use search_space::Candidate;
use std::time::Duration;

/// A strategy's read-only view of the run.
pub(crate) struct View<'v, 'a> {
    engine: &'v Engine<'a>,
    pub settings: &'v TuneSettings,
    pub progress: &'a dyn Progress,
}

impl<'a> Engine<'a> {
    /// The view strategies propose from.
    pub(crate) fn view(&self) -> View<'_, 'a> {
        View {
            engine: self,
            settings: &self.settings,
            progress: self.progress,
        }
    }
}

impl View<'_, '_> {
    /// Whether the run is out of time or stopped.
    pub fn past_budget(&self) -> bool {
        self.engine.past_budget()
    }
    /// Whether the run was stopped, not merely out of time.
    pub fn stopped(&self) -> bool {
        self.engine.stopped()
    }
    pub fn elapsed(&self) -> Duration {
        self.engine.elapsed()
    }

    // What is measured so far.

    /// `c`'s median rate, where measured.
    pub fn median_rate(&self, c: &Candidate) -> Option<f64> {
        self.engine.median_rate(c)
    }
    /// Whether `a` was measured slower than `b` by the decision rule.
    pub fn slower(&self, a: &Candidate, b: &Candidate) -> bool {
        self.engine.slower(a, b)
    }
    pub fn margin_over_runner_up(&self, best: &Candidate) -> Option<f64> {
        self.engine.margin_over_runner_up(best)
    }
    /// `axis` skipped from `from` where the ceilings leave nothing beyond the noise to win.
    pub fn skip_if_nothing_to_win(
        &self,
        axis: &str,
        group: &[Candidate],
        from: &Candidate,
    ) -> Option<SkippedAxis> {
        self.engine.skip_if_nothing_to_win(axis, group, from)
    }
    /// Which of `axes` would vary `from`.
    pub fn by_gain_per_second(&self, axes: &[Axis], from: &Candidate) -> Vec<Axis> {
        self.engine.by_gain_per_second(axes, from)
    }
    pub fn axes_with_candidates(&self, axes: &[Axis], from: &Candidate) -> Vec<String> {
        self.engine.axes_with_candidates(axes, from)
    }

    // Placements, from dry runs.

    pub fn max_fitting_layers(&self, c: &Candidate) -> Option<u32> {
        self.engine.max_fitting_layers(c)
    }
    pub fn expert_fit_levers(&self, from: &Candidate) -> Vec<Candidate> {
        self.engine.expert_fit_levers(from)
    }
    pub fn split_search_group(&self, best: &Candidate) -> Option<Group> {
        self.engine.split_search_group(best)
    }
    pub fn split_step(&self, c: &Candidate, half: bool) -> Option<Candidate> {
        self.engine.split_step(c, half)
    }
    pub fn split_moved(&self, c: &Candidate) -> u32 {
        self.engine.split_moved(c)
    }
    /// `c` on the default backend's devices.
    pub fn plain(&self, c: &Candidate) -> Candidate {
        self.engine.plain(c)
    }
    /// `shape` on `like`'s backend.
    pub fn like(&self, shape: &Candidate, like: &Candidate) -> Option<Candidate> {
        self.engine.like(shape, like)
    }
}
