//! Where physics leaves nothing to win: the most an axis of the search could gain over the best so
//! far, with every phase the axis can move at its ceiling ([`Ceilings`]: the prompt at the
//! machine's matrix-multiply peak, generation at its memory bandwidth over the bytes a token reads).
//! An axis whose best case beats the best so far by less than the noise threshold is not measured:
//! the decision rule could call none of its candidates faster, and on a model that takes most of a
//! minute a request, its repetitions are minutes of the user's time.

use super::Engine;
use crate::measuring::{Ceilings, SkippedAxis, Workload};
use crate::stats::Sample;
use search_space::{knob, Candidate, Phases};

/// A phase's ceiling where `now` (measured) does not beat it. A measurement above its probe shows
/// the probe low (a busy moment, a kernel it did not try: one was 30% low), and a ceiling that may
/// be low cannot say an axis has nothing to win: it bounds nothing, and the axes are measured.
pub(crate) fn ceiling_of(now: f64, ceiling: Option<f64>) -> Option<f64> {
    ceiling.filter(|x| x.is_finite() && *x > 0.0 && now <= *x)
}

/// The most a request measured at `pp` and `tg` tokens a second could gain where `phases` move,
/// each moving phase at its ceiling (or where it is, if it is already at it): relative, 0.05 = 5%
/// faster. `None` where a moving phase has no ceiling (or one its measurement beats), or the
/// workload is one the ceilings do not bound (a depth, several sequences at once: the ceilings are
/// a single empty-cache request's).
pub(crate) fn at_most(c: &Ceilings, pp: f64, tg: f64, phases: Phases, w: &Workload) -> Option<f64> {
    if w.depth > 0 || w.n_parallel > 1 || pp <= 0.0 || tg <= 0.0 {
        return None;
    }
    let reach = |now: f64, ceiling: Option<f64>, moves: bool| -> Option<f64> {
        if moves {
            ceiling_of(now, ceiling).map(|x| x.max(now))
        } else {
            Some(now)
        }
    };
    let pp_best = reach(pp, c.prompt_tps, phases.prompt)?;
    let tg_best = reach(tg, c.generation_tps, phases.generation)?;
    let (np, ng) = (f64::from(w.n_prompt), f64::from(w.n_gen));
    let now = np / pp + ng / tg;
    let best = np / pp_best + ng / tg_best;
    (best > 0.0).then(|| now / best - 1.0)
}

impl Engine<'_> {
    /// The median prompt and generation rates of `c`'s measurement, where it ran.
    pub(crate) fn phase_medians(&self, c: &Candidate) -> Option<(f64, f64)> {
        let r = self.results.iter().find(|r| &r.candidate == c && r.ok())?;
        let median = |f: fn(&crate::measuring::Repetition) -> f64| {
            Sample::new(r.reps.iter().map(f).collect())
                .ok()
                .map(|s| s.median())
        };
        Some((median(|x| x.pp_tps)?, median(|x| x.tg_tps)?))
    }

    /// The most an axis's `group` could gain over `from` (measured) by the ceilings of the phases
    /// the knob table says its differences move (generation's threads only generation, the
    /// prompt's threads, the micro-batch and op offload only the prompt: a token generated is a
    /// batch of one); `None` where they cannot say (see [`at_most`]).
    pub(crate) fn room_on(&self, group: &[Candidate], from: &Candidate) -> Option<f64> {
        let (pp, tg) = self.phase_medians(from)?;
        at_most(
            &self.settings.ceilings,
            pp,
            tg,
            knob::phases_moved(group),
            &self.settings.plan.workload,
        )
    }

    /// `axis` (its candidates `group`) as skipped from `from`, where its best case beats `from`
    /// by less than the noise threshold and the user did not ask for its values by name. Never in
    /// grid mode, nor for the placements (they are not descent axes).
    pub(crate) fn nothing_to_win(
        &self,
        axis: &str,
        group: &[Candidate],
        from: &Candidate,
    ) -> Option<SkippedAxis> {
        if self.asked_for(axis) {
            return None;
        }
        let at_most = self.room_on(group, from)?;
        (at_most < self.settings.plan.noise).then(|| SkippedAxis {
            axis: axis.to_string(),
            at_most: at_most.max(0.0),
        })
    }

    /// Whether the user named the values of `axis` (`--threads 1,2`, `--numa off,distribute`):
    /// they are measured as asked. (The kernels, flash attention and KV types have defaults on the
    /// command line, and so cannot tell.)
    fn asked_for(&self, axis: &str) -> bool {
        let p = &self.settings.plan;
        match axis {
            "threads" => p.threads.is_some(),
            "prompt threads" => p.threads_batch.is_some(),
            "numa" => p.numa.is_some(),
            "host buffer" => p.host_buffers.is_some(),
            "batch" => !p.ubatch_options.is_empty(),
            _ => false,
        }
    }

    /// `axis` skipped from `from` where [`Self::nothing_to_win`] says so, said the first time
    /// (the host's axes and the later pass both have threads).
    pub(crate) fn skip_if_nothing_to_win(
        &self,
        axis: &str,
        group: &[Candidate],
        from: &Candidate,
    ) -> Option<SkippedAxis> {
        let skipped = self.nothing_to_win(axis, group, from)?;
        if !self.skipped_axes.iter().any(|s| s.axis == skipped.axis) {
            self.progress.skipped(&skipped);
        }
        Some(skipped)
    }

    /// Records axes a descent skipped, each once (its largest bound).
    pub(crate) fn record_skips(&mut self, skipped: Vec<SkippedAxis>) {
        for new in skipped {
            match (self.skipped_axes.iter_mut()).find(|s| s.axis == new.axis) {
                Some(s) => s.at_most = s.at_most.max(new.at_most),
                None => self.skipped_axes.push(new),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(n_prompt: u32, n_gen: u32) -> Workload {
        Workload {
            n_ctx: 4096,
            n_prompt,
            n_gen,
            depth: 0,
            n_parallel: 1,
            name: String::new(),
        }
    }

    fn ceilings(pp: Option<f64>, tg: Option<f64>) -> Ceilings {
        Ceilings {
            prompt_tps: pp,
            generation_tps: tg,
            method: Vec::new(),
        }
    }

    #[test]
    fn an_axis_gains_at_most_what_its_phases_ceilings_leave() {
        let c = ceilings(Some(40.0), Some(8.0));
        // pp512 at 20 t/s (25.6 s) and tg128 at 7.2 t/s (17.8 s): 43.4 s a request.
        let now = 512.0 / 20.0 + 128.0 / 7.2;
        let gen = at_most(&c, 20.0, 7.2, Phases::GENERATION, &w(512, 128)).unwrap();
        let want = now / (512.0 / 20.0 + 128.0 / 8.0) - 1.0;
        assert!((gen - want).abs() < 1e-12, "{gen} vs {want}");
        let prompt = at_most(&c, 20.0, 7.2, Phases::PROMPT, &w(512, 128)).unwrap();
        assert!((prompt - (now / (512.0 / 40.0 + 128.0 / 7.2) - 1.0)).abs() < 1e-12);
        let both = at_most(&c, 20.0, 7.2, Phases::BOTH, &w(512, 128)).unwrap();
        assert!(both > prompt && both > gen);
        // A phase measured at its ceiling has nothing left; one measured past it, however little,
        // shows the probe low: no bound.
        assert_eq!(
            at_most(&c, 40.0, 8.0, Phases::BOTH, &w(512, 128)),
            Some(0.0)
        );
        assert_eq!(at_most(&c, 41.0, 8.0, Phases::BOTH, &w(512, 128)), None);
        assert_eq!(at_most(&c, 50.0, 8.1, Phases::BOTH, &w(512, 128)), None);
        assert!(at_most(&c, 50.0, 7.2, Phases::GENERATION, &w(512, 128)).is_some());
    }

    #[test]
    fn without_a_ceiling_for_a_phase_it_moves_an_axis_is_not_bounded() {
        let only_tg = ceilings(None, Some(8.0));
        assert!(at_most(&only_tg, 20.0, 7.2, Phases::GENERATION, &w(512, 128)).is_some());
        assert_eq!(
            at_most(&only_tg, 20.0, 7.2, Phases::PROMPT, &w(512, 128)),
            None
        );
        assert_eq!(
            at_most(&only_tg, 20.0, 7.2, Phases::BOTH, &w(512, 128)),
            None
        );
        // At depth or with several sequences the ceilings (one empty-cache request's) say nothing.
        let c = ceilings(Some(40.0), Some(8.0));
        let deep = Workload {
            depth: 4096,
            n_ctx: 8192,
            ..w(512, 128)
        };
        assert_eq!(at_most(&c, 20.0, 7.2, Phases::BOTH, &deep), None);
        let four = Workload {
            n_parallel: 4,
            ..w(512, 128)
        };
        assert_eq!(at_most(&c, 20.0, 7.2, Phases::BOTH, &four), None);
    }
}
