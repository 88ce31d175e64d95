#!/usr/bin/env python3
"""Build the demo model's chat dataset from the manual pages installed on this machine.

Each page (sections 1-8 of /usr/share/man, English, gcloud's 16k generated pages left out) is rendered
to text with man(1) and turned into single-turn conversations:

  user "What does `tar` do?" (several phrasings)  -> the NAME line + the first DESCRIPTION paragraph
  user "How do I <NAME line's task>?"             -> "Use `tar`: ..." + the same paragraph
  user "What does `ls -l` do?" (up to 4 options)  -> the option's text

and a share of two-turn conversations (two pages), as a chat session has. Every conversation is rendered
with the demo model's Qwen2.5 chat template (no system message: the template's default system prompt,
as `tllm chat` sends it) and tokenized with the real Qwen2.5 tokenizer through `tllm tokenize`; the
script checks its rendering against `tllm tokenize --chat` on samples. 5% of the pages (by a seeded
hash of the name) are held out for evaluation: none of their conversations is in the training split.

Output (--out, default build/mandemo): conversations.jsonl (text), train.jsonl and eval.jsonl
({"ids": [...], "spans": [[start, end], ...]}: the assistant tokens, <|im_end|> included, that carry the
loss), heldout.txt (held-out page names) and stats.json.

usage: python3 scripts/man_dataset.py [--tllm build/tllm] [--model models/tllm-man-demo] [--out DIR]
"""
import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

SECTIONS = ["1", "2", "3", "4", "5", "6", "7", "8"]
HELDOUT_SHARE = 0.05
SEED = 1234
MAX_ANSWER_CHARS = 700
MAX_OPTIONS_PER_PAGE = 4
WHAT_PER_PAGE = 4  # phrasings of "what does X do" per page, so the answer does not hang on one wording
TWO_TURN_SHARE = 0.15

WHAT_COMMAND = ["What does `{n}` do?", "What does {n} do?", "What is `{n}`?", "What is {n} used for?",
                "Explain the `{n}` command.", "Tell me about {n}.", "what does {n} do"]
WHAT_BY_SECTION = {
    "2": ["What does the `{n}` system call do?", "What is the {n} system call?", "What does {n}() do?"],
    "3": ["What does the `{n}` function do?", "What is {n}() for?", "What does {n} do?"],
    "3pm": ["What is the Perl module `{n}`?", "What does {n} do?"],
    "4": ["What is the `{n}` device?", "What is {n}?"],
    "5": ["What is the `{n}` file?", "What is the format of {n}?", "What is {n}?"],
    "7": ["What is `{n}`?", "Explain {n}.", "Tell me about {n}."],
}
HOW = ["How do I {t}?", "How can I {t}?", "Which command can {t}?"]
OPTION = ["What does `{n} {o}` do?", "What does the {o} option of {n} do?", "What does {n} {o} do?"]
NOT_A_TASK = {"a", "an", "the", "gnu", "perl", "this", "library", "interface", "overview", "manual", "list",
              "format", "file", "files", "configuration", "utility", "tool", "program", "simple", "debian",
              "module", "common", "generic", "standard", "various", "miscellaneous", "introduction", "x", "c"}
SECTION_HEADER = re.compile(r"^[A-Z][A-Z0-9 ,/&()-]*$")
OPTION_TERM = re.compile(r"^( {7})(-{1,2}[A-Za-z0-9?#][^ ]*(?:, -{1,2}[A-Za-z0-9][^ ]*)*)(?:\s{2,}(.*))?$")


def ws(s):
    return re.sub(r"\s+", " ", s).strip()


def clip(text, limit=MAX_ANSWER_CHARS):
    """Whole sentences up to `limit` characters (at least one, cut at a word if it alone is longer)."""
    if len(text) <= limit:
        return text
    out = ""
    for m in re.finditer(r"[^.!?]+[.!?]+(\s|$)", text):
        if len(out) + len(m.group(0)) > limit:
            break
        out += m.group(0)
    if not out:
        out = text[:limit].rsplit(" ", 1)[0] + " ..."
    return out.strip()


def render(path):
    env = dict(os.environ, MANWIDTH="1000", MAN_KEEP_FORMATTING="", LC_ALL="C.UTF-8")
    try:
        r = subprocess.run(["man", "-P", "cat", "-l", path], capture_output=True, env=env, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        return None
    return r.stdout.decode("utf-8", "replace")


def sections_of(text):
    """{HEADER: [lines]} of a rendered page (headers are unindented capitals)."""
    out, cur = {}, None
    for line in text.split("\n")[1:]:
        line = line.rstrip()
        if line and not line[0].isspace() and SECTION_HEADER.match(line):
            cur = line
            out.setdefault(cur, [])
        elif cur:
            out[cur].append(line)
    return out


def first_paragraph(lines):
    para = []
    for line in lines:
        if not line.strip():
            if para:
                break
            continue
        if line.startswith("   ") and not line.startswith("       "):  # a subsection heading
            if para:
                break
            continue
        if OPTION_TERM.match(line) and not para:
            return ""
        para.append(line.strip())
    return ws(" ".join(para))


def options_of(lines):
    """[(spelling, text)] of option entries: '       -x, --long' followed by indented text."""
    opts, i = [], 0
    while i < len(lines):
        m = OPTION_TERM.match(lines[i])
        if not m:
            i += 1
            continue
        term, text = m.group(2), [m.group(3) or ""]
        i += 1
        while i < len(lines) and lines[i].startswith("        ") and not OPTION_TERM.match(lines[i]):
            text.append(lines[i].strip())
            i += 1
        body = ws(" ".join(text))
        if body:
            opts.append((term, clip(body, 400)))
    return opts


def parse_page(path):
    base = os.path.basename(path)
    stem = base[:-3] if base.endswith(".gz") else base
    name, _, suffix = stem.rpartition(".")
    text = render(path)
    if not text:
        return None
    secs = sections_of(text)
    name_lines = secs.get("NAME")
    if not name_lines:
        return None
    name_line = ws(" ".join(name_lines))
    m = re.match(r"^(.*?)\s+(?:\\?-|\u2014|\u2013)\s+(.*)$", name_line)
    if not m:
        return None
    desc = m.group(2).strip().rstrip(".")
    if not desc:
        return None
    description = first_paragraph(secs.get("DESCRIPTION", []))
    opt_lines = secs.get("OPTIONS", []) + secs.get("DESCRIPTION", [])
    return {"name": name, "section": suffix, "name_line": name_line, "desc": desc,
            "description": clip(description) if description else "", "options": options_of(opt_lines)}


def is_heldout(name):
    h = hashlib.sha256(f"{SEED}:{name}".encode()).digest()
    return int.from_bytes(h[:4], "big") / 2**32 < HELDOUT_SHARE


def answer_what(p):
    ans = p["name_line"]
    if not ans.endswith("."):
        ans += "."
    if p["description"]:
        ans += "\n\n" + p["description"]
    return ans


def task_of(p):
    words = p["desc"].split()
    if p["section"][0] not in "168" or not words:
        return None
    w = words[0]
    if not re.fullmatch(r"[a-z]+", w) or w in NOT_A_TASK or w.endswith("ing") or w.endswith("er"):
        return None
    # "prints lines" -> "print lines": NAME lines use both forms.
    if w.endswith("s") and not w.endswith("ss") and len(w) > 3:
        w = w[:-1]
    t = " ".join([w] + words[1:])
    return t[0].lower() + t[1:]


def conversations_of(p, rng):
    n, sec = p["name"], p["section"]
    key = "3pm" if sec.startswith("3pm") else sec[0]
    what = WHAT_BY_SECTION.get(key, WHAT_COMMAND)
    turns = []
    for q in rng.sample(what, min(WHAT_PER_PAGE, len(what))):
        turns.append((q.format(n=n), answer_what(p)))
    for a in p["aliases"]:
        turns.append((rng.choice(what).format(n=a), answer_what(p)))
    t = task_of(p)
    if t:
        ans = f"Use `{n}`: {p['name_line']}."
        if p["description"]:
            ans += "\n\n" + p["description"]
        turns.append((rng.choice(HOW).format(t=t), ans))
    if key in "168":
        for term, text in rng.sample(p["options"], min(MAX_OPTIONS_PER_PAGE, len(p["options"]))):
            spelling = term.split(",")[0].split("=")[0].split("[")[0]
            turns.append((rng.choice(OPTION).format(n=n, o=spelling), f"`{term}`: {text}"))
    return turns


def chatml(template_system, turns):
    """The demo template's rendering of [user, assistant]* with no system message, split into the
    prompt text before each answer and the answer."""
    parts = [f"<|im_start|>system\n{template_system}<|im_end|>\n"]
    for q, a in turns:
        parts.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
        parts.append(a)
        parts.append("<|im_end|>\n")
    return parts


def tokenize(tllm, model, texts):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
        name = f.name
    try:
        r = subprocess.run([tllm, "tokenize", "-m", model, "--jsonl", name], capture_output=True, check=True)
    finally:
        os.unlink(name)
    return [json.loads(l)["ids"] for l in r.stdout.decode().splitlines()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tllm", default="build/tllm")
    ap.add_argument("--model", default="models/tllm-man-demo", help="directory with the tokenizer files")
    ap.add_argument("--out", default="build/mandemo")
    ap.add_argument("--man", default="/usr/share/man")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--limit", type=int, default=0, help="at most this many pages (0 = all; for trying)")
    args = ap.parse_args()

    cfg = json.load(open(os.path.join(args.model, "tokenizer_config.json")))
    m = re.search(r"<\|im_start\|>system\\n([^'\"]+)<\|im_end\|>", cfg["chat_template"])
    system = m.group(1)

    paths = []
    for s in SECTIONS:
        d = os.path.join(args.man, "man" + s)
        if os.path.isdir(d):
            paths += sorted(os.path.join(d, f) for f in os.listdir(d) if not f.startswith("gcloud"))
    if args.limit:
        paths = paths[: args.limit]
    print(f"man_dataset: rendering {len(paths)} pages with man(1), {args.jobs} jobs", file=sys.stderr)
    with ThreadPoolExecutor(args.jobs * 2) as ex:
        pages = [p for p in ex.map(parse_page, paths) if p]
    groups = {}
    for p in pages:  # aliases (egrep -> grep) render the same page: one entry, named as its NAME line
        groups.setdefault((p["section"], p["name_line"]), []).append(p)
    uniq = []
    for g in groups.values():
        stems = [p["name"] for p in g]
        listed = [n.strip() for n in g[0]["name_line"].split(" - ")[0].split(",")]
        primary = next((n for n in listed if n in stems), stems[0])
        p = dict(g[0], name=primary, aliases=[n for n in stems if n != primary][:3])
        uniq.append(p)
    print(f"man_dataset: {len(pages)} pages parsed, {len(uniq)} distinct", file=sys.stderr)

    rng = random.Random(SEED)
    convs = []
    for p in uniq:
        split = "eval" if is_heldout(p["name"]) else "train"
        for q, a in conversations_of(p, rng):
            convs.append({"split": split, "page": f"{p['name']}({p['section']})", "turns": [[q, a]]})
    train = [c for c in convs if c["split"] == "train"]
    for _ in range(int(len(train) * TWO_TURN_SHARE)):
        a, b = rng.sample(train, 2)
        convs.append({"split": "train", "page": a["page"] + "+" + b["page"], "turns": a["turns"] + b["turns"]})
    rng.shuffle(convs)

    # Tokenize each piece separately (prompt, answer, "<|im_end|>\n") so the loss spans are exact; the
    # concatenation is checked against the tokenizer on the whole text below.
    pieces = [chatml(system, c["turns"]) for c in convs]
    flat = [x for ps in pieces for x in ps]
    ids_flat = tokenize(args.tllm, args.model, flat)
    os.makedirs(args.out, exist_ok=True)
    k = 0
    out = {"train": open(os.path.join(args.out, "train.jsonl"), "w"),
           "eval": open(os.path.join(args.out, "eval.jsonl"), "w")}
    ntok = {"train": 0, "eval": 0}
    nconv = {"train": 0, "eval": 0}
    for c, ps in zip(convs, pieces):
        ids, spans = [], []
        for j in range(len(ps)):  # pieces: system, then (prompt, answer, "<|im_end|>\n") per turn
            piece = ids_flat[k + j]
            if j > 0 and (j - 1) % 3 == 1:
                spans.append([len(ids), len(ids) + len(piece)])
            elif j > 0 and (j - 1) % 3 == 2:  # the loss covers <|im_end|>: it ends the answer
                spans[-1][1] += 1
            ids += piece
        k += len(ps)
        c["n_tokens"] = len(ids)
        out[c["split"]].write(json.dumps({"ids": ids, "spans": spans}) + "\n")
        ntok[c["split"]] += len(ids)
        nconv[c["split"]] += 1
    for f in out.values():
        f.close()

    # The pieces' concatenation must be what `tllm tokenize --chat` gives for the conversation.
    for c in rng.sample(convs, 20):
        msgs = []
        for q, a in c["turns"]:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        prompt = msgs[:-1]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(prompt, f)
        r = subprocess.run([args.tllm, "tokenize", "-m", args.model, "--chat", f.name], capture_output=True,
                           check=True)
        os.unlink(f.name)
        want = json.loads(r.stdout)
        got = [x for ps in tokenize(args.tllm, args.model, chatml(system, c["turns"])[:-2]) for x in ps]
        whole = tokenize(args.tllm, args.model, ["".join(chatml(system, c["turns"]))])[0]
        split = [x for ps in tokenize(args.tllm, args.model, chatml(system, c["turns"])) for x in ps]
        if got != want or whole != split:
            sys.exit(f"man_dataset: rendering of {c['page']} differs from `tllm tokenize --chat`")

    with open(os.path.join(args.out, "conversations.jsonl"), "w") as f:
        for c in convs:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    held = sorted({p["name"] + "(" + p["section"] + ")" for p in uniq if is_heldout(p["name"])})
    with open(os.path.join(args.out, "heldout.txt"), "w") as f:
        f.write("\n".join(held) + "\n")
    stats = {"pages_rendered": len(paths), "pages_distinct": len(uniq), "heldout_pages": len(held),
             "conversations": nconv, "tokens": ntok, "system_prompt": system, "seed": SEED}
    json.dump(stats, open(os.path.join(args.out, "stats.json"), "w"), indent=2)
    print("man_dataset: " + json.dumps(stats), file=sys.stderr)


if __name__ == "__main__":
    main()
