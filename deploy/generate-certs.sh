#!/usr/bin/env bash
# Generate a private CA, the SuperLink's TLS certificate signed by it, and one SSH key pair per
# SuperNode (for node authentication). Used by the compose `gen-certs` service and by
# deploy/loopback.py alike, so both deployments run on the same kind of files.
#
#   deploy/generate-certs.sh OUT_DIR NUM_SUPERNODES [EXTRA_SAN ...]
#
# OUT_DIR gets ca.crt, ca.key, server.pem, server.key and keys/supernode-N{,.pub}. The
# certificate is valid for localhost, 127.0.0.1, superlink, and every EXTRA_SAN: list the
# name or IP address the SuperNodes and the `flwr` CLI dial (DNS:fl.example.org,IP:203.0.113.7).
# Existing files are kept, so re-running never invalidates enrolled keys.
set -euo pipefail
out="${1:?usage: generate-certs.sh OUT_DIR NUM_SUPERNODES [EXTRA_SAN ...]}"
num_nodes="${2:?number of SuperNodes}"
shift 2
san="DNS:localhost,IP:127.0.0.1,DNS:superlink"
for extra in "$@"; do
  if [ -n "$extra" ]; then san="$san,$extra"; fi  # comma-separated lists work too
done

mkdir -p "$out/keys"
cd "$out"
if [ ! -f ca.crt ]; then
  openssl req -x509 -newkey rsa:4096 -sha256 -days 365 -nodes -keyout ca.key -out ca.crt \
    -subj "/CN=adaptfl-ca" 2>/dev/null
fi
if [ ! -f server.pem ]; then
  openssl req -newkey rsa:4096 -sha256 -nodes -keyout server.key -out server.csr \
    -subj "/CN=superlink" 2>/dev/null
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
    "$san" > server.ext
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -sha256 -extfile server.ext -out server.pem 2>/dev/null
  rm -f server.csr server.ext
fi
for i in $(seq 1 "$num_nodes"); do
  [ -f "keys/supernode-$i" ] || ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode-$i" -f "keys/supernode-$i"
done
# The containers run as the non-root user `app`: the files must be readable by it.
chmod -R a+rX "$out"
