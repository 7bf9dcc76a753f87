//! The confirmation: the search's finalists measured again on the workload's whole prompt (and,
//! where the run screens, a short generation at its depth: [`Engine::confirm_screen`]), side by
//! side in interleaved rounds, each repetition on a fresh load, and the run's choice made among
//! them on those rounds alone. The finalists are the search's winner, the runner-up, llama.cpp's
//! defaults (the headline compares with them) and, where the winner changes the model's output (a
//! quantized cache), its lossless twin: every other knob equal, so that a lossy setting wins only
//! by being faster beyond the noise than the same configuration without it.

use super::run::TwinVerdict;
use super::Engine;
use crate::stats::{self, Sample};
use search_space::{knob, Candidate};

/// The axis name of the confirmation's group: measured whole, each repetition on a fresh load,
/// never stopped as too slow.
pub const CONFIRM: &str = "confirm";

/// Rounds the time reserved for the confirmation plans on: each finalist's minimum.
pub const CONFIRM_ROUNDS: u32 = 2;

/// Finalists the time reserved for the confirmation plans on: the winner and llama.cpp's defaults
/// (a runner-up or a lossless twin beside them take what the search left).
pub const RESERVED_FINALISTS: f64 = 2.0;

impl Engine<'_> {
    /// The finalists of a search that chose `winner` among `measured` (its choosable candidates,
    /// best first): the winner, the runner-up, llama.cpp's defaults where the search screened them
    /// and the winner's lossless twin where it is lossy and the user allows its cache. Each once,
    /// the winner first.
    pub(super) fn finalists(
        &self,
        winner: &Candidate,
        measured: &[Candidate],
        base: &Candidate,
    ) -> Vec<Candidate> {
        let mut out = vec![winner.clone()];
        let mut add = |c: Candidate| {
            if !out.contains(&c) {
                out.push(c);
            }
        };
        if let Some(r) = measured.iter().find(|c| *c != winner) {
            add(r.clone());
        }
        // The defaults' figures on the workload's request, where the search measured them on a
        // shorter one: the headline compares figures of one request.
        if self.settings.screen {
            add(base.clone());
        }
        let twin = knob::lossless_twin(winner);
        if twin != *winner && self.settings.kv_pairs.contains(&(twin.type_k, twin.type_v)) {
            add(twin);
        }
        out
    }

    /// Measures `finalists` on the confirmation's request in interleaved, shuffled rounds, each
    /// repetition on a fresh load (one load of a configuration can run several percent faster or
    /// slower than another for as long as it lives: `autotune measure --twice` without reloads
    /// called identical twins different on a VM): [`CONFIRM_ROUNDS`] each, and more while a
    /// finalist screened rather than measured whole wants them (its interval not yet tight, within
    /// its limits, not clearly behind). Returns each one's drift: its median on the confirmation's
    /// request over its median before the confirmation (at that request where the search measured
    /// it there, else where it was screened last), less one.
    pub(super) fn confirm(&mut self, finalists: &[Candidate]) -> Vec<(Candidate, f64)> {
        let w = self.settings.plan.workload.clone();
        let screened: Vec<Option<f64>> = (finalists.iter()).map(|c| self.median_rate(c)).collect();
        self.decide_at(self.confirm_screen());
        let idx = self.fitted_indices(finalists);
        let before: Vec<usize> = idx.iter().map(|&i| self.results[i].reps.len()).collect();
        let mut spent = vec![std::time::Duration::ZERO; idx.len()];
        let mut dropped = vec![false; idx.len()];
        for round in 0.. {
            self.drop_clear_losers(&idx, &mut dropped);
            let pending: Vec<usize> = (0..idx.len())
                .filter(|&k| !dropped[k] && self.confirms_more(idx[k], round, before[k], spent[k]))
                .collect();
            // The search stopped where its next step would have eaten into this time: only the
            // budget itself, or a stop, ends the confirmation.
            if pending.is_empty() || self.stopped() || self.elapsed() >= self.settings.time_budget {
                break;
            }
            self.round += 1;
            let mut measured = false;
            for o in stats::shuffled_order(pending.len(), self.settings.plan.seed ^ self.round) {
                if self.stopped() || self.would_overrun(self.confirm_cost(), false) {
                    break;
                }
                measured = true;
                let i = idx[pending[o]];
                self.measurer.get_mut().unload();
                self.loaded.clear();
                let t = self.elapsed();
                self.measure_once(i, CONFIRM);
                spent[pending[o]] += self.elapsed().saturating_sub(t);
            }
            if !measured {
                break;
            }
        }
        let median = |reps: &[crate::measuring::Repetition]| {
            let rates = reps.iter().map(|x| 1.0 / super::score_seconds(x, &w));
            Sample::new(rates.collect()).ok().map(|s| s.median())
        };
        // Against what the search measured of it: at the confirmation's request where it measured
        // it there (the defaults' first visit), else at the request it was screened on last.
        (idx.iter().zip(&before).zip(&screened))
            .filter_map(|((&i, &n0), screened)| {
                let r = &self.results[i];
                let n0 = n0.min(r.reps.len());
                let new = median(&r.reps[n0..])?;
                let old = median(&r.reps[..n0]).or(*screened)?;
                Some((r.candidate.clone(), new / old - 1.0))
            })
            .collect()
    }

    /// Whether finalist `i` takes another confirming repetition in round `round` (from 0): its
    /// [`CONFIRM_ROUNDS`] first; then, where its figures on the workload's request are the
    /// confirmation's alone (it was screened), while it wants more as any measurement does.
    fn confirms_more(
        &self,
        i: usize,
        round: u32,
        before: usize,
        spent: std::time::Duration,
    ) -> bool {
        let r = &self.results[i];
        if r.failure.is_some() || r.skipped.is_some() || r.halted.is_some() {
            return false;
        }
        if round < CONFIRM_ROUNDS {
            return true;
        }
        before == 0 && self.wants_more(i, spent)
    }

    /// A lossy winner beside its lossless twin, as the confirmation measured them.
    pub(super) fn twin_verdict(
        &self,
        finalists: &[Candidate],
        chosen: &Candidate,
    ) -> Option<TwinVerdict> {
        let lossy = finalists.iter().find(|c| knob::lossless_twin(c) != **c)?;
        let twin = knob::lossless_twin(lossy);
        let find = |c: &Candidate| self.results.iter().find(|r| &r.candidate == c && r.ok());
        let ratio = match (find(lossy), find(&twin)) {
            (Some(a), Some(b)) => (a.compare_with(
                b,
                &self.settings.plan.workload,
                self.settings.plan.noise,
                self.settings.plan.seed,
            ))
            .map(|c| c.ratio),
            _ => None,
        };
        finalists.contains(&twin).then(|| TwinVerdict {
            lossy: lossy.label(),
            twin: twin.label(),
            ratio,
            chose_lossy: chosen == lossy,
        })
    }
}
