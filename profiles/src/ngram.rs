//! N-gram speculation a profile's server runs (llama-server's `--spec-type ngram-simple`, no draft
//! model): its lookup and draft lengths (`--spec-ngram-simple-size-n/-size-m`) and what it measured
//! against the target alone on the workload's prompts.

use crate::error::{ProfileError, Result};
use crate::server_args::ServerOption;
use serde::{Deserialize, Serialize};

/// The server's limit for both sizes.
pub const MAX_NGRAM_SIZE: u32 = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NgramSettings {
    /// `ngram-simple` (the one n-gram type autotune measures).
    pub spec_type: String,
    /// Length of the n-gram looked up in the text so far (`--spec-ngram-simple-size-n`).
    pub size_n: u32,
    /// Most tokens drafted after a match (`--spec-ngram-simple-size-m`).
    pub size_m: u32,
    /// Prompt kinds it was measured on (the workload's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// Measured: accepted / drafted tokens.
    pub acceptance: f64,
    /// Measured: tokens produced per target decode.
    pub tokens_per_round: f64,
    /// Measured: effective generation speed with it, and the target alone in the same run.
    pub tg_tps: f64,
    pub baseline_tg_tps: f64,
}

/// `--spec-type ngram-simple --spec-ngram-simple-size-n N --spec-ngram-simple-size-m M`.
pub fn ngram_options(n: &NgramSettings) -> Vec<ServerOption> {
    let opt = |short, long, value: String| ServerOption {
        short,
        long,
        value: Some(value),
    };
    vec![
        opt("--spec-type", "spec-type", n.spec_type.clone()),
        opt(
            "--spec-ngram-simple-size-n",
            "spec-ngram-simple-size-n",
            n.size_n.to_string(),
        ),
        opt(
            "--spec-ngram-simple-size-m",
            "spec-ngram-simple-size-m",
            n.size_m.to_string(),
        ),
    ]
}

pub(crate) fn check(n: &NgramSettings, has_draft: bool) -> Result<()> {
    if n.spec_type != "ngram-simple" {
        return Err(ProfileError::invalid(
            "ngram.spec_type",
            format!("must be ngram-simple (found '{}')", n.spec_type),
        ));
    }
    if has_draft {
        return Err(ProfileError::invalid(
            "ngram",
            "a profile speculates with a draft model or with n-grams, not both (remove [draft] or [ngram])",
        ));
    }
    for (name, v) in [("size_n", n.size_n), ("size_m", n.size_m)] {
        if v == 0 || v > MAX_NGRAM_SIZE {
            return Err(ProfileError::invalid(
                format!("ngram.{name}"),
                format!("must be between 1 and {MAX_NGRAM_SIZE} (found {v})"),
            ));
        }
    }
    if n.size_m < n.size_n {
        return Err(ProfileError::invalid(
            "ngram.size_m",
            format!(
                "({}) below size_n ({}) never drafts: the server drops drafts shorter than the lookup",
                n.size_m, n.size_n
            ),
        ));
    }
    for (name, v) in [
        ("acceptance", n.acceptance),
        ("tokens_per_round", n.tokens_per_round),
        ("tg_tps", n.tg_tps),
        ("baseline_tg_tps", n.baseline_tg_tps),
    ] {
        if !v.is_finite() {
            return Err(ProfileError::invalid(
                format!("ngram.{name}"),
                format!("must be a finite number (found {v})"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::example_profile;

    pub(crate) fn example() -> NgramSettings {
        NgramSettings {
            spec_type: "ngram-simple".into(),
            size_n: 4,
            size_m: 16,
            kinds: vec!["code".into()],
            acceptance: 0.6,
            tokens_per_round: 2.5,
            tg_tps: 40.0,
            baseline_tg_tps: 25.0,
        }
    }

    #[test]
    fn ngram_speculation_adds_the_servers_flags_and_round_trips() {
        let mut p = example_profile();
        p.ngram = Some(example());
        p.refresh_server_args();
        let a = &p.server_args;
        let tail: Vec<&str> = a[a.len() - 6..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "--spec-type",
                "ngram-simple",
                "--spec-ngram-simple-size-n",
                "4",
                "--spec-ngram-simple-size-m",
                "16"
            ]
        );
        p.validate(false).unwrap();
        let (back, warnings) = crate::Profile::from_toml(&p.to_toml().unwrap()).unwrap();
        assert_eq!(back, p);
        assert!(warnings.is_empty(), "{warnings:?}");
        let presets = crate::export(&p, crate::ExportFormat::Presets).unwrap();
        assert!(
            presets.contains("spec-ngram-simple-size-m = 16"),
            "{presets}"
        );
    }

    #[test]
    fn a_hand_edited_ngram_is_checked() {
        let mut p = example_profile();
        let mut n = example();
        n.size_m = 2;
        p.ngram = Some(n);
        p.refresh_server_args();
        let e = p.validate(false).unwrap_err().to_string();
        assert!(e.contains("ngram.size_m"), "{e}");
        let mut n = example();
        n.spec_type = "ngram-mod; rm".into();
        p.ngram = Some(n);
        p.refresh_server_args();
        assert!(p.validate(false).is_err());
    }
}
