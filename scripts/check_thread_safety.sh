#!/usr/bin/env bash
# Clang's thread-safety analysis over the C++ of the named directories: a syntax-only pass (no
# code generated) of each translation unit, with the flags the build uses, failing on any
# -Wthread-safety diagnostic (a guarded member touched without its mutex, a *Locked helper called
# without the lock, a lock not released, ...). The lock rules are the annotations of
# absl/base/thread_annotations.h (docs/architecture.md, "Concurrency").
#
#   scripts/check_thread_safety.sh                 # the directories of CHECKED_DIRS
#   scripts/check_thread_safety.sh common server/app
#
# Reads ${ORTHOSERVE_BUILD_DIR:-build}/compile_commands.json, so it needs a configured build
# whose generated sources (protobuf headers) exist: run it after ./scripts/setup.sh. Needs
# clang++ (Debian's clang package) and python3. Runs ORTHOSERVE_TSA_JOBS (default 2) files at
# a time. Exits non-zero when any file has a thread-safety error or does not compile under clang.
set -euo pipefail
cd "$(dirname "$0")/.."

# Source directories checked by default, relative to the repository root: all of the C++.
CHECKED_DIRS=(common client/cpp server)

build_dir=${ORTHOSERVE_BUILD_DIR:-build}
jobs=${ORTHOSERVE_TSA_JOBS:-2}
clang=${CLANGXX:-clang++}

if ! command -v "$clang" >/dev/null 2>&1; then
  echo "check_thread_safety: $clang not found: install Debian's clang package (scripts/setup.sh does)" >&2
  exit 1
fi
db="$build_dir/compile_commands.json"
if [[ ! -f "$db" ]]; then
  echo "check_thread_safety: $db not found: configure the build first (scripts/setup.sh)" >&2
  exit 1
fi

dirs=("$@")
((${#dirs[@]})) || dirs=("${CHECKED_DIRS[@]}")

start=$SECONDS

# One mutex type: a std:: mutex, lock or condition variable is invisible to the analysis.
if grep -rnE --include='*.h' --include='*.cc' \
  'std::(mutex|timed_mutex|recursive_mutex|shared_mutex|shared_timed_mutex|condition_variable|condition_variable_any|lock_guard|unique_lock|scoped_lock|shared_lock)\b' \
  "${dirs[@]}"; then
  echo "check_thread_safety: use absl::Mutex, absl::MutexLock and absl::CondVar instead (docs/architecture.md, \"Concurrency\")" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One line per translation unit: the clang command, shell-quoted, run from the entry's directory.
python3 - "$db" "$PWD" "$clang" "$work" "${dirs[@]}" <<'PY'
import json, os, shlex, sys

db, root, clang, work, *dirs = sys.argv[1:]
dirs = [os.path.normpath(os.path.join(root, d)) for d in dirs]
for d in dirs:
    if not os.path.isdir(d):
        sys.exit(f"check_thread_safety: {os.path.relpath(d, root)} is not a directory")

# Kept: -I, -isystem, -D, -std and the like. Dropped: output, dependency-file and code
# generation flags, which a syntax-only pass does not use; every warning flag (-Werror included:
# the pass turns all warnings off but the thread-safety ones); GCC-only flags clang rejects.
DROP = {"-c"}
DROP_WITH_VALUE = {"-o", "-MF", "-MT", "-MQ"}
DROP_PREFIX = ("-O", "-g", "-W", "-MD", "-MMD", "-flto", "-fno-fat-lto-objects", "-fdiagnostics-color",
               "-fconcepts-diagnostics-depth", "-fmax-errors", "-fipa-", "-fno-ipa-", "-ftree-", "-fno-tree-")

seen = set()
lines = []
for entry in json.load(open(db)):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    if not any(path.startswith(d + os.sep) for d in dirs):
        continue
    # CUDA sources are nvcc's; a source built into several targets is checked once.
    if path.endswith(".cu") or path in seen:
        continue
    seen.add(path)
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in DROP_WITH_VALUE:
            skip = True
            continue
        if a in DROP or a.startswith(DROP_PREFIX) or os.path.normpath(os.path.join(entry["directory"], a)) == path:
            continue
        out.append(a)
    # Every warning off but the thread-safety ones, which are errors (-beta: the newer checks
    # clang leaves off by default). ORTHOSERVE_NO_VECTOR_CLONES: see common/vector_clones.h.
    out += ["-DORTHOSERVE_NO_VECTOR_CLONES", "-fsyntax-only", "-Wno-everything",
            "-Wthread-safety", "-Wthread-safety-beta", "-Werror=thread-safety", "-Werror=thread-safety-beta", path]
    lines.append(f"{entry['directory']}\t{os.path.relpath(path, root)}\t{shlex.join(out)}")
lines.sort(key=lambda l: l.split("\t")[1])
with open(os.path.join(work, "units"), "w") as f:
    f.write("".join(l + "\n" for l in lines))
PY

count=$(wc -l <"$work/units")
if ((count == 0)); then
  echo "check_thread_safety: no translation unit under ${dirs[*]} in $db" >&2
  exit 1
fi

# Checks one unit (a line of $work/units); on failure leaves its diagnostics in $work/<file>.failed.
check_one() {
  local dir file cmd out
  IFS=$'\t' read -r dir file cmd <<<"$1"
  out="$work/${file//\//_}"
  if ! (cd "$dir" && eval "$cmd") >"$out.log" 2>&1; then
    { echo "check_thread_safety: FAILED $file"; cat "$out.log"; } >"$out.failed"
  fi
}
export -f check_one
export work

xargs -d '\n' -P "$jobs" -n 1 bash -c 'check_one "$1"' _ <"$work/units" ||
  { echo "check_thread_safety: xargs failed" >&2; exit 1; }
failed=0
for f in "$work"/*.failed; do
  [[ -e "$f" ]] || continue
  cat "$f"
  failed=$((failed + 1))
done
echo "check_thread_safety: $count files checked in $((SECONDS - start)) s ($jobs at a time) under ${dirs[*]}:" \
  "$([[ $failed == 0 ]] && echo OK || echo "$failed FAILED")"
((failed == 0))
