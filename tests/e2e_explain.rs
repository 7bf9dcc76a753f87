//! End-to-end: a short real tuning run of the demo model, then `autotune explain` on its profile: the
//! roofline and the diagnosis are printed, `--plot` writes SVG charts, `--export-markdown` a report,
//! a profile written before the roofline existed is explained from its model file, and a llama gets
//! the full-context line (the demo model, with sliding-window layers, does not).

mod common;
use common::*;

/// One configuration only (llama.cpp's defaults with 2 threads): the quickest run that saves a profile.
const ONE_CANDIDATE: &[&str] = &[
    "--ctx",
    "256",
    "--prompt",
    "32",
    "--gen",
    "8",
    "--min-reps",
    "2",
    "--max-reps",
    "2",
    "--seed",
    "7",
    "--threads",
    "2",
    "--cache-types",
    "f16",
    "--flash-attn",
    "auto",
    "--kernels",
    "repack",
    "--ubatch",
    "512",
    "--budget",
    "60s",
];

const TOPICS: [&str; 7] = [
    "fit",
    "quality",
    "bandwidth",
    "model",
    "prefill",
    "devices",
    "settings",
];

fn assert_explains(text: &str) {
    assert!(
        text.contains("roofline (what one generated token reads)"),
        "{text}"
    );
    assert!(text.contains("diagnosis (most impact first)"), "{text}");
    assert!(text.contains("GB/s"), "the bandwidth was measured: {text}");
    for topic in TOPICS {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(topic)),
            "no `{topic}` line: {text}"
        );
    }
}

fn svg_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "svg"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn explains_a_tuned_profile_with_charts_and_a_report() {
    let sb = Sandbox::new();
    let model = demo_model();
    let profile = sb.dir.path().join("p.toml");
    let mut args = vec![
        model.to_str().unwrap(),
        "-q",
        "--out",
        profile.to_str().unwrap(),
    ];
    args.extend_from_slice(ONE_CANDIDATE);
    let o = sb.run(&args);
    assert!(o.status.success(), "tune failed: {}", stderr(&o));
    // The tuning run shows the explanation after its table, and records the roofline in the profile.
    assert_explains(&stdout(&o));
    let toml = std::fs::read_to_string(&profile).unwrap();
    assert!(
        toml.contains("[roofline]") && toml.contains("cpu_bandwidth"),
        "{toml}"
    );

    let plots = sb.dir.path().join("charts");
    let report = sb.dir.path().join("report.md");
    let o = sb.run(&[
        "explain",
        profile.to_str().unwrap(),
        "--plot",
        plots.to_str().unwrap(),
        "--export-markdown",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "explain failed: {}", stderr(&o));
    let out = stdout(&o);
    assert_explains(&out);
    assert!(out.contains("fit         yes: CPU only"), "{out}");
    let svgs = svg_files(&plots);
    assert!(!svgs.is_empty(), "no SVG in {}: {out}", plots.display());
    for svg in &svgs {
        let text = std::fs::read_to_string(svg).unwrap();
        assert!(
            text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
            "{}",
            svg.display()
        );
        assert!(
            out.contains(&svg.display().to_string()),
            "the chart's path is printed: {out}"
        );
    }
    let md = std::fs::read_to_string(&report).unwrap();
    for section in [
        "## Diagnosis",
        "## Roofline",
        "## Leaderboard",
        "## Charts",
        "-leaderboard.svg)",
    ] {
        assert!(md.contains(section), "no `{section}` in the report: {md}");
    }

    // JSON: the same explanation as one value.
    let o = sb.run(&["explain", profile.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(v["findings"].as_array().unwrap().len(), TOPICS.len());
    // Gemma 3's sliding-window layers read at most their window: no full-context line, and the
    // roofline record says its KV reads are not known to grow with the context.
    assert!(v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["topic"] != "context"));
    assert!(!toml.contains("kv_grows"), "{toml}");
    assert!(
        v["roofline"]["percent_of_ceiling"].as_f64().unwrap() > 0.0,
        "{v}"
    );

    // A profile from before the roofline was recorded: computed again from its model file.
    let old: String = toml.split("\n[roofline]").next().unwrap().to_string()
        + &toml
            .split("\n[roofline]")
            .nth(1)
            .unwrap()
            .split_once("\n[")
            .map(|(_, rest)| format!("\n[{rest}"))
            .unwrap_or_default();
    assert!(!old.contains("[roofline]"));
    let old_path = sb.dir.path().join("old.toml");
    std::fs::write(&old_path, old).unwrap();
    let o = sb.run(&["explain", old_path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_explains(&stdout(&o));
    assert!(stderr(&o).contains("no roofline record"), "{}", stderr(&o));

    // The model file finds this machine's stored profile.
    let o = sb.run(&["explain", model.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_explains(&stdout(&o));
}

#[test]
fn explaining_a_missing_profile_says_what_to_do() {
    let sb = Sandbox::new();
    let o = sb.run(&["explain", "/nonexistent/p.toml"]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let o = sb.run(&["explain", demo_model().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no profile for this model on this machine"),
        "{}",
        stderr(&o)
    );
}

/// A llama (every layer attends to the whole cache): the explanation says what a full context
/// costs, as a bound from the profile's roofline record.
#[test]
fn a_model_whose_kv_reads_grow_gets_the_full_context_line() {
    let sb = Sandbox::new();
    let model = tiny_model();
    let m = model.to_str().unwrap();
    let mut args = vec!["tune", m];
    args.extend(ONE_CANDIDATE);
    let o = sb.run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let profile = &sb.stored_profiles()[0];
    assert!(std::fs::read_to_string(profile)
        .unwrap()
        .contains("kv_grows = true"));
    let v = sb.run_json(&["explain", profile.to_str().unwrap(), "--json"]);
    let findings = v["findings"].as_array().unwrap();
    let context = findings
        .iter()
        .find(|f| f["topic"] == "context")
        .unwrap_or_else(|| panic!("{findings:?}"));
    let text = context["text"].as_str().unwrap();
    assert!(text.starts_with("a full 256-token context adds"), "{text}");
    assert!(text.contains("at least that much slower"), "{text}");
}
