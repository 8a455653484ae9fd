# countersign — the two commands that matter are `make demo` and `make test`.

DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
AMQP_ADDR ?= amqp://guest:guest@127.0.0.1:5672/%2f
export DATABASE_URL AMQP_ADDR
# The build uses the committed query cache in .sqlx/, never a live database.
export SQLX_OFFLINE := true

.PHONY: test demo bench services fmt sqlx-prepare

## Runs formatting and lint checks, then every test against the real PostgreSQL.
test: services
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo build --workspace --bins  # the end-to-end tests in tests/ run these binaries
	cargo test --workspace --no-fail-fast
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

## Runs the demonstration end to end against the local PostgreSQL.
demo: services
	cargo run --quiet -p countersign-cli -- demo

## Prints the benchmark figures: the store and crypto, then runs through the services.
bench: services
	cargo run --release -p countersign-store --example bench
	cargo run --release --quiet -p countersign-cli -- bench --runs 500

services:
	@scripts/services.sh

fmt:
	cargo fmt --all

## Rewrites the offline query cache from a scratch database migrated with migrations/.
sqlx-prepare:
	scripts/sqlx-prepare.sh
