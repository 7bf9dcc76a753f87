//! The time budget (tiny, ended early, grown by default, resumed) and the confirmation of the
//! winner and runner-up on fresh loads.

use super::harness::{gpus, result, settings, tune, tune_logged, Mode};
use super::{SimMeasurer, GIB};
use crate::engine::TuneSettings;
use search_space::Candidate;
use std::time::Duration;

/// A budget that ends during the very first repetition still leaves that candidate measured (its
/// second repetition runs on the load already paid for), and the rest reported as not measured.
#[test]
fn a_tiny_budget_still_measures_the_first_visited_candidate() {
    let land = gpus(1, 24 * GIB);
    let mut s = settings(&land, 13);
    let full = tune(land.clone(), s.clone(), None, Mode::Search);
    let first_end = full.trace.borrow().calls[0].2;
    s.time_budget = Duration::from_secs_f64(first_end - 1.0);
    let run = tune(land, s, None, Mode::Search);
    assert!(run.budget_spent);
    let measured: Vec<_> = run.results.iter().filter(|r| r.ok()).collect();
    assert_eq!(measured.len(), 1, "one candidate visited");
    assert_eq!(measured[0].reps.len(), 2);
    assert_eq!(run.winner.as_ref(), Some(&measured[0].candidate));
    assert!(run
        .results
        .iter()
        .filter(|r| !r.ok())
        .all(|r| r.skipped.as_deref() == Some(crate::engine::BUDGET_SPENT)));
}

/// A budget that ends before the search reaches its later axes says which ones it did not reach,
/// only those with something to measure; a run that reaches them all names none.
#[test]
fn a_budget_that_ends_early_names_the_axes_it_did_not_reach() {
    let land = gpus(2, 24 * GIB);
    let mut s = settings(&land, 5);
    let full = tune(land.clone(), s.clone(), None, Mode::Search);
    assert!(full.not_reached.is_empty(), "{:?}", full.not_reached);
    // About a third of the full run: the placement and the split are measured, the axes after
    // them are not.
    s.time_budget = Duration::from_secs_f64(full.seconds / 3.0);
    let run = tune(land, s.clone(), None, Mode::Search);
    assert!(run.budget_spent);
    assert!(
        run.not_reached.iter().any(|a| a == "kv cache"),
        "{:?}",
        run.not_reached
    );
    // Every layer is on the GPUs: the host's axes have nothing to vary and are not listed.
    for host_axis in ["prompt threads", "kernels", "op offload", "host buffer"] {
        assert!(
            !run.not_reached.iter().any(|a| a == host_axis),
            "{:?}",
            run.not_reached
        );
    }
    let measured_axes: Vec<&str> = run
        .results
        .iter()
        .filter(|r| r.ok())
        .map(|r| r.candidate.type_k.as_str())
        .collect();
    assert!(
        measured_axes.iter().all(|t| *t == "f16"),
        "no KV type was measured"
    );
}

/// A resumed run (the repetitions of the first reused from its measurement log) grows its default
/// budget as the first did: the baseline's visit costs nothing now, so what it took is told from
/// its figures.
#[test]
fn a_resumed_run_grows_its_default_budget_as_the_first_did() {
    use profiles::measurements::{Context, MeasurementLog};
    let land = gpus(2, 24 * GIB);
    let s = TuneSettings {
        time_budget: crate::tuning::DEFAULT_BUDGET,
        time_budget_cap: Some(crate::tuning::GROWN_BUDGET_CAP),
        ..settings(&land, 5)
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let context = Context {
        model: "sim".into(),
        llama: "sim".into(),
        machine: "sim".into(),
        workload: s.plan.workload.clone(),
    };
    let run = |reuse: bool| {
        let mut log = MeasurementLog::open(&path, context.clone(), reuse).unwrap();
        let m = SimMeasurer::new(land.clone(), s.plan.seed);
        tune_logged(m, s.clone(), Mode::Search, Some(&mut log))
    };
    let first = run(false);
    let resumed = run(true);
    let (a, b) = (first.visit_seconds.unwrap(), resumed.visit_seconds.unwrap());
    // The figures leave out the warm-up: a little short.
    assert!(
        b > 0.8 * a && b <= a,
        "first {a} s, told from the figures {b} s"
    );
    assert!(
        resumed.budget > crate::tuning::DEFAULT_BUDGET,
        "{:?}",
        resumed.budget
    );
    // Every repetition of the baseline's that the first run measured was reused (it may get more:
    // reused repetitions cost no time, so its time cap in a group comes later).
    let had = result(&first, &first.baseline).unwrap().reps.len();
    let base = result(&resumed, &resumed.baseline).unwrap();
    assert!(base.reps.len() >= had);
    assert!(
        base.rounds[..had].iter().all(Option::is_none),
        "the baseline's {had} repetitions were reused: {:?}",
        base.rounds
    );
}

/// `tune`'s default budget grows for a model whose every configuration takes long to measure: to
/// 40 visits of what the baseline's first (its load, warm-up and two repetitions) cost, at most 30
/// minutes; it reaches axes 10 minutes left unreached. A budget given stays.
#[test]
fn the_default_budget_grows_with_what_a_visit_costs_and_a_given_one_stays() {
    let land = gpus(2, 24 * GIB);
    let given = TuneSettings {
        time_budget: crate::tuning::DEFAULT_BUDGET,
        ..settings(&land, 5)
    };
    let fixed = tune(land.clone(), given.clone(), None, Mode::Search);
    assert_eq!(fixed.budget, crate::tuning::DEFAULT_BUDGET);
    assert!(fixed.visit_seconds.is_none());
    assert!(!fixed.not_reached.is_empty(), "{:?}", fixed.not_reached);
    let default = TuneSettings {
        time_budget_cap: Some(crate::tuning::GROWN_BUDGET_CAP),
        ..given
    };
    let run = tune(land.clone(), default, None, Mode::Search);
    let visit = run.visit_seconds.expect("the budget was sized");
    let base = result(&run, &run.baseline).expect("the baseline was measured");
    assert!(visit > 0.0 && visit <= base.seconds, "{visit} s");
    let want = Duration::from_secs_f64(visit * crate::engine::VISITS)
        .min(crate::tuning::GROWN_BUDGET_CAP)
        .max(crate::tuning::DEFAULT_BUDGET);
    assert_eq!(run.budget, want);
    assert!(run.budget > crate::tuning::DEFAULT_BUDGET);
    assert!(
        run.not_reached.len() < fixed.not_reached.len(),
        "{:?} vs {:?}",
        run.not_reached,
        fixed.not_reached
    );
    let w = &settings(&land, 5).plan.workload;
    let (got, before) = (
        land.true_seconds(run.winner.as_ref().unwrap(), w),
        land.true_seconds(fixed.winner.as_ref().unwrap(), w),
    );
    assert!(got <= before * 1.02, "{got} vs {before}");
}

/// The confirmation re-measures the search's winner and runner-up (and a quantized cache's
/// lossless twin beside it), twice each, interleaved, each repetition on a fresh load.
#[test]
fn confirm_remeasures_the_winner_and_the_runner_up_on_fresh_loads() {
    let mut land = gpus(4, 12 * GIB);
    land.load_spread = 0.03;
    let run = tune(land.clone(), settings(&land, 21), None, Mode::Search);
    let (win, second) = (
        run.searched.clone().unwrap(),
        run.runner_up.clone().unwrap(),
    );
    let mut finalists = vec![win.clone(), second.clone()];
    let twin = search_space::knob::lossless_twin(&win);
    if twin != win && !finalists.contains(&twin) {
        finalists.push(twin);
    }
    let trace = run.trace.borrow();
    let n = 2 * finalists.len();
    let last: Vec<&Candidate> = trace.calls[trace.calls.len() - n..]
        .iter()
        .map(|(c, _, _)| c)
        .collect();
    for f in &finalists {
        assert_eq!(last.iter().filter(|c| **c == f).count(), 2, "{}", f.label());
    }
    assert_eq!(run.drift.len(), finalists.len());
    // Each confirming repetition paid a load: all of them in a row on fresh loads.
    for r in finalists.iter().map(|c| result(&run, c).unwrap()) {
        let fresh = r
            .reps
            .iter()
            .rev()
            .take(2)
            .filter(|x| x.load.is_some())
            .count();
        assert_eq!(fresh, 2, "{}", r.candidate.label());
    }
    assert!(
        run.drift.iter().all(|(_, d)| d.abs() < 0.1),
        "{:?}",
        run.drift
    );
}
