#!/usr/bin/env bash
# Build the local control-plane tools (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok, helm) and promtool (alert rule tests) from Go modules, at the versions
# pinned in tools/versions.env.
#
# Idempotent: only what is missing is built. Everything lives outside the
# repository, under ${HYBRIDSERVING_CACHE:-$HOME/.cache/hybridserving}:
#   tools/<name>-<version>/   built binaries, one folder per version
#                             (kwok-<version>/stages/: kwok's default Stage objects)
#   src/<name>-<version>/     generated wrapper go.mod/go.sum
#   bin/                      symlinks to the current versions
#   build-stats.txt           wall time and memory of each build step
#   build.lock                serialises concurrent runs
#
# Usage: tools/build-tools.sh [--check]
#   --check   build nothing; exit 0 when every binary is present, 1 otherwise.
#
# Environment:
#   HYBRIDSERVING_CACHE          cache root (default ~/.cache/hybridserving)
#   HYBRIDSERVING_BUILD_JOBS     go build -p value (default: number of CPUs)
#   HYBRIDSERVING_BUILD_VERBOSE  1 (default) passes -v to go build
#   GO                           go binary (default: go in PATH, else /usr/local/go/bin/go)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"

# Absolute, so the bin/ links and every path below resolve from any working directory.
CACHE=$(realpath -m "${HYBRIDSERVING_CACHE:-$HOME/.cache/hybridserving}")
TOOLS=$CACHE/tools
SRC=$CACHE/src
BIN=$CACHE/bin
STATS=$CACHE/build-stats.txt

K8S_DIR=$TOOLS/k8s-$K8S_VERSION
ETCD_DIR=$TOOLS/etcd-$ETCD_VERSION
KWOK_DIR=$TOOLS/kwok-$KWOK_VERSION
HELM_DIR=$TOOLS/helm-$HELM_VERSION
PROMTOOL_DIR=$TOOLS/promtool-$PROMETHEUS_VERSION
PROMOP_DIR=$TOOLS/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION
PROMOP_CRDS=(podmonitors servicemonitors prometheusrules)
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
# kwok's default stages (what kwokctl feeds it); kwok itself starts with none.
KWOK_STAGES=(
  kustomize/stage/node/fast/node-initialize.yaml
  kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  kustomize/stage/pod/fast/pod-ready.yaml
  kustomize/stage/pod/fast/pod-complete.yaml
  kustomize/stage/pod/fast/pod-delete.yaml
)

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

all_present() {
  local b
  for b in "${K8S_BINS[@]}"; do [[ -x $K8S_DIR/$b ]] || return 1; done
  [[ -x $ETCD_DIR/etcd && -x $KWOK_DIR/kwok && -x $HELM_DIR/helm && -x $PROMTOOL_DIR/promtool ]] || return 1
  local st
  for st in "${KWOK_STAGES[@]}"; do [[ -s $KWOK_DIR/stages/${st##*/} ]] || return 1; done
  local crd
  for crd in "${PROMOP_CRDS[@]}"; do [[ -s $PROMOP_DIR/monitoring.coreos.com_$crd.yaml ]] || return 1; done
}

link_bin() {
  mkdir -p "$BIN"
  local b
  for b in "${K8S_BINS[@]}"; do ln -sfn "$K8S_DIR/$b" "$BIN/$b"; done
  ln -sfn "$ETCD_DIR/etcd" "$BIN/etcd"
  ln -sfn "$KWOK_DIR/kwok" "$BIN/kwok"
  ln -sfn "$HELM_DIR/helm" "$BIN/helm"
  ln -sfn "$PROMTOOL_DIR/promtool" "$BIN/promtool"
}

if [[ ${1:-} == --check ]]; then
  if all_present; then link_bin; echo "$BIN"; exit 0; fi
  echo "missing tools under $TOOLS; run tools/build-tools.sh" >&2
  exit 1
fi

mkdir -p "$TOOLS" "$SRC" "$BIN"

# One build at a time per cache folder.
exec 9>"$CACHE/build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/build.lock; waiting"
  flock 9
fi
# Holding the lock, no build is under way: a *.tmp.* folder is what an interrupted one left.
rm -rf "$TOOLS"/*.tmp.*

if all_present; then
  link_bin
  log "all tools present ($K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION, promtool $PROMETHEUS_VERSION) in $BIN"
  exit 0
fi

# Go is needed only from here: a machine whose cache already holds every tool builds nothing.
if [[ -z ${GO:-} ]]; then
  if command -v go >/dev/null 2>&1; then GO=$(command -v go)
  elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
  else die "no go toolchain found (set GO=/path/to/go)"; fi
fi
export GOTOOLCHAIN=local CGO_ENABLED=0
JOBS=${HYBRIDSERVING_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
VFLAG=()
[[ ${HYBRIDSERVING_BUILD_VERBOSE:-1} == 1 ]] && VFLAG=(-v)
BUILDFLAGS=(-p "$JOBS" -trimpath "${VFLAG[@]}")

log "go: $("$GO" version) ; jobs: $JOBS ; cache: $CACHE"

# --- measurement helpers ----------------------------------------------------
TIMEV=()
[[ -x /usr/bin/time ]] && TIMEV=(/usr/bin/time -v)
MEMPEAK_FILE=$(mktemp)
HEARTBEAT_PID=
SAMPLER_PID=

# Peak of (MemTotal - MemAvailable) over the whole run, in MiB.
mem_sampler() {
  local peak=0 used
  while kill -0 $$ 2>/dev/null; do
    used=$(awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{print int((t-a)/1024)}' /proc/meminfo)
    (( used > peak )) && { peak=$used; echo "$peak" >"$MEMPEAK_FILE"; }
    sleep 2
  done
}

cleanup() {
  [[ -n $HEARTBEAT_PID ]] && kill "$HEARTBEAT_PID" 2>/dev/null || true
  [[ -n $SAMPLER_PID ]] && kill "$SAMPLER_PID" 2>/dev/null || true
  rm -f "$MEMPEAK_FILE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mem_sampler &
SAMPLER_PID=$!
RUN_START=$(date +%s)
BASE_MEM=$(awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{print int((t-a)/1024)}' /proc/meminfo)
{
  echo "# build $(date -u +%Y-%m-%dT%H:%M:%SZ) host-cpus=$(nproc) jobs=$JOBS $("$GO" version)"
  echo "# system memory in use before the build: ${BASE_MEM} MiB"
} >>"$STATS"

# step NAME CMD...: run CMD with progress heartbeat, record wall time and max RSS.
step() {
  local name=$1; shift
  local t0 rc=0 tv
  t0=$(date +%s)
  tv=$(mktemp)
  log "step $name: $*"
  ( while sleep 60 && kill -0 $$ 2>/dev/null; do log "  ... $name still running ($(( ($(date +%s) - t0) / 60 )) min)"; done ) &
  HEARTBEAT_PID=$!
  if ((${#TIMEV[@]})); then
    "${TIMEV[@]}" -o "$tv" "$@" || rc=$?
  else
    "$@" || rc=$?
  fi
  kill "$HEARTBEAT_PID" 2>/dev/null || true
  wait "$HEARTBEAT_PID" 2>/dev/null || true
  HEARTBEAT_PID=
  local wall=$(( $(date +%s) - t0 ))
  local rss
  rss=$(awk -F': ' '/Maximum resident set size/{print int($2/1024)}' "$tv" 2>/dev/null || true)
  rm -f "$tv"
  echo "$name wall_s=$wall max_rss_single_process_mib=${rss:-?} rc=$rc" >>"$STATS"
  log "step $name done in ${wall}s (largest process ${rss:-?} MiB), rc=$rc"
  return "$rc"
}

# --- kubernetes ----------------------------------------------------------------
# One field of a module's `go mod download -json` record. Go reports a failed download (proxy,
# network, unknown version) only in the record's Error field, so that is what is printed.
mod_field() {  # module@version field [workdir]
  local json
  json=$(cd "${3:-$CACHE}" && "$GO" mod download -json "$1") || true
  MOD_JSON=$json python3 -c '
import json, os, sys
try:
    record = json.loads(os.environ["MOD_JSON"])
except ValueError:
    sys.exit("go mod download printed no module record")
if record.get("Error") or sys.argv[1] not in record:
    sys.exit(record.get("Error") or "no %s in the module record" % sys.argv[1])
print(record[sys.argv[1]])' "$2" || die "cannot download $1 (check GOPROXY and the network)"
}

build_k8s() {
  local b missing=0
  for b in "${K8S_BINS[@]}"; do [[ -x $K8S_DIR/$b ]] || missing=1; done
  ((missing)) || { log "kubernetes $K8S_VERSION present"; return 0; }

  local mod=$SRC/k8s-$K8S_VERSION
  mkdir -p "$mod"
  log "kubernetes $K8S_VERSION: reading upstream go.mod"
  local upstream
  upstream=$(mod_field "k8s.io/kubernetes@$K8S_VERSION" GoMod "$mod")
  [[ -f $upstream ]] || die "cannot download go.mod of k8s.io/kubernetes@$K8S_VERSION"

  local goline godebug
  goline=$(grep -E '^go [0-9]' "$upstream" | head -1)
  godebug=$(grep -E '^godebug ' "$upstream" || true)
  {
    echo "// Generated by tools/build-tools.sh; do not edit."
    echo "module local.invalid/k8s-bins"
    echo
    echo "$goline"
    [[ -n $godebug ]] && echo "$godebug"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "tool ("
    for b in "${K8S_BINS[@]}"; do echo "	k8s.io/kubernetes/cmd/$b"; done
    echo ")"
    echo
    echo "replace ("
    # Every staging module (=> ./staging/src/...) becomes its published v0.x tag.
    sed -n "s|^[[:space:]]*\(k8s.io/[A-Za-z0-9._-]*\) => ./staging/.*|	\1 => \1 $K8S_STAGING_VERSION|p" "$upstream"
    echo ")"
  } >"$mod/go.mod.new"
  if ! cmp -s "$mod/go.mod.new" "$mod/go.mod" 2>/dev/null; then
    mv "$mod/go.mod.new" "$mod/go.mod"
    rm -f "$mod/go.sum"
  else
    rm -f "$mod/go.mod.new"
  fi
  log "kubernetes: $(grep -c '=> k8s.io' "$mod/go.mod") staging modules replaced with $K8S_STAGING_VERSION"

  [[ -s $mod/go.sum ]] || (cd "$mod" && step k8s-mod-tidy "$GO" mod tidy)

  local v=${K8S_VERSION#v} major minor
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  local ldf="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ldf+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done

  local tmp=$K8S_DIR.tmp.$$
  rm -rf "$tmp"; mkdir -p "$tmp"
  local pkgs=()
  for b in "${K8S_BINS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$mod" && step k8s-build "$GO" build "${BUILDFLAGS[@]}" -ldflags "$ldf" -o "$tmp/" "${pkgs[@]}")
  for b in "${K8S_BINS[@]}"; do [[ -x $tmp/$b ]] || die "kubernetes build did not produce $b"; done
  rm -rf "$K8S_DIR"; mv "$tmp" "$K8S_DIR"
  "$K8S_DIR/kube-apiserver" --version
}

# --- etcd ----------------------------------------------------------------------
build_etcd() {
  [[ -x $ETCD_DIR/etcd ]] && { log "etcd $ETCD_VERSION present"; return 0; }
  local mod=$SRC/etcd-$ETCD_VERSION
  mkdir -p "$mod"
  cat >"$mod/go.mod.new" <<EOF
// Generated by tools/build-tools.sh; do not edit.
module local.invalid/etcd-bin

go 1.24.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION

tool go.etcd.io/etcd/server/v3
EOF
  if ! cmp -s "$mod/go.mod.new" "$mod/go.mod" 2>/dev/null; then
    mv "$mod/go.mod.new" "$mod/go.mod"; rm -f "$mod/go.sum"
  else
    rm -f "$mod/go.mod.new"
  fi
  [[ -s $mod/go.sum ]] || (cd "$mod" && step etcd-mod-tidy "$GO" mod tidy)
  local tmp=$ETCD_DIR.tmp.$$
  rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$mod" && step etcd-build "$GO" build "${BUILDFLAGS[@]}" \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
    -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$ETCD_DIR"; mv "$tmp" "$ETCD_DIR"
  "$ETCD_DIR/etcd" --version | sed -n 1p  # sed reads all: no SIGPIPE under pipefail
}

# --- kwok / helm (plain go install, no replace directives upstream) -----------------
kwok_stages() {
  local st missing=0
  for st in "${KWOK_STAGES[@]}"; do [[ -s $KWOK_DIR/stages/${st##*/} ]] || missing=1; done
  ((missing)) || return 0
  log "kwok: copying default stages from the sigs.k8s.io/kwok@$KWOK_VERSION module"
  local dir
  dir=$(mod_field "sigs.k8s.io/kwok@$KWOK_VERSION" Dir)
  mkdir -p "$KWOK_DIR/stages"
  for st in "${KWOK_STAGES[@]}"; do
    [[ -s $dir/$st ]] || die "kwok stage $st not found in $dir"
    cp "$dir/$st" "$KWOK_DIR/stages/"
    chmod 644 "$KWOK_DIR/stages/${st##*/}"
  done
}

build_kwok() {
  [[ -x $KWOK_DIR/kwok ]] && { log "kwok $KWOK_VERSION present"; kwok_stages; return 0; }
  local tmp=$KWOK_DIR.tmp.$$
  rm -rf "$tmp"; mkdir -p "$tmp"
  local kv=${K8S_VERSION#v}
  (cd "$tmp" && GOBIN=$tmp step kwok-build "$GO" install "${BUILDFLAGS[@]}" \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$kv" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
  rm -rf "$KWOK_DIR"; mv "$tmp" "$KWOK_DIR"
  "$KWOK_DIR/kwok" --version 2>/dev/null | head -1 || true
  kwok_stages
}

build_helm() {
  [[ -x $HELM_DIR/helm && -x $PROMTOOL_DIR/promtool ]] && { log "helm $HELM_VERSION present"; return 0; }
  local tmp=$HELM_DIR.tmp.$$
  rm -rf "$tmp"; mkdir -p "$tmp"
  local v=${K8S_VERSION#v} major minor
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  local ldf="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  ldf+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  ldf+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  (cd "$tmp" && GOBIN=$tmp step helm-build "$GO" install "${BUILDFLAGS[@]}" -ldflags "$ldf" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
  rm -rf "$HELM_DIR"; mv "$tmp" "$HELM_DIR"
  "$HELM_DIR/helm" version --short
}

# promtool from the Prometheus module (Prometheus 3.x is tagged v0.3xx.y for Go). Its main package
# registers every service-discovery plugin (AWS, Azure, GCE, ...); `-tags remove_all_sd` leaves
# them out (plugins/*.go), which shortens the build and changes nothing `promtool test rules` does.
build_promtool() {
  [[ -x $PROMTOOL_DIR/promtool ]] && { log "promtool $PROMETHEUS_VERSION present"; return 0; }
  local mod=$SRC/promtool-$PROMETHEUS_VERSION
  mkdir -p "$mod"
  cat >"$mod/go.mod.seed" <<EOF
// Generated by tools/build-tools.sh; do not edit.
module local.invalid/promtool-bin

go 1.24.0

require github.com/prometheus/prometheus $PROMETHEUS_VERSION

tool github.com/prometheus/prometheus/cmd/promtool
EOF
  # go mod tidy rewrites go.mod; go.mod.tidied-from records the seed it was tidied from.
  if ! cmp -s "$mod/go.mod.seed" "$mod/go.mod.tidied-from" 2>/dev/null || [[ ! -s $mod/go.sum ]]; then
    cp "$mod/go.mod.seed" "$mod/go.mod"; rm -f "$mod/go.sum"
    (cd "$mod" && step promtool-mod-tidy "$GO" mod tidy)
    cp "$mod/go.mod.seed" "$mod/go.mod.tidied-from"
  fi
  local v=${PROMETHEUS_VERSION#v0.} tmp=$PROMTOOL_DIR.tmp.$$
  local pv="${v:0:1}.${v:1}"  # 316.0 -> 3.16.0
  rm -rf "$tmp"; mkdir -p "$tmp"
  (cd "$mod" && step promtool-build "$GO" build "${BUILDFLAGS[@]}" -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$pv" \
    -o "$tmp/promtool" github.com/prometheus/prometheus/cmd/promtool)
  rm -rf "$PROMTOOL_DIR"; mv "$tmp" "$PROMTOOL_DIR"
  "$PROMTOOL_DIR/promtool" --version | sed -n 1p
}

# The Prometheus Operator's CRDs: files of a Go module, nothing to build.
fetch_prometheus_operator_crds() {
  local crd missing=0
  for crd in "${PROMOP_CRDS[@]}"; do [[ -s $PROMOP_DIR/monitoring.coreos.com_$crd.yaml ]] || missing=1; done
  ((missing)) || { log "prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION present"; return 0; }
  local dir
  dir=$(mod_field "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" Dir)
  mkdir -p "$PROMOP_DIR"
  for crd in "${PROMOP_CRDS[@]}"; do
    [[ -s $dir/example/prometheus-operator-crd/monitoring.coreos.com_$crd.yaml ]] || die "CRD $crd not found in $dir"
    cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$crd.yaml" "$PROMOP_DIR/"
    chmod 644 "$PROMOP_DIR/monitoring.coreos.com_$crd.yaml"
  done
}

build_etcd
build_kwok
build_k8s
build_helm
build_promtool
fetch_prometheus_operator_crds

link_bin
all_present || die "some tools are still missing"
TOTAL=$(( $(date +%s) - RUN_START ))
PEAK=$(cat "$MEMPEAK_FILE" 2>/dev/null || echo "?")
echo "total wall_s=$TOTAL peak_system_mem_in_use_mib=$PEAK (baseline ${BASE_MEM})" >>"$STATS"
log "done in ${TOTAL}s; peak system memory in use ${PEAK} MiB; binaries in $BIN"
ls -l "$BIN"
