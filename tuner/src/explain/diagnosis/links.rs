//! The links finding: each RPC host the run measured over, the link it was reached by (as measured
//! before the run), and what the fastest placement on it alone did against this machine alone —
//! "RPC1 over a 30 MB/s link (7.5 ms round trip): 0.41x local alone; not used". Where this machine
//! alone did not fit, against the winner.

use super::finding::{finding, measured, secs, Finding, Topic};
use crate::explain::offload_devices;
use crate::hosts::links::runs_on;
use profiles::Profile;

/// The finding, where the run had RPC hosts.
pub fn links(profile: &Profile) -> Option<Finding> {
    if profile.hosts.is_empty() {
        return None;
    }
    let offload = offload_devices(profile);
    let best = |keep: &dyn Fn(&search_space::Candidate) -> bool| {
        measured(profile)
            .filter(|(e, _)| keep(&e.candidate))
            .map(|(_, f)| f.score_s)
            .min_by(f64::total_cmp)
    };
    let local = best(&|c| c.n_gpu_layers == 0);
    let winner = best(&|c| c == &profile.winner);
    let (against, base) = match (local, winner) {
        (Some(l), _) => ("local alone", Some(l)),
        (None, w) => ("the winner", w),
    };
    let used: Vec<&str> = (profile.hosts.iter())
        .filter(|h| h.used)
        .map(|h| h.device.as_str())
        .collect();
    let text = match used.as_slice() {
        [] => format!(
            "{} measured; the winner runs on this machine alone",
            hosts(profile.hosts.len())
        ),
        u => format!(
            "{} measured; the winner runs on {} over {}",
            hosts(profile.hosts.len()),
            u.join(" + "),
            if u.len() == 1 { "its link" } else { "theirs" }
        ),
    };
    let details = (profile.hosts.iter())
        .map(|h| {
            let alone = |c: &search_space::Candidate| {
                (offload.iter()).all(|d| runs_on(c, &offload, d) == (d == &h.device))
            };
            let vs = match (best(&alone), base) {
                (Some(s), Some(b)) => format!("{:.2}x {against} ({} per request)", b / s, secs(s)),
                (Some(s), None) => format!("{} per request", secs(s)),
                (None, _) => "not measured on it alone".into(),
            };
            format!(
                "{} ({}) over a {:.0} MB/s link ({:.2} ms round trip): {vs}; {}",
                h.device,
                h.endpoint,
                h.upload_bytes_per_s / 1e6,
                h.round_trip_ms,
                if h.used { "used" } else { "not used" }
            )
        })
        .collect();
    Some(Finding {
        details,
        ..finding(Topic::Links, text)
    })
}

fn hosts(n: usize) -> String {
    match n {
        1 => "1 RPC host".into(),
        n => format!("{n} RPC hosts"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::tests::rpc_profile;

    fn host(used: bool) -> profiles::HostLink {
        profiles::HostLink {
            endpoint: "127.0.0.1:50060".into(),
            device: "RPC0".into(),
            round_trip_ms: 7.5,
            upload_bytes_per_s: 30e6,
            download_bytes_per_s: 30e6,
            used,
        }
    }

    #[test]
    fn a_slow_host_left_out_is_named_with_its_link_and_its_cost_against_local_alone() {
        // The RPC fixture: the host alone (12 layers on RPC0, tg 22 t/s) against this machine
        // alone (tg 41.3 at its best).
        let mut p = rpc_profile();
        assert!(links(&p).is_none(), "no hosts, no finding");
        p.hosts = vec![host(false)];
        let f = links(&p).expect("a finding");
        assert_eq!(f.topic, Topic::Links);
        assert_eq!(
            f.text,
            "1 RPC host measured; the winner runs on this machine alone"
        );
        let line = &f.details[0];
        assert!(
            line.starts_with("RPC0 (127.0.0.1:50060) over a 30 MB/s link (7.50 ms round trip): 0."),
            "{line}"
        );
        assert!(line.contains("x local alone ("), "{line}");
        assert!(line.ends_with("; not used"), "{line}");
        // Its ratio: local alone's best s/request over the host alone's best.
        let best = |on_host: bool| {
            (p.leaderboard.iter())
                .filter(|e| (e.candidate.n_gpu_layers > 0) == on_host)
                .filter_map(|e| e.figures.as_ref().map(|f| f.score_s))
                .min_by(f64::total_cmp)
                .unwrap()
        };
        assert!(
            line.contains(&format!("{:.2}x", best(false) / best(true))),
            "{line}"
        );
    }

    #[test]
    fn a_used_host_is_said_and_the_winner_is_the_reference_where_local_alone_was_not_measured() {
        let mut p = rpc_profile();
        p.leaderboard.retain(|e| e.candidate.n_gpu_layers > 0);
        p.winner = p.leaderboard[0].candidate.clone();
        p.hosts = vec![host(true)];
        let f = links(&p).unwrap();
        assert_eq!(
            f.text,
            "1 RPC host measured; the winner runs on RPC0 over its link"
        );
        assert!(f.details[0].contains("x the winner ("), "{}", f.details[0]);
        assert!(f.details[0].ends_with("; used"), "{}", f.details[0]);
    }
}
