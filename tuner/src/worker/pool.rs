//! Workers kept alive per model placement, so candidates that differ only in context settings share a
//! loaded model, and a crashed worker is replaced transparently.

use super::client::{TrialFailure, Worker};
use super::protocol::{Request, Response};
use super::stall::Pace;
use crate::measuring::{FitAnswer, FitRequest, MeasureRequest};
use std::collections::HashMap;
use std::time::Duration;

/// Key of a loaded model in a worker: the file and the model-side settings.
type ModelKey = String;

pub struct WorkerPool {
    workers: Vec<(ModelKey, Worker)>,
    /// How many models may be loaded at once (each worker holds one).
    max_alive: usize,
    /// Crashes per model key: a placement that keeps crashing is skipped.
    crashes: HashMap<ModelKey, u32>,
    pub timeout: Duration,
    /// Answer times of requests over RPC, which bound how long the next may take ([`Pace`]).
    pace: Pace,
    /// This pool runs dry runs (bounded sooner before anything over RPC answered).
    dry: bool,
}

impl WorkerPool {
    pub fn new(max_alive: usize, timeout: Duration) -> Self {
        WorkerPool {
            workers: Vec::new(),
            max_alive: max_alive.max(1),
            crashes: HashMap::new(),
            timeout,
            pace: Pace::default(),
            dry: false,
        }
    }

    /// A pool for dry runs.
    pub(crate) fn for_dry_runs(timeout: Duration) -> Self {
        let mut pool = WorkerPool::new(1, timeout);
        pool.dry = true;
        pool
    }

    fn key(m: &MeasureRequest) -> ModelKey {
        format!(
            "{}|{}",
            m.model.display(),
            serde_json::to_string(&m.settings).expect("serialises")
        )
    }

    pub fn crashes_for(&self, m: &MeasureRequest) -> u32 {
        self.crashes.get(&Self::key(m)).copied().unwrap_or(0)
    }

    /// Sends a request to the worker holding this model (spawning or evicting as needed). When the
    /// worker refuses a load for want of memory while other workers hold models, those are what
    /// holds it: they are closed, one model at a time is kept from then on, and the load is tried
    /// again.
    pub fn call(
        &mut self,
        request: &Request,
        stop: &dyn Fn() -> bool,
    ) -> Result<Response, TrialFailure> {
        let result = self.call_once(request, stop);
        let short_of_memory = matches!(&result,
            Err(TrialFailure::Refused { stage, .. }) if stage == profiles::measurements::MEMORY_CHECK);
        if !short_of_memory || self.workers.len() < 2 {
            return result;
        }
        // The refusing worker is the most recently used, last.
        let refusing = self.workers.pop().expect("two or more workers");
        self.shutdown();
        self.workers.push(refusing);
        self.max_alive = 1;
        self.call_once(request, stop)
    }

    fn call_once(
        &mut self,
        request: &Request,
        stop: &dyn Fn() -> bool,
    ) -> Result<Response, TrialFailure> {
        let m = match request {
            Request::Measure(m) | Request::Footprint(m) => m,
            // Quantize and quality requests hold no placement: they run in a worker of their own.
            Request::Quit
            | Request::Quantize(_)
            | Request::Quality(_)
            | Request::DraftCheck(_)
            | Request::Speculate(_)
            | Request::SpecFootprint(_)
            | Request::LlamaFit(_)
            | Request::Bandwidth(_)
            | Request::Link(_)
            | Request::Greedy(_)
            | Request::Retrieval(_)
            | Request::Matmul(_)
            | Request::KvPairs(_) => return Err(TrialFailure::Interrupted),
        };
        let key = Self::key(m);
        let idx = match self.workers.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                while self.workers.len() >= self.max_alive {
                    let (_, w) = self.workers.remove(0);
                    w.quit();
                }
                let w = Worker::spawn_with(&m.settings.env).map_err(|e| TrialFailure::Exited {
                    code: -1,
                    stderr_tail: format!("cannot start worker: {e}"),
                })?;
                self.workers.push((key.clone(), w));
                self.workers.len() - 1
            }
        };
        let over_rpc = !m.settings.rpc.is_empty();
        let worker = &mut self.workers[idx].1;
        let fresh = worker.slowest.is_none();
        let timeout = if over_rpc {
            self.pace.deadline(worker.slowest, self.timeout, self.dry)
        } else {
            self.timeout
        };
        let result = worker.call(request, timeout, stop);
        if over_rpc && fresh && result.is_ok() {
            self.pace.fresh_answered(worker.slowest.unwrap_or_default());
        }
        match &result {
            Ok(_) | Err(TrialFailure::Refused { .. } | TrialFailure::GaveUp { .. }) => {
                // Most recently used last, so eviction takes the oldest.
                let w = self.workers.remove(idx);
                self.workers.push(w);
            }
            Err(failure) => {
                // The worker is gone (crashed, killed or timed out): forget it.
                self.workers.remove(idx);
                let crashed = matches!(
                    failure,
                    TrialFailure::Crashed { .. }
                        | TrialFailure::Exited { .. }
                        | TrialFailure::TimedOut { .. }
                );
                if crashed && over_rpc {
                    if let Some(lost) = host_lost(&m.settings.rpc, failure) {
                        // The host's fault, not the placement's: not counted as its crash.
                        return Err(lost);
                    }
                }
                if crashed {
                    *self.crashes.entry(key).or_insert(0) += 1;
                }
            }
        }
        result
    }

    pub fn shutdown(&mut self) {
        for (_, w) in self.workers.drain(..) {
            w.quit();
        }
    }
}

/// Where a worker over RPC failed and one of its servers is now down or does not answer its check
/// (asked in seconds, the worker gone, so the server is free for it), that as the failure.
fn host_lost(rpc: &[String], failure: &TrialFailure) -> Option<TrialFailure> {
    let (endpoint, problem) = crate::llama::rpc_check::first_problem(rpc)?;
    Some(TrialFailure::RpcHost {
        endpoint,
        problem,
        failure: Box::new(failure.clone()),
    })
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// llama.cpp's fit (`common_fit_params`) in a worker of its own: it loads the model several times
/// with `no_alloc` and aborts like any llama.cpp call; the worker is gone when this returns, so a
/// ggml RPC server it talked to is free for the next client.
pub fn llama_fit(
    request: &FitRequest,
    timeout: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<FitAnswer, TrialFailure> {
    let mut worker = Worker::spawn().map_err(|e| TrialFailure::Exited {
        code: -1,
        stderr_tail: format!("cannot start worker: {e}"),
    })?;
    let answer = match worker.call(&Request::LlamaFit(request.clone()), timeout, stop)? {
        Response::Fitted(f) => Ok(f),
        _ => Err(TrialFailure::Refused {
            stage: "fit".into(),
            message: "unexpected answer from the worker".into(),
        }),
    };
    worker.quit();
    answer
}
