#!/bin/sh
# The exporter's three Secrets, as YAML on standard output (nothing is written elsewhere):
#   deploy/components/exporter-web-config/make-secrets.sh | kubectl apply -f -
# A self-signed certificate for the exporter Service's name (its own CA: Prometheus checks the
# exporter against it), a random scrape password and its bcrypt hash in the exporter's web config.
# Needs openssl, kubectl and Python's bcrypt (pip install bcrypt; gpu-defrag depends on it).
# Options: NAMESPACE (default gpu-defrag-exporter), USERNAME (default prometheus),
# DAYS the certificate is valid (default 825).
set -eu
namespace=${NAMESPACE:-gpu-defrag-exporter}
username=${USERNAME:-prometheus}
days=${DAYS:-825}
python=${PYTHON:-python3}
dns="gpu-exporter.$namespace.svc"
mount=/etc/gpu-defrag/tls   # where components/exporter-web-config mounts gpu-exporter-tls

for tool in openssl kubectl "$python"; do
  command -v "$tool" >/dev/null || { echo "make-secrets.sh: error: $tool is not installed" >&2; exit 2; }
done
"$python" -c 'import bcrypt' 2>/dev/null ||
  { echo "make-secrets.sh: error: Python's bcrypt is missing: pip install bcrypt" >&2; exit 2; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
umask 077

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
  -days "$days" -subj "/CN=$dns" -addext "subjectAltName=DNS:$dns" \
  -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null
cp "$dir/tls.crt" "$dir/ca.crt"
openssl rand -hex 24 | tr -d '\n' > "$dir/password"
printf %s "$username" > "$dir/username"
hash=$("$python" -c 'import bcrypt, sys; print(bcrypt.hashpw(sys.stdin.buffer.read(), bcrypt.gensalt(10)).decode())' < "$dir/password")
cat > "$dir/web-config.yml" <<YAML
# gpu-defrag exporter --web.config.file (exporter-toolkit format), made by make-secrets.sh
tls_server_config:
  cert_file: $mount/tls.crt
  key_file: $mount/tls.key
basic_auth_users:
  $username: $hash
YAML

secret() {
  kubectl create secret generic "$@" --namespace "$namespace" --dry-run=client -o yaml |
    grep -v '^  creationTimestamp: null$'
}
secret gpu-exporter-tls --type kubernetes.io/tls \
  --from-file "tls.crt=$dir/tls.crt" --from-file "tls.key=$dir/tls.key" --from-file "ca.crt=$dir/ca.crt"
echo ---
secret gpu-exporter-web-config --from-file "web-config.yml=$dir/web-config.yml"
echo ---
secret gpu-exporter-scrape --from-file "username=$dir/username" --from-file "password=$dir/password"
