//! The measurement log: every repetition and failure appended as it arrives (JSON Lines), keyed by
//! model identity, llama.cpp build, machine fingerprint, workload and candidate, so an interrupted
//! run loses nothing and a re-run reuses what is still valid.

use crate::trial::TrialFailure;
use crate::worker::{Repetition, Workload};
use search_space::Candidate;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What makes a measurement reusable: the same file, build, machine and workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    pub model: String,
    pub llama: String,
    pub machine: String,
    pub workload: Workload,
}

/// One line of the log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    #[serde(default)]
    pub context: Option<Context>,
    pub candidate: Candidate,
    #[serde(default)]
    pub rep: Option<Repetition>,
    #[serde(default)]
    pub failure: Option<TrialFailure>,
    pub unix: u64,
}

impl Record {
    pub fn rep(c: &Candidate, rep: &Repetition) -> Self {
        Record { context: None, candidate: c.clone(), rep: Some(rep.clone()), failure: None, unix: now() }
    }
    pub fn failure(c: &Candidate, f: &TrialFailure) -> Self {
        Record { context: None, candidate: c.clone(), rep: None, failure: Some(f.clone()), unix: now() }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The append-only log of one (model, build, machine, workload), plus what earlier runs left in it.
pub struct MeasurementLog {
    path: PathBuf,
    context: Context,
    previous: Vec<Record>,
    pub corrupt_lines: usize,
    pub appended: usize,
    file: Option<std::fs::File>,
}

impl MeasurementLog {
    /// Opens (creating) the log at `path`; `reuse` loads earlier records with the same context.
    pub fn open(path: &Path, context: Context, reuse: bool) -> std::io::Result<MeasurementLog> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut previous = Vec::new();
        let mut corrupt_lines = 0;
        if reuse {
            if let Ok(text) = std::fs::read_to_string(path) {
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    match serde_json::from_str::<Record>(line) {
                        Ok(r) if r.context.as_ref() == Some(&context) => previous.push(r),
                        Ok(_) => {}
                        Err(_) => corrupt_lines += 1,
                    }
                }
            }
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(MeasurementLog { path: path.to_path_buf(), context, previous, corrupt_lines, appended: 0, file: Some(file) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn previous_count(&self) -> usize {
        self.previous.len()
    }

    /// Repetitions earlier runs measured for this candidate.
    pub fn previous_reps(&self, c: &Candidate) -> Vec<Repetition> {
        self.previous.iter().filter(|r| &r.candidate == c).filter_map(|r| r.rep.clone()).collect()
    }

    /// Appends one record as a single write (one line), flushed at once.
    pub fn append(&mut self, record: &Record) {
        let mut r = record.clone();
        r.context = Some(self.context.clone());
        let Ok(mut line) = serde_json::to_string(&r) else { return };
        line.push('\n');
        if let Some(f) = self.file.as_mut() {
            if f.write_all(line.as_bytes()).and_then(|_| f.flush()).is_ok() {
                self.appended += 1;
            }
        }
    }
}
