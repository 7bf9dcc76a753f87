//! `autotune doctor`: what llama.cpp sees on this machine — devices, backends, the CPU variant it
//! loaded, and its system info line (which SIMD kernels are in use).

use crate::cli::{Cli, DoctorArgs};
use crate::{exit, gpus, llama, machine::Machine};
use search_space::size::format_size;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Doctor {
    pub machine: Machine,
    pub backends: Vec<String>,
    pub cpu_variant: Option<String>,
    pub system_info: String,
    pub llama_version: String,
    /// GPUs the operating system shows, whether or not a loaded backend drives them.
    pub gpus: Vec<gpus::Gpu>,
    /// One line per vendor whose GPUs no device of this build is driven by (`gpus::unused`).
    pub gpu_warnings: Vec<String>,
}

/// Starts llama.cpp in this process (connecting the RPC servers given) and reads what it sees.
pub fn probe(verbose: bool, rpc: &[String]) -> anyhow::Result<Doctor> {
    llama::init(verbose);
    let log = llama::take_log();
    llama::rpc_add_servers(rpc).map_err(|e| anyhow::anyhow!("{e}"))?;
    let devices = llama::devices();
    let backends = llama::backends();
    let found = gpus::this_machine();
    let gpu_warnings = gpus::unused(&found, &backends, &devices);
    Ok(Doctor {
        machine: Machine::probe(devices),
        backends,
        gpus: found,
        gpu_warnings,
        cpu_variant: llama::cpu_variant(&log),
        system_info: llama::system_info(),
        llama_version: llama::build_info().0,
    })
}

pub fn run(cli: &Cli, args: &DoctorArgs) -> anyhow::Result<i32> {
    let d = probe(cli.verbose, &args.rpc)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(exit::OK);
    }
    let m = &d.machine;
    println!(
        "cpu          {} ({} cores, {} logical CPUs)",
        m.cpu, m.physical_cores, m.logical_cpus
    );
    println!(
        "memory       {} total, {} available",
        format_size(m.ram_bytes),
        format_size(m.ram_available_bytes)
    );
    println!("os           {}", m.os);
    println!("llama.cpp    {}", d.llama_version);
    println!("backends     {}", d.backends.join(", "));
    println!(
        "cpu variant  {}",
        d.cpu_variant.as_deref().unwrap_or("(static build)")
    );
    println!("system info  {}", d.system_info);
    println!("devices");
    for dev in &m.devices {
        println!(
            "  {:<12} {:<6} {:<5} {} free of {}  {}",
            dev.name,
            dev.backend,
            dev.kind,
            format_size(dev.memory_free),
            format_size(dev.memory_total),
            dev.description
        );
    }
    if !d.gpus.is_empty() {
        println!("gpus (seen by the OS)");
        for g in &d.gpus {
            println!("  {:<40} {}", g.name, g.source);
        }
    }
    for w in &d.gpu_warnings {
        println!("warning      {w}");
    }
    println!("fingerprint  {}", &m.fingerprint[..16]);
    Ok(exit::OK)
}
