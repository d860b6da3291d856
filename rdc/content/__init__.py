"""What a byte stream becomes: chunks, leaves, Merkle trees, sketches, sub-chunks, and the
packed entry lists that travel. May import: rdc._native, rdc.params, rdc.errors."""
