#!/usr/bin/env bash
# The plain-Secret alternative to components/fleet-tls-cert-manager: makes a fleet CA and one
# certificate for the fleet's pods with openssl, and prints the `kubectl create secret` command
# that stores them as orthoserve-fleet-tls (tls.crt, tls.key, ca.crt), the Secret the base mounts.
#
#   deploy/k8s/make_fleet_certs.sh [--namespace NS] [--service SVC]... [--days N] [--dir DIR]
#
# The certificate carries DNS:*.SVC.NS.svc for each headless Service given (default
# orthoserve-fleet; one per cell for examples/cells), so it carries every pod's member name
# (ORTHOSERVE_FLEET_TLS_MEMBER_NAME: <statefulset>-{rank}.<service>.<namespace>.svc). EC P-256 keys,
# valid --days days (default 365); files go to DIR (default ./orthoserve-fleet-tls), keys mode 0600.
# Keep ca.key offline (it is not part of the Secret): whoever holds it can mint member certificates.
#
# One certificate shared by all pods means any pod (or anything that can read the Secret) can
# claim any rank; processes without it cannot reach the fleet port at all. Per-pod certificates
# (cert-manager's csi-driver) bind each pod to its rank: docs/operations.md, "Security".
set -euo pipefail

namespace=orthoserve
services=()
days=365
dir=./orthoserve-fleet-tls
while (($#)); do
  case "$1" in
    --namespace) namespace=$2; shift 2 ;;
    --service) services+=("$2"); shift 2 ;;
    --days) days=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "make_fleet_certs.sh: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
((${#services[@]})) || services=(orthoserve-fleet)
command -v openssl >/dev/null || { echo "make_fleet_certs.sh: openssl not found" >&2; exit 2; }
[[ $days =~ ^[1-9][0-9]*$ ]] || { echo "make_fleet_certs.sh: --days ${days} is not a positive integer" >&2; exit 2; }

umask 077
mkdir -p "$dir"
sans=""
for svc in "${services[@]}"; do sans+="${sans:+,}DNS:*.${svc}.${namespace}.svc"; done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$days" \
  -subj "/CN=orthoserve fleet CA (${namespace})" -keyout "$dir/ca.key" -out "$dir/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' \
  "$sans" >"$dir/tls.ext"
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=orthoserve fleet (${namespace})" \
  -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -set_serial "0x$(openssl rand -hex 8)" \
  -days "$days" -extfile "$dir/tls.ext" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/tls.ext"
openssl verify -CAfile "$dir/ca.crt" "$dir/tls.crt" >/dev/null

echo "made $dir/ca.crt, $dir/tls.crt and $dir/tls.key for ${sans//,/, } (valid ${days} days); store them with:" >&2
printf 'kubectl create secret generic orthoserve-fleet-tls --namespace %q --from-file=tls.crt=%q --from-file=tls.key=%q --from-file=ca.crt=%q\n' \
  "$namespace" "$dir/tls.crt" "$dir/tls.key" "$dir/ca.crt"
