//! End to end: the real binary tunes the real demo model through linked llama.cpp and writes a
//! profile that parses, validates and carries well-formed llama-server arguments.

mod common;
use common::*;

#[test]
fn tunes_the_demo_model_and_saves_a_valid_profile() {
    let model = demo_model();
    let sb = Sandbox::new();
    let out_file = sb.dir.path().join("profile.toml");
    let mut args = vec![
        "tune",
        model.to_str().unwrap(),
        "--out",
        out_file.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(SHORT);
    let o = sb.run(&args);
    assert!(
        o.status.success(),
        "autotune failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );

    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    check_report(&report);
    check_time_plan(&report, &stderr(&o));
    let versus = &report["versus_defaults"];
    check_versus_defaults(&report);
    let profile = check_saved_profile(&sb, &out_file);
    check_server_args(&profile, &model);
    check_listing(&sb, &profile, versus);

    // `show` finds it for this model on this machine.
    let o = sb.run(&["show", model.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("schema_version = 1"));
}

/// The JSON report has a measured winner with real figures, and the defaults measured beside it.
fn check_report(report: &serde_json::Value) {
    let winner = &report["winner_figures"];
    assert!(winner["pp_tps"].as_f64().unwrap() > 1.0, "{winner}");
    assert!(winner["tg_tps"].as_f64().unwrap() > 1.0, "{winner}");
    assert!(
        report["leaderboard"].as_array().unwrap().len() >= 2,
        "more than one candidate measured"
    );
    assert!(
        report["baseline_figures"]["tg_tps"].as_f64().is_some(),
        "llama.cpp's defaults measured in the same run"
    );
}

/// The run said its time once llama.cpp's defaults were measured (on stderr, as it ran), and the
/// report keeps it: a request's seconds, the time expected within the budget kept.
fn check_time_plan(report: &serde_json::Value, err: &str) {
    let plan = &report["time_plan"];
    let (expected, budget) = (plan["expected_s"].as_f64(), plan["budget_s"].as_f64());
    assert!(plan["request_s"].as_f64() > Some(0.0), "{plan}");
    assert!(expected > Some(0.0) && expected <= budget, "{plan}");
    assert_eq!(budget, report["budget_s"].as_f64(), "{plan}");
    let said = err
        .lines()
        .filter(|l| l.starts_with("autotune: time: about"))
        .count();
    assert_eq!(said, 1, "said once: {err}");
}

/// The headline's claim against the defaults comes from the decision rule: a verdict with its
/// interval, or the defaults themselves winning.
fn check_versus_defaults(report: &serde_json::Value) {
    let versus = &report["versus_defaults"];
    if versus["same_configuration"] == false {
        let verdict = versus["comparison"]["verdict"].as_str().unwrap();
        assert!(["faster", "slower", "tie"].contains(&verdict), "{versus}");
        assert!(
            versus["comparison"]["ci_low"].as_f64().unwrap()
                <= versus["comparison"]["ci_high"].as_f64().unwrap()
        );
        assert_eq!(
            versus["chosen_for"].is_string(),
            verdict == "tie",
            "{versus}"
        );
    } else {
        assert_eq!(report["winner"], report["baseline"], "{versus}");
    }
}

/// The profile: in the store and at `out_file`, identical, parseable, valid.
fn check_saved_profile(sb: &Sandbox, out_file: &std::path::Path) -> profiles::Profile {
    let stored = sb.stored_profiles();
    assert_eq!(stored.len(), 1, "one profile in the store");
    let text = std::fs::read_to_string(out_file).unwrap();
    assert_eq!(text, std::fs::read_to_string(&stored[0]).unwrap());
    let (profile, unknown) = profiles::Profile::from_toml(&text).expect("profile parses");
    assert!(unknown.is_empty(), "{unknown:?}");
    assert_eq!(profile.schema_version, profiles::SCHEMA_VERSION);
    profile
        .validate(true)
        .expect("profile validates, model path exists");

    profile
}

/// The server arguments are well formed: llama-server flags with values, the model first.
fn check_server_args(profile: &profiles::Profile, model: &std::path::Path) {
    let a = &profile.server_args;
    assert_eq!(a[0], "-m");
    assert_eq!(std::path::Path::new(&a[1]), model.canonicalize().unwrap());
    let pos = |flag: &str| {
        a.iter()
            .position(|x| x == flag)
            .unwrap_or_else(|| panic!("{flag} missing in {a:?}"))
    };
    assert_eq!(a[pos("-c") + 1], "256");
    assert_eq!(a[pos("-t") + 1], profile.winner.threads.to_string());
    for flag in ["-b", "-ub", "-ctk", "-ctv", "-fa", "-ngl"] {
        let v = &a[pos(flag) + 1];
        assert!(!v.starts_with('-'), "{flag} has a value: {a:?}");
    }
    assert_eq!(profile.server_args, profile.expected_server_args());
    // What llama-server would otherwise choose for itself, pinned as measured: one slot with a
    // KV cache of its own, no speculation.
    assert_eq!(a[pos("-np") + 1], "1");
    assert!(a.contains(&"-no-kvu".to_string()), "{a:?}");
    assert_eq!(a[a.len() - 2..], ["--spec-type", "none"]);
}

/// The profile keeps the report's verdict, and the listing shows it, never a raw gain for a tie.
fn check_listing(sb: &Sandbox, profile: &profiles::Profile, versus: &serde_json::Value) {
    let kept = profile.versus_defaults.as_ref().expect("versus_defaults");
    let listed = match versus["comparison"]["verdict"].as_str() {
        None => {
            assert_eq!(kept.verdict, profiles::Judged::Same);
            "(llama.cpp's defaults)".to_string()
        }
        Some(v) => {
            assert_eq!(serde_json::to_value(kept.verdict).unwrap(), v);
            let ratio = versus["comparison"]["ratio"].as_f64().unwrap();
            assert!((kept.ratio - ratio).abs() < 1e-9, "{kept:?} vs {versus}");
            match v {
                "tie" => "(ties with defaults within ±".to_string(),
                _ => format!("({:+.0}% requests/s vs defaults)", ratio * 100.0),
            }
        }
    };
    let o = sb.run(&["show"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&listed), "{listed} in {}", stdout(&o));
}

#[test]
fn doctor_reports_llama_cpp_devices_and_system_info() {
    let sb = Sandbox::new();
    let o = sb.run(&["doctor", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let devices = v["machine"]["devices"].as_array().unwrap();
    assert!(devices.iter().any(|d| d["kind"] == "cpu"), "{devices:?}");
    assert!(v["system_info"].as_str().unwrap().contains("CPU :"));
    assert!(v["backends"].as_array().unwrap().iter().any(|b| b == "CPU"));
}

/// Issue 3's A/A test: one configuration measured as two candidates (two workers, two loads, rounds
/// interleaved) is judged a tie by the tuner's paired decision rule, for prompt and generation speed.
/// A 95% interval outside the noise threshold is a verdict a quiet machine gives a few times in a
/// hundred, and this shared VM is not always quiet (seen once in CI: tg A 12% faster, CI [+4.8%,
/// +17.9%], then ties on the two runs after), so a second A/A run is allowed before failing: a rule
/// that does not call identical configurations a tie fails both.
#[test]
fn two_identical_configurations_are_a_tie() {
    let sb = Sandbox::new();
    let model = demo_model();
    let run = || -> serde_json::Value {
        let o = sb.run(&[
            "measure",
            model.to_str().unwrap(),
            "-c",
            "256",
            "-p",
            "64",
            "-n",
            "16",
            "-t",
            "2",
            "--reps",
            "8",
            "--twice",
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let ties = |v: &serde_json::Value| (0..2).all(|k| v["comparisons"][k]["verdict"] == "tie");
    let first = run();
    let v = if ties(&first) {
        first
    } else {
        eprintln!(
            "not a tie on the first A/A run, measuring again: {}",
            first["comparisons"]
        );
        run()
    };
    for (k, figure) in ["pp", "tg"].iter().enumerate() {
        let c = &v["comparisons"][k];
        assert_eq!(c["verdict"], "tie", "{figure}: {c}");
        let (low, high) = (
            c["ci_low"].as_f64().unwrap(),
            c["ci_high"].as_f64().unwrap(),
        );
        assert!(low <= high, "{figure}: {c}");
        assert_eq!(v["a"][k]["n"], 8, "{figure}: {v}");
        assert_eq!(v["b"][k]["n"], 8, "{figure}: {v}");
    }
}

/// `-tb` reaches llama.cpp: with one generation thread, prompt processing with two threads is
/// faster than with one (it is compute-bound), while generation stays one thread's.
#[test]
fn prompt_threads_are_set_apart_from_generation_threads() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: one CPU, nothing to split");
        return;
    }
    let sb = Sandbox::new();
    let model = demo_model();
    let measure = |tb: &str| {
        sb.run_json(&[
            "measure",
            model.to_str().unwrap(),
            "-c",
            "512",
            "-p",
            "256",
            "-n",
            "16",
            "-t",
            "1",
            "-tb",
            tb,
            "--reps",
            "3",
            "--json",
        ])
    };
    let median = |v: &serde_json::Value, k: &str| v[k]["median"].as_f64().unwrap();
    // Speeds measured one after the other on a shared VM: a noisy spell can slow one of them by a
    // third (seen once: tg 38 against 54 t/s, where both are 58-61 t/s run after run), so a second
    // pair is measured before failing; -tb that does not reach llama.cpp, or reaches generation,
    // fails both.
    let check = || -> Result<(), String> {
        let (one, two) = (measure("1"), measure("2"));
        assert_eq!(two["candidate"]["threads_batch"], 2, "{two}");
        assert!(
            one["candidate"]["threads_batch"].is_null(),
            "-tb 1 = -t 1: {one}"
        );
        let (pp1, pp2) = (median(&one, "pp"), median(&two, "pp"));
        if pp2 <= 1.3 * pp1 {
            return Err(format!("pp {pp2} t/s with -tb 2 vs {pp1} with -tb 1"));
        }
        let (tg1, tg2) = (median(&one, "tg"), median(&two, "tg"));
        if tg2 >= 1.25 * tg1 {
            return Err(format!(
                "tg {tg2} t/s with -tb 2 vs {tg1} with -tb 1 (both -t 1)"
            ));
        }
        Ok(())
    };
    if let Err(first) = check() {
        eprintln!("{first}; measuring the pair again");
        if let Err(again) = check() {
            panic!("{first}; again: {again}");
        }
    }
}

/// Records per candidate in a measurement log (JSON Lines).
fn records_per_candidate(log: &std::path::Path) -> std::collections::HashMap<String, usize> {
    let mut m = std::collections::HashMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        *m.entry(v["candidate"].to_string()).or_insert(0) += 1;
    }
    m
}

/// Runs autotune with `args` and interrupts it (SIGINT) once a few repetitions are in the
/// measurement logs under `logs` (or after two minutes).
fn interrupt_after_three_records(
    sb: &Sandbox,
    args: &[&str],
    logs: &std::path::Path,
) -> std::process::Output {
    let child = sb
        .cmd()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    loop {
        let n: usize = std::fs::read_dir(logs)
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
        if n >= 3 || start.elapsed().as_secs() > 120 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait_with_output().unwrap()
}

#[test]
fn an_interrupted_run_resumes_without_re_measuring() {
    let model = demo_model();
    let sb = Sandbox::new();
    let mut args = vec![
        "tune",
        model.to_str().unwrap(),
        "--json",
        "--cache-types",
        "f16,q8_0,q4_0",
        "--budget",
        "120s",
    ];
    args.extend_from_slice(SHORT_WORKLOAD);
    args.extend_from_slice(&["--threads", "2", "--flash-attn", "auto", "--ubatch", "512"]);
    // Nothing to resume yet: --resume says so (bad usage) and measures nothing.
    let mut nothing = args.clone();
    nothing.push("--resume");
    let o = sb.run(&nothing);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no earlier measurements"),
        "{}",
        stderr(&o)
    );
    let logs = sb.cache().join("measurements");
    let out = interrupt_after_three_records(&sb, &args, &logs);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("resume"), "{}", stderr(&out));
    assert!(
        sb.stored_profiles().is_empty(),
        "no profile from an interrupted run"
    );
    let log = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let before = records_per_candidate(&log);
    assert!(before.values().sum::<usize>() >= 3);

    args.push("--resume");
    let o = sb.run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(
        report["reused_repetitions"].as_u64().unwrap() >= 3,
        "{}",
        report["reused_repetitions"]
    );
    // Candidates complete before the interrupt (--max-reps 3 reached) got no new repetitions, except the
    // winner and runner-up, which are re-measured at the end on purpose.
    let after = records_per_candidate(&log);
    // (The report names them: the winner and runner-up as they stood before the confirmation rounds,
    // which the final leaderboard may order differently.)
    let confirmed: Vec<String> = report["confirmed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert!(!confirmed.is_empty(), "{}", report["confirmed"]);
    for (cand, n) in &before {
        if *n >= 3 && !confirmed.contains(cand) {
            assert_eq!(after[cand], *n, "{cand} was measured again after resuming");
        }
    }
}

#[test]
fn the_time_budget_is_respected() {
    let model = demo_model();
    let sb = Sandbox::new();
    let mut args = vec![
        "tune",
        model.to_str().unwrap(),
        "--json",
        "--budget",
        "15s",
        "--cache-types",
        "f16,q8_0,q4_0",
    ];
    args.extend_from_slice(&[
        "--ctx",
        "256",
        "--prompt",
        "32",
        "--gen",
        "8",
        "--min-reps",
        "2",
        "--max-reps",
        "10",
    ]);
    args.extend_from_slice(&[
        "--threads",
        "1,2",
        "--flash-attn",
        "auto,on,off",
        "--ubatch",
        "512,256",
    ]);
    let t = std::time::Instant::now();
    let o = sb.run(&args);
    let took = t.elapsed().as_secs_f64();
    assert!(
        o.status.success() || o.status.code() == Some(4),
        "{}",
        stderr(&o)
    );
    // One repetition (with its model load) may be in flight when the budget runs out; the quality
    // gate's evaluation of a quantized cache counts against the budget like any measurement.
    assert!(
        took < 15.0 + 12.0,
        "took {took:.1} s for a 15 s budget: {}",
        stderr(&o)
    );
}

/// A micro-batch of one token takes a prompt token by token, several times slower than -ub 256: its
/// first repetition stops mid-prompt (llama.cpp's abort callback, between the graph's operations)
/// once its own time proves a request more than 1.75 times the best's, and the run goes on to a winner
/// without it. The stopped candidate is on the leaderboard with its limit, not as a failure.
#[test]
fn a_configuration_several_times_slower_stops_mid_repetition() {
    let model = demo_model();
    let sb = Sandbox::new();
    // A 256-token prompt: one micro-batch at -ub 256, 256 of them at -ub 1.
    let knobs = "--ctx 512 --prompt 256 --gen 8 --min-reps 2 --max-reps 2 --seed 7 --threads 2 \
                 --cache-types f16 --flash-attn auto --kernels repack --ubatch 256,1 --budget 3m";
    let mut args = vec!["tune", model.to_str().unwrap(), "--no-save", "--json"];
    args.extend(knobs.split_whitespace());
    let v = sb.run_json(&args);
    let board = v["leaderboard"].as_array().expect("a leaderboard");
    let one = board
        .iter()
        .find(|e| e["candidate"]["n_ubatch"] == 1)
        .unwrap_or_else(|| panic!("-ub 1 was tried: {v}"));
    let status = one["status"].as_str().unwrap();
    assert!(
        status.starts_with("stopped mid-repetition: slower than"),
        "{status}"
    );
    assert!(one["figures"].is_null(), "{one}");
    assert!(v["stopped_early"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["failed"], 0, "{v}");
    assert_ne!(v["winner"]["n_ubatch"], 1, "{}", v["winner"]);
}

/// `--numa`: each strategy asked for is measured (in a worker process of its own: llama.cpp sets it
/// once per process), labelled, and `measure` takes one. On this project's one-node VM llama.cpp
/// treats them all as off, so their speeds are not compared here.
#[test]
fn numa_strategies_asked_for_are_measured() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let mut args = vec!["tune", m, "--json", "--no-save", "--numa", "off,distribute"];
    args.extend(SHORT_WORKLOAD);
    args.extend(FIXED_KNOBS);
    args.extend(["--kernels", "repack", "--budget", "90s"]);
    let r = sb.run_json(&args);
    let board = r["leaderboard"].as_array().unwrap();
    let measured = |numa: Option<&str>| {
        board
            .iter()
            .any(|e| e["candidate"]["numa"].as_str() == numa && !e["figures"].is_null())
    };
    assert!(measured(None), "off (llama.cpp's default): {board:#?}");
    assert!(measured(Some("distribute")), "{board:#?}");

    let one = sb.run_json(&[
        "measure", m, "-c", "256", "-p", "16", "-n", "4", "-r", "2", "--numa", "isolate", "--json",
    ]);
    assert_eq!(one["candidate"]["numa"], "isolate", "{one}");
    assert!(one["tg"]["median"].as_f64().unwrap() > 0.0, "{one}");
    let bad = sb.run(&["measure", m, "--numa", "numactl"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("distribute"), "{}", stderr(&bad));
}

/// `measure -d` takes several depths, as llama-bench does: a repetition at each per round, in one
/// load, each depth's prompt processing and generation (llama-bench's pp512 @ d and tg128 @ d)
/// summarised on its own.
#[test]
fn measure_takes_several_depths_like_llama_bench() {
    let sb = Sandbox::new();
    let model = tiny_model();
    let m = model.to_str().unwrap();
    let v = sb.run_json(&[
        "measure",
        m,
        "-c",
        "2048",
        "-p",
        "32",
        "-n",
        "8",
        "-d",
        "0,1024,256",
        "-r",
        "2",
        "-t",
        "2",
        "--json",
    ]);
    let depths = v["depths"].as_array().unwrap();
    let at: Vec<u64> = depths
        .iter()
        .map(|d| d["depth"].as_u64().unwrap())
        .collect();
    assert_eq!(at, [256, 1024], "{v}");
    for d in depths {
        for figure in ["pp", "tg"] {
            assert_eq!(d[figure]["n"], 2, "{d}");
            assert!(d[figure]["median"].as_f64().unwrap() > 0.0, "{d}");
        }
    }
    assert_eq!(v["workload"]["depth"], 256);
    assert_eq!(v["tg_depth"], depths[0]["tg"]);
    assert_eq!(v["pp_depth"], depths[0]["pp"]);
    // Every repetition measured the empty cache too.
    assert_eq!(v["tg"]["n"], 4, "{v}");
    let o = sb.run(&["measure", m, "-d", "256,512", "--twice"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // The A/A test at one depth compares the figures a tune at that depth decides on.
    let o = sb.run(&[
        "measure", m, "-c", "2048", "-p", "32", "-n", "8", "-d", "256", "--twice", "-r", "2", "-t",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("pp32@d256") && out.contains("tg8@d256"),
        "{out}"
    );
}

/// Busy-loop processes, one per CPU, until dropped: a machine that other programs keep busy.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn start() -> Hogs {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get());
        Hogs(
            (0..n)
                .map(|_| {
                    std::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Other programs' CPU time while autotune measures (from /proc/stat, less autotune's own and its
/// workers') is reported: `measure` and `tune` warn, `tune` notes it in the report and the profile.
#[test]
fn a_machine_busy_with_other_programs_is_said_to_be_busy() {
    let model = demo_model();
    let sb = Sandbox::new();
    let _hogs = Hogs::start();
    let args = ["measure", model.to_str().unwrap(), "--json", "--reps", "2"];
    let knobs = ["-c", "512", "-p", "32", "-n", "4", "-t", "2"];
    let o = sb.run(&[&args[..], &knobs[..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let share = v["others_cpu_share"].as_f64().expect("others_cpu_share");
    assert!(share > 0.15, "{share}");
    assert!(
        stderr(&o).contains("the machine was busy: other programs took"),
        "{}",
        stderr(&o)
    );

    let profile = sb.dir.path().join("busy.toml");
    let knobs = "--ctx 512 --prompt 32 --gen 4 --threads 2 --cache-types f16 --flash-attn auto \
                 --kernels repack --min-reps 2 --max-reps 2 --budget 20s";
    let mut args = vec!["tune", model.to_str().unwrap(), "--json", "-o"];
    args.push(profile.to_str().unwrap());
    args.extend(knobs.split_whitespace());
    let o = sb.run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["others_cpu_share"].as_f64().unwrap() > 0.15, "{v}");
    let busy = "the machine was busy: other programs took";
    assert!(v["notes"].to_string().contains(busy), "{}", v["notes"]);
    assert!(
        stderr(&o).contains("time as autotune started"),
        "{}",
        stderr(&o)
    );
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains(busy), "{text}");

    // `doctor` says so before anyone tunes.
    let v = sb.run_json(&["doctor", "--json"]);
    assert!(v["others_cpu_share"].as_f64().unwrap() > 0.15, "{v}");
    let o = sb.run(&["doctor"]);
    assert!(
        stdout(&o).contains("warning      the machine is busy: other programs take"),
        "{}",
        stdout(&o)
    );
}
