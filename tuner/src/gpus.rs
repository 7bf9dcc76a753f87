//! GPUs as the operating system sees them, whether or not this build of llama.cpp can drive them.
//!
//! A profile that leaves the GPU idle, trusted because it was "measured", is the worst result the tool
//! can give: on an NVIDIA machine a build without the CUDA backend (or Vulkan) would tune the CPU alone
//! and say nothing. So `doctor` and `tune` look for the hardware themselves — NVIDIA's driver files
//! (`/proc/driver/nvidia/gpus`) or `nvidia-smi`, display controllers under `/sys/class/drm` (AMD, Intel,
//! NVIDIA without its driver), Apple silicon on macOS — and compare it with the devices llama.cpp
//! reports: a GPU no loaded backend offers gets one warning, with the command that fixes it, and
//! every GPU a line on the backends that could drive it ([`advice`]).

use crate::llama::DeviceInfo;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub mod advice;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Amd,
    Intel,
    Apple,
}

impl Vendor {
    fn from_pci(id: &str) -> Option<Vendor> {
        match id.trim().to_ascii_lowercase().as_str() {
            "0x10de" => Some(Vendor::Nvidia),
            "0x1002" => Some(Vendor::Amd),
            "0x8086" => Some(Vendor::Intel),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Vendor::Nvidia => "NVIDIA",
            Vendor::Amd => "AMD",
            Vendor::Intel => "Intel",
            Vendor::Apple => "Apple",
        }
    }

    /// ggml backends (registry names, lower case) that drive this vendor's GPUs, best first.
    pub fn backends(self) -> &'static [&'static str] {
        match self {
            Vendor::Nvidia => &["cuda", "vulkan"],
            Vendor::Amd => &["rocm", "hip", "vulkan"],
            Vendor::Intel => &["sycl", "vulkan"],
            Vendor::Apple => &["metal", "mtl"],
        }
    }

    /// What builds a backend for this vendor.
    pub fn build_hint(self) -> &'static str {
        match self {
            Vendor::Nvidia => "scripts/build-backends cuda",
            Vendor::Amd | Vendor::Intel => "scripts/build-backends vulkan",
            Vendor::Apple => "cargo build --release -p tuner --features metal",
        }
    }
}

/// One GPU found by the operating system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub vendor: Vendor,
    /// The model name where the driver gives one, else the PCI ids.
    pub name: String,
    /// Where it was seen (a path, or `nvidia-smi`).
    pub source: String,
}

/// The GPUs under `root` (`/` on a real machine; a fixture directory in tests). NVIDIA GPUs come from
/// the driver's files when it is loaded; display controllers (PCI class 0x03) from `sys/class/drm`.
pub fn scan(root: &Path) -> Vec<Gpu> {
    let mut gpus = nvidia_driver_gpus(root);
    let have_nvidia = !gpus.is_empty();
    for g in drm_gpus(root) {
        // With NVIDIA's driver loaded its own files already named these GPUs.
        if !(have_nvidia && g.vendor == Vendor::Nvidia) {
            gpus.push(g);
        }
    }
    gpus
}

/// This machine's GPUs: [`scan`] of `/`, `nvidia-smi -L` when the driver's files are not visible
/// (some containers), and Apple silicon on macOS.
pub fn this_machine() -> Vec<Gpu> {
    let mut gpus = scan(Path::new("/"));
    if !gpus.iter().any(|g| g.vendor == Vendor::Nvidia) {
        gpus.extend(nvidia_smi_gpus());
    }
    if cfg!(target_os = "macos") && cfg!(target_arch = "aarch64") {
        gpus.push(Gpu {
            vendor: Vendor::Apple,
            name: "Apple silicon GPU".into(),
            source: "the OS".into(),
        });
    }
    gpus
}

fn nvidia_driver_gpus(root: &Path) -> Vec<Gpu> {
    let dir = root.join("proc/driver/nvidia/gpus");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    entries
        .into_iter()
        .map(|p| {
            let info = std::fs::read_to_string(p.join("information")).unwrap_or_default();
            let name = info
                .lines()
                .find_map(|l| l.strip_prefix("Model:"))
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "NVIDIA GPU".into());
            Gpu {
                vendor: Vendor::Nvidia,
                name,
                source: p.display().to_string(),
            }
        })
        .collect()
}

fn drm_gpus(root: &Path) -> Vec<Gpu> {
    let dir = root.join("sys/class/drm");
    let mut cards: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    cards.sort();
    let read = |p: &Path, f: &str| std::fs::read_to_string(p.join("device").join(f)).ok();
    cards
        .into_iter()
        .filter(|p| {
            // card0, card1 … (not their connectors card0-HDMI-A-1, nor renderD128).
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("card"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|p| read(p, "class").is_some_and(|c| c.trim().starts_with("0x03")))
        .filter_map(|p| {
            let vendor_id = read(&p, "vendor")?;
            let vendor = Vendor::from_pci(&vendor_id)?;
            let device = read(&p, "device").unwrap_or_default();
            Some(Gpu {
                vendor,
                name: format!(
                    "{} GPU (PCI {}:{})",
                    vendor.name(),
                    vendor_id.trim().trim_start_matches("0x"),
                    device.trim().trim_start_matches("0x")
                ),
                source: p.display().to_string(),
            })
        })
        .collect()
}

fn nvidia_smi_gpus() -> Vec<Gpu> {
    let Ok(out) = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    parse_nvidia_smi_list(&String::from_utf8_lossy(&out.stdout))
}

/// `nvidia-smi -L` lines: `GPU 0: NVIDIA H200 (UUID: GPU-…)`.
fn parse_nvidia_smi_list(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("GPU ")?;
            let (_, name) = rest.split_once(": ")?;
            let name = name.split(" (UUID").next()?.trim();
            Some(Gpu {
                vendor: Vendor::Nvidia,
                name: name.to_string(),
                source: "nvidia-smi".into(),
            })
        })
        .collect()
}

/// Memory a discrete GPU already has in use above which the run says so: [`IN_USE_FLOOR`] or this
/// share of the GPU, whichever is more (a driver's context and a desktop take some).
const IN_USE_SHARE: f64 = 0.05;
const IN_USE_FLOOR: u64 = 3 << 29; // 1.5 GiB

/// One warning per discrete GPU whose memory other programs already hold (a desktop, a game, a
/// model another server keeps loaded): the search fits what is free, so a profile tuned now leaves
/// that memory to them. Integrated GPUs (the host's RAM) and RPC devices (another host's RAM, where
/// other programs live) are not judged. `holders` names the programs on a CUDA device's line
/// (NVIDIA's list of processes on its GPUs, [`nvidia_compute_apps`]).
pub fn memory_in_use(devices: &[DeviceInfo], holders: impl Fn() -> Vec<GpuApp>) -> Vec<String> {
    use search_space::size::format_size;
    let mut apps = None;
    devices
        .iter()
        .filter(|d| d.kind.eq_ignore_ascii_case("gpu") && !d.is_rpc())
        .filter_map(|d| {
            let used = d.memory_total.saturating_sub(d.memory_free);
            let floor = IN_USE_FLOOR.max((d.memory_total as f64 * IN_USE_SHARE) as u64);
            if used <= floor {
                return None;
            }
            let apps = apps.get_or_insert_with(&holders);
            let named = if d.backend.eq_ignore_ascii_case("CUDA") && !apps.is_empty() {
                let list: Vec<String> = (apps.iter())
                    .map(|a| format!("{} (pid {}, {})", a.name, a.pid, format_size(a.bytes)))
                    .collect();
                format!(" (nvidia-smi: {})", list.join(", "))
            } else {
                String::new()
            };
            Some(format!(
                "{}: {} of its {} is already in use{named}; the search fits the {} free, so a profile tuned now leaves the rest to them: stop them and tune again to use the whole GPU, or keep them and this profile",
                d.name,
                format_size(used),
                format_size(d.memory_total),
                format_size(d.memory_free)
            ))
        })
        .collect()
}

/// A process holding memory on an NVIDIA GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuApp {
    pub pid: u32,
    /// The executable's file name.
    pub name: String,
    pub bytes: u64,
}

/// The processes on this machine's NVIDIA GPUs, other than this one (none without `nvidia-smi`).
pub fn nvidia_compute_apps() -> Vec<GpuApp> {
    let Ok(out) = std::process::Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,process_name,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let me = std::process::id();
    parse_compute_apps(&String::from_utf8_lossy(&out.stdout))
        .into_iter()
        .filter(|a| a.pid != me)
        .collect()
}

/// `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits`
/// lines: `1234, /usr/bin/ollama, 9830` (MiB). Lines that do not parse (`[N/A]`) are left out.
fn parse_compute_apps(text: &str) -> Vec<GpuApp> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(", ");
            let pid = f.next()?.trim().parse().ok()?;
            let path = f.next()?.trim();
            let mib: u64 = f.next()?.trim().parse().ok()?;
            let name = path.rsplit('/').next().unwrap_or(path).to_string();
            Some(GpuApp {
                pid,
                name,
                bytes: mib << 20,
            })
        })
        .collect()
}

fn display_backend(b: &str) -> String {
    search_space::backend::display(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    fn card(root: &Path, card: &str, vendor: &str, class: &str, device: &str) {
        write(root, &format!("sys/class/drm/{card}/device/vendor"), vendor);
        write(root, &format!("sys/class/drm/{card}/device/class"), class);
        write(root, &format!("sys/class/drm/{card}/device/device"), device);
    }

    fn device(backend: &str) -> DeviceInfo {
        DeviceInfo {
            name: format!("{backend}0"),
            description: String::new(),
            backend: backend.into(),
            kind: "gpu".into(),
            memory_free: 1,
            memory_total: 1,
            host_buffer: false,
        }
    }

    #[test]
    fn nvidia_driver_files_name_the_gpus() {
        let root = tempfile::tempdir().unwrap();
        write(
            root.path(),
            "proc/driver/nvidia/gpus/0000:19:00.0/information",
            "Model: \t\t NVIDIA H200\nIRQ:   \t\t 34\n",
        );
        // The same GPU as a display controller: not counted twice.
        card(root.path(), "card1", "0x10de\n", "0x030200\n", "0x2335\n");
        let gpus = scan(root.path());
        assert_eq!(gpus.len(), 1, "{gpus:?}");
        assert_eq!(gpus[0].vendor, Vendor::Nvidia);
        assert_eq!(gpus[0].name, "NVIDIA H200");
    }

    #[test]
    fn display_controllers_of_known_vendors_are_gpus() {
        let root = tempfile::tempdir().unwrap();
        card(root.path(), "card0", "0x1002\n", "0x030000\n", "0x744c\n");
        card(root.path(), "card1", "0x8086\n", "0x038000\n", "0x56a0\n");
        // A BMC's display (ASPEED), a connector and a non-display function are not.
        card(root.path(), "card2", "0x1a03\n", "0x030000\n", "0x2000\n");
        card(
            root.path(),
            "card0-DP-1",
            "0x1002\n",
            "0x030000\n",
            "0x744c\n",
        );
        card(root.path(), "card3", "0x10de\n", "0x040300\n", "0x10f0\n");
        let gpus = scan(root.path());
        let vendors: Vec<Vendor> = gpus.iter().map(|g| g.vendor).collect();
        assert_eq!(vendors, [Vendor::Amd, Vendor::Intel], "{gpus:?}");
        assert_eq!(gpus[0].name, "AMD GPU (PCI 1002:744c)");
        // Without the NVIDIA driver, an NVIDIA display controller is still seen.
        card(root.path(), "card4", "0x10de\n", "0x030200\n", "0x2335\n");
        assert!(scan(root.path()).iter().any(|g| g.vendor == Vendor::Nvidia));
    }

    #[test]
    fn an_empty_machine_has_no_gpus() {
        let root = tempfile::tempdir().unwrap();
        assert!(scan(root.path()).is_empty());
    }

    #[test]
    fn a_discrete_gpus_memory_held_by_others_gets_a_warning() {
        let gib = 1u64 << 30;
        let gpu = |name: &str, backend: &str, kind: &str, free: u64, total: u64| DeviceInfo {
            name: name.into(),
            backend: backend.into(),
            kind: kind.into(),
            memory_free: free,
            memory_total: total,
            ..device(backend)
        };
        let devices = [
            gpu("CUDA0", "CUDA", "gpu", 14 * gib, 24 * gib), // 10 GiB held: said
            gpu("CUDA1", "CUDA", "gpu", 23 * gib, 24 * gib), // a context and a desktop: not
            gpu("CUDA2", "CUDA", "gpu", 133 * gib, 140 * gib), // 7 GiB of 140: 5%, not
            gpu("Vulkan0", "Vulkan", "igpu", gib, 16 * gib), // the host's RAM
            gpu("RPC0", "RPC", "gpu", gib, 16 * gib),        // another host's RAM
            gpu("CPU", "CPU", "cpu", gib, 16 * gib),
        ];
        let asked = std::cell::Cell::new(0);
        let holders = || {
            asked.set(asked.get() + 1);
            parse_compute_apps("4242, /usr/local/bin/ollama, 9830\n77, [N/A], [N/A]\n")
        };
        let w = memory_in_use(&devices, holders);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(
                "CUDA0: 10.0 GiB of its 24.0 GiB is already in use (nvidia-smi: ollama (pid 4242, 9.6 GiB))"
            ),
            "{}",
            w[0]
        );
        assert!(w[0].contains("fits the 14.0 GiB free"), "{}", w[0]);
        assert_eq!(asked.get(), 1);
        // No GPU over the line: nvidia-smi is not asked.
        assert!(memory_in_use(&devices[1..], holders).is_empty());
        assert_eq!(asked.get(), 1);
    }

    #[test]
    fn nvidia_smi_list_is_parsed() {
        let gpus = parse_nvidia_smi_list(
            "GPU 0: NVIDIA H200 (UUID: GPU-1234)\nGPU 1: NVIDIA GeForce RTX 4090 (UUID: GPU-5678)\n",
        );
        let names: Vec<&str> = gpus.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["NVIDIA H200", "NVIDIA GeForce RTX 4090"]);
    }
}
