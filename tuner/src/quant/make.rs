//! Making a ladder: quantizations of one source file written with llama.cpp's own quantizer
//! (`llama_model_quantize`, linked), one worker process per file so a quantizer abort is that
//! rung's outcome. Files are written under a temporary name, checked with the GGUF reader and
//! renamed, so an interrupted run never leaves a half-written model that looks complete.

use super::serve::QuantizeRequest;
use crate::measuring::TrialFailure;
use crate::worker::Worker;
use crate::worker::{Request, Response};
use indicatif::ProgressBar;
use search_space::gguf::GgufInfo;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// A quantization llama.cpp can write: its file-type name and `llama_ftype` number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QuantType {
    pub name: &'static str,
    pub ftype: u32,
}

/// Parses `f16,q8_0,q6_k,…` (any case) into llama file types.
pub fn parse_types(list: &[String]) -> Result<Vec<QuantType>, String> {
    let mut out: Vec<QuantType> = Vec::new();
    for raw in list
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let found = (0..=64u32)
            .filter_map(|n| {
                search_space::gguf::file_type_name(n).map(|name| QuantType { name, ftype: n })
            })
            .find(|t| t.name.eq_ignore_ascii_case(raw));
        match found {
            Some(t) if !out.contains(&t) => out.push(t),
            Some(_) => {}
            None => {
                let known: Vec<&str> = (0..=64u32)
                    .filter_map(search_space::gguf::file_type_name)
                    .collect();
                return Err(format!(
                    "unknown quantization type '{raw}' (expected one of: {})",
                    known.join(", ").to_lowercase()
                ));
            }
        }
    }
    if out.is_empty() {
        return Err("no quantization types given (e.g. --types f16,q8_0,q4_k_m)".into());
    }
    Ok(out)
}

/// Whether a file type holds unquantized (float) weights.
pub fn is_float(file_type: &str) -> bool {
    matches!(file_type, "F32" | "F16" | "BF16")
}

/// The file stem without its quantization suffix: `gemma-3-270m-q4_k_m.gguf` (Q4_K_M) → `gemma-3-270m`.
pub fn base_name(file_name: &str, file_type: Option<&str>) -> String {
    let stem = file_name
        .strip_suffix(".gguf")
        .or_else(|| file_name.strip_suffix(".GGUF"))
        .unwrap_or(file_name);
    if let Some(t) = file_type {
        let lower = stem.to_ascii_lowercase();
        let t = t.to_ascii_lowercase();
        for sep in ['-', '.', '_'] {
            if lower.ends_with(&format!("{sep}{t}")) {
                return stem[..stem.len() - t.len() - 1].to_string();
            }
        }
    }
    stem.to_string()
}

/// The file a quantization is written to.
pub fn rung_path(out_dir: &Path, base: &str, t: &str) -> PathBuf {
    out_dir.join(format!("{base}-{t}.gguf"))
}

/// What happened to one requested type.
#[derive(Debug, Clone, Serialize)]
pub struct Made {
    pub file_type: String,
    pub path: PathBuf,
    /// `made`, `kept` (already there), `source` (the source itself, linked), or `failed: …`.
    pub status: String,
    pub size_bytes: u64,
    pub seconds: f64,
}

impl Made {
    pub fn failed(&self) -> bool {
        self.status.starts_with("failed")
    }
}

pub struct MakeSettings<'a> {
    pub src: &'a Path,
    pub src_info: &'a GgufInfo,
    pub out_dir: &'a Path,
    pub allow_requantize: bool,
    pub threads: u32,
    /// Write again files that already exist.
    pub force: bool,
    pub timeout: Duration,
}

/// An existing file counts as made when it is a readable GGUF of the same model and the type asked.
fn already_made(path: &Path, t: &QuantType, src: &GgufInfo) -> Option<u64> {
    let info = GgufInfo::inspect(path).ok()?;
    (info.file_type == Some(t.ftype) && super::ladder::mismatch(src, &info).is_none())
        .then_some(info.file_size)
}

/// Links the source into the ladder folder (so the folder holds the whole ladder); returns its path there.
pub fn link_source(s: &MakeSettings) -> std::io::Result<PathBuf> {
    let src = std::fs::canonicalize(s.src)?;
    let t = s.src_info.file_type_name.as_deref().unwrap_or("SRC");
    let name = src
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let link = rung_path(
        s.out_dir,
        &base_name(&name, s.src_info.file_type_name.as_deref()),
        t,
    );
    if std::fs::canonicalize(&link).ok().as_ref() == Some(&src) {
        return Ok(link);
    }
    if src.parent() == Some(std::fs::canonicalize(s.out_dir)?.as_path()) {
        return Ok(src);
    }
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&src, &link)?;
    Ok(link)
}

/// Writes one quantization (or finds it made, or links the source when it is of that type).
pub fn make_one(
    s: &MakeSettings,
    t: &QuantType,
    bar: Option<&ProgressBar>,
    interrupted: &AtomicBool,
) -> Result<Made, TrialFailure> {
    let name = s
        .src
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let base = base_name(&name, s.src_info.file_type_name.as_deref());
    let dst = rung_path(s.out_dir, &base, t.name);
    let made = |status: String, size_bytes: u64, seconds: f64| Made {
        file_type: t.name.to_string(),
        path: dst.clone(),
        status,
        size_bytes,
        seconds,
    };
    if s.src_info.file_type == Some(t.ftype) {
        let link = link_source(s).map_err(|e| TrialFailure::Refused {
            stage: "link".into(),
            message: e.to_string(),
        })?;
        return Ok(Made {
            path: link,
            ..made("source".into(), s.src_info.file_size, 0.0)
        });
    }
    if !s.force {
        if let Some(size) = already_made(&dst, t, s.src_info) {
            return Ok(made("kept".into(), size, 0.0));
        }
    }
    let partial = dst.with_extension("gguf.partial");
    let progress = s.out_dir.join(format!(".{base}-{}.progress", t.name));
    let request = Request::Quantize(QuantizeRequest {
        src: s.src.to_path_buf(),
        dst: partial.clone(),
        ftype: t.ftype,
        allow_requantize: s.allow_requantize,
        threads: s.threads,
        progress: Some(progress.clone()),
    });
    let mut worker = Worker::spawn().map_err(|e| TrialFailure::Exited {
        code: -1,
        stderr_tail: format!("cannot start worker: {e}"),
    })?;
    let result = super::call_with_progress(
        &mut worker,
        &request,
        &progress,
        bar,
        &|| interrupted.load(std::sync::atomic::Ordering::Relaxed),
        s.timeout,
    );
    worker.quit();
    let outcome = written(result, &partial, &dst, t)
        .map(|(status, size_bytes, seconds)| made(status, size_bytes, seconds));
    let _ = std::fs::remove_file(&partial);
    outcome
}

/// What became of a quantization the worker was asked to write to `partial`: (status, size,
/// seconds). A file of the type asked is renamed to `dst` ("made"); anything else is a failure of
/// this type, except an interruption.
fn written(
    result: Result<Response, TrialFailure>,
    partial: &Path,
    dst: &Path,
    t: &QuantType,
) -> Result<(String, u64, f64), TrialFailure> {
    match result {
        Ok(Response::Quantized(a)) => match GgufInfo::inspect(partial) {
            Ok(info) if info.file_type == Some(t.ftype) => match std::fs::rename(partial, dst) {
                Ok(()) => Ok(("made".into(), info.file_size, a.seconds)),
                Err(e) => Ok((
                    format!("failed: cannot rename {}: {e}", partial.display()),
                    0,
                    a.seconds,
                )),
            },
            Ok(info) => Ok((
                format!(
                    "failed: llama.cpp wrote file type {:?}, not {}",
                    info.file_type_name, t.name
                ),
                0,
                a.seconds,
            )),
            Err(e) => Ok((
                format!("failed: the written file does not read back: {e}"),
                0,
                a.seconds,
            )),
        },
        Ok(_) => Ok(("failed: unexpected answer from the worker".into(), 0, 0.0)),
        Err(TrialFailure::Interrupted) => Err(TrialFailure::Interrupted),
        Err(f) => Ok((
            format!("failed: {}", crate::report::one_line(&f.to_string())),
            0,
            0.0,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_type_lists() {
        let t = parse_types(&["f16,q8_0,Q6_K".into(), "q4_k_m".into(), "q8_0".into()]).unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.name).collect();
        assert_eq!(names, ["F16", "Q8_0", "Q6_K", "Q4_K_M"]);
        assert_eq!(t[3].ftype, 15);
        assert!(parse_types(&["q9_9".into()])
            .unwrap_err()
            .contains("unknown quantization type"));
        assert!(parse_types(&[]).is_err());
    }

    #[test]
    fn base_names_drop_the_quant_suffix() {
        assert_eq!(
            base_name("gemma-3-270m-q4_k_m.gguf", Some("Q4_K_M")),
            "gemma-3-270m"
        );
        assert_eq!(
            base_name("Llama-3.2-1B.Q8_0.gguf", Some("Q8_0")),
            "Llama-3.2-1B"
        );
        assert_eq!(base_name("model.gguf", Some("F16")), "model");
        assert_eq!(base_name("model-f16.gguf", None), "model-f16");
    }
}
