//! `bench/search-sim`: the coordinate-descent search against the exhaustive grid (every placement ×
//! every knob value, same protocol) on seeded simulated landscapes, scored against the best
//! configuration known on each landscape (the noise-free model's best over the whole grid, or a
//! run's winner where it is faster: the grid holds every layer count on every device, not device
//! subsets or uneven splits). And `bench/vs-tuners`: autotune's choice against other tools' ways
//! of choosing (`rivals.rs`) on the same landscapes. They test decision logic on a model, not real
//! hardware. Run with `--ignored` (the scripts do).

use super::harness::{fits, settings, tune, within_gate, Mode};
use super::{Device, Host, Landscape, Moe, Outcome, SimModel, GIB, MIB};
use crate::engine::TuneSettings;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use search_space::Candidate;
use std::time::Duration;

/// The first seed of the held-out landscapes: the search's heuristics were tuned on seeds from 0
/// (bench/vs-tuners' first 100 and 300); these are for scoring only, and a change tuned on them
/// would make them a tuning set too.
const HELD_OUT: u64 = 1_000_000;

/// The landscape sets a bench scores (`SEARCH_SIM_SET`: tuning, held-out or both, the default):
/// (name, first seed).
fn landscape_sets() -> Vec<(&'static str, u64)> {
    let tuning = (
        "tuning set (seeds from 0: what the heuristics were tuned on)",
        0,
    );
    let held_out = (
        "held-out set (seeds from 1000000: never used to tune)",
        HELD_OUT,
    );
    match std::env::var("SEARCH_SIM_SET").as_deref() {
        Ok("tuning") => vec![tuning],
        Ok("held-out") => vec![held_out],
        _ => vec![tuning, held_out],
    }
}

/// A model's q8_0/q8_0 KV-cache divergence, drawn apart from the rest of the landscape (which stays
/// what it was before quality was modelled): log-uniform from 0.0008 (Llama 3 8B with f16 weights)
/// to 0.012 (a small model: the 270M demo model measures 0.009). A q4_0/q4_0 cache costs 12 times
/// that: within the default gate (0.02) on about a fifth of the landscapes.
fn kv_kld_q8(seed: u64) -> f64 {
    let mut r = StdRng::seed_from_u64(seed ^ 0x004b_4c44_5138);
    let (lo, hi): (f64, f64) = (0.0008, 0.012);
    (lo.ln() + r.gen::<f64>() * (hi.ln() - lo.ln())).exp()
}

/// A seeded landscape: 1–4 GPUs of 8–48 GiB, a model of 32–80 layers (a quarter of them MoE), a
/// vocabulary of 32k–262k, 0.5–2% noise, load offsets up to ±5%, rare crashes, a KV-cache quality
/// cost ([`kv_kld_q8`]).
fn landscape(seed: u64) -> Landscape {
    let mut r = StdRng::seed_from_u64(seed);
    let n = r.gen_range(1..=4);
    let mem = *[8, 12, 16, 24, 48].choose(&mut r).unwrap() * GIB;
    let layers = *[32, 48, 64, 80].choose(&mut r).unwrap();
    let layer_bytes = *[100, 200, 350, 480, 700].choose(&mut r).unwrap() * MIB;
    let vocab = *[32_000, 128_256, 262_144].choose(&mut r).unwrap();
    let mut model = SimModel::dense(layers, layer_bytes, vocab);
    model.kv_kld_q8 = kv_kld_q8(seed);
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
                latency: 0.0,
            })
            .collect(),
        model,
        overhead_s: 0.5e-3,
        noise: *[0.005, 0.01, 0.02].choose(&mut r).unwrap(),
        load_spread: *[0.0, 0.02, 0.05].choose(&mut r).unwrap(),
        crash_rate: 0.005,
        fit_undercount: 0,
        other_backends: Vec::new(),
    }
}

/// The grid's fastest configuration that fits, and its noise-free seconds per request.
fn grid_optimum(land: &Landscape, s: &TuneSettings) -> Option<(f64, Candidate)> {
    let l = land.model.n_layers;
    let mut placements: Vec<(u32, u32, u32)> = (0..=l + 1).map(|n| (n, 0, 0)).collect();
    if land.model.moe.is_some() {
        placements.extend((0..=l).map(|m| (l + 1, m, 0)));
    } else {
        placements.extend((1..=l).map(|f| (l + 1, 0, f)));
    }
    let mut best: Option<(f64, Candidate)> = None;
    for (n_gpu_layers, n_cpu_moe, n_cpu_ffn) in placements {
        let base = Candidate {
            n_gpu_layers,
            n_cpu_moe,
            n_cpu_ffn,
            ..Candidate::llama_default(s.default_threads, 0)
        };
        for c in crate::engine::grid(s, &base) {
            if fits(land, s, &c) && within_gate(land, s, &c) {
                let t = land.true_seconds(&c, &s.plan.workload);
                if best.as_ref().is_none_or(|(b, _)| t < *b) {
                    best = Some((t, c));
                }
            }
        }
    }
    best
}

/// One mode's figures on one landscape: hit (within the threshold of the best known, and within
/// the quality gate), regret, simulated seconds, repetitions measured; whether its choice loads at
/// the run's context, and whether its KV cache is over the quality gate.
struct Score {
    hit: bool,
    regret: f64,
    seconds: f64,
    reps: usize,
    loads: bool,
    over_gate: bool,
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
    let worst = (scores.iter().filter(|x| x.loads))
        .map(|x| x.regret)
        .fold(0.0, f64::max);
    let secs = median(scores.iter().map(|x| x.seconds).collect());
    let reps = median(scores.iter().map(|x| x.reps as f64).collect());
    println!(
        "{name:<22} within noise of the best {:>5.1}%   median regret {:>+6.2}%   worst {:>+7.2}%   median {:>8.0} s simulated, {:>6.0} repetitions",
        100.0 * hits,
        100.0 * regret,
        100.0 * worst,
        secs,
        reps
    );
    (hits, secs, reps)
}

/// How many landscapes a bench runs: `SEARCH_SIM_LANDSCAPES`, 100 unless set.
fn landscape_count() -> u64 {
    std::env::var("SEARCH_SIM_LANDSCAPES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

#[test]
#[ignore = "the bench behind bench/search-sim; run with --ignored"]
fn search_sim_bench() {
    let n = landscape_count();
    println!(
        "search-sim: tests the search LOGIC on a simulated roofline model of devices and a model,"
    );
    println!("NOT real hardware or llama.cpp. {n} seeded landscapes (1-4 GPUs, 32-80 layers, noise 0.5-2%)");
    println!(
        "in each set; a KV cache wins only within the default quality gate (its choices too)."
    );
    for (set, first) in landscape_sets() {
        println!("{set}:");
        search_sim_set(first, n);
    }
}

/// `bench/search-sim` on the `n` landscapes from seed `first`.
fn search_sim_set(first: u64, n: u64) {
    let (mut search, mut searched_unbounded, mut grid) = (Vec::new(), Vec::new(), Vec::new());
    for seed in first..first + n {
        let land = landscape(seed);
        let s = TuneSettings {
            time_budget: Duration::from_secs(600),
            ..settings(&land, seed)
        };
        let unbounded = TuneSettings {
            time_budget: Duration::from_secs(1000 * 3600),
            ..s.clone()
        };
        let choices = [
            run_choice(&land, s.clone(), Mode::Search),
            run_choice(&land, unbounded.clone(), Mode::Search),
            run_choice(&land, unbounded, Mode::Grid),
        ];
        let mut scores = score_choices(&land, &s, &choices).into_iter();
        search.extend(scores.next());
        searched_unbounded.extend(scores.next());
        grid.extend(scores.next());
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

/// One tool's choice on a landscape: the configuration (none when it chose nothing), the
/// simulated seconds it spent choosing and the repetitions it measured.
struct Choice {
    candidate: Option<Candidate>,
    seconds: f64,
    reps: usize,
}

/// Every tool's choice on one landscape scored at the run's workload, against the best
/// configuration known there: the grid's optimum or any tool's choice, whichever is faster (the
/// grid holds every layer count with every device, not device subsets or uneven splits, which the
/// search also measures). A choice that exceeds a device's memory at the run's context does not
/// load (llama-server would fail to start with it).
fn score_choices(land: &Landscape, s: &TuneSettings, choices: &[Choice]) -> Vec<Score> {
    let got: Vec<Option<f64>> = choices
        .iter()
        .map(|ch| {
            let c = ch.candidate.as_ref()?;
            let loads = land
                .out_of_memory(c, s.plan.workload.n_ctx, false)
                .is_none();
            loads.then(|| land.true_seconds(c, &s.plan.workload))
        })
        .collect();
    let over_gate: Vec<bool> = (choices.iter())
        .map(|ch| (ch.candidate.as_ref()).is_some_and(|c| !within_gate(land, s, c)))
        .collect();
    let best = (got.iter().zip(&over_gate))
        .filter(|(_, &over)| !over)
        .filter_map(|(g, _)| *g)
        .fold(
            grid_optimum(land, s).map_or(f64::INFINITY, |(t, _)| t),
            f64::min,
        );
    choices
        .iter()
        .zip(got)
        .zip(over_gate)
        .map(|((ch, g), over_gate)| {
            let t = g.unwrap_or(f64::INFINITY);
            Score {
                hit: t <= best * (1.0 + s.plan.noise) && !over_gate,
                regret: t / best - 1.0,
                seconds: ch.seconds,
                reps: ch.reps,
                loads: g.is_some(),
                over_gate,
            }
        })
        .collect()
}

/// A tune's choice on the landscape (the search or the grid).
fn run_choice(land: &Landscape, s: TuneSettings, mode: Mode) -> Choice {
    let run = tune(land.clone(), s, None, mode);
    let reps = run.trace.borrow().count(Outcome::Measured);
    Choice {
        reps,
        candidate: run.winner,
        seconds: run.seconds,
    }
}

/// `s` with `tune`'s default budget: 10 minutes, growing to 40 visits of the baseline up to 30.
fn default_budget(s: &TuneSettings) -> TuneSettings {
    TuneSettings {
        time_budget: crate::tuning::DEFAULT_BUDGET,
        time_budget_cap: Some(crate::tuning::GROWN_BUDGET_CAP),
        ..s.clone()
    }
}

/// The tools' choices on one landscape: autotune's search (with the run's budget and without
/// one), llama-server unasked, Ollama's estimate, llama-optimus with its default metric and with
/// `--metric mean`.
fn choices(land: &Landscape, s: &TuneSettings, seed: u64) -> Vec<Choice> {
    use super::rivals::{fituna, ggrun, llama_optimus, ollama, Optimus, OptimusMetric};
    let decided = |c: Candidate| Choice {
        candidate: Some(c),
        seconds: 0.0,
        reps: 0,
    };
    let unbounded = TuneSettings {
        time_budget: Duration::from_secs(1000 * 3600),
        ..s.clone()
    };
    let default = default_budget(s);
    let mut out = vec![
        run_choice(land, s.clone(), Mode::Search),
        run_choice(land, default, Mode::Search),
        run_choice(land, unbounded, Mode::Search),
        decided(super::harness::llama_fit(land, s)),
        decided(ollama(land, s)),
    ];
    for metric in [OptimusMetric::Tg, OptimusMetric::Mean] {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0000_716d_7573);
        let o = llama_optimus(land, &Optimus::new(metric), &mut rng);
        out.push(Choice {
            candidate: Some(o.pick),
            seconds: o.seconds,
            reps: (o.trials * 3) as usize,
        });
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0000_6767_7275);
    let g = ggrun(land, s, &mut rng);
    out.push(Choice {
        candidate: Some(g.pick),
        seconds: g.seconds,
        reps: g.launches as usize,
    });
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0000_6669_7475);
    let f = fituna(land, s, &mut rng);
    out.push(Choice {
        candidate: f.pick,
        seconds: f.seconds,
        reps: (f.benches * 5) as usize,
    });
    out
}

/// One row of the rivals' table: how often within noise of the best known, the median regret, the
/// worst regret of a choice that loads, how many choices do not load, the median tuning time, and
/// against autotune's choice on the same landscape: how often it is slower or faster beyond the
/// noise threshold.
fn rival_row(name: &str, scores: &[Score], autotune: &[Score]) {
    let n = scores.len() as f64;
    let hits = scores.iter().filter(|x| x.hit).count() as f64 / n;
    let fails = scores.iter().filter(|x| !x.loads).count();
    let over_gate = scores.iter().filter(|x| x.over_gate).count();
    let regret = median(scores.iter().map(|x| x.regret).collect());
    let worst = (scores.iter().filter(|x| x.loads))
        .map(|x| x.regret)
        .fold(0.0, f64::max);
    let secs = median(scores.iter().map(|x| x.seconds).collect());
    let time = if secs > 0.0 {
        format!("{:>7.0} s", secs)
    } else {
        format!("{:>9}", "-")
    };
    let ratio = |x: &Score, a: &Score| (1.0 + x.regret) / (1.0 + a.regret);
    let pairs = || scores.iter().zip(autotune);
    let slower = pairs().filter(|(x, a)| ratio(x, a) > 1.02).count();
    let faster = pairs().filter(|(x, a)| ratio(x, a) < 1.0 / 1.02).count();
    println!(
        "{name:<34} {:>5.1}%   {:>+8.2}%   {:>+8.2}%   {:>3}/{:<3}   {:>9}   {time}   {slower:>3} / {faster:<3}",
        100.0 * hits,
        100.0 * regret,
        100.0 * worst,
        fails,
        scores.len(),
        over_gate,
    );
}

/// `VS_TUNERS_TRACE=SEED[/R]`: every simulated measurement of autotune's run on that landscape (with
/// tune's default budget, or `budget` when VS_TUNERS_BUDGET is set), the time it ended, its
/// outcome and the configuration's noise-free seconds per request; then each candidate's outcome.
fn trace_landscape(seed: u64, r: u64, budget: Option<Duration>) {
    let land = landscape(seed);
    let run_seed = run_seed(seed, r);
    let s = match budget {
        Some(time_budget) => TuneSettings {
            time_budget,
            ..settings(&land, run_seed)
        },
        None => default_budget(&settings(&land, run_seed)),
    };
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let w = &s.plan.workload;
    println!(
        "trace seed {seed}/{r}: budget {} s, ran {:.0} s, axes not reached {:?}",
        run.budget.as_secs(),
        run.seconds,
        run.not_reached
    );
    for (c, outcome, t) in run.trace.borrow().calls.iter() {
        let truth = land.true_seconds(c, w);
        println!("trace {t:8.1} s {outcome:?} {} ({truth:.3} s)", c.label());
    }
    for r in &run.results {
        let why = r
            .failure
            .as_ref()
            .map(|f| f.to_string())
            .or(r.skipped.clone());
        let median = (r.rate_sample(w))
            .map(|s| format!(", median {:.3} s", 1.0 / s.median()))
            .unwrap_or_default();
        println!(
            "trace result {}: {} reps{median} {}",
            r.candidate.label(),
            r.reps.len(),
            why.unwrap_or_default()
        );
    }
    println!("trace winner {:?}", run.winner.map(|c| c.label()));
}

/// The seed of run `r` of a landscape: the landscape stays, the measurements' noise and the
/// candidates' order change (run 0 is the landscape's own seed).
fn run_seed(seed: u64, r: u64) -> u64 {
    seed + (r << 32)
}

/// `VS_TUNERS_TRACE`'s landscape and run: `SEED` (the first run) or `SEED/R` (run R of
/// `VS_TUNERS_REPLICAS`).
fn trace_target(v: &str) -> Option<(u64, u64)> {
    match v.split_once('/') {
        Some((seed, r)) => Some((seed.parse().ok()?, r.parse().ok()?)),
        None => Some((v.parse().ok()?, 0)),
    }
}

/// `VS_TUNERS_REPLICAS=R`: runs of each landscape (default 1). One run per landscape decides a
/// landscape's hit on one draw of the noise; a change to the search that moves the hits by one or
/// two in 100 needs several draws to tell from chance.
fn replica_count() -> u64 {
    std::env::var("VS_TUNERS_REPLICAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&r| r >= 1)
        .unwrap_or(1)
}

/// The table's rows: autotune with the run's budget, the default and none, then the rivals.
fn row_names(budget: Duration) -> Vec<String> {
    vec![
        format!("autotune ({} s budget)", budget.as_secs()),
        "autotune (default budget, grows)".into(),
        "autotune (no budget)".into(),
        "llama-server unasked (its --fit)".into(),
        "Ollama's estimate + its defaults".into(),
        "llama-optimus (tg, its default)".into(),
        "llama-optimus --metric mean".into(),
        "ggrun --ai-tune (its fixed plan)".into(),
        "FiTuna (a target above reach)".into(),
    ]
}

#[test]
#[ignore = "the bench behind bench/vs-tuners; run with --ignored"]
fn vs_tuners_bench() {
    let n = landscape_count();
    // autotune's default, or VS_TUNERS_BUDGET seconds.
    let asked: Option<u64> = std::env::var("VS_TUNERS_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok());
    if let Some((seed, r)) = std::env::var("VS_TUNERS_TRACE")
        .ok()
        .and_then(|v| trace_target(&v))
    {
        return trace_landscape(seed, r, asked.map(Duration::from_secs));
    }
    let budget = Duration::from_secs(asked.unwrap_or(600));
    println!(
        "vs-tuners: decision procedures on a SIMULATED roofline model of devices and a model,"
    );
    println!("NOT real hardware, llama.cpp or the other tools' real speed. {n} seeded landscapes");
    println!(
        "(those of bench/search-sim). Every choice is scored at the same workload: a 4096-token"
    );
    println!(
        "context, 512-token prompts, 128 generated tokens; a KV cache over the default quality"
    );
    println!(
        "gate (mean KLD 0.02 on the landscape's model) is never a hit, and never the best known."
    );
    let replicas = replica_count();
    if replicas > 1 {
        println!("Each landscape {replicas} times, with other noise and shuffle seeds (run r: seed + r x 2^32).");
    }
    for (set, first) in landscape_sets() {
        println!("{set}:");
        vs_tuners_set(first, n, budget, replicas);
    }
    println!(
        "hits: within the ±2% noise threshold of the best configuration known (the grid's optimum"
    );
    println!(
        "or any tool's choice, within the quality gate); median/worst: regret, seconds per request"
    );
    println!("over the best's (worst: of the choices that load); no load: choices that exceed a");
    println!(
        "device's memory at the 4096-token context, or none (a search that ended with an error);"
    );
    println!(
        "over gate: choices whose KV cache is over the quality gate; tuning: median simulated"
    );
    println!("seconds spent; slower / faster: landscapes where its choice is more than 2% slower");
    println!("/ faster than autotune's.");
}

/// `bench/vs-tuners`' table on the `n` landscapes from seed `first`, each `replicas` times.
fn vs_tuners_set(first: u64, n: u64, budget: Duration, replicas: u64) {
    let names = row_names(budget);
    let mut rows: Vec<Vec<Score>> = names.iter().map(|_| Vec::new()).collect();
    for seed in first..first + n {
        let land = landscape(seed);
        for r in 0..replicas {
            let run_seed = run_seed(seed, r);
            let s = TuneSettings {
                time_budget: budget,
                ..settings(&land, run_seed)
            };
            let choices = choices(&land, &s, run_seed);
            let scores = score_choices(&land, &s, &choices);
            if std::env::var_os("VS_TUNERS_DEBUG").is_some() {
                if let Some((t, c)) = grid_optimum(&land, &s) {
                    println!(
                        "seed {seed}/{r} grid's optimum {t:.3} s/request {}",
                        c.label()
                    );
                }
                for ((name, ch), sc) in names.iter().zip(&choices).zip(&scores) {
                    let label = ch.candidate.as_ref().map(|c| c.label());
                    println!(
                        "seed {seed}/{r} {name:<34} {:+7.2}% {label:?} {:.0} s",
                        100.0 * sc.regret,
                        sc.seconds
                    );
                }
            }
            for (row, sc) in rows.iter_mut().zip(scores) {
                row.push(sc);
            }
        }
    }
    println!(
        "{:<34} {:>6}   {:>9}   {:>9}   {:>7}   {:>9}   {:>9}   vs autotune: slower / faster",
        "", "hits", "median", "worst", "no load", "over gate", "tuning"
    );
    for (name, scores) in names.iter().zip(&rows) {
        rival_row(name, scores, &rows[0]);
    }
}
