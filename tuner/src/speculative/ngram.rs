//! N-gram speculation without a draft model (llama-server's `--spec-type ngram-simple`): the draft is
//! the text that followed the last time the context's last n tokens appeared in that same context
//! (prompt lookup). It costs no model, so it pays wherever text repeats (code edits, an agent's tool
//! calls, summarising a given text) and drafts nothing elsewhere.
//!
//! [`draft`] mirrors llama.cpp's `common_ngram_simple_draft` (`common/ngram-map.cpp`) token for token,
//! so the acceptance measured here is the server's: the history is the prompt and the generated
//! tokens before the last sampled one, the pattern is the last `size_n - 1` of them plus the sampled
//! token, the search runs backwards from just before the current position (position 0 never
//! matches), and the draft is at most `size_m` tokens that followed the match, dropped when fewer
//! than `size_n` are available.

pub use crate::worker::protocol::NgramParams;
use crate::worker::protocol::SpeculateRequest;
use serde::Serialize;

/// The name n-gram speculation's entry carries (llama-server's `--spec-type`).
pub const NGRAM_SIMPLE: &str = "ngram-simple";

/// The server's limit for both sizes (`common/arg.cpp`).
pub const MAX_SIZE: u32 = 1024;

impl NgramParams {
    pub fn label(&self) -> String {
        format!("n {} m {}", self.size_n, self.size_m)
    }
}

/// The n-gram settings to search: every lookup length with every draft length.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NgramGrid {
    pub size_n: Vec<u32>,
    pub size_m: Vec<u32>,
}

impl NgramGrid {
    /// Checks the values (1 to 1024, as the server does) and sorts them; empty lists mean no n-gram
    /// speculation.
    pub fn new(mut size_n: Vec<u32>, mut size_m: Vec<u32>) -> Result<NgramGrid, String> {
        let bad = |v: &[u32]| v.iter().any(|&x| x == 0 || x > MAX_SIZE);
        if bad(&size_n) || bad(&size_m) {
            return Err(format!(
                "--ngram-n and --ngram-m values must be between 1 and {MAX_SIZE}"
            ));
        }
        size_n.sort_unstable();
        size_n.dedup();
        size_m.sort_unstable();
        size_m.dedup();
        Ok(NgramGrid { size_n, size_m })
    }

    pub fn is_empty(&self) -> bool {
        self.size_n.is_empty() || self.size_m.is_empty()
    }

    /// One line per lookup length, draft lengths ascending: the search walks a line and stops
    /// where it slows down. A draft shorter than the lookup never happens (the server drops it).
    pub fn lines(&self) -> Vec<Vec<NgramParams>> {
        self.size_n
            .iter()
            .map(|&size_n| {
                self.size_m
                    .iter()
                    .filter(|&&m| m >= size_n)
                    .map(|&size_m| NgramParams { size_n, size_m })
                    .collect::<Vec<_>>()
            })
            .filter(|l| !l.is_empty())
            .collect()
    }
}

/// The draft after `history` (the tokens in the target's cache) and `sampled` (the last accepted
/// token, not yet decoded): llama.cpp's `common_ngram_simple_draft`.
pub fn draft(p: NgramParams, history: &[i32], sampled: i32) -> Vec<i32> {
    let (n, m) = (p.size_n as usize, p.size_m as usize);
    let len = history.len();
    if n == 0 || len <= n + m + 1 {
        return Vec::new();
    }
    let mut pattern: Vec<i32> = history[len - n + 1..].to_vec();
    pattern.push(sampled);
    // Backwards from the last place a whole n-gram fits before the current one; 0 is "no match".
    let found = (1..len - n)
        .rev()
        .find(|&j| history[j..j + n] == pattern[..]);
    let Some(at) = found else {
        return Vec::new();
    };
    let copy = m.min(len - (at + n));
    if copy < n {
        return Vec::new();
    }
    history[at + n..at + n + copy].to_vec()
}

/// Why a worker request's n-gram settings cannot run, if they cannot.
pub fn request_error(r: &SpeculateRequest) -> Option<String> {
    let p = r.ngram?;
    if r.draft.is_some() || r.follow.is_some() {
        return Some("n-gram speculation runs without a draft model and is never followed".into());
    }
    if p.size_n == 0 || p.size_m == 0 {
        return Some("n-gram sizes must be at least 1".into());
    }
    if p.size_m + 1 > r.context.n_batch {
        return Some(format!(
            "ngram size m {} needs n_batch of at least {}",
            p.size_m,
            p.size_m + 1
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(size_n: u32, size_m: u32) -> NgramParams {
        NgramParams { size_n, size_m }
    }

    #[test]
    fn drafts_what_followed_the_last_occurrence() {
        // history: 1 2 3 4 5 6 7 8 | 9 9 9 9 | 1 2 ; sampled 3: the pattern is [2, 3]
        let h = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9, 1, 2];
        assert_eq!(draft(p(2, 4), &h, 3), [4, 5, 6, 7]);
        // A longer lookup: [1, 2, 3] is found at 1 as well.
        assert_eq!(draft(p(3, 5), &h, 3), [4, 5, 6, 7, 8]);
        // No match: nothing.
        assert!(draft(p(2, 4), &h, 42).is_empty());
    }

    #[test]
    fn the_latest_match_wins_and_the_current_one_is_skipped() {
        // [5, 6] appears at 1 (followed by 7 7) and at 5 (followed by 8 8): the later one drafts.
        let h = [0, 5, 6, 7, 7, 5, 6, 8, 8, 0, 0, 0, 0, 5];
        assert_eq!(draft(p(2, 2), &h, 6), [8, 8]);
    }

    #[test]
    fn mirrors_the_servers_limits() {
        // History must be longer than n + m + 1.
        let h = [0, 1, 2, 3, 1];
        assert!(draft(p(2, 2), &h, 2).is_empty());
        // Position 0 never matches.
        let h = [1, 2, 7, 7, 7, 7, 7, 7, 1];
        assert!(draft(p(2, 2), &h, 2).is_empty());
        // The latest match wins even when it leaves fewer than n tokens: then nothing is drafted.
        let h = [0, 3, 4, 5, 5, 0, 0, 0, 0, 3, 4, 3];
        assert!(draft(p(2, 3), &h, 4).is_empty());
        // ... and at most m tokens are drafted.
        let h = [0, 3, 4, 1, 2, 3, 4, 5, 6, 0, 0, 3];
        assert_eq!(draft(p(2, 3), &h, 4), [5, 6, 0]);
    }

    #[test]
    fn grid_checks_sorts_and_skips_drafts_shorter_than_the_lookup() {
        let g = NgramGrid::new(vec![8, 3, 3], vec![16, 4]).unwrap();
        assert_eq!(g.size_n, [3, 8]);
        assert_eq!(
            g.lines(),
            [vec![p(3, 4), p(3, 16)], vec![p(8, 16)]],
            "m 4 < n 8 is never tried"
        );
        assert!(NgramGrid::new(vec![0], vec![4]).is_err());
        assert!(NgramGrid::new(vec![2], vec![2000]).is_err());
        assert!(NgramGrid::new(vec![], vec![4]).unwrap().is_empty());
    }
}
