# syntax=docker/dockerfile:1
# One image with the five binaries; each container picks its own as its command
# (deploy/compose.yaml, deploy/kubernetes/). Build from the repository root:
#   docker build -t countersign .

# The build stage: the workspace's toolchain (rust-version in Cargo.toml or newer), the
# committed sqlx query cache instead of a database, the committed Cargo.lock.
FROM rust:1.89-bookworm AS build
WORKDIR /src
ENV SQLX_OFFLINE=true CARGO_TERM_COLOR=never
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        -p countersign-cli -p countersign-coordinator -p countersign-worker -p countersign-reaper \
        -p countersign-api \
 && mkdir -p /out \
 && cp target/release/countersign target/release/countersign-coordinator \
       target/release/countersign-worker target/release/countersign-reaper \
       target/release/countersign-api /out/

# The runtime stage: glibc and libgcc only (TLS roots are compiled in), no shell, and a
# non-root user given by number (distroless's nonroot, 65532): the kubelet refuses
# `runAsNonRoot` for an image whose user is a name it cannot check without a passwd file. The demo's agent configuration and model script come along so
# that compose can run the demo agent; a real deployment names its own.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
COPY deploy/agents/ /usr/share/countersign/agents/
COPY crates/cli/demo/ /usr/share/countersign/demo/
USER 65532:65532
ENV RUST_LOG=info RUST_LOG_FORMAT=json
CMD ["countersign", "--help"]
