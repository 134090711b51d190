#!/usr/bin/env python3
"""Checks the classes of gen_unicode_tables.py against the system Oniguruma (libonig.so.5),
code point by code point: the classes must equal what Oniguruma's \\p{L} \\p{M} \\p{N}
\\p{P} \\p{S} and \\s match. Prints the differences and exits 1 if any."""
import bisect
import sys

import onig
from gen_unicode_tables import char_class, NAMES, LETTER, MARK, NUMBER, PUNCT, SYMBOL, SPACE


def main() -> int:
    cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    data = bytearray()
    offsets = []
    for cp in cps:
        offsets.append(len(data))
        data += chr(cp).encode("utf-8")
    data = bytes(data)
    onig_class = {}
    for cls, pat in [(LETTER, r"\p{L}+"), (MARK, r"\p{M}+"), (NUMBER, r"\p{N}+"), (PUNCT, r"\p{P}+"),
                     (SYMBOL, r"\p{S}+"), (SPACE, r"\s+")]:
        for s, e in onig.Regex(pat).find_iter(data):
            i = bisect.bisect_left(offsets, s)
            while i < len(offsets) and offsets[i] < e:
                if cps[i] in onig_class:
                    print("U+%04X in two classes" % cps[i])
                onig_class[cps[i]] = cls
                i += 1
    bad = 0
    for cp in cps:
        a = char_class(cp)
        b = onig_class.get(cp, 0)
        if a != b:
            bad += 1
            if bad < 50:
                print("U+%04X python=%s oniguruma=%s" % (cp, NAMES[a], NAMES[b]))
    print("oniguruma %s: %d differences" % (onig.VERSION, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
