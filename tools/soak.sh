#!/usr/bin/env bash
# Soak: many steps of the tiny GPT-2 three ways, which must end with the same weights bit for bit:
#   plain   HybridAdam with its states in RAM;
#   nvme    --offload nvme: every Adam state streamed from and to disk every step;
#   tiers   --gemini auto on a simulated device too small for all chunks (chunks are evicted every
#           step) with a host budget too small for the model data, so 9 of the 13 chunks and every
#           Adam state live on disk (three tiers, docs/gemini.md).
# It also checks that no offload file is left in the --nvme-dir folders. Not run on every CI run
# (1000 steps: 105 s here under load 11 on 2 cores: plain 26 s, nvme 41 s, tiers 38 s with 11988
# evictions); run it after changing the optimizer, the io engine or Gemini:
#   tools/soak.sh [BUILD_DIR] [STEPS]          (defaults: build, 1000)
set -euo pipefail
build=${1:-build}
steps=${2:-1000}
train="$build/apps/gpt2_train"
[ -x "$train" ] || { echo "soak: $train not found; build the gpt2_train target first" >&2; exit 1; }
work=$(mktemp -d /tmp/mw_soak_XXXXXX)
trap 'rm -rf "$work"' EXIT
common=(--model tiny --batch 4 --seq 32 --steps "$steps" --seed 7 --lr 3e-3 --threads 2)

run() {  # run NAME ARGS...: trains into $work/NAME, prints the wall time
  local name=$1; shift
  mkdir -p "$work/$name.nvme"
  local start end
  start=$(date +%s.%N)
  "$train" "${common[@]}" --save "$work/$name" "$@" > "$work/$name.log" 2>&1 ||
    { echo "soak: the $name run failed:"; tail -20 "$work/$name.log"; exit 1; }
  end=$(date +%s.%N)
  printf 'soak %-6s %5d steps in %6.1f s, last %s\n' "$name" "$steps" "$(echo "$end - $start" | bc)" \
    "$(grep -E '^\[[0-9]+\] loss' "$work/$name.log" | tail -1)"
  if [ -n "$(ls -A "$work/$name.nvme")" ]; then
    echo "soak: the $name run left files in its --nvme-dir:"; ls -la "$work/$name.nvme"; exit 1
  fi
}

total_start=$(date +%s)
run plain
run nvme --offload nvme --fraction 1.0 --nvme-dir "$work/nvme.nvme"
run tiers --device sim:840KiB --gemini auto --chunk-size 4096 --nvme-window 64KiB \
  --host-capacity 150KiB --nvme-dir "$work/tiers.nvme"
grep -h -E "^NVMe:|^Gemini" "$work/nvme.log" "$work/tiers.log" | cut -c1-150 || true

status=0
for name in nvme tiers; do
  if cmp -s "$work/plain/model.safetensors" "$work/$name/model.safetensors"; then
    echo "soak $name: model.safetensors equals the plain run's, bit for bit"
  else
    echo "soak $name: model.safetensors DIFFERS from the plain run's"; status=1
  fi
done
echo "soak: $(( $(date +%s) - total_start )) s in all"
exit $status
