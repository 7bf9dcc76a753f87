//! The search's shape: strategies propose, one loop measures. A [`Strategy`] (the coordinate
//! descent over a table of axes, the placement walk, the split's steps, the expert challenge)
//! proposes each [`Group`] of candidates from a read-only view of the engine (its settings, what
//! is measured so far, dry runs, which allocate nothing) and hears which candidate the group's
//! measurement chose; [`Engine::drive`] is the one loop that measures each group (interleaved,
//! shuffled rounds) and chooses (the decision rule, the quality gate). llama-bench's shape: a
//! table of axes, the instances it yields, one loop.

use super::group::Group;
use super::view::View;
use super::{in_space, Axis, Engine};
use crate::measuring::SkippedAxis;
use search_space::Candidate;

/// A way of searching: proposes groups, one at a time, from what is measured so far.
pub(crate) trait Strategy {
    type Output;
    /// The next group to measure, given `chosen`: the candidate the engine chose among the last
    /// group proposed (`None` before the first, or where none of it was measured). `None`: done.
    fn next(&mut self, view: &View, chosen: Option<Candidate>) -> Option<Group>;
    /// What the strategy found, once it proposes nothing more.
    fn finish(self, view: &View) -> Self::Output;
}

impl Engine<'_> {
    /// The one loop that measures: each group a strategy proposes, measured and chosen among,
    /// until it proposes nothing more. The budget and a stop are checked before each proposal
    /// (the strategies read them from the view).
    pub(crate) fn drive<S: Strategy>(&mut self, mut strategy: S) -> S::Output {
        let mut chosen = None;
        loop {
            self.out_of_time();
            let Some(group) = strategy.next(&self.view(), chosen.take()) else {
                break;
            };
            self.promising = group.promising;
            self.measure_group(&group.candidates, group.axis);
            self.promising = Vec::new();
            chosen = self.choose(&group.candidates);
        }
        self.out_of_time();
        strategy.finish(&self.view())
    }

    /// Whether the run is out of time or stopped, as [`Engine::out_of_time`] would say, without
    /// recording it (the view is read-only; the loop records it before each proposal).
    pub(crate) fn past_budget(&self) -> bool {
        self.interrupted
            || self.budget_spent
            || (self.stop)()
            || self.elapsed() >= self.settings.time_budget
    }

    /// Whether the run was stopped (a signal, or the engine's own stop), not merely out of time.
    pub(crate) fn stopped(&self) -> bool {
        self.interrupted || (self.stop)()
    }
}

/// One group, measured once: its choice, or `fallback` where nothing in it was measured.
pub(crate) struct Once {
    group: Option<Group>,
    fallback: Option<Candidate>,
    chosen: Option<Candidate>,
}

impl Once {
    pub fn new(group: Group, fallback: Option<Candidate>) -> Self {
        Once {
            group: Some(group),
            fallback,
            chosen: None,
        }
    }
}

impl Strategy for Once {
    type Output = Option<Candidate>;

    fn next(&mut self, _: &View, chosen: Option<Candidate>) -> Option<Group> {
        let group = self.group.take();
        if group.is_none() {
            self.chosen = chosen;
        }
        group
    }

    fn finish(self, _: &View) -> Option<Candidate> {
        self.chosen.or(self.fallback)
    }
}

/// One pass of the coordinate descent over a table of axes from a best: each axis's variants
/// proposed beside the best so far, the best kept. A budget that ends on the way records the axes
/// it left ([`Descended::not_reached`]).
pub(crate) struct Descend {
    axes: Vec<Axis>,
    /// The axes put in order of the gain they can bring per second of measuring, once.
    ordered: bool,
    /// The next axis to propose.
    k: usize,
    best: Option<Candidate>,
    base: Candidate,
    /// A group is out, and its choice comes with the next call.
    proposed: bool,
    not_reached: Option<Vec<String>>,
    skipped: Vec<SkippedAxis>,
}

/// What a descent found.
pub(crate) struct Descended {
    pub best: Option<Candidate>,
    /// The axes with candidates that the budget's end left unmeasured; `None` where it did not
    /// end within the descent (or a stop did).
    pub not_reached: Option<Vec<String>>,
    /// The axes not measured: by the ceilings, nothing beyond the noise to win there.
    pub skipped: Vec<SkippedAxis>,
}

impl Descend {
    pub fn new(axes: &'static [Axis], best: Option<Candidate>, base: &Candidate) -> Self {
        Descend {
            axes: axes.to_vec(),
            ordered: false,
            k: 0,
            best,
            base: base.clone(),
            proposed: false,
            not_reached: None,
            skipped: Vec::new(),
        }
    }

    /// The candidate the axes vary from: the best so far (else the baseline) inside the user's
    /// space (the defaults are the reference, not a start for knobs the user excluded).
    fn from(&self, view: &View) -> Candidate {
        in_space(view.settings, self.best.as_ref().unwrap_or(&self.base))
    }

    /// The last group's choice kept, and said.
    fn hear(&mut self, view: &View, chosen: Option<Candidate>) {
        if let Some(b) = chosen {
            self.best = Some(b);
        }
        if let Some(b) = &self.best {
            let margin = view.margin_over_runner_up(b);
            (view.progress).best(
                &b.label(),
                margin,
                view.elapsed(),
                view.settings.time_budget,
            );
        }
    }
}

impl Strategy for Descend {
    type Output = Descended;

    fn next(&mut self, view: &View, chosen: Option<Candidate>) -> Option<Group> {
        if std::mem::take(&mut self.proposed) {
            self.hear(view, chosen);
        }
        if !std::mem::replace(&mut self.ordered, true) {
            let from = self.from(view);
            self.axes = view.by_gain_per_second(&self.axes, &from);
        }
        while let Some(&Axis {
            name: axis, vary, ..
        }) = self.axes.get(self.k)
        {
            if view.past_budget() {
                // The budget's doing, not an interruption's (that run resumes where it stopped).
                if !view.stopped() {
                    let rest = &self.axes[self.k..];
                    self.not_reached = Some(view.axes_with_candidates(rest, &self.from(view)));
                }
                self.k = self.axes.len();
                return None;
            }
            self.k += 1;
            let from = self.from(view);
            let mut group: Vec<Candidate> = vary(view.settings, &from)
                .into_iter()
                .filter(|c| c.validate().is_ok())
                .collect();
            if !group.contains(&from) {
                group.insert(0, from.clone());
            }
            group.dedup();
            if group.len() < 2 && self.best.is_some() {
                continue;
            }
            if let Some(s) = view.skip_if_nothing_to_win(axis, &group, &from) {
                self.skipped.push(s);
                continue;
            }
            self.proposed = true;
            // The best so far measured first at the group's size: a budget that ends within the
            // round still leaves what the others are compared with.
            return Some(Group {
                promising: vec![from],
                ..Group::new(group, axis)
            });
        }
        None
    }

    fn finish(self, _: &View) -> Descended {
        Descended {
            best: self.best,
            not_reached: self.not_reached,
            skipped: self.skipped,
        }
    }
}
