//! End to end: two loopback `autotune rpc-serve` devices stand in for two GPUs. A tune offloads every
//! layer to them (to one of them or both, whichever measures faster), the profile keeps both
//! servers, and `apply --exec --check-only` starts the vendor llama-server with `--rpc` naming the
//! servers its devices need and gets a completion from it.

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
fn a_profile_offloading_to_rpc_devices_applies_with_the_servers_it_uses() {
    let servers = (rpc_server(), rpc_server());
    let (e0, e1) = (servers.0.endpoint(), servers.1.endpoint());
    let rpc = format!("{e0},{e1}");
    let sb = Sandbox::new();
    let profile = sb.dir.path().join("rpc.toml");
    tune_offloaded(&sb, &profile, &rpc, "90s");
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(
        text.contains(&e0) && text.contains(&e1),
        "the profile keeps both RPC servers: {text}"
    );
    // The loopback servers compute autotune's own trials: their time is not other programs'.
    assert!(
        !text.contains("the machine was busy"),
        "loopback RPC servers counted as other programs: {text}"
    );

    let o = sb.run(&strs(&apply_check_args(&profile, &llama_server())));
    assert!(o.status.success(), "apply: {}\n{}", stderr(&o), stdout(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let command = command_of(&v);
    let at = command
        .iter()
        .position(|a| *a == "--rpc")
        .unwrap_or_else(|| panic!("--rpc in {command:?}"));
    let needed = servers_needed(&command, &[e0.as_str(), e1.as_str()]);
    assert_eq!(command[at + 1], needed, "{command:?}");
    assert!(v["completion"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
}

/// The `--rpc` list a server command needs: the servers up to the last RPC device its `--device`
/// names (RPCn is the n-th server given), all of them when it names none. Which devices win is
/// measured (on loopback one device alone often beats two), so the test follows the winner.
fn servers_needed(command: &[&str], servers: &[&str]) -> String {
    let last = match command.iter().position(|a| *a == "--device") {
        None => servers.len() - 1,
        Some(at) => (command[at + 1].split(','))
            .filter_map(|d| d.strip_prefix("RPC")?.parse::<usize>().ok())
            .max()
            .unwrap_or_else(|| panic!("an RPC device in {command:?}")),
    };
    servers[..=last].join(",")
}

#[test]
fn apply_names_the_rpc_server_that_is_down() {
    let sb = Sandbox::new();
    let profile = sb.dir.path().join("rpc.toml");
    let rpc;
    {
        let server = rpc_server();
        rpc = server.endpoint();
        tune_offloaded(&sb, &profile, &rpc, "40s");
    }
    // The server is gone: apply fails in one line naming it, with the documented exit code.
    let o = sb.run(&["apply", profile.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(&rpc), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// With devices to offload to, "llama.cpp's defaults" are what llama-server does unasked: its own
/// fit's placement under the same budgets, at the same context. With RPC1's budget too small for
/// the output layer, the fit puts every layer on RPC0 (`-ts 19,0`), which the split by free memory
/// (even here) cannot hold; `tune --json` measures that placement as its baseline and says so, and
/// the profile names it.
#[test]
fn the_baseline_with_two_rpc_devices_is_llama_cpps_fit_placement() {
    let servers = (rpc_server(), rpc_server());
    let rpc = format!("{},{}", servers.0.endpoint(), servers.1.endpoint());
    let budgets = "RPC0=600M,RPC1=300M";
    let model = demo_model();
    let m = model.to_str().unwrap();
    let sb = Sandbox::new();
    let o = sb.run(&[
        "fit",
        m,
        "--json",
        "--rpc",
        &rpc,
        "--mem-budget",
        budgets,
        "--ctx",
        "256",
    ]);
    assert!(o.status.success(), "fit: {}", stderr(&o));
    let fit: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(fit["status"], "success", "{fit:#}");
    let split: Vec<u64> = fit["fit"]["tensor_split"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap().round() as u64)
        .collect();

    let profile = sb.dir.path().join("fit.toml");
    let mut args = vec![
        "tune",
        m,
        "--json",
        "--no-save",
        "--out",
        profile.to_str().unwrap(),
        "--rpc",
        &rpc,
        "--mem-budget",
        budgets,
        "--kernels",
        "plain",
        "--budget",
        "40s",
    ];
    args.extend_from_slice(SHORT_WORKLOAD);
    args.extend_from_slice(SHORT_KNOBS);
    let o = sb.run(&args);
    assert!(o.status.success(), "tune: {}\n{}", stderr(&o), stdout(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let b = &r["baseline"];
    assert_eq!(b["n_gpu_layers"], fit["n_gpu_layers"], "{b} vs {fit:#}");
    let baseline_split: Vec<u64> = b["tensor_split"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_u64().unwrap()).collect())
        .unwrap_or_default();
    assert_eq!(baseline_split, split, "{b} vs {fit:#}");
    assert_eq!(r["baseline_placement"]["source"], "llama_fit", "{r:#}");
    assert_eq!(
        r["baseline_placement"]["label"],
        "llama.cpp's --fit placement"
    );
    assert!(
        !r["baseline_figures"].is_null(),
        "measured in the same run: {r:#}"
    );
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(
        text.contains("baseline_placement = \"llama.cpp's --fit placement\""),
        "{text}"
    );
}

/// llama.cpp's experimental tensor parallelism runs on two RPC devices when measured by hand
/// (`measure --split-mode tensor`), and without flash attention it is refused before loading.
#[test]
fn tensor_parallelism_is_measured_by_hand_and_needs_flash_attention() {
    let servers = (rpc_server(), rpc_server());
    let rpc = format!("{},{}", servers.0.endpoint(), servers.1.endpoint());
    let sb = Sandbox::new();
    let model = tiny_model();
    let model = model.to_str().unwrap();
    let args = [
        "measure",
        model,
        "--rpc",
        &rpc,
        "-ngl",
        "5",
        "--split-mode",
        "tensor",
        "-r",
        "2",
        "-t",
        "1",
        "--ctx",
        "1024",
        "--prompt",
        "64",
        "--gen",
        "16",
        "--json",
    ];
    let o = sb.run(&args);
    assert!(
        o.status.success(),
        "measure: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    assert_eq!(v["candidate"]["split_mode"], "tensor", "{v:#}");
    assert!(v["tg"]["median"].as_f64().unwrap() > 0.0, "{v:#}");

    let o = sb.run(&["measure", model, "--split-mode", "tensor", "-fa", "off"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("split mode tensor needs flash attention"),
        "{}",
        stderr(&o)
    );
}

/// The KV cache in host memory (-nkvo) as a fit lever, on a real RPC device: at a 32k context the
/// demo model's f16 KV cache on RPC0 is 111 MiB (96 MiB for its 3 global layers, 15 MiB for the 15
/// sliding-window ones, as llama-server sizes them). A budget 56 MiB short of what every layer with
/// its KV cache needs (llama.cpp's fit placement, `autotune fit`) holds only some layers with the
/// cache on RPC0, and all 19 with it on the host; that placement is measured beside the others,
/// within the budget by what llama.cpp allocated.
#[test]
fn the_kv_cache_on_the_host_lets_every_layer_fit_and_is_measured() {
    let server = rpc_server();
    let rpc = server.endpoint();
    let sb = Sandbox::new();
    let model = demo_model();
    let (ngl, every_layer) = fit_on_rpc0(&sb, &model, &rpc, "32768");
    assert_eq!(ngl, 19);
    let budget = every_layer - (56 << 20);
    let r = sb.run_json(&[
        "tune",
        model.to_str().unwrap(),
        "--json",
        "--no-save",
        "--rpc",
        &rpc,
        "--mem-budget",
        &format!("RPC0={budget}"),
        "--ctx",
        "32768",
        "--prompt",
        "64",
        "--gen",
        "16",
        "--cache-types",
        "f16",
        "--ubatch",
        "512",
        "--kernels",
        "plain",
        "--threads",
        "2",
        "--flash-attn",
        "auto",
        "--min-reps",
        "2",
        "--max-reps",
        "3",
        "--budget",
        "120s",
    ]);
    let board = r["leaderboard"].as_array().unwrap();
    // Measured: in full, or loaded and stopped once its time proved it far slower than the best
    // (on 2 cores the CPU alone can be that best, when it is measured first).
    let measured = |host_kv: bool| -> Vec<u64> {
        board
            .iter()
            .filter(|e| (e["candidate"]["kv_offload"] == "off") == host_kv)
            .filter(|e| {
                let status = e["status"].as_str().unwrap();
                status == "ok" || status.starts_with("stopped ")
            })
            .map(|e| e["candidate"]["n_gpu_layers"].as_u64().unwrap())
            .collect()
    };
    let (on_device, on_host) = (measured(false), measured(true));
    assert_eq!(on_host, [19], "the -nkvo placement, every layer: {r:#}");
    assert!(
        on_device.iter().all(|&n| n < 19),
        "with the KV cache on RPC0 not every layer fits: {on_device:?}"
    );
    let rows = r["memory"].as_array().unwrap();
    for row in rows {
        for d in row["reported"].as_array().into_iter().flatten() {
            if d["device"] == "RPC0" {
                assert!(d["bytes"].as_u64().unwrap() <= budget, "{row}");
            }
        }
    }
    // What llama.cpp allocated for the -nkvo placement is kept whether it ran in full or stopped.
    let host_kv = (rows.iter())
        .find(|row| row["candidate"]["kv_offload"] == "off")
        .expect("a memory row for the -nkvo placement");
    assert_eq!(host_kv["loaded"], true, "{host_kv}");
    assert!(
        (host_kv["reported"].as_array().unwrap().iter()).any(|d| d["device"] == "RPC0"),
        "{host_kv}"
    );
}

/// A prompt longer than 512 tokens with a device to offload to: micro-batches above 512 are tried
/// unasked (here 1024, the first that holds the whole 1024-token prompt; 2048 would hold no more)
/// and measured beside llama.cpp's 512, and the profile carries the winner's.
#[test]
fn a_long_prompt_with_a_device_measures_micro_batches_above_512() {
    let server = rpc_server();
    let rpc = server.endpoint();
    let sb = Sandbox::new();
    let model = tiny_model();
    let profile = sb.dir.path().join("ub.toml");
    let r = sb.run_json(&[
        "tune",
        model.to_str().unwrap(),
        "--json",
        "-o",
        profile.to_str().unwrap(),
        "--rpc",
        &rpc,
        "--n-gpu-layers",
        "99",
        "--ctx",
        "2048",
        "--prompt",
        "1024",
        "--gen",
        "16",
        "--cache-types",
        "f16",
        "--kernels",
        "plain",
        "--threads",
        "2",
        "--flash-attn",
        "auto",
        "--budget",
        "60s",
    ]);
    let mut measured: Vec<u64> = r["leaderboard"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == "ok")
        .map(|e| e["candidate"]["n_ubatch"].as_u64().unwrap())
        .collect();
    measured.sort_unstable();
    measured.dedup();
    assert_eq!(measured, [128, 256, 512, 1024], "{r:#}");
    let ub = r["winner"]["n_ubatch"].as_u64().unwrap();
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains(&format!("\"-ub\", \"{ub}\"")), "{text}");
}
