//! The search's shape: a strategy proposes groups from a read-only view, and `Engine::drive`, the
//! one loop, measures each and hands back the choice.

use super::harness::{gpus, settings, with_engine};
use super::GIB;
use crate::engine::strategy::{Group, Once, Strategy};
use crate::engine::view::View;
use search_space::Candidate;

/// Proposes the groups it was given, one after the other, and records what it heard of each.
struct Script {
    groups: Vec<Group>,
    proposed: usize,
    heard: Vec<Option<Candidate>>,
}

impl Strategy for Script {
    type Output = Vec<Option<Candidate>>;

    fn next(&mut self, _: &View, chosen: Option<Candidate>) -> Option<Group> {
        if self.proposed > 0 {
            self.heard.push(chosen);
        }
        let group = self.groups.get(self.proposed).cloned();
        self.proposed += 1;
        group
    }

    fn finish(self, _: &View) -> Vec<Option<Candidate>> {
        self.heard
    }
}

fn with_threads(c: &Candidate, t: u32) -> Candidate {
    Candidate {
        threads: t,
        ..c.clone()
    }
}

/// Each group proposed is measured, nothing else is, and the strategy hears the choice among each
/// group, the one `Engine::choose` makes.
#[test]
fn drive_measures_what_a_strategy_proposes_and_hands_back_each_choice() {
    let land = gpus(1, 16 * GIB);
    let s = settings(&land, 3);
    with_engine(land, s, |e| {
        let base = e.baseline();
        let groups = vec![
            Group::new(vec![base.clone(), with_threads(&base, 8)], "threads"),
            Group::new(vec![base.with_ubatch(256), base.with_ubatch(128)], "batch"),
        ];
        let script = Script {
            groups: groups.clone(),
            proposed: 0,
            heard: Vec::new(),
        };
        let heard = e.drive(script);
        assert_eq!(heard.len(), groups.len());
        for (g, h) in groups.iter().zip(&heard) {
            assert!(h.is_some(), "every group was measured: {}", g.axis);
            assert_eq!(*h, e.choose(&g.candidates), "{}", g.axis);
            assert!(g.candidates.contains(h.as_ref().unwrap()));
        }
        let proposed: Vec<&Candidate> = groups.iter().flat_map(|g| &g.candidates).collect();
        for r in e.results.iter().filter(|r| !r.reps.is_empty()) {
            assert!(
                proposed.contains(&&r.candidate),
                "measured without being proposed: {}",
                r.candidate.label()
            );
        }
        assert_eq!(
            e.results.iter().filter(|r| !r.reps.is_empty()).count(),
            proposed.len()
        );
    });
}

/// A group none of which could be measured (every candidate over the device's budget, pruned
/// without a load) gives no choice, and `Once` falls back to what it was given.
#[test]
fn a_group_of_which_nothing_fits_gives_no_choice_and_once_falls_back() {
    let land = gpus(1, 8 * GIB);
    let s = settings(&land, 5);
    let all = s.n_layers + 1;
    with_engine(land, s, |e| {
        let base = e.baseline();
        let too_big = Candidate {
            n_gpu_layers: all,
            ..base.clone()
        };
        assert!(e.check_fit(&too_big).is_err(), "a 70B model on 8 GiB");
        let group = Group::new(vec![too_big.clone()], "gpu layers");
        let won = e.drive(Once::new(group, Some(base.clone())));
        assert_eq!(won, Some(base));
        let r = e.results.iter().find(|r| r.candidate == too_big).unwrap();
        assert!(r.reps.is_empty() && r.did_not_fit(), "{:?}", r.skipped);
    });
}
