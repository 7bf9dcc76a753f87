//! Quality of a ladder: for every rung, and for every KV-cache type (on the reference's weights), the
//! KL divergence of its next-token distributions from the reference's and how often both agree on
//! the most likely token, over an evaluation text shipped with autotune (`assets/eval.txt`: English
//! prose, code, dialogue and a specification written for this purpose, about 14,100 words; the
//! token count depends on the model's vocabulary).
//!
//! Each evaluation runs in a worker (llama.cpp, logits for every position, the text cut into chunks
//! of the context size) and is cached in `$AUTOTUNE_CACHE_DIR/quality/` by the identities of both
//! files, the KV types, the text, the chunking and what it was measured with (llama.cpp's build,
//! the backend, flash attention: [`MeasuredWith`]), so a second `quality` or `tune --max-kld` costs
//! nothing, and a figure is never reused where any of these changed.

use super::kld::QualityFigures;
use super::ladder::{Ladder, Rung};
use super::serve::{QualityAnswer, QualityJob, QualityRequest};
use crate::measuring::TrialFailure;
use crate::measuring::{KvQualityAnswer, KvQualityRequest};
use crate::worker::Worker;
use crate::worker::{Request, Response};
use indicatif::ProgressBar;
use profiles::MeasuredWith;
use search_space::identity::ModelIdentity;
use search_space::{CacheType, FlashAttn};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod table;
pub use table::fmt_kld;

/// The evaluation text built into autotune.
pub const EVAL_TEXT: &str = include_str!("../../assets/eval.txt");

/// What a quality row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A weight quantization (with an f16 KV cache) against the reference.
    Weights,
    /// The reference's weights with a KV-cache type against the same with f16.
    Kv,
}

/// One evaluation's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityRow {
    pub kind: Kind,
    pub file_type: String,
    /// The K cache's type, and the V cache's where it differs (`None`: the same as K).
    pub kv: CacheType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_v: Option<CacheType>,
    pub model: PathBuf,
    pub model_fingerprint: String,
    pub size_bytes: u64,
    pub reference: PathBuf,
    pub reference_fingerprint: String,
    /// `None` when the evaluation failed (see `error`).
    pub figures: Option<QualityFigures>,
    pub tokens: u64,
    pub chunks: u32,
    pub seconds: f64,
    /// Read from the cache rather than evaluated now.
    #[serde(default)]
    pub cached: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// llama.cpp's build, the backend and flash attention it was measured with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_with: Option<MeasuredWith>,
    /// The gate the evaluation could stop at once its verdict was decided
    /// ([`EvalSettings::decide_at`]): its figures may rest on fewer windows, good for that gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<f64>,
    /// Where `decided_at` is: each window's mean KL divergence, so another gate can be decided
    /// from them ([`crate::quant::kld::decided`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub window_means: Vec<f64>,
}

impl QualityRow {
    pub fn kld(&self) -> Option<f64> {
        self.figures.as_ref().map(|f| f.kld_mean)
    }
    /// Whether the row stays under a gate (a failed evaluation never does).
    pub fn passes(&self, max_kld: f64) -> bool {
        self.kld().is_some_and(|k| k <= max_kld)
    }
}

/// How to evaluate.
#[derive(Debug, Clone)]
pub struct EvalSettings {
    pub text: String,
    pub max_tokens: Option<u32>,
    pub chunk: u32,
    /// Compare only the last this many positions of each chunk (see [`QualityRequest::scored`]).
    pub scored: Option<u32>,
    pub threads: u32,
    /// Layers offloaded where a device exists (falling back to the CPU when the model does not
    /// load so).
    pub n_gpu_layers: u32,
    /// The devices they go to (empty: llama.cpp's default, every one).
    pub devices: Vec<String>,
    /// What the figures are measured with (its flash attention is the contexts').
    pub with: MeasuredWith,
    /// The rotation of the compared models' quantized caches (the reference's f16 cache is never
    /// rotated).
    pub attn_rot: search_space::AttnRot,
    /// Where every context keeps its cache (`off`: in host memory, `-nkvo`).
    pub kv_offload: search_space::KvOffload,
    /// A gate the rows are held to: the evaluation stops after the window where each verdict is
    /// decided ([`crate::quant::kld::decided`]); `None`: every window (a table's figures).
    pub decide_at: Option<f64>,
    /// Ignore cached results.
    pub fresh: bool,
    pub cache_dir: PathBuf,
    pub quiet: bool,
}

impl EvalSettings {
    fn text_hash(&self) -> String {
        hex::encode(Sha256::digest(self.text.as_bytes()))[..12].to_string()
    }
}

/// What an evaluation with `n_gpu_layers` on `devices` (empty: every device llama.cpp offloads to
/// by default) and `flash_attn` is measured with in this process's llama.cpp (initialised).
pub fn measured_with(n_gpu_layers: u32, devices: &[String], flash_attn: FlashAttn) -> MeasuredWith {
    let (listed, _) = crate::llama::device_view();
    let offload: Vec<&crate::llama::DeviceInfo> = (listed.iter())
        .filter(|d| matches!(d.kind.as_str(), "gpu" | "igpu"))
        .collect();
    let mut backends: Vec<String> = if n_gpu_layers == 0 || offload.is_empty() {
        vec!["CPU".into()]
    } else if devices.is_empty() {
        offload.iter().map(|d| d.backend.clone()).collect()
    } else {
        (devices.iter())
            .map(|n| match listed.iter().find(|d| &d.name == n) {
                Some(d) => d.backend.clone(),
                None => n.trim_end_matches(|c: char| c.is_ascii_digit()).to_string(),
            })
            .collect()
    };
    backends.dedup();
    MeasuredWith {
        llama: crate::llama::build_info().0,
        backend: backends.join("+"),
        flash_attn,
    }
}

/// A short key of what figures are measured with, for cache file names.
fn with_key(with: &MeasuredWith) -> String {
    let text = format!("{}|{}|{}", with.llama, with.backend, with.flash_attn);
    hex::encode(Sha256::digest(text.as_bytes()))[..10].to_string()
}

/// Where the figures were computed beside a device, which changes them a little (the host's layers
/// and a cache kept in host memory, `-nkvo`, run on the CPU's kernels): the layers offloaded and
/// the cache's place. Nothing on the CPU alone, whatever was asked (the rows measured there before
/// this key keep their names).
fn placement_key(s: &EvalSettings, with: &MeasuredWith) -> String {
    if with.backend == "CPU" {
        return String::new();
    }
    let kvo = if s.kv_offload.is_on() { "" } else { "-nkvo" };
    format!("-g{}{kvo}", s.n_gpu_layers)
}

/// The whole table: the reference, the weight rows (most precise first) and the KV rows.
#[derive(Debug, Clone, Serialize)]
pub struct QualityTable {
    pub reference: PathBuf,
    pub reference_type: String,
    pub text_tokens: u64,
    pub chunk: u32,
    pub weights: Vec<QualityRow>,
    pub kv: Vec<QualityRow>,
}

/// A file to evaluate: where, what type, which identity.
#[derive(Debug, Clone)]
pub struct Subject {
    pub path: PathBuf,
    pub file_type: String,
    pub size_bytes: u64,
    pub identity: ModelIdentity,
}

impl Subject {
    pub fn of(r: &Rung) -> std::io::Result<Subject> {
        Ok(Subject {
            path: r.path.clone(),
            file_type: r.file_type.clone(),
            size_bytes: r.size_bytes,
            identity: ModelIdentity::of_file(&r.path)?,
        })
    }
}

/// One evaluation to run: a model (with an f16 cache for weights, `kv` for KV rows) against the
/// reference.
pub struct Task<'s> {
    pub kind: Kind,
    pub model: &'s Subject,
    /// The K and V cache types.
    pub kv: CacheType,
    pub kv_v: CacheType,
}

/// Runs evaluations in one worker (the reference stays loaded in it), replacing it after a crash.
pub struct Evaluator<'a> {
    pub settings: EvalSettings,
    worker: Option<Worker>,
    stop: &'a dyn Fn() -> bool,
}

impl<'a> Evaluator<'a> {
    pub fn new(settings: EvalSettings, stop: &'a dyn Fn() -> bool) -> Self {
        Evaluator {
            settings,
            worker: None,
            stop,
        }
    }

    /// Where a task's row is cached: by both files, the pair, the text, the chunking, and what it
    /// is measured with.
    fn cache_path(&self, t: &Task, reference: &Subject, with: &MeasuredWith) -> PathBuf {
        let s = &self.settings;
        let tokens = s.max_tokens.map_or("all".to_string(), |t| t.to_string());
        // A pair of one type keeps the name it had before K and V were chosen apart.
        let kv = if t.kv == t.kv_v {
            t.kv.to_string()
        } else {
            format!("{}-{}", t.kv, t.kv_v)
        };
        // An unrotated quantized cache is another cache (a pair of f16 is rotated by nobody).
        let kv = match s.attn_rot.is_on() || !(t.kv.is_quantized() || t.kv_v.is_quantized()) {
            true => kv,
            false => format!("{kv}-norot"),
        };
        self.settings.cache_dir.join("quality").join(format!(
            "{}-vs-{}-{}-{}-t{tokens}-c{}{}-w{}{}.json",
            t.model.identity.short(),
            reference.identity.short(),
            kv,
            s.text_hash(),
            s.chunk,
            s.scored.map_or(String::new(), |n| format!("-s{n}")),
            with_key(with),
            placement_key(s, with)
        ))
    }

    /// A cached row for a task, if there is one (and `--fresh` was not given).
    fn cached(&self, t: &Task, reference: &Subject) -> Option<QualityRow> {
        if self.settings.fresh {
            return None;
        }
        let path = self.cache_path(t, reference, &self.settings.with);
        let text = std::fs::read_to_string(path).ok()?;
        let mut row: QualityRow = serde_json::from_str(&text).ok()?;
        // Figures from fewer windows are reused where their windows decide this gate too; every
        // window's hold for any gate.
        if row.decided_at.is_some() && !reusable(&row, self.settings.decide_at) {
            return None;
        }
        row.cached = true;
        row.kind = t.kind;
        row.model = t.model.path.clone();
        row.reference = reference.path.clone();
        Some(row)
    }

    /// Rows for every task: from the cache, or evaluated now (and cached when they succeed). Tasks
    /// are evaluated in batches that share the reference's pass over the text, as many per batch as
    /// half the available memory holds; a batch whose worker crashes is retried one task at a time,
    /// so the crash is pinned on the task that caused it.
    pub fn evaluate(
        &mut self,
        tasks: &[Task],
        reference: &Subject,
    ) -> Result<Vec<QualityRow>, TrialFailure> {
        let mut rows: Vec<Option<QualityRow>> =
            tasks.iter().map(|t| self.cached(t, reference)).collect();
        let pending: Vec<usize> = (0..tasks.len()).filter(|&i| rows[i].is_none()).collect();
        let cap = (crate::machine::Machine::probe(Vec::new()).ram_available_bytes / 2)
            .saturating_sub(reference.size_bytes);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut used = u64::MAX;
        for i in pending {
            let size = if tasks[i].model.identity == reference.identity {
                0
            } else {
                tasks[i].model.size_bytes
            };
            if used.saturating_add(size) > cap {
                groups.push(Vec::new());
                used = 0;
            }
            groups.last_mut().expect("pushed above").push(i);
            used = used.saturating_add(size);
        }
        for g in groups {
            let batch: Vec<&Task> = g.iter().map(|&i| &tasks[i]).collect();
            match self.run_batch(&batch, reference) {
                Ok(done) => g.iter().zip(done).for_each(|(&i, r)| rows[i] = Some(r)),
                Err(TrialFailure::Interrupted) => return Err(TrialFailure::Interrupted),
                Err(_) if g.len() > 1 => {
                    for &i in &g {
                        let r = match self.run_batch(&[&tasks[i]], reference) {
                            Ok(mut r) => r.remove(0),
                            Err(TrialFailure::Interrupted) => {
                                return Err(TrialFailure::Interrupted)
                            }
                            Err(f) => QualityRow {
                                error: Some(crate::report::one_line(&f.to_string())),
                                ..base_row(&tasks[i], reference)
                            },
                        };
                        rows[i] = Some(r);
                    }
                }
                Err(f) => {
                    for &i in &g {
                        rows[i] = Some(QualityRow {
                            error: Some(crate::report::one_line(&f.to_string())),
                            ..base_row(&tasks[i], reference)
                        });
                    }
                }
            }
        }
        Ok(rows
            .into_iter()
            .map(|r| r.expect("every task has a row"))
            .collect())
    }

    /// One worker request for a batch of tasks; successful rows are cached. Where the devices
    /// could not answer it (a context at the request's depth they cannot hold: the f16
    /// reference's cache is the largest; or a device that failed it), it is asked again on the
    /// CPU: the same figures, slower, recorded as the CPU's. Else a quantized cache that made the
    /// model fit would be refused for what its f16 reference needs.
    fn run_batch(
        &mut self,
        batch: &[&Task],
        reference: &Subject,
    ) -> Result<Vec<QualityRow>, TrialFailure> {
        let s = &self.settings;
        let progress =
            std::env::temp_dir().join(format!("autotune-quality-{}.progress", std::process::id()));
        let on_devices = self.request(batch, reference, s.n_gpu_layers, &s.devices, &progress);
        let bar = batch_bar(s.quiet, batch, reference);
        let answer = match self.ask(&on_devices, &progress, bar) {
            Err(f) if self.settings.n_gpu_layers > 0 && f != TrialFailure::Interrupted => {
                let none = [crate::llama::NO_DEVICE.to_string()];
                let on_cpu = self.request(batch, reference, 0, &none, &progress);
                let bar = batch_bar(self.settings.quiet, batch, reference);
                QualityAnswer {
                    cpu_fallback: true,
                    ..self.ask(&on_cpu, &progress, bar)?
                }
            }
            answer => answer?,
        };
        Ok(self.answered_rows(batch, reference, answer))
    }

    /// The worker's request for a batch of tasks, `n_gpu_layers` on `devices`.
    fn request(
        &self,
        batch: &[&Task],
        reference: &Subject,
        n_gpu_layers: u32,
        devices: &[String],
        progress: &Path,
    ) -> Request {
        let s = &self.settings;
        Request::Quality(QualityRequest {
            reference: reference.path.clone(),
            jobs: batch
                .iter()
                .map(|t| QualityJob {
                    model: t.model.path.clone(),
                    kv: t.kv,
                    kv_v: (t.kv_v != t.kv).then_some(t.kv_v),
                })
                .collect(),
            text: s.text.clone(),
            max_tokens: s.max_tokens,
            n_ctx: s.chunk,
            scored: s.scored,
            threads: s.threads,
            n_gpu_layers,
            devices: devices.to_vec(),
            flash_attn: s.with.flash_attn,
            attn_rot: s.attn_rot,
            kv_offload: s.kv_offload,
            progress: Some(progress.to_path_buf()),
            decide_at: s.decide_at,
        })
    }

    /// Sends a quality request to the worker (started if need be) and waits for its answer,
    /// showing its progress on `bar`. A worker that did not merely refuse is gone afterwards.
    fn ask(
        &mut self,
        request: &Request,
        progress: &Path,
        bar: Option<ProgressBar>,
    ) -> Result<QualityAnswer, TrialFailure> {
        if self.worker.is_none() {
            self.worker = Some(Worker::spawn().map_err(|e| TrialFailure::Exited {
                code: -1,
                stderr_tail: format!("cannot start worker: {e}"),
            })?);
        }
        let worker = self.worker.as_mut().expect("spawned above");
        let result = super::call_with_progress(
            worker,
            request,
            progress,
            bar.as_ref(),
            self.stop,
            Duration::from_secs(6 * 3600),
        );
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        match result {
            Ok(Response::Quality(a)) => Ok(a),
            Ok(_) => Err(TrialFailure::Refused {
                stage: "protocol".into(),
                message: "unexpected answer from the worker".into(),
            }),
            Err(f) => {
                if !matches!(f, TrialFailure::Refused { .. }) {
                    self.worker = None; // it is gone
                }
                Err(f)
            }
        }
    }

    /// The batch's rows from the worker's answer; successful rows are cached.
    fn answered_rows(
        &self,
        batch: &[&Task],
        reference: &Subject,
        answer: QualityAnswer,
    ) -> Vec<QualityRow> {
        let mut rows = Vec::new();
        // A reference that fell back to the CPU was measured there, and is cached as such.
        let with = MeasuredWith {
            backend: if answer.cpu_fallback {
                "CPU".into()
            } else {
                self.settings.with.backend.clone()
            },
            ..self.settings.with.clone()
        };
        let mut means = answer.window_means.into_iter();
        for (t, result) in batch.iter().zip(answer.results) {
            let decided_at = self.settings.decide_at;
            let mut row = QualityRow {
                tokens: answer.tokens,
                chunks: answer.chunks,
                measured_with: Some(with.clone()),
                decided_at,
                window_means: (means.next())
                    .filter(|_| decided_at.is_some())
                    .unwrap_or_default(),
                ..base_row(t, reference)
            };
            match result {
                Ok((figures, seconds)) => {
                    row.figures = Some(figures);
                    row.seconds = seconds;
                    let cache = self.cache_path(t, reference, &with);
                    if let Some(dir) = cache.parent() {
                        let _ = std::fs::create_dir_all(dir);
                    }
                    if let Ok(text) = serde_json::to_string_pretty(&row) {
                        let _ = profiles::write_atomic(&cache, &text);
                    }
                }
                Err(e) => row.error = Some(crate::report::one_line(&e)),
            }
            rows.push(row);
        }
        rows
    }

    /// The whole table for a ladder: the reference against itself first (KLD 0: the check that the
    /// comparison is sound), the KV types on the reference, then every other rung.
    pub fn table(
        &mut self,
        ladder: &Ladder,
        reference: &Subject,
        kv_types: &[CacheType],
    ) -> Result<QualityTable, TrialFailure> {
        let (subjects, unreadable) = subjects(ladder, reference);
        let tasks = tasks(reference, kv_types, &subjects);
        let mut rows = self.evaluate(&tasks, reference)?.into_iter();
        let self_row = rows.next().expect("the reference's own row");
        let mut kv = Vec::new();
        for &t in kv_types {
            kv.push(if t == CacheType::F16 {
                QualityRow {
                    kind: Kind::Kv,
                    ..self_row.clone()
                }
            } else {
                rows.next().expect("a KV row")
            });
        }
        let mut others: Vec<QualityRow> = rows.collect();
        for (rung, e) in unreadable {
            others.push(unreadable_row(rung, &e, reference));
        }
        // Most precise first, as the ladder is ordered; the reference (in the ladder or not) leads.
        let mut weights = vec![self_row.clone()];
        for rung in &ladder.rungs {
            if let Some(pos) = others.iter().position(|r| r.model == rung.path) {
                weights.push(others.remove(pos));
            }
        }
        weights.extend(others);
        Ok(QualityTable {
            reference: reference.path.clone(),
            reference_type: reference.file_type.clone(),
            text_tokens: self_row.tokens,
            chunk: self.settings.chunk,
            weights,
            kv,
        })
    }

    pub fn shutdown(&mut self) {
        if let Some(w) = self.worker.take() {
            w.quit();
        }
    }
}

/// The progress bar of a batch (none when quiet), named after what it evaluates.
fn batch_bar(quiet: bool, batch: &[&Task], reference: &Subject) -> Option<ProgressBar> {
    let bar = crate::term::bar(
        quiet,
        "{spinner} [{elapsed_precise}] quality {prefix} {bar:30} {pos}/{len} chunks",
    );
    if let Some(b) = &bar {
        let names: Vec<String> = batch
            .iter()
            .map(|t| match t.kind {
                Kind::Weights => t.model.file_type.clone(),
                Kind::Kv if t.kv_v != t.kv => format!("KV {}/{}", t.kv, t.kv_v),
                Kind::Kv => format!("KV {}", t.kv),
            })
            .collect();
        b.set_prefix(format!("vs {}: {}", reference.file_type, names.join(", ")));
    }
    bar
}

/// The ladder's rungs other than the reference: those whose identity could be read, and those
/// that could not (with why).
fn subjects<'l>(
    ladder: &'l Ladder,
    reference: &Subject,
) -> (Vec<Subject>, Vec<(&'l Rung, std::io::Error)>) {
    let ref_canon = std::fs::canonicalize(&reference.path).ok();
    let mut unreadable = Vec::new();
    let mut subjects = Vec::new();
    for rung in &ladder.rungs {
        if std::fs::canonicalize(&rung.path).ok() == ref_canon {
            continue;
        }
        match Subject::of(rung) {
            Ok(s) => subjects.push(s),
            Err(e) => unreadable.push((rung, e)),
        }
    }
    (subjects, unreadable)
}

/// The evaluations a table needs, in its order: the reference against itself, the reference with
/// each KV type other than f16, then each other rung.
fn tasks<'s>(
    reference: &'s Subject,
    kv_types: &[CacheType],
    subjects: &'s [Subject],
) -> Vec<Task<'s>> {
    let mut tasks = vec![Task {
        kind: Kind::Weights,
        model: reference,
        kv: CacheType::F16,
        kv_v: CacheType::F16,
    }];
    tasks.extend(
        kv_types
            .iter()
            .filter(|&&t| t != CacheType::F16)
            .map(|&kv| Task {
                kind: Kind::Kv,
                model: reference,
                kv,
                kv_v: kv,
            }),
    );
    tasks.extend(subjects.iter().map(|s| Task {
        kind: Kind::Weights,
        model: s,
        kv: CacheType::F16,
        kv_v: CacheType::F16,
    }));
    tasks
}

/// The row of a rung whose file could not be read.
fn unreadable_row(rung: &Rung, e: &std::io::Error, reference: &Subject) -> QualityRow {
    let task = Task {
        kind: Kind::Weights,
        model: reference,
        kv: CacheType::F16,
        kv_v: CacheType::F16,
    };
    QualityRow {
        file_type: rung.file_type.clone(),
        model: rung.path.clone(),
        model_fingerprint: String::new(),
        size_bytes: rung.size_bytes,
        error: Some(format!("cannot read: {e}")),
        ..base_row(&task, reference)
    }
}

/// A row with the task's identity and no figures yet.
fn base_row(t: &Task, reference: &Subject) -> QualityRow {
    QualityRow {
        kind: t.kind,
        file_type: t.model.file_type.clone(),
        kv: t.kv,
        kv_v: (t.kv_v != t.kv).then_some(t.kv_v),
        model: t.model.path.clone(),
        model_fingerprint: t.model.identity.fingerprint.clone(),
        size_bytes: t.model.size_bytes,
        reference: reference.path.clone(),
        reference_fingerprint: reference.identity.fingerprint.clone(),
        figures: None,
        tokens: 0,
        chunks: 0,
        seconds: 0.0,
        cached: false,
        error: None,
        measured_with: None,
        decided_at: None,
        window_means: Vec::new(),
    }
}

/// Whether a cached row evaluated up to a decision (`decided_at`) serves an evaluation held to
/// `gate`: its windows decide that gate too. An evaluation without a gate wants every window.
fn reusable(row: &QualityRow, gate: Option<f64>) -> bool {
    gate.is_some_and(|g| row.decided_at == Some(g) || super::kld::decided(&row.window_means, g))
}

/// The reference for a ladder: `--reference` (checked to be the same model) or the most precise rung.
pub fn choose_reference(ladder: &Ladder, explicit: Option<&Path>) -> Result<Subject, String> {
    let rung = match explicit {
        Some(p) => {
            let info = search_space::gguf::GgufInfo::inspect(p).map_err(|e| e.to_string())?;
            let model = &ladder
                .rungs
                .iter()
                .find(|r| r.path == ladder.model)
                .unwrap_or(&ladder.rungs[0])
                .info;
            if let Some(why) = super::ladder::mismatch(model, &info) {
                return Err(format!(
                    "--reference {} is not a quantization of {}: {why}",
                    p.display(),
                    ladder.model.display()
                ));
            }
            Rung::from_info(info)
        }
        None => ladder
            .most_precise()
            .cloned()
            .ok_or("the ladder is empty")?,
    };
    Subject::of(&rung).map_err(|e| format!("{}: cannot read: {e}", rung.path.display()))
}

/// The quality gate's evaluation ([`crate::engine::gate`]): the model with a K/V cache pair against
/// itself with f16 caches, or, in a choice among quantizations, against the most precise file with
/// f16 caches (with the model's weights alone beside it, over the same windows, for what the pair
/// adds); over windows of a request's context with the last
/// [`SCORED_POSITIONS`](crate::engine::SCORED_POSITIONS) of each compared, in a worker of its own,
/// on the candidate's devices with its flash attention; cached like every quality row, so a second
/// tune does not pay again.
pub fn kv_pair_quality(
    req: &KvQualityRequest,
    stop: &dyn Fn() -> bool,
) -> Result<KvQualityAnswer, String> {
    let subject = subject_of(&req.model)?;
    let reference = match &req.reference {
        Some(r) if !same_file(r, &req.model) => subject_of(r)?,
        _ => subject.clone(),
    };
    let other = reference.identity != subject.identity;
    let settings = EvalSettings {
        text: EVAL_TEXT.to_string(),
        max_tokens: Some(req.max_tokens),
        chunk: req.window,
        scored: Some(crate::engine::SCORED_POSITIONS),
        threads: req.threads,
        n_gpu_layers: req.n_gpu_layers,
        devices: req.devices.clone(),
        with: measured_with(req.n_gpu_layers, &req.devices, req.flash_attn),
        attn_rot: req.attn_rot,
        kv_offload: req.kv_offload,
        // Against another file the verdict is on what the cache adds to the weights' drift, two
        // rows together: every window.
        decide_at: req.decide_at.filter(|_| !other),
        fresh: false,
        cache_dir: crate::session::cache_dir(),
        quiet: true,
    };
    let mut tasks = vec![Task {
        kind: Kind::Kv,
        model: &subject,
        kv: req.type_k,
        kv_v: req.type_v,
    }];
    if other {
        tasks.push(Task {
            kind: Kind::Weights,
            model: &subject,
            kv: CacheType::F16,
            kv_v: CacheType::F16,
        });
    }
    let mut evaluator = Evaluator::new(settings, stop);
    let rows = evaluator.evaluate(&tasks, &reference);
    evaluator.shutdown();
    let mut rows = rows.map_err(|f| crate::report::one_line(&f.to_string()))?;
    let weights_kld = if other {
        let w = rows.pop().expect("the weights' row");
        Some(w.kld().ok_or_else(|| {
            format!(
                "the weights alone: {}",
                w.error.unwrap_or_else(|| "no figures".into())
            )
        })?)
    } else {
        None
    };
    let row = rows.remove(0);
    match (row.figures, row.error) {
        (Some(figures), _) => Ok(KvQualityAnswer {
            figures,
            weights_kld,
            against: other.then(|| reference.file_type.clone()),
            measured_with: row
                .measured_with
                .unwrap_or_else(|| evaluator.settings.with.clone()),
            cached: row.cached,
            seconds: row.seconds,
        }),
        (None, e) => Err(e.unwrap_or_else(|| "no figures".into())),
    }
}

/// A model file as an evaluation's subject.
fn subject_of(path: &Path) -> Result<Subject, String> {
    let info = search_space::gguf::GgufInfo::inspect(path).map_err(|e| e.to_string())?;
    Ok(Subject {
        path: path.to_path_buf(),
        file_type: info
            .file_type_name
            .clone()
            .unwrap_or_else(|| "model".into()),
        size_bytes: info.file_size,
        identity: ModelIdentity::of_file(path).map_err(|e| e.to_string())?,
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, llama: &str, backend: &str, fa: FlashAttn) -> EvalSettings {
        EvalSettings {
            text: "some text".into(),
            max_tokens: Some(2048),
            chunk: 512,
            scored: Some(512),
            threads: 2,
            n_gpu_layers: 0,
            devices: Vec::new(),
            with: MeasuredWith {
                llama: llama.into(),
                backend: backend.into(),
                flash_attn: fa,
            },
            attn_rot: Default::default(),
            kv_offload: Default::default(),
            decide_at: None,
            fresh: false,
            cache_dir: dir.to_path_buf(),
            quiet: true,
        }
    }

    fn answer(cpu_fallback: bool) -> QualityAnswer {
        let f = QualityFigures {
            positions: 2048,
            kld_mean: 0.01,
            kld_se: 0.001,
            kld_median: 0.003,
            kld_p99: 0.06,
            kld_p999: 0.2,
            kld_max: 0.5,
            top1: 0.95,
            ref_ppl: 20.0,
            ppl: 20.2,
        };
        QualityAnswer {
            results: vec![Ok((f, 3.0))],
            tokens: 2048,
            text_tokens: 2048,
            chunks: 4,
            cpu_fallback,
            window_means: Vec::new(),
        }
    }

    /// `model` with a q8_0 cache, against itself.
    fn q8_0_task(model: &Subject) -> Task<'_> {
        Task {
            kind: Kind::Kv,
            model,
            kv: CacheType::Q8_0,
            kv_v: CacheType::Q8_0,
        }
    }

    /// A small file in `dir` as a Q4_K_M model to evaluate.
    fn model_in(dir: &Path) -> Subject {
        let file = dir.join("m.gguf");
        std::fs::write(&file, b"GGUF model bytes").unwrap();
        Subject {
            identity: ModelIdentity::of_file(&file).unwrap(),
            path: file,
            file_type: "Q4_K_M".into(),
            size_bytes: 16,
        }
    }

    /// A figure is reused only where llama.cpp's build, the backend and flash attention are those
    /// it was measured with: any of them changed, it is measured again.
    #[test]
    fn a_changed_build_backend_or_flash_attention_measures_again() {
        let dir = tempfile::tempdir().unwrap();
        let model = model_in(dir.path());
        let task = q8_0_task(&model);
        let never = || false;
        let at = |llama: &str, backend: &str, fa: FlashAttn| {
            Evaluator::new(settings(dir.path(), llama, backend, fa), &never)
        };
        let measured = at("b7400", "CPU", FlashAttn::Auto);
        let rows = measured.answered_rows(&[&task], &model, answer(false));
        assert_eq!(rows[0].measured_with, Some(measured.settings.with.clone()));
        let found = measured.cached(&task, &model).expect("cached");
        assert!(found.cached && found.kld() == Some(0.01));
        assert!(
            at("b7401", "CPU", FlashAttn::Auto)
                .cached(&task, &model)
                .is_none(),
            "another build"
        );
        assert!(
            at("b7400", "CUDA", FlashAttn::Auto)
                .cached(&task, &model)
                .is_none(),
            "another backend"
        );
        assert!(
            at("b7400", "CPU", FlashAttn::On)
                .cached(&task, &model)
                .is_none(),
            "flash attention"
        );
        // Asked on CUDA, measured on the CPU (the model did not load offloaded): cached as the
        // CPU's figure, not CUDA's.
        let asked = at("b7400", "CUDA", FlashAttn::On);
        let rows = asked.answered_rows(&[&task], &model, answer(true));
        assert_eq!(rows[0].measured_with.as_ref().unwrap().backend, "CPU");
        assert!(asked.cached(&task, &model).is_none());
        assert!(at("b7400", "CPU", FlashAttn::On)
            .cached(&task, &model)
            .is_some());
    }

    /// Beside a device the layers offloaded and the cache's place (`-nkvo`) change the figures a
    /// little: a row measured with one is not reused for another. On the CPU alone they change
    /// nothing, and the rows keep their names.
    #[test]
    fn the_layers_offloaded_and_the_caches_place_key_a_devices_rows() {
        let dir = tempfile::tempdir().unwrap();
        let model = model_in(dir.path());
        let task = q8_0_task(&model);
        let never = || false;
        let at = |backend: &str, ngl: u32, kvo: search_space::KvOffload| {
            let mut s = settings(dir.path(), "b7400", backend, FlashAttn::Auto);
            (s.n_gpu_layers, s.kv_offload) = (ngl, kvo);
            Evaluator::new(s, &never)
        };
        let on = search_space::KvOffload::On;
        let measured = at("CUDA", 20, on);
        measured.answered_rows(&[&task], &model, answer(false));
        assert!(measured.cached(&task, &model).is_some());
        assert!(at("CUDA", 30, on).cached(&task, &model).is_none(), "layers");
        let nkvo = search_space::KvOffload::Off;
        assert!(
            at("CUDA", 20, nkvo).cached(&task, &model).is_none(),
            "-nkvo"
        );
        let cpu = at("CPU", 0, on);
        cpu.answered_rows(&[&task], &model, answer(false));
        assert!(
            at("CPU", 99, nkvo).cached(&task, &model).is_some(),
            "the CPU's row"
        );
        let name = |e: &Evaluator| e.cache_path(&task, &model, &e.settings.with);
        assert!(
            !name(&cpu).to_string_lossy().contains("-g"),
            "{:?}",
            name(&cpu)
        );
    }

    #[test]
    fn a_row_decided_at_one_gate_serves_another_its_windows_decide() {
        let dir = tempfile::tempdir().unwrap();
        let model = model_in(dir.path());
        let task = Task {
            kind: Kind::Kv,
            model: &model,
            kv: CacheType::Q8_0,
            kv_v: CacheType::Q8_0,
        };
        let row = QualityRow {
            decided_at: Some(0.001),
            window_means: vec![0.0070, 0.0074],
            ..base_row(&task, &model)
        };
        // Refused at 0.001; far under 0.05 and far over 0.002: decided there too.
        assert!(reusable(&row, Some(0.001)));
        assert!(reusable(&row, Some(0.05)));
        assert!(reusable(&row, Some(0.002)));
        // Near its mean two windows decide nothing; a table wants every window.
        assert!(!reusable(&row, Some(0.0075)));
        assert!(!reusable(&row, None));
    }

    /// Windows run to 16,384 tokens, and one longer than the text would repeat it: both caches
    /// would then copy what they saw a few thousand tokens back and agree whatever the quantized
    /// one lost. So the text is long enough and repeats no run of 40 words (about 64 tokens).
    #[test]
    fn the_evaluation_text_repeats_no_run_of_words() {
        let words: Vec<&str> = EVAL_TEXT.split_whitespace().collect();
        assert!(words.len() >= 13_000, "{} words", words.len());
        let mut runs = std::collections::HashSet::<String>::new();
        for run in words.windows(40) {
            let run = run.join(" ");
            assert!(!runs.contains(&run), "repeated: {run}");
            runs.insert(run);
        }
    }
}
