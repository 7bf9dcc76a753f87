//! Charts of a profile as SVG files: generation and prompt speed against the number of GPU layers
//! (the offload cliff), and the leaderboard as bars.
//!
//! Drawn with `plotters`' SVG backend alone (no default features): text goes into the SVG as `<text>`
//! elements in a generic `sans-serif` family, so nothing needs fonts or a system font library at
//! build or draw time; the viewer picks the font.

use super::{Explanation, PlacementPoint};
use anyhow::Context as _;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use profiles::Profile;
use std::path::{Path, PathBuf};

const FONT: &str = "sans-serif";
const TG_COLOR: RGBColor = RGBColor(31, 119, 180);
const PP_COLOR: RGBColor = RGBColor(255, 127, 14);
const WINNER_COLOR: RGBColor = RGBColor(44, 160, 44);
const BAR_COLOR: RGBColor = RGBColor(120, 160, 200);
const DEFAULTS_COLOR: RGBColor = RGBColor(150, 150, 150);
const FAILED_COLOR: RGBColor = RGBColor(214, 39, 40);
/// tg and pp of each further backend's series (the first backend's are TG_COLOR and PP_COLOR).
const BACKEND_COLORS: [(RGBColor, RGBColor); 3] = [
    (RGBColor(23, 190, 207), RGBColor(148, 103, 189)),
    (RGBColor(140, 86, 75), RGBColor(227, 119, 194)),
    (RGBColor(188, 189, 34), RGBColor(127, 127, 127)),
];
/// Most leaderboard rows drawn.
const MAX_BARS: usize = 20;

/// A chart that was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Chart {
    pub title: String,
    pub path: PathBuf,
}

/// Writes the charts that have something to show into `dir` as `<stem>-leaderboard.svg` and, when
/// more than one GPU-layer count was measured, `<stem>-gpu-layers.svg`.
pub fn write(
    profile: &Profile,
    explanation: &Explanation,
    dir: &Path,
    stem: &str,
) -> anyhow::Result<Vec<Chart>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut out = Vec::new();
    let measured_counts = explanation
        .placements
        .iter()
        .filter(|p| p.tg_tps.is_some())
        .count();
    // Two backends at one layer count are two points to compare as well.
    if measured_counts > 1 || explanation.backend_placements.len() > 1 {
        let path = dir.join(format!("{stem}-gpu-layers.svg"));
        let series = series(&explanation.placements, &explanation.backend_placements);
        gpu_layers(profile, &explanation.placements, &series, &path)
            .with_context(|| format!("cannot draw {}", path.display()))?;
        out.push(Chart {
            title: "tg and pp against GPU layers".into(),
            path,
        });
    }
    if profile.leaderboard.iter().any(|e| e.figures.is_some()) {
        let path = dir.join(format!("{stem}-leaderboard.svg"));
        leaderboard(profile, &path).with_context(|| format!("cannot draw {}", path.display()))?;
        out.push(Chart {
            title: "leaderboard".into(),
            path,
        });
    }
    Ok(out)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// One line of the GPU-layers chart: its backend (`None`: every measured candidate) and its
/// (layers, tg, pp) points, fewest layers first.
type Series = (Option<String>, Vec<(u32, f64, f64)>);

/// The chart's lines: one per backend where a GPU was measured through several, else one.
fn series(points: &[PlacementPoint], by_backend: &[PlacementPoint]) -> Vec<Series> {
    let ok = |p: &PlacementPoint| Some((p.n_gpu_layers, p.tg_tps?, p.pp_tps?));
    let mut out: Vec<Series> = Vec::new();
    if by_backend.is_empty() {
        out.push((None, points.iter().filter_map(ok).collect()));
    }
    for p in by_backend {
        let Some(point) = ok(p) else { continue };
        match out.iter_mut().find(|s| s.0 == p.backend) {
            Some(s) => s.1.push(point),
            None => out.push((p.backend.clone(), vec![point])),
        }
    }
    for s in &mut out {
        s.1.sort_by_key(|p| p.0);
    }
    out
}

/// tg (left axis) and pp (right axis) of the best candidate at each GPU-layer count, a line each
/// per backend where several drove the GPU; counts where nothing was measured are crosses on the
/// axis; the winner's count and "all layers" are marked.
fn gpu_layers(
    profile: &Profile,
    points: &[PlacementPoint],
    series: &[Series],
    path: &Path,
) -> anyhow::Result<()> {
    let ok: Vec<(u32, f64, f64)> = series.iter().flat_map(|s| s.1.iter().copied()).collect();
    let all_layers = profile.roofline.as_ref().map(|r| r.layers + 1);
    let x_max = points
        .iter()
        .map(|p| p.n_gpu_layers)
        .chain(all_layers)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let tg_max = ok.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.2;
    let pp_max = ok.iter().map(|p| p.2).fold(0.0, f64::max).max(1e-3) * 1.2;

    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let title = format!(
        "{}: speed against layers offloaded",
        profile.model.file_name
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .right_y_label_area_size(70)
        .build_cartesian_2d(-0.5..x_max + 0.5, 0.0..tg_max)
        .map_err(err)?
        .set_secondary_coord(-0.5..x_max + 0.5, 0.0..pp_max);
    chart
        .configure_mesh()
        .x_desc("layers offloaded (-ngl)")
        .y_desc("tg, tokens/s (generation)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    chart
        .configure_secondary_axes()
        .y_desc("pp, tokens/s (prompt)")
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;

    reference_lines(&mut chart, profile, all_layers, tg_max)?;
    draw_series(&mut chart, series)?;
    failed_marks(&mut chart, points)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The leaderboard chart's title: the model and the request it is timed on.
fn leaderboard_title(profile: &Profile) -> String {
    format!(
        "{}: seconds per request (prompt {} + gen {}{})",
        profile.model.file_name,
        profile.workload.n_prompt,
        profile.workload.n_gen,
        if profile.workload.depth > 0 {
            format!(" at depth {}", profile.workload.depth)
        } else {
            String::new()
        }
    )
}

/// A bar's label: its rank (`=N` for a tie) and configuration.
fn bar_label(entry: &profiles::LeaderboardEntry, defaults: Option<&str>) -> String {
    let rank = if entry.tie_with_previous {
        format!("={}", entry.rank)
    } else {
        entry.rank.to_string()
    };
    let mut label = format!("{rank:>3}  {}", entry.candidate.label());
    if let Some(d) = defaults {
        label.push_str(&format!(" ({d})"));
    }
    label
}

/// Each series' tg (primary axis) and pp (secondary axis) lines with their points, in colours of
/// their own, named by backend where there are several.
fn draw_series(chart: &mut LayersChart2, series: &[Series]) -> anyhow::Result<()> {
    for (k, (backend, line)) in series.iter().enumerate() {
        let (tg_color, pp_color) = match k {
            0 => (TG_COLOR, PP_COLOR),
            k => BACKEND_COLORS[(k - 1) % BACKEND_COLORS.len()],
        };
        let through = backend
            .as_ref()
            .map_or_else(String::new, |b| format!(" through {b}"));
        let tg: Vec<(f64, f64)> = line.iter().map(|p| (f64::from(p.0), p.1)).collect();
        let pp: Vec<(f64, f64)> = line.iter().map(|p| (f64::from(p.0), p.2)).collect();
        chart
            .draw_series(LineSeries::new(tg.clone(), tg_color.stroke_width(3)))
            .map_err(err)?
            .label(format!("tg{through} (left axis)"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], tg_color.stroke_width(3))
            });
        chart
            .draw_series(tg.iter().map(|&p| Circle::new(p, 4, tg_color.filled())))
            .map_err(err)?;
        chart
            .draw_secondary_series(LineSeries::new(pp.clone(), pp_color.stroke_width(3)))
            .map_err(err)?
            .label(format!("pp{through} (right axis)"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], pp_color.stroke_width(3))
            });
        chart
            .draw_secondary_series(pp.iter().map(|&p| Circle::new(p, 4, pp_color.filled())))
            .map_err(err)?;
    }
    Ok(())
}

/// The primary axes of the GPU-layers chart.
type LayersChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The GPU-layers chart with its secondary (pp) axis.
type LayersChart2<'a, 'b> = plotters::chart::DualCoordChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<RangedCoordf64, RangedCoordf64>,
    Cartesian2d<RangedCoordf64, RangedCoordf64>,
>;

/// Vertical lines at the winner's layer count and at "all layers".
fn reference_lines(
    chart: &mut LayersChart,
    profile: &Profile,
    all_layers: Option<u32>,
    tg_max: f64,
) -> anyhow::Result<()> {
    let winner = f64::from(profile.winner.n_gpu_layers);
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(winner, 0.0), (winner, tg_max)],
            WINNER_COLOR.stroke_width(2),
        )))
        .map_err(err)?
        .label(format!("winner (ngl={})", profile.winner.n_gpu_layers))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], WINNER_COLOR.stroke_width(2)));
    if let Some(all) = all_layers {
        let all = f64::from(all);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(all, 0.0), (all, tg_max)],
                BLACK.mix(0.4).stroke_width(1),
            )))
            .map_err(err)?
            .label(format!("all layers (ngl={all:.0})"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    Ok(())
}

/// A cross at every layer count where nothing was measured.
fn failed_marks(chart: &mut LayersChart, points: &[PlacementPoint]) -> anyhow::Result<()> {
    let failed: Vec<f64> = points
        .iter()
        .filter(|p| p.tg_tps.is_none())
        .map(|p| f64::from(p.n_gpu_layers))
        .collect();
    if !failed.is_empty() {
        chart
            .draw_series(
                failed
                    .iter()
                    .map(|&x| Cross::new((x, 0.0), 6, FAILED_COLOR.stroke_width(2))),
            )
            .map_err(err)?
            .label("not measured (did not fit, failed or stopped as too slow)")
            .legend(|(x, y)| Cross::new((x + 10, y), 5, FAILED_COLOR.stroke_width(2)));
    }
    Ok(())
}

/// One bar per measured candidate (seconds per request, shorter is faster), best at the top: the
/// winner in green, llama.cpp's defaults in grey; each bar labelled with its tg and pp.
fn leaderboard(profile: &Profile, path: &Path) -> anyhow::Result<()> {
    let rows: Vec<_> = profile
        .leaderboard
        .iter()
        .filter_map(|e| e.figures.as_ref().map(|f| (e, f)))
        .take(MAX_BARS)
        .collect();
    let n = rows.len();
    let x_max = rows
        .iter()
        .map(|r| r.1.score_s)
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.45;
    const LABEL_WIDTH: u32 = 400;
    let height = 110 + 30 * n as u32;
    let root = SVGBackend::new(path, (1150, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(leaderboard_title(profile), (FONT, 18))
        .margin(10)
        .margin_left(LABEL_WIDTH)
        .x_label_area_size(40)
        .build_cartesian_2d(0.0..x_max, 0.0..n as f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("seconds per request (shorter is faster)")
        .label_style((FONT, 13))
        .draw()
        .map_err(err)?;
    let label_style =
        TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (entry, f)) in rows.iter().enumerate() {
        let top = (n - i) as f64;
        let is_winner = entry.candidate == profile.winner;
        let is_defaults = profile.baseline.as_ref() == Some(*f);
        let color = if is_winner {
            WINNER_COLOR
        } else if is_defaults {
            DEFAULTS_COLOR
        } else {
            BAR_COLOR
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, top - 0.85), (f.score_s, top - 0.15)],
                color.filled(),
            )))
            .map_err(err)?;
        let figures = format!(
            "{:.3} s · tg {:.1} · pp {:.1}",
            f.score_s, f.tg_tps, f.pp_tps
        );
        let (end, y) = chart.backend_coord(&(f.score_s, top - 0.5));
        root.draw(&Text::new(figures, (end + 6, y), label_style.clone()))
            .map_err(err)?;
        let tag = match &profile.baseline_placement {
            Some(p) if p.contains("--fit") => "llama.cpp --fit",
            _ => "defaults",
        };
        let label = bar_label(entry, is_defaults.then_some(tag));
        root.draw(&Text::new(label, (10, y), label_style.clone()))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
