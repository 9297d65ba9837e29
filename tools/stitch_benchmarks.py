"""Rebuild docs/benchmarks.md from the sections the bench scripts write under docs/bench/.

Each benchmark script owns one section file ``docs/bench/<name>.md`` (with its JSON and PNG
beside it). This script concatenates them in a fixed order, so the report is always the sum of
what the scripts last measured, under a table of the commit each section was measured at and
the commits to its code since. Run by ``make bench`` after the scripts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ORDER = [
    "dgcc_engine",
    "tpcc_soak",
    "dgcc_cluster",
    "dgcc_logging",
    "protocols",
    "protocols_nodes",
    "protocols_cpu",
    "protocols_logged",
    "dgcc_postgres",
    "yatt_rollout",
    "yatt_step",
    "yatt_lora",
    "yatt_checkpointing",
    "yatt_gpu",
    "yatt_gpu_control",
    "yatt_trl",
    "yatt_dpo_trl",
    "yatt_demo",
    "yatt_control_controllers",
    "yatt_control_placement",
    "yatt_placement_ceiling",
    "yatt_placement_ceiling_countdown",
    "yatt_placement_ceiling_lora",
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
# sections that share a JSON file: (file, its key holding the section's run)
_JSON_OF = {
    "yatt_control_controllers": ("yatt_control", "controllers_host"),
    "yatt_control_placement": ("yatt_control", "placement"),
}
_COMMIT = re.compile(r"[0-9a-f]{7,40}")


def measured_commit(bench: Path, name: str) -> str | None:
    """The commit a section's run recorded in its JSON: its host facts' ``git_commit`` (or a
    top-level one), else the shallowest ``git_commit`` or ``commit`` field; None where there is
    none, or the run could not tell (``unknown``)."""
    stem, key = _JSON_OF.get(name, (name, None))
    try:
        data = json.loads((bench / f"{stem}.json").read_text())
    except (OSError, ValueError):
        return None
    level = [data.get(key) if key and isinstance(data, dict) else data]
    if isinstance(level[0], dict):
        for facts in (level[0].get("host"), level[0].get("facts"), level[0]):
            if isinstance(facts, dict) and "git_commit" in facts:
                return _commit(facts["git_commit"])
    while level:  # breadth first
        deeper = []
        for node in level:
            if isinstance(node, dict):
                for field in ("git_commit", "commit"):
                    if field in node:
                        return _commit(node[field])
                deeper += [value for value in node.values() if isinstance(value, dict | list)]
            elif isinstance(node, list):
                deeper += [value for value in node[:1] if isinstance(value, dict | list)]
        level = deeper
    return None


def _commit(value: object) -> str | None:
    return value if isinstance(value, str) and _COMMIT.fullmatch(value) else None


def changes_since(repo: Path, commit: str, paths: list[str]) -> int | None:
    """Commits that touched ``paths`` (in ``repo``) after ``commit``; None when git cannot
    tell (no git, or a commit this clone lacks)."""
    try:
        done = subprocess.run(
            ["git", "rev-list", "--count", f"{commit}..HEAD", "--", *paths],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip().isdigit() else None


def freshness(bench: Path, repo: Path, names: list[str]) -> list[str]:
    """A table of each section's commit and how many commits have touched its package's code
    or bench scripts since (dgcc's or yatt's), so a stale section shows."""
    lines = [
        "| section | measured at | commits to its code since |",
        "|---|---|---:|",
    ]
    for name in names:
        package = "yatt" if name.startswith("yatt_") else "dgcc"
        commit = measured_commit(bench, name)
        if commit is None:
            lines.append(f"| {name} | not recorded | ? |")
            continue
        count = changes_since(repo, commit, [f"{package}/src", f"{package}/bench"])
        since = "?" if count is None else f"{count}" if count == 0 else f"**{count}**"
        lines.append(f"| {name} | {commit[:8]} | {since} |")
    return lines


def _head(repo: Path) -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        )
    except OSError:
        return "an unknown commit"
    return done.stdout.strip() if done.returncode == 0 else "an unknown commit"


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
    freshness_text = "\n".join([
        f"Where each section's figures come from: the commit its run recorded, and how many "
        f"commits up to {_head(docs.parent)} (when this report was joined) touched its "
        "package's code or bench scripts since, in bold where any did. That count is an upper "
        "bound on what could have moved its figures: it includes changes the section does "
        "not exercise.",
        "",
        *freshness(docs / "bench", docs.parent, names),
    ])  # fmt: skip
    parts = [HEADER, freshness_text + "\n"]
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
