//! The other machines a run spreads a model over (`--rpc HOST:PORT`): their endpoints validated before
//! anything connects, each server asked in bounded time whether it is a ggml RPC server that answers,
//! and the link to each measured and described.
//!
//! ggml's own RPC client reads its sockets without a timeout and aborts the process when a server is
//! missing or says something unexpected; a server that is frozen (SIGSTOP, a hung machine) leaves it
//! blocked for ever. So no endpoint reaches ggml before [`check`] has had it answer here, within
//! seconds.

pub mod links;

pub use crate::llama::rpc_endpoint::validate_list;

use std::sync::mpsc;
use std::time::Duration;

/// How long the probe's calls into ggml for the RPC servers (their devices, each device's memory)
/// may take once each server answered its check: a few round trips, milliseconds even over Wi-Fi.
pub const PROBE_LIMIT: Duration = Duration::from_secs(30);

/// Ends the process with `code` and a one-line error if it is still alive `limit` after it started
/// and not dropped by then: the bound on ggml calls that cannot be cancelled (they block in a
/// socket read of a server that stopped answering). Nothing has been measured while one is held.
pub struct Guard {
    _armed: mpsc::Sender<()>,
}

impl Guard {
    pub fn start(limit: Duration, code: i32, message: String) -> Guard {
        let (tx, rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!(
                    "autotune: error: {message} (no answer within {} s)",
                    limit.as_secs()
                );
                std::process::exit(code);
            }
        });
        Guard { _armed: tx }
    }
}
