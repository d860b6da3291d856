"""The protocol's logic: one-way and two-way sync, the per-file descent, source and target,
the server's side of a connection. No sockets, files or command line of its own: the
daemon and the client wire it up. May import: rdc.wire, rdc.local, rdc.content and below."""
