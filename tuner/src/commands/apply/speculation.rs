//! What `apply --exec` checks of a profile's speculative decoding: the prompt its check sends (one of
//! the profile's prompt kinds, preferring text that repeats, so n-gram lookup has something to draft)
//! and the server's own draft figures (`timings.draft_n`, `timings.draft_n_accepted`) beside the
//! acceptance the profile measured.

use super::timings::Timings;
use crate::speculative::prompts::{self, Prompt};
use crate::speculative::workload;
use crate::workload::WorkloadPreset;
use profiles::Profile;
use serde::Serialize;
use std::path::PathBuf;

/// Tokens a speculative check generates at least: a draft needs text to match or predict, and a
/// handful of tokens gives too few rounds for an acceptance figure (the draft search measures 48).
pub const MIN_GEN: u32 = 64;

/// Prompt kinds of the built-in speculative prompts, from the most repetitive to the least.
const KIND_ORDER: &[&str] = &["repetitive", "code", "summarisation", "chat"];

/// The speculation a profile's server runs, as the profile measured it.
#[derive(Debug, Clone)]
pub struct Expected {
    /// llama-server's `--spec-type`: `draft-simple` (a draft model), `ngram-simple` or `draft-mtp`
    /// (the target's own MTP heads).
    pub spec_type: String,
    pub draft_model: Option<PathBuf>,
    /// Measured: accepted / drafted tokens.
    pub acceptance: f64,
    /// Measured: generation speed with the speculation, and the target alone in the same run.
    pub tg_tps: f64,
    pub baseline_tg_tps: f64,
    /// The prompt kinds it was measured on (empty: not recorded).
    pub kinds: Vec<String>,
    /// The server flags it adds (`-md`, `--spec-type`, ...), to tell a refused one apart.
    pub flags: Vec<&'static str>,
}

/// The profile's speculation; `None` when its server runs none.
pub fn expected(p: &Profile) -> Option<Expected> {
    if let Some(d) = &p.draft {
        return Some(Expected {
            spec_type: "draft-simple".into(),
            draft_model: Some(d.path.clone()),
            acceptance: d.acceptance,
            tg_tps: d.tg_tps,
            baseline_tg_tps: d.baseline_tg_tps,
            kinds: Vec::new(),
            flags: profiles::draft_options(d).iter().map(|o| o.short).collect(),
        });
    }
    if let Some(m) = &p.mtp {
        return Some(Expected {
            spec_type: profiles::DRAFT_MTP.into(),
            draft_model: None,
            acceptance: m.acceptance,
            tg_tps: m.tg_tps,
            baseline_tg_tps: m.baseline_tg_tps,
            kinds: m.kinds.clone(),
            flags: profiles::mtp_options(m, &p.winner)
                .iter()
                .map(|o| o.short)
                .collect(),
        });
    }
    p.ngram.as_ref().map(|n| Expected {
        spec_type: n.spec_type.clone(),
        draft_model: None,
        acceptance: n.acceptance,
        tg_tps: n.tg_tps,
        baseline_tg_tps: n.baseline_tg_tps,
        kinds: n.kinds.clone(),
        flags: profiles::ngram_options(n).iter().map(|o| o.short).collect(),
    })
}

/// The check's prompt for a profile with speculation: a built-in speculative prompt of the kinds it
/// was measured on (else those of the profile's `--workload`), the most repetitive kind among them.
/// Kinds that are not built in (the user's own `--draft-prompts`) get the repetitive prompt.
pub fn prompt(e: &Expected, workload_name: &str) -> Prompt {
    let kinds: Vec<String> = if e.kinds.is_empty() {
        workload_kinds(workload_name)
    } else {
        e.kinds.clone()
    };
    let kind = KIND_ORDER
        .iter()
        .find(|k| kinds.is_empty() || kinds.iter().any(|x| x == *k))
        .unwrap_or(&KIND_ORDER[0]);
    let built_in = prompts::built_in();
    built_in
        .iter()
        .find(|p| p.kind == *kind)
        .unwrap_or(&built_in[0])
        .clone()
}

/// The prompt kinds of the workload preset a profile was tuned for ("agent", "agent (adjusted)");
/// empty for a custom workload.
fn workload_kinds(name: &str) -> Vec<String> {
    name.split_whitespace()
        .next()
        .and_then(|w| w.parse::<WorkloadPreset>().ok())
        .map(|w| workload::kinds(w).iter().map(|k| k.to_string()).collect())
        .unwrap_or_default()
}

/// The server's speculation in the measured completion, beside the profile's.
#[derive(Debug, Serialize)]
pub struct SpeculationCheck {
    pub spec_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<PathBuf>,
    /// The built-in speculative prompt the check sent, and its kind.
    pub prompt: String,
    pub prompt_kind: String,
    /// The server's `timings.draft_n` and `timings.draft_n_accepted` (0 when it drafted nothing).
    pub drafted: u64,
    pub accepted: u64,
    /// The server's accepted / drafted; `None` when it drafted nothing.
    pub acceptance: Option<f64>,
    /// What the profile measured: acceptance, and generation with and without the speculation, on
    /// prompts of these kinds (empty: not recorded).
    pub profile_acceptance: f64,
    pub profile_tg_tps: f64,
    pub profile_baseline_tg_tps: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profile_kinds: Vec<String>,
}

impl SpeculationCheck {
    pub fn new(e: &Expected, prompt: &Prompt, t: &Timings) -> SpeculationCheck {
        SpeculationCheck {
            spec_type: e.spec_type.clone(),
            draft_model: e.draft_model.clone(),
            prompt: prompt.name.clone(),
            prompt_kind: prompt.kind.clone(),
            drafted: t.draft_n,
            accepted: t.draft_n_accepted,
            acceptance: (t.draft_n > 0).then(|| t.draft_n_accepted as f64 / t.draft_n as f64),
            profile_acceptance: e.acceptance,
            profile_tg_tps: e.tg_tps,
            profile_baseline_tg_tps: e.baseline_tg_tps,
            profile_kinds: e.kinds.clone(),
        }
    }

    /// The report's line, e.g. `speculation ngram-simple on the numbered-list prompt (repetitive): 41
    /// of 96 drafted tokens accepted (43%), 60% in the profile`.
    pub fn line(&self) -> String {
        let what = match &self.draft_model {
            Some(m) => format!(
                "{} with {}",
                self.spec_type,
                m.file_name().unwrap_or(m.as_os_str()).to_string_lossy()
            ),
            None => self.spec_type.clone(),
        };
        let profile = if self.profile_kinds.is_empty() {
            format!("{:.0}% in the profile", self.profile_acceptance * 100.0)
        } else {
            format!(
                "{:.0}% in the profile (on its {} prompts)",
                self.profile_acceptance * 100.0,
                self.profile_kinds.join(", ")
            )
        };
        let figures = match self.acceptance {
            Some(a) => format!(
                "{} of {} drafted tokens accepted ({:.0}%), {profile}",
                self.accepted,
                self.drafted,
                a * 100.0,
            ),
            None => format!("the server drafted NO tokens ({profile})"),
        };
        format!(
            "speculation {what} on the {} prompt ({}): {figures}\n",
            self.prompt, self.prompt_kind
        )
    }

    /// The warning for a server that drafted nothing although the profile speculates.
    pub fn warning(&self) -> Option<String> {
        (self.drafted == 0).then(|| {
            format!(
                "the profile speculates with {} but llama-server drafted no tokens in the check: it may \
                 not run the speculation (its log, with --verbose, says what it loaded), or the {} prompt \
                 gave it nothing to draft",
                self.spec_type, self.prompt
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(kinds: &[&str]) -> Expected {
        Expected {
            spec_type: "ngram-simple".into(),
            draft_model: None,
            acceptance: 0.6,
            tg_tps: 40.0,
            baseline_tg_tps: 25.0,
            kinds: kinds.iter().map(|k| k.to_string()).collect(),
            flags: vec!["--spec-type"],
        }
    }

    #[test]
    fn the_prompt_is_of_the_profiles_kinds_and_repeats_where_it_can() {
        assert_eq!(
            prompt(&ngram(&["code", "repetitive"]), "x").kind,
            "repetitive"
        );
        assert_eq!(prompt(&ngram(&["code"]), "x").kind, "code");
        assert_eq!(
            prompt(&ngram(&["summarisation"]), "x").kind,
            "summarisation"
        );
        // The user's own kinds are not built in: the repetitive prompt.
        assert_eq!(prompt(&ngram(&["days"]), "x").kind, "repetitive");
        // No kinds recorded (a draft model): the workload's.
        assert_eq!(prompt(&ngram(&[]), "long-prompt").kind, "summarisation");
        assert_eq!(prompt(&ngram(&[]), "chat (adjusted)").kind, "chat");
        assert_eq!(prompt(&ngram(&[]), "agent").kind, "repetitive");
        assert_eq!(prompt(&ngram(&[]), "custom").kind, "repetitive");
    }

    #[test]
    fn the_line_gives_the_servers_acceptance_beside_the_profiles() {
        let p = prompt(&ngram(&["repetitive"]), "agent");
        let t = Timings {
            draft_n: 96,
            draft_n_accepted: 41,
            ..Timings::default()
        };
        let c = SpeculationCheck::new(&ngram(&["repetitive"]), &p, &t);
        assert_eq!(
            c.line(),
            format!(
                "speculation ngram-simple on the {} prompt (repetitive): 41 of 96 drafted tokens accepted \
                 (43%), 60% in the profile (on its repetitive prompts)\n",
                p.name
            )
        );
        assert!(c.warning().is_none());
        let none = SpeculationCheck::new(&ngram(&["repetitive"]), &p, &Timings::default());
        assert!(none.line().contains("drafted NO tokens"), "{}", none.line());
        assert!(none.acceptance.is_none());
        assert!(none.warning().unwrap().contains("drafted no tokens"));
    }

    #[test]
    fn an_mtp_profile_is_checked_as_draft_mtp_on_its_kinds() {
        let mut p = profiles::example_profile();
        assert!(expected(&p).is_none());
        p.mtp = Some(profiles::MtpSettings {
            n_max: 2,
            kinds: vec!["chat".into(), "code".into()],
            acceptance: 0.4,
            tokens_per_round: 1.6,
            tg_tps: 30.0,
            baseline_tg_tps: 25.0,
        });
        let e = expected(&p).expect("an [mtp] profile speculates");
        assert_eq!(e.spec_type, "draft-mtp");
        assert!(e.draft_model.is_none());
        assert_eq!(e.kinds, ["chat", "code"]);
        for flag in ["--spec-type", "--spec-draft-n-max", "-ctkd", "-ctvd"] {
            assert!(e.flags.contains(&flag), "{:?}", e.flags);
        }
        // The more repetitive of its kinds.
        let p = prompt(&e, &p.workload.name);
        assert_eq!(p.kind, "code");
        let t = Timings {
            draft_n: 40,
            draft_n_accepted: 10,
            ..Timings::default()
        };
        let line = SpeculationCheck::new(&e, &p, &t).line();
        assert!(
            line.starts_with(&format!(
                "speculation draft-mtp on the {} prompt (code): 10 of 40",
                p.name
            )),
            "{line}"
        );
        assert!(
            line.contains("40% in the profile (on its chat, code prompts)"),
            "{line}"
        );
    }

    #[test]
    fn the_servers_timings_read_with_and_without_draft_figures() {
        let with: Timings = serde_json::from_str(
            r#"{"prompt_n":93,"prompt_per_second":200.5,"predicted_n":64,"predicted_per_second":9.5,
                "draft_n":59,"draft_n_accepted":39,"cache_n":0}"#,
        )
        .unwrap();
        assert_eq!((with.draft_n, with.draft_n_accepted), (59, 39));
        // llama-server leaves both out when it drafted nothing.
        let without: Timings =
            serde_json::from_str(r#"{"prompt_n":93,"predicted_n":64,"predicted_per_second":9.5}"#)
                .unwrap();
        assert_eq!((without.draft_n, without.draft_n_accepted), (0, 0));
    }
}
