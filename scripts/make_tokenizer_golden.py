#!/usr/bin/env python
"""Build the tokenizer golden fixture: how the official code's stack (transformers 4.57.3, whose
GemmaTokenizerFast the official loader uses; transformers 5 cannot load the official model) reads a
checkpoint's tokenizer files, for each tokenizer_config.json flag where transformers 5 reads them otherwise.

One command, from the repository root, with the project's virtualenv active:

    python scripts/make_tokenizer_golden.py

What it does:
  1. (project venv) writes the tiny tokenizer (`tiny_model(seed=0).tokenizer`, built in code, deterministic)
     as tokenizer.json, once per layout of tests/fixtures/tokenizer_golden/layouts.json (each a
     tokenizer_config.json, and for some a change to tokenizer.json's post-processor), into a temporary
     directory;
  2. creates the separate reference virtualenv `.tokenizer-golden-env/` (git-ignored) if it is missing, with
     transformers==4.57.3 (no torch: only its tokenizers are used);
  3. (reference venv) re-runs this file with `--reference DIR`: `AutoTokenizer.from_pretrained` on each layout,
     and for every sample text the ids with and without special tokens, and the decoded ids with special tokens;
  4. saves `tests/fixtures/tokenizer_golden/golden.json` with the tokenizer.json's SHA-256.
The tests (tests/model/test_tokenizer_flags.py) rebuild the layouts and compare our tokenizer with it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "tokenizer_golden"
ENV = ROOT / ".tokenizer-golden-env"
REFERENCE = "transformers==4.57.3"


def write_layouts(out: Path) -> str:
    """Each layout's directory under `out`; returns the tokenizer.json's SHA-256."""
    sys.path.insert(0, str(ROOT / "worker"))
    from breeze_worker.model.tiny import tiny_model

    text = tiny_model(seed=0, with_codec=False).tokenizer.to_str()
    layouts = json.loads((FIXTURE / "layouts.json").read_text())
    for name, layout in layouts["layouts"].items():
        directory = out / name
        directory.mkdir(parents=True)
        spec = json.loads(text)
        if "post_processor" in layout:
            spec["post_processor"] = layout["post_processor"]
        (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
        (directory / "tokenizer_config.json").write_text(json.dumps(layout["config"]), encoding="utf-8")
    return hashlib.sha256(text.encode()).hexdigest()


def reference(directory: Path) -> dict:
    """(reference venv) what transformers 4 makes of each layout."""
    import transformers
    from transformers import AutoTokenizer

    samples = json.loads((FIXTURE / "layouts.json").read_text())["samples"]
    out = {"transformers": transformers.__version__, "layouts": {}}
    for layout in sorted(p.name for p in directory.iterdir()):
        tok = AutoTokenizer.from_pretrained(str(directory / layout))
        rows = {}
        for text in samples:
            special = tok.encode(text, add_special_tokens=True)
            rows[text] = {"special": special, "plain": tok.encode(text, add_special_tokens=False),
                          "decoded": tok.decode(special)}
        out["layouts"][layout] = {"class": type(tok).__name__, "samples": rows}
    return out


def _dump(golden: dict) -> str:
    """The fixture's JSON with one line per sample (readable, small)."""
    lines = ["{", f' "tokenizer_json_sha256": "{golden["tokenizer_json_sha256"]}",',
             f' "transformers": "{golden["transformers"]}",', ' "layouts": {']
    names = list(golden["layouts"])
    for i, name in enumerate(names):
        layout = golden["layouts"][name]
        lines.append(f'  "{name}": {{"class": "{layout["class"]}", "samples": {{')
        samples = list(layout["samples"].items())
        for j, (text, row) in enumerate(samples):
            lines.append(f"   {json.dumps(text, ensure_ascii=False)}: {json.dumps(row, ensure_ascii=False)}"
                         + ("," if j < len(samples) - 1 else ""))
        lines.append("  }}" + ("," if i < len(names) - 1 else ""))
    return "\n".join(lines + [" }", "}"]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", default=None, metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference:
        print(json.dumps(reference(Path(args.reference))))
        return 0
    if not (ENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(ENV)], check=True)
        subprocess.run([str(ENV / "bin" / "pip"), "install", "-q", REFERENCE], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        digest = write_layouts(Path(tmp))
        done = subprocess.run([str(ENV / "bin" / "python"), __file__, "--reference", tmp], check=True,
                              capture_output=True, text=True)
    golden = {"tokenizer_json_sha256": digest, **json.loads(done.stdout.strip().splitlines()[-1])}
    (FIXTURE / "golden.json").write_text(_dump(golden), encoding="utf-8")
    print(f"wrote {FIXTURE / 'golden.json'} ({golden['transformers']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
