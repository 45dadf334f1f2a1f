# syntax=docker/dockerfile:1
# sluice's container image. The build stage runs CI's build step (`cargo build --locked`, in
# release mode); scripts/ci/check_deploy.py checks the paths, ports and flags below against the
# binary and the manifests in deploy/, since CI has no Docker engine to build this file.

FROM rust:1.89-bookworm AS build
WORKDIR /src
# Only what the build reads: a change to docs or deploy/ does not rebuild. Cargo reads every
# workspace member's manifest even to build one package, so tools/ (the benchmark tools, not
# built here) comes along.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
COPY tools ./tools
RUN cargo build --release --locked --bin sluice

# distroless/cc: glibc and libgcc for the Rust binary, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/sluice /usr/local/bin/sluice
# Default limits so `docker run` works; Kubernetes mounts the ConfigMap over this directory.
COPY deploy/base/limits /etc/sluice/limits
# distroless' `nonroot` user, numeric so Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
# gRPC (RLS, grpc.health.v1, reflection) and admin HTTP (/healthz, /readyz, /metrics).
EXPOSE 8081 9102
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice/limits", "--grpc-addr", "0.0.0.0:8081", "--admin-addr", "0.0.0.0:9102"]
