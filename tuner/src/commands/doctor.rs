//! `autotune doctor`: prints what llama.cpp sees on this machine ([`crate::probe`]) as text or JSON.

use crate::busy::{self, Watch};
use crate::cli::{Cli, DoctorArgs};
use crate::{exit, probe};
use search_space::size::format_size;
use serde::Serialize;

/// The probe, and how busy other programs keep the CPUs while doctor looks.
#[derive(Serialize)]
struct Doctor {
    #[serde(flatten)]
    probe: probe::Probe,
    /// Other programs' share of the CPUs' time while doctor looked ([`busy`]); absent where
    /// `/proc` cannot say.
    others_cpu_share: Option<f64>,
}

pub fn run(cli: &Cli, args: &DoctorArgs) -> anyhow::Result<i32> {
    let watch = Watch::start(&args.rpc.servers);
    let d = probe::probe(cli.verbose, &args.rpc.servers)?;
    let others = watch.share(busy::SHORTEST_LOOK);
    if args.json {
        let doctor = Doctor {
            probe: d,
            others_cpu_share: others,
        };
        println!("{}", serde_json::to_string_pretty(&doctor)?);
        return Ok(exit::OK);
    }
    print_probe(&d);
    if let Some(share) = others {
        println!(
            "others       other programs took {:.0}% of the CPUs' time while doctor looked",
            share * 100.0
        );
    }
    if let Some(n) = busy::now_note(others, d.machine.logical_cpus) {
        println!("warning      {n}");
    }
    println!("fingerprint  {}", &d.machine.fingerprint[..16]);
    Ok(exit::OK)
}

/// What llama.cpp and the operating system see, as text.
fn print_probe(d: &probe::Probe) {
    let m = &d.machine;
    let numa = if m.numa_nodes > 1 {
        format!(
            ", {} NUMA nodes: tune measures --numa off, distribute and isolate",
            m.numa_nodes
        )
    } else {
        String::new()
    };
    let performance = m
        .performance_cores
        .map(|p| format!(": {p} performance cores, llama.cpp's default -t"))
        .unwrap_or_default();
    println!(
        "cpu          {} ({} cores{performance}, {} logical CPUs{numa})",
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
    match &d.modules.dir {
        Some(dir) => println!("modules      {dir}"),
        None => println!("modules      none (backends built into the binary)"),
    }
    for line in probe::module_lines(&d.modules.modules) {
        println!("  {line}");
    }
    println!(
        "cpu variant  {}",
        d.cpu_variant.as_deref().unwrap_or("(static build)")
    );
    println!("system info  {}", d.system_info);
    println!("devices");
    for dev in &m.devices {
        println!(
            "  {:<12} {:<6} {:<5} {} free of {}  {}{}",
            dev.name,
            dev.backend,
            dev.kind,
            format_size(dev.memory_free),
            format_size(dev.memory_total),
            dev.description,
            if dev.host_buffer {
                "  (pinned host memory)"
            } else {
                ""
            }
        );
    }
    for s in &d.skipped_devices {
        println!(
            "  {:<12} {:<6} {:<5} not used: {}",
            s.device.name, s.device.backend, s.device.kind, s.reason
        );
    }
    if !d.gpus.is_empty() {
        println!("gpus (seen by the OS)");
        for g in &d.gpus {
            println!("  {:<40} {}", g.name, g.source);
        }
        println!("gpu backends");
        for a in &d.gpu_advice {
            println!("  {}", a.line());
        }
    }
    for w in &d.gpu_warnings {
        println!("warning      {w}");
    }
}
