#!/usr/bin/env bash
# Installs what qlinear needs to build and test on Debian 12, and nothing that is already there.
#
# Usage: scripts/install-deps.sh [--cutlass | --no-cutlass]
#
# Runs as root, or through sudo otherwise. Each package is checked with dpkg first; apt-get
# update and install run only when something is missing, so a second run is quick and quiet.
#   --cutlass     pip-install the PyPI package nvidia-cutlass (the CUTLASS headers that
#                 cuda.cutlass_sm90 is built from) if it is not installed yet. This is the
#                 default when nvcc is present (on the PATH or in /usr/local/cuda).
#   --no-cutlass  do not (the CUDA build then leaves cuda.cutlass_sm90 out and says so).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev libdnnl-dev nlohmann-json3-dev
  prometheus-cpp-dev
  # The CLI test makes its TLS certificates with the openssl command.
  openssl
  # The deployment files' check (docker/lint.py, a test) reads YAML.
  python3-yaml
  # Debian's oneDNN CMake package requires OpenCL headers and loader (a recommends, which
  # --no-install-recommends would otherwise skip).
  ocl-icd-opencl-dev opencl-headers
)

with_cutlass=0
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  with_cutlass=1
fi
for arg in "$@"; do
  case "$arg" in
    --cutlass) with_cutlass=1 ;;
    --no-cutlass) with_cutlass=0 ;;
    -h | --help)
      sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install-deps: unknown argument '$arg' (see --help)" >&2
      exit 2
      ;;
  esac
done

export DEBIAN_FRONTEND=noninteractive

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo env DEBIAN_FRONTEND=noninteractive "$@"
  else
    # (return, not exit: under quiet, which prints this, the script then stops on its failure)
    echo "install-deps: need root (or sudo) to run: $*" >&2
    return 1
  fi
}

is_installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

# Runs a command quietly; prints everything it said only if it fails.
quiet() {
  local out rc=0
  out="$(mktemp)"
  "$@" >"$out" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    cat "$out" >&2
    echo "install-deps: failed ($rc): $*" >&2
  fi
  rm -f "$out"
  return "$rc"
}

apt_update() { quiet as_root apt-get update -q; }
apt_install() { quiet as_root apt-get install -y -q --no-install-recommends "$@"; }

missing=()
for p in "${PACKAGES[@]}"; do
  is_installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} Debian packages present"
else
  echo "install-deps: apt-get update"
  apt_update
  echo "install-deps: apt-get install ${missing[*]}"
  apt_install "${missing[@]}"
fi

if [ "$with_cutlass" -eq 1 ]; then
  if python3 -m pip show nvidia-cutlass >/dev/null 2>&1; then
    echo "install-deps: nvidia-cutlass present"
  else
    if ! python3 -m pip --version >/dev/null 2>&1; then
      echo "install-deps: apt-get install python3-pip"
      apt_update
      apt_install python3-pip
    fi
    echo "install-deps: pip install nvidia-cutlass"
    # Debian's own Python refuses pip installs outside a venv (PEP 668); this package only adds
    # headers and Python modules of its own, so installing it next to the system's is safe.
    # --no-deps: the build needs its headers only, not its Python generator's dependencies
    # (scipy, cuda-python, ...).
    # A failure here is not fatal: the CUDA build then leaves cuda.cutlass_sm90 out and says so.
    PIP_BREAK_SYSTEM_PACKAGES=1 quiet python3 -m pip install --disable-pip-version-check \
      --no-deps nvidia-cutlass==4.2.0.0 ||
      echo "install-deps: could not install nvidia-cutlass; cuda.cutlass_sm90 will not be built" >&2
  fi
  if include="$(python3 -c 'import importlib.util as u, os
print(os.path.join(u.find_spec("cutlass_library").submodule_search_locations[0], "source", "include"))' 2>/dev/null)"; then
    echo "install-deps: CUTLASS headers in $include"
  fi
fi
