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
    // ggml's server returns when it cannot listen, and also when accepting one client fails (a
    // client that connects and resets at once ends it): the first is an error, the second a reason
    // to listen again. A return within two seconds of starting is taken as the first.
    loop {
        let started = std::time::Instant::now();
        llama::rpc_start_server(&endpoint, threads)
            .map_err(|e| Exit::new(exit::ERROR, e.to_string()))?;
        if started.elapsed() < std::time::Duration::from_secs(2) {
            return Err(Exit::new(
                exit::ERROR,
                format!("cannot serve on {endpoint} (address in use, or not an IPv4 address?)"),
            ));
        }
        eprintln!("autotune: a client connection failed and ended the RPC server; listening again on {endpoint}");
    }
}
