//! Byte sizes as users write them (`512M`, `1.5GiB`, `2000000`) and as reports print them.

/// A size string that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid size '{0}': write a non-negative number with an optional unit, e.g. 512M, 1.5G, 2GiB"
)]
pub struct ParseSizeError(pub String);

/// Parses a byte size. Units are binary (K = KiB = 1024); `B` and a trailing `iB` are optional.
pub fn parse_size(s: &str) -> Result<u64, ParseSizeError> {
    let err = || ParseSizeError(s.to_string());
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(err());
    }
    let value: f64 = num.parse().map_err(|_| err())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let mult: f64 = match unit {
        "" => 1.0,
        "k" => 1024.0,
        "m" => 1024.0 * 1024.0,
        "g" => 1024.0 * 1024.0 * 1024.0,
        "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(err()),
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes with a binary unit, e.g. `241.0 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Two sizes to be told apart (a need against a budget): [`format_size`], or where both would
/// print the same, both in MiB with as many decimals as it takes (up to whole bytes).
pub fn format_size_pair(a: u64, b: u64) -> (String, String) {
    let (fa, fb) = (format_size(a), format_size(b));
    if fa != fb || a == b {
        return (fa, fb);
    }
    let mib = |x: u64, d: usize| format!("{:.*} MiB", d, x as f64 / (1024.0 * 1024.0));
    for d in 1..=6 {
        let (fa, fb) = (mib(a, d), mib(b, d));
        if fa != fb {
            return (fa, fb);
        }
    }
    (format!("{a} B"), format!("{b} B"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("1.5GiB").unwrap(), 1610612736);
        assert_eq!(parse_size("200mb").unwrap(), 200 * 1024 * 1024);
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("12X").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(241 * 1024 * 1024), "241.0 MiB");
    }

    #[test]
    fn a_need_just_over_a_budget_prints_apart() {
        let g = 1 << 30;
        assert_eq!(
            format_size_pair(2 * g, g),
            ("2.0 GiB".into(), "1.0 GiB".into())
        );
        assert_eq!(
            format_size_pair(1200 * (1 << 20) + 300 * 1024, 1200 * (1 << 20)),
            ("1200.3 MiB".into(), "1200.0 MiB".into())
        );
        assert_eq!(
            format_size_pair(g + 1, g),
            ("1024.000001 MiB".into(), "1024.000000 MiB".into())
        );
        assert_eq!(format_size_pair(g, g), ("1.0 GiB".into(), "1.0 GiB".into()));
    }
}
