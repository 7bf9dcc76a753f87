//! `autotune apply`: the llama-server command a profile stands for, and with `--exec` that server
//! started, asked for a completion and its generation speed compared with the profile's (and, when
//! the profile speculates, the server's own acceptance figures shown beside the profile's).

mod agreement;
mod defaults;
mod report;
mod server;
mod speculation;
mod timings;

use crate::cli::{ApplyArgs, Cli};
use crate::exit::{self, Exit};
use crate::session;
use crate::stored;
use anyhow::Context as _;
use profiles::Profile;
use report::Check;
use server::ServerProcess;
use speculation::SpeculationCheck;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use timings::Timings;

pub fn run(cli: &Cli, args: &ApplyArgs) -> anyhow::Result<i32> {
    check_tolerance(args.tolerance)?;
    let stored = stored::resolve(&args.target, args.force, cli.verbose)?;
    let p = &stored.profile;

    let server = find_server(args.server.as_deref())?;
    let (version, profile_llama, same_build) = build_of(server.as_deref(), p);
    let (argv, port) = server_argv(p, args)?;
    let overridden = say_overridden(server.as_deref(), &argv, cli.quiet);

    if !args.exec {
        print_command(server.as_deref(), argv, p, cli.quiet);
        return Ok(exit::OK);
    }

    let server = server.ok_or_else(|| {
        Exit::new(
            exit::ERROR,
            "llama-server not found (not on PATH, no vendor build): pass --server PATH or build it with \
             vendor/build-llama-tools",
        )
    })?;
    if !is_loopback(&args.host) {
        eprintln!(
            "autotune: warning: llama-server will listen on {}: reachable from other machines",
            args.host
        );
    }
    let signal = interrupt_counter()?;

    let (mut proc, url, ready_s) = start(&server, &argv, args, port, cli, &signal, p)?;

    let (timings, profile_tg, speculation) = measure(&mut proc, &url, p, &signal)?;
    // The server's output against the f16-cache reference: the quality figure where it is used.
    let agreement = (args.check_only)
        .then(|| agreement::check(&mut proc, &url, p, &signal))
        .transpose()?;
    let tg_ratio = timings.predicted_per_second / profile_tg;
    let check = Check {
        profile: stored.path.clone(),
        server: server.clone(),
        server_version: version,
        profile_llama,
        same_llama_build: same_build,
        command: env_words(&p.server_env)
            .chain(std::iter::once(server.to_string_lossy().into_owned()))
            .chain(argv)
            .collect(),
        url: url.clone(),
        ready_s,
        completion: timings,
        requests: p.workload.n_parallel.max(1),
        profile_tg_tps: profile_tg,
        profile_pp_tps: p.figures.pp_tps,
        tg_ratio,
        tolerance: args.tolerance,
        within_tolerance: (tg_ratio - 1.0).abs() <= args.tolerance,
        speculation,
        quality: stored::quality_line(p),
        agreement,
        overridden,
    };
    report::print(&check, args.json)?;

    if args.check_only {
        proc.stop(&signal);
        if let Some(why) = check.agreement.and_then(|a| a.failed) {
            return Err(Exit::new(exit::QUALITY_CHECK, why));
        }
        return Ok(exit::OK);
    }
    proc.echo.store(true, Ordering::Relaxed);
    eprintln!(
        "autotune: llama-server is running at {url} (pid {}); press Ctrl-C to stop it",
        proc.child.id()
    );
    server::serve_in_foreground(&mut proc, &signal)
}

fn check_tolerance(tolerance: f64) -> anyhow::Result<()> {
    if tolerance.is_finite() && tolerance > 0.0 {
        return Ok(());
    }
    Err(Exit::new(
        exit::USAGE,
        format!("--tolerance {tolerance} must be a positive number, e.g. 0.25"),
    ))
}

/// The check's completions, on the prompt for the profile (of its speculation's kind when it has
/// one); the measured completion's timings, the generation speed the profile promises for this
/// command line (with its speculation when it has one) and the server's speculation beside the
/// profile's.
fn measure(
    proc: &mut ServerProcess,
    url: &str,
    p: &Profile,
    signal: &AtomicUsize,
) -> anyhow::Result<(Timings, f64, Option<SpeculationCheck>)> {
    let expected = speculation::expected(p);
    let prompt = expected
        .as_ref()
        .map(|e| speculation::prompt(e, &p.workload.name));
    let answer = check_completion(proc, url, p, prompt.as_ref(), signal)?;
    let profile_tg = expected
        .as_ref()
        .map(|e| e.tg_tps)
        .filter(|tg| *tg > 0.0)
        .unwrap_or(p.figures.tg_tps);
    let speculation = expected
        .zip(prompt)
        .map(|(e, prompt)| SpeculationCheck::new(&e, &prompt, &answer.timings));
    Ok((answer.timings, profile_tg, speculation))
}

/// The server's version line, the profile's llama.cpp, and whether they name the same build
/// (a warning when they do not).
fn build_of(server: Option<&Path>, p: &Profile) -> (Option<String>, String, bool) {
    let version = server.and_then(server_version);
    let profile_llama = format!("{} (commit {})", p.llama.version, p.llama.commit);
    let same_build = version.as_deref().is_some_and(|v| names_build(v, p));
    if let Some(v) = &version {
        if !same_build {
            eprintln!(
                "autotune: warning: llama-server reports `{v}`, the profile was measured with llama.cpp \
                 {profile_llama}: if these are different llama.cpp builds, speeds may differ"
            );
        }
    }
    (version, profile_llama, same_build)
}

/// Starts llama-server and waits for its health check; the process, its URL and the seconds it took.
fn start(
    server: &Path,
    argv: &[String],
    args: &ApplyArgs,
    port: u16,
    cli: &Cli,
    signal: &AtomicUsize,
    p: &Profile,
) -> anyhow::Result<(ServerProcess, String, f64)> {
    let started = Instant::now();
    let mut proc = ServerProcess::start(server, argv, &p.server_env, cli.verbose)?;
    let url = format!("http://{}:{port}", connect_host(&args.host));
    if !cli.quiet {
        eprintln!(
            "autotune: started llama-server (pid {}), waiting for {url}/health",
            proc.child.id()
        );
    }
    if let Err(e) = server::wait_ready(&mut proc, &url, signal) {
        return Err(match proc.refusal() {
            Some(r) => refused(&r, server, p),
            None => e,
        });
    }
    let ready_s = started.elapsed().as_secs_f64();
    Ok((proc, url, ready_s))
}

/// A server that refused one of the profile's arguments at start-up (a build without an option the
/// profile uses), as exit code 6 on one line; naming the profile's speculation when the refused flag
/// is one of it.
fn refused(r: &server::Refusal, server: &Path, p: &Profile) -> anyhow::Error {
    let what = match speculation::expected(p) {
        Some(e) if e.flags.contains(&r.argument.as_str()) => {
            format!(
                "it does not support the profile's speculative decoding ({})",
                e.spec_type
            )
        }
        _ => "it does not support an option of the profile's command line".into(),
    };
    Exit::new(
        exit::SERVER_REFUSED,
        format!(
            "llama-server {} refused `{}` ({}): {what}; pass --server PATH to a llama-server of the \
             llama.cpp build that measured the profile (vendor/build-llama-tools builds one)",
            server.display(),
            r.argument,
            r.reason,
        ),
    )
}

/// llama-server's arguments: the profile's, the address, then the user's extra ones; and the port.
fn server_argv(p: &Profile, args: &ApplyArgs) -> anyhow::Result<(Vec<String>, u16)> {
    let port = if args.port == 0 {
        free_port(&args.host)?
    } else {
        args.port
    };
    let mut argv = p.server_args.clone();
    argv.extend([
        "--host".to_string(),
        args.host.clone(),
        "--port".to_string(),
        port.to_string(),
    ]);
    argv.extend(args.extra.iter().cloned());
    Ok((argv, port))
}

/// The signal received (SIGINT or SIGTERM), 0 until then. Installed before the server starts, so a
/// Ctrl-C at any point stops it instead of orphaning it.
fn interrupt_counter() -> anyhow::Result<Arc<AtomicUsize>> {
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)
            .context("cannot install the interrupt handler")?;
    }
    Ok(signal)
}

/// The profile's environment as shell words (`GGML_OP_OFFLOAD_MIN_BATCH=64`), for the line shown.
fn env_words(
    env: &std::collections::BTreeMap<String, String>,
) -> impl Iterator<Item = String> + '_ {
    env.iter().map(|(k, v)| format!("{k}={v}"))
}

/// The command line `apply` prints without `--exec` (the environment the profile needs, then the
/// server and its arguments), and on stderr what its cache costs in quality (stdout is the command
/// line alone; `--exec` says it in its report). `quiet` leaves out all but a lossy cache nobody
/// checked.
fn print_command(server: Option<&Path>, argv: Vec<String>, p: &Profile, quiet: bool) {
    if !quiet || (p.quality.is_none() && p.winner.kv_lossy()) {
        eprintln!("autotune: quality {}", stored::quality_line(p));
    }
    let env = &p.server_env;
    let program = match server {
        Some(s) => s.to_string_lossy().into_owned(),
        None => {
            eprintln!(
                "autotune: warning: llama-server not found (not on PATH, no vendor build): pass --server PATH \
                 or build it with vendor/build-llama-tools"
            );
            "llama-server".to_string()
        }
    };
    let mut line: Vec<String> = env_words(env).collect();
    line.push(program);
    line.extend(argv);
    println!("{}", profiles::shell_quote(&line));
}

/// Two completions: the first warms the server up, the second is the one compared (for a profile
/// of N requests at once, N completions sent together and added up). `spec_prompt`: a
/// profile with speculation is checked on a prompt of its kind, for at least
/// [`speculation::MIN_GEN`] tokens.
fn check_completion(
    proc: &mut ServerProcess,
    url: &str,
    p: &Profile,
    spec_prompt: Option<&crate::speculative::prompts::Prompt>,
    signal: &AtomicUsize,
) -> anyhow::Result<server::CompletionAnswer> {
    // The first completion warms the server up (page cache, allocations, first-request paths); the
    // second is the one compared. Both leave room for the prompt in the context.
    let (prompt, n_gen) = match spec_prompt {
        Some(sp) => (sp.text.as_str(), p.workload.n_gen.max(speculation::MIN_GEN)),
        None => (server::PROMPT, p.workload.n_gen.max(1)),
    };
    let timeout = Duration::from_secs_f64(
        (60.0 + 10.0 * f64::from(n_gen) / p.figures.tg_tps.max(0.1)).min(3600.0),
    );
    let slot = profiles::slot_ctx(p.workload.n_ctx, p.workload.n_parallel);
    let prompt = &server::prompt_within(url, prompt, slot.saturating_sub(n_gen + 1), timeout)?;
    let warmup = server::complete(proc, url, prompt, n_gen.min(16), timeout, signal)?;
    let room = slot.saturating_sub(u32::try_from(warmup.timings.prompt_n).unwrap_or(u32::MAX) + 1);
    if room < n_gen {
        eprintln!(
            "autotune: warning: the context ({slot} tokens a slot) leaves room for {room} generated tokens after \
             the check's prompt, fewer than the {n_gen} the check generates"
        );
    }
    // With N slots the profile's figures are N requests' together: N completions at once.
    let np = p.workload.n_parallel.max(1);
    let n_predict = n_gen.min(room).max(1);
    let answers = server::complete_together(proc, url, prompt, n_predict, np, timeout, signal)?;
    if answers
        .iter()
        .any(|a| a.timings.predicted_n == 0 || a.content.is_empty())
    {
        return Err(Exit::new(
            exit::ERROR,
            "llama-server answered the completion without generating any text",
        ));
    }
    Ok(together(answers))
}

/// Completions answered at once as one: their tokens and their rates added up (each request's
/// rate is its own while they all ran).
fn together(mut answers: Vec<server::CompletionAnswer>) -> server::CompletionAnswer {
    let mut first = answers.remove(0);
    for a in answers {
        let (t, u) = (&mut first.timings, a.timings);
        t.prompt_n += u.prompt_n;
        t.prompt_per_second += u.prompt_per_second;
        t.predicted_n += u.predicted_n;
        t.predicted_per_second += u.predicted_per_second;
        t.draft_n += u.draft_n;
        t.draft_n_accepted += u.draft_n_accepted;
    }
    first
}

/// `--server`, else `llama-server` on PATH, else the vendor build in the cache (with several, the
/// newest of those with backend modules).
fn find_server(explicit: Option<&Path>) -> anyhow::Result<Option<PathBuf>> {
    if let Some(path) = explicit {
        return which::which(path)
            .map(Some)
            .map_err(|e| Exit::new(exit::USAGE, format!("--server {}: {e}", path.display())));
    }
    if let Ok(path) = which::which("llama-server") {
        return Ok(Some(path));
    }
    let Ok(dirs) = std::fs::read_dir(session::cache_dir().join("llama-tools")) else {
        return Ok(None);
    };
    let mut builds: Vec<(bool, std::time::SystemTime, PathBuf)> = dirs
        .flatten()
        .filter_map(|d| {
            let bin = d.path().join("bin").join("llama-server");
            let modified = bin
                .metadata()
                .ok()
                .filter(|m| m.is_file())?
                .modified()
                .ok()?;
            // A build with backend modules beside it (vendor/build-llama-tools since recipe 2) loads
            // the CPU variant and GPU modules autotune loads; an older static one does not.
            let modules = d.path().join("bin").join("libggml-base.so").exists();
            Some((modules, modified, bin))
        })
        .collect();
    builds.sort();
    Ok(builds.pop().map(|(_, _, bin)| bin))
}

/// The version line of `llama-server --version` ("version: N (commit)", on stderr), if it gives one
/// within a few seconds.
fn server_version(server: &Path) -> Option<String> {
    let text = run_briefly(server, "--version")?;
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("version:"))?;
    Some(
        line.trim()
            .trim_start_matches("version:")
            .trim()
            .to_string(),
    )
}

/// What the profile's `argv` pins against this server's own defaults ([`defaults::overridden`]),
/// said on stderr unless `quiet`.
fn say_overridden(server: Option<&Path>, argv: &[String], quiet: bool) -> Vec<String> {
    let help = server.and_then(|s| run_briefly(s, "--help"));
    let said = help.map_or_else(Vec::new, |h| defaults::overridden(argv, &h));
    if !quiet && !said.is_empty() {
        eprintln!(
            "autotune: the profile pins what llama-server would choose itself: {}",
            said.join("; ")
        );
    }
    said
}

/// `server ARG`'s stderr and stdout, where it ends within 10 s.
fn run_briefly(server: &Path, arg: &str) -> Option<String> {
    let mut child = Command::new(server)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().ok()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut text = String::new();
    let _ = child.stderr.take()?.read_to_string(&mut text);
    let _ = child.stdout.take()?.read_to_string(&mut text);
    Some(text)
}

/// Whether the server's version line names the build the profile was measured with.
fn names_build(version_line: &str, p: &Profile) -> bool {
    let known = |s: &str| !s.is_empty() && s != "vendored" && s != "unknown";
    (known(&p.llama.version) && version_line.contains(&p.llama.version))
        || (known(&p.llama.commit) && version_line.contains(&p.llama.commit))
}

/// A port nothing listens on now (the OS picks it), on the address the server will bind.
fn free_port(host: &str) -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind((host, 0))
        .or_else(|_| std::net::TcpListener::bind(("127.0.0.1", 0)))
        .context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Where to connect to reach a server listening on `host` (a wildcard address is reached by loopback).
fn connect_host(host: &str) -> String {
    match host {
        "0.0.0.0" | "" => "127.0.0.1".into(),
        "::" | "[::]" => "[::1]".into(),
        h if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
        h => h.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_and_ipv6_hosts_are_reached_by_loopback() {
        assert_eq!(connect_host("0.0.0.0"), "127.0.0.1");
        assert_eq!(connect_host("::"), "[::1]");
        assert_eq!(connect_host("::1"), "[::1]");
        assert_eq!(connect_host("127.0.0.1"), "127.0.0.1");
        assert!(is_loopback("127.0.0.1") && is_loopback("::1") && is_loopback("localhost"));
        assert!(!is_loopback("0.0.0.0") && !is_loopback("192.168.1.2"));
    }

    #[test]
    fn the_prompt_is_about_a_hundred_words() {
        let words = server::PROMPT.split_whitespace().count();
        assert!((90..=130).contains(&words), "{words}");
    }
}
