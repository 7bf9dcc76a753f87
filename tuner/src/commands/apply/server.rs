//! The llama-server that `apply --exec` starts: its process (own process group, output kept for error
//! messages), waiting for `/health`, the check's completions, and stopping it or serving in the
//! foreground with signals forwarded.

use super::timings::Timings;
use crate::exit::{self, Exit};
use crate::stored::one_line;
use anyhow::Context as _;
use serde::Deserialize;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a starting server may take to load the model and answer `/health` with 200.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a server gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Lines of the server's output kept for the error message when it fails to start.
const LOG_LINES: usize = 40;

/// The prompt of the check: ordinary English (about 100 words), so the server tokenizes and samples real
/// text through its whole HTTP path. Fixed, so checks are comparable across runs. (A profile with
/// speculative decoding is checked on a prompt of its own kind instead: see `speculation::prompt`.)
pub const PROMPT: &str = "The old lighthouse stood at the edge of the cliff for more than a century, watching \
    ships pass through the narrow channel below. Its keeper, a quiet woman who had inherited the post from \
    her father, climbed the spiral stairs every evening to light the lamp and wind the clockwork that turned \
    the great lens. Storms came often in winter, and on the worst nights she stayed awake until dawn, \
    listening to the wind and counting the seconds between flashes. Travellers who stopped in the village \
    sometimes asked her whether she felt lonely. She always answered that the sea was company enough, and \
    then she told them a story about";

/// An argument llama-server refused at start-up (its argument parser's error line), e.g. a
/// `--spec-type` an older build does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub argument: String,
    pub reason: String,
}

impl Refusal {
    /// `error: invalid argument: X` (an unknown flag) or `error while handling argument "X": R`
    /// (a value the flag refused), as llama.cpp's `common/arg.cpp` writes them.
    fn parse(line: &str) -> Option<Refusal> {
        let line = line.trim();
        if let Some(arg) = line.strip_prefix("error: invalid argument: ") {
            return Some(Refusal {
                argument: arg.trim().to_string(),
                reason: "unknown argument".into(),
            });
        }
        let rest = line.strip_prefix("error while handling argument \"")?;
        let (arg, reason) = rest.split_once("\":")?;
        Some(Refusal {
            argument: arg.to_string(),
            reason: reason.trim().to_string(),
        })
    }
}

/// The parts of a `/completion` answer the check uses.
#[derive(Debug, Deserialize)]
pub struct CompletionAnswer {
    #[serde(default)]
    pub content: String,
    pub timings: Timings,
    /// The generated tokens' ids (asked for with `return_tokens`).
    #[serde(default)]
    pub tokens: Vec<i64>,
}

/// A started llama-server in its own process group; stopped (and its group with it) when dropped.
pub struct ServerProcess {
    pub child: Child,
    /// The last lines it wrote (stdout and stderr), for the error message when it fails.
    log: Arc<Mutex<VecDeque<String>>>,
    /// The first argument it refused, read from its output as it comes (before the usage text after it
    /// can push it out of `log`).
    refusal: Arc<Mutex<Option<Refusal>>>,
    /// Copy its output to our stderr (with `--verbose`, and while it serves in the foreground).
    pub echo: Arc<AtomicBool>,
    exited: Option<ExitStatus>,
}

impl ServerProcess {
    /// llama-server with `argv` and the environment the profile needs (`env`; the other variables
    /// of llama.cpp's knobs unset, so the shell's cannot change what runs).
    pub fn start(
        server: &Path,
        argv: &[String],
        env: &std::collections::BTreeMap<String, String>,
        verbose: bool,
    ) -> anyhow::Result<ServerProcess> {
        let mut cmd = Command::new(server);
        for side in [search_space::Side::Process, search_space::Side::Context] {
            for name in search_space::knob::environment_names(side) {
                cmd.env_remove(name);
            }
        }
        cmd.envs(env);
        cmd.args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt as _;
            // Its own group: a Ctrl-C in the terminal reaches us, and we stop the server in order.
            cmd.process_group(0);
            #[cfg(target_os = "linux")]
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
            unsafe {
                cmd.pre_exec(|| {
                    // If autotune dies without stopping it, the server gets SIGTERM instead of living on.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", server.display()))?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let refusal = Arc::new(Mutex::new(None));
        let echo = Arc::new(AtomicBool::new(verbose));
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped"));
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("piped"));
        for stream in [out, err] {
            let (log, echo, refusal) = (Arc::clone(&log), Arc::clone(&echo), Arc::clone(&refusal));
            std::thread::spawn(move || {
                for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                    let line = String::from_utf8_lossy(&line).trim_end().to_string();
                    if echo.load(Ordering::Relaxed) {
                        eprintln!("{line}");
                    }
                    if let Some(r) = Refusal::parse(&line) {
                        let mut first = refusal.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert(r);
                    }
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    if log.len() == LOG_LINES {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            });
        }
        Ok(ServerProcess {
            child,
            log,
            refusal,
            echo,
            exited: None,
        })
    }

    /// The argument it refused, once it has exited because of one. Its output threads may still be
    /// reading the last lines for a moment after it exits, so this waits for them briefly.
    pub fn refusal(&mut self) -> Option<Refusal> {
        self.exited()?;
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            let found = self
                .refusal
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if found.is_some() || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its exit status, once it has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    fn signal(&self, sig: i32) {
        #[cfg(unix)]
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill has no memory effects; the negative pid names the server's own process group.
            unsafe { libc::kill(-pid, sig) };
        }
    }

    /// SIGTERM, then SIGKILL after the grace period (or at once on a second Ctrl-C).
    pub fn stop(&mut self, signal: &AtomicUsize) -> Option<ExitStatus> {
        if self.exited().is_some() {
            return self.exited;
        }
        signal.store(0, Ordering::Relaxed);
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while self.exited().is_none() {
            if Instant::now() > deadline || signal.load(Ordering::Relaxed) != 0 {
                self.signal(libc::SIGKILL);
                let _ = self.child.kill();
                self.exited = self.child.wait().ok();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.exited
    }

    fn tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let lines: Vec<&str> = log
            .iter()
            .map(String::as_str)
            .filter(|l| !l.trim().is_empty())
            .collect();
        let start = lines.len().saturating_sub(12);
        lines[start..]
            .iter()
            .map(|l| format!("\n  | {l}"))
            .collect()
    }

    /// The error for a server that exited while we waited for it.
    fn died(&self, status: ExitStatus, while_doing: &str) -> anyhow::Error {
        #[cfg(unix)]
        let hint = match std::os::unix::process::ExitStatusExt::signal(&status) {
            Some(libc::SIGILL) => {
                "\nSIGILL: this llama-server runs CPU instructions this machine (or its OS or VM) does not \
                 allow, e.g. AMX: use one built with every CPU variant, which picks what this CPU runs \
                 (vendor/build-llama-tools), or tune without weight repacking (--kernels plain)"
            }
            _ => "",
        };
        #[cfg(not(unix))]
        let hint = "";
        Exit::new(
            exit::ERROR,
            format!(
                "llama-server exited ({status}) {while_doing}; its last lines:{}{hint}",
                self.tail()
            ),
        )
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop(&AtomicUsize::new(0));
    }
}

fn interrupted() -> anyhow::Error {
    Exit::new(exit::INTERRUPTED, "interrupted; llama-server stopped")
}

/// Polls `/health` until it answers 200; fails when the server exits, the user interrupts, or it
/// takes longer than [`READY_TIMEOUT`].
pub fn wait_ready(proc: &mut ServerProcess, url: &str, signal: &AtomicUsize) -> anyhow::Result<()> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .build();
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = proc.exited() {
            return Err(proc.died(status, "before it was ready"));
        }
        if signal.load(Ordering::Relaxed) != 0 {
            return Err(interrupted());
        }
        if let Ok(r) = agent.get(&format!("{url}/health")).call() {
            if r.status() == 200 {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(Exit::new(
                exit::ERROR,
                format!(
                    "llama-server did not answer {url}/health with 200 within {} s; its last lines:{}",
                    READY_TIMEOUT.as_secs(),
                    proc.tail()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `text` as a completion's prompt that leaves room for the generation in a slot: the text itself
/// when the server's tokens of it are at most `max`, else its last tokens after the vocabulary's
/// leading special ones (BOS), `max` in all, as autotune's measurements cut a prompt to a slot.
pub fn prompt_within(
    url: &str,
    text: &str,
    max: u32,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let endpoint = format!("{url}/tokenize");
    let tokenize = |content: &str, add_special: bool| -> anyhow::Result<Vec<i64>> {
        #[derive(Deserialize)]
        struct Tokens {
            tokens: Vec<i64>,
        }
        let body = serde_json::json!({ "content": content, "add_special": add_special });
        let answer: Tokens = match agent.post(&endpoint).send_json(body) {
            Ok(r) => r.into_json().map_err(|e| {
                Exit::new(
                    exit::ERROR,
                    format!("unexpected answer from {endpoint}: {e}"),
                )
            })?,
            Err(ureq::Error::Status(code, r)) => {
                return Err(Exit::new(
                    exit::ERROR,
                    format!(
                        "{endpoint} answered {code}: {}",
                        one_line(&r.into_string().unwrap_or_default())
                    ),
                ))
            }
            Err(e) => return Err(Exit::new(exit::ERROR, format!("{endpoint}: {e}"))),
        };
        Ok(answer.tokens)
    };
    let all = tokenize(text, true)?;
    if all.len() <= max as usize {
        return Ok(serde_json::Value::from(text));
    }
    let special = tokenize("", true)?;
    let body = tokenize(text, false)?;
    let keep = (max as usize).saturating_sub(special.len()).max(1);
    let mut tokens = special;
    tokens.extend_from_slice(&body[body.len().saturating_sub(keep)..]);
    Ok(serde_json::Value::from(tokens))
}

/// One `/completion` of `prompt` (a text or tokens), greedy, generating exactly `n_predict` tokens,
/// prompt not cached.
/// Runs on a thread so a Ctrl-C or a crashing server ends the wait at once.
pub fn complete(
    proc: &mut ServerProcess,
    url: &str,
    prompt: &serde_json::Value,
    n_predict: u32,
    timeout: Duration,
    signal: &AtomicUsize,
) -> anyhow::Result<CompletionAnswer> {
    let mut answers = complete_together(proc, url, prompt, n_predict, 1, timeout, signal)?;
    Ok(answers.remove(0))
}

/// `n` such completions sent at once (the server's slots answer them together), each on its own
/// thread; their answers in the order they came.
pub fn complete_together(
    proc: &mut ServerProcess,
    url: &str,
    prompt: &serde_json::Value,
    n_predict: u32,
    n: u32,
    timeout: Duration,
    signal: &AtomicUsize,
) -> anyhow::Result<Vec<CompletionAnswer>> {
    let body = serde_json::json!({
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0,
        "cache_prompt": false,
        "ignore_eos": true,
        "return_tokens": true,
    });
    let endpoint = format!("{url}/completion");
    let (tx, rx) = mpsc::channel();
    for _ in 0..n.max(1) {
        let (tx, body, endpoint) = (tx.clone(), body.clone(), endpoint.clone());
        std::thread::spawn(move || {
            let agent = ureq::AgentBuilder::new().timeout(timeout).build();
            let result = match agent.post(&endpoint).send_json(body) {
                Ok(r) => r
                    .into_json::<CompletionAnswer>()
                    .map_err(|e| format!("unexpected answer from {endpoint}: {e}")),
                Err(ureq::Error::Status(code, r)) => Err(format!(
                    "{endpoint} answered {code}: {}",
                    one_line(&r.into_string().unwrap_or_default())
                )),
                Err(e) => Err(format!("{endpoint}: {e}")),
            };
            let _ = tx.send(result);
        });
    }
    drop(tx);
    let mut answers = Vec::new();
    while answers.len() < n.max(1) as usize {
        answers.push(next_answer(proc, &rx, signal)?);
    }
    Ok(answers)
}

/// The next completion answer, ending the wait when the server dies or the user interrupts.
fn next_answer(
    proc: &mut ServerProcess,
    rx: &mpsc::Receiver<Result<CompletionAnswer, String>>,
    signal: &AtomicUsize,
) -> anyhow::Result<CompletionAnswer> {
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(message)) => {
                // A server that crashed mid-answer closes the connection a moment before it is
                // reaped: give it that moment, so the error is its death and last lines.
                let until = std::time::Instant::now() + Duration::from_secs(2);
                while std::time::Instant::now() < until {
                    if let Some(status) = proc.exited() {
                        return Err(proc.died(status, "during the completion"));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                return Err(Exit::new(exit::ERROR, message));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Exit::new(
                    exit::ERROR,
                    "the completion request ended without an answer",
                ))
            }
        }
        if signal.load(Ordering::Relaxed) != 0 {
            return Err(interrupted());
        }
        if let Some(status) = proc.exited() {
            return Err(proc.died(status, "during the completion"));
        }
    }
}

/// Waits for the server to exit, forwarding SIGINT/SIGTERM to it; exit code 130 when the user stopped
/// it, 0 when it exited cleanly by itself, 1 otherwise.
pub fn serve_in_foreground(proc: &mut ServerProcess, signal: &AtomicUsize) -> anyhow::Result<i32> {
    loop {
        if let Some(status) = proc.exited() {
            if status.success() {
                return Ok(exit::OK);
            }
            return Err(proc.died(status, "while serving"));
        }
        let sig = signal.swap(0, Ordering::Relaxed);
        if sig != 0 {
            proc.signal(i32::try_from(sig).unwrap_or(libc::SIGTERM));
            let deadline = Instant::now() + STOP_GRACE;
            while proc.exited().is_none() {
                if Instant::now() > deadline || signal.load(Ordering::Relaxed) != 0 {
                    proc.signal(libc::SIGKILL);
                    let _ = proc.child.kill();
                    proc.exited = proc.child.wait().ok();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("autotune: llama-server stopped");
            return Ok(exit::INTERRUPTED);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_arguments_are_read_from_the_servers_error_lines() {
        assert_eq!(
            Refusal::parse(
                "error while handling argument \"--spec-type\": unknown speculative type: ngram-simple"
            ),
            Some(Refusal {
                argument: "--spec-type".into(),
                reason: "unknown speculative type: ngram-simple".into()
            })
        );
        assert_eq!(
            Refusal::parse("error: invalid argument: --spec-ngram-simple-size-n"),
            Some(Refusal {
                argument: "--spec-ngram-simple-size-n".into(),
                reason: "unknown argument".into()
            })
        );
        assert_eq!(Refusal::parse("main: loading model"), None);
        assert_eq!(
            Refusal::parse("srv  error: invalid argument in request"),
            None
        );
    }
}
