#!/usr/bin/env python3
"""prepare_corpus.py — the demo model's English corpus, from Debian packages.

Downloads a few Debian packages whose licences allow it (see
data/demo/LICENSES.md), unpacks them into a temporary folder with
`dpkg -x` (no root install, nothing left behind), turns their text into
plain English documents and splits those, deterministically, into

    train.txt        documents separated by one blank line
    heldout.txt      the same format; about 3% of the documents
    train_chat.jsonl a quarter of the training documents as one-turn chats
                     ({"user": ..., "assistant": ...}, one per line)
    SOURCES.txt      package versions, .deb SHA-256s, counts, output SHA-256s

Every document is NFC-normalised UTF-8 with no blank line inside it (single
newlines are kept where they carry meaning: verse, attributions), so the
files split on "\\n\\n". A document goes to heldout.txt when the first 8 bytes
of SHA-256(source tag + "\\n" + text), as an integer, modulo 10000 are below
300; both files list documents in the order of that hash, which mixes the
sources. Running the script twice, or on another machine with the same
package versions, gives byte-identical files (SOURCES.txt records their
SHA-256s).

Usage:
    python3 training/prepare_corpus.py --out DIR [--xz] [--debs DEBDIR]

--xz writes DIR/*.xz instead (what data/demo/ holds: the same bytes once
decompressed, SOURCES.txt gives their SHA-256s); --debs uses .deb files
already in DEBDIR instead of `apt-get download` (which needs `apt-get
update` to have run once). Standard library only.
"""
import argparse
import base64
import codecs
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata

# Package versions of Debian 12 (bookworm); another version is used with a
# warning (the output then differs, and SOURCES.txt says so).
PACKAGES = {
    "fortunes-min": "1:1.99.1-7.3",
    "fortunes": "1:1.99.1-7.3",
    "wordnet-base": "1:3.0-37",
    "dict-jargon": "4.4.7-3.1",
    "miscfiles": "1.5+dfsg-4",
}

FORTUNE_DIR = "usr/share/games/fortunes"
# fortunes-min's three files and the fortunes package's categories that read
# as English prose or verse. Left out: art/ascii-art (pictures), debian,
# linux, linuxcookie, perl (shell and code), knghtbrd (IRC logs), zippy
# (non sequiturs), translate-me, disclaimer, pratchett (tiny), and ethnic,
# men-women, drugs (stereotype and drug jokes: not what a demo should say).
# Debian ships the offensive fortunes in a separate package (fortunes-off)
# that is not used; any off/ folder is skipped as well.
FORTUNE_FILES = {
    "fortunes-min": ["fortunes", "literature", "riddles"],
    "fortunes": [
        "computers", "cookie", "definitions", "education", "food", "goedel", "humorists", "kids", "law", "love",
        "magic", "medicine", "miscellaneous", "news", "paradoxum", "people", "pets", "platitudes", "politics",
        "science", "songs-poems", "sports", "startrek", "tao", "wisdom", "work",
    ],
}

HELDOUT_PER_10000 = 300
CHAT_PER_10000 = 2500
MAX_DOC_CHARS = 3000
MIN_DOC_CHARS = 20

# Words whose presence drops a document (slurs and the crudest profanity),
# written in ROT13 so the list does not itself read as a list of slurs.
BLOCKED = {codecs.decode(w, "rot13") for w in (
    "avttre avttref avttre'f avtte avtenf avttnf avttnu pbba pbbaf fcvp fcvpf puvax puvaxf tbbx tbbxf jbc jbcf "
    "xvxr xvxrf snt sntf snttbg sntbtf qlxr qlxrf ergneq erganeqf genaal funagl juber jubere fyhg fyhgf phag phagf "
    "shpx shpxf shpxvat shpxrq zbgureshpxre pbpx pbpxf qvpxf chffl gjng jnax jnaxre ovgpu ovgpurf fuvg fuvgf "
    "encr encrq encvat encvfg cbeab cbeabtencul betnfz zbyrfg zbyrfgre zbyrfgrq".split())}

TYPOGRAPHY = str.maketrans({
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'", "\u2014": "--", "\u2013": "-",
    "\u2026": "...", "\u00a0": " ", "\u2122": "(TM)", "\t": " ",
})


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------- packages

def fetch_packages(work, debs_dir):
    """Download (or find) each package's .deb and unpack it; returns
    {package: (root folder, version, sha256 of the .deb)}."""
    got = {}
    dl = os.path.join(work, "debs")
    os.makedirs(dl, exist_ok=True)
    for pkg, version in PACKAGES.items():
        deb = None
        if debs_dir:
            cands = sorted(f for f in os.listdir(debs_dir) if f.startswith(pkg + "_") and f.endswith(".deb"))
            if cands:
                deb = os.path.join(debs_dir, cands[-1])
        if not deb:
            for spec in (f"{pkg}={version}", pkg):
                r = subprocess.run(["apt-get", "download", spec], cwd=dl, capture_output=True, text=True)
                if r.returncode == 0:
                    break
                log(f"apt-get download {spec}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'failed'}")
            else:
                sys.exit(f"prepare_corpus: cannot download {pkg} (run `apt-get update` first?)")
            deb = os.path.join(dl, sorted(f for f in os.listdir(dl) if f.startswith(pkg + "_"))[-1])
        fields = subprocess.run(["dpkg-deb", "-f", deb, "Version"], capture_output=True, text=True, check=True)
        found = fields.stdout.strip()
        if found != version:
            log(f"warning: {pkg} is version {found}, not {version}: the corpus will differ from data/demo/")
        root = os.path.join(work, "x", pkg)
        os.makedirs(root, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
        with open(deb, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        got[pkg] = (root, found, sha)
    return got


# --------------------------------------------------------------- cleaning

def clean_text(s):
    """Typography to ASCII where English has an ASCII spelling, overstrike
    (X BACKSPACE X) removed, NFC, spaces collapsed, lines right-trimmed."""
    s = re.sub(r".\x08", "", s)
    s = unicodedata.normalize("NFC", s.translate(TYPOGRAPHY))
    lines = [re.sub(r" {2,}", " ", ln).rstrip() for ln in s.split("\n")]
    s = "\n".join(lines).strip()
    return re.sub(r"\n{2,}", "\n", s)


def letter_ratio(s):
    if not s:
        return 0.0
    return sum(1 for c in s if c.isalpha() or c == " ") / len(s)


def acceptable(doc):
    """Reads as English text: no control characters, no replacement
    characters, mostly letters, no drawing lines, no blocked word, a sane
    length, no ChatML markers."""
    if not (MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS):
        return False
    if "\ufffd" in doc or "<|" in doc or "|>" in doc:
        return False
    if any(unicodedata.category(c) == "Cc" and c != "\n" for c in doc):
        return False
    if sum(1 for c in doc if ord(c) > 127) > 4:
        return False
    if letter_ratio(doc) < 0.78:
        return False
    if re.search(r"([^\w\s.\-])\1{3,}|_{3,}|={3,}|-{4,}|\.{6,}|\*{3,}", doc):
        return False
    words = set(re.findall(r"[a-z']+", doc.lower()))
    return not (words & BLOCKED)


def reflow(block_lines):
    """Lines of one paragraph as text: verse (every line but the last short)
    keeps its line breaks, wrapped prose becomes one line."""
    lines = [ln.strip() for ln in block_lines if ln.strip()]
    if len(lines) >= 2 and max(len(ln) for ln in lines[:-1]) < 52:
        return "\n".join(lines)
    return " ".join(lines)


# --------------------------------------------------------------- fortunes

def fortune_docs(root, names):
    docs = []
    for name in names:
        path = os.path.join(root, FORTUNE_DIR, name)
        if "/off/" in path or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            raw = f.read().decode("utf-8", errors="replace")
        for cookie in re.split(r"\n%\n", raw.replace("\r\n", "\n")):
            doc = fortune_text(cookie)
            if doc:
                docs.append(("fortune", doc))
    return docs


def fortune_text(cookie):
    """A cookie's paragraphs: a blank line or an indented line starts one;
    an attribution line ("-- Author") is its own line."""
    cookie = re.sub(r".\x08", "", cookie).expandtabs(8)
    paras, cur = [], []
    for ln in cookie.split("\n"):
        stripped = ln.strip()
        if not stripped:
            if cur:
                paras.append(cur)
            cur = []
        elif stripped.startswith("--") and len(stripped) > 3:
            if cur:
                paras.append(cur)
            paras.append([stripped])
            cur = []
        elif ln[:1] == " " and cur and not cur[-1].startswith(" ") and len(cur) >= 1:
            paras.append(cur)
            cur = [ln]
        else:
            cur.append(ln)
    if cur:
        paras.append(cur)
    return clean_text("\n".join(reflow(p) for p in paras))


# --------------------------------------------------------------- wordnet

POS_FILES = (("noun", "n"), ("verb", "v"), ("adj", "a"), ("adv", "r"))
POS_NAME = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def wordnet_common_offsets(wn):
    """The synsets of some lemma's tagged senses: a lemma's first
    tagsense_cnt synsets are those seen in the semantic concordance, which
    keeps the common senses and drops taxonomy and gazetteer entries."""
    common = set()
    for name, pos in POS_FILES:
        with open(os.path.join(wn, "index." + name), encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                p = line.split()
                p_cnt = int(p[3])
                tagged = int(p[5 + p_cnt])
                for off in p[6 + p_cnt:6 + p_cnt + tagged]:
                    common.add((pos, off))
    return common


def split_gloss(gloss):
    """A WordNet gloss as (definition, [examples]): examples are the quoted
    parts between semicolons."""
    defs, examples = [], []
    for part in re.split(r";\s*", gloss):
        part = part.strip()
        if part.startswith('"'):
            m = re.match(r'"([^"]+)"', part)
            if m:
                examples.append(m.group(1).strip())
        elif part:
            defs.append(part)
    return "; ".join(defs), examples


def sentence(s):
    s = s.strip()
    if not s:
        return s
    s = s[0].upper() + s[1:]
    return s if s[-1] in ".!?\"'" else s + "."


def wordnet_docs(root):
    wn = os.path.join(root, "usr/share/wordnet")
    common = wordnet_common_offsets(wn)
    docs = []
    for name, pos in POS_FILES:
        with open(os.path.join(wn, "data." + name), encoding="utf-8") as f:
            for line in f:
                if line.startswith("  ") or " | " not in line:
                    continue
                head, gloss = line.rstrip("\n").split(" | ", 1)
                p = head.split()
                if (pos, p[0]) not in common:
                    continue
                n_words = int(p[3], 16)
                words = [re.sub(r"\([a-z]+\)$", "", p[4 + 2 * i]).replace("_", " ") for i in range(n_words)]
                definition, examples = split_gloss(gloss.strip())
                if not definition:
                    continue
                word = words[0]
                also = [w for w in words[1:4] if w.lower() != word.lower()]
                title = ("to " + word if pos == "v" else word) + f" ({POS_NAME[p[2]]})"
                if also:
                    title += ", also " + ", ".join(also)
                text = f"{title}: {definition}."
                if examples:
                    text += " For example: " + " ".join(sentence(e) for e in examples[:3])
                docs.append(("wordnet", clean_text(text)))
    return docs


# --------------------------------------------------------------- jargon

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64num(s):
    n = 0
    for c in s:
        n = n * 64 + B64.index(c)
    return n


def jargon_docs(root):
    d = os.path.join(root, "usr/share/dictd")
    with gzip.open(os.path.join(d, "jargon.dict.dz"), "rb") as f:
        data = f.read()
    docs, seen = [], set()
    with open(os.path.join(d, "jargon.index"), encoding="utf-8") as f:
        entries = [ln.rstrip("\n").split("\t") for ln in f]
    for head, off, size in entries:
        if head.startswith("00-database") or (off, size) in seen:
            continue
        seen.add((off, size))
        entry = data[b64num(off):b64num(off) + b64num(size)].decode("utf-8", errors="replace")
        doc = jargon_text(entry)
        if doc:
            docs.append(("jargon", doc))
    return docs


def jargon_text(entry):
    """'headword: body' with cross-reference braces and short leading
    [usage] tags removed; paragraphs that are code or pictures dropped; cut
    at a paragraph end to stay under MAX_DOC_CHARS."""
    lines = entry.split("\n")
    head = lines[0].strip()
    body = "\n".join(lines[2:]) if len(lines) > 2 else ""
    paras = []
    for block in re.split(r"\n\s*\n", body):
        blines = [ln for ln in block.split("\n") if ln.strip()]
        if not blines:
            continue
        text = reflow(blines) if all(ln.startswith("    ") and not ln.startswith("        ") for ln in blines) \
            else "\n".join(ln.strip() for ln in blines)
        text = re.sub(r"[{}]", "", text)
        text = re.sub(r"^\[[^\]]{1,40}\]\s*", "", text)
        text = re.sub(r"^(\d+\.\s+)?(?:(?:n|v|vt|vi|adj|adv|interj|excl|prep|pron|conj)\.,?\s*)+", r"\1", text)
        text = clean_text(text)
        if letter_ratio(text) < 0.8:
            continue
        paras.append(text)
    if not paras:
        return None
    out = f"{head}: {paras[0]}"
    for p in paras[1:]:
        if len(out) + 1 + len(p) > MAX_DOC_CHARS:
            break
        out += "\n" + p
    return out


# --------------------------------------------------------------- miscfiles

def founding_docs(root):
    """The Declaration of Independence and the US Constitution (public
    domain; miscfiles' debian/addons), one document per paragraph."""
    docs = []
    for name in ("us-declaration", "us-constitution"):
        path = os.path.join(root, "usr/share/state", name + ".gz")
        if not os.path.exists(path):
            continue
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            raw = f.read()
        for block in re.split(r"\n\s*\n", raw):
            text = clean_text(reflow(block.split("\n")))
            if len(text) >= 80:
                docs.append(("founding", text))
    return docs


# --------------------------------------------------------------- chats

FORTUNE_ASKS = ["Tell me a fortune.", "Say something wise.", "Give me a quote.", "Tell me something.",
                "Cheer me up.", "What do you think?"]


def chat_for(source, doc, h):
    """A one-turn chat that has the document as its answer, or None."""
    pick = int.from_bytes(h[8:12], "big")
    if source == "wordnet":
        m = re.match(r"(?:to )?([^(:]+?) \((noun|verb|adjective|adverb)\)", doc)
        if not m:
            return None
        word = m.group(1)
        asks = [f'What does "{word}" mean?', f'Define "{word}".', f"What is the meaning of {word}?"]
        return {"user": asks[pick % len(asks)], "assistant": doc}
    if source == "jargon":
        word = doc.split(":", 1)[0]
        return {"user": f'What does "{word}" mean in hacker slang?', "assistant": doc}
    if source == "fortune":
        return {"user": FORTUNE_ASKS[pick % len(FORTUNE_ASKS)], "assistant": doc}
    return None


# --------------------------------------------------------------- main

def build(pkgs):
    raw = []
    for pkg, names in FORTUNE_FILES.items():
        raw += fortune_docs(pkgs[pkg][0], names)
    raw += wordnet_docs(pkgs["wordnet-base"][0])
    raw += jargon_docs(pkgs["dict-jargon"][0])
    raw += founding_docs(pkgs["miscfiles"][0])
    kept, seen, dropped = [], set(), 0
    for source, doc in raw:
        key = re.sub(r"[^a-z0-9]+", "", doc.lower())
        if key in seen or not acceptable(doc):
            dropped += 1
            continue
        seen.add(key)
        kept.append((source, doc))
    return kept, dropped


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--debs", help="use the .deb files in this folder instead of downloading")
    ap.add_argument("--xz", action="store_true", help="also write .xz copies of the three corpus files")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="moe-corpus-")
    try:
        pkgs = fetch_packages(work, args.debs)
        docs, dropped = build(pkgs)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    train, held, chats = [], [], []
    for source, doc in docs:
        h = hashlib.sha256((source + "\n" + doc).encode("utf-8")).digest()
        bucket = int.from_bytes(h[:8], "big") % 10000
        (held if bucket < HELDOUT_PER_10000 else train).append((h, source, doc))
    train.sort()
    held.sort()
    for h, source, doc in train:
        if int.from_bytes(h[12:20], "big") % 10000 < CHAT_PER_10000:
            c = chat_for(source, doc, h)
            if c:
                chats.append(c)

    files = {
        "train.txt": "\n\n".join(d for _, _, d in train) + "\n",
        "heldout.txt": "\n\n".join(d for _, _, d in held) + "\n",
        "train_chat.jsonl": "".join(json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n" for c in chats),
    }
    for name, text in files.items():
        data = text.encode("utf-8")
        if args.xz:
            with lzma.open(os.path.join(args.out, name + ".xz"), "wb", preset=9 | lzma.PRESET_EXTREME) as f:
                f.write(data)
        else:
            with open(os.path.join(args.out, name), "wb") as f:
                f.write(data)

    counts = {}
    for _, source, doc in train + [(None, s, d) for _, s, d in held]:
        n, c = counts.get(source, (0, 0))
        counts[source] = (n + 1, c + len(doc))
    lines = ["# The demo corpus: made by training/prepare_corpus.py", "", "packages (Debian):"]
    for pkg, (_, version, sha) in pkgs.items():
        lines.append(f"  {pkg} {version} sha256:{sha}")
    lines += ["", "documents by source (kept after cleaning and de-duplication; "
              f"{dropped} dropped):"]
    for source, (n, c) in sorted(counts.items()):
        lines.append(f"  {source:9s} {n:7d} documents {c:9d} characters")
    lines += ["", f"train {len(train)} documents, heldout {len(held)}, chats {len(chats)}", "",
              "files (uncompressed):"]
    for name, text in files.items():
        data = text.encode("utf-8")
        lines.append(f"  {name} {len(data)} bytes sha256:{hashlib.sha256(data).hexdigest()}")
    with open(os.path.join(args.out, "SOURCES.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
