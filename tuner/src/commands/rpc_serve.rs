//! `autotune rpc-serve`: this machine's CPU as a ggml RPC device (`ggml_backend_rpc_start_server`).
//! On one machine it gives the tests a real second, non-CPU device to offload layers to; across
//! machines it is how a model is spread over several hosts.

use crate::cli::{Cli, RpcServeArgs};
use crate::exit::{self, Exit};
use crate::llama;

pub fn run(cli: &Cli, a: &RpcServeArgs) -> anyhow::Result<i32> {
    llama::init(cli.verbose);
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if threads == 0 {
        return Err(Exit::new(exit::USAGE, "--threads must be at least 1"));
    }
    let endpoint = format!("{}:{}", a.host, a.port);
    if a.host != "127.0.0.1" && a.host != "localhost" && a.host != "::1" {
        eprintln!("autotune: warning: the RPC protocol has no authentication; {endpoint} is reachable from the network");
    }
    eprintln!("autotune: serving the CPU as an RPC device on {endpoint} ({threads} threads); Ctrl-C stops");
    llama::rpc_start_server(&endpoint, threads)
        .map_err(|e| Exit::new(exit::ERROR, e.to_string()))?;
    Ok(exit::OK)
}
