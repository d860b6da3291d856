"""The attack harness: a hostile client of the real ``rdc serve`` and the oracle that watches it.

It owns capturing real sessions (`capture`), the framing spoken by hand (`wire`), the seeded
mutator (`mutate`, `values`, `inputs`), playing inputs (`play`), the target world and its
checks (`world`, `oracle`), the fuzz loop and its report (`fuzzer`, `report`) and the
symlink races (`race`). It uses `rdc` (the wire's constants and encodings, signatures)
and `tests.e2e_support`, never the server's or the client's internals;
`tests/test_fuzz_protocol.py`, `tests/test_e2e_race.py`, `bench/fuzz.py` and
`bench/race.py` drive it.
"""
