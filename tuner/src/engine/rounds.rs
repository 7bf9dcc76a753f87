//! Measuring a group of candidates in interleaved, shuffled rounds: each round runs every
//! unfinished candidate once, so slow drift of the machine hits all of them alike; a candidate
//! stops when its confidence interval is tight, it reaches its limits, or it clearly loses.

use super::confirm::CONFIRM;
use super::lent::Lent;
use super::result::score_seconds;
use super::{Engine, BUDGET_SPENT};
use crate::measuring::{GiveUp, Repetition, TrialFailure};
use crate::stats::{self, Sample};
use profiles::measurements::Record;
use search_space::{Candidate, Phases};
use std::time::Duration;

/// A candidate's first repetition stops once its own time proves a request this many times slower
/// than the best median measured so far: it cannot win, and finishing it (the CPU-only point of a
/// model that belongs on a GPU takes minutes) would spend the budget the axes after it need. Above
/// [`ONE_REPETITION_FACTOR`], the stop after a whole repetition, which keeps that repetition's
/// figures. Above 1.5, or the stop after one repetition would never be reached; 1.75 rather than
/// 2 saved time at the same hit rates on `bench/vs-tuners` (docs/benchmarks.md, "The figures behind
/// the search's choices"): on landscape 132 each of three GPUs alone, with 46 of 69 layers left on
/// the host, stopped at 45.0 s a request, not 51.4.
pub const GIVE_UP_FACTOR: f64 = 1.75;

/// A candidate's first visit takes no second repetition once its first (after a discarded warm-up)
/// took this many times the best median measured so far a request: it cannot win either, and on a
/// model that takes a minute a request (a CPU-only point, one GPU alone at half the layers) the
/// second repetition is the time the axes after it need. Wide of any noise seen between repetitions
/// (medians of one configuration 8% apart on a shared VM). What it moved on `bench/vs-tuners`:
/// docs/benchmarks.md, "The figures behind the search's choices".
pub const ONE_REPETITION_FACTOR: f64 = 1.5;

/// Where the run screens, a first visit takes no second repetition once its first took more than
/// this many noise thresholds over the best median (at most [`ONE_REPETITION_FACTOR`]): a screen
/// ranks, the finalists are measured again whole, and a short repetition costs no load. At the
/// default 2% that is 12% slower: six times the noise, wide of the 3-9% one load's repetitions of
/// pp512 spread on a 2-core VM; on the 7B there, `-t 1` and `-tb 1` (a request 38% slower on the
/// screen) each took a second 14-s repetition to be judged.
pub const SCREEN_ONE_REPETITION_NOISES: f64 = 6.0;

/// Why a lossy candidate was not measured: its gate could not have run.
pub const GATE_WOULD_OVERRUN: &str =
    "not measured: the quality gate's evaluation of its cache would not end within the budget";

/// The signal a kill sends (the OOM killer's, a user's): not a crash to measure on after.
const SIGKILL: i32 = 9;

impl Engine<'_> {
    /// Whether a candidate needs more repetitions.
    pub(super) fn wants_more(&self, i: usize, spent: Duration) -> bool {
        let r = &self.results[i];
        if r.failure.is_some() || r.skipped.is_some() || r.halted.is_some() {
            return false;
        }
        let n = r.reps.len() as u32;
        // A screen ranks, and the finalists are measured again whole: its first visit's two
        // repetitions are its minimum.
        let min_reps = match self.fidelity {
            Some(_) => self.settings.plan.min_reps.min(2),
            None => self.settings.plan.min_reps,
        };
        if n < min_reps {
            return true;
        }
        if n >= self.settings.plan.max_reps || spent >= self.settings.plan.candidate_cap {
            return false;
        }
        match r.rate_sample(&self.settings.plan.workload) {
            Some(s) => !stats::enough(&s, self.settings.plan.noise),
            None => true,
        }
    }

    /// Measures a group of candidates in interleaved, shuffled rounds until each is precise enough,
    /// capped, failed, or the run is out of time. A candidate the group names twice (the MoE
    /// placement's every expert on its device is also the most layers that fit; a filled split can be
    /// a device alone) is measured once a round, as any other.
    pub fn measure_group(&mut self, group: &[Candidate], axis: &str) {
        self.decide_at(self.screen_for(group, axis));
        let idx = self.fitted_indices(group);
        self.lent = self.lent_for(&idx, axis);
        let mut spent = vec![Duration::ZERO; idx.len()];
        let mut dropped = vec![false; idx.len()];
        if axis != "grid" {
            self.skip_futile_lossy(&idx);
        }
        // A group whose comparison cannot be measured before the budget's end is not begun: its
        // first visit alone would be time spent on nothing to compare.
        if axis != "grid" && !self.room_to_compare(&idx) {
            self.budget_spent = true;
        }
        loop {
            self.drop_clear_losers(&idx, &mut dropped);
            let pending: Vec<usize> = (0..idx.len())
                .filter(|&k| !dropped[k] && self.wants_more(idx[k], spent[k]))
                .collect();
            if pending.is_empty() || self.alone_and_judged(&pending, &idx) || self.out_of_time() {
                break;
            }
            self.round += 1;
            let mut order = stats::shuffled_order(
                pending.len(),
                self.settings.plan.seed.wrapping_add(self.round),
            );
            self.baseline_first(&mut order, &pending, &idx);
            for o in order {
                if self.out_of_time() {
                    break;
                }
                let k = pending[o];
                let i = idx[k];
                // What could not end before the budget does is not begun (grid mode measures all).
                let first = self.results[i].reps.is_empty();
                let timed = self.lent.as_ref().map_or(Phases::BOTH, |l| l.timed);
                let cost = self.step_cost(&self.results[i].candidate, first, timed);
                if axis != "grid" && self.would_overrun(cost, true) {
                    self.budget_spent = true;
                    break;
                }
                // Here too: the time said (and so the check) may come within the group, once
                // llama.cpp's defaults in it are measured.
                if axis != "grid" && first && self.skip_if_gate_would_overrun(i, cost) {
                    continue;
                }
                // A candidate's first visit takes the two repetitions it needs to be judged at all,
                // on one load: with loads that cost seconds (a GPU's gigabytes, an RPC upload) a
                // budget that ends after one round still leaves every visited candidate measured.
                let visit = if first { 2 } else { 1 };
                for _ in 0..visit {
                    let t = self.elapsed();
                    self.measure_once(i, axis);
                    let took = self.elapsed().saturating_sub(t);
                    spent[k] += took;
                    self.results[i].seconds += took.as_secs_f64();
                    // A budget that ends during the first repetition still lets the second run
                    // on the load already paid for, so the visited candidate can be judged; only
                    // an interruption (or a failure) cuts a visit short.
                    self.out_of_time();
                    let r = &self.results[i];
                    if r.failure.is_some() || r.skipped.is_some() || self.interrupted {
                        break;
                    }
                    if let Some(f) = self.far_behind(i).filter(|_| stops_early(axis)) {
                        self.end_with(i, f);
                        break;
                    }
                }
            }
        }
        self.lent = None;
        self.mark_unmeasured(&idx);
    }

    /// Skips the group's quantized candidates not yet visited whose visit, their pair's quality
    /// evaluation and the confirmation would end past the budget ([`Engine::gate_would_overrun`]).
    fn skip_futile_lossy(&mut self, idx: &[usize]) {
        let timed = self.lent.as_ref().map_or(Phases::BOTH, |l| l.timed);
        for &i in idx {
            let r = &self.results[i];
            if !r.reps.is_empty() || r.failure.is_some() || r.skipped.is_some() {
                continue;
            }
            let cost = self.step_cost(&r.candidate, true, timed);
            self.skip_if_gate_would_overrun(i, cost);
        }
    }

    /// Marks candidate `i` (a first visit costing `cost`) skipped where its gate could not run;
    /// whether it did.
    fn skip_if_gate_would_overrun(&mut self, i: usize, cost: f64) -> bool {
        let futile = self.gate_would_overrun(&self.results[i].candidate, cost);
        if futile {
            self.results[i].skipped = Some(GATE_WOULD_OVERRUN.to_string());
        }
        futile
    }

    /// Where the budget or a stop ended a group, its candidates measured at no size say why.
    fn mark_unmeasured(&mut self, idx: &[usize]) {
        if !self.budget_spent && !self.interrupted {
            return;
        }
        let why = if self.interrupted {
            "not measured: interrupted"
        } else {
            BUDGET_SPENT
        };
        for &i in idx {
            let r = &mut self.results[i];
            if !r.measured_at_any_size() && r.failure.is_none() && r.skipped.is_none() {
                r.skipped = Some(why.to_string());
            }
        }
    }

    /// Whether the budget leaves time for the two cheapest first visits the group still needs
    /// (a candidate beside one measured at this size, or two new ones): a comparison's least.
    fn room_to_compare(&self, idx: &[usize]) -> bool {
        let timed = self.lent.as_ref().map_or(Phases::BOTH, |l| l.timed);
        let mut costs: Vec<f64> = (idx.iter())
            .map(|&i| &self.results[i])
            .filter(|r| r.reps.is_empty() && r.failure.is_none() && r.skipped.is_none())
            .map(|r| self.step_cost(&r.candidate, true, timed))
            .collect();
        costs.sort_by(f64::total_cmp);
        let need: f64 = costs.iter().take(2).sum();
        !self.would_overrun(need, true)
    }

    /// What a group's repetitions need not time: where its candidates differ only in knobs that
    /// cannot move one phase of a request (the knob table's `moves`: the prompt's threads, the
    /// batch sizes and op offload move the prompt alone; the generation threads, with the prompt's
    /// held, generation alone), that phase's figures are the same for all of them, so each
    /// repetition times the other phase and borrows these: the medians of the phase over the
    /// group's repetitions that timed it. None where nothing moves one phase alone, where no
    /// repetition of the group timed the other phase yet (the first visits time both), with
    /// several sequences at once (their generation batches are prompt-like), and in the
    /// confirmation and the grid (measured whole).
    fn lent_for(&self, idx: &[usize], axis: &str) -> Option<Lent> {
        if !stops_early(axis) || self.settings.plan.workload.n_parallel > 1 {
            return None;
        }
        let cs: Vec<Candidate> = idx
            .iter()
            .map(|&i| self.results[i].candidate.clone())
            .collect();
        let moved = search_space::knob::phases_moved(&cs);
        if moved.is_both() || moved == Phases::NONE {
            return None;
        }
        let whole: Vec<&Repetition> = (idx.iter())
            .flat_map(|&i| self.results[i].reps.iter())
            .filter(|r| r.timed.is_both())
            .collect();
        Lent::of(moved, &whole)
    }

    /// The results' indices of a group's candidates, each once, each with llama.cpp's fit asked
    /// (a candidate that does not fit is skipped with the reason).
    pub(super) fn fitted_indices(&mut self, group: &[Candidate]) -> Vec<usize> {
        let mut idx: Vec<usize> = Vec::with_capacity(group.len());
        for c in group {
            let i = self.index_of(c);
            if !idx.contains(&i) {
                idx.push(i);
            }
        }
        for &i in &idx {
            if self.results[i].predicted.is_none() && self.results[i].skipped.is_none() {
                let c = self.results[i].candidate.clone();
                match self.check_fit(&c) {
                    Ok(report) => self.results[i].predicted = Some(report),
                    Err(unfit) => {
                        self.results[i].skipped = Some(unfit.why);
                        self.results[i].over_budget = unfit.over_budget;
                    }
                }
            }
        }
        idx
    }

    /// Moves the baseline's first visit to the front of a round (the headline compares the winner
    /// with it), then the group's most promising candidates' ([`Engine::promising`], in its order):
    /// a budget that ends in the first round still leaves them measured. Later rounds stay shuffled.
    pub(super) fn baseline_first(&self, order: &mut Vec<usize>, pending: &[usize], idx: &[usize]) {
        let base = self.defaults.as_ref().map(|(b, _)| b);
        let first_visit = |o: &usize, c: Option<&Candidate>| {
            let r = &self.results[idx[pending[*o]]];
            Some(&r.candidate) == c && r.reps.is_empty()
        };
        for c in self.promising.iter().rev().map(Some).chain([base]) {
            if let Some(k) = order.iter().position(|o| first_visit(o, c)) {
                let o = order.remove(k);
                order.insert(0, o);
            }
        }
    }

    /// Successive-halving style early stop: a candidate whose best repetition is slower than the
    /// group leader's median by more than twice the noise threshold gets no more repetitions (it keeps
    /// its figures and its place on the leaderboard). Cheap short measurements for losers, longer ones
    /// for the leaders.
    pub(super) fn drop_clear_losers(&self, idx: &[usize], dropped: &mut [bool]) {
        let w = &self.settings.plan.workload;
        let samples: Vec<Option<Sample>> = idx
            .iter()
            .map(|&i| self.results[i].rate_sample(w))
            .collect();
        let Some(leader) = samples
            .iter()
            .flatten()
            .map(|s| s.median())
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
        else {
            return;
        };
        for (k, s) in samples.iter().enumerate() {
            if let Some(s) = s {
                if s.max() < leader * (1.0 - 2.0 * self.settings.plan.noise) {
                    dropped[k] = true;
                }
            }
        }
    }

    /// Whether a group's last pending candidate needs no more repetitions: the others are done
    /// (dropped as clear losers, failed, or precise) and it has its minimum. Its repetitions alone
    /// add no round shared with another candidate of the group, so they change none of the
    /// group's decisions (paired by round). It was measured on alone until its interval was
    /// tight, its `--max-reps` or its time cap; now it keeps repetitions to spare for the next
    /// axis, which measures it again beside its rivals (round by round) where one at its maximum
    /// would be compared with them unpaired (what it moved on `bench/vs-tuners`:
    /// docs/benchmarks.md, "The figures behind the search's choices").
    fn alone_and_judged(&self, pending: &[usize], idx: &[usize]) -> bool {
        let [k] = pending else { return false };
        idx.len() > 1 && self.results[idx[*k]].reps.len() as u32 >= self.settings.plan.min_reps
    }

    /// The limit of candidate `i`'s first repetition: [`GIVE_UP_FACTOR`] times the best median
    /// measured so far (none before anything is). Only a first repetition: a candidate with figures
    /// keeps them, whatever one slow repetition later says.
    fn give_up(&self, i: usize) -> Option<GiveUp> {
        let w = &self.settings.plan.workload;
        let best = self
            .results
            .iter()
            .enumerate()
            .filter(|&(j, r)| j != i && r.ok())
            .filter_map(|(_, r)| r.rate_sample(w))
            .map(|s| 1.0 / s.median())
            .fold(f64::INFINITY, f64::min);
        best.is_finite().then(|| GiveUp {
            limit_ms: (best * GIVE_UP_FACTOR * 1e3).ceil() as u64,
            best_ms: (best * 1e3).round() as u64,
        })
    }

    /// Whether candidate `i`'s one repetition took more than [`ONE_REPETITION_FACTOR`] times the
    /// best median measured so far a request (on a screen, [`SCREEN_ONE_REPETITION_NOISES`] noise
    /// thresholds more): how it stops (its repetition kept).
    fn far_behind(&self, i: usize) -> Option<TrialFailure> {
        let r = &self.results[i];
        let [rep] = r.reps.as_slice() else {
            return None;
        };
        let best_ms = self.give_up(i)?.best_ms;
        let factor = match self.fidelity {
            Some(_) => (1.0 + SCREEN_ONE_REPETITION_NOISES * self.settings.plan.noise)
                .min(ONE_REPETITION_FACTOR),
            None => ONE_REPETITION_FACTOR,
        };
        let limit_ms = (best_ms as f64 * factor).ceil() as u64;
        let took_ms = (score_seconds(rep, &self.settings.plan.workload) * 1e3).round() as u64;
        (took_ms > limit_ms).then(|| TrialFailure::GaveUp {
            limit_ms,
            best_ms,
            load: r.load.clone().map(Box::new),
            took_ms: Some(took_ms),
        })
    }

    /// Ends candidate `i`'s measurements with `f`: said (stopped as too slow, or failed), logged.
    fn end_with(&mut self, i: usize, f: TrialFailure) {
        let c = &self.results[i].candidate;
        if f.gave_up() {
            self.progress.stopped(&c.label(), &f.to_string());
        } else {
            self.progress.failed(&c.label(), &f.to_string());
        }
        if let Some(log) = self.log.as_deref_mut() {
            log.append(&Record::failure(c, &f));
        }
        self.results[i].failure = Some(f);
    }

    /// Whether a failure leaves the candidate measured on: a first crash after it had measured (it
    /// loads and runs: a crash now and then, as llvmpipe's on large batches, is not the
    /// configuration's figure, and ending the fastest configuration on it costs the run its best).
    /// Not a kill (the OOM killer's or a user's), and not a second crash.
    fn survives(&self, i: usize, f: &TrialFailure) -> bool {
        let r = &self.results[i];
        let crash = matches!(f, TrialFailure::Crashed { signal, .. } if *signal != SIGKILL);
        crash && !r.reps.is_empty() && r.crashed_once.is_none()
    }

    pub(super) fn measure_once(&mut self, i: usize, axis: &str) {
        let c = self.results[i].candidate.clone();
        let label = c.label();
        let mut req = self.request(&c);
        // The worker checks the prediction against what is free right before it loads, the host's
        // RAM included.
        if let Some(p) = &self.results[i].predicted {
            req.expect = p.per_device.clone();
            // Mapped weights the kernel may page need no free RAM (a model larger than it).
            let pageable = self.pageable(p);
            for e in req.expect.iter_mut().filter(|e| e.device == "CPU") {
                e.bytes = e.bytes.saturating_sub(pageable);
            }
        }
        if self.results[i].reps.is_empty() && stops_early(axis) {
            req.give_up = self.give_up(i);
        }
        if self.measurer.get_mut().crashes_for(&req) >= 2 {
            // One that had measured keeps its figures (a sporadic crash of the same placement in
            // other candidates is not its own); one that had not is skipped.
            let r = &mut self.results[i];
            if r.reps.len() >= 2 {
                r.halted = Some(format!(
                    "its placement crashed twice after it had measured; its figures stand on {} repetitions",
                    r.reps.len()
                ));
            } else {
                r.skipped = Some("skipped: this placement and kernel choice crashed twice".into());
            }
            return;
        }
        self.progress.candidate_started(&label, axis);
        let stop = self.stop;
        match self.measurer.get_mut().measure(&req, stop) {
            Ok(mut rep) => {
                if let Some(lent) = &self.lent {
                    lent.fill(&mut rep);
                }
                rep.screen = self.fidelity;
                self.now_loaded(&c);
                if let Some(l) = &rep.load {
                    self.results[i].load = Some(l.clone());
                }
                if let Some(log) = self.log.as_deref_mut() {
                    log.append(&Record::rep(&c, &rep));
                }
                self.progress.repetition(&label, &rep);
                self.results[i].reps.push(rep);
                self.results[i].rounds.push(Some(self.round));
            }
            Err(TrialFailure::Interrupted) => self.interrupted = true,
            Err(f) if self.survives(i, &f) => {
                self.progress
                    .failed(&label, &format!("{f}; measured again on a fresh worker"));
                if let Some(log) = self.log.as_deref_mut() {
                    log.append(&Record::failure(&c, &f));
                }
                self.results[i].crashed_once = Some(f);
            }
            Err(f) => {
                // A stopped repetition still loaded: its memory is a figure of the configuration.
                if let TrialFailure::GaveUp { load: Some(l), .. } = &f {
                    self.results[i].load = Some((**l).clone());
                }
                self.end_with(i, f);
            }
        }
    }
}

/// Whether an axis's candidates may stop as too slow ([`GIVE_UP_FACTOR`],
/// [`ONE_REPETITION_FACTOR`]): not in the confirmation, nor in grid mode (`--exhaustive`: every
/// combination measured in full, for those who want the whole grid).
fn stops_early(axis: &str) -> bool {
    axis != CONFIRM && axis != "grid"
}
