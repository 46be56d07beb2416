#!/usr/bin/env bash
# An emulated arm64 device: a Debian bookworm arm64 root filesystem run through qemu-user
# (binfmt_misc), with the device half of hmt installed the way a user installs it on a
# Raspberry Pi or a Jetson: a virtual environment and `pip install hmt` (its required
# dependencies are the device half's: no torch, no onnx, no compiler) from aarch64 wheels.
#
#   scripts/make_arm64_device.sh            build (or refresh) the device; prints its root
#   scripts/make_arm64_device.sh --wheels   what is installed in it, and the wheels' sizes
#   scripts/make_arm64_device.sh --check    exit 0 when the device is ready, 1 otherwise
#   scripts/make_arm64_device.sh --run CMD  run CMD inside the device (/proc and /dev mounted
#                                           for the command, unmounted after)
#
# Root directory: $HMT_ARM64_ROOT (default ~/.cache/hmt/arm64-root). The root filesystem
# (debootstrap, ~10-20 min under emulation) is built once and kept; the hmt install in
# it is refreshed when the checkout's wheel changes (seconds). Needs root (debootstrap,
# chroot, binfmt_misc) and network access to Debian's mirror and the package registry on
# the host; the device itself installs with --no-index from the wheels fetched here.
set -euo pipefail

ROOT="${HMT_ARM64_ROOT:-$HOME/.cache/hmt/arm64-root}"
MIRROR="${HMT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# bookworm's python3 is 3.11; the wheels are fetched for it.
PY_VERSION=311
PLATFORMS=(--platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64)
VENV=/opt/hmt
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { echo "make_arm64_device: $*" >&2; }
die() { log "$*"; exit 1; }

ready() {
  [[ -f "$ROOT/.hmt-rootfs-ready" && -x "$ROOT$VENV/bin/hmt" ]] && binfmt_ok
}

binfmt_ok() {
  [[ -f /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] && grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64
}

ensure_binfmt() {
  if ! command -v qemu-aarch64-static >/dev/null || ! command -v update-binfmts >/dev/null \
      || ! command -v debootstrap >/dev/null; then
    log "installing qemu-user-static binfmt-support debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-user-static binfmt-support debootstrap >&2 \
      || die "apt-get install qemu-user-static binfmt-support debootstrap failed"
  fi
  if [[ ! -f /proc/sys/fs/binfmt_misc/status ]]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || die "cannot mount binfmt_misc (not root?)"
  fi
  binfmt_ok || update-binfmts --enable qemu-aarch64 >&2 || true
  binfmt_ok || die "qemu-aarch64 is not registered with binfmt_misc"
}

# Mount /proc and /dev for the duration of one chrooted command; always unmounted after.
# Not /sys: the host's sysfs describes its x86 CPUs, and ONNX Runtime's CPU detection
# (cpuinfo) crashes under qemu on that mix (it reads /sys/devices/system/cpu, then an
# x86 /proc/cpuinfo); without it, ORT notes that it cannot detect the CPU's features and
# runs. A real board's /sys describes its own CPUs.
MOUNTED=()
mount_all() {
  for fs in proc dev; do
    if ! mountpoint -q "$ROOT/$fs"; then
      case $fs in
        proc) mount -t proc proc "$ROOT/proc" ;;
        dev) mount --bind /dev "$ROOT/dev" ;;
      esac
      MOUNTED+=("$ROOT/$fs")
    fi
  done
}
umount_all() {
  local m
  for m in "${MOUNTED[@]}"; do umount -l "$m" 2>/dev/null || true; done
  MOUNTED=()
}
trap umount_all EXIT

# HMT_ARM64_CPU (a qemu CPU model: cortex-a72 as on a Raspberry Pi 4, cortex-a57 as on a
# Jetson Nano) picks the instruction set the device emulates; default qemu's "max".
DEVICE_ENV=(/usr/bin/env -i HOME=/root PATH="$VENV/bin:/usr/sbin:/usr/bin:/sbin:/bin" LANG=C.UTF-8
            ${HMT_ARM64_CPU:+QEMU_CPU=$HMT_ARM64_CPU})
in_device() {
  mount_all
  chroot "$ROOT" "${DEVICE_ENV[@]}" "$@"
}

build_rootfs() {
  [[ -f "$ROOT/.hmt-rootfs-ready" ]] && return 0
  log "debootstrap $SUITE arm64 into $ROOT (slow under emulation)"
  mkdir -p "$ROOT"
  # minbase + python3 and venv: no compiler, no build tools.
  debootstrap --arch arm64 --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$ROOT" "$MIRROR" >&2 || die "debootstrap failed (see $ROOT/debootstrap/debootstrap.log)"
  rm -rf "$ROOT/var/cache/apt/archives/"*.deb
  date -u +%Y-%m-%dT%H:%M:%SZ > "$ROOT/.hmt-rootfs-ready"
}

# The device half's wheels for aarch64, fetched on the host (binary only: nothing is built),
# and hmt's own wheel, built from a clean copy of this checkout's files (tracked, and
# untracked but not ignored: no stale build/ folder gets into it).
fetch_wheels() {
  local house="$ROOT/wheels" src
  mkdir -p "$house"
  rm -f "$house"/hmt-*.whl
  src=$(mktemp -d)
  (cd "$REPO" && git ls-files -co --exclude-standard | while IFS= read -r f; do [[ -f "$f" ]] && echo "$f"; done \
    | tar -cf - -T - | tar -xf - -C "$src")
  python3 -m pip wheel --no-deps --no-build-isolation -q -w "$house" "$src" >&2 || die "building hmt's wheel failed"
  rm -rf "$src"
  local reqs
  reqs=$(python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$REPO/pyproject.toml")
  mapfile -t reqs_arr <<<"$reqs"
  local download=(python3 -m pip download -q --only-binary=:all: "${PLATFORMS[@]}" --python-version "$PY_VERSION"
                  --implementation cp -d "$house")
  # Offline first (the wheels of an earlier build), then the registry.
  "${download[@]}" --no-index --find-links "$house" "${reqs_arr[@]}" >/dev/null 2>&1 \
    || "${download[@]}" "${reqs_arr[@]}" >&2 || die "pip download of the aarch64 wheels failed"
}

# A virtual environment in the device and `pip install hmt` from the wheels only (--no-index:
# nothing reaches a registry from the device, and nothing is compiled there).
install_hmt() {
  local wheel
  wheel=$(cd "$ROOT/wheels" && ls hmt-*.whl | head -1)
  [[ -x "$ROOT$VENV/bin/python" ]] || in_device python3 -m venv "$VENV"
  in_device "$VENV/bin/pip" install -q --no-index --only-binary=:all: --find-links /wheels "/wheels/$wheel" >&2 \
    || die "pip install hmt inside the device failed"
  # The same version number from another checkout is "already satisfied": replace hmt itself.
  in_device "$VENV/bin/pip" install -q --no-index --force-reinstall --no-deps "/wheels/$wheel" >&2 \
    || die "pip install hmt inside the device failed"
  umount_all
}

# The installed distributions and the size of the wheel each came from.
list_wheels() {
  in_device "$VENV/bin/pip" list --format=freeze 2>/dev/null
  (cd "$ROOT/wheels" && stat -c '%s %n' *.whl)
}

case "${1:-}" in
  --check) ready; exit $? ;;
  --wheels) ready || die "the device is not built"; list_wheels ;;
  --run)
    shift
    ready || die "the device is not built: run scripts/make_arm64_device.sh"
    # In the background so that a SIGTERM to this script (a test stopping `hmt serve`)
    # reaches the command, which then drains and exits before /proc is unmounted.
    # chroot and env exec the command: $child is its process.
    mount_all
    chroot "$ROOT" "${DEVICE_ENV[@]}" "$@" &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null' TERM INT
    rc=0
    wait "$child" || rc=$?
    while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
    exit "$rc"
    ;;
  "")
    ensure_binfmt
    build_rootfs
    fetch_wheels
    install_hmt
    echo "$ROOT"
    ;;
  *) die "usage: $0 [--check | --run CMD...]" ;;
esac
