//! The quality table as text: the weight rows and the KV rows against the reference, each with
//! its divergence figures and whether it passes the gate.

use super::{QualityRow, QualityTable};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use search_space::size::format_size;

pub use profiles::fmt_kld;

impl QualityTable {
    /// The weights table, then the KV table (when KV types were evaluated); `gate`: the KLD gate
    /// rows are checked against, if any.
    pub fn render(&self, gate: Option<f64>) -> String {
        let mut s = format!(
            "reference {} ({}) · {} tokens of evaluation text in chunks of {}\n",
            self.reference.display(),
            self.reference_type,
            self.text_tokens,
            self.chunk
        );
        let gate_cell = |r: &QualityRow| match (gate, r.kld()) {
            (_, None) => r
                .error
                .clone()
                .map(|e| format!("failed: {e}"))
                .unwrap_or_else(|| "failed".into()),
            (Some(g), Some(k)) if k > g => format!("over the gate ({g})"),
            (Some(_), Some(_)) => "passes".into(),
            (None, Some(_)) => {
                if r.cached {
                    "cached".into()
                } else {
                    format!("{:.0} s", r.seconds)
                }
            }
        };
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header([
            "weights",
            "size",
            "KLD mean ± se",
            "KLD p99",
            "top-1",
            "PPL (ref)",
            "status",
        ]);
        for r in &self.weights {
            t.add_row(row(
                &r.file_type,
                if r.size_bytes > 0 {
                    format_size(r.size_bytes)
                } else {
                    "-".into()
                },
                r,
                gate_cell(r),
            ));
        }
        s.push_str(&t.to_string());
        s.push('\n');
        if !self.kv.is_empty() {
            let mut t = Table::new();
            t.load_preset(UTF8_FULL_CONDENSED);
            t.set_header([
                "KV cache",
                "on",
                "KLD mean ± se",
                "KLD p99",
                "top-1",
                "PPL (ref)",
                "status",
            ]);
            for r in &self.kv {
                t.add_row(row(
                    r.kv.as_str(),
                    self.reference_type.clone(),
                    r,
                    gate_cell(r),
                ));
            }
            s.push_str(&t.to_string());
            s.push('\n');
        }
        s
    }
}

fn row(name: &str, second: String, r: &QualityRow, status: String) -> Vec<Cell> {
    let right = |s: String| Cell::new(s).set_alignment(CellAlignment::Right);
    match &r.figures {
        Some(f) => vec![
            Cell::new(name),
            Cell::new(second),
            right(format!("{} ± {}", fmt_kld(f.kld_mean), fmt_kld(f.kld_se))),
            right(fmt_kld(f.kld_p99)),
            right(format!("{:.1}%", f.top1 * 100.0)),
            right(format!("{:.2} ({:.2})", f.ppl, f.ref_ppl)),
            Cell::new(status),
        ],
        None => vec![
            Cell::new(name),
            Cell::new(second),
            right("-".into()),
            right("-".into()),
            right("-".into()),
            right("-".into()),
            Cell::new(status),
        ],
    }
}
