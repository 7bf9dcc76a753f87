//! Where physics leaves nothing: on a host whose generation is near its bandwidth ceiling and whose
//! prompt is at its compute ceiling, an axis that could gain less than the noise is not measured
//! (and the choice is still within the noise of the best), while an axis with room is; and the run's
//! time is said once llama.cpp's defaults are measured, before anything else is.

use super::harness::{settings, tune, Mode};
use super::{Landscape, SimMeasurer};
use crate::engine::Engine;
use crate::measuring::{Progress, Repetition, SkippedAxis, TimePlan};
use search_space::Candidate;
use std::cell::RefCell;
use std::time::Duration;

/// A 70B-class model on a 16-core host alone: llama.cpp's 16 threads generate 8% slower than 8
/// (the bus saturates at half the cores), and its prompt runs at the host's compute peak.
fn host_alone() -> Landscape {
    let mut land = super::harness::gpus(0, 0);
    land.devices.clear();
    land
}

/// The best request time of any thread count for generation, the rest as `c`.
fn best_threads(land: &Landscape, c: &Candidate, w: &crate::measuring::Workload) -> f64 {
    [1, 8, 16, 32]
        .iter()
        .map(|&t| land.true_seconds(&c.with_threads(t, c.batch_threads()), w))
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn an_axis_whose_ceiling_leaves_less_than_the_noise_is_not_measured() {
    let land = host_alone();
    let mut s = settings(&land, 21);
    // A prompt-heavy request: generation, 8% short of its ceiling, is a tenth of it.
    s.plan.workload.n_gen = 16;
    let w = s.plan.workload.clone();
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let threads: Vec<&SkippedAxis> = (run.skipped_axes.iter())
        .filter(|a| a.axis == "threads")
        .collect();
    assert_eq!(threads.len(), 1, "{:?}", run.skipped_axes);
    assert!(threads[0].at_most < s.plan.noise, "{:?}", threads[0]);
    // Nothing with another generation thread count was loaded.
    let trace = run.trace.borrow();
    assert!(
        trace.calls.iter().all(|(c, _, _)| c.threads == 16),
        "{:?}",
        trace
            .calls
            .iter()
            .map(|(c, _, _)| c.label())
            .collect::<Vec<_>>()
    );
    // What the skip left was within the bound: the best thread count is no further.
    let win = run.winner.expect("a winner");
    let (got, best) = (land.true_seconds(&win, &w), best_threads(&land, &win, &w));
    assert!(
        got / best - 1.0 <= threads[0].at_most + 0.005,
        "{got} vs {best}"
    );
    assert!(got <= best * (1.0 + s.plan.noise), "{got} vs {best}");
}

#[test]
fn an_axis_with_room_beyond_the_noise_is_measured() {
    let land = host_alone();
    let mut s = settings(&land, 21);
    // A generation-heavy request: the 8% generation could gain is most of a request.
    s.plan.workload.n_gen = 512;
    let w = s.plan.workload.clone();
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    assert!(
        run.skipped_axes.iter().all(|a| a.axis != "threads"),
        "{:?}",
        run.skipped_axes
    );
    // Said up front: generation 8% short of its ceiling, which the search then won.
    let plan = run.time_plan.expect("the time was said");
    assert!(plan.generation_share.unwrap() < 0.95, "{plan:?}");
    let win = run.winner.expect("a winner");
    assert_eq!(win.threads, 8, "{}", win.label());
    let (got, best) = (land.true_seconds(&win, &w), best_threads(&land, &win, &w));
    assert!(got <= best * 1.005, "{got} vs {best}");
}

/// Progress that keeps, in order, the candidates started and the time plan said.
#[derive(Default)]
struct Told(RefCell<Vec<String>>, RefCell<Option<TimePlan>>);

impl Progress for Told {
    fn candidate_started(&self, label: &str, _: &str) {
        self.0.borrow_mut().push(label.to_string());
    }
    fn repetition(&self, _: &str, _: &Repetition) {}
    fn failed(&self, _: &str, _: &str) {}
    fn best(&self, _: &str, _: Option<f64>, _: Duration, _: Duration) {}
    fn plan(&self, plan: &TimePlan) {
        self.0.borrow_mut().push("plan".into());
        *self.1.borrow_mut() = Some(plan.clone());
    }
}

#[test]
fn the_time_is_said_once_the_defaults_are_measured_and_before_anything_else() {
    let land = host_alone();
    let mut s = settings(&land, 4);
    s.time_budget = crate::tuning::DEFAULT_BUDGET;
    s.time_budget_cap = Some(crate::tuning::GROWN_BUDGET_CAP);
    let told = Told::default();
    let stop = || false;
    let m = SimMeasurer::new(land.clone(), s.plan.seed);
    let mut e = Engine::new(s.clone(), Box::new(m), None, &stop, &told);
    e.run();
    let elapsed = e.elapsed().as_secs_f64();
    let budget = e.settings.time_budget.as_secs_f64();
    let events = told.0.borrow();
    let at = events
        .iter()
        .position(|x| x == "plan")
        .expect("the plan was said");
    let base = Candidate::llama_default(16, 0).label();
    assert!(
        at > 0 && events[..at].iter().all(|x| *x == base),
        "{events:?}"
    );
    assert_eq!(events.iter().filter(|x| *x == "plan").count(), 1);
    let plan = told.1.borrow().clone().unwrap();
    // The budget said is the budget kept, and the run stays within it (less a visit in flight).
    assert_eq!(plan.budget_s, budget);
    assert!(elapsed <= budget + plan.visit_s, "{elapsed} of {budget}");
    assert!(plan.expected_s <= plan.budget_s && plan.expected_s > plan.visit_s);
    // The time said is about the time taken (here 1,261 s said, 1,008 taken).
    assert!(
        elapsed > 0.7 * plan.expected_s && elapsed < 1.3 * plan.expected_s,
        "said {} s, took {elapsed} s",
        plan.expected_s
    );
    let truth = land.true_seconds(&Candidate::llama_default(16, 0), &s.plan.workload);
    assert!(
        (plan.request_s / truth - 1.0).abs() < 0.05,
        "{plan:?} vs {truth}"
    );
    let (pp, tg) = (plan.prompt_share.unwrap(), plan.generation_share.unwrap());
    assert!(pp > 0.9 && pp <= 1.0 && tg > 0.85 && tg < 0.97, "{plan:?}");
    assert!(plan.at_most.unwrap() > 0.0, "{plan:?}");
}

#[test]
fn an_axis_whose_values_were_asked_for_is_measured_whatever_the_ceilings() {
    let land = host_alone();
    let mut s = settings(&land, 21);
    s.plan.workload.n_gen = 16;
    s.plan.threads = Some(s.threads_options.clone());
    let run = tune(land, s, None, Mode::Search);
    assert!(
        run.skipped_axes.iter().all(|a| a.axis != "threads"),
        "{:?}",
        run.skipped_axes
    );
    let trace = run.trace.borrow();
    assert!(trace.calls.iter().any(|(c, _, _)| c.threads != 16));
}
