//! A real GPU backend module on a machine without a GPU: ggml-vulkan, built by
//! `scripts/build-backends vulkan` from the ggml sources autotune links, loaded at run time, running
//! on Mesa's llvmpipe (a Vulkan driver that runs on the CPU; ggml uses it when
//! GGML_VK_VISIBLE_DEVICES names it). Everything a GPU run goes through but the hardware: the module,
//! the device's memory budget and dry runs, offloaded layers measured, the profile's devices, and a
//! llama-server loading the same module from the tools' directory.
//!
//! Debian 12's llvmpipe (Mesa 22.3.6) corrupts its heap on one path (docs/gpus.md): host layers'
//! operations offloaded to the device (op offload on, some layers on the host) with flash attention
//! on abort in libvulkan_lvp's malloc, or segfault in llama-server, while Mesa's shader cache is
//! cold (with MESA_SHADER_CACHE_DISABLE=true, most runs on batches of 256 tokens or more). With
//! flash attention off it never did (4 tunes and 5 llama-server checks, cache disabled). The tests
//! here that keep op offload on with host layers either keep to short batches (the 64-token prompt
//! of [`WORKLOAD`], never seen to crash) or turn flash attention off; nothing is run again after a
//! crash.
//!
//! `scripts/test` builds the module and sets AUTOTUNE_REQUIRE_VULKAN=1 (on CI it must build); without
//! it, a machine with no Vulkan module or no llvmpipe skips these tests with a line on stderr.

mod common;
use common::*;
use std::process::Output;

fn vulkan(sb: &Sandbox, args: &[&str]) -> Output {
    sb.cmd()
        .env("GGML_VK_VISIBLE_DEVICES", "0")
        .args(args)
        .output()
        .expect("run autotune")
}

/// Whether this machine has the module and the llvmpipe device; when AUTOTUNE_REQUIRE_VULKAN=1,
/// their absence fails the test.
fn vulkan_device(sb: &Sandbox) -> bool {
    let o = vulkan(sb, &["doctor", "--json"]);
    assert!(o.status.success(), "doctor: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("doctor --json");
    let device = v["machine"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["name"] == "Vulkan0" && d["backend"] == "Vulkan" && d["kind"] == "gpu");
    if device {
        return true;
    }
    let why = format!(
        "no Vulkan0 device (build the module: scripts/build-backends vulkan; llvmpipe: apt-get \
         install mesa-vulkan-drivers); doctor: {}",
        v["modules"]
    );
    assert!(
        std::env::var("AUTOTUNE_REQUIRE_VULKAN").as_deref() != Ok("1"),
        "{why}"
    );
    eprintln!("skipped: {why}");
    false
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}\n{}", stderr(o), stdout(o));
    serde_json::from_str(&stdout(o)).expect("--json prints JSON")
}

/// `apply PROFILE --exec --check-only --json` with the tools' llama-server (which loads the same
/// Vulkan module); its JSON.
fn apply_checked(sb: &Sandbox, profile: &std::path::Path) -> serde_json::Value {
    let args = apply_check_args(profile, &llama_server());
    json(&vulkan(sb, &strs(&args)))
}

/// The workload of these tests (short, at a context the 8 MiB budget below splits) and the knobs
/// they hold fixed.
const WORKLOAD: &[&str] = &[
    "--ctx",
    "1024",
    "--prompt",
    "64",
    "--gen",
    "16",
    "--seed",
    "3",
    "--threads",
    "2",
    "--cache-types",
    "f16",
    "--flash-attn",
    "auto",
];

/// Every layer on Vulkan0 under an 8 MiB budget: at a 512-token ubatch the dry runs predict
/// 10 MiB there and the candidate is pruned unloaded; at 128, 6 MiB, and it is measured, offloaded
/// for real, within the budget by what llama.cpp reported allocating.
#[test]
fn a_vulkan_budget_prunes_what_does_not_fit_and_measures_what_does() {
    let sb = Sandbox::new();
    if !vulkan_device(&sb) {
        return;
    }
    let model = tiny_model();
    let mut args = vec![
        "tune",
        model.to_str().unwrap(),
        "--json",
        "--no-save",
        "--budget",
        "60s",
        "--mem-budget",
        "Vulkan0=8M",
        "--n-gpu-layers",
        "5",
        "--ubatch",
        "512,128",
        "--min-reps",
        "2",
        "--max-reps",
        "3",
    ];
    args.extend_from_slice(WORKLOAD);
    let r = json(&vulkan(&Sandbox::new(), &args));
    let board = r["leaderboard"].as_array().expect("leaderboard");
    let ubatch = |e: &serde_json::Value| e["candidate"]["n_ubatch"].as_u64().unwrap();
    let status = |e: &serde_json::Value| e["status"].as_str().unwrap_or("").to_string();
    assert!(
        board.iter().any(|e| ubatch(e) == 512
            && status(e).starts_with("pruned")
            && status(e).contains("on Vulkan0")
            && e["figures"].is_null()),
        "ubatch 512 is pruned on Vulkan0's budget: {r:#}"
    );
    assert!(
        board
            .iter()
            .any(|e| ubatch(e) == 128 && status(e) == "ok" && !e["figures"].is_null()),
        "ubatch 128 is measured: {r:#}"
    );
    // A candidate pruned on the memory budget is not one the time budget left unmeasured.
    let unmeasured = board
        .iter()
        .any(|e| status(e).contains("time budget spent"));
    assert_eq!(
        r["notes"].to_string().contains("time budget"),
        unmeasured,
        "the time-budget note only when the time budget left a candidate unmeasured: {}",
        r["notes"]
    );
    let devices: Vec<&str> = r["winner_devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(devices.contains(&"Vulkan0"), "{devices:?}");
    let mut reported = 0;
    for row in r["memory"].as_array().unwrap() {
        for d in row["reported"].as_array().into_iter().flatten() {
            if d["device"] == "Vulkan0" {
                reported += 1;
                assert!(
                    d["bytes"].as_u64().unwrap() <= 8 << 20,
                    "llama.cpp allocated more than the budget on Vulkan0: {row}"
                );
            }
        }
    }
    assert!(
        reported > 0,
        "llama.cpp's allocations on Vulkan0 are reported: {r:#}"
    );
}

/// K and V apart where the device, asked, runs the pair: llvmpipe's Vulkan has subgroup shuffle
/// and vote, so ggml-vulkan runs flash attention over an f16 K and a q8_0 V cache, and the search
/// measures that pair with every layer on Vulkan0 (before, a Vulkan device got pairs of one type
/// by its backend's name).
#[test]
fn mixed_kv_pairs_are_searched_on_a_vulkan_device_that_runs_them() {
    let sb = Sandbox::new();
    if !vulkan_device(&sb) {
        return;
    }
    let model = tiny_model();
    let args = [
        "tune",
        model.to_str().unwrap(),
        "--json",
        "--no-save",
        "--budget",
        "120s",
        "--n-gpu-layers",
        "5",
        "--ubatch",
        "128",
        "--min-reps",
        "2",
        "--max-reps",
        "2",
        "--ctx",
        "1024",
        "--prompt",
        "64",
        "--gen",
        "16",
        "--seed",
        "3",
        "--threads",
        "2",
        "--cache-types",
        "f16,q8_0",
        "--flash-attn",
        "on",
        "--no-quality-gate",
    ];
    let r = json(&vulkan(&Sandbox::new(), &args));
    let board = r["leaderboard"].as_array().expect("leaderboard");
    let kv = |e: &serde_json::Value| {
        let c = &e["candidate"];
        (c["type_k"].to_string(), c["type_v"].to_string())
    };
    assert!(
        board
            .iter()
            .any(|e| kv(e) == ("\"f16\"".into(), "\"q8_0\"".into())),
        "f16 K with a q8_0 V cache was searched on Vulkan0: {r:#}"
    );
}

/// A profile that offloads to Vulkan0 applies to a real llama-server that loads the same module.
#[test]
fn a_profile_offloading_to_vulkan_applies_with_llama_server() {
    let sb = Sandbox::new();
    if !vulkan_device(&sb) {
        return;
    }
    let model = tiny_model();
    let profile = sb.dir.path().join("vulkan.toml");
    let mut args = vec![
        "tune",
        model.to_str().unwrap(),
        "-o",
        profile.to_str().unwrap(),
        "--budget",
        "30s",
        "--n-gpu-layers",
        "2",
        "--ubatch",
        "512",
        // Off, the baseline too: on, the server check's 500-token prompt would go through
        // llvmpipe's heap corruption (the module's doc).
        "--op-offload",
        "off",
    ];
    args.extend_from_slice(WORKLOAD);
    let o = vulkan(&Sandbox::new(), &args);
    assert!(o.status.success(), "tune: {}\n{}", stderr(&o), stdout(&o));
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(
        text.contains("Vulkan0"),
        "the profile names Vulkan0: {text}"
    );

    let v = apply_checked(&sb, &profile);
    let command = command_of(&v);
    let at = command
        .iter()
        .position(|a| *a == "-ngl" || *a == "--n-gpu-layers")
        .unwrap_or_else(|| panic!("-ngl in {command:?}"));
    assert_eq!(command[at + 1], "2", "{command:?}");
    assert!(v["completion"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
}

/// The devices are listed in the order llama.cpp gives them to a model, RPC servers first, though
/// ggml registers them after the modules' devices: every budget and tensor split autotune writes is
/// read by llama.cpp (and llama-server's `--tensor-split`) in that order.
#[test]
fn devices_are_listed_in_llama_cpps_model_order() {
    let sb = Sandbox::new();
    if !vulkan_device(&sb) {
        return;
    }
    let rpc = rpc_server();
    let o = vulkan(&sb, &["doctor", "--json", "--rpc", &rpc.endpoint()]);
    let v = json(&o);
    let names: Vec<&str> = v["machine"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["CPU", "RPC0", "Vulkan0"], "{v:#}");
    assert_eq!(v["skipped_devices"], serde_json::json!([]), "{v:#}");
}

/// Op offload measured for real: with every layer on the CPU and Vulkan0 present, ggml copies the
/// host's weights to the device for each prompt batch of 32 tokens or more and multiplies there; on
/// llvmpipe that is hundreds of times slower than the CPU's own kernels. The tune turns it off, the
/// profile says `--no-op-offload`, and a real llama-server takes the flag.
#[test]
fn op_offload_off_wins_over_a_slow_device_and_applies() {
    let sb = Sandbox::new();
    if !vulkan_device(&sb) {
        return;
    }
    let model = tiny_model();
    let profile = sb.dir.path().join("no-op-offload.toml");
    let mut args = vec![
        "tune",
        model.to_str().unwrap(),
        "-o",
        profile.to_str().unwrap(),
        "--json",
        "--budget",
        "40s",
        "--n-gpu-layers",
        "0",
        "--ubatch",
        "512",
        "--kernels",
        "repack",
    ];
    args.extend_from_slice(WORKLOAD);
    let r = json(&vulkan(&Sandbox::new(), &args));
    let board = r["leaderboard"].as_array().expect("leaderboard");
    let pp = |off: bool| {
        board
            .iter()
            .find(|e| (e["candidate"]["op_offload"] == "off") == off && e["status"] == "ok")
            .and_then(|e| e["figures"]["pp_tps"].as_f64())
            .unwrap_or_else(|| {
                panic!(
                    "op offload {} measured: {r:#}",
                    if off { "off" } else { "on" }
                )
            })
    };
    let (on, off) = (pp(false), pp(true));
    assert!(
        off > 2.0 * on,
        "pp {off} t/s without op offload vs {on} with it"
    );
    assert_eq!(r["winner"]["op_offload"], "off", "{:#}", r["winner"]);
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains("--no-op-offload"), "{text}");

    let v = apply_checked(&sb, &profile);
    assert!(command_of(&v).contains(&"--no-op-offload"), "{v}");
    assert!(v["completion"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
}

/// The CPU backend's buffers for weights it repacks: `AMX` where the CPU has AMX (it is asked
/// first), `CPU_REPACK` elsewhere.
fn is_cpu_extra_buffer(name: &str) -> bool {
    name == "CPU_REPACK" || name == "AMX"
}

/// The buffers `measure` loads the model's weights into with `--host-buffer host_buffer`, every
/// layer on the CPU beside the Vulkan device.
fn model_buffers(sb: &Sandbox, model: &std::path::Path, host_buffer: &str) -> Vec<String> {
    let args = [
        "measure",
        model.to_str().unwrap(),
        "--json",
        "--n-gpu-layers",
        "0",
        "--op-offload",
        "off",
        "--kernels",
        "repack",
        "--host-buffer",
        host_buffer,
        "--reps",
        "2",
        "-c",
        "1024",
        "-p",
        "32",
        "-n",
        "4",
        "-t",
        "2",
    ];
    let v = json(&vulkan(sb, &args));
    (v["load"]["buffers"].as_array())
        .unwrap_or_else(|| panic!("buffers: {v:#}"))
        .iter()
        .filter(|b| b["what"] == "model")
        .map(|b| b["buffer"].as_str().unwrap().to_string())
        .collect()
}

/// `tune` with half the layers on Vulkan0, op offload off (on llvmpipe it is hundreds of times
/// slower), and the `extra` flags.
fn tune_half_on_vulkan(model: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec!["tune", model.to_str().unwrap(), "--n-gpu-layers", "2"];
    args.extend_from_slice(&[
        "--op-offload",
        "off",
        "--kernels",
        "repack",
        "--ubatch",
        "512",
    ]);
    args.extend_from_slice(extra);
    args.extend_from_slice(WORKLOAD);
    vulkan(&Sandbox::new(), &args)
}

/// Beside a device with pinned host memory (Vulkan's, as CUDA's) llama.cpp puts the host's weights
/// in that memory first: mapped from the file by default (the pinned buffer set aside for the
/// mapping: `CPU_Mapped`, and the CPU's repacked kernels unused although `--repack` is on), read
/// into it with `--load-mode none` (`Vulkan_Host`), or in the CPU's own repacking buffers with
/// `--no-host` (`CPU_REPACK`, or `AMX` on a CPU with AMX). `measure` loads each as asked (llama.cpp's own buffer names); `tune`
/// measures all three where weights stay on the host (a first repetition more than 1.75 times as
/// slow as the best is stopped); the profile's flag is what a real
/// llama-server loads the same buffers with.
#[test]
fn host_weights_go_where_the_host_buffer_says_in_autotune_and_llama_server() {
    let sb = Sandbox::new();
    if !vulkan_device(&sb) {
        return;
    }
    let model = tiny_model();
    let mapped = model_buffers(&sb, &model, "mapped");
    assert!(mapped.iter().any(|b| b == "CPU_Mapped"), "{mapped:?}");
    assert!(
        !mapped
            .iter()
            .any(|b| is_cpu_extra_buffer(b) || b == "Vulkan_Host"),
        "{mapped:?}"
    );
    let pinned = model_buffers(&sb, &model, "pinned");
    assert!(pinned.iter().any(|b| b == "Vulkan_Host"), "{pinned:?}");
    let cpu = model_buffers(&sb, &model, "cpu");
    assert!(cpu.iter().any(|b| is_cpu_extra_buffer(b)), "{cpu:?}");

    let r = json(&tune_half_on_vulkan(
        &model,
        &["--json", "--no-save", "--budget", "60s", "--max-reps", "3"],
    ));
    let board = r["leaderboard"].as_array().expect("leaderboard");
    // Measured in full, or loaded and stopped as too slow (mid-repetition, or after one) beside the
    // best (on llvmpipe one of them can be).
    let measured = |e: &serde_json::Value| {
        let status = e["status"].as_str().unwrap_or("");
        status == "ok" || status.starts_with("stopped ")
    };
    for h in ["mapped", "pinned", "cpu"] {
        assert!(
            board
                .iter()
                .any(|e| measured(e)
                    && e["candidate"]["host_buffer"].as_str().unwrap_or("mapped") == h),
            "host buffer {h} measured: {r:#}"
        );
    }
    a_no_host_profile_repacks_in_llama_server(&sb, &model);
}

/// Held to --no-host, the profile says so, and llama-server repacks the host's weights too.
fn a_no_host_profile_repacks_in_llama_server(sb: &Sandbox, model: &std::path::Path) {
    let profile = sb.dir.path().join("no-host.toml");
    let path = profile.to_str().unwrap();
    let o = tune_half_on_vulkan(
        model,
        &["-o", path, "--budget", "20s", "--host-buffer", "cpu"],
    );
    assert!(o.status.success(), "tune: {}\n{}", stderr(&o), stdout(&o));
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains("\"--no-host\""), "{text}");
    // Its log (shown with autotune's --verbose) names its buffers at verbosity 4.
    let mut apply = vec!["--verbose".to_string()];
    apply.extend(apply_check_args(&profile, &llama_server()));
    apply.extend(["--", "-lv", "4"].map(String::from));
    let o = vulkan(sb, &strs(&apply));
    let v = json(&o);
    assert!(command_of(&v).contains(&"--no-host"), "{v}");
    assert!(v["completion"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
    let log = stderr(&o);
    assert!(
        ["CPU_REPACK", "AMX"]
            .iter()
            .any(|b| log.contains(&format!("{b} model buffer size"))),
        "llama-server's log: {}",
        stderr(&o)
    );
}

/// The op-offload threshold (`GGML_OP_OFFLOAD_MIN_BATCH`), measured where it changes something:
/// half the tiny model's layers on the host, op offload on, and a 300-token prompt at `-ub 256`,
/// whose batches are 256 and 44 tokens. Thresholds 32 (llama.cpp's: both batches' host layers go
/// to the device) and 45 (the 44-token batch stays on the CPU) are both measured; the profile
/// carries the winner's value as the server's environment, and `apply` starts llama-server with it.
///
/// Flash attention off: on, this path corrupts llvmpipe's heap (the module's doc).
#[test]
fn the_op_offload_threshold_is_searched_saved_and_applied() {
    let sb = Sandbox::new();
    if !vulkan_device(&sb) {
        return;
    }
    let model = tiny_model();
    let profile = sb.dir.path().join("threshold.toml");
    let args = threshold_tune(&model, &profile);
    let args = strs(&args);
    let threshold = |e: &serde_json::Value| e["candidate"]["op_offload_min_batch"].as_u64();
    let measured = |r: &serde_json::Value, t: Option<u64>| {
        (r["leaderboard"].as_array().into_iter().flatten())
            .any(|e| threshold(e) == t && !e["figures"].is_null())
    };
    let r = json(&vulkan(&Sandbox::new(), &args));
    assert!(
        measured(&r, None),
        "llama.cpp's threshold is measured: {r:#}"
    );
    assert!(
        measured(&r, Some(45)),
        "45 keeps the 44-token batch on the CPU: {r:#}"
    );
    let winner = &r["winner"];
    let text = std::fs::read_to_string(&profile).unwrap();
    match winner["op_offload_min_batch"].as_u64() {
        Some(t) => assert!(
            text.contains(&format!("GGML_OP_OFFLOAD_MIN_BATCH = \"{t}\"")),
            "the profile carries the threshold for the server: {text}"
        ),
        None => assert!(!text.contains("GGML_OP_OFFLOAD_MIN_BATCH"), "{text}"),
    }

    // `apply` without --exec prints the environment before llama-server; with it, starts it so.
    let o = vulkan(&sb, &["apply", profile.to_str().unwrap()]);
    assert!(o.status.success(), "apply: {}", stderr(&o));
    let line = stdout(&o);
    let env = winner["op_offload_min_batch"]
        .as_u64()
        .map(|t| format!("GGML_OP_OFFLOAD_MIN_BATCH={t} "));
    if let Some(env) = &env {
        assert!(line.starts_with(env.as_str()), "{line}");
    }
    let v = apply_checked(&sb, &profile);
    let command = command_of(&v);
    if let Some(env) = &env {
        assert_eq!(command[0], env.trim(), "{command:?}");
    }
    assert!(v["completion"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
}

/// The threshold test's tune: half the tiny model on the device, a 300-token prompt at `-ub 256`.
fn threshold_tune(model: &std::path::Path, profile: &std::path::Path) -> Vec<String> {
    [
        "tune",
        model.to_str().unwrap(),
        "--json",
        "-o",
        profile.to_str().unwrap(),
        "--budget",
        "120s",
        "--n-gpu-layers",
        "2",
        "--op-offload",
        "on",
        "--host-buffer",
        "mapped",
        "--kernels",
        "plain",
        "--ubatch",
        "256",
        "--ctx",
        "400",
        "--prompt",
        "300",
        "--gen",
        "8",
        "--threads",
        "2",
        "--cache-types",
        "f16",
        "--flash-attn",
        "off",
        "--min-reps",
        "2",
        "--max-reps",
        "4",
        "--seed",
        "3",
    ]
    .map(String::from)
    .to_vec()
}

/// The quality gate's context at a request's depth that the device cannot hold (its f16 reference's
/// cache the largest) is evaluated on the CPU alone, said in the row, not failed: else the gate
/// would refuse the quantized cache that made the model fit. Here the device's largest allocation
/// is cut to 384 KiB, under one layer's f16 K cache at 1024 positions (512 KiB): the weights load on
/// it, the context does not (and llvmpipe's worker may crash on that failure: asked again in a
/// fresh worker). Beside it, the same evaluation with the device whole runs on Vulkan.
#[test]
fn a_quality_context_the_device_cannot_hold_is_evaluated_on_the_cpu() {
    let sb = Sandbox::new();
    if !vulkan_device(&sb) {
        return;
    }
    let model = tiny_model();
    let args = [
        "quality",
        model.to_str().unwrap(),
        "--kv-types",
        "q8_0",
        "--chunk",
        "1024",
        "--tokens",
        "1100",
        "--json",
    ];
    let backend = |v: &serde_json::Value| {
        let row = &v["quality"]["kv"][0];
        assert!(row["figures"]["kld_mean"].is_number(), "{row}");
        row["measured_with"]["backend"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let whole = json(&vulkan(&sb, &args));
    assert_eq!(backend(&whole), "Vulkan");
    let cut = sb
        .cmd()
        .env("GGML_VK_VISIBLE_DEVICES", "0")
        .env("GGML_VK_FORCE_MAX_ALLOCATION_SIZE", "393216")
        .env("GGML_VK_FORCE_MAX_BUFFER_SIZE", "393216")
        .args(args)
        .arg("--fresh")
        .output()
        .expect("run autotune");
    assert_eq!(backend(&json(&cut)), "CPU");
}
