"""The timing input, drawn once per machine by the grader and read by every GPU worker it starts
(autograder.timing.publish_input): the same values as a worker's own draw, never changed by a worker's timing."""

from __future__ import annotations

import hashlib
import json
import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from autograder import batch, timing
from autograder.backends.cpu import CpuBackend
from autograder.grade import GradeOptions
from autograder.isolation import Worker
from autograder.launch import Plan
from autograder.records import KernelSource
from autograder.references import reference_source
from autograder.sandbox import Sandbox
from autograder.stages import Shape, get_stage
from autograder.timing import (
    TimedKernel,
    TimingSettings,
    prepare_timing,
    publish_input,
    ready_timing,
    time_interleaved,
)
from autograder.verify import Sums, draw, forget

SEED = 20261125
SETTINGS = TimingSettings(n=1 << 16, max2d_shape=(64, 64), warmup=1, min_repetitions=3, max_repetitions=5)
SIZE = (1 << 16,)
TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def no_inputs_kept():
    timing._INPUTS.clear()
    timing._PUBLISHED.clear()
    yield
    timing._INPUTS.clear()
    timing._PUBLISHED.clear()


def kept_input(backend, seed: int, size: tuple[int, ...]) -> tuple[bool, str]:
    """In a worker: whether its timing input of `seed` and `size` is the published file's mapping, and a digest
    of its values."""
    data = timing._INPUTS[seed, math.prod(size)][0]
    return isinstance(data, np.memmap), digest(data)


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()


def test_the_grader_draws_a_timing_input_once_as_a_worker_would(tmp_path: Path) -> None:
    published = publish_input(SEED, SIZE, tmp_path)
    assert published is not None
    path = published.path
    drawn = draw("random", SIZE[0], SEED)
    assert np.array_equal(np.load(path), drawn)
    # Its record tells a worker what it would compute of the values itself.
    assert published.sums == Sums.of(drawn) and published.maximum == float(drawn.max())
    written = path.stat().st_mtime_ns
    timing._PUBLISHED.clear()  # another grading process: the file is there, with the values it draws
    assert publish_input(SEED, SIZE, tmp_path) == published and path.stat().st_mtime_ns == written
    # Nothing half-written beside it: the file, its record, and the lock the grading processes take in turn.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".publishing", f"{path.stem}.json", path.name]


def test_the_1d_and_the_2d_inputs_of_as_many_values_are_one_file_drawn_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_dir: Path
) -> None:
    # 2^26 values and 8192 x 8192 are the same draw: the class's host draws and writes it once, not twice.
    drawn: list[int] = []

    def counted(*args: object) -> np.ndarray:
        drawn.append(1)
        return draw(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(timing, "draw", counted)
    flat, square = publish_input(SEED, (4096,), tmp_path), publish_input(SEED, (64, 64), tmp_path)
    assert flat is not None and flat == square and len(drawn) == 1
    assert sorted(p.name for p in tmp_path.glob("*.npy")) == [f"{SEED}-4096.npy"]
    # A worker maps it once, and takes each stage's expected result from its record: a sum, or the maximum.
    settings = replace(SETTINGS, n=4096, max2d_shape=(64, 64))
    prepare_timing(CpuBackend(cache_dir=cache_dir), ("naive", "max2d"), settings, SEED, flat)
    values = np.load(flat.path)
    assert len(timing._INPUTS) == 1 and kept_input(None, SEED, (4096,)) == (True, digest(values))
    assert timing._timing_input(SEED, (4096,), get_stage("naive"))[1] == Sums.of(values).exact
    assert timing._timing_input(SEED, (64, 64), get_stage("max2d"))[1:] == (float(values.max()), 0.0)
    assert len(drawn) == 1


def test_the_grading_processes_of_a_machine_draw_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Eight grading processes (threads here: each takes the lock on a file of its own opening, as a process does)
    # ask at once at the start of a class; one draws, the others wait for it and read its record.
    drawn: list[int] = []

    def counted(*args: object) -> np.ndarray:
        drawn.append(1)
        return draw(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(timing, "draw", counted)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: publish_input(SEED, SIZE, tmp_path), range(8)))
    assert len(drawn) == 1 and len(set(answers)) == 1 and answers[0] is not None
    timing._PUBLISHED.clear()
    assert publish_input(SEED, SIZE, tmp_path) == answers[0] and len(drawn) == 1  # a later process reads it too


@pytest.mark.parametrize("change", ["another grader", "the file written since", "a damaged record"])
def test_a_record_of_another_grader_or_of_a_file_written_since_is_drawn_again(change: str, tmp_path: Path) -> None:
    published = publish_input(SEED, SIZE, tmp_path)
    assert published is not None
    path, record = published.path, published.path.with_suffix(".json")
    fields = json.loads(record.read_text())
    if change == "another grader":
        record.write_text(json.dumps({**fields, "drawn_by": "autograder-0.0+another/numpy-1.0"}))
    elif change == "the file written since":
        timing._write(path, lambda part: np.save(part, np.full(SIZE, 3e6, np.float32)))  # another grader's
    else:
        record.write_text(record.read_text()[:40])
    timing._PUBLISHED.clear()
    again = publish_input(SEED, SIZE, tmp_path)
    assert again is not None and again.sums == published.sums and again.stamp == timing._stamp(path.stat())
    assert np.array_equal(np.load(path), draw("random", SIZE[0], SEED))
    assert json.loads(record.read_text())["stamp"] == list(again.stamp)


def test_a_file_written_after_its_record_is_never_read_as_the_input(tmp_path: Path, cache_dir: Path) -> None:
    # A worker is handed the grader's record; the file at its path is then another (another grader's draw, say,
    # of the same size and type). The worker draws its own, and computes its own sums.
    published = publish_input(SEED, SIZE, tmp_path)
    assert published is not None
    timing._write(published.path, lambda part: np.save(part, np.full(SIZE, 3e6, np.float32)))
    prepare_timing(CpuBackend(cache_dir=cache_dir), ("naive",), SETTINGS, SEED, published)
    drawn = draw("random", SIZE[0], SEED)
    assert kept_input(None, SEED, SIZE) == (False, digest(drawn))
    assert timing._INPUTS[SEED, SIZE[0]][1] == Sums.of(drawn)


@pytest.mark.parametrize("planted", ["half-written", "another type", "Fortran order", "another format"])
def test_a_file_that_is_not_an_input_of_its_size_is_never_read_as_the_input(
    planted: str, tmp_path: Path, cache_dir: Path
) -> None:
    # Even with a record that names it as it is, a file that is not the input's float32 values is not mapped.
    path = tmp_path / f"{SEED}-{SIZE[0]}.npy"
    drawn = draw("random", SIZE[0], SEED)
    if planted == "half-written":
        np.save(path, drawn)
        path.write_bytes(path.read_bytes()[:1000])
    elif planted == "another type":
        np.save(path, drawn.astype(np.float64))
    elif planted == "Fortran order":
        np.save(path, np.asfortranarray(drawn.reshape(256, 256)))
    else:
        path.write_bytes(b"not an .npy file at all" * 100)
    named = timing.Published(path, timing._stamp(path.stat()), Sums.of(drawn), float(drawn.max()))
    prepare_timing(CpuBackend(cache_dir=cache_dir), ("naive",), SETTINGS, SEED, named)
    assert kept_input(None, SEED, SIZE) == (False, digest(drawn))


def test_only_the_latest_inputs_are_kept(tmp_path: Path) -> None:
    published = [publish_input(seed, (1024,), tmp_path) for seed in range(timing.KEPT_INPUTS + 2)]
    kept = [p.path for p in published[-timing.KEPT_INPUTS :] if p]
    assert sorted(tmp_path.glob("*.npy")) == sorted(kept)
    assert sorted(tmp_path.glob("*.json")) == sorted(path.with_suffix(".json") for path in kept)


def test_where_it_cannot_be_written_each_worker_draws_its_own(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    assert publish_input(SEED, SIZE, tmp_path / "a_file" / "inputs") is None


def test_timing_reads_the_published_input_and_changes_only_its_own_copy(tmp_path: Path, cache_dir: Path) -> None:
    published = publish_input(SEED, SIZE, tmp_path)
    assert published is not None
    backend = CpuBackend(cache_dir=cache_dir)
    kernels = tuple(
        TimedKernel(f"reference {stage_id}", stage_id, reference_source(stage_id)) for stage_id in ("naive", "shuffle")
    )
    prepare_timing(backend, ("naive", "shuffle"), SETTINGS, SEED, published)
    mapped, _ = kept_input(backend, SEED, SIZE)
    assert mapped and timing._INPUTS[SEED, SIZE[0]][1] == Sums.of(draw("random", SIZE[0], SEED))
    # Every call changes a value of the input and checks the result against it.
    measured = time_interleaved(backend, kernels, SETTINGS, SEED)
    assert [t.repetitions >= 3 for t in measured] == [True, True]
    assert np.array_equal(np.load(published.path), draw("random", SIZE[0], SEED))


def test_a_published_file_of_another_size_is_not_taken(tmp_path: Path, cache_dir: Path) -> None:
    published = publish_input(SEED, (1024,), tmp_path)
    prepare_timing(CpuBackend(cache_dir=cache_dir), ("naive",), SETTINGS, SEED, published)
    mapped, values = kept_input(None, SEED, SIZE)
    assert not mapped and values == digest(draw("random", SIZE[0], SEED))


def test_a_sandboxed_worker_reads_the_published_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", str(tmp_path))  # the worker is bound the folder of this cache
    published = publish_input(SEED, SIZE)
    assert published is not None and published.path.parent == timing.input_folder()
    with Worker("auto", readable=(TESTS,)) as worker:  # on a machine without a GPU, the CPU backend
        worker.call(prepare_timing, ("naive",), SETTINGS, SEED, published, timeout=60)
        mapped, values = worker.call(kept_input, SEED, SIZE, timeout=60)
    assert mapped and values == digest(draw("random", SIZE[0], SEED))


def reference_kernels(*stage_ids: str) -> tuple[TimedKernel, ...]:
    return tuple(TimedKernel(f"reference {stage_id}", stage_id, reference_source(stage_id)) for stage_id in stage_ids)


def test_a_timing_takes_the_plans_readied_for_its_kernels_once(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[str] = []
    create = Plan.create.__func__

    def counted(cls, backend, kernel, *args, **kwargs):
        created.append(kernel.stage.id)
        return create(cls, backend, kernel, *args, **kwargs)

    monkeypatch.setattr(Plan, "create", classmethod(counted))
    kernels = reference_kernels("naive", "shuffle")
    with closing(CpuBackend(cache_dir=cache_dir)) as backend:
        prepare_timing(backend, ("naive", "shuffle"), SETTINGS, SEED)
        ready_timing(backend, kernels, SETTINGS, SEED)  # with the GPU shared, before the grader takes it alone
        assert created == ["naive", "shuffle"]
        readied = time_interleaved(backend, kernels, SETTINGS, SEED)
        assert created == ["naive", "shuffle"]  # it loaded nothing more
        ready_timing(backend, kernels[:1], SETTINGS, SEED)  # readied for other kernels: not taken
        afresh = time_interleaved(backend, kernels, SETTINGS, SEED)  # nor are the plans the first timing released
    assert created == ["naive", "shuffle", "naive", "naive", "shuffle"]
    assert [t.label for t in readied] == [t.label for t in afresh] == [k.label for k in kernels]
    assert all(t.repetitions >= SETTINGS.min_repetitions for t in (*readied, *afresh))


@pytest.mark.gpu
def test_plans_readied_for_a_student_are_gone_with_it_in_a_kept_gpu_worker() -> None:
    # A student readies its timing, then ends in a worker that serves the next one (its buffers all freed):
    # the next timing of the same kernels loads its own, and is right on every call.
    kernels = reference_kernels("sequential", "shuffle")
    settings = TimingSettings(warmup=1, min_repetitions=3, max_repetitions=5)
    with Worker("gpu", {}, Sandbox(False)) as worker:
        worker.call(prepare_timing, ("sequential", "shuffle"), settings, SEED, timeout=120)
        worker.call(ready_timing, kernels, settings, SEED, timeout=120)
        worker.call(forget, timeout=60)
        measured = worker.call(time_interleaved, kernels, settings, SEED, timeout=120)
    assert [t.label for t in measured] == [k.label for k in kernels]
    assert all(t.repetitions >= 3 and t.median_ms > 0 for t in measured)


# Right in every correctness case (none reduces one size more than twice), wrong from the fourth reduction of
# one size on: only the repeated calls of a timing can catch it.
WRONG_WHEN_REPEATED = """
__device__ unsigned int reductions_of_this_size;

__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) {
        sum += g_in[i + blockDim.x];
    }
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        float extra = 0.0f;
        if (blockIdx.x == 0 && n == 65536u && ++reductions_of_this_size > 3) {
            extra = 1.0f;
        }
        g_out[blockIdx.x] = sdata[0] + extra;
    }
}
"""


def test_a_kernel_wrong_in_one_timed_call_of_a_round_is_named_with_its_call(cache_dir: Path) -> None:
    yours = TimedKernel("your shuffle", "shuffle", KernelSource(WRONG_WHEN_REPEATED))
    with closing(CpuBackend(cache_dir=cache_dir)) as backend:
        prepare_timing(backend, ("first_add", "shuffle"), SETTINGS, SEED)
        # Calls 1-2 warm up; rounds of two follow, the order turning each round: its fourth reduction is call 8.
        with pytest.raises(timing.WrongTimedResult, match=r"^your shuffle: a timed call \(call 8, n=65536\) gave"):
            time_interleaved(backend, (*reference_kernels("first_add"), yours), SETTINGS, SEED)


# Replays, at the timed size only, the first-pass outputs of its first reduction of that size: one honest call,
# then the same answer, fast. The changes of the input between calls must move every result beyond the
# tolerance, and always the same way, so that no replayed answer is ever right again.
REPLAYS_A_SUM = """
__device__ float kept_sums[128];
__device__ int kept;

__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;
    if (n == 65536u && kept) {
        if (tid == 0) {
            g_out[blockIdx.x] = kept_sums[blockIdx.x];
        }
        return;
    }
    if (n == 128u && blockIdx.x == 0 && tid == 0) {
        kept = 1;  // the second pass: the first one's outputs are all kept by now
    }
    sdata[tid] = ((i < n) ? g_in[i] : 0.0f) + ((i + blockDim.x < n) ? g_in[i + blockDim.x] : 0.0f);
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
        if (n == 65536u) {
            kept_sums[blockIdx.x] = sdata[0];
        }
    }
}
"""

REPLAYS_A_MAX = """
__device__ float kept_maxima[32 * 32];
__device__ int kept;

__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)
{
    unsigned int half_w = (width + 1) / 2;
    unsigned int half_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= half_w || y >= half_h) {
        return;
    }
    size_t out = (size_t)y * half_w + x;
    bool timed = width == 64u && height == 64u;
    if (timed && kept) {
        g_out[out] = kept_maxima[out];
        return;
    }
    if (width == 32u && height == 32u && out == 0) {
        kept = 1;  // the second pass: the first one's outputs are all kept by now
    }
    float m = g_in[(size_t)y * width + x];
    if (x + half_w < width) {
        m = fmaxf(m, g_in[(size_t)y * width + x + half_w]);
    }
    if (y + half_h < height) {
        m = fmaxf(m, g_in[(size_t)(y + half_h) * width + x]);
        if (x + half_w < width) {
            m = fmaxf(m, g_in[(size_t)(y + half_h) * width + x + half_w]);
        }
    }
    g_out[out] = m;
    if (timed) {
        kept_maxima[out] = m;
    }
}
"""


@pytest.mark.parametrize(("stage_id", "source"), [("first_add", REPLAYS_A_SUM), ("max2d", REPLAYS_A_MAX)])
def test_a_kernel_that_replays_its_answer_at_the_timed_size_fails_its_first_replay(
    stage_id: str, source: str, cache_dir: Path
) -> None:
    replays = TimedKernel(f"your {stage_id}", stage_id, KernelSource(source))
    with closing(CpuBackend(cache_dir=cache_dir)) as backend:
        prepare_timing(backend, (stage_id,), SETTINGS, SEED)
        # Call 1 warms up (an honest reduction); call 2 replays it.
        with pytest.raises(timing.WrongTimedResult, match=rf"^your {stage_id}: a timed call \(call 2, "):
            time_interleaved(backend, (replays,), SETTINGS, SEED)


@pytest.mark.parametrize(("shape", "tolerance"), [(Shape.SUM_1D, 140.0), (Shape.SUM_1D, 0.01), (Shape.MAX_2D, 0.0)])
def test_every_change_of_the_timed_input_moves_its_result_past_any_earlier_one(shape: Shape, tolerance: float) -> None:
    # 140 is about a sum's tolerance at the timed 2^26 values: more than small changes drift in 3000 calls.
    original = draw("random", 4096, SEED)
    data = original.copy()
    exact = float(np.sum(data, dtype=np.float64)) if shape is Shape.SUM_1D else float(data.max())
    checker = timing._Checker(shape, data, exact, {"a stage": tolerance}, np.random.default_rng(1))
    results = [checker.expected]
    for _ in range(3000):
        checker._perturb()
        results.append(checker.expected)
        assert checker.expected == (float(np.sum(data, dtype=np.float64)) if shape is Shape.SUM_1D else data.max())
    assert min(np.diff(results)) > tolerance  # so no earlier result is within the tolerance of a later one
    checker.restore()
    assert np.array_equal(data, original)


def test_a_class_on_a_gpu_publishes_its_inputs_before_any_grading_process_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The class's host draws them while its processes start (autograder.batch); a grading process asking later
    # reads the record, and draws nothing, at its first timing, when the first students all time at once.
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", str(tmp_path))
    options = GradeOptions(seed=SEED)
    options = replace(options, rubric=replace(options.rubric, timing=SETTINGS))
    with batch._ahead(partial(batch._publish_timing_inputs, options)):
        pass  # the class's grading
    timing._PUBLISHED.clear()  # a grading process of the class

    def no_draw(*_: object) -> np.ndarray:
        raise AssertionError("a grading process drew a timing input the class had published")

    monkeypatch.setattr(timing, "draw", no_draw)
    for size in (SETTINGS.n,), SETTINGS.max2d_shape:
        published = publish_input(SEED, size)
        assert published is not None and published.sums == Sums.of(np.load(published.path))
