//! Other hosts over real links: a remote device reached over a network with its own bandwidth and
//! latency ([`Device::latency`]). A model this machine holds is not spread over a slow link (local
//! alone is measured against local + the remote, and the faster kept); a model it does not hold
//! goes to the fewest, fastest hosts that hold it.

use super::harness::{settings, tune, Mode};
use super::{Device, Host, Landscape, SimModel, GIB, MIB};
use crate::hosts::links::runs_on;
use search_space::{Candidate, OpOffload};
use std::time::Duration;

/// A second PC's memory and cores behind a network link (`link` bytes/s, `latency` s each way).
fn remote(name: &str, link: f64, latency: f64) -> Device {
    Device {
        name: name.into(),
        mem_bytes: 32 * GIB,
        bandwidth: 60e9,
        flops: 1e12,
        link,
        host_buffer: false,
        latency,
    }
}

const TEN_GBE: (f64, f64) = (1.2e9, 50e-6);
const ONE_GBE: (f64, f64) = (118e6, 200e-6);
const WIFI: (f64, f64) = (30e6, 3e-3);

/// A 16-core host with 60 GB/s, `model`, and `devices`.
fn landscape(model: SimModel, devices: Vec<Device>) -> Landscape {
    Landscape {
        host: Host {
            bandwidth: 60e9,
            flops_per_core: 60e9,
            physical_cores: 16,
            numa_nodes: 1,
        },
        devices,
        model,
        overhead_s: 0.5e-3,
        noise: 0.01,
        load_spread: 0.0,
        crash_rate: 0.0,
        fit_undercount: 0,
        other_backends: Vec::new(),
    }
}

/// A 1B-class model (16 layers of 60 MiB, 32k vocabulary): about 17 ms a token on the host, where
/// a Wi-Fi round trip (6 ms and the activations) is a third more.
fn small() -> SimModel {
    SimModel::dense(16, 60 * MIB, 32_000)
}

/// An 8B-class model (32 layers of 220 MiB, 128k vocabulary).
fn eight_b() -> SimModel {
    SimModel::dense(32, 220 * MIB, 128_256)
}

/// The offload devices the run's winner puts layers on.
fn hosts_used(land: &Landscape, winner: &Candidate) -> Vec<String> {
    let names: Vec<String> = land.devices.iter().map(|d| d.name.clone()).collect();
    (names.iter())
        .filter(|n| runs_on(winner, &names, n))
        .cloned()
        .collect()
}

/// Tunes `land` as `autotune tune --rpc` would: RPC devices take no op offload; `host_budget` is
/// `--mem-budget CPU=`, `budget` the run's time (simulated; 4 hours when `None`).
fn tune_hosts(
    land: &Landscape,
    host_budget: Option<u64>,
    budget: Option<Duration>,
    seed: u64,
) -> super::harness::SimRun {
    let mut s = settings(land, seed);
    if let Some(b) = budget {
        s.time_budget = b;
    }
    s.op_offload = vec![OpOffload::On];
    if let Some(b) = host_budget {
        s.mem_budgets.0.push(profiles::DeviceBudget {
            device: "CPU".into(),
            bytes: b,
            given: true,
            same_gpu: Vec::new(),
        });
    }
    assert_eq!(s.links.len(), land.devices.len(), "every host's link known");
    tune(land.clone(), s, None, Mode::Search)
}

/// A second PC whose memory is 1.3x as fast as this one's, alone, holds the small model's token
/// in 77% of the host's time: over 10 GbE it is used, over Wi-Fi (a round trip of 6 ms a token) it
/// is slower than the host alone and left out. Both by measurement: its placements are measured.
#[test]
fn a_model_this_machine_holds_is_not_spread_over_a_slow_link() {
    for seed in [1, 2, 3] {
        for ((link, latency), used) in [(WIFI, false), (TEN_GBE, true)] {
            let mut pc = remote("RPC0", link, latency);
            pc.bandwidth = 78e9;
            let land = landscape(small(), vec![pc]);
            let run = tune_hosts(&land, None, None, seed);
            let win = run.winner.clone().expect("a winner");
            let on = hosts_used(&land, &win);
            assert_eq!(
                !on.is_empty(),
                used,
                "seed {seed}, {link} B/s: {}",
                win.label()
            );
            let measured = |remote: bool| {
                (run.results.iter())
                    .any(|r| (r.candidate.n_gpu_layers > 0) == remote && !r.reps.is_empty())
            };
            assert!(
                measured(true) && measured(false),
                "seed {seed}: local alone and local + the remote both measured"
            );
        }
    }
}

/// Three hosts, each able to hold the whole small model, over 1 GbE, Wi-Fi and 10 GbE (in that
/// order); the host's budget (300 MiB) holds its embeddings and a few layers. A token on one host
/// alone takes 17 ms and its link's round trip: 0.1 ms over 10 GbE, 0.7 ms over 1 GbE (4% more),
/// 7 ms over Wi-Fi. The winner is every layer on the 10 GbE host alone, with a budget of 4 simulated
/// hours and with the default's first 10 minutes: the nearest host alone is measured first.
/// For the 8B model the 1 GbE host is as fast within the noise (0.5%), and either is a right answer.
#[test]
fn a_model_this_machine_cannot_hold_goes_to_the_fewest_fastest_hosts() {
    for seed in [1, 2, 3] {
        for budget in [None, Some(Duration::from_secs(600))] {
            let land = landscape(
                small(),
                vec![
                    remote("RPC0", ONE_GBE.0, ONE_GBE.1),
                    remote("RPC1", WIFI.0, WIFI.1),
                    remote("RPC2", TEN_GBE.0, TEN_GBE.1),
                ],
            );
            let run = tune_hosts(&land, Some(300 * MIB), budget, seed);
            let win = run.winner.clone().expect("a winner");
            let why = format!("seed {seed}, budget {budget:?}: {}", win.label());
            assert_eq!(hosts_used(&land, &win), ["RPC2"], "{why}");
            assert!(win.n_gpu_layers >= 14, "{why}");
        }
    }
}

/// The 8B model, whose 120 ms a token on a host hide a 1 GbE link: one host, not the Wi-Fi one.
#[test]
fn a_large_model_that_does_not_fit_uses_one_host_not_the_slow_one() {
    for seed in [1, 2, 3] {
        let land = landscape(
            eight_b(),
            vec![
                remote("RPC0", ONE_GBE.0, ONE_GBE.1),
                remote("RPC1", WIFI.0, WIFI.1),
                remote("RPC2", TEN_GBE.0, TEN_GBE.1),
            ],
        );
        let run = tune_hosts(
            &land,
            Some(3 * GIB / 2),
            Some(Duration::from_secs(600)),
            seed,
        );
        let win = run.winner.clone().expect("a winner");
        let used = hosts_used(&land, &win);
        assert!(
            used == ["RPC0"] || used == ["RPC2"],
            "seed {seed}: {}",
            win.label()
        );
    }
}

/// How the search scales to many hosts (`cargo test --release -p tuner --bin autotune --
/// --ignored --nocapture hosts_scaling`): the 8B model on 2 to 16 hosts of 8 GiB each over a mix of
/// links (1 in 4 over Wi-Fi, 1 in 4 over 1 GbE, the rest over 10 GbE), this machine's budget holding only its
/// embeddings, with the default's first 10 minutes and with 4 hours. Per run: dry runs, loads,
/// candidates measured, simulated minutes, the winner's hosts and its time against the best single
/// placement the landscape has on the fewest 10 GbE hosts that hold it. docs/several-machines.md
/// has its figures.
#[test]
#[ignore]
fn hosts_scaling() {
    println!("hosts budget   dry runs loads measured minutes winner (hosts: links)            s/request vs two 10 GbE");
    for n in [2usize, 4, 8, 16] {
        let devices: Vec<Device> = (0..n)
            .map(|i| {
                let (link, latency) = match i % 4 {
                    0 => ONE_GBE,
                    1 => WIFI,
                    _ => TEN_GBE,
                };
                Device {
                    mem_bytes: 4 * GIB,
                    ..remote(&format!("RPC{i}"), link, latency)
                }
            })
            .collect();
        let land = landscape(eight_b(), devices);
        // The fewest 10 GbE hosts that hold the model (4 GiB each, 7.3 GiB of weights): two.
        let ten: Vec<String> = (0..n)
            .filter(|i| i % 4 >= 2)
            .take(2)
            .map(|i| format!("RPC{i}"))
            .collect();
        let w = settings(&land, 1).plan.workload;
        let reference = (ten.len() == 2).then(|| {
            land.true_seconds(
                &Candidate {
                    n_gpu_layers: 33,
                    devices: ten.clone(),
                    tensor_split: vec![50, 50],
                    ..Candidate::llama_default(16, 33)
                },
                &w,
            )
        });
        for budget in [Some(Duration::from_secs(600)), None] {
            let run = tune_hosts(&land, Some(3 * GIB / 2), budget, 1);
            let t = run.trace.borrow();
            let win = run.winner.clone().expect("a winner");
            let used = hosts_used(&land, &win);
            let kinds: Vec<&str> = (used.iter())
                .map(
                    |d| match d.trim_start_matches("RPC").parse::<usize>().unwrap() % 4 {
                        0 => "1G",
                        1 => "wifi",
                        _ => "10G",
                    },
                )
                .collect();
            let s = land.true_seconds(&win, &w);
            let vs = reference.map_or("-".to_string(), |r| format!("{:.2}x", r / s));
            println!(
                "{n:>5} {:>6} {:>9} {:>5} {:>8} {:>7.0} {:<40} {s:>9.3} {vs:>8}",
                budget.map_or("4 h".into(), |b| format!("{} min", b.as_secs() / 60)),
                t.dry_runs,
                t.loads,
                t.count(super::Outcome::Measured),
                t.calls.last().map_or(0.0, |c| c.2) / 60.0,
                format!("{} ({})", used.len(), kinds.join(" ")),
            );
        }
    }
}
