//! From draft files to a report: check each draft's vocabulary (header, then llama.cpp), count its
//! memory with the target's against the budgets (llama.cpp's dry run), measure the compatible ones
//! that fit ([`super::search`]), and write the [`SpeculationReport`]. Shared by `autotune draft` and
//! `autotune tune --draft`.

use super::prompts::Prompt;
use super::report::SpeculationReport;
use super::search::{self, Candidate, DraftEntry, SearchSettings};
use super::serve::{CheckRequest, DraftModel, Fault, FootprintRequest};
use super::{compat, discover, DraftPlacement, Grid};
use crate::llama::{ContextSettings, ModelSettings};
use crate::measuring::DeviceBytes;
use crate::worker::Worker;
use crate::worker::{Request, Response};
use search_space::gguf::GgufInfo;
use search_space::size::format_size;
use search_space::CacheType;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How many drafts found beside a target are tried.
pub const MAX_DISCOVERED: usize = 3;

pub struct Setup {
    pub target: PathBuf,
    pub target_info: GgufInfo,
    /// Draft files as given; `auto` (or none at all) means the compatible smaller models beside the target.
    pub drafts: Vec<PathBuf>,
    pub settings: ModelSettings,
    pub context: ContextSettings,
    pub grid: Grid,
    /// N-gram speculation's settings (empty: not tried).
    pub ngram: super::ngram::NgramGrid,
    /// MTP draft lengths to try when the target has MTP heads (empty: not tried).
    pub mtp: Vec<u32>,
    /// Look for drafts beside the target when none is given (`autotune draft`; `tune` only with
    /// `--draft auto`).
    pub discover: bool,
    pub prompts: Vec<Prompt>,
    pub n_gen: u32,
    pub reps: u32,
    pub noise: f64,
    pub seed: u64,
    pub trial_timeout: Duration,
    pub budget: Duration,
    /// Memory each device may use (target and draft together).
    pub budgets: profiles::Budgets,
    pub llama_version: String,
}

/// The draft files to consider: those given (`auto` expands to the ones found beside the target).
pub fn draft_files(target: &Path, info: &GgufInfo, given: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let auto = given.is_empty() || given.iter().any(|p| p.as_os_str() == "auto");
    for p in given.iter().filter(|p| p.as_os_str() != "auto") {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    if auto {
        for p in discover::beside(target, info, MAX_DISCOVERED) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The draft's placement follows the target's: all its layers offloaded when the target offloads any.
pub fn draft_model(
    path: &Path,
    info: &GgufInfo,
    target: &ModelSettings,
    context: &ContextSettings,
) -> DraftModel {
    let n_gpu_layers = if target.n_gpu_layers > 0 {
        info.block_count.unwrap_or(0) + 1
    } else {
        0
    };
    DraftModel {
        path: path.to_path_buf(),
        settings: ModelSettings {
            n_gpu_layers,
            devices: target.devices.clone(),
            use_extra_bufts: target.use_extra_bufts,
            rpc: target.rpc.clone(),
            // One process runs both models: its NUMA strategy is the target's, and llama-server
            // loads the draft the way it loads the target.
            numa: target.numa,
            host_buffer: target.host_buffer,
            ..Default::default()
        },
        context: context.clone(),
    }
}

/// The draft placements tried besides the default one: the draft on the CPU when the target
/// offloads (it frees the GPU for the target and costs the draft little when it is small), and a q8_0
/// KV cache for the draft when the target's is wider (half the draft's cache memory).
pub fn alternative_placements(default: &DraftModel) -> Vec<DraftPlacement> {
    let base = default.placement();
    let mut out = Vec::new();
    if base.type_k != CacheType::Q8_0 || base.type_v != CacheType::Q8_0 {
        out.push(DraftPlacement {
            type_k: CacheType::Q8_0,
            type_v: CacheType::Q8_0,
            ..base
        });
    }
    if base.n_gpu_layers > 0 {
        out.push(DraftPlacement {
            n_gpu_layers: 0,
            ..base
        });
    }
    out
}

/// Examines the drafts (vocabulary, memory beside the target), measures those that fit and n-gram
/// speculation ([`search::run`]), and reports.
pub fn evaluate(s: &Setup, stop: &dyn Fn() -> bool, progress: &dyn Fn(&str)) -> SpeculationReport {
    let started = Instant::now();
    let Examined {
        mut entries,
        candidates,
        target_mem,
    } = examine_drafts(s, stop, progress);
    let settings = search_settings(s, s.budget.saturating_sub(started.elapsed()));
    if let Some(f) = settings.fault {
        eprintln!(
            "autotune: warning: AUTOTUNE_SPECULATIVE_FAULT is set: the draft loop runs with the test fault \
             {}, so every draft's output is wrong on purpose",
            f.name()
        );
    }
    let outcome =
        if candidates.iter().any(Option::is_some) || !s.ngram.is_empty() || measures_mtp(s) {
            match search::run(&settings, &candidates, &mut entries, stop, progress) {
                Ok(o) => Some(o),
                Err(e) => {
                    for (entry, c) in entries.iter_mut().zip(&candidates) {
                        if c.is_some() {
                            entry.status = format!("not measured: {e}");
                        }
                    }
                    None
                }
            }
        } else {
            None
        };
    let mut report = SpeculationReport::new(
        &s.target,
        s.target_info.file_type_name.clone(),
        target_mem
            .as_ref()
            .ok()
            .map(|d| d.iter().map(|x| x.bytes).sum()),
        &s.context,
        s.n_gen,
        &s.prompts,
        &s.grid,
        s.seed,
        s.noise,
        entries,
        outcome,
        started.elapsed().as_secs_f64(),
        s.llama_version.clone(),
    );
    report.fault = settings.fault;
    report.mtp = Some(super::mtp::assess(&s.target_info, measures_mtp(s)));
    report
}

/// Whether the target's MTP heads are measured: it has some and draft lengths are given.
fn measures_mtp(s: &Setup) -> bool {
    !s.mtp.is_empty() && super::mtp::heads(&s.target_info) > 0
}

/// The drafts examined: an entry per draft (n-gram speculation first, when it is tried), each with
/// its candidate when it can be measured, and the target's memory (dry run).
struct Examined {
    entries: Vec<DraftEntry>,
    candidates: Vec<Option<Candidate>>,
    target_mem: Result<Vec<DeviceBytes>, String>,
}

/// Examines every draft file (given, or found beside the target) in one helper worker.
fn examine_drafts(s: &Setup, stop: &dyn Fn() -> bool, progress: &dyn Fn(&str)) -> Examined {
    let files = if s.drafts.is_empty() && !s.discover {
        Vec::new()
    } else {
        draft_files(&s.target, &s.target_info, &s.drafts)
    };
    let mut entries: Vec<DraftEntry> = Vec::new();
    let mut candidates: Vec<Option<Candidate>> = Vec::new();
    if !s.ngram.is_empty() {
        // First: it loads nothing, so the budget never leaves it unmeasured.
        entries.push(DraftEntry::ngram());
        candidates.push(None);
    }
    if measures_mtp(s) {
        // Next: it needs no second model either.
        entries.push(DraftEntry::mtp());
        candidates.push(None);
    }
    // One worker for the vocabulary checks and the dry runs (each loads and frees what it needs).
    let mut helper = Helper {
        worker: None,
        s,
        stop,
    };
    progress("the target's memory (dry run)");
    let target_mem = helper.footprint(&s.target, &s.settings, &s.context, 0);
    for path in files {
        let (entry, candidate) = examine(&mut helper, path, &target_mem, progress);
        entries.push(entry);
        candidates.push(candidate);
    }
    helper.quit();
    Examined {
        entries,
        candidates,
        target_mem,
    }
}

/// The search's settings: the setup's, with what is left of the time `budget`.
fn search_settings(s: &Setup, budget: Duration) -> SearchSettings {
    SearchSettings {
        target: s.target.clone(),
        settings: s.settings.clone(),
        context: s.context.clone(),
        grid: s.grid.clone(),
        ngram: s.ngram.clone(),
        mtp: if measures_mtp(s) {
            s.mtp.clone()
        } else {
            Vec::new()
        },
        prompts: s.prompts.clone(),
        n_gen: s.n_gen,
        reps: s.reps,
        noise: s.noise,
        seed: s.seed,
        trial_timeout: s.trial_timeout,
        budget,
        fault: Fault::from_env(),
    }
}

/// One draft file: its vocabulary, its memory with the target's, and the placements that fit.
fn examine(
    helper: &mut Helper,
    path: PathBuf,
    target_mem: &Result<Vec<DeviceBytes>, String>,
    progress: &dyn Fn(&str),
) -> (DraftEntry, Option<Candidate>) {
    let s = helper.s;
    let mut entry = DraftEntry {
        path: path.clone(),
        spec_type: "draft-simple".into(),
        file_type: None,
        size_bytes: 0,
        status: String::new(),
        mem_bytes: None,
        trials: Vec::new(),
    };
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    let mut candidate = None;
    match GgufInfo::inspect(&path) {
        Err(e) => entry.status = format!("unreadable: {e}"),
        Ok(info) => {
            entry.file_type = info.file_type_name.clone();
            entry.size_bytes = info.file_size;
            progress(&format!("{}: vocabulary", path.display()));
            entry.status = match compat::precheck(&s.target_info, &info)
                .map_err(|e| e.to_string())
                .and_then(|()| helper.vocabulary(&path))
            {
                Err(reason) => format!("incompatible: {reason}"),
                Ok(()) => {
                    let model = draft_model(&path, &info, &s.settings, &s.context);
                    progress(&format!("{}: memory (dry run)", path.display()));
                    match (
                        target_mem,
                        helper.footprint(
                            &path,
                            &model.settings,
                            &model.context,
                            model.n_outputs_max(),
                        ),
                    ) {
                        (_, Err(e)) => format!("failed: dry run: {e}"),
                        (Err(e), _) => {
                            format!("not measured: the target's dry run failed: {e}")
                        }
                        (Ok(t), Ok(d)) => {
                            entry.mem_bytes = Some(d.iter().map(|x| x.bytes).sum());
                            match overflow(t, &d, &s.budgets) {
                                Some(why) => format!("does not fit: {why}"),
                                None => {
                                    let alternatives =
                                        alternatives(helper, &path, &model, t, progress);
                                    candidate = Some(Candidate {
                                        model,
                                        alternatives,
                                    });
                                    "measured".to_string()
                                }
                            }
                        }
                    }
                }
            };
        }
    }
    entry.path = path;
    (entry, candidate)
}

/// The draft's other placements, each with its own dry run: only those that fit beside the
/// target (`target_mem`) are measured.
fn alternatives(
    helper: &mut Helper,
    path: &Path,
    model: &DraftModel,
    target_mem: &[DeviceBytes],
    progress: &dyn Fn(&str),
) -> Vec<DraftModel> {
    let mut alternatives = Vec::new();
    for p in alternative_placements(model) {
        let alt = model.placed(p);
        progress(&format!(
            "{}: memory with {} (dry run)",
            path.display(),
            p.label()
        ));
        if let Ok(d) = helper.footprint(path, &alt.settings, &alt.context, alt.n_outputs_max()) {
            if overflow(target_mem, &d, &helper.s.budgets).is_none() {
                alternatives.push(alt);
            }
        }
    }
    alternatives
}

/// The worker that checks vocabularies and runs the dry runs (started on first use, replaced after
/// a crash), with the setup and the stop flag its requests need.
struct Helper<'a> {
    worker: Option<Worker>,
    s: &'a Setup,
    stop: &'a dyn Fn() -> bool,
}

impl Helper<'_> {
    /// One request to the helper worker.
    fn ask(&mut self, request: &Request) -> Result<Response, String> {
        if self.worker.is_none() {
            self.worker = Some(Worker::spawn().map_err(|e| format!("cannot start a worker: {e}"))?);
        }
        let answer = self.worker.as_mut().expect("spawned above").call(
            request,
            self.s.trial_timeout,
            self.stop,
        );
        answer.map_err(|f| {
            if !matches!(f, crate::measuring::TrialFailure::Refused { .. }) {
                self.worker = None;
            }
            crate::report::one_line(&f.to_string())
        })
    }

    /// llama.cpp's vocabulary check (vocab-only loads).
    fn vocabulary(&mut self, draft: &Path) -> Result<(), String> {
        let request = Request::DraftCheck(CheckRequest {
            target: self.s.target.clone(),
            draft: draft.to_path_buf(),
        });
        match self.ask(&request) {
            Ok(Response::DraftCheck(a)) => a.incompatible.map_or(Ok(()), |i| Err(i.to_string())),
            Ok(_) => Err("unexpected answer from the worker".into()),
            Err(e) => Err(format!("llama.cpp could not read the vocabulary: {e}")),
        }
    }

    /// Memory per device of a model with a context, from llama.cpp's dry run (no_alloc).
    fn footprint(
        &mut self,
        path: &Path,
        settings: &ModelSettings,
        context: &ContextSettings,
        n_outputs_max: u32,
    ) -> Result<Vec<DeviceBytes>, String> {
        let request = Request::SpecFootprint(FootprintRequest {
            path: path.to_path_buf(),
            settings: settings.clone(),
            context: context.clone(),
            n_outputs_max,
        });
        match self.ask(&request)? {
            Response::Footprint(r) => Ok(r.per_device),
            _ => Err("unexpected answer from the worker".into()),
        }
    }

    fn quit(self) {
        if let Some(w) = self.worker {
            w.quit();
        }
    }
}

/// Where target and draft together exceed a device's budget, in words.
pub fn overflow(
    target: &[DeviceBytes],
    draft: &[DeviceBytes],
    budgets: &profiles::Budgets,
) -> Option<String> {
    for profiles::DeviceBudget {
        device,
        bytes: budget,
        ..
    } in budgets.iter()
    {
        let of = |v: &[DeviceBytes]| {
            v.iter()
                .filter(|d| &d.device == device)
                .map(|d| d.bytes)
                .sum::<u64>()
        };
        let (t, d) = (of(target), of(draft));
        if d > 0 && t + d > *budget {
            return Some(format!(
                "{device}: target {} + draft {} = {} over its budget of {}",
                format_size(t),
                format_size(d),
                format_size(t + d),
                format_size(*budget)
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_memory_counts_with_the_targets() {
        let dev = |device: &str, bytes: u64| DeviceBytes {
            device: device.into(),
            bytes,
        };
        let budgets: profiles::Budgets = [("CPU".to_string(), 1000), ("CUDA0".to_string(), 500)]
            .into_iter()
            .collect();
        assert_eq!(
            overflow(&[dev("CPU", 600)], &[dev("CPU", 300)], &budgets),
            None
        );
        let why = overflow(&[dev("CUDA0", 400)], &[dev("CUDA0", 200)], &budgets).unwrap();
        assert!(why.starts_with("CUDA0: target"), "{why}");
    }

    #[test]
    fn the_drafts_other_placements_are_a_q8_0_cache_and_the_cpu() {
        let context = ContextSettings::defaults(512, 1).with_knobs(|c| c.n_batch = 512);
        let target = ModelSettings::default();
        let path = Path::new("d.gguf");
        let info = tiny_info(path);
        let cpu = draft_model(path, &info, &target, &context);
        let alts = alternative_placements(&cpu);
        assert_eq!(alts.len(), 1, "no GPU: only the KV type varies");
        assert_eq!((alts[0].type_k, alts[0].n_gpu_layers), (CacheType::Q8_0, 0));
        let gpu = draft_model(
            path,
            &info,
            &ModelSettings {
                n_gpu_layers: 99,
                ..target
            },
            &context.with_knobs(|c| (c.type_k, c.type_v) = (CacheType::Q8_0, CacheType::Q8_0)),
        );
        assert!(
            gpu.settings.n_gpu_layers > 0,
            "the draft follows the target"
        );
        let alts = alternative_placements(&gpu);
        assert_eq!(alts.len(), 1, "q8_0 already: only the CPU placement");
        assert_eq!(alts[0].n_gpu_layers, 0);
        assert_eq!(gpu.placed(alts[0]).placement(), alts[0]);
    }

    #[test]
    fn auto_means_the_files_beside_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t.gguf");
        let info = GgufInfo {
            file_size: 1,
            ..tiny_info(&target)
        };
        let given = vec![PathBuf::from("/x/a.gguf"), PathBuf::from("/x/a.gguf")];
        assert_eq!(
            draft_files(&target, &info, &given),
            [PathBuf::from("/x/a.gguf")]
        );
        assert!(
            draft_files(&target, &info, &[]).is_empty(),
            "an empty folder has no drafts"
        );
    }

    fn tiny_info(path: &Path) -> GgufInfo {
        let bytes = search_space::testfiles::GgufBuilder::tiny_model("llama").build();
        GgufInfo::from_reader(&bytes[..], bytes.len() as u64, path).unwrap()
    }
}
