#!/usr/bin/env bash
# The recorded sweep: start labs.server at Llama-3.1-8B shapes (random weights) on this GPU, run a
# closed-loop concurrency sweep and an open-loop rate sweep with labs.loadgen, record both into
# labs/results/server_sweep.json, stop the server. Everything it prints goes to OUTDIR too.
#
#   bash labs/server/sweep.sh OUTDIR            # from the repository root, on a CUDA machine
#
# SERVER_ARGS and LOADGEN_ARGS override the defaults below (a CPU smoke run uses --tiny).
set -euo pipefail
out=${1:?usage: sweep.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
port=${PORT:-8123}
server_args=${SERVER_ARGS:---model llama-3.1-8b --max-num-seqs 128 --max-model-len 2048 --max-num-batched-tokens 2048}
load_args=${LOADGEN_ARGS:---input-len 256 --output-len 32 --ignore-eos --max-duration 2.5 --num-prompts 512 --goodput ttft:500 tpot:50}
machine=${MACHINE:-$($py -c 'import torch; print(torch.cuda.get_device_name(0))')}
system=${SYSTEM:-labs.server llama-3.1-8b}

# shellcheck disable=SC2086
$py -m labs.server $server_args --port "$port" >"$out/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
start=$(date +%s)
until $py -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; do
  kill -0 "$server" 2>/dev/null || { echo "the server exited:"; cat "$out/server.log"; exit 1; }
  [ $(( $(date +%s) - start )) -lt "${START_TIMEOUT:-180}" ] || { echo "the server did not start"; exit 1; }
  sleep 0.5
done
echo "server up after $(( $(date +%s) - start )) s" | tee -a "$out/sweep.log"

rc=0
# shellcheck disable=SC2086
$py -m labs.loadgen --base-url "http://127.0.0.1:$port" --concurrency "${CONCURRENCY:-1,4,16,64,128}" $load_args \
  --out "$out/concurrency" --progress lines --record --machine "$machine" --system "$system" 2>&1 | tee -a "$out/sweep.log" || rc=1
# shellcheck disable=SC2086
$py -m labs.loadgen --base-url "http://127.0.0.1:$port" --request-rate "${RATES:-10,40,160}" $load_args --warmup 0 \
  --out "$out/rate" --progress lines --record --machine "$machine" --system "$system" 2>&1 | tee -a "$out/sweep.log" || rc=1
curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics.txt" 2>/dev/null || true
exit $rc
