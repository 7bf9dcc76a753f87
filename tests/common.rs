//! Shared helpers of the end-to-end tests: the real binary, the real demo model, and a private
//! store and cache per test so tests never touch the user's profiles.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_autotune"))
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The demo model (fetched and verified by vendor/fetch-demo-model; cached after the first time).
pub fn demo_model() -> PathBuf {
    if let Some(p) = std::env::var_os("AUTOTUNE_DEMO_MODEL") {
        return p.into();
    }
    let out = Command::new(repo_root().join("vendor/fetch-demo-model"))
        .output()
        .expect("run vendor/fetch-demo-model");
    assert!(
        out.status.success(),
        "fetching the demo model failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}

/// A test's private environment: profile store and cache in a temp dir.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Self {
        Sandbox {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }
    pub fn profiles(&self) -> PathBuf {
        self.dir.path().join("profiles")
    }
    pub fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.env("AUTOTUNE_PROFILE_DIR", self.profiles())
            .env("AUTOTUNE_CACHE_DIR", self.cache())
            .env_remove("RUST_BACKTRACE");
        c
    }
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("run autotune")
    }
    /// The JSON a successful run (`… --json`) printed; a failed run fails the test with its output.
    pub fn run_json(&self, args: &[&str]) -> serde_json::Value {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "{args:?}: {}\n{}",
            stderr(&o),
            stdout(&o)
        );
        serde_json::from_str(&stdout(&o)).expect("--json prints JSON")
    }
    /// Files in the profile store (none may appear after a failed run).
    pub fn stored_profiles(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.profiles())
            .map(|it| {
                it.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A short tuning workload so a test finishes in about a minute on 2 cores: the workload and the
/// repetition limits (no budget: tests add theirs).
pub const SHORT_WORKLOAD: &[&str] = &[
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
];

/// A small knob space: two threads, f16/q8_0 KV, default flash attention and micro-batch.
pub const SHORT_KNOBS: &[&str] = &[
    "--threads",
    "2",
    "--cache-types",
    "f16,q8_0",
    "--flash-attn",
    "auto",
    "--ubatch",
    "512",
];

/// One value of each knob that tests of another axis leave alone: two threads, f16 KV, default
/// flash attention and micro-batch.
pub const FIXED_KNOBS: &[&str] = &[
    "--threads",
    "2",
    "--cache-types",
    "f16",
    "--flash-attn",
    "auto",
    "--ubatch",
    "512",
];

/// SHORT_WORKLOAD + SHORT_KNOBS + a 60 s budget.
pub const SHORT: &[&str] = &[
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
    "--cache-types",
    "f16,q8_0",
    "--flash-attn",
    "auto",
    "--ubatch",
    "512",
    "--budget",
    "60s",
];

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `apply --json`'s `command`: the llama-server command line it ran, as strings.
pub fn command_of(v: &serde_json::Value) -> Vec<&str> {
    v["command"]
        .as_array()
        .expect("apply --json has a command")
        .iter()
        .map(|a| a.as_str().expect("command arguments are strings"))
        .collect()
}

/// An `autotune rpc-serve` on loopback (one thread), killed when dropped: a real non-CPU device.
pub struct RpcServer {
    child: std::process::Child,
    /// The port it listens on, chosen by [`rpc_server`].
    pub port: u16,
}

impl RpcServer {
    /// `127.0.0.1:PORT`, as `--rpc` takes it.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether something listens on 127.0.0.1:`port` (or any address), read from /proc/net/tcp: a
/// probing connection would be a client to the server, and one that connects and goes away at
/// once has been seen to end a ggml RPC server.
fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let want = format!(":{port:04X}");
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
    })
}

/// Ports tried by [`rpc_server`]: below Linux's ephemeral range (32768–60999), where an outgoing
/// connection of any process may hold a port as its local end (CI once saw a server on 50312 fail
/// to bind), and spread by the process id so two test binaries rarely start on the same one.
fn candidate_ports() -> impl Iterator<Item = u16> {
    static TRIED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let first = std::process::id() % 500 * 20;
    (0..40).map(move |_| {
        let n = TRIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        20000 + ((first + n) % 12000) as u16
    })
}

/// Starts `autotune rpc-serve` on a free loopback port and waits until it listens (up to a minute:
/// on a busy 2-core machine the server's start-up, which loads the ggml backends, can take several
/// seconds). A server that cannot bind exits at once; the next candidate port is tried. Panics
/// with the server's own stderr when every candidate fails.
pub fn rpc_server() -> RpcServer {
    let mut last_error = String::new();
    for port in candidate_ports() {
        // A port something else holds is skipped before a server is started on it; the listener
        // is closed again at once (std sets SO_REUSEADDR, as ggml's server does).
        if listening(port) || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        match start_rpc_server(port) {
            Ok(server) => return server,
            Err(e) => last_error = e,
        }
    }
    panic!("no autotune rpc-serve could listen on a loopback port; the last said: {last_error}");
}

/// One try of [`rpc_server`] on `port`: the server, or what it printed when it exited.
fn start_rpc_server(port: u16) -> Result<RpcServer, String> {
    let log = tempfile::NamedTempFile::new().expect("temporary file for rpc-serve's stderr");
    let mut child = Command::new(bin())
        .args(["rpc-serve", "--port", &port.to_string(), "-t", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().expect("reopen the temporary file"))
        .spawn()
        .expect("autotune rpc-serve");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !listening(port) {
        if let Ok(Some(status)) = child.try_wait() {
            let said = std::fs::read_to_string(log.path()).unwrap_or_default();
            return Err(format!("port {port}, {status}: {}", said.trim()));
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("autotune rpc-serve on port {port} did not listen within a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok(RpcServer { child, port })
}

/// The llama-server built by vendor/build-llama-tools (in the real cache, not the sandbox's: the sandbox's
/// cache is empty, so the test passes the server with --server).
pub fn llama_server() -> PathBuf {
    static SERVER: OnceLock<PathBuf> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let out = Command::new(repo_root().join("vendor/build-llama-tools"))
                .output()
                .expect("run vendor/build-llama-tools");
            assert!(
                out.status.success(),
                "building llama-server failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let bin = PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
                .join("llama-server");
            assert!(bin.is_file(), "{} missing", bin.display());
            bin
        })
        .clone()
}

/// The tiny random-weight llama (4 layers, 1.6 MiB) from `vendor/make-test-model --preset tiny`.
pub fn tiny_model() -> PathBuf {
    test_model("tiny")
}

/// The tiny random-weight mixture of experts (4 layers, 8 experts, 2 used, trained context 2048)
/// from `vendor/make-tiny-moe`.
pub fn tiny_moe_model() -> PathBuf {
    let out = Command::new(repo_root().join("vendor/make-tiny-moe"))
        .output()
        .expect("vendor/make-tiny-moe");
    assert!(out.status.success(), "{}", stderr(&out));
    PathBuf::from(stdout(&out).trim())
}

/// A random-weight llama from `vendor/make-test-model --preset PRESET` (written once, then reused).
pub fn test_model(preset: &str) -> PathBuf {
    let out = Command::new(repo_root().join("vendor/make-test-model"))
        .args(["--preset", preset])
        .output()
        .expect("vendor/make-test-model");
    assert!(out.status.success(), "{}", stderr(&out));
    PathBuf::from(stdout(&out).trim())
}

/// `apply PROFILE --exec --check-only --json --server SERVER`: the profile applied to a real
/// llama-server that answers one completion and stops.
pub fn apply_check_args(profile: &Path, server: &Path) -> Vec<String> {
    [
        "apply",
        profile.to_str().unwrap(),
        "--exec",
        "--check-only",
        "--json",
        "--server",
        server.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// Words as `&str`, for `Sandbox::run` and `Command::args`.
pub fn strs(words: &[String]) -> Vec<&str> {
    words.iter().map(String::as_str).collect()
}

/// llama.cpp's fit placement of `model` at `ctx` tokens with RPC server `rpc` and no budget
/// (`autotune fit --json`): its GPU layers and autotune's dry-run prediction of its bytes on RPC0.
pub fn fit_on_rpc0(sb: &Sandbox, model: &Path, rpc: &str, ctx: &str) -> (u64, u64) {
    let v = sb.run_json(&[
        "fit",
        model.to_str().unwrap(),
        "--json",
        "--rpc",
        rpc,
        "--ctx",
        ctx,
    ]);
    let bytes = v["predicted"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == "RPC0")
        .and_then(|d| d["predicted_bytes"].as_u64())
        .unwrap_or_else(|| panic!("no RPC0 prediction: {v:#}"));
    (v["n_gpu_layers"].as_u64().unwrap(), bytes)
}
