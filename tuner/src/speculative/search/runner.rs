//! The draft search's runner: one worker for the whole search (the target stays loaded), its
//! requests and their time limits, and the budget each draft gets.

use super::outcome::{KindAcceptance, Trial};
use super::settings::SearchSettings;
use crate::measuring::TrialFailure;
use crate::speculative::ngram::NgramParams;
use crate::speculative::prompts::Prompt;
use crate::speculative::serve::{DraftModel, PromptRun, SpeculateRequest};
use crate::speculative::verify::OutputCheck;
use crate::speculative::DraftParams;
use crate::worker::protocol::MtpParams;
use crate::worker::{Request, Response, Worker};
use std::time::Instant;

/// The search's state while it measures: its settings, the worker, the clock and the reference
/// output.
pub(in crate::speculative) struct Runner<'a> {
    pub(in crate::speculative) s: &'a SearchSettings,
    pub(super) worker: Option<Worker>,
    pub(in crate::speculative) stop: &'a dyn Fn() -> bool,
    pub(in crate::speculative) progress: &'a dyn Fn(&str),
    pub(super) started: Instant,
    /// The grid's share of the budget used up to the end of the current draft's turn: each draft
    /// gets an equal share, and what one leaves unused passes to the next.
    pub(super) grid_share: f64,
    /// The target alone's first pass: what every draft setting's output is checked against.
    pub(super) reference: Vec<PromptRun>,
}

impl Runner<'_> {
    pub(in crate::speculative) fn out_of_time(&self) -> Option<String> {
        if (self.stop)() {
            return Some("interrupted".into());
        }
        let grid_time = self.s.budget.mul_f64(2.0 / 3.0);
        (self.started.elapsed() > grid_time.mul_f64(self.grid_share)).then(|| {
            format!(
                "the grid's share of the time budget ({} s of {} s) ran out",
                grid_time.as_secs(),
                self.s.budget.as_secs()
            )
        })
    }

    /// One pass over the prompt set.
    pub(super) fn pass(
        &mut self,
        draft: Option<(&DraftModel, DraftParams)>,
    ) -> Result<Vec<PromptRun>, String> {
        let prompts = self.s.prompts.iter().map(|p| p.text.clone()).collect();
        self.speculate(draft, None, None, prompts, None)
    }

    /// One pass over the prompt set with n-gram speculation.
    pub(in crate::speculative) fn pass_ngram(
        &mut self,
        p: NgramParams,
    ) -> Result<Vec<PromptRun>, String> {
        let prompts = self.s.prompts.iter().map(|p| p.text.clone()).collect();
        self.speculate(None, Some(p), None, prompts, None)
    }

    /// One pass over the prompt set with the target's MTP heads drafting.
    pub(in crate::speculative) fn pass_mtp(
        &mut self,
        p: MtpParams,
    ) -> Result<Vec<PromptRun>, String> {
        let prompts = self.s.prompts.iter().map(|p| p.text.clone()).collect();
        self.speculate(None, None, Some(p), prompts, None)
    }

    /// Measures a trial once (or marks it skipped when the grid's time is up).
    pub(super) fn measure_once(
        &mut self,
        t: &mut Trial,
        draft: Option<(&DraftModel, DraftParams)>,
        path: &std::path::Path,
    ) {
        if let Some(why) = self.out_of_time() {
            t.skipped = Some(why);
            return;
        }
        let placement = t.placement.map(|p| format!(" {}", p.label()));
        (self.progress)(&format!(
            "{} {}{}",
            file_name(path),
            t.label(),
            placement.unwrap_or_default()
        ));
        match self.pass(draft) {
            Ok(runs) => self.record(t, &runs),
            Err(e) => t.failure = Some(e),
        }
    }

    /// One request to the worker; a dead worker is replaced for the next one.
    pub(super) fn speculate(
        &mut self,
        draft: Option<(&DraftModel, DraftParams)>,
        ngram: Option<NgramParams>,
        mtp: Option<MtpParams>,
        prompts: Vec<String>,
        follow: Option<Vec<Vec<i32>>>,
    ) -> Result<Vec<PromptRun>, String> {
        if self.worker.is_none() {
            self.worker = Some(Worker::spawn().map_err(|e| format!("cannot start a worker: {e}"))?);
        }
        let n_prompts = prompts.len();
        // Following an output checks its tokens, not speed: one sequence does it.
        let context = match follow {
            Some(_) => self.s.context.clone().with_sequences(1),
            None => self.s.context.clone(),
        };
        let request = Request::Speculate(Box::new(SpeculateRequest {
            target: self.s.target.clone(),
            settings: self.s.settings.clone(),
            context,
            draft: draft.map(|(m, p)| (m.clone(), p)),
            ngram,
            mtp,
            prompts,
            n_gen: self.s.n_gen,
            follow,
            fault: self.s.fault,
        }));
        let worker = self.worker.as_mut().expect("spawned above");
        let timeout = self.s.trial_timeout.saturating_mul(n_prompts.max(1) as u32);
        match worker.call(&request, timeout, self.stop) {
            Ok(Response::Speculated(a)) => Ok(a.runs),
            Ok(_) => Err("unexpected answer from the worker".into()),
            Err(f @ TrialFailure::Refused { .. }) => Err(crate::report::one_line(&f.to_string())),
            Err(f) => {
                self.worker = None;
                Err(crate::report::one_line(&f.to_string()))
            }
        }
    }

    /// Adds a pass to a trial: its speed, and (from the first pass) acceptance and the output check.
    pub(in crate::speculative) fn record(&mut self, t: &mut Trial, runs: &[PromptRun]) {
        t.tg_tps.push(rate(runs));
        if t.tg_tps.len() > 1 {
            return;
        }
        let sum = |f: fn(&PromptRun) -> u64| runs.iter().map(f).sum::<u64>();
        let (drafted, accepted, rounds) = (
            sum(|r| r.drafted.into()),
            sum(|r| r.accepted.into()),
            sum(|r| r.rounds.into()),
        );
        let produced = sum(|r| r.loop_tokens().into());
        t.acceptance = if drafted > 0 {
            accepted as f64 / drafted as f64
        } else {
            0.0
        };
        t.mean_accepted = if rounds > 0 {
            accepted as f64 / rounds as f64
        } else {
            0.0
        };
        t.tokens_per_round = if rounds > 0 {
            produced as f64 / rounds as f64
        } else {
            0.0
        };
        let pp: f64 = runs.iter().map(|r| r.prompt_seconds).sum();
        let dpp: f64 = runs.iter().map(|r| r.draft_prompt_seconds).sum();
        t.draft_pp_overhead = if pp > 0.0 { dpp / pp } else { 0.0 };
        let mut kinds: Vec<KindAcceptance> = Vec::new();
        for (run, prompt) in runs.iter().zip(&self.s.prompts) {
            let k = match kinds.iter_mut().find(|k| k.kind == prompt.kind) {
                Some(k) => k,
                None => {
                    kinds.push(KindAcceptance {
                        kind: prompt.kind.clone(),
                        drafted: 0,
                        accepted: 0,
                        acceptance: 0.0,
                        tg_tps: kind_rates(runs, &self.s.prompts, self.s.context.sequences)
                            .into_iter()
                            .find(|(k, _)| *k == prompt.kind)
                            .map_or(0.0, |x| x.1),
                    });
                    kinds.last_mut().expect("pushed")
                }
            };
            k.drafted += u64::from(run.drafted);
            k.accepted += u64::from(run.accepted);
        }
        for k in &mut kinds {
            k.acceptance = if k.drafted > 0 {
                k.accepted as f64 / k.drafted as f64
            } else {
                0.0
            };
        }
        t.per_kind = kinds;
        if t.speculates() {
            t.output = self.check_output(runs);
        }
    }

    /// The draft setting's output against the target alone's ([`crate::speculative::verify::check`]), which
    /// has the target alone follow the outputs that differ.
    pub(super) fn check_output(&mut self, runs: &[PromptRun]) -> OutputCheck {
        let reference = std::mem::take(&mut self.reference);
        let prompts = self.s.prompts.clone();
        let check =
            crate::speculative::verify::check(&prompts, runs, &reference, |texts, follow| {
                (self.progress)("the target alone, following the output that differs");
                self.speculate(None, None, None, texts, Some(follow))
            });
        self.reference = reference;
        check
    }
}

/// Effective generation speed of a pass: loop tokens over loop time, all prompts together.
pub(super) fn rate(runs: &[PromptRun]) -> f64 {
    let tokens: u64 = runs.iter().map(|r| u64::from(r.loop_tokens())).sum();
    let seconds: f64 = runs.iter().map(|r| r.gen_seconds).sum();
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// Generation speed per prompt kind of one pass; none when several requests ran at once
/// (`slots` > 1): a group's prompts share its time, which is no one kind's.
pub(super) fn kind_rates(runs: &[PromptRun], prompts: &[Prompt], slots: u32) -> Vec<(String, f64)> {
    if slots > 1 {
        return Vec::new();
    }
    let mut kinds: Vec<&str> = prompts.iter().map(|p| p.kind.as_str()).collect();
    kinds.dedup();
    kinds
        .into_iter()
        .map(|k| {
            let of_kind: Vec<PromptRun> = runs
                .iter()
                .zip(prompts)
                .filter(|(_, p)| p.kind == k)
                .map(|(r, _)| r.clone())
                .collect();
            (k.to_string(), rate(&of_kind))
        })
        .collect()
}

pub(super) fn file_name(p: &std::path::Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
