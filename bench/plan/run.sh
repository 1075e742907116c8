#!/usr/bin/env bash
# The coordinator and the plan at training scale, in process: builds plan_scale_bench (in
# $ORTHOSERVE_BUILD_DIR when set, else build-bench/ under the repository), runs one group step of
# a 70B-class FSDP model (560 matrices) for every (W, S) of the grid, and writes
# bench/results/plan_scale.md with the table and the growth exponents (log-log slopes between
# grid points) in W and S.
#
#   bench/plan/run.sh                                  # W = 64,256,1024 × S = 8,64, 3 steps each
#   W=1024 S=64 REPS=5 bench/plan/run.sh
#   BEFORE=bench/plan/before_fixes.jsonl bench/plan/run.sh   # adds a before/after table
#   BEFORE=bench/plan/before_plan_message.jsonl BEFORE_LABEL="the fleet's own plan message" bench/plan/run.sh
#
# Environment: ORTHOSERVE_BUILD_DIR (default build-bench/), W, S, LAYERS (80), REPS (3), READERS
# (8: members whose log read is timed; the fan-out is scaled to S), BEFORE (a JSONL of an earlier
# run to compare with), BEFORE_LABEL (what changed since it; default "the fixes"), OUT.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ORTHOSERVE_BUILD_DIR:-$root/build-bench}
worlds=${W:-64,256,1024}
fleets=${S:-8,64}
layers=${LAYERS:-80}
reps=${REPS:-3}
readers=${READERS:-8}
before=${BEFORE:-}
before_label=${BEFORE_LABEL:-the fixes}
out=${OUT:-$root/bench/results/plan_scale.md}

# shellcheck source=bench/build.sh
source "$root/bench/build.sh"
bench_build "$build" plan_scale_bench plan_scale_bench
bench="$build/bench/plan/plan_scale_bench"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date -u '+%Y-%m-%d %H:%M')
"$bench" --w="$worlds" --s="$fleets" --layers="$layers" --reps="$reps" --readers="$readers" 2>"$tmp/log" |
  tee "$tmp/runs.jsonl"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
tree="HEAD $(git -C "$root" log -1 --format=%h 2>/dev/null || echo unknown) plus the working tree, plan_scale_bench built $(date -u -r "$bench" '+%Y-%m-%d %H:%M') UTC ($build_type)"

mkdir -p "$(dirname "$out")"
python3 - "$tmp/runs.jsonl" "$out" "$start" "$load_before" "$load_after" "$tree" "$reps" "$readers" "$before" \
  "$before_label" <<'PY'
import json, math, os, sys

runs_path, out, start, load_before, load_after, tree, reps, readers, before_path, before_label = sys.argv[1:]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
at = {(r["W"], r["S"]): r for r in runs}
Ws = sorted({r["W"] for r in runs})
Ss = sorted({r["S"] for r in runs})
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
mem_total = 0
for line in open("/proc/meminfo"):
    if line.startswith("MemTotal:"):
        mem_total = int(line.split()[1]) * 1024

ms = lambda s: f"{s * 1e3:.1f}"
mb = lambda b: f"{b / 1e6:.1f}"
kb = lambda b: f"{b / 1e3:.1f}"

# (label, how a run gives it, formatter)
metrics = [
    ("last report → log entry, ms (wall)", lambda r: r["last_report_wall_s"], ms),
    ("planning CPU (all Report calls), ms", lambda r: r["planning_cpu_s"], ms),
    ("AssignOwners CPU, ms", lambda r: r["owners_cpu_s"], ms),
    ("report decode CPU (remote reports), ms", lambda r: r["decode_cpu_s"], ms),
    ("kept reports: decode + Read CPU, ms", lambda r: r["kept_decode_cpu_s"] + r["kept_read_cpu_s"], ms),
    ("log read per member (read + encoding + serialize; median), ms",
     lambda r: r["read_cpu_s_per_member"] + r["encode_cpu_s_per_member"] + r["serialize_cpu_s_per_member"], ms),
    ("fan-out CPU (× S members), ms", lambda r: r["fanout_cpu_s"], ms),
    ("coordinator CPU per step, ms", lambda r: r["coordinator_cpu_s"], ms),
    ("member: parse + LogEntryFromProto, ms", lambda r: r["member_parse_cpu_s"] + r["member_from_proto_cpu_s"], ms),
    ("member: ValidatePlan, ms", lambda r: r["member_validate_cpu_s"], ms),
    ("reports in (messages)", lambda r: r["reports_in"], lambda v: f"{v:.0f}"),
    ("report bytes in (Σ W reports), MB", lambda r: r["report_wire_bytes"], mb),
    ("kept-report bytes in (Σ, next reads), MB", lambda r: r["kept_wire_bytes"], mb),
    ("entries out (messages, one per member)", lambda r: r["entries_out"], lambda v: f"{v:.0f}"),
    ("log entry per member on the wire, MB", lambda r: r["entry_wire_bytes"], mb),
    ("entry bytes out (× S), MB", lambda r: r["bytes_out"], mb),
    ("entry encodings for the S reads", lambda r: r["encodings_per_step"], lambda v: f"{v:.0f}"),
    ("coordinator memory: pending step, MB", lambda r: r["pending_bytes"], mb),
    ("coordinator memory: log entry, MB", lambda r: r["entry_bytes"], mb),
    ("coordinator memory: kept reports (between steps), MB", lambda r: r["kept_bytes"], mb),
    ("coordinator memory: serving one member's read, MB", lambda r: r["read_transient_bytes_per_member"], mb),
    ("… × S (all members' reads wake at once), MB",
     lambda r: r["read_transient_bytes_per_member"] * r["S"], mb),
]

def value(get, r):
    try:
        return get(r)
    except KeyError:  # A field an older run did not record.
        return None

def show(fmt, v):
    return "–" if v is None else fmt(v)

def slope(a, b, xa, xb):
    if a is None or b is None or a <= 0 or b <= 0:
        return "–"
    return f"{math.log(b / a) / math.log(xb / xa):.2f}"

L = ["# Coordinator and plan at scale: one group step of a 70B-class FSDP model\n"]
m0 = runs[0]["matrices"] if runs else 0
L.append(f"Recorded by `bench/plan/run.sh` on {start} UTC. Machine: {cpu}, {os.cpu_count()} cores, "
         f"{mem_total / 2**30:.0f} GiB, shared with other engineers' builds and tests: load average {load_before} "
         f"before, {load_after} after (CPU times are per thread, so they are the figures to trust). Tree: {tree}.\n")
L.append(f"Step: {m0} matrices (80 layers × q 8192×8192, k and v 1024×8192, o 8192×8192, gate and up "
         "28672×8192, down 8192×28672; bf16, AUTO, default options), every matrix row-sharded over the W "
         "trainer ranks as torch.chunk does (W · 560 blocks), trainer rank r on fleet rank ⌊r·S/W⌋. "
         "`plan_scale_bench` drives a real `Coordinator` in process the way the fleet service does: each "
         "report built as its fleet rank sends it (untimed), decoded (`ReadyReportFromProto`, timed for the "
         "remote ones) and passed to `Coordinator::Report`; the last one validates the W spec lists, builds "
         "the BatchPlan and runs AssignOwners before it appends the entry. Fan-out: `Coordinator::ReadAsync` "
         "+ the entry's encoding (`EncodedLog`: encoded by the first reader, shared by the rest) + serialization "
         "of the ReadLogResponse, as `FleetService::ReadLog` does it for every member; timed for "
         f"{readers} members and the rest counted at their median. Kept reports: each member "
         "sends the reports of the trainer ranks it ran with its next read (replays). Memory: bytes in use "
         "(glibc `mallinfo2`, every arena) held by the coordinator. Medians of "
         f"{reps} steps per point.\n")

L.append("## Table\n")
head = "| metric |" + "".join(f" W={w} S={s} |" for s in Ss for w in Ws)
L.append(head)
L.append("|---|" + "---|" * (len(Ws) * len(Ss)))
L.append("| blocks per step |" + "".join(f" {at[(w, s)]['blocks']} |" if (w, s) in at else " – |"
                                       for s in Ss for w in Ws))
for label, get, fmt in metrics:
    L.append(f"| {label} |" + "".join(f" {show(fmt, value(get, at[(w, s)]))} |" if (w, s) in at else " – |"
                                      for s in Ss for w in Ws))
L.append("")

L.append("## Growth exponents\n")
L.append("Log-log slopes between neighbouring grid points: 1.00 is linear, 2.00 quadratic, 0 flat. "
         "Slopes of quantities near the timer's or the allocator's resolution (well under 1 ms or 1 MB) "
         "are noise.\n")
cols = []
for s in Ss:
    for a, b in zip(Ws, Ws[1:]):
        cols.append(("W", s, a, b))
for w in Ws:
    for a, b in zip(Ss, Ss[1:]):
        cols.append(("S", w, a, b))
L.append("| metric |" + "".join(
    f" in W, S={fixed}: {a}→{b} |" if kind == "W" else f" in S, W={fixed}: {a}→{b} |" for kind, fixed, a, b in cols))
L.append("|---|" + "---|" * len(cols))
for label, get, fmt in metrics:
    row = f"| {label} |"
    for kind, fixed, a, b in cols:
        ka, kb_ = ((a, fixed), (b, fixed)) if kind == "W" else ((fixed, a), (fixed, b))
        va = value(get, at[ka]) if ka in at else None
        vb = value(get, at[kb_]) if kb_ in at else None
        row += f" {slope(va, vb, a, b)} |"
    L.append(row)
L.append("")

if before_path:
    before = {(r["W"], r["S"]): r for r in (json.loads(l) for l in open(before_path) if l.strip())}
    L.append(f"## Before and after {before_label}\n")
    L.append(f"Before: `{before_path}` (the same benchmark on the tree before {before_label}).\n")
    keys = [k for k in sorted(at, key=lambda k: (k[1], k[0])) if k in before]
    L.append("| metric |" + "".join(f" W={w} S={s} before → after |" for w, s in keys))
    L.append("|---|" + "---|" * len(keys))
    for label, get, fmt in metrics:
        L.append(f"| {label} |" + "".join(f" {show(fmt, value(get, before[k]))} → {show(fmt, value(get, at[k]))} |"
                                          for k in keys))
    L.append("")

# Hand-written notes below the marker survive a rerun.
marker = "<!-- notes: kept by run.sh -->"
notes = ""
if os.path.exists(out):
    text = open(out).read()
    if marker in text:
        notes = text[text.index(marker):]
open(out, "w").write("\n".join(L) + "\n" + notes)
print("\n".join(L))
PY
