//! The tuner's side of the worker protocol: spawn `autotune __worker`, send a request, wait for the
//! answer with a deadline, and turn a crash, a signal or a timeout into a recorded outcome.

use super::protocol::{Request, Response};
pub use profiles::measurements::TrialFailure;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

/// A running worker process.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The longest it took to answer a request so far (`None` before its first answer).
    pub slowest: Option<Duration>,
}

impl Worker {
    /// A worker with llama.cpp's defaults for the knobs it reads once per process.
    pub fn spawn() -> std::io::Result<Worker> {
        Self::spawn_with(&[])
    }

    /// A worker whose process starts with `env`, the variables of the knobs llama.cpp reads once
    /// per process (`ModelSettings::env`); the other such variables are unset.
    pub fn spawn_with(env: &[(String, String)]) -> std::io::Result<Worker> {
        // On Linux /proc/self/exe still runs this very binary after the file was replaced or removed
        // (an upgrade or a rebuild during a long run), where its path would name another file or none.
        let self_exe = std::path::Path::new("/proc/self/exe");
        let exe = if self_exe.exists() {
            self_exe.to_path_buf()
        } else {
            std::env::current_exe()?
        };
        let mut cmd = Command::new(exe);
        let name =
            std::env::current_exe().map_or_else(|_| "autotune".into(), |p| p.display().to_string());
        std::os::unix::process::CommandExt::arg0(&mut cmd, name);
        for name in search_space::knob::environment_names(search_space::Side::Process) {
            cmd.env_remove(name);
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.arg("__worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Own process group: a Ctrl-C in the terminal reaches the tuner only, which then stops its
        // workers itself (so an interrupt is not mistaken for a crashed candidate).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        // A worker outlives nothing: if autotune itself is killed (SIGKILL, a crash), the kernel kills
        // the worker instead of leaving it measuring on a machine the user thinks is idle. (Workers are
        // spawned from the main thread, whose exit is the process's.)
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr_pipe = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                    if v.len() > 200 {
                        v.remove(0);
                    }
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines: rx,
            stderr,
            slowest: None,
        })
    }

    /// Sends one request and waits for its answer. `stop` is polled so an interrupt ends the wait.
    /// On any failure other than `Refused` and `GaveUp` the worker is gone and must be replaced.
    pub fn call(
        &mut self,
        request: &Request,
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<Response, TrialFailure> {
        let line = serde_json::to_string(request).expect("requests serialise");
        if writeln!(self.stdin, "{line}")
            .and_then(|_| self.stdin.flush())
            .is_err()
        {
            return Err(self.death());
        }
        let start = std::time::Instant::now();
        loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(answer) => {
                    let took = start.elapsed();
                    self.slowest = Some(self.slowest.map_or(took, |s| s.max(took)));
                    return match serde_json::from_str::<Response>(&answer) {
                        Ok(Response::Failed { stage, message }) => {
                            Err(TrialFailure::Refused { stage, message })
                        }
                        Ok(Response::GaveUp { limit, load }) => Err(TrialFailure::GaveUp {
                            limit_ms: limit.limit_ms,
                            best_ms: limit.best_ms,
                            load,
                            took_ms: None,
                        }),
                        Ok(r) => Ok(r),
                        // A stray line on stdout (llama.cpp printing there) is skipped.
                        Err(_) => continue,
                    };
                }
                Err(RecvTimeoutError::Disconnected) => return Err(self.death()),
                Err(RecvTimeoutError::Timeout) => {
                    if stop() {
                        self.kill();
                        return Err(TrialFailure::Interrupted);
                    }
                    if start.elapsed() > timeout {
                        self.kill();
                        return Err(TrialFailure::TimedOut {
                            seconds: timeout.as_secs(),
                        });
                    }
                }
            }
        }
    }

    fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().map(|v| v.clone()).unwrap_or_default();
        let interesting: Vec<&String> = lines
            .iter()
            .filter(|l| {
                l.contains("error")
                    || l.contains("GGML_ASSERT")
                    || l.contains("abort")
                    || l.contains("failed")
            })
            .collect();
        let pick: Vec<&String> = if interesting.is_empty() {
            lines.iter().collect()
        } else {
            interesting
        };
        pick.iter()
            .rev()
            .take(2)
            .rev()
            .map(|s| s.trim())
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// The worker's stdout closed: collect how it ended.
    fn death(&mut self) -> TrialFailure {
        let status = self.child.wait();
        // Give the stderr reader a moment to drain the last lines.
        std::thread::sleep(Duration::from_millis(50));
        let tail = self.stderr_tail();
        match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                if let Some(sig) = s.signal() {
                    TrialFailure::Crashed {
                        signal: sig,
                        name: signal_name(sig),
                        stderr_tail: tail,
                    }
                } else {
                    TrialFailure::Exited {
                        code: s.code().unwrap_or(-1),
                        stderr_tail: tail,
                    }
                }
            }
            Err(e) => TrialFailure::Exited {
                code: -1,
                stderr_tail: e.to_string(),
            },
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn quit(mut self) {
        let _ = writeln!(
            self.stdin,
            "{}",
            serde_json::to_string(&Request::Quit).expect("serialises")
        );
        let _ = self.stdin.flush();
        std::thread::sleep(Duration::from_millis(10));
        match self.child.try_wait() {
            Ok(Some(_)) => {}
            _ => {
                std::thread::sleep(Duration::from_millis(200));
                if !matches!(self.child.try_wait(), Ok(Some(_))) {
                    self.kill();
                }
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// A signal's conventional name, with what it usually means for a trial.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGILL => {
            "SIGILL (illegal instruction: a CPU kernel the machine or OS does not support)"
        }
        libc::SIGABRT => "SIGABRT (llama.cpp aborted)",
        libc::SIGSEGV => "SIGSEGV (segmentation fault)",
        libc::SIGBUS => "SIGBUS (bus error)",
        libc::SIGFPE => "SIGFPE (arithmetic error)",
        libc::SIGKILL => "SIGKILL (killed: out of memory or by a user)",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}
