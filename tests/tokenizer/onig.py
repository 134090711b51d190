"""Minimal ctypes binding to the system Oniguruma (libonig.so.5), the regex engine
Hugging Face tokenizers uses (through the Rust `onig` crate) for Split(Regex) patterns.

Used only by developer scripts (hf_reference.py, check_unicode_tables.py); the C++
tests never need it. Debian: `apt-get install libonig5`.
"""
import ctypes

ONIG_MISMATCH = -1


class _Region(ctypes.Structure):
    _fields_ = [("allocated", ctypes.c_int), ("num_regs", ctypes.c_int),
                ("beg", ctypes.POINTER(ctypes.c_int)), ("end", ctypes.POINTER(ctypes.c_int)),
                ("history_root", ctypes.c_void_p)]


class _ErrorInfo(ctypes.Structure):
    _fields_ = [("enc", ctypes.c_void_p), ("par", ctypes.c_void_p), ("par_end", ctypes.c_void_p)]


_lib = ctypes.CDLL("libonig.so.5")
_lib.onig_version.restype = ctypes.c_char_p
_ENC_UTF8 = ctypes.addressof(ctypes.c_char.in_dll(_lib, "OnigEncodingUTF8"))
_SYNTAX_DEFAULT = ctypes.c_void_p.in_dll(_lib, "OnigDefaultSyntax").value
_encs = (ctypes.c_void_p * 1)(_ENC_UTF8)
_lib.onig_initialize(_encs, 1)
_lib.onig_new.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                          ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_ErrorInfo)]
_lib.onig_search.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                             ctypes.c_char_p, ctypes.POINTER(_Region), ctypes.c_uint]
_lib.onig_region_new.restype = ctypes.POINTER(_Region)
_lib.onig_region_free.argtypes = [ctypes.POINTER(_Region), ctypes.c_int]

VERSION = _lib.onig_version().decode()


class Regex:
    def __init__(self, pattern: str):
        pat = pattern.encode("utf-8")
        self._pat = ctypes.create_string_buffer(pat, len(pat))
        self._reg = ctypes.c_void_p()
        einfo = _ErrorInfo()
        base = ctypes.addressof(self._pat)
        r = _lib.onig_new(ctypes.byref(self._reg), ctypes.c_char_p(base), ctypes.c_char_p(base + len(pat)),
                          0, _ENC_UTF8, _SYNTAX_DEFAULT, ctypes.byref(einfo))
        if r != 0:
            raise ValueError("onig_new failed: %d" % r)
        self._region = _lib.onig_region_new()

    def find_iter(self, data: bytes):
        """Yields (start, end) byte offsets like onig::Regex::find_iter (empty matches skip a char)."""
        buf = ctypes.create_string_buffer(data, len(data))
        base = ctypes.addressof(buf)
        n = len(data)
        pos = 0
        last_end = None
        while pos <= n:
            r = _lib.onig_search(self._reg, ctypes.c_char_p(base), ctypes.c_char_p(base + n),
                                 ctypes.c_char_p(base + pos), ctypes.c_char_p(base + n), self._region, 0)
            if r < 0:
                break
            s, e = self._region.contents.beg[0], self._region.contents.end[0]
            if s == e and last_end == e:
                # empty match right after the previous match: step over one UTF-8 char
                pos = e + 1
                while pos < n and (data[pos] & 0xC0) == 0x80:
                    pos += 1
                continue
            yield (s, e)
            last_end = e
            if e == s:
                pos = e + 1
                while pos < n and (data[pos] & 0xC0) == 0x80:
                    pos += 1
            else:
                pos = e

    def full_match(self, data: bytes) -> bool:
        for s, e in self.find_iter(data):
            return s == 0 and e == len(data)
        return False
