#!/usr/bin/env bash
# The recorded observe run: profile a few engine steps, run the one-knob tuning loop, then start
# labs.server, put Poisson load on it with labs.loadgen and scrape its /metrics meanwhile.
# Each stage records into labs/results/observe_*.json and copies that file to OUTDIR at once,
# so a run cut off later keeps what the earlier stages measured.
#
#   bash labs/observe/run.sh OUTDIR            # from the repository root, on a CUDA machine
#
# PROFILE_ARGS, TUNE_ARGS, SERVER_ARGS, LOAD_ARGS, SCRAPE_ARGS override the defaults (a CPU
# smoke run passes --tiny --device cpu and small loads); STAGES picks stages (default: all three).
set -uo pipefail
out=${1:?usage: run.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
port=${PORT:-8124}
stages=${STAGES:-profile tune server}
machine=${MACHINE:-$($py -c 'import torch; print(torch.cuda.get_device_name(0))')}
profile_args=${PROFILE_ARGS:---model llama-3.1-8b --batch 32 --context 1024 --chunk 2048 --steps 3}
tune_args=${TUNE_ARGS:---model llama-3.1-8b --requests 48 --rate-scale 4 --length-scale 0.25 --slo ttft:200 tpot:30 --max-run-s 6 --budget-s 120}
server_args=${SERVER_ARGS:---model llama-3.1-8b --max-num-seqs 64 --max-model-len 2048 --max-num-batched-tokens 2048 --num-blocks 2560}
load_args=${LOAD_ARGS:---request-rate 15,60 --max-duration 5 --num-prompts 400 --input-len 512 --output-len 64 --ignore-eos}
scrape_args=${SCRAPE_ARGS:---interval 0.25 --duration 40 --window 2 --stop-when-idle 1}
rc=0
keep() { cp labs/results/observe_*.json "$out/" 2>/dev/null || true; }
t0=$(date +%s)
for stage in $stages; do
  echo "== $stage at +$(( $(date +%s) - t0 )) s" | tee -a "$out/run.log"
  case $stage in
    profile)
      # shellcheck disable=SC2086
      $py -m labs.observe.profile $profile_args --out "$out/profile" --record --machine "$machine" 2>&1 \
        | grep -v -e '^USDT' -e 'gpuGetDeviceCount' | tee -a "$out/run.log" || rc=1 ;;
    tune)
      # shellcheck disable=SC2086
      $py -m labs.observe.tune $tune_args --out "$out/tune" --record --machine "$machine" 2>&1 | tee -a "$out/run.log" || rc=1 ;;
    server)
      # shellcheck disable=SC2086
      $py -m labs.server $server_args --port "$port" >"$out/server.log" 2>&1 &
      server=$!
      s0=$(date +%s)
      until $py -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; do
        kill -0 "$server" 2>/dev/null || { echo "the server exited:"; cat "$out/server.log"; rc=1; break; }
        [ $(( $(date +%s) - s0 )) -lt "${START_TIMEOUT:-120}" ] || { echo "the server did not start"; rc=1; break; }
        sleep 0.5
      done
      if kill -0 "$server" 2>/dev/null; then
        echo "server up after $(( $(date +%s) - s0 )) s" | tee -a "$out/run.log"
        # shellcheck disable=SC2086
        $py -m labs.observe.scrape --base-url "http://127.0.0.1:$port" $scrape_args --series "${SERIES:-poisson 15 then 60 req/s}" \
          --out "$out/scrape" --record --machine "$machine" >"$out/scrape.log" 2>&1 &
        scraper=$!
        # shellcheck disable=SC2086
        $py -m labs.loadgen --base-url "http://127.0.0.1:$port" $load_args --warmup 0 --out "$out/loadgen" \
          --progress lines 2>&1 | tee -a "$out/run.log" || rc=1
        wait "$scraper" || rc=1
        cat "$out/scrape.log" | tee -a "$out/run.log"
      fi
      kill "$server" 2>/dev/null; wait "$server" 2>/dev/null ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
  keep
done
echo "== done at +$(( $(date +%s) - t0 )) s, rc $rc" | tee -a "$out/run.log"
exit $rc
