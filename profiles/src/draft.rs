//! The draft model a profile's server runs speculative decoding with: which file, how it drafts
//! (llama-server's `--spec-draft-n-max/-n-min/-p-min`), where it lives (`-ngld`, `-devd`, its KV-cache
//! types), and what it measured against the target alone.

use crate::error::{ProfileError, Result};
use search_space::CacheType;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The most tokens a profile may draft per round.
pub const MAX_DRAFT: u32 = 128;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftSettings {
    pub path: PathBuf,
    pub file_name: String,
    /// 64 hex digits identifying the draft file's content.
    pub fingerprint: String,
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_type: Option<String>,
    /// Most tokens drafted per round (`--spec-draft-n-max`).
    pub n_max: u32,
    /// Shorter drafts are dropped (`--spec-draft-n-min`).
    pub n_min: u32,
    /// Drafting stops below this top-token probability (`--spec-draft-p-min`).
    pub p_min: f64,
    /// Draft layers on non-CPU devices (`-ngld`).
    pub n_gpu_layers: u32,
    /// Devices of the draft (`-devd`); empty = the server's default (those of the target).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// The draft's KV-cache types (`-ctkd`, `-ctvd`).
    pub type_k: CacheType,
    pub type_v: CacheType,
    /// Measured on the built-in prompt set: accepted / drafted tokens.
    pub acceptance: f64,
    /// Measured: tokens produced per target decode (accepted draft tokens + the target's own).
    pub tokens_per_round: f64,
    /// Measured: effective generation speed with the draft, and the target alone in the same run.
    pub tg_tps: f64,
    pub baseline_tg_tps: f64,
    /// Memory of the draft (weights, KV cache, compute buffers), as llama.cpp's dry run reports it.
    pub mem_bytes: u64,
}

impl DraftSettings {
    /// p_min as the server's command line writes it.
    pub fn p_min_arg(&self) -> String {
        format!("{:.2}", self.p_min)
    }
}

pub(crate) fn check(d: &DraftSettings, check_paths: bool) -> Result<()> {
    let text = d
        .path
        .to_str()
        .ok_or_else(|| ProfileError::invalid("draft.path", "is not valid UTF-8"))?;
    if text.is_empty() {
        return Err(ProfileError::invalid("draft.path", "is empty"));
    }
    if text.starts_with('-') {
        return Err(ProfileError::invalid(
            "draft.path",
            format!("'{text}' starts with '-' (write it as ./{text})"),
        ));
    }
    if d.fingerprint.len() != 64 || !d.fingerprint.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ProfileError::invalid(
            "draft.fingerprint",
            "must be 64 hex digits",
        ));
    }
    if d.n_max == 0 || d.n_max > MAX_DRAFT {
        return Err(ProfileError::invalid(
            "draft.n_max",
            format!("must be between 1 and {MAX_DRAFT} (found {})", d.n_max),
        ));
    }
    if d.n_min > d.n_max {
        return Err(ProfileError::invalid(
            "draft.n_min",
            format!("({}) must not exceed n_max ({})", d.n_min, d.n_max),
        ));
    }
    if !(0.0..=1.0).contains(&d.p_min) {
        return Err(ProfileError::invalid(
            "draft.p_min",
            format!("must be between 0 and 1 (found {})", d.p_min),
        ));
    }
    if d.n_gpu_layers > crate::MAX_GPU_LAYERS {
        return Err(ProfileError::invalid(
            "draft.n_gpu_layers",
            format!("must be at most {}", crate::MAX_GPU_LAYERS),
        ));
    }
    for (i, name) in d.devices.iter().enumerate() {
        if !crate::is_device_name(name) {
            return Err(ProfileError::invalid(
                format!("draft.devices[{i}]"),
                format!("'{name}' is not a device name"),
            ));
        }
    }
    for (name, v) in [
        ("acceptance", d.acceptance),
        ("tokens_per_round", d.tokens_per_round),
        ("tg_tps", d.tg_tps),
        ("baseline_tg_tps", d.baseline_tg_tps),
    ] {
        if !v.is_finite() {
            return Err(ProfileError::invalid(
                format!("draft.{name}"),
                format!("must be a finite number (found {v})"),
            ));
        }
    }
    if check_paths && !d.path.is_file() {
        return Err(ProfileError::invalid(
            "draft.path",
            format!(
                "{} does not exist or is not a file (moved? re-run `autotune tune --draft` on it)",
                d.path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example_profile;

    pub(crate) fn example_draft() -> DraftSettings {
        DraftSettings {
            path: "/models/Qwen3-0.6B-Q4_0.gguf".into(),
            file_name: "Qwen3-0.6B-Q4_0.gguf".into(),
            fingerprint: "ab".repeat(32),
            size_bytes: 400 << 20,
            file_type: Some("Q4_0".into()),
            n_max: 8,
            n_min: 0,
            p_min: 0.5,
            n_gpu_layers: 0,
            devices: Vec::new(),
            type_k: CacheType::F16,
            type_v: CacheType::F16,
            acceptance: 0.72,
            tokens_per_round: 3.1,
            tg_tps: 31.0,
            baseline_tg_tps: 22.0,
            mem_bytes: 450 << 20,
        }
    }

    #[test]
    fn a_draft_adds_the_servers_speculative_flags() {
        let mut p = example_profile();
        p.draft = Some(example_draft());
        p.refresh_server_args();
        let a = &p.server_args;
        let tail: Vec<&str> = a[a.len() - 16..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "-md",
                "/models/Qwen3-0.6B-Q4_0.gguf",
                "--spec-type",
                "draft-simple",
                "--spec-draft-n-max",
                "8",
                "--spec-draft-n-min",
                "0",
                "--spec-draft-p-min",
                "0.50",
                "-ngld",
                "0",
                "-ctkd",
                "f16",
                "-ctvd",
                "f16"
            ]
        );
        p.validate(false).unwrap();
        // Round trip, and the presets export names the long options.
        let (back, warnings) = crate::Profile::from_toml(&p.to_toml().unwrap()).unwrap();
        assert_eq!(back, p);
        assert!(warnings.is_empty(), "{warnings:?}");
        let presets = crate::export(&p, crate::ExportFormat::Presets).unwrap();
        assert!(
            presets.contains("spec-draft-model = /models/Qwen3-0.6B-Q4_0.gguf"),
            "{presets}"
        );
        assert!(presets.contains("spec-draft-n-max = 8"), "{presets}");
    }

    #[test]
    fn a_hand_edited_draft_is_checked() {
        let mut p = example_profile();
        let mut d = example_draft();
        d.path = "--rpc=evil".into();
        p.draft = Some(d);
        p.refresh_server_args();
        assert!(p
            .validate(false)
            .unwrap_err()
            .to_string()
            .contains("draft.path"));
        let mut d = example_draft();
        d.n_min = 9;
        p.draft = Some(d);
        p.refresh_server_args();
        assert!(p
            .validate(false)
            .unwrap_err()
            .to_string()
            .contains("draft.n_min"));
        let mut d = example_draft();
        d.devices = vec!["-x".into()];
        p.draft = Some(d);
        p.refresh_server_args();
        assert!(p
            .validate(false)
            .unwrap_err()
            .to_string()
            .contains("draft.devices[0]"));
    }

    #[test]
    fn profiles_without_a_draft_read_as_before() {
        let p = example_profile();
        assert!(p.draft.is_none());
        assert!(!p.to_toml().unwrap().contains("[draft]"));
    }
}
