//! End to end: speculative decoding with a draft model through the real binary on the real demo
//! model — drafts with another vocabulary are rejected with the reason, a real pair (the demo model
//! and a Q4_0 made from it) produces the target alone's output with the draft (up to near ties that
//! batched and one-token kernels round apart), a deliberately broken rollback is reported as a real
//! divergence, and `tune --draft` records the outcome in the profile.

mod common;
mod speculation;
use common::*;
use search_space::testfiles::{ggml, GgufBuilder};
use speculation::*;
use std::path::Path;

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

#[test]
fn output_with_a_draft_is_the_target_alones_up_to_near_ties() {
    let demo = demo_model();
    let sb = Sandbox::new();
    let draft = q4_0_draft(&sb);
    let args = draft_model_args(
        &demo,
        &draft,
        ["1024", "0,0.8", "8"],
        &["--draft-budget", "15m"],
    );
    let r = draft_report(&sb, &args);
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
    let args = draft_model_args(
        &demo,
        &draft,
        ["1024", "0", "16"],
        &["--draft-budget", "15m"],
    );
    let r = draft_report_with(&sb, &args, Some("keep-one-rejected-cell"));
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
    args.extend_from_slice(ONE_THREAD_KNOBS);
    args.extend_from_slice(&[
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
    check_draft_outcome(&profile, &draft);
}

/// A profile tuned with `--draft`: the server runs the measured draft when it paid, and the profile
/// says why not, with the numbers, when it did not.
fn check_draft_outcome(profile: &profiles::Profile, draft: &Path) {
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
