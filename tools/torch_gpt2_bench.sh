#!/usr/bin/env bash
# Runs tools/torch_gpt2_bench.py (PyTorch GPT-2 fp32 AdamW training steps) "plain" and/or "tuned".
#
#   tools/torch_gpt2_bench.sh [plain|tuned|both] [torch_gpt2_bench.py args...]
#   tools/torch_gpt2_bench.sh both --model small --batch 4 --seq 128 --steps 10 --threads 2 --json
#
# plain: the process as a user would start it; only torch.set_num_threads(--threads).
# tuned: what docs/references.md records to halve PyTorch's step time on this 2-core machine:
#   OMP_WAIT_POLICY=PASSIVE       OpenMP workers sleep instead of spinning against OpenBLAS's threads;
#   LD_PRELOAD=libjemalloc.so.2   with MALLOC_CONF dirty/muzzy decay off, so the ~100 MB activation and
#                                 logits buffers are reused each step instead of unmapped and re-faulted;
#   OMP_NUM_THREADS=--threads.
# Debian's jemalloc: apt-get install -y libjemalloc2. Uses /usr/bin/python3 (Debian's python3-torch).
# Defaults if no bench args are given: --model small --batch 4 --seq 128 --steps 10 --threads 2 --json.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python=/usr/bin/python3
jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2

mode="both"
case "${1:-}" in
  plain|tuned|both) mode="$1"; shift ;;
  -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
esac
if [[ $# -eq 0 ]]; then
  set -- --model small --batch 4 --seq 128 --steps 10 --threads 2 --json
fi

threads=2
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --threads) threads="${args[i+1]:-2}" ;;
    --threads=*) threads="${args[i]#--threads=}" ;;
  esac
done

run_plain() {
  echo "== plain: $python $here/torch_gpt2_bench.py $*"
  "$python" "$here/torch_gpt2_bench.py" "$@"
}

run_tuned() {
  if [[ ! -e "$jemalloc" ]]; then
    echo "error: $jemalloc not found; install it with: apt-get install -y libjemalloc2" >&2
    exit 2
  fi
  echo "== tuned: OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=$threads LD_PRELOAD=$jemalloc" \
       "MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 $python $here/torch_gpt2_bench.py $*"
  OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$threads" LD_PRELOAD="$jemalloc" \
    MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1" \
    "$python" "$here/torch_gpt2_bench.py" "$@"
}

case "$mode" in
  plain) run_plain "$@" ;;
  tuned) run_tuned "$@" ;;
  both) run_plain "$@"; run_tuned "$@" ;;
esac
