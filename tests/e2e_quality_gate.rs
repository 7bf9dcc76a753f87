//! The KV-cache quality gate on the real demo model: a quantized cache that ties for the win (a
//! wide noise threshold makes every candidate a tie, and a tie goes to less memory) is measured
//! against the f16 cache, refused by a tight gate (the f16 cache wins, the refusal is in every
//! output) and accepted by a loose one, whose run reads the figures from the cache.

mod common;
use common::*;
use serde_json::Value;

/// The tune of one axis: the KV-cache pairs of f16 and q8_0 (f16/f16, q8_0/q8_0 and f16/q8_0 on
/// the CPU) with everything else pinned, a short workload, and every candidate tied (±50%).
fn tune_args(model: &str, gate: &str) -> Vec<String> {
    let fixed = "-t 2 --kernels repack --flash-attn on --ubatch 512 --cache-types f16,q8_0 \
                 --ctx 1024 --prompt 128 --gen 32 --noise 0.5 --budget 300s --seed 3 --json";
    let mut v = vec![model.to_string()];
    v.extend(fixed.split_whitespace().map(String::from));
    v.extend(["--max-kv-kld".to_string(), gate.to_string()]);
    v
}

fn lossy(c: &Value) -> bool {
    c["type_k"] != "f16" || c["type_v"] != "f16"
}

#[test]
fn a_quantized_cache_is_refused_by_a_tight_gate_and_accepted_by_a_loose_one() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let args = tune_args(m, "0.001");
    let tight = sb.run_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!lossy(&tight["winner"]), "{}", tight["winner"]);
    let q = &tight["quality"];
    assert_eq!(q["max_kv_kld"], 0.001);
    let checks = q["checks"].as_array().expect("checks");
    assert!(
        !checks.is_empty(),
        "a tied quantized cache was measured: {q}"
    );
    for c in checks {
        let kld = c["figures"]["kld_mean"].as_f64().expect("measured");
        assert!(kld > 0.001 && kld < 1.0, "{c}");
        assert!(c["figures"]["top1"].as_f64().unwrap() < 1.0, "{c}");
        assert_eq!(c["passed"], false, "{c}");
    }
    let board = tight["leaderboard"].as_array().unwrap();
    let refused: Vec<&Value> = (board.iter())
        .filter(|e| {
            e["status"]
                .as_str()
                .unwrap()
                .starts_with("refused: mean KLD")
        })
        .collect();
    assert!(!refused.is_empty(), "{board:?}");
    assert!(refused
        .iter()
        .all(|e| lossy(&e["candidate"]) && e["kv_kld"].is_number()));
    // The profile keeps the gate and its figures; explain says what was refused.
    let profile = std::fs::read_to_string(&sb.stored_profiles()[0]).unwrap();
    assert!(
        profile.contains("[quality]") && profile.contains("max_kv_kld = 0.001"),
        "{profile}"
    );
    let explain = sb.run(&["explain", m]);
    let text = stdout(&explain);
    assert!(text.contains("kv=f16/f16: lossless"), "{text}");
    assert!(text.contains("refused: mean KLD"), "{text}");

    // Loose: the same measurements (reused from the log), the same figures (from the quality
    // cache, not measured again): the tie goes to the quantized cache's smaller memory.
    let args = tune_args(m, "0.05");
    let loose = sb.run_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let w = &loose["winner"];
    assert!(lossy(w), "{w}");
    let checks = loose["quality"]["checks"].as_array().unwrap();
    let mine = (checks.iter())
        .find(|c| c["type_k"] == w["type_k"] && c["type_v"] == w["type_v"])
        .expect("the winner's pair was checked");
    assert_eq!(mine["passed"], true, "{mine}");
    assert_eq!(mine["cached"], true, "{mine}");
    let explain = stdout(&sb.run(&["explain", m]));
    assert!(explain.contains("within the gate (0.0500)"), "{explain}");
}

#[test]
fn without_the_gate_the_report_says_quality_was_not_checked() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let mut args = tune_args(m, "0.05");
    args.truncate(args.len() - 2);
    args.push("--no-quality-gate".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = sb.run_json(&args);
    let q = &out["quality"];
    assert_eq!(q["unchecked"], "--no-quality-gate");
    assert!(q["checks"].as_array().is_none_or(|c| c.is_empty()), "{q}");
    // The tie goes to less memory on speed alone: a quantized cache whose quality nobody measured.
    assert!(lossy(&out["winner"]), "{}", out["winner"]);
    let table: Vec<&str> = args.iter().copied().filter(|a| *a != "--json").collect();
    let text = stdout(&sb.run(&table));
    assert!(
        text.contains("quality NOT checked (--no-quality-gate)"),
        "{text}"
    );
}
