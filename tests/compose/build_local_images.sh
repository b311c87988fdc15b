#!/usr/bin/env bash
# Build local stand-ins for the images docker-compose.yml names, then the JetServe image (not
# vLLM's or Grafana's: no package ships them; Prometheus only with `observability`).
#
# Machines that cannot pull from a registry (ours) still run the real compose file: the base
# image is a debootstrapped Debian bookworm with python3.11 imported as `python:3.11-slim`, and
# NATS is a FROM-scratch image holding the nats-server binary of the venv (plus a static busybox
# for `wget`, as the official alpine variant has) tagged as the official names. A real image of
# the same name is never overwritten. Everything is cached: reruns take seconds.
#
# usage: build_local_images.sh [all|observability|engine|stop-engine|status]
#   all          (default) make sure an engine runs, then build the images that are missing
#   observability  `all` plus the Prometheus stand-in (opt-in: `all` does not build it)
#   engine       make sure a Docker engine answers: install docker.io and start dockerd if needed
#   stop-engine  stop the dockerd this script started (by its recorded pid), nothing else
#   base | nats | prometheus  build only that stand-in
#   status       exit 0 when an engine answers and every image exists
#
# env: BASE_IMAGE (python:3.11-slim), NATS_IMAGE (nats:2-alpine), JETSERVE_IMAGE
#      (jetserve:latest), PROMETHEUS_IMAGE (prom/prometheus:v2.42.0), JETSERVE_IMAGE_CACHE
#      (~/.cache/jetserve/images), JETSERVE_DOCKERD_DIR (/tmp/jetserve-dockerd: pid + log of a
#      dockerd started here), DEBIAN_MIRROR.
# The JetServe image is rebuilt on every run (its layers are cached, so only changed sources
# cost time); the base and NATS stand-ins only when missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
NATS_IMAGE=${NATS_IMAGE:-nats:2-alpine}
JETSERVE_IMAGE=${JETSERVE_IMAGE:-jetserve:latest}
PROMETHEUS_IMAGE=${PROMETHEUS_IMAGE:-prom/prometheus:v2.42.0}
CACHE=${JETSERVE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jetserve/images}
DOCKERD_DIR=${JETSERVE_DOCKERD_DIR:-/tmp/jetserve-dockerd}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
STANDIN_LABEL=org.jetserve.local-standin
# The legacy builder: this machine has no buildx plugin, and it honours --network host.
export DOCKER_BUILDKIT=0

log() { printf '[images-local %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

engine_answers() { docker info >/dev/null 2>&1; }

apt_install() {
    command -v apt-get >/dev/null || die "need $* but apt-get is not available"
    [ "$(id -u)" = 0 ] || die "need $* (apt-get install) but not running as root"
    log "apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends "$@" >/dev/null
    }
}

compose_available() {
    docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null
}

ensure_engine() {
    if ! engine_answers && ! command -v dockerd >/dev/null; then
        apt_install docker.io
    fi
    compose_available || apt_install docker-compose
    if engine_answers; then
        return 0
    fi
    if pgrep -x dockerd >/dev/null; then
        die "a dockerd is running but 'docker info' fails (permissions? DOCKER_HOST?); not touching it"
    fi
    [ "$(id -u)" = 0 ] || die "no Docker engine answers and starting dockerd needs root"
    mkdir -p "$DOCKERD_DIR"
    log "starting dockerd (log: $DOCKERD_DIR/dockerd.log)"
    # setsid: the engine outlives this script; its pid file says exactly what to stop later.
    setsid dockerd --pidfile "$DOCKERD_DIR/dockerd.pid" >"$DOCKERD_DIR/dockerd.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$DOCKERD_DIR/started-by-jetserve.pid"
    for _ in $(seq 1 150); do
        engine_answers && { log "dockerd $pid is up"; return 0; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    tail -n 20 "$DOCKERD_DIR/dockerd.log" >&2 || true
    die "dockerd did not come up (log: $DOCKERD_DIR/dockerd.log)"
}

stop_engine() {
    local file="$DOCKERD_DIR/started-by-jetserve.pid"
    [ -f "$file" ] || { log "no dockerd started by this script"; return 0; }
    local pid
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
        log "stopping dockerd $pid"
        kill -TERM "$pid"
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
    rm -f "$file"
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

is_standin() {
    [ "$(docker image inspect -f "{{index .Config.Labels \"$STANDIN_LABEL\"}}" "$1" 2>/dev/null)" = 1 ]
}

# Debian bookworm (python3.11 + venv + pip) as a tarball, built once and kept in the cache.
base_tarball() {
    local tarball="$CACHE/bookworm-python3.11.tar"
    if [ -s "$tarball" ]; then
        echo "$tarball"
        return 0
    fi
    command -v debootstrap >/dev/null || apt_install debootstrap
    mkdir -p "$CACHE"
    local rootfs
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    log "debootstrap bookworm into $rootfs (once; cached as $tarball)"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates,passwd \
        bookworm "$rootfs" "$DEBIAN_MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
        { tail -n 20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
    # Like the official image: `python` on PATH, no package lists or caches.
    ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/usr/share/doc "$rootfs"/usr/share/man
    tar -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
    echo "$tarball"
}

build_base() {
    if image_exists "$BASE_IMAGE" && ! is_standin "$BASE_IMAGE"; then
        log "$BASE_IMAGE is a real image; using it"
        return 0
    fi
    image_exists "$BASE_IMAGE" && return 0
    local tarball
    tarball=$(base_tarball)
    log "docker import $tarball as $BASE_IMAGE"
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        "$tarball" "$BASE_IMAGE" >/dev/null
    # This machine may reach PyPI through a TLS proxy whose CA is only in the host's bundle;
    # pip (certifi) would not trust it. Stand-in only: the Dockerfile itself stays as it is.
    local ctx
    ctx=$(mktemp -d)
    cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
    cat >"$ctx/Dockerfile" <<EOF
FROM $BASE_IMAGE
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
LABEL $STANDIN_LABEL=1
EOF
    docker build -q -t "$BASE_IMAGE" "$ctx" >/dev/null
    rm -rf "$ctx"
}

build_nats() {
    if image_exists "$NATS_IMAGE"; then
        is_standin "$NATS_IMAGE" || log "$NATS_IMAGE is a real image; using it"
        image_exists nats:latest || docker tag "$NATS_IMAGE" nats:latest
        return 0
    fi
    local binary="$ROOT/.venv/bin/nats-server"
    [ -x "$binary" ] || binary=$(command -v nats-server) || die "no nats-server binary (make install)"
    local ctx
    ctx=$(mktemp -d)
    cp "$binary" "$ctx/nats-server"
    (cd "$ctx" && apt-get download busybox-static >/dev/null 2>&1) ||
        { apt-get update -q >/dev/null && (cd "$ctx" && apt-get download busybox-static >/dev/null); }
    dpkg-deb -x "$ctx"/busybox-static_*.deb "$ctx/bb"
    cp "$ctx/bb/bin/busybox" "$ctx/busybox"
    printf 'port: 4222\nmonitor_port: 8222\n' >"$ctx/nats-server.conf"
    cat >"$ctx/Dockerfile" <<EOF
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY nats-server /usr/local/bin/nats-server
COPY nats-server.conf /etc/nats/nats-server.conf
LABEL $STANDIN_LABEL=1
EXPOSE 4222 6222 8222
ENTRYPOINT ["/usr/local/bin/nats-server"]
CMD ["--config", "/etc/nats/nats-server.conf"]
EOF
    log "docker build $NATS_IMAGE (FROM scratch + $("$binary" --version))"
    docker build -q -t "$NATS_IMAGE" "$ctx" >/dev/null
    image_exists nats:latest || docker tag "$NATS_IMAGE" nats:latest
    rm -rf "$ctx"
}

# Prometheus 2.42 from Debian bookworm's package on the base stand-in, laid out like the official
# image (the binary as entrypoint, data in /prometheus, user nobody). Grafana has no such package.
build_prometheus() {
    if image_exists "$PROMETHEUS_IMAGE"; then
        is_standin "$PROMETHEUS_IMAGE" || log "$PROMETHEUS_IMAGE is a real image; using it"
        return 0
    fi
    build_base
    local ctx start=$SECONDS
    ctx=$(mktemp -d)
    cat >"$ctx/Dockerfile" <<EOF
FROM $BASE_IMAGE
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \\
        --no-install-recommends prometheus && rm -rf /var/lib/apt/lists/* && \\
    mkdir -p /prometheus && chown nobody:nogroup /prometheus
LABEL $STANDIN_LABEL=1
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
EOF
    log "docker build $PROMETHEUS_IMAGE (FROM $BASE_IMAGE + Debian's prometheus package)"
    docker build --network host -t "$PROMETHEUS_IMAGE" "$ctx" >"$CACHE/prometheus-build.log" 2>&1 ||
        { tail -n 30 "$CACHE/prometheus-build.log" >&2; die "docker build failed"; }
    rm -rf "$ctx"
    log "built $PROMETHEUS_IMAGE in $((SECONDS - start))s"
}

build_jetserve() {
    log "docker build $JETSERVE_IMAGE (BASE_IMAGE=$BASE_IMAGE)"
    local start=$SECONDS
    docker build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$JETSERVE_IMAGE" "$ROOT" \
        >"$CACHE/jetserve-build.log" 2>&1 ||
        { tail -n 30 "$CACHE/jetserve-build.log" >&2; die "docker build failed"; }
    log "built $JETSERVE_IMAGE in $((SECONDS - start))s"
}

main() {
    local cmd=${1:-all}
    case $cmd in
    engine) ensure_engine ;;
    stop-engine) stop_engine ;;
    base) ensure_engine && build_base ;;
    nats) ensure_engine && build_nats ;;
    prometheus) mkdir -p "$CACHE" && ensure_engine && build_prometheus ;;
    status)
        engine_answers && image_exists "$BASE_IMAGE" && image_exists "$NATS_IMAGE" &&
            image_exists "$JETSERVE_IMAGE"
        ;;
    all | observability)
        local start=$SECONDS
        mkdir -p "$CACHE"
        ensure_engine
        build_base
        build_nats
        build_jetserve
        local built="$BASE_IMAGE $NATS_IMAGE $JETSERVE_IMAGE"
        if [ "$cmd" = observability ]; then
            build_prometheus
            built+=" $PROMETHEUS_IMAGE"
        fi
        log "images ready in $((SECONDS - start))s: $built"
        ;;
    *) die "unknown command '$cmd' (all, observability, engine, base, nats, prometheus," \
        "stop-engine, status)" ;;
    esac
}

main "$@"
