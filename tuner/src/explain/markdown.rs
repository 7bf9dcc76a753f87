//! The Markdown report of a profile (`--export-markdown FILE`): the winner and its server command,
//! the diagnosis, the roofline, the leaderboard, and links to the charts.

use super::charts::Chart;
use super::Explanation;
use profiles::Profile;
use search_space::size::format_size;
use std::path::Path;

/// The report; chart links are relative to `dir` (the report's folder) when the charts are inside it.
pub fn render(
    profile: &Profile,
    explanation: &Explanation,
    charts: &[Chart],
    dir: &Path,
) -> String {
    let mut s = winner(profile);
    s.push_str(&diagnosis(profile, explanation));
    s.push_str(&leaderboard(profile));
    if !charts.is_empty() {
        s.push_str("\n## Charts\n\n");
        for c in charts {
            let link = c.path.strip_prefix(dir).unwrap_or(&c.path);
            let link = link.to_string_lossy().replace(' ', "%20");
            s.push_str(&format!("![{}]({link})\n\n", c.title));
        }
    }
    s
}

/// The title, the machine and workload, the winner against the defaults and its server command.
fn winner(profile: &Profile) -> String {
    let mut s = String::new();
    let w = &profile.workload;
    s.push_str(&format!(
        "# {} on {}\n\n",
        profile.model.file_name,
        cell(&profile.machine.hostname)
    ));
    s.push_str(&format!(
        "{} ({} cores / {} CPUs, {} RAM), llama.cpp {}{}. Workload `{}`: context {}, prompt {}, generation {}{}.\n\n",
        profile.machine.cpu,
        profile.machine.physical_cores,
        profile.machine.logical_cpus,
        format_size(profile.machine.ram_bytes),
        profile.llama.version,
        profile.llama.cpu_variant.as_ref().map(|v| format!(" ({v})")).unwrap_or_default(),
        w.name,
        w.n_ctx,
        w.n_prompt,
        w.n_gen,
        if w.depth > 0 { format!(", depth {}", w.depth) } else { String::new() }
    ));
    let f = &profile.figures;
    s.push_str(&format!(
        "**Winner** `{}`: pp {:.1} t/s, tg {:.1} t/s, {:.3} s per request",
        profile.winner.label(),
        f.pp_tps,
        f.tg_tps,
        f.score_s
    ));
    if let Some(b) = profile
        .baseline
        .as_ref()
        .filter(|b| b.tg_tps > 0.0 && b.score_s > 0.0)
    {
        s.push_str(&format!(
            " ({}: tg {:.1} t/s, {:.3} s per request; {:+.1}% tg{})",
            profile
                .baseline_placement
                .as_deref()
                .unwrap_or("llama.cpp's defaults"),
            b.tg_tps,
            b.score_s,
            (f.tg_tps / b.tg_tps - 1.0) * 100.0,
            profile
                .versus_defaults
                .as_ref()
                .map(verdict)
                .unwrap_or_default()
        ));
    }
    s.push_str(".\n\n```sh\nllama-server ");
    s.push_str(&profiles::shell_quote(&profile.server_args));
    s.push_str("\n```\n");
    s
}

/// The run's verdict on the request rate, after the generation speeds' difference.
fn verdict(v: &profiles::VersusDefaults) -> String {
    let pct = |x: f64| format!("{:+.1}%", x * 100.0);
    let judged = match v.verdict {
        profiles::Judged::Same => return String::new(),
        profiles::Judged::Tie => ": a tie within",
        profiles::Judged::Faster | profiles::Judged::Slower => ", beyond",
    };
    format!(
        "; requests/s {} (95% CI [{}, {}]){judged} the ±{:.0}% noise",
        pct(v.ratio),
        pct(v.ci[0]),
        pct(v.ci[1]),
        v.noise * 100.0
    )
}

/// The findings, then the roofline.
fn diagnosis(profile: &Profile, explanation: &Explanation) -> String {
    let mut s = String::from("\n## Diagnosis\n\n");
    let w = &profile.workload;
    for finding in &explanation.findings {
        s.push_str(&format!(
            "- **{}**: {}\n",
            finding.topic.name(),
            finding.text
        ));
        for d in &finding.details {
            match d.strip_prefix(super::NOTE) {
                Some(note) => s.push_str(&format!("    - {note}\n")),
                None => s.push_str(&format!("  - {d}\n")),
            }
        }
    }
    s.push_str("\n## Roofline\n\n");
    match &explanation.roofline {
        Some(r) => {
            for (label, text) in r.lines(w.depth > 0) {
                s.push_str(&format!("- **{label}**: {text}\n"));
            }
        }
        None => s.push_str("Not recorded in this profile.\n"),
    }
    s
}

/// The leaderboard as a Markdown table.
fn leaderboard(profile: &Profile) -> String {
    let mut s = String::new();
    s.push_str("\n## Leaderboard\n\n");
    let depth = profile.workload.depth > 0;
    s.push_str(if depth {
        "| # | configuration | pp t/s | tg t/s | pp@depth t/s | tg@depth t/s | s/request | memory | n | status |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    } else {
        "| # | configuration | pp t/s | tg t/s | s/request | memory | n | status |\n|---:|---|---:|---:|---:|---:|---:|---|\n"
    });
    for e in &profile.leaderboard {
        let row = leaderboard_row(profile, e, depth);
        s.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    s
}

/// One row: rank, configuration (the winner and the defaults marked), figures or why not.
fn leaderboard_row(profile: &Profile, e: &profiles::LeaderboardEntry, depth: bool) -> Vec<String> {
    let rank = match (e.rank, e.tie_with_previous) {
        (0, _) => "-".to_string(),
        (r, true) => format!("={r}"),
        (r, false) => r.to_string(),
    };
    let mut label = format!("`{}`", e.candidate.label());
    if e.candidate == profile.winner {
        label.push_str(" **winner**");
    } else if e.figures.is_some() && e.figures.as_ref() == profile.baseline.as_ref() {
        label.push_str(&format!(
            " ({})",
            profile
                .baseline_placement
                .as_deref()
                .unwrap_or("llama.cpp defaults")
        ));
    }
    match &e.figures {
        Some(f) => {
            let mut cols = vec![
                rank,
                label,
                format!("{:.1}", f.pp_tps),
                format!("{:.1}", f.tg_tps),
            ];
            if depth {
                for v in [f.pp_depth_tps, f.tg_depth_tps] {
                    cols.push(v.map_or("-".into(), |v| format!("{v:.1}")));
                }
            }
            let mem = if f.mem_bytes > 0 {
                format_size(f.mem_bytes)
            } else {
                "-".into()
            };
            cols.extend([
                format!("{:.3}", f.score_s),
                mem,
                f.repetitions.to_string(),
                cell(&e.status),
            ]);
            cols
        }
        None => {
            let mut cols = vec![rank, label];
            cols.extend(std::iter::repeat_n(
                "-".to_string(),
                if depth { 7 } else { 5 },
            ));
            cols.push(cell(&e.status));
            cols
        }
    }
}

/// Text safe inside a table cell: no pipes, no line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}
