//! `--rpc` endpoints as ggml's RPC client takes them: `HOST:PORT`, where HOST is an IPv4 address or a
//! name that resolves to one (ggml splits at the first `:` and resolves with `gethostbyname`, so an
//! IPv6 address would reach it as a host named `[` or `fe80` and abort the process).

use std::net::{Ipv4Addr, SocketAddrV4, ToSocketAddrs};

/// Why an endpoint (or a list of them) cannot be used; each message names the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("'{0}' is not HOST:PORT (e.g. 192.168.1.20:50052)")]
    NotHostPort(String),
    #[error(
        "'{0}': only IPv4 addresses and host names are supported (ggml's RPC client speaks IPv4); \
         give the server's IPv4 address"
    )]
    NotIpv4(String),
    #[error("'{endpoint}': the port must be a number from 1 to 65535, not '{port}'")]
    BadPort { endpoint: String, port: String },
    #[error("'{0}': a host name has only letters, digits, '-' and '.'")]
    BadName(String),
    #[error("{first} and {second} are the same server: give each host once")]
    Duplicate { first: String, second: String },
    #[error("'{0}' does not resolve to an IPv4 address")]
    NoIpv4Address(String),
}

/// A syntactically valid endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// The IPv4 address it names: a literal as is, `localhost` as loopback, else the name resolved
    /// (IPv4 answers only, as ggml's `gethostbyname` would get).
    pub fn resolve(&self) -> Result<SocketAddrV4, EndpointError> {
        if let Some(ip) = literal(&self.host) {
            return Ok(SocketAddrV4::new(ip, self.port));
        }
        let text = format!("{}:{}", self.host, self.port);
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| {
                it.find_map(|a| match a {
                    std::net::SocketAddr::V4(v4) => Some(v4),
                    std::net::SocketAddr::V6(_) => None,
                })
            })
            .ok_or(EndpointError::NoIpv4Address(text))
    }
}

fn literal(host: &str) -> Option<Ipv4Addr> {
    if host.eq_ignore_ascii_case("localhost") {
        return Some(Ipv4Addr::LOCALHOST);
    }
    host.parse().ok()
}

/// Parses `HOST:PORT` without resolving anything.
pub fn parse_endpoint(s: &str) -> Result<Endpoint, EndpointError> {
    let s = s.trim();
    // Two colons or a bracket can only be IPv6 (`[::1]:50052`, `fe80::1:50052`).
    if s.starts_with('[') || s.matches(':').count() > 1 {
        return Err(EndpointError::NotIpv4(s.to_string()));
    }
    let Some((host, port)) = s.split_once(':') else {
        return Err(EndpointError::NotHostPort(s.to_string()));
    };
    if host.is_empty() {
        return Err(EndpointError::NotHostPort(s.to_string()));
    }
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => {
            return Err(EndpointError::BadPort {
                endpoint: s.to_string(),
                port: port.to_string(),
            })
        }
    };
    let name_chars = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    if !host.chars().all(name_chars) {
        return Err(EndpointError::BadName(s.to_string()));
    }
    Ok(Endpoint {
        host: host.to_string(),
        port,
    })
}

/// Every endpoint of a list valid, and none given twice (the same address and port, written alike
/// or not: `localhost:50052` is `127.0.0.1:50052`). Names are compared as written.
pub fn validate_list(list: &[String]) -> Result<Vec<Endpoint>, EndpointError> {
    let parsed = list
        .iter()
        .map(|s| parse_endpoint(s))
        .collect::<Result<Vec<_>, _>>()?;
    let key = |e: &Endpoint| match literal(&e.host) {
        Some(ip) => format!("{ip}:{}", e.port),
        None => format!("{}:{}", e.host.to_ascii_lowercase(), e.port),
    };
    for (i, a) in parsed.iter().enumerate() {
        if let Some(j) = (0..i).find(|&j| key(&parsed[j]) == key(a)) {
            return Err(EndpointError::Duplicate {
                first: list[j].trim().to_string(),
                second: list[i].trim().to_string(),
            });
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ipv4_addresses_and_names_are_endpoints() {
        let e = parse_endpoint("192.168.1.20:50052").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("192.168.1.20", 50052));
        assert_eq!(
            e.resolve().unwrap(),
            "192.168.1.20:50052".parse::<SocketAddrV4>().unwrap()
        );
        assert_eq!(parse_endpoint("gpu-box.lan:1").unwrap().host, "gpu-box.lan");
        assert_eq!(
            parse_endpoint("localhost:50052")
                .unwrap()
                .resolve()
                .unwrap(),
            "127.0.0.1:50052".parse::<SocketAddrV4>().unwrap()
        );
    }

    #[test]
    fn ipv6_is_refused_by_name_before_ggml_could_abort_on_it() {
        for s in ["[::1]:50052", "::1:50052", "fe80::1:50052"] {
            assert_eq!(
                parse_endpoint(s),
                Err(EndpointError::NotIpv4(s.into())),
                "{s}"
            );
        }
    }

    #[test]
    fn malformed_endpoints_say_what_is_wrong() {
        assert!(matches!(
            parse_endpoint("127.0.0.1"),
            Err(EndpointError::NotHostPort(_))
        ));
        assert!(matches!(
            parse_endpoint(":50052"),
            Err(EndpointError::NotHostPort(_))
        ));
        for bad in ["127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:port"] {
            assert!(
                matches!(parse_endpoint(bad), Err(EndpointError::BadPort { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_endpoint("a b:1"),
            Err(EndpointError::BadName(_))
        ));
        let msg = parse_endpoint("127.0.0.1:x").unwrap_err().to_string();
        assert!(msg.contains("127.0.0.1:x") && !msg.contains('\n'), "{msg}");
    }

    #[test]
    fn the_same_server_twice_is_refused_whatever_its_spelling() {
        let e = validate_list(&list(&["127.0.0.1:50052", "localhost:50052"])).unwrap_err();
        assert_eq!(
            e,
            EndpointError::Duplicate {
                first: "127.0.0.1:50052".into(),
                second: "localhost:50052".into()
            }
        );
        assert!(validate_list(&list(&["hostA:1", "HOSTA:1"])).is_err());
        assert_eq!(
            validate_list(&list(&["127.0.0.1:50052", "127.0.0.1:50053"]))
                .unwrap()
                .len(),
            2
        );
        assert!(validate_list(&[]).unwrap().is_empty());
    }
}
