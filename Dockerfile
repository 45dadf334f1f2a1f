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
# envoyproxy/ratelimit's image contract: Envoy Gateway runs `/bin/ratelimit` with no arguments,
# which under that name serves from the environment (src/main.rs). A second copy, not a link:
# the final image has no shell to make one, and COPY follows a symlink given as its source.
COPY --from=build /src/target/release/sluice /bin/ratelimit
# Default limits so `docker run` works; Kubernetes mounts the ConfigMap over this directory.
COPY deploy/base/limits /etc/sluice/limits
# distroless' `nonroot` user, numeric so Kubernetes' runAsNonRoot can verify it. Any other
# non-root user works too (Envoy Gateway runs 65534): sluice only reads its files, writes
# nothing to disk, and needs no capability, so a read-only root filesystem is fine.
USER 65532:65532
# gRPC (RLS, grpc.health.v1, reflection) and admin HTTP (/healthz, /readyz, /metrics).
EXPOSE 8081 9102
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice/limits", "--grpc-addr", "0.0.0.0:8081", "--admin-addr", "0.0.0.0:9102"]
