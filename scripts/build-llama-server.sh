#!/usr/bin/env bash
# Build (once per machine) a genuine llama.cpp `llama-server` for gpuheal's real-server test tier.
#
# Source: the llama.cpp tree vendored in the PyPI sdist of llama-cpp-python (pinned below, sha256-checked).
# Result: ${GPUHEAL_LLAMA_CACHE:-$HOME/.cache/gpuheal}/llama-server-b<build>-<commit>/bin/llama-server
#
# Idempotent: if the cached binary exists and runs, its path is printed and nothing is built.
# Concurrent invocations serialise on a flock; only one builds. The binary path is always the LAST
# line on stdout; everything else (progress, compiler output) goes to stderr.
#
# Environment:
#   GPUHEAL_LLAMA_CACHE   cache root (default: $HOME/.cache/gpuheal)
#   GPUHEAL_LLAMA_JOBS    parallel compile jobs (default: 2)
#   PYTHON                python with pip, used to download the sdist (default: python3)
#
# Options:
#   --check        print the binary path and exit 0 if it is built and runs, else exit 1 (never builds)
#   --print-path   print where the binary is (or would be) and exit 0 (never builds)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_CPP_COMMIT="0c1e57098"   # vendor/llama.cpp HEAD in that sdist (short hash)
LLAMA_BUILD_NUMBER="11312"     # upstream release tag b11312; the sdist's shallow .git cannot count it
BUILD_ID="b${LLAMA_BUILD_NUMBER}-${LLAMA_CPP_COMMIT}"

CACHE_ROOT="${GPUHEAL_LLAMA_CACHE:-$HOME/.cache/gpuheal}"
DEST="${CACHE_ROOT}/llama-server-${BUILD_ID}"
BIN="${DEST}/bin/llama-server"
JOBS="${GPUHEAL_LLAMA_JOBS:-2}"
PY="${PYTHON:-python3}"

log() { printf '%s\n' "build-llama-server: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The cached binary counts only if it runs and reports the pinned build number and commit.
binary_ok() {
    [ -x "$BIN" ] || return 1
    local v
    v="$("$BIN" --version 2>&1)" || return 1
    case "$v" in
        *"build ${LLAMA_BUILD_NUMBER}, commit ${LLAMA_CPP_COMMIT}"*) return 0 ;;
        *) return 1 ;;
    esac
}

case "${1:-}" in
    "") ;;
    --print-path) printf '%s\n' "$BIN"; exit 0 ;;
    --check) if binary_ok; then printf '%s\n' "$BIN"; exit 0; else exit 1; fi ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown option: $1 (try --help)" ;;
esac

# Fast path: no lock, no tools needed.
if binary_ok; then
    printf '%s\n' "$BIN"
    exit 0
fi

# --- prerequisites -------------------------------------------------------------------------
missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$1 (Debian package: $2)"); }
need cmake cmake
need g++ g++
need gcc gcc
need make make
need tar tar
need sha256sum coreutils
need flock util-linux
need "$PY" python3
if [ ${#missing[@]} -gt 0 ]; then
    for m in "${missing[@]}"; do log "missing tool: $m"; done
    die "install them, e.g.: apt-get install -y cmake g++ make python3-pip util-linux"
fi
"$PY" -m pip --version >/dev/null 2>&1 || die "'$PY -m pip' does not work (Debian package: python3-pip)"

mkdir -p "$CACHE_ROOT"
LOCK="${CACHE_ROOT}/.llama-server-${BUILD_ID}.lock"
exec 9>"$LOCK"
if ! flock -n 9; then
    log "another build holds $LOCK; waiting for it..."
    flock 9
fi

# Someone else may have finished the build while we waited.
if binary_ok; then
    printf '%s\n' "$BIN"
    exit 0
fi

# Leftovers of a build that was killed (no EXIT trap ran); safe to delete, we hold the lock.
rm -rf "${CACHE_ROOT}/.build-${BUILD_ID}."* 2>/dev/null || true

log "building llama-server (about 8-13 minutes on 2 cores, once per machine)..."
log "target: $BIN"
start_ts=$(date +%s)

# Work inside the cache root so the final mv is an atomic rename on the same filesystem.
WORK="$(mktemp -d "${CACHE_ROOT}/.build-${BUILD_ID}.XXXXXX")"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

# --- download the sdist ----------------------------------------------------------------------
# NB: `--no-binary :all:` would also force pip to build every build backend from source (minutes);
# restricting it to llama-cpp-python fetches the identical sdist file.
log "downloading llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION} sdist from PyPI..."
"$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
    --dest "$WORK/dl" "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" >&2
SDIST="$(ls "$WORK"/dl/llama_cpp_python-"${LLAMA_CPP_PYTHON_VERSION}".tar.gz 2>/dev/null || true)"
[ -n "$SDIST" ] || die "pip did not produce llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}.tar.gz in $WORK/dl"
got_sha="$(sha256sum "$SDIST" | cut -d' ' -f1)"
[ "$got_sha" = "$SDIST_SHA256" ] || die "sdist sha256 mismatch: got $got_sha, want $SDIST_SHA256"

log "unpacking..."
tar -xzf "$SDIST" -C "$WORK"
SRC="$WORK/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp"
[ -f "$SRC/CMakeLists.txt" ] || die "no vendor/llama.cpp in the sdist"
[ -d "$SRC/tools/server" ] || die "vendor/llama.cpp has no tools/server"
if command -v git >/dev/null 2>&1 && [ -e "$SRC/.git" ]; then
    head="$(git -C "$SRC" rev-parse --short=9 HEAD 2>/dev/null || true)"
    if [ -n "$head" ] && [ "$head" != "$LLAMA_CPP_COMMIT" ]; then
        die "vendored llama.cpp is at $head, expected $LLAMA_CPP_COMMIT"
    fi
fi

# --- configure + build -------------------------------------------------------------------------
# LLAMA_CURL is a no-op in this llama.cpp (kept for older trees); HTTPS is LLAMA_OPENSSL.
# LLAMA_USE_PREBUILT_UI defaults ON and would download the web UI at configure time: turn it off.
# The sdist's .git is shallow, so build number and commit are passed explicitly (else "b1-0c1e570").
# BUILD_SHARED_LIBS=OFF links ggml/llama into the binary (only system libs stay dynamic).
log "configuring..."
cmake -S "$SRC" -B "$WORK/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DGGML_CCACHE=OFF \
    -DLLAMA_BUILD_NUMBER="$LLAMA_BUILD_NUMBER" \
    -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT" >&2

log "compiling (-j${JOBS})..."
cmake --build "$WORK/build" --target llama-server -j"$JOBS" >&2

BUILT="$WORK/build/bin/llama-server"
[ -x "$BUILT" ] || die "build finished but $BUILT is missing"

# --- stage + install atomically ----------------------------------------------------------------
STAGE="$WORK/stage"
mkdir -p "$STAGE/bin"
cp "$BUILT" "$STAGE/bin/llama-server"
# Any shared library that resolves inside the build tree (should be none with BUILD_SHARED_LIBS=OFF)
# is bundled next to the binary; system libraries (libc, libstdc++, libgomp, ...) are not.
if command -v ldd >/dev/null 2>&1; then
    ldd "$BUILT" | awk '/=>/ {print $3}' | while read -r lib; do
        case "$lib" in
            "$WORK"/*) log "bundling $lib"; cp "$lib" "$STAGE/bin/" ;;
        esac
    done
    if ldd "$STAGE/bin/llama-server" | grep -q 'not found'; then
        ldd "$STAGE/bin/llama-server" >&2
        die "staged binary has unresolved shared libraries"
    fi
fi
"$STAGE/bin/llama-server" --version >&2 || die "staged binary does not run"
{
    echo "llama_cpp_python_sdist=${LLAMA_CPP_PYTHON_VERSION}"
    echo "sdist_sha256=${SDIST_SHA256}"
    echo "build_id=${BUILD_ID}"
    echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "build_seconds=$(( $(date +%s) - start_ts ))"
    echo "compiler=$(g++ --version | head -n1)"
} > "$STAGE/BUILD_INFO"

rm -rf "$DEST"          # a stale, non-working install (we hold the lock)
mv "$STAGE" "$DEST"
binary_ok || die "installed binary at $BIN does not run"
log "done in $(( $(date +%s) - start_ts )) s"
printf '%s\n' "$BIN"
