"""The committed stubs are exactly what scripts/gen_protos.sh generates from the .proto files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos" / "breeze_tts_proto" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def test_generated_stubs_match_the_protos_byte_for_byte(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)], check=True, env=env,
                   timeout=120, capture_output=True)
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "breeze_tts_proto" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
    protos = sorted(p.stem for p in PROTO_DIR.glob("*.proto"))
    assert protos, "no .proto files found"
    assert sorted(fresh) == sorted(committed), "stub files differ from the protos: run scripts/gen_protos.sh"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale stubs {stale}: run scripts/gen_protos.sh"
    assert len(fresh) == 3 * len(protos)


def test_every_proto_field_has_a_comment_and_enums_start_unspecified():
    for proto in PROTO_DIR.glob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            s = line.strip()
            is_field = s.endswith(";") and "=" in s and not s.startswith(("option", "syntax", "//", "rpc"))
            if is_field:
                assert lines[i - 1].strip().startswith("//"), f"{proto.name}:{i + 1} has no comment: {s}"
            if s.endswith("= 0;"):
                assert "_UNSPECIFIED" in s, f"{proto.name}:{i + 1}: enum zero must be *_UNSPECIFIED"
