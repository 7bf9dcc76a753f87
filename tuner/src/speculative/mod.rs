//! Speculative decoding with a draft model, tuned by measured acceptance.
//!
//! A small draft model proposes a few tokens, the target model checks them all in one batch and keeps
//! the longest prefix it agrees with plus one token of its own. Whether that pays depends on how often
//! the target agrees (the acceptance rate, which depends on the pair of models and on the text) and on
//! what a batch of k tokens costs the target compared with one token on this machine — so it is
//! measured, never assumed.
//!
//! The parts: [`compat`] decides whether a draft can serve a target at all (the vocabulary check of
//! llama.cpp's speculative decoding), [`discover`] finds candidate drafts beside a target, [`prompts`]
//! is the built-in prompt set, [`serve`] is the worker-side draft-then-verify loop through linked
//! llama.cpp (reading logits with [`logits`]), [`search`] measures draft settings against the target
//! alone and picks the winner, [`verify`] checks that a draft's output is the target alone's (up to
//! near ties of rounding), [`report`] is the report and its table, and [`attach`] adds the result to
//! a tuning profile.

pub use crate::worker::protocol::DraftParams;
pub use crate::worker::protocol::DraftPlacement;
pub mod attach;
pub mod compat;
pub mod discover;
pub mod evaluate;
pub mod logits;
pub mod mtp;
pub mod mtp_search;
pub mod mtp_serve;
pub mod ngram;
pub mod ngram_search;
pub mod prompts;
pub mod report;
pub mod request;
pub mod round;
pub mod search;
pub mod serve;
pub mod together;
pub mod verify;
pub mod workload;

use serde::Serialize;

impl DraftPlacement {
    pub fn label(&self) -> String {
        format!(
            "ngld {} kv {}/{}",
            self.n_gpu_layers,
            self.type_k.as_str(),
            self.type_v.as_str()
        )
    }
}

impl DraftParams {
    pub fn label(&self) -> String {
        format!("max {} min {} p {:.2}", self.n_max, self.n_min, self.p_min)
    }
}

/// The draft settings to search: every n_max with every p_min; n_min only matters when p_min can stop a
/// draft early, so with p_min = 0 only n_min = 0 is tried.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grid {
    pub n_max: Vec<u32>,
    pub n_min: Vec<u32>,
    pub p_min: Vec<f32>,
}

impl Grid {
    /// Checks the values (n_max ≥ 1, p_min in [0, 1]) and sorts them.
    pub fn new(
        mut n_max: Vec<u32>,
        mut n_min: Vec<u32>,
        mut p_min: Vec<f32>,
    ) -> Result<Grid, String> {
        if n_max.is_empty() || n_max.iter().any(|&n| n == 0 || n > 128) {
            return Err("--draft-max values must be between 1 and 128".into());
        }
        if p_min.is_empty() || p_min.iter().any(|p| !(0.0..=1.0).contains(p)) {
            return Err("--draft-p-min values must be between 0 and 1".into());
        }
        if n_min.is_empty() {
            n_min.push(0);
        }
        n_max.sort_unstable();
        n_max.dedup();
        n_min.sort_unstable();
        n_min.dedup();
        p_min.sort_by(f32::total_cmp);
        p_min.dedup();
        Ok(Grid {
            n_max,
            n_min,
            p_min,
        })
    }

    /// Stage one of the search: every n_max and p_min, with the smallest n_min.
    pub fn first_stage(&self) -> Vec<Vec<DraftParams>> {
        // One line per p_min, n_max ascending: the search walks a line and stops where it slows down.
        self.p_min
            .iter()
            .map(|&p_min| {
                self.n_max
                    .iter()
                    .map(|&n_max| DraftParams {
                        n_max,
                        n_min: self.n_min[0],
                        p_min,
                    })
                    .collect()
            })
            .collect()
    }

    /// Stage two: the other n_min values for a setting whose p_min can cut drafts short.
    pub fn n_min_variants(&self, best: DraftParams) -> Vec<DraftParams> {
        if best.p_min <= 0.0 {
            return Vec::new();
        }
        self.n_min
            .iter()
            .filter(|&&m| m != best.n_min && m <= best.n_max)
            .map(|&n_min| DraftParams { n_min, ..best })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_sorts_checks_and_skips_useless_n_min() {
        let g = Grid::new(vec![16, 4, 8, 4], vec![2, 0], vec![0.8, 0.0, 0.5]).unwrap();
        assert_eq!(g.n_max, [4, 8, 16]);
        assert_eq!(g.p_min, [0.0, 0.5, 0.8]);
        let lines = g.first_stage();
        assert_eq!(lines.len(), 3);
        assert!(lines
            .iter()
            .all(|l| l.len() == 3 && l.iter().all(|p| p.n_min == 0)));
        let p0 = DraftParams {
            n_max: 8,
            n_min: 0,
            p_min: 0.0,
        };
        assert!(
            g.n_min_variants(p0).is_empty(),
            "n_min changes nothing when every draft is n_max long"
        );
        let p5 = DraftParams { p_min: 0.5, ..p0 };
        assert_eq!(g.n_min_variants(p5), [DraftParams { n_min: 2, ..p5 }]);
        assert!(Grid::new(vec![0], vec![], vec![0.0]).is_err());
        assert!(Grid::new(vec![4], vec![], vec![1.5]).is_err());
    }
}
