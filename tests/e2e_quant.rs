//! End to end: choosing a quantization with a quality gate. Ladder discovery on a folder of small
//! GGUF files (some look like the model but are not), the quality comparison on the real demo model
//! through linked llama.cpp, and the joint choice's refusal when nothing passes the gate.

mod common;
use common::*;
use search_space::testfiles::{ggml, GgufBuilder};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Evaluation length for the tests: enough positions for a stable figure, short on 2 cores.
const TOKENS: &str = "64";

/// A small tuning run per quantization.
const SHORT_TUNE: &[&str] = &[
    "--ctx",
    "256",
    "--prompt",
    "32",
    "--gen",
    "8",
    "--min-reps",
    "2",
    "--max-reps",
    "3",
    "--seed",
    "7",
    "--threads",
    "2",
    "--kernels",
    "repack",
    "--flash-attn",
    "auto",
    "--ubatch",
    "512",
    "--cache-types",
    "f16,q8_0",
];

/// One tiny model of the "llama" architecture with the given file type, vocabulary and shape.
fn tiny(
    name: &str,
    file_type: u32,
    tensor_type: u32,
    vocab: &[&str],
    layers: u32,
    width: u64,
) -> GgufBuilder {
    GgufBuilder::new("llama")
        .kv_str("general.name", name)
        .kv_u32("general.file_type", file_type)
        .kv_u32("llama.block_count", layers)
        .kv_u32("llama.embedding_length", width as u32)
        .kv_u32("llama.attention.head_count", 4)
        .kv_str("tokenizer.ggml.model", "llama")
        .kv_array_str("tokenizer.ggml.tokens", vocab)
        .tensor(
            "token_embd.weight",
            tensor_type,
            &[width, vocab.len() as u64],
        )
        .tensor("output_norm.weight", ggml::F32, &[width])
}

#[test]
fn ladder_discovery_keeps_the_models_quantizations_and_says_why_look_alikes_are_left_out() {
    let sb = Sandbox::new();
    let d = sb.dir.path().join("models");
    std::fs::create_dir_all(&d).unwrap();
    let v = ["<s>", "</s>", "a", "b"];
    let w = |b: GgufBuilder, name: &str| b.write_to(&d.join(name)).unwrap();
    // The model's ladder.
    w(tiny("tiny", 15, ggml::Q4_K, &v, 2, 256), "tiny-Q4_K_M.gguf");
    w(tiny("tiny", 1, ggml::F16, &v, 2, 256), "tiny-F16.gguf");
    w(tiny("tiny", 7, ggml::Q8_0, &v, 2, 256), "tiny-Q8_0.gguf");
    // Look-alikes: same architecture, one thing differs each.
    w(tiny("tiny", 2, ggml::Q4_0, &v, 3, 256), "deeper-Q4_0.gguf");
    w(
        tiny(
            "tiny",
            2,
            ggml::Q4_0,
            &["<s>", "</s>", "a", "b", "c"],
            2,
            256,
        ),
        "bigger-vocab-Q4_0.gguf",
    );
    w(tiny("tiny", 2, ggml::Q4_0, &v, 2, 512), "wider-Q4_0.gguf");
    w(
        tiny("tiny-instruct", 2, ggml::Q4_0, &v, 2, 256),
        "finetune-Q4_0.gguf",
    );
    w(
        tiny("tiny", 7, ggml::Q8_0, &v, 2, 256),
        "tiny-copy-Q8_0.gguf",
    );
    std::fs::write(d.join("broken.gguf"), b"GGUF but not really").unwrap();
    std::fs::write(d.join("README.md"), b"not a model").unwrap();

    let model = d.join("tiny-Q4_K_M.gguf");
    let o = sb.run(&["quality", model.to_str().unwrap(), "--list", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let types: Vec<&str> = v["ladder"]["rungs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["file_type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["F16", "Q8_0", "Q4_K_M"], "most precise first");
    let rejected = v["ladder"]["rejected"].as_array().unwrap();
    let why = |file: &str| -> String {
        rejected
            .iter()
            .find(|r| r["path"].as_str().unwrap().ends_with(file))
            .unwrap_or_else(|| panic!("{file} not reported: {rejected:?}"))["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        why("deeper-Q4_0.gguf").contains("layer count"),
        "{}",
        why("deeper-Q4_0.gguf")
    );
    assert!(why("bigger-vocab-Q4_0.gguf").contains("vocabulary size"));
    assert!(why("wider-Q4_0.gguf").contains("embedding width"));
    assert!(why("finetune-Q4_0.gguf").contains("named 'tiny-instruct'"));
    assert!(why("tiny-copy-Q8_0.gguf").contains("same quantization"));
    assert!(why("broken.gguf").starts_with("not usable"));
    assert_eq!(
        rejected.len(),
        6,
        "README.md is not even considered: {rejected:?}"
    );

    // The table form says the same in words.
    let o = sb.run(&["quality", model.to_str().unwrap(), "--list"]);
    let text = stdout(&o);
    assert!(
        text.contains("considered  F16")
            && text.contains("left out")
            && text.contains("another model"),
        "{text}"
    );
}

/// The demo model re-quantized to Q4_0 (made once per test binary, kept in the cache like the demo).
fn demo_q4_0() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let model = demo_model();
        let o = Command::new(bin())
            .args([
                "quantize",
                model.to_str().unwrap(),
                "--types",
                "q4_0",
                "--allow-requantize",
                "--json",
            ])
            .output()
            .expect("run autotune quantize");
        assert!(o.status.success(), "quantize failed: {}", stderr(&o));
        assert!(
            stderr(&o).contains("warning: re-quantizing"),
            "a quantized source gets a warning: {}",
            stderr(&o)
        );
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
        let path = PathBuf::from(v["files"][0]["path"].as_str().unwrap());
        assert!(path.exists());
        path
    })
    .clone()
}

#[test]
fn quantizing_a_quantized_model_needs_allow_requantize() {
    let sb = Sandbox::new();
    let model = demo_model();
    let out = sb.dir.path().join("ladder");
    let o = sb.run(&[
        "quantize",
        model.to_str().unwrap(),
        "--types",
        "q8_0",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--allow-requantize"), "{}", stderr(&o));
    assert!(!out.join("gemma-3-270m-Q8_0.gguf").exists());
}

#[test]
fn the_kl_divergence_of_a_model_against_itself_is_zero() {
    let model = demo_model();
    let sb = Sandbox::new();
    let m = model.to_str().unwrap();
    let o = sb.run(&[
        "quality",
        m,
        "--quants",
        m,
        "--kv-types",
        "f16,q8_0",
        "--tokens",
        TOKENS,
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let q = &v["quality"];
    let weights = q["weights"].as_array().unwrap();
    assert_eq!(weights.len(), 1);
    let f = &weights[0]["figures"];
    assert_eq!(f["kld_mean"].as_f64(), Some(0.0), "{f}");
    assert_eq!(f["kld_max"].as_f64(), Some(0.0), "{f}");
    assert_eq!(f["top1"].as_f64(), Some(1.0), "{f}");
    assert!(f["positions"].as_u64().unwrap() >= 64);
    // A real difference does show: the same weights with a q8_0 KV cache.
    let kv = q["kv"].as_array().unwrap();
    let q8 = kv.iter().find(|r| r["kv"] == "q8_0").expect("q8_0 row");
    let k = q8["figures"]["kld_mean"].as_f64().unwrap();
    assert!(k > 0.0 && k < 0.1, "q8_0 KV cache KLD {k}");
    // A second run reads the cache.
    let o = sb.run(&[
        "quality",
        m,
        "--quants",
        m,
        "--kv-types",
        "f16",
        "--tokens",
        TOKENS,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["quality"]["weights"][0]["cached"], true);
}

#[test]
fn a_gate_nothing_passes_is_a_clear_error_and_no_profile() {
    let model = demo_model();
    let q4_0 = demo_q4_0();
    let sb = Sandbox::new();
    let mut args = vec![
        "tune",
        q4_0.to_str().unwrap(),
        "--reference",
        model.to_str().unwrap(),
        "--max-kld",
        "0.000001",
        "--quality-tokens",
        TOKENS,
        "--budget",
        "30s",
    ];
    args.extend_from_slice(SHORT_TUNE);
    let o = sb.run(&args);
    assert_eq!(o.status.code(), Some(4), "{}\n{}", stderr(&o), stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("no quantization passes the quality gate --max-kld"),
        "{err}"
    );
    assert!(
        err.contains("Q4_0") && err.contains("raise --max-kld"),
        "{err}"
    );
    assert!(err.contains("no profile was written"), "{err}");
    assert!(sb.stored_profiles().is_empty(), "no empty profile");
    // The table still shows what was measured.
    assert!(
        stdout(&o).contains("over the quality gate"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn joint_tune_chooses_among_quantizations_and_saves_the_winner() {
    let model = demo_model();
    let q4_0 = demo_q4_0();
    let sb = Sandbox::new();
    let mut args = vec![
        "tune",
        model.to_str().unwrap(),
        "--quants",
        q4_0.to_str().unwrap(),
        "--max-kld",
        "5",
        "--quality-tokens",
        TOKENS,
        "--budget",
        "100s",
        "--json",
    ];
    args.extend_from_slice(SHORT_TUNE);
    let o = sb.run(&args);
    assert!(o.status.success(), "{}\n{}", stderr(&o), stdout(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let quants = v["quants"].as_array().unwrap();
    assert_eq!(quants.len(), 2);
    assert_eq!(
        quants[0]["kld"].as_f64(),
        Some(0.0),
        "the reference (Q4_K_M, more precise) comes first"
    );
    let chosen = v["chosen"].as_u64().expect("a choice") as usize;
    assert_eq!(quants[chosen]["status"], "chosen");
    assert!(
        quants[chosen]["figures"]["tg_tps"].as_f64().is_some(),
        "the choice was measured: {quants:?}"
    );
    // On a busy machine a rung may get no measurement within its share of the budget; it says so.
    for q in quants {
        let measured = q["figures"]["tg_tps"].as_f64().is_some();
        assert!(
            measured || q["status"].as_str().unwrap().starts_with("not measured"),
            "{q}"
        );
        // A measured rung's drift as it will run: its weights' alone where its winner's cache is
        // f16, else the gate's figure for its weights with that cache.
        if measured {
            let (kld, total) = (q["kld"].as_f64().unwrap(), q["total_kld"].as_f64());
            let f16 = q["winner"]["type_k"] == "f16" && q["winner"]["type_v"] == "f16";
            match f16 {
                true => assert_eq!(total, Some(kld), "{q}"),
                false => assert!(total.is_some(), "{q}"),
            }
        }
    }
    let stored = sb.stored_profiles();
    assert_eq!(stored.len(), 1);
    let (profile, _) =
        profiles::Profile::from_toml(&std::fs::read_to_string(&stored[0]).unwrap()).unwrap();
    assert!(Path::new(&profile.model.path).ends_with(
        Path::new(quants[chosen]["path"].as_str().unwrap())
            .file_name()
            .unwrap()
    ));
    assert!(
        profile.notes.iter().any(|n| n.contains("--max-kld")),
        "{:?}",
        profile.notes
    );
}
