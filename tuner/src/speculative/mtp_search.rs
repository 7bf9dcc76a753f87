//! Measuring MTP's draft lengths ([`super::mtp`]) in the draft search: the same passes, acceptance
//! and output check as the other kinds', through the same worker and against the same baseline.

use super::mtp::{progress_label, MtpParams};
use super::search::outcome::{DraftEntry, Trial};
use super::search::runner::Runner;

/// Walks the draft lengths, ascending, and stops where a longer draft is slower than the shorter one
/// by more than the noise.
pub(super) fn measure(r: &mut Runner, entry: &mut DraftEntry) {
    let noise = r.s.noise;
    let mut failures = 0;
    let mut previous: Option<(f64, u32)> = None;
    let lengths = r.s.mtp.clone();
    for (k, &n_max) in lengths.iter().enumerate() {
        let params = MtpParams { n_max };
        let mut t = Trial::mtp(params, "grid");
        if let Some(why) = r.out_of_time() {
            t.skipped = Some(why);
            entry.trials.push(t);
            continue;
        }
        (r.progress)(&progress_label(params));
        match r.pass_mtp(params) {
            Ok(runs) => r.record(&mut t, &runs),
            Err(e) => {
                failures += 1;
                let fatal = failures >= 2 || e.starts_with("llama.cpp refused");
                t.failure = Some(e);
                entry.trials.push(t);
                if fatal {
                    entry.status = "failed: see its trials".into();
                    return;
                }
                continue;
            }
        }
        let tg = t.median_tg().unwrap_or(0.0);
        let slower = previous.filter(|&(p, _)| tg < p * (1.0 - noise));
        entry.trials.push(t);
        if let Some((_, m)) = slower {
            for &rest in &lengths[k + 1..] {
                let mut skip = Trial::mtp(MtpParams { n_max: rest }, "grid");
                skip.skipped = Some(format!("longer drafts got slower from n_max {m} on"));
                entry.trials.push(skip);
            }
            break;
        }
        previous = Some((tg, n_max));
    }
}
