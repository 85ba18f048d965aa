#!/usr/bin/env bash
# Install SGLang's own argument parser and start-up resolution for CPU-only tests
# (see docs/sglang-parser.md).
#
# Makes a venv under ${HYBRIDSERVING_CACHE:-$HOME/.cache/hybridserving}/sglang-<version>/
# holding the sglang wheel from PyPI, installed with --no-deps (its requirements are
# GPU builds: torch with CUDA, triton, flashinfer, ...), plus the small CPU packages
# that the import graph of sglang.srt.server_args needs (DEPS) and those that
# ServerArgs.resolve_once() needs on top: transformers and what it and the model-config
# modules import (RESOLUTION_DEPS). torch, triton, torchvision and the GPU kernel
# packages are not installed; support.sglang_parser and support.sglang_resolver stub
# them for the import only.
#
# Idempotent: does nothing when the marker file matches this script's pins.
# Prints progress on stderr and, last, the venv's python on stdout.
#
# Usage: tools/sglang-parser.sh [--check]
#   --check   install nothing; exit 0 and print the python when installed, 1 otherwise.
#
# Environment:
#   HYBRIDSERVING_CACHE   cache root (default ~/.cache/hybridserving)
#   PYTHON                interpreter for the venv (default python3.11; the wheel is cp311)
set -euo pipefail

SGLANG_VERSION=0.5.23
SGLANG_WHEEL=sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
SGLANG_SHA256=00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937

# What `import sglang.srt.server_args` imports, installed as-is with --no-deps so the
# set stays exactly this one. Transitive requirements are listed explicitly.
DEPS=(
  msgspec==0.23.0
  numpy==2.4.6
  orjson==3.13.0
  psutil==7.2.2
  pybase64==1.5.1
  packaging==26.4
  pillow==13.0.0
  pyzmq==27.3.0
  pydantic-core==2.50.5
  typing-extensions==4.16.0
  starlette==1.10.0
  anyio==4.16.0
  idna==3.20
  requests==2.34.2
  urllib3==2.8.0
  certifi==2026.10.19.post1
  charset-normalizer==3.5.3
)

# What `ServerArgs.resolve_once()` / `check_server_args()` import on top of DEPS: transformers
# (the pinned 5.19.0; it installs without torch) with its requirements, and the pure-Python or
# CPU packages the model-config and quantization modules import at module level.
# tokenizers is sglang's own pin. Same rules: --no-deps, exact pins, transitive ones listed.
RESOLUTION_DEPS=(
  transformers==5.19.0
  huggingface_hub==2.4.0
  tokenizers==0.23.2
  safetensors==0.8.0
  regex==2026.11.19
  PyYAML==6.0.4
  tqdm==4.70.1
  filelock==4.3.1
  fsspec==2026.9.0
  hf-xet==1.8.0
  httpx2==2.16.2
  httpcore2==2.16.2
  h11==0.16.0
  truststore==0.10.5
  typer==0.29.2
  click==8.5.1
  rich==15.0.0
  markdown-it-py==4.3.0
  mdurl==0.1.2
  Pygments==2.21.0
  shellingham==1.5.4
  annotated-doc==0.0.7
  pydantic==2.14.4
  annotated-types==0.8.0
  typing-inspection==0.4.5
  dill==0.4.1
  gguf==0.19.0
  loguru==0.7.3
  sentencepiece==0.2.3
)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
CACHE=$(realpath -m "${HYBRIDSERVING_CACHE:-$HOME/.cache/hybridserving}")
DIR=$CACHE/sglang-$SGLANG_VERSION
VENV=$DIR/venv
MARKER=$DIR/.installed
FINGERPRINT="$SGLANG_WHEEL $SGLANG_SHA256 ${DEPS[*]} ${RESOLUTION_DEPS[*]}"

log() { printf '[sglang-parser %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

installed() { [[ -f $MARKER && $(cat "$MARKER") == "$FINGERPRINT" && -x $VENV/bin/python ]]; }

if [[ ${1:-} == --check ]]; then
  if installed; then echo "$VENV/bin/python"; exit 0; fi
  echo "sglang $SGLANG_VERSION parser not installed under $DIR; run tools/sglang-parser.sh" >&2
  exit 1
fi
[[ $# -eq 0 ]] || die "usage: $0 [--check]"

if installed; then
  log "sglang $SGLANG_VERSION parser already installed in $VENV"
  echo "$VENV/bin/python"
  exit 0
fi

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || die "$PY not found; set PYTHON to a Python 3.11 interpreter"
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$PY is not Python 3.11 (the sglang $SGLANG_VERSION wheel is cp311)"

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
if installed; then echo "$VENV/bin/python"; exit 0; fi

start=$(date +%s)
rm -rf "$VENV" "$MARKER"
log "creating venv $VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)

log "downloading $SGLANG_WHEEL (~39 MB) and checking its sha256"
mkdir -p "$DIR/wheels"
if [[ ! -f $DIR/wheels/$SGLANG_WHEEL ]] \
  || ! echo "$SGLANG_SHA256  $DIR/wheels/$SGLANG_WHEEL" | sha256sum --check --status; then
  rm -f "$DIR/wheels/$SGLANG_WHEEL"
  "${PIP[@]}" download --quiet --no-deps --only-binary=:all: \
    --dest "$DIR/wheels" "sglang==$SGLANG_VERSION"
fi
echo "$SGLANG_SHA256  $DIR/wheels/$SGLANG_WHEEL" | sha256sum --check --status \
  || die "sha256 mismatch for $SGLANG_WHEEL"

log "installing sglang $SGLANG_VERSION without its dependencies"
"${PIP[@]}" install --quiet --no-deps "$DIR/wheels/$SGLANG_WHEEL"

log "installing ${#DEPS[@]} pinned packages: ${DEPS[*]}"
"${PIP[@]}" install --quiet --no-deps --only-binary=:all: "${DEPS[@]}"

log "installing ${#RESOLUTION_DEPS[@]} pinned packages for resolution: ${RESOLUTION_DEPS[*]}"
"${PIP[@]}" install --quiet --no-deps --only-binary=:all: "${RESOLUTION_DEPS[@]}"

log "self-check: parsing sample command lines with the installed parser"
PYTHONPATH=$REPO/tests PYTHONNOUSERSITE=1 "$VENV/bin/python" \
  -m support.sglang_parser --self-check >&2 \
  || die "self-check failed; the install in $VENV is not usable"

log "self-check: resolving a sample command line with the installed resolution pipeline"
PYTHONPATH=$REPO/tests PYTHONNOUSERSITE=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" \
  -m support.sglang_resolver --self-check >&2 \
  || die "resolution self-check failed; the install in $VENV is not usable"

echo "$FINGERPRINT" >"$MARKER"
log "done in $(( $(date +%s) - start ))s"
echo "$VENV/bin/python"
