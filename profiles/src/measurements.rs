//! The measurement log: every repetition and failure appended as it arrives (JSON Lines), keyed by
//! model identity, llama.cpp build, machine fingerprint, workload and candidate, so an interrupted
//! run loses nothing and a re-run reuses what is still valid.
//!
//! The records are plain data (no llama.cpp), so the parser can be fuzzed on its own.

use search_space::Candidate;
use search_space::Phases;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

pub use crate::workload::Workload;

/// Memory of a loaded configuration: what llama.cpp reported per buffer and what the process holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub load_seconds: f64,
    pub buffers: Vec<BufferReport>,
    /// Resident set size of the worker after load and context creation.
    pub rss_bytes: u64,
    /// Sum of the buffers llama.cpp reported.
    pub reported_bytes: u64,
    /// Bytes per device as llama.cpp's buffers attribute them (device name → bytes).
    #[serde(default)]
    pub per_device: Vec<DeviceBytes>,
    /// Bytes per device really taken: device memory free before load minus after (non-CPU devices);
    /// on the host the worker's growth (after the first repetition: private memory plus the model
    /// file's pages inference read). Absent for dry runs.
    #[serde(default)]
    pub actual: Vec<DeviceBytes>,
    /// Bytes of the mmap'd model file that inference read (pages referenced during the first
    /// measured repetition). llama.cpp counts a mapped buffer as the whole file range its tensors
    /// span: with repacked weights (copied out of the mapping at load) or layers on a GPU that range
    /// holds tensors read once and never again, pages the kernel may drop at no cost. Absent for dry
    /// runs, before inference, and where the kernel cannot tell (`/proc/self/clear_refs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapped_in_use: Option<u64>,
}

impl LoadReport {
    /// Memory the configuration holds: llama.cpp's own figures, except that its mmap'd buffers
    /// count as the pages inference read from them ([`Self::mapped_in_use`]) where known.
    pub fn held_bytes(&self) -> u64 {
        match self.mapped_in_use {
            Some(used) => {
                let mapped = self.mapped_bytes();
                self.reported_bytes.saturating_sub(mapped) + used.min(mapped)
            }
            None => self.reported_bytes,
        }
    }

    /// llama.cpp's mmap'd model buffers (`CPU_Mapped`): the file ranges their tensors span.
    pub fn mapped_bytes(&self) -> u64 {
        (self.buffers.iter())
            .filter(|b| b.buffer.ends_with("_Mapped") && b.what == "model")
            .map(|b| b.bytes)
            .sum()
    }
}

/// A number of bytes on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceBytes {
    pub device: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repetition {
    pub pp_tps: f64,
    pub tg_tps: f64,
    /// Prompt processing after `depth` tokens in the cache (the workload's prompt in a long chat);
    /// absent without a depth, and in records written before autotune timed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_depth_tps: Option<f64>,
    /// Generation after `depth` tokens in the cache.
    #[serde(default)]
    pub tg_depth_tps: Option<f64>,
    /// Present on the first repetition after a (re)load or new context.
    #[serde(default)]
    pub load: Option<LoadReport>,
    /// The phases this repetition timed; the other phase's figures are estimates borrowed from the
    /// candidates it was compared with, which differ from it only in knobs that cannot move that
    /// phase (`search_space::knob::phases_moved`). Both in every repetition of earlier logs.
    #[serde(default = "Phases::both", skip_serializing_if = "Phases::is_both")]
    pub timed: Phases,
    /// The request this repetition timed where the search screened candidates on one shorter than
    /// the workload's; absent: the workload's own request (and in every repetition of earlier logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<Screen>,
}

/// A request shorter than the workload's, on which the search screens candidates: fewer generated
/// tokens, and a shorter prompt where the knobs compared show their effect on one. Its rates stand
/// for the workload's in the search's ranking; the finalists are measured again on the workload's
/// own request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Screen {
    pub n_prompt: u32,
    pub n_gen: u32,
}

impl std::fmt::Display for Screen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pp{}/tg{}", self.n_prompt, self.n_gen)
    }
}

/// One buffer llama.cpp reported allocating, e.g. `CPU_Mapped model buffer size = 241.00 MiB`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BufferReport {
    /// The buffer type's name (`CPU_Mapped`, `CPU_REPACK`, `CUDA0`, `RPC0[127.0.0.1:50052]`, ...).
    pub buffer: String,
    /// model, KV, compute, output, RS
    pub what: String,
    pub bytes: u64,
}

/// The stage of a [`TrialFailure::Refused`] that autotune's memory check, not llama.cpp, refused.
pub const MEMORY_CHECK: &str = "memory check";

/// How a trial ended when it did not produce a figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TrialFailure {
    /// llama.cpp returned an error (the worker survived); at stage [`MEMORY_CHECK`], autotune's own
    /// check refused to load what would not fit in the memory free right then.
    Refused { stage: String, message: String },
    /// The worker died of a signal (SIGILL in a kernel, SIGABRT from GGML_ASSERT, SIGKILL from the OOM
    /// killer or a user).
    Crashed {
        signal: i32,
        name: String,
        stderr_tail: String,
    },
    /// The worker exited without answering.
    Exited { code: i32, stderr_tail: String },
    /// No answer within the deadline; the worker was killed.
    TimedOut { seconds: u64 },
    /// The run was interrupted (Ctrl-C / SIGTERM) while this trial was in flight.
    Interrupted,
    /// The worker failed (`failure`) and, asked right after, an RPC server the trial ran on was
    /// down or did not answer (`problem`, naming `endpoint`): the host's fault, not the
    /// configuration's.
    RpcHost {
        endpoint: String,
        problem: String,
        failure: Box<TrialFailure>,
    },
    /// Stopped by autotune, the worker alive: the time it had taken already proved a request
    /// slower than `limit_ms`, a multiple of `best_ms` (the best median measured so far), so it
    /// could not win. A figure of the configuration, not a fault of it. `load`: the memory of the
    /// load it stopped on (absent in records written before it was kept). `took_ms`: absent where
    /// it stopped mid-repetition; where its first repetition finished and took that long a request,
    /// beyond the limit, it was not repeated.
    GaveUp {
        limit_ms: u64,
        best_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        load: Option<Box<LoadReport>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        took_ms: Option<u64>,
    },
}

impl TrialFailure {
    /// Stopped as too slow ([`TrialFailure::GaveUp`]): a figure, not a fault.
    pub fn gave_up(&self) -> bool {
        matches!(self, TrialFailure::GaveUp { .. })
    }

    /// The configuration did not fit: autotune's memory check refused to load it, or llama.cpp
    /// ran out of memory loading it (its message says so; a host's fault is not the
    /// configuration's).
    pub fn out_of_memory(&self) -> bool {
        let says = |text: &str| {
            let t = text.to_lowercase();
            t.contains("out of memory") || t.contains("outofdevicememory")
        };
        match self {
            TrialFailure::Refused { stage, message } => stage == MEMORY_CHECK || says(message),
            TrialFailure::Crashed { stderr_tail, .. }
            | TrialFailure::Exited { stderr_tail, .. } => says(stderr_tail),
            _ => false,
        }
    }
}

impl std::fmt::Display for TrialFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrialFailure::Refused { stage, message } if stage == MEMORY_CHECK => {
                write!(f, "{message}")
            }
            TrialFailure::Refused { stage, message } => {
                write!(f, "llama.cpp refused at {stage}: {message}")
            }
            TrialFailure::Crashed {
                name, stderr_tail, ..
            } => {
                write!(f, "worker killed by {name}")?;
                if !stderr_tail.is_empty() {
                    write!(f, " ({stderr_tail})")?;
                }
                Ok(())
            }
            TrialFailure::Exited { code, stderr_tail } => {
                write!(f, "worker exited with code {code}: {stderr_tail}")
            }
            TrialFailure::TimedOut { seconds } => {
                write!(f, "no answer within {seconds} s; worker killed")
            }
            TrialFailure::Interrupted => write!(f, "interrupted"),
            TrialFailure::RpcHost {
                endpoint,
                problem,
                failure,
            } => write!(
                f,
                "RPC server {endpoint} lost mid-trial: {problem} (the trial: {failure})"
            ),
            TrialFailure::GaveUp {
                limit_ms,
                best_ms,
                took_ms: Some(took),
                ..
            } => write!(
                f,
                "stopped after one repetition: {:.2} s per request, more than {}x the best so far ({:.2} s)",
                *took as f64 / 1e3,
                factor(*limit_ms, *best_ms),
                *best_ms as f64 / 1e3
            ),
            TrialFailure::GaveUp {
                limit_ms, best_ms, ..
            } => write!(
                f,
                "stopped mid-repetition: slower than {:.2} s per request ({}x the best so far, {:.2} s)",
                *limit_ms as f64 / 1e3,
                factor(*limit_ms, *best_ms),
                *best_ms as f64 / 1e3
            ),
        }
    }
}

/// A limit's factor over the best, as the tuner set it (1.5, 1.75): two decimals at most, trailing
/// zeros cut.
fn factor(limit_ms: u64, best_ms: u64) -> String {
    let f = format!("{:.2}", limit_ms as f64 / best_ms.max(1) as f64);
    f.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// What makes a measurement reusable: the same file, build, machine and workload (its numbers, not
/// its name: [`Workload::shape`]).
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
        Record {
            context: None,
            candidate: c.clone(),
            rep: Some(rep.clone()),
            failure: None,
            unix: now(),
        }
    }
    pub fn failure(c: &Candidate, f: &TrialFailure) -> Self {
        Record {
            context: None,
            candidate: c.clone(),
            rep: None,
            failure: Some(f.clone()),
            unix: now(),
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
        let context = Context {
            workload: context.workload.shape(),
            ..context
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut previous = Vec::new();
        let mut corrupt_lines = 0;
        if reuse {
            if let Ok(text) = std::fs::read_to_string(path) {
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    match parse_line(line) {
                        Some(r) if r.context.as_ref() == Some(&context) => previous.push(r),
                        Some(_) => {}
                        None => corrupt_lines += 1,
                    }
                }
            }
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(MeasurementLog {
            path: path.to_path_buf(),
            context,
            previous,
            corrupt_lines,
            appended: 0,
            file: Some(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn previous_count(&self) -> usize {
        self.previous.len()
    }

    /// Repetitions earlier runs measured for this candidate. With a depth, only those that timed the
    /// prompt at depth too (older records timed generation alone there).
    pub fn previous_reps(&self, c: &Candidate) -> Vec<Repetition> {
        let depth = self.context.workload.depth > 0;
        self.previous
            .iter()
            .filter(|r| &r.candidate == c)
            .filter_map(|r| r.rep.clone())
            .filter(|r| !depth || r.pp_depth_tps.is_some())
            .collect()
    }

    /// Appends one record as a single write (one line), flushed at once.
    pub fn append(&mut self, record: &Record) {
        let mut r = record.clone();
        r.context = Some(self.context.clone());
        let Ok(mut line) = serde_json::to_string(&r) else {
            return;
        };
        line.push('\n');
        if let Some(f) = self.file.as_mut() {
            if f.write_all(line.as_bytes()).and_then(|_| f.flush()).is_ok() {
                self.appended += 1;
            }
        }
    }
}

/// Parses one line of the log (what the fuzzer exercises); `None` for a corrupt line.
pub fn parse_line(line: &str) -> Option<Record> {
    serde_json::from_str(line).ok()
}

#[cfg(test)]
mod tests {
    use super::{
        BufferReport, Context, LoadReport, MeasurementLog, Record, Repetition, TrialFailure,
        Workload,
    };
    use search_space::Candidate;

    /// What did not fit: autotune's memory check, or llama.cpp's own words on a load; not a crash,
    /// a timeout or a refusal for another reason.
    #[test]
    fn out_of_memory_is_a_memory_check_or_llama_cpps_words() {
        let refused = |stage: &str, message: &str| TrialFailure::Refused {
            stage: stage.into(),
            message: message.into(),
        };
        assert!(refused(super::MEMORY_CHECK, "not loaded").out_of_memory());
        assert!(refused("load", "cudaMalloc failed: out of memory").out_of_memory());
        assert!(!refused("load", "unknown model architecture").out_of_memory());
        let exited = |tail: &str| TrialFailure::Exited {
            code: 1,
            stderr_tail: tail.into(),
        };
        assert!(exited("ggml_vulkan: ErrorOutOfDeviceMemory").out_of_memory());
        assert!(!exited("GGML_ASSERT(x) failed").out_of_memory());
        assert!(!TrialFailure::TimedOut { seconds: 9 }.out_of_memory());
    }

    /// A stop's factor reads as the tuner set it, not rounded to one decimal (1.75 was "1.7x" or
    /// "1.8x" by the millisecond).
    #[test]
    fn a_stop_names_its_factor_over_the_best() {
        let stop = |limit_ms, best_ms, took_ms| TrialFailure::GaveUp {
            limit_ms,
            best_ms,
            load: None,
            took_ms,
        };
        assert_eq!(
            stop(45_000, 25_710, None).to_string(),
            "stopped mid-repetition: slower than 45.00 s per request (1.75x the best so far, 25.71 s)"
        );
        assert_eq!(
            stop(3_000, 2_000, Some(3_500)).to_string(),
            "stopped after one repetition: 3.50 s per request, more than 1.5x the best so far (2.00 s)"
        );
        assert!(stop(4_000, 2_000, None)
            .to_string()
            .contains("(2x the best"));
    }

    fn buffer(buffer: &str, what: &str, bytes: u64) -> BufferReport {
        BufferReport {
            buffer: buffer.into(),
            what: what.into(),
            bytes,
        }
    }

    #[test]
    fn a_mapped_buffer_counts_as_the_pages_inference_read() {
        let gib = 1u64 << 30;
        // A repacked load as llama.cpp reports it: the mapped range (the whole file) and the
        // repacked copy of most of it, then the KV cache.
        let mut l = LoadReport {
            buffers: vec![
                buffer("CPU_Mapped", "model", 4 * gib),
                buffer("CPU_REPACK", "model", 3 * gib),
                buffer("CPU", "KV", gib),
            ],
            reported_bytes: 8 * gib,
            ..LoadReport::default()
        };
        assert_eq!(l.held_bytes(), 8 * gib, "unknown: llama.cpp's figure");
        l.mapped_in_use = Some(gib);
        assert_eq!(l.held_bytes(), 5 * gib);
        // Never more than the mapped buffer itself.
        l.mapped_in_use = Some(9 * gib);
        assert_eq!(l.held_bytes(), 8 * gib);
    }

    /// With a depth, a repetition reused from an earlier run must have timed the prompt at depth:
    /// records from before that was measured are left out (their score would mix an empty-cache
    /// prompt into a request at depth).
    #[test]
    fn reps_without_the_prompt_at_depth_are_not_reused_for_a_depth() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let context = |depth| Context {
            model: "m".into(),
            llama: "l".into(),
            machine: "x".into(),
            workload: Workload {
                n_ctx: 8192,
                n_prompt: 512,
                n_gen: 128,
                depth,
                n_parallel: 1,
                name: String::new(),
            },
        };
        let c = Candidate::llama_default(4, 0);
        let rep = |pp_depth| Repetition {
            pp_tps: 100.0,
            tg_tps: 10.0,
            pp_depth_tps: pp_depth,
            tg_depth_tps: Some(8.0),
            load: None,
            timed: search_space::Phases::BOTH,
            screen: None,
        };
        let mut log = MeasurementLog::open(&path, context(4096), true).unwrap();
        log.append(&Record::rep(&c, &rep(None)));
        log.append(&Record::rep(&c, &rep(Some(60.0))));
        drop(log);
        let log = MeasurementLog::open(&path, context(4096), true).unwrap();
        assert_eq!(log.previous_count(), 2);
        assert_eq!(log.previous_reps(&c), [rep(Some(60.0))]);
    }

    /// A log is keyed on the workload's numbers: a run under a preset's name reuses what a run of
    /// the same shape under another name (or none, as logs were written before workloads carried
    /// one) measured, and the lines it writes carry no name.
    #[test]
    fn the_workloads_name_is_not_part_of_the_logs_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let context = |name: &str| Context {
            model: "m".into(),
            llama: "l".into(),
            machine: "x".into(),
            workload: Workload {
                n_ctx: 4096,
                n_prompt: 512,
                n_gen: 128,
                depth: 0,
                n_parallel: 1,
                name: name.into(),
            },
        };
        let c = Candidate::llama_default(4, 0);
        let rep = Repetition {
            pp_tps: 100.0,
            tg_tps: 10.0,
            pp_depth_tps: None,
            tg_depth_tps: None,
            load: None,
            timed: search_space::Phases::BOTH,
            screen: None,
        };
        let mut log = MeasurementLog::open(&path, context(""), true).unwrap();
        log.append(&Record::rep(&c, &rep));
        drop(log);
        let mut log = MeasurementLog::open(&path, context("chat"), true).unwrap();
        assert_eq!(log.previous_reps(&c), std::slice::from_ref(&rep));
        log.append(&Record::rep(&c, &rep));
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("chat"), "{text}");
        let log = MeasurementLog::open(&path, context("code"), true).unwrap();
        assert_eq!(log.previous_count(), 2);
    }
}
