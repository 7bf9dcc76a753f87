//! `autotune __worker`: the child process every trial runs in (llama.cpp aborts the whole process on
//! some failures, so the tuner never measures in its own). One JSON line in, one JSON line out: each
//! request goes to the part of autotune that answers it (the measuring worker, quantization and
//! quality, speculative decoding, llama.cpp's fit, the device probes), which know only the protocol.
//! It sits beside `main.rs` because it calls every feature; nothing calls it but `main`.

use crate::llama;
use crate::worker::{self, Request, Response};
use std::io::{BufRead, Write};

/// Entry point of `autotune __worker`: serve requests from stdin until EOF or `Quit`.
pub fn serve() -> anyhow::Result<()> {
    llama::init(std::env::var_os("AUTOTUNE_WORKER_LOG").is_some());
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut state = worker::server::WorkerState::default();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let request: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                let r = Response::Failed {
                    stage: "protocol".into(),
                    message: e.to_string(),
                };
                writeln!(stdout, "{}", serde_json::to_string(&r)?)?;
                stdout.flush()?;
                continue;
            }
        };
        worker::fault::before_request(&request);
        let response = match request {
            Request::Quit => break,
            Request::Measure(m) => state.measure(&m),
            Request::Footprint(m) => state.footprint(&m),
            Request::Quantize(q) => crate::quant::serve::quantize(&q),
            Request::Quality(q) => crate::quant::serve::quality(&q),
            Request::DraftCheck(c) => crate::speculative::serve::check(&c),
            Request::Speculate(r) => crate::speculative::serve::speculate(&r),
            Request::SpecFootprint(r) => crate::speculative::serve::footprint(&r),
            Request::LlamaFit(r) => match crate::llama::fit::fit(&r) {
                Ok(answer) => Response::Fitted(answer),
                Err((stage, e)) => Response::Failed {
                    stage: stage.into(),
                    message: e.to_string(),
                },
            },
            Request::Bandwidth(r) => worker::server::bandwidth(&r),
            Request::Link(r) => worker::server::link(&r),
            Request::Greedy(r) => crate::quant::checks::greedy(&r),
            Request::Retrieval(r) => crate::quant::checks::retrieval(&r),
            Request::KvPairs(r) => worker::server::kv_pairs(&r),
            Request::Matmul(r) => worker::server::matmul(&r),
        };
        writeln!(stdout, "{}", serde_json::to_string(&response)?)?;
        stdout.flush()?;
    }
    Ok(())
}
