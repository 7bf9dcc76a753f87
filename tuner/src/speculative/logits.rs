//! Reading next-token logits: the target's greedy choice with the tokens that came next ([`Choice`],
//! what the output check compares), and the draft's top token with its probability (what p_min is
//! compared with).

pub use crate::worker::protocol::Choice;

/// How many of the target's best tokens are kept at each generated token.
pub const TOP_K: usize = 8;

impl Choice {
    /// The target's (greedy) choice.
    pub fn token(&self) -> i32 {
        self.top.first().map_or(-1, |t| t.0)
    }

    /// The choice's logit.
    pub fn logit(&self) -> f32 {
        self.top.first().map_or(f32::NAN, |t| t.1)
    }

    /// This position's logit for `token`, when it is known (among the best, or the one followed).
    pub fn logit_of(&self, token: i32, followed: Option<i32>) -> Option<f32> {
        self.top
            .iter()
            .find(|t| t.0 == token)
            .map(|t| t.1)
            .or(self.followed_logit.filter(|_| followed == Some(token)))
    }

    /// The lowest logit kept: a token not among `top` has at most this one.
    pub fn floor(&self) -> f32 {
        self.top.last().map_or(f32::NAN, |t| t.1)
    }
}

/// The greedy choice (the first of equal logits, as llama.cpp's greedy sampler) and the next best,
/// [`TOP_K`] in all.
pub fn choice(logits: &[f32]) -> Choice {
    let mut top: [(f32, usize); TOP_K] = [(f32::NEG_INFINITY, usize::MAX); TOP_K];
    for (i, &v) in logits.iter().enumerate() {
        if v > top[TOP_K - 1].0 {
            let mut j = TOP_K - 1;
            // Strictly less: an earlier token of an equal logit stays ahead.
            while j > 0 && top[j - 1].0 < v {
                top[j] = top[j - 1];
                j -= 1;
            }
            top[j] = (v, i);
        }
    }
    Choice {
        top: top
            .iter()
            .filter(|t| t.1 != usize::MAX)
            .map(|&(v, i)| (i as i32, v))
            .collect(),
        followed_logit: None,
    }
}

/// The top token and its probability under a softmax over the 10 best logits (llama-server's draft
/// sampler is top-k 10, and p_min is compared with that probability).
pub fn top_with_probability(logits: &[f32]) -> (i32, f32) {
    const K: usize = 10;
    let mut top: [(f32, usize); K] = [(f32::NEG_INFINITY, 0); K];
    for (i, &v) in logits.iter().enumerate() {
        if v > top[K - 1].0 {
            let mut j = K - 1;
            while j > 0 && top[j - 1].0 < v {
                top[j] = top[j - 1];
                j -= 1;
            }
            top[j] = (v, i);
        }
    }
    let max = top[0].0;
    let sum: f32 = top
        .iter()
        .filter(|(v, _)| v.is_finite())
        .map(|(v, _)| (v - max).exp())
        .sum();
    (top[0].1 as i32, if sum > 0.0 { 1.0 / sum } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_probability_is_over_the_ten_best() {
        let mut logits = vec![-100.0f32; 50];
        logits[7] = 2.0;
        logits[3] = 2.0f32 - 2.0f32.ln(); // half as likely as token 7
        let (t, p) = top_with_probability(&logits);
        assert_eq!(t, 7);
        assert!((p - 2.0 / 3.0).abs() < 1e-3, "{p}");
        // Eleven equal logits: only ten count.
        let flat = vec![1.0f32; 11];
        assert!((top_with_probability(&flat).1 - 0.1).abs() < 1e-6);
    }

    #[test]
    fn a_choice_is_the_greedy_token_then_the_next_best() {
        let c = choice(&[0.0, 3.0, 1.0, 2.5]);
        assert_eq!(c.token(), 1);
        assert_eq!(c.top, [(1, 3.0), (3, 2.5), (2, 1.0), (0, 0.0)]);
        assert_eq!(c.logit_of(2, None), Some(1.0));
        assert_eq!(c.floor(), 0.0);
        // Equal logits: the first is the choice, as llama.cpp's greedy sampler picks it.
        let tie = choice(&[1.0, 4.0, 4.0]);
        assert_eq!((tie.top[0].0, tie.top[1].0), (1, 2));
        // Only TOP_K are kept; a followed token outside them is known by its own logit.
        let mut many = choice(&(0..20).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(many.top.len(), TOP_K);
        assert_eq!((many.token(), many.logit()), (19, 19.0));
        assert_eq!(many.logit_of(3, Some(3)), None);
        many.followed_logit = Some(3.0);
        assert_eq!(many.logit_of(3, Some(3)), Some(3.0));
        assert_eq!(many.logit_of(3, None), None);
    }
}
