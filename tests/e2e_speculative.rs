//! End to end: speculative decoding with a draft model through the real binary on the real demo
//! model — drafts with another vocabulary are rejected with the reason, a real pair (the demo model
//! and a Q4_0 made from it) produces the target alone's output with the draft (up to near ties that
//! batched and one-token kernels round apart), a deliberately broken rollback is reported as a real
//! divergence, and `tune --draft` records the outcome in the profile. Then applied as measured:
//! `apply --exec --check-only` starts the vendor llama-server with a profile's n-gram, draft-model
//! and MTP (`draft-mtp`, a tiny model's own head) speculation and reads the server's own drafted and
//! accepted tokens back, and a server that refuses the profile's speculation is a one-line error
//! with its own exit code.

mod common;
use common::*;
use search_space::testfiles::{ggml, GgufBuilder};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The demo model quantized to Q4_0: a real draft with the same vocabulary. Made once per test
/// binary (quantizing takes a while on 2 cores) in a folder that lives as long as the process.
fn q4_0_draft(sb: &Sandbox) -> PathBuf {
    static DRAFT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = DRAFT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let model = demo_model();
        let o = sb.run(&[
            "quantize",
            model.to_str().unwrap(),
            "--types",
            "q4_0",
            "--allow-requantize",
            "--out-dir",
            dir.path().to_str().unwrap(),
            "--json",
        ]);
        assert!(
            o.status.success(),
            "quantize failed: {}\n{}",
            stderr(&o),
            stdout(&o)
        );
        let report: serde_json::Value =
            serde_json::from_str(&stdout(&o)).expect("quantize --json prints JSON");
        let path = PathBuf::from(
            report["files"][0]["path"]
                .as_str()
                .expect("a file was made"),
        );
        (dir, path)
    });
    path.clone()
}

/// Metadata of a GGUF file, each value as its type and encoded bytes (for copying a tokenizer).
fn gguf_metadata(path: &Path) -> Vec<(String, u32, Vec<u8>)> {
    let bytes = std::fs::read(path).expect("read model");
    let mut pos = 24usize;
    let u32_at = |p: usize| u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap());
    let u64_at = |p: usize| u64::from_le_bytes(bytes[p..p + 8].try_into().unwrap()) as usize;
    fn skip(bytes: &[u8], ty: u32, p: usize) -> usize {
        let u64_at = |p: usize| u64::from_le_bytes(bytes[p..p + 8].try_into().unwrap()) as usize;
        match ty {
            0 | 1 | 7 => p + 1,
            2 | 3 => p + 2,
            4..=6 => p + 4,
            10..=12 => p + 8,
            8 => p + 8 + u64_at(p),
            9 => {
                let et = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap());
                let n = u64_at(p + 4);
                (0..n).fold(p + 12, |q, _| skip(bytes, et, q))
            }
            _ => panic!("unknown GGUF value type {ty}"),
        }
    }
    let n_kv = u64_at(16);
    let mut out = Vec::new();
    for _ in 0..n_kv {
        let len = u64_at(pos);
        let key = String::from_utf8(bytes[pos + 8..pos + 8 + len].to_vec()).unwrap();
        pos += 8 + len;
        let ty = u32_at(pos);
        let end = skip(&bytes, ty, pos + 4);
        out.push((key, ty, bytes[pos + 4..end].to_vec()));
        pos = end;
    }
    out
}

/// A tiny zero-weight gemma3 carrying the demo model's tokenizer, with token `changed` renamed.
fn gemma3_with_renamed_token(demo: &Path, changed: usize, out: &Path) {
    let mut b = GgufBuilder::new("gemma3")
        .kv_str("general.name", "renamed-token draft")
        .kv_u32("general.file_type", 1)
        .kv_u32("gemma3.context_length", 2048)
        .kv_u32("gemma3.embedding_length", 64)
        .kv_u32("gemma3.block_count", 1)
        .kv_u32("gemma3.feed_forward_length", 128)
        .kv_u32("gemma3.attention.head_count", 1)
        .kv_u32("gemma3.attention.head_count_kv", 1)
        .kv_u32("gemma3.attention.key_length", 64)
        .kv_u32("gemma3.attention.value_length", 64)
        .kv_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6);
    let mut n_vocab = 0u64;
    for (key, ty, value) in gguf_metadata(demo)
        .into_iter()
        .filter(|(k, _, _)| k.starts_with("tokenizer."))
    {
        let value = if key == "tokenizer.ggml.tokens" {
            // array of strings: elem type, count, then (len, bytes) each
            let count = u64::from_le_bytes(value[4..12].try_into().unwrap());
            n_vocab = count;
            let mut p = 12usize;
            let mut v = value[..12].to_vec();
            for i in 0..count as usize {
                let len = u64::from_le_bytes(value[p..p + 8].try_into().unwrap()) as usize;
                let text: &[u8] = if i == changed {
                    b"<renamed by the test>"
                } else {
                    &value[p + 8..p + 8 + len]
                };
                v.extend_from_slice(&(text.len() as u64).to_le_bytes());
                v.extend_from_slice(text);
                p += 8 + len;
            }
            v
        } else {
            value
        };
        b = b.kv_raw(&key, ty, &value);
    }
    b = b
        .tensor("token_embd.weight", ggml::F16, &[64, n_vocab])
        .tensor("output_norm.weight", ggml::F32, &[64]);
    b.write_to(out).unwrap();
}

fn draft_report(sb: &Sandbox, args: &[&str]) -> serde_json::Value {
    draft_report_with(sb, args, None)
}

/// `autotune draft --json`, with the draft loop's test fault when given.
fn draft_report_with(sb: &Sandbox, args: &[&str], fault: Option<&str>) -> serde_json::Value {
    let mut cmd = sb.cmd();
    match fault {
        Some(f) => cmd.env("AUTOTUNE_SPECULATIVE_FAULT", f),
        None => cmd.env_remove("AUTOTUNE_SPECULATIVE_FAULT"),
    };
    let o = cmd.args(args).output().expect("run autotune");
    assert!(
        o.status.success(),
        "autotune draft failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    serde_json::from_str(&stdout(&o)).expect("--json prints JSON")
}

#[test]
fn drafts_with_another_vocabulary_are_rejected_with_the_reason() {
    let demo = demo_model();
    let sb = Sandbox::new();
    // Another tokenizer altogether (4 tokens): rejected from the header, before llama.cpp reads it.
    let tiny = sb.dir.path().join("tiny-llama.gguf");
    GgufBuilder::tiny_model("llama").write_to(&tiny).unwrap();
    // The same tokenizer but one token's text changed: rejected by llama.cpp's own rule (vocab-only load).
    let renamed = sb.dir.path().join("renamed-token.gguf");
    gemma3_with_renamed_token(&demo, 1000, &renamed);

    let r = draft_report(
        &sb,
        &[
            "draft",
            demo.to_str().unwrap(),
            "--draft",
            &format!("{},{}", tiny.display(), renamed.display()),
            "--json",
            "--no-ngram",
            "-t",
            "2",
            "--ctx",
            "512",
        ],
    );
    let drafts = r["drafts"].as_array().unwrap();
    assert_eq!(drafts.len(), 2, "{r:#}");
    let status = |i: usize| drafts[i]["status"].as_str().unwrap().to_string();
    assert!(status(0).starts_with("incompatible:"), "{}", status(0));
    assert!(
        status(0).contains("vocabulary sizes differ") || status(0).contains("tokenizers differ"),
        "{}",
        status(0)
    );
    assert!(status(1).starts_with("incompatible:"), "{}", status(1));
    assert!(status(1).contains("token 1000 differs"), "{}", status(1));
    assert!(r["winner"].is_null());
    assert!(
        r["conclusion"].as_str().unwrap().starts_with("no draft"),
        "{}",
        r["conclusion"]
    );
    // Nothing was generated: no compatible draft, so the search never started.
    assert!(r["baseline"].is_null());
}

/// The measured draft trials of the first draft, with the run's figures on stderr (acceptance, near
/// ties, how far rounding moved the gaps between logits).
fn measured_trials(r: &serde_json::Value) -> Vec<serde_json::Value> {
    let d = &r["drafts"][0];
    assert_eq!(d["status"], "measured", "{d:#}");
    let measured: Vec<serde_json::Value> = d["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["failure"].is_null() && t["skipped"].is_null())
        .cloned()
        .collect();
    for t in &measured {
        eprintln!(
            "{} {}: acceptance {:.2}, same_output {}, near ties {}, max margin shift {:.3}, divergence {}",
            t["stage"],
            t["params"],
            t["acceptance"].as_f64().unwrap_or(0.0),
            t["same_output"],
            t["near_ties"].as_array().map_or(0, Vec::len),
            t["max_margin_shift"].as_f64().unwrap_or(0.0),
            t["divergence"]
        );
    }
    measured
}

#[test]
fn output_with_a_draft_is_the_target_alones_up_to_near_ties() {
    let demo = demo_model();
    let sb = Sandbox::new();
    let draft = q4_0_draft(&sb);
    let r = draft_report(
        &sb,
        &[
            "draft",
            demo.to_str().unwrap(),
            "--draft",
            draft.to_str().unwrap(),
            "--json",
            "--no-ngram",
            // One thread: on a busy machine two spinning threads wait for each other far longer
            // than one thread computes.
            "-t",
            "1",
            "--ctx",
            "1024",
            "--draft-max",
            "4",
            "--draft-p-min",
            "0,0.8",
            "--draft-min",
            "0",
            "--draft-gen",
            "8",
            "--draft-reps",
            "2",
            "--draft-budget",
            "15m",
            "--seed",
            "3",
        ],
    );
    assert!(
        r["prompts"].as_array().unwrap().len() >= 8,
        "several prompts of several kinds"
    );
    assert!(
        !r["baseline"]["tg_tps"].as_array().unwrap().is_empty(),
        "the target alone was measured: {r:#}"
    );
    let d = &r["drafts"][0];
    assert!(
        d["mem_bytes"].as_u64().unwrap() > 100 << 20,
        "the draft's memory is counted: {d:#}"
    );
    let measured = measured_trials(&r);
    assert!(measured.len() >= 2, "{d:#}");
    let threshold = r["near_tie_nats"].as_f64().expect("the near-tie threshold");
    // A near tie is rounding, not a licence: under a factor of e^2 in probability either way.
    assert!(threshold > 0.0 && threshold <= 2.0, "{threshold}");
    assert!(r["fault"].is_null());
    for t in &measured {
        // Greedy decoding: the draft changes the speed, never the text — except where the target's
        // best tokens nearly tie and its batched kernels round the other way than its one-token ones
        // (which kernels llama.cpp runs depends on the CPU variant it picked).
        match t["same_output"].as_str() {
            Some("identical") => assert_eq!(t["identical"], true, "{t:#}"),
            Some("near-ties") => {
                let ties = t["near_ties"].as_array().expect("the near ties");
                assert!(!ties.is_empty(), "{t:#}");
                for n in ties {
                    assert!(n["margin"].as_f64().unwrap() < threshold, "{t:#}");
                }
            }
            _ => panic!("output differs with the draft: {t:#}"),
        }
        assert!(t["divergence"].is_null(), "{t:#}");
        let acceptance = t["acceptance"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acceptance), "{t:#}");
        assert!(t["tokens_per_round"].as_f64().unwrap() >= 1.0, "{t:#}");
    }
    // The draft's placement is searched too: its own KV-cache type beside the target's f16.
    assert!(
        measured
            .iter()
            .any(|t| t["stage"] == "placement" && t["placement"]["type_k"] == "q8_0"),
        "{d:#}"
    );
    // A Q4_0 of the same model agrees with it most of the time when it drafts unconditionally.
    let p0 = measured
        .iter()
        .find(|t| t["params"]["p_min"].as_f64() == Some(0.0))
        .expect("a p_min 0 trial");
    assert!(p0["acceptance"].as_f64().unwrap() > 0.3, "{p0:#}");
    assert!(p0["per_kind"].as_array().unwrap().len() >= 4, "{p0:#}");
    assert!(!r["conclusion"].as_str().unwrap().is_empty());
}

/// The check must still catch a real bug: with a rollback that leaves the first rejected draft token
/// in the target's KV cache (positions carry on after it, so llama.cpp accepts the sequence), the
/// target attends to text that is not there, and that is reported as a real divergence — not as a
/// near tie — and disqualifies the draft.
#[test]
fn a_broken_rollback_is_reported_as_a_real_divergence() {
    let demo = demo_model();
    let sb = Sandbox::new();
    let draft = q4_0_draft(&sb);
    let r = draft_report_with(
        &sb,
        &[
            "draft",
            demo.to_str().unwrap(),
            "--draft",
            draft.to_str().unwrap(),
            "--json",
            "--no-ngram",
            "-t",
            "1",
            "--ctx",
            "1024",
            "--draft-max",
            "4",
            "--draft-p-min",
            "0",
            "--draft-min",
            "0",
            "--draft-gen",
            "16",
            "--draft-reps",
            "2",
            "--draft-budget",
            "15m",
            "--seed",
            "3",
        ],
        Some("keep-one-rejected-cell"),
    );
    assert_eq!(r["fault"], "keep-one-rejected-cell", "{r:#}");
    let threshold = r["near_tie_nats"].as_f64().expect("the near-tie threshold");
    let measured = measured_trials(&r);
    assert!(!measured.is_empty(), "{r:#}");
    for t in &measured {
        assert!(
            t["acceptance"].as_f64().unwrap() < 1.0,
            "a rejected draft token is needed to show the fault: {t:#}"
        );
        assert_eq!(
            t["same_output"], "differs",
            "a broken rollback passed the output check: {t:#}"
        );
        assert_eq!(t["identical"], false, "{t:#}");
        let d = &t["divergence"];
        assert!(
            d["prompt"].is_string() && d["token"].as_u64().unwrap() > 0,
            "the first token comes from the prompt alone, before any draft: {t:#}"
        );
        // Not a near tie: the gap between the two tokens moved by more than rounding does (or the
        // alone's token was not even among the draft path's best).
        let moved = d["ours_margin"].as_f64().unwrap() + d["alone_margin"].as_f64().unwrap_or(0.0);
        assert!(
            moved >= threshold || d["reason"].as_str().unwrap().contains("not among"),
            "{t:#}"
        );
    }
    assert!(r["winner"].is_null(), "a broken draft never wins: {r:#}");
}

#[test]
fn tune_with_a_draft_records_the_outcome_in_the_profile() {
    let demo = demo_model();
    let sb = Sandbox::new();
    let draft = q4_0_draft(&sb);
    let out_file = sb.dir.path().join("profile.toml");
    // Two prompts of two kinds keep the draft search short; the built-in set is measured above.
    let prompts = sb.dir.path().join("prompts.toml");
    std::fs::write(
        &prompts,
        "[[prompt]]\nname = \"loop\"\nkind = \"code\"\ntext = \"def count(n):\\n    for i in range(n):\\n\"\n\n\
         [[prompt]]\nname = \"days\"\nkind = \"repetitive\"\ntext = \"Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,\"\n",
    )
    .unwrap();
    let mut args = vec![
        "tune",
        demo.to_str().unwrap(),
        "--out",
        out_file.to_str().unwrap(),
        "--no-save",
    ];
    args.extend_from_slice(SHORT_WORKLOAD);
    // One thread (on a busy machine two spinning threads wait for each other far longer than one
    // computes) and one KV type: the tuning itself is not what this test is about.
    args.extend_from_slice(&[
        "--threads",
        "1",
        "--cache-types",
        "f16",
        "--flash-attn",
        "auto",
        "--ubatch",
        "512",
        "--budget",
        "30s",
        "--draft-prompts",
        prompts.to_str().unwrap(),
        "--draft",
        draft.to_str().unwrap(),
        "--draft-max",
        "4",
        "--draft-p-min",
        "0",
        "--draft-min",
        "0",
        "--draft-gen",
        "12",
        "--draft-reps",
        "2",
    ]);
    let o = sb.run(&args);
    assert!(
        o.status.success(),
        "autotune failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    let text = std::fs::read_to_string(&out_file).unwrap();
    let (profile, unknown) = profiles::Profile::from_toml(&text).expect("profile parses");
    assert!(unknown.is_empty(), "{unknown:?}");
    profile.validate(true).expect("profile validates");
    match &profile.draft {
        Some(d) => {
            // The server runs the measured draft: its flags follow the target's.
            let a = &profile.server_args;
            let pos = a
                .iter()
                .position(|x| x == "-md")
                .expect("-md in server_args");
            assert_eq!(Path::new(&a[pos + 1]), draft.canonicalize().unwrap());
            assert!(
                a.windows(2).any(|w| w == ["--spec-draft-n-max", "4"]),
                "{a:?}"
            );
            assert!(
                a.windows(2).any(|w| w == ["--spec-type", "draft-simple"]),
                "{a:?}"
            );
            assert!(d.tg_tps > d.baseline_tg_tps, "{d:?}");
            assert!(
                profile
                    .notes
                    .iter()
                    .any(|n| n.starts_with("speculative decoding pays")),
                "{:?}",
                profile.notes
            );
        }
        None => {
            // No draft paid: the profile says so, with the numbers, and the server runs without one.
            let note = profile
                .notes
                .iter()
                .find(|n| n.starts_with("no draft pays"))
                .unwrap_or_else(|| panic!("{:?}", profile.notes));
            assert!(
                note.contains("t/s") && note.contains("acceptance"),
                "{note}"
            );
            assert!(!profile.server_args.iter().any(|x| x == "-md"));
        }
    }
}

/// A copy of the demo model alone in a folder (hard link where it can), so `autotune draft` finds no
/// draft model beside it.
fn lone_demo(sb: &Sandbox) -> PathBuf {
    let lone = sb.dir.path().join("lone");
    std::fs::create_dir_all(&lone).unwrap();
    let to = lone.join("demo.gguf");
    if std::fs::hard_link(demo_model(), &to).is_err() {
        std::fs::copy(demo_model(), &to).unwrap();
    }
    to
}

/// Text that repeats (where n-gram lookup drafts) and a chat turn (where it rarely does).
fn ngram_prompts(sb: &Sandbox) -> PathBuf {
    let prompts = sb.dir.path().join("ngram-prompts.toml");
    std::fs::write(
        &prompts,
        "[[prompt]]\nname = \"days\"\nkind = \"repetitive\"\ntext = \"Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday,\"\n\n\
         [[prompt]]\nname = \"hello\"\nkind = \"chat\"\ntext = \"User: What is a good name for a cat?\\nAssistant:\"\n",
    )
    .unwrap();
    prompts
}

fn ngram_args<'a>(target: &'a Path, prompts: &'a Path) -> Vec<&'a str> {
    vec![
        "draft",
        target.to_str().unwrap(),
        "--json",
        "-t",
        "1",
        "--ctx",
        "1024",
        "--ngram-n",
        "2",
        "--ngram-m",
        "8",
        "--draft-gen",
        "32",
        "--draft-reps",
        "2",
        "--draft-budget",
        "15m",
        "--draft-prompts",
        prompts.to_str().unwrap(),
        "--seed",
        "3",
    ]
}

/// With no draft model anywhere, `autotune draft` measures n-gram speculation: it drafts on repeated
/// text, its output passes the same identity check as a draft model's, and the report says per
/// prompt kind how fast it went against the target alone.
#[test]
fn ngram_speculation_needs_no_draft_model_and_keeps_the_output() {
    let sb = Sandbox::new();
    let target = lone_demo(&sb);
    let prompts = ngram_prompts(&sb);
    let r = draft_report(&sb, &ngram_args(&target, &prompts));
    let drafts = r["drafts"].as_array().unwrap();
    assert_eq!(drafts.len(), 1, "only n-gram: {r:#}");
    assert_eq!(drafts[0]["spec_type"], "ngram-simple", "{r:#}");
    assert_eq!(
        r["mtp"]["heads"], 0,
        "the demo model has no MTP heads: {r:#}"
    );
    assert!(r["mtp"]["note"]
        .as_str()
        .unwrap()
        .starts_with("no MTP heads"));
    let measured = measured_trials(&r);
    assert!(!measured.is_empty(), "{r:#}");
    for t in &measured {
        assert_eq!(t["ngram"]["size_n"], 2, "{t:#}");
        assert_ne!(t["same_output"], "differs", "{t:#}");
        let kind = |k: &str| {
            t["per_kind"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["kind"] == k)
                .cloned()
                .unwrap()
        };
        assert!(
            kind("repetitive")["accepted"].as_u64().unwrap() > 0,
            "n-gram lookup drafts repeated text: {t:#}"
        );
        assert!(kind("chat")["tg_tps"].as_f64().unwrap() > 0.0, "{t:#}");
    }
    if let Some(w) = r["winner"].as_object() {
        assert_eq!(w["ngram"]["size_m"], 8, "{r:#}");
    }
}

/// The identity check applies to n-gram speculation too: a broken rollback is caught.
#[test]
fn a_broken_rollback_under_ngram_speculation_is_caught() {
    let sb = Sandbox::new();
    let target = lone_demo(&sb);
    // Code that repeats with changes: n-gram drafts are often wrong part way, and rejected.
    let prompts = sb.dir.path().join("code.toml");
    std::fs::write(
        &prompts,
        "[[prompt]]\nname = \"list\"\nkind = \"code\"\ntext = \"fruits = [\\\"apple\\\", \\\"banana\\\", \\\"cherry\\\"]\\nfor fruit in fruits:\\n    print(fruit)\\nvegetables = [\\\"carrot\\\", \\\"potato\\\", \\\"onion\\\"]\\nfor\"\n",
    )
    .unwrap();
    let mut args = ngram_args(&target, &prompts);
    let gen = args.iter().position(|a| *a == "--draft-gen").unwrap() + 1;
    args[gen] = "64";
    let r = draft_report_with(&sb, &args, Some("keep-one-rejected-cell"));
    let measured = measured_trials(&r);
    let rejected: Vec<&serde_json::Value> = measured
        .iter()
        .filter(|t| t["acceptance"].as_f64().unwrap() < 1.0)
        .collect();
    assert!(
        !rejected.is_empty(),
        "a rejected draft token is needed: {r:#}"
    );
    for t in rejected {
        assert_eq!(t["same_output"], "differs", "{t:#}");
    }
    assert!(r["winner"].is_null(), "a broken loop never wins: {r:#}");
}

/// Repeated text only (the days of the week): where n-gram lookup drafts, and the cheapest prompt set
/// for a draft search.
fn days_prompts(sb: &Sandbox) -> PathBuf {
    let prompts = sb.dir.path().join("days.toml");
    std::fs::write(
        &prompts,
        "[[prompt]]\nname = \"days\"\nkind = \"repetitive\"\ntext = \"Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday,\"\n",
    )
    .unwrap();
    prompts
}

/// A profile of the demo model tuned for the agent workload on text that repeats: the user's path to
/// n-gram speculation (`tune --workload agent` measures it after tuning and keeps it when it pays).
/// Tuned once per test binary, in a folder that lives as long as the process.
fn ngram_profile() -> PathBuf {
    static PROFILE: OnceLock<(Sandbox, PathBuf)> = OnceLock::new();
    let (_, path) = PROFILE.get_or_init(|| {
        let sb = Sandbox::new();
        let demo = demo_model();
        let out = sb.dir.path().join("agent.toml");
        let prompts = days_prompts(&sb);
        let mut args = vec![
            "tune",
            demo.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--no-save",
            "--workload",
            "agent",
            "--depth",
            "0",
            // SHORT_WORKLOAD with a larger context: room for the check's prompt and 64 tokens.
            "--ctx",
            "512",
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
        ];
        args.extend_from_slice(&[
            "--threads",
            "1",
            "--cache-types",
            "f16",
            "--flash-attn",
            "auto",
            "--ubatch",
            "512",
            "--budget",
            "30s",
            "--draft-prompts",
            prompts.to_str().unwrap(),
            "--ngram-n",
            "2",
            "--ngram-m",
            "8",
            "--draft-gen",
            "32",
            "--draft-reps",
            "2",
        ]);
        let o = sb.run(&args);
        assert!(
            o.status.success(),
            "autotune tune failed: {}\n{}",
            stderr(&o),
            stdout(&o)
        );
        (sb, out)
    });
    path.clone()
}

/// `autotune apply PROFILE --exec --check-only --json` with the vendor llama-server (or `server`).
fn apply_check(sb: &Sandbox, profile: &Path, server: Option<&Path>) -> std::process::Output {
    let server = server.map_or_else(llama_server, Path::to_path_buf);
    sb.run(&strs(&apply_check_args(profile, &server)))
}

/// The server's own figures from `apply --json`, checked for consistency with its `completion`
/// timings; (drafted, accepted).
fn servers_speculation(v: &serde_json::Value, spec_type: &str) -> (u64, u64) {
    let c = &v["completion"];
    let s = &v["speculation"];
    assert_eq!(s["spec_type"], spec_type, "{v:#}");
    let (drafted, accepted) = (
        c["draft_n"].as_u64().expect("draft_n in the timings"),
        c["draft_n_accepted"].as_u64().expect("draft_n_accepted"),
    );
    assert_eq!(s["drafted"], drafted, "{v:#}");
    assert_eq!(s["accepted"], accepted, "{v:#}");
    assert!(accepted <= drafted, "{v:#}");
    assert!(c["predicted_n"].as_u64().unwrap() >= 32, "{v:#}");
    if drafted > 0 {
        let a = s["acceptance"].as_f64().unwrap();
        assert!((a - accepted as f64 / drafted as f64).abs() < 1e-9, "{v:#}");
    }
    eprintln!(
        "{spec_type}: the server drafted {drafted} tokens and accepted {accepted} on the {} prompt \
         ({} t/s); the profile measured {:.0}% acceptance",
        s["prompt"],
        c["predicted_per_second"],
        s["profile_acceptance"].as_f64().unwrap() * 100.0
    );
    (drafted, accepted)
}

/// `apply --exec --check-only` (text) of `profile` prints one speculation line for `spec_type`
/// with the server's drafted and accepted tokens.
fn text_report_says(sb: &Sandbox, profile: &Path, spec_type: &str) {
    let o = sb.run(&[
        "apply",
        profile.to_str().unwrap(),
        "--exec",
        "--check-only",
        "--server",
        llama_server().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("speculation {spec_type} on the ")))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("drafted tokens accepted"), "{line}");
    eprintln!("{line}");
}

/// Whether a figure `apply --json` printed is the profile's `expected`. serde_json's default float
/// parser may land one unit in the last place off the printed value (exact parsing is its
/// `float_roundtrip` feature), so equal means equal to 12 significant digits.
fn same_figure(printed: &serde_json::Value, expected: f64) -> bool {
    printed
        .as_f64()
        .is_some_and(|x| (x - expected).abs() <= 1e-12 * expected.abs().max(1.0))
}

/// The profile `tune --workload agent` wrote speculates with n-grams, and llama-server started with it
/// drafts: its own `timings.draft_n` comes back through `apply --json` and the text report.
#[test]
fn apply_runs_a_tuned_ngram_profile_and_reads_the_servers_acceptance() {
    let profile = ngram_profile();
    let text = std::fs::read_to_string(&profile).unwrap();
    let (p, _) = profiles::Profile::from_toml(&text).expect("profile parses");
    let n = p.ngram.as_ref().unwrap_or_else(|| {
        panic!(
            "n-gram speculation did not pay on repeated text, so the profile has none: {:?}",
            p.notes
        )
    });
    assert_eq!((n.size_n, n.size_m), (2, 8), "{n:?}");

    let sb = Sandbox::new();
    let o = apply_check(&sb, &profile, None);
    assert!(
        o.status.success(),
        "apply --exec failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let command = command_of(&v);
    assert!(
        command
            .windows(2)
            .any(|w| w == ["--spec-type", "ngram-simple"]),
        "{command:?}"
    );
    assert!(
        command
            .windows(2)
            .any(|w| w == ["--spec-ngram-simple-size-n", "2"]),
        "{command:?}"
    );
    let (drafted, _) = servers_speculation(&v, "ngram-simple");
    assert!(drafted > 0, "llama-server drafted nothing: {v:#}");
    assert_eq!(v["speculation"]["prompt_kind"], "repetitive", "{v:#}");
    // Compared with the speed the profile measured with the speculation, not the target alone's.
    assert!(same_figure(&v["profile_tg_tps"], n.tg_tps), "{v:#}");

    // The text report says the same in one line.
    text_report_says(&sb, &profile, "ngram-simple");
}

/// The `[draft]` table of the fastest measured setting of `autotune draft --json`'s first draft: what
/// a user who wants a draft that did not pay here writes into a profile.
fn draft_table(r: &serde_json::Value, draft: &Path) -> String {
    let median = |xs: &serde_json::Value| {
        let mut v: Vec<f64> = xs
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let d = &r["drafts"][0];
    let best = measured_trials(r)
        .into_iter()
        .max_by(|a, b| median(&a["tg_tps"]).total_cmp(&median(&b["tg_tps"])))
        .expect("a measured setting");
    let id = search_space::identity::ModelIdentity::of_file(draft).unwrap();
    format!(
        "\n[draft]\npath = {:?}\nfile_name = {:?}\nfingerprint = {:?}\nsize_bytes = {}\n\
         n_max = {}\nn_min = {}\np_min = {}\nn_gpu_layers = {}\ntype_k = {}\ntype_v = {}\n\
         acceptance = {}\ntokens_per_round = {}\ntg_tps = {}\nbaseline_tg_tps = {}\nmem_bytes = {}\n",
        draft.to_str().unwrap(),
        id.file_name,
        id.fingerprint,
        id.size_bytes,
        best["params"]["n_max"],
        best["params"]["n_min"],
        best["params"]["p_min"],
        best["placement"]["n_gpu_layers"],
        best["placement"]["type_k"],
        best["placement"]["type_v"],
        best["acceptance"],
        best["tokens_per_round"],
        median(&best["tg_tps"]),
        median(&r["baseline"]["tg_tps"]),
        d["mem_bytes"],
    )
}

/// The tuned agent profile without its n-gram speculation (a profile has one kind) and without
/// server_args, with the draft table added, for `n_parallel` requests at once.
fn with_draft(table: &str, n_parallel: u32) -> String {
    let tuned = std::fs::read_to_string(ngram_profile()).unwrap();
    let mut text = String::new();
    let mut skipping = false;
    for line in tuned.lines() {
        if line.starts_with('[') {
            skipping = line.trim() == "[ngram]";
        }
        if !skipping && !line.starts_with("server_args = ") {
            text.push_str(line);
            text.push('\n');
        }
        if line.trim() == "[workload]" && n_parallel > 1 {
            text.push_str(&format!("n_parallel = {n_parallel}\n"));
        }
    }
    text.push_str(table);
    text
}

/// A draft model does not pay for a 270M target on a CPU, so no tuning run writes one into a profile.
/// The profile format's own editing rule is the user's way to run one anyway: add a `[draft]` table
/// (here from `autotune draft`'s measurement of the Q4_0) and delete `server_args`, which autotune
/// then derives. llama-server started with it drafts with the Q4_0: `-md` is on its command line and
/// its own `timings.draft_n` comes back.
#[test]
fn apply_runs_a_draft_model_profile_and_reads_the_servers_acceptance() {
    let sb = Sandbox::new();
    let demo = demo_model();
    let draft = q4_0_draft(&sb).canonicalize().unwrap();
    let prompts = days_prompts(&sb);
    let r = draft_report(
        &sb,
        &[
            "draft",
            demo.to_str().unwrap(),
            "--draft",
            draft.to_str().unwrap(),
            "--json",
            "--no-ngram",
            "-t",
            "1",
            "--ctx",
            "512",
            "--draft-max",
            "4",
            "--draft-p-min",
            "0",
            "--draft-min",
            "0",
            "--draft-gen",
            "16",
            "--draft-reps",
            "2",
            "--draft-prompts",
            prompts.to_str().unwrap(),
            "--seed",
            "3",
        ],
    );
    let profile = sb.dir.path().join("with-draft.toml");
    std::fs::write(&profile, with_draft(&draft_table(&r, &draft), 1)).unwrap();

    let o = apply_check(&sb, &profile, None);
    assert!(
        o.status.success(),
        "apply --exec failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("derived them from [winner]"),
        "{}",
        stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let command = command_of(&v);
    assert!(
        command
            .windows(2)
            .any(|w| w == ["-md", draft.to_str().unwrap()]),
        "{command:?}"
    );
    assert!(
        command
            .windows(2)
            .any(|w| w == ["--spec-type", "draft-simple"]),
        "{command:?}"
    );
    assert!(!command.contains(&"ngram-simple"), "{command:?}");
    let (drafted, accepted) = servers_speculation(&v, "draft-simple");
    assert!(drafted > 0, "llama-server drafted nothing: {v:#}");
    // The Q4_0 of the same model agrees with it on a list that repeats.
    assert!(accepted > 0, "{v:#}");
    assert_eq!(
        Path::new(v["speculation"]["draft_model"].as_str().unwrap()),
        draft
    );
}

/// A llama-server that does not know the profile's speculative type (an older build) refuses to
/// start: `apply --exec` stops with one line naming the refused argument and the profile's
/// speculation, exit code 6, and nothing on stdout. The stand-in is the real server, told a type it
/// does not know, so the refusal is llama.cpp's own.
#[test]
fn a_server_without_the_profiles_speculation_is_a_one_line_error() {
    let profile = ngram_profile();
    let sb = Sandbox::new();
    let server = sb.dir.path().join("older-llama-server");
    std::fs::write(
        &server,
        format!(
            "#!/bin/sh\nn=$#\nfor a in \"$@\"; do\n  [ \"$a\" = ngram-simple ] && a=ngram-unknown-here\n  \
             set -- \"$@\" \"$a\"\ndone\nshift $n\nexec '{}' \"$@\"\n",
            llama_server().display()
        ),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let o = apply_check(&sb, &profile, Some(&server));
    assert_eq!(o.status.code(), Some(6), "{}", stderr(&o));
    assert_eq!(stdout(&o), "", "nothing half-written on stdout");
    let err = stderr(&o);
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("autotune: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    let e = errors[0];
    assert!(
        e.contains("refused `--spec-type` (unknown speculative type: ngram-unknown-here)"),
        "{e}"
    );
    assert!(
        e.contains("does not support the profile's speculative decoding (ngram-simple)"),
        "{e}"
    );
    assert!(
        !err.contains("usage:"),
        "the server's usage text stays out: {err}"
    );
}

/// vendor/make-tiny-mtp's model (a tiny mimo2 with one MTP head, random weights) in the sandbox.
fn tiny_mtp(sb: &Sandbox) -> PathBuf {
    let dir = sb.dir.path().join("mtp");
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny-mtp.gguf");
    let o = std::process::Command::new(repo_root().join("vendor/make-tiny-mtp"))
        .arg(&model)
        .output()
        .expect("vendor/make-tiny-mtp");
    assert!(o.status.success(), "make-tiny-mtp: {}", stderr(&o));
    model
}

/// A model with an MTP head (vendor/make-tiny-mtp: a tiny mimo2, random weights shaped so that the
/// head's drafts are right part of the time): `autotune draft` measures `draft-mtp` with the target's
/// own head, per prompt kind, and its output is the target alone's (up to near ties). The weights are
/// random, so the figures are checked for presence and consistency, not for a speed-up.
#[test]
fn a_model_with_mtp_heads_is_measured_with_draft_mtp() {
    let sb = Sandbox::new();
    let model = tiny_mtp(&sb);
    let r = draft_report(
        &sb,
        &[
            "draft",
            model.to_str().unwrap(),
            "--no-ngram",
            "--threads",
            "1",
            "--draft-gen",
            "24",
            "--draft-reps",
            "2",
            "--draft-budget",
            "120s",
            "--json",
        ],
    );
    assert_eq!(r["mtp"]["heads"], 1, "{r:#}");
    let entry = r["drafts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["spec_type"] == "draft-mtp")
        .unwrap_or_else(|| panic!("no draft-mtp entry: {r:#}"));
    assert_eq!(entry["status"], "measured", "{entry:#}");
    let measured: Vec<&serde_json::Value> = entry["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tg_tps"].as_array().is_some_and(|v| !v.is_empty()))
        .collect();
    assert!(!measured.is_empty(), "no MTP setting measured: {entry:#}");
    for t in &measured {
        let n_max = t["mtp"]["n_max"].as_u64().expect("an MTP trial has n_max");
        assert!((1..=4).contains(&n_max), "{t:#}");
        let acceptance = t["acceptance"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acceptance), "{t:#}");
        // Tokens per target decode: the target's own plus the accepted drafts, at most 1 + n_max.
        let per_round = t["tokens_per_round"].as_f64().unwrap();
        assert!(
            per_round >= 1.0 && per_round <= 1.0 + n_max as f64 + 1e-9,
            "{t:#}"
        );
        let kinds = t["per_kind"].as_array().unwrap();
        assert!(kinds.len() >= 2, "figures per prompt kind: {t:#}");
        for k in kinds {
            assert!(
                k["accepted"].as_u64().unwrap() <= k["drafted"].as_u64().unwrap(),
                "{k:#}"
            );
            assert!(k["tg_tps"].as_f64().unwrap() > 0.0, "{k:#}");
        }
        // The output is the target alone's, or differs only where two tokens were near-tied.
        assert!(
            t["identical"] == true || t["near_ties"].as_array().is_some_and(|v| !v.is_empty()),
            "draft-mtp changed the output beyond near ties: {t:#}"
        );
        assert!(t["divergence"].is_null(), "{t:#}");
    }
    // The tiny model's head is right part of the time (25-60% on this machine): drafts were made
    // and some accepted over the whole prompt set.
    let drafted: u64 = measured[0]["per_kind"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["drafted"].as_u64().unwrap())
        .sum();
    assert!(drafted > 0, "{:#}", measured[0]);
}

/// The `[mtp]` table of the fastest measured draft length of `autotune draft --json`'s `draft-mtp`
/// entry, with the n_max it sets: what a user who wants MTP that did not pay here writes into a
/// profile.
fn mtp_table(r: &serde_json::Value) -> (String, u64) {
    let median = |xs: &serde_json::Value| {
        let mut v: Vec<f64> = xs
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let entry = r["drafts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["spec_type"] == "draft-mtp")
        .unwrap_or_else(|| panic!("no draft-mtp entry: {r:#}"));
    let best = entry["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tg_tps"].as_array().is_some_and(|v| !v.is_empty()))
        .max_by(|a, b| median(&a["tg_tps"]).total_cmp(&median(&b["tg_tps"])))
        .unwrap_or_else(|| panic!("no MTP setting measured: {entry:#}"));
    let n_max = best["mtp"]["n_max"].as_u64().unwrap();
    let kinds: Vec<String> = best["per_kind"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| format!("{}", k["kind"]))
        .collect();
    let table = format!(
        "\n[mtp]\nn_max = {n_max}\nkinds = [{}]\nacceptance = {}\ntokens_per_round = {}\n\
         tg_tps = {}\nbaseline_tg_tps = {}\n",
        kinds.join(", "),
        best["acceptance"],
        best["tokens_per_round"],
        median(&best["tg_tps"]),
        median(&r["baseline"]["tg_tps"]),
    );
    (table, n_max)
}

/// `autotune tune` of the tiny MTP model for `parallel` requests at once, a short run written to a
/// profile file; the profile's path and the tune's `--json` report.
fn tune_tiny_mtp(sb: &Sandbox, m: &str, parallel: u32) -> (PathBuf, serde_json::Value) {
    let tuned = sb.dir.path().join(format!("tiny-mtp-{parallel}.toml"));
    let np = parallel.to_string();
    let v = sb.run_json(&[
        "tune",
        m,
        "--out",
        tuned.to_str().unwrap(),
        "--no-save",
        "--parallel",
        &np,
        "--depth",
        "0",
        "--ctx",
        "512",
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
        "1",
        "--cache-types",
        "f16",
        "--flash-attn",
        "auto",
        "--ubatch",
        "512",
        "--budget",
        "30s",
        "--json",
    ]);
    (tuned, v)
}

/// The tuned profile with the fastest measured `[mtp]` setting of `autotune draft` report `r`
/// added and `server_args` deleted (the profile format's rule for editing by hand); its path and
/// the setting's n_max.
fn with_mtp_table(tuned: &Path, r: &serde_json::Value) -> (PathBuf, u64) {
    let text: String = std::fs::read_to_string(tuned)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("server_args = "))
        .map(|l| format!("{l}\n"))
        .collect();
    let (table, n_max) = mtp_table(r);
    let profile = tuned.with_extension("mtp.toml");
    std::fs::write(&profile, text + &table).unwrap();
    (profile, n_max)
}

/// MTP does not pay for the tiny model on a CPU, so no tuning run writes `[mtp]` into its profile;
/// as with a draft model, the user adds the table (from `autotune draft`'s measurement of the head)
/// to a tuned profile and deletes `server_args`. llama-server started with it drafts with the
/// model's own head: `--spec-type draft-mtp` is on its command line and its `timings.draft_n` comes
/// back, with some drafts accepted (the head is right part of the time).
#[test]
fn apply_runs_an_mtp_profile_and_reads_the_servers_acceptance() {
    let sb = Sandbox::new();
    let model = tiny_mtp(&sb);
    let m = model.to_str().unwrap();
    let (tuned, _) = tune_tiny_mtp(&sb, m, 1);
    let r = draft_report(
        &sb,
        &[
            "draft",
            m,
            "--no-ngram",
            "--threads",
            "1",
            "--ctx",
            "512",
            "--draft-gen",
            "24",
            "--draft-reps",
            "2",
            "--draft-budget",
            "60s",
            "--seed",
            "3",
            "--json",
        ],
    );
    let (profile, n_max) = with_mtp_table(&tuned, &r);
    let (p, _) = profiles::Profile::from_toml(&std::fs::read_to_string(&profile).unwrap())
        .expect("the edited profile parses");
    let mtp = p.mtp.clone().expect("[mtp] read back");

    let o = apply_check(&sb, &profile, None);
    assert!(
        o.status.success(),
        "apply --exec failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("derived them from [winner]"),
        "{}",
        stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let command = command_of(&v);
    let n = n_max.to_string();
    for pair in [["--spec-type", "draft-mtp"], ["--spec-draft-n-max", &n]] {
        assert!(
            command.windows(2).any(|w| w == pair),
            "{pair:?} in {command:?}"
        );
    }
    assert!(!command.contains(&"-md"), "no draft model: {command:?}");
    let (drafted, accepted) = servers_speculation(&v, "draft-mtp");
    assert!(
        drafted > 0,
        "llama-server drafted nothing with the MTP head: {v:#}"
    );
    assert!(accepted > 0, "the head is right part of the time: {v:#}");
    // At most n_max drafts per target decode, and no more decodes than generated tokens.
    let generated = v["completion"]["predicted_n"].as_u64().unwrap();
    assert!(drafted <= n_max * generated, "{v:#}");
    let kind = v["speculation"]["prompt_kind"].as_str().unwrap();
    assert!(
        mtp.kinds.iter().any(|k| k == kind),
        "{kind} not in {:?}",
        mtp.kinds
    );
    assert!(v["speculation"]["draft_model"].is_null(), "{v:#}");
    assert!(same_figure(&v["profile_tg_tps"], mtp.tg_tps), "{v:#}");

    // The text report's line names draft-mtp once, with the server's figures.
    text_report_says(&sb, &profile, "draft-mtp");
}

/// Several requests at once (`--parallel 2`): the draft proposes for both slots in shared batches
/// and the target checks both drafts in one batch, as llama-server's slots do. The output is still
/// the target alone's (at two slots too), the speeds are of both together (not per kind: a group's
/// prompts share its time), and llama-server runs the measured draft with `-np 2`: two completions at
/// once, drafted and accepted by its own account.
#[test]
fn a_draft_for_two_requests_at_once_keeps_the_output_and_runs_in_llama_server() {
    let sb = Sandbox::new();
    let demo = demo_model();
    let draft = q4_0_draft(&sb).canonicalize().unwrap();
    // Two texts unlike each other, so that a slot reading the other's cache or logits shows.
    let prompts = sb.dir.path().join("two.toml");
    std::fs::write(
        &prompts,
        "[[prompt]]\nname = \"loop\"\nkind = \"code\"\ntext = \"def count(n):\\n    for i in range(n):\\n\"\n\n\
         [[prompt]]\nname = \"days\"\nkind = \"repetitive\"\ntext = \"Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,\"\n",
    )
    .unwrap();
    let at = |slots: &str| {
        draft_report(
            &sb,
            &[
                "draft",
                demo.to_str().unwrap(),
                "--draft",
                draft.to_str().unwrap(),
                "--parallel",
                slots,
                "--no-ngram",
                "--json",
                "-t",
                "1",
                "--ctx",
                "1024",
                "--draft-max",
                "4",
                "--draft-p-min",
                "0",
                "--draft-min",
                "0",
                "--draft-gen",
                "16",
                "--draft-reps",
                "2",
                "--draft-prompts",
                prompts.to_str().unwrap(),
                "--seed",
                "3",
            ],
        )
    };
    let r = at("2");
    assert_eq!(r["n_parallel"], 2, "{r:#}");
    // Greedy: each slot drafts and keeps what one request alone does (a slot that read another's
    // cache, or a draft batch row taken for another slot's, would not).
    let one = at("1");
    assert!(
        one["n_parallel"].is_null(),
        "one slot is the default: {one:#}"
    );
    let acceptance = |r: &serde_json::Value| measured_trials(r)[0]["acceptance"].as_f64().unwrap();
    assert!(
        (acceptance(&r) - acceptance(&one)).abs() < 0.05,
        "two slots accept {} of the draft, one {}",
        acceptance(&r),
        acceptance(&one)
    );
    // The user's two prompts, generated at once: a whole group of two.
    assert_eq!(r["prompts"].as_array().unwrap().len(), 2, "{r:#}");
    let measured = measured_trials(&r);
    assert!(!measured.is_empty(), "{r:#}");
    for t in &measured {
        assert!(
            matches!(t["same_output"].as_str(), Some("identical" | "near-ties")),
            "output differs with the draft at two slots: {t:#}"
        );
        assert!(t["acceptance"].as_f64().unwrap() > 0.3, "{t:#}");
        for k in t["per_kind"].as_array().unwrap() {
            assert_eq!(k["tg_tps"], 0.0, "no speed by kind for a group: {k:#}");
        }
    }
    assert!(r["baseline"]["tg_tps"][0].as_f64().unwrap() > 0.0, "{r:#}");
    // Without --no-ngram: n-gram speculation is measured for the two slots too.
    let text = stdout_of_text_report(&sb, &demo, &draft, &prompts);
    assert!(text.contains("2 requests at once"), "{text}");
    assert!(
        text.contains(
            "ngram-simple (no draft model: drafts by looking up the text so far): measured"
        ),
        "{text}"
    );

    let profile = sb.dir.path().join("two-at-once.toml");
    std::fs::write(&profile, with_draft(&draft_table(&r, &draft), 2)).unwrap();
    let o = apply_check(&sb, &profile, None);
    assert!(
        o.status.success(),
        "apply --exec failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let command = command_of(&v);
    assert!(command.windows(2).any(|w| w == ["-np", "2"]), "{command:?}");
    assert!(
        command
            .windows(2)
            .any(|w| w == ["-md", draft.to_str().unwrap()]),
        "{command:?}"
    );
    assert_eq!(v["requests"], 2, "{v:#}");
    let (drafted, accepted) = servers_speculation(&v, "draft-simple");
    assert!(drafted > 0 && accepted > 0, "{v:#}");
}

/// `autotune draft` at two slots as text, one short pass (its header line is what is checked).
fn stdout_of_text_report(sb: &Sandbox, demo: &Path, draft: &Path, prompts: &Path) -> String {
    let o = sb.run(&[
        "draft",
        demo.to_str().unwrap(),
        "--draft",
        draft.to_str().unwrap(),
        "--parallel",
        "2",
        "-t",
        "1",
        "--ctx",
        "1024",
        "--draft-max",
        "2",
        "--draft-p-min",
        "0",
        "--draft-min",
        "0",
        "--draft-gen",
        "4",
        "--draft-reps",
        "2",
        "--draft-prompts",
        prompts.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
}

/// Several requests at once with the model's own heads (`--parallel 2`): the head drafts for both
/// slots in shared batches and the target checks both drafts in one batch, as llama-server's slots
/// run `draft-mtp`. Each slot accepts what one request alone does (a slot that paired its tokens with
/// the other's hidden states, or read its cache, would not), the output is still the target alone's,
/// `tune --parallel 2` measures the heads as well, and llama-server runs the measured head with
/// `-np 2`: two completions at once, drafted and accepted by its own account.
#[test]
fn mtp_heads_are_measured_for_two_requests_at_once_and_run_in_llama_server() {
    let sb = Sandbox::new();
    let model = tiny_mtp(&sb);
    let m = model.to_str().unwrap();
    let at = |slots: &str| {
        draft_report(
            &sb,
            &[
                "draft",
                m,
                "--parallel",
                slots,
                "--no-ngram",
                "--threads",
                "1",
                "--ctx",
                "1024",
                "--draft-gen",
                "24",
                "--draft-reps",
                "2",
                "--seed",
                "3",
                "--json",
            ],
        )
    };
    let two = at("2");
    assert_eq!(two["n_parallel"], 2, "{two:#}");
    assert!(
        two["mtp"]["note"]
            .as_str()
            .unwrap()
            .contains("draft-mtp measured"),
        "{two:#}"
    );
    let one = at("1");
    let by_n_max = |r: &serde_json::Value| -> Vec<(u64, f64)> {
        let entry = (r["drafts"].as_array().unwrap().iter())
            .find(|d| d["spec_type"] == "draft-mtp")
            .unwrap_or_else(|| panic!("no draft-mtp entry: {r:#}"));
        (entry["trials"].as_array().unwrap().iter())
            .filter(|t| t["tg_tps"].as_array().is_some_and(|v| !v.is_empty()))
            .map(|t| {
                assert!(
                    t["identical"] == true
                        || t["near_ties"].as_array().is_some_and(|v| !v.is_empty()),
                    "draft-mtp changed the output beyond near ties: {t:#}"
                );
                (
                    t["mtp"]["n_max"].as_u64().unwrap(),
                    t["acceptance"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let (two_slots, one_slot) = (by_n_max(&two), by_n_max(&one));
    assert!(!two_slots.is_empty(), "{two:#}");
    for (n_max, a) in &two_slots {
        if let Some((_, alone)) = one_slot.iter().find(|(n, _)| n == n_max) {
            assert!(
                (a - alone).abs() < 0.05,
                "n_max {n_max}: two slots accept {a} of the head's drafts, one {alone}"
            );
        }
    }
    assert!(
        two_slots.iter().any(|(_, a)| *a > 0.2),
        "the head is right part of the time: {two_slots:?}"
    );

    let (tuned, v) = tune_tiny_mtp(&sb, m, 2);
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("draft-mtp"),
        "tune measured the heads: {notes}"
    );
    assert!(!notes.contains("not tried"), "{notes}");
    let (profile, _) = with_mtp_table(&tuned, &two);
    let o = apply_check(&sb, &profile, None);
    assert!(
        o.status.success(),
        "apply --exec failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    let command = command_of(&v);
    for pair in [["-np", "2"], ["--spec-type", "draft-mtp"]] {
        assert!(
            command.windows(2).any(|w| w == pair),
            "{pair:?} in {command:?}"
        );
    }
    assert_eq!(v["requests"], 2, "{v:#}");
    let (drafted, accepted) = servers_speculation(&v, "draft-mtp");
    assert!(drafted > 0 && accepted > 0, "{v:#}");
}
