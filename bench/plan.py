"""Benchmark: `plan` on a MachineConfig with 5,000 files (50 MiB) against one that changes a
tenth of them. (The agent's resident memory, both modes: bench/live_apply.py.)

    python bench/plan.py [--files 5000] [--total-mib 50] [--runs 7]

Prints the median of repeated runs in one process for: parsing both documents, planning
(diff + verdict) on the parsed configs, and both together. Target: plan <= 200 ms.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.core.plan import plan_update
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import parse_machine_config

IMAGE = "quay.example/os/node@sha256:" + "a" * 64


def build(files: int, size: int, seed: int, changed: set[int]) -> bytes:
    rng = random.Random(seed)
    entries = []
    for i in range(files):
        payload = rng.randbytes(size) if i not in changed else rng.randbytes(size)[::-1]
        source = "data:;base64," + base64.b64encode(payload).decode()
        entries.append({"path": f"/etc/bench/{i:05d}.conf", "mode": 420,
                        "contents": {"source": source}})  # fmt: skip
    doc = {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfig",
        "metadata": {"name": f"rendered-bench-{len(changed)}"},
        "spec": {"osImageURL": IMAGE, "config": {"ignition": {"version": "3.4.0"},
                                                "storage": {"files": entries}}},
    }  # fmt: skip
    return json.dumps(doc).encode()


def median_ms(fn, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--total-mib", type=float, default=50)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    size = int(args.total_mib * 1024 * 1024 / args.files)
    changed = set(random.Random(1).sample(range(args.files), args.files // 10))
    print(f"building: {args.files} files x {size} bytes, {len(changed)} changed", flush=True)
    old_doc, new_doc = build(args.files, size, 7, set()), build(args.files, size, 7, changed)
    print(f"documents: {len(old_doc) / 2**20:.1f} MiB and {len(new_doc) / 2**20:.1f} MiB JSON")
    booted, target = parse_image_ref(IMAGE), parse_image_ref(IMAGE)
    old, new = parse_machine_config(old_doc), parse_machine_config(new_doc)

    def do_plan():
        return plan_update(old, new, booted=booted, target=target)

    result = do_plan()
    assert result.verdict == "refused" and result.image_changes == ("files",), result.verdict
    parse_ms = median_ms(lambda: (parse_machine_config(old_doc), parse_machine_config(new_doc)),
                         args.runs)  # fmt: skip
    plan_ms = median_ms(do_plan, args.runs)
    print(f"plan (diff + verdict, parsed inputs): median {plan_ms:.1f} ms over {args.runs} runs"
          f" (target <= 200 ms)")  # fmt: skip
    print(f"parse both documents:                median {parse_ms:.1f} ms over {args.runs} runs")
    print(f"parse + plan:                        {parse_ms + plan_ms:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
