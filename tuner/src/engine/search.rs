//! The search: the order in which the strategies take the knobs. The placement first (llama.cpp's
//! defaults and the GPU-layer placements around them, then the walk below the most that fit), the
//! host's axes or the expert challenge, the split and the backends, the coordinate descent over
//! the rest of the axes, and the placement and split again once the cache and micro-batch are
//! chosen. Each step is a [`Strategy`](super::strategy::Strategy) that proposes from what is
//! measured so far; the engine's one loop ([`Engine::drive`]) measures.

use super::challenge::ExpertChallenge;
use super::group::Group;
use super::placement::BelowTheTop;
use super::strategy::{Descend, Once};
use super::{grid, host_weights, strongest_lever, Axis, Engine, AXES, HOST_AXES};
use search_space::Candidate;

impl Engine<'_> {
    /// The coordinate-descent search. Returns the winner (if anything was measured). Each step is
    /// a strategy that proposes from what is measured so far, driven by the one loop that measures
    /// (`engine/strategy.rs`).
    pub fn run(&mut self) -> Option<Candidate> {
        self.probe_device_bandwidths();
        let base = self.baseline();
        let first = self.first_group(&base);
        let (group, placements) = (first.candidates.clone(), first.axis == "gpu layers");
        let mut best = self.drive(Once::new(first, None));
        if placements {
            let walk = BelowTheTop::new(&self.view(), &self.placement_start(&base), best);
            best = self.drive(walk);
        }
        if let Some(b) = best.take() {
            let b = if host_weights(&self.settings, &b) {
                self.descend(&HOST_AXES, Some(b.clone()), &base)
                    .unwrap_or(b)
            } else {
                self.challenge_with_experts(&group, b, &base)
            };
            let b = self.search_split(b);
            best = Some(self.compare_backends(b));
        }
        let best = self.descend(&AXES, best, &base);
        match best {
            // The split again once the KV cache and micro-batch are chosen: with room to spare,
            // moving layers to the faster device pays where at f16 every byte was needed.
            Some(b) if !self.out_of_time() => {
                let b = self.trade_layers_for_batch(b);
                let b = self.refit_layers(b);
                Some(self.search_split(b))
            }
            other => other,
        }
    }

    /// One pass of the coordinate descent over `axes` from `best` ([`Descend`]); a budget that ends
    /// on the way records the axes left.
    fn descend(
        &mut self,
        axes: &'static [Axis],
        best: Option<Candidate>,
        base: &Candidate,
    ) -> Option<Candidate> {
        let out = self.drive(Descend::new(axes, best, base));
        if let Some(left) = out.not_reached {
            self.not_reached = left;
        }
        self.record_skips(out.skipped);
        out.best
    }

    /// The expert challenge to `best` from the first group's placements ([`ExpertChallenge`]);
    /// returns the faster.
    pub(crate) fn challenge_with_experts(
        &mut self,
        group: &[Candidate],
        best: Candidate,
        base: &Candidate,
    ) -> Candidate {
        let (won, not_reached) = self.drive(ExpertChallenge::new(&self.view(), group, best, base));
        if let Some(left) = not_reached {
            self.not_reached = left;
        }
        won
    }

    /// The first group measured: the defaults, and with a non-CPU device the GPU-layer placements
    /// around them (placement first: it matters most, and every placement gets its first
    /// repetitions before any gets more).
    fn first_group(&self, base: &Candidate) -> Group {
        if !self.settings.offload || self.settings.n_gpu_layers_pinned() {
            let mut group = vec![base.clone()];
            group.extend(self.unpacked_where_unfit(base));
            return Group::new(group, "defaults");
        }
        let start = self.placement_start(base);
        let mut group = self.placement_group(&start);
        if self.settings.moe {
            group.extend(self.expert_group(&start));
        } else if self.settings.plan.host_ffns {
            group.extend(self.ffn_group(&start));
        }
        if !group.contains(base) {
            group.insert(0, base.clone());
        }
        let mut promising: Vec<Candidate> = strongest_lever(&group, &start).into_iter().collect();
        // Hosts over clearly different links: the nearest alone right after the baseline, before
        // placements whose every load sends weights over the slowest link too.
        let near = self.nearest_hosts(&self.plain(&start));
        if let Some(near) = near.and_then(|c| self.like(&c, &start)) {
            if !group.contains(&near) {
                group.push(near.clone());
            }
            promising.insert(0, near);
        }
        Group {
            promising,
            ..Group::new(group, "gpu layers")
        }
    }

    /// `base` with plain kernels where it does not fit the budgets and that does: repacked weights
    /// are a copy in RAM, so a model larger than the RAM, which llama.cpp runs from its mapping,
    /// runs with plain kernels or not at all (llama.cpp's defaults would be killed for memory).
    fn unpacked_where_unfit(&self, base: &Candidate) -> Option<Candidate> {
        let plain = search_space::KernelChoice::Plain;
        if base.kernels == plain || !self.settings.plan.kernels.contains(&plain) {
            return None;
        }
        self.check_fit(base).err().filter(|u| u.over_budget)?;
        let c = Candidate {
            kernels: plain,
            ..base.clone()
        };
        self.check_fit(&c).is_ok().then_some(c)
    }

    /// Grid mode (`--exhaustive`): every combination of the declared knob values, measured with the
    /// same protocol (shuffled rounds, the same stopping rule), then the same decision rule.
    pub fn run_exhaustive(&mut self) -> Option<Candidate> {
        let base = self.baseline();
        let mut grid = grid(&self.settings, &base);
        // Where a GPU shows through several backends, the backend is one more knob of the grid.
        let through: Vec<Candidate> = (self.settings.backends.iter().skip(1))
            .flat_map(|b| grid.iter().map(|c| self.on_backend(&self.plain(c), b)))
            .collect();
        grid.extend(through);
        self.drive(Once::new(Group::new(grid, "grid"), None))
    }
}
