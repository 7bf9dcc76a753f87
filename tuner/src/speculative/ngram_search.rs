//! Measuring n-gram speculation's settings ([`super::ngram`]) in the draft search: the same passes,
//! acceptance and output check as a draft model's, through the same worker and against the same
//! baseline, so the final comparison can weigh them side by side.

use super::search::outcome::{DraftEntry, Trial};
use super::search::runner::Runner;

/// Walks each lookup length's line of draft lengths, ascending, and stops a line where a longer
/// draft is slower than the shorter one by more than the noise.
pub(super) fn measure(r: &mut Runner, entry: &mut DraftEntry) {
    let noise = r.s.noise;
    let mut failures = 0;
    for line in r.s.ngram.lines() {
        let mut previous: Option<(f64, u32)> = None;
        for (k, params) in line.iter().enumerate() {
            let mut t = Trial::ngram(*params, "grid");
            if let Some(why) = r.out_of_time() {
                t.skipped = Some(why);
                entry.trials.push(t);
                continue;
            }
            (r.progress)(&format!("ngram-simple {}", params.label()));
            match r.pass_ngram(*params) {
                Ok(runs) => r.record(&mut t, &runs),
                Err(e) => {
                    failures += 1;
                    t.failure = Some(e);
                    entry.trials.push(t);
                    if failures >= 2 {
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
                for rest in &line[k + 1..] {
                    let mut skip = Trial::ngram(*rest, "grid");
                    skip.skipped = Some(format!("longer drafts got slower from size m {m} on"));
                    entry.trials.push(skip);
                }
                break;
            }
            previous = Some((tg, params.size_m));
        }
    }
}
