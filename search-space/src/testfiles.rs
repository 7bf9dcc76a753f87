//! Builders for small GGUF files, valid and broken, for tests: unit tests here, integration tests of
//! other crates, and the CLI's reliability corpus. Not used by autotune itself.
//!
//! [`GgufBuilder`] writes a well-formed file (zeroed tensor data, correct alignment) from whatever keys
//! and tensors it is given, without judging them, so it can also write files that are valid GGUF but
//! wrong for llama.cpp. [`broken_corpus`] lists damaged files with the error each must produce.

use crate::gguf::{ggml_type, GgufErrorKind, DEFAULT_ALIGNMENT};
use std::io;
use std::path::Path;

/// GGUF metadata value type numbers.
pub mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// ggml tensor type numbers used in tests.
pub mod ggml {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q8_0: u32 = 8;
    pub const Q4_K: u32 = 12;
    pub const Q6_K: u32 = 14;
}

/// Writes GGUF files. Keys and tensors are written in the order they are added.
#[derive(Debug, Clone)]
pub struct GgufBuilder {
    version: u32,
    alignment: u64,
    /// (key, value type, encoded value)
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<TensorSpec>,
}

#[derive(Debug, Clone)]
struct TensorSpec {
    name: String,
    ggml_type: u32,
    dims: Vec<u64>,
    /// Written instead of the computed offset, to make broken files.
    offset: Option<u64>,
}

fn string_bytes(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

impl GgufBuilder {
    /// A version 3 file whose `general.architecture` is `arch`.
    pub fn new(arch: &str) -> Self {
        Self::empty().kv_str("general.architecture", arch)
    }

    /// A version 3 file with no keys and no tensors.
    pub fn empty() -> Self {
        GgufBuilder {
            version: 3,
            alignment: DEFAULT_ALIGNMENT.into(),
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// A small but complete model of architecture `arch`: the usual hyperparameters, a four-token
    /// vocabulary and a few tensors of different types.
    pub fn tiny_model(arch: &str) -> Self {
        let k = |s: &str| format!("{arch}.{s}");
        Self::new(arch)
            .kv_str("general.name", "tiny test model")
            .kv_u32("general.file_type", 15)
            .kv_u32(&k("block_count"), 2)
            .kv_u32(&k("context_length"), 2048)
            .kv_u32(&k("embedding_length"), 256)
            .kv_u32(&k("attention.head_count"), 4)
            .kv_u32(&k("attention.head_count_kv"), 2)
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_array_str("tokenizer.ggml.tokens", &["<s>", "</s>", "a", "b"])
            .tensor("token_embd.weight", ggml::Q8_0, &[256, 4])
            .tensor("blk.0.attn_q.weight", ggml::Q4_K, &[256, 256])
            .tensor("blk.0.attn_norm.weight", ggml::F32, &[256])
            .tensor("output_norm.weight", ggml::F32, &[256])
    }

    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Adds a key with a value of any type, given as its encoded bytes.
    pub fn kv_raw(mut self, key: &str, value_type: u32, value: &[u8]) -> Self {
        self.kvs.push((key.to_string(), value_type, value.to_vec()));
        self
    }

    pub fn kv_u8(self, key: &str, v: u8) -> Self {
        self.kv_raw(key, value_type::U8, &[v])
    }
    pub fn kv_u16(self, key: &str, v: u16) -> Self {
        self.kv_raw(key, value_type::U16, &v.to_le_bytes())
    }
    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv_raw(key, value_type::U32, &v.to_le_bytes())
    }
    pub fn kv_i32(self, key: &str, v: i32) -> Self {
        self.kv_raw(key, value_type::I32, &v.to_le_bytes())
    }
    pub fn kv_u64(self, key: &str, v: u64) -> Self {
        self.kv_raw(key, value_type::U64, &v.to_le_bytes())
    }
    pub fn kv_i64(self, key: &str, v: i64) -> Self {
        self.kv_raw(key, value_type::I64, &v.to_le_bytes())
    }
    pub fn kv_f32(self, key: &str, v: f32) -> Self {
        self.kv_raw(key, value_type::F32, &v.to_le_bytes())
    }
    pub fn kv_bool(self, key: &str, v: bool) -> Self {
        self.kv_raw(key, value_type::BOOL, &[u8::from(v)])
    }
    pub fn kv_str(self, key: &str, v: &str) -> Self {
        self.kv_raw(key, value_type::STRING, &string_bytes(v.as_bytes()))
    }

    /// Adds an array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn kv_array_str(self, key: &str, items: &[&str]) -> Self {
        let mut v = value_type::STRING.to_le_bytes().to_vec();
        v.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for s in items {
            v.extend(string_bytes(s.as_bytes()));
        }
        self.kv_raw(key, value_type::ARRAY, &v)
    }

    /// Adds an array of u32 (e.g. per-layer head counts).
    pub fn kv_array_u32(self, key: &str, items: &[u32]) -> Self {
        let mut v = value_type::U32.to_le_bytes().to_vec();
        v.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for n in items {
            v.extend_from_slice(&n.to_le_bytes());
        }
        self.kv_raw(key, value_type::ARRAY, &v)
    }

    /// Sets `general.alignment` (a u32) and aligns the data to it. Must be a power of two to build a
    /// file llama.cpp accepts; other values are written as given, with data aligned to 1.
    pub fn alignment(mut self, alignment: u32) -> Self {
        self.alignment = if alignment.is_power_of_two() {
            alignment.into()
        } else {
            1
        };
        self.kv_u32("general.alignment", alignment)
    }

    /// Marks this file as part `no` (from 0) of a model split into `count` files.
    pub fn split(self, no: u16, count: u16, tensors_count: i32) -> Self {
        self.kv_u16("split.no", no)
            .kv_u16("split.count", count)
            .kv_raw(
                "split.tensors.count",
                value_type::I32,
                &tensors_count.to_le_bytes(),
            )
    }

    /// Adds a tensor whose data follows the previous one's, zero-filled. Its size comes from ggml's
    /// type table; an unknown type or an impossible shape gets no data.
    pub fn tensor(mut self, name: &str, ggml_type: u32, dims: &[u64]) -> Self {
        self.tensors.push(TensorSpec {
            name: name.into(),
            ggml_type,
            dims: dims.to_vec(),
            offset: None,
        });
        self
    }

    /// Adds a tensor that claims its data is at `offset` in the data section; the data is still written
    /// where it would normally be.
    pub fn tensor_at(mut self, name: &str, ggml_type: u32, dims: &[u64], offset: u64) -> Self {
        self.tensors.push(TensorSpec {
            name: name.into(),
            ggml_type,
            dims: dims.to_vec(),
            offset: Some(offset),
        });
        self
    }

    /// The bytes of the file.
    pub fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (key, ty, value) in &self.kvs {
            out.extend(string_bytes(key.as_bytes()));
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(value);
        }
        let mut offset = 0u64;
        let mut sizes = Vec::new();
        for t in &self.tensors {
            out.extend(string_bytes(t.name.as_bytes()));
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&t.offset.unwrap_or(offset).to_le_bytes());
            let size = data_size(t.ggml_type, &t.dims);
            sizes.push(size);
            offset = align(offset + size, self.alignment);
        }
        if !self.tensors.is_empty() {
            out.resize(align(out.len() as u64, self.alignment) as usize, 0);
            for size in sizes {
                out.resize(align(out.len() as u64 + size, self.alignment) as usize, 0);
            }
        }
        out
    }

    /// Writes the file to `path`.
    pub fn write_to(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.build())
    }
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Bytes of data of a tensor, 0 when its type is unknown or its data would exceed 64 MiB.
fn data_size(ty: u32, dims: &[u64]) -> u64 {
    let Some(t) = ggml_type(ty) else { return 0 };
    let elements = dims.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
    elements
        .and_then(|n| (n / t.block_size).checked_mul(t.type_size))
        .filter(|b| *b <= 64 << 20)
        .unwrap_or(0)
}

/// Offsets of the fixed header fields, for patching built files.
pub mod header {
    pub const VERSION: usize = 4;
    pub const TENSOR_COUNT: usize = 8;
    pub const KV_COUNT: usize = 16;
    /// Where the first key-value pair starts.
    pub const END: usize = 24;
}

/// Overwrites the u32 at `at` (little-endian). Panics if `bytes` is too short, as a test should.
pub fn patch_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Overwrites the u64 at `at` (little-endian). Panics if `bytes` is too short, as a test should.
pub fn patch_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The position of the first occurrence of `needle` in `bytes`.
pub fn find(bytes: &[u8], needle: &[u8]) -> Option<usize> {
    bytes.windows(needle.len()).position(|w| w == needle)
}

/// A damaged or unusable file and the error it must produce.
#[derive(Debug, Clone)]
pub struct BrokenFile {
    /// A short file-name-like label, e.g. `truncated-in-metadata`.
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub kind: GgufErrorKind,
    /// The `GgufError` variant name, e.g. `Truncated`.
    pub variant: &'static str,
}

/// Damaged files, one per way a model file goes wrong in practice or under a fuzzer. Errors that need
/// the file system (missing file, directory, missing split parts) are not here.
pub fn broken_corpus() -> Vec<BrokenFile> {
    let mut files = broken_cut_short();
    files.extend(broken_header());
    files.extend(broken_keys());
    files.extend(broken_values());
    files.extend(broken_tensors());
    files
}

fn broken(
    name: &'static str,
    bytes: Vec<u8>,
    kind: GgufErrorKind,
    variant: &'static str,
) -> BrokenFile {
    BrokenFile {
        name,
        bytes,
        kind,
        variant,
    }
}

/// Files that are not GGUF at all, or a good one cut short in each of its sections.
fn broken_cut_short() -> Vec<BrokenFile> {
    use GgufErrorKind::*;
    let good = GgufBuilder::tiny_model("llama").build();
    let meta_start = header::END;
    let tensors_start = find(&good, b"token_embd.weight").expect("tensor name") - 8;
    let data_start = good.len() - 64; // inside the data of the last tensor
    vec![
        broken("empty", Vec::new(), Invalid, "Empty"),
        broken(
            "text",
            b"hello, this is not a model\n".to_vec(),
            Invalid,
            "NotGguf",
        ),
        broken(
            "zip",
            b"PK\x03\x04\x14\x00\x00\x00".to_vec(),
            Invalid,
            "NotGguf",
        ),
        broken(
            "html",
            b"<!DOCTYPE html><html>".to_vec(),
            Invalid,
            "NotGguf",
        ),
        broken("truncated-magic", b"GG".to_vec(), Invalid, "Truncated"),
        broken(
            "truncated-header",
            good[..12].to_vec(),
            Invalid,
            "Truncated",
        ),
        broken(
            "truncated-in-metadata",
            good[..meta_start + 30].to_vec(),
            Invalid,
            "Truncated",
        ),
        broken(
            "truncated-in-tensor-infos",
            good[..tensors_start + 10].to_vec(),
            Invalid,
            "Truncated",
        ),
        broken(
            "truncated-in-data",
            good[..data_start].to_vec(),
            Invalid,
            "Truncated",
        ),
    ]
}

/// Files whose header's version or counts are wrong.
fn broken_header() -> Vec<BrokenFile> {
    use GgufErrorKind::*;
    let good = GgufBuilder::tiny_model("llama").build();
    let patched = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        b
    };
    let mut huge_key = GgufBuilder::empty().build();
    patch_u64(&mut huge_key, header::KV_COUNT, 1);
    huge_key.extend_from_slice(&(1u64 << 40).to_le_bytes());
    huge_key.extend_from_slice(b"general.architecture");
    vec![
        broken(
            "version-1",
            patched(&|b| patch_u32(b, header::VERSION, 1)),
            Unsupported,
            "UnsupportedVersion",
        ),
        broken(
            "version-4",
            patched(&|b| patch_u32(b, header::VERSION, 4)),
            Unsupported,
            "UnsupportedVersion",
        ),
        broken(
            "big-endian",
            patched(&|b| patch_u32(b, header::VERSION, 3u32.swap_bytes())),
            Unsupported,
            "BigEndian",
        ),
        broken(
            "absurd-tensor-count",
            patched(&|b| patch_u64(b, header::TENSOR_COUNT, 1 << 40)),
            Invalid,
            "AbsurdCount",
        ),
        broken(
            "absurd-kv-count",
            patched(&|b| patch_u64(b, header::KV_COUNT, u64::MAX)),
            Invalid,
            "AbsurdCount",
        ),
        broken(
            "kv-count-past-eof",
            patched(&|b| patch_u64(b, header::KV_COUNT, 90_000)),
            Invalid,
            "Truncated",
        ),
        broken("huge-key-length", huge_key, Invalid, "AbsurdCount"),
    ]
}

/// Files whose metadata has a key of the wrong type, or misses or names an unknown architecture.
fn broken_keys() -> Vec<BrokenFile> {
    use GgufErrorKind::*;
    vec![
        broken(
            "block-count-is-a-string",
            GgufBuilder::new("llama")
                .kv_str("llama.block_count", "32")
                .build(),
            Invalid,
            "WrongType",
        ),
        broken(
            "architecture-is-a-number",
            GgufBuilder::empty()
                .kv_u32("general.architecture", 1)
                .build(),
            Invalid,
            "WrongType",
        ),
        broken(
            "missing-architecture",
            GgufBuilder::empty().kv_str("general.name", "x").build(),
            Invalid,
            "MissingKey",
        ),
        broken(
            "unknown-architecture",
            GgufBuilder::tiny_model("not-a-real-arch").build(),
            Unsupported,
            "UnsupportedArchitecture",
        ),
        broken(
            "mmproj",
            GgufBuilder::new("clip").build(),
            Unsupported,
            "UnsupportedArchitecture",
        ),
    ]
}

/// Files whose metadata has bad bytes: a string that is not UTF-8, a duplicate key, an unknown or
/// nested value type, an alignment that is not a power of two.
fn broken_values() -> Vec<BrokenFile> {
    use GgufErrorKind::*;
    vec![
        broken(
            "bad-utf8-name",
            GgufBuilder::new("llama")
                .kv_raw(
                    "general.name",
                    value_type::STRING,
                    &string_bytes(b"\xff\xfe"),
                )
                .build(),
            Invalid,
            "BadString",
        ),
        broken(
            "duplicate-key",
            GgufBuilder::new("llama")
                .kv_str("general.architecture", "llama")
                .build(),
            Invalid,
            "BadMetadata",
        ),
        broken(
            "unknown-value-type",
            GgufBuilder::new("llama").kv_raw("x", 13, &[0; 8]).build(),
            Invalid,
            "BadMetadata",
        ),
        broken(
            "nested-array",
            GgufBuilder::new("llama")
                .kv_raw(
                    "x",
                    value_type::ARRAY,
                    &[9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                )
                .build(),
            Invalid,
            "BadMetadata",
        ),
        broken(
            "alignment-not-power-of-two",
            GgufBuilder::new("llama").alignment(48).build(),
            Invalid,
            "BadMetadata",
        ),
    ]
}

/// Files whose tensor descriptions, tensor data or split numbering are wrong.
fn broken_tensors() -> Vec<BrokenFile> {
    use GgufErrorKind::*;
    let n_dims_9 = GgufBuilder::new("llama")
        .tensor("t", ggml::F32, &[1; 9])
        .build();
    vec![
        broken("tensor-n-dims-9", n_dims_9, Invalid, "BadTensor"),
        broken(
            "tensor-unknown-type",
            GgufBuilder::new("llama").tensor("t", 31, &[32]).build(),
            Invalid,
            "BadTensor",
        ),
        broken(
            "tensor-row-not-multiple-of-block",
            GgufBuilder::new("llama")
                .tensor("t", ggml::Q4_K, &[100])
                .build(),
            Invalid,
            "BadTensor",
        ),
        broken(
            "tensor-duplicate-name",
            GgufBuilder::new("llama")
                .tensor("t", ggml::F32, &[8])
                .tensor("t", ggml::F32, &[8])
                .build(),
            Invalid,
            "BadTensor",
        ),
        broken(
            "tensor-offset-beyond-eof",
            GgufBuilder::new("llama")
                .tensor_at("t", ggml::F32, &[8], 1 << 30)
                .build(),
            Invalid,
            "Truncated",
        ),
        broken(
            "tensor-offset-out-of-order",
            GgufBuilder::new("llama")
                .tensor("a", ggml::F32, &[8])
                .tensor_at("b", ggml::F32, &[8], 0)
                .build(),
            Invalid,
            "BadTensor",
        ),
        broken(
            "split-not-first-part",
            GgufBuilder::new("llama").split(1, 3, 10).build(),
            Invalid,
            "NotFirstSplit",
        ),
    ]
}
