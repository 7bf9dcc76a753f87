//! The run's time, set once and said before the search goes beyond llama.cpp's defaults: what one
//! request costs here (the defaults' first visit), the default budget sized from it, what the search
//! expects to take within the budget, and how far the defaults are from the ceilings (the most the
//! search could still gain). Nothing grows after that: the budget said is the budget kept.

use super::ceiling::at_most;
use super::confirm::{CONFIRM_ROUNDS, RESERVED_FINALISTS};
use super::result::rep_seconds;
use super::{in_space, Engine, AXES, VISITS};
use crate::measuring::{BudgetFrom, Screen, TimePlan};
use crate::stats::Sample;
use search_space::{Candidate, Phases};
use std::time::Duration;

impl Engine<'_> {
    /// Once the baseline's first visit is measured (its load, warm-up and two repetitions), and
    /// only then: the default budget sized on it ([`VISITS`] such visits where that is more, up to
    /// its cap), and the [`TimePlan`] said. A resumed run tells what the reused repetitions took
    /// from their load time and rates, as the run that measured them did.
    pub(super) fn plan_time(&mut self) {
        if self.time_plan.is_some() {
            return;
        }
        let Some((base, _)) = self.defaults.clone() else {
            return;
        };
        let w = self.settings.plan.workload.clone();
        // The defaults, or where they could not run (a model larger than the RAM, repacked) the
        // first configuration measured in their place.
        let Some(r) = (self.results.iter().find(|r| r.candidate == base))
            .filter(|r| r.failure.is_none() && r.skipped.is_none())
            .or_else(|| self.results.iter().find(|r| r.reps.len() >= 2))
            .filter(|r| r.reps.len() >= 2)
        else {
            return;
        };
        let base = r.candidate.clone();
        let visit = if r.seconds > 0.0 {
            r.seconds
        } else {
            r.visit_seconds_from_figures(&w)
        };
        let Some(request) = Sample::new(r.scores(&w)).ok().map(|s| s.median()) else {
            return;
        };
        let repetitions = r.reps.iter().map(|x| rep_seconds(x, &w)).collect();
        let repetition = Sample::new(repetitions).map_or(request, |s| s.median());
        if visit <= 0.0 {
            return;
        }
        let median = |f: fn(&crate::measuring::Repetition) -> f64| {
            Sample::new(r.reps.iter().map(f).collect()).map_or(0.0, |s| s.median())
        };
        let (pp_tps, tg_tps) = (median(|x| x.pp_tps), median(|x| x.tg_tps));
        let load_s = r.load.as_ref().map_or(0.0, |l| l.load_seconds);
        // The first visit's own repetitions at the size they were measured at: the rest of it is
        // the warm-up and a context's making, which every new context pays.
        let measured = self.measured_workload();
        let own: f64 = (r.reps.iter().take(2))
            .map(|x| rep_seconds(x, &measured))
            .sum();
        let warm_up_s = (visit - load_s - own).max(0.0);
        let mut budget_from = BudgetFrom::Given;
        if let Some(cap) = self.settings.time_budget_cap {
            self.visit_seconds = Some(visit);
            let want = Duration::from_secs_f64(visit * VISITS).min(cap);
            budget_from = if want > self.settings.time_budget {
                BudgetFrom::Grown
            } else {
                BudgetFrom::Default
            };
            self.settings.time_budget = self.settings.time_budget.max(want);
        }
        let budget = self.settings.time_budget.as_secs_f64();
        let (shares, room) = self.headroom(&base);
        let plan = TimePlan {
            request_s: request,
            visit_s: visit,
            repetition_s: repetition,
            load_s,
            warm_up_s,
            pp_tps,
            tg_tps,
            budget_s: budget,
            expected_s: 0.0,
            gate_s: None,
            prompt_share: shares.0,
            generation_share: shares.1,
            at_most: room,
            budget_from,
            at_s: self.elapsed().as_secs_f64(),
        };
        self.say_plan(plan, &base);
    }

    /// `plan` with what the run expects to take from `base` (priced by the plan's own figures),
    /// said and kept.
    fn say_plan(&mut self, mut plan: TimePlan, base: &Candidate) {
        self.time_plan = Some(plan.clone());
        let (search, gate) = self.expected_seconds(base);
        plan.expected_s = (plan.at_s + search).min(plan.budget_s);
        let left = plan.budget_s - plan.expected_s;
        plan.gate_s = gate.filter(|g| *g > 0.0).map(|g| g.min(left));
        self.progress.plan(&plan);
        self.time_plan = Some(plan);
    }

    /// Whether a step of the run that costs about `seconds` would end past the budget, the time
    /// the confirmation needs kept aside where `reserve` (the search's steps): it is not begun,
    /// so that the run ends within the budget it said. Nothing is refused before the plan is made
    /// (the first visit is always measured).
    pub(super) fn would_overrun(&self, seconds: f64, reserve: bool) -> bool {
        if self.time_plan.is_none() {
            return false;
        }
        let kept = if reserve { self.confirm_reserve() } else { 0.0 };
        self.elapsed().as_secs_f64() + seconds + kept > self.settings.time_budget.as_secs_f64()
    }

    /// What the confirmation needs: [`RESERVED_FINALISTS`] finalists, [`CONFIRM_ROUNDS`]
    /// repetitions each on the workload's request, each on a fresh load. A run that measures its
    /// candidates whole keeps that time only while the best so far changes the output: its
    /// lossless twin must be measured beside it (a lossy setting wins only by being faster than
    /// the same configuration without it), where otherwise the budget could end first.
    fn confirm_reserve(&self) -> f64 {
        if self.settings.plan.exhaustive {
            return 0.0;
        }
        if !self.settings.screen && !self.leader_is_lossy() {
            return 0.0;
        }
        RESERVED_FINALISTS * f64::from(CONFIRM_ROUNDS) * self.confirm_cost()
    }

    /// The fastest candidate measured so far (by its median), the gate's refusals left out.
    fn leader(&self) -> Option<&super::CandidateResult> {
        let w = &self.settings.plan.workload;
        let rate = |r: &super::CandidateResult| r.rate_sample(w).map(|s| s.median());
        (self.results.iter())
            .filter(|r| r.ok() && !self.refused(&r.candidate))
            .filter_map(|r| Some((rate(r)?, r)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, r)| r)
    }

    /// Whether the fastest candidate measured so far changes the model's output and has a
    /// lossless twin the user allows, which the confirmation would measure beside it.
    fn leader_is_lossy(&self) -> bool {
        self.leader().is_some_and(|r| {
            let twin = search_space::knob::lossless_twin(&r.candidate);
            twin != r.candidate && self.settings.kv_pairs.contains(&(twin.type_k, twin.type_v))
        })
    }

    /// One confirming repetition: a load, its warm-up and the confirmation's request
    /// ([`Engine::confirm_screen`]), at the figures of the fastest candidate so far where it
    /// was measured in both phases (the finalists are it and its closest rivals: on a 7B on two
    /// cores a plain load took 0.3 s and a repacked one, llama.cpp's default, 11.8), else at the
    /// defaults'.
    pub(super) fn confirm_cost(&self) -> f64 {
        let Some(p) = &self.time_plan else {
            return 0.0;
        };
        let screen = self.confirm_screen();
        let load = (self.leader())
            .and_then(|r| Some(r.load.as_ref()?.load_seconds))
            .map_or(p.load_s, |l| l.min(p.load_s));
        load + self.fresh_warm_up_s() + self.repetition_cost_at(Phases::BOTH, screen)
    }

    /// What the quality gate's evaluation of one K/V pair takes: two contexts (the pair's and
    /// the f16 reference's) through the text at the defaults' prompt rate.
    pub(super) fn gate_cost(&self) -> f64 {
        let pp = self.time_plan.as_ref().map_or(0.0, |p| p.pp_tps);
        match self.settings.quality.max_kv_kld {
            Some(_) if pp > 0.0 => 2.0 * f64::from(self.settings.quality.max_tokens) / pp,
            _ => 0.0,
        }
    }

    /// Whether a first visit of the lossy `c` (costing `cost`), then the gate's evaluation of its
    /// K/V pair (not yet measured in this run) and the confirmation, would end past the budget:
    /// it could not win then (an unmeasured pair never does), and its visit is time the axes
    /// after it need.
    pub(super) fn gate_would_overrun(&self, c: &Candidate, cost: f64) -> bool {
        search_space::knob::lossy(c)
            && self.kv_check(c).is_none()
            && self.would_overrun(cost + self.gate_cost(), true)
    }

    /// What measuring `c` once more costs at the request size decided at, timing `phases`: its
    /// first visit (a load where its model is not the one loaded, the warm-up and the two
    /// repetitions it takes), or one repetition; at the defaults' rates.
    pub(super) fn step_cost(&self, c: &Candidate, first: bool, phases: Phases) -> f64 {
        self.step_cost_at(c, first, phases, self.fidelity)
    }

    /// [`Self::step_cost`] at the request size `screen` (`None`: the workload's own).
    pub(super) fn step_cost_at(
        &self,
        c: &Candidate,
        first: bool,
        phases: Phases,
        screen: Option<Screen>,
    ) -> f64 {
        let Some(p) = &self.time_plan else {
            return 0.0;
        };
        let rep = self.repetition_cost_at(phases, screen);
        if !first {
            return rep;
        }
        // A new context on a model already loaded warms up on a few tokens (the worker's
        // `warm_up`), not on the whole prompt the first visit's figure holds.
        let (load, warm_up) = match self.loaded.contains(&search_space::knob::model_key(c)) {
            true => (0.0, self.short_warm_up_s()),
            false => (p.load_s, self.fresh_warm_up_s()),
        };
        load + warm_up + 2.0 * rep
    }

    /// The warm-up after a load, as the first visit's took (a context's making and a few
    /// tokens: the worker's `warm_up`), whatever the request measured after it.
    fn fresh_warm_up_s(&self) -> f64 {
        self.time_plan.as_ref().map_or(0.0, |p| p.warm_up_s)
    }

    /// The warm-up of a new context on a model already loaded: a few prompt tokens and generation
    /// steps, at the defaults' rates (and never more than the first visit's).
    fn short_warm_up_s(&self) -> f64 {
        let Some(p) = &self.time_plan else {
            return 0.0;
        };
        let np = f64::from(self.settings.plan.workload.n_parallel.max(1));
        let prompt = f64::from(crate::worker::server::WARM_UP_TOKENS) / p.pp_tps.max(1e-9);
        let steps = f64::from(crate::worker::timing::WARM_UP_STEPS) / p.tg_tps.max(1e-9);
        (np * (prompt + steps)).min(p.warm_up_s)
    }

    /// One repetition at the request size `screen`, timing `phases`, at the rates of the fastest
    /// candidate measured so far in both phases where it is faster than llama.cpp's defaults (an
    /// axis varies it, and a candidate much slower is stopped early: [`super::GIVE_UP_FACTOR`]),
    /// else at the defaults'. On the 7B on two cores the defaults' rates priced a repetition of
    /// the plain kernels' groups 45% over what it took, and the budget refused two axes for it.
    fn repetition_cost_at(&self, phases: Phases, screen: Option<Screen>) -> f64 {
        let Some(p) = &self.time_plan else {
            return 0.0;
        };
        let at_defaults = self.repetition_at_rates(phases, screen, p.pp_tps, p.tg_tps);
        let leader = (self.leader())
            .and_then(|r| self.phase_medians(&r.candidate))
            .map(|(pp, tg)| self.repetition_at_rates(phases, screen, pp, tg));
        leader.map_or(at_defaults, |l| l.min(at_defaults))
    }

    /// One repetition at the request size `screen`, timing `phases`, at the rates `pp` and `tg`.
    fn repetition_at_rates(&self, phases: Phases, screen: Option<Screen>, pp: f64, tg: f64) -> f64 {
        let w = self.workload_at(screen);
        let np = f64::from(w.n_parallel.max(1));
        let (pp, tg) = (pp.max(1e-9), tg.max(1e-9));
        let prompt = if phases.prompt {
            f64::from(w.n_prompt) / pp
        } else {
            0.0
        };
        let generation = if phases.generation {
            f64::from(w.n_gen) / tg
        } else {
            0.0
        };
        // A depth is filled before each phase at it (untimed, but it takes its time).
        let fill = f64::from(w.depth) / pp * if w.depth > 0 { 2.0 } else { 0.0 };
        np * (prompt + generation + fill)
    }

    /// The baseline's rates as shares of the ceilings (prompt, generation), and the most a request
    /// could gain with both at their ceilings.
    fn headroom(&self, base: &Candidate) -> ((Option<f64>, Option<f64>), Option<f64>) {
        let Some((pp, tg)) = self.phase_medians(base) else {
            return ((None, None), None);
        };
        let c = &self.settings.ceilings;
        let share = |now: f64, ceiling: Option<f64>| {
            super::ceiling::ceiling_of(now, ceiling).map(|x| (now / x).min(1.0))
        };
        let both = Phases {
            prompt: true,
            generation: true,
        };
        let room = at_most(c, pp, tg, both, &self.settings.plan.workload);
        ((share(pp, c.prompt_tps), share(tg, c.generation_tps)), room)
    }

    /// What the run is expected to take after the baseline's first visit: where the host alone
    /// computes, every descent axis's new candidates (those the ceilings leave room for) in the
    /// axes' order, each a first visit at the request its axis screens on and its further
    /// repetitions up to the minimum (the best so far measured again where that request is a new
    /// size), less what would end past the budget (a quantized candidate with its pair's quality
    /// evaluation: it is not visited then), and the confirmation; and apart, what that evaluation
    /// of one quantized cache would add where one is visited. With a device to offload to the
    /// placements, the cliff and the split depend on what is measured: the budget.
    fn expected_seconds(&self, base: &Candidate) -> (f64, Option<f64>) {
        let s = &self.settings;
        if s.offload {
            return (s.time_budget.as_secs_f64(), None);
        }
        let from = in_space(s, base);
        let (budget, at) = (s.time_budget.as_secs_f64(), self.elapsed().as_secs_f64());
        let (reserve, gate) = (self.confirm_reserve(), self.gate_cost());
        let mut seen: Vec<Candidate> = vec![from.clone()];
        let (mut spent, mut size, mut lossy) = (0.0, Some(self.fidelity), false);
        for axis in &AXES {
            let group: Vec<Candidate> = std::iter::once(from.clone())
                .chain((axis.vary)(s, &from))
                .filter(|c| c.validate().is_ok())
                .collect();
            if group.len() < 2 || self.nothing_to_win(axis.name, &group, &from).is_some() {
                continue;
            }
            let screen = self.screen_for(&group, axis.name);
            let phases = search_space::knob::phases_moved(&group);
            // The best so far measured again where the group's request is a new size.
            if size != Some(screen) {
                spent += 2.0 * self.repetition_cost_at(phases, screen);
                size = Some(screen);
            }
            for c in group {
                if seen.contains(&c) {
                    continue;
                }
                let cost = self.visit_cost(&c, phases, screen);
                // A lossy candidate whose gate could not run is not measured (`measure_group`),
                // nor anything that would end past the budget.
                let gated = if c.kv_lossy() { gate } else { 0.0 };
                if at + spent + cost + gated + reserve > budget {
                    continue;
                }
                lossy |= c.kv_lossy();
                spent += cost;
                seen.push(c);
            }
        }
        (spent + reserve, lossy.then_some(gate))
    }

    /// A new candidate's first visit at the request `screen`, timing `phases`, and its further
    /// repetitions up to the minimum (a screen's minimum is its first visit's two:
    /// [`Engine::wants_more`]).
    fn visit_cost(&self, c: &Candidate, phases: Phases, screen: Option<Screen>) -> f64 {
        let more = match screen {
            Some(_) => 0.0,
            None => f64::from(self.settings.plan.min_reps.saturating_sub(2)),
        };
        self.step_cost_at(c, true, phases, screen) + more * self.repetition_cost_at(phases, screen)
    }
}
