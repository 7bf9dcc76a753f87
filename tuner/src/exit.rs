//! Documented exit codes (also listed in `autotune --help` and the README).

/// Everything went as asked.
pub const OK: i32 = 0;
/// An unexpected error (I/O, a bug): the message says what.
pub const ERROR: i32 = 1;
/// Bad usage: an unknown flag or an out-of-range value (clap uses 2 as well).
pub const USAGE: i32 = 2;
/// The model file is missing, unreadable, not GGUF, damaged or unsupported.
pub const BAD_MODEL: i32 = 3;
/// Nothing could be measured: every candidate failed, was pruned, or none fits.
pub const NOTHING_MEASURED: i32 = 4;
/// A profile or the profile store is corrupt, stale or invalid.
pub const BAD_PROFILE: i32 = 5;
/// llama-server refused the profile's command line (`apply --exec`): a build without an option the
/// profile uses, e.g. an older one without `--spec-type ngram-simple`.
pub const SERVER_REFUSED: i32 = 6;
/// An RPC server given with `--rpc` cannot be reached or does not answer as one (refused,
/// unreachable, stopped or frozen, another protocol version); the message names it.
pub const RPC_HOST: i32 = 7;
/// `autotune verify`: the profile's quantized KV cache lost a fact, placed deep in the server's
/// context, that the f16 cache retrieves.
pub const RETRIEVAL_LOST: i32 = 8;
/// `apply --exec --check-only`: the server's cache fails the profile's quality record (the gate
/// refused or never measured it, or the server's output agrees with the f16 reference less than
/// the gate measured, beyond both intervals).
pub const QUALITY_CHECK: i32 = 9;
/// Interrupted by SIGINT or SIGTERM (after keeping what was measured).
pub const INTERRUPTED: i32 = 130;

/// An error that carries its exit code through `anyhow`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    pub code: i32,
    pub message: String,
}

impl Exit {
    // Returns `anyhow::Error`, not `Self`, on purpose: its ~60 callers all want the anyhow error.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(code: i32, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Exit {
            code,
            message: message.into(),
        })
    }
}
