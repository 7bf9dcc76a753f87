//! The bounds a GGUF header is held to before anything it counts is allocated or looped over: the
//! reader checks every count and length against them (and against the bytes left in the file).

/// Longest key or string value accepted (1 MiB). Real keys are short; chat templates reach tens of KiB.
pub const MAX_STRING_LEN: u64 = 1024 * 1024;
/// Largest metadata section accepted (512 MiB). Big vocabularies (~1M tokens) take tens of MiB.
pub const MAX_METADATA_BYTES: u64 = 512 * 1024 * 1024;
/// Most tensors accepted in one file. The largest models have tens of thousands.
pub const MAX_TENSOR_COUNT: u64 = 1_000_000;
/// Most metadata key-value pairs accepted. Models have tens to hundreds.
pub const MAX_KV_COUNT: u64 = 100_000;
/// Longest metadata array accepted (elements). Vocabularies have up to about a million tokens.
pub const MAX_ARRAY_COUNT: u64 = 50_000_000;
/// Most dimensions a tensor can have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Longest tensor name llama.cpp accepts (`GGML_MAX_NAME` - 1).
pub const MAX_TENSOR_NAME_LEN: usize = 63;
