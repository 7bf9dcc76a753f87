//! Explaining a tuning result: the bandwidth roofline of the winner, a diagnosis in the order of what
//! matters most (does it fit, is it bandwidth-bound, dense or sparse, is prefill the delay, is another
//! device faster, which setting mattered), charts, and a Markdown report.
//!
//! Everything is computed from a profile (its figures, leaderboard and roofline record), so `autotune
//! explain PROFILE.toml` can explain any profile, and `autotune tune` shows the same right after a run.
//! [`Explanation`] is one `Serialize` value, rendered as text or as JSON.

#[cfg(test)]
mod backend_tests;
pub mod bandwidth;
pub mod charts;
mod diagnosis;
pub mod markdown;
pub mod outputs;
pub mod roofline;
#[cfg(test)]
mod tests;
mod view;

pub use diagnosis::{Finding, KnobEffect, PlacementPoint, NOTE};
pub use view::{decimal_bytes, offload_devices, RooflineScope, RooflineView};

use profiles::Profile;
use serde::Serialize;

/// Everything `explain` says about a profile.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// Absent for profiles written before the roofline was recorded, when the model file is not at hand.
    pub roofline: Option<RooflineView>,
    /// One finding per topic, most impact first.
    pub findings: Vec<Finding>,
    /// What each knob changed, most first (also in the `settings` finding).
    pub knob_effects: Vec<KnobEffect>,
    /// The best measured figures at each GPU-layer count (the offload cliff).
    pub placements: Vec<PlacementPoint>,
    /// Where a GPU was measured through several backends: the best placement through each, and
    /// the cliff as a series per backend.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<profiles::BackendTrial>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_placements: Vec<PlacementPoint>,
}

impl Explanation {
    pub fn of(profile: &Profile) -> Explanation {
        let roofline = RooflineView::of(profile);
        let knob_effects = diagnosis::knob_effects(profile);
        let placements = diagnosis::placements(profile);
        let findings = diagnosis::findings(profile, roofline.as_ref(), &knob_effects, &placements);
        Explanation {
            roofline,
            findings,
            knob_effects,
            placements,
            backends: profile.backends.clone(),
            backend_placements: diagnosis::backend_placements(profile),
        }
    }

    /// The roofline block (when there is one) and the diagnosis, as printed after a run and by
    /// `autotune explain`.
    pub fn render(&self, profile: &Profile) -> String {
        let mut s = String::new();
        match &self.roofline {
            Some(r) => {
                s.push_str("roofline (what one generated token reads)\n");
                for (label, text) in r.lines(profile.workload.depth > 0) {
                    s.push_str(&format!("  {label:<12}{text}\n"));
                }
            }
            None => s.push_str(
                "roofline    not recorded in this profile (explain the model file to compute it)\n",
            ),
        }
        s.push_str("\ndiagnosis (most impact first)\n");
        s.push_str(&self.render_findings("  ", 12));
        s
    }

    /// One block per finding: the topic, its verdict, and its detail lines indented under it.
    pub fn render_findings(&self, indent: &str, width: usize) -> String {
        let mut s = String::new();
        for f in &self.findings {
            s.push_str(&format!("{indent}{:<width$}{}\n", f.topic.name(), f.text));
            for d in &f.details {
                s.push_str(&format!("{indent}{:<width$}  {d}\n", ""));
            }
        }
        s
    }
}
