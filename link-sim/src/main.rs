//! `link-proxy`: one throttled link between a local port and a server, until killed. A bench gives
//! each `autotune rpc-serve` one: `link-proxy --to 127.0.0.1:50052 --link wifi --listen 127.0.0.1:51052`.

use clap::Parser;
use link_sim::{LinkSpec, Proxy};
use std::net::SocketAddr;

#[derive(Parser)]
#[command(
    version,
    about = "A TCP proxy that behaves like a network link: a latency each way, a bandwidth cap, jitter"
)]
struct Args {
    /// Address to listen on (port 0: any free port, printed on stdout)
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The server every connection is joined to
    #[arg(long)]
    to: SocketAddr,
    /// The link: 10gbe (1.2 GB/s, 0.05 ms), 1gbe (118 MB/s, 0.2 ms), wifi (30 MB/s, 3 ms, 1 ms
    /// jitter), or BANDWIDTH,LATENCY[,JITTER] such as 50MB/s,1ms (latency each way)
    #[arg(long, value_parser = |s: &str| LinkSpec::parse(s).map_err(|e| e.to_string()))]
    link: LinkSpec,
}

fn main() {
    let a = Args::parse();
    match Proxy::start(a.listen, a.to, a.link) {
        Ok(p) => {
            // The address first, alone on its line, so a script can read it.
            println!("{}", p.addr());
            eprintln!(
                "link-proxy: {} -> {} over {}; Ctrl-C stops",
                p.addr(),
                a.to,
                a.link.describe()
            );
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("link-proxy: error: cannot listen on {}: {e}", a.listen);
            std::process::exit(1);
        }
    }
}
