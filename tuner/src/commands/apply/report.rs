//! What `apply --exec` reports: the server it started, the command, and the measured completion
//! against the profile's figures (and its speculation's), as text or `--json`.

use super::speculation::SpeculationCheck;
use super::timings::Timings;
use serde::Serialize;
use std::path::PathBuf;

/// The result of `apply --exec`: what was started, and how fast it generated compared with the profile.
#[derive(Debug, Serialize)]
pub struct Check {
    pub profile: PathBuf,
    pub server: PathBuf,
    /// `llama-server --version`'s version line.
    pub server_version: Option<String>,
    /// The llama.cpp build that measured the profile.
    pub profile_llama: String,
    /// Whether the server's version line names the profile's llama.cpp build.
    pub same_llama_build: bool,
    pub command: Vec<String>,
    pub url: String,
    /// Seconds from start until `/health` answered 200.
    pub ready_s: f64,
    /// The measured (second) completion; the first only warms the server up. For a profile of N
    /// requests at once, N completions sent together, their tokens and rates added up.
    pub completion: Timings,
    /// Completions sent together for the measured one (the profile's `--parallel`).
    pub requests: u32,
    /// The profile's generation speed for this command line: with its speculation when it has one
    /// (measured on prompts of its kinds), else the target alone's.
    pub profile_tg_tps: f64,
    pub profile_pp_tps: f64,
    /// Server generation speed over the profile's.
    pub tg_ratio: f64,
    pub tolerance: f64,
    pub within_tolerance: bool,
    /// The server's drafted and accepted tokens beside the profile's acceptance (a profile with
    /// speculative decoding only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationCheck>,
    /// The profile's quality line (its cache's figures, lossless, or never checked).
    pub quality: String,
    /// The server's greedy output against the f16-cache reference (`--check-only`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agreement: Option<super::agreement::Agreement>,
    /// The options the profile pins where this server's own default differs (`-np 1 (this
    /// llama-server's default: -1, -1 = auto)`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overridden: Vec<String>,
}

fn warn_beyond_tolerance(check: &Check) {
    eprintln!(
            "autotune: warning: llama-server generates at {:.1} t/s, {:.2}× the profile's {:.1} t/s (beyond ±{:.0}%): \
             the machine may be busy, or the server runs differently from the measurement",
            check.completion.predicted_per_second,
            check.tg_ratio,
            check.profile_tg_tps,
            check.tolerance * 100.0
        );
}

pub fn render(c: &Check) -> String {
    let t = &c.completion;
    let verdict = if c.within_tolerance {
        "within"
    } else {
        "beyond"
    };
    let with = c
        .speculation
        .as_ref()
        .map(|s| format!(" with {}", s.spec_type))
        .unwrap_or_default();
    let spec_line = c
        .speculation
        .as_ref()
        .map(SpeculationCheck::line)
        .unwrap_or_default();
    let agreement = (c.agreement.as_ref())
        .map(|a| format!("agreement   {}\n", a.line()))
        .unwrap_or_default();
    let together = match c.requests {
        0 | 1 => String::new(),
        n => format!(" ({n} completions at once, added up)"),
    };
    format!(
        "profile     {}\nserver      {} ({})\ncommand     {}\nready       {} after {:.1} s\n\
         generation  {:.1} t/s from the server{together}, {:.1} t/s in the profile{with}: {:.2}× ({verdict} ±{:.0}%)\n\
         prompt      {:.1} t/s from the server ({} tokens), {:.1} t/s in the profile (not compared)\n{spec_line}\
         quality     {}\n{agreement}",
        c.profile.display(),
        c.server.display(),
        c.server_version.as_deref().unwrap_or("version unknown"),
        profiles::shell_quote(&c.command),
        c.url,
        c.ready_s,
        t.predicted_per_second,
        c.profile_tg_tps,
        c.tg_ratio,
        c.tolerance * 100.0,
        t.prompt_per_second,
        t.prompt_n,
        c.profile_pp_tps,
        c.quality,
    )
}

/// Prints the check on stdout (`--json` or text), then its warnings on stderr.
pub fn print(check: &Check, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(check)?);
    } else {
        print!("{}", render(check));
    }
    if !check.within_tolerance {
        warn_beyond_tolerance(check);
    }
    if let Some(w) = check
        .speculation
        .as_ref()
        .and_then(SpeculationCheck::warning)
    {
        eprintln!("autotune: warning: {w}");
    }
    Ok(())
}
