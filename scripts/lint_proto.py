#!/usr/bin/env python3
"""Lints orthoserve's protos with the conventions other languages' generators expect (buf's DEFAULT rules, as far as
they matter to code generators), so that any language can be generated from them:

  - a versioned package (`orthoserve.v1`, `orthoserve.fleet.v1`) and `go_package` and `java_package` options;
  - messages, enums, services and rpcs in CamelCase, fields in lower_snake_case;
  - enum values in UPPER_SNAKE_CASE prefixed by their enum's name (`DTYPE_FP32` in `DType`), and every enum's zero
    value named `<ENUM>_UNSPECIFIED`, except where ZERO_VALUE_EXCEPTIONS says why not.

    scripts/lint_proto.py [FILE.proto ...]     # default: every .proto under proto/orthoserve

Prints one line per finding (file:line: rule: what) and exits 1 when there is any; stdlib only.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Enums whose zero value means something on purpose, each with the reason. Keep this short.
ZERO_VALUE_EXCEPTIONS = {
    # The fleet's own wire (rank to rank, one release at a time, protocol-versioned): an explicit placement list
    # is what an unset rule must mean, so that an old encoder's message reads the same.
    "BlockRule": "fleet-internal; EXPLICIT is the meaning of an unset rule",
}

CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")
SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
UPPER_SNAKE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def upper_snake(name: str) -> str:
    """DType -> DTYPE, ScaleMode -> SCALE_MODE, NdLayout -> ND_LAYOUT (buf's rule)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def lint(path: pathlib.Path) -> list:
    findings = []
    lines = strip_comments(path.read_text()).split("\n")

    shown = path.relative_to(ROOT) if ROOT in path.parents else path

    def bad(number: int, rule: str, what: str) -> None:
        findings.append(f"{shown}:{number}: {rule}: {what}")

    text = "\n".join(lines)
    package = re.search(r"^\s*package\s+([\w.]+)\s*;", text, re.M)
    if package is None or not re.search(r"\.v\d+$", package.group(1)):
        bad(1, "PACKAGE_VERSION_SUFFIX", f"package {package.group(1) if package else '(none)'} has no .vN suffix")
    for option in ("go_package", "java_package"):
        if not re.search(rf"^\s*option\s+{option}\s*=", text, re.M):
            bad(1, "FILE_OPTION", f"no option {option}")
    stack = []  # ("enum" | "message" | ..., name, first value seen)
    for number, line in enumerate(lines, 1):
        for kind, name in re.findall(r"\b(message|enum|service|oneof)\s+(\w+)\s*\{", line):
            if kind != "oneof" and not CAMEL.match(name):
                bad(number, f"{kind.upper()}_PASCAL_CASE", name)
            if kind == "oneof" and not SNAKE.match(name):
                bad(number, "ONEOF_LOWER_SNAKE_CASE", name)
            stack.append([kind, name, False])
        rpc = re.search(r"\brpc\s+(\w+)\s*\(", line)
        if rpc and not CAMEL.match(rpc.group(1)):
            bad(number, "RPC_PASCAL_CASE", rpc.group(1))
        inner = stack[-1] if stack else None
        if inner and inner[0] == "enum":
            value = re.match(r"\s*(\w+)\s*=\s*(-?\d+)", line)
            if value:
                name, tag = value.group(1), int(value.group(2))
                prefix = upper_snake(inner[1]) + "_"
                if not UPPER_SNAKE.match(name):
                    bad(number, "ENUM_VALUE_UPPER_SNAKE_CASE", name)
                if not name.startswith(prefix):
                    bad(number, "ENUM_VALUE_PREFIX", f"{name} in enum {inner[1]} (expected the prefix {prefix})")
                if tag == 0 and name != prefix + "UNSPECIFIED" and inner[1] not in ZERO_VALUE_EXCEPTIONS:
                    bad(number, "ENUM_ZERO_VALUE_SUFFIX", f"{name} is enum {inner[1]}'s zero value")
        elif inner and inner[0] in ("message", "oneof"):
            field = re.match(r"\s*(?:optional\s+|repeated\s+)?(?:map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*\d+", line)
            if field and not line.lstrip().startswith(("option", "reserved")) and not SNAKE.match(field.group(1)):
                bad(number, "FIELD_LOWER_SNAKE_CASE", field.group(1))
        for _ in range(line.count("}")):
            if stack:
                stack.pop()
    return findings


def main(argv: list) -> int:
    files = [pathlib.Path(a).resolve() for a in argv] or sorted((ROOT / "proto" / "orthoserve").rglob("*.proto"))
    findings = [f for path in files for f in lint(path)]
    for f in findings:
        print(f)
    print(f"lint_proto: {len(files)} files, {len(findings)} findings", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
