//! `bench/search-sim`: the coordinate-descent search against the exhaustive grid (every placement ×
//! every knob value, same protocol) on seeded simulated landscapes, scored against each landscape's
//! true optimum (the noise-free model evaluated on the whole grid). It tests search logic on a
//! model, not real hardware. Run with `--ignored` (the script does).

use super::harness::{fits, settings, tune, Mode, SimRun};
use super::{Device, Host, Landscape, Moe, Outcome, SimModel, GIB, MIB};
use crate::engine::TuneSettings;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use search_space::Candidate;
use std::time::Duration;

/// A seeded landscape: 1–4 GPUs of 8–48 GiB, a model of 32–80 layers (a quarter of them MoE), a
/// vocabulary of 32k–262k, 0.5–2% noise, load offsets up to ±5%, rare crashes.
fn landscape(seed: u64) -> Landscape {
    let mut r = StdRng::seed_from_u64(seed);
    let n = r.gen_range(1..=4);
    let mem = *[8, 12, 16, 24, 48].choose(&mut r).unwrap() * GIB;
    let layers = *[32, 48, 64, 80].choose(&mut r).unwrap();
    let layer_bytes = *[100, 200, 350, 480, 700].choose(&mut r).unwrap() * MIB;
    let vocab = *[32_000, 128_256, 262_144].choose(&mut r).unwrap();
    let mut model = SimModel::dense(layers, layer_bytes, vocab);
    if r.gen_bool(0.25) {
        model.moe = Some(Moe {
            expert_share: 0.9,
            active: 0.1,
        });
    }
    Landscape {
        host: Host {
            bandwidth: *[50e9, 80e9, 200e9].choose(&mut r).unwrap(),
            flops_per_core: 60e9,
            physical_cores: 16,
            numa_nodes: 1,
        },
        devices: (0..n)
            .map(|i| Device {
                name: format!("CUDA{i}"),
                mem_bytes: mem,
                bandwidth: *[450e9, 900e9, 3000e9].choose(&mut r).unwrap(),
                flops: 80e12,
                link: 25e9,
                host_buffer: true,
            })
            .collect(),
        model,
        overhead_s: 0.5e-3,
        noise: *[0.005, 0.01, 0.02].choose(&mut r).unwrap(),
        load_spread: *[0.0, 0.02, 0.05].choose(&mut r).unwrap(),
        crash_rate: 0.005,
        fit_undercount: 0,
    }
}

/// The best noise-free seconds per request over every valid, fitting configuration.
fn true_optimum(land: &Landscape, s: &TuneSettings) -> f64 {
    let l = land.model.n_layers;
    let mut placements: Vec<(u32, u32)> = (0..=l + 1).map(|n| (n, 0)).collect();
    if land.model.moe.is_some() {
        placements.extend((0..=l).map(|m| (l + 1, m)));
    }
    let mut best = f64::INFINITY;
    for (n_gpu_layers, n_cpu_moe) in placements {
        let base = Candidate {
            n_gpu_layers,
            n_cpu_moe,
            ..Candidate::llama_default(s.default_threads, 0)
        };
        for c in crate::engine::grid(s, &base) {
            if fits(land, s, &c) {
                best = best.min(land.true_seconds(&c, &s.workload));
            }
        }
    }
    best
}

/// One mode's figures on one landscape: hit (within the threshold of the optimum), regret,
/// simulated seconds, repetitions measured.
struct Score {
    hit: bool,
    regret: f64,
    seconds: f64,
    reps: usize,
}

fn score(run: &SimRun, land: &Landscape, s: &TuneSettings, opt: f64) -> Score {
    let got = run
        .winner
        .as_ref()
        .map_or(f64::INFINITY, |w| land.true_seconds(w, &s.workload));
    Score {
        hit: got <= opt * (1.0 + s.noise),
        regret: got / opt - 1.0,
        seconds: run.seconds,
        reps: run.trace.borrow().count(Outcome::Measured),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn summary(name: &str, scores: &[Score]) -> (f64, f64, f64) {
    let n = scores.len() as f64;
    let hits = scores.iter().filter(|x| x.hit).count() as f64 / n;
    let regret = median(scores.iter().map(|x| x.regret).collect());
    let worst = scores.iter().map(|x| x.regret).fold(0.0, f64::max);
    let secs = median(scores.iter().map(|x| x.seconds).collect());
    let reps = median(scores.iter().map(|x| x.reps as f64).collect());
    println!(
        "{name:<22} within noise of optimum {:>5.1}%   median regret {:>+6.2}%   worst {:>+7.2}%   median {:>8.0} s simulated, {:>6.0} repetitions",
        100.0 * hits,
        100.0 * regret,
        100.0 * worst,
        secs,
        reps
    );
    (hits, secs, reps)
}

#[test]
#[ignore = "the bench behind bench/search-sim; run with --ignored"]
fn search_sim_bench() {
    let n: u64 = std::env::var("SEARCH_SIM_LANDSCAPES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    println!(
        "search-sim: tests the search LOGIC on a simulated roofline model of devices and a model,"
    );
    println!("NOT real hardware or llama.cpp. {n} seeded landscapes (1-4 GPUs, 32-80 layers, noise 0.5-2%).");
    let (mut search, mut searched_unbounded, mut grid) = (Vec::new(), Vec::new(), Vec::new());
    for seed in 0..n {
        let land = landscape(seed);
        let s = TuneSettings {
            budget: Duration::from_secs(600),
            ..settings(&land, seed)
        };
        let opt = true_optimum(&land, &s);
        let run = tune(land.clone(), s.clone(), None, Mode::Search);
        search.push(score(&run, &land, &s, opt));
        let unbounded = TuneSettings {
            budget: Duration::from_secs(1000 * 3600),
            ..s.clone()
        };
        let run = tune(land.clone(), unbounded.clone(), None, Mode::Search);
        searched_unbounded.push(score(&run, &land, &s, opt));
        let run = tune(land.clone(), unbounded, None, Mode::Grid);
        grid.push(score(&run, &land, &s, opt));
    }
    let (hs, ss, rs) = summary("search (10 min budget)", &search);
    summary("search (no budget)", &searched_unbounded);
    let (hg, sg, rg) = summary("grid (no budget)", &grid);
    println!(
        "ratios search/grid: hits {:.2}, simulated time {:.3}, repetitions {:.3}",
        hs / hg,
        ss / sg,
        rs / rg
    );
}
