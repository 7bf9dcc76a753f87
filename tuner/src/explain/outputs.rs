//! What explaining writes and prints: charts and the Markdown report of a profile, the roofline record
//! a tuning run measures for its winner, and the explanation shown right after `autotune tune`.

use super::{bandwidth, charts, markdown, offload_devices, roofline, Explanation};
use anyhow::Context as _;
use profiles::{Profile, Roofline};
use search_space::gguf::GgufInfo;
use std::path::{Path, PathBuf};

/// What a tuning run was asked to show and write after it saved its profile.
#[derive(Debug, Clone, Default)]
pub struct Asked {
    /// `--plot`: charts beside the saved profile.
    pub plot: bool,
    /// `--export-markdown FILE`.
    pub markdown: Option<PathBuf>,
    /// `--json`: stdout is the report, so the explanation goes to stderr.
    pub json: bool,
}

/// After `autotune tune` saved `profile`: the roofline and diagnosis after the table (on stderr with
/// `--json`, whose stdout is the report), then the charts (`--plot`, beside the profile) and the
/// Markdown report (`--export-markdown`).
/// The profile is saved by then, so a chart or report that cannot be written is a warning.
pub fn after_tune(asked: &Asked, profile: &Profile, profile_path: Option<&Path>) {
    if let Err(e) = show_after_tune(asked, profile, profile_path) {
        eprintln!("autotune: warning: {}", crate::term::error_line(&e));
    }
}

fn show_after_tune(
    asked: &Asked,
    profile: &Profile,
    profile_path: Option<&Path>,
) -> anyhow::Result<()> {
    let explanation = Explanation::of(profile);
    let stem = profile_path
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| profile.model_stem());
    let dir = profile_path
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let written = write(
        profile,
        &explanation,
        asked.plot.then_some(dir.as_path()),
        asked.markdown.as_deref(),
        &stem,
    )?;
    let mut text = format!("\n{}", explanation.render(profile));
    for line in written {
        text.push_str(&line);
        text.push('\n');
    }
    if asked.json {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    Ok(())
}

/// Charts into `plot_dir`, the Markdown report to `markdown` (with charts beside it when no
/// `plot_dir` is given); returns one line per file written.
pub fn write(
    profile: &Profile,
    explanation: &Explanation,
    plot_dir: Option<&Path>,
    markdown: Option<&Path>,
    stem: &str,
) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    let md_dir = markdown.map(|m| {
        m.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()
    });
    let chart_dir = plot_dir.map(Path::to_path_buf).or_else(|| md_dir.clone());
    let written = match &chart_dir {
        Some(dir) => charts::write(profile, explanation, dir, stem)?,
        None => Vec::new(),
    };
    for c in &written {
        lines.push(format!("chart       {} ({})", c.path.display(), c.title));
    }
    if let (Some(file), Some(dir)) = (markdown, md_dir) {
        let text = markdown::render(profile, explanation, &written, &dir);
        profiles::write_atomic(file, &text)
            .with_context(|| format!("cannot write {}", file.display()))?;
        lines.push(format!("report      {}", file.display()));
    }
    Ok(lines)
}

/// The roofline of a run's winner, for the profile: the token's reads from the model header, the
/// CPU's bandwidth and each non-CPU device's (through `rpc`'s servers where those are the devices),
/// measured now (call it after the workers have stopped, on a quiet machine).
pub fn roofline_for_run(info: &GgufInfo, profile: &Profile, rpc: &[String]) -> Roofline {
    let bw = bandwidth::measure_cpu();
    let devices = offload_devices(profile);
    let mut r = roofline::roofline(
        info,
        &profile.winner,
        &profile.workload,
        !devices.is_empty(),
        bw.as_ref(),
    );
    r.device_bandwidth = bandwidth::measure_devices(&devices, rpc);
    r
}
