//! A group: the candidates one measurement sets against each other, as a strategy proposes it.

use search_space::Candidate;

/// Candidates to measure against each other, and the axis they vary (for progress and the log).
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub candidates: Vec<Candidate>,
    pub axis: &'static str,
    /// Visited first in the group's first round, in this order, right after the baseline: where
    /// the budget ends within the group, they are the ones measured ([`Engine::promising`]).
    pub promising: Vec<Candidate>,
}

impl Group {
    pub fn new(candidates: Vec<Candidate>, axis: &'static str) -> Self {
        Group {
            candidates,
            axis,
            promising: Vec::new(),
        }
    }
}
