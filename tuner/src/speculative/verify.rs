//! Is the output with a draft the target alone's? Under greedy decoding speculative decoding promises
//! the very text the target writes alone; this module checks that promise and tells a broken draft loop
//! from rounding.
//!
//! Token equality alone is too strict. The target checking a draft scores several tokens in one batch,
//! the target alone scores one, and llama.cpp runs other kernels for the two (other tiling, summation
//! order and quantization of activations; which ones depends on the CPU variant or GPU backend it
//! picked). Their logits differ — by tenths of a nat on the demo model — and where the target's best
//! tokens nearly tie, the greedy choice can flip. After a flip the two texts legitimately go separate
//! ways, and comparing them token by token says nothing more.
//!
//! So every token of the draft run is compared with what the target alone chooses *after the same
//! text*: up to the first difference that is the baseline run itself; for a prompt that differs, the
//! target alone decodes the draft run's own output one token at a time ([`SpeculateRequest::follow`])
//! and records its choice at every position, so the whole output is checked, not only up to its first
//! flip. Where the draft path chose A and the target alone B, the draft path preferred A to B by some
//! margin and the target alone B to A by another: their sum is how far the gap between the two
//! tokens' logits moved from one path to the other. Under [`NEAR_TIE_NATS`] that is rounding (a
//! *near tie*); anything else is a real divergence: a bug in the loop (a stale KV cell, shifted
//! positions, a wrong rollback), which disqualifies the draft setting. The comparison is of logit
//! *differences*, which a softmax does not see shifted all together.
//!
//! [`SpeculateRequest::follow`]: super::serve::SpeculateRequest::follow

use super::logits::Choice;
use super::prompts::Prompt;
use super::serve::PromptRun;
use serde::Serialize;

/// The most, in nats, by which the gap between two tokens' logits may move from the target alone to
/// the draft path for a flip between them to count as rounding (see the module's documentation).
///
/// Why 1.5: measured on the demo model (Gemma 3 270M Q4_K_M target, Q4_0 draft; llama.cpp's AVX-512
/// CPU variant), where both paths chose the same token the gap from it to each other top token moved
/// by a median of 0.05 to 0.09 nats, about 0.5 at the 99th percentile and 0.97 at most (9,300 pairs;
/// one and two threads, drafts of 2 to 8 tokens, outputs of 8 to 48 tokens; batches of up to 3 tokens
/// round exactly like one), and the 16 flips seen moved it by 0.3 at most. 1.5 is half again the
/// largest rounding measured and three times its 99th percentile, room for other kernels (other CPU
/// variants, GPU backends). A broken rollback moves gaps by far more: leaving one rejected draft token
/// in the target's cache, each prompt's first real flip moved by 2.5 to 20 nats. Two tokens whose gap
/// moved by less than 1.5 are within a factor of 4.5 in probability in both paths, and the greedy
/// choice between them is what the kernels' rounding decides. The limit of any such check: a bug that
/// moves logits no more than rounding does looks like rounding (with that broken rollback, one later
/// flip moved by 1.2 and counts as a near tie; the setting is still reported as differing).
pub const NEAR_TIE_NATS: f32 = 1.5;

/// The verdict on a setting's output over the whole prompt set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SameOutput {
    /// Token for token the target alone's.
    #[default]
    Identical,
    /// Every token is the target alone's choice after the same text, or one of two nearly tied tokens.
    NearTies,
    /// A token the target alone would not choose, beyond a near tie: the draft loop is broken.
    Differs,
}

/// A token where the two paths picked the other of two nearly tied tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NearTie {
    pub prompt: String,
    /// Index in the generated tokens.
    pub token: usize,
    /// The draft path's token and the target alone's.
    pub ours: i32,
    pub alone: i32,
    /// How far the draft path preferred its token to the target alone's, and the target alone its
    /// own to the draft path's (nats).
    pub ours_margin: f32,
    pub alone_margin: f32,
    /// Their sum: how far the gap between the two tokens moved between the paths (under
    /// [`NEAR_TIE_NATS`]).
    pub margin: f32,
}

/// The first token that differs beyond a near tie.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    pub prompt: String,
    pub token: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ours: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alone: Option<i32>,
    /// As in [`NearTie`]; a lower bound where the other path's token was not among its best.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ours_margin: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alone_margin: Option<f32>,
    /// Why it is not a near tie.
    pub reason: String,
}

/// The check of one setting's output, all prompts together.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutputCheck {
    pub same_output: SameOutput,
    /// Token for token the target alone's output on every prompt.
    pub identical: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub near_ties: Vec<NearTie>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub divergence: Option<Divergence>,
    /// Where both paths chose the same token: the largest change between them in the gap from the
    /// chosen token's logit to another top token's (nats). What rounding alone does on this machine.
    pub max_margin_shift: f32,
}

impl OutputCheck {
    /// Nothing compared yet: identical.
    pub fn new() -> OutputCheck {
        OutputCheck {
            identical: true,
            ..OutputCheck::default()
        }
    }

    /// Only a real divergence disqualifies.
    pub fn differs(&self) -> bool {
        self.same_output == SameOutput::Differs
    }

    /// The largest margin among the near ties.
    pub fn max_near_tie_margin(&self) -> f32 {
        self.near_ties.iter().map(|n| n.margin).fold(0.0, f32::max)
    }

    fn diverged(&mut self, d: Divergence) {
        self.same_output = SameOutput::Differs;
        self.divergence.get_or_insert(d);
    }

    /// Adds one prompt: `ours` is the draft run, `baseline` the target alone's, and `followed` the
    /// target alone following `ours`' tokens (needed only when they differ from the baseline's).
    pub fn add_prompt(
        &mut self,
        prompt: &str,
        ours: &PromptRun,
        baseline: &PromptRun,
        followed: Option<&PromptRun>,
    ) {
        let divergence = |token: usize, reason: &str| Divergence {
            prompt: prompt.into(),
            token,
            ours: ours.tokens.get(token).copied(),
            alone: None,
            ours_margin: None,
            alone_margin: None,
            reason: reason.into(),
        };
        let alone = if ours.tokens == baseline.tokens {
            baseline
        } else {
            self.identical = false;
            match followed {
                Some(f) => f,
                None => {
                    return self.diverged(divergence(
                        first_difference(ours, baseline),
                        "the target alone did not re-decode this output",
                    ));
                }
            }
        };
        for (k, &token) in ours.tokens.iter().enumerate() {
            let (Some(o), Some(a)) = (ours.choices.get(k), alone.choices.get(k)) else {
                return self.diverged(divergence(
                    k,
                    "the target's choices were not recorded this far",
                ));
            };
            if a.token() == token {
                self.shift(o, a);
                continue;
            }
            match near_tie(o, a, token) {
                Ok((ours_margin, alone_margin)) => self.add_near_tie(NearTie {
                    prompt: prompt.into(),
                    token: k,
                    ours: token,
                    alone: a.token(),
                    ours_margin,
                    alone_margin,
                    margin: ours_margin + alone_margin,
                }),
                Err((ours_margin, alone_margin, reason)) => {
                    // Past a real divergence nothing more is learnt from this prompt.
                    return self.diverged(Divergence {
                        alone: Some(a.token()),
                        ours_margin,
                        alone_margin,
                        ..divergence(k, &reason)
                    });
                }
            }
        }
        if alone.tokens.len() > ours.tokens.len() {
            // The draft run stopped early (it stops only at the token budget or an end token, and the
            // target alone following it stops there too): a truncated run.
            self.diverged(divergence(
                ours.tokens.len(),
                "the output with the draft is shorter",
            ));
        }
    }

    /// The paths chose different tokens, but nearly tied ones.
    fn add_near_tie(&mut self, tie: NearTie) {
        if self.same_output == SameOutput::Identical {
            self.same_output = SameOutput::NearTies;
        }
        self.near_ties.push(tie);
    }

    /// Both paths chose the same token: how far the gaps from it to the other top tokens moved.
    fn shift(&mut self, o: &Choice, a: &Choice) {
        for &(t, logit) in a.top.iter().skip(1) {
            if let Some(ol) = o.logit_of(t, None) {
                let moved = ((o.logit() - ol) - (a.logit() - logit)).abs();
                if moved.is_finite() {
                    self.max_margin_shift = self.max_margin_shift.max(moved);
                }
            }
        }
    }
}

/// Checks a draft setting's output (`runs`, one per prompt) against the target alone's (`reference`).
/// Prompts whose tokens differ are re-decoded by the target alone following the draft run's tokens:
/// `follow(prompt texts, their tokens)` returns those runs, in order.
pub fn check(
    prompts: &[Prompt],
    runs: &[PromptRun],
    reference: &[PromptRun],
    follow: impl FnOnce(Vec<String>, Vec<Vec<i32>>) -> Result<Vec<PromptRun>, String>,
) -> OutputCheck {
    let differing: Vec<usize> = (0..runs.len().min(reference.len()))
        .filter(|&i| runs[i].tokens != reference[i].tokens)
        .collect();
    let followed = if differing.is_empty() {
        Ok(Vec::new())
    } else {
        follow(
            differing.iter().map(|&i| prompts[i].text.clone()).collect(),
            differing.iter().map(|&i| runs[i].tokens.clone()).collect(),
        )
    };
    let mut check = OutputCheck::new();
    for (i, ((run, prompt), baseline)) in runs.iter().zip(prompts).zip(reference).enumerate() {
        let followed = differing
            .iter()
            .position(|&d| d == i)
            .and_then(|k| followed.as_ref().ok().and_then(|f| f.get(k)));
        check.add_prompt(&prompt.name, run, baseline, followed);
    }
    if let (Err(e), Some(d)) = (&followed, check.divergence.as_mut()) {
        d.reason = format!("{}: {e}", d.reason);
    }
    check
}

/// The first token where two runs' outputs differ (or where the shorter one ends).
fn first_difference(ours: &PromptRun, baseline: &PromptRun) -> usize {
    ours.tokens
        .iter()
        .zip(&baseline.tokens)
        .position(|(a, b)| a != b)
        .unwrap_or(ours.tokens.len().min(baseline.tokens.len()))
}

type Margins = (Option<f32>, Option<f32>, String);

/// Where the draft path (`o`, which chose `token`) and the target alone (`a`, following the same
/// text, which chose another) disagree: Ok((the draft path's preference for its token over the
/// alone's, the alone's for its own over the draft path's)) for a near tie, else those margins as far
/// as known and why it is not one.
fn near_tie(o: &Choice, a: &Choice, token: i32) -> Result<(f32, f32), Margins> {
    let theirs = a.token();
    // The target alone's logit for the draft path's token: it followed that token, so it is known.
    let alone_margin = a.logit_of(token, Some(token)).map(|l| a.logit() - l);
    // The draft path's logit for the alone's token: known when among its best; else at most the
    // lowest of them, which bounds the margin from below.
    let ours_margin = o.logit_of(theirs, None).map(|l| o.logit() - l);
    let (Some(om), Some(am)) = (ours_margin, alone_margin) else {
        let floor = o.logit() - o.floor();
        let bound = floor + alone_margin.unwrap_or(0.0);
        return Err((
            ours_margin.or(Some(floor)),
            alone_margin,
            format!(
                "the target alone's token {theirs} is not among the draft path's {} best, which lead it by \
                 at least {bound:.3} nats together",
                o.top.len()
            ),
        ));
    };
    let moved = om + am;
    if moved.is_nan() || moved >= NEAR_TIE_NATS {
        return Err((
            Some(om),
            Some(am),
            format!(
                "with the draft {token} led {theirs} by {om:.3} nats, alone {theirs} led {token} by {am:.3}: \
                 the gap moved by {moved:.3} (rounding moves it by under {NEAR_TIE_NATS})"
            ),
        ));
    }
    Ok((om, am))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A position where the target chose the first of `top` (best first).
    fn at(top: &[(i32, f32)]) -> Choice {
        Choice {
            top: top.to_vec(),
            followed_logit: None,
        }
    }

    /// A draft run that took its target's choices.
    fn ours(choices: &[Choice]) -> PromptRun {
        PromptRun {
            tokens: choices.iter().map(Choice::token).collect(),
            choices: choices.to_vec(),
            ..PromptRun::default()
        }
    }

    /// The target alone choosing `choices` after `ours`' text: (its own run, and it following
    /// `ours`' tokens, with the logit of each). Past the first difference only the second matters.
    fn alone(ours: &PromptRun, choices: &[Choice]) -> (PromptRun, PromptRun) {
        let baseline = PromptRun {
            tokens: choices.iter().map(Choice::token).collect(),
            choices: choices.to_vec(),
            ..PromptRun::default()
        };
        let followed = PromptRun {
            tokens: ours.tokens.clone(),
            choices: choices
                .iter()
                .zip(&ours.tokens)
                .map(|(c, &t)| Choice {
                    followed_logit: c.logit_of(t, None),
                    ..c.clone()
                })
                .collect(),
            ..PromptRun::default()
        };
        (baseline, followed)
    }

    fn check_one(o: &[Choice], a: &[Choice]) -> OutputCheck {
        let o = ours(o);
        let (baseline, followed) = alone(&o, a);
        let mut c = OutputCheck::new();
        c.add_prompt("p", &o, &baseline, Some(&followed));
        c
    }

    #[test]
    fn equal_outputs_are_identical_and_measure_how_rounding_moves_margins() {
        let c = check_one(
            &[
                at(&[(1, 10.2), (2, 8.0)]),
                at(&[(3, 9.0), (4, 7.0), (5, 1.0)]),
            ],
            &[
                at(&[(1, 10.0), (2, 8.1)]),
                at(&[(3, 9.0), (4, 7.0), (6, 2.0)]),
            ],
        );
        assert_eq!(c.same_output, SameOutput::Identical);
        assert!(c.identical && !c.differs());
        assert!(
            (c.max_margin_shift - 0.3).abs() < 1e-4,
            "{}",
            c.max_margin_shift
        );
    }

    #[test]
    fn a_flip_between_nearly_tied_tokens_is_a_near_tie_and_checking_goes_on() {
        // Alone 5 leads 6 by 0.2; with the draft 6 leads 5 by 0.1 (a third token close by too).
        // After the flip the target alone, following the draft's text, agrees again.
        let o = [
            at(&[(1, 10.0), (2, 8.0)]),
            at(&[(6, 7.0), (7, 6.95), (5, 6.9)]),
            at(&[(9, 4.0), (8, 1.0)]),
        ];
        let a = [
            at(&[(1, 10.0), (2, 8.0)]),
            at(&[(5, 7.1), (7, 7.0), (6, 6.9)]),
            at(&[(9, 4.0), (8, 1.0)]),
        ];
        let mut c = check_one(&o, &a);
        assert_eq!(c.same_output, SameOutput::NearTies);
        assert!(!c.identical && !c.differs());
        assert_eq!(c.near_ties.len(), 1);
        let n = &c.near_ties[0];
        assert_eq!((n.token, n.ours, n.alone), (1, 6, 5));
        assert!((n.ours_margin - 0.1).abs() < 1e-4 && (n.alone_margin - 0.2).abs() < 1e-4);
        assert!((c.max_near_tie_margin() - 0.3).abs() < 1e-4);
        // A real divergence after the near tie, on the same text, is still caught.
        let late = check_one(&o, &[a[0].clone(), a[1].clone(), at(&[(8, 4.0), (9, 1.0)])]);
        assert!(late.differs());
        assert_eq!(late.divergence.as_ref().unwrap().token, 2);
        // A real divergence on another prompt makes the whole output differ.
        let bad = ours(&[at(&[(1, 10.0), (2, 8.0)]), at(&[(2, 9.0), (1, 5.0)])]);
        let (baseline, followed) = alone(&bad, &[a[0].clone(), at(&[(1, 9.0), (2, 5.0)])]);
        c.add_prompt("code", &bad, &baseline, Some(&followed));
        assert!(c.differs());
        assert_eq!(c.divergence.as_ref().unwrap().prompt, "code");
    }

    #[test]
    fn a_flip_of_a_clear_lead_is_a_real_divergence() {
        let c = check_one(
            &[at(&[(1, 10.0), (2, 8.0)]), at(&[(6, 8.9), (5, 7.1)])],
            &[at(&[(1, 10.0), (2, 8.0)]), at(&[(5, 7.5), (6, 7.2)])],
        );
        assert!(c.differs());
        let d = c.divergence.unwrap();
        assert_eq!((d.token, d.ours, d.alone), (1, Some(6), Some(5)));
        assert_eq!(d.ours_margin.map(|m| (m * 10.0).round()), Some(18.0));
        assert!(d.reason.contains("moved by 2.100"), "{}", d.reason);
        // Just under the threshold it is a near tie.
        let under = check_one(
            &[at(&[(6, 7.2 + NEAR_TIE_NATS - 0.31), (5, 7.2)])],
            &[at(&[(5, 7.5), (6, 7.2)])],
        );
        assert_eq!(under.same_output, SameOutput::NearTies);
    }

    #[test]
    fn a_flip_to_a_token_far_down_the_list_is_a_real_divergence() {
        let c = check_one(
            &[at(&[(7, 9.0), (8, 8.9), (9, 8.0)])],
            &[at(&[(5, 7.0), (7, 6.99)])],
        );
        assert!(c.differs());
        let d = c.divergence.unwrap();
        assert!(
            d.reason.contains("not among the draft path's 3 best"),
            "{}",
            d.reason
        );
        assert_eq!(d.ours_margin, Some(1.0));
    }

    #[test]
    fn only_the_outputs_that_differ_are_followed() {
        let prompt = |name: &str| Prompt {
            name: name.into(),
            kind: "chat".into(),
            text: format!("{name} text"),
        };
        let prompts = [prompt("same"), prompt("flip")];
        let same = ours(&[at(&[(1, 5.0), (2, 4.0)])]);
        let o = ours(&[at(&[(6, 7.0), (5, 6.9)])]);
        let (baseline, followed) = alone(&o, &[at(&[(5, 7.0), (6, 6.95)])]);
        let runs = [same.clone(), o.clone()];
        let reference = [same.clone(), baseline];
        let c = check(&prompts, &runs, &reference, |texts, tokens| {
            assert_eq!(texts, ["flip text"]);
            assert_eq!(tokens, [vec![6]]);
            Ok(vec![followed.clone()])
        });
        assert_eq!(c.same_output, SameOutput::NearTies);
        assert_eq!(c.near_ties[0].prompt, "flip");
        // When the target alone cannot follow, the output that differs is not excused.
        let c = check(
            &prompts,
            &runs,
            &reference,
            |_, _| Err("worker died".into()),
        );
        assert!(c.differs());
        assert!(c.divergence.unwrap().reason.ends_with("worker died"));
        // Nothing differs: nothing is followed.
        let c = check(&prompts, &reference, &reference, |_, _| panic!("followed"));
        assert_eq!(c.same_output, SameOutput::Identical);
    }

    #[test]
    fn unchecked_missing_or_short_outputs_differ() {
        let a = [at(&[(1, 1.0), (2, 0.0)]), at(&[(3, 1.0), (4, 0.0)])];
        // Shorter than the target alone's, following it.
        let short = ours(&a[..1]);
        let mut c = OutputCheck::new();
        c.add_prompt("p", &short, &ours(&a), Some(&ours(&a)));
        assert!(c.differs());
        // No choices recorded.
        let o = PromptRun {
            tokens: vec![1, 3],
            ..PromptRun::default()
        };
        let mut c = OutputCheck::new();
        c.add_prompt("p", &o, &ours(&a), None);
        assert!(
            c.identical && c.differs(),
            "equal tokens, but nothing to check them by"
        );
        // Differing tokens that the target alone did not re-decode.
        let o = ours(&[a[0].clone(), at(&[(4, 1.0), (3, 0.99)])]);
        let mut c = OutputCheck::new();
        c.add_prompt("p", &o, &ours(&a), None);
        assert!(c.differs() && !c.identical);
        assert_eq!(c.divergence.unwrap().token, 1);
    }
}
