//! The host's memory as the OS reports it (sysinfo): its size, and what a new process can have of
//! it now. A leaf: the machine's probe, llama.cpp's CPU device and the worker's load check read it.

use sysinfo::{MemoryRefreshKind, RefreshKind, System};

/// The RAM's size and what a new process can have of it now (free memory plus the page cache and
/// slab the kernel can reclaim: Linux's MemTotal and MemAvailable), in bytes, as the OS reports them
/// (sysinfo); 0 where it cannot say.
pub fn total_and_available() -> (u64, u64) {
    let memory = RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram());
    let sys = System::new_with_specifics(memory);
    (sys.total_memory(), sys.available_memory())
}

/// The RAM available to a new process now (see [`total_and_available`]); `None` where the OS does not say.
pub fn available_now() -> Option<u64> {
    Some(total_and_available().1).filter(|&a| a > 0)
}
