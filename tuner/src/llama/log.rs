//! What llama.cpp logs: captured into a buffer by its log callback, and parsed for the buffer sizes
//! and backend modules it reports.

use super::device::DeviceInfo;
use llama_cpp_sys_2 as sys;
use profiles::measurements::BufferReport;
use std::ffi::{c_char, c_void, CStr};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
static ECHO_LOG: OnceLock<bool> = OnceLock::new();

/// Echo llama.cpp's log to stderr too (set once, by `init`).
pub(super) fn set_echo(echo: bool) {
    let _ = ECHO_LOG.set(echo);
}

/// llama.cpp's log callback: appends each line to the buffer [`take_log`] empties.
pub(super) extern "C" fn log_callback(
    level: sys::ggml_log_level,
    text: *const c_char,
    _user: *mut c_void,
) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
    let line = unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    if *ECHO_LOG.get().unwrap_or(&false) {
        eprint!("{line}");
    }
    let _ = level;
    if let Ok(mut log) = LOG.lock() {
        // Continuation lines (level CONT) are appended to the previous entry.
        if level == sys::GGML_LOG_LEVEL_CONT {
            if let Some(last) = log.last_mut() {
                last.push_str(&line);
                return;
            }
        }
        log.push(line);
        if log.len() > 20_000 {
            log.drain(..10_000);
        }
    }
}

/// Takes (and clears) what llama.cpp has logged since the last call.
pub fn take_log() -> Vec<String> {
    LOG.lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default()
}

/// The last error-looking lines of a log, for failure reasons.
pub fn log_tail(log: &[String]) -> String {
    let errors: Vec<&str> = log
        .iter()
        .map(|s| s.trim())
        .filter(|s| s.contains("error") || s.contains("failed") || s.contains("ERROR"))
        .collect();
    let lines = if errors.is_empty() {
        log.iter().map(|s| s.trim()).collect::<Vec<_>>()
    } else {
        errors
    };
    lines
        .iter()
        .rev()
        .take(2)
        .rev()
        .cloned()
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Reads the buffer sizes llama.cpp logs while loading a model and creating a context.
pub fn parse_buffer_reports(log: &[String]) -> Vec<BufferReport> {
    let mut out = Vec::new();
    for line in log {
        let Some(idx) = line.find(" buffer size") else {
            continue;
        };
        let Some(eq) = line[idx..].find('=') else {
            continue;
        };
        let head = line[..idx].trim();
        let mut words = head.rsplitn(2, char::is_whitespace);
        let what = words.next().unwrap_or("").to_string();
        let buffer = words
            .next()
            .unwrap_or("")
            .rsplit(|c: char| c.is_whitespace())
            .next()
            .unwrap_or("")
            .to_string();
        let tail = line[idx + eq + 1..].trim();
        let mut parts = tail.split_whitespace();
        let (Some(num), Some(unit)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(v) = num.parse::<f64>() else { continue };
        let mult = match unit {
            "MiB" => 1024.0 * 1024.0,
            "KiB" => 1024.0,
            "GiB" => 1024.0 * 1024.0 * 1024.0,
            "B" => 1.0,
            _ => continue,
        };
        if buffer.is_empty() || what.is_empty() {
            continue;
        }
        out.push(BufferReport {
            buffer,
            what,
            bytes: (v * mult) as u64,
        });
    }
    out
}

/// Which device a llama.cpp buffer lives on: device-named buffers (`CUDA0`, `RPC0[host:port]`) belong
/// to that device; host buffers (`CPU`, `CPU_Mapped`, `CPU_REPACK`, `CUDA_Host`, ...) to the CPU, and
/// so does `AMX`, the CPU backend's buffer type for Intel AMX kernels (repacked weights in host
/// memory, on CPUs with AMX tiles).
pub fn buffer_device(buffer: &str, devices: &[DeviceInfo]) -> String {
    if is_host_buffer(buffer) {
        return "CPU".to_string();
    }
    devices
        .iter()
        .filter(|d| d.kind != "cpu")
        .filter(|d| buffer.starts_with(&d.name) || buffer.contains(&d.description))
        .max_by_key(|d| d.name.len())
        .map(|d| d.name.clone())
        .unwrap_or_else(|| buffer.split('[').next().unwrap_or(buffer).to_string())
}

/// Whether a buffer (type) name, or a memory breakdown's row, is host memory: llama.cpp's `Host`
/// row, the CPU backend's buffer types (`CPU…`, `AMX`) and GPU backends' pinned host buffers
/// (`…_Host`).
pub fn is_host_buffer(name: &str) -> bool {
    name == "Host" || name.starts_with("CPU") || name.ends_with("_Host") || name == "AMX"
}

/// Sums buffer reports per device.
pub fn bytes_per_device(
    buffers: &[BufferReport],
    devices: &[DeviceInfo],
) -> Vec<profiles::measurements::DeviceBytes> {
    let mut map: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for b in buffers {
        *map.entry(buffer_device(&b.buffer, devices)).or_default() += b.bytes;
    }
    map.into_iter()
        .map(|(device, bytes)| profiles::measurements::DeviceBytes { device, bytes })
        .collect()
}

/// `(backend, file name)` of each "load_backend: loaded CUDA backend from /dir/libggml-cuda.so"
/// line ggml logged.
pub fn loaded_modules(log: &[String]) -> Vec<(String, String)> {
    log.iter()
        .filter_map(|l| {
            let rest = &l[l.find("loaded ")? + "loaded ".len()..];
            let (name, path) = rest.split_once(" backend from ")?;
            let file = Path::new(path.trim())
                .file_name()?
                .to_string_lossy()
                .into_owned();
            Some((name.to_string(), file))
        })
        .collect()
}

/// The CPU variant ggml loaded (from the module file name it logged, or from system info).
pub fn cpu_variant(log: &[String]) -> Option<String> {
    log.iter().find_map(|l| {
        let i = l.find("libggml-cpu-")?;
        let rest = &l[i + "libggml-cpu-".len()..];
        Some(rest.split(".so").next()?.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host memory whatever the buffer type's name: the CPU backend's own (the mapped file, its
    /// repacked weights, Intel AMX's) and a GPU backend's pinned host buffers.
    #[test]
    fn host_buffer_types_count_as_the_cpus_memory() {
        for b in [
            "CPU",
            "CPU_Mapped",
            "CPU_REPACK",
            "AMX",
            "CUDA_Host",
            "Vulkan_Host",
        ] {
            assert_eq!(buffer_device(b, &[]), "CPU", "{b}");
        }
        assert_eq!(buffer_device("RPC0[127.0.0.1:50052]", &[]), "RPC0");
    }

    #[test]
    fn parses_llama_buffer_lines() {
        let log = vec![
            "load_tensors:   CPU_Mapped model buffer size =   241.00 MiB\n".to_string(),
            "llama_kv_cache:        CPU KV buffer size =    72.00 MiB\n".to_string(),
            "sched_reserve:        CPU compute buffer size =   258.50 MiB\n".to_string(),
            "load_tensors: RPC0[127.0.0.1:50052] model buffer size =    10.00 MiB\n".to_string(),
            "unrelated line\n".to_string(),
        ];
        let r = parse_buffer_reports(&log);
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].buffer, "CPU_Mapped");
        assert_eq!(r[0].what, "model");
        assert_eq!(r[0].bytes, 241 * 1024 * 1024);
        assert_eq!(r[1].what, "KV");
        assert_eq!(r[3].buffer, "RPC0[127.0.0.1:50052]");
    }
}
