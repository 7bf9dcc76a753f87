//! The settings axes after the placement: generation and prompt threads, micro-batches above 512
//! and the layer one may cost, op offload over fast and slow links, the host-only axes skipped.

use super::harness::{fits, gpus, max_fit, settings, tune, Mode};
use super::{Landscape, GIB};
use crate::engine::{offloads_host_ops, TuneSettings};
use crate::measuring::TrialFailure;
use search_space::{Candidate, KernelChoice, KvOffload, OpOffload};
use std::time::Duration;

/// Op offload on partial offload: over a fast link (25 GB/s, PCIe 4) copying the host's layers to
/// the GPU for each micro-batch beats computing them on 16 cores, so llama.cpp's default stays; over
/// a slow one (0.1 GB/s) it is the slowest part of the prompt and the search turns it off. With
/// every layer on the GPUs nothing is left to offload and the knob is never measured.
#[test]
fn op_offload_is_measured_where_weights_stay_on_the_host_and_follows_the_link() {
    let winner = |link: f64| {
        let mut land = gpus(1, 24 * GIB);
        land.devices[0].link = link;
        let mut s = settings(&land, 5);
        // Over the slow link a repetition takes minutes: time for every axis.
        s.time_budget = Duration::from_secs(72 * 3600);
        let run = tune(land, s.clone(), None, Mode::Search);
        let off = run
            .results
            .iter()
            // Measured in full, or stopped mid-repetition as GIVE_UP_FACTOR times as slow as the best.
            .filter(|r| r.candidate.op_offload == OpOffload::Off)
            .filter(|r| r.ok() || r.failure.as_ref().is_some_and(TrialFailure::gave_up))
            .count();
        let win = run.winner.expect("a winner");
        assert!(
            win.n_gpu_layers <= s.n_layers,
            "partial offload: {}",
            win.label()
        );
        (win, off)
    };
    let (fast, measured) = winner(25e9);
    assert!(
        measured > 0,
        "op offload off was measured on a partial offload"
    );
    // Off, or on beside host weights repacked in the CPU's buffers, which are never offloaded.
    let s = settings(&gpus(1, 24 * GIB), 5);
    assert!(offloads_host_ops(&s, &fast), "{}", fast.label());
    let (slow, _) = winner(0.1e9);
    assert!(!offloads_host_ops(&s, &slow), "{}", slow.label());

    let land = gpus(2, 80 * GIB);
    let s = settings(&land, 5);
    let run = tune(land, s.clone(), None, Mode::Search);
    assert_eq!(run.winner.as_ref().unwrap().n_gpu_layers, s.n_layers + 1);
    assert!(
        run.results
            .iter()
            .all(|r| r.candidate.op_offload == OpOffload::On),
        "nothing on the host: op offload is not varied"
    );
}

/// A 3000-token prompt with a GPU: the micro-batches above 512 are offered (1024, 2048 and 4096, the
/// first that holds the whole prompt) and one of them wins (a GPU's efficiency grows with the
/// tokens of a batch, and with the host's layers copied over for each batch, fewer batches copy
/// less), within the noise of the landscape's best micro-batch that fits. On the host alone they do not pay
/// and are never measured.
#[test]
fn long_prompts_with_a_gpu_try_micro_batches_above_512() {
    for (n, mem) in [(2, 80 * GIB), (1, 24 * GIB)] {
        let land = gpus(n, mem);
        let mut s = settings(&land, 9);
        s.plan.workload.n_prompt = 3000;
        s.ubatch_options = crate::tuning::ubatch_options(&[], &s.plan.workload, s.offload);
        assert_eq!(s.ubatch_options, [512, 256, 128, 1024, 2048, 4096]);
        let run = tune(land.clone(), s.clone(), None, Mode::Search);
        let win = run.winner.expect("a winner");
        let at = |ub: u32| win.with_ubatch(ub);
        let best = s
            .ubatch_options
            .iter()
            .filter(|&&ub| fits(&land, &s, &at(ub)))
            .map(|&ub| land.true_seconds(&at(ub), &s.plan.workload))
            .fold(f64::INFINITY, f64::min);
        let got = land.true_seconds(&win, &s.plan.workload);
        assert!(win.n_ubatch > 512, "{n} GPUs: {}", win.label());
        // Within twice the noise threshold: a smaller micro-batch that ties goes first (less memory).
        assert!(
            got <= best * 1.04,
            "{n} GPUs: {} {got} vs {best}",
            win.label()
        );
    }
    let mut land = gpus(0, 0);
    land.devices.clear();
    let mut s = settings(&land, 9);
    s.plan.workload.n_prompt = 3000;
    s.ubatch_options = crate::tuning::ubatch_options(&[], &s.plan.workload, s.offload);
    let run = tune(land, s, None, Mode::Search);
    assert!(run.results.iter().all(|r| r.candidate.n_ubatch <= 512));
    assert_eq!(run.winner.expect("a winner").n_ubatch, 512);
}

/// On the host, generation saturates the memory bus at half the cores and slows past them, while
/// the prompt wants every core: the threads axis (prompt threads held) finds the generation's
/// count, the prompt-threads axis the prompt's, and the winner splits them (`-t 8 -tb 16`), faster
/// than either count for both.
#[test]
fn generation_and_prompt_threads_are_chosen_apart_on_the_host() {
    let mut land = gpus(0, 0);
    land.devices.clear();
    let s = settings(&land, 11);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.expect("a winner");
    assert_eq!(
        (win.threads, win.batch_threads()),
        (8, 16),
        "{}",
        win.label()
    );
    let got = land.true_seconds(&win, &s.plan.workload);
    for t in [8, 16] {
        let same = win.with_threads(t, t);
        let theirs = land.true_seconds(&same, &s.plan.workload);
        assert!(
            got < theirs * 0.99,
            "{} {got} vs {} {theirs}",
            win.label(),
            same.label()
        );
    }
}

/// Many requests at once move the host's generation from its memory bus to its cores: 16
/// sequences read each weight once per step but multiply it 16 times, so generation wants every
/// core (`-t 16`) where one request wanted half of them (`-t 8 -tb 16`, the test above). The search
/// measures what the concurrency changes rather than carrying over the single-request answer.
#[test]
fn many_requests_at_once_want_every_core_for_generation_too() {
    let mut land = gpus(0, 0);
    land.devices.clear();
    let mut s = settings(&land, 11);
    s.plan.workload.n_parallel = 16;
    s.plan.workload.n_ctx = 16 * 1024;
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.expect("a winner");
    assert_eq!(
        (win.threads, win.batch_threads()),
        (16, 16),
        "{}",
        win.label()
    );
    let got = land.true_seconds(&win, &s.plan.workload);
    let single = win.with_threads(8, 16);
    let theirs = land.true_seconds(&single, &s.plan.workload);
    assert!(
        got < theirs * 0.9,
        "{} {got} vs {} {theirs}",
        win.label(),
        single.label()
    );
    // And 16 at once serve more requests per second than one at a time (the prompts, compute-bound
    // either way, take about half of a request here).
    let one = crate::measuring::Workload {
        n_parallel: 1,
        ..s.plan.workload.clone()
    };
    let alone = land.true_seconds(&single, &one);
    assert!(
        got * 1.3 < alone,
        "{got} s per request vs {alone} one at a time"
    );
}

/// One 24 GiB GPU behind a slow link (0.25 GB/s), a 3000-token prompt, and the micro-batches
/// `tune` offers for it; minutes per request, so simulated days of budget.
fn slow_link_long_prompt() -> (Landscape, TuneSettings) {
    let mut land = gpus(1, 24 * GIB);
    land.devices[0].link = 0.25e9;
    let mut s = settings(&land, 5);
    s.plan.workload.n_prompt = 3000;
    s.time_budget = Duration::from_secs(72 * 3600);
    s.ubatch_options = crate::tuning::ubatch_options(&[], &s.plan.workload, s.offload);
    // The KV cache stays on the GPU, and whole layers on the host: what these tests follow is the
    // micro-batch and the link.
    s.plan.kv_offload = vec![KvOffload::On];
    s.plan.host_ffns = false;
    (land, s)
}

/// Op offload and the micro-batch interact: it copies the host's layers over the link once per
/// micro-batch. Over a slow link (0.25 GB/s) with a 3000-token prompt, off wins at 512 tokens (the
/// op offload axis turns it off) but on wins at 2048 (two copies instead of six; 4096 does not fit
/// beside 49 layers): the batch axis measures the larger micro-batches with op offload on too, and
/// the search finds the best that fits.
#[test]
fn op_offload_is_measured_again_at_the_largest_micro_batch() {
    let (land, s) = slow_link_long_prompt();
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.expect("a winner");
    let at = |ub: u32, op| Candidate {
        op_offload: op,
        ..win.with_ubatch(ub)
    };
    let w = &s.plan.workload;
    assert!(
        land.true_seconds(&at(512, OpOffload::Off), w)
            < land.true_seconds(&at(512, OpOffload::On), w)
    );
    assert!(
        win.n_ubatch > 512 && win.op_offload == OpOffload::On,
        "{}",
        win.label()
    );
    let best = [512, 1024, 2048, 4096]
        .into_iter()
        .flat_map(|ub| [at(ub, OpOffload::On), at(ub, OpOffload::Off)])
        .filter(|c| fits(&land, &s, c))
        .map(|c| land.true_seconds(&c, w))
        .fold(f64::INFINITY, f64::min);
    let got = land.true_seconds(&win, w);
    assert!(got <= best * 1.04, "{} {got} vs {best}", win.label());
    assert!(run.results.iter().any(|r| r.ok()
        && r.candidate.op_offload == OpOffload::Off
        && r.candidate.n_ubatch == 512));
}

/// With every layer on the GPUs the host multiplies no weights: the CPU kernels and the prompt's
/// thread count are not varied (their candidates would tie at full cost); on the host alone both
/// are.
#[test]
fn host_only_axes_are_skipped_when_every_layer_is_offloaded() {
    let land = gpus(2, 80 * GIB);
    let s = settings(&land, 3);
    let run = tune(land, s.clone(), None, Mode::Search);
    assert_eq!(run.winner.as_ref().unwrap().n_gpu_layers, s.n_layers + 1);
    assert!(run
        .results
        .iter()
        .all(|r| r.candidate.kernels == KernelChoice::Repack
            && r.candidate.batch_threads() == s.default_threads));

    let mut land = gpus(0, 0);
    land.devices.clear();
    let mut s = settings(&land, 3);
    // Without the ceilings: by them neither axis has anything left to win on this host (its
    // prompt already runs at its peak), and they would be skipped for that (sim/ceiling_tests.rs).
    s.ceilings = Default::default();
    let run = tune(land, s.clone(), None, Mode::Search);
    assert!(run
        .results
        .iter()
        .any(|r| r.candidate.kernels == KernelChoice::Plain));
    assert!(run
        .results
        .iter()
        .any(|r| r.candidate.batch_threads() != s.default_threads));
}

/// A micro-batch that does not fit beside the most layers is measured at the most it lets fit:
/// over a slow link with a 3000-token prompt, -ub 4096 (one copy of the host's weights per prompt
/// instead of two) does not fit beside 49 layers of a 24 GiB GPU but does beside 48, and giving up
/// that layer costs generation less than the prompt gains.
#[test]
fn a_layer_is_given_up_for_a_larger_micro_batch_when_that_pays() {
    let (land, s) = slow_link_long_prompt();
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.expect("a winner");
    let w = &s.plan.workload;
    let at = |ngl: u32, ub: u32| Candidate {
        n_gpu_layers: ngl,
        op_offload: OpOffload::On,
        ..win.with_ubatch(ub)
    };
    let most = max_fit(&land, &s, &at(81, 2048)).unwrap();
    assert!(
        !fits(&land, &s, &at(most, 4096)),
        "4096 fits beside {most} layers"
    );
    assert_eq!(
        (win.n_ubatch, win.n_gpu_layers),
        (4096, most - 1),
        "{}",
        win.label()
    );
    let kept = land.true_seconds(&at(most, 2048), w);
    assert!(
        land.true_seconds(&win, w) < kept * 0.9,
        "{} vs {kept}",
        win.label()
    );
}

/// `--threads-batch 16`: the prompt's thread count stays among those given, while generation's
/// is still searched.
#[test]
fn the_prompt_thread_counts_given_are_the_only_ones_measured() {
    let mut land = gpus(0, 0);
    land.devices.clear();
    let mut s = settings(&land, 3);
    s.threads_batch_options = vec![16];
    let run = tune(land, s, None, Mode::Search);
    assert!(run
        .results
        .iter()
        .all(|r| r.candidate.batch_threads() == 16));
    assert!(run.results.iter().any(|r| r.candidate.threads != 16));
}

/// The ceilings bound an axis by the phases the knob table says its candidates' differences move
/// (no table of axis names beside it): on the host alone generation's threads move generation
/// alone, the prompt's threads and the micro-batch the prompt alone, the kernels both.
#[test]
fn an_axis_moves_the_phases_the_knob_table_gives_what_its_candidates_change() {
    use search_space::{knob::phases_moved, Phases};
    let land = gpus(0, 0);
    let s = settings(&land, 5);
    let from = crate::engine::in_space(&s, &Candidate::llama_default(16, 0));
    let moved = |name: &str| {
        let axis = (crate::engine::AXES.iter())
            .find(|a| a.name == name)
            .expect("an axis");
        let group: Vec<Candidate> = std::iter::once(from.clone())
            .chain((axis.vary)(&s, &from))
            .collect();
        assert!(group.len() > 1, "{name} varies on the host alone");
        phases_moved(&group)
    };
    assert_eq!(moved("threads"), Phases::GENERATION);
    assert_eq!(moved("prompt threads"), Phases::PROMPT);
    assert_eq!(moved("batch"), Phases::PROMPT);
    assert_eq!(moved("kernels"), Phases::BOTH);
}
