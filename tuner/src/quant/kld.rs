//! The arithmetic of comparing two models' next-token distributions: per position the KL divergence
//! KL(P_ref ‖ P_model) in nats, whether both put the same token on top, and each one's log-probability
//! of the token that really follows (for perplexity). Sums are kept in f64: a vocabulary has up to a
//! few hundred thousand entries, and f32 sums of that many terms lose the small divergences of good
//! quantizations in rounding.

pub use crate::worker::protocol::QualityFigures;

/// What one position contributes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionStats {
    pub kld: f64,
    pub same_top1: bool,
    /// ln P(next token) under the reference and under the model, when the next token is known.
    pub ref_logprob: Option<f64>,
    pub logprob: Option<f64>,
}

/// The largest logit and its index.
fn max_argmax(x: &[f32]) -> (f32, usize) {
    let (mut arg, mut max) = (0usize, f32::NEG_INFINITY);
    for (i, &v) in x.iter().enumerate() {
        if v > max {
            max = v;
            arg = i;
        }
    }
    (max, arg)
}

/// Compares the logits of one position. `next` is the token that follows in the text, if any.
/// Logits of different lengths (vocabularies that differ) compare over the shorter one.
pub fn compare_position(reference: &[f32], model: &[f32], next: Option<i32>) -> PositionStats {
    let n = reference.len().min(model.len());
    let (r, m) = (&reference[..n], &model[..n]);
    let (max_r, top_r) = max_argmax(r);
    let (max_m, top_m) = max_argmax(m);
    // exp(r - max) is needed twice (the normaliser and the probabilities): computed once. The
    // exponentials are f32 (a relative error of 1e-7 moves a divergence by far less than its
    // standard error) and twice as fast; the sums are f64.
    let er: Vec<f32> = r.iter().map(|&v| (v - max_r).exp()).collect();
    let sum_r: f64 = er.iter().map(|&e| f64::from(e)).sum();
    let sum_m: f64 = m.iter().map(|&v| f64::from((v - max_m).exp())).sum();
    let lse_r = f64::from(max_r) + sum_r.ln();
    let lse_m = f64::from(max_m) + sum_m.ln();
    // KL = Σ p (ln p - ln q), with ln p = r - lse_r and ln q = m - lse_m.
    let mut kld = 0.0f64;
    for ((&a, &b), &e) in r.iter().zip(m).zip(&er) {
        if e > 0.0 {
            kld += (f64::from(e) / sum_r) * ((f64::from(a) - lse_r) - (f64::from(b) - lse_m));
        }
    }
    let at = |x: &[f32], lse: f64| {
        next.and_then(|t| x.get(usize::try_from(t).ok()?))
            .map(|&v| f64::from(v) - lse)
    };
    PositionStats {
        // Tiny negative sums are rounding; KL divergence is never negative.
        kld: kld.max(0.0),
        same_top1: top_r == top_m,
        ref_logprob: at(r, lse_r),
        logprob: at(m, lse_m),
    }
}

/// Accumulates positions into [`QualityFigures`].
#[derive(Debug, Default, Clone)]
pub struct Accumulator {
    klds: Vec<f64>,
    same_top1: u64,
    ref_nll: f64,
    nll: f64,
    scored: u64,
}

impl Accumulator {
    pub fn add(&mut self, p: PositionStats) {
        self.klds.push(p.kld);
        self.same_top1 += u64::from(p.same_top1);
        if let (Some(r), Some(m)) = (p.ref_logprob, p.logprob) {
            self.ref_nll -= r;
            self.nll -= m;
            self.scored += 1;
        }
    }

    /// Positions added so far.
    pub fn len(&self) -> usize {
        self.klds.len()
    }

    /// The mean KL divergence of the positions added after the first `from`; none where none was.
    pub fn mean_since(&self, from: usize) -> Option<f64> {
        let new = self.klds.get(from..).filter(|n| !n.is_empty())?;
        Some(new.iter().sum::<f64>() / new.len() as f64)
    }

    pub fn finish(mut self) -> QualityFigures {
        let n = self.klds.len();
        let nf = n.max(1) as f64;
        let mean = self.klds.iter().sum::<f64>() / nf;
        let var = if n > 1 {
            self.klds.iter().map(|k| (k - mean).powi(2)).sum::<f64>() / (nf - 1.0)
        } else {
            0.0
        };
        self.klds.sort_by(f64::total_cmp);
        let quantile = |q: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            self.klds[((q * (n - 1) as f64).round() as usize).min(n - 1)]
        };
        let ppl = |nll: f64| {
            if self.scored > 0 {
                (nll / self.scored as f64).exp()
            } else {
                f64::NAN
            }
        };
        QualityFigures {
            positions: n as u64,
            kld_mean: mean,
            kld_se: (var / nf).sqrt(),
            kld_median: quantile(0.5),
            kld_p99: quantile(0.99),
            kld_p999: quantile(0.999),
            kld_max: self.klds.last().copied().unwrap_or(0.0),
            top1: if n > 0 {
                self.same_top1 as f64 / nf
            } else {
                1.0
            },
            ref_ppl: ppl(self.ref_nll),
            ppl: ppl(self.nll),
        }
    }
}

/// Whether the mean of `window_means` (each window's mean KL divergence over its scored positions)
/// lies on one side of `gate` with 95% confidence, so further windows cannot change the verdict:
/// the windows are the units (positions within one window are correlated), Student's t over at
/// least two of them. A quality evaluation stops there (issue 54: the gate's evaluation sized by
/// the interval, not a fixed count of tokens).
pub fn decided(window_means: &[f64], gate: f64) -> bool {
    let n = window_means.len();
    if n < 2 || !gate.is_finite() {
        return false;
    }
    let mean = window_means.iter().sum::<f64>() / n as f64;
    let var = window_means.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t95(n - 1) * (var / n as f64).sqrt();
    mean + half < gate || mean - half > gate
}

/// Student's t at 97.5% (a two-sided 95% interval) for `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    match df {
        0 => f64::INFINITY,
        1..=10 => TABLE[df - 1],
        11..=30 => 2.2,
        _ => 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn identical_logits_have_zero_divergence() {
        let l = vec![1.0f32, 3.0, -2.0, 0.5];
        let p = compare_position(&l, &l, Some(1));
        assert_eq!(p.kld, 0.0);
        assert!(p.same_top1);
        assert_eq!(p.ref_logprob, p.logprob);
    }

    #[test]
    fn known_divergence() {
        // P = (0.5, 0.5), Q = (0.9, 0.1): KL = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) ≈ 0.5108
        let r = [0.0f32, 0.0];
        let m = [(0.9f32).ln(), (0.1f32).ln()];
        let p = compare_position(&r, &m, None);
        assert!((p.kld - 0.510_825_6).abs() < 1e-5, "{}", p.kld);
        assert!(p.ref_logprob.is_none());
    }

    #[test]
    fn shifted_logits_are_the_same_distribution() {
        let r = [0.1f32, 2.0, -1.0];
        let m = [10.1f32, 12.0, 9.0];
        // Equal up to the f32 rounding of the inputs.
        assert!(compare_position(&r, &m, Some(0)).kld < 1e-6);
    }

    #[test]
    fn accumulator_figures() {
        let mut a = Accumulator::default();
        let l = [0.0f32, 1.0];
        a.add(compare_position(&l, &l, Some(1)));
        a.add(compare_position(&l, &[1.0, 0.0], Some(1)));
        let f = a.finish();
        assert_eq!(f.positions, 2);
        assert_eq!(f.top1, 0.5);
        assert!(f.kld_mean > 0.0 && f.kld_max >= f.kld_median);
        assert!(f.ppl > f.ref_ppl);
    }

    proptest! {
        #[test]
        fn divergence_is_never_negative(
            r in prop::collection::vec(-30.0f32..30.0, 1..64),
            noise in prop::collection::vec(-3.0f32..3.0, 64),
        ) {
            let m: Vec<f32> = r.iter().zip(&noise).map(|(a, b)| a + b).collect();
            let p = compare_position(&r, &m, Some(0));
            prop_assert!(p.kld >= 0.0 && p.kld.is_finite());
            prop_assert_eq!(compare_position(&r, &r, None).kld, 0.0);
        }
    }

    #[test]
    fn a_gate_far_from_consistent_windows_is_decided_and_one_window_never_is() {
        // Two windows near 0.003 against 0.02: decided, passed.
        assert!(decided(&[0.0028, 0.0032], 0.02));
        // Far above: decided, refused.
        assert!(decided(&[0.100, 0.104], 0.02));
        // One window says nothing of the spread.
        assert!(!decided(&[0.001], 0.02));
        // Windows that straddle the gate are not decided, nor two close to it apart.
        assert!(!decided(&[0.005, 0.035], 0.02));
        assert!(!decided(&[0.017, 0.019], 0.02));
        // More windows tighten the interval around the same mean.
        assert!(!decided(&[0.012, 0.016], 0.02));
        assert!(decided(&[0.012, 0.016, 0.013, 0.015, 0.014, 0.014], 0.02));
    }

    #[test]
    fn an_accumulator_gives_the_mean_of_a_window() {
        let mut a = Accumulator::default();
        let at = |kld| PositionStats {
            kld,
            same_top1: true,
            ref_logprob: None,
            logprob: None,
        };
        a.add(at(1.0));
        let from = a.len();
        assert_eq!(a.mean_since(from), None);
        a.add(at(2.0));
        a.add(at(4.0));
        assert_eq!(a.mean_since(from), Some(3.0));
    }
}
