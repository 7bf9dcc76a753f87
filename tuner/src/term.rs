//! The terminal side of a run: the interrupt flag (Ctrl-C, SIGTERM), progress bars on stderr, and
//! errors and notes kept to one line.

use crate::measuring::Progress;
use crate::measuring::Repetition;
use anyhow::Context as _;
use indicatif::ProgressState;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an interrupted run may take to stop cleanly before it is ended anyway: a clean stop
/// (the worker killed, the report printed) takes well under a second, so only a call that cannot
/// be cancelled (ggml reading from an RPC server that stopped answering) is still running then.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// A flag set by SIGINT and SIGTERM, so a long run stops cleanly and keeps what it measured. A run
/// still alive [`STOP_GRACE`] after the first signal, or given a second, exits at once with status
/// 130: every measurement is already in the log (each is appended and flushed as it arrives), and
/// the workers die with it (`PR_SET_PDEATHSIG`).
pub fn interrupt_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The second signal: the flag is already set when it comes.
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))
            .context("cannot install the interrupt handler")?;
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("cannot install the interrupt handler")?;
    }
    let watched = Arc::clone(&stop);
    std::thread::spawn(move || {
        while !watched.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(STOP_GRACE);
        eprintln!(
            "autotune: interrupted; still blocked {} s later (an RPC server that stopped answering?), \
             so ending now. Measurements are kept: run the same command again to continue.",
            STOP_GRACE.as_secs()
        );
        std::process::exit(130);
    });
    Ok(stop)
}

/// A progress bar on stderr when it is a terminal and not `--quiet`.
pub fn bar(quiet: bool, template: &str) -> Option<ProgressBar> {
    (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        b.set_style(ProgressStyle::with_template(template).expect("valid template"));
        b.enable_steady_tick(Duration::from_millis(200));
        b
    })
}

pub use profiles::one_line;

/// An error and its causes on one line (anyhow's `{:#}`), each cause once: a message that already
/// quotes its source (as `ProfileError::Io` and tempfile's errors do) is not followed by it again.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if text.contains(&s) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&s);
    }
    one_line(&text)
}

/// The tuning run's progress bar: repetitions counted, the candidate, the best so far, and once
/// the run's time is set ([`Bar::set_time_left`]) the time left.
pub struct Bar(Option<ProgressBar>, Deadline);

/// When the run's budget ends, once it is known.
type Deadline = Arc<Mutex<Option<Instant>>>;

impl Bar {
    pub fn new(quiet: bool) -> Bar {
        const TEMPLATE: &str =
            "{spinner} [{elapsed_precise}{left}] {pos} reps · {prefix} · {wide_msg}";
        let deadline: Deadline = Arc::default();
        let at = Arc::clone(&deadline);
        let left = move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
            if let Some(end) = *at.lock().unwrap_or_else(|e| e.into_inner()) {
                let left = end.saturating_duration_since(Instant::now());
                let _ = write!(w, ", {} left", clock(left));
            }
        };
        let bar = bar(quiet, "{spinner} [{elapsed_precise}] {pos} reps");
        if let Some(b) = &bar {
            let style = ProgressStyle::with_template(TEMPLATE).expect("valid template");
            b.set_style(style.with_key("left", left));
        }
        Bar(bar, deadline)
    }

    /// The run's budget has `left` to go from now: the bar counts it down.
    pub fn set_time_left(&self, left: Duration) {
        *self.1.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + left);
    }

    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

/// A duration as a clock: "6:59", "1:02:03".
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match s / 3600 {
        0 => format!("{}:{:02}", s / 60, s % 60),
        h => format!("{h}:{:02}:{:02}", (s / 60) % 60, s % 60),
    }
}

impl Progress for Bar {
    fn candidate_started(&self, label: &str, axis: &str) {
        if let Some(b) = &self.0 {
            b.set_prefix(axis.to_string());
            b.set_message(label.to_string());
        }
    }
    fn repetition(&self, _label: &str, rep: &Repetition) {
        if let Some(b) = &self.0 {
            b.inc(1);
            b.set_prefix(format!("pp {:.0} tg {:.1}", rep.pp_tps, rep.tg_tps));
        }
    }
    fn failed(&self, label: &str, failure: &str) {
        match &self.0 {
            Some(b) => b.println(format!("trial failed: {label}: {failure}")),
            None => eprintln!("autotune: trial failed: {label}: {failure}"),
        }
    }
    fn stopped(&self, label: &str, why: &str) {
        match &self.0 {
            Some(b) => b.println(format!("{label}: {why}")),
            None => eprintln!("autotune: {label}: {why}"),
        }
    }
    fn note(&self, line: &str) {
        match &self.0 {
            Some(b) => b.println(line),
            None => eprintln!("autotune: {line}"),
        }
    }
    fn best(&self, label: &str, margin: Option<f64>, elapsed: Duration, budget: Duration) {
        let left = budget.saturating_sub(elapsed).as_secs();
        let m = margin
            .map(|m| format!(", {:+.1}% over the runner-up", m * 100.0))
            .unwrap_or_default();
        if let Some(b) = &self.0 {
            b.println(format!("best so far: {label}{m} ({left} s of budget left)"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot create a temporary file in /x: {source}; check the folder")]
    struct Quoting {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn the_time_left_reads_as_a_clock() {
        assert_eq!(clock(Duration::from_secs(419)), "6:59");
        assert_eq!(clock(Duration::from_secs(3723)), "1:02:03");
        assert_eq!(clock(Duration::ZERO), "0:00");
    }

    #[test]
    fn an_error_line_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(Quoting { source: io }).context("cannot write /x/p.toml");
        assert_eq!(
            error_line(&e),
            "cannot write /x/p.toml: cannot create a temporary file in /x: no such file; check the folder"
        );
        let plain = anyhow::anyhow!("first\nsecond").context("outer");
        assert_eq!(error_line(&plain), "outer: first | second");
    }
}
