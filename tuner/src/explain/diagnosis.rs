//! The diagnosis: one finding per question, in the order of their usual impact, each backed by a
//! figure of the run. Does the model fit (and what spilling costs), is generation bandwidth-bound, is
//! what a full context costs, is the model dense, is prefill the delay, is another device faster,
//! what each other host's link cost, and which setting mattered.

use super::view::{decimal_bytes, generation_tps, offload_devices, RooflineScope, RooflineView};
use profiles::Profile;
use search_space::size::format_size;
use search_space::Candidate;

mod backends;
mod context;
mod finding;
mod knobs;
mod links;
pub use backends::backend_placements;
#[cfg(test)]
pub use context::at_full_context;
use finding::{finding, measured, secs};
pub use finding::{Finding, PlacementPoint, Topic, NOTE};
pub use knobs::{knob_effects, KnobEffect};

/// Relative differences below this are within the default noise threshold of a run.
const NOISE: f64 = 0.02;

/// The best measured figures at each GPU-layer count, most layers first.
pub fn placements(profile: &Profile) -> Vec<PlacementPoint> {
    let mut counts: Vec<u32> = profile
        .leaderboard
        .iter()
        .map(|e| e.candidate.n_gpu_layers)
        .collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts.dedup();
    counts
        .into_iter()
        .map(|n| {
            let best = measured(profile)
                .filter(|(e, _)| e.candidate.n_gpu_layers == n)
                .min_by(|a, b| a.1.score_s.total_cmp(&b.1.score_s));
            match best {
                Some((_, f)) => PlacementPoint {
                    n_gpu_layers: n,
                    pp_tps: Some(f.pp_tps),
                    tg_tps: Some(f.tg_tps),
                    score_s: Some(f.score_s),
                    status: "ok".into(),
                    backend: None,
                },
                None => PlacementPoint {
                    n_gpu_layers: n,
                    pp_tps: None,
                    tg_tps: None,
                    score_s: None,
                    status: profile
                        .leaderboard
                        .iter()
                        .find(|e| e.candidate.n_gpu_layers == n)
                        .map(|e| e.status.clone())
                        .unwrap_or_default(),
                    backend: None,
                },
            }
        })
        .collect()
}

/// Every finding, in the order of [`Topic`].
pub fn findings(
    profile: &Profile,
    roofline: Option<&RooflineView>,
    knobs: &[KnobEffect],
    placements: &[PlacementPoint],
) -> Vec<Finding> {
    let mut v = vec![
        fit(profile, placements),
        quality(profile),
        bandwidth(roofline),
    ];
    v.extend(context::context(profile, roofline));
    v.extend([model(profile, roofline), prefill(profile), devices(profile)]);
    v.extend(backends::backends(profile));
    v.extend(links::links(profile));
    v.push(settings(knobs));
    v
}

/// The winner's K/V caches against the quality gate: lossless, within the gate with its figures,
/// or not checked; and each faster pair the gate refused.
fn quality(profile: &Profile) -> Finding {
    let w = &profile.winner;
    let Some(q) = &profile.quality else {
        let text = if w.kv_lossy() {
            format!(
                "kv={}: quality not recorded (a profile written before the quality gate)",
                w.kv_label()
            )
        } else {
            format!("kv={}: lossless", w.kv_label())
        };
        return finding(Topic::Quality, text);
    };
    let mut lines = crate::report::quality::lines(q, w, &profile.leaderboard).into_iter();
    Finding {
        topic: Topic::Quality,
        text: lines.next().unwrap_or_default(),
        details: lines.collect(),
    }
}

/// The fit finding of a run with no layers on another device: the share of RAM the winner takes.
fn cpu_only_fit(profile: &Profile, devs: &[String], failed: &str) -> String {
    let mem = profile.figures.mem_bytes;
    let ram = profile.machine.ram_bytes;
    let on = if devs.is_empty() {
        "CPU only".to_string()
    } else {
        format!("CPU only (no layers on {} measured)", devs.join(", "))
    };
    if mem > 0 && ram > 0 {
        format!(
            "yes: {on}; the winner takes {} of {} RAM ({:.0}%){failed}",
            format_size(mem),
            format_size(ram),
            100.0 * mem as f64 / ram as f64
        )
    } else {
        format!(
            "yes: {on}; the model file is {}{failed}",
            format_size(profile.model.size_bytes)
        )
    }
}

fn fit(profile: &Profile, placements: &[PlacementPoint]) -> Finding {
    let devs = offload_devices(profile);
    let failed = did_not_fit(profile);
    let ok: Vec<&PlacementPoint> = placements.iter().filter(|p| p.tg_tps.is_some()).collect();
    if devs.is_empty() || ok.iter().all(|p| p.n_gpu_layers == 0) {
        return finding(Topic::Fit, cpu_only_fit(profile, &devs, &failed));
    }
    let max_ok = ok.iter().map(|p| p.n_gpu_layers).max().unwrap_or(0);
    // The most layers were measured only with the KV cache in host memory (the -nkvo lever).
    let at_max: Vec<_> = measured(profile)
        .filter(|(e, _)| e.candidate.n_gpu_layers == max_ok)
        .collect();
    let kv_on_host =
        !at_max.is_empty() && at_max.iter().all(|(e, _)| !e.candidate.kv_offload.is_on());
    let given = profile.budgets.given();
    let under = if given.is_empty() {
        String::new()
    } else {
        format!(" under --mem-budget {}", given.join(" "))
    };
    let devs = if kv_on_host {
        format!(
            "{}{under} with the KV cache in host memory (-nkvo)",
            devs.join(", ")
        )
    } else {
        format!("{}{under}", devs.join(", "))
    };
    let mut text = layers_that_fit(profile, max_ok, &devs);
    text.push_str(&winner_layers(profile, max_ok, kv_on_host));
    if let (Some(top), Some(bottom)) = (ok.first(), ok.last()) {
        if ok.len() > 1 {
            let (a, b) = (top.tg_tps.unwrap_or(0.0), bottom.tg_tps.unwrap_or(0.0));
            text.push_str(&format!(
                "; tg {a:.1} t/s at ngl={} vs {b:.1} at ngl={} ({:+.0}%)",
                top.n_gpu_layers,
                bottom.n_gpu_layers,
                (b / a.max(1e-12) - 1.0) * 100.0
            ));
        }
    }
    text.push_str(&failed);
    let details = (ffn_against_layers(profile).into_iter())
        .chain(placements.iter().map(placement_detail))
        .collect();
    Finding {
        topic: Topic::Fit,
        text,
        details,
    }
}

/// Where a dense model's FFNs in host memory (`--n-cpu-ffn`, every layer's attention on the
/// devices) were measured against whole layers on the host (`-ngl`): the best of each, and how much
/// faster per request the first ran, at the workload's depth ("attention at depth 16384 on CUDA0:
/// --n-cpu-ffn 14 1.40x -ngl 41").
fn ffn_against_layers(profile: &Profile) -> Option<String> {
    let best = |ffn: bool| {
        measured(profile)
            .filter(|(e, _)| (e.candidate.n_cpu_ffn > 0) == ffn && e.candidate.n_cpu_moe == 0)
            .min_by(|a, b| a.1.score_s.total_cmp(&b.1.score_s))
    };
    let ((fe, ff), (le, lf)) = (best(true)?, best(false)?);
    let devs = offload_devices(profile).join(", ");
    let at = match profile.workload.depth {
        0 => format!("attention on {devs}"),
        d => format!("attention at depth {d} on {devs}"),
    };
    let won = if ff.score_s < lf.score_s {
        "the FFNs on the host won"
    } else {
        "whole layers on the host won"
    };
    Some(format!(
        "{at}: --n-cpu-ffn {} {:.2}x -ngl {} per request ({won})",
        fe.candidate.n_cpu_ffn,
        lf.score_s / ff.score_s,
        le.candidate.n_gpu_layers
    ))
}

/// "; N configurations did not fit": out of memory when loaded, or pruned by the placement's dry
/// run as over a budget; empty when all fitted.
fn did_not_fit(profile: &Profile) -> String {
    let failures = profile.leaderboard.iter().filter(|e| e.did_not_fit).count();
    match failures {
        0 => String::new(),
        1 => "; 1 configuration did not fit".to_string(),
        n => format!("; {n} configurations did not fit"),
    }
}

/// How many of the model's layers fit on `devs` (at most `max_ok` were measured there), and what
/// spills to the CPU when not all of them do.
fn layers_that_fit(profile: &Profile, max_ok: u32, devs: &str) -> String {
    let full = profile.roofline.as_ref().map(|r| r.layers + 1);
    let winner = profile.winner.n_gpu_layers;
    match full {
        Some(full) if max_ok >= full => format!("yes: all {full} layers fit on {devs}"),
        Some(full) => {
            let spill = profile
                .roofline
                .as_ref()
                .filter(|_| winner == max_ok)
                .map(|r| format!(" ({} of weights and KV per token read from RAM)", decimal_bytes(r.cpu_bytes)))
                .unwrap_or_default();
            format!("no: at most {max_ok} of {full} layers fit on {devs}; {} spill to the CPU{spill}", full - max_ok)
        }
        None => format!("at most {max_ok} layers were offloaded to {devs} (the model's layer count is not recorded in this profile)"),
    }
}

/// "; the winner runs ngl=N", and why it runs fewer than the most that fit.
fn winner_layers(profile: &Profile, max_ok: u32, kv_on_host: bool) -> String {
    let winner = profile.winner.n_gpu_layers;
    let mut text = format!("; the winner runs ngl={winner}");
    // With the KV cache kept on the device, fewer layers fit than with -nkvo: a winner at the most
    // of those did not measure faster with fewer layers, it chose the cache's place.
    let most_with_kv_on_device = measured(profile)
        .filter(|(e, _)| e.candidate.kv_offload.is_on())
        .map(|(e, _)| e.candidate.n_gpu_layers)
        .max();
    if kv_on_host && profile.winner.kv_offload.is_on() && most_with_kv_on_device == Some(winner) {
        text.push_str(" (the most with the KV cache on the device)");
    } else if winner < max_ok {
        text.push_str(" (fewer layers on the device measured faster)");
    }
    text
}

/// One placement's line under the fit finding: its speeds, or why it has none.
fn placement_detail(p: &PlacementPoint) -> String {
    match (p.tg_tps, p.pp_tps, p.score_s) {
        (Some(tg), Some(pp), Some(s)) => format!(
            "ngl={:<4} tg {tg:.1} t/s, pp {pp:.1} t/s, {s:.3} s/request",
            p.n_gpu_layers
        ),
        _ => format!("ngl={:<4} {}", p.n_gpu_layers, p.status),
    }
}

fn bandwidth(roofline: Option<&RooflineView>) -> Finding {
    let Some(r) = roofline else {
        return finding(
            Topic::Bandwidth,
            "unknown: this profile has no roofline record".into(),
        );
    };
    let (Some(p), Some(c)) = (r.percent_of_ceiling, r.ceiling_tps) else {
        let why = if r.bandwidth_bytes_per_s.is_none() {
            "the memory bandwidth was not measured".to_string()
        } else {
            format!(
                "the weights are on {}, whose bandwidth is not measured here",
                r.offload_devices.join(", ")
            )
        };
        return finding(Topic::Bandwidth, format!("unknown: {why}"));
    };
    let of = match r.scope {
        RooflineScope::CpuShare => "the CPU share's",
        _ => "the",
    };
    let figure = format!(
        "tg {:.1} t/s is {p:.0}% of {of} {c:.1} t/s memory roofline",
        r.measured_tps
    );
    let text = if p >= 70.0 {
        format!(
            "bound: {figure}; only fewer bytes per token (a smaller quantization, a quantized KV cache at depth) \
             decode faster"
        )
    } else if p >= 35.0 {
        format!("partly: {figure}; the rest is compute and per-token overhead")
    } else {
        format!("not bound: {figure}; compute and per-token overhead (threads, kernels, fixed costs per token) limit it")
    };
    finding(Topic::Bandwidth, text)
}

/// Parameters as people say them: `268M`, `4.02B`.
fn params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2}B", n as f64 / 1e9)
    } else {
        format!("{:.0}M", n as f64 / 1e6)
    }
}

fn model(profile: &Profile, roofline: Option<&RooflineView>) -> Finding {
    let Some(r) = profile.roofline.as_ref() else {
        return finding(
            Topic::Model,
            format!(
                "{} ({}); parameter counts are not recorded in this profile",
                profile.model.architecture,
                format_size(profile.model.size_bytes)
            ),
        );
    };
    if r.is_moe() {
        let (used, count) = (
            r.expert_used_count.unwrap_or(1),
            r.expert_count.unwrap_or(1),
        );
        return finding(
            Topic::Model,
            format!(
                "sparse: {used} of {count} experts per token, so a token reads {} of {} parameters ({:.0}%)",
                params(r.active_parameters),
                params(r.parameters),
                100.0 * r.active_parameters as f64 / r.parameters.max(1) as f64
            ),
        );
    }
    let bound = roofline.and_then(|v| v.percent_of_ceiling);
    let base = if r.active_parameters >= r.parameters {
        format!(
            "dense: every token reads all {} parameters",
            params(r.parameters)
        )
    } else {
        format!(
            "dense: every token reads {} of its {} parameters (all but other tokens' embedding rows)",
            params(r.active_parameters),
            params(r.parameters)
        )
    };
    let text = match bound {
        Some(p) if p >= 50.0 && r.parameters >= 2_000_000_000 => format!(
            "{base}; generation is bandwidth-bound ({p:.0}%), so a sparse (mixture-of-experts) model of similar size, \
             which reads only its active experts, would decode several times faster here"
        ),
        Some(p) if p < 35.0 => format!("{base}; a sparse model would not help much: generation is not bandwidth-bound ({p:.0}%)"),
        _ if r.parameters < 2_000_000_000 => format!("{base}; at this size a sparse model would save little"),
        _ => base,
    };
    finding(Topic::Model, text)
}

fn prefill(profile: &Profile) -> Finding {
    let f = &profile.figures;
    let w = &profile.workload;
    // With N requests at once their prompts are processed together, then their generations: each
    // waits for all N (the rates are aggregate).
    let np = w.n_parallel.max(1);
    // A request of a long chat processes its prompt after what the cache holds.
    let (pp, at) = match f.pp_depth_tps.filter(|_| w.depth > 0) {
        Some(pp) => (pp, format!(" at depth {}", w.depth)),
        None => (f.pp_tps, String::new()),
    };
    let first = f
        .ttft_ms
        .map(|ms| ms / 1000.0)
        .unwrap_or(np as f64 * w.n_prompt as f64 / pp.max(1e-12));
    let gen = np as f64 * w.n_gen as f64 / generation_tps(profile).max(1e-12);
    let share = 100.0 * first / (first + gen);
    let (prompts, rate, each) = if np > 1 {
        (
            format!(
                "the first tokens of {np} {}-token prompts together",
                w.n_prompt
            ),
            " of all",
            " each",
        )
    } else {
        (
            format!("the first token of a {}-token prompt", w.n_prompt),
            "",
            "",
        )
    };
    let figure = format!(
        "{} to {prompts} (pp {:.1} t/s{at}{rate}) vs {} to generate {} tokens{each}: {share:.0}% of the request",
        secs(first),
        pp,
        secs(gen),
        w.n_gen
    );
    let text = if share >= 50.0 {
        format!("the delay: {figure}; prompt speed (batch sizes, offload) matters most for this workload")
    } else {
        format!("not the delay: {figure}")
    };
    finding(Topic::Prefill, text)
}

/// Where a candidate's layers run.
fn placement_class(c: &Candidate, offload: &[String]) -> String {
    if c.n_gpu_layers == 0 || offload.is_empty() {
        "CPU".into()
    } else if !c.devices.is_empty() {
        c.devices.join("+")
    } else {
        offload.join("+")
    }
}

fn devices(profile: &Profile) -> Finding {
    let offload = offload_devices(profile);
    let mut best: Vec<(String, f64, f64)> = Vec::new();
    for (e, f) in measured(profile) {
        let class = placement_class(&e.candidate, &offload);
        match best.iter_mut().find(|b| b.0 == class) {
            Some(b) if f.score_s < b.1 => *b = (class, f.score_s, f.tg_tps),
            Some(_) => {}
            None => best.push((class, f.score_s, f.tg_tps)),
        }
    }
    best.sort_by(|a, b| a.1.total_cmp(&b.1));
    match best.as_slice() {
        [] => finding(Topic::Devices, "nothing was measured".into()),
        [(only, _, _)] => {
            let more = if offload.is_empty() || only != "CPU" {
                String::new()
            } else {
                format!(" ({} not used)", offload.join(", "))
            };
            finding(
                Topic::Devices,
                format!("one placement measured ({only}){more}; nothing to compare"),
            )
        }
        [(first, s, tg), rest @ ..] => {
            let others: Vec<String> = rest
                .iter()
                .map(|(c, s2, tg2)| {
                    format!(
                        "{c} {} (tg {tg2:.1}, {:+.0}%)",
                        secs(*s2),
                        (s2 / s - 1.0) * 100.0
                    )
                })
                .collect();
            finding(
                Topic::Devices,
                format!(
                    "{first} is fastest: {} per request (tg {tg:.1} t/s) vs {}",
                    secs(*s),
                    others.join(", ")
                ),
            )
        }
    }
}

fn settings(knobs: &[KnobEffect]) -> Finding {
    let Some(top) = knobs.first() else {
        return finding(Topic::Settings, "no knob was varied".into());
    };
    let line = |k: &KnobEffect| {
        let noise = if k.slower < NOISE {
            ", within noise"
        } else {
            ""
        };
        let around = match (&k.winner_value, k.around_winner) {
            (Some(v), _) => {
                format!("; the winner has {v}: a tie, broken toward less memory or fewer changes")
            }
            (None, true) => String::new(),
            (None, false) => "; measured around an earlier best".to_string(),
        };
        format!(
            "{}: {} {} vs {} {} per request ({:+.0}%{noise}){around}",
            k.knob,
            k.best,
            secs(k.best_s),
            k.worst,
            secs(k.worst_s),
            k.slower * 100.0
        )
    };
    let text = if top.slower < NOISE {
        "no knob made a difference beyond noise".to_string()
    } else {
        format!("{} mattered most", top.knob)
    };
    // Each knob's line, and under a knob's first line what the knob does: a reader who does not
    // know `ub` or `-nkvo` learns why it could matter.
    let mut details = Vec::new();
    let mut told: Vec<&str> = Vec::new();
    for k in knobs {
        details.push(line(k));
        if !told.contains(&k.what) {
            told.push(k.what);
            details.push(format!("{NOTE}{}", k.what));
        }
    }
    Finding {
        topic: Topic::Settings,
        text,
        details,
    }
}
