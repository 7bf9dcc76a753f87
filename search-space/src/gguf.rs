//! Safe inspection of a GGUF model file before it is handed to llama.cpp.
//!
//! llama.cpp's GGUF getters abort the whole process on a type mismatch, and a damaged count can make it
//! allocate absurd amounts of memory. So autotune reads the header itself first: in pure, safe Rust, with
//! buffered reads of the header only (the tensor data, possibly many GB, is never read), with every count
//! bounded by a documented limit before anything is allocated, and with every failure turned into a
//! [`GgufError`] that names the file and says what to do. It never panics, whatever the input.
//!
//! Format: GGUF v2/v3, little-endian: magic `GGUF`, u32 version, u64 tensor count, u64 key-value count, the
//! key-value pairs, the tensor descriptions, padding to `general.alignment`, then the tensor data.

mod error;
mod limits;
mod reader;
mod tables;
#[cfg(test)]
mod tests;

pub use error::{GgufError, GgufErrorKind};
pub use limits::{
    MAX_ARRAY_COUNT, MAX_DIMS, MAX_KV_COUNT, MAX_METADATA_BYTES, MAX_STRING_LEN, MAX_TENSOR_COUNT,
    MAX_TENSOR_NAME_LEN,
};
pub use tables::{file_type_name, ggml_type, GgmlType, GGML_TYPES, KNOWN_ARCHITECTURES};

use reader::{Reader, Value, ValueType};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

/// Data alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u32 = 32;

/// What autotune needs to know about a model file, read from its GGUF header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GgufInfo {
    pub path: PathBuf,
    pub version: u32,
    pub file_size: u64,
    /// `general.architecture`, one of [`KNOWN_ARCHITECTURES`].
    pub architecture: String,
    /// `general.name`.
    pub name: Option<String>,
    /// `general.file_type`, a `llama_ftype` number.
    pub file_type: Option<u32>,
    /// The `llama_ftype` name of `file_type`, e.g. `Q4_K_M`.
    pub file_type_name: Option<String>,
    /// `{arch}.block_count`: the number of layers.
    pub block_count: Option<u32>,
    /// `{arch}.context_length`: the context the model was trained with.
    pub context_length: Option<u64>,
    /// `{arch}.embedding_length`.
    pub embedding_length: Option<u64>,
    /// `{arch}.attention.head_count`; for models with per-layer counts, the largest.
    pub head_count: Option<u64>,
    /// `{arch}.attention.head_count_kv`; for models with per-layer counts, the largest.
    pub head_count_kv: Option<u64>,
    /// `{arch}.attention.sliding_window`: layers that attend to the last this many tokens only
    /// (all or some of them, by the architecture's pattern).
    pub sliding_window: Option<u64>,
    /// `{arch}.attention.kv_lora_rank`: a compressed (MLA) KV cache.
    pub kv_lora_rank: Option<u64>,
    /// `{arch}.expert_count` (mixture-of-experts models).
    pub expert_count: Option<u32>,
    /// `{arch}.expert_used_count`.
    pub expert_used_count: Option<u32>,
    /// The length of `tokenizer.ggml.tokens`.
    pub vocab_size: Option<u64>,
    /// `tokenizer.ggml.model`, e.g. `llama` or `gpt2`.
    pub tokenizer_model: Option<String>,
    /// Present when the model is split over several files (`split.*` keys).
    pub split: Option<SplitInfo>,
    /// Tensors in this file (for a split model, in this part only), and their totals.
    pub tensor_count: u64,
    pub parameter_count: u64,
    pub tensor_bytes: u64,
    pub tensors: Vec<TensorInfo>,
}

/// Where a file sits in a model split by `llama-gguf-split` (`name-00001-of-00003.gguf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitInfo {
    /// `split.no`, counted from 0 (file names count from 1).
    pub no: u16,
    /// `split.count`: how many files the model has.
    pub count: u16,
    /// `split.tensors.count`: tensors in all parts together.
    pub tensors_count: Option<u64>,
}

/// One tensor's description; `offset` is relative to the start of the data section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: u32,
    /// ggml's name for the type, e.g. `q4_K`.
    pub type_name: String,
    pub dims: Vec<u64>,
    pub offset: u64,
    pub bytes: u64,
}

impl GgufInfo {
    /// Reads and validates the header of the GGUF file at `path`, and checks that the other parts of a
    /// split model are next to it. Reads only the header, whatever the size of the file.
    pub fn inspect(path: &Path) -> Result<GgufInfo, GgufError> {
        let unreadable = |e: io::Error| match e.kind() {
            io::ErrorKind::NotFound => GgufError::NotFound {
                path: path.to_path_buf(),
            },
            _ => GgufError::Unreadable {
                path: path.to_path_buf(),
                source: e,
            },
        };
        let meta = std::fs::metadata(path).map_err(unreadable)?;
        if meta.is_dir() {
            return Err(GgufError::IsDirectory {
                path: path.to_path_buf(),
            });
        }
        let file = File::open(path).map_err(unreadable)?;
        let info = Self::from_reader(BufReader::with_capacity(64 * 1024, file), meta.len(), path)?;
        if let Some(split) = info.split.filter(|s| s.count > 1) {
            if let Some(parts) = split_part_paths(path, split.no, split.count) {
                let missing: Vec<PathBuf> = parts.into_iter().filter(|p| !p.exists()).collect();
                if !missing.is_empty() {
                    return Err(GgufError::MissingSplitParts {
                        path: path.to_path_buf(),
                        no: split.no,
                        count: split.count,
                        missing,
                    });
                }
            }
        }
        Ok(info)
    }

    /// Reads and validates a GGUF header from `r`, the start of a file of `file_size` bytes at `path`
    /// (used in messages, and to name the first part of a split model). Touches no file system.
    pub fn from_reader<R: Read>(r: R, file_size: u64, path: &Path) -> Result<GgufInfo, GgufError> {
        let path_buf = path.to_path_buf();
        if file_size == 0 {
            return Err(GgufError::Empty { path: path_buf });
        }
        let mut r = Reader::new(r, file_size, path_buf.clone());
        check_magic(&mut r, path)?;
        let (version, tensor_count, kv_count) = r.header()?;
        let meta = Metadata {
            path,
            map: r.metadata(kv_count, keeps_contents)?,
        };
        let alignment = meta.alignment()?;
        let raw = r.tensor_infos(tensor_count)?;

        let Tensors {
            tensors,
            parameter_count,
            tensor_bytes,
        } = lay_out_tensors(&r, raw, alignment, path)?;

        let split = meta.split()?;
        if let Some(s) = split.filter(|s| s.no != 0) {
            let first = split_part_paths(path, s.no, s.count).and_then(|p| p.into_iter().next());
            return Err(GgufError::NotFirstSplit {
                path: path_buf,
                no: s.no,
                count: s.count,
                first,
            });
        }

        let architecture = meta.architecture()?;
        let arch_key = |suffix: &str| format!("{architecture}.{suffix}");
        let file_type = meta.uint::<u32>("general.file_type")?;
        Ok(GgufInfo {
            version,
            file_size,
            name: meta.string("general.name")?.map(str::to_string),
            file_type,
            file_type_name: file_type.and_then(file_type_name).map(str::to_string),
            block_count: meta.uint(&arch_key("block_count"))?,
            context_length: meta.uint(&arch_key("context_length"))?,
            embedding_length: meta.uint(&arch_key("embedding_length"))?,
            head_count: meta.uint_or_per_layer(&arch_key("attention.head_count"))?,
            head_count_kv: meta.uint_or_per_layer(&arch_key("attention.head_count_kv"))?,
            sliding_window: meta.uint(&arch_key("attention.sliding_window"))?,
            kv_lora_rank: meta.uint(&arch_key("attention.kv_lora_rank"))?,
            expert_count: meta.uint(&arch_key("expert_count"))?,
            expert_used_count: meta.uint(&arch_key("expert_used_count"))?,
            vocab_size: meta.string_array_len("tokenizer.ggml.tokens")?,
            tokenizer_model: meta.string("tokenizer.ggml.model")?.map(str::to_string),
            split,
            tensor_count,
            parameter_count,
            tensor_bytes,
            tensors,
            architecture,
            path: path_buf,
        })
    }

    /// Whether the model is a mixture of experts (more than one expert per layer).
    pub fn is_moe(&self) -> bool {
        self.expert_count.is_some_and(|n| n > 1)
    }
}

/// The paths of all parts of a split model, given one part's path, `split.no` (from 0) and `split.count`,
/// following llama.cpp's naming `%s-%05d-of-%05d.gguf` (numbered from 1). `None` when the file name does
/// not follow that naming.
pub fn split_part_paths(path: &Path, no: u16, count: u16) -> Option<Vec<PathBuf>> {
    let file_name = path.file_name()?.to_str()?;
    let suffix = format!("-{:05}-of-{count:05}.gguf", u32::from(no) + 1);
    let prefix = file_name.strip_suffix(&suffix).filter(|p| !p.is_empty())?;
    let dir = path.parent().unwrap_or(Path::new(""));
    Some(
        (1..=count)
            .map(|k| dir.join(format!("{prefix}-{k:05}-of-{count:05}.gguf")))
            .collect(),
    )
}

/// Keys whose string text, or short integer array contents, the inspector reads.
fn keeps_contents(key: &str) -> bool {
    matches!(
        key,
        "general.architecture" | "general.name" | "tokenizer.ggml.model"
    ) || key.ends_with(".attention.head_count")
        || key.ends_with(".attention.head_count_kv")
}

/// `x` rounded up to a multiple of `alignment` (a power of two), or `None` on overflow.
fn align_up(x: u64, alignment: u32) -> Option<u64> {
    let a = u64::from(alignment);
    x.checked_add(a - 1).map(|v| v & !(a - 1))
}

/// Fails unless the file starts with the GGUF magic, saying what it looks like instead.
fn check_magic<R: Read>(r: &mut Reader<R>, path: &Path) -> Result<(), GgufError> {
    let magic = r.magic()?;
    if magic == b"GGUF" {
        return Ok(());
    }
    if b"GGUF".starts_with(&magic) {
        return Err(r.truncated("the GGUF magic", 0));
    }
    let hint = error::not_gguf_hint(&magic);
    Err(GgufError::NotGguf {
        path: path.to_path_buf(),
        found: magic.escape_ascii().to_string(),
        hint,
    })
}

/// The tensors of a file, with their data checked to lie inside it, and their totals.
struct Tensors {
    tensors: Vec<TensorInfo>,
    parameter_count: u64,
    tensor_bytes: u64,
}

/// Checks that the tensors' data lies where llama.cpp expects it, `r` being just past their
/// descriptions, and describes them.
fn lay_out_tensors<R: Read>(
    r: &Reader<R>,
    raw: Vec<reader::RawTensor>,
    alignment: u32,
    path: &Path,
) -> Result<Tensors, GgufError> {
    let file_size = r.file_size();
    // The data section starts at the next multiple of `alignment`; tensors follow each other in
    // order, each padded to `alignment`, as llama.cpp requires.
    let data_start = align_up(r.pos(), alignment);
    let mut expected = 0u64;
    let mut tensors = Vec::with_capacity(raw.len());
    let (mut parameter_count, mut tensor_bytes) = (0u64, 0u64);
    for t in raw {
        let start = data_start.and_then(|d| d.checked_add(t.offset));
        if start
            .and_then(|s| s.checked_add(t.bytes))
            .is_none_or(|end| end > file_size)
        {
            let what = format!("the {} bytes of data of tensor '{}'", t.bytes, t.name);
            return Err(r.truncated(&what, start.unwrap_or(u64::MAX)));
        }
        if t.offset != expected {
            return Err(GgufError::BadTensor {
                path: path.to_path_buf(),
                name: t.name,
                reason: format!(
                    "has its data at offset {}, expected {expected} (tensor data must follow each \
                     other in order, aligned to {alignment} bytes)",
                    t.offset
                ),
            });
        }
        // Cannot overflow: offset + bytes fits below file_size, and alignment is at most 2^31.
        expected = align_up(t.offset + t.bytes, alignment).unwrap_or(u64::MAX);
        parameter_count = parameter_count.saturating_add(t.elements);
        tensor_bytes = tensor_bytes.saturating_add(t.bytes);
        let type_name = ggml_type(t.ggml_type).map_or("?", |g| g.name).to_string();
        tensors.push(TensorInfo {
            name: t.name,
            ggml_type: t.ggml_type,
            type_name,
            dims: t.dims,
            offset: t.offset,
            bytes: t.bytes,
        });
    }
    Ok(Tensors {
        tensors,
        parameter_count,
        tensor_bytes,
    })
}

/// Typed, checked access to the metadata that was kept.
struct Metadata<'a> {
    path: &'a Path,
    map: HashMap<String, Value>,
}

impl Metadata<'_> {
    /// `general.architecture`, which must be one llama.cpp knows.
    fn architecture(&self) -> Result<String, GgufError> {
        let architecture = self
            .string("general.architecture")?
            .ok_or_else(|| GgufError::MissingKey {
                path: self.path.to_path_buf(),
                key: "general.architecture".into(),
            })?
            .to_string();
        if !KNOWN_ARCHITECTURES.contains(&architecture.as_str()) {
            let hint = if architecture == "clip" {
                "; this is a multimodal projector (mmproj), pass the language model instead"
            } else {
                "; check for a newer autotune, or convert the model with a matching llama.cpp"
            };
            return Err(GgufError::UnsupportedArchitecture {
                path: self.path.to_path_buf(),
                arch: architecture,
                hint,
            });
        }
        Ok(architecture)
    }

    fn wrong(&self, key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            expected,
            found: found.describe(),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(s.as_deref()),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    /// An integer of any stored type, if it fits `T`.
    fn uint<T: TryFrom<i128> + Unsigned>(&self, key: &str) -> Result<Option<T>, GgufError> {
        match self.map.get(key) {
            None => Ok(None),
            Some(v @ Value::Int(_, n)) => T::try_from(*n)
                .map(Some)
                .map_err(|_| self.wrong(key, T::EXPECTED, v)),
            Some(v) => Err(self.wrong(key, T::EXPECTED, v)),
        }
    }

    /// An unsigned integer, or the largest of a per-layer array of them.
    fn uint_or_per_layer(&self, key: &str) -> Result<Option<u64>, GgufError> {
        const EXPECTED: &str = "an unsigned integer or an array of them";
        match self.map.get(key) {
            Some(
                v @ Value::Array {
                    ints: Some(ints), ..
                },
            ) => {
                let max = ints.iter().copied().max();
                max.map(u64::try_from)
                    .transpose()
                    .map_err(|_| self.wrong(key, EXPECTED, v))
            }
            Some(v @ Value::Array { .. }) => Err(self.wrong(key, EXPECTED, v)),
            _ => self.uint::<u64>(key),
        }
    }

    fn string_array_len(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Array {
                elem: ValueType::String,
                count,
                ..
            }) => Ok(Some(*count)),
            Some(v) => Err(self.wrong(key, "an array of strings", v)),
        }
    }

    /// `general.alignment`: llama.cpp insists on a u32 power of two.
    fn alignment(&self) -> Result<u32, GgufError> {
        const KEY: &str = "general.alignment";
        match self.map.get(KEY) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(Value::Int(ValueType::U32, n)) => match u32::try_from(*n) {
                Ok(a) if a.is_power_of_two() => Ok(a),
                _ => Err(GgufError::BadMetadata {
                    path: self.path.to_path_buf(),
                    key: KEY.into(),
                    reason: format!("is {n}, not a power of two"),
                }),
            },
            Some(v) => Err(self.wrong(KEY, "a u32", v)),
        }
    }

    fn split(&self) -> Result<Option<SplitInfo>, GgufError> {
        let Some(count) = self.uint::<u16>("split.count")? else {
            return Ok(None);
        };
        let no = self.uint::<u16>("split.no")?.unwrap_or(0);
        if count > 0 && no >= count {
            return Err(GgufError::BadMetadata {
                path: self.path.to_path_buf(),
                key: "split.no".into(),
                reason: format!("is {no}, but split.count is only {count}"),
            });
        }
        Ok(Some(SplitInfo {
            no,
            count,
            tensors_count: self.uint("split.tensors.count")?,
        }))
    }
}

/// The unsigned integer types metadata is read as, and how a wrong-type message describes them.
trait Unsigned {
    const EXPECTED: &'static str;
}
impl Unsigned for u16 {
    const EXPECTED: &'static str = "an unsigned integer that fits in 16 bits";
}
impl Unsigned for u32 {
    const EXPECTED: &'static str = "an unsigned integer that fits in 32 bits";
}
impl Unsigned for u64 {
    const EXPECTED: &'static str = "an unsigned integer";
}
