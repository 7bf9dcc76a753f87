//! Reliability on the real binary (the fast cases; scripts/reliability runs the full set): a crashing
//! trial is recorded and tuning carries on, a corrupt store entry is set aside, a corrupt profile file
//! is one clear line with exit 5.

mod common;
use common::*;

#[test]
fn a_worker_that_aborts_is_recorded_and_tuning_continues() {
    let model = demo_model();
    let sb = Sandbox::new();
    let counter = sb.dir.path().join("fault-count");
    // Two candidates: llama.cpp's defaults, whose first measure request aborts, then plain kernels.
    let mut args = vec!["tune", model.to_str().unwrap(), "--json"];
    args.extend_from_slice(&[
        "--ctx",
        "256",
        "--prompt",
        "32",
        "--gen",
        "8",
        "--budget",
        "60s",
        "--min-reps",
        "2",
        "--max-reps",
        "2",
        "--threads",
        "1",
        "--cache-types",
        "f16",
        "--flash-attn",
        "auto",
        "--ubatch",
        "512",
        "--kernels",
        "repack,plain",
        "--seed",
        "7",
    ]);
    let o = sb
        .cmd()
        .args(&args)
        .env("AUTOTUNE_FAULT", "abort@1")
        .env("AUTOTUNE_FAULT_COUNTER", &counter)
        .output()
        .expect("run autotune");
    let err = stderr(&o);
    assert!(o.status.success(), "exit {:?}: {err}", o.status.code());
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("SIGABRT"), "the crash is reported: {err}");
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    assert!(report["failed"].as_u64().unwrap() >= 1, "{report}");
    let board = report["leaderboard"].as_array().unwrap();
    assert!(
        board
            .iter()
            .any(|e| e["status"].as_str().unwrap_or("").contains("SIGABRT")),
        "the failure is that candidate's status: {board:?}"
    );
    assert!(
        report["winner_figures"]["tg_tps"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert_eq!(sb.stored_profiles().len(), 1, "a profile is saved");
}

#[test]
fn a_corrupt_store_entry_is_set_aside_and_reported() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.profiles()).unwrap();
    let bad = sb
        .profiles()
        .join("broken--000000000000--000000000000.toml");
    std::fs::write(&bad, "schema_version = 1\nthis is [not toml\n").unwrap();
    let o = sb.run(&["show"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("moved aside") && err.contains("broken--"),
        "{err}"
    );
    assert!(!bad.exists(), "set aside");
    let aside: Vec<_> = std::fs::read_dir(sb.profiles())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".toml.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1);
    // Listed once: the next `show` is quiet.
    let o = sb.run(&["show"]);
    assert!(stderr(&o).trim().is_empty(), "{}", stderr(&o));
}

#[test]
fn a_corrupt_profile_file_is_one_line_and_exit_5() {
    let sb = Sandbox::new();
    let f = sb.dir.path().join("bad.toml");
    std::fs::write(&f, "schema_version = 1\nthis is [not toml\n").unwrap();
    let o = sb.run(&["show", f.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("bad.toml") && !err.contains("panicked"),
        "{err}"
    );
}
