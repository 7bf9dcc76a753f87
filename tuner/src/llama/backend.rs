//! Starting llama.cpp (log routing, backend modules) and what it reports about itself: backends,
//! module files, build and system information (its devices: `devices.rs`).

use super::{cstr, log};
use llama_cpp_sys_2 as sys;
use serde::Serialize;
use std::ffi::c_char;
use std::sync::OnceLock;

static BACKEND: OnceLock<llama_cpp_2::llama_backend::LlamaBackend> = OnceLock::new();
/// What llama.cpp logged while starting (the modules it loaded, the CPU variant it chose): logged
/// once per process, kept for every probe.
static STARTUP_LOG: OnceLock<Vec<String>> = OnceLock::new();

/// Starts llama.cpp once per process: routes its log into our buffer (echoed to stderr when `echo`),
/// and loads every backend module present (CPU variants, CUDA, Vulkan, RPC, ...).
pub fn init(echo: bool) {
    log::set_echo(echo);
    BACKEND.get_or_init(|| {
        // SAFETY: the callback is a plain function that lives for the whole program.
        unsafe { sys::llama_log_set(Some(log::log_callback), std::ptr::null_mut()) };
        load_backend_modules();
        let backend = llama_cpp_2::llama_backend::LlamaBackend::init()
            .expect("llama.cpp backend initialises once");
        STARTUP_LOG.get_or_init(log::take_log);
        backend
    });
}

/// The NUMA strategy this process's llama.cpp runs with, once a load asked for one.
static NUMA: OnceLock<search_space::Numa> = OnceLock::new();

/// Sets llama.cpp's NUMA strategy (`llama_numa_init`, what `--numa` does) before a load that asks
/// for one. It cannot be undone or changed, so a later load that asks for another strategy (or for
/// none) is an error; each trial worker holds one configuration's model settings, so in a run this
/// does not happen.
pub fn numa_init(numa: search_space::Numa) -> Result<(), super::LlamaError> {
    let step = numa_step(NUMA.get().copied(), numa).map_err(super::LlamaError::ModelLoad)?;
    if let NumaStep::Init(strategy) = step {
        NUMA.get_or_init(|| {
            let s = match strategy {
                search_space::Numa::Isolate => sys::GGML_NUMA_STRATEGY_ISOLATE,
                _ => sys::GGML_NUMA_STRATEGY_DISTRIBUTE,
            };
            // SAFETY: the backends are loaded ([`init`] ran); called once per process (a worker
            // loads one model at a time, so no other load races this one).
            unsafe { sys::llama_numa_init(s) };
            strategy
        });
    }
    Ok(())
}

/// What a load asking for `asked` does in a process whose llama.cpp runs with `current`.
#[derive(Debug, PartialEq, Eq)]
enum NumaStep {
    /// Nothing to set: the process already runs as asked (or off, never set).
    Keep,
    /// Set this strategy before the load.
    Init(search_space::Numa),
}

fn numa_step(
    current: Option<search_space::Numa>,
    asked: search_space::Numa,
) -> Result<NumaStep, String> {
    match current {
        None if asked.is_off() => Ok(NumaStep::Keep),
        None => Ok(NumaStep::Init(asked)),
        Some(set) if set == asked => Ok(NumaStep::Keep),
        Some(set) => Err(format!(
            "this process already runs llama.cpp with --numa {set}; --numa {asked} needs a new one"
        )),
    }
}

/// The lines llama.cpp logged while starting ([`init`] first).
pub fn startup_log() -> &'static [String] {
    STARTUP_LOG.get().map_or(&[], Vec::as_slice)
}

/// Backend modules are looked for in `AUTOTUNE_BACKEND_DIR`, next to the executable (`backends/`),
/// in `<exe dir>/../lib/autotune` (what `scripts/install` writes: `PREFIX/bin/autotune` beside
/// `PREFIX/lib/autotune/`), and in the directory the build wrote them to. The installed layouts come
/// before the build's directory, so an installed binary loads its own modules even while the build
/// it came from still exists.
fn load_backend_modules() {
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("AUTOTUNE_BACKEND_DIR") {
        dirs.push(d.into());
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(bin) = exe.parent() {
            dirs.push(bin.join("backends"));
            if let Some(prefix) = bin.parent() {
                dirs.push(prefix.join("lib").join("autotune"));
            }
        }
    }
    if let Some(d) = sys::BACKENDS_DIR {
        dirs.push(d.into());
    }
    for d in dirs {
        let has_cpu = std::fs::read_dir(&d)
            .map(|it| {
                it.flatten()
                    .any(|e| e.file_name().to_string_lossy().contains("ggml-cpu"))
            })
            .unwrap_or(false);
        if has_cpu {
            let _ = MODULE_DIR.set(d.clone());
            llama_cpp_2::llama_backend::load_backends_from_path(&d);
            return;
        }
    }
    // SAFETY: plain call; searches ggml's default locations.
    unsafe { sys::ggml_backend_load_all() };
}

/// Names of the registered backends (`CPU`, `RPC`, `CUDA`, ...).
pub fn backends() -> Vec<String> {
    // SAFETY: plain getters over ggml's registry; names are static strings.
    unsafe {
        (0..sys::ggml_backend_reg_count())
            .map(|i| cstr(sys::ggml_backend_reg_name(sys::ggml_backend_reg_get(i))))
            .collect()
    }
}

/// A buffer type by its ggml name (`CPU`, `RPC0[127.0.0.1:50052]`, `CUDA0`) or its device's name.
pub fn buffer_type_by_name(name: &str) -> Option<sys::ggml_backend_buffer_type_t> {
    // SAFETY: registry getters; names are static strings.
    unsafe {
        (0..sys::ggml_backend_dev_count()).find_map(|i| {
            let dev = sys::ggml_backend_dev_get(i);
            let buft = sys::ggml_backend_dev_buffer_type(dev);
            (cstr(sys::ggml_backend_dev_name(dev)) == name
                || cstr(sys::ggml_backend_buft_name(buft)) == name)
                .then_some(buft)
        })
    }
}

/// The directory `init` loaded the backend modules from; unset when ggml searched by itself.
static MODULE_DIR: OnceLock<std::path::PathBuf> = OnceLock::new();

/// One backend module file (`libggml-<name>.so`) of the directory `init` loaded modules from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BackendModule {
    pub file: String,
    /// The backend ggml registered from this file (`CPU`, `CUDA`, `RPC`, ...); None when ggml did
    /// not load it (another CPU variant was chosen, or the file could not be opened).
    pub backend: Option<String>,
    /// Devices that backend has now (a CUDA module without an NVIDIA driver registers none).
    pub devices: usize,
}

/// The module directory and each module in it, with the backend ggml registered from it (matched
/// by ggml's "loaded CUDA backend from DIR/libggml-cuda.so" lines in `log`, what `init` logged) and
/// that backend's device count. Empty for a build without loadable modules.
pub fn backend_modules(log: &[String]) -> (Option<std::path::PathBuf>, Vec<BackendModule>) {
    let Some(dir) = MODULE_DIR.get() else {
        return (None, Vec::new());
    };
    let loaded = log::loaded_modules(log);
    // SAFETY: plain getters over ggml's registry; names are static strings.
    let counts: Vec<(String, usize)> = unsafe {
        (0..sys::ggml_backend_reg_count())
            .map(|i| {
                let reg = sys::ggml_backend_reg_get(i);
                (
                    cstr(sys::ggml_backend_reg_name(reg)),
                    sys::ggml_backend_reg_dev_count(reg),
                )
            })
            .collect()
    };
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| {
                    f.starts_with("libggml-") && f.ends_with(".so") && f != "libggml-base.so"
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let modules = files
        .into_iter()
        .map(|file| {
            let backend = loaded
                .iter()
                .find(|(_, f)| *f == file)
                .map(|(b, _)| b.clone());
            let devices = backend
                .as_ref()
                .and_then(|b| counts.iter().find(|(n, _)| n == b))
                .map_or(0, |(_, c)| *c);
            BackendModule {
                file,
                backend,
                devices,
            }
        })
        .collect();
    (Some(dir.clone()), modules)
}

/// llama.cpp's own system information line (`CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | ...`).
pub fn system_info() -> String {
    // SAFETY: returns a static string.
    unsafe { cstr(sys::llama_print_system_info()) }
        .trim()
        .to_string()
}

extern "C" {
    // Globals of llama.cpp's build-info (C++ globals are not name-mangled).
    static LLAMA_BUILD_NUMBER: i32;
    static LLAMA_COMMIT: *const c_char;
}

/// The llama.cpp build this binary links: its version the way llama.cpp's tools print it
/// (`0.6.0-dev (build N, commit C)`), and the commit.
pub fn build_info() -> (String, String) {
    // SAFETY: read-only globals initialised at load time.
    let (number, commit) = unsafe { (LLAMA_BUILD_NUMBER, cstr(LLAMA_COMMIT)) };
    let commit = if commit.is_empty() || commit == "unknown" {
        "llama-cpp-sys-2 0.1.161".to_string()
    } else {
        commit
    };
    // The same sources built another way (-O2 vs -O3, other flags) measure differently: the
    // compiler settings are part of the build's identity (measurement cache keys, profile staleness).
    let commit = match option_env!("AUTOTUNE_LLAMA_BUILD_CONFIG") {
        Some(config) => format!("{commit} ({config})"),
        None => commit,
    };
    (
        format!("{LLAMA_VERSION} (build {number}, commit {commit})"),
        commit,
    )
}

/// llama.cpp's version (its CMakeLists' LLAMA_VERSION) of the sources llama-cpp-sys-2 0.1.161 vendors.
pub const LLAMA_VERSION: &str = "0.6.0-dev";

#[cfg(test)]
mod tests {
    use super::{numa_step, NumaStep};
    use search_space::Numa;

    #[test]
    fn a_numa_strategy_is_set_once_and_never_changed() {
        assert_eq!(numa_step(None, Numa::Off), Ok(NumaStep::Keep));
        assert_eq!(
            numa_step(None, Numa::Distribute),
            Ok(NumaStep::Init(Numa::Distribute))
        );
        assert_eq!(
            numa_step(Some(Numa::Isolate), Numa::Isolate),
            Ok(NumaStep::Keep)
        );
        // Neither another strategy nor off once one is set: the load would run mislabelled.
        for asked in [Numa::Distribute, Numa::Off] {
            let e = numa_step(Some(Numa::Isolate), asked).unwrap_err();
            assert!(e.contains("--numa isolate"), "{e}");
        }
    }
}
