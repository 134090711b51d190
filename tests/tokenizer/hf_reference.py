#!/usr/bin/env python3
"""A second, independent reference for the DeepSeek-V4 tokenizer, following HF `tokenizers`
step by step with the regex engine HF itself uses (Oniguruma, via onig.py / libonig.so.5):

  added tokens (non-normalized, then normalized; leftmost-longest) -> the pre_tokenizer's
  Split(Regex, Isolated) steps run by Oniguruma on each piece -> ByteLevel -> BPE (the classic
  lowest-rank-leftmost merge loop).

The JavaScript reference (reference.mjs) differs from HF in its \\s class (JS \\s has U+FEFF and
lacks U+0085, Oniguruma's is Unicode White_Space), so strings with those characters are
checked against this one (onig-cases.json).

Usage: python3 tests/tokenizer/hf_reference.py TOKENIZER_JSON CORPUS_JSON > ids.json
"""
import json
import sys

import onig


def bytes_to_unicode():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class Reference:
    def __init__(self, path):
        t = json.load(open(path, encoding="utf-8"))
        m = t["model"]
        assert m["type"] == "BPE" and not m.get("byte_fallback") and not m.get("ignore_merges")
        self.vocab = m["vocab"]
        self.ranks = {}
        for i, e in enumerate(m["merges"]):
            a, b = e.split(" ") if isinstance(e, str) else e
            self.ranks[(a, b)] = i
        self.added_raw, self.added_norm = {}, {}
        for a in t["added_tokens"]:
            assert not (a["lstrip"] or a["rstrip"] or a["single_word"]), "flags not implemented here"
            (self.added_norm if a["normalized"] else self.added_raw)[a["content"].encode()] = a["id"]
        steps = t["pre_tokenizer"]["pretokenizers"]
        self.splits = [onig.Regex(s["pattern"]["Regex"]) for s in steps if s["type"] == "Split"]
        assert steps[-1]["type"] == "ByteLevel" and steps[-1]["use_regex"] is False
        self.b2u = bytes_to_unicode()

    @staticmethod
    def split_added(data, table):
        """[(bytes, id or None)], leftmost-longest."""
        lengths = sorted({len(k) for k in table}, reverse=True)
        out, done, pos = [], 0, 0
        while pos < len(data):
            for n in lengths:
                if data[pos:pos + n] in table:
                    if done < pos:
                        out.append((data[done:pos], None))
                    out.append((data[pos:pos + n], table[data[pos:pos + n]]))
                    pos = done = pos + n
                    break
            else:
                pos += 1
        if done < len(data):
            out.append((data[done:], None))
        return out

    @staticmethod
    def isolated(regex, piece):
        out, prev = [], 0
        for s, e in regex.find_iter(piece):
            if prev < s:
                out.append(piece[prev:s])
            out.append(piece[s:e])
            prev = e
        if prev < len(piece):
            out.append(piece[prev:])
        return out

    def bpe(self, piece):
        word = [self.b2u[b] for b in piece]
        while len(word) > 1:
            best, at = None, -1
            for i in range(len(word) - 1):
                r = self.ranks.get((word[i], word[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            word[at:at + 2] = [word[at] + word[at + 1]]
        return [self.vocab[w] for w in word]

    def encode(self, text):
        ids = []
        for part, tid in self.split_added(text.encode("utf-8"), self.added_raw):
            if tid is not None:
                ids.append(tid)
                continue
            for seg, tid2 in self.split_added(part, self.added_norm):
                if tid2 is not None:
                    ids.append(tid2)
                    continue
                pieces = [seg]
                for regex in self.splits:
                    pieces = [p for piece in pieces for p in self.isolated(regex, piece)]
                for p in pieces:
                    ids.extend(self.bpe(p))
        return ids


def main():
    ref = Reference(sys.argv[1])
    corpus = json.load(open(sys.argv[2], encoding="utf-8"))
    lines = [json.dumps(ref.encode(s), separators=(",", ":")) for s in corpus]
    sys.stdout.write("[\n" + ",\n".join(lines) + "\n]\n")


if __name__ == "__main__":
    main()
