//! Lets the `autotune` binary find llama.cpp's shared libraries at run time without LD_LIBRARY_PATH:
//! an rpath to the directory the llama-cpp-sys-2 build installed them in, and `$ORIGIN/lib` for an
//! installed layout (binary + lib/ + backends/ side by side).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_BACKENDS_DIR");
    if let Ok(backends) = std::env::var("DEP_LLAMA_BACKENDS_DIR") {
        let out = std::path::Path::new(&backends)
            .parent()
            .expect("backends dir has a parent");
        for lib in ["lib", "lib64"] {
            let dir = out.join(lib);
            if dir.is_dir() {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
            }
        }
        println!("cargo:rustc-env=AUTOTUNE_BACKENDS_DIR_BUILD={backends}");
        // How llama.cpp was compiled (build type and its C++ flags), from its CMake cache: part of
        // the build's identity, so measurements of a differently optimised build are not reused.
        let cache = out.join("build").join("CMakeCache.txt");
        println!("cargo:rerun-if-changed={}", cache.display());
        if let Ok(text) = std::fs::read_to_string(&cache) {
            let value = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(key)?.split_once('=').map(|(_, v)| v.trim()))
                    .filter(|v| !v.is_empty())
                    .map(str::to_string)
            };
            if let Some(build_type) = value("CMAKE_BUILD_TYPE:") {
                let flags = value(&format!("CMAKE_CXX_FLAGS_{}:", build_type.to_uppercase()));
                let config = match flags {
                    Some(f) => format!("{build_type} {f}"),
                    None => build_type,
                };
                println!("cargo:rustc-env=AUTOTUNE_LLAMA_BUILD_CONFIG={config}");
            }
        }
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/lib");
}
