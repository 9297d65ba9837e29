"""Rebuild docs/benchmarks.md from the sections the bench scripts write under docs/bench/.

Each benchmark script owns one section file ``docs/bench/<name>.md`` (with its JSON and PNG
beside it). This script only concatenates them in a fixed order, so the report is always the
sum of what the scripts last measured. Run by ``make bench`` after the scripts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ORDER = [
    "dgcc_engine",
    "tpcc_soak",
    "dgcc_cluster",
    "dgcc_logging",
    "protocols",
    "protocols_nodes",
    "protocols_logged",
    "dgcc_postgres",
    "yatt_rollout",
    "yatt_step",
    "yatt_lora",
    "yatt_gpu",
    "yatt_gpu_control",
    "yatt_trl",
    "yatt_demo",
    "yatt_control_controllers",
    "yatt_control_placement",
    "yatt_placement_ceiling",
]
# written only where a GPU, or the demo's timing, ran
OPTIONAL = {"yatt_gpu", "yatt_gpu_control", "yatt_demo"}
HEADER = """# Benchmarks

Made by `make bench` (`tools/stitch_benchmarks.py` joins the sections that each script in
`dgcc/bench/` and `yatt/bench/` writes under `docs/bench/`). Each section is its script's last
run, so sections may come from different commits and machines; each says how it was measured
and where. Ratios measured side by side in one run are the figures to quote; absolute CPU times
vary with the machine's load.
"""
_IMAGE = re.compile(r"(!\[[^\]]*\]\()([^/)]+)\)")


def main(docs: Path) -> int:
    """Join the sections; 1 (with the reasons on stderr, nothing written) when a section the
    report needs is missing or links a plot that is not there. A section file not in ORDER is
    left out, with a warning."""
    sections = {path.stem: path for path in (docs / "bench").glob("*.md")}
    problems = [
        f"{name}.md is missing (its bench script did not write it)"
        for name in ORDER
        if name not in sections and name not in OPTIONAL
    ]
    for name in sorted(set(sections) - set(ORDER)):
        print(
            f"stitch_benchmarks: left out docs/bench/{name}.md (not a known section)",
            file=sys.stderr,
        )
    names = [name for name in ORDER if name in sections]
    parts = [HEADER]
    for name in names:
        text = sections[name].read_text().strip() + "\n"
        problems += [
            f"{name}.md links {image}, which is not in docs/bench"
            for _, image in _IMAGE.findall(text)
            if not (docs / "bench" / image).is_file()
        ]
        # A section links its plots beside itself; from docs/ they live under bench/.
        parts.append(_IMAGE.sub(r"\1bench/\2)", text))
    if problems:
        for problem in problems:
            print(f"stitch_benchmarks: {problem}", file=sys.stderr)
        return 1
    (docs / "benchmarks.md").write_text("\n".join(parts))
    print(f"docs/benchmarks.md: {len(names)} sections ({', '.join(names) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(__file__).resolve().parent.parent / "docs"))
