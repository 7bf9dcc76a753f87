//! End to end: a draft model applied as measured — a profile with a `[draft]` table from `autotune
//! draft`'s measurement of a Q4_0 of the demo model starts the vendor llama-server with `-md`, for
//! one request and for two at once (where the draft's output and acceptance per slot are checked
//! first), and the server's own drafted and accepted tokens come back through `apply --json`.

mod common;
mod speculation;
use common::*;
use speculation::*;
use std::path::{Path, PathBuf};

/// The `[draft]` table of the fastest measured setting of `autotune draft --json`'s first draft: what
/// a user who wants a draft that did not pay here writes into a profile.
fn draft_table(r: &serde_json::Value, draft: &Path) -> String {
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
    let more = ["--draft-prompts", prompts.to_str().unwrap()];
    let r = draft_report(
        &sb,
        &draft_model_args(&demo, &draft, ["512", "0", "16"], &more),
    );
    let profile = sb.dir.path().join("with-draft.toml");
    std::fs::write(&profile, with_draft(&draft_table(&r, &draft), 1)).unwrap();

    let (o, v) = apply_checked_json(&sb, &profile);
    assert!(
        stderr(&o).contains("derived them from [winner]"),
        "{}",
        stderr(&o)
    );
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
    let prompts = two_unlike_prompts(&sb);
    let at = |slots: &str| draft_at_slots(&sb, &demo, &draft, &prompts, slots);
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

    the_server_runs_the_draft_for_two_requests(&sb, &r, &draft);
}

/// Two texts unlike each other, so that a slot reading the other's cache or logits shows.
fn two_unlike_prompts(sb: &Sandbox) -> PathBuf {
    let prompts = sb.dir.path().join("two.toml");
    std::fs::write(
        &prompts,
        "[[prompt]]\nname = \"loop\"\nkind = \"code\"\ntext = \"def count(n):\\n    for i in range(n):\\n\"\n\n\
         [[prompt]]\nname = \"days\"\nkind = \"repetitive\"\ntext = \"Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,\"\n",
    )
    .unwrap();
    prompts
}

/// `autotune draft --json` of the demo model with `draft` for `slots` requests at once.
fn draft_at_slots(
    sb: &Sandbox,
    demo: &Path,
    draft: &Path,
    prompts: &Path,
    slots: &str,
) -> serde_json::Value {
    let more = [
        "--parallel",
        slots,
        "--draft-prompts",
        prompts.to_str().unwrap(),
    ];
    draft_report(
        sb,
        &draft_model_args(demo, draft, ["1024", "0", "16"], &more),
    )
}

/// llama-server runs the draft measured at two slots (report `r`) with `-np 2`: two completions at
/// once, drafted and accepted by its own account.
fn the_server_runs_the_draft_for_two_requests(sb: &Sandbox, r: &serde_json::Value, draft: &Path) {
    let profile = sb.dir.path().join("two-at-once.toml");
    std::fs::write(&profile, with_draft(&draft_table(r, draft), 2)).unwrap();
    let (_, v) = apply_checked_json(sb, &profile);
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
