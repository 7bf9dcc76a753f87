//! What autotune knows of each ggml backend, in one table: the names it goes by (ggml's registry
//! name, its module's, the one reports print) and what it can run (row and tensor splits, op
//! offload, pinned host memory). Every check that used to ask for a backend by name asks this
//! table; whether a device runs K and V caches of different types, it is asked itself
//! (`tuner/src/tuning/kv_pairs.rs`).

/// One ggml backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// ggml's registry name, which prefixes its devices' names (`CUDA` for `CUDA0`).
    pub name: &'static str,
    /// Its loadable module's name (`ggml-cuda`) less the prefix, as `scripts/build-backends` and
    /// `autotune doctor` name it.
    pub module: &'static str,
    /// How reports write it.
    pub display: &'static str,
    /// `-sm row`: every layer's rows spread over its devices.
    pub row_split: bool,
    /// `-sm tensor`: tensor parallelism over two or more of its devices (this machine's backends
    /// only: an RPC server's is unknown).
    pub tensor_split: bool,
    /// Its devices run a host tensor's operations for large batches (op offload), from
    /// `GGML_OP_OFFLOAD_MIN_BATCH` tokens.
    pub op_offload: bool,
    /// It offers a pinned host buffer for the weights left on the host.
    pub pinned_host: bool,
}

const fn gpu(name: &'static str, module: &'static str, display: &'static str) -> Backend {
    Backend {
        name,
        module,
        display,
        row_split: false,
        tensor_split: true,
        op_offload: true,
        pinned_host: false,
    }
}

/// Every backend autotune knows; [`of`] answers for the others with what is safe to assume.
pub static BACKENDS: [Backend; 9] = [
    Backend {
        op_offload: false,
        tensor_split: false,
        ..gpu("CPU", "cpu", "CPU")
    },
    Backend {
        row_split: true,
        pinned_host: true,
        ..gpu("CUDA", "cuda", "CUDA")
    },
    Backend {
        pinned_host: true,
        ..gpu("Vulkan", "vulkan", "Vulkan")
    },
    gpu("Metal", "metal", "Metal"),
    gpu("SYCL", "sycl", "SYCL"),
    gpu("CANN", "cann", "CANN"),
    gpu("ROCm", "hip", "ROCm"),
    gpu("OpenCL", "opencl", "OpenCL"),
    // A server's own backend is unknown here; it never takes op offload's batches.
    Backend {
        op_offload: false,
        tensor_split: false,
        ..gpu("RPC", "rpc", "RPC")
    },
];

/// The backend named `name` (its registry, module or display name, in any case); an unknown one
/// gets a row of its own name that claims nothing it has not shown.
pub fn of(name: &str) -> Backend {
    let found = BACKENDS.iter().find(|b| {
        [b.name, b.module, b.display]
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
    });
    match found {
        Some(b) => *b,
        None => Backend {
            tensor_split: false,
            op_offload: false,
            ..gpu("?", "?", "?")
        },
    }
}

/// How reports write a backend (`cuda` → `CUDA`); an unknown one in capitals.
pub fn display(name: &str) -> String {
    match BACKENDS.iter().find(|b| {
        [b.name, b.module, b.display]
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
    }) {
        Some(b) => b.display.to_string(),
        None => name.to_ascii_uppercase(),
    }
}

/// The backend of a device, from its name's prefix (`CUDA1` → `CUDA`, `Vulkan12` → `Vulkan`).
pub fn of_device(device: &str) -> &str {
    device.trim_end_matches(|c: char| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_any_form_find_the_row() {
        assert_eq!(of("cuda").name, "CUDA");
        assert_eq!(of("hip").display, "ROCm");
        assert!(of("CUDA").row_split && !of("Vulkan").row_split);
        assert!(!of("RPC").op_offload && of("Vulkan").op_offload);
        assert_eq!(display("vulkan"), "Vulkan");
        assert_eq!(display("zdnn"), "ZDNN");
        assert!(!of("zdnn").op_offload, "an unknown backend claims nothing");
        assert_eq!(of_device("Vulkan12"), "Vulkan");
    }
}
