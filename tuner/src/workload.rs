//! The presets a user names a workload by (`--workload chat`): the request a run tunes for, whose
//! numbers become the measured `Workload` (a record of the measurement log, `crate::measuring`).

/// Workload presets: (prompt, gen, depth) of a representative request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadPreset {
    Chat,
    LongPrompt,
    Agent,
}

impl WorkloadPreset {
    pub const ALL: [WorkloadPreset; 3] = [
        WorkloadPreset::Chat,
        WorkloadPreset::LongPrompt,
        WorkloadPreset::Agent,
    ];

    pub fn numbers(self) -> (u32, u32, u32) {
        match self {
            WorkloadPreset::Chat => (256, 256, 1024),
            WorkloadPreset::LongPrompt => (3000, 128, 0),
            WorkloadPreset::Agent => (1024, 256, 2048),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WorkloadPreset::Chat => "chat",
            WorkloadPreset::LongPrompt => "long-prompt",
            WorkloadPreset::Agent => "agent",
        }
    }
}

impl std::str::FromStr for WorkloadPreset {
    type Err = String;

    /// A preset by its name, in any case (a profile records "agent" or "agent (adjusted)").
    fn from_str(s: &str) -> Result<Self, String> {
        (WorkloadPreset::ALL.into_iter())
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("'{s}' is not a workload (chat, long-prompt, agent)"))
    }
}
