//! What machine this is: CPU, cores, memory, OS and llama.cpp's devices, and a fingerprint that
//! changes when any of them does (a profile measured elsewhere is stale here).

use crate::llama::DeviceInfo;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub fingerprint: String,
    pub hostname: String,
    pub cpu: String,
    pub physical_cores: u32,
    pub logical_cpus: u32,
    pub ram_bytes: u64,
    pub ram_available_bytes: u64,
    pub os: String,
    pub devices: Vec<DeviceInfo>,
    /// NUMA nodes with CPUs ([`numa_nodes`]); 1 on most machines.
    #[serde(default = "profiles::serde_one::one")]
    pub numa_nodes: u32,
}

impl Machine {
    pub fn probe(devices: Vec<DeviceInfo>) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let logical = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let physical = physical_cores(&cpuinfo)
            .unwrap_or(logical)
            .clamp(1, logical.max(1));
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let ram_bytes = meminfo_kib(&meminfo, "MemTotal:") * 1024;
        let ram_available_bytes = meminfo_kib(&meminfo, "MemAvailable:") * 1024;
        let os = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|t| {
                t.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| {
                    l.trim_start_matches("PRETTY_NAME=")
                        .trim_matches('"')
                        .to_string()
                })
            })
            .unwrap_or_else(|| std::env::consts::OS.to_string());
        let hostname = std::fs::read_to_string("/etc/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let mut h = Sha256::new();
        h.update(format!(
            "{cpu}|{physical}|{logical}|{}|{os}",
            ram_bytes >> 30
        ));
        // RPC devices are other machines (or servers) a run connects to, not this machine: a profile
        // is found again whether or not they are connected, and `apply` connects the profile's own.
        for d in devices.iter().filter(|d| !d.is_rpc()) {
            h.update(format!(
                "|{}|{}|{}|{}",
                d.name,
                d.description,
                d.kind,
                d.memory_total >> 20
            ));
        }
        Machine {
            fingerprint: hex::encode(h.finalize()),
            hostname,
            cpu,
            physical_cores: physical,
            logical_cpus: logical,
            ram_bytes,
            ram_available_bytes,
            os,
            devices,
            numa_nodes: numa_nodes(std::path::Path::new(SYS_NODES)),
        }
    }

    /// Devices other than the CPU that layers can be offloaded to.
    pub fn offload_devices(&self) -> Vec<&DeviceInfo> {
        self.devices.iter().filter(|d| d.takes_layers()).collect()
    }
}

/// Where Linux lists the NUMA nodes.
const SYS_NODES: &str = "/sys/devices/system/node";

/// NUMA nodes that have CPUs (`node*/cpulist` not empty) under `root` (Linux's
/// /sys/devices/system/node; a memory-only node, such as CXL memory, does not count: no thread can
/// be placed there). 1 where the directory does not exist (another OS, a container that hides it).
pub fn numa_nodes(root: &std::path::Path) -> u32 {
    let Ok(dir) = std::fs::read_dir(root) else {
        return 1;
    };
    let with_cpus = dir
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("node")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("cpulist")).is_ok_and(|l| !l.trim().is_empty())
        })
        .count() as u32;
    with_cpus.max(1)
}

fn physical_cores(cpuinfo: &str) -> Option<u32> {
    let mut seen = std::collections::BTreeSet::new();
    let mut phys = String::new();
    for line in cpuinfo.lines() {
        if let Some(v) = line.strip_prefix("physical id") {
            phys = v.trim_start_matches([' ', '\t', ':']).trim().to_string();
        } else if let Some(v) = line.strip_prefix("core id") {
            seen.insert((
                phys.clone(),
                v.trim_start_matches([' ', '\t', ':']).trim().to_string(),
            ));
        }
    }
    if seen.is_empty() {
        None
    } else {
        Some(seen.len() as u32)
    }
}

/// The RAM available to a new process now (`MemAvailable`: free memory plus the page cache and slab
/// the kernel can reclaim); `None` where /proc/meminfo does not say.
pub fn ram_available_now() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo
        .lines()
        .any(|l| l.starts_with("MemAvailable:"))
        .then(|| meminfo_kib(&meminfo, "MemAvailable:") * 1024)
}

fn meminfo_kib(meminfo: &str, key: &str) -> u64 {
    meminfo
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_nodes_are_those_with_cpus() {
        let dir = tempfile::tempdir().unwrap();
        let node = |name: &str, cpus: &str| {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("cpulist"), cpus).unwrap();
        };
        assert_eq!(numa_nodes(&dir.path().join("missing")), 1);
        assert_eq!(numa_nodes(dir.path()), 1, "no node listed");
        node("node0", "0-15,32-47\n");
        assert_eq!(numa_nodes(dir.path()), 1);
        node("node1", "16-31,48-63\n");
        // CXL memory: a node without CPUs; and files that are not nodes.
        node("node2", "\n");
        std::fs::write(dir.path().join("possible"), "0-2\n").unwrap();
        std::fs::create_dir(dir.path().join("nodex")).unwrap();
        assert_eq!(numa_nodes(dir.path()), 2);
    }

    #[test]
    fn counts_physical_cores_once_per_core_id() {
        let info = "processor\t: 0\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 1\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 2\nphysical id\t: 0\ncore id\t\t: 1\n";
        assert_eq!(physical_cores(info), Some(2));
        assert_eq!(physical_cores(""), None);
    }
}
