//! `Profile`: the TOML file that records the fastest llama.cpp configuration for one model on one machine.
//!
//! The file is typed (serde) and versioned (`schema_version`). Reading it reports keys this version does
//! not know as warnings instead of failing, so a profile edited by hand or written by a newer patch release
//! still loads; a different `schema_version` is refused with a message naming both versions, because the
//! meaning of the keys may have changed.

use crate::error::{ProfileError, Result};
use crate::server_args::{server_options, ServerOption};
pub use crate::workload::Workload;
use search_space::Candidate;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The profile layout this crate reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// Comment lines written above every profile, for whoever opens it in an editor.
const HEADER: &str = "\
# autotune profile: the fastest llama.cpp configuration measured for one model on one machine.
# server_args is derived from [winner], [workload] and model.path. After editing those, delete the
# server_args line and autotune derives it again; a server_args that does not match is refused.
";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub schema_version: u32,
    /// When the tuning run finished (seconds since the Unix epoch).
    pub created_unix: u64,
    pub autotune_version: String,
    /// The llama-server argv (without the program name) that reproduces `winner`.
    #[serde(default)]
    pub server_args: Vec<String>,
    /// The environment llama-server needs beside `server_args` (the knobs llama.cpp reads from the
    /// environment, like `GGML_OP_OFFLOAD_MIN_BATCH`), derived from `winner` as `server_args` is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub server_env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// ggml RPC servers (`host:port`) the run used as devices: llama-server gets them as `--rpc`, and
    /// `apply` connects them before checking the devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<String>,
    pub model: ModelRef,
    pub machine: MachineRef,
    pub llama: LlamaBuild,
    pub workload: Workload,
    pub winner: Candidate,
    pub figures: Figures,
    /// llama.cpp's defaults measured in the same run, for the speed-up a user gets from this profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Figures>,
    /// What the baseline was, when not llama.cpp's plain defaults: with a device to offload to,
    /// "llama.cpp's --fit placement" (llama-server's own placement under the same budgets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_placement: Option<String>,
    /// The winner against the baseline by the run's decision rule (absent in profiles written
    /// before it was recorded, and where either was not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versus_defaults: Option<VersusDefaults>,
    /// What a generated token of the winner reads and how fast this machine reads memory, for
    /// `autotune explain`; absent in profiles written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roofline: Option<crate::Roofline>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaderboard: Vec<LeaderboardEntry>,
    /// The draft model for speculative decoding, when one measured faster than the target alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<crate::DraftSettings>,
    /// N-gram speculation (no draft model), when it measured faster than the target alone on the
    /// workload's prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ngram: Option<crate::NgramSettings>,
    /// Multi-token prediction with the target's own heads (no draft model), when it measured faster
    /// than the target alone on the workload's prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<crate::MtpSettings>,
    /// The quality of the quantized K/V caches the run held to its gate (absent in profiles
    /// written before the gate existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<crate::QualityRecord>,
    /// Why `[quality]` could not be read, where it could not (hand-edited, or damaged): the profile
    /// is then stale, as what its cache's quality was measured with is unknown. Never written.
    #[serde(skip)]
    pub quality_unreadable: Option<String>,
    /// The memory each device could hold in the run (given with `--mem-budget`, or free memory
    /// less the margin): what the winner was chosen under.
    #[serde(default, skip_serializing_if = "crate::Budgets::is_empty")]
    pub budgets: crate::Budgets,
    /// Each RPC server the run measured over and its link then, used by the winner or not (absent
    /// without `--rpc`, and in profiles written before links were measured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<crate::HostLink>,
    /// Where one GPU is driven by several backends (CUDA0 and Vulkan0), the best placement found
    /// through each, measured against each other (absent where each GPU has one backend).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<crate::BackendTrial>,
}

/// What the run's decision rule said of the winner against the baseline: the request rate's
/// relative difference with its 95% interval, from interleaved repetitions, judged at the run's
/// noise threshold. A gain is only claimed where the whole interval lies above it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersusDefaults {
    pub verdict: Judged,
    /// Winner's request rate over the baseline's, less one (0.05: 5% more requests per second);
    /// 0 when the winner is the baseline.
    #[serde(default)]
    pub ratio: f64,
    /// The 95% interval of `ratio`.
    #[serde(default)]
    pub ci: [f64; 2],
    /// The relative difference below which the run calls two configurations a tie.
    pub noise: f64,
}

/// The verdict of [`VersusDefaults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Judged {
    /// The winner is the baseline itself: nothing beat it beyond the noise.
    Same,
    /// Faster beyond the noise threshold with 95% confidence.
    Faster,
    /// Within the noise: chosen for something else (less memory, a smaller KV cache).
    Tie,
    Slower,
}

impl VersusDefaults {
    /// A few words for one-line listings: "+7% requests/s vs defaults", "ties with defaults
    /// within ±2%", "llama.cpp's defaults".
    pub fn short(&self) -> String {
        match self.verdict {
            Judged::Same => "llama.cpp's defaults".into(),
            Judged::Tie => format!("ties with defaults within ±{:.0}%", self.noise * 100.0),
            Judged::Faster | Judged::Slower => {
                format!("{:+.0}% requests/s vs defaults", self.ratio * 100.0)
            }
        }
    }
}

/// The profile without its `[quality]` table, where that table is what did not parse: read, with
/// why it could not be (`Profile::quality_unreadable`), so that using it is refused as stale
/// rather than failing as an unreadable file or a panic later.
fn without_quality(text: &str) -> Option<Profile> {
    let mut table: toml::Table = toml::from_str(text).ok()?;
    let quality = table.remove("quality")?;
    let why = match crate::QualityRecord::deserialize(quality) {
        Err(q) => q.message().to_string(),
        Ok(_) => return None,
    };
    let mut profile = Profile::deserialize(toml::Value::Table(table)).ok()?;
    profile.quality_unreadable = Some(why.trim().replace('\n', " "));
    Some(profile)
}

/// The GGUF file the profile was measured with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRef {
    pub path: PathBuf,
    pub file_name: String,
    /// 64 hex digits identifying the model's content.
    pub fingerprint: String,
    pub size_bytes: u64,
    pub architecture: String,
    /// The quantization, as the GGUF names it (e.g. `Q4_K_M`), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_type: Option<String>,
}

/// The machine the profile was measured on. A profile is only applied on the machine it was made on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineRef {
    pub fingerprint: String,
    pub hostname: String,
    pub cpu: String,
    pub physical_cores: u32,
    pub logical_cpus: u32,
    pub ram_bytes: u64,
    pub os: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceRef>,
    /// GPUs the operating system showed, whether or not a backend of the build drove them (a profile
    /// tuned with a GPU left idle says so here and in its notes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// NUMA nodes with CPUs (written when more than one: on one node llama.cpp treats every
    /// `--numa` strategy as off).
    #[serde(
        default = "crate::serde_one::one",
        skip_serializing_if = "crate::serde_one::is_one"
    )]
    pub numa_nodes: u32,
}

/// One llama.cpp device (`--list-devices`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRef {
    /// llama.cpp's device name, as `--device` takes it (e.g. `CUDA0`).
    pub name: String,
    pub description: String,
    /// `cpu`, `gpu`, `igpu` or `accel`.
    pub kind: String,
    /// The ggml backend (e.g. `CUDA`, `Vulkan`, `CPU`).
    pub backend: String,
    pub memory_total: u64,
}

impl DeviceRef {
    /// A device llama.cpp places layers on (a GPU, integrated or not, or an RPC server); CPU and
    /// accelerator devices only serve the CPU's tensors.
    pub fn takes_layers(&self) -> bool {
        matches!(self.kind.as_str(), "gpu" | "igpu")
    }
}

/// The llama.cpp build that was measured: a profile from another build may no longer be the fastest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlamaBuild {
    pub version: String,
    pub commit: String,
    #[serde(default)]
    pub backends: Vec<String>,
    /// The CPU backend variant loaded (e.g. `haswell`, `sapphirerapids`), with dynamic backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_variant: Option<String>,
    pub system_info: String,
}

/// The measured speed and memory of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Prompt processing, tokens per second.
    pub pp_tps: f64,
    /// Generation, tokens per second.
    pub tg_tps: f64,
    /// Prompt processing with `depth` tokens already in the context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_depth_tps: Option<f64>,
    /// Generation with `depth` tokens already in the context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tg_depth_tps: Option<f64>,
    /// Time to first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// The workload's modelled duration in seconds (lower is better): what candidates are ranked by.
    pub score_s: f64,
    pub mem_bytes: u64,
    /// Confidence interval of `pp_tps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_ci: Option<[f64; 2]>,
    /// Confidence interval of `tg_tps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tg_ci: Option<[f64; 2]>,
    pub repetitions: u32,
    /// The phases (`prompt`, `generation`) whose figures are estimates: no repetition of this
    /// configuration timed them, its group moving only the other phase, and they were borrowed
    /// from the configurations it was compared with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimated: Vec<String>,
}

/// One row of the ranking: every candidate tried, with its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardEntry {
    pub rank: u32,
    /// Not distinguishable from the row above (confidence intervals overlap).
    #[serde(default)]
    pub tie_with_previous: bool,
    /// `ok`, `failed: <reason>` or `pruned: <reason>`.
    pub status: String,
    /// It did not fit: pruned as over a device's memory budget, or out of memory when loaded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub did_not_fit: bool,
    pub candidate: Candidate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<Figures>,
    /// The mean KL divergence of its K/V cache pair against the f16 cache, where that pair was
    /// held to the quality gate (the profile's `[quality]` has the rest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_kld: Option<f64>,
}

/// A few lines about a profile, for `autotune profiles list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileSummary {
    pub model_file: String,
    pub model_fingerprint: String,
    pub machine_fingerprint: String,
    pub hostname: String,
    pub created_unix: u64,
    pub workload: String,
    /// `Candidate::label()` of the winner.
    pub winner: String,
    pub pp_tps: f64,
    pub tg_tps: f64,
    /// Generation speed relative to llama.cpp's defaults, where the baseline was measured.
    pub tg_speedup: Option<f64>,
    /// The winner against the baseline by the run's decision rule, where recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versus_defaults: Option<VersusDefaults>,
}

impl Profile {
    /// The profile as TOML, with a short comment header.
    pub fn to_toml(&self) -> Result<String> {
        let body = toml::to_string(self).map_err(|e| ProfileError::Serialize {
            message: e.to_string(),
        })?;
        Ok(format!("{HEADER}\n{body}"))
    }

    /// Reads a profile. Returns it with warnings for keys this version does not know (they are ignored).
    ///
    /// Only parses: call [`Profile::validate`] before using what it says.
    pub fn from_toml(text: &str) -> Result<(Profile, Vec<String>)> {
        // Look at the version first: a profile of another version may not deserialize at all, and
        // "wrong version" is the message that helps then, not "missing field".
        #[derive(Deserialize)]
        struct Probe {
            schema_version: Option<toml::Value>,
            server_args: Option<toml::Value>,
        }
        let probe: Probe = toml::from_str(text).map_err(|e| parse_error(text, &e))?;
        match probe.schema_version {
            None => {
                return Err(ProfileError::Parse {
                    path: None,
                    message: "missing key `schema_version` (not an autotune profile?)".into(),
                })
            }
            Some(toml::Value::Integer(v)) if v == i64::from(SCHEMA_VERSION) => {}
            Some(toml::Value::Integer(found)) => {
                return Err(ProfileError::SchemaVersion {
                    path: None,
                    found,
                    supported: SCHEMA_VERSION,
                })
            }
            Some(other) => {
                return Err(ProfileError::Parse {
                    path: None,
                    message: format!(
                        "`schema_version` must be an integer, found {}",
                        other.type_str()
                    ),
                })
            }
        }

        let mut warnings = Vec::new();
        let de = toml::Deserializer::new(text);
        let parsed: std::result::Result<Profile, _> = serde_ignored::deserialize(de, |path| {
            warnings.push(format!("unknown key `{path}` ignored"))
        });
        let mut profile = match parsed {
            Ok(p) => p,
            Err(e) => without_quality(text).ok_or_else(|| parse_error(text, &e))?,
        };
        if probe.server_args.is_none() {
            profile.refresh_server_args();
            warnings.push("no `server_args` in the profile: derived them from [winner]".into());
        } else if profile.server_args == profile.unpinned_server_args() {
            // Written before the slots, the KV pool and speculation were pinned: the same
            // configuration, now with what the server would otherwise choose for itself.
            profile.server_args = profile.expected_server_args();
        }
        Ok((profile, warnings))
    }

    /// The llama-server argv this profile's winner, workload and model stand for.
    pub fn expected_server_args(&self) -> Vec<String> {
        crate::server_args::words(self.server_options())
    }

    /// llama-server's options for this profile: the winner's, its RPC servers, its draft. The one
    /// list the argv and every export are made from.
    pub fn server_options(&self) -> Vec<ServerOption> {
        let mut o = server_options(&self.winner, &self.model.path, &self.workload);
        if !self.rpc.is_empty() {
            // Right after the model: llama-server resolves `--device` names as it reads them, and
            // RPC devices exist only once `--rpc` has been read.
            o.insert(
                1,
                ServerOption {
                    short: "--rpc",
                    long: "rpc",
                    value: Some(self.rpc.join(",")),
                },
            );
        }
        o.extend(
            self.draft
                .iter()
                .flat_map(crate::server_args::draft_options),
        );
        o.extend(self.ngram.iter().flat_map(crate::ngram_options));
        o.extend(
            self.mtp
                .iter()
                .flat_map(|m| crate::mtp_options(m, &self.winner)),
        );
        if self.draft.is_none() && self.ngram.is_none() && self.mtp.is_none() {
            o.push(ServerOption::with_value(
                "--spec-type",
                "spec-type",
                crate::server_args::NO_SPECULATION,
            ));
        }
        o
    }

    /// [`Self::expected_server_args`] as a profile written before the server's own choices were
    /// pinned (`-np 1`, `-no-kvu`, `--spec-type none`) has them.
    fn unpinned_server_args(&self) -> Vec<String> {
        let np = self.workload.n_parallel;
        (self.server_options().into_iter())
            .filter(|o| !crate::server_args::pinned_since_v1(o, np))
            .flat_map(|o| std::iter::once(o.short.to_string()).chain(o.value))
            .collect()
    }

    /// The environment this profile's winner needs llama-server started with.
    pub fn expected_server_env(&self) -> BTreeMap<String, String> {
        crate::server_args::server_env(&self.winner)
            .into_iter()
            .collect()
    }

    /// Sets `server_args` and `server_env` from the winner (call after changing `winner`,
    /// `workload` or `model.path`).
    pub fn refresh_server_args(&mut self) {
        self.server_args = self.expected_server_args();
        self.server_env = self.expected_server_env();
    }

    /// The model's file name without `.gguf`, reduced to `[A-Za-z0-9._-]`: safe as a file name, an INI
    /// section, a YAML key and a model name in API requests.
    pub fn model_stem(&self) -> String {
        let name = if self.model.file_name.is_empty() {
            self.model
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            self.model.file_name.clone()
        };
        let stem = Path::new(&name)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let safe: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let safe = safe.trim_start_matches(['.', '-']);
        if safe.is_empty() {
            "model".into()
        } else {
            safe.into()
        }
    }

    pub fn summary(&self) -> ProfileSummary {
        ProfileSummary {
            model_file: self.model.file_name.clone(),
            model_fingerprint: self.model.fingerprint.clone(),
            machine_fingerprint: self.machine.fingerprint.clone(),
            hostname: self.machine.hostname.clone(),
            created_unix: self.created_unix,
            workload: match self.workload.n_parallel {
                0 | 1 => self.workload.name.clone(),
                n => format!("{} ×{n} at once", self.workload.name),
            },
            winner: self.winner.label(),
            pp_tps: self.figures.pp_tps,
            tg_tps: self.figures.tg_tps,
            tg_speedup: self
                .baseline
                .as_ref()
                .filter(|b| b.tg_tps > 0.0)
                .map(|b| self.figures.tg_tps / b.tg_tps),
            versus_defaults: self.versus_defaults.clone(),
        }
    }
}

/// Turns a TOML error into a message that names the line and the key, e.g.
/// ``line 31, key `winner.threads`: invalid type: string "4; rm -rf /", expected u32``.
fn parse_error(text: &str, err: &toml::de::Error) -> ProfileError {
    let message = err.message().trim_end().to_string();
    let Some(span) = err.span() else {
        return ProfileError::Parse {
            path: None,
            message,
        };
    };
    let start = span.start.min(text.len());
    let line_no = text[..start].matches('\n').count() + 1;
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("").trim_end();
    let key = key_of_line(line).map(|k| match table_above(&text[..line_start]) {
        Some(table) => format!("{table}.{k}"),
        None => k.to_string(),
    });
    let located = match key {
        Some(key) => format!("line {line_no}, key `{key}`"),
        None => format!("line {line_no}"),
    };
    ProfileError::Parse {
        path: None,
        message: format!("{located}: {message}\n  {line_no} | {line}"),
    }
}

/// The key of a `key = value` line, if the line is one.
fn key_of_line(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let plain =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '"' | '\'' | ' ');
    (!key.is_empty() && !key.starts_with('[') && key.chars().all(plain)).then_some(key)
}

/// The name of the last `[table]` or `[[array]]` header in `before`.
fn table_above(before: &str) -> Option<&str> {
    before
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| {
            let l = l.split('#').next().unwrap_or(l).trim();
            l.trim_start_matches('[').trim_end_matches(']').trim()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example_profile;

    #[test]
    fn round_trips_through_toml() {
        let p = example_profile();
        let text = p.to_toml().unwrap();
        let (back, warnings) = Profile::from_toml(&text).unwrap();
        assert_eq!(back, p);
        assert!(warnings.is_empty(), "{warnings:?}");
        back.validate(false).unwrap();
    }

    #[test]
    fn toml_snapshot() {
        insta::assert_snapshot!("profile_toml", example_profile().to_toml().unwrap());
    }

    #[test]
    fn a_quality_record_that_does_not_parse_is_kept_apart_not_an_error() {
        let text = example_profile().to_toml().unwrap();
        let text = format!("{text}\n[quality]\ntext = \"t\"\nwindow = \"deep\"\ntokens = 2048\n");
        let (p, _) = Profile::from_toml(&text).unwrap();
        assert!(p.quality.is_none());
        let why = p.quality_unreadable.expect("said why");
        assert!(
            why.contains("window") || why.contains("invalid type"),
            "{why}"
        );
        // Anything else that does not parse is still the error it was.
        let bad = example_profile().to_toml().unwrap().replacen(
            "[winner]\n",
            "[winner]\nthreads = \"x\"\n",
            1,
        );
        assert!(Profile::from_toml(&bad).is_err());
    }

    #[test]
    fn unknown_keys_are_warnings() {
        let text = example_profile().to_toml().unwrap();
        let text = text.replacen("[winner]\n", "[winner]\nturbo = true\n", 1);
        let text = text.replacen(
            "schema_version = 1\n",
            "schema_version = 1\ncolour = \"blue\"\n",
            1,
        );
        let (p, warnings) = Profile::from_toml(&text).unwrap();
        assert_eq!(p, example_profile());
        assert_eq!(
            warnings,
            [
                "unknown key `colour` ignored",
                "unknown key `winner.turbo` ignored"
            ]
        );
    }

    #[test]
    fn other_schema_version_is_refused_by_name() {
        let text = example_profile().to_toml().unwrap().replacen(
            "schema_version = 1",
            "schema_version = 2",
            1,
        );
        // Also break the layout: the version message must win over "missing field".
        let text = text.replacen("[winner]", "[winning]", 1);
        let err = Profile::from_toml(&text).unwrap_err();
        assert!(
            matches!(
                err,
                ProfileError::SchemaVersion {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("schema_version 2") && msg.contains("schema_version 1"),
            "{msg}"
        );
    }

    #[test]
    fn missing_schema_version_is_not_a_profile() {
        let err = Profile::from_toml("title = \"hello\"\n").unwrap_err();
        assert!(
            err.to_string().contains("missing key `schema_version`"),
            "{err}"
        );
    }

    #[test]
    fn a_string_where_a_number_belongs_names_the_key_and_line() {
        let text = example_profile().to_toml().unwrap().replacen(
            "threads = 8",
            "threads = \"4; rm -rf /\"",
            1,
        );
        let line = text.lines().position(|l| l.contains("rm -rf")).unwrap() + 1;
        let err = Profile::from_toml(&text).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ProfileError::Parse { .. }), "{err:?}");
        assert!(
            msg.contains(&format!("line {line}, key `winner.threads`")),
            "{msg}"
        );
        assert!(msg.contains("expected u32"), "{msg}");
    }

    #[test]
    fn missing_server_args_are_derived_with_a_warning() {
        let text = example_profile().to_toml().unwrap();
        let text: String = text
            .lines()
            .filter(|l| !l.starts_with("server_args"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(!text.contains("server_args = "));
        let (p, warnings) = Profile::from_toml(&text).unwrap();
        assert_eq!(p.server_args, example_profile().server_args);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }

    #[test]
    fn summary_reports_the_speedup_over_the_baseline() {
        let s = example_profile().summary();
        assert_eq!(s.winner, example_profile().winner.label());
        let speedup = s.tg_speedup.unwrap();
        assert!((speedup - 118.25 / 104.0).abs() < 1e-9);
    }

    #[test]
    fn model_stem_is_safe_everywhere() {
        let mut p = example_profile();
        assert_eq!(p.model_stem(), "Qwen3-4B-Q4_K_M");
        p.model.file_name = "../my model]:v2.gguf".into();
        assert_eq!(p.model_stem(), "my_model__v2");
        p.model.file_name = String::new();
        p.model.path = "/".into();
        assert_eq!(p.model_stem(), "model");
    }
}
