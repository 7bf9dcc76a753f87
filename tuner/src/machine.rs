//! What machine this is: CPU, cores, memory, OS and llama.cpp's devices, and a fingerprint that
//! changes when any of them does (a profile measured elsewhere is stale here).
//!
//! Memory and the physical cores come from the OS through `sysinfo` (on Linux the same
//! /proc/meminfo and /proc/cpuinfo figures as ever; elsewhere its own calls, where reading /proc
//! would find nothing). What only Linux tells stays Linux's: the CPU's model name as the fingerprint
//! has always had it, a hybrid CPU's performance cores, the NUMA nodes.

use crate::llama::DeviceInfo;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sysinfo::{CpuRefreshKind, RefreshKind, System};

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
    /// A hybrid CPU's performance cores ([`performance_cores`]); `None` on other CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance_cores: Option<u32>,
    /// A GPU that several loaded backends drive, through each backend but the one llama.cpp lists
    /// it by (`Vulkan0` beside `CUDA0`): a way to run it that the backend axis measures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_backends: Vec<OtherBackend>,
}

/// A listed GPU's name through another backend that drives it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OtherBackend {
    /// The listed device (`CUDA0`).
    pub same_as: String,
    /// The same GPU through the other backend (`Vulkan0`).
    pub device: DeviceInfo,
}

impl Machine {
    pub fn probe(devices: Vec<DeviceInfo>) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpu_name(&cpuinfo);
        let logical = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let physical = (System::new().physical_core_count())
            .map_or(logical, |n| n as u32)
            .clamp(1, logical.max(1));
        let (ram_bytes, ram_available_bytes) = crate::ram::total_and_available();
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
            performance_cores: performance_cores(
                std::fs::read_to_string(SYS_P_CORES).ok().as_deref(),
                &cpuinfo,
            )
            .filter(|&p| p < physical),
            other_backends: Vec::new(),
        }
    }

    /// This machine with the other backends' names for its GPUs: the skipped devices that are a
    /// listed GPU through another backend.
    pub fn with_other_backends(mut self, skipped: &[crate::llama::SkippedDevice]) -> Machine {
        self.other_backends = (skipped.iter())
            .filter_map(|s| {
                Some(OtherBackend {
                    same_as: s.same_as.clone()?,
                    device: s.device.clone(),
                })
            })
            .collect();
        self
    }

    /// The ggml backends that drive some GPU also driven by another (`CUDA`, `Vulkan`), in
    /// llama.cpp's order: the backend axis's choices. Empty where each GPU has one backend.
    pub fn gpu_backends(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for o in &self.other_backends {
            let listed = self.devices.iter().find(|d| d.name == o.same_as);
            for b in listed
                .map(|d| &d.backend)
                .into_iter()
                .chain([&o.device.backend])
            {
                if !out.contains(b) {
                    out.push(b.clone());
                }
            }
        }
        out
    }

    /// The thread count llama.cpp uses unasked (`-t`): its "math" cores, the physical cores, or on
    /// a hybrid CPU the performance cores alone.
    pub fn llama_default_threads(&self) -> u32 {
        self.performance_cores.unwrap_or(self.physical_cores).max(1)
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

/// The CPU's model name: /proc/cpuinfo's `model name` on Linux (part of the fingerprint, so read as
/// it always was), the OS's brand string elsewhere, else the architecture.
fn cpu_name(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .or_else(|| (!cfg!(target_os = "linux")).then(cpu_brand).flatten())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The first CPU's brand string as the OS reports it (sysinfo); `None` when empty.
fn cpu_brand() -> Option<String> {
    let cpus = RefreshKind::nothing().with_cpu(CpuRefreshKind::everything());
    let sys = System::new_with_specifics(cpus);
    let brand = sys.cpus().first()?.brand().trim().to_string();
    (!brand.is_empty()).then_some(brand)
}

/// Where Linux lists a hybrid Intel CPU's performance cores' logical CPUs (its efficiency cores'
/// are under `cpu_atom`).
const SYS_P_CORES: &str = "/sys/devices/cpu_core/cpus";

/// The performance cores of a hybrid CPU: the physical cores (per /proc/cpuinfo) of the logical
/// CPUs in `p_cpus` (a kernel CPU list such as `0-15`, from [`SYS_P_CORES`]); `None` when the
/// list is absent or names no core. That is llama.cpp's default thread count there: it leaves the
/// efficiency cores out ("efficiency cores harm lockstep threading", `common_cpu_get_num_math`).
pub fn performance_cores(p_cpus: Option<&str>, cpuinfo: &str) -> Option<u32> {
    let wanted = parse_cpu_list(p_cpus?)?;
    cores_among(cpuinfo, |cpu| wanted.contains(&cpu))
}

/// A kernel CPU list (`0-3,8,10-11`); `None` when malformed or empty.
fn parse_cpu_list(list: &str) -> Option<std::collections::BTreeSet<u32>> {
    let mut out = std::collections::BTreeSet::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        if b < a || b - a > 65_536 {
            return None;
        }
        out.extend(a..=b);
    }
    (!out.is_empty()).then_some(out)
}

/// Physical cores (distinct `physical id`, `core id` pairs in /proc/cpuinfo) of the logical CPUs
/// (`processor`) that `keep` accepts; `None` when there are none.
fn cores_among(cpuinfo: &str, keep: impl Fn(u32) -> bool) -> Option<u32> {
    let mut seen = std::collections::BTreeSet::new();
    let (mut processor, mut phys) = (None, String::new());
    let value = |v: &str| v.trim_start_matches([' ', '\t', ':']).trim().to_string();
    for line in cpuinfo.lines() {
        if let Some(v) = line.strip_prefix("processor") {
            processor = value(v).parse::<u32>().ok();
        } else if let Some(v) = line.strip_prefix("physical id") {
            phys = value(v);
        } else if let Some(v) = line.strip_prefix("core id") {
            if processor.is_none_or(&keep) {
                seen.insert((phys.clone(), value(v)));
            }
        }
    }
    (!seen.is_empty()).then_some(seen.len() as u32)
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

    /// A hybrid CPU as Linux shows it: two performance cores with two threads each (CPUs 0-3),
    /// two efficiency cores (CPUs 4-5).
    #[test]
    fn a_hybrid_cpus_performance_cores_are_the_cores_of_its_p_cpus() {
        let info: String = [(0, 0), (1, 0), (2, 4), (3, 4), (4, 8), (5, 9)]
            .iter()
            .map(|(p, c)| format!("processor\t: {p}\nphysical id\t: 0\ncore id\t\t: {c}\n\n"))
            .collect();
        assert_eq!(cores_among(&info, |_| true), Some(4));
        assert_eq!(performance_cores(Some("0-3\n"), &info), Some(2));
        assert_eq!(performance_cores(Some("0,2"), &info), Some(2));
        assert_eq!(performance_cores(None, &info), None, "not hybrid");
        assert_eq!(performance_cores(Some(""), &info), None);
        assert_eq!(performance_cores(Some("3-1"), &info), None);
        assert_eq!(performance_cores(Some("x"), &info), None);
    }

    /// On Linux sysinfo reads the figures autotune read from /proc itself before, to the byte and
    /// the core: profiles and fingerprints made then are found again.
    #[cfg(target_os = "linux")]
    #[test]
    fn on_linux_the_ram_and_cores_are_procs_own_figures() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let mem_total_kib: u64 = (meminfo.lines())
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        assert_eq!(crate::ram::total_and_available().0, mem_total_kib * 1024);
        assert!(crate::ram::available_now()
            .is_some_and(|a| a > 0 && a <= crate::ram::total_and_available().0));
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        if let Some(cores) = cores_among(&cpuinfo, |_| true) {
            assert_eq!(System::new().physical_core_count(), Some(cores as usize));
        }
    }

    #[test]
    fn counts_physical_cores_once_per_core_id() {
        let info = "processor\t: 0\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 1\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 2\nphysical id\t: 0\ncore id\t\t: 1\n";
        assert_eq!(cores_among(info, |_| true), Some(2));
        assert_eq!(cores_among("", |_| true), None);
    }
}
