//! End to end: the real binary tunes the real demo model through linked llama.cpp and writes a
//! profile that parses, validates and carries well-formed llama-server arguments.

mod common;
use common::*;

#[test]
fn tunes_the_demo_model_and_saves_a_valid_profile() {
    let model = demo_model();
    let sb = Sandbox::new();
    let out_file = sb.dir.path().join("profile.toml");
    let mut args = vec!["tune", model.to_str().unwrap(), "--out", out_file.to_str().unwrap(), "--json"];
    args.extend_from_slice(SHORT);
    let o = sb.run(&args);
    assert!(o.status.success(), "autotune failed: {}\n{}", stderr(&o), stdout(&o));

    // The JSON report parses and has a measured winner with real figures.
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let winner = &report["winner_figures"];
    assert!(winner["pp_tps"].as_f64().unwrap() > 1.0, "{winner}");
    assert!(winner["tg_tps"].as_f64().unwrap() > 1.0, "{winner}");
    assert!(report["leaderboard"].as_array().unwrap().len() >= 2, "more than one candidate measured");
    assert!(report["baseline_figures"]["tg_tps"].as_f64().is_some(), "llama.cpp's defaults measured in the same run");

    // The profile: in the store and at --out, identical, parseable, valid.
    let stored = sb.stored_profiles();
    assert_eq!(stored.len(), 1, "one profile in the store");
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert_eq!(text, std::fs::read_to_string(&stored[0]).unwrap());
    let (profile, unknown) = profiles::Profile::from_toml(&text).expect("profile parses");
    assert!(unknown.is_empty(), "{unknown:?}");
    assert_eq!(profile.schema_version, profiles::SCHEMA_VERSION);
    profile.validate(true).expect("profile validates, model path exists");

    // The server arguments are well formed: llama-server flags with values, the model first.
    let a = &profile.server_args;
    assert_eq!(a[0], "-m");
    assert_eq!(std::path::Path::new(&a[1]), model.canonicalize().unwrap());
    let pos = |flag: &str| a.iter().position(|x| x == flag).unwrap_or_else(|| panic!("{flag} missing in {a:?}"));
    assert_eq!(a[pos("-c") + 1], "256");
    assert_eq!(a[pos("-t") + 1], profile.winner.threads.to_string());
    for flag in ["-b", "-ub", "-ctk", "-ctv", "-fa", "-ngl"] {
        let v = &a[pos(flag) + 1];
        assert!(!v.starts_with('-'), "{flag} has a value: {a:?}");
    }
    assert_eq!(profile.server_args, profiles::server_args(&profile.winner, &profile.model.path, &profile.workload));

    // `show` finds it for this model on this machine.
    let o = sb.run(&["show", model.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("schema_version = 1"));
}

#[test]
fn doctor_reports_llama_cpp_devices_and_system_info() {
    let sb = Sandbox::new();
    let o = sb.run(&["doctor", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let devices = v["machine"]["devices"].as_array().unwrap();
    assert!(devices.iter().any(|d| d["kind"] == "cpu"), "{devices:?}");
    assert!(v["system_info"].as_str().unwrap().contains("CPU :"));
    assert!(v["backends"].as_array().unwrap().iter().any(|b| b == "CPU"));
}
