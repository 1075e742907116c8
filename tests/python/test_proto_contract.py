"""The proto carries the whole numerics contract: its coefficient tables and tail rules are Emerging-Optimizers'.

proto/orthoserve/v1/orthogonalizer.proto documents every coefficient set in the comment above its enum value
(the triples in order, `× N` for repeats, and whether the set cycles or repeats its last triple). A client
written from the proto alone depends on those comments, so they are checked against the oracle's own tables.
"""

from __future__ import annotations

import pathlib
import re

from emerging_optimizers.orthogonalized_optimizers import muon_utils

REPO = pathlib.Path(__file__).resolve().parents[2]
PROTO = REPO / "proto" / "orthoserve" / "v1" / "orthogonalizer.proto"
NUMBER = r"-?\d+(?:\.\d+)?"
TRIPLE = re.compile(rf"\(({NUMBER}), ({NUMBER}), ({NUMBER})\)(?: × (\d+))?")


def documented_sets() -> dict[str, tuple[list[tuple[float, float, float]], str]]:
    """{set name: (triples, "cycle" | "repeat_last" | other)} from the comments of enum Coefficients."""
    body = PROTO.read_text().split("enum Coefficients {", 1)[1].split("}", 1)[0]
    sets, comment = {}, []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("//"):
            comment.append(line[2:].strip())
            continue
        m = re.match(r"COEFFICIENTS_(\w+) = \d+;", line)
        if m:
            text = " ".join(comment)
            triples = []
            for a, b, c, times in TRIPLE.findall(text):
                triples += [(float(a), float(b), float(c))] * int(times or 1)
            tail = "repeat_last" if "Repeats the last" in text else "cycle" if re.search(r"\b[Cc]ycle", text) else text
            sets[m.group(1).lower()] = (triples, tail)
        comment = []
    return sets


def test_every_emerging_optimizers_set_is_documented_exactly():
    sets = documented_sets()
    for name, expected in muon_utils._COEFFICIENT_SETS.items():
        triples, tail = sets[name]
        assert triples == [tuple(float(v) for v in t) for t in expected], name
        rule = "repeat_last" if name in ("polar_express", "cans", "deepseekv4") else "cycle"
        assert tail == rule, f"{name}: documented {tail!r}, Emerging-Optimizers uses {rule}"


def test_our_own_sets_are_documented():
    sets = documented_sets()
    assert len(sets["cubic5"][0]) == 5 and all(c == 0 for _, _, c in sets["cubic5"][0])
    assert sets["custom"][1] == "cycle"
    assert sets["unspecified"][0] == [] and "quintic" in PROTO.read_text().split("COEFFICIENTS_UNSPECIFIED", 1)[1][:40]
