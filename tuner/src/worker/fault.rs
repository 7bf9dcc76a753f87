//! Fault injection for the reliability tests (a test hook, not a user feature): makes a worker crash,
//! hang or exit on purpose, so the tests can check that the tuner records the failure as that
//! candidate's outcome and carries on.
//!
//! The worker reads two environment variables, once, at its first request:
//!
//! - `AUTOTUNE_FAULT=KIND@N`: on the N-th measure request (counted from 1), before answering, the
//!   worker does KIND: `abort` (SIGABRT, like a failed `GGML_ASSERT`), `segv` (SIGSEGV), `hang`
//!   (sleeps forever, so `--trial-timeout` has to kill it) or `exit` (exits with code 42 without an
//!   answer). Without a counter file N counts in each worker process, so every worker faults: a
//!   placement that keeps crashing.
//! - `AUTOTUNE_FAULT_COUNTER=FILE`: N counts measure requests across all the workers of a run (the
//!   count lives in FILE, which the tests create empty or leave absent), so the fault fires once.
//!
//! An unparseable `AUTOTUNE_FAULT` is reported on stderr and ignored. Unset, this costs one check per
//! request. Workers answer one request at a time, so the counter file needs no lock.

use super::protocol::Request;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// What the worker does when the fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    Abort,
    Segv,
    Hang,
    Exit,
}

/// A parsed `AUTOTUNE_FAULT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    /// The measure request (from 1) on which it fires.
    pub at: u64,
}

impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Fault, String> {
        let (kind, at) = s.trim().split_once('@').unwrap_or((s.trim(), "1"));
        let kind = match kind {
            "abort" => FaultKind::Abort,
            "segv" => FaultKind::Segv,
            "hang" => FaultKind::Hang,
            "exit" => FaultKind::Exit,
            _ => {
                return Err(format!(
                    "unknown fault '{kind}' (use abort, segv, hang or exit)"
                ))
            }
        };
        match at.parse::<u64>() {
            Ok(at) if at >= 1 => Ok(Fault { kind, at }),
            _ => Err(format!("bad request number '{at}' (write e.g. abort@2)")),
        }
    }
}

/// The fault configured for this process, parsed once.
fn configured() -> Option<Fault> {
    static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
    *FAULT.get_or_init(|| {
        let spec = std::env::var("AUTOTUNE_FAULT")
            .ok()
            .filter(|s| !s.trim().is_empty())?;
        match spec.parse() {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("autotune: AUTOTUNE_FAULT={spec} ignored: {e}");
                None
            }
        }
    })
}

/// Called by the worker at the start of every request: fires the configured fault when its turn comes.
pub fn before_request(request: &Request) {
    let Some(fault) = configured() else { return };
    if !matches!(request, Request::Measure(_)) {
        return;
    }
    if next_count() == fault.at {
        fire(fault.kind);
    }
}

/// This request's number: from the shared counter file when one is set, else this process's own.
fn next_count() -> u64 {
    static LOCAL: AtomicU64 = AtomicU64::new(0);
    let Some(file) = std::env::var_os("AUTOTUNE_FAULT_COUNTER") else {
        return LOCAL.fetch_add(1, Ordering::Relaxed) + 1;
    };
    let n = std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    // Written before firing, so a crash does not make the next worker fire again.
    let _ = std::fs::write(&file, n.to_string());
    n
}

fn fire(kind: FaultKind) {
    // Lower case "abort" so the tuner's stderr tail picks this line as the reason.
    eprintln!(
        "autotune: AUTOTUNE_FAULT: injecting {} (test hook)",
        format!("{kind:?}").to_lowercase()
    );
    match kind {
        FaultKind::Abort => std::process::abort(),
        FaultKind::Segv => {
            // SAFETY: raising a signal is always sound; with the default action the process ends here.
            unsafe {
                libc::signal(libc::SIGSEGV, libc::SIG_DFL);
                libc::raise(libc::SIGSEGV);
            }
            std::process::abort();
        }
        FaultKind::Hang => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        FaultKind::Exit => std::process::exit(42),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kind_and_request_number() {
        assert_eq!(
            "abort@2".parse::<Fault>(),
            Ok(Fault {
                kind: FaultKind::Abort,
                at: 2
            })
        );
        assert_eq!(
            "segv".parse::<Fault>(),
            Ok(Fault {
                kind: FaultKind::Segv,
                at: 1
            })
        );
        assert_eq!("hang@1".parse::<Fault>().unwrap().kind, FaultKind::Hang);
        assert_eq!("exit@3".parse::<Fault>().unwrap().at, 3);
        assert!("abort@0".parse::<Fault>().is_err());
        assert!("boom@1".parse::<Fault>().is_err());
        assert!("abort@x".parse::<Fault>().is_err());
    }
}
