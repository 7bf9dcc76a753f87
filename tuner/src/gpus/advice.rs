//! Advice per GPU the operating system shows: which ggml backends could drive it, which of them this
//! build loaded, why each loaded one lists no device for it, and the one command that fixes it.
//!
//! The command follows from what is missing, not from a guess: an NVIDIA GPU that `nvidia-smi` (or
//! the driver's files) shows has its driver, so a build whose only GPU module is Vulkan, with no
//! NVIDIA Vulkan driver (ICD) for the loader, wants the CUDA module (`scripts/build-backends cuda`),
//! not a driver.

use super::{display_backend, Gpu, Vendor};
use crate::llama::DeviceInfo;
use serde::Serialize;
use std::path::Path;

/// What this machine and build offer a GPU: the loaded backends, the devices ggml registered
/// (those llama.cpp lists and those it skips), the drivers, and why a backend did not start.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The backends ggml loaded (registry names: `CPU`, `CUDA`, `Vulkan`).
    pub backends: Vec<String>,
    pub devices: Vec<DeviceInfo>,
    /// An NVIDIA driver is installed (its kernel module's files or libcuda).
    pub nvidia_driver: bool,
    /// The Vulkan loader's driver manifests (file names: `nvidia_icd.json`, `lvp_icd.x86_64.json`).
    pub vulkan_icds: Vec<String>,
    /// (backend, the reason it logged for not starting).
    pub start_failures: Vec<(String, String)>,
}

/// One backend that could drive a vendor's GPUs, as this build has it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendState {
    pub backend: String,
    pub loaded: bool,
    /// Its devices that are these GPUs.
    pub devices: Vec<String>,
    /// Why it lists none of them (not built, no driver, did not start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_none: Option<String>,
}

/// The advice for one vendor's GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuAdvice {
    pub vendor: Vendor,
    pub gpus: Vec<String>,
    /// Each backend that could drive them, best first.
    pub backends: Vec<BackendState>,
    /// The one command that gives them a backend (where none drives them), or another backend
    /// to compare (where one drives them and the other's driver is there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl GpuAdvice {
    /// Whether some loaded backend drives these GPUs.
    pub fn driven(&self) -> bool {
        self.backends.iter().any(|b| !b.devices.is_empty())
    }

    /// One line: the GPUs, each backend's state, the command.
    pub fn line(&self) -> String {
        let states: Vec<String> = (self.backends.iter())
            .map(|b| match (&b.why_none, b.devices.is_empty()) {
                (_, false) => format!("{} drives it as {}", b.backend, b.devices.join(", ")),
                (Some(why), true) => format!("{}: {why}", b.backend),
                (None, true) => format!("{}: no device", b.backend),
            })
            .collect();
        let both = if self
            .backends
            .iter()
            .filter(|b| !b.devices.is_empty())
            .count()
            > 1
        {
            " (tune measures each)"
        } else {
            ""
        };
        let fix = self.fix.as_ref().map_or_else(String::new, |f| {
            if self.driven() {
                format!("; to compare another backend: {f}")
            } else {
                format!("; fix: {f}")
            }
        });
        format!("{}: {}{both}{fix}", self.gpus.join(", "), states.join("; "))
    }

    /// The warning where no loaded backend drives these GPUs.
    pub fn warning(&self) -> Option<String> {
        if self.driven() {
            return None;
        }
        let why: Vec<String> = (self.backends.iter())
            .map(|b| {
                format!(
                    "{}: {}",
                    b.backend,
                    b.why_none.as_deref().unwrap_or("no device")
                )
            })
            .collect();
        Some(format!(
            "{} found, but no loaded backend drives it ({}): autotune would tune without the GPU. Fix: {}",
            self.gpus.join(", "),
            why.join("; "),
            self.fix.as_deref().unwrap_or("see `autotune doctor`")
        ))
    }
}

/// The Vulkan loader's driver manifests under `root` (`/` on a real machine).
pub fn vulkan_icds(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = [
        "usr/share/vulkan/icd.d",
        "etc/vulkan/icd.d",
        "usr/local/share/vulkan/icd.d",
    ]
    .iter()
    .filter_map(|d| std::fs::read_dir(root.join(d)).ok())
    .flatten()
    .flatten()
    .map(|e| e.file_name().to_string_lossy().into_owned())
    .filter(|n| n.ends_with(".json"))
    .collect();
    out.sort();
    out
}

/// Whether an ICD manifest's name is a Vulkan driver for `vendor`'s GPUs.
fn icd_for(vendor: Vendor, icd: &str) -> bool {
    let icd = icd.to_ascii_lowercase();
    match vendor {
        Vendor::Nvidia => icd.contains("nvidia"),
        Vendor::Amd => icd.contains("radeon") || icd.contains("amd"),
        Vendor::Intel => icd.contains("intel"),
        Vendor::Apple => icd.contains("moltenvk"),
    }
}

/// Whether `d` (of a backend that drives `vendor`) is one of its GPUs: a vendor's own backend's
/// devices are; a Vulkan device is when its description names the vendor (llvmpipe does not).
fn is_vendors(d: &DeviceInfo, vendor: Vendor) -> bool {
    if !d.backend.eq_ignore_ascii_case("vulkan") {
        return true;
    }
    let desc = d.description.to_ascii_lowercase();
    desc.contains(&vendor.name().to_ascii_lowercase())
        || (vendor == Vendor::Amd && desc.contains("radeon"))
        || (vendor == Vendor::Nvidia && (desc.contains("geforce") || desc.contains("quadro")))
}

/// Why `backend` (lower case) lists none of `vendor`'s GPUs.
fn why_none(vendor: Vendor, backend: &str, loaded: bool, seen: &Seen) -> String {
    if !loaded {
        return format!("not in this build (scripts/build-backends {backend})");
    }
    let failure = (seen.start_failures.iter()).find(|(b, _)| b.eq_ignore_ascii_case(backend));
    match (vendor, backend) {
        (Vendor::Nvidia, "cuda") if !seen.nvidia_driver => {
            "loaded, no NVIDIA driver (libcuda) to run it".into()
        }
        (_, _) if failure.is_some() => {
            format!("loaded, did not start ({})", failure.map_or("", |f| &f.1))
        }
        (_, "vulkan") if !seen.vulkan_icds.iter().any(|i| icd_for(vendor, i)) => {
            let icds = if seen.vulkan_icds.is_empty() {
                "none".to_string()
            } else {
                seen.vulkan_icds.join(", ")
            };
            format!(
                "loaded, no {} Vulkan driver for the loader (its ICDs: {icds})",
                vendor.name()
            )
        }
        _ => "loaded, lists no device".into(),
    }
}

/// The one command for `vendor`'s GPUs: where none is driven, the backend whose driver is there
/// (built, or its driver installed); where one is, another backend whose driver is there to
/// compare with.
fn fix(vendor: Vendor, states: &[BackendState], seen: &Seen) -> Option<String> {
    let has_icd = seen.vulkan_icds.iter().any(|i| icd_for(vendor, i));
    let state = |b: &str| states.iter().find(|s| s.backend.eq_ignore_ascii_case(b));
    let driven = states.iter().any(|s| !s.devices.is_empty());
    let vulkan_missing = state("vulkan").is_some_and(|s| !s.loaded);
    match vendor {
        Vendor::Nvidia if driven => (vulkan_missing && has_icd)
            .then(|| "scripts/build-backends vulkan".to_string()),
        Vendor::Nvidia if seen.nvidia_driver => {
            let cuda = state("cuda");
            Some(match cuda {
                // Loaded with the driver there, yet no device: built for another driver.
                Some(s) if s.loaded => "scripts/build-backends cuda (rebuild it for this driver)".into(),
                _ => "scripts/build-backends cuda".into(),
            })
        }
        Vendor::Nvidia => Some(
            "install NVIDIA's driver (nvidia-smi must list the GPU), then scripts/build-backends cuda".into(),
        ),
        Vendor::Apple if !driven => Some(vendor.build_hint().into()),
        Vendor::Amd | Vendor::Intel if !driven && vulkan_missing => {
            Some("scripts/build-backends vulkan".into())
        }
        Vendor::Amd | Vendor::Intel if !driven && !has_icd => Some(
            "install Mesa's Vulkan driver (apt-get install mesa-vulkan-drivers)".into(),
        ),
        _ => None,
    }
}

/// The advice for each vendor whose GPUs the operating system shows.
pub fn advise(gpus: &[Gpu], seen: &Seen) -> Vec<GpuAdvice> {
    let mut out = Vec::new();
    for vendor in [Vendor::Nvidia, Vendor::Amd, Vendor::Intel, Vendor::Apple] {
        let names: Vec<String> = (gpus.iter())
            .filter(|g| g.vendor == vendor)
            .map(|g| g.name.clone())
            .collect();
        if names.is_empty() {
            continue;
        }
        // ROCm registers as "ROCm" or "HIP": one entry, named as the build names it.
        let wanted: Vec<&str> = match vendor {
            Vendor::Amd => {
                let hip = seen.backends.iter().any(|b| b.eq_ignore_ascii_case("hip"));
                vec![if hip { "hip" } else { "rocm" }, "vulkan"]
            }
            _ => vendor.backends().to_vec(),
        };
        let states: Vec<BackendState> = (wanted.iter())
            .map(|&b| {
                let loaded = seen.backends.iter().any(|l| l.eq_ignore_ascii_case(b));
                let devices: Vec<String> = (seen.devices.iter())
                    .filter(|d| d.backend.eq_ignore_ascii_case(b) && d.takes_layers())
                    .filter(|d| is_vendors(d, vendor))
                    .map(|d| d.name.clone())
                    .collect();
                BackendState {
                    backend: display_backend(b),
                    loaded,
                    why_none: devices
                        .is_empty()
                        .then(|| why_none(vendor, b, loaded, seen)),
                    devices,
                }
            })
            .collect();
        out.push(GpuAdvice {
            vendor,
            gpus: names,
            fix: fix(vendor, &states, seen),
            backends: states,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(vendor: Vendor, name: &str) -> Gpu {
        Gpu {
            vendor,
            name: name.into(),
            source: "nvidia-smi".into(),
        }
    }

    fn dev(name: &str, backend: &str, description: &str) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            description: description.into(),
            backend: backend.into(),
            kind: "gpu".into(),
            memory_free: 1,
            memory_total: 1,
            host_buffer: true,
        }
    }

    fn seen(backends: &[&str], devices: Vec<DeviceInfo>, driver: bool, icds: &[&str]) -> Seen {
        Seen {
            backends: backends.iter().map(|b| b.to_string()).collect(),
            devices,
            nvidia_driver: driver,
            vulkan_icds: icds.iter().map(|b| b.to_string()).collect(),
            start_failures: Vec::new(),
        }
    }

    fn h200() -> Vec<Gpu> {
        vec![gpu(Vendor::Nvidia, "NVIDIA H200")]
    }

    /// The README's second command on an NVIDIA machine: CPU, RPC and Vulkan modules, no CUDA,
    /// only Mesa's llvmpipe for the loader. The driver is there (nvidia-smi answered): what is
    /// missing is the CUDA module.
    #[test]
    fn an_nvidia_gpu_with_only_a_vulkan_module_and_no_nvidia_icd_wants_the_cuda_module() {
        let s = seen(
            &["CPU", "RPC", "Vulkan"],
            vec![],
            true,
            &["lvp_icd.x86_64.json"],
        );
        let a = advise(&h200(), &s);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].fix.as_deref(), Some("scripts/build-backends cuda"));
        let w = a[0].warning().expect("not driven");
        assert!(!w.contains("driver installed"), "{w}");
        assert!(
            w.contains("CUDA: not in this build (scripts/build-backends cuda)")
                && w.contains("Vulkan: loaded, no NVIDIA Vulkan driver for the loader (its ICDs: lvp_icd.x86_64.json)"),
            "{w}"
        );
        assert!(w.ends_with("Fix: scripts/build-backends cuda"), "{w}");
        // Without the Vulkan module: the same command.
        let s = seen(&["CPU", "RPC"], vec![], true, &[]);
        let a = advise(&h200(), &s);
        assert_eq!(a[0].fix.as_deref(), Some("scripts/build-backends cuda"));
        assert!(a[0]
            .line()
            .contains("Vulkan: not in this build (scripts/build-backends vulkan)"));
    }

    #[test]
    fn a_cuda_module_without_a_driver_or_that_did_not_start_is_told_apart() {
        let nvidia_pci = vec![gpu(Vendor::Nvidia, "NVIDIA GPU (PCI 10de:2335)")];
        let s = seen(&["CPU", "CUDA"], vec![], false, &[]);
        let a = advise(&nvidia_pci, &s);
        assert!(a[0]
            .line()
            .contains("CUDA: loaded, no NVIDIA driver (libcuda) to run it"));
        assert!(a[0]
            .fix
            .as_deref()
            .unwrap()
            .starts_with("install NVIDIA's driver"));
        let mut s = seen(&["CPU", "CUDA"], vec![], true, &[]);
        s.start_failures = vec![("CUDA".into(), "CUDA driver version is insufficient".into())];
        let a = advise(&h200(), &s);
        assert!(
            a[0].line()
                .contains("CUDA: loaded, did not start (CUDA driver version is insufficient)"),
            "{}",
            a[0].line()
        );
        assert_eq!(
            a[0].fix.as_deref(),
            Some("scripts/build-backends cuda (rebuild it for this driver)")
        );
    }

    #[test]
    fn a_gpu_two_backends_drive_is_measured_through_each_and_needs_no_warning() {
        let both = vec![
            dev("CUDA0", "CUDA", "NVIDIA H200"),
            dev("Vulkan0", "Vulkan", "NVIDIA H200"),
        ];
        let s = seen(&["CPU", "CUDA", "Vulkan"], both, true, &["nvidia_icd.json"]);
        let a = advise(&h200(), &s);
        assert_eq!(a[0].warning(), None);
        assert_eq!(
            a[0].line(),
            "NVIDIA H200: CUDA drives it as CUDA0; Vulkan drives it as Vulkan0 (tune measures each)"
        );
        // CUDA alone with NVIDIA's ICD there: the Vulkan module is the command to compare.
        let s = seen(
            &["CPU", "CUDA"],
            vec![dev("CUDA0", "CUDA", "NVIDIA H200")],
            true,
            &["nvidia_icd.json"],
        );
        let a = advise(&h200(), &s);
        assert_eq!(a[0].warning(), None);
        assert!(a[0]
            .line()
            .ends_with("; to compare another backend: scripts/build-backends vulkan"));
        // llvmpipe through Vulkan is no NVIDIA GPU.
        let s = seen(
            &["CPU", "Vulkan"],
            vec![dev("Vulkan0", "Vulkan", "llvmpipe (LLVM 15.0.7, 256 bits)")],
            true,
            &["lvp_icd.x86_64.json"],
        );
        assert!(advise(&h200(), &s)[0].warning().is_some());
    }

    #[test]
    fn an_amd_gpu_wants_the_vulkan_module_or_mesas_driver() {
        let amd = vec![gpu(Vendor::Amd, "AMD GPU (PCI 1002:744c)")];
        let a = advise(&amd, &seen(&["CPU"], vec![], false, &[]));
        assert_eq!(a[0].fix.as_deref(), Some("scripts/build-backends vulkan"));
        assert!(
            a[0].line().contains("ROCm: not in this build"),
            "{}",
            a[0].line()
        );
        let a = advise(
            &amd,
            &seen(&["CPU", "Vulkan"], vec![], false, &["lvp_icd.x86_64.json"]),
        );
        assert!(a[0].fix.as_deref().unwrap().contains("mesa-vulkan-drivers"));
        let radv = vec![dev(
            "Vulkan0",
            "Vulkan",
            "AMD Radeon RX 7900 XTX (RADV NAVI31)",
        )];
        let a = advise(
            &amd,
            &seen(&["CPU", "Vulkan"], radv, false, &["radeon_icd.x86_64.json"]),
        );
        assert_eq!((a[0].warning(), a[0].fix.as_deref()), (None, None));
        assert!(advise(&[], &seen(&["CPU"], vec![], false, &[])).is_empty());
    }

    #[test]
    fn icd_manifests_are_read_from_the_loaders_directories() {
        let root = tempfile::tempdir().unwrap();
        for (dir, f) in [
            ("usr/share/vulkan/icd.d", "nvidia_icd.json"),
            ("etc/vulkan/icd.d", "lvp_icd.x86_64.json"),
            ("etc/vulkan/icd.d", "README"),
        ] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
            std::fs::write(root.path().join(dir).join(f), "{}").unwrap();
        }
        assert_eq!(
            vulkan_icds(root.path()),
            ["lvp_icd.x86_64.json", "nvidia_icd.json"]
        );
    }
}
