//! The roofline of a profile's winner as explain shows it (what one generated token reads, the
//! ceiling that sets, the measured speed against it), and the small readings of a profile the
//! findings share (its generation speed, its offload devices, bytes in decimal units).

use profiles::Profile;
use serde::Serialize;

/// Which bytes the roofline compares with the bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RooflineScope {
    /// Everything is read by the CPU: the ceiling bounds the whole token.
    Whole,
    /// Some layers are on offload devices whose bandwidth was measured too: the ceiling is the time
    /// of the CPU's reads plus the devices' reads.
    Split,
    /// Everything is on offload devices whose bandwidth was measured: their reads bound the token.
    Device,
    /// Some layers are on offload devices whose bandwidth was not measured: the ceiling bounds the
    /// CPU's share only.
    CpuShare,
    /// No ceiling: the bandwidth was not measured, or nothing is read by the CPU.
    None,
}

/// The roofline of the winner, compared with its measured generation speed.
#[derive(Debug, Clone, Serialize)]
pub struct RooflineView {
    pub bytes_per_token: u64,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub kv_tokens: u32,
    pub cpu_bytes: u64,
    pub bandwidth_bytes_per_s: Option<f64>,
    pub bandwidth_method: String,
    /// Each non-CPU device's measured bandwidth.
    pub device_bandwidth: Vec<profiles::DeviceBandwidth>,
    /// Generation speed compared with the ceiling: at depth when the workload has a depth.
    pub measured_tps: f64,
    /// Generation speed if every byte a token reads came at its memory's measured bandwidth.
    pub ceiling_tps: Option<f64>,
    pub percent_of_ceiling: Option<f64>,
    pub scope: RooflineScope,
    /// The devices holding the rest (for `split`, `device`, `cpu-share` and a ceiling-less full offload).
    pub offload_devices: Vec<String>,
    /// Sequences decoding together (`--parallel`): each step's weight reads are shared by them.
    pub sequences: u32,
}

impl RooflineView {
    pub fn of(profile: &Profile) -> Option<RooflineView> {
        let r = profile.roofline.as_ref()?;
        let measured = generation_tps(profile);
        let offload_devices: Vec<String> = if r.cpu_bytes < r.bytes_per_token() {
            offload_devices(profile)
        } else {
            Vec::new()
        };
        let device_bytes = r.bytes_per_token().saturating_sub(r.cpu_bytes) as f64;
        let cpu_bytes = r.cpu_bytes as f64;
        let cpu_bw = r.cpu_bandwidth.filter(|b| *b > 0.0);
        // With several devices the fastest one's bandwidth for all their bytes: still an upper bound.
        let device_bw = r
            .device_bandwidth
            .iter()
            .filter(|d| offload_devices.contains(&d.device) && d.bytes_per_s > 0.0)
            .map(|d| d.bytes_per_s)
            .reduce(f64::max);
        let (ceiling, scope) = match (offload_devices.is_empty(), cpu_bw, device_bw) {
            (true, Some(c), _) if r.cpu_bytes > 0 => (Some(c / cpu_bytes), RooflineScope::Whole),
            (false, _, Some(d)) if r.cpu_bytes == 0 => {
                (Some(d / device_bytes), RooflineScope::Device)
            }
            (false, Some(c), Some(d)) => (
                Some(1.0 / (cpu_bytes / c + device_bytes / d)),
                RooflineScope::Split,
            ),
            (false, Some(c), None) if r.cpu_bytes > 0 => {
                (Some(c / cpu_bytes), RooflineScope::CpuShare)
            }
            _ => (None, RooflineScope::None),
        };
        Some(RooflineView {
            bytes_per_token: r.bytes_per_token(),
            weight_bytes: r.weight_bytes,
            kv_bytes: r.kv_bytes,
            kv_tokens: r.kv_tokens,
            cpu_bytes: r.cpu_bytes,
            bandwidth_bytes_per_s: r.cpu_bandwidth,
            bandwidth_method: r.bandwidth_method.clone(),
            device_bandwidth: r.device_bandwidth.clone(),
            measured_tps: measured,
            ceiling_tps: ceiling,
            percent_of_ceiling: ceiling.map(|c| 100.0 * measured / c),
            scope,
            offload_devices,
            sequences: profile.workload.n_parallel.max(1),
        })
    }

    /// The roofline block's lines: (label, text) for bandwidth, bytes per token and the ceiling.
    pub fn lines(&self, depth: bool) -> Vec<(&'static str, String)> {
        let tg = if depth { "tg at depth" } else { "tg" };
        let bandwidth = match self.bandwidth_bytes_per_s {
            Some(b) => format!("{}/s ({})", decimal_bytes(b as u64), self.bandwidth_method),
            None => "not measured".to_string(),
        };
        let shared = match self.sequences {
            0 | 1 => String::new(),
            n => format!(" (its share: {n} sequences read each step's weights once)"),
        };
        let per_token = format!(
            "{} = {} of weights{shared} + {} of KV cache at {} cached tokens (estimate)",
            decimal_bytes(self.bytes_per_token),
            decimal_bytes(self.weight_bytes),
            decimal_bytes(self.kv_bytes),
            self.kv_tokens
        );
        let devices = self.offload_devices.join(", ");
        let device_bytes = self.bytes_per_token.saturating_sub(self.cpu_bytes);
        let ceiling = match (self.scope, self.ceiling_tps, self.percent_of_ceiling, self.bandwidth_bytes_per_s) {
            (RooflineScope::Whole, Some(c), Some(p), Some(b)) => format!(
                "{c:.1} t/s = {}/s ÷ {}; measured {tg} {:.1} t/s is {p:.0}% of it",
                decimal_bytes(b as u64),
                decimal_bytes(self.cpu_bytes),
                self.measured_tps
            ),
            (RooflineScope::Split, Some(c), Some(p), _) => format!(
                "{c:.1} t/s: the CPU reads {} and {devices} {} per token, each at its measured bandwidth; \
                 measured {tg} {:.1} t/s is {p:.0}% of it",
                decimal_bytes(self.cpu_bytes),
                decimal_bytes(device_bytes),
                self.measured_tps
            ),
            (RooflineScope::Device, Some(c), Some(p), _) => format!(
                "{c:.1} t/s: {devices} reads all {} per token at its measured bandwidth; measured {tg} {:.1} t/s \
                 is {p:.0}% of it",
                decimal_bytes(device_bytes),
                self.measured_tps
            ),
            (RooflineScope::CpuShare, Some(c), Some(p), _) => format!(
                "the CPU reads {} of it (the rest is on {devices}, whose bandwidth is not measured here): at most \
                 {c:.1} t/s; measured {tg} {:.1} t/s is {p:.0}% of that",
                decimal_bytes(self.cpu_bytes),
                self.measured_tps
            ),
            _ if self.cpu_bytes == 0 && !devices.is_empty() => {
                format!("not computed: the weights are on {devices}, whose memory bandwidth is not measured here")
            }
            _ => "not computed: the memory bandwidth was not measured".to_string(),
        };
        let mut lines = vec![("bandwidth", bandwidth)];
        for d in &self.device_bandwidth {
            lines.push((
                "device",
                format!(
                    "{}: {}/s ({})",
                    d.device,
                    decimal_bytes(d.bytes_per_s as u64),
                    d.method
                ),
            ));
        }
        lines.extend([("per token", per_token), ("ceiling", ceiling)]);
        lines
    }
}

/// The generation speed a token's roofline is compared with: at depth when the workload has one.
pub fn generation_tps(profile: &Profile) -> f64 {
    let f = &profile.figures;
    if profile.workload.depth > 0 {
        f.tg_depth_tps.unwrap_or(f.tg_tps)
    } else {
        f.tg_tps
    }
}

/// Names of the profile machine's devices other than the CPU.
pub fn offload_devices(profile: &Profile) -> Vec<String> {
    profile
        .machine
        .devices
        .iter()
        .filter(|d| d.takes_layers())
        .map(|d| d.name.clone())
        .collect()
}

/// Decimal bytes as bandwidth figures are written (`12.3 GB`, `185.2 MB`): GB/s and MB per token
/// divide without a 1024 in between.
pub fn decimal_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}
