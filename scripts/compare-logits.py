#!/usr/bin/env python3
"""Compares two float32 logit arrays [T, vocab] (.npy) row by row, as tests/test_golden.cpp does:
median and max relative L2 error per position and the argmax agreement. With a golden case.json
the case's "pass" thresholds decide the exit status (1 when one is missed); with --mtp, the MTP
block's logits against expected-mtp.npy: the case's "mtp"."pass" thresholds, its
exclude_positions rows left out of all three figures (tests/test_engine.cpp EngineMtp.GoldenLogits);
with --max-rel R only the max is checked. Standard library only (the device machines may lack numpy).

  compare-logits.py GOT.npy WANT.npy [--case case.json [--mtp] | --max-rel R] [--label NAME]
"""
import argparse, ast, array, json, math, struct, sys


def read_npy_f32(path):
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            sys.exit(f"{path}: not a .npy file")
        major = f.read(2)[0]
        hlen = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))[0]
        header = ast.literal_eval(f.read(hlen).decode("latin1"))
        if header["descr"] != "<f4" or header["fortran_order"] or len(header["shape"]) != 2:
            sys.exit(f"{path}: expected a C-order float32 [T, vocab] array, got {header}")
        data = array.array("f")
        data.frombytes(f.read())
    return header["shape"], data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("got")
    ap.add_argument("want")
    ap.add_argument("--case")
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--max-rel", type=float)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    (T, V), got = read_npy_f32(a.got)
    shape_w, want = read_npy_f32(a.want)
    if (T, V) != tuple(shape_w):
        print(f"{a.label}: shape {(T, V)} != {tuple(shape_w)}")
        return 1
    passes, excluded = None, set()
    if a.case:
        cs = json.load(open(a.case))
        passes = cs["mtp"]["pass"] if a.mtp else cs["pass"]
        excluded = set(passes.get("exclude_positions", []))
    errs, agree = [], 0
    for t in range(T):
        g, w = got[t * V:(t + 1) * V], want[t * V:(t + 1) * V]
        if not all(math.isfinite(x) for x in g):
            print(f"{a.label}: non-finite logit at position {t}")
            return 1
        if t in excluded:
            continue
        num = sum((x - y) ** 2 for x, y in zip(g, w))
        den = sum(y * y for y in w)
        errs.append(math.sqrt(num) / max(math.sqrt(den), 1e-30))
        agree += max(range(V), key=g.__getitem__) == max(range(V), key=w.__getitem__)
    s = sorted(errs)
    median, mx, pct = s[len(s) // 2], s[-1], 100.0 * agree / len(s)
    note = f" ({len(excluded)} rows excluded)" if excluded else ""
    print(f"{a.label}: median rel L2 {median:.3g}, max {mx:.3g}, argmax {pct:.1f}%{note}")
    ok = True
    if passes:
        p = passes
        ok = median <= p["median_rel_l2"] and mx <= p["max_rel_l2"] and pct >= p["argmax_pct"]
    if a.max_rel is not None:
        ok = ok and mx <= a.max_rel
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
