//! How much of the CPUs other programs took while autotune measured: the machine's CPU time from
//! `/proc/stat` (the hypervisor's steal included) less this process's and its workers' own. A tune
//! on a busy machine measures the machine's leftovers: slower, noisier, and a profile that fits an
//! idle machine badly. Linux only; elsewhere nothing is said.

use std::path::Path;
use std::time::{Duration, Instant};

/// Other programs' share of the CPUs' time above which the run says the machine was busy. An idle
/// desktop's background stays well below it; one other busy thread on two cores is 50%.
pub const BUSY_SHARE: f64 = 0.15;

/// Other programs' CPU time from one moment on: [`Watch::start`], then [`Watch::share`].
pub struct Watch {
    start: Option<CpuSnapshot>,
    at: Instant,
}

impl Watch {
    pub fn start() -> Watch {
        Watch {
            start: CpuSnapshot::now(),
            at: Instant::now(),
        }
    }

    /// Other programs' share of all CPUs' time since the start (0 to 1), looked at for `at_least`
    /// (slept out where less has passed: a short span has too few clock ticks to tell a share
    /// from); `None` where `/proc` cannot say.
    pub fn share(&self, at_least: Duration) -> Option<f64> {
        std::thread::sleep(at_least.saturating_sub(self.at.elapsed()));
        CpuSnapshot::now()
            .zip(self.start)
            .and_then(|(now, start)| now.others_since(&start))
    }
}

/// [`note`] as a warning on stderr.
pub fn warn(share: Option<f64>, cpus: u32, when: &str) {
    if let Some(n) = note(share, cpus, when) {
        eprintln!("autotune: warning: {n}");
    }
}

/// CPU time at one moment, in clock ticks: the whole machine's and this process tree's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuSnapshot {
    /// Ticks the CPUs spent busy (user, nice, system, irq, softirq) or stolen by the hypervisor.
    busy: u64,
    /// Every tick of every CPU (busy, idle and waiting for I/O).
    total: u64,
    /// Ticks of this process and its children (workers alive or reaped).
    own: u64,
}

impl CpuSnapshot {
    /// This machine's, now; `None` where `/proc` cannot say (not Linux).
    fn now() -> Option<CpuSnapshot> {
        let (busy, total) = system_ticks(&std::fs::read_to_string("/proc/stat").ok()?)?;
        Some(CpuSnapshot {
            busy,
            total,
            own: own_ticks(Path::new("/proc"), std::process::id()),
        })
    }

    /// Other programs' share of all CPUs' time since `earlier` (0 to 1); `None` when too little time
    /// passed to say.
    fn others_since(&self, earlier: &CpuSnapshot) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        // A tenth of a second of one CPU's ticks (USER_HZ is 100): less says nothing.
        if total < 10 {
            return None;
        }
        let busy = self.busy.saturating_sub(earlier.busy);
        let own = self.own.saturating_sub(earlier.own);
        Some((busy.saturating_sub(own) as f64 / total as f64).clamp(0.0, 1.0))
    }
}

/// The one line a busy run gets, or `None` below [`BUSY_SHARE`]. `when`: "while autotune measured".
pub fn note(share: Option<f64>, cpus: u32, when: &str) -> Option<String> {
    let share = share.filter(|&s| s > BUSY_SHARE)?;
    Some(format!(
        "the machine was busy: other programs took {:.0}% of its {cpus} CPUs' time {when} (the hypervisor's steal included); the figures are slower and noisier than this machine's own, so tune again when it is idle",
        share * 100.0
    ))
}

/// `/proc/stat`'s first line, `cpu  user nice system idle iowait irq softirq steal guest guest_nice`:
/// (busy, total) ticks. Guest time is already counted in user and nice.
fn system_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let at = |k: usize| f.get(k).copied().unwrap_or(0);
    if f.len() < 4 {
        return None;
    }
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some((busy, busy + at(3) + at(4)))
}

/// `/proc/PID/stat` after the command's closing parenthesis (a command may hold spaces and
/// parentheses): (parent pid, utime + stime + cutime + cstime).
fn process_ticks(stat: &str) -> Option<(u32, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state (0), ppid (1), ..., utime (11), stime (12), cutime (13), cstime (14).
    let ppid = f.get(1)?.parse().ok()?;
    let ticks = (11..=14)
        .map(|k| f.get(k)?.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    Some((ppid, ticks))
}

/// Ticks of process `pid` (its reaped children included) and of its living children (workers) under
/// the `/proc` at `proc`.
fn own_ticks(proc: &Path, pid: u32) -> u64 {
    let read = |dir: &Path| process_ticks(&std::fs::read_to_string(dir.join("stat")).ok()?);
    let mine = read(&proc.join(pid.to_string())).map_or(0, |(_, t)| t);
    let Ok(entries) = std::fs::read_dir(proc) else {
        return mine;
    };
    let children: u64 = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| read(&e.path()))
        .filter(|&(ppid, _)| ppid == pid)
        .map(|(_, t)| t)
        .sum();
    mine + children
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 50 2 25 400 10 1 1 5 0 0\nintr 1 2\n";

    #[test]
    fn the_machines_ticks_count_steal_as_busy_and_iowait_as_idle() {
        assert_eq!(system_ticks(STAT), Some((170, 990)));
        assert_eq!(system_ticks("intr 1\n"), None);
        assert_eq!(system_ticks("cpu  1 x 2 3\n"), None);
    }

    #[test]
    fn a_process_stat_is_read_after_its_commands_last_parenthesis() {
        let stat =
            "4242 (my (odd) worker) S 4241 4242 4242 0 -1 4194304 100 0 0 0 30 12 7 1 20 0 3 0";
        assert_eq!(process_ticks(stat), Some((4241, 50)));
        assert_eq!(process_ticks("4242 (cut) S 1"), None);
    }

    #[test]
    fn own_ticks_add_the_living_children_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let proc = |pid: &str, ppid: u32, utime: u64| {
            std::fs::create_dir(dir.path().join(pid)).unwrap();
            let stat = format!("{pid} (x) R {ppid} 0 0 0 -1 0 0 0 0 0 {utime} 1 1 1 20 0 1 0");
            std::fs::write(dir.path().join(pid).join("stat"), stat).unwrap();
        };
        proc("10", 1, 100); // this process: 103 ticks
        proc("11", 10, 20); // its worker: 23
        proc("12", 1, 500); // another program
        std::fs::create_dir(dir.path().join("self")).unwrap();
        assert_eq!(own_ticks(dir.path(), 10), 126);
    }

    #[test]
    fn others_share_is_the_machines_busy_time_less_ours() {
        let at = |busy, total, own| CpuSnapshot { busy, total, own };
        let start = at(1000, 10_000, 300);
        // 200 ticks of 2 CPUs' 200 each: we took 150 of the 300 busy ones.
        assert_eq!(at(1300, 10_400, 450).others_since(&start), Some(0.375));
        // Ours alone: nobody else.
        assert_eq!(at(1300, 10_400, 600).others_since(&start), Some(0.0));
        // Too short to say.
        assert_eq!(at(1001, 10_005, 300).others_since(&start), None);
    }

    #[test]
    fn only_a_share_above_the_threshold_gets_a_note() {
        assert_eq!(note(Some(0.05), 2, "while autotune measured"), None);
        assert_eq!(note(None, 2, "while autotune measured"), None);
        let n = note(Some(0.48), 2, "while autotune measured").unwrap();
        assert!(n.starts_with("the machine was busy: other programs took 48% of its 2 CPUs' time while autotune measured"), "{n}");
    }
}
