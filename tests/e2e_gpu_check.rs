//! bench/gpu-check on this CPU machine: the script a GPU machine runs, with a loopback RPC device in
//! place of CUDA0 and the tiny test models, so every step but the GPU itself is tested before device
//! time is spent — and its resumption: the same command run again prints what is done and measures
//! nothing; a deadline leaves steps for the next run.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// Runs bench/gpu-check with the sandbox's cache (test model, state, profiles) and OUT dir.
fn gpu_check(sb: &Sandbox, args: &[&str]) -> (bool, String) {
    let tools = llama_server()
        .parent()
        .expect("the tools' bin dir")
        .to_path_buf();
    let out = Command::new(repo_root().join("bench/gpu-check"))
        .args(["--budget", "15s", "--out"])
        .arg(sb.dir.path().join("out"))
        .args(args)
        .env("AUTOTUNE_BIN", bin())
        .env("AUTOTUNE_CACHE_DIR", sb.cache())
        .env("AUTOTUNE_LLAMA_TOOLS", tools)
        .env("PYTHONUNBUFFERED", "1")
        .env_remove("OUT")
        .env_remove("LLAMA_BENCH")
        .output()
        .expect("run bench/gpu-check");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    (out.status.success(), text)
}

/// The lines of step `name` in the script's output, up to the next step.
fn section(text: &str, name: &str) -> String {
    let start = text
        .find(&format!("\n## {name}\n"))
        .unwrap_or_else(|| panic!("no step {name} in:\n{text}"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    rest[..end].to_string()
}

fn has(text: &str, wanted: &[&str]) {
    for w in wanted {
        assert!(text.contains(w), "`{w}` missing in:\n{text}");
    }
}

#[test]
fn gpu_check_runs_every_step_on_a_loopback_rpc_device_and_resumes() {
    let sb = Sandbox::new();
    let (ok, text) = gpu_check(&sb, &[]);
    assert!(ok, "bench/gpu-check failed:\n{text}");
    has(
        &text,
        &[
            "no NVIDIA GPU: loopback RPC device in its place",
            "## autotune doctor",
            "## tune-full",
            "winner: ",
            "the cliff (best tg per GPU-layer count):",
            "from every layer to the budget: tg ",
            "llama-bench: ",
            "autotune/llama-bench: pp ",
            "tg within ±5%: ",
            "llama.cpp's fit: ",
            "## apply",
            "llama-server: ",
            "## tune-default",
            "(the stand-in's --budget, in place of the default)",
            "quality gate: a quantized KV cache may add at most ",
            "## host-ffns",
            "a quarter of the weights less: llama.cpp's fit: -ngl ",
            "best --n-cpu-ffn in the tune: ",
            "best -ngl in the tune: ",
            "(tg is at depth 256: ",
            "## moe",
            "test-llama-tiny-moe-q4_0.gguf",
            "## ctx-max",
            "autotune --ctx max: ",
            "## parallel",
            "autotune/llama-batched-bench: pp ",
            "## backends",
            "one backend per GPU here (",
        ],
    );
    assert!(!text.contains("FAILED"), "a step failed:\n{text}");
    new_steps_printed(&text);
    // The cliff lists more than one GPU-layer count, RPC0 holding layers in some of them.
    let cliff: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("the cliff"))
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("ngl="))
        .collect();
    assert!(cliff.len() >= 2, "one placement in the cliff:\n{text}");
    outputs_written(&sb.dir.path().join("out"));
    resumed_from_state(&sb, &cliff);
}

/// The steps after the fit: both winners applied, the default tune, host FFNs, the MoE.
fn new_steps_printed(text: &str) {
    // Both winners' profiles reached llama-server, and its tg came back as a ratio.
    for winner in ["full", "budget"] {
        assert!(
            section(text, "apply")
                .lines()
                .any(|l| l.starts_with(&format!("  {winner} winner ("))
                    && l.contains("llama-server tg ")),
            "no {winner} winner applied:\n{text}"
        );
    }
    // The default tune printed its board and its cliff, and measured llama.cpp's fit beside it.
    let tuned = section(text, "tune-default");
    has(
        &tuned,
        &[
            "winner: ",
            "the cliff (best tg per GPU-layer count):",
            "autotune/fit: pp ",
        ],
    );
    // Host FFNs measured against whole layers: every layer of the tiny model (4 and the output)
    // offloaded with some FFNs on the host.
    let ffns = section(text, "host-ffns");
    assert!(
        ffns.lines()
            .any(|l| l.starts_with("best --n-cpu-ffn in the tune: ngl=5 ") && l.contains(" ncffn=")),
        "{ffns}"
    );
    has(&ffns, &["/-ngl "]);
    // The MoE's choice beside llama.cpp's fit under half of what it needs.
    has(
        &section(text, "moe"),
        &["budget ", "half of it", "autotune/fit: pp "],
    );
}

/// OUT holds the text, the budget tune's charts and the JSON with every step's figures.
fn outputs_written(out: &Path) {
    let file = std::fs::read_to_string(out.join("gpu-check.txt")).expect("OUT/gpu-check.txt");
    has(&file, &["the cliff (best tg per GPU-layer count):"]);
    for chart in ["budget-gpu-layers.svg", "budget-leaderboard.svg"] {
        assert!(Path::new(&out.join(chart)).is_file(), "{chart} not in OUT");
    }
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("gpu-check.json")).expect("OUT/gpu-check.json"),
    )
    .expect("gpu-check.json is JSON");
    assert!(
        json["fidelity"]["tg"].as_f64().is_some_and(|r| r > 0.0),
        "{json}"
    );
    assert!(
        json["parallel"]["tg_gain"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{json}"
    );
    for winner in ["full", "budget"] {
        assert!(
            json["apply"][winner]["tg_ratio"]
                .as_f64()
                .is_some_and(|r| r > 0.0),
            "{json}"
        );
    }
    assert!(
        json["host_ffns"]["n_cpu_ffn"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{json}"
    );
    assert!(
        json["moe"]["fit"]["tg"].as_f64().is_some_and(|r| r > 0.0),
        "{json}"
    );
    // The context found lies between llama.cpp's least fit context and the trained one, every layer
    // on the device (the budget was chosen between the two).
    let ctx = &json["ctx_max"];
    let (n, ceiling) = (
        ctx["n_ctx"].as_u64().unwrap_or(0),
        ctx["ceiling"].as_u64().unwrap_or(0),
    );
    assert!(n > 4096 && n < ceiling && ctx["whole"] == true, "{json}");
}

/// The same command again: every step comes from the state, the cliff lines with it.
fn resumed_from_state(sb: &Sandbox, cliff: &[&str]) {
    let started = std::time::Instant::now();
    let (ok, again) = gpu_check(sb, &[]);
    assert!(ok, "the second run failed:\n{again}");
    has(
        &again,
        &[
            "## tune-full (done in an earlier run)",
            "## fidelity (done in an earlier run)",
            "## tune-budget (done in an earlier run)",
            "## fit (done in an earlier run)",
            "## apply (done in an earlier run)",
            "## tune-default (done in an earlier run)",
            "## host-ffns (done in an earlier run)",
            "## moe (done in an earlier run)",
            "## ctx-max (done in an earlier run)",
            "## parallel (done in an earlier run)",
            "## backends (done in an earlier run)",
        ],
    );
    for line in cliff {
        assert!(again.contains(line), "`{line}` not repeated:\n{again}");
    }
    assert!(
        started.elapsed().as_secs() < 60,
        "the resumed run measured again: {:?}",
        started.elapsed()
    );
}

#[test]
fn a_deadline_leaves_the_steps_for_the_next_run() {
    let sb = Sandbox::new();
    let (ok, text) = gpu_check(&sb, &["--deadline", "1"]);
    assert!(ok, "bench/gpu-check failed:\n{text}");
    has(
        &text,
        &[
            "## model: SKIPPED",
            "run the same command again to continue",
        ],
    );
    assert!(!text.contains("## tune-full"), "{text}");
}
