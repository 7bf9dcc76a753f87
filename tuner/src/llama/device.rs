//! One device as llama.cpp lists it: its name, backend, kind and memory (the probe's record,
//! `llama::devices`).

use serde::{Deserialize, Serialize};

/// Devices and backends as llama.cpp sees them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceInfo {
    pub name: String,
    pub description: String,
    pub backend: String,
    /// cpu, gpu, igpu, accel
    pub kind: String,
    pub memory_free: u64,
    pub memory_total: u64,
    /// The device offers pinned host memory (`ggml_backend_dev_host_buffer_type`: CUDA, Vulkan),
    /// which llama.cpp puts host weights in before the CPU's own buffer types ([`HostBuffer`]).
    ///
    /// [`HostBuffer`]: search_space::HostBuffer
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_buffer: bool,
}

impl DeviceInfo {
    /// A device served by a ggml RPC server (`RPC0`, …).
    pub fn is_rpc(&self) -> bool {
        search_space::backend::of(&self.backend).name == "RPC"
    }

    /// A device whose memory is the host's RAM: an integrated GPU its backend reports as one (a
    /// laptop's or a Strix Halo's Vulkan iGPU; ggml-metal reports Apple silicon's as a GPU, so a
    /// Mac's GPU and host are budgeted apart), or a software rasteriser standing in for a GPU (Mesa's
    /// llvmpipe and lavapipe, SwiftShader), which reports the host's memory as its own. Its budget
    /// and the host's are one ([`crate::engine::TuneSettings::host_memory_devices`]).
    pub fn shares_host_memory(&self) -> bool {
        let d = self.description.to_ascii_lowercase();
        self.kind == "igpu"
            || ["llvmpipe", "lavapipe", "swiftshader"]
                .iter()
                .any(|s| d.contains(s))
    }

    /// A device llama.cpp places layers on (a GPU, integrated or not, or an RPC server); CPU and
    /// accelerator devices (BLAS, AMX) only serve the CPU's tensors.
    pub fn takes_layers(&self) -> bool {
        matches!(self.kind.as_str(), "gpu" | "igpu")
    }
}
