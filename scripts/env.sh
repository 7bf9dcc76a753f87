# Sourced by the scripts: shared build settings and the system prerequisites check.
# The cargo target dir lives in the user cache, outside the checkout, so a fresh clone on the same
# machine reuses the ~15-minute llama.cpp build.
export AUTOTUNE_CACHE_DIR="${AUTOTUNE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/autotune}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$AUTOTUNE_CACHE_DIR/target}"
export GGML_RPC=ON
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
AUTOTUNE_BIN="$CARGO_TARGET_DIR/release/autotune"

# libclang itself (what bindgen loads): libclang.so*, libclang-14.so*. Not libclang-cpp.so*, the C++
# library llvm ships beside it, which a machine can have without libclang (bindgen then fails with
# "Unable to find libclang").
have_libclang() {
  local f d
  for d in /usr/lib/llvm-*/lib /usr/lib/*-linux-gnu /usr/lib /usr/local/lib; do
    for f in "$d"/libclang.so* "$d"/libclang-[0-9]*.so*; do
      [ -e "$f" ] && return 0
    done
  done
  return 1
}

# apt-get install of the packages given (with sudo when not root); fails with a one-line error
# naming them when that cannot be done.
apt_install() {
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo=sudo; else
      echo "error: missing $*; install them with your package manager (apt-get install $*)" >&2
      return 1
    fi
  fi
  command -v apt-get >/dev/null 2>&1 ||
    { echo "error: missing $*; install them with your package manager" >&2; return 1; }
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}

# Installs what building llama.cpp needs (cmake, a C++ compiler, libclang for bindgen) when missing,
# and python3 with pip and venv (the reference tools' sdist, the CUDA toolkit's venv).
ensure_prerequisites() {
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v c++ >/dev/null 2>&1 || missing+=(g++)
  have_libclang || missing+=(libclang-dev)
  if ! command -v python3 >/dev/null 2>&1; then
    missing+=(python3 python3-pip python3-venv)
  elif ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    # A stock Debian or Ubuntu python3 lacks ensurepip: `python3 -m venv` (vendor/cuda-toolkit)
    # then fails until python3-venv is installed.
    missing+=(python3-venv)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing system prerequisites: ${missing[*]}" >&2
    apt_install "${missing[@]}" || exit 1
  fi
  command -v cargo >/dev/null 2>&1 || { echo "error: cargo not found: install Rust (rustup) first" >&2; exit 1; }
}

build_release() {
  # llama-cpp-sys-2's build script hard-links lib*.so symlinks into release/; dangling ones make a re-run
  # of it fail with "File exists".
  find "$CARGO_TARGET_DIR"/release "$CARGO_TARGET_DIR"/release/deps "$CARGO_TARGET_DIR"/release/examples \
    -maxdepth 1 -name 'lib*.so' -xtype l -delete 2>/dev/null || true
  # Paths compiled into the workspace crates (CARGO_MANIFEST_DIR: insta's snapshot dir, test fixtures)
  # belong to the checkout that built them; a second checkout sharing this target dir rebuilds the
  # workspace crates (seconds), never llama.cpp.
  local stamp="$CARGO_TARGET_DIR/.autotune-checkout" here
  here="$(pwd -P)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$here" ]; then
    echo "target dir was built from $(cat "$stamp"); rebuilding the workspace crates for $here" >&2
    cargo clean --release -p tuner -p profiles -p search-space >&2 2>&1 || true
  fi
  mkdir -p "$CARGO_TARGET_DIR" && printf '%s' "$here" >"$stamp"
  # cmake-rs never re-configures an existing llama.cpp build dir, so a dir configured with other
  # settings than .cargo/config.toml's (an older checkout's -O2 build) is removed once.
  local cache
  for cache in "$CARGO_TARGET_DIR"/release/build/llama-cpp-sys-2-*/out/build/CMakeCache.txt; do
    [ -f "$cache" ] || continue
    if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$cache" ||
      ! grep -q '^CMAKE_CXX_FLAGS_RELEASE:.*-fno-dse' "$cache"; then
      echo "llama.cpp was configured with other build settings; rebuilding it (~15 min)" >&2
      cargo clean --release -p llama-cpp-sys-2 >&2 2>&1 || true
      break
    fi
  done
  echo "building autotune (the first build compiles llama.cpp with every CPU variant: ~15 min on 2 cores)" >&2
  cargo build --release --locked -p tuner >&2
}
