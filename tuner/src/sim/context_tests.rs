//! `--ctx max` on simulated landscapes: the context chosen keeps every layer on the GPUs, the next
//! step would not, and a model that does not fit even the least context is tuned there.

use super::harness::{fits, gpus, settings, tune, Mode, Quiet};
use super::{SimMeasurer, GIB};
use crate::engine::context::{floor_of, ContextChoice};
use crate::engine::{Engine, TuneSettings};
use search_space::Candidate;

/// The choice for `s`'s workload (its context the most asked for) and the candidate it was made with.
fn choose(land: &super::Landscape, s: &TuneSettings) -> (ContextChoice, Candidate) {
    let stop = || false;
    let m = SimMeasurer::new(land.clone(), s.plan.seed);
    let mut e = Engine::new(s.clone(), Box::new(m), None, &stop, &Quiet);
    let w = &s.plan.workload;
    let floor = floor_of(w.n_prompt + w.depth, w.n_parallel, w.n_ctx);
    (e.largest_context(floor, w.n_ctx), e.context_probe())
}

fn at_ctx(s: &TuneSettings, n_ctx: u32) -> TuneSettings {
    let mut s = s.clone();
    s.plan.workload.n_ctx = n_ctx;
    s
}

#[test]
fn the_largest_context_keeps_every_layer_on_the_gpus_and_one_step_more_would_not() {
    for (n, mem, slots) in [(1, 64 * GIB, 1), (2, 32 * GIB, 1), (1, 64 * GIB, 4)] {
        let land = gpus(n, mem);
        let mut s = settings(&land, 1);
        s.plan.workload.n_parallel = slots;
        s.plan.workload.n_ctx = 131072 * slots;
        let (choice, probe) = choose(&land, &s);
        let step = 256 * slots;
        assert!(choice.whole, "{n}x{mem}: {choice:?}");
        assert_eq!(probe.n_gpu_layers, land.model.n_layers + 1);
        assert_eq!(probe.tensor_split.len(), if n > 1 { n } else { 0 });
        assert!(
            (8192 * slots..131072 * slots).contains(&choice.n_ctx)
                && choice.n_ctx.is_multiple_of(step),
            "{choice:?}"
        );
        assert!(fits(&land, &at_ctx(&s, choice.n_ctx), &probe));
        assert!(!fits(&land, &at_ctx(&s, choice.n_ctx + step), &probe));
        let limit = choice
            .limit
            .clone()
            .expect("the trained context does not fit");
        assert!(
            limit.starts_with(&format!("{}: needs", choice.n_ctx + step)),
            "{limit}"
        );
    }
}

#[test]
fn tuned_at_the_chosen_context_every_layer_stays_on_the_gpu_which_the_trained_context_loses() {
    let land = gpus(1, 64 * GIB);
    let mut s = settings(&land, 3);
    s.plan.workload.n_ctx = 131072;
    let (choice, _) = choose(&land, &s);
    let chosen = tune(land.clone(), at_ctx(&s, choice.n_ctx), None, Mode::Search);
    let all = land.model.n_layers + 1;
    assert_eq!(chosen.winner.expect("a winner").n_gpu_layers, all);
    // At the trained context the KV cache pushes layers off the GPU (or the KV cache to a smaller
    // type): what --ctx max avoids.
    let trained = tune(land.clone(), s.clone(), None, Mode::Search);
    let w = trained.winner.expect("a winner");
    assert!(
        w.n_gpu_layers < all || w.type_k != search_space::CacheType::F16 || !w.kv_offload.is_on(),
        "{}",
        w.label()
    );
}

#[test]
fn a_model_too_big_for_the_least_context_is_tuned_there_with_the_reason() {
    let land = gpus(1, 24 * GIB);
    let mut s = settings(&land, 1);
    s.plan.workload.n_ctx = 131072;
    let (choice, _) = choose(&land, &s);
    assert!(!choice.whole);
    assert_eq!(choice.n_ctx, 4096);
    assert!(choice.limit.unwrap().contains("on CUDA0"));
    // A workload longer than llama.cpp's fit minimum raises the least context tried.
    s.plan.workload.depth = 6000;
    let (choice, _) = choose(&land, &s);
    assert_eq!(choice.n_ctx, 6656);
}

#[test]
fn a_mixture_of_experts_too_big_for_the_gpu_keeps_its_context_there_and_its_experts_in_ram() {
    let mut land = gpus(1, 16 * GIB);
    let mut model = super::SimModel::dense(48, 700 * super::MIB, 128_256);
    model.moe = Some(super::Moe {
        expert_share: 0.9,
        active: 0.1,
    });
    land.model = model;
    let mut s = settings(&land, 1);
    s.plan.workload.n_ctx = 131072;
    let (choice, probe) = choose(&land, &s);
    assert!(choice.whole && choice.experts_on_host, "{choice:?}");
    assert!((8192..131072).contains(&choice.n_ctx), "{choice:?}");
    // Every expert on the host, the rest of every layer on the GPU: fits at the context, not a step on.
    let lean = Candidate {
        n_cpu_moe: land.model.n_layers,
        ..probe.clone()
    };
    assert!(fits(&land, &at_ctx(&s, choice.n_ctx), &lean));
    assert!(!fits(&land, &at_ctx(&s, choice.n_ctx + 256), &lean));
    // With its experts on the GPU, not even the least context fits.
    assert!(!fits(&land, &at_ctx(&s, 4096), &probe));
}
