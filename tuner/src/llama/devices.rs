//! The devices a model is placed on, as llama.cpp itself chooses them when it is given no device
//! list (`llama_model_load_from_file_impl` in src/llama.cpp): RPC servers first, then each GPU once,
//! then integrated GPUs only when there is no discrete GPU. Every budget, tensor split and fit that
//! autotune builds is indexed by this list, so it must be llama.cpp's: one GPU that two modules see
//! (CUDA0 and Vulkan0 on an NVIDIA machine) is one device, and a split's first share goes to the
//! first RPC server whatever order the registry has. The other module's name for such a GPU
//! (`SkippedDevice::same_as`) is how a configuration runs through that backend instead
//! (`--device Vulkan0`): the tuner's backend axis measures both.

use super::cstr;
use super::device::DeviceInfo;
use llama_cpp_sys_2 as sys;
use serde::Serialize;

/// A device ggml registered that llama.cpp does not give a model by default, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SkippedDevice {
    pub device: DeviceInfo,
    pub reason: String,
    /// The listed device that is the same GPU (`CUDA0` for `Vulkan0`), where it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_as: Option<String>,
}

/// A device as ggml's registry lists it, with the identity llama.cpp compares GPUs by.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    pub info: DeviceInfo,
    /// `ggml_backend_dev_props.device_id` (a PCI bus id for CUDA and Vulkan); None when the backend
    /// does not say.
    pub device_id: Option<String>,
}

/// The CPU-side devices (CPU, accelerators) in registry order, then the model's devices in
/// llama.cpp's order; the devices llama.cpp skips are not listed ([`skipped_devices`] says why).
pub fn devices() -> Vec<DeviceInfo> {
    model_view(registered()).0
}

/// [`devices`] and the registered devices llama.cpp does not give a model, each with its reason,
/// from one reading of the registry.
pub fn device_view() -> (Vec<DeviceInfo>, Vec<SkippedDevice>) {
    model_view(registered())
}

/// Free memory per non-CPU device right now (device name → free bytes), a GPU that several
/// backends drive named as `named` (a load's `--device` list) names it where it does: one entry
/// per GPU, so its memory is never counted twice.
pub fn device_free_for(named: &[String]) -> Vec<(String, u64)> {
    let (listed, skipped) = device_view();
    free_of(&listed, &skipped, named)
}

fn free_of(
    listed: &[DeviceInfo],
    skipped: &[SkippedDevice],
    named: &[String],
) -> Vec<(String, u64)> {
    listed
        .iter()
        .filter(|d| d.takes_layers())
        .map(|d| {
            let other = skipped.iter().find(|s| {
                s.same_as.as_deref() == Some(d.name.as_str()) && named.contains(&s.device.name)
            });
            match other {
                Some(s) => (s.device.name.clone(), s.device.memory_free),
                None => (d.name.clone(), d.memory_free),
            }
        })
        .collect()
}

/// Every device in ggml's registry, in its order.
fn registered() -> Vec<Registered> {
    // SAFETY: registry getters; the props' strings are static for the device's lifetime and are
    // copied before the next call.
    unsafe {
        (0..sys::ggml_backend_dev_count())
            .map(|i| {
                let dev = sys::ggml_backend_dev_get(i);
                let mut props: sys::ggml_backend_dev_props = std::mem::zeroed();
                sys::ggml_backend_dev_get_props(dev, &mut props);
                let id = cstr(props.device_id);
                Registered {
                    info: DeviceInfo {
                        name: cstr(props.name),
                        description: cstr(props.description),
                        backend: cstr(sys::ggml_backend_reg_name(
                            sys::ggml_backend_dev_backend_reg(dev),
                        )),
                        kind: kind_name(props.type_).to_string(),
                        memory_free: host_free(props.type_, props.memory_free as u64),
                        memory_total: props.memory_total as u64,
                        host_buffer: !sys::ggml_backend_dev_host_buffer_type(dev).is_null(),
                    },
                    device_id: (!id.is_empty()).then_some(id),
                }
            })
            .collect()
    }
}

/// A device's free memory: llama.cpp's figure, but for the CPU the RAM available now. ggml's CPU
/// device reports all of RAM as free ("ill-defined, assume all of it is free"), so a budget made from
/// it would let a configuration whose host part exceeds what is really free be loaded: its weights
/// then page from disk for every token (the fit cliff of the host), or its KV cache and buffers get
/// the worker, or another process, killed for memory.
fn host_free(t: sys::ggml_backend_dev_type, reported: u64) -> u64 {
    if t != sys::GGML_BACKEND_DEVICE_TYPE_CPU {
        return reported;
    }
    crate::ram::available_now().map_or(reported, |a| a.min(reported))
}

fn kind_name(t: sys::ggml_backend_dev_type) -> &'static str {
    match t {
        sys::GGML_BACKEND_DEVICE_TYPE_CPU => "cpu",
        sys::GGML_BACKEND_DEVICE_TYPE_GPU => "gpu",
        sys::GGML_BACKEND_DEVICE_TYPE_IGPU => "igpu",
        sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => "accel",
        _ => "unknown",
    }
}

/// llama.cpp's default choice over the registry (`devs`, in registry order): the CPU-side devices
/// first, as listed; then RPC servers; then GPUs, a GPU whose device id an earlier GPU has being
/// skipped; then integrated GPUs (the first one's backend only) when there is no discrete GPU.
pub fn model_view(devs: Vec<Registered>) -> (Vec<DeviceInfo>, Vec<SkippedDevice>) {
    let (mut host, mut rpc) = (Vec::new(), Vec::new());
    let (mut gpus, mut igpus): (Vec<Registered>, Vec<Registered>) = (Vec::new(), Vec::new());
    let mut skipped = Vec::new();
    let skip = |d: Registered, reason: String, same_as: Option<String>| SkippedDevice {
        device: d.info,
        reason,
        same_as,
    };
    for d in devs {
        match d.info.kind.as_str() {
            "gpu" if d.info.is_rpc() => rpc.push(d),
            "gpu" => match same_gpu(&gpus, &d) {
                Some(first) => {
                    let reason = format!(
                        "the same GPU as {} (device id {}): llama.cpp gives a model each GPU once; \
                         tune measures both backends (--device {})",
                        first.info.name,
                        d.device_id.as_deref().unwrap_or("?"),
                        d.info.name
                    );
                    let same = Some(first.info.name.clone());
                    skipped.push(skip(d, reason, same));
                }
                None => gpus.push(d),
            },
            "igpu" => match igpus.last() {
                Some(first) if first.info.backend != d.info.backend => {
                    let reason = format!(
                        "an integrated GPU {} already shows through {}",
                        first.info.name, first.info.backend
                    );
                    skipped.push(skip(d, reason, None));
                }
                _ => igpus.push(d),
            },
            _ => host.push(d),
        }
    }
    if !gpus.is_empty() {
        for d in igpus.drain(..) {
            let reason = "an integrated GPU: llama.cpp uses one only when there is no discrete GPU"
                .to_string();
            skipped.push(skip(d, reason, None));
        }
    }
    let listed = [host, rpc, gpus, igpus]
        .into_iter()
        .flatten()
        .map(|d| d.info)
        .collect();
    (listed, skipped)
}

/// The GPU among `gpus` with `d`'s device id (devices without one are never the same).
fn same_gpu<'a>(gpus: &'a [Registered], d: &Registered) -> Option<&'a Registered> {
    let id = d.device_id.as_ref()?;
    gpus.iter().find(|g| g.device_id.as_ref() == Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml says all of RAM is free on the CPU device; autotune's view says what is available now.
    #[test]
    fn the_hosts_free_memory_is_the_ram_available_now_not_all_of_it() {
        let gpu = sys::GGML_BACKEND_DEVICE_TYPE_GPU;
        let cpu = sys::GGML_BACKEND_DEVICE_TYPE_CPU;
        assert_eq!(host_free(gpu, 5 << 30), 5 << 30, "a GPU's own figure");
        assert_eq!(host_free(cpu, 1), 1, "never more than llama.cpp says");
        let available = crate::ram::available_now().expect("the RAM available now");
        let free = host_free(cpu, u64::MAX);
        assert!(
            free.abs_diff(available) < 512 << 20,
            "{free} against MemAvailable {available}"
        );
        let total = crate::machine::Machine::probe(Vec::new()).ram_bytes;
        assert!(free < total, "{free} of {total}: not all of RAM");
        // And the device list llama.cpp gives a model says so for its CPU.
        super::super::init(false);
        let listed = devices()
            .into_iter()
            .find(|d| d.kind == "cpu")
            .expect("a CPU");
        assert!(listed.memory_free < listed.memory_total, "{listed:?}");
    }

    fn dev(name: &str, backend: &str, kind: &str, id: Option<&str>) -> Registered {
        Registered {
            info: DeviceInfo {
                name: name.into(),
                description: format!("{name} description"),
                backend: backend.into(),
                kind: kind.into(),
                memory_free: 1 << 30,
                memory_total: 2 << 30,
                host_buffer: false,
            },
            device_id: id.map(String::from),
        }
    }

    fn names(list: &[DeviceInfo]) -> Vec<&str> {
        list.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn one_gpu_seen_by_cuda_and_vulkan_is_listed_once() {
        let (listed, skipped) = model_view(vec![
            dev("CUDA0", "CUDA", "gpu", Some("0000:01:00.0")),
            dev("Vulkan0", "Vulkan", "gpu", Some("0000:01:00.0")),
            dev("Vulkan1", "Vulkan", "gpu", Some("0000:02:00.0")),
            dev("CPU", "CPU", "cpu", None),
        ]);
        assert_eq!(names(&listed), ["CPU", "CUDA0", "Vulkan1"]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].device.name, "Vulkan0");
        assert!(
            skipped[0].reason.contains("the same GPU as CUDA0"),
            "{}",
            skipped[0].reason
        );
        assert_eq!(skipped[0].same_as.as_deref(), Some("CUDA0"));
    }

    /// One GPU's free memory once, named as the load names it.
    #[test]
    fn a_gpu_seen_by_two_backends_has_its_free_memory_listed_once() {
        let (listed, skipped) = model_view(vec![
            dev("CPU", "CPU", "cpu", None),
            dev("CUDA0", "CUDA", "gpu", Some("0000:01:00.0")),
            dev("Vulkan0", "Vulkan", "gpu", Some("0000:01:00.0")),
        ]);
        let names = |named: &[&str]| -> Vec<String> {
            let named: Vec<String> = named.iter().map(|n| n.to_string()).collect();
            free_of(&listed, &skipped, &named)
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(names(&[]), ["CUDA0"]);
        assert_eq!(names(&["CUDA0"]), ["CUDA0"]);
        assert_eq!(names(&["Vulkan0"]), ["Vulkan0"]);
    }

    #[test]
    fn gpus_without_an_id_are_never_merged() {
        let (listed, skipped) = model_view(vec![
            dev("CUDA0", "CUDA", "gpu", None),
            dev("Vulkan0", "Vulkan", "gpu", None),
        ]);
        assert_eq!(names(&listed), ["CUDA0", "Vulkan0"]);
        assert!(skipped.is_empty());
    }

    #[test]
    fn rpc_servers_come_before_local_gpus_as_llama_cpp_orders_them() {
        // The registry lists RPC devices after the modules' (they are added at run time), but
        // llama.cpp puts them first: a tensor split's first share is RPC0's.
        let (listed, _) = model_view(vec![
            dev("CPU", "CPU", "cpu", None),
            dev("CUDA0", "CUDA", "gpu", Some("0000:01:00.0")),
            dev("RPC0", "RPC", "gpu", Some("127.0.0.1:50052")),
            dev("RPC1", "RPC", "gpu", Some("127.0.0.1:50053")),
        ]);
        assert_eq!(names(&listed), ["CPU", "RPC0", "RPC1", "CUDA0"]);
    }

    #[test]
    fn integrated_gpus_only_without_a_discrete_one() {
        let machine = |with_dgpu: bool| {
            let mut v = vec![
                dev("CPU", "CPU", "cpu", None),
                dev("Vulkan0", "Vulkan", "igpu", Some("0000:00:02.0")),
                dev("SYCL0", "SYCL", "igpu", Some("0000:00:02.0")),
            ];
            if with_dgpu {
                v.push(dev("CUDA0", "CUDA", "gpu", Some("0000:01:00.0")));
            }
            model_view(v)
        };
        let (listed, skipped) = machine(false);
        assert_eq!(names(&listed), ["CPU", "Vulkan0"]);
        assert_eq!(names(&[skipped[0].device.clone()]), ["SYCL0"]);
        let (listed, skipped) = machine(true);
        assert_eq!(names(&listed), ["CPU", "CUDA0"]);
        let gone: Vec<&str> = skipped.iter().map(|s| s.device.name.as_str()).collect();
        assert_eq!(gone, ["SYCL0", "Vulkan0"]);
    }

    #[test]
    fn accelerators_stay_with_the_cpu() {
        let (listed, skipped) = model_view(vec![
            dev("BLAS", "BLAS", "accel", None),
            dev("CPU", "CPU", "cpu", None),
        ]);
        assert_eq!(names(&listed), ["BLAS", "CPU"]);
        assert!(skipped.is_empty());
    }
}
