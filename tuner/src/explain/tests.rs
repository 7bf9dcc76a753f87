//! Snapshot tests of the explanation on recorded measurements: a CPU-only run, an offload run with a
//! GPU-layer axis, a mixture of experts, and a profile without a roofline record.

use super::diagnosis::Topic;
use super::*;
use profiles::{example_profile, DeviceRef, Figures, LeaderboardEntry, Roofline};
use search_space::{CacheType, Candidate, FlashAttn, KernelChoice};

pub(super) fn figures(pp: f64, tg: f64, w: &profiles::Workload, mem: u64) -> Figures {
    let score = w.n_prompt as f64 / pp + w.n_gen as f64 / tg;
    Figures {
        pp_tps: pp,
        tg_tps: tg,
        pp_depth_tps: None,
        tg_depth_tps: None,
        ttft_ms: Some((w.n_prompt as f64 / pp + 1.0 / tg) * 1000.0),
        score_s: score,
        mem_bytes: mem,
        pp_ci: Some([pp * 0.98, pp * 1.02]),
        tg_ci: Some([tg * 0.99, tg * 1.01]),
        repetitions: 3,
        estimated: Vec::new(),
    }
}

/// The explanation's finding on `topic`.
pub(super) fn finding(e: &Explanation, topic: Topic) -> &diagnosis::Finding {
    e.findings.iter().find(|f| f.topic == topic).unwrap()
}

pub(super) fn entry(rank: u32, c: Candidate, f: Option<Figures>, status: &str) -> LeaderboardEntry {
    LeaderboardEntry {
        rank,
        tie_with_previous: false,
        status: status.into(),
        // As the tuner marks them: out of memory when loaded, or pruned as over a budget.
        did_not_fit: status.contains("out of memory") || status.starts_with("pruned: needs"),
        candidate: c,
        figures: f,
        kv_kld: None,
    }
}

/// Re-ranks measured rows by score (unmeasured ones last, rank 0), as the tuner does.
pub(super) fn ranked(mut rows: Vec<LeaderboardEntry>) -> Vec<LeaderboardEntry> {
    rows.sort_by(|a, b| match (&a.figures, &b.figures) {
        (Some(x), Some(y)) => x.score_s.total_cmp(&y.score_s),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    for (i, r) in rows.iter_mut().enumerate() {
        r.rank = if r.figures.is_some() { i as u32 + 1 } else { 0 };
    }
    rows
}

/// The figures of `c`'s row in a leaderboard.
pub(super) fn figures_of(rows: &[LeaderboardEntry], c: &Candidate) -> Figures {
    rows.iter()
        .find(|e| &e.candidate == c)
        .and_then(|e| e.figures.clone())
        .unwrap()
}

fn cpu_machine(p: &mut profiles::Profile) {
    p.machine.cpu = "Intel(R) Xeon(R) Processor".into();
    p.machine.physical_cores = 2;
    p.machine.logical_cpus = 2;
    p.machine.ram_bytes = 24 << 30;
    p.machine.devices = vec![DeviceRef {
        name: "CPU".into(),
        description: "Intel(R) Xeon(R) Processor".into(),
        kind: "cpu".into(),
        backend: "CPU".into(),
        memory_total: 24 << 30,
    }];
}

/// A small dense model tuned on a 2-core CPU: the coordinate descent's threads, kernels, KV-cache and
/// micro-batch axes, the defaults as the baseline.
pub fn cpu_profile() -> profiles::Profile {
    let mut p = example_profile();
    cpu_machine(&mut p);
    small_model(&mut p);
    let (rows, winner, base) = cpu_rows(&p.workload);
    p.leaderboard = ranked(rows);
    p.figures = figures_of(&p.leaderboard, &winner);
    p.baseline = Some(base);
    p.winner = winner;
    p.roofline = Some(small_model_roofline());
    p.refresh_server_args();
    p
}

/// The demo model (gemma-3-270m) and a plain workload.
fn small_model(p: &mut profiles::Profile) {
    p.model.file_name = "gemma-3-270m-q4_k_m.gguf".into();
    p.model.path = "/models/gemma-3-270m-q4_k_m.gguf".into();
    p.model.architecture = "gemma3".into();
    p.model.size_bytes = 253_104_832;
    p.workload = profiles::Workload {
        n_ctx: 4096,
        n_prompt: 512,
        n_gen: 128,
        depth: 0,
        n_parallel: 1,
        name: "custom".into(),
    };
}

/// The CPU run's rows (unranked), its winner and the defaults' figures.
fn cpu_rows(w: &profiles::Workload) -> (Vec<LeaderboardEntry>, Candidate, Figures) {
    let defaults = Candidate::llama_default(2, 0);
    let one_thread = Candidate {
        threads: 1,
        ..defaults.clone()
    };
    let plain = Candidate {
        kernels: KernelChoice::Plain,
        ..defaults.clone()
    };
    let q8 = Candidate {
        type_k: CacheType::Q8_0,
        type_v: CacheType::Q8_0,
        flash_attn: FlashAttn::On,
        ..defaults.clone()
    };
    let fa_on = Candidate {
        flash_attn: FlashAttn::On,
        ..defaults.clone()
    };
    let winner = Candidate {
        n_ubatch: 256,
        ..defaults.clone()
    };
    let ub128 = Candidate {
        n_ubatch: 128,
        ..defaults.clone()
    };
    let base = figures(610.0, 41.0, w, 310 << 20);
    let rows = vec![
        entry(0, defaults.clone(), Some(base.clone()), "ok"),
        entry(
            0,
            one_thread,
            Some(figures(330.0, 27.5, w, 310 << 20)),
            "ok",
        ),
        entry(0, plain, Some(figures(560.0, 40.2, w, 305 << 20)), "ok"),
        entry(0, fa_on, Some(figures(612.0, 41.1, w, 309 << 20)), "ok"),
        entry(0, q8, Some(figures(590.0, 40.0, w, 300 << 20)), "ok"),
        entry(
            0,
            winner.clone(),
            Some(figures(650.0, 41.3, w, 300 << 20)),
            "ok",
        ),
        entry(0, ub128, Some(figures(540.0, 40.9, w, 296 << 20)), "ok"),
    ];
    (rows, winner, base)
}

/// The small model's roofline record on the 2-core CPU.
fn small_model_roofline() -> Roofline {
    Roofline {
        layers: 18,
        parameters: 268_098_176,
        active_parameters: 268_098_176,
        expert_count: None,
        expert_used_count: None,
        weight_bytes: 236_000_000,
        kv_bytes: 2_372_000,
        kv_tokens: 64,
        kv_bytes_per_cached_token: 36_864,
        kv_grows: false,
        cpu_bytes: 238_372_000,
        cpu_bandwidth: Some(14.2e9),
        bandwidth_method: "CPU: read of a 1.0 GiB buffer by 2 threads, best of 5 passes".into(),
        device_bandwidth: Vec::new(),
    }
}

/// The same model with an RPC device whose budget holds 12 of its 19 layers: the GPU-layer axis
/// (12, 11, 9, 6, 3, 0) and the settings axes from the best placement.
pub fn rpc_profile() -> profiles::Profile {
    let mut p = cpu_profile();
    p.machine.devices.insert(
        0,
        DeviceRef {
            name: "RPC0".into(),
            description: "127.0.0.1:50060".into(),
            kind: "gpu".into(),
            backend: "RPC".into(),
            memory_total: 24 << 30,
        },
    );
    let w = p.workload.clone();
    let at = |n: u32| Candidate::llama_default(2, n);
    let mut rows = vec![];
    for (n, pp, tg) in [
        (12, 420.0, 22.0),
        (11, 430.0, 23.1),
        (9, 450.0, 25.8),
        (6, 500.0, 29.5),
        (3, 560.0, 35.0),
        (0, 610.0, 41.0),
    ] {
        rows.push(entry(0, at(n), Some(figures(pp, tg, &w, 310 << 20)), "ok"));
    }
    rows.push(entry(
        0,
        Candidate {
            threads: 1,
            ..at(0)
        },
        Some(figures(330.0, 27.5, &w, 310 << 20)),
        "ok",
    ));
    let winner = Candidate {
        n_ubatch: 256,
        ..at(0)
    };
    rows.push(entry(
        0,
        winner.clone(),
        Some(figures(650.0, 41.3, &w, 300 << 20)),
        "ok",
    ));
    rows.push(entry(
        0,
        Candidate {
            n_ubatch: 2048,
            n_batch: 2048,
            ..at(12)
        },
        None,
        "failed: out of memory on RPC0",
    ));
    p.leaderboard = ranked(rows);
    p.figures = figures_of(&p.leaderboard, &winner);
    p.baseline = p
        .leaderboard
        .iter()
        .find(|e| e.candidate == at(12))
        .and_then(|e| e.figures.clone());
    p.winner = winner;
    p.roofline.as_mut().unwrap().device_bandwidth = vec![profiles::DeviceBandwidth {
        device: "RPC0".into(),
        bytes_per_s: 9.6e9,
        method: "matrix-vector product over a 512.0 MiB f32 matrix by RPC0's own kernels, best of 5 passes"
            .into(),
    }];
    p.refresh_server_args();
    p
}

/// A 30B mixture of experts (8 of 128 experts) near its bandwidth ceiling, with a long prompt.
fn moe_profile() -> profiles::Profile {
    let mut p = cpu_profile();
    p.model.file_name = "Qwen3-30B-A3B-Q4_K_M.gguf".into();
    p.model.architecture = "qwen3moe".into();
    p.workload = profiles::Workload {
        n_ctx: 8192,
        n_prompt: 3000,
        n_gen: 128,
        depth: 0,
        n_parallel: 1,
        name: "long-prompt".into(),
    };
    let w = p.workload.clone();
    p.figures = figures(45.0, 8.1, &w, 18 << 30);
    p.leaderboard = vec![entry(1, p.winner.clone(), Some(p.figures.clone()), "ok")];
    p.baseline = None;
    p.roofline = Some(Roofline {
        layers: 48,
        parameters: 30_532_122_624,
        active_parameters: 3_350_000_000,
        expert_count: Some(128),
        expert_used_count: Some(8),
        weight_bytes: 1_880_000_000,
        kv_bytes: 6_291_456,
        kv_tokens: 64,
        kv_bytes_per_cached_token: 98_304,
        kv_grows: false,
        cpu_bytes: 1_886_291_456,
        cpu_bandwidth: Some(19.0e9),
        bandwidth_method: "CPU: read of a 1.0 GiB buffer by 16 threads, best of 5 passes".into(),
        device_bandwidth: Vec::new(),
    });
    p.refresh_server_args();
    p
}

/// A dense llama-shaped 8B model (every layer attends to the whole cache) tuned on the CPU for a
/// 32768-token context: the context finding's projection.
fn long_context_profile() -> profiles::Profile {
    let mut p = cpu_profile();
    p.model.file_name = "Llama-3.1-8B-Q4_K_M.gguf".into();
    p.model.architecture = "llama".into();
    p.workload.n_ctx = 32768;
    let w = p.workload.clone();
    p.figures = figures(60.0, 5.6, &w, 9 << 30);
    p.leaderboard = vec![entry(1, p.winner.clone(), Some(p.figures.clone()), "ok")];
    p.baseline = None;
    p.roofline = Some(Roofline {
        layers: 32,
        parameters: 8_030_261_248,
        active_parameters: 7_504_924_672,
        expert_count: None,
        expert_used_count: None,
        weight_bytes: 4_600_000_000,
        kv_bytes: 8_388_608,
        kv_tokens: 64,
        kv_bytes_per_cached_token: 131_072,
        kv_grows: true,
        cpu_bytes: 4_608_388_608,
        cpu_bandwidth: Some(40.0e9),
        bandwidth_method: "CPU: read of a 1.0 GiB buffer by 16 threads, best of 5 passes".into(),
        device_bandwidth: Vec::new(),
    });
    p.refresh_server_args();
    p
}

#[test]
fn a_full_context_lowers_the_ceiling_by_the_kv_cache_it_adds() {
    let p = long_context_profile();
    let e = Explanation::of(&p);
    let r = e.roofline.as_ref().unwrap();
    let (full_kv, full, at_full) = diagnosis::at_full_context(&p, r).unwrap();
    // 32768 tokens of 128 KiB: 4.29 GB on top of the weights.
    assert_eq!(full_kv, 32768 * 131_072);
    assert_eq!(full, 4_600_000_000 + full_kv);
    assert!((at_full - 40.0e9 / full as f64).abs() < 1e-9, "{at_full}");
    let line = finding(&e, Topic::Context);
    assert!(
        line.text.contains("a full 32768-token context adds 4.3 GB"),
        "{}",
        line.text
    );
    // Four slots: each reads its own quarter of the cache.
    let mut four = p.clone();
    four.workload.n_parallel = 4;
    let (kv4, _, _) = diagnosis::at_full_context(&four, r).unwrap();
    assert_eq!(kv4, full_kv / 4);
    // A sliding window (the other fixtures' Gemma 3): no line.
    assert!(Explanation::of(&cpu_profile())
        .findings
        .iter()
        .all(|f| f.topic != Topic::Context));
}

#[test]
fn long_context_run() {
    insta::assert_snapshot!("long_context_run", text(&long_context_profile()));
}

fn text(p: &profiles::Profile) -> String {
    Explanation::of(p).render(p)
}

#[test]
fn cpu_run() {
    insta::assert_snapshot!("cpu_run", text(&cpu_profile()));
}

#[test]
fn offload_run_with_a_gpu_layer_axis() {
    insta::assert_snapshot!("rpc_run", text(&rpc_profile()));
}

#[test]
fn mixture_of_experts_with_a_long_prompt() {
    insta::assert_snapshot!("moe_run", text(&moe_profile()));
}

#[test]
fn profile_without_a_roofline_record() {
    insta::assert_snapshot!("no_roofline", text(&example_profile()));
}

#[test]
fn markdown_report() {
    let p = rpc_profile();
    let e = Explanation::of(&p);
    let charts = [
        charts::Chart {
            title: "tg and pp against GPU layers".into(),
            path: "/out/p-gpu-layers.svg".into(),
        },
        charts::Chart {
            title: "leaderboard".into(),
            path: "/out/p-leaderboard.svg".into(),
        },
    ];
    insta::assert_snapshot!(
        "rpc_markdown",
        markdown::render(&p, &e, &charts, std::path::Path::new("/out"))
    );
}

#[test]
fn knob_effects_compare_the_winners_neighbours_first() {
    let p = cpu_profile();
    let effects = Explanation::of(&p).knob_effects;
    let names: Vec<&str> = effects.iter().map(|k| k.knob).collect();
    // Threads changed the most; every axis here was varied around the defaults, and the winner
    // (ub=256) differs from the defaults only in the micro-batch, so only that axis is around it.
    assert_eq!(names[0], "threads");
    let ub = effects.iter().find(|k| k.knob == "micro-batch").unwrap();
    assert!(ub.around_winner);
    assert_eq!(
        (ub.best.as_str(), ub.worst.as_str(), ub.values),
        ("ub=256", "ub=128", 3)
    );
    let threads = &effects[0];
    assert!(!threads.around_winner);
    assert_eq!(
        (threads.best.as_str(), threads.worst.as_str()),
        ("t=2", "t=1")
    );
    assert!(effects.windows(2).all(|w| w[0].slower >= w[1].slower));
}

/// The threads axis holds the prompt's threads and the prompt-threads axis the generation's: each
/// line compares only its own change.
#[test]
fn generation_and_prompt_threads_are_told_apart() {
    let mut p = cpu_profile();
    let w = p.workload.clone();
    let defaults = Candidate::llama_default(2, 0);
    for e in p
        .leaderboard
        .iter_mut()
        .filter(|e| e.candidate.threads == 1)
    {
        e.candidate = defaults.with_threads(1, 2);
    }
    let fewer = figures(300.0, 41.0, &w, 310 << 20);
    p.leaderboard
        .push(entry(0, defaults.with_threads(2, 1), Some(fewer), "ok"));
    let effects = Explanation::of(&p).knob_effects;
    let of = |name| {
        let k = effects.iter().find(|k| k.knob == name).unwrap();
        (k.best.as_str(), k.worst.as_str(), k.values)
    };
    assert_eq!(of("threads"), ("t=2", "t=1", 2));
    assert_eq!(of("prompt threads"), ("tb=2", "tb=1", 2));
}

/// The NUMA strategy is a knob that mattered only on a machine with several nodes: on one,
/// llama.cpp runs every strategy as off and what differs between them is noise.
#[test]
fn numa_effects_are_reported_on_several_nodes_only() {
    let mut p = cpu_profile();
    let w = p.workload.clone();
    let winner = p.winner.clone();
    let distribute = Candidate {
        numa: search_space::Numa::Distribute,
        ..winner.clone()
    };
    let best = p.leaderboard[0].figures.clone().unwrap();
    let faster = figures(best.pp_tps, 2.0 * best.tg_tps, &w, best.mem_bytes);
    p.leaderboard.push(entry(0, distribute, Some(faster), "ok"));
    let numa = |p: &profiles::Profile| {
        let effects = Explanation::of(p).knob_effects;
        effects
            .iter()
            .find(|k| k.knob == "NUMA")
            .map(|k| k.best.clone())
    };
    assert_eq!(numa(&p), None, "one node");
    p.machine.numa_nodes = 2;
    assert_eq!(numa(&p).as_deref(), Some("numa=distribute"));
}

#[test]
fn placements_give_the_best_figures_per_layer_count() {
    let p = rpc_profile();
    let points = Explanation::of(&p).placements;
    let counts: Vec<u32> = points.iter().map(|x| x.n_gpu_layers).collect();
    assert_eq!(counts, [12, 11, 9, 6, 3, 0]);
    // At ngl=0 the best is the winner (ub=256), not the first candidate measured there.
    assert_eq!(points.last().unwrap().tg_tps, Some(41.3));
}

#[test]
fn the_roofline_percentage_is_tg_over_bandwidth_per_byte() {
    let p = cpu_profile();
    let r = RooflineView::of(&p).unwrap();
    assert_eq!(r.scope, RooflineScope::Whole);
    let ceiling = 14.2e9 / 238_372_000.0;
    assert!((r.ceiling_tps.unwrap() - ceiling).abs() < 1e-9);
    assert!((r.percent_of_ceiling.unwrap() - 100.0 * 41.3 / ceiling).abs() < 1e-9);
    // Partial offload to a device whose bandwidth is unknown: only the CPU's share is bounded; full
    // offload: nothing is.
    let mut partial = p.clone();
    partial.machine.devices = rpc_profile().machine.devices;
    partial.roofline.as_mut().unwrap().cpu_bytes = 100_000_000;
    assert_eq!(
        RooflineView::of(&partial).unwrap().scope,
        RooflineScope::CpuShare
    );
    partial.roofline.as_mut().unwrap().cpu_bytes = 0;
    let full = RooflineView::of(&partial).unwrap();
    assert_eq!((full.scope, full.ceiling_tps), (RooflineScope::None, None));
    assert_eq!(full.offload_devices, ["RPC0"]);

    // With the device's bandwidth measured: the token's time is the CPU's reads at the CPU's
    // bandwidth plus the device's reads at the device's.
    let device_bw = rpc_profile().roofline.unwrap().device_bandwidth;
    let mut split = partial.clone();
    split.roofline.as_mut().unwrap().device_bandwidth = device_bw.clone();
    split.roofline.as_mut().unwrap().cpu_bytes = 100_000_000;
    let r = RooflineView::of(&split).unwrap();
    assert_eq!(r.scope, RooflineScope::Split);
    let seconds = 100_000_000.0 / 14.2e9 + 138_372_000.0 / 9.6e9;
    assert!((r.ceiling_tps.unwrap() - 1.0 / seconds).abs() < 1e-9);
    let ceiling_line = r
        .lines(false)
        .into_iter()
        .find(|(l, _)| *l == "ceiling")
        .unwrap()
        .1;
    assert!(
        ceiling_line.contains("the CPU reads 100.0 MB and RPC0 138.4 MB per token"),
        "{ceiling_line}"
    );
    split.roofline.as_mut().unwrap().cpu_bytes = 0;
    let r = RooflineView::of(&split).unwrap();
    assert_eq!(r.scope, RooflineScope::Device);
    assert!((r.ceiling_tps.unwrap() - 9.6e9 / 238_372_000.0).abs() < 1e-9);
    // A device that is not one the layers went to does not bound anything.
    split.roofline.as_mut().unwrap().device_bandwidth[0].device = "CUDA0".into();
    assert_eq!(RooflineView::of(&split).unwrap().scope, RooflineScope::None);
}

#[test]
fn charts_are_svg_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = rpc_profile();
    let written = charts::write(&p, &Explanation::of(&p), dir.path(), "p").unwrap();
    assert_eq!(written.len(), 2);
    for c in &written {
        let svg = std::fs::read_to_string(&c.path).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{}",
            c.path.display()
        );
        assert!(svg.contains("<text"), "labels are text elements");
    }
    // A CPU-only run has no GPU-layer axis: only the leaderboard is drawn.
    let p = cpu_profile();
    let written = charts::write(&p, &Explanation::of(&p), dir.path(), "cpu").unwrap();
    assert_eq!(
        written.iter().map(|c| c.title.as_str()).collect::<Vec<_>>(),
        ["leaderboard"]
    );
}

#[test]
fn a_winner_chosen_by_a_tie_is_named_in_its_knob_line() {
    let mut p = cpu_profile();
    // The plain kernels lose by 3% but suppose the decision rule called it a tie and took them.
    p.winner = Candidate {
        kernels: KernelChoice::Plain,
        ..Candidate::llama_default(2, 0)
    };
    let e = Explanation::of(&p);
    let kernels = e.knob_effects.iter().find(|k| k.knob == "kernels").unwrap();
    assert_eq!(
        (kernels.best.as_str(), kernels.winner_value.as_deref()),
        ("repack", Some("plain"))
    );
    let settings = finding(&e, Topic::Settings);
    assert!(
        settings
            .details
            .iter()
            .any(|d| d.contains("the winner has plain: a tie")),
        "{:?}",
        settings.details
    );
}

#[test]
fn the_fit_line_says_when_the_most_layers_fit_only_with_the_kv_cache_on_the_host() {
    let fit_line = |p: &profiles::Profile| {
        text(p)
            .lines()
            .find(|l| l.trim_start().starts_with("fit "))
            .unwrap()
            .to_string()
    };
    let mut p = rpc_profile();
    assert!(!fit_line(&p).contains("-nkvo"), "{}", fit_line(&p));
    for e in p.leaderboard.iter_mut() {
        if e.candidate.n_gpu_layers == 12 {
            e.candidate.kv_offload = search_space::KvOffload::Off;
        }
    }
    let line = fit_line(&p);
    assert!(
        line.contains(
            "at most 12 of 19 layers fit on RPC0 with the KV cache in host memory (-nkvo)"
        ),
        "{line}"
    );
}

/// The H200 run of `bench/gpu-check` under `--mem-budget CUDA0=2178M` (half of full offload), its
/// figures as measured: each quantized KV cache was measured at the most layers it lets fit, so no
/// two candidates differ in the KV cache alone.
fn budget_profile() -> profiles::Profile {
    let mut p = rpc_profile();
    let w = p.workload.clone();
    let at = |n: u32, kv: CacheType, ub: u32| Candidate {
        type_k: kv,
        type_v: kv,
        n_ubatch: ub,
        ..Candidate::llama_default(16, n)
    };
    let winner = at(17, CacheType::Q4_0, 512);
    let mut rows = vec![];
    for (c, pp, tg) in [
        (winner.clone(), 1595.7, 29.6),
        (at(16, CacheType::Q8_0, 512), 1618.5, 28.2),
        (at(17, CacheType::Q8_0, 128), 498.0, 29.2),
        (at(16, CacheType::F16, 128), 439.2, 28.5),
        (at(15, CacheType::F16, 512), 1311.7, 23.9),
        (at(14, CacheType::F16, 512), 1222.8, 23.6),
    ] {
        rows.push(entry(0, c, Some(figures(pp, tg, &w, 4 << 30)), "ok"));
    }
    p.leaderboard = ranked(rows);
    p.figures = p.leaderboard[0].figures.clone().unwrap();
    p.winner = winner;
    p.refresh_server_args();
    p
}

/// Where a quantized KV cache won by letting more layers fit, "which setting mattered" says so:
/// the cache compared at the layers each type fits, not "no knob made a difference".
#[test]
fn a_kv_cache_that_lets_more_layers_fit_is_compared_at_the_layers_each_type_fits() {
    let p = budget_profile();
    let e = Explanation::of(&p);
    let top = &e.knob_effects[0];
    assert_eq!(
        (top.knob, top.best.as_str(), top.worst.as_str(), top.values),
        (
            "KV cache with the layers it fits",
            "kv=q4_0/q4_0 ngl=17",
            "kv=f16/f16 ngl=15",
            3
        )
    );
    assert!(top.around_winner && top.slower > 0.2, "{top:?}");
    let settings = finding(&e, Topic::Settings);
    assert_eq!(
        settings.text,
        "KV cache with the layers it fits mattered most"
    );
    // One layer more fitted only with the KV cache in host memory: the winner holds the most
    // layers with it on the device, which is not "fewer layers measured faster".
    let mut p = p;
    p.leaderboard.push(entry(
        0,
        Candidate {
            kv_offload: search_space::KvOffload::Off,
            n_ubatch: 128,
            ..Candidate::llama_default(16, 18)
        },
        Some(figures(471.5, 27.9, &p.workload, 4 << 30)),
        "ok",
    ));
    let fit = finding(&Explanation::of(&p), Topic::Fit).text.clone();
    assert!(
        fit.contains("the winner runs ngl=17 (the most with the KV cache on the device)"),
        "{fit}"
    );
    // Where every candidate has the same layers, the knob alone says it all: no second line.
    let cpu = Explanation::of(&cpu_profile());
    assert!(
        !cpu.knob_effects
            .iter()
            .any(|k| k.knob.contains("with the layers")),
        "{:?}",
        cpu.knob_effects
    );
}

/// The H200 budget run held to the gate: had q4_0/q4_0 measured over it (mean KLD 0.071), the
/// q8_0/q8_0 cache one layer fewer wins, and explain says what the refusal cost beside the winner's
/// own figures.
#[test]
fn the_quality_finding_shows_the_winners_figures_and_what_the_gate_refused() {
    let mut p = budget_profile();
    let figures = |kld: f64, top1: f64| profiles::QualityFigures {
        positions: 2048,
        kld_mean: kld,
        kld_se: kld / 20.0,
        kld_median: kld / 3.0,
        kld_p99: kld * 8.0,
        kld_p999: kld * 30.0,
        kld_max: kld * 40.0,
        top1,
        ref_ppl: 6.2,
        ppl: 6.2 * (1.0 + kld),
    };
    let check = |kv: CacheType, kld: f64, top1: f64, passed: bool| profiles::KvQualityCheck {
        type_k: kv,
        type_v: kv,
        figures: Some(figures(kld, top1)),
        passed,
        error: None,
        cached: false,
        seconds: 12.0,
        measured_with: None,
        against: None,
        weights_kld: None,
        attn_rot: Default::default(),
    };
    let record = profiles::QualityRecord {
        max_kv_kld: Some(0.02),
        unchecked: None,
        text: crate::engine::TEXT.into(),
        window: 1024,
        tokens: 2048,
        checks: vec![
            check(CacheType::Q4_0, 0.071, 0.86, false),
            check(CacheType::Q8_0, 0.0015, 0.985, true),
        ],
    };
    crate::report::quality::annotate(&mut p.leaderboard, &record);
    p.quality = Some(record);
    p.winner = p.leaderboard[1].candidate.clone();
    assert_eq!(p.leaderboard[0].status, "refused: mean KLD 0.0710 > 0.0200");
    assert_eq!(p.leaderboard[1].kv_kld, Some(0.0015));
    let q = finding(&Explanation::of(&p), Topic::Quality).clone();
    assert_eq!(
        q.text,
        "kv=q8_0/q8_0: mean KLD 0.0015, p99 0.0120, p99.9 0.0450, top-1 98.5% against f16, within the gate (0.0200); \
         1024-token windows of autotune's evaluation text (English prose, code and dialogue)"
    );
    assert_eq!(
        q.details,
        ["kv=q4_0/q4_0 (+5% requests/s) refused: mean KLD 0.0710 > 0.0200"]
    );
}

/// The budgets a profile was tuned under are its own record: the fit finding names those given with
/// `--mem-budget` (no status string parsed for them), and says nothing of the free-memory defaults.
#[test]
fn the_fit_finding_names_the_budgets_given() {
    let mut p = budget_profile();
    let fit = |p: &profiles::Profile| finding(&Explanation::of(p), Topic::Fit).text.clone();
    assert!(!fit(&p).contains("--mem-budget"), "{}", fit(&p));
    p.budgets = profiles::Budgets(vec!["RPC0=2178M".parse().unwrap()]);
    let text = fit(&p);
    assert!(
        text.contains("fit on RPC0 under --mem-budget RPC0=2.1 GiB"),
        "{text}"
    );
}

/// Where FFNs in host memory were measured against whole layers there, the fit finding says which
/// won and by how much, at the workload's depth.
#[test]
fn the_fit_finding_compares_host_ffns_with_whole_layers_on_the_host() {
    let mut p = budget_profile();
    p.workload.depth = 16384;
    let w = p.workload.clone();
    let ffn = Candidate {
        n_cpu_ffn: 14,
        ..Candidate::llama_default(16, 33)
    };
    let mut rows = p.leaderboard.clone();
    rows.push(entry(
        0,
        ffn,
        Some(figures(1500.0, 40.0, &w, 4 << 30)),
        "ok",
    ));
    p.leaderboard = ranked(rows);
    let fit = finding(&Explanation::of(&p), Topic::Fit).clone();
    let line = &fit.details[0];
    assert!(
        line.starts_with("attention at depth 16384 on RPC0: --n-cpu-ffn 14 ")
            && line.contains("x -ngl 17 per request (the FFNs on the host won)"),
        "{line}"
    );
    // No such line where no placement kept FFNs on the host.
    let plain = Explanation::of(&budget_profile());
    assert!(!finding(&plain, Topic::Fit)
        .details
        .iter()
        .any(|d| d.contains("--n-cpu-ffn")));
}
