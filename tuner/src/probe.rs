//! What llama.cpp sees on this machine — devices, backends and the module files they came from, the
//! CPU variant it loaded, and its system info line (which SIMD kernels are in use). Every command that
//! loads a model starts with [`probe`]; `autotune doctor` prints it.

use crate::exit::{self, Exit};
use crate::{gpus, llama, machine::Machine};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Probe {
    pub machine: Machine,
    /// Devices ggml registered that llama.cpp does not give a model (one GPU seen by two modules).
    pub skipped_devices: Vec<llama::SkippedDevice>,
    pub backends: Vec<String>,
    pub cpu_variant: Option<String>,
    pub system_info: String,
    pub llama_version: String,
    /// GPUs the operating system shows, whether or not a loaded backend drives them.
    pub gpus: Vec<gpus::Gpu>,
    /// For each vendor's GPUs: the backends that could drive them, their state, the command that
    /// fixes it (`gpus::advice`).
    pub gpu_advice: Vec<gpus::advice::GpuAdvice>,
    /// One line per vendor whose GPUs no device of this build is driven by, and per GPU whose
    /// memory others hold.
    pub gpu_warnings: Vec<String>,
    /// The backend module files found (`libggml-cuda.so`, ...) and what each gave on this machine.
    pub modules: Modules,
}

/// The backend modules of the directory autotune loaded them from.
#[derive(Debug, Serialize)]
pub struct Modules {
    /// None when the build has no loadable modules (a static build).
    pub dir: Option<String>,
    pub modules: Vec<ModuleStatus>,
}

/// One module file and what it gave on this machine.
#[derive(Debug, Serialize, PartialEq)]
pub struct ModuleStatus {
    pub file: String,
    /// The backend ggml registered from it; None when it was not loaded.
    pub backend: Option<String>,
    pub loaded: bool,
    pub devices: usize,
    /// One sentence: loaded with N devices, present but not used (and why), not loaded.
    pub status: String,
}

/// Starts llama.cpp in this process (connecting the RPC servers given) and reads what it sees.
pub fn probe(verbose: bool, rpc: &[String]) -> anyhow::Result<Probe> {
    crate::hosts::validate_list(rpc).map_err(|e| Exit::new(exit::USAGE, format!("--rpc {e}")))?;
    llama::init(verbose);
    let log = llama::startup_log();
    // Each server is checked in seconds before ggml connects to it; ggml's own calls (its device
    // count, each device's memory) have no timeout, so a server frozen right after its check ends
    // the process with an error naming the servers rather than blocking it.
    let guard = (!rpc.is_empty()).then(|| {
        crate::hosts::Guard::start(
            crate::hosts::PROBE_LIMIT,
            exit::RPC_HOST,
            format!(
                "an RPC server ({}) stopped answering while autotune asked about its devices",
                rpc.join(", ")
            ),
        )
    });
    llama::rpc_add_servers(rpc).map_err(|e| Exit::new(exit::RPC_HOST, e.to_string()))?;
    let (dir, found_modules) = llama::backend_modules(log);
    let modules = Modules {
        dir: dir.map(|d| d.display().to_string()),
        modules: module_statuses(&found_modules, log, Drivers::this_machine()),
    };
    let (devices, skipped_devices) = llama::device_view();
    drop(guard);
    let backends = llama::backends();
    let found = gpus::this_machine();
    // A GPU llama.cpp skips on purpose (an integrated one beside a discrete GPU, one GPU seen by two
    // modules) is driven all the same: doctor says why it is not used, not that a driver is missing.
    let registered: Vec<llama::DeviceInfo> = devices
        .iter()
        .cloned()
        .chain(skipped_devices.iter().map(|s| s.device.clone()))
        .collect();
    let seen = gpus::advice::Seen {
        start_failures: (backends.iter())
            .filter_map(|b| Some((b.clone(), start_failure(log, b)?)))
            .collect(),
        backends: backends.clone(),
        devices: registered,
        nvidia_driver: nvidia_driver_present(),
        vulkan_icds: gpus::advice::vulkan_icds(std::path::Path::new("/")),
    };
    let gpu_advice = gpus::advice::advise(&found, &seen);
    let mut gpu_warnings: Vec<String> = gpu_advice.iter().filter_map(|a| a.warning()).collect();
    gpu_warnings.extend(gpus::memory_in_use(&devices, gpus::nvidia_compute_apps));
    Ok(Probe {
        machine: Machine::probe(devices).with_other_backends(&skipped_devices),
        skipped_devices,
        backends,
        gpus: found,
        gpu_advice,
        gpu_warnings,
        modules,
        cpu_variant: llama::cpu_variant(log),
        system_info: llama::system_info(),
        llama_version: llama::build_info().0,
    })
}

/// The drivers a GPU module's missing device is explained by.
#[derive(Debug, Clone, Copy, Default)]
pub struct Drivers {
    /// An NVIDIA driver is installed.
    pub nvidia: bool,
    /// A Vulkan driver that runs on the CPU (Mesa's llvmpipe, SwiftShader) is installed; ggml-vulkan
    /// skips such devices unless GGML_VK_VISIBLE_DEVICES names them.
    pub cpu_vulkan: bool,
}

impl Drivers {
    pub fn this_machine() -> Self {
        Drivers {
            nvidia: nvidia_driver_present(),
            cpu_vulkan: cpu_vulkan_driver_present(),
        }
    }
}

/// Whether an NVIDIA driver is installed: its kernel module's version file, or its user-space
/// library (libcuda, which the CUDA runtime loads; PyPI's toolkit does not have it).
fn nvidia_driver_present() -> bool {
    [
        "/proc/driver/nvidia/version",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/lib/wsl/lib/libcuda.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

/// Whether the Vulkan loader's driver manifests name a CPU driver: Mesa's lavapipe (`lvp_icd.*`)
/// or SwiftShader (`vk_swiftshader_icd.json`).
fn cpu_vulkan_driver_present() -> bool {
    ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("lvp_icd") || name.contains("swiftshader")
        })
}

/// `cuda` for `libggml-cuda.so`, `cpu` for every `libggml-cpu-<variant>.so`.
fn module_kind(file: &str) -> &str {
    let name = file
        .strip_prefix("libggml-")
        .and_then(|f| f.strip_suffix(".so"))
        .unwrap_or(file);
    if name.starts_with("cpu") {
        "cpu"
    } else {
        name
    }
}

fn display_kind(kind: &str) -> String {
    search_space::backend::display(kind)
}

fn devices_text(n: usize) -> String {
    match n {
        1 => "1 device".into(),
        n => format!("{n} devices"),
    }
}

/// What each module gave: loaded with its devices; a GPU module with no device says why (no NVIDIA
/// driver; the reason ggml logged when the backend did not start); a CPU variant ggml did not choose;
/// a file ggml could not open (release builds of ggml say nothing about those).
pub fn module_statuses(
    modules: &[llama::BackendModule],
    log: &[String],
    drivers: Drivers,
) -> Vec<ModuleStatus> {
    let cpu_variants = modules
        .iter()
        .filter(|m| module_kind(&m.file) == "cpu")
        .count();
    modules
        .iter()
        .map(|m| {
            let kind = module_kind(&m.file);
            let file = &m.file;
            let status = match (&m.backend, kind) {
                (Some(b), "cpu") if cpu_variants > 1 => format!(
                    "{b} module loaded ({file}, the best of {cpu_variants} variants for this CPU): {}",
                    devices_text(m.devices)
                ),
                (Some(b), "rpc") if m.devices == 0 => {
                    format!("{b} module loaded ({file}): devices come from --rpc HOST:PORT")
                }
                (Some(b), _) if m.devices > 0 => {
                    format!("{b} module loaded ({file}): {}", devices_text(m.devices))
                }
                (Some(b), "cuda") if !drivers.nvidia => {
                    format!("{b} module present ({file}), no NVIDIA driver: not used")
                }
                (Some(b), "vulkan") if drivers.cpu_vulkan && start_failure(log, b).is_none() => {
                    format!(
                        "{b} module present ({file}), no Vulkan GPU: not used (ggml skips CPU \
                         drivers such as Mesa's llvmpipe; GGML_VK_VISIBLE_DEVICES=0 selects one)"
                    )
                }
                (Some(b), _) => match start_failure(log, b) {
                    Some(why) => format!(
                        "{b} module present ({file}), but {b} did not start ({why}): not used; \
                         a driver older than the module's toolkit? rebuild with scripts/build-backends {kind}"
                    ),
                    None => format!("{b} module present ({file}), no {b} device: not used"),
                },
                (None, "cpu") => format!("{file}: not chosen (ggml loads the best CPU variant only)"),
                (None, _) => format!(
                    "{} module present ({file}) but not loaded: a library it needs is missing, or it \
                     was built from other llama.cpp sources (see `ldd` on it; rebuild with \
                     scripts/build-backends {kind})",
                    display_kind(kind)
                ),
            };
            ModuleStatus {
                file: m.file.clone(),
                backend: m.backend.clone(),
                loaded: m.backend.is_some(),
                devices: m.devices,
                status,
            }
        })
        .collect()
}

/// The reason a backend logged for not starting: ggml-cuda's "ggml_cuda_init: failed to initialize
/// CUDA: <reason>" when the runtime finds no usable driver.
fn start_failure(log: &[String], backend: &str) -> Option<String> {
    let marker = format!("failed to initialize {backend}: ");
    log.iter().find_map(|l| {
        let i = l.find(&marker)?;
        Some(l[i + marker.len()..].trim().to_string())
    })
}

/// The text lines: one per module, the CPU variants ggml did not choose folded into the chosen one.
pub fn module_lines(modules: &[ModuleStatus]) -> Vec<String> {
    modules
        .iter()
        .filter(|m| m.loaded || module_kind(&m.file) != "cpu")
        .map(|m| m.status.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::BackendModule;

    fn module(file: &str, backend: Option<&str>, devices: usize) -> BackendModule {
        BackendModule {
            file: file.into(),
            backend: backend.map(Into::into),
            devices,
        }
    }

    fn lines(modules: &[BackendModule], log: &[&str], driver: bool) -> Vec<String> {
        let log: Vec<String> = log.iter().map(|l| l.to_string()).collect();
        let drivers = Drivers {
            nvidia: driver,
            cpu_vulkan: false,
        };
        module_lines(&module_statuses(modules, &log, drivers))
    }

    #[test]
    fn cuda_module_without_a_driver_says_so_in_one_line() {
        let modules = [
            module("libggml-cpu-haswell.so", Some("CPU"), 1),
            module("libggml-cpu-icelake.so", None, 0),
            module("libggml-cpu-x64.so", None, 0),
            module("libggml-cuda.so", Some("CUDA"), 0),
            module("libggml-rpc.so", Some("RPC"), 0),
        ];
        let log = [
            "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version\n",
        ];
        assert_eq!(
            lines(&modules, &log, false),
            [
                "CPU module loaded (libggml-cpu-haswell.so, the best of 3 variants for this CPU): 1 device",
                "CUDA module present (libggml-cuda.so), no NVIDIA driver: not used",
                "RPC module loaded (libggml-rpc.so): devices come from --rpc HOST:PORT",
            ]
        );
    }

    #[test]
    fn cuda_module_with_a_driver_too_old_gives_the_runtime_reason() {
        let modules = [module("libggml-cuda.so", Some("CUDA"), 0)];
        let log = [
            "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version\n",
        ];
        let l = lines(&modules, &log, true);
        assert_eq!(l.len(), 1);
        assert!(
            l[0].starts_with("CUDA module present (libggml-cuda.so), but CUDA did not start (CUDA driver version is insufficient for CUDA runtime version): not used"),
            "{}",
            l[0]
        );
        assert!(l[0].contains("scripts/build-backends cuda"), "{}", l[0]);
    }

    #[test]
    fn loaded_gpu_and_rpc_devices_are_counted() {
        let modules = [
            module("libggml-cpu-x64.so", Some("CPU"), 1),
            module("libggml-cuda.so", Some("CUDA"), 2),
            module("libggml-rpc.so", Some("RPC"), 1),
        ];
        assert_eq!(
            lines(&modules, &[], true),
            [
                "CPU module loaded (libggml-cpu-x64.so): 1 device",
                "CUDA module loaded (libggml-cuda.so): 2 devices",
                "RPC module loaded (libggml-rpc.so): 1 device",
            ]
        );
    }

    #[test]
    fn a_vulkan_module_with_only_a_cpu_driver_says_how_to_use_it() {
        let modules = [module("libggml-vulkan.so", Some("Vulkan"), 0)];
        let with = |cpu_vulkan| {
            let drivers = Drivers {
                nvidia: false,
                cpu_vulkan,
            };
            module_lines(&module_statuses(&modules, &[], drivers))
        };
        assert_eq!(
            with(true),
            ["Vulkan module present (libggml-vulkan.so), no Vulkan GPU: not used (ggml skips CPU \
              drivers such as Mesa's llvmpipe; GGML_VK_VISIBLE_DEVICES=0 selects one)"]
        );
        assert_eq!(
            with(false),
            ["Vulkan module present (libggml-vulkan.so), no Vulkan device: not used"]
        );
    }

    #[test]
    fn a_module_ggml_could_not_open_is_named_and_cpu_variants_stay_in_the_json() {
        let modules = [
            module("libggml-cpu-haswell.so", Some("CPU"), 1),
            module("libggml-cpu-x64.so", None, 0),
            module("libggml-vulkan.so", None, 0),
        ];
        let all = module_statuses(&modules, &[], Drivers::default());
        assert_eq!(all.len(), 3);
        assert!(!all[1].loaded);
        assert_eq!(
            all[1].status,
            "libggml-cpu-x64.so: not chosen (ggml loads the best CPU variant only)"
        );
        assert!(
            all[2]
                .status
                .starts_with("Vulkan module present (libggml-vulkan.so) but not loaded"),
            "{}",
            all[2].status
        );
        assert_eq!(module_lines(&all).len(), 2);
    }

    #[test]
    fn ggml_load_lines_name_backend_and_file() {
        let log = vec![
            "load_backend: loaded CPU backend from /x/backends/libggml-cpu-haswell.so\n"
                .to_string(),
            "load_backend: loaded CUDA backend from /x/backends/libggml-cuda.so\n".to_string(),
            "something else\n".to_string(),
        ];
        assert_eq!(
            llama::loaded_modules(&log),
            [
                ("CPU".to_string(), "libggml-cpu-haswell.so".to_string()),
                ("CUDA".to_string(), "libggml-cuda.so".to_string()),
            ]
        );
    }
}
