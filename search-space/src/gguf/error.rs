//! Why a model file cannot be used, worded for the person who passed it: every message starts with the
//! file's path and ends with what to do about it.

use std::io;
use std::path::{Path, PathBuf};

/// The broad class of a [`GgufError`], so the binary can map it to an exit code without matching every
/// variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufErrorKind {
    /// The file (or a part of a split model) does not exist.
    NotFound,
    /// The file exists but is not a usable GGUF model: wrong format, damaged, incomplete or inconsistent.
    Invalid,
    /// A well-formed file that this llama.cpp cannot load (version, byte order, architecture).
    Unsupported,
    /// Reading failed for a reason outside the file's content (permissions, I/O error).
    Io,
}

/// A model file that cannot be handed to llama.cpp, and why.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{}: no such file; check the path", path.display())]
    NotFound { path: PathBuf },

    #[error("{}: is a directory; pass the .gguf model file inside it", path.display())]
    IsDirectory { path: PathBuf },

    #[error("{}: cannot read the file ({source}); check its permissions", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{}: the file is empty; download or copy the model again", path.display())]
    Empty { path: PathBuf },

    #[error("{}: not a GGUF file (starts with \"{found}\"){hint}", path.display())]
    NotGguf {
        path: PathBuf,
        /// The first bytes, escaped as ASCII text.
        found: String,
        /// A guess at what the file is instead, starting with "; " (or empty).
        hint: &'static str,
    },

    #[error(
        "{}: GGUF version {version} is not supported (this llama.cpp reads versions 2 and 3); {}",
        path.display(),
        if *version < 2 { "convert the model again with a current llama.cpp" } else { "update autotune" }
    )]
    UnsupportedVersion { path: PathBuf, version: u32 },

    #[error(
        "{}: this is a big-endian GGUF file; use the little-endian version of the model",
        path.display()
    )]
    BigEndian { path: PathBuf },

    #[error(
        "{}: the file ends while reading {what} (at byte {offset}); it is incomplete or damaged, \
         download or copy it again",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
    },

    #[error(
        "{}: {what} is {count}, more than the limit of {limit}; the file is damaged or not a model",
        path.display()
    )]
    AbsurdCount {
        path: PathBuf,
        what: String,
        count: u64,
        limit: u64,
    },

    #[error(
        "{}: metadata key '{key}' should be {expected} but is {found}; the file was written by a broken \
         converter, convert the model again",
        path.display()
    )]
    WrongType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error(
        "{}: required metadata key '{key}' is missing; the file is not a complete llama.cpp model",
        path.display()
    )]
    MissingKey { path: PathBuf, key: String },

    #[error("{}: invalid UTF-8 in a string at byte {offset}; the file is damaged", path.display())]
    BadString { path: PathBuf, offset: u64 },

    #[error(
        "{}: metadata key '{key}' {reason}; the file is damaged or was written by a broken converter",
        path.display()
    )]
    BadMetadata {
        path: PathBuf,
        key: String,
        reason: String,
    },

    #[error(
        "{}: tensor '{name}' {reason}; the file is damaged or was written by a broken converter",
        path.display()
    )]
    BadTensor {
        path: PathBuf,
        name: String,
        reason: String,
    },

    #[error(
        "{}: this is part {} of a model split into {count} files, but {} missing: {}; put all parts in \
         the same directory",
        path.display(),
        u32::from(*no) + 1,
        if missing.len() == 1 { "this part is" } else { "these parts are" },
        missing.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    MissingSplitParts {
        path: PathBuf,
        no: u16,
        count: u16,
        missing: Vec<PathBuf>,
    },

    #[error(
        "{}: this is part {} of a model split into {count} files; pass the first part{}",
        path.display(),
        u32::from(*no) + 1,
        first.as_ref().map(|p| format!(", {}", p.display())).unwrap_or_default()
    )]
    NotFirstSplit {
        path: PathBuf,
        no: u16,
        count: u16,
        /// The first part's path, when the file name follows llama.cpp's split naming.
        first: Option<PathBuf>,
    },

    #[error("{}: architecture '{arch}' is not supported by this llama.cpp{hint}", path.display())]
    UnsupportedArchitecture {
        path: PathBuf,
        arch: String,
        /// What to do, starting with "; ".
        hint: &'static str,
    },
}

impl GgufError {
    /// The broad class of this error.
    pub fn kind(&self) -> GgufErrorKind {
        use GgufError::*;
        match self {
            NotFound { .. } | MissingSplitParts { .. } => GgufErrorKind::NotFound,
            Unreadable { .. } => GgufErrorKind::Io,
            UnsupportedVersion { .. } | BigEndian { .. } | UnsupportedArchitecture { .. } => {
                GgufErrorKind::Unsupported
            }
            IsDirectory { .. }
            | Empty { .. }
            | NotGguf { .. }
            | Truncated { .. }
            | AbsurdCount { .. }
            | WrongType { .. }
            | MissingKey { .. }
            | BadString { .. }
            | BadMetadata { .. }
            | BadTensor { .. }
            | NotFirstSplit { .. } => GgufErrorKind::Invalid,
        }
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        use GgufError::*;
        match self {
            NotFound { path }
            | IsDirectory { path }
            | Unreadable { path, .. }
            | Empty { path }
            | NotGguf { path, .. }
            | UnsupportedVersion { path, .. }
            | BigEndian { path }
            | Truncated { path, .. }
            | AbsurdCount { path, .. }
            | WrongType { path, .. }
            | MissingKey { path, .. }
            | BadString { path, .. }
            | BadMetadata { path, .. }
            | BadTensor { path, .. }
            | MissingSplitParts { path, .. }
            | NotFirstSplit { path, .. }
            | UnsupportedArchitecture { path, .. } => path,
        }
    }
}

/// A guess at what a file that does not start with `GGUF` is, from its first bytes, as a "; ..." suffix.
pub(crate) fn not_gguf_hint(magic: &[u8]) -> &'static str {
    if magic.starts_with(b"PK") {
        "; it looks like a zip archive: extract the .gguf file from it"
    } else if magic.starts_with(b"vers") {
        "; it looks like a Git LFS pointer: run `git lfs pull` to fetch the real file"
    } else if magic.starts_with(b"<") {
        "; it looks like HTML or XML, perhaps an error page saved instead of the model: download it again"
    } else if matches!(magic, b"lmgg" | b"fmgg" | b"tjgg") {
        "; it is a model in the old GGML format: convert the original model again with llama.cpp"
    } else if magic.first().is_some_and(|b| *b == b'{' || *b == b'[') {
        "; it looks like JSON: pass the .gguf model file, not a configuration file"
    } else if !magic.is_empty()
        && magic
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace())
    {
        "; it looks like a text file: pass the .gguf model file"
    } else {
        "; pass a .gguf model file (convert other formats with llama.cpp's convert_hf_to_gguf.py)"
    }
}
