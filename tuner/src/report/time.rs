//! The run's time as it was said before the search went beyond llama.cpp's defaults, and the axes
//! the ceilings left unmeasured: one line each, for the progress on stderr and the report's notes.

use crate::measuring::{BudgetFrom, SkippedAxis, TimePlan};

/// "about 7 min: one request takes 45 s; generation is at 88% of its ceiling, the prompt at 71%
/// (at most +25% to win); budget 10 min".
pub fn plan_line(p: &TimePlan) -> String {
    let gate = (p.gate_s.filter(|g| *g >= 1.0)).map_or(String::new(), |g| {
        format!(
            " (+{} where a quantized KV cache would win: its quality measured)",
            duration(g)
        )
    });
    let mut s = format!(
        "about {}{gate}: one request takes {}",
        duration(p.expected_s),
        duration(p.request_s)
    );
    let shares: Vec<String> = [
        ("generation", p.generation_share),
        ("the prompt", p.prompt_share),
    ]
    .into_iter()
    .filter_map(|(phase, share)| share.map(|x| (phase, x)))
    .enumerate()
    .map(|(k, (phase, x))| match k {
        0 => format!("{phase} is at {:.0}% of its ceiling", x * 100.0),
        _ => format!("{phase} at {:.0}%", x * 100.0),
    })
    .collect();
    if !shares.is_empty() {
        s.push_str(&format!("; {}", shares.join(", ")));
    }
    if let Some(m) = p.at_most {
        s.push_str(&format!(" (at most {:+.0}% to win)", m * 100.0));
    }
    let how = match p.budget_from {
        BudgetFrom::Grown => "grown from one visit of llama.cpp's defaults",
        BudgetFrom::Default => "the default",
        BudgetFrom::Given => "as given",
    };
    s.push_str(&format!("; budget {} ({how})", duration(p.budget_s)));
    s
}

/// "skipped the threads axis: at most +0.4% possible here".
pub fn skipped_line(a: &SkippedAxis) -> String {
    format!(
        "skipped the {} axis: at most {:+.1}% possible here (the ceilings' bound, under the noise threshold)",
        a.axis,
        a.at_most * 100.0
    )
}

/// Seconds as a person says them: "45 s", "1.5 min", "7 min", "1 h 5 min".
pub fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 90.0 {
        format!("{s:.0} s")
    } else if s < 180.0 {
        format!("{:.1} min", s / 60.0)
    } else if s < 3600.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        let m = (s / 60.0).round() as u64;
        format!("{} h {} min", m / 60, m % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> TimePlan {
        TimePlan {
            request_s: 45.0,
            visit_s: 110.0,
            repetition_s: 45.0,
            load_s: 20.0,
            warm_up_s: 1.0,
            pp_tps: 20.0,
            tg_tps: 5.0,
            budget_s: 600.0,
            expected_s: 420.0,
            gate_s: None,
            prompt_share: Some(0.71),
            generation_share: Some(0.88),
            at_most: Some(0.25),
            budget_from: BudgetFrom::Grown,
            at_s: 110.0,
        }
    }

    #[test]
    fn the_plan_says_the_time_the_request_and_the_room_left() {
        assert_eq!(
            plan_line(&plan()),
            "about 7 min: one request takes 45 s; generation is at 88% of its ceiling, the prompt at 71% (at most +25% to win); budget 10 min (grown from one visit of llama.cpp's defaults)"
        );
        let bare = TimePlan {
            prompt_share: None,
            generation_share: None,
            at_most: None,
            budget_from: BudgetFrom::Given,
            ..plan()
        };
        assert_eq!(
            plan_line(&bare),
            "about 7 min: one request takes 45 s; budget 10 min (as given)"
        );
        let gated = TimePlan {
            gate_s: Some(170.0),
            ..bare
        };
        assert_eq!(
            plan_line(&gated),
            "about 7 min (+2.8 min where a quantized KV cache would win: its quality measured): one request takes 45 s; budget 10 min (as given)"
        );
    }

    #[test]
    fn durations_read_as_seconds_minutes_or_hours() {
        assert_eq!(duration(45.2), "45 s");
        assert_eq!(duration(420.0), "7 min");
        assert_eq!(duration(90.0), "1.5 min");
        assert_eq!(duration(1800.0), "30 min");
        assert_eq!(duration(3900.0), "1 h 5 min");
        assert_eq!(
            skipped_line(&SkippedAxis {
                axis: "threads".into(),
                at_most: 0.004
            }),
            "skipped the threads axis: at most +0.4% possible here (the ceilings' bound, under the noise threshold)"
        );
    }
}
