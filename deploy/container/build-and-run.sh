#!/usr/bin/env bash
# Builds the kilnd image of deploy/Containerfile with podman where no container registry can be
# reached, only Debian's mirrors; starts it; checks that it answers its health check and
# compiles from this machine's Python client (compile_check.py); stops and removes it. Root
# only. Each phase is timed, and the times are printed at the end. Exits non-zero, saying what
# failed, on any failure.
#
#   deploy/container/build-and-run.sh
#
# The base image is made here from Debian's packages: `debootstrap --variant=minbase bookworm`
# into the work folder, imported with `podman import` as localhost/kiln-debian:12 and passed to
# the Containerfile as BASE. The tree is kept and made again when a week old (Debian's fixes).
# Podman keeps its images in the work folder as well, configured by files of its own there, so
# nothing here touches the machine's podman setup; the layers cached there make the next build
# skip the package downloads. The image stays, as localhost/kilnd; how to run it by hand:
# docs/operations.md, "The container image".
#
# Environment: KILN_CONTAINER_DIR (the work folder, default ~/.cache/kiln/container; delete it
# to start over), KILN_CONTAINER_REFRESH=1 (debootstrap now), KILN_DEBIAN_MIRROR (default
# http://deb.debian.org/debian; its -security sibling serves the fixes), KILN_VENV (the
# client's virtualenv, default .venv, made by deploy/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "container: $*" >&2; exit 1; }
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) die "takes no arguments (see --help)" ;;
esac
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, podman's rootful storage and networks)"
WORK="${KILN_CONTAINER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/container}"
MIRROR="${KILN_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
VENV="${KILN_VENV:-$PWD/.venv}"
BASE_IMAGE=localhost/kiln-debian:12
IMAGE=localhost/kilnd
CONTAINER="kiln-check-$$"
[ -x "$VENV/bin/python" ] || die "no Python client: $VENV/bin/python is missing (run deploy/setup.sh)"
mkdir -p "$WORK/run" "$WORK/storage"
# One run at a time per work folder: two would debootstrap into the same tree.
exec 9>"$WORK/lock"
flock -w 3600 9 || die "another run holds $WORK/lock"

# --- phases, their times, and the way out ------------------------------------------------------
phases=()
phase_name=""
started=$SECONDS
podman=(podman --runtime runc)
failed=1
phase_start() { phase_name="$1"; phase_t0=$EPOCHREALTIME; echo "container: $1"; }
phase_end() {
  phases+=("$(awk -v n="$phase_name" -v a="$phase_t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%-40s %7.1f s", n, b - a }')")
  phase_name=""
}
cleanup() {
  [ -z "$phase_name" ] || phase_end
  if [ -n "${CONTAINERS_CONF:-}" ] && "${podman[@]}" container exists "$CONTAINER" 2>/dev/null; then
    if [ -n "$failed" ]; then
      echo "container: kilnd's log:" >&2
      "${podman[@]}" logs --tail 40 "$CONTAINER" >&2 || true
    fi
    "${podman[@]}" rm -f -v -t 5 "$CONTAINER" >/dev/null 2>&1 || true
  fi
  echo "container: times"
  local p
  for p in "${phases[@]}"; do echo "  $p"; done
  printf '  %-40s %7d s\n' "total" $((SECONDS - started))
  if [ -n "$failed" ]; then echo "container: FAILED (the last phase above)" >&2
  else echo "container: ok: $IMAGE, from $BASE_IMAGE made by debootstrap, answers health and compiles"; fi
}
trap cleanup EXIT

# --- packages --------------------------------------------------------------------------------
phase_start "packages (apt)"
missing=()
for p in debootstrap podman runc; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "container: installing ${missing[*]}"
  timeout 600 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
phase_end

# --- podman's configuration, all in the work folder --------------------------------------------
# default_ulimits = []: containers inherit this machine's limits. Podman's default open-files
# limit (1048576) is above the hard limit where the machine sets one lower (20000 in these VMs),
# and then both runtimes refuse to start the container.
# cgroup_manager = "cgroupfs": systemd is not PID 1 here, so there is none to ask for cgroups.
# runtime = "runc": crun refuses a hybrid cgroup v1/v2 hierarchy like these machines' ("cgroups
# in hybrid mode not supported"). Debian's podman depends on crun or runc; apt takes crun unless
# runc is named too, as above.
cat >"$WORK/containers.conf" <<EOF
[containers]
default_ulimits = []
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
tmp_dir = "$WORK/run/libpod"
EOF
cat >"$WORK/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run/storage"
EOF
export CONTAINERS_CONF="$WORK/containers.conf" CONTAINERS_STORAGE_CONF="$WORK/storage.conf"

# --- the base image, from Debian's packages ----------------------------------------------------
phase_start "base: debootstrap"
if [ -n "${KILN_CONTAINER_REFRESH:-}" ] || [ ! -f "$WORK/rootfs.stamp" ] ||
   [ -n "$(find "$WORK/rootfs.stamp" -mtime +6)" ]; then
  rm -rf "$WORK/rootfs" "$WORK/rootfs.tmp" "$WORK/rootfs.stamp"
  "${podman[@]}" rmi -f "$BASE_IMAGE" >/dev/null 2>&1 || true
  timeout 900 debootstrap --variant=minbase bookworm "$WORK/rootfs.tmp" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    die "debootstrap failed; its log: $WORK/debootstrap.log"
  # The release, its updates and its security fixes, as the debian:12 image lists them.
  rm -f "$WORK/rootfs.tmp/etc/apt/sources.list"
  cat >"$WORK/rootfs.tmp/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $MIRROR-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$WORK"/rootfs.tmp/var/cache/apt/archives/*.deb "$WORK"/rootfs.tmp/var/lib/apt/lists/*
  mv "$WORK/rootfs.tmp" "$WORK/rootfs"
  touch "$WORK/rootfs.stamp"
else
  echo "container: the tree debootstrap made $(( ($(date +%s) - $(stat -c %Y "$WORK/rootfs.stamp")) / 3600 )) h ago"
fi
phase_end

phase_start "base: podman import"
if ! "${podman[@]}" image exists "$BASE_IMAGE"; then
  tar -C "$WORK/rootfs" -c . | timeout 300 "${podman[@]}" import -q --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
fi
phase_end

# --- the image -----------------------------------------------------------------------------
# --format docker keeps the HEALTHCHECK (podman's default, the OCI format, has none). Chroot
# isolation runs RUN steps without a runtime, cgroups or namespaces of their own. The log,
# build.log in the work folder, gets the time on each line.
stamp() { while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done; }
image_build() {
  timeout 3600 "${podman[@]}" build --isolation chroot --format docker --build-arg "BASE=$BASE_IMAGE" \
    -f deploy/Containerfile "$@" . 2>&1 | stamp >>"$WORK/build.log" ||
    { tail -n 40 "$WORK/build.log" >&2; die "podman build failed; its log: $WORK/build.log"; }
}
: >"$WORK/build.log"
# Stage `build` is tagged too, so that the prune below keeps it: its layers (the packages, and
# the build folder) are the next run's cache.
phase_start "image: stage build (packages, cmake)"
image_build --target build -t "$IMAGE-build"
phase_end
phase_start "image: final stage (packages, binaries)"
image_build -t "$IMAGE"
phase_end
# What these tags held before is dangling now: dropped, or each run would leave its own.
"${podman[@]}" image prune -f >/dev/null

# --- run it --------------------------------------------------------------------------------
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
grpc_port=$(free_port)
metrics_port=$(free_port)
# Podman asks systemd for a timer to run the image's HEALTHCHECK and logs an error where there
# is none; the container runs all the same, and the loop below runs the check. Those lines go.
no_systemd_noise() { "$@" 2> >(grep -v "unable to get systemd connection" >&2); }

phase_start "run: start, health check"
no_systemd_noise "${podman[@]}" run -d --name "$CONTAINER" \
  -p "127.0.0.1:$grpc_port:50051" -p "127.0.0.1:$metrics_port:9464" "$IMAGE" >/dev/null
healthy=""
for _ in $(seq 120); do
  [ "$("${podman[@]}" inspect -f '{{.State.Running}}' "$CONTAINER")" = true ] ||
    die "kilnd exited with status $("${podman[@]}" inspect -f '{{.State.ExitCode}}' "$CONTAINER")"
  if "${podman[@]}" healthcheck run "$CONTAINER" >/dev/null 2>&1; then healthy=1; break; fi
  sleep 0.5
done
[ -n "$healthy" ] || die "the image's health check did not pass within 60 s"
phase_end

phase_start "run: compiles from the Python client"
timeout 600 "$VENV/bin/python" deploy/container/compile_check.py "127.0.0.1:$grpc_port" \
  --metrics "127.0.0.1:$metrics_port" || die "the compile check failed"
phase_end

phase_start "run: stop (SIGTERM), remove"
no_systemd_noise "${podman[@]}" stop -t 30 "$CONTAINER" >/dev/null
code=$("${podman[@]}" inspect -f '{{.State.ExitCode}}' "$CONTAINER")
[ "$code" = 0 ] || die "kilnd exited with status $code after SIGTERM"
no_systemd_noise "${podman[@]}" rm -v "$CONTAINER" >/dev/null
phase_end
failed=""
