//! How long a request that talks to RPC servers may go unanswered before its worker is killed.
//!
//! ggml's RPC client has no timeout: a worker whose server froze mid-trial (SIGSTOP, a hung
//! machine) waits for ever, and a busy server looks the same from outside (it serves one client at
//! a time, so a second connection is not answered either). Only time tells them apart, so the run's
//! own pace bounds the wait: a worker that already answered gets [`FACTOR`] times its slowest
//! answer, a fresh one (whose first answer loads the model, the weights sent over each link)
//! [`FACTOR`] times the slowest first answer of the run, each at least its floor, never more than
//! `--trial-timeout`. Before anything over RPC has answered, a dry run gets [`FIRST_DRY_RUN`] and a
//! trial the full `--trial-timeout`.

use std::time::Duration;

/// Times the slowest answer seen: a repetition's time varies by far less across one run's
/// candidates (a micro-batch, a cache type, a split), and a false alarm costs a candidate.
pub const FACTOR: u32 = 5;
/// The least a worker that already answered gets.
pub const LOADED_FLOOR: Duration = Duration::from_secs(20);
/// The least a fresh worker gets (start-up, the load, the warm-up, a repetition).
pub const FRESH_FLOOR: Duration = Duration::from_secs(60);
/// A dry run before any over RPC has answered: it uploads nothing (no weights, no compute), only
/// asks each tensor's size, a few thousand round trips at most.
pub const FIRST_DRY_RUN: Duration = Duration::from_secs(120);

/// The answer times a pool of workers has seen for requests over RPC.
#[derive(Debug, Clone, Default)]
pub struct Pace {
    /// The slowest first answer of a fresh worker.
    pub slowest_fresh: Option<Duration>,
}

impl Pace {
    /// The deadline of a request over RPC: `worker_slowest` is the slowest answer of the worker it
    /// goes to (`None` for a fresh one); `cap` is `--trial-timeout`; `dry` for dry runs.
    pub fn deadline(&self, worker_slowest: Option<Duration>, cap: Duration, dry: bool) -> Duration {
        let bound = match (worker_slowest, self.slowest_fresh) {
            (Some(w), _) => (w * FACTOR).max(LOADED_FLOOR),
            (None, Some(f)) => (f * FACTOR).max(FRESH_FLOOR),
            (None, None) if dry => FIRST_DRY_RUN,
            (None, None) => cap,
        };
        bound.min(cap)
    }

    /// Notes a fresh worker's first answer.
    pub fn fresh_answered(&mut self, took: Duration) {
        self.slowest_fresh = Some(self.slowest_fresh.map_or(took, |s| s.max(took)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_secs(300);

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn before_anything_answered_a_trial_gets_the_trial_timeout_and_a_dry_run_two_minutes() {
        let p = Pace::default();
        assert_eq!(p.deadline(None, CAP, false), CAP);
        assert_eq!(p.deadline(None, CAP, true), FIRST_DRY_RUN);
        assert_eq!(p.deadline(None, s(30), true), s(30), "never past the cap");
    }

    #[test]
    fn a_loaded_worker_gets_five_times_its_slowest_answer_at_least_twenty_seconds() {
        let p = Pace::default();
        assert_eq!(p.deadline(Some(s(2)), CAP, false), LOADED_FLOOR);
        assert_eq!(p.deadline(Some(s(10)), CAP, false), s(50));
        assert_eq!(p.deadline(Some(s(100)), CAP, false), CAP);
    }

    #[test]
    fn a_fresh_worker_gets_five_times_the_slowest_first_answer_at_least_a_minute() {
        let mut p = Pace::default();
        p.fresh_answered(s(3));
        assert_eq!(p.deadline(None, CAP, false), FRESH_FLOOR);
        p.fresh_answered(s(20));
        p.fresh_answered(s(4));
        assert_eq!(p.slowest_fresh, Some(s(20)));
        assert_eq!(p.deadline(None, CAP, false), s(100));
        assert_eq!(p.deadline(None, CAP, true), s(100));
    }
}
