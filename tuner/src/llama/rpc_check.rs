//! A ggml RPC server asked, in bounded time, whether it answers: connect, the protocol's HELLO (its
//! version) and DEVICE_COUNT, then close, so the server goes back to accepting its next client.
//!
//! Spoken here in Rust, with a deadline on every read, because ggml's client has none: asked first,
//! a server that refuses, is frozen (SIGSTOP: the kernel still accepts the connection, nobody reads
//! it), is no RPC server or speaks another protocol version is an error naming it within seconds,
//! never a process blocked for ever or aborted by ggml.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

/// `RPC_CMD_HELLO` and `RPC_CMD_DEVICE_COUNT` in ggml-rpc.cpp (HELLO is pinned to 14 there).
const CMD_HELLO: u8 = 14;
const CMD_DEVICE_COUNT: u8 = 15;
/// `RPC_CONN_CAPS_SIZE`: the transport capabilities a HELLO carries (all zero: plain TCP).
const CAPS: usize = 24;
/// `RPC_PROTO_MAJOR_VERSION` of the ggml this binary links: a server of another major version
/// cannot serve it.
pub const PROTOCOL_MAJOR: u8 = 7;

/// How long a check may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// To establish the TCP connection (a host that is off or filtered never answers the SYN).
    pub connect: Duration,
    /// For the server's answers once connected.
    pub answer: Duration,
}

impl Default for Timeouts {
    /// 3 s to connect and 5 s to answer: a ggml RPC server answers HELLO in microseconds on a LAN
    /// and milliseconds over Wi-Fi, and these are on the path of every run with `--rpc`.
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(3),
            answer: Duration::from_secs(5),
        }
    }
}

/// Why a server cannot be used; each message names it and says what to look at.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(
        "cannot connect to the RPC server at {endpoint}: {why} (is `autotune rpc-serve` running there?)"
    )]
    Unreachable { endpoint: String, why: String },
    #[error(
        "the RPC server at {endpoint} accepted the connection but did not answer within {seconds} s: \
         it is stopped or frozen, or serving another client (a ggml RPC server serves one at a time)"
    )]
    Silent { endpoint: String, seconds: u64 },
    #[error("{endpoint} closed the connection without answering: is it a ggml RPC server?")]
    Closed { endpoint: String },
    #[error("{endpoint} answered, but not as a ggml RPC server does ({what})")]
    NotRpc { endpoint: String, what: String },
    #[error(
        "the RPC server at {endpoint} speaks protocol {major}.{minor}.{patch}; this autotune needs \
         {PROTOCOL_MAJOR}.x: run the same llama.cpp build on both (`autotune rpc-serve` of this version)"
    )]
    Version {
        endpoint: String,
        major: u8,
        minor: u8,
        patch: u8,
    },
    #[error("the RPC server at {endpoint} has no device to serve")]
    NoDevices { endpoint: String },
}

impl HostError {
    /// What is wrong, without the endpoint (for messages that name it already).
    pub fn problem(&self) -> String {
        match self {
            HostError::Unreachable { why, .. } => format!("down ({why})"),
            HostError::Silent { seconds, .. } => format!(
                "accepts connections but did not answer within {seconds} s (stopped or frozen?)"
            ),
            HostError::Closed { .. } => "closes connections without answering".into(),
            HostError::NotRpc { what, .. } => {
                format!("no longer answers as an RPC server ({what})")
            }
            HostError::Version { major, .. } => format!("speaks protocol {major}.x now"),
            HostError::NoDevices { .. } => "serves no device".into(),
        }
    }
}

/// Connects to `endpoint` (at `addr`), checks that it answers as a ggml RPC server of this protocol
/// version, and returns how many devices it serves. Takes at most `t.connect + t.answer`.
pub fn check(endpoint: &str, addr: SocketAddrV4, t: Timeouts) -> Result<u32, HostError> {
    let unreachable = |e: std::io::Error| HostError::Unreachable {
        endpoint: endpoint.to_string(),
        why: match e.kind() {
            ErrorKind::TimedOut | ErrorKind::WouldBlock => {
                format!("no answer within {} s", t.connect.as_secs())
            }
            _ => e.to_string(),
        },
    };
    let mut s =
        TcpStream::connect_timeout(&SocketAddr::V4(addr), t.connect).map_err(unreachable)?;
    let _ = s.set_nodelay(true);
    let mut conn = Conn {
        s: &mut s,
        endpoint,
        deadline: Instant::now() + t.answer,
        answer: t.answer,
    };
    let mut hello = vec![CMD_HELLO];
    hello.extend_from_slice(&(CAPS as u64).to_le_bytes());
    hello.extend_from_slice(&[0u8; CAPS]);
    conn.send(&hello)?;
    let rsp = conn.message(4 + CAPS)?;
    if rsp[0] != PROTOCOL_MAJOR {
        return Err(HostError::Version {
            endpoint: endpoint.to_string(),
            major: rsp[0],
            minor: rsp[1],
            patch: rsp[2],
        });
    }
    let mut count = vec![CMD_DEVICE_COUNT];
    count.extend_from_slice(&0u64.to_le_bytes());
    conn.send(&count)?;
    let n = conn.message(4)?;
    let devices = u32::from_le_bytes([n[0], n[1], n[2], n[3]]);
    if devices == 0 {
        return Err(HostError::NoDevices {
            endpoint: endpoint.to_string(),
        });
    }
    Ok(devices)
}

/// One checking connection, every read and write within the same deadline.
struct Conn<'a> {
    s: &'a mut TcpStream,
    endpoint: &'a str,
    deadline: Instant,
    answer: Duration,
}

impl Conn<'_> {
    fn left(&self) -> Result<Duration, HostError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.silent());
        }
        Ok(left)
    }

    fn silent(&self) -> HostError {
        HostError::Silent {
            endpoint: self.endpoint.to_string(),
            seconds: self.answer.as_secs(),
        }
    }

    fn io(&self, e: std::io::Error) -> HostError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => self.silent(),
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => HostError::Closed {
                endpoint: self.endpoint.to_string(),
            },
            _ => HostError::Unreachable {
                endpoint: self.endpoint.to_string(),
                why: e.to_string(),
            },
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        let left = self.left()?;
        let _ = self.s.set_write_timeout(Some(left));
        self.s.write_all(bytes).map_err(|e| self.io(e))
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), HostError> {
        let mut got = 0;
        while got < buf.len() {
            let left = self.left()?;
            let _ = self.s.set_read_timeout(Some(left));
            match self.s.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(HostError::Closed {
                        endpoint: self.endpoint.to_string(),
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        Ok(())
    }

    /// A response: its 8-byte size, which must be `size`, then that many bytes.
    fn message(&mut self, size: usize) -> Result<Vec<u8>, HostError> {
        let mut head = [0u8; 8];
        self.read_exact(&mut head)?;
        let said = u64::from_le_bytes(head);
        if said != size as u64 {
            return Err(HostError::NotRpc {
                endpoint: self.endpoint.to_string(),
                what: format!("a {said}-byte answer where {size} bytes were due"),
            });
        }
        let mut body = vec![0u8; size];
        self.read_exact(&mut body)?;
        Ok(body)
    }
}

/// The first of `endpoints` that is down or does not answer its check, with the problem in words
/// (not naming it: the caller does). Asked right after a trial over RPC failed, to tell a host that
/// went away or froze from a configuration that crashed.
pub fn first_problem(endpoints: &[String]) -> Option<(String, String)> {
    endpoints.iter().find_map(|e| {
        let addr = match super::rpc_endpoint::parse_endpoint(e).and_then(|p| p.resolve()) {
            Ok(a) => a,
            Err(err) => return Some((e.clone(), err.to_string())),
        };
        check(e, addr, Timeouts::default())
            .err()
            .map(|err| (e.clone(), err.problem()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn quick() -> Timeouts {
        Timeouts {
            connect: Duration::from_millis(500),
            answer: Duration::from_millis(400),
        }
    }

    /// A listener on a free loopback port, and its address.
    fn listener() -> (TcpListener, SocketAddrV4) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(a) = l.local_addr().unwrap() else {
            unreachable!()
        };
        (l, a)
    }

    /// A server that reads each command and answers it as `answer` says.
    fn serve(l: TcpListener, answer: impl Fn(u8) -> Vec<u8> + Send + 'static) {
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            loop {
                let mut cmd = [0u8; 9];
                if s.read_exact(&mut cmd).is_err() {
                    return;
                }
                let n = u64::from_le_bytes(cmd[1..9].try_into().unwrap()) as usize;
                let mut body = vec![0u8; n];
                if s.read_exact(&mut body).is_err() || s.write_all(&answer(cmd[0])).is_err() {
                    return;
                }
            }
        });
    }

    fn msg(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    fn rpc_like(major: u8, devices: u32) -> impl Fn(u8) -> Vec<u8> {
        move |cmd| match cmd {
            CMD_HELLO => msg(&[[major, 0, 0, 0].as_slice(), &[0u8; CAPS]].concat()),
            CMD_DEVICE_COUNT => msg(&devices.to_le_bytes()),
            _ => Vec::new(),
        }
    }

    #[test]
    fn a_server_that_answers_hello_and_device_count_is_usable() {
        let (l, a) = listener();
        serve(l, rpc_like(PROTOCOL_MAJOR, 2));
        assert_eq!(check("x", a, quick()).unwrap(), 2);
    }

    #[test]
    fn a_refused_connection_is_down() {
        let (l, a) = listener();
        drop(l);
        let e = check("127.0.0.1:1", a, quick()).unwrap_err();
        assert!(matches!(e, HostError::Unreachable { .. }), "{e}");
        assert!(e.problem().starts_with("down ("), "{}", e.problem());
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    }

    #[test]
    fn a_server_that_accepts_and_says_nothing_is_silent_within_the_deadline() {
        // Never accepted: the kernel completes the handshake into the backlog, as for a server
        // stopped with SIGSTOP.
        let (_l, a) = listener();
        let t0 = Instant::now();
        let e = check("frozen:1", a, quick()).unwrap_err();
        assert!(matches!(e, HostError::Silent { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(e.to_string().contains("frozen:1"), "{e}");
    }

    #[test]
    fn another_protocol_is_named_not_waited_on() {
        let (l, a) = listener();
        serve(l, |_| b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec());
        let e = check("web:80", a, quick()).unwrap_err();
        assert!(matches!(e, HostError::NotRpc { .. }), "{e}");

        let (l, a) = listener();
        std::thread::spawn(move || drop(l.accept()));
        let e = check("closes:1", a, quick()).unwrap_err();
        assert!(matches!(e, HostError::Closed { .. }), "{e}");
    }

    #[test]
    fn another_major_version_and_no_devices_are_refused() {
        let (l, a) = listener();
        serve(l, rpc_like(PROTOCOL_MAJOR - 1, 1));
        let e = check("old:1", a, quick()).unwrap_err();
        assert!(matches!(e, HostError::Version { major, .. } if major == PROTOCOL_MAJOR - 1));
        let (l, a) = listener();
        serve(l, rpc_like(PROTOCOL_MAJOR, 0));
        assert!(matches!(
            check("empty:1", a, quick()),
            Err(HostError::NoDevices { .. })
        ));
    }
}
