//! Shared by the speculative-decoding end-to-end tests (e2e_draft, e2e_ngram, e2e_draft_serving,
//! e2e_mtp): the Q4_0 draft and the n-gram profile made once per test binary, `autotune draft
//! --json`, and `apply --exec --check-only` with the server's own speculation figures.
#![allow(dead_code)]

use crate::common::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// SHORT_WORKLOAD at no depth with a larger context: room for `apply --check-only`'s prompt and 64
/// tokens.
pub const SHORT_WORKLOAD_AT_512: &[&str] = &[
    "--depth",
    "0",
    "--ctx",
    "512",
    "--prompt",
    "32",
    "--gen",
    "8",
    "--min-reps",
    "2",
    "--max-reps",
    "3",
    "--seed",
    "7",
];

/// The knobs of a tune these tests hold to one configuration, one thread (on a busy machine two
/// spinning threads wait for each other far longer than one computes) and a 30 s budget: the tuning
/// itself is not what they are about.
pub const ONE_THREAD_KNOBS: &[&str] = &[
    "--threads",
    "1",
    "--cache-types",
    "f16",
    "--flash-attn",
    "auto",
    "--ubatch",
    "512",
    "--budget",
    "30s",
];

/// `autotune draft --json` arguments for `target` with the draft model `draft` (no n-gram lookup):
/// one thread (on a busy machine two spinning threads wait for each other far longer than one
/// computes), at most 4 drafted tokens with no minimum, two repetitions, seed 3; `ctx`, `p_min`
/// (comma-separated values) and `gen` as given, and `more` before the seed.
pub fn draft_model_args<'a>(
    target: &'a Path,
    draft: &'a Path,
    [ctx, p_min, gen]: [&'a str; 3],
    more: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "draft",
        target.to_str().unwrap(),
        "--draft",
        draft.to_str().unwrap(),
        "--json",
        "--no-ngram",
        "-t",
        "1",
        "--ctx",
        ctx,
        "--draft-max",
        "4",
        "--draft-p-min",
        p_min,
        "--draft-min",
        "0",
        "--draft-gen",
        gen,
        "--draft-reps",
        "2",
    ];
    args.extend_from_slice(more);
    args.extend_from_slice(&["--seed", "3"]);
    args
}

/// The demo model quantized to Q4_0: a real draft with the same vocabulary. Made once per test
/// binary (quantizing takes a while on 2 cores) in a folder that lives as long as the process.
pub fn q4_0_draft(sb: &Sandbox) -> PathBuf {
    static DRAFT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = DRAFT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let model = demo_model();
        let o = sb.run(&[
            "quantize",
            model.to_str().unwrap(),
            "--types",
            "q4_0",
            "--allow-requantize",
            "--out-dir",
            dir.path().to_str().unwrap(),
            "--json",
        ]);
        assert!(
            o.status.success(),
            "quantize failed: {}\n{}",
            stderr(&o),
            stdout(&o)
        );
        let report: serde_json::Value =
            serde_json::from_str(&stdout(&o)).expect("quantize --json prints JSON");
        let path = PathBuf::from(
            report["files"][0]["path"]
                .as_str()
                .expect("a file was made"),
        );
        (dir, path)
    });
    path.clone()
}

pub fn draft_report(sb: &Sandbox, args: &[&str]) -> serde_json::Value {
    draft_report_with(sb, args, None)
}

/// `autotune draft --json`, with the draft loop's test fault when given.
pub fn draft_report_with(sb: &Sandbox, args: &[&str], fault: Option<&str>) -> serde_json::Value {
    let mut cmd = sb.cmd();
    match fault {
        Some(f) => cmd.env("AUTOTUNE_SPECULATIVE_FAULT", f),
        None => cmd.env_remove("AUTOTUNE_SPECULATIVE_FAULT"),
    };
    let o = cmd.args(args).output().expect("run autotune");
    assert!(
        o.status.success(),
        "autotune draft failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    serde_json::from_str(&stdout(&o)).expect("--json prints JSON")
}

/// The measured draft trials of the first draft, with the run's figures on stderr (acceptance, near
/// ties, how far rounding moved the gaps between logits).
pub fn measured_trials(r: &serde_json::Value) -> Vec<serde_json::Value> {
    let d = &r["drafts"][0];
    assert_eq!(d["status"], "measured", "{d:#}");
    let measured: Vec<serde_json::Value> = d["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["failure"].is_null() && t["skipped"].is_null())
        .cloned()
        .collect();
    for t in &measured {
        eprintln!(
            "{} {}: acceptance {:.2}, same_output {}, near ties {}, max margin shift {:.3}, divergence {}",
            t["stage"],
            t["params"],
            t["acceptance"].as_f64().unwrap_or(0.0),
            t["same_output"],
            t["near_ties"].as_array().map_or(0, Vec::len),
            t["max_margin_shift"].as_f64().unwrap_or(0.0),
            t["divergence"]
        );
    }
    measured
}

/// Repeated text only (the days of the week): where n-gram lookup drafts, and the cheapest prompt set
/// for a draft search.
pub fn days_prompts(sb: &Sandbox) -> PathBuf {
    let prompts = sb.dir.path().join("days.toml");
    std::fs::write(
        &prompts,
        "[[prompt]]\nname = \"days\"\nkind = \"repetitive\"\ntext = \"Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday,\"\n",
    )
    .unwrap();
    prompts
}

/// A profile of the demo model tuned for the agent workload on text that repeats: the user's path to
/// n-gram speculation (`tune --workload agent` measures it after tuning and keeps it when it pays).
/// Tuned once per test binary, in a folder that lives as long as the process.
pub fn ngram_profile() -> PathBuf {
    static PROFILE: OnceLock<(Sandbox, PathBuf)> = OnceLock::new();
    let (_, path) = PROFILE.get_or_init(|| {
        let sb = Sandbox::new();
        let demo = demo_model();
        let out = sb.dir.path().join("agent.toml");
        let prompts = days_prompts(&sb);
        let mut args = vec![
            "tune",
            demo.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--no-save",
            "--workload",
            "agent",
        ];
        args.extend_from_slice(SHORT_WORKLOAD_AT_512);
        args.extend_from_slice(ONE_THREAD_KNOBS);
        args.extend_from_slice(&[
            "--draft-prompts",
            prompts.to_str().unwrap(),
            "--ngram-n",
            "2",
            "--ngram-m",
            "8",
            "--draft-gen",
            "32",
            "--draft-reps",
            "2",
        ]);
        let o = sb.run(&args);
        assert!(
            o.status.success(),
            "autotune tune failed: {}\n{}",
            stderr(&o),
            stdout(&o)
        );
        (sb, out)
    });
    path.clone()
}

/// `autotune apply PROFILE --exec --check-only --json` with the vendor llama-server (or `server`).
pub fn apply_check(sb: &Sandbox, profile: &Path, server: Option<&Path>) -> std::process::Output {
    let server = server.map_or_else(llama_server, Path::to_path_buf);
    sb.run(&strs(&apply_check_args(profile, &server)))
}

/// [`apply_check`] with the vendor llama-server, which must succeed: its output and its `--json`
/// report.
pub fn apply_checked_json(
    sb: &Sandbox,
    profile: &Path,
) -> (std::process::Output, serde_json::Value) {
    let o = apply_check(sb, profile, None);
    assert!(
        o.status.success(),
        "apply --exec failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    (o, v)
}

/// The server's own figures from `apply --json`, checked for consistency with its `completion`
/// timings; (drafted, accepted).
pub fn servers_speculation(v: &serde_json::Value, spec_type: &str) -> (u64, u64) {
    let c = &v["completion"];
    let s = &v["speculation"];
    assert_eq!(s["spec_type"], spec_type, "{v:#}");
    let (drafted, accepted) = (
        c["draft_n"].as_u64().expect("draft_n in the timings"),
        c["draft_n_accepted"].as_u64().expect("draft_n_accepted"),
    );
    assert_eq!(s["drafted"], drafted, "{v:#}");
    assert_eq!(s["accepted"], accepted, "{v:#}");
    assert!(accepted <= drafted, "{v:#}");
    assert!(c["predicted_n"].as_u64().unwrap() >= 32, "{v:#}");
    if drafted > 0 {
        let a = s["acceptance"].as_f64().unwrap();
        assert!((a - accepted as f64 / drafted as f64).abs() < 1e-9, "{v:#}");
    }
    eprintln!(
        "{spec_type}: the server drafted {drafted} tokens and accepted {accepted} on the {} prompt \
         ({} t/s); the profile measured {:.0}% acceptance",
        s["prompt"],
        c["predicted_per_second"],
        s["profile_acceptance"].as_f64().unwrap() * 100.0
    );
    (drafted, accepted)
}

/// `apply --exec --check-only` (text) of `profile` prints one speculation line for `spec_type`
/// with the server's drafted and accepted tokens.
pub fn text_report_says(sb: &Sandbox, profile: &Path, spec_type: &str) {
    let o = sb.run(&[
        "apply",
        profile.to_str().unwrap(),
        "--exec",
        "--check-only",
        "--server",
        llama_server().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("speculation {spec_type} on the ")))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("drafted tokens accepted"), "{line}");
    eprintln!("{line}");
}

/// Whether a figure `apply --json` printed is the profile's `expected`. serde_json's default float
/// parser may land one unit in the last place off the printed value (exact parsing is its
/// `float_roundtrip` feature), so equal means equal to 12 significant digits.
pub fn same_figure(printed: &serde_json::Value, expected: f64) -> bool {
    printed
        .as_f64()
        .is_some_and(|x| (x - expected).abs() <= 1e-12 * expected.abs().max(1.0))
}

/// The median of a JSON array of numbers (the upper middle one of an even count).
pub fn median(xs: &serde_json::Value) -> f64 {
    let mut v: Vec<f64> = xs
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
