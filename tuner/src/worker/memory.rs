//! The worker's own memory, from /proc: what llama.cpp's host buffers took (thread stacks left
//! out) and the resident set size; and whether a load fits the device memory free right now.

use crate::measuring::DeviceBytes;
use search_space::size::format_size_pair;

/// Host memory this process holds for llama.cpp's buffers: private data (heap and anonymous
/// mappings: KV cache, compute buffers, repacked weights — counted when allocated, touched or not,
/// as a device allocation is) plus resident file-backed pages (the mmap'd weights, once read), less
/// the reservations of thread stacks (see [`thread_stack_bytes`]).
pub fn committed_bytes() -> u64 {
    private_bytes() + status_bytes("RssFile:")
}

/// Private memory this process holds (heap and anonymous mappings, allocated whether touched or
/// not), less the reservations of thread stacks: [`committed_bytes`] without file-backed pages.
pub fn private_bytes() -> u64 {
    status_bytes("VmData:").saturating_sub(thread_stack_bytes(
        &std::fs::read_to_string("/proc/self/maps").unwrap_or_default(),
    ))
}

/// A `/proc/self/status` figure (`key` with its colon) in bytes; 0 where unavailable.
fn status_bytes(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status_kib(&status, key) * 1024
}

/// A `Key:  N kB` figure of /proc/PID/status, in KiB; 0 when absent.
fn status_kib(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Clears the referenced bits of this process's pages, so that [`model_pages_referenced`] later
/// counts the pages read since. `false` where the kernel does not offer it.
pub fn clear_referenced() -> bool {
    std::fs::write("/proc/self/clear_refs", "1").is_ok()
}

/// Bytes of mmap'd GGUF files (the model's, a draft's) referenced since [`clear_referenced`],
/// from /proc/self/smaps.
pub fn model_pages_referenced() -> Option<u64> {
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .map(|s| gguf_referenced_bytes(&s))
}

/// The `Referenced:` bytes of the mappings of `.gguf` files in an smaps listing.
pub fn gguf_referenced_bytes(smaps: &str) -> u64 {
    let mut total = 0;
    let mut in_gguf = false;
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping's header: range perms offset dev inode [path, which may hold spaces]
            let rest: Vec<&str> = f.collect();
            in_gguf = rest.len() > 4 && rest.last().is_some_and(|p| p.ends_with(".gguf"));
        } else if in_gguf && first == "Referenced:" {
            total += f.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024;
        }
    }
    total
}

/// Device memory kept free beyond a load's prediction (llama.cpp's accounting is within a few
/// percent of what it allocates; small allocations outside its buffers remain).
pub const LOAD_GUARD: u64 = 64 << 20;

/// How [`short_of_device_memory`]'s reasons begin.
pub const SHORT_OF_MEMORY: &str = "not loaded, to avoid running out of memory";

/// Why a load predicted to take `expect` would not fit in the device memory `free` now (device →
/// free bytes), or `None` when it fits with [`LOAD_GUARD`] to spare. Devices not listed in `free`
/// are not checked.
pub fn short_of_device_memory(expect: &[DeviceBytes], free: &[(String, u64)]) -> Option<String> {
    expect.iter().find_map(|e| {
        let (_, f) = free.iter().find(|(name, _)| *name == e.device)?;
        (e.bytes.saturating_add(LOAD_GUARD) > *f).then(|| {
            let (need, free) = format_size_pair(e.bytes, *f);
            // Within the guard: say what is kept free beyond the prediction.
            let guard = if e.bytes <= *f {
                format!(
                    " and {} kept spare",
                    search_space::size::format_size(LOAD_GUARD)
                )
            } else {
                String::new()
            };
            format!(
                "{SHORT_OF_MEMORY}: needs {need}{guard} on {}, {free} free now \
                 (other processes, the tuner's own workers included, hold the rest)",
                e.device,
            )
        })
    })
}

/// Thread stacks in a `/proc/PID/maps` listing: an anonymous read-write mapping directly above its
/// guard page(s) (an anonymous `---p` mapping of at most 1 MiB), which is how glibc lays out a
/// pthread stack. VmData counts each whole stack reservation (8 MiB by default) although a thread
/// touches a few pages of it: a compute thread started by the first decode is not memory llama.cpp
/// took. Malloc arenas are the other way round (read-write below their reserved, inaccessible rest),
/// and an inaccessible region larger than a guard does not qualify.
pub fn thread_stack_bytes(maps: &str) -> u64 {
    const MAX_GUARD: u64 = 1 << 20;
    let mut total = 0;
    // (end address, size) of the previous line when it was an anonymous guard.
    let mut guard_end: Option<u64> = None;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            guard_end = None;
            continue;
        };
        let anonymous = f.nth(2) == Some("0") && f.next().is_none();
        let Some((start, end)) = range.split_once('-').and_then(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        }) else {
            guard_end = None;
            continue;
        };
        if anonymous && perms.starts_with("rw") && guard_end == Some(start) {
            total += end.saturating_sub(start);
        }
        guard_end =
            (anonymous && perms == "---p" && end.saturating_sub(start) <= MAX_GUARD).then_some(end);
    }
    total
}

/// Resident set size of this process, from /proc (0 where unavailable).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        // SAFETY: sysconf is a plain query.
        .map(|pages| pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{
        gguf_referenced_bytes, short_of_device_memory, status_kib, thread_stack_bytes, DeviceBytes,
        LOAD_GUARD,
    };

    #[test]
    fn reads_a_status_figure_in_kib() {
        let status = "Name:\tautotune\nVmData:\t  123456 kB\nRssFile:\t   2048 kB\n";
        assert_eq!(status_kib(status, "VmData:"), 123_456);
        assert_eq!(status_kib(status, "RssFile:"), 2048);
        assert_eq!(status_kib(status, "Nope:"), 0);
    }

    #[test]
    fn referenced_pages_of_gguf_mappings_are_summed() {
        let smaps = "\
7f0050000000-7f0150000000 r--s 00000000 fd:01 1234                       /models/My Model.gguf
Size:            4194304 kB
Rss:             4194304 kB
Referenced:       262144 kB
7f0150000000-7f0150100000 r-xp 00000000 fd:01 99                         /usr/lib/libggml-cpu.so
Referenced:         1024 kB
7f0160000000-7f0160100000 rw-p 00000000 00:00 0
Referenced:         2048 kB
7f0170000000-7f0170100000 r--s 00000000 fd:01 1235                       /models/draft.gguf
Referenced:          100 kB
";
        // The library and the anonymous mapping do not count; a path with a space does.
        assert_eq!(gguf_referenced_bytes(smaps), (262144 + 100) * 1024);
        assert_eq!(gguf_referenced_bytes(""), 0);
    }

    #[test]
    fn a_load_is_refused_when_less_than_its_prediction_is_free_now() {
        let gib = 1u64 << 30;
        let expect = vec![
            DeviceBytes {
                device: "CUDA0".into(),
                bytes: 10 * gib,
            },
            DeviceBytes {
                device: "CUDA1".into(),
                bytes: 4 * gib,
            },
        ];
        let free = |c0: u64, c1: u64| vec![("CUDA0".to_string(), c0), ("CUDA1".to_string(), c1)];
        assert_eq!(
            short_of_device_memory(&expect, &free(20 * gib, 20 * gib)),
            None
        );
        // Exactly the prediction plus the guard still fits; one byte less does not.
        assert_eq!(
            short_of_device_memory(&expect, &free(20 * gib, 4 * gib + LOAD_GUARD)),
            None
        );
        let why = short_of_device_memory(&expect, &free(20 * gib, 4 * gib + LOAD_GUARD - 1))
            .expect("refused");
        assert!(
            why.contains("needs 4.0 GiB and 64.0 MiB kept spare on CUDA1, 4.1 GiB free now"),
            "{why}"
        );
        // A device the worker does not see (an RPC server gone) is the load's problem, not this check's.
        assert_eq!(short_of_device_memory(&expect, &[]), None);
    }

    #[test]
    fn thread_stacks_are_the_read_write_mappings_right_above_a_guard() {
        let maps = "\
55d0c0000000-55d0c0100000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000021000 rw-p 00000000 00:00 0
7f0000021000-7f0004000000 ---p 00000000 00:00 0
7f0004000000-7f0024000000 rw-p 00000000 00:00 0
7f0040000000-7f0040001000 ---p 00000000 00:00 0
7f0040001000-7f0040801000 rw-p 00000000 00:00 0
7f0050000000-7f0050100000 r--p 00000000 fd:01 1234                       /models/m.gguf
7f0050100000-7f0050101000 ---p 00000000 fd:01 1234                       /usr/lib/libx.so
7f0050101000-7f0050102000 rw-p 00000000 00:00 0
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
";
        // Counted: the 8 MiB stack above its 4 KiB guard. Not counted: the arena (read-write
        // below its 64 MiB reservation), the 512 MiB buffer right above that reservation (too big a
        // region for a guard), the anonymous page above a library's inaccessible mapping, the main
        // thread's [stack], the heap and the file mapping.
        assert_eq!(thread_stack_bytes(maps), 8 << 20);
        assert_eq!(thread_stack_bytes(""), 0);
        assert_eq!(thread_stack_bytes("garbage\n- x\n"), 0);
    }
}
