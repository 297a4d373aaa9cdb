# The `stephost` binary in a small image.
#
#   docker build -t stephost:local .
#   docker run --rm stephost:local --help
#
# Base images are pinned by tag. Pin them by digest too
# (`rust:1.95.0-slim-bookworm@sha256:…`) where you build: the digests could not
# be looked up when this file was written.

# ---- build ------------------------------------------------------------------
# The toolchain of rust-toolchain.toml (1.95.0). The image already has what the
# C parts of the build need (gcc and libc6-dev, for ring, the bundled SQLite,
# mimalloc and wasmtime's few C files): TLS is rustls on ring (no OpenSSL, no
# aws-lc, so no cmake), and nothing generates protobuf code at build time (no
# protoc). No extra packages are installed.
FROM rust:1.95.0-slim-bookworm AS build

# rust-toolchain.toml also asks for the wasm32-wasip2 target, clippy and
# rustfmt, which the host binary does not need; naming the toolchain here
# overrides the file, so rustup downloads none of them.
ENV RUSTUP_TOOLCHAIN=1.95.0

WORKDIR /src
# The whole workspace: cargo reads every member's manifest even for `-p`.
COPY . .

# The cache mounts (BuildKit) keep the registry and the compiled dependencies
# between builds (wasmtime alone takes minutes); the binary is copied out of
# the cached target folder in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release -p stephost --locked \
    && install -m 0755 target/release/stephost /usr/local/bin/stephost

# ---- runtime ----------------------------------------------------------------
# debian:bookworm-slim rather than distroless: the same glibc as the build
# stage, and a shell and coreutils for the programs a configuration may start
# (`kind = "command"` effects, MCP servers over stdio), which a distroless
# image cannot hold.
FROM debian:bookworm-slim

# ca-certificates: the machine's roots, read by `sslrootcert=system` in a
# PostgreSQL URL (rustls-native-certs, host/ledger-postgres/src/tls.rs) and by
# MCP servers over https:// (reqwest with rustls-platform-verifier). HTTP
# effects, models, webhooks and the OTLP exporter (ureq) carry their own roots
# (webpki-roots) and need none.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# A fixed, unprivileged user. Its home is the data folder: the SQLite ledger by
# default (`sqlite:stephost.db`, relative to the working directory) and the
# compiled-component cache (STEPHOST_CACHE_DIR). Both must be its own: the
# ledger is created 0600, and a cache folder that is not the user's own is not
# trusted.
RUN groupadd --system --gid 10001 stephost \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/stephost \
       --no-create-home --shell /usr/sbin/nologin stephost \
    && install -d -m 0700 -o 10001 -g 10001 /var/lib/stephost /var/lib/stephost/cache

COPY --from=build /usr/local/bin/stephost /usr/local/bin/stephost

ENV HOME=/var/lib/stephost \
    STEPHOST_CACHE_DIR=/var/lib/stephost/cache

USER 10001:10001
WORKDIR /var/lib/stephost
VOLUME ["/var/lib/stephost"]

# `stephost serve`: the API, the console, /healthz and /readyz.
EXPOSE 7070

ENTRYPOINT ["stephost"]
# Serves on every address of the container, so it needs API tokens
# (STEPHOST_API_TOKENS or STEPHOST_API_TOKENS_FILE, lines `NAME ROLE TOKEN`);
# without them it refuses to start (exit 2). Give another command for the rest
# (`worker`, `submit …`).
CMD ["serve", "--listen", "0.0.0.0:7070"]
