//! The proxy: a listener whose every connection is joined to the upstream address through one
//! [`LinkSpec`] link, each direction by a reader (which times chunks onto the wire) and a writer
//! (which delivers them when they arrive).

use crate::LinkSpec;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Bytes a reader takes off its socket at a time: small enough that a chunk's time on a 30 MB/s
/// wire (0.5 ms) is below Wi-Fi's latency, large enough for 1.2 GB/s with a thread per direction.
const CHUNK: usize = 16 * 1024;
/// Chunks in flight per direction (1 MiB): the sender's socket buffer.
const IN_FLIGHT: usize = 64;
/// A chunk due this soon is written now rather than slept for (a sleep overshoots by about as
/// much), so a fast link keeps its bandwidth.
const SLACK: Duration = Duration::from_micros(100);

/// A running proxy; dropping it stops it and cuts its connections.
pub struct Proxy {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    /// Bytes carried, client to upstream and back.
    carried: Arc<[AtomicU64; 2]>,
}

impl Proxy {
    /// Listens on `listen` (port 0: any free port) and joins each connection to `upstream` through
    /// `link`. A connection whose upstream refuses is closed at once.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        link: LinkSpec,
    ) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let carried = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let (stop, conns, bytes) = (stopping.clone(), open.clone(), carried.clone());
        thread::spawn(move || {
            for (n, client) in listener.incoming().enumerate() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                if let Ok(mut v) = conns.lock() {
                    v.extend(client.try_clone().ok());
                    v.extend(server.try_clone().ok());
                }
                join(client, server, link, n as u64, &bytes);
            }
        });
        Ok(Proxy {
            addr,
            stopping,
            open,
            carried,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bytes carried so far from clients to the upstream, and back.
    pub fn carried(&self) -> (u64, u64) {
        (
            self.carried[0].load(Ordering::Relaxed),
            self.carried[1].load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Ok(v) = self.open.lock() {
            for s in v.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Both directions of one connection.
fn join(
    client: TcpStream,
    server: TcpStream,
    link: LinkSpec,
    seed: u64,
    bytes: &Arc<[AtomicU64; 2]>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let pairs = [
        (client.try_clone(), server.try_clone(), 0usize),
        (server.try_clone(), client.try_clone(), 1usize),
    ];
    for (from, to, dir) in pairs {
        let (Ok(from), Ok(to)) = (from, to) else {
            return;
        };
        let (tx, rx) = sync_channel(IN_FLIGHT);
        let bytes = bytes.clone();
        let jitter = Jitter::new(seed * 2 + dir as u64 + 1);
        thread::spawn(move || read_side(from, tx, link, jitter));
        thread::spawn(move || write_side(to, rx, &bytes[dir]));
    }
}

/// A chunk and when it arrives at the far end; `None` bytes for the end of the stream.
type Timed = (Instant, Option<Vec<u8>>);

/// Reads chunks off `from` and times each onto the wire: it leaves when the wire is free, takes
/// its size over the bandwidth, and arrives the latency (and jitter) later, never before the last.
fn read_side(mut from: TcpStream, tx: SyncSender<Timed>, link: LinkSpec, mut jitter: Jitter) {
    let mut wire_free = Instant::now();
    let mut last = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        let now = Instant::now();
        let arrives = if n == 0 {
            last.max(now + link.latency)
        } else {
            let leaves = wire_free.max(now);
            wire_free = leaves + Duration::from_secs_f64(n as f64 / link.bandwidth);
            (wire_free + link.latency + jitter.upto(link.jitter)).max(last)
        };
        last = arrives;
        let chunk = (n > 0).then(|| buf[..n].to_vec());
        if tx.send((arrives, chunk)).is_err() || n == 0 {
            let _ = from.shutdown(Shutdown::Read);
            return;
        }
    }
}

/// Delivers each chunk to `to` when it arrives; at the end of the stream, closes `to` for writing
/// (a half close, as TCP passes it on).
fn write_side(mut to: TcpStream, rx: Receiver<Timed>, carried: &AtomicU64) {
    for (arrives, chunk) in rx {
        let wait = arrives.saturating_duration_since(Instant::now());
        if wait > SLACK {
            thread::sleep(wait);
        }
        let Some(chunk) = chunk else {
            let _ = to.shutdown(Shutdown::Write);
            return;
        };
        if to.write_all(&chunk).is_err() {
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        carried.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
}

/// Uniform delays from a seeded xorshift: the same link jitters the same way each run.
struct Jitter(u64);

impl Jitter {
    fn new(seed: u64) -> Self {
        Jitter(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn upto(&mut self, max: Duration) -> Duration {
        if max.is_zero() {
            return Duration::ZERO;
        }
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        max.mul_f64((self.0 >> 11) as f64 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port: what it reads it writes back.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let _ = std::io::copy(&mut r, &mut s);
                });
            }
        });
        a
    }

    fn link(bandwidth: f64, latency_ms: f64, jitter_ms: f64) -> LinkSpec {
        LinkSpec {
            bandwidth,
            latency: Duration::from_secs_f64(latency_ms / 1e3),
            jitter: Duration::from_secs_f64(jitter_ms / 1e3),
        }
    }

    fn through(l: LinkSpec) -> (Proxy, TcpStream) {
        let p = Proxy::start("127.0.0.1:0".parse().unwrap(), echo(), l).unwrap();
        let s = TcpStream::connect(p.addr()).unwrap();
        s.set_nodelay(true).unwrap();
        (p, s)
    }

    /// Seconds a `size`-byte message takes to go out and come back.
    fn round_trip(s: &mut TcpStream, size: usize) -> f64 {
        let msg: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let t0 = Instant::now();
        let mut w = s.try_clone().unwrap();
        let out = msg.clone();
        let sender = thread::spawn(move || w.write_all(&out).unwrap());
        let mut back = vec![0u8; size];
        s.read_exact(&mut back).unwrap();
        sender.join().unwrap();
        assert!(back == msg, "the bytes come back as they went");
        t0.elapsed().as_secs_f64()
    }

    #[test]
    fn a_round_trip_takes_the_latency_each_way() {
        let (_p, mut s) = through(link(1e9, 5.0, 0.0));
        // Never faster than the latency there and back; on a busy machine a round trip can be
        // late, so the median is held to the upper bound.
        let mut rtts: Vec<f64> = (0..7).map(|_| round_trip(&mut s, 64)).collect();
        assert!(
            rtts.iter().all(|&t| t >= 0.010),
            "{rtts:?}: 2 x 5 ms each way"
        );
        rtts.sort_by(f64::total_cmp);
        assert!(rtts[3] < 0.016, "{rtts:?}");
    }

    #[test]
    fn a_large_transfer_takes_its_size_over_the_bandwidth() {
        // 4 MB at 20 MB/s: 0.2 s out, overlapped with its way back (the echo streams): 0.2 s + a
        // chunk's time and the latency, not 0.4 s.
        let (p, mut s) = through(link(20e6, 1.0, 0.0));
        let t = round_trip(&mut s, 4_000_000);
        assert!((0.19..0.30).contains(&t), "{t} s");
        // The proxy counts a chunk after its write returns, which can be after the client read it.
        let deadline = Instant::now() + Duration::from_secs(2);
        while p.carried() != (4_000_000, 4_000_000) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(p.carried(), (4_000_000, 4_000_000));
        // Against the same transfer over a 10x faster link.
        let (_p, mut s) = through(link(200e6, 1.0, 0.0));
        let fast = round_trip(&mut s, 4_000_000);
        assert!(fast < t / 2.5, "{fast} s vs {t} s");
    }

    #[test]
    fn jitter_adds_up_to_its_bound_and_keeps_the_order() {
        let (_p, mut s) = through(link(1e9, 2.0, 4.0));
        let mut rtts: Vec<f64> = (0..21).map(|_| round_trip(&mut s, 64)).collect();
        rtts.sort_by(f64::total_cmp);
        // 2 x 2 ms at least; at most 2 x 6 ms, but for a late round trip or two on a busy machine.
        assert!(rtts[0] >= 0.004 && rtts[18] < 0.0125, "{rtts:?}");
        assert!(rtts[15] - rtts[5] > 0.001, "the delays vary: {rtts:?}");
    }

    #[test]
    fn an_end_of_stream_passes_through_and_a_dropped_proxy_cuts_the_link() {
        let (p, mut s) = through(link(1e9, 1.0, 0.0));
        s.write_all(b"bye").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"bye", "the echo saw the end and closed its side");

        let mut s = TcpStream::connect(p.addr()).unwrap();
        s.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one).unwrap();
        drop(p);
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert!(matches!(s.read(&mut one), Ok(0) | Err(_)), "cut");
    }

    #[test]
    fn an_upstream_that_refuses_closes_the_client() {
        let gone = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let p = Proxy::start("127.0.0.1:0".parse().unwrap(), gone, link(1e9, 1.0, 0.0)).unwrap();
        let mut s = TcpStream::connect(p.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut one = [0u8; 1];
        assert!(matches!(s.read(&mut one), Ok(0) | Err(_)));
    }
}
