//! The request a measurement takes: the search screens candidates on one shorter than the
//! workload's, as short as the knobs a group compares allow (the knob table's
//! [`search_space::Shows`]), and confirms its finalists on the workload's own request. On a 7B
//! model on two cores a request of llama-bench's pp512/tg128 takes a minute, most of it
//! generating; 32 generated tokens rank what 128 do (a token's rate does not depend on how many
//! follow it), and a thread count or a kernel choice ranks on a 128-token prompt as on 512 (the
//! rank check: docs/benchmarks.md). The finalists are confirmed on the workload's whole prompt
//! and as many generated tokens.
//!
//! The engine decides at one request size at a time: every candidate's repetitions at that size
//! are its figures ([`CandidateResult::decide_at`]), the others are set aside until a decision at
//! their size needs them again.

use super::Engine;
use crate::measuring::{Ceilings, Screen, Workload};
use search_space::knob;
use search_space::Candidate;

/// The generated tokens a screen times (FMwork: 128 generated tokens rank configurations as 1,024
/// do, at 2.7x less cost; a token's rate does not depend on the tokens after it).
pub const SCREEN_GEN: u32 = 32;

/// The prompt a screen times where every knob compared shows its effect on a short one (and at
/// most one micro-batch): a thread count or a kernel choice costs a quarter of a 512-token prompt.
pub const SCREEN_PROMPT: u32 = 128;

/// A run screens where even at its ceilings a request of the workload would take longer than
/// this: a short request saves the most there, and the demo model's 3-second request is measured
/// whole as it always was.
pub const SCREEN_ABOVE: f64 = 5.0;

/// Whether a run of `w` on a host with `ceilings` screens its candidates: where both ceilings are
/// known (the host alone computes) and a request at them takes more than [`SCREEN_ABOVE`] seconds.
pub fn worth_screening(w: &Workload, ceilings: &Ceilings) -> bool {
    let (Some(pp), Some(tg)) = (ceilings.prompt_tps, ceilings.generation_tps) else {
        return false;
    };
    let fastest = f64::from(w.n_prompt) / pp.max(1e-9) + f64::from(w.n_gen) / tg.max(1e-9);
    fastest > SCREEN_ABOVE
}

impl Engine<'_> {
    /// The request a group of `candidates` is screened on: the workload's, with no more than
    /// [`SCREEN_GEN`] generated tokens and, where every difference among them shows on a short
    /// prompt, no more than [`SCREEN_PROMPT`] prompt tokens (and one micro-batch). `None` where that is the
    /// workload's own request, where the run does not screen, and in the confirmation (its own:
    /// [`Self::confirm_screen`]) and the grid (measured whole). A candidate alone is a reference (the defaults: the time said, the
    /// ceilings' shares, the headline): its whole prompt.
    pub(crate) fn screen_for(&self, candidates: &[Candidate], axis: &str) -> Option<Screen> {
        let w = &self.settings.plan.workload;
        if !self.settings.screen || axis == super::confirm::CONFIRM || axis == "grid" {
            return None;
        }
        let micro_batch = candidates.iter().map(|c| c.n_ubatch).max();
        let n_prompt = match micro_batch {
            Some(ub) if candidates.len() > 1 && knob::shows_on_short(candidates) => {
                w.n_prompt.min(ub).min(SCREEN_PROMPT)
            }
            _ => w.n_prompt,
        };
        let screen = Screen {
            n_prompt,
            n_gen: w.n_gen.min(SCREEN_GEN),
        };
        (screen.n_prompt < w.n_prompt || screen.n_gen < w.n_gen).then_some(screen)
    }

    /// The request the finalists are confirmed on: the workload's prompt whole, at its depth, and
    /// where the run screens, no more than [`SCREEN_GEN`] generated tokens (a token's rate does
    /// not depend on the tokens after it; on a 7B on two cores the other 96 of pp512/tg128 were 19
    /// s of each confirming repetition's 70). `None` (the workload's own request) where the run
    /// does not screen or generates no more than that.
    pub(crate) fn confirm_screen(&self) -> Option<Screen> {
        let w = &self.settings.plan.workload;
        (self.settings.screen && w.n_gen > SCREEN_GEN).then_some(Screen {
            n_prompt: w.n_prompt,
            n_gen: SCREEN_GEN,
        })
    }

    /// Every candidate's figures become those at `screen` ([`CandidateResult::decide_at`]).
    pub(crate) fn decide_at(&mut self, screen: Option<Screen>) {
        self.fidelity = screen;
        for r in &mut self.results {
            r.decide_at(screen);
        }
    }

    /// The request a measurement now takes: the workload's, at the size decided at.
    pub(crate) fn measured_workload(&self) -> Workload {
        self.workload_at(self.fidelity)
    }

    /// The workload's request at `screen`'s size (`None`: its own).
    pub(crate) fn workload_at(&self, screen: Option<Screen>) -> Workload {
        let w = &self.settings.plan.workload;
        match screen {
            Some(s) => Workload {
                n_prompt: s.n_prompt,
                n_gen: s.n_gen,
                ..w.clone()
            },
            None => w.clone(),
        }
    }
}
