#!/usr/bin/env python3
"""Two kiln builds (or two programs) against each other, node by node (a measurement, not a
test). On a shared host whose speed changes within seconds, per-node minima over a few
rounds move by 10-25% on layers neither build changed; here each round runs `kiln profile`
with build A and build B back to back (a few inferences each, the order alternating), so a
pair sees the same moment of the host, and the figure is the median over the rounds of
each pair's B/A ratio, per node and for the whole run.

usage: python scripts/ab_profile.py --a OLD_KILN --b NEW_KILN [--program-b OTHER.kiln]
       [--inputs FEEDS.npz] [--rounds 30] [-n 3] [--threads 1] [--top 20] [--strip TEXT]
       PROGRAM.kiln

With --program-b, build B runs that program instead (two compilations of one model: QDQ
against QOperator, an option on and off); nodes are joined by name, less any --strip text. Prints the whole run's
median B/A and quartiles, then the `--top` slowest nodes of A: the median B/A, its
quartiles, and the minimum time of each side (ms).
"""

import argparse
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^\s*\d+\s+([\d.]+)\s")
WHOLE = re.compile(r"whole run ([\d.]+) ms/run")


def profile(kiln, program, inputs, n, threads, strip=()):
    """One `kiln profile` run: (whole-run ms, {node: ms}), each node's name without the
    `strip` texts."""
    cmd = [kiln, "profile", program, "-n", str(n), "-q", "--top", "0", "-O", f"num_of_cores={threads}"]
    if inputs:
        cmd += ["--inputs", inputs]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{kiln} profile {program} failed: {r.stderr.strip()}")
    whole = WHOLE.search(r.stdout)
    if not whole:
        sys.exit(f"{kiln} profile {program}: no whole-run time in its report")
    nodes = {}
    for line in r.stdout.splitlines():
        fields = line.split()
        # The node table: rank, ms/run, share, cum, GFLOP/s, op, precision, node, shapes...
        if ROW.match(line) and len(fields) > 8:
            name = fields[7]
            for text in strip:
                name = name.replace(text, "")
            nodes[name] = float(fields[1])
    return float(whole.group(1)), nodes


def quartiles(values):
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="build A's kiln binary")
    ap.add_argument("--b", required=True, help="build B's kiln binary")
    ap.add_argument("--program-b", help="the program build B runs (default: the same)")
    ap.add_argument("--inputs", help="inputs as an .npz (default: kiln's random inputs)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("-n", type=int, default=3, help="inferences per profile run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--strip", action="append", default=[],
                    help="text removed from node names before joining (repeatable; QDQ against "
                         "QOperator: --strip _quant)")
    ap.add_argument("program")
    a = ap.parse_args()
    program_b = a.program_b or a.program
    whole, per_node, mins = [], {}, {}
    for r in range(a.rounds):
        runs = [("a", a.a, a.program), ("b", a.b, program_b)]
        order = runs if r % 2 == 0 else runs[::-1]
        got = {side: profile(kiln, prog, a.inputs, a.n, a.threads, a.strip) for side, kiln, prog in order}
        (wa, na), (wb, nb) = got["a"], got["b"]
        whole.append(wb / wa)
        for node, ta in na.items():
            tb = nb.get(node)
            if tb is None or ta <= 0:
                continue
            per_node.setdefault(node, []).append(tb / ta)
            lo = mins.get(node, (ta, tb))
            mins[node] = (min(lo[0], ta), min(lo[1], tb))
    q1, q3 = quartiles(whole)
    print(f"whole run: B/A median {statistics.median(whole):.3f} (quartiles {q1:.3f}-{q3:.3f}) over {a.rounds} pairs")
    rows = sorted(per_node.items(), key=lambda kv: -mins[kv[0]][0])[: a.top]
    for node, ratios in rows:
        q1, q3 = quartiles(ratios)
        ta, tb = mins[node]
        print(f"  B/A {statistics.median(ratios):.3f} ({q1:.3f}-{q3:.3f})  min A {ta:.4f}  min B {tb:.4f}  {node}")


if __name__ == "__main__":
    main()
