//! End to end: RPC hosts that misbehave. A `--rpc` host that refuses, accepts and says nothing, is
//! given twice or is no IPv4 address is a one-line error within seconds, before anything is measured;
//! a run whose host answers its check and then freezes still ends on Ctrl-C.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A listener on a free loopback port and its `--rpc` endpoint.
fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let e = format!("127.0.0.1:{}", l.local_addr().unwrap().port());
    (l, e)
}

/// A stand-in for an RPC server that freezes right after autotune checked it: the first connection
/// is answered as a ggml RPC server answers HELLO and DEVICE_COUNT (protocol 7, one device), every
/// later one is accepted and never read (as by a server stopped with SIGSTOP).
fn answers_once_then_freezes(l: TcpListener) {
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for (n, s) in l.incoming().enumerate() {
            let Ok(mut s) = s else { return };
            if n > 0 {
                held.push(s);
                continue;
            }
            for answer in [
                [vec![7u8, 0, 0, 0], vec![0u8; 24]].concat(),
                vec![1, 0, 0, 0],
            ] {
                let mut head = [0u8; 9];
                if s.read_exact(&mut head).is_err() {
                    return;
                }
                let mut body =
                    vec![0u8; u64::from_le_bytes(head[1..].try_into().unwrap()) as usize];
                let _ = s.read_exact(&mut body);
                let _ = s.write_all(&(answer.len() as u64).to_le_bytes());
                let _ = s.write_all(&answer);
            }
        }
    });
}

fn tune_args<'a>(model: &'a str, rpc: &'a str) -> Vec<&'a str> {
    let mut a = vec!["tune", model, "--rpc", rpc, "--no-save"];
    a.extend_from_slice(SHORT);
    a
}

/// Runs autotune and asserts it failed within `limit` with `code`, one line naming `needle`.
fn fails_quickly(sb: &Sandbox, args: &[&str], code: i32, needle: &str, limit: Duration) {
    let t0 = Instant::now();
    let o = sb.run(args);
    let took = t0.elapsed();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    assert!(took < limit, "{args:?} took {took:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "'{needle}' in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(sb.stored_profiles().is_empty());
}

#[test]
fn a_bad_rpc_host_is_a_one_line_error_in_seconds_before_measuring() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    let limit = Duration::from_secs(20);

    // Refuses: nothing listens on the port.
    let (l, refused) = listener();
    drop(l);
    fails_quickly(&sb, &tune_args(m, &refused), 7, &refused, limit);

    // Accepts and says nothing: a listener that never accepts (the kernel completes the handshake).
    let (_silent_listener, silent) = listener();
    fails_quickly(
        &sb,
        &tune_args(m, &silent),
        7,
        "did not answer within",
        limit,
    );

    // The same host twice, written two ways; an IPv6 address (ggml would abort on it).
    let (_l, e) = listener();
    let twice = format!("{e},{}", e.replace("127.0.0.1", "localhost"));
    fails_quickly(&sb, &tune_args(m, &twice), 2, "same server", limit);
    fails_quickly(&sb, &tune_args(m, "[::1]:50052"), 2, "IPv4", limit);
    // Not HOST:PORT.
    fails_quickly(&sb, &tune_args(m, "127.0.0.1"), 2, "HOST:PORT", limit);
    // doctor and fit check the same way.
    fails_quickly(&sb, &["doctor", "--rpc", &silent], 7, &silent, limit);
    fails_quickly(&sb, &["fit", m, "--rpc", &refused], 7, &refused, limit);
}

/// The host answers autotune's own check and then freezes: ggml's next call to it blocks in a
/// socket read (no timeout there), where Ctrl-C once did nothing for 12 minutes. The run ends on
/// SIGINT within the stop grace (10 s) with status 130, and, left alone, within the probe's limit
/// (30 s) with an error naming the host.
#[test]
fn a_host_that_freezes_after_its_check_cannot_hold_the_run() {
    let model = demo_model();
    let m = model.to_str().unwrap();
    let sb = Sandbox::new();

    let (l, rpc) = listener();
    answers_once_then_freezes(l);
    let mut child = sb
        .cmd()
        .args(tune_args(m, &rpc))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "still blocked on the host"
    );
    let t0 = Instant::now();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    let took = t0.elapsed();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(took < Duration::from_secs(15), "{took:?}: {err}");
    assert!(err.contains("interrupted"), "{err}");

    let (l, rpc) = listener();
    answers_once_then_freezes(l);
    let t0 = Instant::now();
    let o = sb.run(&["doctor", "--rpc", &rpc]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(45), "{:?}", t0.elapsed());
    assert!(
        err.contains(&rpc) && err.contains("stopped answering"),
        "{err}"
    );
}

/// An `autotune rpc-serve` behind a throttled link (`link`: a link-sim preset); the proxy's
/// endpoint is what `--rpc` takes.
struct LinkedHost {
    _server: RpcServer,
    proxy: link_sim::Proxy,
}

impl LinkedHost {
    fn new(link: &str) -> Self {
        let server = rpc_server();
        let upstream = format!("127.0.0.1:{}", server.port).parse().unwrap();
        let spec = link_sim::LinkSpec::preset(link).unwrap();
        let proxy = link_sim::Proxy::start("127.0.0.1:0".parse().unwrap(), upstream, spec).unwrap();
        LinkedHost {
            _server: server,
            proxy,
        }
    }
    fn endpoint(&self) -> String {
        self.proxy.addr().to_string()
    }
}

/// One thread on this machine as on each host (each `rpc-serve -t 1`): alike, the link is the
/// difference. Placement only: one value of every other knob.
fn tune_over(
    sb: &Sandbox,
    rpc: &str,
    profile: &std::path::Path,
    extra: &[&str],
) -> serde_json::Value {
    let model = demo_model();
    let mut args = vec![
        "tune",
        model.to_str().unwrap(),
        "--json",
        "--out",
        profile.to_str().unwrap(),
        "--rpc",
        rpc,
        "--threads",
        "1",
        "--kernels",
        "plain",
        "--cache-types",
        "f16",
        "--ubatch",
        "512",
        "--flash-attn",
        "auto",
        "--ctx",
        "512",
        "--prompt",
        "64",
        "--gen",
        "32",
        "--min-reps",
        "2",
        "--max-reps",
        "3",
        "--budget",
        "150s",
    ];
    args.extend_from_slice(extra);
    sb.run_json(&args)
}

/// The demo model fits this machine: with one host over Wi-Fi (30 MB/s, 3 ms each way) the search
/// measures a placement on it and keeps this machine alone, and the profile records the link and
/// needs no server. Under a host budget the model does not fit (--mem-budget CPU=300M: the CPU-only
/// placement needs 344 MiB there), with a 10 GbE host and the Wi-Fi host: every layer goes to the
/// 10 GbE host alone, and the profile keeps only its server.
#[test]
fn a_slow_host_is_left_out_when_the_model_fits_and_a_fast_one_used_when_it_does_not() {
    let sb = Sandbox::new();
    let wifi = LinkedHost::new("wifi");
    let profile = sb.dir.path().join("fits.toml");
    let r = tune_over(&sb, &wifi.endpoint(), &profile, &[]);
    let w = &r["winner"];
    assert_eq!(
        w["n_gpu_layers"].as_u64(),
        Some(0),
        "{:#}",
        r["leaderboard"]
    );
    let on_host = (r["leaderboard"].as_array().unwrap().iter())
        .filter(|e| e["candidate"]["n_gpu_layers"].as_u64() > Some(0))
        .map(|e| e["status"].as_str().unwrap())
        .find(|s| *s == "ok" || s.starts_with("stopped"));
    assert!(
        on_host.is_some(),
        "a placement on the host measured: {:#}",
        r["leaderboard"]
    );
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(
        !text.contains("\nrpc = "),
        "this machine alone needs no server: {text}"
    );
    assert!(
        text.contains("[[hosts]]")
            && text.contains(&wifi.endpoint())
            && text.contains("used = false"),
        "{text}"
    );
    let o = sb.run(&["explain", profile.to_str().unwrap()]);
    let said = stdout(&o);
    assert!(
        said.contains("links") && said.contains("local alone") && said.contains("not used"),
        "{said}"
    );

    let fast = LinkedHost::new("10gbe");
    let rpc = format!("{},{}", fast.endpoint(), wifi.endpoint());
    let profile = sb.dir.path().join("tight.toml");
    let r = tune_over(&sb, &rpc, &profile, &["--mem-budget", "CPU=300M"]);
    let w = &r["winner"];
    assert!(w["n_gpu_layers"].as_u64() > Some(0), "{w}");
    let on = |dev: &str| {
        let devices = w["devices"].as_array().cloned().unwrap_or_default();
        let split = w["tensor_split"].as_array().cloned().unwrap_or_default();
        let k = if dev == "RPC0" { 0 } else { 1 };
        (devices.is_empty() || devices.iter().any(|d| d == dev))
            && split.get(k).is_none_or(|s| s.as_u64() > Some(0))
    };
    assert!(on("RPC0") && !on("RPC1"), "the 10 GbE host alone: {w}");
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(
        text.contains(&format!("rpc = [\"{}\"]", fast.endpoint())),
        "only the host used: {text}"
    );
}
