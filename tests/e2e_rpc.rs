//! End to end: two loopback `autotune rpc-serve` devices stand in for two GPUs. A tune offloads every
//! layer to them, the profile keeps both servers, and `apply --exec --check-only`
//! starts the vendor llama-server with `--rpc` and gets a completion from it.

mod common;
use common::*;
use std::path::Path;

/// Tunes the demo model with every layer on the RPC servers `rpc` into the profile file `out`.
fn tune_offloaded(sb: &Sandbox, out: &Path, rpc: &str, budget: &str) {
    let model = demo_model();
    let mut args = vec![
        "-q",
        "tune",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--rpc",
        rpc,
        "--n-gpu-layers",
        "19",
        "--kernels",
        "plain",
        "--threads",
        "2",
        "--cache-types",
        "f16",
        "--flash-attn",
        "auto",
        "--ubatch",
        "128",
        "--budget",
        budget,
    ];
    args.extend_from_slice(SHORT_WORKLOAD);
    let o = sb.run(&args);
    assert!(o.status.success(), "tune: {}\n{}", stderr(&o), stdout(&o));
}

#[test]
fn a_profile_offloading_to_two_rpc_devices_applies_with_both_servers() {
    let base = 50240 + (std::process::id() % 40) as u16 * 2;
    let (p0, p1) = (base, base + 1);
    let _servers = (rpc_server(p0), rpc_server(p1));
    let rpc = format!("127.0.0.1:{p0},127.0.0.1:{p1}");
    let sb = Sandbox::new();
    let profile = sb.dir.path().join("rpc.toml");
    tune_offloaded(&sb, &profile, &rpc, "90s");
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(
        text.contains(&format!("127.0.0.1:{p0}")) && text.contains(&format!("127.0.0.1:{p1}")),
        "the profile keeps both RPC servers: {text}"
    );

    let server = llama_server();
    let o = sb.run(&[
        "apply",
        profile.to_str().unwrap(),
        "--exec",
        "--check-only",
        "--json",
        "--server",
        server.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "apply: {}\n{}", stderr(&o), stdout(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let command: Vec<&str> = v["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = command
        .iter()
        .position(|a| *a == "--rpc")
        .unwrap_or_else(|| panic!("--rpc in {command:?}"));
    assert_eq!(command[at + 1], rpc, "{command:?}");
    assert!(v["completion"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn apply_names_the_rpc_server_that_is_down() {
    let base = 50330 + (std::process::id() % 40) as u16 * 2;
    let sb = Sandbox::new();
    let profile = sb.dir.path().join("rpc.toml");
    let rpc = format!("127.0.0.1:{base}");
    {
        let _server = rpc_server(base);
        tune_offloaded(&sb, &profile, &rpc, "40s");
    }
    // The server is gone: apply fails in one line naming it, with the documented exit code.
    let o = sb.run(&["apply", profile.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(&rpc), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
