//! Checks a profile before anything in it reaches llama-server or the file system.
//!
//! A profile is a file in the user's data folder that anyone can edit, so it is treated as input:
//! numbers must be in ranges llama.cpp accepts, names must look like names (a device called `--rpc`
//! would be read by llama-server as a flag), no string may carry a NUL or a line break, and
//! `server_args` must be exactly what the winner stands for, so nothing can be smuggled into the argv.

use crate::error::{ProfileError, Result};
use crate::profile::{Figures, Profile, SCHEMA_VERSION};
use search_space::knob;

pub use search_space::knob::{MAX_BATCH, MAX_GPU_LAYERS, MAX_THREADS};
/// The most context a profile (and `--ctx`) may ask for: a sanity bound, 100 times today's longest
/// trained contexts, and below llama.cpp's 32-bit `n_ctx`.
pub const MAX_CTX: u32 = 1 << 30;
/// llama.cpp's most sequences at once (`LLAMA_MAX_SEQ`): the most `--parallel` slots.
pub const MAX_PARALLEL: u32 = 256;

impl Profile {
    /// Rejects anything a hand-edited profile could abuse. With `check_paths`, the model file must also
    /// exist (leave it off for listing profiles, where a missing model is not an error).
    pub fn validate(&self, check_paths: bool) -> Result<()> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(ProfileError::SchemaVersion {
                path: None,
                found: self.schema_version.into(),
                supported: SCHEMA_VERSION,
            });
        }
        check_strings(self)?;
        check_model(self, check_paths)?;
        check_fingerprint("machine.fingerprint", &self.machine.fingerprint, |c| {
            c.is_ascii_alphanumeric() || c == '_' || c == '-'
        })?;
        in_range("workload.n_ctx", self.workload.n_ctx, 1, MAX_CTX)?;
        in_range(
            "workload.n_parallel",
            self.workload.n_parallel,
            1,
            MAX_PARALLEL,
        )?;
        check_winner(self)?;
        check_rpc(&self.rpc)?;
        check_figures("figures", &self.figures)?;
        if let Some(b) = &self.baseline {
            check_figures("baseline", b)?;
        }
        for (i, t) in self.backends.iter().enumerate() {
            if let Some(f) = &t.figures {
                check_figures(&format!("backends[{i}].figures"), f)?;
            }
        }
        if let Some(d) = &self.draft {
            crate::draft::check(d, check_paths)?;
        }
        if let Some(n) = &self.ngram {
            crate::ngram::check(n, self.draft.is_some())?;
        }
        if let Some(m) = &self.mtp {
            let other = match (&self.draft, &self.ngram) {
                (Some(_), _) => Some("draft"),
                (None, Some(_)) => Some("ngram"),
                (None, None) => None,
            };
            crate::mtp::check(m, other)?;
        }
        check_server_args(&self.expected_server_args(), &self.server_args)?;
        check_server_env(&self.expected_server_env(), &self.server_env)
    }
}

/// No NUL or line break in any string of the profile. Walks the serialized form so that a field added
/// later is covered without anyone remembering to add it here.
fn check_strings(p: &Profile) -> Result<()> {
    let value = serde_json::to_value(p)
        .map_err(|e| ProfileError::invalid("profile", format!("cannot be represented: {e}")))?;
    walk(&value, &mut String::new())
}

fn walk(v: &serde_json::Value, path: &mut String) -> Result<()> {
    use serde_json::Value;
    match v {
        Value::String(s) => {
            if let Some(c) = s.chars().find(|c| matches!(c, '\0' | '\n' | '\r')) {
                let what = match c {
                    '\0' => "a NUL character",
                    '\n' => "a line break",
                    _ => "a carriage return",
                };
                return Err(ProfileError::invalid(
                    path.clone(),
                    format!("contains {what}"),
                ));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(item, path)?;
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                walk(item, path)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_model(p: &Profile, check_paths: bool) -> Result<()> {
    let path = &p.model.path;
    let text = path
        .to_str()
        .ok_or_else(|| ProfileError::invalid("model.path", "is not valid UTF-8"))?;
    if text.is_empty() {
        return Err(ProfileError::invalid("model.path", "is empty"));
    }
    if text.starts_with('-') {
        return Err(ProfileError::invalid(
            "model.path",
            format!("'{text}' starts with '-' (write it as ./{text})"),
        ));
    }
    check_fingerprint("model.fingerprint", &p.model.fingerprint, |c| {
        c.is_ascii_hexdigit()
    })?;
    if p.model.fingerprint.len() != 64 {
        return Err(ProfileError::invalid(
            "model.fingerprint",
            format!(
                "must be 64 hex digits (found {})",
                p.model.fingerprint.len()
            ),
        ));
    }
    if check_paths && !path.is_file() {
        return Err(ProfileError::invalid(
            "model.path",
            format!(
                "{} does not exist or is not a file (moved? re-run `autotune tune` on it)",
                path.display()
            ),
        ));
    }
    Ok(())
}

fn check_fingerprint(field: &str, value: &str, allowed: impl Fn(char) -> bool) -> Result<()> {
    if value.is_empty() {
        return Err(ProfileError::invalid(field, "is empty"));
    }
    if let Some(c) = value.chars().find(|c| !allowed(*c)) {
        return Err(ProfileError::invalid(
            field,
            format!("contains '{c}', which no fingerprint has"),
        ));
    }
    Ok(())
}

fn in_range(field: &str, value: u32, min: u32, max: u32) -> Result<()> {
    if value < min || value > max {
        return Err(ProfileError::invalid(
            field,
            format!("must be between {min} and {max} (found {value})"),
        ));
    }
    Ok(())
}

fn check_winner(p: &Profile) -> Result<()> {
    let c = &p.winner;
    // Every counted knob within its row's bounds (the knob table's, so a knob added there is
    // checked here without a line of its own).
    knob::check_bounds(c).map_err(|e| {
        let found = e.to_string();
        ProfileError::invalid(format!("winner.{}", e.bounds.field), found)
    })?;
    if c.n_ubatch > c.n_batch {
        return Err(ProfileError::invalid(
            "winner.n_ubatch",
            format!("({}) must not exceed n_batch ({})", c.n_ubatch, c.n_batch),
        ));
    }
    for (i, name) in c.devices.iter().enumerate() {
        if !is_device_name(name) {
            return Err(ProfileError::invalid(
                format!("winner.devices[{i}]"),
                format!(
                    "'{name}' is not a device name (expected letters, digits and _ . : [ ] / -, \
                     not starting with '-'; see llama-server --list-devices)"
                ),
            ));
        }
    }
    if c.tensor_split.len() > MAX_DEVICES {
        return Err(ProfileError::invalid(
            "winner.tensor_split",
            format!(
                "has {} shares; llama.cpp takes at most {MAX_DEVICES}",
                c.tensor_split.len()
            ),
        ));
    }
    for (i, &v) in c.tensor_split.iter().enumerate() {
        in_range(&format!("winner.tensor_split[{i}]"), v, 0, 1_000_000)?;
    }
    c.validate()
        .map_err(|e| ProfileError::invalid("winner", format!("is not runnable: {e}")))
}

/// llama.cpp's most devices (LLAMA_MAX_DEVICES).
const MAX_DEVICES: usize = 16;

/// llama.cpp device names: `CPU`, `CUDA0`, `Vulkan1`, `Metal`, `RPC[host:port]`, ...
pub fn is_device_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_.:[]/-".contains(c);
    !name.is_empty() && !name.starts_with('-') && name.chars().all(allowed)
}

fn check_figures(field: &str, f: &Figures) -> Result<()> {
    let mut values = vec![
        ("pp_tps", f.pp_tps),
        ("tg_tps", f.tg_tps),
        ("score_s", f.score_s),
    ];
    values.extend(f.tg_depth_tps.map(|v| ("tg_depth_tps", v)));
    values.extend(f.ttft_ms.map(|v| ("ttft_ms", v)));
    values.extend(f.pp_ci.into_iter().flatten().map(|v| ("pp_ci", v)));
    values.extend(f.tg_ci.into_iter().flatten().map(|v| ("tg_ci", v)));
    match values.into_iter().find(|(_, v)| !v.is_finite()) {
        Some((name, v)) => Err(ProfileError::invalid(
            format!("{field}.{name}"),
            format!("must be a finite number (found {v})"),
        )),
        None => Ok(()),
    }
}

/// `found` must equal `expected`; the error names the first word that differs.
/// RPC servers are `host:port` (a name, an IPv4 address or a bracketed IPv6 one, then a port): nothing
/// that llama-server could read as another flag or another list item.
fn check_rpc(rpc: &[String]) -> Result<()> {
    for (i, e) in rpc.iter().enumerate() {
        let port_ok = e.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        let chars_ok = e
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']'));
        if !port_ok || !chars_ok || e.starts_with('-') {
            return Err(ProfileError::invalid(
                format!("rpc[{i}]"),
                format!("'{e}' is not a host:port address"),
            ));
        }
    }
    Ok(())
}

fn check_server_args(expected: &[String], found: &[String]) -> Result<()> {
    if expected == found {
        return Ok(());
    }
    Err(ProfileError::invalid(
        "server_args",
        format!(
            "do not match the winning configuration: {}; to change the configuration, edit [winner] \
             and delete server_args",
            describe_mismatch(expected, found)
        ),
    ))
}

fn check_server_env(
    expected: &std::collections::BTreeMap<String, String>,
    found: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    if expected == found {
        return Ok(());
    }
    let show = |m: &std::collections::BTreeMap<String, String>| {
        let pairs: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if pairs.is_empty() {
            "none".to_string()
        } else {
            pairs.join(" ")
        }
    };
    Err(ProfileError::invalid(
        "server_env",
        format!(
            "does not match the winning configuration: expected {}, found {}; to change the \
             configuration, edit [winner] and delete [server_env] and server_args",
            show(expected),
            show(found)
        ),
    ))
}

fn describe_mismatch(expected: &[String], found: &[String]) -> String {
    let count = |list: &[String], word: &String| list.iter().filter(|w| *w == word).count();
    let after = |list: &[String], i: usize| match i.checked_sub(1).and_then(|j| list.get(j)) {
        Some(prev) => format!(" (after '{prev}')"),
        None => String::new(),
    };
    if let Some(i) =
        (0..found.len()).find(|&i| count(found, &found[i]) > count(expected, &found[i]))
    {
        return format!("unexpected '{}'{}", found[i], after(found, i));
    }
    if let Some(i) =
        (0..expected.len()).find(|&i| count(expected, &expected[i]) > count(found, &expected[i]))
    {
        return format!("missing '{}'{}", expected[i], after(expected, i));
    }
    let i = expected
        .iter()
        .zip(found)
        .position(|(e, f)| e != f)
        .unwrap_or(0);
    format!(
        "'{}' where '{}' was expected (argument {})",
        found[i],
        expected[i],
        i + 1
    )
}

#[cfg(test)]
mod tests;
