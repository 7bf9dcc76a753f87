//! End to end: `scripts/install` puts autotune, llama.cpp's shared libraries and ggml's backend
//! modules into a prefix, and the installed binary runs from there by itself — no
//! `AUTOTUNE_BACKEND_DIR`, no other environment, its own libraries and modules rather than the build's.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `scripts/install --bin <the binary under test> ARGS` (never a build: cargo holds the target
/// dir's lock while tests run).
fn install(args: &[&Path]) -> Output {
    Command::new(repo_root().join("scripts/install"))
        .arg("--bin")
        .arg(bin())
        .args(args)
        .env_remove("AUTOTUNE_BACKEND_DIR")
        .output()
        .expect("run scripts/install")
}

/// The installed binary with nothing in its environment but HOME (a private one, so nothing it
/// writes or looks up under ~ is the user's) and a system PATH.
fn installed(prefix: &Path, home: &Path) -> Command {
    let mut c = Command::new(prefix.join("bin/autotune"));
    c.env_clear()
        .env("HOME", home)
        .env("PATH", "/usr/bin:/bin")
        .current_dir(home);
    c
}

fn installed_prefix(sb: &Sandbox) -> PathBuf {
    let prefix = sb.dir.path().join("prefix");
    let o = install(&[&prefix]);
    assert!(o.status.success(), "install failed: {}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!(
            "is now at {}",
            prefix.join("bin/autotune").display()
        )),
        "{}",
        stdout(&o)
    );
    prefix.canonicalize().unwrap()
}

#[test]
fn installed_binary_loads_its_own_libraries_and_backends() {
    let sb = Sandbox::new();
    let prefix = installed_prefix(&sb);
    let libdir = prefix.join("lib/autotune");
    let home = sb.dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();

    // llama.cpp's shared libraries resolve to the prefix, not to the cargo build they came from
    // (with nothing set: cargo sets LD_LIBRARY_PATH to the build's folders for tests).
    let ldd = Command::new("ldd")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .arg(prefix.join("bin/autotune"))
        .output()
        .expect("run ldd");
    let ldd = stdout(&ldd);
    let llama_libs: Vec<&str> = ldd
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("libllama") || l.starts_with("libggml")
        })
        .collect();
    assert!(llama_libs.len() >= 2, "{ldd}");
    for line in llama_libs {
        let path = line.split("=>").nth(1).unwrap().split(" (").next().unwrap();
        let path = Path::new(path.trim()).canonicalize().unwrap();
        assert!(path.starts_with(&libdir), "{line} is not under {libdir:?}");
    }

    // doctor: the CPU backend (a CPU variant module) and the RPC backend module, both loaded from
    // the prefix.
    let o = installed(&prefix, &home)
        .args(["--verbose", "doctor", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "doctor failed: {}", stderr(&o));
    let doctor: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("doctor --json");
    let backends: Vec<&str> = doctor["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b.as_str())
        .collect();
    assert!(backends.contains(&"CPU"), "{backends:?}");
    assert!(backends.contains(&"RPC"), "{backends:?}");
    assert!(
        doctor["cpu_variant"].as_str().is_some(),
        "a CPU variant module was loaded: {doctor}"
    );
    let log = stderr(&o);
    for (backend, module) in [("CPU", "libggml-cpu-"), ("RPC", "libggml-rpc.so")] {
        let line = format!(
            "loaded {backend} backend from {}",
            libdir.join(module).display()
        );
        assert!(log.contains(&line), "no '{line}' in:\n{log}");
    }

    // A short tune from there: its workers are the installed binary too.
    let model = demo_model();
    let mut args = vec!["tune", model.to_str().unwrap(), "--no-save", "--json"];
    args.extend_from_slice(SHORT_WORKLOAD);
    args.extend_from_slice(FIXED_KNOBS);
    args.extend_from_slice(&["--budget", "30s"]);
    let o = installed(&prefix, &home).args(&args).output().unwrap();
    assert!(
        o.status.success(),
        "tune from the prefix failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("tune --json");
    // Measured at all (how fast is not this test's business: the machine may be busy).
    assert!(
        report["winner_figures"]["tg_tps"].as_f64().unwrap() > 0.0,
        "{report}"
    );
}

#[test]
fn a_second_install_replaces_the_first_and_leaves_nothing_behind() {
    let sb = Sandbox::new();
    let prefix = installed_prefix(&sb);
    let stale = prefix.join("lib/autotune/libggml-cpu-stale.so");
    std::fs::write(&stale, b"not a module").unwrap();

    let o = install(&[&prefix]);
    assert!(o.status.success(), "second install failed: {}", stderr(&o));
    assert!(!stale.exists(), "the earlier install's folder was replaced");
    let mut entries: Vec<String> = std::fs::read_dir(&prefix)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        ["bin", "lib"],
        "no staging folder is left in the prefix"
    );
    let o = installed(&prefix, sb.dir.path())
        .arg("--version")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_prefix_that_cannot_be_written_is_one_error_line() {
    let sb = Sandbox::new();
    // Nobody, root included, can create a folder below a regular file.
    let file = sb.dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let mut prefixes = vec![file.join("prefix")];
    // A read-only folder stops everyone but root.
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        let ro = sb.dir.path().join("read-only");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
        prefixes.push(ro);
    }
    for prefix in prefixes {
        let o = install(&[&prefix]);
        assert!(!o.status.success(), "install into {prefix:?} succeeded");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with(&format!("error: cannot write to {}", prefix.display())),
            "{err}"
        );
    }
}
