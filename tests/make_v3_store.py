#!/usr/bin/env python3
"""Rewrites a flashtune store in place as schema 3 wrote it (the tests' older store): results without
the columns later schemas added (inputs 4, origin 5, heads_k 6), no provenance table, no origin columns,
meta at '3', no application_id, one file (no WAL).

usage: make_v3_store.py DB
"""
import sqlite3
import sys

LATER_RESULTS_COLUMNS = ("inputs", "origin", "heads_k")

c = sqlite3.connect(sys.argv[1])
cols = [r[1] for r in c.execute("pragma table_info(results)") if r[1] not in LATER_RESULTS_COLUMNS]
c.executescript(f"""create table r3 as select {','.join(cols)} from results; drop table results;
  alter table r3 rename to results; drop table provenance; alter table kernels drop column origin;
  alter table experiment_runs drop column origin; update meta set value='3'; pragma application_id=0;
  pragma journal_mode=delete;""")
c.commit()
