//! End to end: `autotune apply` and `autotune export` on a profile of the demo model tuned by the real
//! binary: the printed command, a real llama-server started and checked, refused hand-edited and stale
//! profiles, and every export format.
//!
//! The tests share one tuning run (about a minute on 2 cores); each works on its own copies of the profile.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A sandbox whose store holds a profile of the demo model, and a copy of that profile outside the store.
struct Tuned {
    sandbox: Sandbox,
    model: PathBuf,
    profile: PathBuf,
}

fn tuned() -> &'static Tuned {
    static TUNED: OnceLock<Tuned> = OnceLock::new();
    TUNED.get_or_init(|| {
        let model = demo_model();
        // Under the target dir: the fixture lives in a static, which is never dropped.
        let sandbox = Sandbox {
            dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir"),
        };
        let profile = sandbox.dir.path().join("tuned.toml");
        let mut args = vec![
            "-q",
            "tune",
            model.to_str().unwrap(),
            "--out",
            profile.to_str().unwrap(),
        ];
        args.extend_from_slice(SHORT);
        // Both kernel choices: the vendor llama-server is built with the same -O3 flags as the linked
        // llama.cpp (dead stores kept, see the README), so a repack (AMX) winner runs there too.
        args.extend_from_slice(&["--kernels", "repack,plain"]);
        let o = sandbox.run(&args);
        assert!(
            o.status.success(),
            "tuning failed: {}\n{}",
            stderr(&o),
            stdout(&o)
        );
        assert_eq!(
            sandbox.stored_profiles().len(),
            1,
            "the profile is in the store"
        );
        Tuned {
            sandbox,
            model,
            profile,
        }
    })
}

/// A copy of the tuned profile with `edit` applied, as `name` next to the store (not in it).
fn edited(name: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let t = tuned();
    let text = std::fs::read_to_string(&t.profile).unwrap();
    let changed = edit(&text);
    assert_ne!(changed, text, "the edit of {name} changed nothing");
    let path = t.sandbox.dir.path().join(name);
    std::fs::write(&path, changed).unwrap();
    path
}

/// A stand-in for llama-server that leaves a mark if anything runs it.
fn tripwire(name: &str) -> (PathBuf, PathBuf) {
    let dir = tuned().sandbox.dir.path();
    let mark = dir.join(format!("{name}.ran"));
    let script = dir.join(format!("{name}.sh"));
    std::fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", mark.display()),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (script, mark)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn exec_check_only_starts_the_server_and_compares_its_speed() {
    let t = tuned();
    let server = llama_server();
    let o = t.sandbox.run(&[
        "apply",
        s(&t.model),
        "--exec",
        "--check-only",
        "--json",
        "--server",
        s(&server),
    ]);
    assert!(
        o.status.success(),
        "apply --exec failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");

    let c = &v["completion"];
    assert!(
        c["predicted_n"].as_u64().unwrap() > 0,
        "a completion came back: {v}"
    );
    let server_tg = c["predicted_per_second"].as_f64().unwrap();
    assert!(server_tg > 0.0, "{v}");
    let profile_tg = v["profile_tg_tps"].as_f64().unwrap();
    let ratio = v["tg_ratio"].as_f64().unwrap();
    let tolerance = v["tolerance"].as_f64().unwrap();
    let within = v["within_tolerance"].as_bool().unwrap();
    assert!((ratio - server_tg / profile_tg).abs() < 1e-9, "{v}");
    assert_eq!(within, (ratio - 1.0).abs() <= tolerance, "{v}");
    assert_eq!(v["command"][0], s(&server));
    // The profile pins the slots and their cache, which this llama-server would choose itself (4
    // slots sharing one cache, llama.cpp #28849): said, with the server's own defaults.
    let overridden: Vec<&str> = (v["overridden"].as_array())
        .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    assert!(
        overridden
            .iter()
            .any(|o| o.starts_with("-np 1 (this llama-server's default: -1"))
            && overridden.iter().any(|o| o.starts_with("-no-kvu (")),
        "{v}"
    );
    // Speeds are not asserted: on a shared 2-core machine both figures move by a factor of two or more
    // from one minute to the next (performance lives in bench scripts, not timed tests). A gross error,
    // e.g. ms taken for s, is still caught.
    assert!(
        (0.05..20.0).contains(&ratio),
        "server tg {server_tg:.2} t/s vs profile {profile_tg:.2} t/s: {ratio:.2}×"
    );
    eprintln!(
        "apply --exec: server tg {server_tg:.2} t/s, profile tg {profile_tg:.2} t/s, ratio {ratio:.2} \
         (within ±{tolerance}: {within})"
    );

    // The quality line, and the server's greedy output against the f16-cache reference: the
    // profile's cache is f16 (a tie goes to the lossless cache), so they agree on (almost) every
    // token; the server's CPU kernels and batch sizes may differ from the reference's.
    assert!(
        v["quality"]
            .as_str()
            .unwrap()
            .starts_with("kv=f16/f16: lossless"),
        "{v}"
    );
    let a = &v["agreement"];
    assert_eq!(a["tokens"], 32, "{a}");
    let top1 = a["top1"].as_f64().unwrap();
    assert!(top1 >= 0.9, "{a}");
    eprintln!("apply --exec --check-only: {a}");

    // --check-only stopped the server: nothing listens on its port any more.
    let url = v["url"].as_str().unwrap();
    let addr = url.trim_start_matches("http://");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "llama-server still listens on {addr}"
    );
}

/// A profile whose cache was edited to a quantized one after the run: its quality record (the
/// gate held the run's caches to it) never measured the new cache, so `--check-only` starts the
/// server, says the agreement, and fails with exit code 9 and the reason on one line.
#[test]
fn check_only_fails_a_cache_edited_beyond_the_gate() {
    let t = tuned();
    let server = llama_server();
    let q4 = edited("q4.toml", |text| {
        let winner = text.find("\n[winner]\n").expect("[winner] table");
        let (head, tail) = text.split_at(winner);
        // K alone: a quantized V cache would need flash attention, which the winner may not have.
        let tail = tail.replacen("type_k = \"f16\"", "type_k = \"q4_0\"", 1);
        // server_args derived again from the edited winner, as the profile's header says.
        let start = head.find("\nserver_args = [").expect("server_args") + 1;
        let end = start + head[start..].find("]\n").unwrap() + 2;
        format!("{}{}{tail}", &head[..start], &head[end..])
    });
    let o = t.sandbox.run(&[
        "apply",
        s(&q4),
        "--exec",
        "--check-only",
        "--json",
        "--server",
        s(&server),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(9), "{err}\n{}", stdout(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints JSON");
    assert!(command_of(&v).contains(&"q4_0"), "{v}");
    assert!(
        v["quality"]
            .as_str()
            .unwrap()
            .contains("quality NOT checked"),
        "{v}"
    );
    let failed = v["agreement"]["failed"].as_str().expect("the reason");
    assert!(failed.contains("never measured"), "{failed}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("autotune: error: kv=q4_0/f16 was never measured"),
        "{err}"
    );
}

#[test]
fn apply_prints_the_server_command_line() {
    let t = tuned();
    let server = llama_server();
    let o = t.sandbox.run(&[
        "apply",
        s(&t.model),
        "--server",
        s(&server),
        "--port",
        "8123",
        "--",
        "--parallel",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // What the profile pins against the server's own choices, and what the command's cache costs
    // in quality, on stderr beside it.
    assert!(
        stderr(&o).contains("pins what llama-server would choose itself: -np 1 ("),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("autotune: quality kv=f16/f16: lossless"),
        "{}",
        stderr(&o)
    );
    let line = stdout(&o);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.starts_with(&format!("{} -m ", s(&server))), "{line}");
    assert!(
        line.contains(&format!(" -m {} ", s(&t.model.canonicalize().unwrap()))),
        "{line}"
    );
    assert!(
        line.trim_end()
            .ends_with("--host 127.0.0.1 --port 8123 --parallel 1"),
        "{line}"
    );

    // The same by profile file.
    let o = t.sandbox.run(&[
        "apply",
        s(&t.profile),
        "--server",
        s(&server),
        "--port",
        "8123",
        "--",
        "--parallel",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), line);
}

#[test]
fn a_hand_edited_profile_is_refused_before_anything_runs() {
    let injected = edited("injected.toml", |text| {
        let winner = text.find("[winner]").expect("[winner] table");
        let (head, tail) = text.split_at(winner);
        let start = tail.find("\nthreads = ").expect("threads in [winner]") + 1;
        let end = start + tail[start..].find('\n').unwrap();
        format!(
            "{head}{}threads = \"4; rm -rf /\"{}",
            &tail[..start],
            &tail[end..]
        )
    });
    let smuggled = edited("smuggled.toml", |text| {
        let start = text.find("\nserver_args = [").expect("server_args") + 1;
        let end = start + text[start..].find("]\n").unwrap();
        format!("{}, \"--foo\"{}", &text[..end], &text[end..])
    });
    for (profile, expected) in [
        (injected, "winner.threads"),
        (smuggled, "unexpected '--foo'"),
    ] {
        let (server, mark) = tripwire(profile.file_stem().unwrap().to_str().unwrap());
        let o = tuned()
            .sandbox
            .run(&["apply", s(&profile), "--exec", "--server", s(&server)]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(5), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with("autotune: error: ") && err.contains(expected),
            "{err}"
        );
        assert!(stdout(&o).is_empty(), "{}", stdout(&o));
        assert!(
            !mark.exists(),
            "the server was run for {}",
            profile.display()
        );
    }
}

#[test]
fn export_writes_every_format() {
    use profiles::ExportFormat;
    let t = tuned();
    for &format in ExportFormat::all() {
        let name = format.to_string();
        let o = t.sandbox.run(&["export", s(&t.model), "--format", &name]);
        assert!(o.status.success(), "{format}: {}", stderr(&o));
        let text = stdout(&o);
        assert!(
            text.contains("gemma") || text.contains(".gguf"),
            "{format}: {text}"
        );
        match format {
            ExportFormat::Args => {
                let (quality, command) = text.split_once('\n').unwrap();
                assert!(
                    quality.starts_with("# quality kv=f16/f16: lossless"),
                    "{text}"
                );
                assert!(command.starts_with("llama-server -m "), "{text}");
            }
            ExportFormat::LlamaSwap => assert!(text.contains("${PORT}"), "{text}"),
            ExportFormat::Json => {
                let p: profiles::Profile =
                    serde_json::from_str(&text).expect("the json export is a profile");
                p.validate(true).unwrap();
            }
            ExportFormat::Presets | ExportFormat::Ollama => {}
        }
    }

    let out = t.sandbox.dir.path().join("swap.yaml");
    let o = t.sandbox.run(&[
        "export",
        s(&t.profile),
        "-f",
        "llama-swap",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
    assert!(std::fs::read_to_string(&out).unwrap().contains("${PORT}"));

    let o = t
        .sandbox
        .run(&["export", s(&t.profile), "--format", "yaml"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let names: Vec<String> = ExportFormat::all().iter().map(|f| f.to_string()).collect();
    assert!(
        stderr(&o).contains(&format!("[possible values: {}]", names.join(", "))),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_stale_profile_is_refused_unless_forced() {
    let t = tuned();
    let stale = edited("stale.toml", |text| {
        let machine = text.find("[machine]").expect("[machine] table");
        let start = machine
            + text[machine..].find("\nfingerprint = \"").unwrap()
            + "\nfingerprint = \"".len();
        format!(
            "{}{}{}",
            &text[..start],
            "ab".repeat(32),
            &text[start + 64..]
        )
    });
    let o = t
        .sandbox
        .run(&["apply", s(&stale), "--server", s(&llama_server())]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("stale") && err.contains("another machine") && err.contains("--force"),
        "{err}"
    );
    assert!(stdout(&o).is_empty());

    let o = t.sandbox.run(&[
        "apply",
        s(&stale),
        "--server",
        s(&llama_server()),
        "--force",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("stale"), "warned: {}", stderr(&o));
    assert!(stdout(&o).contains(" -m "));

    let o = t.sandbox.run(&["export", s(&stale)]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let o = t.sandbox.run(&["export", s(&stale), "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // `show` shows it, and says why it is stale; the fresh one it shows without a word.
    let o = t.sandbox.run(&["show", s(&stale)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("[winner]"), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("stale: measured on another machine") && err.contains("tune again"),
        "{err}"
    );
    let o = t.sandbox.run(&["show", s(&t.profile)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("stale"), "{}", stderr(&o));
}

#[test]
fn a_model_without_a_profile_says_what_to_run() {
    let sb = Sandbox::new();
    let model = demo_model();
    let o = sb.run(&["apply", s(&model)]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains("no profile for this model on this machine; run `autotune"),
        "{err}"
    );
}

/// A NUMA strategy goes from the tune to the profile to llama-server: tuned with `--numa
/// distribute` alone (so the winner has it), the profile's command carries `--numa distribute`,
/// and the vendored llama-server runs it and answers.
#[test]
fn a_numa_strategy_reaches_llama_server() {
    let model = demo_model();
    let sb = Sandbox::new();
    let profile = sb.dir.path().join("numa.toml");
    let mut args = vec![
        "-q",
        "tune",
        s(&model),
        "--out",
        s(&profile),
        "--numa",
        "distribute",
        "--kernels",
        "repack",
    ];
    args.extend_from_slice(SHORT);
    let o = sb.run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = sb.run_json(&strs(&apply_check_args(&profile, &llama_server())));
    let command: Vec<&str> = command_of(&v);
    assert!(
        command.windows(2).any(|w| w == ["--numa", "distribute"]),
        "{command:?}"
    );
    assert!(v["completion"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
}

/// `export --all`: every model tuned on this machine in one file for a runner that serves several
/// (llama-server's router, llama-swap, a JSON array), a stale profile left out with a warning, and
/// the presets file served by the real llama-server router, one model at a time, each on its own
/// profile's settings.
#[test]
fn export_all_makes_one_router_file_that_llama_server_serves() {
    let t = tuned();
    let sb = Sandbox::new();
    let o = sb.run(&["export", "--all"]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(stderr(&o).contains("no usable profile"), "{}", stderr(&o));

    // The demo model's profile from the shared run, and the tiny model tuned here.
    std::fs::create_dir_all(sb.profiles()).unwrap();
    let demo = t.sandbox.stored_profiles().remove(0);
    std::fs::copy(&demo, sb.profiles().join(demo.file_name().unwrap())).unwrap();
    let tiny = tiny_model();
    let mut args = vec!["-q", "tune", s(&tiny)];
    args.extend_from_slice(SHORT);
    let o = sb.run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    // A profile of a model file that has changed since: stale, so left out.
    let tiny_profile = sb
        .stored_profiles()
        .into_iter()
        .find(|p| s(p).contains("tiny"))
        .expect("the tiny model's profile");
    let text = std::fs::read_to_string(&tiny_profile).unwrap();
    let model_fp = profiles::StoredProfile::read(&tiny_profile)
        .unwrap()
        .profile
        .model
        .fingerprint;
    let name = s(tiny_profile.file_name().unwrap().as_ref())
        .replace(&model_fp[..12], &"e".repeat(12))
        .replace("test-llama-tiny", "changed");
    std::fs::write(
        sb.profiles().join(&name),
        text.replace(&model_fp, &"e".repeat(64)),
    )
    .unwrap();

    let ini = sb.dir.path().join("models.ini");
    let o = sb.run(&["export", "--all", "-f", "presets", "-o", s(&ini)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("left out {}", s(&sb.profiles().join(&name))))
            && err.contains("stale"),
        "{err}"
    );
    let presets = std::fs::read_to_string(&ini).unwrap();
    assert_eq!(presets.matches("\n[").count(), 2, "{presets}");
    assert!(presets.contains("--models-max 1"), "{presets}");

    let v = sb.run_json(&["export", "--all", "-f", "json"]);
    let exported: Vec<profiles::Profile> = serde_json::from_value(v).unwrap();
    assert_eq!(exported.len(), 2);
    let swap = stdout(&sb.run(&["export", "--all", "-f", "llama-swap"]));
    assert_eq!(swap.matches("${PORT}").count(), 2, "{swap}");
    let o = sb.run(&["export", "--all", "-f", "args"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("holds one profile, not 2"),
        "{}",
        stderr(&o)
    );
    // Named targets make the same file as --all.
    let o = sb.run(&["export", s(&t.model), s(&tiny), "-f", "presets"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).matches("\n[").count(), 2);

    router_serves(&ini, &exported);
}

/// llama-server's router started on the presets file answers a completion from each profile's model,
/// each run with its profile's context size.
fn router_serves(ini: &Path, exported: &[profiles::Profile]) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new(llama_server())
        .args(["--models-preset", s(ini), "--models-max", "1"])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start llama-server");
    let _router = Router(child);
    let base = format!("http://127.0.0.1:{port}");
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(120))
        .build();
    let listed = (0..120)
        .find_map(|_| {
            let r = agent.get(&format!("{base}/models")).call().ok();
            if r.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            r
        })
        .expect("the router answers /models");
    let listed: serde_json::Value = listed.into_json().unwrap();
    for p in exported {
        let name = p.model_stem();
        let v: serde_json::Value = agent
            .post(&format!("{base}/v1/completions"))
            .send_json(serde_json::json!({
                "model": name, "prompt": "The capital of France is", "max_tokens": 8
            }))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .into_json()
            .unwrap();
        assert_eq!(v["model"], name.as_str(), "{v}");
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{v}");
        let entry = listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} listed: {listed}"));
        let args: Vec<&str> = entry["status"]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let ctx = p.workload.n_ctx.to_string();
        assert!(
            args.windows(2).any(|w| w == ["--ctx-size", ctx.as_str()]),
            "{name}: {args:?}"
        );
    }
}

/// The router, stopped as a user would (SIGTERM: it stops its model instances too) when the test ends.
struct Router(std::process::Child);

impl Drop for Router {
    fn drop(&mut self) {
        // SAFETY: a signal to a child this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        for _ in 0..100 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
