#!/usr/bin/env bash
# Builds the Go trainer example (examples/go/trainer) from the proto alone with Debian's Go
# packages, starts a one-rank CPU server on free loopback ports, and runs the example against it
# (a unary call checked against a float64 Newton–Schulz, and a group step of two ranks checked
# against the unary result). Offline: the Go sources come from Debian (/usr/share/gocode), built
# in GOPATH mode; nothing is downloaded.
#
#   examples/go/run.sh            # uses build/bin/orthoserve (ORTHOSERVE_BUILD_DIR)
#
# Exits 77 (CTest: skipped) with a line saying what is missing when Go, protoc, protoc-gen-go-grpc
# or Debian's Go sources of protobuf and gRPC are absent (scripts/setup.sh installs them).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ORTHOSERVE_BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
binary=${ORTHOSERVE_BINARY:-$build/bin/orthoserve}
gocode=/usr/share/gocode

skip() { echo "go example: skipped: $*" >&2; exit 77; }
for tool in go protoc protoc-gen-go-grpc python3; do
  command -v "$tool" >/dev/null || skip "no $tool here (Debian: golang-go, protobuf-compiler, protoc-gen-go-grpc)"
done
for pkg in google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc; do
  [[ -d $gocode/src/$pkg ]] || skip "no $gocode/src/$pkg (Debian: golang-google-protobuf-dev, golang-google-grpc-dev)"
done
[[ -x $binary ]] || { echo "go example: no server binary $binary; build it first (scripts/setup.sh)" >&2; exit 2; }

work=$build/go
gopath=$work/gopath
export GO111MODULE=off GOPATH=$gopath:$gocode GOCACHE=$work/cache GOFLAGS= CGO_ENABLED=0
mkdir -p "$work/bin" "$gopath/src/orthoserve-example"

# protoc-gen-go of the protobuf-go API Debian ships (its packaged binary is the older 1.3 generator,
# which cannot read proto3 `optional`).
go build -o "$work/bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
PATH=$work/bin:$PATH protoc -I "$root/proto" --go_out="$gopath/src" --go-grpc_out="$gopath/src" \
  "$root/proto/orthoserve/v1/orthogonalizer.proto"
rm -rf "$gopath/src/orthoserve-example/trainer"
cp -r "$root/examples/go/trainer" "$gopath/src/orthoserve-example/trainer"
go build -o "$work/bin/trainer" orthoserve-example/trainer
echo "go example: built $work/bin/trainer"

read -r port fleet_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
log=$work/server.log
"$binary" --listen "127.0.0.1:$port" --backend cpu --metrics-address "" --fleet-listen "127.0.0.1:$fleet_port" \
  >"$log" 2>&1 &
server_pid=$!
trap 'kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true' EXIT
ctl=$build/bin/orthoctl
for _ in $(seq 1 300); do
  if [[ -x $ctl ]] && "$ctl" health --server "127.0.0.1:$port" --timeout 1 >/dev/null 2>&1; then break; fi
  kill -0 "$server_pid" 2>/dev/null || { echo "go example: the server exited (see $log)" >&2; exit 1; }
  sleep 0.1
done
"$work/bin/trainer" -address "127.0.0.1:$port"
