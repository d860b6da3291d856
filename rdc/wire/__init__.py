"""The wire: frames, the msgpack codec with peer-safe limits, typed messages, the handshake,
and conversations over one connection. docs/protocol.md is the normative text. May import:
rdc.local (paths), rdc.content and below."""
