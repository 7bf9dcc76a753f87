//! llama.cpp's own memory breakdown of a context per device (what its fit routine plans with), read
//! through its common library's logger and parsed.

use super::Context;
use llama_cpp_sys_2 as sys;
use serde::{Deserialize, Serialize};
use std::ffi::{c_char, c_void, CString};

// llama.cpp's common library (linked as libllama-common) prints the memory breakdown — the same
// numbers its own fit routine (`--fit`) plans with — through its own logger. These are plain C++
// functions with C-compatible signatures; their mangled names are stable for this vendored build.
#[link(name = "llama-common")]
extern "C" {
    #[link_name = "_Z15common_log_mainv"]
    fn common_log_main() -> *mut c_void;
    #[link_name = "_Z19common_log_set_fileP10common_logPKc"]
    fn common_log_set_file(log: *mut c_void, path: *const c_char);
    #[link_name = "_Z30common_log_set_verbosity_tholdi"]
    fn common_log_set_verbosity_thold(v: i32);
}

/// One row of llama.cpp's memory breakdown, in bytes (MiB granularity).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BreakdownRow {
    /// A device name (`RPC0`, `CUDA0`), `Host`, or a buffer type name.
    pub name: String,
    pub model: u64,
    pub context: u64,
    pub compute: u64,
}

impl BreakdownRow {
    pub fn total(&self) -> u64 {
        self.model + self.context + self.compute
    }
}

/// llama.cpp's own accounting of a context's memory per device (weights, KV/context, compute),
/// valid for dry-run (`no_alloc`) loads too: what its fit routine plans with.
pub fn memory_breakdown(ctx: &Context) -> Vec<BreakdownRow> {
    let path = std::env::temp_dir().join(format!("autotune-breakdown-{}.log", std::process::id()));
    let Some(cpath) = path.to_str().and_then(|p| CString::new(p).ok()) else {
        return Vec::new();
    };
    // SAFETY: the logger is a process-wide singleton; set_file pauses (drains) and resumes its thread.
    unsafe {
        let log = common_log_main();
        common_log_set_verbosity_thold(4); // LOG_LEVEL_TRACE: the breakdown table is a trace message
        common_log_set_file(log, cpath.as_ptr());
        sys::llama_rs_memory_breakdown_print(ctx.ptr.as_ptr());
        common_log_set_file(log, std::ptr::null()); // drains the queue and closes the file
        common_log_set_verbosity_thold(0);
    }
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    parse_breakdown(&text)
}

/// Parses the rows of `common_memory_breakdown_print`:
/// `  - RPC0 (desc) | total = free + (self = model + context + compute) + unaccounted |` and
/// `  - Host | self = model + context + compute |`.
pub fn parse_breakdown(text: &str) -> Vec<BreakdownRow> {
    const MIB: u64 = 1024 * 1024;
    let mut rows = Vec::new();
    for line in text.lines() {
        let Some(dash) = line.find("|   - ").or_else(|| line.find("| - ")) else {
            continue;
        };
        let rest = &line[dash + 1..];
        let mut cells = rest.split('|');
        let (Some(label), Some(values)) = (cells.next(), cells.next()) else {
            continue;
        };
        let name = label.trim().trim_start_matches('-').trim();
        let name = name.split(" (").next().unwrap_or(name).trim().to_string();
        let nums: Vec<u64> = values
            .split(|c: char| !c.is_ascii_digit() && c != '-')
            .filter_map(|t| t.parse::<i64>().ok())
            .map(|v| v.max(0) as u64)
            .collect();
        // device rows: total free self model context compute unaccounted; others: self model context compute
        let (model, context, compute) = match nums.len() {
            7 => (nums[3], nums[4], nums[5]),
            4 => (nums[1], nums[2], nums[3]),
            _ => continue,
        };
        rows.push(BreakdownRow {
            name,
            model: model * MIB,
            context: context * MIB,
            compute: compute * MIB,
        });
    }
    rows
}

/// Bytes per device from a breakdown: host rows (`Host`, CPU buffer types, `AMX`) count for the CPU.
pub fn breakdown_per_device(rows: &[BreakdownRow]) -> Vec<profiles::measurements::DeviceBytes> {
    let mut map: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for r in rows {
        let dev = if super::log::is_host_buffer(&r.name) {
            "CPU".to_string()
        } else {
            r.name.clone()
        };
        *map.entry(dev).or_default() += r.total();
    }
    map.into_iter()
        .map(|(device, bytes)| profiles::measurements::DeviceBytes { device, bytes })
        .collect()
}

/// The buffers a dry run (which maps nothing, as llama.cpp's fit) predicts for a real load that
/// maps the model file: the weights its host buffers hold (the breakdown's `Host` row) as the
/// mapped buffer the real load reports (`CPU_Mapped`), in place of the host's empty model buffers
/// the dry run logged. Repacked weights (`CPU_REPACK`, a copy) keep their own row.
pub fn predicted_mapping(
    buffers: &mut Vec<profiles::measurements::BufferReport>,
    rows: &[BreakdownRow],
) {
    let Some(host) = rows
        .iter()
        .find(|r| r.name == "Host")
        .filter(|r| r.model > 0)
    else {
        return;
    };
    buffers.retain(|b| !(b.what == "model" && b.bytes == 0 && b.buffer == "CPU"));
    buffers.push(profiles::measurements::BufferReport {
        buffer: "CPU_Mapped".into(),
        what: "model".into(),
        bytes: host.model,
    });
}

#[cfg(test)]
mod breakdown_tests {
    use super::*;

    #[test]
    fn parses_the_breakdown_table() {
        let text = "common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |\n\
common_memory_breakdown_print: |   - RPC0 (127.0.0.1:50052) | 24105 = 23000 + (805 = 241 +  36 + 528) + 300 |\n\
common_memory_breakdown_print: |   - Host                   |                   3 =   0 +   0 +   3                |\n";
        let rows = parse_breakdown(text);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].name, "RPC0");
        assert_eq!(rows[0].model, 241 * 1024 * 1024);
        assert_eq!(rows[0].compute, 528 * 1024 * 1024);
        assert_eq!(rows[1].name, "Host");
        assert_eq!(breakdown_per_device(&rows)[0].device, "CPU");
    }

    #[test]
    fn a_dry_run_predicts_the_host_weights_as_the_mapped_buffer() {
        use profiles::measurements::BufferReport;
        let b = |buffer: &str, what: &str, bytes| BufferReport {
            buffer: buffer.into(),
            what: what.into(),
            bytes,
        };
        let mut buffers = vec![
            b("CPU", "model", 0),
            b("CPU_REPACK", "model", 0),
            b("CPU", "compute", 9),
        ];
        let row = |name: &str, model| BreakdownRow {
            name: name.into(),
            model,
            context: 0,
            compute: 0,
        };
        predicted_mapping(&mut buffers, &[row("Host", 300), row("CPU_REPACK", 200)]);
        let report = profiles::measurements::LoadReport {
            buffers: buffers.clone(),
            ..Default::default()
        };
        assert_eq!(report.mapped_bytes(), 300);
        assert!(buffers.iter().any(|x| x.buffer == "CPU_REPACK"));
        // Nothing on the host: nothing predicted.
        let mut none = vec![b("CPU", "model", 0)];
        predicted_mapping(&mut none, &[row("Host", 0)]);
        assert_eq!(none.len(), 1);
    }
}
