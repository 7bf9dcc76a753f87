//! Speculation chosen for the user's workload: which built-in prompt kinds a `--workload` preset
//! stands for, and whether text repeats there (so n-gram speculation is worth measuring in `tune`).
//! The search then measures on those prompts only, so its paired comparison with the target alone
//! — the rule that enables speculation — is about the workload the user runs.

use super::prompts::Prompt;
use crate::cli::WorkloadPreset;

/// The built-in prompt kinds a preset stands for: chat is chat; an agent reads and writes code and
/// repeats its tool calls' text; a long prompt is a document to summarise.
pub fn kinds(w: WorkloadPreset) -> &'static [&'static str] {
    match w {
        WorkloadPreset::Chat => &["chat"],
        WorkloadPreset::Agent => &["code", "repetitive"],
        WorkloadPreset::LongPrompt => &["summarisation"],
    }
}

/// Workloads whose output repeats text of their context (where n-gram speculation can pay).
pub fn text_repeats(w: Option<WorkloadPreset>) -> bool {
    matches!(w, Some(WorkloadPreset::Agent | WorkloadPreset::LongPrompt))
}

/// The prompts to measure on: the user's own set whole, or the built-in prompts of the workload's
/// kinds (all of them without a workload).
pub fn prompts_for(w: Option<WorkloadPreset>, prompts: Vec<Prompt>, own: bool) -> Vec<Prompt> {
    let Some(w) = w.filter(|_| !own) else {
        return prompts;
    };
    let chosen: Vec<Prompt> = prompts
        .iter()
        .filter(|p| kinds(w).contains(&p.kind.as_str()))
        .cloned()
        .collect();
    if chosen.is_empty() {
        prompts
    } else {
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::prompts::built_in;

    #[test]
    fn a_workload_measures_its_own_kinds() {
        let all = built_in();
        let agent = prompts_for(Some(WorkloadPreset::Agent), all.clone(), false);
        assert!(!agent.is_empty());
        assert!(agent
            .iter()
            .all(|p| p.kind == "code" || p.kind == "repetitive"));
        let long = prompts_for(Some(WorkloadPreset::LongPrompt), all.clone(), false);
        assert!(long.iter().all(|p| p.kind == "summarisation"));
        assert_eq!(prompts_for(None, all.clone(), false), all);
        assert_eq!(
            prompts_for(Some(WorkloadPreset::Chat), all.clone(), true),
            all,
            "the user's own prompts are their workload"
        );
    }

    #[test]
    fn text_repeats_for_agents_and_documents_not_chat() {
        assert!(text_repeats(Some(WorkloadPreset::Agent)));
        assert!(text_repeats(Some(WorkloadPreset::LongPrompt)));
        assert!(!text_repeats(Some(WorkloadPreset::Chat)));
        assert!(!text_repeats(None));
    }
}
