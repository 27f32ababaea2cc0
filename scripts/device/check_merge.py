#!/usr/bin/env python3
"""Folds scripts/device/check_real.sh's JSON into scripts/device/check.sh's, so that one file
holds the whole CUDA check in the shape the backend issue asks for:

  {"commit", "gpu", "op_tests": {"passed", "failed"},
   "parity": {"fixtures": "pass"|"fail", "fixtures_detail": {...},
              "real_shapes": {name: {... "pass"}} | "not-run",
              "batch_invariance": {... "pass"} | "not-run",
              "restore": {case: {... "pass"}} | "not-run"},
   "memcheck": ..., ...}

usage: check_merge.py CHECK_JSON [REAL_JSON]   (CHECK_JSON is rewritten in place)
"""
import json
import sys


def merge(check, real):
    par = check.get("parity", {})
    if "fixtures" in par and isinstance(par.get("fixtures"), str) and par["fixtures"] in ("pass", "fail"):
        return check  # already merged
    detail = dict(par)
    ok = detail.get("failed", 1) == 0 and detail.get("passed", 0) > 0
    out = {"fixtures": "pass" if ok else "fail", "fixtures_detail": detail,
           "real_shapes": "not-run", "batch_invariance": "not-run", "restore": "not-run"}
    if real:
        rs = real.get("real_shapes") or {}
        if rs:
            out["real_shapes"] = rs
            out["real_shapes_pass"] = all(v.get("pass") == 1 for v in rs.values())
        bi = real.get("batch_invariance_32") or {}
        if "identical" in bi:
            out["batch_invariance"] = bi
            out["batch_invariance_default_mode"] = real.get("batch_invariance_32_default_mode", {})
        rest = real.get("restore") or {}
        if rest:
            out["restore"] = rest
            out["restore_pass"] = all(v.get("pass") == 1 for v in rest.values())
        out["criteria"] = real.get("criteria", {})
        if real.get("moe_diagnostics"):
            out["moe_diagnostics"] = real["moe_diagnostics"]
    check["parity"] = out
    return check


def main():
    path = sys.argv[1]
    real_path = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
    check = json.load(open(path))
    real = None
    if real_path:
        try:
            real = json.load(open(real_path))
        except (OSError, ValueError) as e:
            print("check_merge: cannot read %s: %s" % (real_path, e), file=sys.stderr)
    json.dump(merge(check, real), open(path, "w"), indent=2)


if __name__ == "__main__":
    main()
