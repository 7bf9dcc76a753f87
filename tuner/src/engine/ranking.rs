//! The ranking of a run's results: each measured candidate's figures (medians and their
//! intervals) and the leaderboard (by median request rate, a tie marked where the decision rule
//! cannot separate a row from the one above, then what failed or was not measured and why). The
//! engine reads it to pick the runner-up; the report and the profile carry it.

use super::result::{score_seconds, CandidateResult};
use crate::measuring::{Repetition, TrialFailure, Workload};
use crate::stats::{Sample, Verdict};
use profiles::{one_line, Figures, LeaderboardEntry};

/// Figures of a measured candidate (medians, with the 95% CI of the medians).
pub fn figures(r: &CandidateResult, w: &Workload) -> Option<Figures> {
    if !r.ok() {
        return None;
    }
    // Each phase's figures from the repetitions that timed it where two or more did, else from
    // every one (borrowed figures: said in `estimated`).
    let timed = |phase: fn(&Repetition) -> bool| {
        let reps: Vec<&Repetition> = r.reps.iter().filter(|x| phase(x)).collect();
        if reps.len() >= 2 {
            (reps, false)
        } else {
            (r.reps.iter().collect(), true)
        }
    };
    let (prompt, pp_lent) = timed(|x| x.timed.prompt);
    let (generation, tg_lent) = timed(|x| x.timed.generation);
    let pp = Sample::new(prompt.iter().map(|x| x.pp_tps).collect()).ok()?;
    let tg = Sample::new(generation.iter().map(|x| x.tg_tps).collect()).ok()?;
    let median = |reps: &[&Repetition], f: fn(&Repetition) -> Option<f64>| {
        Sample::new(reps.iter().filter_map(|x| f(x)).collect())
            .ok()
            .map(|s| s.median())
    };
    let pp_depth = median(&prompt, |x| x.pp_depth_tps);
    let tg_depth = median(&generation, |x| x.tg_depth_tps);
    let estimated = [("prompt", pp_lent), ("generation", tg_lent)]
        .into_iter()
        .filter(|(_, lent)| *lent)
        .map(|(phase, _)| phase.to_string())
        .collect();
    let score = Sample::new(r.reps.iter().map(|x| score_seconds(x, w)).collect()).ok()?;
    let (pp_lo, pp_hi) = pp.median_ci(0.95);
    let (tg_lo, tg_hi) = tg.median_ci(0.95);
    // Time to first token of the workload's request: its prompt (after its depth), then one
    // generated token (with N requests at once: all N prompts, then one step of N tokens; the rates
    // are theirs together).
    let np = w.n_parallel.max(1) as f64;
    let ttft_ms = np
        * (w.n_prompt as f64 / pp_depth.unwrap_or(pp.median())
            + 1.0 / tg_depth.unwrap_or(tg.median()))
        * 1000.0;
    Some(Figures {
        pp_tps: pp.median(),
        tg_tps: tg.median(),
        pp_depth_tps: pp_depth,
        tg_depth_tps: tg_depth,
        ttft_ms: Some(ttft_ms),
        score_s: score.median(),
        mem_bytes: r.mem_bytes(),
        pp_ci: Some([pp_lo, pp_hi]),
        tg_ci: Some([tg_lo, tg_hi]),
        repetitions: r.reps.len() as u32,
        estimated,
    })
}

/// Ranks every candidate: measured ones by median request rate (ties marked when the decision rule
/// cannot separate a row from the one above), then failed and unmeasured ones with their reasons.
pub fn leaderboard(
    results: &[CandidateResult],
    w: &Workload,
    noise: f64,
    seed: u64,
) -> Vec<LeaderboardEntry> {
    let mut ok: Vec<(&CandidateResult, Sample)> = results
        .iter()
        .filter(|r| r.ok())
        .filter_map(|r| r.rate_sample(w).map(|s| (r, s)))
        .collect();
    ok.sort_by(|a, b| b.1.median().total_cmp(&a.1.median()));
    let mut out = Vec::new();
    for (i, (r, _)) in ok.iter().enumerate() {
        let tie = i > 0
            && ok[i - 1]
                .0
                .compare_with(r, w, noise, seed)
                .is_some_and(|c| c.verdict == Verdict::Tie);
        out.push(LeaderboardEntry {
            rank: (i + 1) as u32,
            tie_with_previous: tie,
            status: "ok".into(),
            did_not_fit: false,
            candidate: r.candidate.clone(),
            figures: figures(r, w),
            kv_kld: None,
        });
    }
    for r in results.iter().filter(|r| !r.ok()) {
        let status = if let Some(f @ TrialFailure::GaveUp { .. }) = &r.failure {
            f.to_string()
        } else if let Some(f) = &r.failure {
            format!("failed: {f}")
        } else if let Some(s) = &r.skipped {
            s.clone()
        } else {
            "not measured: too few repetitions".into()
        };
        let status = one_line(&status);
        out.push(LeaderboardEntry {
            rank: 0,
            tie_with_previous: false,
            status,
            did_not_fit: r.did_not_fit(),
            candidate: r.candidate.clone(),
            figures: None,
            kv_kld: None,
        });
    }
    out
}
