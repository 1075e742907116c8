# Sourced by the bench scripts: bench_build BUILD_DIR LOG_NAME TARGET... configures BUILD_DIR
# (Release, no CUDA) when it has no CMakeCache.txt yet, builds the targets on two cores, and
# exits with the build's log on stderr when that fails (BUILD_DIR/LOG_NAME.build.log).
# Expects $root, the repository's root.
bench_build() {
  local build=$1 log="$1/$2.build.log"
  shift 2
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DORTHOSERVE_WITH_CUDA=OFF >/dev/null
  fi
  if ! cmake --build "$build" --target "$@" -- -j2 >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
}
