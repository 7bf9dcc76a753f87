//! The RPC servers a run measured over, and the link to each as measured then: what a profile's
//! figures depend on beyond this machine.

use serde::{Deserialize, Serialize};

/// One RPC server of a run and its link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostLink {
    /// `host:port`, as `--rpc` gave it.
    pub endpoint: String,
    /// llama.cpp's name for the device it served (`RPC0`, ...).
    pub device: String,
    /// Median round trip of a 4-byte read from the device, milliseconds.
    pub round_trip_ms: f64,
    /// Best rate of an 8 MiB write to the device, and of its read back, bytes per second.
    pub upload_bytes_per_s: f64,
    pub download_bytes_per_s: f64,
    /// Whether the winner runs layers on it (its endpoint is then in `rpc`).
    pub used: bool,
}

impl HostLink {
    /// `1 GbE-like: 112 MB/s up, 0.41 ms round trip`.
    pub fn describe(&self) -> String {
        format!(
            "{:.0} MB/s up, {:.0} MB/s down, {:.2} ms round trip",
            self.upload_bytes_per_s / 1e6,
            self.download_bytes_per_s / 1e6,
            self.round_trip_ms
        )
    }
}
