//! Several GPUs: the split moved toward the faster device by measurement, the fastest devices
//! alone, and what is measured before the split group.

use super::harness::{fits, gpus, max_fit, settings, tune, with_engine, Mode, SimRun};
use super::{Landscape, SimModel, GIB, MIB};
use crate::engine::TuneSettings;
use search_space::{CacheType, Candidate, SplitMode};

#[test]
fn the_split_moves_toward_the_faster_device_by_measurement() {
    let mut land = gpus(2, 24 * GIB);
    land.devices[1].bandwidth = 2.0 * land.devices[0].bandwidth;
    let s = settings(&land, 11);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert!(fits(&land, &s, &win), "{}", win.label());
    assert_eq!(win.tensor_split.len(), 2, "{}", win.label());
    assert!(
        win.tensor_split[1] > win.tensor_split[0],
        "more on the faster device: {}",
        win.label()
    );
    // Better than llama.cpp's split (by memory) at the winner's other settings and the most layers
    // that split lets fit.
    let plain = Candidate {
        tensor_split: Vec::new(),
        ..win.clone()
    };
    let plain = Candidate {
        n_gpu_layers: max_fit(&land, &s, &plain).unwrap(),
        ..plain
    };
    let (got, llama) = (
        land.true_seconds(&win, &s.plan.workload),
        land.true_seconds(&plain, &s.plan.workload),
    );
    assert!(got < llama * 0.97, "{got} vs {llama}");
}

/// One GPU of four three times as fast as the others: the steps toward it grow (10, 20, 40 points
/// of the split) while they win, each as long as still holds every layer (bisected on dry runs
/// where the fast GPU fills up), so the run gets as much onto it as it holds (58% at f16 here, 60%
/// with the q4_0 cache chosen later), never a split that pushes layers off the GPUs.
#[test]
fn the_split_steps_grow_toward_a_much_faster_device_as_far_as_it_holds() {
    let mut land = gpus(4, 24 * GIB);
    land.devices[3].bandwidth = 3000e9;
    let s = settings(&land, 5);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert!(fits(&land, &s, &win), "{}", win.label());
    assert_eq!(win.tensor_split.len(), 4, "{}", win.label());
    assert!(win.tensor_split[3] >= 58, "{}", win.label());
    assert!(run.not_reached.is_empty(), "{:?}", run.not_reached);
    for r in (run.results.iter()).filter(|r| !r.candidate.tensor_split.is_empty()) {
        assert_eq!(r.candidate.n_gpu_layers, 81, "{}", r.candidate.label());
    }
}

/// Part of the model on two GPUs: the splits that hold fewer layers on the same two devices (a
/// step from the budgets' split, `-sm row` where it holds less) leave more layers to the host, whose
/// memory is read at every token far slower than a GPU's, and are not measured; each GPU alone
/// (another set of devices) still is. On `bench/vs-tuners`, 8 runs of each landscape: 79.5 / 90.6
/// / 94.9% within noise of the best (fixed 10 minutes / default budget / none) before, 81.1 / 91.6 /
/// 94.9% after.
#[test]
fn splits_that_leave_more_layers_to_the_host_are_not_measured() {
    let land = gpus(2, 16 * GIB);
    let s = settings(&land, 3);
    with_engine(land, s, |e| {
        let base = e.baseline();
        let from = Candidate {
            n_gpu_layers: e.max_fitting_layers(&base).unwrap(),
            ..base
        };
        assert!(
            from.n_gpu_layers < 81,
            "only part of the model fits: {}",
            from.label()
        );
        let group = e.split_group(&from);
        for c in &group {
            assert!(
                !c.devices.is_empty() || c.n_gpu_layers >= from.n_gpu_layers,
                "{} holds fewer layers than {} on the same devices",
                c.label(),
                from.label()
            );
        }
        assert!(
            group.iter().any(|c| c.devices.len() == 1),
            "each GPU alone is still measured: {:?}",
            group.iter().map(|c| c.label()).collect::<Vec<_>>()
        );
    });
}

/// The devices' bandwidths are probed before anything loads, and the split that fills the clearly
/// fastest one as far as it holds every layer (the roofline's best for generation) is the first
/// split measured: a budget that ends within the split group still has it.
#[test]
fn the_split_that_fills_a_much_faster_device_is_measured_first() {
    let mut land = gpus(4, 24 * GIB);
    land.devices[3].bandwidth = 3000e9;
    let s = settings(&land, 5);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let first_split = (run.trace.borrow().calls.iter())
        .map(|(c, _, _)| c.clone())
        .find(|c| !c.tensor_split.is_empty() && *c != run.baseline)
        .expect("a split was measured");
    assert!(first_split.tensor_split[3] >= 58, "{}", first_split.label());
    // Over every device, as llama.cpp's own split: no `--device` list (steps move only those).
    assert!(first_split.devices.is_empty(), "{}", first_split.label());
    assert!(fits(&land, &s, &first_split), "{}", first_split.label());
    assert_eq!(first_split.n_gpu_layers, 81, "{}", first_split.label());
}

/// Four GPUs, two of them fast (3000 GB/s) and two slow (450 GB/s), and a model the two fast ones
/// hold: the search runs it on those two alone (`--device`), where every split over the four
/// (the fastest filled, or each in turn) still passes a token through the slow ones.
#[test]
fn the_fastest_devices_that_hold_the_model_are_measured_alone() {
    let mut land = gpus(4, 16 * GIB);
    for (d, bw) in land.devices.iter_mut().zip([3000e9, 3000e9, 450e9, 450e9]) {
        d.bandwidth = bw;
    }
    land.model = SimModel::dense(32, 700 * MIB, 262_144);
    let s = settings(&land, 11);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.expect("a winner");
    assert_eq!(win.devices, ["CUDA0", "CUDA1"], "{}", win.label());
    assert_eq!(win.n_gpu_layers, s.n_layers + 1, "{}", win.label());
    let spread = Candidate {
        tensor_split: vec![25, 25, 25, 25],
        ..Candidate::llama_default(16, s.n_layers + 1)
    };
    let w = &s.plan.workload;
    assert!(land.true_seconds(&win, w) < 0.8 * land.true_seconds(&spread, w));
}

/// The distinct split candidates (a device list, a tensor split or row split) in the order their
/// first measurement came.
fn splits_in_measured_order(run: &SimRun) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    for (c, _, _) in run.trace.borrow().calls.iter() {
        let split = !c.devices.is_empty() || !c.tensor_split.is_empty();
        if (split || c.split_mode == SplitMode::Row) && !out.contains(c) {
            out.push(c.clone());
        }
    }
    out
}

/// The fastest devices alone are measured right after the filled split, before the group's other
/// shapes (each device alone, the budgets' split shifted, rows): where a fixed budget ends within
/// the split group of a large model on several GPUs, they are measured.
#[test]
fn the_fastest_devices_alone_are_measured_right_after_the_filled_split() {
    for seed in 1..=4 {
        let mut land = gpus(4, 16 * GIB);
        for (d, bw) in land.devices.iter_mut().zip([3000e9, 3000e9, 450e9, 450e9]) {
            d.bandwidth = bw;
        }
        land.model = SimModel::dense(32, 700 * MIB, 262_144);
        let s = settings(&land, seed);
        let run = tune(land, s, None, Mode::Search);
        let order = splits_in_measured_order(&run);
        let alone = order.iter().position(|c| c.devices == ["CUDA0", "CUDA1"]);
        assert!(
            alone.is_some_and(|k| k <= 1),
            "seed {seed}: {:?}",
            order.iter().map(|c| c.label()).collect::<Vec<_>>()
        );
    }
}

/// Three GPUs, two fast and one slow, and a 32k context whose f16 cache the two fast ones cannot
/// hold beside every layer, while a quantized one fits: the two alone at the least quantized
/// cache that fits are in the first split group, measured before the KV-cache axis is reached.
#[test]
fn the_fastest_devices_alone_are_offered_the_cache_that_lets_them_hold_the_model() {
    let (land, s) = two_fast_one_slow_at_32k();
    let alone_at = |t: CacheType| Candidate {
        devices: vec!["CUDA0".into(), "CUDA1".into()],
        tensor_split: vec![50, 50],
        type_k: t,
        type_v: t,
        ..Candidate::llama_default(16, s.n_layers + 1)
    };
    assert!(!fits(&land, &s, &alone_at(CacheType::F16)));
    assert!(fits(&land, &s, &alone_at(CacheType::Q8_0)));
    let run = tune(land, s, None, Mode::Search);
    let calls: Vec<Candidate> = run
        .trace
        .borrow()
        .calls
        .iter()
        .map(|(c, _, _)| c.clone())
        .collect();
    let first_quantized = calls.iter().position(|c| c.type_k.is_quantized());
    let first = first_quantized.map(|k| &calls[k]);
    assert!(
        first.is_some_and(|c| c.devices == ["CUDA0", "CUDA1"] && c.type_k == CacheType::Q8_0),
        "{:?}",
        first.map(|c| c.label())
    );
    let win = run.winner.expect("a winner");
    assert_eq!(win.devices, ["CUDA0", "CUDA1"], "{}", win.label());
}

/// [`the_fastest_devices_alone_are_offered_the_cache_that_lets_them_hold_the_model`]'s machine.
fn two_fast_one_slow_at_32k() -> (Landscape, TuneSettings) {
    let mut land = gpus(3, 16 * GIB);
    for (d, bw) in land.devices.iter_mut().zip([3000e9, 3000e9, 450e9]) {
        d.bandwidth = bw;
    }
    land.model = SimModel::dense(32, 860 * MIB, 262_144);
    let mut s = settings(&land, 7);
    s.plan.workload.n_ctx = 32_768;
    (land, s)
}

/// Where the clearly fastest of two GPUs holds every layer by itself, filling it first leaves the
/// other no share: that split is the fastest device alone (`--device`), which the split group
/// measures already, so it is measured as such, once, and not again as `ts=100/0`.
#[test]
fn a_filled_split_that_leaves_a_device_no_share_is_the_device_alone() {
    let mut land = gpus(2, 16 * GIB);
    for (d, bw) in land.devices.iter_mut().zip([3000e9, 450e9]) {
        d.bandwidth = bw;
    }
    land.model = SimModel::dense(32, 300 * MIB, 262_144);
    let s = settings(&land, 11);
    let run = tune(land, s.clone(), None, Mode::Search);
    let win = run.winner.expect("a winner");
    assert_eq!(win.devices, ["CUDA0"], "{}", win.label());
    assert_eq!(win.n_gpu_layers, s.n_layers + 1, "{}", win.label());
    for r in &run.results {
        let c = &r.candidate;
        assert!(!c.tensor_split.contains(&0), "measured {}", c.label());
    }
}

/// Where layers stay on the host, the host's own axes (its buffer, the generation threads) are
/// measured before the split: they set the host's share of every token, the split only what the
/// devices hold, and a budget that ends within the split group still has them.
#[test]
fn with_layers_on_the_host_the_threads_come_before_the_split() {
    let land = gpus(2, 16 * GIB);
    let s = settings(&land, 3);
    let run = tune(land, s.clone(), None, Mode::Search);
    let calls = &run.trace.borrow().calls;
    let at = |f: &dyn Fn(&Candidate) -> bool| calls.iter().position(|(c, _, _)| f(c));
    let threads = at(&|c| c.threads != s.default_threads).expect("threads measured");
    // Each device alone, or rows: only the split group measures those.
    let split = at(&|c| !c.devices.is_empty() || c.split_mode != SplitMode::Layer)
        .expect("a split measured");
    assert!(
        threads < split,
        "threads at call {threads}, the split at {split}"
    );
    let winner = run.winner.expect("a winner");
    assert!(
        winner.n_gpu_layers < 81,
        "layers on the host: {}",
        winner.label()
    );
}

/// Where the devices run tensor parallelism, the split group offers it with its constraints applied
/// before it is built (flash attention, an f16 cache), whatever the cache of the best it starts
/// from; where they do not (the simulator's default, which models neither), it offers neither.
#[test]
fn tensor_parallelism_is_offered_with_its_constraints_where_the_backend_runs_it() {
    let land = gpus(2, 48 * GIB);
    let mut s = settings(&land, 3);
    let from = Candidate {
        type_k: CacheType::Q8_0,
        type_v: CacheType::Q8_0,
        ..Candidate::llama_default(16, 81)
    };
    let modes = |s: &TuneSettings| {
        let group = with_engine(land.clone(), s.clone(), |e| e.split_group(&from));
        (group.iter())
            .filter(|c| !c.split_mode.is_layer())
            .map(|c| (c.split_mode, c.type_k, c.type_v))
            .collect::<Vec<_>>()
    };
    assert!(modes(&s).is_empty());
    s.split_modes = vec![SplitMode::Tensor];
    assert_eq!(
        modes(&s),
        [(SplitMode::Tensor, CacheType::F16, CacheType::F16)]
    );
}
