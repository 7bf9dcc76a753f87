//! The backends finding: where one GPU was driven by several backends (CUDA0 and Vulkan0), what the
//! best placement through each measured against the other ("CUDA0 1.31x Vulkan0 at ngl=33"), else
//! that each GPU had one backend; and the offload cliff as a series per backend for the chart.

use super::finding::{finding, measured, Finding, PlacementPoint, Topic};
use profiles::{BackendTrial, Profile};

/// The ggml backends that drive the profile's GPUs (not the CPU, not RPC servers).
fn gpu_backends(profile: &Profile) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for d in (profile.machine.devices.iter()).filter(|d| matches!(d.kind.as_str(), "gpu" | "igpu"))
    {
        if !d.backend.eq_ignore_ascii_case("RPC") && !out.contains(&d.backend.as_str()) {
            out.push(&d.backend);
        }
    }
    out
}

/// The finding, where the profile has a GPU of this machine.
pub fn backends(profile: &Profile) -> Option<Finding> {
    if let Some(text) = BackendTrial::summary(&profile.backends) {
        return Some(Finding {
            topic: Topic::Backends,
            text,
            details: profile.backends.iter().map(BackendTrial::detail).collect(),
        });
    }
    if !profile.backends.is_empty() {
        let details = profile.backends.iter().map(BackendTrial::detail).collect();
        return Some(Finding {
            topic: Topic::Backends,
            text: "several backends drive a GPU; none was measured against another".into(),
            details,
        });
    }
    let gpus = gpu_backends(profile);
    (!gpus.is_empty()).then(|| {
        finding(
            Topic::Backends,
            format!(
                "one backend per GPU here ({}); nothing to compare",
                gpus.join(", ")
            ),
        )
    })
}

/// The backend a candidate runs its GPU through: that of the first device it names.
fn backend_of(c: &search_space::Candidate) -> Option<String> {
    let d = c.devices.iter().find(|d| *d != "CPU")?;
    Some(
        d.trim_end_matches(|ch: char| ch.is_ascii_digit())
            .to_string(),
    )
}

/// The best measured figures at each GPU-layer count through each backend the run compared, most
/// layers first; empty where no backends were compared.
pub fn backend_placements(profile: &Profile) -> Vec<PlacementPoint> {
    let mut out: Vec<PlacementPoint> = Vec::new();
    for t in &profile.backends {
        let mut points: Vec<PlacementPoint> = Vec::new();
        for (e, f) in measured(profile).filter(|(e, _)| {
            e.candidate.n_gpu_layers > 0
                && backend_of(&e.candidate).as_deref() == Some(t.backend.as_str())
        }) {
            let n = e.candidate.n_gpu_layers;
            match points.iter_mut().find(|p| p.n_gpu_layers == n) {
                Some(p) if p.score_s.is_some_and(|s| s <= f.score_s) => {}
                Some(p) => {
                    (p.pp_tps, p.tg_tps, p.score_s) =
                        (Some(f.pp_tps), Some(f.tg_tps), Some(f.score_s));
                }
                None => points.push(PlacementPoint {
                    n_gpu_layers: n,
                    pp_tps: Some(f.pp_tps),
                    tg_tps: Some(f.tg_tps),
                    score_s: Some(f.score_s),
                    status: "ok".into(),
                    backend: Some(t.backend.clone()),
                }),
            }
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.n_gpu_layers));
        out.extend(points);
    }
    out
}
