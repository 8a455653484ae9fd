#!/bin/sh
# Regenerates the test certificates of the https:// tests (crates/remote/tests/it/tls.rs):
# a test CA, and a certificate it signs for 127.0.0.1 and localhost. Valid for a century, so
# that the tests do not start failing on a date. For tests only: the keys are public.
set -eu
cd "$(dirname "$0")"
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout ca.key \
  -out ca.pem -days 36500 -subj "/CN=countersign test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout server.key \
  -out server.csr -subj "/CN=countersign test tool server"
printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
  "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
  -days 36500 -extfile server.ext
openssl pkcs8 -topk8 -nocrypt -in server.key -out server.key.pk8 && mv server.key.pk8 server.key
rm -f server.csr server.ext ca.key ca.srl
