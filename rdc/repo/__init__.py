"""Backup repositories: snapshots of trees as deduplicated, delta-compressed, optionally
encrypted blobs in packs. May import rdc.storage, rdc.content, rdc.local, rdc.params, rdc.errors.
"""
