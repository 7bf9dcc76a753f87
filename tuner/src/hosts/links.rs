//! The link to each RPC server of a run, measured once before anything loads (in a worker: ggml's
//! calls abort and block like any), recorded in the profile beside the figures it shaped.

use crate::llama::DeviceInfo;
use crate::worker::{LinkRequest, Request, Response, Worker};
use profiles::HostLink;
use std::time::Duration;

/// Bytes each timed write and read moves: under ggml's 10 MiB hash threshold (a larger write goes
/// as a hash first), and 0.3 s over a 30 MB/s Wi-Fi link.
const LINK_BYTES: u64 = 8 << 20;
const ROUND_TRIPS: u32 = 15;
const PASSES: u32 = 3;
/// A link probe that takes longer has a link too slow to time: 8 MiB at under 1 MB/s.
const LINK_TIMEOUT: Duration = Duration::from_secs(60);

/// The run's RPC devices (llama.cpp's name and the endpoint it describes itself by).
pub fn rpc_devices(devices: &[DeviceInfo]) -> Vec<(String, String)> {
    devices
        .iter()
        .filter(|d| d.is_rpc())
        .map(|d| (d.name.clone(), d.description.clone()))
        .collect()
}

/// Measures the link to each of `devices` (name, endpoint), connecting `rpc` first, one worker for
/// all; a link whose probe fails is left out with a warning. `stop` ends it early.
pub fn measure(
    devices: &[(String, String)],
    rpc: &[String],
    stop: &dyn Fn() -> bool,
) -> Vec<HostLink> {
    let mut out = Vec::new();
    let mut worker: Option<Worker> = None;
    for (device, endpoint) in devices {
        if stop() {
            break;
        }
        let w = match worker.take().map_or_else(Worker::spawn, Ok) {
            Ok(w) => worker.insert(w),
            Err(e) => {
                eprintln!("autotune: warning: the links to the RPC servers not measured: {e}");
                return out;
            }
        };
        let request = Request::Link(LinkRequest {
            device: device.clone(),
            rpc: rpc.to_vec(),
            bytes: LINK_BYTES,
            round_trips: ROUND_TRIPS,
            passes: PASSES,
        });
        match w.call(&request, LINK_TIMEOUT, stop) {
            Ok(Response::Link {
                round_trip_s,
                upload_bytes_per_s,
                download_bytes_per_s,
                ..
            }) => out.push(HostLink {
                endpoint: endpoint.clone(),
                device: device.clone(),
                round_trip_ms: round_trip_s * 1e3,
                upload_bytes_per_s,
                download_bytes_per_s,
                used: false,
            }),
            Ok(Response::Failed { message, .. }) => {
                eprintln!(
                    "autotune: warning: the link to {device} ({endpoint}) not measured: {message}"
                )
            }
            Ok(_) => {
                eprintln!("autotune: warning: the link to {device} not measured: unexpected answer")
            }
            Err(f) => {
                eprintln!("autotune: warning: the link to {device} ({endpoint}) not measured: {f}");
                worker = None;
            }
        }
    }
    if let Some(w) = worker {
        // A ggml RPC server serves one client at a time: let go before the run's workers connect.
        w.quit();
    }
    out
}

/// Whether `c` puts layers on `device`, of the run's offload devices `offload` (llama.cpp's order,
/// which a tensor split follows when `c` names no devices).
pub fn runs_on(c: &search_space::Candidate, offload: &[String], device: &str) -> bool {
    if c.n_gpu_layers == 0 {
        return false;
    }
    let names: &[String] = if c.devices.is_empty() {
        offload
    } else {
        &c.devices
    };
    let Some(k) = names.iter().position(|n| n == device) else {
        return false;
    };
    c.tensor_split.get(k).is_none_or(|&share| share > 0)
}

/// `links` with `used` set where `winner` runs layers on the device.
pub fn marked(
    links: &[HostLink],
    winner: &search_space::Candidate,
    offload: &[String],
) -> Vec<HostLink> {
    links
        .iter()
        .map(|l| HostLink {
            used: runs_on(winner, offload, &l.device),
            ..l.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use search_space::Candidate;

    #[test]
    fn a_host_is_used_where_the_winner_puts_layers_on_its_device() {
        let offload: Vec<String> = ["RPC0", "RPC1"].map(String::from).to_vec();
        let mut c = Candidate::llama_default(2, 0);
        assert!(!runs_on(&c, &offload, "RPC0"), "the host alone");
        c.n_gpu_layers = 19;
        assert!(runs_on(&c, &offload, "RPC0") && runs_on(&c, &offload, "RPC1"));
        c.tensor_split = vec![100, 0];
        assert!(runs_on(&c, &offload, "RPC0") && !runs_on(&c, &offload, "RPC1"));
        c.tensor_split = Vec::new();
        c.devices = vec!["RPC1".into()];
        assert!(!runs_on(&c, &offload, "RPC0") && runs_on(&c, &offload, "RPC1"));
    }
}
