//! The quality gate in the report: the mean KL divergence of each leaderboard row's K/V pair where
//! it was measured, "refused" on the rows the gate turned down, and the lines under the winner (its
//! quality beside its speed, and each faster pair the gate refused, with what it would have won).

use profiles::{fmt_kld, KvQualityCheck, LeaderboardEntry, QualityRecord};
use search_space::Candidate;

/// Marks each row whose K/V pair was held to the gate: its mean KLD, and a refused row's status.
pub fn annotate(board: &mut [LeaderboardEntry], q: &QualityRecord) {
    for e in board.iter_mut().filter(|e| e.candidate.kv_lossy()) {
        let Some(check) = q.check(&e.candidate) else {
            continue;
        };
        e.kv_kld = check.kld();
        if !check.passed && e.figures.is_some() {
            e.status = format!("refused: {}", refusal(check, q));
        }
    }
}

/// Why the gate turned a pair down: "mean KLD 0.1100 > 0.0200", or why it was not measured.
fn refusal(check: &KvQualityCheck, q: &QualityRecord) -> String {
    match (check.added_kld(), q.max_kv_kld) {
        (Some(k), Some(max)) if check.weights_kld.is_some() => {
            format!("the cache adds mean KLD {} > {}", fmt_kld(k), fmt_kld(max))
        }
        (Some(k), Some(max)) => format!("mean KLD {} > {}", fmt_kld(k), fmt_kld(max)),
        _ => format!("quality {}", check.describe()),
    }
}

/// The quality lines under the winner.
pub fn lines(q: &QualityRecord, winner: &Candidate, board: &[LeaderboardEntry]) -> Vec<String> {
    let mut out = vec![q.winner_line(winner)];
    let score = |c: &KvQualityCheck| {
        (board.iter())
            .filter(|e| (e.candidate.type_k, e.candidate.type_v) == (c.type_k, c.type_v))
            .filter_map(|e| e.figures.as_ref().map(|f| f.score_s))
            .reduce(f64::min)
    };
    let won = (board.iter())
        .find(|e| &e.candidate == winner)
        .and_then(|e| e.figures.as_ref().map(|f| f.score_s));
    let refused: Vec<&KvQualityCheck> = q.checks.iter().filter(|c| !c.passed).collect();
    for c in &refused {
        let speed = match (won, score(c)) {
            (Some(w), Some(r)) => format!("({:+.0}% requests/s) ", 100.0 * (w / r - 1.0)),
            _ => String::new(),
        };
        out.push(format!(
            "kv={} {speed}refused: {}",
            c.label(),
            refusal(c, q)
        ));
    }
    if !refused.is_empty() && !winner.kv_lossy() && q.checks.iter().all(|c| !c.passed) {
        out.push("no quantized KV cache passed the gate: the f16 cache is kept".into());
    }
    out
}
