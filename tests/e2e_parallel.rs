//! `--parallel N`: N requests measured at once on the real demo model, the profile carrying `-np N`,
//! and a real llama-server checked with N completions sent together.

mod common;
use common::*;

/// `measure -np N`: N prompts, then a token of each of N sequences per step, rates of all of them
/// together. Batching shares each weight read among the sequences, so 4 at once generate more
/// tokens a second than 1 — and no more than 4 times as many.
#[test]
fn several_sequences_are_measured_together() {
    let sb = Sandbox::new();
    let model = demo_model();
    let measure = |np: &str| {
        sb.run_json(&[
            "measure",
            model.to_str().unwrap(),
            "-c",
            "1024",
            "-p",
            "64",
            "-n",
            "32",
            "-np",
            np,
            "--reps",
            "3",
            "--json",
        ])
    };
    let (one, four) = (measure("1"), measure("4"));
    assert_eq!(four["workload"]["n_parallel"], 4, "{four}");
    assert!(one["workload"]["n_parallel"].is_null(), "{one}");
    let median = |v: &serde_json::Value, k: &str| v[k]["median"].as_f64().unwrap();
    let (tg1, tg4) = (median(&one, "tg"), median(&four, "tg"));
    assert!(
        tg4 > 1.1 * tg1 && tg4 < 4.4 * tg1,
        "tg {tg4} t/s of 4 sequences together vs {tg1} of one"
    );
}

/// `tune --parallel 2`: the workload and `-np 2` reach the profile, and `apply --exec` sends two
/// completions at once to a real llama-server started with it, adding their figures up.
#[test]
fn a_profile_for_two_requests_at_once_is_applied_with_two_slots() {
    let sb = Sandbox::new();
    let model = demo_model();
    let out = sb.dir.path().join("np2.toml");
    let o = sb.run(&[
        model.to_str().unwrap(),
        "--quick",
        "--parallel",
        "2",
        "-c",
        "1024",
        "-p",
        "64",
        "-n",
        "16",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("· 2 requests at once (t/s of all together)"),
        "{}",
        stdout(&o)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("n_parallel = 2"), "{text}");
    assert!(text.contains(r#""-c", "1024", "-np", "2""#), "{text}");

    let server = llama_server();
    let v = sb.run_json(&strs(&apply_check_args(&out, &server)));
    assert_eq!(v["requests"], 2, "{v}");
    let command = command_of(&v);
    assert!(command.windows(2).any(|w| w == ["-np", "2"]), "{command:?}");
    // Two completions of 16 tokens each, added up.
    assert_eq!(v["completion"]["predicted_n"], 32, "{v}");
}

/// `fit --parallel N`: llama.cpp's fit asked for N sequences, and its flags carry `-np N`.
#[test]
fn llama_cpps_fit_is_asked_for_n_sequences() {
    let sb = Sandbox::new();
    let model = demo_model();
    let v = sb.run_json(&[
        "fit",
        model.to_str().unwrap(),
        "-c",
        "8192",
        "--parallel",
        "4",
        "--json",
    ]);
    assert_eq!(v["status"], "success", "{v}");
    let args: Vec<&str> = v["server_args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[..4], ["-c", "8192", "-np", "4"], "{v}");
}

/// A workload whose text repeats gets n-gram speculation measured after the tune, for several
/// requests at once too (each slot drafts from its own text): the profile's notes give its outcome.
#[test]
fn ngram_speculation_is_measured_for_several_requests_at_once() {
    let sb = Sandbox::new();
    let model = tiny_model();
    let v = sb.run_json(&[
        model.to_str().unwrap(),
        "--quick",
        "--workload",
        "agent",
        "--parallel",
        "2",
        "-c",
        "8192",
        "--no-save",
        "--json",
    ]);
    let notes = v["notes"].to_string();
    assert!(notes.contains("ngram-simple"), "{notes}");
    assert!(!notes.contains("not tried"), "{notes}");
    assert_eq!(v["workload"]["n_parallel"], 2, "{v}");
    // The agent workload's requests come after 2048 tokens of conversation: each slot's prompt is
    // processed, and its tokens generated, after that depth in its cache, and the score is theirs.
    assert_eq!(v["workload"]["depth"], 2048, "{v}");
    let f = &v["winner_figures"];
    let (pp_d, tg_d) = (
        f["pp_depth_tps"].as_f64().unwrap(),
        f["tg_depth_tps"].as_f64().unwrap(),
    );
    assert!(pp_d > 0.0 && tg_d > 0.0, "{f}");
    assert!(
        v["leaderboard"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["status"] == "ok" || e["status"] == "tie")
            .all(|e| e["figures"]["pp_depth_tps"].as_f64().is_some()),
        "{v}"
    );
}
