//! The quality gate on simulated landscapes: a quantized K/V cache that wins on speed wins the run
//! only when its pair's mean KL divergence is within the gate; a gate nothing passes keeps the f16
//! cache; without a gate nothing is measured for quality; K and V are searched apart where the
//! backends run mixed pairs.

use super::harness::{fits, gpus, settings, tune, Mode};
use super::{Landscape, GIB};
use crate::engine::{GateChoice, TuneSettings, GATE_WOULD_OVERRUN};
use search_space::{CacheType, KvOffload};
use std::time::Duration;

/// One GPU too small for a 70B at a 32k context: a quantized cache lets several more layers onto
/// it (the cache in host memory is not allowed, so the KV cache is the fit lever), with the
/// model's q8_0 cache at `kv_kld_q8` nats per token.
fn tight(kv_kld_q8: f64) -> (Landscape, TuneSettings) {
    let mut land = gpus(1, 24 * GIB);
    land.model.kv_kld_q8 = kv_kld_q8;
    let mut s = settings(&land, 2);
    s.plan.workload.n_ctx = 32768;
    s.plan.kv_offload = vec![KvOffload::On];
    (land, s)
}

fn with_gate(mut s: TuneSettings, gate: GateChoice) -> TuneSettings {
    s.quality = gate.gate(&s.plan.workload, 16);
    s
}

#[test]
fn a_quantized_cache_wins_under_a_loose_gate_and_loses_under_a_tight_one() {
    // Loose: the quantized cache that fits more layers wins, measured within the gate.
    let (land, s) = tight(0.0015);
    let run = tune(
        land.clone(),
        with_gate(s.clone(), GateChoice::On(1.0)),
        None,
        Mode::Search,
    );
    let win = run.winner.clone().expect("a winner");
    assert!(win.kv_lossy() && fits(&land, &s, &win), "{}", win.label());
    let check = run.quality.check(&win).expect("checked");
    assert!(check.passed, "{check:?}");
    // Tight: the same landscape, every quantized pair over the gate: the f16 cache wins.
    let run = tune(
        land.clone(),
        with_gate(s.clone(), GateChoice::On(1e-4)),
        None,
        Mode::Search,
    );
    let win = run.winner.clone().expect("a winner");
    assert!(!win.kv_lossy(), "{}", win.label());
    assert!(
        run.quality.checks.iter().any(|c| !c.passed),
        "a faster quantized cache was measured and refused: {:?}",
        run.quality.checks
    );
    // Every pair is measured at most once a run.
    let checks = run.trace.borrow().kv_checks.clone();
    let mut unique = checks.clone();
    unique.sort_by_key(|(k, v)| (k.bits_per_element() as u32, v.bits_per_element() as u32));
    unique.dedup();
    assert_eq!(checks.len(), unique.len(), "{checks:?}");
}

/// The evaluation counts against the time budget: where it is seen not to fit (an evaluation of
/// 200k tokens, 410 s here and priced at 1,960 s by the defaults' prompt rate) before a quantized
/// candidate's first visit, that visit is not made: it could not win (an unmeasured pair never
/// does), and its time goes to the axes after it. The lossless cache wins, and each quantized
/// candidate says why it was not measured. (An evaluation begun and cut at the budget's end
/// leaves its pair unmeasured too: `Engine::passes_gate`.)
#[test]
fn a_budget_spent_before_the_gate_lets_no_unmeasured_pair_win() {
    let (land, s) = tight(0.0015);
    let mut s = with_gate(s, GateChoice::On(1.0));
    s.quality.max_tokens = 200_000;
    let full = tune(land.clone(), s.clone(), None, Mode::Search);
    assert!(full.winner.expect("a winner").kv_lossy());
    let began = full.trace.borrow().kv_checks_began[0];
    let mut short = s.clone();
    short.time_budget = Duration::from_secs_f64(began + 60.0);
    let run = tune(land.clone(), short.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert!(!win.kv_lossy(), "{}", win.label());
    // Each quantized candidate was skipped so, or measured when its evaluation seemed to fit,
    // and then the evaluation was begun and cut at the budget: its pair unmeasured, said so in
    // the quality record.
    let lossy: Vec<_> = (run.results.iter())
        .filter(|r| r.candidate.kv_lossy())
        .collect();
    let skipped =
        |r: &&crate::engine::CandidateResult| r.skipped.as_deref() == Some(GATE_WOULD_OVERRUN);
    assert!(lossy.iter().any(skipped), "none skipped for its gate");
    for r in lossy.iter().filter(|r| !skipped(r)) {
        let check = run.quality.check(&r.candidate);
        let cut = check.is_some_and(|c| {
            !c.passed
                && c.figures.is_none()
                && c.error
                    .as_deref()
                    .unwrap_or_default()
                    .contains("time budget")
        });
        assert!(cut || !r.ok(), "{}: {check:?}", r.candidate.label());
    }
}

#[test]
fn the_model_decides_which_pairs_pass_the_default_gate() {
    // An 8B-like model (q8_0 0.0015): q8_0 passes; q4_0 (12x) adds 0.018: passes too.
    let (land, s) = tight(0.0015);
    assert!(land.kv_kld(CacheType::Q8_0, CacheType::Q8_0) < 0.02);
    // The demo model's kind (q8_0 0.009): q8_0 passes, q4_0 (0.11) does not.
    let (small, s_small) = tight(0.009);
    assert!(small.kv_kld(CacheType::Q4_0, CacheType::Q4_0) > 0.02);
    let run = tune(small, s_small, None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert_ne!(
        (win.type_k, win.type_v),
        (CacheType::Q4_0, CacheType::Q4_0),
        "{}",
        win.label()
    );
    let _ = (land, s);
}

#[test]
fn a_gate_nothing_passes_keeps_the_lossless_cache_with_a_note() {
    let (land, s) = tight(1.0);
    let w = s.plan.workload.clone();
    let run = tune(land, s, None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert!(!win.kv_lossy(), "{}", win.label());
    assert!(!run.quality.checks.is_empty());
    assert!(run.quality.checks.iter().all(|c| !c.passed));
    let board = crate::engine::ranking::leaderboard(&run.results, &w, 0.02, 2);
    let lines = crate::report::quality::lines(&run.quality, &win, &board);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("no quantized KV cache passed the gate")),
        "{lines:?}"
    );
}

#[test]
fn without_a_gate_nothing_is_measured_for_quality_and_the_record_says_why() {
    let (land, s) = tight(1.0);
    let s = with_gate(s, GateChoice::Off("--no-quality-gate".into()));
    let run = tune(land, s, None, Mode::Search);
    assert!(run.trace.borrow().kv_checks.is_empty());
    assert_eq!(run.quality.unchecked.as_deref(), Some("--no-quality-gate"));
    // On speed alone the quantized cache that fits more layers wins, however far it drifts.
    assert!(run.winner.expect("a winner").kv_lossy());
}

#[test]
fn k_and_v_are_searched_apart_on_the_cpu_and_the_pair_is_gated() {
    let mut land = gpus(0, 0);
    land.model = super::SimModel::dense(32, 120 * super::MIB, 32_000);
    let mut s = settings(&land, 3);
    // Without the ceilings: on this host with an empty cache no KV type can gain beyond the noise,
    // and the axis would be skipped for that (sim/ceiling_tests.rs).
    s.ceilings = Default::default();
    assert!(s.kv_pairs.contains(&(CacheType::Q8_0, CacheType::Q4_0)));
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    assert!(
        run.results
            .iter()
            .any(|r| r.candidate.type_k != r.candidate.type_v && r.ok()),
        "a mixed pair was measured"
    );
    // Beside a GPU without kernels for mixed pairs (CUDA as built), only pairs of one type.
    let gpu = settings(&gpus(1, 24 * GIB), 3);
    assert!(gpu.kv_pairs.iter().all(|(k, v)| k == v));
}
