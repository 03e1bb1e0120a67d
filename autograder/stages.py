"""The catalogue of stages: the one place that says what each stage is and how it is launched.

The command line, the grader, the notebook self-check, the calibration, the rubric and the docs all read this.
A stage id is spelled the same everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum


class Shape(Enum):
    """The two reduction shapes of the assignment."""

    SUM_1D = "sum_1d"
    MAX_2D = "max_2d"


SUM_SIGNATURE = "(const float *g_in, float *g_out, unsigned int n)"
MAX2D_SIGNATURE = "(const float *g_in, float *g_out, unsigned int width, unsigned int height)"

# Parameter types in Itanium-mangled form, so a kernel compiled without extern "C" can be found by name.
_MANGLED_PARAMS = {Shape.SUM_1D: "PKfPfj", Shape.MAX_2D: "PKfPfjj"}

# The max2d step kernel runs one thread per output element, in blocks of this shape.
MAX2D_BLOCK = (32, 8)

# Correctness sizes for 1-D stages: tiny, around a warp, around the block, odd, and large enough for
# several passes and for races that only show at scale (PRODUCT.md: a missing barrier first failed at 1000003).
# These are published; every run adds odd sizes drawn from its secret seed (autograder.verify.seeded_sizes).
SUM_SIZES = (1, 2, 31, 32, 33, 255, 256, 257, 511, 512, 513, 1000, 65535, 65536, 1_000_003, 4_194_304 + 77)

# (width, height) shapes for the max2d step kernel: 1 x 1, degenerate rows and columns, odd sides.
MAX2D_SHAPES = (
    (1, 1),
    (2, 1),
    (1, 2),
    (1, 1000),
    (1000, 1),
    (3, 3),
    (31, 33),
    (32, 32),
    (257, 255),
    (1000, 999),
    (4097, 3),
    (2048, 2048),
)


@dataclass(frozen=True)
class Stage:
    """One stage of the assignment."""

    id: str
    number: int
    title: str
    technique: str
    fixes: str
    kernel_name: str
    shape: Shape
    elements_per_thread: int
    previous: str | None
    optional: bool = False  # the open stage: ranked on the leaderboard, no points unless the rubric gives some

    @property
    def parameters(self) -> str:
        return SUM_SIGNATURE if self.shape is Shape.SUM_1D else MAX2D_SIGNATURE

    @property
    def signature(self) -> str:
        return f"__global__ void {self.kernel_name}{self.parameters}"

    @property
    def mangled_name(self) -> str:
        """The C++ symbol of the kernel when it is compiled as C++ (no extern "C")."""
        return f"_Z{len(self.kernel_name)}{self.kernel_name}{_MANGLED_PARAMS[self.shape]}"

    def mangled_in(self, namespace: str) -> str:
        """The kernel's C++ symbol where it is declared in `namespace` (autograder.backends.gpu_batch). The
        parameters' mangling is the plain symbol's: right while no parameter type repeats a compound one (which a
        namespace would renumber, `S_` becoming `S0_`)."""
        return f"_ZN{len(namespace)}{namespace}{len(self.kernel_name)}{self.kernel_name}E{_MANGLED_PARAMS[self.shape]}"

    @property
    def symbols(self) -> tuple[str, str]:
        """The names every backend looks the compiled kernel up by, in order: the C++ symbol, which holds the
        contract's exact parameter types (so `int n`, `size_t n` or a non-const `g_in` is not it, while
        `__restrict__` and top-level `const` change nothing), then the plain name of an `extern "C"` kernel."""
        return (self.mangled_name, self.kernel_name)

    def parameter_check(self) -> str:
        """Source that compiles only where the kernel has the contract's parameter types: an `extern "C"`
        kernel's symbol holds no types, so the compiler is asked (autograder.build)."""
        types = re.sub(r" ?\w+(?=[,)])", "", self.parameters)  # the signature less its parameter names
        return f"\nstatic void (*const __ag_contract){types} = {self.kernel_name};\n"

    def wrong_parameters_message(self) -> str:
        return (
            f"a kernel named {self.kernel_name} is there, but not with the contract's parameters (or it is a "
            f"template): it must be `{self.signature}`"
        )

    def missing_kernel_message(self, defined: Collection[str]) -> str:
        """Why none of `symbols` is among the names a build `defined` (autograder.build.defined_symbols): the same
        words on every backend."""
        mangled = f"_Z{len(self.kernel_name)}{self.kernel_name}"
        if any(name.startswith(mangled) for name in defined):
            return self.wrong_parameters_message()
        return f"no kernel named {self.kernel_name} with signature `{self.signature}` in the cell"

    def stub_source(self) -> str:
        """The kernel a released notebook starts with: it compiles and computes nothing.

        A hand-in whose kernel is still this stub is "not attempted".
        """
        return f"{self.signature}\n{{\n    // TODO: your kernel for stage {self.number} ({self.title}) goes here.\n}}\n"


STAGES: tuple[Stage, ...] = (
    Stage(
        id="naive",
        number=1,
        title="Naive",
        technique="interleaved addressing: `if (tid % (2*s) == 0)`",
        fixes="baseline: a tree reduction in shared memory",
        kernel_name="reduce_naive",
        shape=Shape.SUM_1D,
        elements_per_thread=1,
        previous=None,
    ),
    Stage(
        id="anti_divergence",
        number=2,
        title="Anti-divergence",
        technique="strided index `index = 2*s*tid`, so the active threads are contiguous",
        fixes="warp divergence (but adds shared-memory bank conflicts)",
        kernel_name="reduce_anti_divergence",
        shape=Shape.SUM_1D,
        elements_per_thread=1,
        previous="naive",
    ),
    Stage(
        id="sequential",
        number=3,
        title="Sequential addressing",
        technique="sequential addressing: the stride halves from `blockDim.x/2`",
        fixes="shared-memory bank conflicts",
        kernel_name="reduce_sequential",
        shape=Shape.SUM_1D,
        elements_per_thread=1,
        previous="anti_divergence",
    ),
    Stage(
        id="first_add",
        number=4,
        title="First add during load",
        technique="each thread adds two elements while loading; half as many blocks",
        fixes="idle threads in the first step",
        kernel_name="reduce_first_add",
        shape=Shape.SUM_1D,
        elements_per_thread=2,
        previous="sequential",
    ),
    Stage(
        id="unrolled_warp",
        number=5,
        title="Unrolled last warp",
        technique="the last warp unrolled, with `__syncwarp()` between its steps",
        fixes="loop and barrier overhead",
        kernel_name="reduce_unrolled_warp",
        shape=Shape.SUM_1D,
        elements_per_thread=2,
        previous="first_add",
    ),
    Stage(
        id="shuffle",
        number=6,
        title="Warp shuffle",
        technique="warp shuffle (`__shfl_down_sync`) for the last warp",
        fixes="shared-memory traffic in the last warp",
        kernel_name="reduce_shuffle",
        shape=Shape.SUM_1D,
        elements_per_thread=2,
        previous="unrolled_warp",
    ),
    Stage(
        id="max2d",
        number=7,
        title="2-D max by quadrants",
        technique="each step reads four elements, one from each quadrant, and halves both dimensions",
        fixes="a second reduction shape and operator",
        kernel_name="max2d",
        shape=Shape.MAX_2D,
        elements_per_thread=4,
        previous="max2d_baseline",
    ),
    Stage(
        id="open",
        number=8,
        title="Open stage",
        technique="any technique: grid-stride loops, vectorised loads, warp-level atomics, full unrolling",
        fixes="whatever still stands between the kernel and the memory-bandwidth ceiling",
        kernel_name="reduce_open",
        shape=Shape.SUM_1D,
        elements_per_thread=16,
        previous="shuffle",
        optional=True,
    ),
)

# The simple 2-D max kernel shipped with the assignment: max2d's speedup is measured against it.
# It is not a student stage, so it is not in STAGES.
MAX2D_BASELINE = Stage(
    id="max2d_baseline",
    number=0,
    title="2-D max baseline (neighbouring 2x2 blocks)",
    technique="each thread takes the max of a 2x2 block of neighbours",
    fixes="nothing: the baseline for max2d",
    kernel_name="max2d_baseline",
    shape=Shape.MAX_2D,
    elements_per_thread=4,
    previous=None,
)

STAGE_IDS: tuple[str, ...] = tuple(stage.id for stage in STAGES)
REQUIRED_STAGE_IDS: tuple[str, ...] = tuple(stage.id for stage in STAGES if not stage.optional)
_BY_ID = {stage.id: stage for stage in (*STAGES, MAX2D_BASELINE)}


def get_stage(stage_id: str) -> Stage:
    """The stage with this id, or a KeyError that lists the valid ids."""
    try:
        return _BY_ID[stage_id]
    except KeyError:
        raise KeyError(f"unknown stage {stage_id!r}; the stages are: {', '.join(STAGE_IDS)}") from None
