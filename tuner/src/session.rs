//! What every command that touches a model needs before it starts: the model header checked, the
//! cache directory, the memory budget of each device, the default thread count, the profile store
//! and its lock.

use crate::exit::{self, Exit};
use crate::machine::Machine;
use anyhow::Context as _;
use profiles::{Budgets, Store, StoreLock};
use search_space::gguf::GgufInfo;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Inspects the model header safely before llama.cpp sees the file (exit 3 when it is no usable GGUF).
pub fn inspect_model(path: &Path) -> anyhow::Result<GgufInfo> {
    GgufInfo::inspect(path).map_err(|e| Exit::new(exit::BAD_MODEL, e.to_string()))
}

/// autotune's cache directory (measurement logs, demo model, built tools).
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AUTOTUNE_CACHE_DIR") {
        return d.into();
    }
    directories::ProjectDirs::from("", "", "autotune")
        .map(|p| p.cache_dir().to_path_buf())
        .unwrap_or_else(|| std::env::temp_dir().join("autotune-cache"))
}

pub use profiles::DeviceBudget;

/// Memory budget per device (device name → bytes): the `--mem-budget` given for it, else its free
/// memory minus `margin`. A GPU several backends drive has one budget, which names it through each
/// (given by either name). A budget naming a device this machine does not have is a usage error.
pub fn budgets_of(
    explicit: &[DeviceBudget],
    margin: u64,
    machine: &Machine,
) -> anyhow::Result<Budgets> {
    let others = |listed: &str| -> Vec<String> {
        (machine.other_backends.iter())
            .filter(|o| o.same_as == listed)
            .map(|o| o.device.name.clone())
            .collect()
    };
    let known = |name: &str| {
        machine.devices.iter().any(|d| d.name == name)
            || machine.other_backends.iter().any(|o| o.device.name == name)
    };
    if let Some(b) = explicit.iter().find(|b| !known(&b.device)) {
        let names: Vec<&str> = (machine.devices.iter().map(|d| d.name.as_str()))
            .chain(
                machine
                    .other_backends
                    .iter()
                    .map(|o| o.device.name.as_str()),
            )
            .collect();
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "--mem-budget: unknown device '{}' (devices: {}; `autotune doctor` says which others llama.cpp skips, and why)",
                b.device,
                names.join(", ")
            ),
        ));
    }
    Ok(Budgets(
        (machine.devices.iter())
            .map(|d| {
                let same_gpu = others(&d.name);
                let given =
                    (explicit.iter()).find(|b| b.device == d.name || same_gpu.contains(&b.device));
                DeviceBudget {
                    device: d.name.clone(),
                    bytes: given.map_or(d.memory_free.saturating_sub(margin), |b| b.bytes),
                    given: given.is_some(),
                    same_gpu,
                }
            })
            .collect(),
    ))
}

/// llama.cpp's default thread count on this machine ([`Machine::llama_default_threads`]).
pub fn default_threads() -> u32 {
    Machine::probe(Vec::new()).llama_default_threads()
}

/// The profile store (`$AUTOTUNE_PROFILE_DIR` or the per-user data folder).
pub fn open_store() -> anyhow::Result<Store> {
    Store::open(Store::default_dir()?).context("cannot open the profile store")
}

/// Takes the store's lock, waiting (and saying so) while another run holds it; polled rather than
/// blocking, so Ctrl-C still works while waiting.
pub fn lock_store(store: &Store, stop: &AtomicBool) -> anyhow::Result<StoreLock> {
    if let Some(g) = store.try_lock()? {
        return Ok(g);
    }
    eprintln!("autotune: another autotune run holds the store lock; waiting for it to finish");
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(Exit::new(
                exit::INTERRUPTED,
                "interrupted while waiting for the store lock; nothing was measured",
            ));
        }
        if let Some(g) = store.try_lock()? {
            return Ok(g);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_free_memory_minus_the_margin_unless_given() {
        let m = Machine::probe(vec![crate::llama::DeviceInfo {
            name: "CPU".into(),
            description: "test".into(),
            backend: "CPU".into(),
            kind: "cpu".into(),
            memory_free: 8 << 30,
            memory_total: 16 << 30,
            host_buffer: false,
        }]);
        let cpu = m.devices[0].clone();
        let margin = 1 << 20;
        let b = budgets_of(&[], margin, &m).unwrap();
        assert_eq!(
            b.of(&cpu.name),
            Some(cpu.memory_free.saturating_sub(margin))
        );
        assert!(b.given().is_empty());
        let given: DeviceBudget = format!("{}=42", cpu.name).parse().unwrap();
        let b = budgets_of(&[given], margin, &m).unwrap();
        assert_eq!((b.of(&cpu.name), b.given().len()), (Some(42), 1));
        let unknown: DeviceBudget = "NOPE9=1".parse().unwrap();
        assert!(budgets_of(&[unknown], margin, &m).is_err());
    }

    #[test]
    fn a_gpu_two_backends_drive_has_one_budget_given_by_either_name() {
        let dev = |name: &str, backend: &str| crate::llama::DeviceInfo {
            name: name.into(),
            description: "GPU".into(),
            backend: backend.into(),
            kind: "gpu".into(),
            memory_free: 10 << 30,
            memory_total: 12 << 30,
            host_buffer: true,
        };
        let skipped = [crate::llama::SkippedDevice {
            device: dev("Vulkan0", "Vulkan"),
            reason: "the same GPU".into(),
            same_as: Some("CUDA0".into()),
        }];
        let m = Machine::probe(vec![dev("CUDA0", "CUDA")]).with_other_backends(&skipped);
        assert_eq!(m.gpu_backends(), ["CUDA", "Vulkan"]);
        let b = budgets_of(&[], 0, &m).unwrap();
        assert_eq!(b.offload().count(), 1, "one GPU, one budget");
        assert_eq!(
            (b.of("CUDA0"), b.of("Vulkan0")),
            (Some(10 << 30), Some(10 << 30))
        );
        let given: DeviceBudget = "Vulkan0=4G".parse().unwrap();
        let b = budgets_of(&[given], 0, &m).unwrap();
        assert_eq!((b.of("CUDA0"), b.given().len()), (Some(4 << 30), 1));
        assert!(budgets_of(&["Vulkan1=1G".parse().unwrap()], 0, &m).is_err());
    }
}
