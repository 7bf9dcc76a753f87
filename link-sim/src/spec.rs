//! What a link is: a bandwidth, a latency each way and a jitter, by preset name or by figures.

use std::time::Duration;

/// One link: every direction gets the same figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    /// Bytes per second each direction carries.
    pub bandwidth: f64,
    /// One-way delay, added to every chunk after it left the wire.
    pub latency: Duration,
    /// Up to this much more one-way delay per chunk (uniform), order kept.
    pub jitter: Duration,
}

/// Why a link description cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "unknown link '{0}': give a preset (10gbe, 1gbe, wifi) or BANDWIDTH,LATENCY[,JITTER] \
         (e.g. 30MB/s,3ms,1ms)"
    )]
    Unknown(String),
    #[error("bad bandwidth '{0}': a number with B/s, kB/s, MB/s or GB/s (decimal), e.g. 118MB/s")]
    Bandwidth(String),
    #[error("bad duration '{0}': a number with us, ms or s, e.g. 0.2ms")]
    Duration(String),
}

impl LinkSpec {
    /// Links of the kinds hosts are joined by, in their usable TCP throughput and one-way delay:
    /// 10 GbE (1.2 GB/s, 0.05 ms), 1 GbE (118 MB/s, 0.2 ms) and Wi-Fi (30 MB/s, 3 ms, 1 ms jitter).
    pub fn preset(name: &str) -> Option<LinkSpec> {
        let (bandwidth, latency_us, jitter_us) = match name.to_ascii_lowercase().as_str() {
            "10gbe" => (1.2e9, 50, 0),
            "1gbe" => (118e6, 200, 0),
            "wifi" => (30e6, 3000, 1000),
            _ => return None,
        };
        Some(LinkSpec {
            bandwidth,
            latency: Duration::from_micros(latency_us),
            jitter: Duration::from_micros(jitter_us),
        })
    }

    /// A preset name, or `BANDWIDTH,LATENCY[,JITTER]`.
    pub fn parse(s: &str) -> Result<LinkSpec, SpecError> {
        if let Some(p) = Self::preset(s.trim()) {
            return Ok(p);
        }
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(SpecError::Unknown(s.to_string()));
        }
        Ok(LinkSpec {
            bandwidth: parse_bandwidth(parts[0])?,
            latency: parse_duration(parts[1])?,
            jitter: parts
                .get(2)
                .map(|j| parse_duration(j))
                .transpose()?
                .unwrap_or_default(),
        })
    }

    /// `30 MB/s, 3 ms each way (+ up to 1 ms)`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} MB/s, {} ms each way",
            round3(self.bandwidth / 1e6),
            round3(self.latency.as_secs_f64() * 1e3)
        );
        if !self.jitter.is_zero() {
            s += &format!(" (+ up to {} ms)", round3(self.jitter.as_secs_f64() * 1e3));
        }
        s
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `118MB/s`, `1.2GB/s`, `500kB/s`, `1000B/s` (decimal units, as link speeds are given).
pub fn parse_bandwidth(s: &str) -> Result<f64, SpecError> {
    let bad = || SpecError::Bandwidth(s.to_string());
    let t = s.trim().strip_suffix("/s").ok_or_else(bad)?;
    let (num, scale) = [
        ("GB", 1e9),
        ("MB", 1e6),
        ("kB", 1e3),
        ("KB", 1e3),
        ("B", 1.0),
    ]
    .iter()
    .find_map(|(u, k)| t.strip_suffix(u).map(|n| (n, *k)))
    .ok_or_else(bad)?;
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    (v.is_finite() && v > 0.0)
        .then_some(v * scale)
        .ok_or_else(bad)
}

/// `3ms`, `0.05ms`, `200us`, `1s`.
pub fn parse_duration(s: &str) -> Result<Duration, SpecError> {
    let bad = || SpecError::Duration(s.to_string());
    let t = s.trim();
    let (num, scale) = [("us", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .iter()
        .find_map(|(u, k)| t.strip_suffix(u).map(|n| (n, *k)))
        .ok_or_else(bad)?;
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    (v.is_finite() && v >= 0.0)
        .then(|| Duration::from_secs_f64(v * scale))
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_the_three_links_hosts_are_joined_by() {
        let ten = LinkSpec::preset("10GbE").unwrap();
        assert_eq!(ten.bandwidth, 1.2e9);
        assert_eq!(ten.latency, Duration::from_micros(50));
        let wifi = LinkSpec::parse("wifi").unwrap();
        assert_eq!(wifi.bandwidth, 30e6);
        assert_eq!(wifi.latency, Duration::from_millis(3));
        assert_eq!(wifi.jitter, Duration::from_millis(1));
        assert_eq!(
            LinkSpec::parse("1gbe").unwrap().describe(),
            "118 MB/s, 0.2 ms each way"
        );
        assert_eq!(wifi.describe(), "30 MB/s, 3 ms each way (+ up to 1 ms)");
    }

    #[test]
    fn figures_parse_in_decimal_units() {
        let l = LinkSpec::parse("118MB/s, 0.2ms").unwrap();
        assert_eq!(l.bandwidth, 118e6);
        assert_eq!(l.latency, Duration::from_micros(200));
        assert!(l.jitter.is_zero());
        let l = LinkSpec::parse("1.2GB/s,50us,10us").unwrap();
        assert_eq!(
            (l.bandwidth, l.latency, l.jitter),
            (1.2e9, Duration::from_micros(50), Duration::from_micros(10))
        );
        assert_eq!(parse_bandwidth("500kB/s").unwrap(), 5e5);
    }

    #[test]
    fn bad_descriptions_say_what_is_expected() {
        assert!(matches!(
            LinkSpec::parse("ethernet"),
            Err(SpecError::Unknown(_))
        ));
        assert!(matches!(
            LinkSpec::parse("30Mbit,3ms"),
            Err(SpecError::Bandwidth(_))
        ));
        assert!(matches!(
            LinkSpec::parse("0MB/s,3ms"),
            Err(SpecError::Bandwidth(_))
        ));
        assert!(matches!(
            LinkSpec::parse("30MB/s,3"),
            Err(SpecError::Duration(_))
        ));
        assert!(matches!(
            LinkSpec::parse("30MB/s,-1ms"),
            Err(SpecError::Duration(_))
        ));
    }
}
