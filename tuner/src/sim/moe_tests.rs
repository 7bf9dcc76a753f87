//! A mixture of experts: its experts placed one layer at a time around the fit boundary, brought
//! back onto the GPU by a quantized cache, and a close placement with experts on the host tuned.

use super::harness::{self, fits, gpus, settings, tune, with_engine, Mode};
use super::{Landscape, Outcome, SimModel, GIB, MIB};
use crate::engine::TuneSettings;
use search_space::{CacheType, Candidate};

/// A Mixtral-class MoE (48 layers of 560 MiB, 90% experts, a quarter of them read per token) on
/// one GPU of `mem` bytes.
fn mixtral_on(mem: u64) -> Landscape {
    let mut land = gpus(1, mem);
    land.model = SimModel {
        moe: Some(super::Moe {
            expert_share: 0.9,
            active: 0.25,
        }),
        ..SimModel::dense(48, 560 * MIB, 32_000)
    };
    land
}

#[test]
fn moe_experts_are_placed_one_layer_at_a_time_around_the_fit_boundary() {
    // On one 24 GiB GPU every layer fits only with the experts of some layers on the host.
    let land = mixtral_on(24 * GIB);
    let s = settings(&land, 9);
    let all = land.model.n_layers + 1;
    let at = |n| Candidate {
        n_cpu_moe: n,
        ..Candidate::llama_default(16, all)
    };
    let least = (0..=48).find(|&n| fits(&land, &s, &at(n))).expect("fits");
    assert!(
        least > 0 && least % 12 != 0,
        "the boundary falls between the quarters: {least}"
    );
    let group = with_engine(land.clone(), s.clone(), |e| {
        e.expert_group(&Candidate::llama_default(16, all))
    });
    let ns: Vec<u32> = group.iter().map(|c| c.n_cpu_moe).collect();
    assert_eq!(ns, vec![least, least + 1, least + 2, 48]);

    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert!(fits(&land, &s, &win), "{}", win.label());
    assert_eq!(run.trace.borrow().count(Outcome::OutOfMemory), 0);
    // The quarter grid this replaced would have measured the next quarter up at best.
    let quarter = Candidate {
        n_cpu_moe: least.div_ceil(12) * 12,
        ..win.clone()
    };
    let (got, grid) = (
        land.true_seconds(&win, &s.plan.workload),
        land.true_seconds(&quarter, &s.plan.workload),
    );
    assert!(
        got < grid * 0.98,
        "{} ({got}) vs the quarter grid's {} ({grid})",
        win.label(),
        quarter.label()
    );
}

/// One 24 GiB GPU and the Mixtral-class model at a 32k context: every layer fits only with some
/// layers' experts on the host, fewer with a quantized cache.
fn mixtral_at_32k() -> (Landscape, TuneSettings) {
    let land = mixtral_on(24 * GIB);
    let mut s = settings(&land, 9);
    s.plan.workload.n_ctx = 32_768;
    (land, s)
}

/// Every layer of [`mixtral_at_32k`]'s model on the GPU, the experts of `n` on the host, cache `t`.
fn expert_at(n: u32, t: CacheType) -> Candidate {
    Candidate {
        n_cpu_moe: n,
        type_k: t,
        type_v: t,
        flash_attn: search_space::FlashAttn::On,
        ..Candidate::llama_default(16, 49)
    }
}

/// The fewest layers whose experts stay on the host for [`expert_at`] with cache `t` to fit.
fn fewest_host_experts(land: &Landscape, s: &TuneSettings, t: CacheType) -> u32 {
    (0..=48)
        .find(|&n| fits(land, s, &expert_at(n, t)))
        .expect("fits")
}

/// The experts' count is found at the first group's f16 cache; a quantized cache chosen later frees
/// room for more of them on the GPU, and the best with the fewest that now fit on the host is
/// measured against it (and wins: reading an expert from host memory is the slower path).
#[test]
fn a_quantized_cache_chosen_later_brings_experts_back_onto_the_gpu() {
    let (land, s) = mixtral_at_32k();
    let least = |t| fewest_host_experts(&land, &s, t);
    let at = expert_at;
    let (f16, q4) = (least(CacheType::F16), least(CacheType::Q4_0));
    assert!(q4 < f16, "q4_0 frees an expert layer: {q4} vs {f16}");
    let won = with_engine(land.clone(), s.clone(), |e| {
        e.refit_layers(at(f16, CacheType::Q4_0))
    });
    assert_eq!(won, at(q4, CacheType::Q4_0), "{}", won.label());
}

/// A MoE placement with experts on the host that came close to the best (every expert on the GPU)
/// gets its host's axes tuned, which can turn it (its host reads experts at every token); one far
/// behind does not.
#[test]
fn a_close_placement_with_experts_on_the_host_gets_its_host_axes_tuned() {
    let land = mixtral_on(80 * GIB);
    let s = settings(&land, 9);
    with_engine(land, s, |e| {
        let base = e.baseline();
        let at = |n: u32| Candidate {
            n_gpu_layers: 49,
            n_cpu_moe: n,
            ..base.clone()
        };
        let group = [at(0), at(1), at(48)];
        e.measure_group(&group, "gpu layers");
        let best = e.choose(&group).expect("measured");
        assert_eq!(best, at(0), "{}", best.label());
        e.challenge_with_experts(&group, best, &base);
        let tuned = |n: u32| {
            e.results
                .iter()
                .filter(|r| r.candidate.n_cpu_moe == n && r.candidate != at(n))
                .count()
        };
        assert!(
            tuned(1) >= 2,
            "the close one's threads and host buffer measured"
        );
        assert_eq!(tuned(48), 0, "every expert on the host is far behind");
        assert_eq!(tuned(0), 0, "the best's own host axes wait for the descent");
    });
}

/// A placement with experts on the host that challenges the best is offered at each quantized KV
/// cache with the fewest expert layers on the host that cache lets fit (at the largest micro-batch
/// that does): fewer than at f16, never none (that is the best's placement, the descent's to tune).
#[test]
fn a_challenger_with_host_experts_is_offered_the_caches_that_bring_experts_back() {
    let (land, s) = mixtral_at_32k();
    let least = |t| fewest_host_experts(&land, &s, t);
    let at = expert_at;
    let f16 = least(CacheType::F16);
    let levers = with_engine(land.clone(), s.clone(), |e| {
        e.expert_fit_levers(&at(f16, CacheType::F16))
    });
    assert!(!levers.is_empty(), "a quantized cache frees expert layers");
    for c in &levers {
        assert!(c.type_k.is_quantized(), "{}", c.label());
        assert!((1..f16).contains(&c.n_cpu_moe), "{}", c.label());
        assert!(fits(&land, &s, c), "{} fits", c.label());
        let one_fewer = harness::one_host_expert_layer_fewer(c);
        assert!(!fits(&land, &s, &one_fewer), "{} is the fewest", c.label());
    }
    // With every expert on the GPU at f16 nothing is offered: the descent measures those caches.
    let roomy = mixtral_on(80 * GIB);
    let none = with_engine(roomy.clone(), settings(&roomy, 9), |e| {
        e.expert_fit_levers(&at(1, CacheType::F16))
    });
    assert!(
        none.is_empty(),
        "{:?}",
        none.iter().map(|c| c.label()).collect::<Vec<_>>()
    );
}
