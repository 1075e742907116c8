#!/usr/bin/env bash
# Throw-away certificates for the fleet port's mutual TLS (openssl; EC P-256 keys, valid 30 days):
# what deploy/local/fleet.sh starts local fleets with, and what the tests make theirs with. Not
# for production: see deploy/k8s/make_fleet_certs.sh and the cert-manager component.
#
#   deploy/local/fleet_certs.sh fleet DIR WORLD               a CA (DIR/ca.crt) and rank R's certificate
#                                                             DIR/rankR.{crt,key} with SAN DNS:orthoserve-rank-R
#                                                             (the default --fleet-tls-member-name)
#   deploy/local/fleet_certs.sh ca DIR [NAME]                 a CA: DIR/NAME.{crt,key} (NAME default ca)
#   deploy/local/fleet_certs.sh cert DIR NAME [--ca CA] SAN...  DIR/NAME.{crt,key} signed by DIR/CA.{crt,key}
#                                                             (default ca), with the SANs given as openssl
#                                                             writes them: DNS:x, URI:y, IP:z
#
# Every certificate has the serverAuth and clientAuth usages (a member is both). Keys are
# written mode 0600.
set -euo pipefail
umask 077

die() { echo "fleet_certs.sh: $*" >&2; exit 2; }
command -v openssl >/dev/null || die "openssl not found"

make_ca() {  # make_ca DIR NAME
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=orthoserve throw-away fleet CA ($2)" -keyout "$1/$2.key" -out "$1/$2.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

make_cert() {  # make_cert DIR NAME CA SAN...
  local dir=$1 name=$2 ca=$3
  shift 3
  (($#)) || die "cert ${name}: give at least one SAN (DNS:..., URI:..., IP:...)"
  [[ -f "$dir/$ca.crt" && -f "$dir/$ca.key" ]] || die "cert ${name}: no CA $dir/$ca.{crt,key}; make it with \`ca\`"
  local sans
  sans=$(IFS=,; echo "$*")
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' \
    "$sans" >"$dir/$name.ext"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$name" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/$ca.crt" -CAkey "$dir/$ca.key" \
    -set_serial "0x$(openssl rand -hex 8)" -days 30 -extfile "$dir/$name.ext" -out "$dir/$name.crt" 2>/dev/null
  rm -f "$dir/$name.csr" "$dir/$name.ext"
}

cmd=${1:-}
(($#)) && shift
case "$cmd" in
  fleet)
    (($# == 2)) || die "usage: fleet DIR WORLD"
    dir=$1 world=$2
    [[ $world =~ ^[1-9][0-9]*$ ]] || die "WORLD ${world} is not a positive integer"
    mkdir -p "$dir"
    make_ca "$dir" ca
    for ((r = 0; r < world; r++)); do make_cert "$dir" "rank$r" ca "DNS:orthoserve-rank-$r"; done
    ;;
  ca)
    (($# == 1 || $# == 2)) || die "usage: ca DIR [NAME]"
    mkdir -p "$1"
    make_ca "$1" "${2:-ca}"
    ;;
  cert)
    (($# >= 2)) || die "usage: cert DIR NAME [--ca CA] SAN..."
    dir=$1 name=$2 ca=ca
    shift 2
    if [[ ${1:-} == --ca ]]; then
      ca=$2
      shift 2
    fi
    make_cert "$dir" "$name" "$ca" "$@"
    ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
