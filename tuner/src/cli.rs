//! Command-line flags as clap parses them ("low args"); `commands::*` turns them into validated
//! settings ("high args"). Flag names mirror llama.cpp's where they overlap.

use crate::workload::WorkloadPreset;
use clap::{Args, Parser, Subcommand};
use profiles::ExportFormat;
use std::path::PathBuf;
use std::time::Duration;

mod draft;
mod fit;
mod knob_value;
mod measure;
mod quant;
mod tune;

pub use draft::{DraftArgs, DraftSearchArgs};
pub use fit::FitArgs;
pub use measure::MeasureArgs;
pub use quant::{QualityArgs, QuantizeArgs};
pub use tune::{CtxArg, DeviceArgs, RpcArgs, TuneArgs, WorkloadArgs};

#[derive(Debug, Parser)]
#[command(
    name = "autotune",
    version,
    about = "Finds the fastest way to run a GGUF model with llama.cpp on this machine",
    long_about = "Finds the fastest way to run a GGUF model with llama.cpp on this machine.\n\n\
        `autotune model.gguf` is short for `autotune tune model.gguf`: it measures real configurations \
        through linked llama.cpp and saves the fastest that fits as a profile.",
    after_help = "Exit codes: 0 ok, 1 error, 2 bad usage, 3 bad model file, 4 nothing could be measured, \
        5 bad profile or store, 6 llama-server refused the profile's arguments, 7 an RPC server does not \
        answer, 8 verify: the profile's quantized KV cache lost a fact the f16 cache keeps, 9 apply --check-only: \
        the server's cache fails the profile's quality record, 130 interrupted."
)]
pub struct Cli {
    /// Print llama.cpp's own log lines on stderr (useful when a trial fails)
    #[arg(short, long, global = true)]
    pub verbose: bool,

    /// No progress bar
    #[arg(short, long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure configurations of MODEL and save the fastest as a profile (the default command)
    Tune(Box<TuneArgs>),
    /// Show llama.cpp's devices, backends, CPU variant and system info
    Doctor(DoctorArgs),
    /// List stored profiles, or print one (by model file or profile path)
    Show(ShowArgs),
    /// Measure one configuration (like llama-bench): pp, tg and tg at depth with statistics
    Measure(MeasureArgs),
    /// Print the llama-server command for a profile, or start the server with it and verify its speed
    Apply(ApplyArgs),
    // Its one line of help lists the formats, from `ExportFormat` (the one list of their names).
    #[command(about = export_about())]
    Export(ExportArgs),
    /// Check a profile's long-context retrieval: facts placed at 90% of the server's context and
    /// asked for at its end, answered by the model as the profile runs it (and, for a quantized KV
    /// cache, with f16 caches too); run it before serving long chats with a quantized cache
    Verify(VerifyArgs),
    /// Serve this machine's CPU as a ggml RPC device (a second device for offload tests, or a
    /// remote machine's share of a model)
    #[command(name = "rpc-serve")]
    RpcServe(RpcServeArgs),
    /// Internal: the worker process that runs trials
    #[command(name = "__worker", hide = true)]
    Worker,
    /// Write other quantizations of a model (a "ladder") with llama.cpp's quantizer
    Quantize(QuantizeArgs),
    /// How far each quantization of a model (and each KV-cache type) drifts from the most precise
    /// file available: KL divergence and top-1 agreement of next-token distributions
    Quality(QualityArgs),
    /// Explain a profile: the memory-bandwidth roofline and a diagnosis (fit, bandwidth, dense or
    /// sparse, prefill, devices, which setting mattered), with charts and a Markdown report
    Explain(ExplainArgs),
    /// Speculative decoding: measure draft models (smaller models of the same family) against the
    /// target alone, with their draft settings, and report which pays
    Draft(Box<DraftArgs>),
    /// llama.cpp's own fit (common_fit_params) under the same budgets: the placement it chooses, its
    /// llama-server flags, and autotune's dry-run prediction of that placement per device
    Fit(FitArgs),
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub rpc: RpcArgs,
}

#[derive(Debug, Args)]
pub struct RpcServeArgs {
    /// Address to listen on (loopback by default: the RPC protocol has no authentication)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on
    #[arg(long, default_value_t = 50052)]
    pub port: u16,
    /// CPU threads the served device computes with
    #[arg(short, long)]
    pub threads: Option<usize>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A model file (its profile for this machine) or a profile file; none = list the store
    pub target: Option<PathBuf>,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A model file (its stored profile for this machine) or a profile file
    pub target: PathBuf,
    /// The llama-server executable (default: `llama-server` on PATH, then the vendor build)
    #[arg(long)]
    pub server: Option<PathBuf>,
    /// Start the server, wait for /health, send a completion and compare its speed with the profile
    #[arg(long)]
    pub exec: bool,
    /// Use a stale profile (other machine, devices, llama.cpp build or model file)
    #[arg(long)]
    pub force: bool,
    /// Address the server listens on (loopback by default)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port the server listens on (0 = pick a free one)
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Relative difference between the server's generation speed and the profile's beyond which to warn.
    /// Generous on purpose: the server samples real text through its HTTP loop while tuning decodes
    /// random tokens in-process, so some tens of percent apart is normal; a bigger gap means a busy
    /// machine or a server that does not run the measured configuration
    #[arg(long, default_value_t = 0.25)]
    pub tolerance: f64,
    /// Stop the server after the check instead of leaving it running in the foreground
    #[arg(long = "check-only")]
    pub check_only: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Extra llama-server arguments, after `--`
    #[arg(last = true)]
    pub extra: Vec<String>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A model file (its stored profile for this machine) or a profile file
    pub target: PathBuf,
    /// Use a stale profile (other machine, devices, llama.cpp build or model file)
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Model files (their stored profiles for this machine) or profile files; several make one file
    /// for a runner that serves several models (the formats whose help says "several")
    #[arg(required_unless_present = "all")]
    pub targets: Vec<PathBuf>,
    /// Every model tuned on this machine (the newest profile of each; stale ones are left out, with
    /// a warning, unless --force)
    #[arg(long, conflicts_with = "targets")]
    pub all: bool,
    /// The runner to write for (`--help` says what each format holds)
    #[arg(short, long, value_enum, ignore_case = true, default_value_t = ExportFormat::Args)]
    pub format: ExportFormat,
    /// Write to this file (atomically) instead of stdout
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Export a stale profile anyway
    #[arg(long)]
    pub force: bool,
}

/// `export`'s line in `autotune --help`: what it does, and its formats.
fn export_about() -> String {
    let names: Vec<String> = ExportFormat::all().iter().map(|f| f.to_string()).collect();
    format!(
        "Write a profile in another runner's format: {}",
        names.join(", ")
    )
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// A profile file, or a model file (this machine's stored profile for it); none = this
    /// machine's newest stored profile
    pub target: Option<PathBuf>,
    /// Write the charts (SVG: tg and pp against GPU layers, the leaderboard) into this folder
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Write a Markdown report (leaderboard, diagnosis, roofline, chart links) to FILE; the charts
    /// go beside it unless --plot puts them elsewhere
    #[arg(long = "export-markdown", value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,
    /// Print the explanation as JSON
    #[arg(long)]
    pub json: bool,
}

/// The subcommand names, for the `autotune model.gguf` short form.
pub const SUBCOMMANDS: &[&str] = &[
    "tune",
    "doctor",
    "show",
    "measure",
    "apply",
    "export",
    "rpc-serve",
    "__worker",
    "help",
    "quantize",
    "quality",
    "explain",
    "draft",
    "fit",
    "verify",
];

/// llama.cpp's multi-letter single-dash flags, which clap cannot express as short flags.
const LLAMA_STYLE_FLAGS: &[&str] = &[
    "-ngl", "-ctk", "-ctv", "-fa", "-ub", "-tb", "-np", "-ot", "-ts",
];

/// `autotune model.gguf …` → `autotune tune model.gguf …`, and `-ngl 8` → `--ngl 8` (not after
/// `--`: what follows it goes to llama-server as written).
pub fn with_default_subcommand(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut args: Vec<std::ffi::OsString> = args
        .into_iter()
        .enumerate()
        .map(|(i, a)| match a.to_str() {
            Some(s) if i < end && LLAMA_STYLE_FLAGS.contains(&s) => format!("-{s}").into(),
            _ => a,
        })
        .collect();
    let has_sub = args
        .iter()
        .skip(1)
        .any(|a| a.to_str().is_some_and(|s| SUBCOMMANDS.contains(&s)));
    let wants_help_or_version = args
        .iter()
        .skip(1)
        .any(|a| matches!(a.to_str(), Some("-h" | "--help" | "-V" | "--version")));
    let has_positional = args
        .iter()
        .skip(1)
        .any(|a| !a.to_string_lossy().starts_with('-'));
    if !has_sub && has_positional && !(wants_help_or_version && args.len() == 2) {
        args.insert(1, "tune".into());
    }
    args
}

/// Parses a size like `256M`, `8G` or plain bytes (search-space's parser), for clap.
fn parse_size(s: &str) -> Result<u64, String> {
    search_space::size::parse_size(s).map_err(|e| e.to_string())
}

/// Parses `90s`, `5m`, `1h`, `1h30m` or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("invalid duration '{s}': write e.g. 90s, 5m, 1h"));
    }
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(std::time::Duration::from_secs_f64(secs));
        }
        return Err(format!("invalid duration '{s}': it must be positive"));
    }
    let mut total = 0.0;
    let mut num = String::new();
    for ch in t.chars() {
        if ch.is_ascii_digit() || ch == '.' {
            num.push(ch);
            continue;
        }
        let v: f64 = num
            .parse()
            .map_err(|_| format!("invalid duration '{s}': write e.g. 90s, 5m, 1h"))?;
        num.clear();
        total += v * match ch {
            's' => 1.0,
            'm' => 60.0,
            'h' => 3600.0,
            _ => {
                return Err(format!(
                    "invalid duration '{s}': unknown unit '{ch}' (use s, m, h)"
                ))
            }
        };
    }
    if !num.is_empty() {
        return Err(format!(
            "invalid duration '{s}': a number needs a unit (s, m, h)"
        ));
    }
    if total <= 0.0 {
        return Err(format!("invalid duration '{s}': it must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_form_inserts_tune() {
        let a = with_default_subcommand(vec!["autotune".into(), "m.gguf".into(), "--quick".into()]);
        assert_eq!(a[1], "tune");
        let a = with_default_subcommand(vec!["autotune".into(), "doctor".into()]);
        assert_eq!(a[1], "doctor");
        let a = with_default_subcommand(vec!["autotune".into(), "--help".into()]);
        assert_eq!(a.len(), 2);
        let a = with_default_subcommand(vec![
            "autotune".into(),
            "measure".into(),
            "m.gguf".into(),
            "-ngl".into(),
            "9".into(),
        ]);
        assert_eq!(a[3], "--ngl");
        // After `--` the words are llama-server's, as written.
        let a = with_default_subcommand(
            ["autotune", "apply", "m.gguf", "-np", "2", "--", "-ngl", "9"]
                .map(Into::into)
                .to_vec(),
        );
        assert_eq!(a[3], "--np");
        assert_eq!(a[6], "-ngl");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("5m").unwrap().as_secs(), 300);
        assert_eq!(parse_duration("1h30m").unwrap().as_secs(), 5400);
        assert_eq!(parse_duration("12").unwrap().as_secs(), 12);
        assert!(parse_duration("-5m").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("5").is_ok());
    }
}

/// How candidates are judged and how long one may take (`tune`, `draft`).
#[derive(Debug, Args)]
pub struct TrialArgs {
    /// Relative difference below which two configurations are called a tie
    #[arg(long, default_value_t = crate::stats::DEFAULT_NOISE, allow_negative_numbers = true)]
    pub noise: f64,

    /// Seed of the candidate order shuffle and the prompt tokens (recorded in the report)
    #[arg(long)]
    pub seed: Option<u64>,

    /// A trial that gives no answer within this time is killed and recorded as timed out
    #[arg(
        long = "trial-timeout",
        default_value = "5m",
        allow_hyphen_values = true,
        value_parser = parse_duration
    )]
    pub trial_timeout: Duration,
}

/// `--workload`: one of the presets' names, listed in `--help`.
pub(crate) fn workload_preset() -> impl clap::builder::TypedValueParser<Value = WorkloadPreset> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(WorkloadPreset::ALL.map(WorkloadPreset::name))
        .map(|s| s.parse().expect("one of the names listed"))
}
