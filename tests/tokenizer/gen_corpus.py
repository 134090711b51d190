#!/usr/bin/env python3
"""Generates the tokenizer test corpus deterministically (fixed seeds, no external data).

  python3 tests/tokenizer/gen_corpus.py corpus      > tests/tokenizer/corpus.json
  python3 tests/tokenizer/gen_corpus.py onig-cases  > tests/tokenizer/onig-cases.json

`corpus` is compared with the JavaScript reference (reference.mjs -> corpus-ids.json). It avoids
the two characters on which JavaScript's \\s differs from Oniguruma's (U+0085, U+FEFF) and any
character assigned after Unicode 14.0 (JS/ICU and Oniguruma 6.9.8 disagree on those).
`onig-cases` is checked against hf_reference.py (Oniguruma itself): short random strings over a
palette of boundary characters, including U+0085 and U+FEFF.
"""
import json
import random
import sys
import unicodedata

WORDS = """the of and to in is you that it he was for on are as with his they at be this have from
or one had by word but not what all were we when your can said there use an each which she do how
their if will up other about out many then them these so some her would make like him into time has
look two more write go see number no way could people my than first water been call who oil its now
find long down day did get come made may part over new sound take only little work know place year
live me back give most very after thing our just name good sentence man think say great where help
through much before line right too mean old any same tell boy follow came want show also around
form three small set put end does another well large must big even such because turn here why ask
went men read need land different home us move try kind hand picture again change off play spell air
away animal house point page letter mother answer found study still learn should America world
tokenizer inference engine DeepSeek model attention weight tensor kernel batch prefill decode cache
Hello World JSON GPU CPU API HTTP URL UTF-8 don't won't it's I'm you're we've they'll she'd
""".split()

CODE_SNIPPETS = [
    "#include <stdio.h>\nint main(void) {{\n\tprintf(\"%d\\n\", {n});\n\treturn 0;\n}}\n",
    "def {f}(x, y={n}):\n    if x > y:\n        return x ** 2\n    return [i for i in range(y) if i % 3 == 0]\n",
    "const {f} = async (req, res) => {{\n  const {{ id }} = req.params;\n  res.json({{ ok: true, id }});\n}};\n",
    "for (int i = 0; i < {n}; ++i) {{ sum += a[i] * b[i]; }}",
    "SELECT name, COUNT(*) AS n FROM users WHERE age >= {n} GROUP BY name ORDER BY n DESC;",
    "<div class=\"{f}\"><a href=\"https://example.com/{f}?q={n}&lang=en\">link</a></div>",
    "{{\"name\": \"{f}\", \"values\": [{n}, {n}.5, -1e-9], \"nested\": {{\"ok\": null}}}}",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  grep -c '{f}' \"$f\" || true\ndone\n",
    "std::vector<std::pair<int, std::string>> {f}; // TODO(me): reserve({n})\r\n",
    "fn {f}(v: &[u32]) -> Option<u32> {{ v.iter().copied().max() }}",
    "    @property\n    def {f}(self) -> int:\n        return self._{f}  # noqa: E501\n",
    "x = {n}; y = x << 2 | 0xFF & ~0b1010; z = (x != y) && !(x >= {n});",
    "git commit -m \"fix: {f} off-by-one\" && git push origin HEAD:refs/for/main",
    "$ ./{f} --threads={n} -v --out=/tmp/{f}.npy 2>&1 | tee log.txt",
    "if (err) {{\n\t\tconsole.error(`failed: ${{err.message}}`);\n\t\treturn;\n\t}}",
    "matrix = [[{n}, 0, 0], [0, {n}, 0], [0, 0, {n}]]\nprint(matrix[1][1])",
]

CJK_COMMON = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴切"
HIRAGANA = "".join(chr(c) for c in range(0x3041, 0x3097)) + "ゝゞ"
KATAKANA = "".join(chr(c) for c in range(0x30A1, 0x30FB)) + "ーヽヾ"
HALFWIDTH_KANA = "".join(chr(c) for c in range(0xFF66, 0xFF9E))
FULLWIDTH_PUNCT = "，。、！？；：「」『』（）【】《》〈〉…—～·“”‘’"
HANGUL = "".join(chr(c) for c in range(0xAC00, 0xD7A4, 37)) + "ㄱㄴㄷㄹㅁㅂㅅㅇㅈㅊㅋㅌㅍㅎㅏㅑㅓㅕ"
KOREAN_WORDS = ["안녕하세요", "감사합니다", "토크나이저", "한국어", "테스트", "사랑해요", "대한민국", "서울", "컴퓨터",
                "프로그래밍", "인공지능", "모델"]
ARABIC = ["مرحبا بالعالم", "السلام عليكم", "اللغة العربية جميلة", "كِتَابٌ", "مُحَمَّد", "٠١٢٣٤٥٦٧٨٩", "شكراً جزيلاً",
          "هذا اختبار للمحلل"]
HEBREW = ["שָׁלוֹם עוֹלָם", "עברית", "בְּרֵאשִׁית בָּרָא"]
HINDI = ["नमस्ते दुनिया", "हिन्दी भाषा", "क्षत्रिय", "१२३४५६७८९०", "श्री गणेशाय नमः", "कृत्रिम बुद्धिमत्ता"]
THAI = ["สวัสดีครับ", "ภาษาไทย", "ขอบคุณมากค่ะ", "๑๒๓๔๕", "กรุงเทพมหานคร", "ปัญญาประดิษฐ์"]
OTHER_SCRIPTS = ["Привет, мир!", "Ελληνικά γράμματα", "გამარჯობა", "Բարեւ", "ሰላም ለዓለም", "Tiếng Việt có dấu",
                 "Ølförråd på Ærø", "straße Großbuchstaben", "İstanbul ılık", "ĳsselmeer", "ﬁnancial ﬂow",
                 "தமிழ் மொழி", "বাংলা ভাষা", "ਪੰਜਾਬੀ", "ગુજરાતી", "ಕನ್ನಡ", "മലയാളം", "తెలుగు", "සිංහල", "ພາສາລາວ",
                 "မြန်မာ", "ខ្មែរ", "ᠮᠣᠩᠭᠣᠯ", "ᏣᎳᎩ", "ᚠᚢᚦᚨᚱᚲ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝐁𝐨𝐥𝐝 𝑖𝑡𝑎𝑙𝑖𝑐"]
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0303", "\u030A", "\u0336", "\u20DD", "\u20E3", "\u0489",
             "\u093F", "\u0903", "\u05B4", "\u064E", "\u0E31", "\u1AB0", "\uFE20", "\U0001D167"]
EMOJI = ["😀", "😂", "🥲", "🤖", "🚀", "✨", "🔥", "💯", "🎉", "🙏", "👍", "❤️", "☺️", "✔️", "⭐", "🌍", "🇺🇸", "🇯🇵",
         "🇩🇪", "🏳️‍🌈", "🏴‍☠️", "👨‍👩‍👧‍👦", "👩‍💻", "🧑‍🚀", "👨🏽‍🍳", "👋🏻", "👋🏿", "🤝🏼", "1️⃣", "#️⃣", "*️⃣", "©️",
         "™️", "🫠", "🥹", "🧠", "🦀", "🐍", "🍣", "⚽", "🏃‍♀️", "🧔‍♂️", "💁🏾‍♀️", "🏳️‍⚧️", "😶‍🌫️", "❤️‍🔥", "🐻‍❄️"]
SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
           "</think>", "<|EOT|>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜tool▁calls▁begin｜>",
           "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
           "<｜tool▁outputs▁begin｜>", "<｜tool▁output▁end｜>", "｜DSML｜", "<dsml:", "</dsml:", "<｜latest_reminder｜>",
           "<｜place▁holder▁no▁0｜>", "<｜place▁holder▁no▁17｜>", "<｜place▁holder▁no▁799｜>", "<｜image2｜>",
           "<｜/table>｜", "<｜table｜>", "<｜td｜>", "<｜/td｜>", "<｜tr｜>", "<｜search▁begin｜>", "<｜read_url｜>"]
NEAR_SPECIAL = ["<｜User", "User｜>", "<think", "think>", "</think", "<｜begin▁of▁sentence", "<｜▁pad▁", "<|EOT|",
                "<｜place▁holder▁no▁｜>", "<｜place▁holder▁no▁99999｜>", "<dsml", "｜DSML", "<｜", "｜>", "<|", "|>",
                "<<think>>", "<think >", "< think>", "<THINK>"]
SPACES = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\r\n\r\n", " \n", "\n ", " \t ",
          "\u00A0", "\u3000", "\u2009", "\u2002", "\u202F", "\u205F", "\u1680", "\u2028", "\u2029", "\x0b", "\x0c",
          "        ", "\n\n\n\n", " \r\n ", "\t\n\t"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "…", "—", "–", "«", "»", "¿", "¡", "§", "¶", "†", "•",
                                                     "©", "®", "°", "±", "×", "÷", "€", "£", "¥", "¢", "→", "⇒", "∀",
                                                     "∑", "√", "∞", "≠", "≤", "★", "♥", "♪", "☃", "〜", "〃", "※"]
NUMBERS_EXOTIC = ["０１２３４５６７８９", "²³¹", "½¾⅓", "Ⅻ", "ⅷ", "①②③", "⑽", "𝟘𝟙𝟚", "٣", "۳", "७", "๗", "᠓",
                  "〇", "〡〢〣", "𐌢", "𝍩"]

# Characters where JavaScript's \s and Oniguruma's \s disagree, and a palette of boundary cases.
JS_DIVERGENT = ["\u0085", "\uFEFF"]
PALETTE = (list("aZé ") + [" ", " ", "\t", "\n", "\r", "\u3000", "\u00A0", "1", "9", "٣", "²", "Ⅻ", ".", ",", "!",
                            "'", "\"", "#", "$", "-", "_", "<", ">", "(", "{", "|", "~", "…", "€", "→", "中", "の",
                            "ア", "ー", "ｱ", "한", "😀", "\u200D", "🏽", "\uFE0F", "\u20E3", "\u0301", "\u093F",
                            "ا", "ש", "ก", "\u0E31", "\x00", "\x1b", "\u200B", "\u2028", "\u00AD", "𝔘", "\uE000",
                            "<｜User｜>", "<think>", "<dsml:", "｜DSML｜"])


def assigned_in_14(s):
    for ch in s:
        if unicodedata.category(ch) == "Cn":
            raise ValueError("unassigned in Unicode %s: U+%04X" % (unicodedata.unidata_version, ord(ch)))
    return s


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def pick(self, xs):
        return xs[self.r.randrange(len(xs))]

    def words(self, n):
        out = []
        for i in range(n):
            w = self.pick(WORDS)
            if self.r.random() < 0.1:
                w = w.capitalize()
            if self.r.random() < 0.03:
                w = w.upper()
            out.append(w)
            if self.r.random() < 0.12:
                out[-1] += self.pick([",", ".", ";", ":", "!", "?", "'s", "...", " -", ")"])
        return " ".join(out)

    def number(self):
        k = self.r.random()
        if k < 0.5:
            return str(self.r.randrange(10 ** self.r.randint(1, 40)))
        if k < 0.7:
            return "%d.%0*d" % (self.r.randrange(10 ** self.r.randint(1, 8)), self.r.randint(1, 9),
                                self.r.randrange(10 ** 9) % 10 ** 9)
        if k < 0.8:
            return "{:,}".format(self.r.randrange(10 ** self.r.randint(4, 15)))
        if k < 0.9:
            return self.pick(["-", "+", "$", "€", "#", "v", "x", "0x"]) + str(self.r.randrange(10 ** 6))
        return self.pick(NUMBERS_EXOTIC)

    def cjk(self, n):
        return "".join(self.pick(CJK_COMMON) for _ in range(n))

    def english(self):
        s = self.words(self.r.randint(1, 40))
        return s[0].upper() + s[1:] + self.pick([".", "!", "?", "", "\n"])

    def code(self):
        t = self.pick(CODE_SNIPPETS)
        s = t.format(f=self.pick(["foo", "bar_baz", "computeLogits", "x1", "MAX_SIZE", "_private", "ÄpfelZähler"]),
                     n=self.r.randrange(10 ** self.r.randint(1, 6)))
        if self.r.random() < 0.3:
            s = s.replace("    ", "\t")
        if self.r.random() < 0.2:
            s = s.replace("\n", "\r\n")
        return s

    def chinese(self):
        parts = []
        for _ in range(self.r.randint(1, 6)):
            k = self.r.random()
            if k < 0.6:
                parts.append(self.cjk(self.r.randint(1, 20)))
            elif k < 0.8:
                parts.append(self.pick(FULLWIDTH_PUNCT))
            elif k < 0.9:
                parts.append(" " + self.words(self.r.randint(1, 3)) + " ")
            else:
                parts.append(self.number())
        return "".join(parts)

    def japanese(self):
        parts = []
        for _ in range(self.r.randint(2, 8)):
            k = self.r.random()
            if k < 0.35:
                parts.append("".join(self.pick(HIRAGANA) for _ in range(self.r.randint(1, 8))))
            elif k < 0.6:
                parts.append("".join(self.pick(KATAKANA) for _ in range(self.r.randint(1, 8))))
            elif k < 0.75:
                parts.append(self.cjk(self.r.randint(1, 4)))
            elif k < 0.85:
                parts.append("".join(self.pick(HALFWIDTH_KANA) for _ in range(self.r.randint(1, 6))))
            else:
                parts.append(self.pick(FULLWIDTH_PUNCT + "　"))
        return "".join(parts)

    def korean(self):
        parts = []
        for _ in range(self.r.randint(1, 8)):
            if self.r.random() < 0.6:
                parts.append(self.pick(KOREAN_WORDS))
            else:
                parts.append("".join(self.pick(HANGUL) for _ in range(self.r.randint(1, 5))))
        return self.pick([" ", "", ", "]).join(parts) + self.pick(["", ".", "?", "!"])

    def emoji(self):
        parts = []
        for _ in range(self.r.randint(1, 8)):
            k = self.r.random()
            if k < 0.6:
                parts.append(self.pick(EMOJI) * self.r.randint(1, 3))
            elif k < 0.8:
                parts.append(self.words(self.r.randint(1, 3)))
            else:
                parts.append(self.pick(SPACES[:6]))
        return self.pick(["", " "]).join(parts)

    def whitespace(self):
        parts = []
        for _ in range(self.r.randint(1, 10)):
            k = self.r.random()
            if k < 0.5:
                parts.append("".join(self.pick(SPACES) for _ in range(self.r.randint(1, 4))))
            elif k < 0.8:
                parts.append(self.words(self.r.randint(1, 3)))
            elif k < 0.9:
                parts.append(self.pick(PUNCT))
            else:
                parts.append(self.number())
        return "".join(parts)

    def numbers(self):
        parts = []
        for _ in range(self.r.randint(1, 6)):
            k = self.r.random()
            if k < 0.6:
                parts.append(self.number())
            elif k < 0.8:
                parts.append(self.pick(["abc", "x", "v", "th", "st", "px", "kg", "中", "号", "%", "°C", "e-"]))
            else:
                parts.append(self.pick([" ", ", ", "-", "/", ":", ".", "\n", " + ", " = "]))
        return "".join(parts)

    def punctuation(self):
        parts = []
        for _ in range(self.r.randint(1, 8)):
            k = self.r.random()
            if k < 0.5:
                parts.append("".join(self.pick(PUNCT) for _ in range(self.r.randint(1, 6))))
            elif k < 0.75:
                parts.append(self.pick(WORDS))
            elif k < 0.9:
                parts.append(self.pick([" ", "\n", "\r\n", "  ", "\t"]))
            else:
                parts.append(self.pick(["#include", ".com", "$var", "@user", "--flag", "'s", "...and", "/usr/bin",
                                        "->next", "::std", "?!?", "!!\n\n", "...\r\n", "),\n", "];\r\n\r\n"]))
        return "".join(parts)

    def special(self):
        parts = []
        for _ in range(self.r.randint(1, 8)):
            k = self.r.random()
            if k < 0.4:
                parts.append(self.pick(SPECIAL))
            elif k < 0.55:
                parts.append(self.pick(NEAR_SPECIAL))
            elif k < 0.85:
                parts.append(self.words(self.r.randint(1, 5)))
            else:
                parts.append(self.pick(SPACES[:12]))
        return "".join(parts)

    def combining(self):
        parts = []
        for _ in range(self.r.randint(1, 6)):
            k = self.r.random()
            base = self.pick(["e", "a", "o", "Z", " ", "1", ".", "中", "\n", "", "ा", "-", "😀"])
            if k < 0.7:
                parts.append(base + "".join(self.pick(COMBINING) for _ in range(self.r.randint(1, 5))))
            else:
                parts.append(self.words(self.r.randint(1, 2)))
        return self.pick(["", " "]).join(parts)

    def scripts(self):
        pool = ARABIC + HEBREW + HINDI + THAI + OTHER_SCRIPTS
        parts = [self.pick(pool) for _ in range(self.r.randint(1, 4))]
        if self.r.random() < 0.3:
            parts.append(self.number())
        if self.r.random() < 0.3:
            parts.append(self.words(2))
        return self.pick([" ", "", ", ", "\n"]).join(parts)

    def long_word(self):
        k = self.r.random()
        n = self.r.randint(50, 1500)
        if k < 0.2:
            return self.pick(["a", "ab", "xyz", "the", "中", "ア", "😀", "é"]) * (n // 4)
        if k < 0.4:
            letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
            return "".join(self.pick(letters) for _ in range(n))
        if k < 0.55:
            b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
            return "".join(self.pick(b64) for _ in range(n)) + "=="
        if k < 0.7:
            return "".join(self.pick("0123456789abcdef") for _ in range(n))
        if k < 0.85:
            return "https://" + "/".join(self.pick(WORDS).lower() for _ in range(n // 20)) + "?q=" + str(n)
        return "".join(self.pick(WORDS) for _ in range(n // 5))

    def mix(self, palette):
        return "".join(self.pick(palette) for _ in range(self.r.randint(1, 24)))

    def whitespace_runs(self):
        # long homogeneous or mixed whitespace runs, with and without a trailing word
        run = "".join(self.pick([" ", " ", " ", "\t", "\n", "\r\n", "\u3000"]) for _ in range(self.r.randint(2, 60)))
        return self.pick(["", "x", "中", "1", "!", " "]) + run + self.pick(["", "y", "\n", " ", "end"])


EDGE = ["", " ", "  ", "\n", "\r", "\r\n", "\t", "a", "A", "1", "12", "123", "1234", "!", "'", "\"", "中", "の", "ー",
        "한", "😀", "\u0301", "\u200D", "\u00A0", "\u3000", "\x00", "\x7f", "a\u0301", " \u0301", "\n\u0301",
        "1\u0301", "!a", "!!a", " !a", " a", "  a", "   a", "a ", "a  ", " \n", "\n ", " \n ", "a\n\nb", "a \n b",
        "'s", "'S", "I'm", "don't", "$100", "100$", "1,000", "1.5", "-1", "3.14159265358979", "0000000",
        "12345678901234567890", "abc123def", "x²", "H₂O", "٣٤", "<｜User｜>", "<｜User｜><｜User｜>", "a<｜User｜>b",
        " <｜User｜> ", "<think></think>", "<think>\n\n</think>\n\n", "<｜begin▁of▁sentence｜>", "<dsml:x>",
        "</dsml:x>", "｜DSML｜invoke", "<｜/table>｜", "hello\r\n\r\nworld", "\t\tindent", "tab\there", "end. ",
        "end.\n", "end.\r\n", "?\n\n\n", "...\n", "a.b.c", "www.example.com", "e-mail", "C++", "C#", ".NET", "#1",
        "@here", "~/path", "`code`", "«quote»", "“smart”", "‘single’", "…", "—dash—", "中文English混合", "日本語とEnglish",
        "カタカナー", "ｶﾀｶﾅ", "한국어English", "😀😀😀", "👨‍👩‍👧", "👍🏽", "🇺🇸🇯🇵", "1️⃣2️⃣", "ñ", "n\u0303",
        "Ａｂｃ", "１２３", "ｈｔｔｐ", "\u2028", "\u2029", "\x0b\x0c", "a\x00b", "\u200Bzero\u200Bwidth"]


def corpus():
    g = Gen(20240601)
    out = list(EDGE)
    plan = [(g.english, 320), (g.code, 220), (g.chinese, 220), (g.japanese, 160), (g.korean, 100), (g.emoji, 200),
            (g.whitespace, 200), (g.whitespace_runs, 80), (g.numbers, 200), (g.punctuation, 160), (g.special, 160),
            (g.combining, 110), (g.scripts, 160), (g.long_word, 45), (lambda: g.mix(PALETTE), 300)]
    for fn, n in plan:
        for _ in range(n):
            out.append(fn())
    for s in out:
        assigned_in_14(s)
        assert not any(ch in s for ch in JS_DIVERGENT)
    return out


def onig_cases():
    g = Gen(7)
    palette = PALETTE + JS_DIVERGENT * 4
    out = ["\u0085", "\uFEFF", "a\u0085b", "a\u0085\u0085b", "  \u0085x", "x\u0085\n", "\u0085\u0085",
           "a \uFEFFb", "\uFEFF\uFEFF", " \uFEFF", "\uFEFF ", "a\uFEFF\uFEFF b", "\uFEFF<｜User｜>\u0085",
           "word\u0085\u0085\u0085", "\u0085\r\n", "\r\n\u0085", "1\u0085 2", "!\u0085"]
    for _ in range(1500):
        out.append(g.mix(palette))
    for _ in range(200):
        out.append(g.whitespace_runs().replace("\t", g.pick(["\t", "\u0085", "\uFEFF"])))
    return out


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "corpus"
    data = corpus() if which == "corpus" else onig_cases()
    sys.stdout.write("[\n" + ",\n".join(json.dumps(s, ensure_ascii=False) for s in data) + "\n]\n")


if __name__ == "__main__":
    main()
