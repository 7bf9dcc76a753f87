//! Lets the `autotune` binary find llama.cpp's shared libraries at run time without LD_LIBRARY_PATH:
//! an rpath to the directory the llama-cpp-sys-2 build installed them in, and `$ORIGIN/lib` for an
//! installed layout (binary + lib/ + backends/ side by side). Also compiles native/mtp_slots.cpp
//! against the llama.cpp sources that build used.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_BACKENDS_DIR");
    let backends = std::env::var("DEP_LLAMA_BACKENDS_DIR").expect(
        "llama-cpp-sys-2 is built with its dynamic-backends feature (the workspace sets it)",
    );
    let out = std::path::Path::new(&backends)
        .parent()
        .expect("backends dir has a parent");
    for lib in ["lib", "lib64"] {
        let dir = out.join(lib);
        if dir.is_dir() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/lib");
    println!("cargo:rustc-env=AUTOTUNE_BACKENDS_DIR_BUILD={backends}");
    let cache = out.join("build").join("CMakeCache.txt");
    println!("cargo:rerun-if-changed={}", cache.display());
    let text = std::fs::read_to_string(&cache)
        .unwrap_or_else(|e| panic!("{}: llama-cpp-sys-2's CMake cache: {e}", cache.display()));
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.split_once('=').map(|(_, v)| v.trim()))
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let source = value("llama.cpp_SOURCE_DIR:")
        .expect("llama-cpp-sys-2's CMake cache names its llama.cpp sources");
    mtp_slots(std::path::Path::new(&source));
    // How llama.cpp was compiled (build type and its C++ flags): part of the build's identity, so
    // measurements of a differently optimised build are not reused.
    if let Some(build_type) = value("CMAKE_BUILD_TYPE:") {
        let flags = value(&format!("CMAKE_CXX_FLAGS_{}:", build_type.to_uppercase()));
        let config = match flags {
            Some(f) => format!("{build_type} {f}"),
            None => build_type,
        };
        println!("cargo:rustc-env=AUTOTUNE_LLAMA_BUILD_CONFIG={config}");
    }
}

/// llama.cpp's `draft-mtp` drafter for several sequences (native/mtp_slots.cpp), compiled against
/// the llama.cpp sources llama-cpp-sys-2 built, with the flags its own C++ wrapper is compiled with;
/// it links against that build's libllama-common.
fn mtp_slots(llama_src: &std::path::Path) {
    println!("cargo:rerun-if-changed=native/mtp_slots.cpp");
    cc::Build::new()
        .cpp(true)
        .file("native/mtp_slots.cpp")
        .include(llama_src)
        .include(llama_src.join("common"))
        .include(llama_src.join("include"))
        .include(llama_src.join("ggml/include"))
        .include(llama_src.join("vendor"))
        .flag_if_supported("-std=c++17")
        .pic(true)
        .compile("autotune_mtp_slots");
    // After the static library on the link line: the library it calls into.
    println!("cargo:rustc-link-lib=dylib=llama-common");
}
