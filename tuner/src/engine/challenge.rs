//! The expert challenge: where the first group's best keeps every expert on the devices and a
//! placement with experts on the host came within [`EXPERT_CHALLENGE`] of it, that placement's host
//! axes are tuned (its host reads each token's experts, so threads and pinned memory move it, while
//! they leave the best alone), then its KV cache and micro-batch where a smaller one brings experts
//! onto the devices ([`Engine::expert_fit_levers`]), and it is measured against the best. A
//! [`Strategy`]: it proposes, the engine's loop measures.

use super::strategy::{Descend, Group, Strategy};
use super::view::View;
use super::{vary_cache, Engine, HOST_AXES};
use search_space::Candidate;

/// How far behind a best with every expert on the devices a placement with experts on the host may
/// be and still get its host's axes tuned.
const EXPERT_CHALLENGE: f64 = 0.15;

/// The challenge from the first group's best; its output is the faster of the best and the
/// challenger tuned, and the host axes' descent's unreached axes.
pub(crate) struct ExpertChallenge {
    best: Candidate,
    stage: Stage,
    not_reached: Option<Vec<String>>,
}

enum Stage {
    /// The challenger's host axes, from the challenger.
    Host(Box<Descend>, Candidate),
    /// Its KV cache and micro-batch levers are out, from the tuned challenger.
    Levers(Candidate),
    /// The tuned challenger against the best is out.
    Pair,
    /// Decided.
    Done(Candidate),
}

impl ExpertChallenge {
    /// The challenge to `best` from the placements of `group` (the first group) with experts or
    /// FFNs on the host; none (the best stands) where none came close.
    pub fn new(view: &View, group: &[Candidate], best: Candidate, base: &Candidate) -> Self {
        let challenger = view.median_rate(&best).and_then(|top| {
            (group.iter())
                .filter(|c| c.n_cpu_moe > 0 || c.n_cpu_ffn > 0)
                .filter_map(|c| view.median_rate(c).map(|r| (r, c)))
                .filter(|(r, _)| *r >= top * (1.0 - EXPERT_CHALLENGE))
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, c)| c.clone())
        });
        let stage = match challenger {
            Some(c) => Stage::Host(Box::new(Descend::new(&HOST_AXES, Some(c.clone()), base)), c),
            None => Stage::Done(best.clone()),
        };
        ExpertChallenge {
            best,
            stage,
            not_reached: None,
        }
    }

    /// After the host axes: the cache and micro-batch that bring the most of its experts onto the
    /// devices, measured where there are any and time is left.
    fn levers(&mut self, view: &View, tuned: Candidate) -> Option<Group> {
        let mut levers = vec![tuned.clone()];
        levers.extend(view.expert_fit_levers(&tuned));
        if levers.len() > 1 && !view.past_budget() {
            self.stage = Stage::Levers(tuned);
            return Some(Group::new(levers, "kv cache"));
        }
        self.against_best(view, tuned)
    }

    /// The tuned challenger against the best, where time is left and it differs.
    fn against_best(&mut self, view: &View, tuned: Candidate) -> Option<Group> {
        if view.past_budget() || tuned == self.best {
            self.stage = Stage::Done(self.best.clone());
            return None;
        }
        self.stage = Stage::Pair;
        Some(Group::new(vec![self.best.clone(), tuned], "gpu layers"))
    }
}

impl Strategy for ExpertChallenge {
    type Output = (Candidate, Option<Vec<String>>);

    fn next(&mut self, view: &View, chosen: Option<Candidate>) -> Option<Group> {
        match std::mem::replace(&mut self.stage, Stage::Done(self.best.clone())) {
            Stage::Host(mut descent, challenger) => {
                if let Some(g) = descent.next(view, chosen) {
                    self.stage = Stage::Host(descent, challenger);
                    return Some(g);
                }
                let out = (*descent).finish(view);
                self.not_reached = out.not_reached;
                self.levers(view, out.best.unwrap_or(challenger))
            }
            Stage::Levers(tuned) => self.against_best(view, chosen.unwrap_or(tuned)),
            Stage::Pair => {
                self.stage = Stage::Done(chosen.unwrap_or_else(|| self.best.clone()));
                None
            }
            done @ Stage::Done(_) => {
                self.stage = done;
                None
            }
        }
    }

    fn finish(self, _: &View) -> Self::Output {
        let won = match self.stage {
            Stage::Done(c) => c,
            _ => self.best,
        };
        (won, self.not_reached)
    }
}

impl Engine<'_> {
    /// `from` (a placement with experts on the host) at each KV-cache type, each at the largest
    /// micro-batch up to its own that keeps the fewest expert layers on the host, where that is
    /// fewer than `from` keeps but not none (with every expert on the devices it is the best's
    /// placement, whose cache and micro-batch the descent measures). A smaller cache or compute
    /// buffer is worth most where it brings a layer's experts onto the device, which the KV-cache
    /// axis at `from`'s placement does not see: on `bench/vs-tuners`' landscape 227 a placement
    /// with the KV cache in host memory won by 7% over 3 host expert layers at f16, and lost by
    /// 11% to 1 at q8_0 with 256-token micro-batches (what it moved on `bench/vs-tuners`:
    /// docs/benchmarks.md, "The figures behind the search's choices").
    pub(crate) fn expert_fit_levers(&self, from: &Candidate) -> Vec<Candidate> {
        let mut ubs: Vec<u32> = (self.settings.ubatch_options.iter().copied())
            .filter(|&ub| ub <= from.n_ubatch)
            .collect();
        ubs.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        for kv in vary_cache(&self.settings, from) {
            // Each smaller micro-batch is searched only below the fewest a larger one reached.
            let mut fewest: Option<Candidate> = None;
            for &ub in &ubs {
                let most = fewest.as_ref().map_or(from.n_cpu_moe, |f| f.n_cpu_moe);
                if most < 2 {
                    break;
                }
                let c = kv.with_ubatch(ub);
                let at = |n: u32| Candidate {
                    n_cpu_moe: n,
                    ..c.clone()
                };
                if let Some(n) = self.fewest_on_host_upto(&at, most - 1) {
                    fewest = Some(at(n));
                }
            }
            out.extend(fewest.filter(|f| f.n_cpu_moe > 0 && f.validate().is_ok()));
        }
        out
    }
}
