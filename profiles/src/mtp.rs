//! Multi-token prediction a profile's server runs (llama-server's `--spec-type draft-mtp`): the
//! target drafts with its own MTP heads, no second model. The profile keeps the draft length
//! (`--spec-draft-n-max`) and what it measured against the target alone on the workload's prompts.
//!
//! llama-server loads the MTP layers by itself when the type is `draft-mtp`, and gives the MTP
//! context the draft's KV-cache types (`-ctkd`/`-ctvd`, F16 unless set) and the draft's n_min and
//! p_min: autotune measured the head with the target's cache types and greedy drafts (n_min 0,
//! p_min 0), so all four are passed explicitly.

use crate::error::{ProfileError, Result};
use crate::server_args::ServerOption;
use search_space::Candidate;
use serde::{Deserialize, Serialize};

/// llama-server's name for the speculation.
pub const DRAFT_MTP: &str = "draft-mtp";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MtpSettings {
    /// Most tokens the heads draft per round (`--spec-draft-n-max`).
    pub n_max: u32,
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

/// `--spec-type draft-mtp --spec-draft-n-max N --spec-draft-n-min 0 --spec-draft-p-min 0.00
/// -ctkd K -ctvd V`, with the winner's KV-cache types (those the MTP context was measured with).
pub fn mtp_options(m: &MtpSettings, winner: &Candidate) -> Vec<ServerOption> {
    let opt = |short, long, value: String| ServerOption {
        short,
        long,
        value: Some(value),
    };
    vec![
        opt("--spec-type", "spec-type", DRAFT_MTP.into()),
        opt(
            "--spec-draft-n-max",
            "spec-draft-n-max",
            m.n_max.to_string(),
        ),
        opt("--spec-draft-n-min", "spec-draft-n-min", "0".into()),
        opt("--spec-draft-p-min", "spec-draft-p-min", "0.00".into()),
        opt("-ctkd", "spec-draft-type-k", winner.type_k.as_str().into()),
        opt("-ctvd", "spec-draft-type-v", winner.type_v.as_str().into()),
    ]
}

pub(crate) fn check(m: &MtpSettings, other: Option<&str>) -> Result<()> {
    if let Some(other) = other {
        return Err(ProfileError::invalid(
            "mtp",
            format!(
                "a profile speculates one way: with MTP heads or with {other}, not both (remove [mtp] or [{other}])"
            ),
        ));
    }
    if m.n_max == 0 || m.n_max > crate::MAX_DRAFT {
        return Err(ProfileError::invalid(
            "mtp.n_max",
            format!(
                "must be between 1 and {} (found {})",
                crate::MAX_DRAFT,
                m.n_max
            ),
        ));
    }
    if !(0.0..=1.0).contains(&m.acceptance) {
        return Err(ProfileError::invalid(
            "mtp.acceptance",
            format!("must be between 0 and 1 (found {})", m.acceptance),
        ));
    }
    for (name, v) in [
        ("tokens_per_round", m.tokens_per_round),
        ("tg_tps", m.tg_tps),
        ("baseline_tg_tps", m.baseline_tg_tps),
    ] {
        if !v.is_finite() || v < 0.0 {
            return Err(ProfileError::invalid(
                format!("mtp.{name}"),
                format!("must be a finite number of at least 0 (found {v})"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example_profile;

    fn example() -> MtpSettings {
        MtpSettings {
            n_max: 3,
            kinds: vec!["chat".into(), "code".into()],
            acceptance: 0.55,
            tokens_per_round: 2.1,
            tg_tps: 33.0,
            baseline_tg_tps: 25.0,
        }
    }

    #[test]
    fn mtp_speculation_adds_the_servers_flags_and_round_trips() {
        let mut p = example_profile();
        p.mtp = Some(example());
        p.refresh_server_args();
        let a = &p.server_args;
        let tail: Vec<&str> = a[a.len() - 12..].iter().map(String::as_str).collect();
        let (k, v) = (p.winner.type_k.as_str(), p.winner.type_v.as_str());
        assert_eq!(
            tail,
            [
                "--spec-type",
                "draft-mtp",
                "--spec-draft-n-max",
                "3",
                "--spec-draft-n-min",
                "0",
                "--spec-draft-p-min",
                "0.00",
                "-ctkd",
                k,
                "-ctvd",
                v
            ]
        );
        p.validate(false).unwrap();
        let text = p.to_toml().unwrap();
        assert!(text.contains("[mtp]\nn_max = 3\n"), "{text}");
        let (back, warnings) = crate::Profile::from_toml(&text).unwrap();
        assert_eq!(back, p);
        assert!(warnings.is_empty(), "{warnings:?}");
        let presets = crate::export(&p, crate::ExportFormat::Presets).unwrap();
        assert!(presets.contains("spec-type = draft-mtp"), "{presets}");
        // Ollama has no speculation: its export says what it leaves out.
        let ollama = crate::export(&p, crate::ExportFormat::Ollama).unwrap();
        assert!(
            ollama.contains("# autotune: MTP speculation draft-mtp (n_max 3; 33.0 vs 25.0 t/s): Ollama cannot speculate"),
            "{ollama}"
        );
        assert!(!ollama.contains("spec-"), "{ollama}");
    }

    #[test]
    fn a_hand_edited_mtp_is_checked() {
        let bad = |edit: fn(&mut MtpSettings)| {
            let mut p = example_profile();
            let mut m = example();
            edit(&mut m);
            p.mtp = Some(m);
            p.refresh_server_args();
            p.validate(false).unwrap_err().to_string()
        };
        let e = bad(|m| m.n_max = 0);
        assert!(
            e.contains("mtp.n_max must be between 1 and 128 (found 0)"),
            "{e}"
        );
        let e = bad(|m| m.n_max = 500);
        assert!(e.contains("mtp.n_max"), "{e}");
        let e = bad(|m| m.acceptance = 1.5);
        assert!(e.contains("mtp.acceptance must be between 0 and 1"), "{e}");
        let e = bad(|m| m.tg_tps = f64::NAN);
        assert!(e.contains("mtp.tg_tps"), "{e}");
        // One kind of speculation per profile.
        let mut p = example_profile();
        p.mtp = Some(example());
        p.ngram = Some(crate::ngram::tests::example());
        p.refresh_server_args();
        let e = p.validate(false).unwrap_err().to_string();
        assert!(e.contains("with MTP heads or with ngram"), "{e}");
        // A value that parses as TOML but not as a count is a parse error naming the key.
        let mut p = example_profile();
        p.mtp = Some(example());
        p.refresh_server_args();
        let text = p.to_toml().unwrap().replace("n_max = 3", "n_max = -1");
        let e = crate::Profile::from_toml(&text).unwrap_err().to_string();
        assert!(e.contains("n_max"), "{e}");
    }
}
