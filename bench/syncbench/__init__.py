"""Support for bench/sync_vs_rsync.py: measured processes, trees, the rdc and rsync runs,
the delta bound, the frame tally and the report. Not a library: bench scripts only."""
