//! The KV-cache quality gate on the real demo model: a quantized cache wins only by being faster
//! than its lossless twin measured beside it (at the default noise threshold), and a tie goes to
//! the f16 cache; where a host memory budget
//! lets only a q8_0 cache fit, that cache is held to the gate (a tight gate refuses it, a loose one
//! accepts it from the quality cache), and its quality line reaches `show`, `apply` and `export`; a
//! profile without a record is flagged and one whose record does not parse is stale; a workload
//! deeper than 4,096 tokens is judged at its depth; a choice among quantizations holds the chosen
//! weights with the cache to `--max-kv-kld`; `verify` asks for facts at the server's context.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// One axis tuned, everything else pinned: the KV-cache pairs of f16 and q8_0 (f16/f16, q8_0/q8_0
/// and f16/q8_0 on the CPU), a short request at `ctx`, every candidate tied (±50%), the gate given.
/// The caches rotated, unless `extra` asks otherwise: an unrotated cache is a second pair held to
/// the gate, a second evaluation only the rotation's own test needs.
fn tune_args(model: &str, ctx: &str, gate: &str, extra: &[&str]) -> Vec<String> {
    let fixed = "-t 2 --kernels plain --flash-attn on --ubatch 512 --cache-types f16,q8_0 \
                 --prompt 128 --gen 32 --noise 0.5 --budget 300s --seed 3 --json";
    let mut v = vec![model.to_string(), "--ctx".into(), ctx.into()];
    v.extend(fixed.split_whitespace().map(String::from));
    if !extra.contains(&"--attn-rot") {
        v.extend(["--attn-rot".to_string(), "on".to_string()]);
    }
    v.extend(["--max-kv-kld".to_string(), gate.to_string()]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run(sb: &Sandbox, args: &[String]) -> Output {
    sb.run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn lossy(c: &Value) -> bool {
    c["type_k"] != "f16" || c["type_v"] != "f16"
}

/// The dry run's prediction of `model` on the host at `ctx` with a KV cache of `kv`, in bytes.
fn predicted(sb: &Sandbox, model: &str, ctx: &str, kv: &str) -> u64 {
    let v = sb.run_json(&[
        "measure",
        model,
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
        "-fa",
        "on",
        "--kernels",
        "plain",
        "--predict",
        "--json",
    ]);
    (v["predicted"]["per_device"].as_array().unwrap().iter())
        .find(|d| d["device"] == "CPU")
        .and_then(|d| d["bytes"].as_u64())
        .unwrap_or_else(|| panic!("a CPU prediction: {v}"))
}

/// [`q8_only_budget`] of the demo model alone, asked once for the tests that share it.
fn demo_q8_only_budget() -> String {
    static BUDGET: OnceLock<String> = OnceLock::new();
    BUDGET
        .get_or_init(|| {
            let model = demo_model();
            q8_only_budget(&Sandbox::new(), &[model.to_str().unwrap()])
        })
        .clone()
}

/// A host budget at 32,768 tokens that every model of `models` fits with a q8_0/q8_0 cache and
/// none with f16 for K or V (the f16/q8_0 pair needs about halfway between).
fn q8_only_budget(sb: &Sandbox, models: &[&str]) -> String {
    let q8 = (models.iter())
        .map(|m| predicted(sb, m, "32768", "q8_0"))
        .max()
        .unwrap();
    let f16 = (models.iter())
        .map(|m| predicted(sb, m, "32768", "f16"))
        .min()
        .unwrap();
    assert!(f16 > q8 + (32 << 20), "f16 {f16} vs q8_0 {q8}");
    format!("CPU={}", q8 + (f16 - q8) / 4)
}

/// At the default noise threshold: a quantized cache wins only by being faster beyond the noise
/// than its lossless twin (every other knob equal), measured beside it in the confirmation; where
/// the search's winner is lossless, no quantized cache is the run's. Every repetition a tune makes
/// is on the demo model, so which branch a run takes is the machine's: each says what it checks.
#[test]
fn a_quantized_cache_wins_only_beside_its_measured_lossless_twin() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let mut args = tune_args(m, "1024", "0.05", &[]);
    let at = args.iter().position(|a| a == "--noise").unwrap();
    args.drain(at..at + 2);
    let v = sb.run_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let board = v["leaderboard"].as_array().unwrap();
    assert!(
        board
            .iter()
            .any(|e| lossy(&e["candidate"]) && e["status"] == "ok"),
        "a quantized cache was measured: {board:?}"
    );
    let winner = &v["winner"];
    let twin = &v["lossless_twin"];
    if lossy(winner) {
        // Faster than its twin beyond the noise, both measured in the confirmation.
        assert_eq!(twin["chose_lossy"], true, "{twin}");
        assert!(twin["ratio"].as_f64().unwrap() > 0.0, "{twin}");
        let confirmed = v["confirmed"].as_array().unwrap();
        assert!(confirmed.iter().any(|c| !lossy(c)), "{confirmed:?}");
        eprintln!("the quantized cache won beside its twin: {twin}");
    } else {
        assert!(twin.is_null() || twin["chose_lossy"] == false, "{twin}");
        eprintln!("the lossless cache won: {winner} (twin: {twin})");
    }
    // Without the gate speed alone decides, and a quantized cache still must beat its twin.
    let mut args = tune_args(m, "1024", "0.05", &[]);
    args.truncate(args.len() - 2);
    args.push("--no-quality-gate".into());
    let out = run(&sb, &args);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(!lossy(&v["winner"]), "{}", v["winner"]);
    assert_eq!(v["quality"]["unchecked"], "--no-quality-gate");
}

#[test]
fn a_cache_that_alone_fits_is_held_to_the_gate_and_its_quality_follows_the_profile() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let budget = demo_q8_only_budget();
    let tight = run(
        &sb,
        &tune_args(m, "32768", "0.001", &["--mem-budget", &budget]),
    );
    assert_eq!(tight.status.code(), Some(4), "{}", stderr(&tight));
    assert!(
        stderr(&tight).contains("over the quality gate"),
        "{}",
        stderr(&tight)
    );

    // Loose: the same pair's figures from the quality cache, within the gate: it wins.
    let loose = run(
        &sb,
        &tune_args(m, "32768", "0.05", &["--mem-budget", &budget]),
    );
    assert!(loose.status.success(), "{}", stderr(&loose));
    let v: Value = serde_json::from_str(&stdout(&loose)).unwrap();
    let w = &v["winner"];
    assert_eq!(
        (&w["type_k"], &w["type_v"]),
        (&"q8_0".into(), &"q8_0".into())
    );
    let checks = v["quality"]["checks"].as_array().unwrap();
    let mine = (checks.iter())
        .find(|c| c["type_k"] == "q8_0" && c["type_v"] == "q8_0")
        .expect("the winner's pair was checked");
    assert_eq!(mine["passed"], true, "{mine}");
    assert_eq!(mine["cached"], true, "{mine}");
    let with = &mine["measured_with"];
    assert_eq!(
        (&with["backend"], &with["flash_attn"]),
        (&"CPU".into(), &"on".into())
    );
    assert!(with["llama"].as_str().unwrap().contains("build"), "{with}");

    // Where the profile is used: show, apply, export --format args.
    let line = "quality kv=q8_0/q8_0: mean KLD";
    let show = stdout(&sb.run(&["show", m]));
    assert!(
        show.contains(&format!("# {line}")) && show.contains("CPU, flash attention on"),
        "{show}"
    );
    let apply = sb.run(&["apply", m]);
    assert!(
        stderr(&apply).contains(&format!("autotune: {line}")),
        "{}",
        stderr(&apply)
    );
    let args = stdout(&sb.run(&["export", m, "--format", "args"]));
    assert!(args.starts_with(&format!("# {line}")), "{args}");
    for (format, comment) in [("presets", ";"), ("llama-swap", "#"), ("ollama", "#")] {
        let text = stdout(&sb.run(&["export", m, "--format", format]));
        assert!(
            text.contains(&format!("\n{comment} {line}")),
            "{format}: {text}"
        );
    }
    let explain = stdout(&sb.run(&["explain", m]));
    assert!(explain.contains("within the gate (0.0500)"), "{explain}");
    profiles_without_a_readable_record(&sb, m);
}

/// A copy of the stored profile without `[quality]` (as written before the gate) is flagged where
/// it is used; one whose `[quality]` does not parse is stale: refused with exit 5.
fn profiles_without_a_readable_record(sb: &Sandbox, model: &str) {
    let stored = &sb.stored_profiles()[0];
    let (mut p, _) =
        profiles::Profile::from_toml(&std::fs::read_to_string(stored).unwrap()).unwrap();
    p.quality = None;
    let pre_gate = sb.dir.path().join("pre-gate.toml");
    std::fs::write(&pre_gate, p.to_toml().unwrap()).unwrap();
    let pre = pre_gate.to_str().unwrap();
    let flag = format!("kv=q8_0/q8_0: quality never checked: run `autotune {model}` again");
    assert!(stdout(&sb.run(&["show", pre])).contains(&flag));
    let quiet = sb.run(&["-q", "apply", pre]);
    assert!(
        quiet.status.success() && stderr(&quiet).contains(&flag),
        "{}",
        stderr(&quiet)
    );
    assert!(stdout(&sb.run(&["export", pre, "--format", "args"])).contains(&flag));

    let text = std::fs::read_to_string(stored).unwrap();
    assert!(text.contains("\nwindow = 512\n"), "{text}");
    let broken = sb.dir.path().join("broken-quality.toml");
    std::fs::write(
        &broken,
        text.replace("\nwindow = 512\n", "\nwindow = \"deep\"\n"),
    )
    .unwrap();
    let o = sb.run(&["apply", broken.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("[quality] record does not parse"),
        "{}",
        stderr(&o)
    );
    let o = sb.run(&["show", broken.to_str().unwrap()]);
    assert!(
        o.status.success() && stderr(&o).contains("stale"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_workload_deeper_than_4096_tokens_is_judged_at_its_depth() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let budget = demo_q8_only_budget();
    let mut args = tune_args(
        m,
        "32768",
        "1",
        // Just past 4,096 (the depth is what is tested, not the speed: two repetitions).
        &[
            "--depth",
            "4200",
            "--mem-budget",
            &budget,
            "--min-reps",
            "2",
            "--max-reps",
            "2",
        ],
    );
    // The budget is a cap: on a busy 2-core machine the repetitions at depth and the evaluation
    // of two 4,608-token windows (twice each) take minutes.
    let at = args.iter().position(|a| a == "--budget").unwrap();
    args[at + 1] = "1500s".into();
    let v = sb.run_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(lossy(&v["winner"]), "{}", v["winner"]);
    let q = &v["quality"];
    // 4,200 deep, a 128-token prompt, 32 generated: windows of 4,608 tokens, the last 512 scored.
    assert_eq!(q["window"], 4608, "{q}");
    let check = &q["checks"][0];
    assert_eq!(check["passed"], true, "{check}");
    assert_eq!(
        check["figures"]["positions"], 1024,
        "two windows' last 512: {check}"
    );
    eprintln!("at depth 4200: {}", check["figures"]);
}

/// The demo model re-quantized to Q4_0 (made once, kept in the user's cache like the demo model).
fn demo_q4_0() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let model = demo_model();
        let o = Command::new(bin())
            .args(["quantize", model.to_str().unwrap(), "--types", "q4_0"])
            .args(["--allow-requantize", "--json"])
            .output()
            .expect("run autotune quantize");
        assert!(o.status.success(), "quantize failed: {}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON");
        PathBuf::from(v["files"][0]["path"].as_str().unwrap())
    })
    .clone()
}

#[test]
fn joint_mode_holds_the_chosen_weights_with_the_cache_to_max_kv_kld() {
    let sb = Sandbox::new();
    let (model, q4) = (demo_model(), demo_q4_0());
    let (m, q) = (model.to_str().unwrap(), q4.to_str().unwrap());
    let budget = q8_only_budget(&sb, &[m, q]);
    let joint = |gate: &str| {
        let extra = [
            "--reference",
            m,
            "--max-kld",
            "5",
            "--quality-tokens",
            "64",
            "--depth",
            "1000",
            "--mem-budget",
            &budget,
        ];
        run(&sb, &tune_args(q, "32768", gate, &extra))
    };
    let o = joint("1");
    assert!(o.status.success(), "{}\n{}", stderr(&o), stdout(&o));
    let stored = &sb.stored_profiles()[0];
    let (p, _) = profiles::Profile::from_toml(&std::fs::read_to_string(stored).unwrap()).unwrap();
    assert!(Path::new(&p.model.path).ends_with(q4.file_name().unwrap()));
    let record = p.quality.expect("[quality]");
    // At the workload's depth (1,000 + 128 + 32 tokens: windows of 1,536), the Q4_0 weights with
    // the q8_0 cache against the Q4_K_M reference, with the weights alone beside it.
    assert_eq!(record.window, 1536);
    let check = record.check(&p.winner).expect("checked");
    assert!(p.winner.kv_lossy() && check.passed, "{check:?}");
    assert_eq!(check.against.as_deref(), Some("Q4_K_M"), "{check:?}");
    let weights = check.weights_kld.expect("the weights alone");
    assert!(weights > 0.0 && check.kld().unwrap() > 0.0, "{check:?}");
    // The chosen rung's drift as it will run (what a tie between rungs goes by): the gate's figure
    // for these weights with that cache, not the weights' own.
    let v: Value = serde_json::from_str(&stdout(&o)).expect("the choice's report");
    let chosen = &v["quants"][v["chosen"].as_u64().expect("a choice") as usize];
    assert_eq!(chosen["total_kld"].as_f64(), check.kld(), "{chosen}");
    assert_ne!(chosen["total_kld"], chosen["kld"], "{chosen}");

    // A gate the cache cannot meet: the rung has no winner, and nothing is chosen; its row says
    // what the cache adds over the weights alone.
    let o = joint("0.00001");
    assert_eq!(o.status.code(), Some(4), "{}\n{}", stderr(&o), stdout(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("the choice's report");
    let status = v["quants"][0]["status"].as_str().unwrap();
    assert!(
        status.contains("refused: the cache adds mean KLD"),
        "{status}"
    );
}

#[test]
fn max_kv_kld_without_f16_or_with_no_gate_is_a_usage_error() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let o = sb.run(&[m, "--cache-types", "q8_0", "--max-kv-kld", "0.01"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("add f16 to --cache-types"),
        "{}",
        stderr(&o)
    );
    let o = sb.run(&[m, "--no-quality-gate", "--max-kv-kld", "0.01"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn verify_retrieves_facts_at_the_servers_context() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    // A quantized cache asked for as it is (no f16 to keep): verify asks with f16 too.
    let mut args = vec!["-q", m, "--ctx", "2048", "--budget", "60s"];
    args.extend_from_slice(&SHORT_WORKLOAD[2..]);
    args.extend_from_slice(&["-t", "2", "--cache-types", "q8_0", "--ubatch", "512"]);
    let o = sb.run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("quality NOT checked"), "{}", stdout(&o));
    let o = sb.run(&["verify", m, "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|_| panic!("{}", stderr(&o)));
    eprintln!("verify: {v}");
    assert_eq!(v["context"], 2048, "the server's context");
    assert_eq!(v["profile_kv"]["kv"], "q8_0/q8_0");
    assert_eq!(v["f16"]["kv"], "f16/f16");
    let lost = v["lost"].as_u64().unwrap();
    assert_eq!(o.status.code(), Some(if lost > 0 { 8 } else { 0 }), "{v}");
    assert!(
        v["f16"]["found"].as_u64().unwrap() >= 2,
        "the demo model retrieves at 90%: {v}"
    );
}

/// Attention rotation off (`LLAMA_ATTN_ROT_DISABLE=1`), a lossy knob, on the demo model: with
/// `--attn-rot off` every quantized cache runs unrotated, and under a host budget that only a
/// q8_0 cache fits, the unrotated q8_0 cache is the one measured, held to the gate unrotated (its
/// own figures, cached apart from the rotated pair's), and the winner; the profile's [quality]
/// keeps the check, and `apply` starts the server with the variable set and says its quality.
#[test]
fn an_unrotated_quantized_cache_is_held_to_the_gate_and_applied_with_its_variable() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let profile = sb.dir.path().join("rot.toml");
    let budget = demo_q8_only_budget();
    let args = tune_args(
        m,
        "32768",
        "0.05",
        &[
            "--attn-rot",
            "off",
            "--mem-budget",
            &budget,
            "-o",
            profile.to_str().unwrap(),
        ],
    );
    let v = sb.run_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let board = v["leaderboard"].as_array().unwrap();
    let unrotated = |c: &Value| lossy(c) && c["attn_rot"] == "off";
    assert!(
        board
            .iter()
            .any(|e| unrotated(&e["candidate"]) && e["status"] == "ok"),
        "an unrotated q8_0 cache was measured: {board:?}"
    );
    assert!(
        !board
            .iter()
            .any(|e| lossy(&e["candidate"]) && e["candidate"]["attn_rot"].is_null()),
        "no rotated quantized cache was loaded: {board:?}"
    );
    let checks = v["quality"]["checks"]
        .as_array()
        .expect("a pair was checked");
    let check = checks
        .iter()
        .find(|c| c["attn_rot"] == "off")
        .unwrap_or_else(|| panic!("the unrotated pair was checked: {}", v["quality"]));
    let kld = check["figures"]["kld_mean"].as_f64().expect("its figures");
    eprintln!("q8_0 unrotated: mean KLD {kld} ({})", check["passed"]);
    assert!(unrotated(&v["winner"]), "{}", v["winner"]);

    // apply sets the variable and says the quality of the unrotated pair.
    let out = sb.run(&["apply", profile.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stdout(&out);
    assert!(line.starts_with("LLAMA_ATTN_ROT_DISABLE=1 "), "{line}");
    assert!(line.contains("-ctk q8_0 -ctv q8_0"), "{line}");
    assert!(
        stderr(&out).contains("q8_0/q8_0 no-rot") || stderr(&out).contains("kld"),
        "the quality line of the unrotated pair: {}",
        stderr(&out)
    );
}
