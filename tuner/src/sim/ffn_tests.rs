//! Dense FFNs in host memory (`--n-cpu-ffn`) against whole layers there (`-ngl`) on simulated
//! landscapes: a 48-layer dense model of 16.4 GiB on one 16 GiB GPU. Which wins depends on the depth
//! a request attends to (attention over a long cache runs on the GPU only with every layer there)
//! and on the bus (the host's FFN weights cross it once per micro-batch of a prompt).

use super::harness::{fits, gpus, settings, tune, with_engine, Mode, SimRun};
use super::{Landscape, SimModel, GIB, MIB};
use crate::engine::TuneSettings;
use search_space::Candidate;

fn landscape(link: f64) -> Landscape {
    let mut land = gpus(1, 16 * GIB);
    land.model = SimModel::dense(48, 350 * MIB, 128_256);
    land.devices[0].link = link;
    land
}

fn at_depth(land: &Landscape, depth: u32) -> TuneSettings {
    let mut s = settings(land, 7);
    s.plan.workload.n_ctx = 32768;
    s.plan.workload.depth = depth;
    s
}

/// The noise-free seconds per request of the fastest measured candidate with (or without) host
/// FFNs.
fn best_measured(run: &SimRun, land: &Landscape, s: &TuneSettings, ffn: bool) -> Option<f64> {
    (run.results.iter())
        .filter(|r| r.ok() && (r.candidate.n_cpu_ffn > 0) == ffn)
        .map(|r| land.true_seconds(&r.candidate, &s.plan.workload))
        .reduce(f64::min)
}

#[test]
fn whole_layers_win_without_depth_and_host_ffns_win_at_depth() {
    let land = landscape(25e9);
    let s = at_depth(&land, 0);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert_eq!(win.n_cpu_ffn, 0, "{}", win.label());
    assert!(
        best_measured(&run, &land, &s, true).is_some(),
        "host FFNs were measured"
    );
    // At a depth of 16384 tokens the host's layers would attend to the whole cache on the CPU.
    let s = at_depth(&land, 16384);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert!(
        win.n_cpu_ffn > 0 && fits(&land, &s, &win),
        "{}",
        win.label()
    );
    let (ffn, layers) = (
        land.true_seconds(&win, &s.plan.workload),
        best_measured(&run, &land, &s, false).unwrap(),
    );
    assert!(ffn < layers * (1.0 - s.plan.noise), "{ffn} vs {layers}");
}

#[test]
fn over_a_slow_bus_whole_layers_win_even_at_depth() {
    let land = landscape(0.25e9);
    let mut s = at_depth(&land, 16384);
    // Each repetition fills 16384 tokens of cache with the host's weights crossing a slow bus for
    // every micro-batch (a first visit: 49 simulated minutes): time for every axis.
    s.time_budget = std::time::Duration::from_secs(24 * 3600);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert_eq!(win.n_cpu_ffn, 0, "{}", win.label());
    assert!(
        best_measured(&run, &land, &s, true).is_some(),
        "host FFNs were measured"
    );
}

#[test]
fn host_ffns_are_placed_one_layer_at_a_time_around_the_fit_boundary() {
    let land = landscape(25e9);
    let s = at_depth(&land, 0);
    let start = Candidate::llama_default(16, 49);
    let group = with_engine(land.clone(), s.clone(), |e| e.ffn_group(&start));
    let f16: Vec<u32> = (group.iter())
        .filter(|c| !c.kv_lossy())
        .map(|c| c.n_cpu_ffn)
        .collect();
    let least = f16[0];
    assert_eq!(f16, [least, least + 1, least + 2], "{group:?}");
    let at = |n: u32| Candidate {
        n_cpu_ffn: n,
        ..start.clone()
    };
    assert!(fits(&land, &s, &at(least)) && !fits(&land, &s, &at(least - 1)));
    // A quantized cache holds every layer's attention with fewer FFNs on the host.
    assert!(
        group.iter().any(|c| c.kv_lossy() && c.n_cpu_ffn < least),
        "{group:?}"
    );
    // Without the lever (--no-cpu-ffn) no such placement is measured.
    let mut off = s.clone();
    off.plan.host_ffns = false;
    let run = tune(land, off, None, Mode::Search);
    assert!(run.results.iter().all(|r| r.candidate.n_cpu_ffn == 0));
}
