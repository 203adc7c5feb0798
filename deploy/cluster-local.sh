#!/usr/bin/env bash
# Tries cluster mode on one machine: one redis-server and two kilnd replicas sharing it.
#   ./deploy/cluster-local.sh            # redis on 127.0.0.1:6390, kilnd on :50051 and :50052
# Each replica keeps its L1 in ./.kiln-cluster/replica-N; Redis keeps the shared L2 in memory
# (256 MiB, allkeys-lru). Compile on one replica, ask the other: `kiln stats` there shows the
# shared-tier hit. Ctrl-C (or SIGTERM) stops all three. Ports: KILN_REDIS_PORT, KILN_PORTS;
# state folder: KILN_CLUSTER_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/build.sh --target kilnd
KILND="./${KILN_BUILD_DIR:-build}/server/kilnd"
REDIS_PORT="${KILN_REDIS_PORT:-6390}"
read -r -a PORTS <<<"${KILN_PORTS:-50051 50052}"
STATE="${KILN_CLUSTER_DIR:-.kiln-cluster}"
mkdir -p "$STATE"

pids=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop INT TERM EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --maxmemory 256mb --maxmemory-policy allkeys-lru --logfile "$STATE/redis.log" &
pids+=($!)
for _ in $(seq 50); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done

# One signing key for every replica: a replica serves only records from Redis that it verifies.
[ -f "$STATE/signing.pem" ] || "$KILND" keygen "$STATE/signing.pem" >/dev/null
n=0
for port in "${PORTS[@]}"; do
  n=$((n + 1))
  "$KILND" --listen "127.0.0.1:$port" --cache-dir "$STATE/replica-$n" \
    --shared-cache "redis://127.0.0.1:$REDIS_PORT" --signing-key "$STATE/signing.pem" \
    2>>"$STATE/replica-$n.log" &
  pids+=($!)
done
echo "redis on 127.0.0.1:$REDIS_PORT; kilnd replicas on ${PORTS[*]} (logs in $STATE/)."
echo "Try: KILN_SERVER=127.0.0.1:${PORTS[0]} kiln compile G --target cpu; then KILN_SERVER=127.0.0.1:${PORTS[1]} kiln stats"
wait -n "${pids[@]}"
