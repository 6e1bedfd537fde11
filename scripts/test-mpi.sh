#!/usr/bin/env bash
# The MPI collectives between real processes: 2 and 3 ranks on this machine's CPU (loopback)
# under mpirun. Installs Open MPI from Debian when missing (CI runs as root on a fresh machine);
# bindgen also needs libclang. Each run is bounded by a timeout so that a stuck rank fails the
# job instead of hanging it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq libopenmpi-dev openmpi-bin libclang-dev >/dev/null
fi
binary=$(cargo test --locked -p qwen-gdn-collective --features mpi --test mpi_collective \
    --no-run --message-format=json \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "mpi_collective":
        print(m["executable"])')
for ranks in 2 3; do
    echo "mpi_collective on $ranks ranks"
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$binary" --test-threads=1
done
