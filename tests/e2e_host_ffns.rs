//! End to end: a loopback `autotune rpc-serve` device stands in for a GPU too small for the demo
//! model. Every layer's attention fits it with the FFNs of some layers kept in host memory
//! (llama.cpp's `--n-cpu-ffn`): the search measures those placements beside whole layers on the
//! host (`-ngl`), a pinned one reaches the profile, and `apply --exec --check-only` runs
//! llama-server with it.

mod common;
use common::*;
use serde_json::Value;

/// Bytes of RPC0's budget: what every layer with its FFN on the device needs, less a margin that
/// two layers' FFNs (of 18, about two thirds of a layer each) free.
fn budget_below_every_layer(sb: &Sandbox, rpc: &str) -> u64 {
    let (_, all_layers) = fit_on_rpc0(sb, &demo_model(), rpc, "256");
    all_layers - all_layers / 12
}

fn tune_args(model: &str, rpc: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        model,
        "--rpc",
        rpc,
        "--threads",
        "2",
        "--kernels",
        "plain",
        "--cache-types",
        "f16",
        "--flash-attn",
        "auto",
        "--ubatch",
        "512",
        "--kv-offload",
        "on",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(SHORT_WORKLOAD.iter().map(|s| s.to_string()));
    v
}

fn host_ffns(c: &Value) -> u64 {
    c["n_cpu_ffn"].as_u64().unwrap_or(0)
}

#[test]
fn host_ffns_are_measured_beside_whole_layers_when_every_layer_does_not_fit() {
    let server = rpc_server();
    let rpc = server.endpoint();
    let sb = Sandbox::new();
    let model = demo_model();
    let budget = format!("RPC0={}", budget_below_every_layer(&sb, &rpc));
    let args = tune_args(
        model.to_str().unwrap(),
        &rpc,
        &["--mem-budget", &budget, "--budget", "150s"],
    );
    let out = sb.run_json(&strs(&args));
    let board = out["leaderboard"].as_array().unwrap();
    let best = |ffn: bool| {
        (board.iter())
            .filter(|e| e["figures"].is_object() && (host_ffns(&e["candidate"]) > 0) == ffn)
            .map(|e| (e["figures"]["score_s"].as_f64().unwrap(), &e["candidate"]))
            .min_by(|a, b| a.0.total_cmp(&b.0))
    };
    let (ffn_s, ffn) = best(true).unwrap_or_else(|| panic!("host FFNs measured: {board:#?}"));
    let (layers_s, layers) = best(false).expect("-ngl measured");
    // Every layer offloaded with some FFNs on the host; whole layers: fewer than every layer.
    assert_eq!(ffn["n_gpu_layers"], 19, "{ffn}");
    assert!(layers["n_gpu_layers"].as_u64().unwrap() < 19, "{layers}");
    eprintln!(
        "--n-cpu-ffn {} {:.3} s vs -ngl {} {:.3} s per request: {:.2}x",
        host_ffns(ffn),
        ffn_s,
        layers["n_gpu_layers"],
        layers_s,
        layers_s / ffn_s
    );
}

#[test]
fn a_pinned_host_ffn_placement_reaches_the_server() {
    let server = rpc_server();
    let rpc = server.endpoint();
    let sb = Sandbox::new();
    let model = demo_model();
    let profile = sb.dir.path().join("ffn.toml");
    let args = tune_args(
        model.to_str().unwrap(),
        &rpc,
        &[
            "--n-cpu-ffn",
            "9",
            "--budget",
            "40s",
            "--out",
            profile.to_str().unwrap(),
        ],
    );
    let out = sb.run_json(&strs(&args));
    let w = &out["winner"];
    assert_eq!(
        (w["n_gpu_layers"].as_u64(), host_ffns(w)),
        (Some(19), 9),
        "{w}"
    );
    let o = sb.run(&strs(&apply_check_args(&profile, &llama_server())));
    assert!(o.status.success(), "apply: {}\n{}", stderr(&o), stdout(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let command = command_of(&v);
    let at = (command.iter().position(|a| *a == "--n-cpu-ffn"))
        .unwrap_or_else(|| panic!("--n-cpu-ffn in {command:?}"));
    assert_eq!(command[at + 1], "9", "{command:?}");
    assert!(v["completion"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn host_ffns_on_a_machine_without_a_device_or_past_the_layers_are_usage_errors() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    for (args, needle) in [
        (
            vec![m, "--n-cpu-ffn", "4"],
            "--n-cpu-ffn 4: there is no GPU or RPC device",
        ),
        (
            vec![m, "--n-cpu-ffn", "4", "--no-cpu-ffn"],
            "cannot be used with",
        ),
    ] {
        let o = sb.run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    let server = rpc_server();
    let rpc = server.endpoint();
    let o = sb.run(&[m, "--rpc", &rpc, "--n-cpu-ffn", "40"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the model has 18 layers; give at most 18"),
        "{}",
        stderr(&o)
    );
}
