//! End to end: multi-token prediction with a model's own heads (`draft-mtp`, vendor/make-tiny-mtp's
//! tiny model) — `autotune draft` measures it per prompt kind with the target alone's output, for one
//! request and two at once, and llama-server started with a profile's `[mtp]` table drafts with the
//! head: its own drafted and accepted tokens come back through `apply --json`.

mod common;
mod speculation;
use common::*;
use speculation::*;
use std::path::{Path, PathBuf};

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
    let entry = mtp_entry(&r);
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
    let entry = mtp_entry(r);
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
    let mut args = vec![
        "tune",
        m,
        "--out",
        tuned.to_str().unwrap(),
        "--no-save",
        "--parallel",
        &np,
    ];
    args.extend_from_slice(SHORT_WORKLOAD_AT_512);
    args.extend_from_slice(ONE_THREAD_KNOBS);
    args.push("--json");
    let v = sb.run_json(&args);
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

    let (o, v) = apply_checked_json(&sb, &profile);
    assert!(
        stderr(&o).contains("derived them from [winner]"),
        "{}",
        stderr(&o)
    );
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
    let at = |slots: &str| mtp_report_at_slots(&sb, m, slots);
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
    let (two_slots, one_slot) = (acceptance_by_n_max(&two), acceptance_by_n_max(&one));
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
    let (_, v) = apply_checked_json(&sb, &profile);
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

/// `autotune draft --json` of the tiny MTP model `m` for `slots` requests at once.
fn mtp_report_at_slots(sb: &Sandbox, m: &str, slots: &str) -> serde_json::Value {
    draft_report(
        sb,
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
}

/// The measured `draft-mtp` settings of report `r`, each checked to keep the target alone's output
/// (up to near ties): (n_max, acceptance).
fn acceptance_by_n_max(r: &serde_json::Value) -> Vec<(u64, f64)> {
    let entry = mtp_entry(r);
    (entry["trials"].as_array().unwrap().iter())
        .filter(|t| t["tg_tps"].as_array().is_some_and(|v| !v.is_empty()))
        .map(|t| {
            assert!(
                t["identical"] == true || t["near_ties"].as_array().is_some_and(|v| !v.is_empty()),
                "draft-mtp changed the output beyond near ties: {t:#}"
            );
            (
                t["mtp"]["n_max"].as_u64().unwrap(),
                t["acceptance"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The `draft-mtp` entry of an `autotune draft --json` report.
fn mtp_entry(r: &serde_json::Value) -> &serde_json::Value {
    (r["drafts"].as_array().unwrap().iter())
        .find(|d| d["spec_type"] == "draft-mtp")
        .unwrap_or_else(|| panic!("no draft-mtp entry: {r:#}"))
}
