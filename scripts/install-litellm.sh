#!/usr/bin/env bash
# Install (once per machine) the real LiteLLM proxy for gpuheal's real-LiteLLM test tier (issue 11).
#
# Source: `litellm[proxy]` from PyPI, pinned below, into its own virtualenv (never gpuheal's .venv:
# LiteLLM pulls ~700 MB of dependencies whose pins must not leak into gpuheal's environment).
# Result: ${GPUHEAL_LITELLM_CACHE:-$HOME/.cache/gpuheal}/litellm-<version>/bin/litellm
#
# Idempotent: if the cached proxy exists and imports at the pinned version, its path is printed and
# nothing is installed. Concurrent invocations serialise on a flock; only one installs. The `litellm`
# executable's path is always the LAST line on stdout; progress goes to stderr.
#
# Environment:
#   GPUHEAL_LITELLM_CACHE   cache root (default: $HOME/.cache/gpuheal)
#   PYTHON                  python (>= 3.9, with the venv module) for the virtualenv (default: python3)
#
# Options:
#   --check        print the executable's path and exit 0 if it is installed and works, else exit 1
#   --print-path   print where the executable is (or would be) and exit 0 (never installs)
set -euo pipefail

LITELLM_VERSION="1.108.7"

CACHE_ROOT="${GPUHEAL_LITELLM_CACHE:-$HOME/.cache/gpuheal}"
DEST="${CACHE_ROOT}/litellm-${LITELLM_VERSION}"
BIN="${DEST}/bin/litellm"
PY="${PYTHON:-python3}"

log() { printf '%s\n' "install-litellm: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The cached install counts only if its python imports the pinned litellm and the proxy's server.
install_ok() {
    [ -x "$BIN" ] && [ -x "${DEST}/bin/python" ] || return 1
    [ -f "${DEST}/.gpuheal-installed" ] || return 1
    local v
    v="$("${DEST}/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))' 2>/dev/null)" || return 1
    [ "$v" = "$LITELLM_VERSION" ] || return 1
    "${DEST}/bin/python" -c 'import prometheus_client' 2>/dev/null
}

# The `prometheus` callback (LiteLLM's own /metrics: per-deployment request and failure counts, issue 20)
# needs prometheus_client, which litellm[proxy] does not pull in (it is the `proxy-runtime` extra).
PROM_CLIENT="prometheus-client>=0.20.0,<1.0"

case "${1:-}" in
    "") ;;
    --print-path) printf '%s\n' "$BIN"; exit 0 ;;
    --check) if install_ok; then printf '%s\n' "$BIN"; exit 0; else exit 1; fi ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) die "unknown option: $1 (try --help)" ;;
esac

if install_ok; then
    printf '%s\n' "$BIN"
    exit 0
fi
# an install from before the prometheus callback was used: add the one package, not 700 MB again
if [ -f "${DEST}/.gpuheal-installed" ] && [ -x "${DEST}/bin/python" ] \
    && ! "${DEST}/bin/python" -c 'import prometheus_client' 2>/dev/null; then
    log "adding ${PROM_CLIENT} to ${DEST} (LiteLLM's prometheus callback)"
    "${DEST}/bin/python" -m pip install --quiet --disable-pip-version-check "$PROM_CLIENT" >&2 || true
    if install_ok; then
        printf '%s\n' "$BIN"
        exit 0
    fi
fi

command -v flock >/dev/null 2>&1 || die "missing tool: flock (Debian package: util-linux)"
command -v "$PY" >/dev/null 2>&1 || die "missing tool: $PY (Debian package: python3)"
"$PY" -c 'import venv, ensurepip' 2>/dev/null || die "'$PY -m venv' does not work (Debian package: python3-venv)"

mkdir -p "$CACHE_ROOT"
LOCK="${CACHE_ROOT}/.litellm-${LITELLM_VERSION}.lock"
exec 9>"$LOCK"
if ! flock -n 9; then
    log "another install holds $LOCK; waiting for it..."
    flock 9
fi
if install_ok; then
    printf '%s\n' "$BIN"
    exit 0
fi

rm -rf "${CACHE_ROOT}/.install-litellm-${LITELLM_VERSION}."* 2>/dev/null || true
log "installing litellm[proxy]==${LITELLM_VERSION} (about 90 s and 700 MB, once per machine)..."
start_ts=$(date +%s)

# A virtualenv cannot be moved after creation (its scripts carry absolute paths), so it is built in
# place; the marker file written last is what makes it count (a killed install is rebuilt).
rm -rf "$DEST"
"$PY" -m venv "$DEST"
"${DEST}/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"${DEST}/bin/python" -m pip install --quiet --disable-pip-version-check \
    "litellm[proxy]==${LITELLM_VERSION}" "$PROM_CLIENT" >&2
[ -x "$BIN" ] || die "pip finished but $BIN is missing"
LITELLM_LOCAL_MODEL_COST_MAP=True "${DEST}/bin/python" -c 'import litellm.proxy.proxy_server' >&2 \
    || die "litellm.proxy.proxy_server does not import in ${DEST}"
{
    echo "litellm=${LITELLM_VERSION}"
    echo "installed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "install_seconds=$(( $(date +%s) - start_ts ))"
    echo "size_mb=$(du -sm "$DEST" | cut -f1)"
} > "${DEST}/.gpuheal-installed"
install_ok || die "installed proxy at $DEST does not report litellm ${LITELLM_VERSION}"
log "done in $(( $(date +%s) - start_ts )) s"
printf '%s\n' "$BIN"
