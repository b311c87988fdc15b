#!/usr/bin/env bash
# Run a command with Docker made available to it when that is possible, and say why when not.
#
# Where an engine answers, or this may provision one (CI, or JETSERVE_DOCKER_PROVISION=1; never
# with JETSERVE_DOCKER_PROVISION=0), build_local_images.sh starts it and builds the images, then
# the command runs with JETSERVE_DOCKER_READY=1. Otherwise it runs with
# JETSERVE_DOCKER_SKIP_REASON set, which the Docker tests print when they skip. A dockerd that
# this script started is stopped afterwards, by its recorded pid. The command's exit status is
# this script's.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
started_engine=0

provision=${JETSERVE_DOCKER_PROVISION:-}
if [ -z "$provision" ] && [ -n "${CI:-}" ]; then provision=1; fi

if docker info >/dev/null 2>&1 || [ "$provision" = 1 ]; then
    docker info >/dev/null 2>&1 || started_engine=1
    start=$SECONDS
    # Bounded: a hung apt-get or debootstrap must not hold CI; the tests then skip, saying why.
    if log=$(timeout 1200 bash "$HERE/build_local_images.sh" all 2>&1); then
        echo "$log" | tail -n 1
        echo "docker: engine and images ready in $((SECONDS - start))s"
        export JETSERVE_DOCKER_READY=1
    else
        echo "$log" | tail -n 5
        export JETSERVE_DOCKER_SKIP_REASON="no Docker engine could be started or images built (see above)"
    fi
else
    export JETSERVE_DOCKER_SKIP_REASON="no Docker engine ('docker info' failed); \`make images-local\` starts one (or set JETSERVE_DOCKER_PROVISION=1)"
fi
[ -n "${JETSERVE_DOCKER_SKIP_REASON:-}" ] && echo "docker: $JETSERVE_DOCKER_SKIP_REASON"

"$@"
status=$?
if [ "$started_engine" = 1 ]; then
    bash "$HERE/build_local_images.sh" stop-engine
fi
exit "$status"
