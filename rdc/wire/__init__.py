"""The wire: frames, the msgpack codec with peer-safe limits, and message schemas.

docs/protocol.md is the normative text; this package is its one implementation of the
encoding. Everything that crosses the connection goes through `rdc.wire.codec`.
"""
