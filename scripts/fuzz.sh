#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz; docs/operations.md, "Testing") for SECONDS each on a
# copy of its committed seed corpus, in a clang build in build-fuzz (-fsanitize=fuzzer-no-link,
# address,undefined on everything it builds, no recovery; CUDA and benchmarks off; only the fuzz
# targets and what they link). Prints one line per target (executions, coverage, corpus size,
# finding) and exits non-zero when any target found something; a finding's input is kept under
# build-fuzz/findings/<target>/ (replay it with build/fuzz/<target>_fuzz FILE, or the fuzz build's
# binary), and the corpus a run grew under build-fuzz/corpus/<target>/.
#
#   scripts/fuzz.sh 120                    # every target, 120 s each
#   scripts/fuzz.sh 30 npy etcd_value      # only these targets
#
# Environment: ORTHOSERVE_FUZZ_JOBS (build jobs, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if (($# < 1)) || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
dir=build-fuzz
jobs=${ORTHOSERVE_FUZZ_JOBS:-2}

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz: $tool not found (scripts/setup.sh installs clang)" >&2; exit 1; }
done
if [[ ! -f "$(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]]; then
  echo "fuzz: libFuzzer is missing: apt-get install libclang-rt-14-dev (scripts/setup.sh does)" >&2
  exit 1
fi

if (($#)); then
  targets=("$@")
else
  targets=()
  for d in tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi

# The flags of scripts/sanitize.sh's ASan+UBSan build, so that ccache serves each build the
# other's objects. Clang 14 rejects target_clones on templates (common/vector_clones.h): the
# clones are left out.
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -DORTHOSERVE_NO_VECTOR_CLONES"
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
  -DORTHOSERVE_WITH_CUDA=OFF -DORTHOSERVE_BUILD_BENCH=OFF -DORTHOSERVE_WERROR=OFF -DORTHOSERVE_FUZZ=ON >/dev/null
start=$SECONDS
nice -n 10 cmake --build "$dir" -j "$jobs" --target "${targets[@]/%/_fuzz}"
echo "fuzz: built in $((SECONDS - start)) s"

status=0
summary=()
for t in "${targets[@]}"; do
  work=$dir/corpus/$t
  findings=$dir/findings/$t
  log=$dir/logs/$t.log
  rm -rf "$findings"
  mkdir -p "$work" "$findings" "$(dirname "$log")"
  cp -n tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  set +e
  "$dir/fuzz/${t}_fuzz" "$work" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$findings/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n1)
  found=$(find "$findings" -type f | wc -l)
  line="fuzz: $t: ${seconds} s, ${execs:-?} executions, ${cov:-no coverage line}, corpus $(find "$work" -type f | wc -l) inputs"
  if ((rc != 0)) || ((found > 0)); then
    line+=", FINDING (exit $rc; $found input(s) in $findings; log $log)"
    status=1
    grep -m1 -E 'ERROR: |FUZZ_CHECK failed|runtime error' "$log" || true
  else
    line+=", no finding"
  fi
  echo "$line"
  summary+=("$line")
done
echo "fuzz: summary"
printf '%s\n' "${summary[@]}"
exit $status
