//! Speculation chosen for the user's workload: which built-in prompt kinds a `--workload` preset
//! stands for, and whether text repeats there (so n-gram speculation is worth measuring in `tune`).
//! The search then measures on those prompts only, so its paired comparison with the target alone
//! — the rule that enables speculation — is about the workload the user runs.

use super::prompts::Prompt;
use crate::llama::ContextSettings;
use crate::workload::WorkloadPreset;

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

/// The prompts for `slots` requests at once: the list repeated from its start until it makes whole
/// groups of `slots` (each group is generated together); unchanged for one slot.
pub fn fill_slots(prompts: Vec<Prompt>, slots: u32) -> Vec<Prompt> {
    let n = slots.max(1) as usize;
    if prompts.is_empty() || prompts.len().is_multiple_of(n) {
        return prompts;
    }
    let whole = prompts.len().div_ceil(n) * n;
    prompts.iter().cycle().take(whole).cloned().collect()
}

/// The context for `slots` requests at once: one sequence each, and a batch that holds every
/// slot's last token and longest draft (`n_max`) at once, as the check of a round decodes them.
pub fn for_slots(context: ContextSettings, slots: u32, n_max: u32) -> ContextSettings {
    let n_batch = context.n_batch.max(slots.max(1) * (n_max + 1));
    context
        .with_sequences(slots)
        .with_knobs(|c| c.n_batch = n_batch)
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
    fn prompts_make_whole_groups_of_slots() {
        let all = built_in();
        let three: Vec<Prompt> = all.iter().take(3).cloned().collect();
        assert_eq!(fill_slots(three.clone(), 1), three);
        let four = fill_slots(three.clone(), 4);
        assert_eq!(four.len(), 4);
        assert_eq!(four[3], three[0], "repeated from the start");
        assert_eq!(fill_slots(three.clone(), 3), three);
        assert_eq!(fill_slots(three.clone(), 2).len(), 4);
        assert!(fill_slots(Vec::new(), 4).is_empty());
    }

    #[test]
    fn the_context_of_slots_holds_every_slots_draft_in_one_batch() {
        let mut c = search_space::Candidate::llama_default(2, 0);
        c.n_batch = 64;
        let base = ContextSettings::for_candidate(&c, 4096);
        let one = for_slots(base.clone(), 1, 16);
        assert_eq!((one.sequences, one.n_batch), (1, 64));
        let eight = for_slots(base, 8, 16);
        assert_eq!((eight.sequences, eight.n_batch), (8, 136));
    }

    #[test]
    fn text_repeats_for_agents_and_documents_not_chat() {
        assert!(text_repeats(Some(WorkloadPreset::Agent)));
        assert!(text_repeats(Some(WorkloadPreset::LongPrompt)));
        assert!(!text_repeats(Some(WorkloadPreset::Chat)));
        assert!(!text_repeats(None));
    }
}
