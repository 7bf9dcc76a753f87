//! The statistics' unit and property tests.

use super::*;
use proptest::prelude::*;
use rand::Rng;

fn sample(values: &[f64]) -> Sample {
    Sample::new(values.to_vec()).unwrap()
}

/// n draws from N(mean, sd²) by Box–Muller; a stand-in for a configuration's run-to-run noise.
fn normal_values(seed: u64, n: usize, mean: f64, sd: f64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u1: f64 = rng.gen::<f64>().max(f64::MIN_POSITIVE);
            let u2: f64 = rng.gen();
            mean + sd * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        })
        .collect()
}

fn normal_sample(seed: u64, n: usize, mean: f64, sd: f64) -> Sample {
    Sample::new(normal_values(seed, n, mean, sd)).unwrap()
}

fn close(x: f64, y: f64) -> bool {
    (x - y).abs() < 1e-9
}

#[test]
fn rejects_invalid_measurements() {
    assert_eq!(Sample::new(vec![]), Err(SampleError::TooFew { n: 0 }));
    assert_eq!(Sample::new(vec![1.0]), Err(SampleError::TooFew { n: 1 }));
    assert!(matches!(
        Sample::new(vec![1.0, f64::NAN]),
        Err(SampleError::NotFinite { index: 1, .. })
    ));
    assert!(matches!(
        Sample::new(vec![f64::INFINITY, 1.0]),
        Err(SampleError::NotFinite { index: 0, .. })
    ));
    assert_eq!(
        Sample::new(vec![1.0, 2.0, -0.5]),
        Err(SampleError::Negative {
            index: 2,
            value: -0.5
        })
    );
    assert!(Sample::new(vec![0.0, 0.0]).is_ok());
}

#[test]
fn error_messages_say_what_to_do() {
    let message = SampleError::TooFew { n: 1 }.to_string();
    assert!(message.starts_with("need at least 2"), "{message}");
}

#[test]
fn known_median_mean_sd() {
    let s = sample(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
    assert_eq!(s.n(), 8);
    assert!(close(s.median(), 4.5));
    assert!(close(s.mean(), 5.0));
    assert!(close(s.sd(), (32.0_f64 / 7.0).sqrt()));
    assert_eq!((s.min(), s.max()), (2.0, 9.0));

    let odd = sample(&[3.0, 1.0, 2.0]);
    assert!(close(odd.median(), 2.0));
    assert!(close(odd.sd(), 1.0));
    assert_eq!(odd.values(), &[3.0, 1.0, 2.0]);
}

#[test]
fn known_mad() {
    // |x − 2| = [1, 1, 0, 0, 2, 4, 7] → raw MAD 1.
    let s = sample(&[1.0, 1.0, 2.0, 2.0, 4.0, 6.0, 9.0]);
    assert!(close(s.mad(), 1.4826));
}

#[test]
fn flags_a_wild_run_among_steady_ones() {
    let s = sample(&[10.1, 9.9, 10.0, 10.2, 9.8, 100.0, 10.0, 10.1, 9.9, 10.0]);
    let outliers = s.outliers();
    assert_eq!(outliers.len(), 1);
    assert_eq!(outliers[0].index, 5);
    assert_eq!(outliers[0].value, 100.0);
    assert!(outliers[0].z > OUTLIER_THRESHOLD);
    assert_eq!(s.summary().outliers, 1);
}

#[test]
fn flags_nothing_in_uniform_or_constant_data() {
    let uniform: Vec<f64> = (0..20).map(|i| 10.0 + 0.1 * i as f64).collect();
    assert!(sample(&uniform).outliers().is_empty());
    // MAD is 0 here, so the score is undefined and nothing is flagged.
    assert!(sample(&[5.0, 5.0, 5.0, 5.0, 7.0]).outliers().is_empty());
}

#[test]
fn median_ci_by_order_statistics() {
    // n = 10: 2·P(B ≤ 1) = 22/1024 ≤ 5 % < 2·P(B ≤ 2) = 112/1024, so [x₍₂₎, x₍₉₎].
    let s = sample(&(1..=10).map(f64::from).collect::<Vec<_>>());
    assert_eq!(s.median_ci(0.95), (2.0, 9.0));
    // 99 % needs k = 1 there: 2·P(B = 0) = 2/1024 ≤ 1 %.
    assert_eq!(s.median_ci(0.99), (1.0, 10.0));
    assert!(close(s.relative_ci_halfwidth(0.95), 3.5 / 5.5));
}

#[test]
fn median_ci_falls_back_to_range_for_small_samples() {
    assert_eq!(min_sample_size(0.95), 6);
    assert_eq!(min_sample_size(0.99), 8);
    let s = sample(&[3.0, 1.0, 4.0, 1.5, 5.0]);
    assert_eq!(s.median_ci(0.95), (1.0, 5.0));
    assert!(close(s.relative_ci_halfwidth(0.95), 2.0 / 3.0));
}

#[test]
fn median_ci_contains_true_median_and_narrows_with_n() {
    let widths: Vec<f64> = [30, 300, 3000]
        .iter()
        .map(|&n| {
            let s = normal_sample(7, n, 100.0, 5.0);
            let (low, high) = s.median_ci(0.95);
            assert!(low <= 100.0 && 100.0 <= high, "n = {n}: ({low}, {high})");
            high - low
        })
        .collect();
    assert!(widths[0] > widths[1] && widths[1] > widths[2], "{widths:?}");
    // Width shrinks like 1/√n: 3000 points give roughly a tenth of the width of 30.
    assert!(widths[2] < widths[0] / 5.0, "{widths:?}");
}

#[test]
fn median_ci_has_its_coverage() {
    let covered = (0..400)
        .filter(|&seed| {
            let (low, high) = normal_sample(seed, 25, 50.0, 3.0).median_ci(0.95);
            low <= 50.0 && 50.0 <= high
        })
        .count();
    assert!(covered >= 370, "covered {covered} of 400");
}

#[test]
fn summary_matches_methods() {
    let s = normal_sample(3, 12, 40.0, 1.0);
    let summary = s.summary();
    let (ci_low, ci_high) = s.median_ci(DEFAULT_CONFIDENCE);
    assert_eq!(
        summary,
        Summary {
            n: 12,
            median: s.median(),
            mean: s.mean(),
            sd: s.sd(),
            min: s.min(),
            max: s.max(),
            mad: s.mad(),
            ci_low,
            ci_high,
            ci_halfwidth: s.relative_ci_halfwidth(DEFAULT_CONFIDENCE),
            outliers: 0,
        }
    );
}

#[test]
fn enough_waits_for_a_tight_interval() {
    // Tight (±0.5 %) but too few runs for a real 95 % interval.
    assert!(!enough(&sample(&[100.0, 100.5, 99.5]), DEFAULT_NOISE));
    // Tight and enough runs.
    assert!(enough(&normal_sample(1, 10, 100.0, 0.3), DEFAULT_NOISE));
    // 5 % run-to-run noise: not tight after 10 runs, tight after 2000.
    assert!(!enough(&normal_sample(1, 10, 100.0, 5.0), DEFAULT_NOISE));
    assert!(enough(&normal_sample(1, 2000, 100.0, 5.0), DEFAULT_NOISE));
}

#[test]
fn same_distribution_is_a_tie() {
    for seed in 0..20 {
        let a = normal_sample(2 * seed, 30, 100.0, 1.0);
        let b = normal_sample(2 * seed + 1, 30, 100.0, 1.0);
        let c = compare(&a, &b, DEFAULT_NOISE, DEFAULT_CONFIDENCE, seed);
        assert_eq!(c.verdict, Verdict::Tie, "seed {seed}: {c:?}");
        // (The 95 % interval itself misses 0 about once in 20 such pairs; the threshold absorbs that.)
        assert!(c.ratio.abs() < DEFAULT_NOISE / 2.0, "seed {seed}: {c:?}");
    }
}

#[test]
fn ten_percent_apart_is_detected() {
    let a = normal_sample(1, 15, 110.0, 1.1);
    let b = normal_sample(2, 15, 100.0, 1.0);
    let ab = compare(&a, &b, 0.01, DEFAULT_CONFIDENCE, 42);
    assert_eq!(ab.verdict, Verdict::Faster, "{ab:?}");
    assert!((ab.ratio - 0.10).abs() < 0.02, "{ab:?}");
    assert!(ab.ci_low <= ab.ratio && ab.ratio <= ab.ci_high, "{ab:?}");
    assert_eq!(
        compare(&b, &a, 0.01, DEFAULT_CONFIDENCE, 42).verdict,
        Verdict::Slower
    );
}

#[test]
fn one_percent_apart_is_below_a_two_percent_threshold() {
    let a = normal_sample(1, 30, 101.0, 0.5);
    let b = normal_sample(2, 30, 100.0, 0.5);
    let c = compare(&a, &b, 0.02, DEFAULT_CONFIDENCE, 42);
    assert_eq!(c.verdict, Verdict::Tie, "{c:?}");
    // … though the difference itself is resolved.
    assert!(c.ci_low > 0.0, "{c:?}");
}

#[test]
fn compare_is_deterministic_given_the_seed() {
    let a = normal_sample(1, 20, 100.0, 3.0);
    let b = normal_sample(2, 20, 102.0, 3.0);
    let first = compare(&a, &b, DEFAULT_NOISE, DEFAULT_CONFIDENCE, 9);
    assert_eq!(first, compare(&a, &b, DEFAULT_NOISE, DEFAULT_CONFIDENCE, 9));
    assert_ne!(
        first,
        compare(&a, &b, DEFAULT_NOISE, DEFAULT_CONFIDENCE, 10)
    );
}

/// The machine speeds up by ~2× over the run (both configurations alike); a is 5 % faster in every pair.
fn drifting_pairs() -> (Vec<f64>, Vec<f64>) {
    let jitter = normal_values(5, 40, 0.0, 0.005);
    (0..20)
        .map(|i| {
            let base = 50.0 + 2.5 * i as f64;
            (
                1.05 * base * (1.0 + jitter[2 * i]),
                base * (1.0 + jitter[2 * i + 1]),
            )
        })
        .unzip()
}

#[test]
fn paired_comparison_sees_through_drift() {
    let (a, b) = drifting_pairs();
    let c = compare_paired(&a, &b, DEFAULT_NOISE, DEFAULT_CONFIDENCE, 1).unwrap();
    assert_eq!(c.verdict, Verdict::Faster, "{c:?}");
    assert!((c.ratio - 0.05).abs() < 0.01, "{c:?}");
    assert_eq!(
        compare_paired(&b, &a, DEFAULT_NOISE, DEFAULT_CONFIDENCE, 1)
            .unwrap()
            .verdict,
        Verdict::Slower
    );
    // Ignoring the pairing, the drift swamps the 5 % difference.
    let unpaired = compare(
        &sample(&a),
        &sample(&b),
        DEFAULT_NOISE,
        DEFAULT_CONFIDENCE,
        1,
    );
    assert_eq!(unpaired.verdict, Verdict::Tie, "{unpaired:?}");
}

fn in_rounds(values: &[f64], first_round: u64) -> Vec<RoundRate> {
    values
        .iter()
        .enumerate()
        .map(|(i, &rate)| RoundRate {
            round: Some(first_round + i as u64),
            rate,
        })
        .collect()
}

#[test]
fn decide_pairs_measurements_of_the_same_rounds() {
    let (a, b) = drifting_pairs();
    let c = decide(&in_rounds(&a, 10), &in_rounds(&b, 10), DEFAULT_NOISE, 1).unwrap();
    assert_eq!(c.verdict, Verdict::Faster, "{c:?}");
    assert_eq!(
        c,
        compare_paired(&a, &b, DEFAULT_NOISE, DEFAULT_CONFIDENCE, 1).unwrap()
    );
}

#[test]
fn decide_falls_back_to_unpaired_without_shared_rounds() {
    let (a, b) = drifting_pairs();
    let unpaired = compare(
        &sample(&a),
        &sample(&b),
        DEFAULT_NOISE,
        DEFAULT_CONFIDENCE,
        1,
    );
    // Different rounds (a carried-over candidate): the drift cannot be cancelled.
    let c = decide(&in_rounds(&a, 0), &in_rounds(&b, 1000), DEFAULT_NOISE, 1).unwrap();
    assert_eq!(c, unpaired);
    // Measurements that belong to no round (reused from a log) are never paired.
    let none = |v: &[f64]| -> Vec<RoundRate> {
        v.iter()
            .map(|&rate| RoundRate { round: None, rate })
            .collect()
    };
    assert_eq!(
        decide(&none(&a), &none(&b), DEFAULT_NOISE, 1).unwrap(),
        unpaired
    );
    // Fewer shared rounds than MIN_PAIRS: unpaired over everything.
    let mut b_late = in_rounds(&b, 1000);
    for (k, x) in b_late.iter_mut().take(MIN_PAIRS - 1).enumerate() {
        x.round = Some(k as u64);
    }
    assert_eq!(
        decide(&in_rounds(&a, 0), &b_late, DEFAULT_NOISE, 1).unwrap(),
        unpaired
    );
}

#[test]
fn decide_needs_two_measurements_a_side() {
    let a = in_rounds(&[10.0, 11.0, 12.0], 0);
    assert!(decide(&a, &in_rounds(&[10.0], 0), DEFAULT_NOISE, 1).is_none());
    assert_eq!(
        decide(&a, &a, DEFAULT_NOISE, 1).unwrap().verdict,
        Verdict::Tie
    );
}

#[test]
fn paired_comparison_validates_its_input() {
    assert_eq!(
        compare_paired(&[1.0, 2.0], &[1.0], DEFAULT_NOISE, DEFAULT_CONFIDENCE, 0),
        Err(SampleError::LengthMismatch { a: 2, b: 1 })
    );
    assert_eq!(
        compare_paired(&[1.0], &[1.0], DEFAULT_NOISE, DEFAULT_CONFIDENCE, 0),
        Err(SampleError::TooFew { n: 1 })
    );
    assert!(matches!(
        compare_paired(
            &[1.0, 2.0],
            &[1.0, f64::NAN],
            DEFAULT_NOISE,
            DEFAULT_CONFIDENCE,
            0
        ),
        Err(SampleError::NotFinite { index: 1, .. })
    ));
}

#[test]
fn zero_rates_do_not_produce_nan() {
    let zeros = sample(&[0.0, 0.0, 0.0]);
    let some = sample(&[1.0, 2.0, 3.0]);
    assert_eq!(
        compare(&zeros, &zeros, DEFAULT_NOISE, DEFAULT_CONFIDENCE, 0).verdict,
        Verdict::Tie
    );
    let c = compare(&some, &zeros, DEFAULT_NOISE, DEFAULT_CONFIDENCE, 0);
    assert_eq!(c.verdict, Verdict::Faster, "{c:?}");
    assert_eq!(zeros.relative_ci_halfwidth(0.95), 0.0);
}

#[test]
#[should_panic(expected = "confidence must be strictly between 0 and 1")]
fn rejects_impossible_confidence() {
    sample(&[1.0, 2.0]).median_ci(1.0);
}

#[test]
fn shuffled_order_is_a_reproducible_permutation() {
    let order = shuffled_order(10, 3);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    assert_eq!(order, shuffled_order(10, 3));
    assert_ne!(order, shuffled_order(10, 4));
    assert!(shuffled_order(0, 3).is_empty());
}

fn rates() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0.0f64..1e6, 2..40)
}

/// Realistic throughputs: positive, within a factor of a few of each other.
fn throughputs() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(1.0f64..200.0, 2..30)
}

proptest! {
    #[test]
    fn new_never_panics(values in prop::collection::vec(any::<f64>(), 0..20)) {
        if let Ok(s) = Sample::new(values) {
            let _ = (s.median(), s.mean(), s.sd(), s.mad(), s.outliers(), s.summary());
            let _ = (s.median_ci(0.95), s.relative_ci_halfwidth(0.5), enough(&s, 0.02));
        }
    }

    #[test]
    fn median_lies_within_range(values in rates()) {
        let s = Sample::new(values).unwrap();
        prop_assert!(s.min() <= s.median() && s.median() <= s.max());
    }

    #[test]
    fn ci_brackets_the_median(values in rates(), confidence in 0.5f64..0.999) {
        let s = Sample::new(values).unwrap();
        let (low, high) = s.median_ci(confidence);
        prop_assert!(s.min() <= low && low <= s.median() && s.median() <= high && high <= s.max());
    }

    #[test]
    fn shuffled_order_is_a_permutation(n in 0usize..200, seed in any::<u64>()) {
        let mut order = shuffled_order(n, seed);
        order.sort_unstable();
        prop_assert_eq!(order, (0..n).collect::<Vec<_>>());
    }
}

proptest! {
    // Each case runs several 2000-resample bootstraps; fewer cases keep the suite quick in debug builds.
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn a_sample_ties_with_itself(values in throughputs(), noise in 0.0f64..0.1, seed in any::<u64>()) {
        let s = Sample::new(values.clone()).unwrap();
        prop_assert_eq!(compare(&s, &s, noise, 0.95, seed).verdict, Verdict::Tie);
        prop_assert_eq!(compare_paired(&values, &values, noise, 0.95, seed).unwrap().verdict, Verdict::Tie);
    }

    #[test]
    fn swapping_mirrors_the_verdict(
        a in throughputs(),
        b in throughputs(),
        noise in 0.0f64..0.1,
        seed in any::<u64>(),
    ) {
        let (sa, sb) = (Sample::new(a).unwrap(), Sample::new(b).unwrap());
        let ab = compare(&sa, &sb, noise, 0.95, seed);
        let ba = compare(&sb, &sa, noise, 0.95, seed);
        prop_assert_eq!(ab.verdict, ba.verdict.reversed(), "{:?} vs {:?}", ab, ba);
        prop_assert!(ab.ci_low <= ab.ci_high);
    }

    #[test]
    fn swapping_pairs_mirrors_the_verdict(
        pairs in prop::collection::vec((1.0f64..200.0, 1.0f64..200.0), 2..30),
        noise in 0.0f64..0.1,
        seed in any::<u64>(),
    ) {
        let (a, b): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
        let ab = compare_paired(&a, &b, noise, 0.95, seed).unwrap();
        let ba = compare_paired(&b, &a, noise, 0.95, seed).unwrap();
        prop_assert_eq!(ab.verdict, ba.verdict.reversed(), "{:?} vs {:?}", ab, ba);
    }
}
