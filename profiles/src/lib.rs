//! Tuning results as TOML profiles: reading, checking and storing them, and turning one into the
//! llama-server command line (or a llama-swap, Ollama or preset entry) it stands for.
//!
//! A profile is treated as input: [`Profile::validate`] rejects anything that could put more on
//! llama-server's command line than the winning configuration, and the server is always started with
//! [`Profile::server_args`] as an argv, never through a shell.

mod backends;
mod budgets;
mod draft;
mod error;
mod export;
mod hosts;
pub mod measurements;
mod mtp;
mod ngram;
mod profile;
mod quality;
mod roofline;
pub mod serde_one;
mod server_args;
mod store;
mod validate;
mod workload;

#[cfg(any(test, feature = "test-support"))]
mod fixture;

pub use backends::BackendTrial;
pub use budgets::{Budgets, DeviceBudget};
pub use draft::{DraftSettings, MAX_DRAFT};
pub use error::{ProfileError, Result};
pub use export::{export, export_many, ExportFormat, Exporter};
pub use hosts::HostLink;
pub use mtp::{mtp_options, MtpSettings, DRAFT_MTP};
pub use ngram::{ngram_options, NgramSettings, MAX_NGRAM_SIZE};
pub use profile::{
    DeviceRef, Figures, Judged, LeaderboardEntry, LlamaBuild, MachineRef, ModelRef, Profile,
    ProfileSummary, VersusDefaults, Workload, SCHEMA_VERSION,
};
pub use quality::{
    fmt_kld, quality_line, KvQualityCheck, MeasuredWith, QualityFigures, QualityRecord,
};
pub use roofline::{DeviceBandwidth, Roofline};
pub use server_args::{
    draft_options, server_args, server_options, shell_quote, ServerOption, SERVER_CHOICES,
};
pub use store::{
    write_atomic, MachineProfiles, Store, StoreEntry, StoreLock, StoredProfile, PROFILE_DIR_ENV,
};
pub use validate::{is_device_name, MAX_BATCH, MAX_CTX, MAX_GPU_LAYERS, MAX_PARALLEL, MAX_THREADS};
pub use workload::slot_ctx;

#[cfg(any(test, feature = "test-support"))]
pub use fixture::example_profile;

/// A message as one line of a profile or a leaderboard status: llama.cpp's multi-line messages
/// joined with " | ", blank lines dropped.
pub fn one_line(s: &str) -> String {
    s.split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}
