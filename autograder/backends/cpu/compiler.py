"""Building kernels for the CPU backend: the runtime library once, then two shared objects per kernel source.

- The runtime (`runtime/ag_runtime.cpp`) is built once per fiber kind into the cache directory.
- Each kernel source is compiled twice with the prelude force-included: an instrumented build (ThreadSanitizer
  hooks and basic-block coverage, served by the runtime) for the checked blocks, and a plain build for
  unchecked runs and the unchecked middle of large launches. Both link against the runtime and are cached
  by a hash of everything that went into them.

Compiler messages come back as CompilerMessage records with notebook cell lines. An error inside the
prelude (a wrong argument to a shuffle, say) is put on the student's line that g++'s notes point to.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autograder.backends.cpu.rewrite import declares_device_variables, rewrite_shared
from autograder.errors import BackendUnavailable, CompileError
from autograder.records import CompilerMessage, KernelSource
from autograder.stages import Shape, Stage

RUNTIME_DIR = Path(__file__).parent / "runtime"
SOURCE_NAME = "kernel.cu"  # the student's source as g++ sees it, so messages can be told apart from the prelude
FIBER_KINDS = ("auto", "boost.context", "ucontext")

# Never -ffast-math: the sums are compared with a float64 reference and must round like IEEE float32.
COMMON_FLAGS = (
    "-std=gnu++17",
    "-O2",
    "-g",
    "-fPIC",
    "-fno-threadsafe-statics",
    "-Wno-unknown-pragmas",
    "-fdiagnostics-plain-output",
    "-fmessage-length=0",
)
# The instrumented build calls the runtime's hooks at every memory access and basic block. The ThreadSanitizer
# library itself is never linked: the runtime (runtime/ag_runtime.cpp) defines the hooks.
CHECK_FLAGS = (
    "-fsanitize=thread",
    "--param=tsan-instrument-func-entry-exit=0",
    "--param=tsan-distinguish-volatile=1",
    "-fsanitize-coverage=trace-pc",
)


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    version: str
    fibers: str  # "boost.context" or "ucontext"
    runtime: Path  # the runtime shared object
    cache: Path
    key: str  # hash of the compiler, the runtime and the prelude: part of every kernel's cache key


@dataclass(frozen=True)
class KernelBuild:
    checked: Path
    fast: Path
    warnings: tuple[CompilerMessage, ...]
    dynamic_shared_names: tuple[str, ...]
    parameter_names: tuple[str, ...]
    device_variables: bool  # the source has __device__ variables: never mix the two builds in one launch


def cache_directory() -> Path:
    if os.environ.get("AUTOGRADER_CPU_CACHE"):
        return Path(os.environ["AUTOGRADER_CPU_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "autograder" / "cpu"


def find_compiler() -> tuple[str, str]:
    """The C++ compiler (`$CXX` or g++) and its version, or BackendUnavailable."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise BackendUnavailable(
            "the CPU backend needs g++ to compile kernels, and none was found: install it "
            "(Debian/Ubuntu: sudo apt-get install g++ libboost-context-dev, or run scripts/install-system-packages.sh)"
        )
    version = subprocess.run([compiler, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    return compiler, version


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def _runtime_sources() -> bytes:
    return b"".join(path.read_bytes() for path in sorted(RUNTIME_DIR.iterdir()) if path.is_file())


def _publish(temporary: Path, final: Path) -> None:
    """Move a finished build into place atomically, so concurrent graders never see half a file."""
    os.replace(temporary, final)


def prepare_toolchain(fibers: str = "auto", cache: Path | None = None) -> Toolchain:
    """Find g++ and build (or find in the cache) the runtime with the fiber kind asked for."""
    if fibers not in FIBER_KINDS:
        raise ValueError(f"fibers must be one of {', '.join(FIBER_KINDS)}, not {fibers!r}")
    compiler, version = find_compiler()
    cache = cache or cache_directory()
    cache.mkdir(parents=True, exist_ok=True)
    kinds = ["boost.context", "ucontext"] if fibers == "auto" else [fibers]
    failures = []
    for kind in kinds:
        flags = ["-std=gnu++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
        libraries = ["-lboost_context"] if kind == "boost.context" else []
        flags.append("-DAG_REQUIRE_BOOST" if kind == "boost.context" else "-DAG_UCONTEXT")
        key = _digest(compiler, version, kind, _runtime_sources(), " ".join(flags))
        runtime = cache / f"libagrt-{key}.so"
        if not runtime.exists():
            with tempfile.NamedTemporaryFile(dir=cache, suffix=".so", delete=False) as handle:
                temporary = Path(handle.name)
            command = [compiler, *flags, "-o", str(temporary), str(RUNTIME_DIR / "ag_runtime.cpp"), *libraries]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                temporary.unlink(missing_ok=True)
                failures.append(f"{kind}: {result.stderr.strip()[-500:]}")
                continue
            _publish(temporary, runtime)
        return Toolchain(compiler, version, kind, runtime, cache, key)
    raise BackendUnavailable("could not build the CPU backend's runtime: " + " | ".join(failures))


def parameter_names(source: str, kernel_name: str, count: int) -> tuple[str, ...]:
    """The kernel's own parameter names (for messages), or g_in, g_out, ... where they cannot be read."""
    fallback = ("g_in", "g_out", "n", "height")[:count] if count <= 4 else tuple(f"arg{i}" for i in range(count))
    match = re.search(rf"\b{re.escape(kernel_name)}\s*\(([^)]*)\)\s*\{{", source)
    if match is None:
        return fallback
    names = []
    for parameter in match.group(1).split(","):
        identifiers = re.findall(r"[A-Za-z_]\w*", parameter)
        names.append(identifiers[-1] if identifiers else "?")
    return tuple(names) if len(names) == count else fallback


def entry_code(stage: Stage, line: int) -> str:
    """The extern "C" launcher the runtime calls in every fiber: it unpacks the argument array."""
    integers = 1 if stage.shape is Shape.SUM_1D else 2
    arguments = ["(float *)*(void **)a[0]", "(float *)*(void **)a[1]"]
    arguments += [f"*(unsigned int *)a[{2 + i}]" for i in range(integers)]
    return (
        f'\n#line {line} "ag_entry.cu"\n'
        f'extern "C" void __ag_entry(void **a) {{ {stage.kernel_name}({", ".join(arguments)}); }}\n'
    )


ENTRY_LINE = 1_000_000  # entry code lines: far past any student source


def compile_kernel(toolchain: Toolchain, source: KernelSource, stage: Stage) -> KernelBuild:
    """Both builds of `source` for `stage`, from the cache when they are there. Raises CompileError."""
    rewritten = rewrite_shared(source.text)
    text = rewritten.text + entry_code(stage, ENTRY_LINE)
    include_flags = ("-include", str(RUNTIME_DIR / "ag_prelude.h"), "-I", str(RUNTIME_DIR))
    key = _digest(toolchain.key, text, " ".join(COMMON_FLAGS + CHECK_FLAGS))
    checked = toolchain.cache / f"k-{key}-checked.so"
    fast = toolchain.cache / f"k-{key}-fast.so"
    warnings_file = toolchain.cache / f"k-{key}.warnings"
    names = parameter_names(source.text, stage.kernel_name, 3 if stage.shape is Shape.SUM_1D else 4)
    device_variables = declares_device_variables(source.text)
    if checked.exists() and fast.exists():
        log = warnings_file.read_text() if warnings_file.exists() else ""
        warnings = tuple(m for m in parse_diagnostics(log, source) if m.severity == "warning")
        return KernelBuild(checked, fast, warnings, rewritten.dynamic_names, names, device_variables)

    link = ["-L", str(toolchain.runtime.parent), f"-l:{toolchain.runtime.name}",
            f"-Wl,-rpath,{toolchain.runtime.parent}", "-Wl,-z,defs", "-lm"]
    with tempfile.TemporaryDirectory(dir=toolchain.cache, prefix="build-") as directory:
        build = Path(directory)
        source_path = build / SOURCE_NAME
        source_path.write_text(text)
        base = [toolchain.compiler, *COMMON_FLAGS, *include_flags]
        # The two builds run side by side: the instrumented one compiles to an object first, because linking
        # with -fsanitize=thread would pull in the real ThreadSanitizer library.
        compile_checked = subprocess.Popen(
            [*base, *CHECK_FLAGS, "-c", "-x", "c++", SOURCE_NAME, "-o", "checked.o"],
            cwd=build, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        compile_fast = subprocess.Popen(
            [*base, "-shared", "-x", "c++", SOURCE_NAME, "-x", "none", *link, "-o", "fast.so"],
            cwd=build, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        _, checked_log = compile_checked.communicate()
        _, fast_log = compile_fast.communicate()
        if compile_checked.returncode != 0 or compile_fast.returncode != 0:
            log = checked_log if compile_checked.returncode != 0 else fast_log
            raise _compile_error(log, source, stage)
        linked = subprocess.run(
            [toolchain.compiler, "-shared", "checked.o", *link, "-o", "checked.so"],
            cwd=build, capture_output=True, text=True,
        )
        if linked.returncode != 0:
            raise _compile_error(linked.stderr, source, stage)
        warnings_file.write_text(checked_log)
        _publish(build / "fast.so", fast)
        _publish(build / "checked.so", checked)
    warnings = tuple(m for m in parse_diagnostics(checked_log, source) if m.severity == "warning")
    return KernelBuild(checked, fast, warnings, rewritten.dynamic_names, names, device_variables)


_LOCATION = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:\d+:)?\s*(?P<rest>.*)$")
_SEVERITY = re.compile(r"^(?:fatal )?(?P<severity>error|warning):\s*(?P<text>.*)$")


def parse_diagnostics(log: str, source: KernelSource) -> list[CompilerMessage]:
    """g++'s errors and warnings as CompilerMessage records, on notebook cell lines.

    A diagnostic inside the prelude or the generated launcher goes to the student's line that the
    surrounding notes name (a macro expansion, a template instantiation), or to no line.
    """
    student_lines = source.text.count("\n") + 1
    entries: list[tuple[str, int, str]] = []  # (file, line, rest) for each located line, in order
    for raw in log.splitlines():
        match = _LOCATION.match(raw.strip())
        if match:
            entries.append((Path(match["file"]).name, int(match["line"]), match["rest"]))
        elif "undefined reference to" in raw or "undefined symbol" in raw:
            entries.append(("", 0, "error: " + raw.split(":", 2)[-1].strip()))
    messages = []
    for index, (file, line, rest) in enumerate(entries):
        severity = _SEVERITY.match(rest)
        if severity is None:
            continue
        located = line if file == SOURCE_NAME and line <= student_lines else _nearby_student_line(entries, index)
        messages.append(CompilerMessage(severity["severity"], source.cell_line(located), _readable(severity["text"])))
    return messages


# The prelude's internal names, as a student would recognise them in a message.
_INTERNAL_NAMES = (
    (re.compile(r"__ag_shuffle\(int, <unnamed enum>, "), "a warp shuffle ("),
    (re.compile(r"__ag_warp\(int, <unnamed enum>, "), "a warp collective ("),
    (re.compile(r"__ag_atomic_op<[^>]*>"), "an atomic function"),
)


def _readable(text: str) -> str:
    for pattern, replacement in _INTERNAL_NAMES:
        text = pattern.sub(replacement, text)
    return text


def _nearby_student_line(entries: list[tuple[str, int, str]], index: int) -> int | None:
    for file, line, rest in entries[index + 1 :]:
        if _SEVERITY.match(rest):
            break
        if file == SOURCE_NAME:
            return line
    for file, line, rest in reversed(entries[:index]):
        if _SEVERITY.match(rest):
            break
        if file == SOURCE_NAME:
            return line
    return None


def _compile_error(log: str, source: KernelSource, stage: Stage) -> CompileError:
    messages = tuple(parse_diagnostics(log, source))
    errors = [m for m in messages if m.severity == "error"]
    in_launcher = f'ag_entry.cu:{ENTRY_LINE}' in log and not any(m.line is not None for m in errors)
    if in_launcher:
        summary = (
            f"no kernel `{stage.kernel_name}` that the grader can launch: the stage needs `{stage.signature}`"
        )
        messages = (*messages, CompilerMessage("error", None, summary))
    elif errors:
        first = errors[0]
        where = f" (line {first.line})" if first.line is not None else ""
        summary = f"the kernel did not compile{where}: {first.text}"
    else:
        summary = "the kernel did not compile"
    return CompileError(summary, messages, log)


def addr2line(library: Path, offsets: list[int]) -> dict[int, int | None]:
    """Kernel-source lines of code offsets in `library`, innermost student frame first (inlining included)."""
    tool = shutil.which("addr2line")
    if tool is None or not offsets:
        return {offset: None for offset in offsets}
    result = subprocess.run(
        [tool, "-e", str(library), "-i", "-a", *(hex(offset) for offset in offsets)],
        capture_output=True, text=True,
    )
    lines: dict[int, int | None] = {}
    current: int | None = None
    for raw in result.stdout.splitlines():
        if raw.startswith("0x"):
            current = int(raw, 16)
            lines[current] = None
            continue
        if current is None or lines[current] is not None:
            continue
        location = raw.split(" (discriminator")[0]
        file, _, number = location.rpartition(":")
        if Path(file).name == SOURCE_NAME and number.isdigit():
            lines[current] = int(number)
    return {offset: lines.get(offset) for offset in offsets}
