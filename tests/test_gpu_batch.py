"""A student's GPU stages compiled in one nvcc run (autograder.backends.gpu_batch): each stage gets exactly what it
gets compiled alone, the same code, the same errors and warnings, or it is compiled alone.

Needs nvcc (it compiles without a GPU); the gpu-marked test grades a batched hand-in on a GPU.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autograder.backends import gpu_batch
from autograder.backends.gpu import NVCC_OPTIONS, find_nvcc
from autograder.build import Builder
from autograder.errors import CompileError
from autograder.records import Build, DeviceInfo, KernelSource, SourceLocation
from autograder.sandbox import Sandbox
from autograder.stages import STAGES, Stage, get_stage

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (it compiles without a GPU)")

ROOT = Path(__file__).resolve().parents[1]
DEVICE = DeviceInfo("gpu", "nvcc", compute_capability="9.0")
KERNEL_FOLDERS = ("solutions/reduction/kernels", "tests/cpu_kernels", "tests/known", "tests/technique_kernels")

HEADER = "__global__ void {name}(const float *g_in, float *g_out, unsigned int n)"
BODY = """{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = i < n ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += %s;
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
"""
LOOP = "    for (unsigned int s"


def kernel(stage_id: str, add: str = "sdata[tid + s]", before: str = "") -> str:
    """A sequential-addressing kernel of `stage_id`'s name, adding `add`, after `before`."""
    return before + HEADER.format(name=get_stage(stage_id).kernel_name) + "\n" + BODY % add


def bodied(stage_id: str, body: str) -> str:
    """A kernel of `stage_id`'s name and signature with this body."""
    return HEADER.format(name=get_stage(stage_id).kernel_name) + "\n" + body + "\n"


# Hand-ins of several stages each, of the kinds a batch could compile otherwise than alone: each stage must get
# what it gets alone, whether or not the batch is used.
HAND_INS: dict[str, dict[str, str]] = {
    "clean": {"naive": kernel("naive"), "sequential": kernel("sequential"), "shuffle": kernel("shuffle")},
    "same helper names, different helpers": {
        "naive": kernel("naive", "twice(sdata[tid + s])", "__device__ float twice(float v) { return v; }\n"),
        "sequential": kernel("sequential", "twice(sdata[tid + s])",
                             "__device__ float twice(float v) { return 2 * v; }\n"),
    },
    "a helper only another stage defines": {
        "naive": kernel("naive", "helper(sdata[tid + s])", "__device__ float helper(float v) { return v; }\n"),
        "sequential": kernel("sequential", "helper(sdata[tid + s])"),
    },
    "a macro only another stage defines": {
        "naive": kernel("naive", "sdata[tid + s] * SCALE", "#define SCALE 1\n"),
        "sequential": kernel("sequential", "sdata[tid + s] * SCALE"),
    },
    "the same macro, other values": {
        "naive": kernel("naive", "sdata[tid + s] * SCALE", "#define SCALE 1\n"),
        "sequential": kernel("sequential", "sdata[tid + s] * SCALE", "#define SCALE 2\n"),
    },
    "a header's function overloaded": {  # alone, max(float, float) is the header's; in a namespace, this one
        "naive": kernel("naive", "max(sdata[tid + s], 0.0f)",
                        "__device__ double max(double a, double b) { return a; }\n"),
        "sequential": kernel("sequential"),
    },
    "a header's function defined again": {
        "naive": kernel("naive", "fminf(sdata[tid + s], 1e30f)",
                        "__device__ float fminf(float a, float b) { return a + b; }\n"),
        "sequential": kernel("sequential"),
    },
    "a header's type used": {
        "naive": kernel("naive", "first(make_float2(sdata[tid + s], 0.0f))",
                        "__device__ float first(float2 v) { return v.x; }\n"),
        "sequential": kernel("sequential"),
    },
    "a header's type in one stage of three": {  # that stage alone; the others still together
        "naive": kernel("naive", "at(sdata, tid + s)",
                        "__device__ float at(const float *p, size_t i) { return p[i]; }\n"),
        "sequential": kernel("sequential", "sdata[tid + s] * fmaxf(1.0f, 0.0f)"),
        "shuffle": kernel("shuffle"),
    },
    "a header's namespace declared a variable": {
        "naive": kernel("naive", "sdata[tid + s] + std", "__device__ float std = 0.0f;\n"),
        "sequential": kernel("sequential"),
    },
    "a builtin's name": {
        "naive": kernel("naive", "__fadd_rn(sdata[tid + s], 0.0f)",
                        "__device__ float __fadd_rn(float a, float b) { return a - b; }\n"),
        "sequential": kernel("sequential"),
    },
    "the enclosing function's name asked": {
        "naive": kernel("naive", "sdata[tid + s] * (sizeof(__PRETTY_FUNCTION__) > 60 ? 2 : 1)"),
        "sequential": kernel("sequential"),
    },
    "a brace too many": {
        "naive": kernel("naive") + "}\n__device__ float spare;\n{\n",
        "sequential": kernel("sequential"),
    },
    "a brace in digraphs": {
        "naive": kernel("naive").replace("{\n    extern", "<%\n    extern", 1),
        "sequential": kernel("sequential"),
    },
    "an unclosed conditional": {
        "naive": kernel("naive") + "#if 1\n",
        "sequential": "#endif\n" + kernel("sequential"),
    },
    "a line splice at the end": {
        "naive": kernel("naive") + "// the end \\",
        "sequential": kernel("sequential") + "#define LAST 1 \\",
    },
    "an enumerator and a friend": {
        "naive": kernel("naive", "sdata[tid + s] * ONE", "enum { ONE = 1 };\n"),
        "sequential": kernel("sequential", "sdata[tid + s]",
                             "struct S { friend __device__ float f(S) { return 0; } };\n"),
    },
    "a qualified name": {
        "naive": kernel("naive", "::fmaxf(sdata[tid + s], -1e30f)"),
        "sequential": kernel("sequential"),
    },
    "extern C": {
        "naive": 'extern "C" ' + kernel("naive"),
        "sequential": kernel("sequential"),
    },
    "a compile error in one stage": {
        "naive": kernel("naive", "sdata[tid + t]"),
        "sequential": kernel("sequential"),
        "shuffle": kernel("shuffle"),
    },
    "a warning in one stage": {
        "naive": kernel("naive", "sdata[tid + s]", "__device__ void unused_here() { int unused = 0; }\n"),
        "sequential": kernel("sequential"),
    },
    "a warning in one stage of three": {
        "naive": kernel("naive", "sdata[tid + s]", "__device__ void unused_here() { int unused = 0; }\n"),
        "sequential": kernel("sequential"),
        "shuffle": kernel("shuffle"),
    },
    "a kernel that prints": {
        "naive": kernel("naive").replace("if (tid == 0)", 'if (tid == 0 && n == 7) printf("x");\n    if (tid == 0)'),
        "sequential": kernel("sequential"),
    },
    "large device variables": {
        "naive": kernel("naive", "sdata[tid + s] + big[0]", "__device__ float big[1 << 20];\n"),
        "sequential": kernel("sequential"),
    },
    "a wrong signature": {
        "naive": kernel("naive").replace("unsigned int n", "int n"),
        "sequential": kernel("sequential"),
    },
    # Found by a red team: each got a batch Build for a stage that does not compile alone, or compiles otherwise.
    "a name declared, then defined a macro": {
        "naive": kernel("naive", "max(sdata[tid + s], 0.0f)",
                        "__device__ double max(double a, double b) { return a; }\n") + "#define max\n",
        "sequential": kernel("sequential", "fminf(sdata[tid + s], 1e30f)",
                             "__device__ float fminf(float a, double b) { return a; }\n") + "#define fminf\n",
    },
    "a class of the namespace declared in a class's body": {  # alone the header's function hides the class
        "naive": kernel("naive", "sdata[tid + s] * pick<fminf>()",
                        "struct Hide { struct fminf *p; };\n"
                        "template <class T> __device__ float pick() { return 1.0f; }\n"
                        "template <float (*F)(float, float)> __device__ float pick() { return 2.0f; }\n"),
        "sequential": kernel("sequential"),
    },
    "an anonymous union's members": {
        "naive": kernel("naive", before="static union { int fminf; };\n"),
        "sequential": kernel("sequential"),
        "shuffle": kernel("shuffle", before="typedef struct { float a; } Pair;\n"),
    },
    "#pragma unroll asking the function's name": {
        "naive": kernel("naive").replace(LOOP, "#pragma unroll (sizeof(__PRETTY_FUNCTION__) > 62 ? 1 : 8)\n" + LOOP),
        "sequential": kernel("sequential").replace(LOOP, "#pragma unroll 4\n" + LOOP),
        "shuffle": kernel("shuffle").replace(LOOP, "#pragma unroll\n" + LOOP),
    },
    "a macro call left open across stages": {
        "naive": kernel("naive") + "#define SWALLOW(...)\nSWALLOW(\n",
        "sequential": ")\n" + kernel("sequential"),
        "shuffle": kernel("shuffle", "sdata[tid + s] * SCALE", "#define SCALE (1 + (2 - 2))\n"),
    },
    # A second red team: a name declared inside braces that is the namespace's, unseen by the probes.
    "a function declared in a block": {
        "naive": bodied("naive", "{ __device__ int fminf(float, float);"
                                 " if (threadIdx.x == 0) g_out[blockIdx.x] = g_in[0]; }"),
        "sequential": kernel("sequential"),
    },
    "a function declared in a block through a typedef": {
        "naive": bodied("naive", "{ typedef double F(float, float); F fminf;"
                                 " if (threadIdx.x == 0) g_out[blockIdx.x] = sizeof(fminf(1.f, 2.f)); }"),
        "sequential": kernel("sequential"),
    },
    "extern __shared__ of a type that holds a semicolon": {
        "naive": bodied("naive", "{ extern __shared__ decltype(({ 1.0f; })) fmaxf[];"
                                 " fmaxf[threadIdx.x] = g_in[threadIdx.x]; __syncthreads();"
                                 " if (threadIdx.x == 0) g_out[blockIdx.x] = fmaxf[1]; }"),
        "sequential": kernel("sequential"),
    },
    "extern __shared__ of a class defined there": {
        "naive": bodied("naive", "{ extern __shared__ struct S { int a; } fminf[];"
                                 " if (threadIdx.x == 0) g_out[blockIdx.x] = g_in[0]; }"),
        "sequential": kernel("sequential"),
    },
    "templates and local structs": {
        "naive": kernel("naive", "Add<float>()(sdata[tid + s])",
                        "template <typename T> struct Add { __device__ T operator()(T v) const { return v; } };\n"),
        "sequential": kernel("sequential", "Add<float>()(sdata[tid + s])",
                             "template <typename T> struct Add { __device__ T operator()(T v) const { return -v; } "
                             "};\n"),
    },
}
# The stages each hand-in gets from a batch (all its stages where it is not named here): none where the batch is
# not used, a stage but one where that one is compiled alone (the others still batched, as more than one).
NONE: set[str] = set()
BATCHED: dict[str, set[str]] = {
    **dict.fromkeys(["a helper only another stage defines", "a macro only another stage defines",
                     "a warning in one stage", "a header's function defined again",
                     "a header's function overloaded", "a header's type used", "an unclosed conditional"], NONE),
    **dict.fromkeys(["a header's namespace declared a variable", "a builtin's name",
                     "the enclosing function's name asked", "a brace too many", "an enumerator and a friend",
                     "a qualified name", "extern C", "a kernel that prints", "large device variables"], NONE),
    "a wrong signature": {"sequential"},  # its kernel is not in the batch's module: alone it gets its message
    "a header's type in one stage of three": {"sequential", "shuffle"},
    "a compile error in one stage": {"sequential", "shuffle"},  # nvcc names its file: it alone, the rest batched
    "a warning in one stage of three": {"sequential", "shuffle"},
    "a name declared, then defined a macro": NONE,
    "a class of the namespace declared in a class's body": NONE,
    "an anonymous union's members": {"sequential", "shuffle"},
    "#pragma unroll asking the function's name": {"sequential", "shuffle"},
    "a macro call left open across stages": NONE,
    "a function declared in a block": NONE,
    "a function declared in a block through a typedef": NONE,
    "extern __shared__ of a type that holds a semicolon": NONE,
    "extern __shared__ of a class defined there": NONE,
}

def items_of(hand_in: dict[str, str]) -> list[tuple[Stage, KernelSource]]:
    return [(get_stage(stage_id), KernelSource(text, SourceLocation("hand-in.ipynb", stage_id, 3, 5)))
            for stage_id, text in hand_in.items()]


def outcome(builder: Builder, stage: Stage, source: KernelSource) -> tuple:
    """What grading sees of a build: its warnings, or its error's messages."""
    try:
        built = builder.build(stage, source)
    except CompileError as error:
        return "does not compile", error.messages
    return "compiles", built.warnings


def together(hand_in: dict[str, str]) -> dict[str, tuple[tuple, Build | None]]:
    builder = Builder(DEVICE, Sandbox())
    items = items_of(hand_in)
    with ThreadPoolExecutor(max_workers=16) as pool:
        builder.start(items, pool)
        results = {}
        for stage, source in items:
            found = outcome(builder, stage, source)
            results[stage.id] = found, builder.build(stage, source) if found[0] == "compiles" else None
    return results


def batched(build: Build | None) -> bool:
    return build is not None and "symbols" in build.details


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", str(tmp_path / "cache"))
    yield


@pytest.mark.parametrize("name", sorted(HAND_INS))
def test_each_stage_gets_what_it_gets_alone(name: str) -> None:
    hand_in = HAND_INS[name]
    alone = {stage.id: outcome(Builder(DEVICE, Sandbox()), stage, source) for stage, source in items_of(hand_in)}
    found = together(hand_in)
    assert {stage_id: result for stage_id, (result, _) in found.items()} == alone
    used = {stage_id for stage_id, (_, build) in found.items() if batched(build)}
    assert used == BATCHED.get(name, set(hand_in))


def test_the_cases_above_cover_every_outcome() -> None:
    """Some hand-ins are batched whole, some not at all, and some in part."""
    assert set(BATCHED) <= set(HAND_INS)
    kinds = {"whole" if BATCHED.get(name, set(hand_in)) == set(hand_in) else "none" if not BATCHED[name] else "part"
             for name, hand_in in HAND_INS.items()}
    assert kinds == {"whole", "none", "part"}

def stage_of(text: str) -> Stage | None:
    return next((stage for stage in STAGES if f" {stage.kernel_name}(" in text), None)


def test_every_kernel_of_the_project_gets_the_same_code_in_a_batch() -> None:
    """The project's kernels of every stage (the references, the CPU backend's, the known hand-ins, the technique
    tests), batched a kernel per stage: each kernel's PTX is the one it gets alone, but for names."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from nvcc_batch import kernels
    finally:
        sys.path.remove(str(ROOT / "bench"))
    by_stage: dict[str, list[str]] = {}
    for folder in KERNEL_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.cu")):
            text = path.read_text()
            stage = stage_of(text)
            if stage is not None and gpu_batch.plan(text) is not None:
                by_stage.setdefault(stage.id, []).append(text)
    assert len(by_stage) >= 6 and sum(map(len, by_stage.values())) >= 50
    nvcc = find_nvcc()
    compared = 0
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)

        def ptx(text: str) -> str | None:
            (folder / "kernel.cu").write_text(text)
            argv = [nvcc, "--ptx", "-arch=sm_90", *NVCC_OPTIONS, "-o", "kernel.ptx", "kernel.cu"]
            done = subprocess.run(argv, cwd=folder, capture_output=True, text=True)
            return (folder / "kernel.ptx").read_text() if done.returncode == 0 and not done.stderr else None

        for round_ in range(max(map(len, by_stage.values()))):
            texts = {stage_id: kernels[round_] for stage_id, kernels in by_stage.items() if round_ < len(kernels)}
            alone = {stage_id: ptx(text) for stage_id, text in texts.items()}
            texts = {stage_id: text for stage_id, text in texts.items() if alone[stage_id] is not None}
            batch = ptx(gpu_batch.source([(get_stage(s), t, gpu_batch.plan(t)) for s, t in texts.items()]))
            if batch is None:
                continue  # not used: each stage is compiled alone
            for stage_id, text in texts.items():
                assert kernels(batch, get_stage(stage_id)) == kernels(alone[stage_id]), (stage_id, text[:300])
                compared += 1
    assert compared >= 50


def test_a_batch_is_one_compiler_run_and_its_stages_take_their_kernels_by_their_namespaced_symbols() -> None:
    items = items_of(HAND_INS["clean"])
    found = together(HAND_INS["clean"])
    cubins = {build.file("kernel.cubin") for _, build in found.values()}
    assert len(cubins) == 1
    for stage, _ in items:
        assert found[stage.id][1].details["symbols"] == (stage.mangled_in(f"ag_{stage.id}"),)


@pytest.mark.gpu
def test_on_a_gpu_a_batched_hand_in_is_graded_as_its_stages_alone(tmp_path: Path) -> None:
    """Kernels of three stages, one of them wrong, graded on a GPU from a batch and from builds alone: the same
    results (the GPU loads each stage's kernel from the batch's module by its symbol)."""
    import numpy as np

    from autograder.backends.gpu import GpuBackend
    from autograder.launch import Plan

    hand_in = {"naive": kernel("naive"), "sequential": kernel("sequential", "sdata[tid + s] * 2.0f"),
               "shuffle": kernel("shuffle", "twice(sdata[tid + s])", "__device__ float twice(float v) { return v; }\n")
               .replace("i = blockIdx.x * blockDim.x + tid", "i = blockIdx.x * 2 * blockDim.x + tid")
               .replace("sdata[tid] = i < n ? g_in[i] : 0.0f", "sdata[tid] = (i < n ? g_in[i] : 0.0f) + "
                        "(i + blockDim.x < n ? g_in[i + blockDim.x] : 0.0f)")}  # its stage adds two values a load
    found = together(hand_in)
    assert all(batched(build) for _, build in found.values())
    backend = GpuBackend()
    try:
        data = np.arange(1000, dtype=np.float32) % 7
        sums = {}
        for stage, source in items_of(hand_in):
            alone = Builder(DEVICE, Sandbox()).build(stage, source)
            for way, build in (("batch", found[stage.id][1]), ("alone", alone)):
                plan = Plan.create(backend, backend.load(build), (1000,), 256)
                try:
                    plan.load(data)
                    plan.poison()
                    assert plan.run(check_each_pass=True) == ()
                    sums[stage.id, way] = plan.result()
                finally:
                    plan.release()
    finally:
        backend.close()
    assert sums["naive", "batch"] == sums["naive", "alone"] == float(data.sum())
    assert sums["sequential", "batch"] == sums["sequential", "alone"] != float(data.sum())
    assert sums["shuffle", "batch"] == sums["shuffle", "alone"] == float(data.sum())


def test_a_batch_that_raises_leaves_each_stage_to_its_own_build() -> None:
    """A fault of the batch (a bug, say) is never a stage's verdict: each stage is then built alone."""
    builder = Builder(DEVICE, Sandbox())

    def broken(items: list) -> dict:
        raise IndexError("a bug in the batch")

    builder._build_together = broken
    items = items_of(HAND_INS["clean"])
    with ThreadPoolExecutor(max_workers=8) as pool:
        builder.start(items, pool)
        builds = [builder.build(stage, source) for stage, source in items]
    assert [build.details for build in builds] == [{}] * len(items)


def test_a_stage_left_by_the_batch_is_built_even_where_the_pool_has_closed() -> None:
    builder = Builder(DEVICE, Sandbox())
    builder._build_together = lambda items: {}
    items = items_of(HAND_INS["clean"])
    claimed = [(stage, source, builder._future(stage, source)[0]) for stage, source in items]
    pool = ThreadPoolExecutor(max_workers=1)
    pool.shutdown()
    builder._make_together(claimed, pool)
    assert all(future.result().stage_id == stage.id for stage, _, future in claimed)


def test_no_claimed_build_is_left_unmade_where_the_pool_refuses_the_work() -> None:
    """`build` waits on a claimed build without a limit: where the pool cannot take the work, each gets the error."""
    builder = Builder(DEVICE, Sandbox())
    items = items_of(HAND_INS["clean"])
    pool = ThreadPoolExecutor(max_workers=1)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        builder.start(items, pool)
    for stage, source in items:
        with pytest.raises(RuntimeError):
            builder.build(stage, source)
