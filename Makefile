# countersign — the two commands that matter are `make demo` and `make test`.

DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
AMQP_ADDR ?= amqp://guest:guest@127.0.0.1:5672/%2f
export DATABASE_URL AMQP_ADDR
# The build uses the committed query cache in .sqlx/, never a live database.
export SQLX_OFFLINE := true

.PHONY: test demo bench chaos services fmt sqlx-prepare deny audit

## Runs formatting and lint checks, then every test against the real PostgreSQL.
test: services
	cargo fmt --all -- --check
	cargo deny --locked check licenses bans sources  # deny.toml; the advisories are `make audit`
	cargo clippy --workspace --all-targets -- -D warnings
	# No function of the shipped and dev code over 60 lines of code (clippy.toml); tests may be.
	cargo clippy --workspace --exclude countersign-e2e --lib --bins -- -D warnings -W clippy::too_many_lines
	cargo build --workspace --bins  # the end-to-end tests in tests/ run these binaries
	cargo test --workspace --no-fail-fast
	CHAOS_RUNS=$(CI_CHAOS_RUNS) cargo run --quiet -p countersign-e2e --bin countersign-chaos
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

## Runs the demonstration through the real services (coordinator, two workers, reaper) over
## RabbitMQ, in a throwaway database and queue prefix. KEEP=1 leaves them running.
demo: services
	cargo build --quiet -p countersign-cli -p countersign-dev -p countersign-coordinator -p countersign-worker -p countersign-reaper -p countersign-api --bins
	cargo run --quiet -p countersign-dev -- demo $(if $(KEEP),--keep)

CHAOS_RUNS ?= 200
CONCURRENCY_ROUNDS ?= 1000
CI_CHAOS_RUNS ?= 30

## Many approved runs while workers are killed or paused and a colleague edits the same element;
## exits non-zero unless no approved write was lost, duplicated or landed against unseen state.
## Then the pause and silence tests again with minute-long silences (`make test` runs 20 s ones),
## and every pair of the content store's writers against each other, CONCURRENCY_ROUNDS times
## each, while a colleague edits the site root: no deadlock, and the colleague never waits.
chaos: services
	cargo build --workspace --bins
	CHAOS_RUNS=$(CHAOS_RUNS) cargo run --quiet -p countersign-e2e --bin countersign-chaos
	COUNTERSIGN_E2E_SILENCE_SECS=60 cargo test -p countersign-e2e --test e2e silence::
	CONCURRENCY_ROUNDS=$(CONCURRENCY_ROUNDS) cargo test -p countersign-worker --test it concurrency -- --nocapture

## Prints the benchmark figures: the store and crypto, then runs through the services.
bench: services
	cargo run --release -p countersign-store --example bench
	cargo build --release --quiet -p countersign-dev -p countersign-worker -p countersign-coordinator --bins
	cargo run --release --quiet -p countersign-dev -- bench --runs 500

services:
	@scripts/services.sh

## Licences, banned and duplicate crates, sources (deny.toml): needs crates.io, nothing else.
deny:
	cargo deny --locked check licenses bans sources

## The RustSec advisories too; fetches the advisory database from GitHub, so it needs that.
audit:
	cargo deny --locked check advisories licenses bans sources

fmt:
	cargo fmt --all

## Rewrites the offline query cache from a scratch database migrated with migrations/ and
## crates/content/migrations/.
sqlx-prepare:
	scripts/sqlx-prepare.sh
