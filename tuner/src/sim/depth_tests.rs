//! A long chat's request processes its prompt after what the cache holds: the objective counts the
//! prompt at depth, not on an empty cache. On the landscape a quantized KV cache reads fewer bytes
//! per generated token at depth but costs attention compute over the cached tokens in every prompt
//! token, so for large prompts at depth (an agent's tool results) the f16 cache is faster per request
//! although generation at depth alone favours q8_0.

use super::harness::{gpus, settings, tune, Mode};
use super::GIB;
use crate::engine::score_seconds;
use search_space::{CacheType, Candidate};
use std::time::Duration;

/// `c` with its KV cache (K and V) of type `t`.
fn with_kv(c: &Candidate, t: CacheType) -> Candidate {
    Candidate {
        type_k: t,
        type_v: t,
        ..c.clone()
    }
}

#[test]
fn the_prompt_at_depth_decides_the_kv_cache_type_for_long_tool_results() {
    // A 70B-class model on one 80 GiB GPU (every layer fits): 4000-token tool results after 24000
    // tokens of conversation, 16 tokens generated.
    let land = gpus(1, 80 * GIB);
    let mut s = settings(&land, 3);
    s.plan.workload.n_ctx = 32768;
    s.plan.workload.n_prompt = 4000;
    s.plan.workload.n_gen = 16;
    s.plan.workload.depth = 24000;
    s.time_budget = Duration::from_secs(48 * 3600);
    let w = s.plan.workload.clone();

    let all = Candidate::llama_default(16, land.model.n_layers + 1);
    let (f16, q8) = (
        with_kv(&all, CacheType::F16),
        with_kv(&all, CacheType::Q8_0),
    );
    let (rf, rq) = (land.ideal(&f16, &w), land.ideal(&q8, &w));
    assert!(
        rq.tg_depth_tps.unwrap() > rf.tg_depth_tps.unwrap() * 1.05,
        "generation at depth favours q8_0"
    );
    // Scored as before (the prompt on an empty cache, generation at depth), q8_0 ties f16 within
    // the noise (and a tie goes to less memory); with the prompt at depth, f16 is clearly faster.
    let empty_cache_prompt = |r: &crate::measuring::Repetition| crate::measuring::Repetition {
        pp_depth_tps: None,
        ..r.clone()
    };
    let (old_f, old_q) = (
        score_seconds(&empty_cache_prompt(&rf), &w),
        score_seconds(&empty_cache_prompt(&rq), &w),
    );
    assert!(old_q <= old_f, "{old_q} vs {old_f}");
    assert!(
        land.true_seconds(&f16, &w) < land.true_seconds(&q8, &w) * 0.96,
        "the prompt at depth favours f16"
    );

    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert_eq!(
        (win.type_k, win.type_v),
        (CacheType::F16, CacheType::F16),
        "{}",
        win.label()
    );
    // The winner's figures carry both rates at depth, and its score is the request at depth.
    let r = run
        .results
        .iter()
        .find(|r| r.candidate == win)
        .expect("the winner was measured");
    let f = crate::engine::ranking::figures(r, &w).expect("figures");
    let (pp_d, tg_d) = (f.pp_depth_tps.unwrap(), f.tg_depth_tps.unwrap());
    assert!(
        pp_d < f.pp_tps * 0.9,
        "{pp_d} at depth vs {} empty",
        f.pp_tps
    );
    let modelled = w.n_prompt as f64 / pp_d + w.n_gen as f64 / tg_d;
    assert!(
        (f.score_s / modelled - 1.0).abs() < 0.05,
        "{} vs {modelled}",
        f.score_s
    );
}
