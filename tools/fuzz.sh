#!/usr/bin/env bash
# Runs every libFuzzer target of a -DMW_FUZZ=ON build for a bounded time each (fuzz/CMakeLists.txt).
#   tools/fuzz.sh BUILD_DIR [SECONDS_EACH]      (default 25 s)
# Each target starts from its seed corpus fuzz/corpus/NAME/ (read only: new inputs go to a scratch
# copy that is removed at the end). A crash, a sanitizer report, a leak or a hang (> 10 s on one
# input) stops the target; its input is kept as fuzz-findings/NAME-crash-* and the script exits 1.
# Turn each finding into a regression test of the normal suite before fixing it.
set -euo pipefail
build=${1:?usage: tools/fuzz.sh BUILD_DIR [SECONDS_EACH]}
seconds=${2:-25}
root=$(cd "$(dirname "$0")/.." && pwd)
findings="$root/fuzz-findings"
scratch=$(mktemp -d /tmp/mw_fuzz_corpus_XXXXXX)
trap 'rm -rf "$scratch"' EXIT
shopt -s nullglob
targets=("$build"/fuzz/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz_* executables under $build/fuzz; configure with -DMW_FUZZ=ON (clang)" >&2
  exit 1
fi
# One target per core at a time (each is one process): on 2 cores the six targets take three
# rounds of SECONDS_EACH instead of five. Results are printed in target order.
jobs=$(nproc)
fuzz_one() {
  local exe=$1 name=$2 start runs
  start=$(date +%s)
  if "$exe" -max_total_time="$seconds" -timeout=10 -max_len=16384 -print_final_stats=1 \
       -artifact_prefix="$findings/$name-" "$scratch/$name" "$root/fuzz/corpus/$name" \
       > "$scratch/$name.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$name.log" | grep -o '[0-9]*$')
    echo "fuzz $name: ok, ${runs:-?} inputs in $(( $(date +%s) - start )) s" > "$scratch/$name.result"
  else
    {
      echo "fuzz $name: FAILED; the input is under $findings/:"
      grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$scratch/$name.log" | head -20 || true
      tail -5 "$scratch/$name.log"
    } > "$scratch/$name.result"
    return 1
  fi
}
names=()
for exe in "${targets[@]}"; do
  name=$(basename "$exe"); name=${name#fuzz_}
  names+=("$name")
  mkdir -p "$scratch/$name" "$findings"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$exe" "$name" &
done
wait || true
failed=0
for name in "${names[@]}"; do
  cat "$scratch/$name.result" 2> /dev/null || echo "fuzz $name: FAILED (no result)"
  grep -q ': ok,' "$scratch/$name.result" 2> /dev/null || failed=1
done
exit $failed
