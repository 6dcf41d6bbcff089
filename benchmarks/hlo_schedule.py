"""What a compiled program's kernels compute and where XLA scheduled them: two compiled
programs (`kernel_profile --save-hlo DIR` writes each variant's compiled HLO and profile)
compared fusion by fusion, and the placement of their column sums.

    python -m benchmarks.hlo_schedule DIR/prune_dense.hlo.txt DIR/prune_pit.hlo.txt
    python -m benchmarks.hlo_schedule A.hlo.txt B.hlo.txt --profile DIR/prune.json --names dense,pit

Fusions are matched across programs by their fused computation with names, layouts and
metadata stripped (XLA names the same fusion differently in each program), so a kernel's
time in one program meets the same computation's time in the other. The placement metric
counts the reductions to a 1-D result (bias and layer-norm gradients: sums over tokens)
that run within `near` kernels of the kernel that produced their input: in the pruned BERT
step at 20 % density (H200, 2026-11-29) 65 of 65 in dense and 3 in pit (docs/workloads.md,
forty-fourth session).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
from typing import Dict, List, Optional, Tuple

_INSTR = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")


def kernel_name(hlo_name: str) -> str:
    """The name a profiler trace gives the kernel of HLO instruction `hlo_name`."""
    return hlo_name.replace(".", "_").replace("-", "_")


def _computations(text: str) -> Dict[str, List[str]]:
    comps, name, body = {}, None, []
    for line in text.split("\n"):
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            m = re.match(r"(?:ENTRY )?%([\w.\-]+) ", line)
            name, body = (m.group(1) if m else None), []
        elif line.startswith("}") and name is not None:
            comps[name] = body
            name = None
        elif name is not None:
            body.append(line)
    return comps


def _signature(body: List[str]) -> str:
    """A fused computation without its names, layouts and metadata."""
    lines = []
    for line in body:
        line = re.sub(r",? metadata=\{[^}]*\}", "", line.strip())
        line = re.sub(r"%[\w.\-]+", "%", line)
        line = re.sub(r"\{[0-9,]*\}", "", line)
        lines.append(line)
    return hashlib.md5("\n".join(lines).encode()).hexdigest()[:10]


def fusions(text: str) -> Dict[str, Tuple[str, str, str, str]]:
    """{kernel name: (signature, kind, result shape, op_name)} of a compiled HLO module's fusions."""
    comps = _computations(text)
    out = {}
    for line in text.split("\n"):
        m = _INSTR.match(line)
        if not m or m.group(3) != "fusion":
            continue
        calls = re.search(r"calls=%([\w.\-]+)", line)
        kind = re.search(r"kind=(\w+)", line)
        op = re.search(r'op_name="([^"]*)"', line)
        body = comps.get(calls.group(1), []) if calls else []
        out[kernel_name(m.group(1))] = (_signature(body), kind.group(1) if kind else "?", m.group(2),
                                        op.group(1) if op else "")
    return out


def attribute(top: List, text: str) -> Dict[str, List]:
    """{what: [us, launches, description]} of a profile's kernels ([name, us, launches]):
    fusions keyed by their signature, other kernels by name."""
    table = fusions(text)
    out = collections.defaultdict(lambda: [0.0, 0.0, ""])
    for name, us, n in top:
        if name in table:
            sig, kind, shape, op = table[name]
            key, desc = f"{sig} {kind}", f"{shape[:60]} | {re.sub(r'^jit[(][^)]*[)]/', '', op)[:90]}"
        else:
            key, desc = "kernel " + name[:60], ""
        row = out[key]
        row[0] += us
        row[1] += n
        row[2] = row[2] or desc
    return dict(out)


def diff(top_a: List, text_a: str, top_b: List, text_b: str, rows: int = 30) -> List[Tuple]:
    """(us in a, us in b, b - a, launches a, launches b, what, description), largest |b - a| first."""
    a, b = attribute(top_a, text_a), attribute(top_b, text_b)
    keys = set(a) | set(b)
    get = lambda d, k: d.get(k, [0.0, 0.0, ""])  # noqa: E731
    table = [(get(a, k)[0], get(b, k)[0], get(b, k)[0] - get(a, k)[0], get(a, k)[1], get(b, k)[1], k,
              get(a, k)[2] or get(b, k)[2]) for k in keys]
    return sorted(table, key=lambda r: -abs(r[2]))[:rows]


def reduction_distances(text: str) -> List[int]:
    """For each reduction fusion with a 1-D result in the entry computation's schedule, how
    many kernels (fusions and custom calls) after its input's producer it runs."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("ENTRY")), None)
    if start is None:
        return []
    pos, tuple_of, order, out = {}, {}, 0, []
    for line in lines[start + 1:]:
        if line.startswith("}"):
            break
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape, op, rest = m.groups()
        first = re.match(r"%([\w.\-]+)", rest)
        if op == "get-tuple-element" and first:
            tuple_of[name] = tuple_of.get(first.group(1), first.group(1))
            continue
        if op not in ("fusion", "custom-call"):
            continue
        order += 1
        pos[name] = order
        if op == "fusion" and "reduce" in name and re.fullmatch(r"\w+\[\d+\]\{0\}", shape) and first:
            src = tuple_of.get(first.group(1), first.group(1))
            if src in pos:
                out.append(order - pos[src])
    return out


def placement(text: str, near: int = 2) -> dict:
    d = reduction_distances(text)
    return {"reductions": len(d), "near": sum(1 for x in d if x <= near),
            "median_distance": sorted(d)[len(d) // 2] if d else None}


def main(argv: Optional[List[str]] = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hlo_a")
    ap.add_argument("hlo_b")
    ap.add_argument("--profile", default=None, help="kernel_profile --save-hlo's JSON: per-kernel times")
    ap.add_argument("--names", default=None, help="the two variants' names in that JSON (a,b)")
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args(argv)
    texts = [open(p).read() for p in (args.hlo_a, args.hlo_b)]
    for path, text in zip((args.hlo_a, args.hlo_b), texts):
        print(f"{path}: column sums {placement(text)}")
    if args.profile:
        prof = json.load(open(args.profile))
        a, b = args.names.split(",") if args.names else [k for k in prof if isinstance(prof[k], dict)][:2]
        top_a, top_b = prof[a].get("top", []), prof[b].get("top", [])
        if not (top_a and top_b):
            print("the profile has no kernel times (a CPU run)")
            return
        print(f"us a call: {a} -> {b}, largest differences (fusions matched by computation)")
        for ua, ub, d, na, nb, key, desc in diff(top_a, texts[0], top_b, texts[1], args.rows):
            print(f"{ua:9.1f} {ub:9.1f} {d:+9.1f}  x{na:4.0f}/{nb:4.0f}  {key}  {desc}")


if __name__ == "__main__":
    main()
