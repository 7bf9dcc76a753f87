//! A model's "ladder": the other quantizations of the same model, found beside it or named by the
//! user. Only GGUF headers are read (search_space's safe reader), so a damaged or foreign file is a
//! reason in the report, never a crash.
//!
//! Two files are quantizations of the same model when they agree on everything quantization leaves
//! alone: architecture, layer count, embedding width, attention heads, vocabulary size, tokenizer,
//! parameter count (quantization changes how weights are stored, never how many there are) and the
//! model's name. Their file types must differ; of two files with the same type the first by name is
//! kept. What was rejected is reported with the first difference found.

use search_space::gguf::GgufInfo;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One quantization of the model.
#[derive(Debug, Clone, Serialize)]
pub struct Rung {
    pub path: PathBuf,
    /// `Q4_K_M`, `F16`, … (`?` when the file does not say).
    pub file_type: String,
    pub size_bytes: u64,
    /// Bits per weight: tensor bytes × 8 / parameters. Orders the ladder by precision.
    pub bpw: f64,
    #[serde(skip)]
    pub info: GgufInfo,
}

impl Rung {
    pub fn from_info(info: GgufInfo) -> Rung {
        Rung {
            path: info.path.clone(),
            file_type: info.file_type_name.clone().unwrap_or_else(|| "?".into()),
            size_bytes: info.file_size,
            bpw: if info.parameter_count > 0 {
                info.tensor_bytes as f64 * 8.0 / info.parameter_count as f64
            } else {
                0.0
            },
            info,
        }
    }

    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// A file that was looked at and left out, with why.
#[derive(Debug, Clone, Serialize)]
pub struct Rejected {
    pub path: PathBuf,
    pub reason: String,
}

/// The ladder and how it was found.
#[derive(Debug, Clone, Serialize)]
pub struct Ladder {
    /// The model the ladder was built around.
    pub model: PathBuf,
    /// Every rung, most precise first (the model itself included).
    pub rungs: Vec<Rung>,
    pub rejected: Vec<Rejected>,
}

impl Ladder {
    /// The most precise rung (highest bits per weight; BF16 before F16 at equal size, as models are
    /// trained in BF16 and F16 can overflow).
    pub fn most_precise(&self) -> Option<&Rung> {
        self.rungs.first()
    }

    /// Human lines: what was considered and why others were not.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for r in &self.rungs {
            s.push_str(&format!(
                "  considered  {:<8} {:>6.2} bpw  {}\n",
                r.file_type,
                r.bpw,
                r.path.display()
            ));
        }
        for r in &self.rejected {
            s.push_str(&format!(
                "  left out    {}: {}\n",
                r.path.display(),
                r.reason
            ));
        }
        s
    }
}

/// Why `other` is not a quantization of the same model as `model`; `None` when it is.
pub fn mismatch(model: &GgufInfo, other: &GgufInfo) -> Option<String> {
    fn opt<T: std::fmt::Debug>(v: &Option<T>) -> String {
        match v {
            Some(x) => format!("{x:?}"),
            None => "none".into(),
        }
    }
    macro_rules! differ {
        ($what:expr, $a:expr, $b:expr) => {
            if $a != $b {
                return Some(format!(
                    "another model: {} {} (this model: {})",
                    $what,
                    opt(&$b),
                    opt(&$a)
                ));
            }
        };
    }
    if model.architecture != other.architecture {
        return Some(format!(
            "another model: architecture {} (this model: {})",
            other.architecture, model.architecture
        ));
    }
    differ!("layer count", model.block_count, other.block_count);
    differ!(
        "embedding width",
        model.embedding_length,
        other.embedding_length
    );
    differ!("attention heads", model.head_count, other.head_count);
    differ!("KV heads", model.head_count_kv, other.head_count_kv);
    differ!("experts", model.expert_count, other.expert_count);
    differ!("vocabulary size", model.vocab_size, other.vocab_size);
    differ!("tokenizer", model.tokenizer_model, other.tokenizer_model);
    if model.parameter_count != other.parameter_count {
        return Some(format!(
            "another model: {} parameters (this model: {})",
            other.parameter_count, model.parameter_count
        ));
    }
    if let (Some(a), Some(b)) = (&model.name, &other.name) {
        if a != b {
            return Some(format!("another model: named '{b}' (this model: '{a}')"));
        }
    }
    None
}

/// Rank of a file type at equal bits per weight (higher = preferred as the reference).
fn type_preference(t: &str) -> u8 {
    match t {
        "F32" => 3,
        "BF16" => 2,
        "F16" => 1,
        _ => 0,
    }
}

fn sort_rungs(rungs: &mut [Rung]) {
    rungs.sort_by(|a, b| {
        b.bpw
            .total_cmp(&a.bpw)
            .then(type_preference(&b.file_type).cmp(&type_preference(&a.file_type)))
            .then(a.path.cmp(&b.path))
    });
}

/// The files `sources` name (a folder: its `*.gguf` files, sorted; no sources: the model's folder);
/// a folder that cannot be read is recorded in `rejected`.
fn candidate_files(
    model: &Path,
    sources: &[PathBuf],
    rejected: &mut Vec<Rejected>,
) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    let folders: Vec<PathBuf> = if sources.is_empty() {
        vec![model
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()]
    } else {
        Vec::new()
    };
    for src in sources.iter().chain(&folders) {
        if src.is_dir() {
            let mut files: Vec<PathBuf> = match std::fs::read_dir(src) {
                Ok(it) => it.flatten().map(|e| e.path()).collect(),
                Err(e) => {
                    rejected.push(Rejected {
                        path: src.clone(),
                        reason: format!("cannot read the folder: {e}"),
                    });
                    continue;
                }
            };
            files.sort();
            for f in files {
                let is_gguf = f
                    .extension()
                    .is_some_and(|x| x.eq_ignore_ascii_case("gguf"));
                if is_gguf && !f.is_dir() {
                    candidates.push(f);
                }
            }
        } else {
            candidates.push(src.clone());
        }
    }
    candidates
}

/// Builds the ladder of `model` from candidate files: `sources` are files or folders (a folder
/// stands for its `*.gguf` files); with no sources, the model's own folder.
pub fn discover(
    model: &Path,
    sources: &[PathBuf],
) -> Result<Ladder, search_space::gguf::GgufError> {
    let model_info = GgufInfo::inspect(model)?;
    let model_canon = std::fs::canonicalize(model).unwrap_or_else(|_| model.to_path_buf());
    let mut rejected = Vec::new();
    let candidates = candidate_files(model, sources, &mut rejected);
    let mut rungs = vec![Rung::from_info(model_info.clone())];
    let mut seen = vec![model_canon];
    for path in candidates {
        let canon = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.contains(&canon) {
            continue;
        }
        seen.push(canon);
        let info = match GgufInfo::inspect(&path) {
            Ok(i) => i,
            Err(e) => {
                let reason = match e {
                    search_space::gguf::GgufError::NotFirstSplit { .. } => {
                        "a later part of a split model (its first part stands for it)".to_string()
                    }
                    _ => format!("not usable: {e}"),
                };
                rejected.push(Rejected { path, reason });
                continue;
            }
        };
        if let Some(why) = mismatch(&model_info, &info) {
            rejected.push(Rejected { path, reason: why });
            continue;
        }
        let rung = Rung::from_info(info);
        if let Some(same) = rungs
            .iter()
            .find(|r| r.file_type == rung.file_type && r.file_type != "?")
        {
            rejected.push(Rejected {
                path,
                reason: format!(
                    "same quantization ({}) as {}, which is kept",
                    rung.file_type,
                    same.file_name()
                ),
            });
            continue;
        }
        rungs.push(rung);
    }
    sort_rungs(&mut rungs);
    Ok(Ladder {
        model: model.to_path_buf(),
        rungs,
        rejected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use search_space::testfiles::{ggml, GgufBuilder};

    fn model(file_type: u32, tensor_type: u32, vocab: &[&str], layers: u32) -> GgufBuilder {
        GgufBuilder::new("llama")
            .kv_str("general.name", "tiny")
            .kv_u32("general.file_type", file_type)
            .kv_u32("llama.block_count", layers)
            .kv_u32("llama.embedding_length", 256)
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_array_str("tokenizer.ggml.tokens", vocab)
            .tensor("token_embd.weight", tensor_type, &[256, 4])
            .tensor("output_norm.weight", ggml::F32, &[256])
    }

    #[test]
    fn finds_the_ladder_and_says_why_others_are_left_out() {
        let d = tempfile::tempdir().unwrap();
        let v = ["<s>", "</s>", "a", "b"];
        model(15, ggml::Q4_K, &v, 2)
            .write_to(&d.path().join("m-Q4_K_M.gguf"))
            .unwrap();
        model(1, ggml::F16, &v, 2)
            .write_to(&d.path().join("m-F16.gguf"))
            .unwrap();
        model(7, ggml::Q8_0, &v, 2)
            .write_to(&d.path().join("m-Q8_0.gguf"))
            .unwrap();
        model(7, ggml::Q8_0, &v, 2)
            .write_to(&d.path().join("m-copy-Q8_0.gguf"))
            .unwrap();
        model(2, ggml::Q4_0, &v, 3)
            .write_to(&d.path().join("other-Q4_0.gguf"))
            .unwrap();
        model(2, ggml::Q4_0, &["<s>", "</s>", "a", "b", "c"], 2)
            .write_to(&d.path().join("other-vocab.gguf"))
            .unwrap();
        std::fs::write(d.path().join("notes.gguf"), b"not a model").unwrap();
        std::fs::write(d.path().join("readme.txt"), b"ignored").unwrap();
        let l = discover(&d.path().join("m-Q4_K_M.gguf"), &[]).unwrap();
        let types: Vec<&str> = l.rungs.iter().map(|r| r.file_type.as_str()).collect();
        assert_eq!(types, ["F16", "Q8_0", "Q4_K_M"]);
        let why = |name: &str| {
            l.rejected
                .iter()
                .find(|r| r.path.ends_with(name))
                .map(|r| r.reason.clone())
                .unwrap()
        };
        assert!(
            why("other-Q4_0.gguf").contains("layer count"),
            "{}",
            why("other-Q4_0.gguf")
        );
        assert!(why("other-vocab.gguf").contains("vocabulary size"));
        assert!(why("m-copy-Q8_0.gguf").contains("same quantization"));
        assert!(why("notes.gguf").starts_with("not usable"));
        assert_eq!(l.rejected.len(), 4, "{:?}", l.rejected);
        assert_eq!(l.most_precise().unwrap().file_type, "F16");
    }

    #[test]
    fn named_files_only_with_sources() {
        let d = tempfile::tempdir().unwrap();
        let v = ["<s>", "</s>", "a", "b"];
        model(15, ggml::Q4_K, &v, 2)
            .write_to(&d.path().join("m.gguf"))
            .unwrap();
        model(1, ggml::F16, &v, 2)
            .write_to(&d.path().join("m-F16.gguf"))
            .unwrap();
        let l = discover(&d.path().join("m.gguf"), &[d.path().join("m.gguf")]).unwrap();
        assert_eq!(
            l.rungs.len(),
            1,
            "the model itself is not listed twice, the folder is not searched"
        );
    }
}
