//! ggml RPC: connecting to remote devices (`host:port`) and serving this machine's CPU as one.

use super::LlamaError;
use llama_cpp_sys_2 as sys;
use std::ffi::{c_char, c_void, CString};
use std::sync::Mutex;

fn rpc_proc(name: &str) -> Option<*mut c_void> {
    // SAFETY: registry lookups by static names.
    unsafe {
        let reg = sys::ggml_backend_reg_by_name(c"RPC".as_ptr());
        if reg.is_null() {
            return None;
        }
        let cname = CString::new(name).ok()?;
        let p = sys::ggml_backend_reg_get_proc_address(reg, cname.as_ptr());
        (!p.is_null()).then_some(p)
    }
}

static RPC_SERVERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Connects to every ggml RPC server of a run (`host:port` each); stops at the first that fails.
pub fn rpc_add_servers(endpoints: &[String]) -> Result<(), LlamaError> {
    endpoints.iter().try_for_each(|e| rpc_add_server(e))
}

/// Connects to a ggml RPC server (`host:port`), which then appears as a non-CPU device. Idempotent.
pub fn rpc_add_server(endpoint: &str) -> Result<(), LlamaError> {
    let mut added = RPC_SERVERS
        .lock()
        .map_err(|_| LlamaError::Rpc("lock poisoned".into()))?;
    if added.iter().any(|e| e == endpoint) {
        return Ok(());
    }
    let p = rpc_proc("ggml_backend_rpc_add_server")
        .ok_or_else(|| LlamaError::Rpc("this build has no RPC backend".into()))?;
    let c = CString::new(endpoint)
        .map_err(|_| LlamaError::Rpc(format!("bad endpoint '{endpoint}'")))?;
    // ggml aborts the process when it cannot reach the server, and blocks for ever on one that
    // accepts and never answers: it is asked here first, in bounded time.
    let addr = super::rpc_endpoint::parse_endpoint(endpoint)
        .and_then(|e| e.resolve())
        .map_err(|e| LlamaError::Rpc(e.to_string()))?;
    super::rpc_check::check(endpoint, addr, super::rpc_check::Timeouts::default())
        .map_err(|e| LlamaError::Rpc(e.to_string()))?;
    // SAFETY: the proc address has this signature in ggml-rpc.h.
    let reg = unsafe {
        let f: unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t =
            std::mem::transmute(p);
        f(c.as_ptr())
    };
    if reg.is_null() {
        return Err(LlamaError::Rpc(format!(
            "cannot connect to the RPC server at {endpoint}"
        )));
    }
    // SAFETY: registers the returned backend registry with ggml.
    unsafe { sys::ggml_backend_register(reg) };
    added.push(endpoint.to_string());
    Ok(())
}

/// Serves this machine's CPU as a ggml RPC device on `endpoint`; blocks for ever.
pub fn rpc_start_server(endpoint: &str, threads: usize) -> Result<(), LlamaError> {
    let p = rpc_proc("ggml_backend_rpc_start_server")
        .ok_or_else(|| LlamaError::Rpc("this build has no RPC backend".into()))?;
    let c = CString::new(endpoint)
        .map_err(|_| LlamaError::Rpc(format!("bad endpoint '{endpoint}'")))?;
    // SAFETY: plain registry lookup.
    let mut cpu = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    if cpu.is_null() {
        return Err(LlamaError::Rpc("no CPU device to serve".into()));
    }
    // SAFETY: the proc address has this signature in ggml-rpc.h; the device pointer outlives the call.
    unsafe {
        let f: unsafe extern "C" fn(
            *const c_char,
            *const c_char,
            usize,
            usize,
            *mut sys::ggml_backend_dev_t,
        ) = std::mem::transmute(p);
        f(c.as_ptr(), std::ptr::null(), threads, 1, &mut cpu);
    }
    Ok(())
}
