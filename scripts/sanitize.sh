#!/usr/bin/env bash
# The C++ suites under clang's sanitizers (docs/operations.md, "Testing"): an ASan+UBSan build in
# build-asan and a TSan build in build-tsan (CUDA and benchmarks off), each running every CTest
# test (unit, integration, the fuzz corpus replays) with the sanitizer's reports written to
# <build>/sanitizer-logs, so that a report from a child process (the orthoserve and orthoctl
# binaries the integration tests start) is not lost in its output. Fails when a test fails or any
# report was written.
#
#   scripts/sanitize.sh                  # both builds: configure, build, test
#   scripts/sanitize.sh --asan           # only ASan+UBSan (--tsan: only TSan)
#   scripts/sanitize.sh --tsan -R fleet  # only the tests whose name matches (ctest -R)
#   scripts/sanitize.sh --targets "common_test shm_test" -R 'common|shm'  # build only these
#   scripts/sanitize.sh --build-only     # configure and build, run nothing
#   scripts/sanitize.sh --test-only      # run what is built
#   scripts/sanitize.sh -- -L integration  # anything after -- goes to ctest
#
# Needs Debian's clang and libclang-rt-14-dev (scripts/setup.sh installs both). TSan sees a lock
# only where the code that takes it is instrumented: every absl::Mutex (ours and gRPC's) lives in
# Debian's libabsl, so the TSan build first builds Debian's own abseil source package (the
# installed version, fetched with `apt-get source` through a private source list, nothing of the
# system's apt set-up changed) with -fsanitize=thread into build-tsan/absl, which the tests load
# in place of the system's (LD_LIBRARY_PATH). Suppressions: tests/sanitizers/*.supp, third-party
# code only. Environment: ORTHOSERVE_SANITIZE_JOBS (build jobs, default 2),
# ORTHOSERVE_SANITIZE_TEST_JOBS (ctest -j, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

builds=()
build_only=0
test_only=0
build_targets=()
ctest_args=()
while (($#)); do
  case "$1" in
    --asan) builds+=(asan) ;;
    --tsan) builds+=(tsan) ;;
    --build-only) build_only=1 ;;
    --test-only) test_only=1 ;;
    --targets)
      read -r -a build_targets <<<"$2"
      shift
      ;;
    -R | -E | -L | -LE)
      ctest_args+=("$1" "$2")
      shift
      ;;
    --)
      shift
      ctest_args+=("$@")
      break
      ;;
    -h | --help)
      sed -n '2,24p' "$0"
      exit 0
      ;;
    *)
      echo "sanitize: unknown argument $1 (see --help)" >&2
      exit 2
      ;;
  esac
  shift
done
((${#builds[@]})) || builds=(asan tsan)
jobs=${ORTHOSERVE_SANITIZE_JOBS:-2}
test_jobs=${ORTHOSERVE_SANITIZE_TEST_JOBS:-2}

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "sanitize: $tool not found (scripts/setup.sh installs clang)" >&2; exit 1; }
done
if [[ ! -f "$(clang++ -print-file-name=libclang_rt.asan-x86_64.a)" ]]; then
  echo "sanitize: clang's sanitizer runtimes are missing: apt-get install libclang-rt-14-dev (scripts/setup.sh does)" >&2
  exit 1
fi

# Builds Debian's abseil, the installed version, with -fsanitize=thread into $1/lib (once).
tsan_abseil() {
  local dir=$1 version
  version=$(dpkg-query -W -f='${Version}' libabsl-dev)
  if [[ -f "$dir/lib/.version" && "$(cat "$dir/lib/.version")" == "$version" ]]; then
    return 0
  fi
  echo "sanitize: building abseil $version with -fsanitize=thread into $dir (once)"
  rm -rf "$dir"
  mkdir -p "$dir/apt/lists/partial" "$dir/src"
  # Debian's archive as the system's sources name it, for source packages only.
  local archive security
  archive=$(grep -rhoE 'https?://[^ ]*/debian/?$|https?://[^ ]*/debian$' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -n1 || true)
  security=$(grep -rhoE 'https?://[^ ]*/debian-security/?$' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -n1 || true)
  archive=${archive:-http://deb.debian.org/debian}
  security=${security:-http://deb.debian.org/debian-security}
  local codename
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  cat >"$dir/apt/sources.list" <<EOF
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive $codename main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive $codename-updates main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $security $codename-security main
EOF
  local apt_opts=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$dir/apt/lists" -o Debug::NoLocking=1)
  apt-get "${apt_opts[@]}" update -qq
  (cd "$dir/src" && apt-get "${apt_opts[@]}" source --download-only "abseil=$version" >/dev/null)
  dpkg-source -x "$dir"/src/abseil_*.dsc "$dir/source" >/dev/null
  # As debian/rules configures the shared libraries (the SONAMEs and options.h are Debian's
  # patches), plus TSan.
  CC=clang CXX=clang++ cmake -S "$dir/source" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DCMAKE_INSTALL_PREFIX="$dir" -DCMAKE_INSTALL_LIBDIR=lib \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  nice -n 10 cmake --build "$dir/build" -j "$jobs"
  cmake --install "$dir/build" >/dev/null
  rm -rf "$dir/build" "$dir/source" "$dir/src" "$dir/apt"
  echo "$version" >"$dir/lib/.version"
}

# configure_build NAME SANITIZE_FLAGS: build-NAME with clang, CUDA and benchmarks off.
configure_build() {
  local name=$1 flags=$2
  local dir=build-$name
  # -O1 keeps the suites' timing close to a release build's; no NDEBUG (asserts on). Clang 14
  # rejects target_clones on templates (common/vector_clones.h): the clones are left out.
  flags="$flags -DORTHOSERVE_NO_VECTOR_CLONES"
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
    -DORTHOSERVE_WITH_CUDA=OFF -DORTHOSERVE_BUILD_BENCH=OFF -DORTHOSERVE_WERROR=OFF \
    -DORTHOSERVE_TEST_TIMEOUT_SCALE="$3" >/dev/null
}

status=0
for name in "${builds[@]}"; do
  dir=build-$name
  start=$SECONDS
  case $name in
    asan)
      # With libFuzzer's coverage instrumentation (fuzzer-no-link, a few per cent slower): the
      # flags of scripts/fuzz.sh's build, so that ccache serves each build the other's objects.
      flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
      scale=3
      ;;
    tsan)
      flags="-fsanitize=thread"
      scale=5
      ;;
  esac
  if ((!test_only)); then
    [[ $name == tsan ]] && tsan_abseil "$root/$dir/absl"
    configure_build "$name" "$flags" "$scale"
    echo "sanitize: building $dir"
    nice -n 10 cmake --build "$dir" -j "$jobs" ${build_targets[@]:+--target "${build_targets[@]}"}
    echo "sanitize: $dir built in $((SECONDS - start)) s"
  fi
  ((build_only)) && continue

  logs=$root/$dir/sanitizer-logs
  rm -rf "$logs"
  mkdir -p "$logs"
  supp=$root/tests/sanitizers
  env_vars=()
  case $name in
    asan)
      env_vars=(
        "ASAN_OPTIONS=log_path=$logs/asan:log_exe_name=1:allocator_may_return_null=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
        "LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0"
        "UBSAN_OPTIONS=log_path=$logs/ubsan:log_exe_name=1:print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
      )
      ;;
    tsan)
      env_vars=(
        "TSAN_OPTIONS=log_path=$logs/tsan:log_exe_name=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp:print_suppressions=0"
        "LD_LIBRARY_PATH=$root/$dir/absl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      )
      ;;
  esac
  start=$SECONDS
  set +e
  env "${env_vars[@]}" ctest --test-dir "$dir" --output-on-failure -j "$test_jobs" "${ctest_args[@]}"
  rc=$?
  set -e
  # A log with no error in it (ASan's "failed to allocate" warning for the tests that ask for
  # impossible sizes on purpose, with allocator_may_return_null=1) is printed but is no finding.
  reports=$(grep -lE 'ERROR: |runtime error|WARNING: ThreadSanitizer' -r "$logs" 2>/dev/null | sort || true)
  for f in $(find "$logs" -type f | sort); do
    grep -qxF "$f" <<<"$reports" || { echo "=== $f (warning only)"; cat "$f"; }
  done
  echo "sanitize: $dir: ctest exit $rc in $((SECONDS - start)) s, $(echo -n "$reports" | grep -c . || true) sanitizer report(s)"
  for f in $reports; do
    echo "=== $f"
    cat "$f"
  done
  if ((rc != 0)) || [[ -n "$reports" ]]; then
    status=1
  fi
done
exit $status
