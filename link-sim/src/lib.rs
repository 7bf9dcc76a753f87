//! A network link between two sockets of one machine: a TCP proxy that delays each direction by a
//! latency (plus optional jitter) and caps its bandwidth, so a test or a bench can give each
//! `autotune rpc-serve` the link a real host would have — 10 GbE, 1 GbE, Wi-Fi — on a kernel without
//! `netem` (`tc qdisc … netem` needs the sch_netem module; this needs nothing).
//!
//! What it models: each direction is a wire that carries one chunk at a time at `bandwidth` bytes
//! per second, and each chunk arrives `latency` (+ up to `jitter`) after it left the wire, in order,
//! as TCP delivers. A bounded queue per direction (1 MiB) stands for the sender's socket buffer: a
//! fast sender blocks, as it would on a real link, rather than finishing an upload early. What it
//! does not: loss, retransmission, or TCP's slow start. Delays are kept with the OS's sleep, about
//! 0.06 ms late on Linux, so links faster than that in latency behave as this machine's loopback.

mod proxy;
mod spec;

pub use proxy::Proxy;
pub use spec::{parse_bandwidth, parse_duration, LinkSpec, SpecError};
