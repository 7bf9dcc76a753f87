//! How a group's rounds spend repetitions: first visits before more, ties to the lossless setting
//! then to less memory, clear losers and far slower first repetitions stopped, a last candidate not
//! measured on alone.

use super::harness::{gpus, result, settings, tune, with_engine, Mode};
use super::{Outcome, GIB};
use crate::engine::{Engine, GIVE_UP_FACTOR, ONE_REPETITION_FACTOR};
use crate::measuring::TrialFailure;
use crate::stats::Verdict;
use search_space::{CacheType, Candidate};
use std::collections::HashMap;

/// Ties on an axis go to less memory only within half the noise threshold of the best, and to a
/// lossier KV cache only through the quality gate; the run's choice gives a tie to the lossless
/// cache. A q8_0 KV cache with 2048 tokens in it (0.3% slower than f16 on this landscape, every
/// layer on four GPUs either way, less memory) ties with f16: on the axis the search goes on from
/// it when its divergence passes the gate (what its memory buys later is then measured), and f16
/// stays when it does not; the run's choice goes to f16 either way, as the memory bought nothing
/// measured. `-ub 256` (3% slower, less memory) is a tie too under a 4% threshold, but 3% below the
/// best: the faster `-ub 512` stays (a tie that far below is more likely slower than not, and such
/// choices compound over the axes: see `Engine::choose`).
#[test]
fn a_tie_goes_to_less_memory_on_an_axis_and_to_the_lossless_cache_in_the_run_s_choice() {
    let mut land = gpus(4, 16 * GIB);
    land.noise = 0.003;
    for (kv_kld_q8, q8_passes) in [(0.0015, true), (0.05, false)] {
        land.model.kv_kld_q8 = kv_kld_q8;
        let mut s = settings(&land, 11);
        s.plan.workload.depth = 2048;
        let w = s.plan.workload.clone();
        with_engine(land.clone(), s, |e| {
            let base = e.baseline();
            let q8 = Candidate {
                type_k: CacheType::Q8_0,
                type_v: CacheType::Q8_0,
                ..base.clone()
            };
            e.measure_group(&[base.clone(), q8.clone()], "kv cache");
            let r = |c: &Candidate| e.results.iter().find(|r| &r.candidate == c).unwrap();
            let cmp = r(&q8).compare_with(r(&base), &w, 0.02, 11).unwrap();
            assert_eq!(cmp.verdict, Verdict::Tie, "{cmp:?}");
            assert!(r(&q8).mem_bytes() < r(&base).mem_bytes());
            let axis = if q8_passes { &q8 } else { &base };
            assert_eq!(e.choose(&[base.clone(), q8.clone()]).as_ref(), Some(axis));
            assert_eq!(e.refused(&q8), !q8_passes);
            assert_eq!(
                e.choose_final(&[base.clone(), q8.clone()]).as_ref(),
                Some(&base)
            );
        });
    }
    let mut s = settings(&land, 11);
    s.plan.noise = 0.04;
    let w = s.plan.workload.clone();
    with_engine(land, s, |e| {
        let base = e.baseline();
        let ub256 = base.with_ubatch(256);
        e.measure_group(&[base.clone(), ub256.clone()], "batch");
        let r = |c: &Candidate| e.results.iter().find(|r| &r.candidate == c).unwrap();
        let cmp = r(&ub256).compare_with(r(&base), &w, 0.04, 11).unwrap();
        assert_eq!(cmp.verdict, Verdict::Tie, "{cmp:?}");
        assert!(cmp.ratio < -0.02, "{cmp:?}");
        assert!(r(&ub256).mem_bytes() < r(&base).mem_bytes());
        assert_eq!(e.choose(&[base.clone(), ub256]), Some(base));
    });
}

/// Placements far off the leader stop after their first visit; those near it are measured to the end.
#[test]
fn a_clearly_slower_candidate_stops_getting_repetitions() {
    let land = gpus(1, 24 * GIB);
    let s = settings(&land, 5);
    let w = s.plan.workload.clone();
    let (min_reps, noise) = (s.plan.min_reps as usize, s.plan.noise);
    with_engine(land.clone(), s, |e| {
        let base = e.baseline();
        let group = e.placement_group(&base);
        e.measure_group(&group, "gpu layers");
        let best = group
            .iter()
            .map(|c| land.true_seconds(c, &w))
            .fold(f64::INFINITY, f64::min);
        for c in &group {
            let r = e.results.iter().find(|r| &r.candidate == c).unwrap();
            // Beyond 4× the noise: dropped after one visit (or stopped during it, more than
            // GIVE_UP_FACTOR times as slow as the best measured before it); within the noise: measured
            // on. In between the rule (its best repetition 2× the noise behind the leader) may go
            // either way.
            let t = land.true_seconds(c, &w);
            let stopped = r.failure.as_ref().is_some_and(|f| f.gave_up());
            assert!(!stopped || t > 1.8 * best, "{} stopped", c.label());
            if t > best * (1.0 + 4.0 * noise) {
                let reps = if stopped { 0 } else { 2 };
                assert_eq!(r.reps.len(), reps, "{} dropped after one visit", c.label());
            } else if t <= best * (1.0 + noise) {
                assert!(r.reps.len() >= min_reps, "{} measured on", c.label());
            }
        }
    });
}

/// In a group every candidate gets its first visit (two repetitions) before any gets a third.
#[test]
fn every_candidate_gets_its_first_repetitions_before_any_gets_more() {
    let land = gpus(2, 16 * GIB);
    let s = settings(&land, 9);
    with_engine(land, s, |e| {
        let base = e.baseline();
        let group = e.placement_group(&base);
        assert!(group.len() >= 4, "{}", group.len());
        e.measure_group(&group, "gpu layers");
        let mut seen: HashMap<String, usize> = HashMap::new();
        let results: Vec<_> = e.results.iter().map(|r| r.candidate.label()).collect();
        let mut third = None;
        for (k, label) in calls_of(e).into_iter().enumerate() {
            let n = seen.entry(label).or_default();
            *n += 1;
            if *n == 3 && third.is_none() {
                third = Some(k);
            }
        }
        assert!(third.is_some(), "the leaders got more repetitions");
        // (A candidate stopped during its first repetition, more than GIVE_UP_FACTOR times as slow
        // as the best measured before it, has none.)
        let visited = (e.results.iter())
            .filter(|r| group.contains(&r.candidate) && !r.reps.is_empty())
            .count();
        assert!(visited < group.len(), "the CPU-only point was stopped");
        assert_eq!(third.unwrap(), 2 * visited, "{results:?}");
    });
}

/// A group that names a candidate twice (the MoE placement's every expert on its device is also the
/// most layers that fit) measures it as any other: its first visit's two repetitions, then one a
/// round, not a visit for each time it is named.
#[test]
fn a_candidate_named_twice_in_a_group_is_measured_once_a_round() {
    let land = gpus(2, 16 * GIB);
    let s = settings(&land, 9);
    with_engine(land, s, |e| {
        let base = e.baseline();
        let mut group = e.placement_group(&base);
        group.push(group[0].clone());
        e.measure_group(&group, "gpu layers");
        for r in &e.results {
            let mut per_round: HashMap<u64, usize> = HashMap::new();
            for round in r.rounds.iter().flatten() {
                *per_round.entry(*round).or_default() += 1;
            }
            let first = per_round.keys().min().copied();
            for (round, n) in &per_round {
                let most = if Some(*round) == first { 2 } else { 1 };
                assert!(*n <= most, "{}: {n} in round {round}", r.candidate.label());
            }
        }
    });
}

/// The labels of the candidates measured, in order (each repetition one entry).
fn calls_of(e: &Engine) -> Vec<String> {
    // The engine's rounds record the order: a repetition's round, then its place in `reps`.
    let mut calls: Vec<(u64, usize, String)> = Vec::new();
    for r in &e.results {
        for (k, round) in r.rounds.iter().enumerate() {
            calls.push((round.unwrap_or(0), k, r.candidate.label()));
        }
    }
    calls.sort();
    calls.into_iter().map(|(_, _, l)| l).collect()
}

/// The CPU-only point of a model that belongs on the GPUs is several times slower than the
/// placements measured before it: its first repetition stops once its own time proves a request
/// more than [`GIVE_UP_FACTOR`] times the best's, the run goes on without it (at less than a full repetition's cost),
/// and nothing that could win is stopped.
#[test]
fn a_first_repetition_several_times_slower_than_the_best_stops_early() {
    let land = gpus(2, 24 * GIB);
    let s = settings(&land, 5);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let w = &s.plan.workload;
    let cpu = run
        .results
        .iter()
        .find(|r| r.candidate.n_gpu_layers == 0)
        .expect("the CPU-only point was tried");
    let Some(TrialFailure::GaveUp {
        limit_ms, best_ms, ..
    }) = cpu.failure.clone()
    else {
        panic!("{:?}", cpu.failure);
    };
    assert!(cpu.reps.is_empty());
    // It loaded: its memory is kept, as a measured candidate's is.
    assert!(cpu.load.is_some(), "the stopped candidate's load report");
    assert!((limit_ms as f64 - best_ms as f64 * GIVE_UP_FACTOR).abs() <= GIVE_UP_FACTOR);
    assert!(land.true_seconds(&cpu.candidate, w) > limit_ms as f64 / 1e3);
    // Its load, the warm-up (a prompt and 4 tokens) and the time to the limit: not a second
    // repetition.
    let rep = land.rep_seconds(&land.ideal(&cpu.candidate, w), w);
    let load = land.load_seconds(&cpu.candidate, w.n_ctx);
    assert!(cpu.seconds < load + 1.5 * rep, "{} s", cpu.seconds);
    // Every configuration stopped was slower than the limit it was given, and the winner is
    // measured in full.
    let best = land.true_seconds(run.winner.as_ref().expect("a winner"), w);
    for r in &run.results {
        if let Some(TrialFailure::GaveUp { limit_ms, .. }) = r.failure {
            let t = land.true_seconds(&r.candidate, w);
            assert!(
                t > 1.8 * best && t * 1.1 > limit_ms as f64 / 1e3,
                "{}",
                r.candidate.label()
            );
        }
    }
    let won = result(&run, run.winner.as_ref().unwrap()).unwrap();
    assert!(won.ok() && won.failure.is_none());
    assert!(run.trace.borrow().count(Outcome::GaveUp) >= 1);
}

/// A group's last pending candidate is not measured on alone: once its rivals are done (dropped as
/// clear losers or precise), its repetitions share no round with another candidate and change no
/// decision. Before, on this landscape (seed 2), `ngl=81 t=16 …` was measured four and more
/// times in a row. Now no candidate is measured four times in a row (at most a first visit's two repetitions and its next round's, first in the
/// shuffle), and the run still finds the best known.
#[test]
fn a_groups_last_candidate_is_not_measured_on_alone() {
    for seed in [2, 5, 9] {
        let land = gpus(2, 24 * GIB);
        let s = settings(&land, seed);
        let run = tune(land.clone(), s.clone(), None, Mode::Search);
        let trace = run.trace.borrow();
        let measured: Vec<&Candidate> = (trace.calls.iter())
            .filter(|(_, o, _)| *o == Outcome::Measured)
            .map(|(c, _, _)| c)
            .collect();
        for four in measured.windows(4) {
            assert!(
                four.iter().any(|c| c != &four[0]),
                "seed {seed}: {} measured four times in a row",
                four[0].label()
            );
        }
        let win = run.winner.as_ref().expect("a winner");
        let grid = tune(land.clone(), s.clone(), None, Mode::Grid);
        let (got, best) = (
            land.true_seconds(win, &s.plan.workload),
            land.true_seconds(
                grid.winner.as_ref().expect("the grid's winner"),
                &s.plan.workload,
            ),
        );
        assert!(
            got <= best * (1.0 + s.plan.noise),
            "seed {seed}: {} {got} vs {best}",
            win.label()
        );
    }
}

/// A first visit whose first repetition took more than [`ONE_REPETITION_FACTOR`] times the best
/// median so far a request gets no second: it is stopped (its repetition kept), says so, and was
/// truly that much slower on the landscape. Nothing within reach of the winner is stopped so.
#[test]
fn a_first_repetition_far_behind_the_best_is_not_repeated() {
    let land = gpus(2, 16 * GIB);
    let s = settings(&land, 3);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let w = &s.plan.workload;
    let best = land.true_seconds(run.winner.as_ref().expect("a winner"), w);
    let mut stopped = 0;
    for r in &run.results {
        let t = land.true_seconds(&r.candidate, w);
        match &r.failure {
            Some(
                f @ TrialFailure::GaveUp {
                    limit_ms,
                    best_ms,
                    took_ms: Some(took),
                    ..
                },
            ) => {
                stopped += 1;
                assert_eq!(r.reps.len(), 1, "{}", r.candidate.label());
                assert_eq!(
                    *limit_ms,
                    (*best_ms as f64 * ONE_REPETITION_FACTOR).ceil() as u64
                );
                assert!(took > limit_ms, "{took} ms <= {limit_ms} ms");
                assert!(
                    t > 1.3 * best,
                    "{}: {t} s, best {best} s",
                    r.candidate.label()
                );
                assert!(
                    f.to_string().starts_with("stopped after one repetition: "),
                    "{f}"
                );
            }
            _ if t < 1.3 * best && r.reps.len() == 1 => {
                panic!("{} left at one repetition", r.candidate.label())
            }
            _ => {}
        }
    }
    assert!(
        stopped >= 1,
        "no first visit was stopped after one repetition"
    );
    let won = result(&run, run.winner.as_ref().unwrap()).unwrap();
    assert!(won.ok() && won.failure.is_none());
}

/// A group whose candidates differ only in a knob that moves one phase of a request times that
/// phase alone: the micro-batch moves the prompt, so after the baseline's first visit (both
/// phases) `-ub 256` times the prompt and borrows the group's generation figures, and costs less
/// simulated time than a whole repetition; the threads with the prompt's held move generation
/// alone. Its figures say which phase is an estimate.
#[test]
fn a_group_that_moves_one_phase_times_that_phase_alone() {
    let land = gpus(1, 16 * GIB);
    let s = settings(&land, 5);
    let w = s.plan.workload.clone();
    with_engine(land, s, |e| {
        let base = e.baseline();
        e.measure_group(std::slice::from_ref(&base), "baseline");
        let r = |e: &Engine, c: &Candidate| {
            e.results
                .iter()
                .find(|r| &r.candidate == c)
                .unwrap()
                .clone()
        };
        assert!(r(e, &base).reps.iter().all(|x| x.timed.is_both()));
        let ub = base.with_ubatch(256);
        let before = e.elapsed();
        e.measure_group(&[base.clone(), ub.clone()], "batch");
        let ub_r = r(e, &ub);
        assert!(ub_r
            .reps
            .iter()
            .all(|x| x.timed == search_space::Phases::PROMPT));
        let base_tg: Vec<f64> = r(e, &base).reps.iter().map(|x| x.tg_tps).collect();
        let lent = ub_r.reps[0].tg_tps;
        assert!(
            lent > 0.0 && base_tg.iter().any(|&t| t >= lent) && base_tg.iter().any(|&t| t <= lent)
        );
        let figures = crate::engine::ranking::figures(&ub_r, &w).unwrap();
        assert_eq!(figures.estimated, ["generation"]);
        assert!(e.elapsed() > before);

        let t = base.with_threads(base.threads / 2, base.batch_threads());
        e.measure_group(&[base.clone(), t.clone()], "threads");
        assert!(r(e, &t)
            .reps
            .iter()
            .all(|x| x.timed == search_space::Phases::GENERATION));
        // Both phases moved: both timed.
        let both = base.with_threads(base.threads / 2, base.threads / 2);
        e.measure_group(&[base.clone(), both.clone()], "threads");
        assert!(r(e, &both).reps.iter().all(|x| x.timed.is_both()));
    });
}
