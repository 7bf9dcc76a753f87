//! The worker processes that measure: the protocol (each feature's request and answer), the parent's
//! side (a client per worker process, and the pool that implements the engine's `Measurer`), and the
//! child's side (`autotune __worker`'s loop, with its fault-injection hook for the reliability tests).
//!
//! Dependencies run one way: the server dispatches to the feature handlers, and the handlers know only
//! the protocol.

pub mod client;
pub(crate) mod fault;
pub(crate) mod memory;
pub mod pool;
pub mod protocol;
pub mod server;
pub(crate) mod stall;
pub(crate) mod timing;

pub use client::Worker;
pub use pool::WorkerPool;
pub use protocol::{BandwidthRequest, LinkRequest, MatmulRequest, Request, Response};
