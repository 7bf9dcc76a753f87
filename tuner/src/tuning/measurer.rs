//! The engine's real measurer: trial workers running llama.cpp (`worker::WorkerPool`), a separate
//! worker for dry runs (so they never evict a loaded model), the features that answer the rest of
//! the measuring contract (llama.cpp's fit, the devices' bandwidth probe, the quality gate's
//! evaluation) and the wall clock from the run's start. It lives with the run it serves, above the
//! worker processes and the features, so that neither reaches up to the other.

use crate::measuring::{FitAnswer, FitRequest, KvQualityAnswer, KvQualityRequest, Measurer};
use crate::measuring::{LoadReport, MeasureRequest, Repetition, TrialFailure};
use crate::worker::pool::llama_fit;
use crate::worker::{Request, Response, WorkerPool};
use std::time::{Duration, Instant};

/// The engine's real measurer: trial workers running llama.cpp, a separate worker for dry runs (so
/// they never evict a loaded model), and the wall clock from the run's start.
pub struct Workers {
    pool: WorkerPool,
    dry: WorkerPool,
    started: Instant,
}

impl Workers {
    /// Workers on the clock that began at `started`: the run's start, so that the budget bounds
    /// the probes and the link measurements before the engine too.
    pub fn new(pool: WorkerPool, started: Instant) -> Self {
        let dry = WorkerPool::for_dry_runs(pool.timeout);
        Workers { pool, dry, started }
    }
}

impl Measurer for Workers {
    fn measure(
        &mut self,
        req: &MeasureRequest,
        stop: &dyn Fn() -> bool,
    ) -> Result<Repetition, TrialFailure> {
        match self.pool.call(&Request::Measure(req.clone()), stop)? {
            Response::Measured(rep) => Ok(*rep),
            // A worker answers a measurement with a repetition or a refusal (an `Err` above).
            _ => Err(TrialFailure::Refused {
                stage: "measure".into(),
                message: "unexpected answer from the worker".into(),
            }),
        }
    }

    fn footprint(
        &mut self,
        req: &MeasureRequest,
        stop: &dyn Fn() -> bool,
    ) -> Result<LoadReport, String> {
        let exclusive = !req.settings.rpc.is_empty();
        if exclusive {
            // A ggml RPC server serves one client at a time: no trial worker may hold a connection
            // while the dry run talks to it, and the dry-run worker lets go right after.
            self.pool.shutdown();
        }
        let result = match self.dry.call(&Request::Footprint(req.clone()), stop) {
            Ok(Response::Footprint(report)) => Ok(report),
            Ok(_) => Err("unexpected answer to a dry run".to_string()),
            Err(f) => Err(format!("dry run failed: {f}")),
        };
        if exclusive {
            self.dry.shutdown();
        }
        result
    }

    fn llama_fit(
        &mut self,
        req: &FitRequest,
        stop: &dyn Fn() -> bool,
    ) -> Result<FitAnswer, String> {
        // The fit's worker holds the devices while it runs: no trial worker may hold them too (at
        // most one worker with a device at a time), and a ggml RPC server serves one client at a
        // time, so with RPC the dry-run worker lets go as well.
        self.pool.shutdown();
        if !req.rpc.is_empty() {
            self.dry.shutdown();
        }
        llama_fit(req, self.pool.timeout, stop).map_err(|f| format!("llama.cpp's fit failed: {f}"))
    }

    fn device_bandwidths(
        &mut self,
        devices: &[(String, u64)],
        rpc: &[String],
    ) -> Vec<(String, f64)> {
        // The probe allocates on each device in a worker of its own: no trial worker may hold a
        // device meanwhile, and a ggml RPC server serves one client at a time.
        self.pool.shutdown();
        if !rpc.is_empty() {
            self.dry.shutdown();
        }
        crate::explain::bandwidth::measure_devices_within(devices, rpc)
            .into_iter()
            .map(|d| (d.device, d.bytes_per_s))
            .collect()
    }

    fn kv_quality(
        &mut self,
        req: &KvQualityRequest,
        stop: &dyn Fn() -> bool,
        ends_by: Duration,
    ) -> Result<KvQualityAnswer, String> {
        // The evaluation loads the model twice in a worker of its own (on the devices where they
        // hold it, else on the CPU): no trial worker may hold memory meanwhile.
        self.pool.shutdown();
        self.dry.shutdown();
        let started = self.started;
        let stop = move || stop() || started.elapsed() >= ends_by;
        crate::quant::quality::kv_pair_quality(req, &stop)
    }

    fn crashes_for(&self, req: &MeasureRequest) -> u32 {
        self.pool.crashes_for(req)
    }

    fn unload(&mut self) {
        self.pool.shutdown();
    }

    fn shutdown(&mut self) {
        self.pool.shutdown();
        self.dry.shutdown();
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}
