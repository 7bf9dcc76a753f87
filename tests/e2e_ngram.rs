//! End to end: n-gram speculation (no draft model) on the real demo model — `autotune draft`
//! measures it with the same identity check as a draft model's (a broken rollback is caught), `tune
//! --workload agent` keeps it in the profile when it pays, `apply --exec --check-only` starts the
//! vendor llama-server with it and reads the server's own drafted and accepted tokens back, and a
//! server that refuses the profile's speculation is a one-line error with its own exit code.

mod common;
mod speculation;
use common::*;
use speculation::*;
use std::path::{Path, PathBuf};

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
    let (_, v) = apply_checked_json(&sb, &profile);
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
