"""What nvcc costs a student's required stages: a run a stage, against the one run that the grader makes of them,
each stage in a namespace of its own (autograder.backends.gpu_batch).

    .venv/bin/python bench/nvcc_batch.py [--rounds 3] [--arch sm_90]

Printed: the core-seconds of each way (nvcc and the programs it runs, the median of the rounds), and whether
each kernel's PTX is the same either way but for its names. Needs nvcc; no GPU.
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import tempfile
from pathlib import Path

from autograder.backends import gpu_batch
from autograder.backends.gpu import NVCC_OPTIONS, find_nvcc
from autograder.references import reference_source
from autograder.stages import REQUIRED_STAGE_IDS, Stage, get_stage


def core_seconds(argv: list[str], folder: Path) -> float:
    """The CPU time of `argv` and every process it ran."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=folder, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def entries(ptx: str) -> dict[str, str]:
    """Each kernel's PTX body by its symbol, with every symbol name and source position left out."""
    found = {}
    variable = (r"^\s*(?:\.extern\s+|\.visible\s+|\.weak\s+)*\.(?:shared|global|const)\b.*?([\w$]+)(?:\[\d*\])?"
                r"\s*(?:=[^;]*)?;")
    declared = re.findall(variable, ptx, flags=re.MULTILINE)
    for match in re.finditer(r"\.entry\s+(\S+?)\(", ptx):
        start = ptx.index("{", match.end())
        depth, end = 0, start
        for end in range(start, len(ptx)):
            depth += {"{": 1, "}": -1}.get(ptx[end], 0)
            if depth == 0:
                break
        body = re.sub(r"^\s*\.(loc|file)\b.*$", "", ptx[start : end + 1], flags=re.MULTILINE)
        body = re.sub(r"\b_Z\w+|\$L__\w+", "NAME", body)
        for name in declared:  # the module's own variables (`sdata` alone, `_ZN8ag_naive5sdataE` in a namespace)
            body = re.sub(rf"(?<![\w$]){re.escape(name)}(?![\w$])", "NAME", body)
        found[match[1]] = " ".join(body.split())
    return found


def kernels(ptx: str, stage: Stage | None = None) -> list[str]:
    """The bodies of a module's kernels, in order, or of those in `stage`'s namespace of a batch."""
    namespace = gpu_batch.namespace_of(stage) if stage else ""
    return sorted(body for name, body in entries(ptx).items() if f"{len(namespace)}{namespace}" in name or not stage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    nvcc = find_nvcc()
    if nvcc is None:
        parser.error("nvcc is not installed here")
    texts = {stage: reference_source(stage).text for stage in REQUIRED_STAGE_IDS}
    options = [f"-arch={args.arch}", *NVCC_OPTIONS]
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        for stage, text in texts.items():
            (folder / f"{stage}.cu").write_text(text)
        plans = {stage: gpu_batch.plan(text) for stage, text in texts.items()}
        if None in plans.values():
            parser.error(f"a reference stage would be compiled alone: {[s for s, found in plans.items() if not found]}")
        together_text = gpu_batch.source([(get_stage(s), texts[s], found) for s, found in plans.items()])
        (folder / "all.cu").write_text(together_text)
        each, together = [], []
        for _ in range(args.rounds):
            each.append(sum(core_seconds([nvcc, "--cubin", *options, "-o", f"{s}.cubin", f"{s}.cu"], folder)
                            for s in texts))
            together.append(core_seconds([nvcc, "--cubin", *options, "-o", "all.cubin", "all.cu"], folder))
        print(f"{len(texts)} stages, {len(texts)} nvcc runs: {statistics.median(each):.2f} core-seconds")
        print(f"{len(texts)} stages, one nvcc run:  {statistics.median(together):.2f} core-seconds")
        for stage in texts:
            subprocess.run([nvcc, "-ptx", *options, "-o", f"{stage}.ptx", f"{stage}.cu"], cwd=folder, check=True)
        subprocess.run([nvcc, "-ptx", *options, "-o", "all.ptx", "all.cu"], cwd=folder, check=True)
        together_ptx = (folder / "all.ptx").read_text()
        for stage in texts:
            alone = kernels((folder / f"{stage}.ptx").read_text())
            same = alone == kernels(together_ptx, get_stage(stage))
            print(f"  {stage:<16} {len(alone)} kernel(s), PTX {'the same but for names' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
