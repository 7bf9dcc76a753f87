//! Statistics for noisy throughput figures: when to stop repeating a run, and which configuration is faster.
//!
//! Every figure here is a rate (tokens per second), so **higher is better**. The shared machine this runs on
//! is noisy in ways that are neither normal nor stationary: a neighbour's job steals a core for a few runs,
//! clocks ramp up and down, caches warm. So the module leans on the median and on distribution-free methods
//! (order statistics, the bootstrap) rather than on mean ± t·σ, and it *reports* outliers (hyperfine's
//! modified z-score) instead of silently dropping them.
//!
//! The two knobs, and what they trade:
//!
//! * `noise` (default [`DEFAULT_NOISE`], 2 %) is the smallest relative difference we are willing to call real.
//!   Smaller values let the tuner pick up small wins, but each candidate needs more repetitions before its
//!   confidence interval is tight enough ([`enough`]), and drift that the interleaving did not cancel is more
//!   likely to be mistaken for an effect. Larger values make runs shorter and verdicts safer, but gains below
//!   the threshold are reported as ties (and then ties are broken toward less memory / simpler settings).
//! * `confidence` (default [`DEFAULT_CONFIDENCE`], 95 %) is the coverage of every interval. Higher confidence
//!   means wider intervals: fewer false "faster" verdicts, more ties, and more runs before [`enough`] is
//!   satisfied. Small samples cannot reach high confidence at all with order statistics; see
//!   [`min_sample_size`].
//!
//! Randomness (bootstrap resampling, run order) always comes from a caller-supplied seed so a run can be
//! recorded and reproduced. [`StdRng`] is used; its stream is stable for a given `rand` version, which
//! `Cargo.lock` pins.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Default relative noise threshold: differences smaller than 2 % are ties. See the module docs for the trade-off.
pub const DEFAULT_NOISE: f64 = 0.02;
/// Default confidence level of every interval. See the module docs for the trade-off.
pub const DEFAULT_CONFIDENCE: f64 = 0.95;
/// Number of bootstrap resamples used by [`compare`] and [`compare_paired`]. 2000 keeps the Monte-Carlo error
/// of a 95 % percentile bound well under the width of the interval while costing microseconds for samples of
/// the size a tuner collects.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;
/// Modified z-score above which a measurement is reported as an outlier (Iglewicz & Hoaglin; hyperfine).
pub const OUTLIER_THRESHOLD: f64 = 3.5;
/// Scales the raw MAD so it estimates σ for normal data (1 / Φ⁻¹(3/4)).
const MAD_SCALE: f64 = 1.4826;
/// Φ⁻¹(3/4), the constant of the modified z-score.
const MODIFIED_Z_SCALE: f64 = 0.6745;

/// Why a set of measurements cannot be used as a [`Sample`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("need at least 2 measurements, got {n}; repeat the run before comparing it")]
    TooFew { n: usize },
    #[error("measurement {index} is {value}, not a finite number; check how the rate was computed (a zero duration?)")]
    NotFinite { index: usize, value: f64 },
    #[error("measurement {index} is negative ({value}); a rate in tokens per second cannot be below zero")]
    Negative { index: usize, value: f64 },
    #[error("paired measurements need as many values for a as for b, got {a} and {b}; drop the unpaired run")]
    LengthMismatch { a: usize, b: usize },
}

/// Checks the invariants of a [`Sample`] without building one.
fn validate(values: &[f64]) -> Result<(), SampleError> {
    if values.len() < 2 {
        return Err(SampleError::TooFew { n: values.len() });
    }
    for (index, &value) in values.iter().enumerate() {
        if !value.is_finite() {
            return Err(SampleError::NotFinite { index, value });
        }
        if value < 0.0 {
            return Err(SampleError::Negative { index, value });
        }
    }
    Ok(())
}

/// A set of at least two finite, non-negative measurements (tokens per second) of one configuration.
///
/// The measurements are kept in the order they were taken, so [`Outlier::index`] points at the run that
/// misbehaved.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    values: Vec<f64>,
    sorted: Vec<f64>,
}

/// A measurement whose modified z-score exceeds [`OUTLIER_THRESHOLD`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outlier {
    /// Position of the measurement in the order it was taken.
    pub index: usize,
    pub value: f64,
    /// Modified z-score, `0.6745 · (value − median) / MAD`; negative for slow runs.
    pub z: f64,
}

/// The figures a report shows for one sample. `ci_low..ci_high` is the [`DEFAULT_CONFIDENCE`] interval of the
/// median from [`Sample::median_ci`]; `outliers` counts [`Sample::outliers`] (reported, never removed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub sd: f64,
    pub min: f64,
    pub max: f64,
    /// Median absolute deviation scaled to estimate σ ([`Sample::mad`]): a spread outliers cannot inflate.
    pub mad: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// Half the interval's width over the median ([`Sample::relative_ci_halfwidth`]; 0.01 = ±1 %).
    pub ci_halfwidth: f64,
    pub outliers: u32,
}

impl Sample {
    /// Validates the measurements: at least 2, none NaN or infinite, none negative.
    pub fn new(values: Vec<f64>) -> Result<Sample, SampleError> {
        validate(&values)?;
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        Ok(Sample { values, sorted })
    }

    /// The measurements in the order they were taken.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    pub fn n(&self) -> usize {
        self.values.len()
    }

    pub fn median(&self) -> f64 {
        median_of_sorted(&self.sorted)
    }

    /// Arithmetic mean (computed incrementally, so it cannot overflow for finite input).
    pub fn mean(&self) -> f64 {
        self.welford().0
    }

    /// Sample standard deviation (divides by n − 1).
    pub fn sd(&self) -> f64 {
        let (_, m2) = self.welford();
        (m2 / (self.n() - 1) as f64).sqrt()
    }

    pub fn min(&self) -> f64 {
        self.sorted[0]
    }

    pub fn max(&self) -> f64 {
        self.sorted[self.sorted.len() - 1]
    }

    /// Median absolute deviation, scaled by 1.4826 so it estimates σ for normal data.
    pub fn mad(&self) -> f64 {
        MAD_SCALE * self.raw_mad()
    }

    /// Measurements whose modified z-score `0.6745 · (x − median) / MAD` (raw, unscaled MAD) exceeds
    /// [`OUTLIER_THRESHOLD`] in absolute value. When the MAD is 0 (more than half the runs identical) the
    /// score is undefined and nothing is flagged. These are for warning the user, as hyperfine does; the
    /// statistics here are median-based and need no outlier removal.
    pub fn outliers(&self) -> Vec<Outlier> {
        let median = self.median();
        let mad = self.raw_mad();
        if mad == 0.0 {
            return Vec::new();
        }
        self.values
            .iter()
            .enumerate()
            .map(|(index, &value)| Outlier {
                index,
                value,
                z: MODIFIED_Z_SCALE * (value - median) / mad,
            })
            .filter(|o| o.z.abs() > OUTLIER_THRESHOLD)
            .collect()
    }

    /// Distribution-free confidence interval of the median, `(low, high)`.
    ///
    /// For sorted measurements x₍₁₎ ≤ … ≤ x₍ₙ₎ the interval [x₍ₖ₎, x₍ₙ₋ₖ₊₁₎] covers the true median with
    /// probability 1 − 2·P(B ≤ k − 1), B ~ Binomial(n, ½), whatever the distribution. We take the largest k
    /// whose coverage is still at least `confidence`, so the interval is exact-or-conservative.
    ///
    /// **Small n:** when even [min, max] covers less than `confidence` (n < [`min_sample_size`], i.e. n < 6 at
    /// 95 %), we return (min, max). A bootstrap was rejected for this case: with a handful of points the
    /// bootstrap distribution of the median is a few atoms at the sample values, and its percentile interval
    /// is *narrower* than (min, max) while claiming more coverage, which would let a noisy candidate look
    /// settled. (min, max) is the widest interval the data supports; [`enough`] refuses to stop at such n.
    ///
    /// # Panics
    /// If `confidence` is not strictly between 0 and 1.
    pub fn median_ci(&self, confidence: f64) -> (f64, f64) {
        assert_confidence(confidence);
        let n = self.n();
        match order_statistic_rank(n, confidence) {
            Some(k) => (self.sorted[k - 1], self.sorted[n - k]),
            None => (self.min(), self.max()),
        }
    }

    /// Half the width of [`Sample::median_ci`] divided by the median (0.01 = ±1 %). A zero median gives 0
    /// when the interval is a point and infinity otherwise.
    ///
    /// # Panics
    /// If `confidence` is not strictly between 0 and 1.
    pub fn relative_ci_halfwidth(&self, confidence: f64) -> f64 {
        let (low, high) = self.median_ci(confidence);
        let half = (high - low) / 2.0;
        let median = self.median();
        if median == 0.0 {
            return if half == 0.0 { 0.0 } else { f64::INFINITY };
        }
        half / median
    }

    /// The figures a report shows, with the median's interval at [`DEFAULT_CONFIDENCE`].
    pub fn summary(&self) -> Summary {
        let (ci_low, ci_high) = self.median_ci(DEFAULT_CONFIDENCE);
        Summary {
            n: self.n(),
            median: self.median(),
            mean: self.mean(),
            sd: self.sd(),
            min: self.min(),
            max: self.max(),
            mad: self.mad(),
            ci_low,
            ci_high,
            ci_halfwidth: self.relative_ci_halfwidth(DEFAULT_CONFIDENCE),
            outliers: u32::try_from(self.outliers().len()).unwrap_or(u32::MAX),
        }
    }

    /// (mean, sum of squared deviations) by Welford's method, which stays finite where a naive sum overflows.
    fn welford(&self) -> (f64, f64) {
        let (mut mean, mut m2) = (0.0_f64, 0.0_f64);
        for (i, &x) in self.values.iter().enumerate() {
            let delta = x - mean;
            mean += delta / (i + 1) as f64;
            m2 += delta * (x - mean);
        }
        (mean, m2)
    }

    fn raw_mad(&self) -> f64 {
        let median = self.median();
        let mut deviations: Vec<f64> = self.sorted.iter().map(|x| (x - median).abs()).collect();
        deviations.sort_by(f64::total_cmp);
        median_of_sorted(&deviations)
    }
}

/// Median of an already sorted, non-empty slice; the mean of the two middle values for even length.
fn median_of_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        sorted[n / 2 - 1].midpoint(sorted[n / 2])
    }
}

/// The largest k (1-based) such that [x₍ₖ₎, x₍ₙ₋ₖ₊₁₎] covers the median with probability ≥ `confidence`, or
/// `None` when even k = 1 falls short. Binomial(n, ½) probabilities are built up in log space so large n does
/// not underflow 0.5ⁿ.
fn order_statistic_rank(n: usize, confidence: f64) -> Option<usize> {
    let alpha = 1.0 - confidence;
    let mut log_pmf = n as f64 * 0.5_f64.ln();
    let mut cdf = 0.0;
    let mut rank = None;
    for j in 0..n {
        cdf += log_pmf.exp();
        if 2.0 * cdf > alpha {
            break;
        }
        rank = Some(j + 1);
        log_pmf += ((n - j) as f64 / (j + 1) as f64).ln();
    }
    rank
}

/// The fewest measurements for which [`Sample::median_ci`] can reach `confidence` (6 at 95 %, 8 at 99 %);
/// below it the interval is just (min, max) and covers less than asked. Use it as the minimum run count.
///
/// # Panics
/// If `confidence` is not strictly between 0 and 1.
pub fn min_sample_size(confidence: f64) -> usize {
    assert_confidence(confidence);
    (2..)
        .find(|&n| order_statistic_rank(n, confidence).is_some())
        .expect("coverage of [min, max] tends to 1")
}

/// Stopping rule: true once the [`DEFAULT_CONFIDENCE`] interval of the median lies within ±`noise`/2 of the
/// median, i.e. `low ≥ median·(1 − noise/2)` and `high ≤ median·(1 + noise/2)`.
///
/// Half the noise threshold leaves room for the other candidate's interval: two samples that each satisfy it
/// can only be told apart when their medians differ by about `noise`, which is what [`compare`] asks. The
/// rule is never satisfied below [`min_sample_size`] runs (6), because the interval would not have the
/// stated coverage. The caller enforces the time cap; a sample that never gets tight is a noisy candidate.
///
/// # Panics
/// If `noise` is negative or not finite.
pub fn enough(sample: &Sample, noise: f64) -> bool {
    assert_noise(noise);
    if sample.n() < min_sample_size(DEFAULT_CONFIDENCE) {
        return false;
    }
    let (low, high) = sample.median_ci(DEFAULT_CONFIDENCE);
    let median = sample.median();
    low >= median * (1.0 - noise / 2.0) && high <= median * (1.0 + noise / 2.0)
}

/// Outcome of comparing a against b. Higher rates are better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// a is faster than b by more than the noise threshold, with the requested confidence.
    Faster,
    /// a is slower than b by more than the noise threshold, with the requested confidence.
    Slower,
    /// No difference larger than the noise threshold was detected (criterion's "no change detected").
    Tie,
}

impl Verdict {
    /// The verdict with a and b swapped.
    #[cfg(test)]
    pub fn reversed(self) -> Verdict {
        match self {
            Verdict::Faster => Verdict::Slower,
            Verdict::Slower => Verdict::Faster,
            Verdict::Tie => Verdict::Tie,
        }
    }
}

/// Relative difference of a over b and its confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Point estimate of the relative difference r = median(a)/median(b) − 1 (0.05: a is 5 % faster).
    pub ratio: f64,
    /// Lower bound of the bootstrap interval of r.
    pub ci_low: f64,
    /// Upper bound of the bootstrap interval of r.
    pub ci_high: f64,
    pub verdict: Verdict,
}

/// Decides whether configuration a is faster than b from independent samples (criterion-style).
///
/// The relative difference r = median(a)/median(b) − 1 gets a percentile interval from a seeded bootstrap:
/// each sample is resampled with replacement [`BOOTSTRAP_RESAMPLES`] times and the ratio of the resampled
/// medians is recorded. The verdict is
///
/// * [`Verdict::Faster`] when the whole interval lies above +`noise`,
/// * [`Verdict::Slower`] when the whole interval says b is faster than a by more than `noise`, i.e. it lies
///   below 1/(1 + noise) − 1 (≈ −noise: −1.96 % for noise = 2 %). Using the mirror image of the "faster" test
///   rather than exactly −noise makes `compare(b, a)` the exact mirror of `compare(a, b)`;
/// * [`Verdict::Tie`] otherwise.
///
/// `noise` (default [`DEFAULT_NOISE`]) and `confidence` (default [`DEFAULT_CONFIDENCE`]) trade sensitivity
/// for false alarms: a smaller threshold or lower confidence detects smaller gains but calls more noise a
/// win; see the module docs. A noise threshold below the run-to-run drift of the machine is meaningless
/// unless the runs are interleaved; for interleaved runs prefer [`compare_paired`].
///
/// Deterministic given `seed` and the data: the seed is mixed with a fingerprint of each sample's values, so
/// each sample has its own resampling stream. That is what makes `compare(a, a)` an exact [`Verdict::Tie`]
/// and `compare(b, a)` the exact mirror of `compare(a, b)` for the same seed. The bootstrap is computed on
/// log ratios (percentile intervals are invariant under monotone maps), which keeps the mirroring exact in
/// floating point.
///
/// # Panics
/// If `noise` is negative or not finite, or `confidence` is not strictly between 0 and 1.
pub fn compare(a: &Sample, b: &Sample, noise: f64, confidence: f64, seed: u64) -> Comparison {
    assert_noise(noise);
    assert_confidence(confidence);
    let point = log_ratio(a.median(), b.median());
    let medians_a = bootstrap_medians(&a.sorted, stream_seed(seed, &a.sorted));
    let medians_b = bootstrap_medians(&b.sorted, stream_seed(seed, &b.sorted));
    let distribution = medians_a
        .iter()
        .zip(&medians_b)
        .map(|(&x, &y)| log_ratio(x, y))
        .collect();
    judge(point, distribution, noise, confidence)
}

/// Decides whether a is faster than b from interleaved, paired runs: `a[i]` and `b[i]` were measured back to
/// back, so whatever the machine was doing at the time (clock ramp, a neighbour's load, thermal drift)
/// affected both. Comparing within pairs cancels that drift, which [`compare`] would count as noise.
///
/// The relative difference is r = median over pairs of aᵢ/bᵢ, minus 1 (for an even number of pairs the two
/// middle ratios are combined by their geometric mean, which keeps the a/b and b/a views exact mirrors). Its
/// interval comes from a seeded bootstrap over pair indices, and the verdict follows the same rule as
/// [`compare`] (see there for `noise` and `confidence`). `compare_paired(a, a, ..)` is always a tie.
///
/// # Errors
/// When the slices differ in length, or either fails the checks of [`Sample::new`].
///
/// # Panics
/// If `noise` is negative or not finite, or `confidence` is not strictly between 0 and 1.
pub fn compare_paired(
    a: &[f64],
    b: &[f64],
    noise: f64,
    confidence: f64,
    seed: u64,
) -> Result<Comparison, SampleError> {
    assert_noise(noise);
    assert_confidence(confidence);
    if a.len() != b.len() {
        return Err(SampleError::LengthMismatch {
            a: a.len(),
            b: b.len(),
        });
    }
    validate(a)?;
    validate(b)?;
    let log_ratios: Vec<f64> = a.iter().zip(b).map(|(&x, &y)| log_ratio(x, y)).collect();
    let mut sorted = log_ratios.clone();
    sorted.sort_by(f64::total_cmp);
    let point = finite_or_zero(median_of_sorted(&sorted));

    let n = log_ratios.len();
    let mut rng = StdRng::seed_from_u64(splitmix64(seed));
    let mut resample = vec![0.0; n];
    let distribution = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            for slot in resample.iter_mut() {
                *slot = log_ratios[rng.gen_range(0..n)];
            }
            resample.sort_by(f64::total_cmp);
            finite_or_zero(median_of_sorted(&resample))
        })
        .collect();
    Ok(judge(point, distribution, noise, confidence))
}

/// One measurement of a configuration, tagged with the interleaved round it was taken in. `round` is
/// `None` for a measurement that belongs to no round of this run (reused from an earlier run's log).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundRate {
    pub round: Option<u64>,
    pub rate: f64,
}

/// The fewest shared rounds for which [`decide`] compares pairs; below it the pairs' bootstrap has too
/// few distinct resamples to mean much, and all measurements are compared unpaired instead.
pub const MIN_PAIRS: usize = 3;

/// The decision rule of the tuner — the search's choice, the leaderboard's ties, the headline against
/// llama.cpp's defaults and `autotune measure --twice` all call this one function.
///
/// Where a and b were measured in the same interleaved rounds (at least [`MIN_PAIRS`] of them), it compares
/// those pairs ([`compare_paired`]): a round's drift hits both, and pairing cancels it. Otherwise (a
/// candidate carried over from an earlier axis, reused repetitions) it compares all measurements unpaired
/// ([`compare`]). `None` when either side has fewer than two usable measurements. Confidence is
/// [`DEFAULT_CONFIDENCE`].
pub fn decide(a: &[RoundRate], b: &[RoundRate], noise: f64, seed: u64) -> Option<Comparison> {
    let (pa, pb): (Vec<f64>, Vec<f64>) = a
        .iter()
        .filter_map(|x| {
            let round = x.round?;
            let y = b.iter().find(|y| y.round == Some(round))?;
            Some((x.rate, y.rate))
        })
        .unzip();
    if pa.len() >= MIN_PAIRS {
        if let Ok(c) = compare_paired(&pa, &pb, noise, DEFAULT_CONFIDENCE, seed) {
            return Some(c);
        }
    }
    let sample = |v: &[RoundRate]| Sample::new(v.iter().map(|x| x.rate).collect()).ok();
    Some(compare(
        &sample(a)?,
        &sample(b)?,
        noise,
        DEFAULT_CONFIDENCE,
        seed,
    ))
}

/// Turns a point estimate and bootstrap distribution of ln(a/b) into a [`Comparison`].
fn judge(point: f64, mut distribution: Vec<f64>, noise: f64, confidence: f64) -> Comparison {
    distribution.sort_by(f64::total_cmp);
    let last = distribution.len() - 1;
    // Symmetric order statistics: low and high swap exactly when a and b do.
    let low_index =
        (((1.0 - confidence) / 2.0 * distribution.len() as f64).floor() as usize).min(last / 2);
    let (low, high) = (distribution[low_index], distribution[last - low_index]);
    let threshold = noise.ln_1p();
    let verdict = if low > threshold {
        Verdict::Faster
    } else if high < -threshold {
        Verdict::Slower
    } else {
        Verdict::Tie
    };
    Comparison {
        ratio: point.exp_m1(),
        ci_low: low.exp_m1(),
        ci_high: high.exp_m1(),
        verdict,
    }
}

/// ln(x/y) for non-negative rates; 0/0 counts as equal (0) and x/0 as +∞.
fn log_ratio(x: f64, y: f64) -> f64 {
    finite_or_zero(x.ln() - y.ln())
}

/// Maps NaN (from ∞ − ∞, i.e. two zero rates) to 0; keeps ±∞.
fn finite_or_zero(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x
    }
}

/// Medians of [`BOOTSTRAP_RESAMPLES`] resamples (with replacement) of a sorted sample. Because the values are
/// sorted, the median of a resample is found by sorting the drawn indices, which are cheap to compare.
fn bootstrap_medians(sorted: &[f64], seed: u64) -> Vec<f64> {
    let n = sorted.len();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut indices = vec![0usize; n];
    (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            for slot in indices.iter_mut() {
                *slot = rng.gen_range(0..n);
            }
            indices.sort_unstable();
            if n % 2 == 1 {
                sorted[indices[n / 2]]
            } else {
                sorted[indices[n / 2 - 1]].midpoint(sorted[indices[n / 2]])
            }
        })
        .collect()
}

/// Seed for one sample's resampling stream: the caller's seed mixed with the sample's values, so the stream
/// does not depend on whether the sample is passed as a or as b.
fn stream_seed(seed: u64, values: &[f64]) -> u64 {
    values.iter().fold(splitmix64(seed), |hash, value| {
        splitmix64(hash ^ value.to_bits())
    })
}

/// SplitMix64 finaliser: a fixed, well-mixing u64 → u64 map (unlike `std`'s hasher, stable across releases).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded permutation of `0..n`: the order in which to run n candidates (or their repetitions) so that
/// drift over time is spread across candidates instead of favouring whichever ran first. Record the seed
/// with the results; the same seed (and `rand` version) gives the same order.
pub fn shuffled_order(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    order
}

fn assert_confidence(confidence: f64) {
    assert!(
        confidence > 0.0 && confidence < 1.0,
        "confidence must be strictly between 0 and 1, got {confidence}"
    );
}

fn assert_noise(noise: f64) {
    assert!(
        noise.is_finite() && noise >= 0.0,
        "noise must be a finite, non-negative fraction, got {noise}"
    );
}

#[cfg(test)]
mod tests;
