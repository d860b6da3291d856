"""The wire: frames, the msgpack codec with peer-safe limits, typed messages, the handshake,
and conversations over one connection. docs/protocol.md is the normative text. May import:
rdc.local (paths), rdc.content and below."""

DEFAULT_PORT = 8730  # rdc://HOST/... without a port, and rdc serve without --listen
