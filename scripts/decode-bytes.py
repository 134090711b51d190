#!/usr/bin/env python3
"""Bytes a batch-1 decode step reads per op of the CUDA backend, and the HBM-time floor.

Prints the markdown tables of docs/cuda.md ("Decode step: bytes and the HBM floor") for
V4-Flash (43 layers: 2 window, 21 CSA, 20 HCA; ../shared/spec/CHECKPOINTS.md) and the
flash-proxy preset (make-tiny: V4-Flash layer dims, layers window/CSA/HCA/CSA, 32 experts).
Counts weight bytes as stored (FP8 + E8M0 per 128x128, MXFP4 + E8M0 per 32, BF16, F32) and
KV-cache bytes read at a given context; activations (a few hundred KB per step) are left out.

usage: scripts/decode-bytes.py [--context N]
"""
import argparse

H100, H200 = 3.35e12, 4.8e12  # HBM bytes/s
EFF = 0.8                     # "each kernel streams at 80% of the bandwidth"


def fp8(r, c):
    return r * c + -(-r // 128) * -(-c // 128)


def bf16(r, c):
    return 2 * r * c


def f32(r, c):
    return 4 * r * c


def mxfp4(r, c):
    return r * c // 2 + r * (c // 32)


def model(name):
    common = dict(D=4096, H=64, d=512, r=64, Qr=1024, G=8, Ro=1024, W=128, HI=64, dI=128, KI=512, V=129280, hc=4, k=6,
                  I=2048)
    if name == "V4-Flash":
        return dict(common, E=256, kinds=["window"] * 2 + ["csa", "hca"] * 20 + ["csa"], hca_ratio=128)
    return dict(common, E=32, kinds=["window", "csa", "hca", "csa"], hca_ratio=128)


def ops(m, ctx):
    """[(op, kind, bytes per layer of that kind)], then the head."""
    D, H, d, r, Qr, G, Ro = m["D"], m["H"], m["d"], m["r"], m["Qr"], m["G"], m["Ro"]
    HI, dI, hc, k, I, E = m["HI"], m["dI"], m["hc"], m["k"], m["I"], m["E"]
    M = (2 + hc) * hc
    kvb = (d - r) + (d - r) // 64 + 4 * r  # KvCodec bytes per cached vector
    ikb = dI // 2 + dI // 32               # Fp4Codec bytes per indexer key
    out = []
    for kind in ("window", "csa", "hca"):
        ratio = {"window": 0, "csa": 4, "hca": m["hca_ratio"]}[kind]
        o = [("hc_pre x2 (mixers F32)", 2 * f32(M, hc * D)),
             ("wq_a + wq_b (FP8)", fp8(Qr, D) + fp8(H * d, Qr)),
             ("wkv (FP8)", fp8(d, D))]
        if ratio:
            coff = 2 if ratio == 4 else 1
            o.append(("compressor wkv + wgate (BF16)", 2 * bf16(coff * d, D)))
        if kind == "csa":
            o.append(("indexer wq_b (FP8) + weights_proj (BF16) + compressor (BF16)",
                      fp8(HI * dI, Qr) + bf16(HI, D) + 2 * bf16(2 * dI, D)))
            o.append(("indexer scores: keys read", (ctx // 4) * ikb))
        entries = {"window": 0, "csa": min(m["KI"], ctx // 4), "hca": ctx // m["hca_ratio"]}[kind]
        o.append(("sparse_attention: window + entries read", (m["W"] + entries) * kvb))
        o.append(("wo_a + wo_b (FP8)", fp8(G * Ro, H * d // G) + fp8(D, G * Ro)))
        o.append(("gate (BF16)", bf16(E, D)))
        o.append(("routed experts: k x (w1 + w3 + w2) (MXFP4)", k * (2 * mxfp4(I, D) + mxfp4(D, I))))
        o.append(("shared expert w1 + w3 + w2 (FP8)", 2 * fp8(I, D) + fp8(D, I)))
        out += [(n, kind, b) for n, b in o]
    head = [("hc_head (F32) + head (BF16)", f32(hc, hc * D) + bf16(m["V"], D))]
    return out, head


def report(name, ctx):
    m = model(name)
    per, head = ops(m, ctx)
    count = {kind: m["kinds"].count(kind) for kind in ("window", "csa", "hca")}
    print(f"\n### {name}, batch 1, context {ctx} ({count['window']} window, {count['csa']} CSA, {count['hca']} HCA layers)\n")
    print("| op | layers | MB per layer | MB per step | H100 floor us | H200 floor us |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for n, kind, b in per:
        if count[kind] == 0:
            continue
        rows.setdefault(n, [0, 0, {}])
        rows[n][0] += b * count[kind]
        rows[n][1] += count[kind]
        rows[n][2][kind] = b
    total = 0
    for n, (b, layers, by_kind) in rows.items():
        per_layer = " / ".join(f"{v / 1e6:.2f}" for v in by_kind.values())
        total += b
        print(f"| {n} | {layers} | {per_layer} | {b / 1e6:.1f} | {b / H100 * 1e6:.1f} | {b / H200 * 1e6:.1f} |")
    for n, b in head:
        total += b
        print(f"| {n} | - | - | {b / 1e6:.1f} | {b / H100 * 1e6:.1f} | {b / H200 * 1e6:.1f} |")
    print(f"| **total** | | | **{total / 1e6:.0f}** | **{total / H100 * 1e6:.0f}** | **{total / H200 * 1e6:.0f}** |")
    print(f"\nPredicted batch-1 decode at {EFF:.0%} of the bandwidth: "
          f"H100 {EFF * H100 / total:.0f} tok/s, H200 {EFF * H200 / total:.0f} tok/s "
          f"(floor {H100 / total:.0f} / {H200 / total:.0f} tok/s).")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=4096)
    a = ap.parse_args()
    for name in ("flash-proxy", "V4-Flash"):
        report(name, a.context)


if __name__ == "__main__":
    main()
