//! How much of the CPUs other programs took while autotune measured: the machine's CPU time from
//! `/proc/stat` (the hypervisor's steal included) less this process's and its workers' own. A tune
//! on a busy machine measures the machine's leftovers: slower, noisier, and a profile that fits an
//! idle machine badly. Linux only; elsewhere nothing is said. RPC servers on this machine (loopback
//! endpoints) compute autotune's own trials: their time counts as autotune's.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Other programs' share of the CPUs' time above which the run says the machine was busy. An idle
/// desktop's background stays well below it; one other busy thread on two cores is 50%.
pub const BUSY_SHARE: f64 = 0.15;

/// How long a look at the CPUs lasts at least: a probe can take a few hundredths of a second, fewer
/// clock ticks than a share can be told from.
pub const SHORTEST_LOOK: Duration = Duration::from_millis(500);

/// Other programs' CPU time from one moment on: [`Watch::start`], then [`Watch::share`].
pub struct Watch {
    start: Option<CpuSnapshot>,
    at: Instant,
    /// This process and the RPC servers on this machine that autotune measures with.
    ours: Vec<u32>,
}

impl Watch {
    /// From now on; `rpc`: the run's RPC endpoints (those on this machine count as autotune's).
    pub fn start(rpc: &[String]) -> Watch {
        let ours: Vec<u32> = std::iter::once(std::process::id())
            .chain(local_servers(Path::new("/proc"), rpc))
            .collect();
        Watch {
            start: CpuSnapshot::now(&ours),
            at: Instant::now(),
            ours,
        }
    }

    /// Other programs' share of all CPUs' time since the start (0 to 1), looked at for `at_least`
    /// (slept out where less has passed: a short span has too few clock ticks to tell a share
    /// from); `None` where `/proc` cannot say.
    pub fn share(&self, at_least: Duration) -> Option<f64> {
        std::thread::sleep(at_least.saturating_sub(self.at.elapsed()));
        CpuSnapshot::now(&self.ours)
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
    /// Ticks of autotune's processes and their children (workers alive or reaped).
    own: u64,
}

impl CpuSnapshot {
    /// This machine's, now, with `ours` (process ids) as autotune's; `None` where `/proc` cannot say
    /// (not Linux).
    fn now(ours: &[u32]) -> Option<CpuSnapshot> {
        let (busy, total) = system_ticks(&std::fs::read_to_string("/proc/stat").ok()?)?;
        Some(CpuSnapshot {
            busy,
            total,
            own: own_ticks(Path::new("/proc"), ours),
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

/// `doctor`'s line for a machine busy right now, or `None` below [`BUSY_SHARE`].
pub fn now_note(share: Option<f64>, cpus: u32) -> Option<String> {
    let share = share.filter(|&s| s > BUSY_SHARE)?;
    Some(format!(
        "the machine is busy: other programs take {:.0}% of its {cpus} CPUs' time (the hypervisor's steal included); a tune now measures what they leave, slower and noisier than this machine's own",
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

/// Ticks of the processes `pids` (their reaped children included) and of their living children
/// (workers) under the `/proc` at `proc`.
fn own_ticks(proc: &Path, pids: &[u32]) -> u64 {
    let read = |dir: &Path| process_ticks(&std::fs::read_to_string(dir.join("stat")).ok()?);
    let mine: u64 = (pids.iter())
        .filter_map(|p| read(&proc.join(p.to_string())))
        .map(|(_, t)| t)
        .sum();
    let children: u64 = process_dirs(proc)
        .filter_map(|(_, dir)| read(&dir))
        .filter(|(ppid, _)| pids.contains(ppid))
        .map(|(_, t)| t)
        .sum();
    mine + children
}

/// Every process's directory under the `/proc` at `proc`, with its id.
fn process_dirs(proc: &Path) -> impl Iterator<Item = (u32, std::path::PathBuf)> {
    (std::fs::read_dir(proc).into_iter().flatten().flatten())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
}

/// The processes listening on this machine on the ports of those `endpoints` (`host:port`) that
/// name this machine: loopback RPC servers.
fn local_servers(proc: &Path, endpoints: &[String]) -> Vec<u32> {
    let ports: Vec<u16> = endpoints.iter().filter_map(|e| loopback_port(e)).collect();
    if ports.is_empty() {
        return Vec::new();
    }
    let sockets: Vec<String> = ["net/tcp", "net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(proc.join(t)).ok())
        .flat_map(|table| listening_inodes(&table, &ports))
        .map(|inode| format!("socket:[{inode}]"))
        .collect();
    if sockets.is_empty() {
        return Vec::new();
    }
    let holds = |dir: &Path| {
        (std::fs::read_dir(dir.join("fd"))
            .into_iter()
            .flatten()
            .flatten())
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|l| l.to_str().is_some_and(|l| sockets.iter().any(|s| s == l)))
    };
    let me = std::process::id();
    process_dirs(proc)
        .filter(|(pid, dir)| *pid != me && holds(dir))
        .map(|(pid, _)| pid)
        .collect()
}

/// The port of an endpoint on this machine (`127.0.0.1:50052`, `localhost:50052`, `[::1]:50052`).
fn loopback_port(endpoint: &str) -> Option<u16> {
    let (host, port) = endpoint.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let here = host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    here.then(|| port.parse().ok()).flatten()
}

/// Inodes of the listening sockets on `ports` in a `/proc/net/tcp` or `tcp6` table (`sl
/// local_address rem_address st … uid timeout inode`, addresses `HEX:PORT`, state `0A` = LISTEN).
fn listening_inodes(table: &str, ports: &[u16]) -> Vec<u64> {
    (table.lines().skip(1))
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            let listening = *f.get(3)? == "0A" && ports.contains(&port);
            listening.then(|| f.get(9)?.parse().ok()).flatten()
        })
        .collect()
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
        assert_eq!(own_ticks(dir.path(), &[10]), 126);
        // A loopback RPC server counts as ours too.
        assert_eq!(own_ticks(dir.path(), &[10, 12]), 126 + 503);
    }

    #[test]
    fn the_rpc_servers_on_this_machine_are_found_by_their_listening_socket() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("net");
        std::fs::create_dir(&net).unwrap();
        // 127.0.0.1:50071 (0xC397) listening, inode 111; :50072 connected, not listening (222);
        // [::]:50073 listening (333).
        std::fs::write(
            net.join("tcp"),
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:C397 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n   1: 0100007F:C398 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 100 0 0 10 0\n",
        )
        .unwrap();
        std::fs::write(
            net.join("tcp6"),
            "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000000000000000000000000000:C399 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0\n",
        )
        .unwrap();
        let process = |pid: &str, sockets: &[&str]| {
            let fd = dir.path().join(pid).join("fd");
            std::fs::create_dir_all(&fd).unwrap();
            for (k, s) in sockets.iter().enumerate() {
                std::os::unix::fs::symlink(s, fd.join(k.to_string())).unwrap();
            }
        };
        process("40", &["socket:[111]", "/dev/null"]);
        process("41", &["socket:[222]"]);
        process("42", &["socket:[333]"]);
        process("43", &["socket:[999]"]);
        let endpoints = |e: &[&str]| e.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut found = local_servers(
            dir.path(),
            &endpoints(&["127.0.0.1:50071", "127.0.0.1:50072", "[::1]:50073"]),
        );
        found.sort();
        assert_eq!(found, vec![40, 42]);
        // A remote machine's server is not this machine's.
        let remote = endpoints(&["192.168.1.7:50071", "gpu-box:50073"]);
        assert_eq!(local_servers(dir.path(), &remote), Vec::<u32>::new());
        assert_eq!(loopback_port("localhost:50052"), Some(50052));
        assert_eq!(loopback_port("127.0.0.1"), None);
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
        assert_eq!(now_note(Some(0.1), 2), None);
        let n = now_note(Some(0.5), 4).unwrap();
        assert!(
            n.starts_with("the machine is busy: other programs take 50% of its 4 CPUs' time"),
            "{n}"
        );
    }
}
