//! Fit before you run: candidates predicted (by llama.cpp's dry run) to exceed a device budget are
//! pruned and never loaded; a model larger than every budget is a clear error with no trial; an MoE
//! model's experts are placed on the host when the offload device is small (a real RPC device).

mod common;
use common::*;

fn model_arg(p: &std::path::Path) -> String {
    p.to_str().unwrap().to_string()
}

/// A /proc/meminfo figure (`key` with its colon), in KiB.
fn meminfo_kib(key: &str) -> u64 {
    (std::fs::read_to_string("/proc/meminfo").unwrap().lines())
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/meminfo"))
}

/// The dry run's prediction of the demo model on the host at context `ctx` with a KV cache of
/// `kv` (`autotune measure --predict`), in bytes.
fn predicted_host_bytes(sb: &Sandbox, m: &str, ctx: &str, kv: &str) -> u64 {
    let v = sb.run_json(&[
        "measure",
        m,
        "-c",
        ctx,
        "-p",
        "32",
        "-n",
        "8",
        "-r",
        "2",
        "-t",
        "2",
        "-ctk",
        kv,
        "-ctv",
        kv,
        "--kernels",
        "plain",
        "--predict",
        "--json",
    ]);
    v["predicted"]["per_device"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == "CPU")
        .and_then(|d| d["bytes"].as_u64())
        .unwrap_or_else(|| panic!("a CPU prediction: {v}"))
}

#[test]
fn candidates_over_budget_are_pruned_not_loaded() {
    let model = demo_model();
    let sb = Sandbox::new();
    let m = model_arg(&model);
    // At 32768 tokens the f16 KV cache takes about twice the q8_0 one: a host budget halfway
    // between their predictions fits only q8_0.
    let f16 = predicted_host_bytes(&sb, &m, "32768", "f16");
    let q8 = predicted_host_bytes(&sb, &m, "32768", "q8_0");
    assert!(f16 > q8 + (32 << 20), "f16 {f16} vs q8_0 {q8}");
    let budget = (f16 + q8) / 2;
    let o = sb.run(&[
        "tune",
        &m,
        "--json",
        "--mem-budget",
        &format!("CPU={budget}"),
        "--ubatch",
        "512",
        "--ctx",
        "32768",
        "--prompt",
        "32",
        "--gen",
        "8",
        "--min-reps",
        "2",
        "--max-reps",
        "2",
        "--threads",
        "2",
        "--cache-types",
        "f16,q8_0",
        "--flash-attn",
        "auto",
        "--kernels",
        "plain",
        "--budget",
        "90s",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let board = r["leaderboard"].as_array().unwrap();
    let pruned: Vec<_> = board
        .iter()
        .filter(|e| e["status"].as_str().unwrap().starts_with("pruned"))
        .collect();
    assert!(!pruned.is_empty(), "{board:?}");
    assert!(pruned
        .iter()
        .all(|e| e["candidate"]["type_k"] == "f16" && e["figures"].is_null()));
    // Marked as not fitting, for explain; what was measured is not.
    assert!(
        pruned.iter().all(|e| e["did_not_fit"] == true),
        "{pruned:?}"
    );
    assert!(board
        .iter()
        .filter(|e| e["status"] == "ok")
        .all(|e| e.get("did_not_fit").is_none()));
    // What fits holds a q8_0 cache: on K and V, or on V alone (less lossy).
    let w = &r["winner"];
    assert!(w["type_k"] == "q8_0" || w["type_v"] == "q8_0", "{w}");
    let explain = stdout(&sb.run(&["explain", &m]));
    let n = pruned.len();
    assert!(
        explain.contains(&format!(
            "{n} configuration{} did not fit",
            if n == 1 { "" } else { "s" }
        )),
        "{explain}"
    );
    // Nothing that was loaded exceeded the budget by llama.cpp's own accounting.
    for row in r["memory"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["loaded"] == true)
    {
        for d in row["reported"].as_array().unwrap() {
            if d["device"] == "CPU" {
                assert!(d["bytes"].as_u64().unwrap() <= budget, "{row}");
            }
        }
    }
}

#[test]
fn a_model_larger_than_every_budget_is_a_clear_error_without_trials() {
    let model = demo_model();
    let sb = Sandbox::new();
    let m = model_arg(&model);
    let o = sb.run(&[
        "tune",
        &m,
        "--mem-budget",
        "CPU=10M",
        "--ctx",
        "256",
        "--prompt",
        "32",
        "--gen",
        "8",
        "--threads",
        "2",
        "--cache-types",
        "f16",
        "--kernels",
        "plain",
        "--budget",
        "60s",
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("fits the memory budgets") && err.contains("nothing was loaded"),
        "{err}"
    );
    // The host named as RAM, and what would fit instead.
    assert!(
        err.contains("on CPU (host RAM), budget 10.0 MiB") && err.contains("smaller quantization"),
        "{err}"
    );
    assert!(sb.stored_profiles().is_empty());
    // No trial ran: the measurement log has no repetition.
    let logs = sb.cache().join("measurements");
    let lines: usize = std::fs::read_dir(&logs)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    std::fs::read_to_string(e.path())
                        .unwrap_or_default()
                        .lines()
                        .count()
                })
                .sum()
        })
        .unwrap_or(0);
    assert_eq!(lines, 0);
}

#[test]
fn moe_experts_go_to_the_host_when_the_device_is_small() {
    let moe = model_arg(&tiny_moe_model());
    let server = rpc_server();
    let sb = Sandbox::new();
    // At -ub 128, every layer with every expert does not fit 22 MiB on the device (at most 4 of
    // the 5 do); with the experts of two or more layers on the host all 5 do.
    let rpc = server.endpoint();
    let o = sb.run(&[
        "tune",
        &moe,
        "--json",
        "--rpc",
        &rpc,
        "--mem-budget",
        "RPC0=22M",
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
        "--threads",
        "2",
        "--cache-types",
        "f16",
        "--flash-attn",
        "auto",
        "--ubatch",
        "128",
        "--kernels",
        "plain",
        "--budget",
        "150s",
        "--no-save",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let board = r["leaderboard"].as_array().unwrap();
    let measured_moe = board
        .iter()
        .filter(|e| {
            e["candidate"]["n_cpu_moe"].as_u64().unwrap_or(0) > 0 && !e["figures"].is_null()
        })
        .count();
    assert!(
        measured_moe >= 1,
        "an expert placement was measured: {board:#?}"
    );
    // Full offload with every expert on the device does not fit and was never loaded.
    assert!(
        board.iter().all(|e| !(e["candidate"]["n_gpu_layers"] == 5
            && e["candidate"]["n_cpu_moe"].is_null()
            && !e["figures"].is_null())),
        "{board:#?}"
    );
}

/// `measure` has no budgets, but it never runs the machine out of memory: its dry run predicts the
/// load, and the worker refuses one that needs more RAM than is available (exit 4, one line, the
/// figures), before allocating anything. The tiny model's KV cache at a context of twice this
/// machine's RAM in tokens' worth of it is far over what any machine has free.
#[test]
fn measure_refuses_a_load_larger_than_the_ram_available() {
    let model = tiny_model();
    let sb = Sandbox::new();
    let total_kib = meminfo_kib("MemTotal:");
    // 4 KiB of f16 K and V per token (4 layers, 4 KV heads of 64): twice RAM in KV cache alone.
    let ctx = (total_kib * 1024 * 2 / 4096).to_string();
    let o = sb.run(&[
        "measure",
        &model_arg(&model),
        "-c",
        &ctx,
        "-t",
        "1",
        "-p",
        "16",
        "-n",
        "4",
        "--reps",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("not loaded, to avoid running out of memory") && err.contains("on CPU"),
        "{err}"
    );
    assert!(
        !err.contains("llama.cpp refused"),
        "autotune refused, not llama.cpp: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(stdout(&o).is_empty());
}

/// Two candidates that differ in their model settings (CPU kernels) are held by two trial workers
/// when the model file is small, but each of these loads takes over half the RAM available (the
/// tiny model's KV cache at a context sized from /proc/meminfo): the second worker's memory check
/// refuses its load while the first holds its model. The tuner's own idle worker is what holds that
/// memory, so it is closed and the load tried again: both are measured, nothing is refused, and
/// nothing ran the machine out of memory.
#[test]
fn two_loads_that_cannot_share_the_ram_are_measured_one_after_the_other() {
    let model = tiny_model();
    let sb = Sandbox::new();
    let available_kib = meminfo_kib("MemAvailable:");
    // About 5.2 KiB per token of context at -ub 512 (the KV cache's 4 KiB and the compute buffer's
    // attention rows, by the dry run): each load 65% of the RAM available (the KV cache, over
    // half of it, is cleared at load, so it is resident before the next load is checked).
    let ctx = (available_kib * 1024 * 65 / 100 / 5300).to_string();
    let o = sb.run(&[
        "tune",
        &model_arg(&model),
        "--ctx",
        &ctx,
        "--prompt",
        "32",
        "--gen",
        "8",
        "--exhaustive",
        "--kernels",
        "repack,plain",
        "--threads",
        "1",
        "--cache-types",
        "f16",
        "--flash-attn",
        "auto",
        "--ubatch",
        "512",
        "--min-reps",
        "2",
        "--max-reps",
        "2",
        "--budget",
        "2m",
        "--no-save",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not loaded"), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let board = r["leaderboard"].as_array().unwrap();
    for kernels in ["repack", "plain"] {
        let e = (board.iter())
            .find(|e| e["candidate"]["kernels"] == kernels)
            .unwrap_or_else(|| panic!("{kernels} in {board:#?}"));
        assert_eq!(e["status"], "ok", "{kernels}: {e:#}");
    }
    // Each load really was over half of what was available, so two could not have shared it.
    for row in r["memory"].as_array().unwrap() {
        let cpu = (row["predicted"].as_array().unwrap().iter())
            .find(|d| d["device"] == "CPU")
            .and_then(|d| d["bytes"].as_u64())
            .unwrap();
        assert!(cpu > available_kib * 1024 / 2, "{row}");
    }
}

/// With repacked weights llama.cpp counts a tensor twice: the repacked copy, and the range of the
/// mapped file it was copied from. Those pages are read once at load and never again (the kernel
/// may drop them at no cost), so the memory a configuration holds counts the mapped buffer as the
/// pages inference read. A 0.6 GiB random-weight llama at Q4_0 (repacked on x86 CPUs with AVX2 and
/// on ARM with dot products): repacked and plain kernels hold the same memory. On a CPU where
/// llama.cpp repacks nothing both rows are plain loads, and the test checks what it can.
#[test]
fn repacked_weights_count_once_in_the_memory_a_configuration_holds() {
    let model = test_model("1b");
    let sb = Sandbox::new();
    let m = model_arg(&model);
    // The grid: both rows measured in full (the search would stop plain kernels early where they
    // are more than 1.75 times as slow, and report no memory for them).
    let mut args = vec![
        "tune",
        &m,
        "--json",
        "--no-save",
        "--exhaustive",
        "--kernels",
        "repack,plain",
    ];
    args.extend(SHORT_WORKLOAD);
    args.extend(FIXED_KNOBS);
    args.extend(["--budget", "120s"]);
    let r = sb.run_json(&args);
    let board = r["leaderboard"].as_array().unwrap();
    let held = |kernels: &str| -> u64 {
        (board.iter())
            .find(|e| e["candidate"]["kernels"] == kernels && !e["figures"].is_null())
            .and_then(|e| e["figures"]["mem_bytes"].as_u64())
            .unwrap_or_else(|| panic!("no measured {kernels} row: {board:#?}"))
    };
    let (repack, plain) = (held("repack"), held("plain"));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let file = std::fs::metadata(&model).unwrap().len();
    // Weights once (the file), KV cache and compute buffers: never the weights twice.
    assert!(
        repack < file + file / 3 && plain < file + file / 3,
        "repack {:.0} MiB, plain {:.0} MiB, file {:.0} MiB",
        mib(repack),
        mib(plain),
        mib(file)
    );
    assert!(
        (repack as f64 / plain as f64 - 1.0).abs() < 0.10,
        "repack {:.0} MiB against plain {:.0} MiB",
        mib(repack),
        mib(plain)
    );
    // What the worker measured (private memory grown plus the file's pages inference read) agrees
    // with the dry run's prediction, repacked or not.
    for row in (r["memory"].as_array().unwrap().iter()).filter(|m| m["loaded"] == true) {
        let cpu = |key: &str| {
            (row[key].as_array().unwrap().iter())
                .find(|d| d["device"] == "CPU")
                .and_then(|d| d["bytes"].as_u64())
                .unwrap_or_else(|| panic!("no CPU {key}: {row}"))
        };
        let (predicted, measured) = (cpu("predicted"), cpu("actual"));
        assert!(
            (measured as f64 / predicted as f64 - 1.0).abs() < 0.15,
            "measured {:.0} MiB against predicted {:.0} MiB: {row}",
            mib(measured),
            mib(predicted)
        );
    }
}

/// llama.cpp's dry-run prediction on RPC0 of every layer there (its fit's placement with nothing in
/// the way), at `ctx`.
fn rpc0_need(sb: &Sandbox, model: &str, rpc: &str, ctx: u32) -> u64 {
    let r = sb.run_json(&[
        "fit",
        model,
        "--rpc",
        rpc,
        "--ctx",
        &ctx.to_string(),
        "--json",
    ]);
    let layers = r["n_gpu_layers"].as_u64().unwrap();
    assert!(layers >= 5, "every layer of the tiny model offloaded: {r}");
    (r["predicted"].as_array().unwrap().iter())
        .find(|d| d["device"] == "RPC0")
        .and_then(|d| d["predicted_bytes"].as_u64())
        .unwrap_or_else(|| panic!("RPC0 in {r}"))
}

/// `tune MODEL --ctx max` on the RPC device under `budget`, one configuration's knobs, with
/// `[prompt, gen]`: the JSON report.
fn ctx_max_tune(
    sb: &Sandbox,
    model: &str,
    rpc: &str,
    budget: &str,
    [prompt, gen]: [&str; 2],
) -> serde_json::Value {
    sb.run_json(&[
        "tune",
        model,
        "--ctx",
        "max",
        "--rpc",
        rpc,
        "--mem-budget",
        budget,
        "--json",
        "--threads",
        "2",
        "--cache-types",
        "f16",
        "--kernels",
        "plain",
        "--flash-attn",
        "auto",
        "--ubatch",
        "512",
        "--prompt",
        prompt,
        "--gen",
        gen,
        "--min-reps",
        "2",
        "--max-reps",
        "2",
        "--budget",
        "60s",
    ])
}

#[test]
fn ctx_max_is_the_largest_context_that_keeps_every_layer_on_the_device() {
    let model = tiny_model();
    let m = model_arg(&model);
    let server = rpc_server();
    let rpc = server.endpoint();
    let sb = Sandbox::new();
    // A budget between what every layer needs at llama.cpp's fit minimum (4096) and at the model's
    // trained context (8192).
    let (low, high) = (
        rpc0_need(&sb, &m, &rpc, 4096),
        rpc0_need(&sb, &m, &rpc, 8192),
    );
    assert!(
        high > low + (1 << 20),
        "the KV cache grows with the context: {low} vs {high}"
    );
    let budget = (low + high) / 2;
    let r = ctx_max_tune(&sb, &m, &rpc, &format!("RPC0={budget}"), ["64", "16"]);
    let n = r["context"]["n_ctx"].as_u64().expect("the context chosen") as u32;
    assert_eq!(r["workload"]["n_ctx"], n, "tuned at the context chosen");
    assert_eq!(r["context"]["ceiling"], 8192);
    assert_eq!(r["context"]["whole"], true, "{}", r["context"]);
    assert!(n > 4096 && n < 8192 && n.is_multiple_of(256), "{n}");
    // The profile's server runs with it, and says why.
    let profile = std::fs::read_to_string(&sb.stored_profiles()[0]).unwrap();
    assert!(profile.contains(&format!("\"-c\", \"{n}\"")), "{profile}");
    assert!(
        profile.contains(&format!("--ctx max: {n} tokens, the most at which")),
        "{profile}"
    );
    // The largest: llama.cpp's dry run puts every layer within the budget at n, not at n + 256.
    assert!(rpc0_need(&sb, &m, &rpc, n) <= budget);
    assert!(rpc0_need(&sb, &m, &rpc, n + 256) > budget);
    let limit = r["context"]["limit"].as_str().unwrap();
    assert!(
        limit.starts_with(&format!("{}: needs", n + 256)) && limit.contains("on RPC0"),
        "{limit}"
    );
    // And at that context every layer on the device is measured, not pruned (on this machine's
    // loopback RPC device the host may still be faster: the winner is the measurements' to pick,
    // and a placement far slower than the best is stopped mid-repetition or after one).
    let layers = r["model"]["layers"].as_u64().unwrap();
    let board = r["leaderboard"].as_array().unwrap();
    assert!(
        board.iter().any(
            |e| e["candidate"]["n_gpu_layers"].as_u64() == Some(layers + 1)
                && (!e["figures"].is_null()
                    || e["status"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("stopped ")))
        ),
        "{board:?}"
    );

    // A mixture of experts whose experts do not fit beside the context: its trained context (2048)
    // with every expert in RAM and the rest on the device. 30 MiB holds every layer at 2048 tokens
    // only without the experts (about 15 MiB; 44 MiB with them, by the dry run of `measure`).
    let moe = model_arg(&tiny_moe_model());
    let r = ctx_max_tune(&sb, &moe, &rpc, "RPC0=30M", ["32", "8"]);
    let c = &r["context"];
    assert_eq!(c["experts_on_host"], true, "{c}");
    assert_eq!(
        (c["n_ctx"].as_u64(), c["whole"].as_bool()),
        (Some(2048), Some(true)),
        "{c}"
    );
    let board = r["leaderboard"].as_array().unwrap();
    assert!(
        board.iter().any(|e| e["candidate"]["n_gpu_layers"] == 5
            && e["candidate"]["n_cpu_moe"].as_u64().unwrap_or(0) > 0
            && !e["figures"].is_null()),
        "every layer offloaded with experts on the host, measured: {board:#?}"
    );

    // What --ctx max cannot be: a quantization ladder's files would each get their own context.
    let o = sb.run(&["tune", &m, "--ctx", "max", "--ladder"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--ctx max cannot be combined"),
        "{}",
        stderr(&o)
    );
}

/// A dry run maps nothing (as llama.cpp's own fit), yet it predicts the weights a real load maps
/// from the file (llama.cpp's breakdown of the host's weights): what may be paged where the host
/// alone runs a model larger than its RAM. With plain kernels every weight on the host is mapped.
#[test]
fn a_dry_run_predicts_the_weights_a_real_load_maps() {
    let model = demo_model();
    let sb = Sandbox::new();
    let v = sb.run_json(&[
        "measure",
        &model_arg(&model),
        "-c",
        "256",
        "-p",
        "16",
        "-n",
        "4",
        "--reps",
        "2",
        "-t",
        "2",
        "--kernels",
        "plain",
        "--predict",
        "--json",
    ]);
    let mapped = |report: &serde_json::Value| -> u64 {
        (report["buffers"].as_array().unwrap().iter())
            .filter(|b| b["buffer"] == "CPU_Mapped" && b["what"] == "model")
            .map(|b| b["bytes"].as_u64().unwrap())
            .sum()
    };
    let (predicted, loaded) = (mapped(&v["predicted"]), mapped(&v["load"]));
    assert!(loaded > 100 << 20, "{}", v["load"]);
    let off = predicted.abs_diff(loaded) as f64 / loaded as f64;
    assert!(off < 0.05, "predicted {predicted}, mapped {loaded}");
}
