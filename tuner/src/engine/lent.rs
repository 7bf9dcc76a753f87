//! The figures a group's repetitions borrow for the phase they do not time: a group that moves
//! only one phase times only that one, and the other is lent from repetitions that timed both.

use crate::measuring::Repetition;
use crate::stats::Sample;
use search_space::Phases;

/// The figures a group's repetitions borrow for the phase they do not time
/// ([`Engine::lent_for`]).
#[derive(Debug, Clone)]
pub(crate) struct Lent {
    /// What the group's repetitions time.
    pub timed: Phases,
    pp: f64,
    tg: f64,
    pp_depth: Option<f64>,
    tg_depth: Option<f64>,
}

impl Lent {
    /// The medians of `whole` (repetitions that timed both phases), for a group that moves only
    /// `moved`; none without such repetitions.
    pub(super) fn of(moved: Phases, whole: &[&Repetition]) -> Option<Lent> {
        let median = |f: fn(&Repetition) -> Option<f64>| {
            Sample::new(whole.iter().filter_map(|r| f(r)).collect())
                .ok()
                .map(|s| s.median())
        };
        Some(Lent {
            timed: moved,
            pp: median(|r| Some(r.pp_tps))?,
            tg: median(|r| Some(r.tg_tps))?,
            pp_depth: median(|r| r.pp_depth_tps),
            tg_depth: median(|r| r.tg_depth_tps),
        })
    }

    /// `rep`'s untimed figures, lent; `rep.timed` says which were.
    pub fn fill(&self, rep: &mut Repetition) {
        if !rep.timed.prompt {
            rep.pp_tps = self.pp;
            rep.pp_depth_tps = rep.pp_depth_tps.and(self.pp_depth);
        }
        if !rep.timed.generation {
            rep.tg_tps = self.tg;
            rep.tg_depth_tps = rep.tg_depth_tps.and(self.tg_depth);
        }
    }
}
