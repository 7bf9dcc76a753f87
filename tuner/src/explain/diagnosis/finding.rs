//! What every finding is made of (its topic, its line and details) and the readings of a profile
//! the findings share: the measured leaderboard entries, seconds in words, the offload cliff's
//! points.

use profiles::{LeaderboardEntry, Profile};
use serde::Serialize;

/// The leaderboard's measured entries with their figures.
pub(super) fn measured(
    profile: &Profile,
) -> impl Iterator<Item = (&LeaderboardEntry, &profiles::Figures)> {
    profile
        .leaderboard
        .iter()
        .filter_map(|e| e.figures.as_ref().map(|f| (e, f)))
}

/// What a finding is about; the order of the variants is the order they are shown in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Topic {
    Fit,
    Quality,
    Bandwidth,
    Context,
    Model,
    Prefill,
    Devices,
    Backends,
    Links,
    Settings,
}

impl Topic {
    pub fn name(self) -> &'static str {
        match self {
            Topic::Fit => "fit",
            Topic::Quality => "quality",
            Topic::Bandwidth => "bandwidth",
            Topic::Context => "context",
            Topic::Model => "model",
            Topic::Prefill => "prefill",
            Topic::Devices => "devices",
            Topic::Backends => "backends",
            Topic::Links => "links",
            Topic::Settings => "settings",
        }
    }
}

/// The best measured candidate at one GPU-layer count (or why none was measured there).
#[derive(Debug, Clone, Serialize)]
pub struct PlacementPoint {
    pub n_gpu_layers: u32,
    pub pp_tps: Option<f64>,
    pub tg_tps: Option<f64>,
    pub score_s: Option<f64>,
    /// `ok`, or the status of the first candidate at this count when none was measured.
    pub status: String,
    /// The backend the GPU ran through, in a series per backend ([`backend_placements`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// One line of the diagnosis, with optional detail lines.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub topic: Topic,
    pub text: String,
    /// A detail that starts with [`NOTE`] is a note on the detail before it, shown under it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

/// What a note on the detail before it starts with: the text shows it indented under that detail
/// (these spaces), the Markdown report as a list item nested in that detail's.
pub const NOTE: &str = "  ";

/// A finding without detail lines.
pub(super) fn finding(topic: Topic, text: String) -> Finding {
    Finding {
        topic,
        text,
        details: Vec::new(),
    }
}

/// Seconds with a precision that suits them.
pub(super) fn secs(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.3} s")
    } else {
        format!("{s:.1} s")
    }
}
