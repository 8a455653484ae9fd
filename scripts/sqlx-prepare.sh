#!/usr/bin/env bash
# Rewrites .sqlx/ (the offline query cache that lets the build run without a database):
# creates a scratch database, applies the engine's migrations/ and the content store's
# crates/content/migrations/ to it, and re-checks every crate with the
# sqlx macros online, which write one file per query.
set -euo pipefail
cd "$(dirname "$0")/.."
# SQLX_PREPARE_DB names the scratch database, so that two checkouts can prepare at once.
db=${SQLX_PREPARE_DB:-countersign_prepare}
psql -q -h 127.0.0.1 -U postgres -c "drop database if exists $db" -c "create database $db"
for m in migrations/*.sql crates/content/migrations/*.sql; do psql -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d "$db" -f "$m"; done
rm -rf .sqlx && mkdir .sqlx
touch crates/*/src/lib.rs
SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$PWD/.sqlx" DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" \
    cargo check --workspace --all-targets --quiet
psql -q -h 127.0.0.1 -U postgres -c "drop database $db"
echo "sqlx-prepare: $(ls .sqlx | wc -l) queries cached"
