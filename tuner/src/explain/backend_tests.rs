//! The backends finding, the per-backend figures in `--json` and the cliff chart's series per
//! backend, on a profile whose GPU was measured through CUDA and through Vulkan.

use super::diagnosis::Topic;
use super::tests::{cpu_profile, entry, figures, figures_of, finding, ranked};
use super::*;
use profiles::{BackendTrial, DeviceRef};
use search_space::Candidate;

fn gpu(p: &mut profiles::Profile) {
    p.machine.devices.push(DeviceRef {
        name: "CUDA0".into(),
        description: "NVIDIA H200".into(),
        kind: "gpu".into(),
        backend: "CUDA".into(),
        memory_total: 140 << 30,
    });
}

/// CUDA0 and Vulkan0 the same GPU: the best through CUDA at every layer, through Vulkan at fewer
/// (its buffers are larger), and one layer count below each.
fn two_backend_profile() -> profiles::Profile {
    let mut p = cpu_profile();
    gpu(&mut p);
    let w = p.workload.clone();
    let on = |dev: &str, n: u32| Candidate {
        devices: vec![dev.into()],
        ..Candidate::llama_default(2, n)
    };
    let rows = vec![
        entry(
            0,
            on("CUDA0", 19),
            Some(figures(9000.0, 310.0, &w, 1 << 30)),
            "ok",
        ),
        entry(
            0,
            on("CUDA0", 15),
            Some(figures(5000.0, 150.0, &w, 1 << 30)),
            "ok",
        ),
        entry(
            0,
            on("Vulkan0", 17),
            Some(figures(7000.0, 236.0, &w, 1 << 30)),
            "ok",
        ),
        entry(
            0,
            on("Vulkan0", 14),
            Some(figures(4000.0, 120.0, &w, 1 << 30)),
            "ok",
        ),
    ];
    p.leaderboard = ranked(rows);
    let trial = |c: Candidate, backend: &str, chosen| BackendTrial {
        backend: backend.into(),
        figures: Some(figures_of(&p.leaderboard, &c)),
        candidate: c,
        status: "ok".into(),
        chosen,
    };
    p.backends = vec![
        trial(on("CUDA0", 19), "CUDA", true),
        trial(on("Vulkan0", 17), "Vulkan", false),
    ];
    p.winner = on("CUDA0", 19);
    p.figures = figures_of(&p.leaderboard, &p.winner);
    p.refresh_server_args();
    p
}

#[test]
fn the_backends_finding_gives_the_winners_ratio_and_each_backends_figures() {
    let p = two_backend_profile();
    let e = Explanation::of(&p);
    let f = finding(&e, Topic::Backends);
    let (c, v) = (&p.backends[0], &p.backends[1]);
    let ratio = v.figures.as_ref().unwrap().score_s / c.figures.as_ref().unwrap().score_s;
    assert!(ratio > 1.0);
    assert_eq!(
        f.text,
        format!("CUDA0 {ratio:.2}x Vulkan0 at ngl=19 (Vulkan0 at ngl=17)")
    );
    assert_eq!(f.details.len(), 2);
    assert!(
        f.details[0].starts_with("CUDA0 (CUDA backend, ngl=19): "),
        "{}",
        f.details[0]
    );
    assert!(f.details[0].ends_with(", chosen"), "{}", f.details[0]);
    // --json: the trials with their figures, and the cliff per backend.
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["backends"].as_array().unwrap().len(), 2);
    assert_eq!(json["backends"][1]["candidate"]["devices"][0], "Vulkan0");
    assert!(json["backends"][1]["figures"]["tg_tps"].is_number());
    let series: Vec<(Option<&str>, u32)> = (e.backend_placements.iter())
        .map(|p| (p.backend.as_deref(), p.n_gpu_layers))
        .collect();
    assert_eq!(
        series,
        [
            (Some("CUDA"), 19),
            (Some("CUDA"), 15),
            (Some("Vulkan"), 17),
            (Some("Vulkan"), 14)
        ]
    );
    // The profile's server runs the backend that was measured.
    let args = p.server_args.join(" ");
    assert!(args.contains("--device CUDA0"), "{args}");
}

#[test]
fn the_cliff_chart_has_a_series_per_backend() {
    let dir = tempfile::tempdir().unwrap();
    let p = two_backend_profile();
    let written = charts::write(&p, &Explanation::of(&p), dir.path(), "b").unwrap();
    let cliff = (written.iter())
        .find(|c| c.title.contains("GPU layers"))
        .expect("a GPU-layers chart");
    let svg = std::fs::read_to_string(&cliff.path).unwrap();
    for label in [
        "tg through CUDA",
        "pp through CUDA",
        "tg through Vulkan",
        "pp through Vulkan",
    ] {
        assert!(svg.contains(label), "{label}");
    }
}

#[test]
fn one_backend_per_gpu_is_said_and_a_cpu_run_has_no_backends_finding() {
    let mut p = cpu_profile();
    assert!(Explanation::of(&p)
        .findings
        .iter()
        .all(|f| f.topic != Topic::Backends));
    gpu(&mut p);
    let e = Explanation::of(&p);
    assert_eq!(
        finding(&e, Topic::Backends).text,
        "one backend per GPU here (CUDA); nothing to compare"
    );
    assert!(e.backend_placements.is_empty());
    let json = serde_json::to_value(&e).unwrap();
    assert!(json.get("backends").is_none());
}
