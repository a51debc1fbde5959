#!/usr/bin/env python3
"""Checks a `flashtune export --format t4` file against the published T4 results schema.

usage: t4_export.py SCHEMA EXPORT.json STORE.db FAMILIES.json

- the JSON schema (tests/data/t4/results-schema.json, T4 1.0.0), with the Draft 2020-12 validator;
- the newer draft's stricter points: correctness 0 or 1, runtimes of numbers, metadata.timeunit;
- the mapping from the store: one result per stored row, per-status counts, invalidity and correctness
  from the status, configuration = exactly the family's tunables, the time objective = the median.
Exit 1 with the first problem; a missing validator is a failure, never a skip.
"""
import json
import sqlite3
import sys

try:
    import jsonschema
except ImportError:
    print("FAIL: python3 cannot import jsonschema, which validates the T4 export "
          "(scripts/setup.sh installs it: python3 -m pip install jsonschema)")
    sys.exit(1)

INVALIDITY = {"ok": "correct", "invalid": "correctness", "compile_error": "compile", "pruned": "constraints",
              "timeout": "timeout", "crashed": "runtime", "launch_error": "runtime", "error": "runtime"}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    schema_path, export_path, db_path, families_path = sys.argv[1:5]
    schema = json.load(open(schema_path))
    doc = json.load(open(export_path))
    tunables = {f["name"]: [p["name"] for p in f["params"]] for f in json.load(open(families_path))}

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        fail(f"{export_path}: {len(errors)} schema errors; first at {list(e.path)}: {e.message[:300]}")
    # The newer draft (AutoTuningAssociation's T4.json) on top: stricter types.
    if doc["metadata"].get("timeunit") not in ("nanoseconds", "microseconds", "milliseconds", "seconds"):
        fail("metadata.timeunit is not one of the draft's units")

    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    stored = dict(con.execute("select status, count(*) from results group by status").fetchall())
    results = doc["results"]
    if len(results) != sum(stored.values()):
        fail(f"{len(results)} results exported, the store holds {sum(stored.values())}")
    counts = {}
    for i, r in enumerate(results):
        ft = r["flashtune"]
        status = ft["status"]
        counts[status] = counts.get(status, 0) + 1
        if r["correctness"] not in (0, 1) or r["correctness"] != (status == "ok"):
            fail(f"results[{i}]: correctness {r['correctness']} for status {status}")
        if r["invalidity"] != INVALIDITY[status]:
            fail(f"results[{i}]: invalidity {r['invalidity']} for status {status}")
        if list(r["configuration"]) != tunables[ft["family"]]:
            fail(f"results[{i}]: configuration {list(r['configuration'])} is not {ft['family']}'s tunables")
        if not all(isinstance(v, int) for v in r["configuration"].values()):
            fail(f"results[{i}]: configuration values must be integers")
        runtimes = r["times"]["runtimes"]
        if not all(isinstance(x, (int, float)) for x in runtimes):
            fail(f"results[{i}]: runtimes must be numbers")
        m = {x["name"]: x for x in r["measurements"]}
        if status == "ok":
            if runtimes != [m["time"]["value"]] or m["time"]["unit"] != "ms" or "tflops" not in m:
                fail(f"results[{i}]: an ok result needs runtimes [time] in ms and tflops")
            if r["objectives"] != ["time", "tflops"]:
                fail(f"results[{i}]: objectives {r['objectives']}")
        elif runtimes:
            fail(f"results[{i}]: a {status} result has runtimes")
        for key in ("problem", "device", "kernel_hash", "nvrtc_version", "seed"):
            if key not in ft:
                fail(f"results[{i}]: flashtune.{key} is missing")
    if counts != stored:
        fail(f"exported statuses {counts}, stored {stored}")
    print(f"{export_path}: {len(results)} results valid against the T4 schema, statuses {counts}")


main()
