//! Crashed workers as data (the run goes on, a measured candidate keeps its figures) and a run
//! that is the same for the same seed.

use super::harness::{self, gpus, settings, tune, Mode, Quiet};
use super::{SimMeasurer, GIB};
use crate::engine::Engine;
use crate::measuring::TrialFailure;
use search_space::{Candidate, FlashAttn};

/// A configuration that aborts its worker is recorded as that candidate's failure; the search goes
/// on to the next axes and still picks a winner. Random crashes (2%) do not stop a run either.
#[test]
fn a_crash_is_recorded_and_the_run_goes_on() {
    let land = gpus(2, 24 * GIB);
    let s = settings(&land, 17);
    let run = tune(
        land.clone(),
        s.clone(),
        Some(|c| c.flash_attn == FlashAttn::Off),
        Mode::Search,
    );
    let crashed: Vec<_> = (run.results.iter())
        .filter(|r| r.failure.as_ref().is_some_and(|f| !f.gave_up()))
        .collect();
    assert!(!crashed.is_empty());
    assert!(crashed
        .iter()
        .all(|r| r.candidate.flash_attn == FlashAttn::Off));
    let win = run.winner.expect("a winner");
    assert_ne!(win.flash_attn, FlashAttn::Off);
    assert!(run
        .results
        .iter()
        .any(|r| r.candidate.n_ubatch != 512 && r.ok()));
    let mut noisy = land;
    noisy.crash_rate = 0.02;
    let run = tune(noisy, s, None, Mode::Search);
    assert!(run.winner.is_some());
}

/// A crash after a candidate had measured (a fault now and then, as llvmpipe's on large batches)
/// leaves it measured on, on a fresh worker, and it can still win; a second crash ends it.
#[test]
fn a_crash_after_a_candidate_measured_is_measured_on_and_a_second_ends_it() {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    static ONCE: AtomicU32 = AtomicU32::new(0);
    static EVERY: AtomicU32 = AtomicU32::new(0);
    let run = |crashing: fn(&Candidate) -> bool| {
        let mut land = gpus(1, 24 * GIB);
        land.noise = 0.05;
        let s = settings(&land, 5);
        let mut m = SimMeasurer::new(land, s.plan.seed);
        m.crashing = Some(crashing);
        let stop = || false;
        let mut e = Engine::new(s, Box::new(m), None, &stop, &Quiet);
        let base = e.baseline();
        let ub = base.with_ubatch(256);
        e.measure_group(&[base.clone(), ub.clone()], "batch");
        e.results
            .iter()
            .find(|r| r.candidate == ub)
            .unwrap()
            .clone()
    };
    // The third repetition crashes, once.
    let r = run(|c| c.n_ubatch == 256 && ONCE.fetch_add(1, SeqCst) == 2);
    assert!(r.crashed_once.is_some() && r.failure.is_none(), "{r:?}");
    assert!(
        r.ok() && r.reps.len() >= 3,
        "measured on: {} reps",
        r.reps.len()
    );
    // Every repetition from the third crashes.
    let r = run(|c| c.n_ubatch == 256 && EVERY.fetch_add(1, SeqCst) >= 2);
    assert!(r.crashed_once.is_some(), "{r:?}");
    assert!(
        matches!(r.failure, Some(TrialFailure::Crashed { .. })),
        "{r:?}"
    );
    assert!(!r.ok());
}

/// A placement that crashed twice in other candidates (two thread counts here) takes no more
/// repetitions, but a candidate of it that had measured keeps its figures and can still win.
#[test]
fn a_measured_candidate_keeps_its_figures_when_its_placement_crashes_twice_since() {
    let land = gpus(1, 24 * GIB);
    let s = settings(&land, 5);
    let mut m = SimMeasurer::new(land, s.plan.seed);
    m.crashing = Some(|c| c.threads != 16);
    let stop = || false;
    let mut e = Engine::new(s, Box::new(m), None, &stop, &Quiet);
    let a = e.baseline();
    assert_eq!(a.threads, 16);
    let (b, c) = (
        Candidate {
            threads: 8,
            ..a.clone()
        },
        Candidate {
            threads: 4,
            ..a.clone()
        },
    );
    e.measure_group(std::slice::from_ref(&a), "threads");
    assert!(e.results.iter().any(|r| r.candidate == a && r.ok()));
    e.measure_group(&[b.clone(), c.clone()], "threads");
    // More repetitions asked of it than it has.
    e.settings.plan.min_reps = 10;
    e.measure_group(std::slice::from_ref(&a), "threads");
    let r = e.results.iter().find(|r| r.candidate == a).unwrap();
    assert!(r.ok() && r.halted.is_some(), "{r:?}");
    assert_eq!(e.choose(&[a.clone(), b, c]), Some(a));
}

#[test]
fn a_run_is_deterministic_for_a_seed() {
    let mut land = gpus(2, 16 * GIB);
    land.load_spread = 0.03;
    land.crash_rate = 0.02;
    let a = tune(land.clone(), settings(&land, 4), None, Mode::Search);
    let b = tune(land.clone(), settings(&land, 4), None, Mode::Search);
    assert_eq!(a.winner, b.winner);
    assert_eq!(a.trace.borrow().calls, b.trace.borrow().calls);
    assert_eq!(a.seconds, b.seconds);
    let _ = harness::gib(0);
}
