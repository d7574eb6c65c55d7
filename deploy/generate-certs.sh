#!/usr/bin/env bash
# A private CA, the TLS certificates of the SuperLink and of the Fleet API proxy, one SSH key pair
# per SuperNode (node authentication) and the shared secrets of the SuperExec links, laid out
# as one folder per process, so each container mounts only its own folder. Used by the compose
# demo (`./generate-certs.sh certs N` in deploy/) and by adaptfl/deploy/loopback.py alike.
#
#   deploy/generate-certs.sh OUT_DIR NUM_SUPERNODES [EXTRA_SAN ...]
#
#   OUT_DIR/ca.crt                   public: give it to SuperNodes and operators
#   OUT_DIR/ca/                      ca.key ca.crt (the CA: mounted nowhere, its key never copied
#                                    off this machine)
#   OUT_DIR/superlink/               ca.crt server.pem server.key superexec.secret
#   OUT_DIR/fleet-proxy/             ca.crt fleet-proxy.pem fleet-proxy.key
#   OUT_DIR/superexec-serverapp/     ca.crt superexec.secret (the same secret as the SuperLink's)
#   OUT_DIR/supernode-N/             ca.crt supernode.key supernode.pub superexec.secret
#   OUT_DIR/superexec-clientapp-N/   superexec.secret (the same secret as supernode-N's)
#   OUT_DIR/operator/                ca.crt supernode-N.pub (what an operator holds: the public
#                                    keys the organisations sent, to register them)
#
# Keys are ECDSA P-384 (about RSA-7680's strength, NIST SP 800-57 Part 1 Table 2; made in a
# millisecond where RSA-4096 took 0.7-3.6 s each here). Private keys and secrets are 0600 in 0700 folders. KEY_OWNER=uid:gid (compose: 49999:49999,
# the user `app` of Flower's images) hands each process folder to the user that runs it; the
# CA folder stays with whoever ran this. Certificates are valid for localhost, 127.0.0.1,
# superlink / fleet-proxy and every EXTRA_SAN (DNS:fl.example.org,IP:203.0.113.7: the names the
# SuperNodes and operators dial). Existing files are kept, so re-running never invalidates
# enrolled keys.
set -euo pipefail
out="${1:?usage: generate-certs.sh OUT_DIR NUM_SUPERNODES [EXTRA_SAN ...]}"
num_nodes="${2:?number of SuperNodes}"
shift 2
extra_san=""
for extra in "$@"; do
  if [ -n "$extra" ]; then extra_san="$extra_san,$extra"; fi  # comma-separated lists work too
done
umask 077  # everything private unless made public below

private_dir() { mkdir -p "$1"; chmod 0700 "$1"; }
secret() { [ -f "$1" ] || openssl rand -hex 32 | tr -d '\n' > "$1"; chmod 0600 "$1"; }
public() { cp "$1" "$2"; chmod 0644 "$2"; }

# server_cert NAME SAN: NAME.key (0600) and NAME.pem signed by the CA, in folder NAME-dir
server_cert() {
  local dir="$1" name="$2" san="$3"
  if [ ! -f "$dir/$name.pem" ]; then
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-384 -sha384 -nodes -keyout "$dir/$name.key" \
      -out "$dir/$name.csr" -subj "/CN=$name" 2>/dev/null
    # an ECDSA key signs the (EC)DHE handshake: digitalSignature only (keyEncipherment is RSA's)
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' \
      "$san" > "$dir/$name.ext"
    openssl x509 -req -in "$dir/$name.csr" -CA "$out/ca/ca.crt" -CAkey "$out/ca/ca.key" \
      -CAcreateserial -days 365 -sha384 -extfile "$dir/$name.ext" -out "$dir/$name.pem" 2>/dev/null
    rm -f "$dir/$name.csr" "$dir/$name.ext"
  fi
  chmod 0600 "$dir/$name.key"
  chmod 0644 "$dir/$name.pem"
}

mkdir -p "$out"
chmod 0755 "$out"
private_dir "$out/ca"
if [ ! -f "$out/ca/ca.crt" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-384 -sha384 -days 365 -nodes -keyout "$out/ca/ca.key" \
    -out "$out/ca/ca.crt" -subj "/CN=adaptfl-ca" 2>/dev/null
fi
chmod 0600 "$out/ca/ca.key"
public "$out/ca/ca.crt" "$out/ca.crt"

private_dir "$out/superlink"
public "$out/ca.crt" "$out/superlink/ca.crt"
server_cert "$out/superlink" server "DNS:localhost,IP:127.0.0.1,DNS:superlink$extra_san"
secret "$out/superlink/superexec.secret"

private_dir "$out/fleet-proxy"
public "$out/ca.crt" "$out/fleet-proxy/ca.crt"
server_cert "$out/fleet-proxy" fleet-proxy "DNS:localhost,IP:127.0.0.1,DNS:fleet-proxy$extra_san"

private_dir "$out/superexec-serverapp"
public "$out/ca.crt" "$out/superexec-serverapp/ca.crt"
cp -p "$out/superlink/superexec.secret" "$out/superexec-serverapp/superexec.secret"

for i in $(seq 1 "$num_nodes"); do
  node="$out/supernode-$i"
  private_dir "$node"
  public "$out/ca.crt" "$node/ca.crt"
  if [ ! -f "$node/supernode.key" ]; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode-$i" -f "$node/supernode.key"
    mv "$node/supernode.key.pub" "$node/supernode.pub"
  fi
  chmod 0600 "$node/supernode.key"
  chmod 0644 "$node/supernode.pub"
  secret "$node/superexec.secret"
  private_dir "$out/superexec-clientapp-$i"
  cp -p "$node/superexec.secret" "$out/superexec-clientapp-$i/superexec.secret"
done

# The operators' folder: nothing private, but 0700 like the others (the compose `operator`).
private_dir "$out/operator"
public "$out/ca.crt" "$out/operator/ca.crt"
for i in $(seq 1 "$num_nodes"); do
  public "$out/supernode-$i/supernode.pub" "$out/operator/supernode-$i.pub"
done

if [ -n "${KEY_OWNER:-}" ]; then
  for dir in "$out"/*/; do
    [ "$dir" = "$out/ca/" ] || chown -R "$KEY_OWNER" "$dir"
  done
fi
