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
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/lib");
}
