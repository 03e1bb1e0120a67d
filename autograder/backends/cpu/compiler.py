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

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from autograder.backends.cpu.rewrite import SHARED_MARKER, rewrite_source
from autograder.errors import BackendUnavailable, CompileError
from autograder.records import Build, CompilerMessage, KernelSource
from autograder.sandbox import COMPILE_LIMITS, Limits, Sandbox
from autograder.stages import Shape, Stage

RUNTIME_DIR = Path(__file__).parent / "runtime"
SOURCE_NAME = "kernel.cu"  # the student's source as g++ sees it, so messages can be told apart from the prelude
FIBER_KINDS = ("auto", "boost.context", "ucontext")

# Never -ffast-math: the sums are compared with a float64 reference and must round like IEEE float32. No fused
# multiply-add either, as nvcc builds the GPU's (-fmad=false): every float operation rounds alike on both.
COMMON_FLAGS = (
    "-std=gnu++17",
    "-O2",
    "-ffp-contract=off",
    "-g",
    "-fPIC",
    "-fno-threadsafe-statics",
    # A template's or an inline function's statics are one per library, not one per process (STB_GNU_UNIQUE): the
    # checked and the fast build each keep their own, and the runtime checks the checked build's (red team).
    "-fno-gnu-unique",
    "-Wno-unknown-pragmas",
    "-fdiagnostics-plain-output",
    "-fmessage-length=0",
)
# The instrumented build calls the runtime's hooks at every memory access and basic block. The ThreadSanitizer
# library itself is never linked: the runtime (runtime/ag_runtime.cpp) defines the hooks.
CHECK_FLAGS = (
    "-U_FORTIFY_SOURCE",  # a toolchain that fortifies by default would turn memcpy into __memcpy_chk, unwrapped
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
    device_variables: tuple[str, ...]  # the symbols of its variables in a GPU's global memory (device_variables)
    lines: dict[int, int]  # call-site offset in the instrumented build -> kernel-source line
    hashes: dict[str, str]  # SHA-256 of "checked" and "fast", as recorded when they were built
    unchecked_imports: tuple[str, ...]  # functions it calls that may write where no bounds check looks


def cache_directory() -> Path:
    if os.environ.get("AUTOGRADER_CPU_CACHE"):
        return Path(os.environ["AUTOGRADER_CPU_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "autograder" / "cpu"


def find_compiler(named: str | None = None) -> tuple[str, str]:
    """The C++ compiler (`named`, else `$CXX` or g++) and its version, or BackendUnavailable."""
    compiler = shutil.which(named or os.environ.get("CXX", "g++"))
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


@contextlib.contextmanager
def _alone(cache: Path, name: str) -> Iterator[None]:
    """Held while this process builds `name` into the cache: graders that start together (a class's processes on
    a fresh machine) build it once, one after another finding it made, rather than all at once, each its own.
    Taken after a core (schedule.cpu_slot) where both are, never the other way round, and nothing is waited for
    while it is held but the build."""
    with open(cache / f".{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file lets go of the lock


def prepare_toolchain(fibers: str = "auto", cache: Path | None = None, compiler: str | None = None) -> Toolchain:
    """Find g++ and build (or find in the cache) the runtime with the fiber kind asked for."""
    if fibers not in FIBER_KINDS:
        raise ValueError(f"fibers must be one of {', '.join(FIBER_KINDS)}, not {fibers!r}")
    compiler, version = find_compiler(compiler)
    cache = cache or cache_directory()
    cache.mkdir(parents=True, exist_ok=True)
    # Boost.Context linked statically where its archive is installed, so the runtime needs no shared Boost
    # library at run time (a sandboxed worker sees only the system's folders; the GPU machine's Boost comes
    # from a carried .deb, see scripts/gpu-setup.sh).
    variants = (("boost.context", ["-l:libboost_context.a"]), ("boost.context", ["-lboost_context"]), ("ucontext", []))
    failures = []
    for kind, libraries in variants:
        if fibers not in ("auto", kind):
            continue
        flags = ["-std=gnu++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
        flags.append("-DAG_REQUIRE_BOOST" if kind == "boost.context" else "-DAG_UCONTEXT")
        found = [_found_library(compiler, library) for library in libraries]  # one installed later: a new key
        key = _digest(compiler, version, kind, _runtime_sources(), " ".join(flags + libraries + found))
        runtime = cache / f"libagrt-{key}.so"
        failure = _runtime_built([compiler, *flags, str(RUNTIME_DIR / "ag_runtime.cpp"), *libraries], runtime)
        if failure is None:
            return Toolchain(compiler, version, kind, runtime, cache, key)
        failures.append(f"{kind}: {failure}")
    raise BackendUnavailable("could not build the CPU backend's runtime: " + " | ".join(failures))


@functools.cache
def _found_library(compiler: str, flag: str) -> str:
    """Where the compiler finds the library a `-l` flag names (its bare name where it finds none)."""
    name = flag[3:] if flag.startswith("-l:") else f"lib{flag[2:]}.so"
    return subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()


def _runtime_built(command: list[str], runtime: Path) -> str | None:
    """Build the runtime with `command` (the compiler, its flags and files) unless it is built: None, or why it
    cannot be. Once a machine: one grader builds it while the others wait (`_alone`), and a build that failed is
    recorded beside it, so that a variant this machine cannot build (Boost's archive missing, say) is not tried
    again at every worker's start, each grader in turn."""
    manifest, failed = runtime.with_suffix(".json"), runtime.with_suffix(".failed")

    def known() -> tuple[bool, str | None]:
        if _read_manifest(manifest, {"runtime": runtime}) is not None:
            return True, None
        with contextlib.suppress(OSError):
            return True, failed.read_text()
        return False, None

    done, failure = known()
    if done:
        return failure
    with _alone(runtime.parent, runtime.name):
        done, failure = known()
        if done:
            return failure
        with tempfile.NamedTemporaryFile(dir=runtime.parent, suffix=".so", delete=False) as handle:
            temporary = Path(handle.name)
        try:
            result = subprocess.run([*command, "-o", str(temporary)], capture_output=True, text=True,
                                    timeout=RUNTIME_SECONDS)
        except subprocess.TimeoutExpired:
            temporary.unlink(missing_ok=True)
            return f"the compiler took more than {RUNTIME_SECONDS:g} s"  # not recorded: a busy machine, perhaps
        if result.returncode != 0:
            temporary.unlink(missing_ok=True)
            failure = result.stderr.strip()[-500:] or f"the compiler exited with {result.returncode}"
            with contextlib.suppress(OSError):
                failed.write_text(failure)
            return failure
        _publish(temporary, runtime)
        _write_manifest(manifest, {"runtime": runtime}, result.stderr, {})
        return None


RUNTIME_SECONDS = 300.0


BUILD_FLAGS = {"fast": COMMON_FLAGS, "checked": COMMON_FLAGS + CHECK_FLAGS}


def precompiled_preludes(toolchain: Toolchain) -> dict[str, Path]:
    """The prelude precompiled for each build ("fast", "checked"; g++ uses a .gch only with the flags it was
    made with), once per toolchain, each in a folder of its own beside a copy of the header. g++ then reads
    the parsed headers instead of parsing them, which was most of a small kernel's compile; the text compiled
    is the same. A build for which none can be made (a read-only cache) is left out: its kernels read the
    header itself."""
    found = {}
    for build, flags in BUILD_FLAGS.items():
        folder = toolchain.cache / f"prelude-{_digest(toolchain.key, build, *flags)}"
        failed = folder.with_suffix(".failed")  # g++ could not make it here: not tried again at every build
        if not _verified_prelude(folder) and not failed.exists():
            with contextlib.suppress(OSError), _alone(toolchain.cache, folder.name):
                if not _verified_prelude(folder) and not failed.exists():  # another grader's, made meanwhile
                    _precompile(toolchain, flags, folder)
                    if not _verified_prelude(folder):
                        failed.touch()
        if _verified_prelude(folder):
            found[build] = folder
    return found


def _precompile(toolchain: Toolchain, flags: tuple[str, ...], folder: Path) -> None:
    with tempfile.TemporaryDirectory(dir=toolchain.cache, prefix="prelude-") as directory:
        made = Path(directory)
        shutil.copyfile(RUNTIME_DIR / PRELUDE, made / PRELUDE)
        command = [toolchain.compiler, *flags, "-I", RUNTIME_DIR, "-x", "c++-header", PRELUDE, "-o", f"{PRELUDE}.gch"]
        if subprocess.run(command, cwd=made, capture_output=True).returncode == 0:
            _write_manifest(made / "manifest.json", _prelude_files(made), "", {})
            if _verified_prelude(folder):
                return  # another grader published one meanwhile, which others may be compiling with
            shutil.rmtree(folder, ignore_errors=True)  # one not as it was built, which nobody compiles with
            os.replace(made, folder)  # fails where another grader published one since
            made.mkdir()  # for the TemporaryDirectory to remove


def _prelude_files(folder: Path) -> dict[str, Path]:
    return {"header": folder / PRELUDE, "gch": folder / f"{PRELUDE}.gch"}


_VERIFIED: set[tuple[Path, int, int]] = set()  # precompiled preludes whose hashes this process checked


def _verified_prelude(folder: Path) -> bool:
    """Whether a precompiled prelude is whole and as it was built (its hashes, checked once a process for
    each version of the file)."""
    try:
        info = (folder / f"{PRELUDE}.gch").stat()
    except OSError:
        return False
    version = (folder, info.st_ino, info.st_mtime_ns)
    if version not in _VERIFIED and _read_manifest(folder / "manifest.json", _prelude_files(folder)) is not None:
        _VERIFIED.add(version)
    return version in _VERIFIED


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
    """The extern "C" launcher the runtime calls in every fiber: it unpacks the argument array and calls the
    kernel through `__ag_kernel`, which the loader points at the symbol a GPU finds it by (Stage.symbols), so
    a kernel with other parameter types is refused as on a GPU."""
    integers = 1 if stage.shape is Shape.SUM_1D else 2
    parameters = ", ".join(["const float *", "float *", *["unsigned int"] * integers])
    arguments = ["*(const float **)a[0]", "*(float **)a[1]", *(f"*(unsigned int *)a[{2 + i}]" for i in range(integers))]
    return (
        f'\n#line {line} "ag_entry.cu"\n'
        f'extern "C" {{ void (*__ag_kernel)({parameters}); }}\n'
        f'extern "C" void __ag_entry(void **a) {{ __ag_kernel({", ".join(arguments)}); }}\n'
    )


ENTRY_LINE = 1_000_000  # entry code lines: far past any student source


def compile_kernel(
    toolchain: Toolchain, source: KernelSource, stage: Stage, sandbox: Sandbox, fast: bool = True
) -> KernelBuild:
    """Both builds of `source` for `stage`, from the cache when they are there. Raises CompileError.

    g++ runs inside the sandbox and writes only a temporary build folder; the grader then moves what it built
    into the cache and records each file's SHA-256, which is checked whenever the cache is read. Without `fast`
    only the instrumented build is made and serves as both: enough for launches small enough to be checked
    whole (the CPU analysis of GPU stages), at half the compiling.
    """
    rewritten = rewrite_source(
        source.text, lambda text: _preprocess(toolchain, sandbox, text, source), SOURCE_NAME
    )
    text = rewritten.text + entry_code(stage, ENTRY_LINE)
    key = _digest(toolchain.key, text, " ".join(COMMON_FLAGS + CHECK_FLAGS + WRAPPED), "" if fast else "checked only")
    checked = toolchain.cache / f"k-{key}-checked.so"
    plain = toolchain.cache / f"k-{key}-fast.so" if fast else checked
    manifest = toolchain.cache / f"k-{key}.json"
    files = {"checked": checked, "fast": plain} if fast else {"checked": checked}
    names = parameter_names(source.text, stage.kernel_name, 3 if stage.shape is Shape.SUM_1D else 4)

    def finish(
        log: str, lines: dict[int, int], hashes: dict[str, str], unchecked: list[str], variables: list[str]
    ) -> KernelBuild:
        warnings = tuple(m for m in parse_diagnostics(log, source) if m.severity == "warning")
        return KernelBuild(
            checked, plain, warnings, rewritten.dynamic_names, names, tuple(variables), lines, hashes, tuple(unchecked)
        )

    cached = _read_manifest(manifest, files)
    if cached is not None:
        lines = {int(pc): line for pc, line in cached["lines"].items()}
        if "variables" in cached:  # a manifest of before the variables were read from the symbols is not used
            unchecked = cached.get("unchecked", ["(not recorded)"])
            return finish(cached["log"], lines, cached["files"], unchecked, cached["variables"])

    link = ["-L", str(toolchain.runtime.parent), f"-l:{toolchain.runtime.name}",
            f"-Wl,-rpath,{toolchain.runtime.parent}", "-Wl,-z,defs", "-lm"]
    preludes = precompiled_preludes(toolchain)
    readable = (RUNTIME_DIR, toolchain.runtime, *preludes.values())
    with tempfile.TemporaryDirectory(dir=toolchain.cache, prefix="build-") as directory:
        build = Path(directory)
        (build / SOURCE_NAME).write_text(text)

        def base(build: str) -> list[str]:
            # The header beside its .gch where it is precompiled; preprocessed text holds the prelude already.
            prelude = () if rewritten.preprocessed else prelude_flags(preludes.get(build, RUNTIME_DIR))
            return [toolchain.compiler, *BUILD_FLAGS[build], *prelude]

        def run(argv: list[str], limits: Limits = COMPILE_LIMITS) -> subprocess.CompletedProcess[str]:
            return sandbox.run_tool(argv, build, COMPILE_SECONDS, limits, readable)

        # The two builds run side by side: the instrumented one compiles to an object first, because linking
        # with -fsanitize=thread would pull in the real ThreadSanitizer library.
        argvs = [[*base("checked"), "-c", "-x", "c++", SOURCE_NAME, "-o", "checked.o"]]
        if fast:
            argvs.append([*base("fast"), "-shared", "-x", "c++", SOURCE_NAME, "-x", "none", *link, "-o", "fast.so"])
        with ThreadPoolExecutor(2) as pool:
            compiled = list(pool.map(run, argvs))
        failed = next((result for result in compiled if result.returncode != 0), None)
        if failed is not None:
            raise _compile_error(failed.stderr, source)
        linked = run([toolchain.compiler, "-shared", "checked.o", *link, *WRAPPED, "-o", "checked.so"])
        if linked.returncode != 0:
            raise _compile_error(linked.stderr, source)
        seen = _inspect(build, [f"{name}.so" for name in files], run)
        imports = _imports(seen["undefined"])
        _refuse_forbidden_imports(imports)
        unchecked = sorted(name for name in imports if not CHECKED_IMPORT.match(name))
        objects = data_objects(seen["defined"], seen["demangled"])
        _refuse_zero_sized(objects)
        variables = device_variables(objects)
        lines = _line_table(seen["disassembly"], build / "checked.so", run)
        for name, path in files.items():
            _publish(build / f"{name}.so", path)
        hashes = _write_manifest(manifest, files, compiled[0].stderr, lines, unchecked, variables)
    return finish(compiled[0].stderr, lines, hashes, unchecked, variables)


def data_objects(symbols: str, demangled: str) -> list[tuple[str, str, str, int]]:
    """The data objects a library defines, from `nm --defined-only -S -p` and its `-C` twin, line for line: each as
    (symbol, its demangled name, nm's kind, its size: 0 where nm shows none)."""
    objects = []
    for line, readable in zip(symbols.splitlines(), demangled.splitlines(), strict=True):
        fields = line.split()  # address, [size,] kind, symbol
        name = readable.split(maxsplit=len(fields) - 1)[-1]
        size = int(fields[1], 16) if len(fields) == 4 else 0
        if fields[-2] in "bBdDuVvrR":
            objects.append((fields[-1], name, fields[-2], size))
    return objects


def device_variables(objects: list[tuple[str, str, str, int]]) -> list[str]:
    """The symbols of the kernel library's variables in a GPU's global memory (`__device__`, `__constant__`,
    `__managed__`, a function's `static`), which the runtime checks as it checks the grader's buffers. From what
    the compiler built (`data_objects`), so a declaration written through a macro, with `__align__` or in
    parentheses is one like any other (red team): every writable data object but the compiler's own (guard
    variables, vtables and typeinfo: by their mangled prefixes), the C runtime's, the runtime's (`__ag_kernel`),
    and the variables the rewrite makes of `__shared__` arrays, each told by the marker it keeps beside it
    (rewrite.SHARED_MARKER, the array's name as the compiler keeps it exactly where it keeps the array). Where a
    scope holds more variables of an array's name than markers, all of them are checked: a kernel's own variable
    cannot hide behind a `__shared__` array's name."""
    sized = [(symbol, name, kind) for symbol, name, kind, size in objects if size > 0]
    names = Counter(name for _, name, _ in sized)
    rewritten = set()
    for _, name, _ in sized:
        scope, _, last = name.rpartition("::")
        if last.startswith(SHARED_MARKER):
            array = f"{scope}::{last[len(SHARED_MARKER):]}" if scope else last[len(SHARED_MARKER):]
            if names[array] <= names[name]:
                rewritten.update((array, name))
    return [
        symbol for symbol, name, kind in sized
        if kind in _WRITABLE and name not in rewritten and not symbol.startswith(_COMPILERS)
        and not _runtime_own(symbol)
    ]


def _runtime_own(symbol: str) -> bool:
    return symbol in _RUNTIME_OWN or re.fullmatch(r"completed\.\d+", symbol) is not None


# The compiler's own objects, by their mangled prefixes: guard variables, vtables, VTTs, typeinfo and their names,
# construction vtables, thread-local wrappers. Not reference temporaries (`_ZGR`): a kernel can write those.
_COMPILERS = ("_ZGV", "_ZTV", "_ZTT", "_ZTI", "_ZTS", "_ZTC", "_ZTH", "_ZTW")
# The linker's, the C runtime's and the grader runtime's objects (no kernel's name: the policy refuses `__ag_`).
_RUNTIME_OWN = frozenset({"__frame_dummy_init_array_entry", "__do_global_dtors_aux_fini_array_entry", "__dso_handle",
                          "__TMC_END__", "_GLOBAL_OFFSET_TABLE_", "_DYNAMIC", "__bss_start", "_edata", "_end",
                          "__ag_kernel"})
_WRITABLE = "bBdDuVv"  # nm's kinds of writable data


COMPILE_SECONDS = 60.0
PRELUDE = "ag_prelude.h"
# The C library's copies, which the instrumented build calls through the runtime's checked wrappers.
WRAPPED = ("-Wl,--wrap=memcpy", "-Wl,--wrap=memmove")


def prelude_flags(folder: Path = RUNTIME_DIR) -> tuple[str, ...]:
    """The flags that put the prelude, the copy in `folder`, before a kernel; its own headers are the runtime's."""
    return ("-include", str(folder / PRELUDE), "-I", str(RUNTIME_DIR))


PRELUDE_FLAGS = prelude_flags()


def _preprocess(toolchain: Toolchain, sandbox: Sandbox, text: str, source: KernelSource) -> str:
    """`g++ -E` of `text` with the prelude, keeping `__shared__` for the rewrite (rewrite.rewrite_source)."""
    with tempfile.TemporaryDirectory(dir=toolchain.cache, prefix="cpp-") as directory:
        folder = Path(directory)
        (folder / SOURCE_NAME).write_text(text)
        argv = [toolchain.compiler, *COMMON_FLAGS, "-E", "-DAG_PREPROCESSING", *PRELUDE_FLAGS, "-x", "c++", SOURCE_NAME]
        result = sandbox.run_tool(argv, folder, COMPILE_SECONDS, readable=(RUNTIME_DIR,))
    if result.returncode != 0:
        raise _compile_error(result.stderr, source)
    return result.stdout


# Functions a kernel library may not import: the grader's runtime API (only its hooks are for kernel code),
# and what could start programs, load code or reach out. The source policy refuses their names; this check
# sees what the linker saw, whatever macros built the names. The sandbox and seccomp stop them regardless.
FORBIDDEN_IMPORT = re.compile(
    r"^(ag_\w+|system|popen|exec\w*|posix_spawn\w*|fork|vfork|clone\w*|dlopen|dlmopen|dlsym|dlvsym|syscall|"
    r"socket|connect|ptrace|kill|raise|mprotect|pthread_create|"
    # Allocation: memory no check watches, where a kernel could keep state between launches or use up the worker's
    # address space until its checks cannot be made (review).
    r"malloc|calloc|realloc|reallocarray|free|aligned_alloc|posix_memalign|memalign|valloc|_Zn[wa]\w*|_Zd[la]\w*)$"
)


# Imports whose memory accesses the bounds checks still see: the runtime's hooks (the instrumented build's memcpy
# and memmove among them, through its wrappers: WRAPPED), the thread-index variables, what the compiler adds, and
# math functions that write through no pointer. Any other (memset, printf, frexpf, and the plain build's memcpy,
# ...) may write where no check looks, so a kernel that calls one is not trusted to have done no more than the stray
# reads it was seen making (Finding.reads_only).
CHECKED_IMPORT = re.compile(
    r"^(__tsan_\w+|__sanitizer_cov_\w+|__ag_\w+|__wrap_mem(cpy|move)|blockIdx|threadIdx|blockDim|gridDim|"
    r"__gmon_start__|_ITM_\w+|__cxa_finalize|(a?(sin|cos|tan)h?|atan2|exp(2|10|m1)?|log(2|10|1p|b)?|pow|r?sqrt|cbrt|hypot|"
    r"f(max|min|abs|mod|dim|ma)|floor|ceil|l?l?round|l?l?rint|nearbyint|trunc|remainder|ldexp|scalbl?n|copysign|"
    r"erfc?|tgamma|ilogb|nextafter)[fl]?)$"
)


def _imports(nm_output: str) -> set[str]:
    """The functions and variables that `nm --undefined-only` says the libraries import, unversioned."""
    return {line.split()[-1].split("@")[0] for line in nm_output.splitlines() if line.strip().startswith("U ")}


def _refuse_forbidden_imports(names: set[str]) -> None:
    forbidden = sorted(name for name in names if FORBIDDEN_IMPORT.match(name))
    if forbidden:
        summary = (
            f"the kernel calls `{forbidden[0]}`, which kernel code may not use: a kernel computes its result from "
            "its input, and calls no host library or grader function"
        )
        raise CompileError(summary, (CompilerMessage("error", None, summary),), "")


def _refuse_zero_sized(objects: list[tuple[str, str, str, int]]) -> None:
    """A variable of size zero (`__device__ unsigned x[0]`) has no bounds the runtime could check, so what it
    holds could pass from launch to launch unseen (red team); nvcc refuses it in device code, and so does this."""
    for symbol, name, kind, size in objects:
        if size == 0 and kind in _WRITABLE and not _runtime_own(symbol):
            summary = f"the variable `{name}` has size zero, which nvcc refuses in device code: give it a size"
            raise CompileError(summary, (CompilerMessage("error", None, summary),), "")


def build_shared_objects(
    toolchain: Toolchain, stage: Stage, source: KernelSource, sandbox: Sandbox, fast: bool = True
) -> Build:
    """`compile_kernel` as a Build a worker can load: the libraries' bytes and what the loader needs."""
    built = compile_kernel(toolchain, source, stage, sandbox, fast)
    files = {"checked": built.checked.read_bytes()} | ({"fast": built.fast.read_bytes()} if fast else {})
    for name, data in files.items():  # the bytes sent, not only the file checked a moment ago
        if hashlib.sha256(data).hexdigest() != built.hashes[name]:
            raise BackendUnavailable(f"the cached build {name}.so changed after it was built: clear the cache")
    return Build(
        backend="cpu",
        stage_id=stage.id,
        source=source,
        warnings=built.warnings,
        files=tuple((f"{name}.so", data) for name, data in files.items()),
        details={
            "dynamic_shared_names": built.dynamic_shared_names,
            "parameter_names": built.parameter_names,
            "device_variables": built.device_variables,
            "unchecked_imports": built.unchecked_imports,
            "lines": built.lines,
        },
    )


_INSTRUCTION = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)")


# A build's libraries ("$@", the instrumented one first) inspected in one sandboxed run, not four (every sandbox
# takes the kernel's locks over namespaces while it starts, and a class starts thousands): each tool's output in
# a file of its own, read as data. objdump may fail (no line table then); nm may not.
_INSPECT = (
    'nm -D --undefined-only "$@" > undefined.txt && nm --defined-only -S -p "$1" > defined.txt'
    ' && nm --defined-only -S -p -C "$1" > demangled.txt'
    ' && { objdump -d --no-show-raw-insn "$1" > disassembly.txt || : > disassembly.txt; }'
)
_INSPECTED = ("undefined", "defined", "demangled", "disassembly")
# Each file at most this: a real kernel's are kilobytes, but names spelled out can grow without bound (templates
# nested a dozen deep name hundreds of megabytes in a library of kilobytes).
INSPECT_LIMITS = replace(COMPILE_LIMITS, file_bytes=32 << 20)
_PAST_A_LIMIT = {128 + signal.SIGXFSZ, 128 + signal.SIGXCPU, 128 + signal.SIGKILL}


def _inspect(build: Path, libraries: list[str], run) -> dict[str, str]:
    """What `_INSPECT` saw of `libraries` in `build`: the imports, the defined symbols plain and demangled, and the
    instrumented library's disassembly, by name. A build too large to inspect is the kernel's compile error."""
    result = run(["sh", "-c", _INSPECT, "sh", *libraries], INSPECT_LIMITS)
    if result.returncode in _PAST_A_LIMIT:
        limit = INSPECT_LIMITS.file_bytes or 0
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
        summary = f"the compiled kernel is too large to check: its symbols, listed, pass {size} (deep templates?)"
        raise CompileError(summary, (CompilerMessage("error", None, summary),), "")
    if result.returncode != 0:  # never skipped: the imports it lists are checked
        raise BackendUnavailable(f"nm could not read the kernel's build: {result.stderr.strip()[-300:]}")
    return {name: (build / f"{name}.txt").read_text(errors="replace") for name in _INSPECTED}


def _line_table(disassembly: str, library: Path, run) -> dict[int, int]:
    """Kernel-source lines of the runtime hooks' call sites in the instrumented build, from its `disassembly`.

    The runtime names a call site by its return address less one, relative to the library (see pc_offset in
    ag_runtime.cpp). Reading the table here, in the compile sandbox, spares the worker from starting tools.
    """
    addresses: list[tuple[int, str]] = []
    for raw in disassembly.splitlines():
        match = _INSTRUCTION.match(raw)
        if match:
            addresses.append((int(match[1], 16), match[2]))
    pairs = zip(addresses, addresses[1:], strict=False)
    sites = [following - 1 for (_, op), (following, _) in pairs if op.startswith("call")]
    return {site: line for site, line in _addr2line(library, sites, run).items() if line is not None}


def _addr2line(library: Path, offsets: list[int], run) -> dict[int, int | None]:
    """Kernel-source lines of code offsets in `library`, innermost student frame first (inlining included)."""
    if not offsets:
        return {}
    result = run(["addr2line", "-e", library.name, "-i", "-a", *(hex(offset) for offset in offsets)])
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


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_manifest(
    manifest: Path,
    files: dict[str, Path],
    log: str,
    lines: dict[int, int],
    unchecked: list[str] | None = None,
    variables: list[str] | None = None,
) -> dict[str, str]:
    """Record what was built, with each file's hash; written last, so a manifest means a complete build."""
    hashes = {name: sha256_of(path) for name, path in files.items()}
    data = {
        "files": hashes,
        "log": log,
        "lines": {str(pc): line for pc, line in lines.items()},
        "unchecked": unchecked or [],
        "variables": variables or [],
    }
    handle, temporary = tempfile.mkstemp(dir=manifest.parent, suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        json.dump(data, out)
    _publish(Path(temporary), manifest)
    return hashes


def _read_manifest(manifest: Path, files: dict[str, Path]) -> dict | None:
    """A cached build's manifest, if every file it names is there with the hash recorded when it was built."""
    try:
        data = json.loads(manifest.read_text())
        if all(sha256_of(path) == data["files"][name] for name, path in files.items()):
            return data
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


_LOCATION = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:\d+:)?\s*(?P<rest>.*)$")
_SEVERITY = re.compile(r"^(?:fatal )?(?P<severity>error|warning):\s*(?P<text>.*)$")
# A driver's own failure (`g++: fatal error: Killed signal terminated program cc1plus`, `g++: internal compiler
# error: File size limit exceeded`); not collect2's `ld returned 1 exit status`, which follows the linker's own.
_DRIVER = re.compile(
    r"^(?:\S*/)?(?:[\w.-]*-)?(?:g\+\+|gcc|cc1plus|as|ld|collect2)(?:-[\w.]+)?: "
    r"(?:fatal error|internal compiler error|error): (?!ld returned \d+ exit status)(?P<text>.*)$"
)
_DEFINE_IT = " (declared, and never defined in the cell: define it there, with the parameter types it is called with)"
_TOO_LARGE = " (the compiled kernel is larger than a compile may write: a __device__ or static array too large?)"


def parse_diagnostics(log: str, source: KernelSource) -> list[CompilerMessage]:
    """g++'s errors and warnings as CompilerMessage records, on notebook cell lines.

    A diagnostic inside the prelude or the generated launcher goes to the student's line that the
    surrounding notes name (a macro expansion, a template instantiation), or to no line.
    """
    student_lines = source.text.count("\n") + 1
    entries: list[tuple[str, int, str]] = []  # (file, line, rest) for each located line, in order
    for raw in log.splitlines():
        match = _LOCATION.match(raw.strip())
        undefined = "undefined reference to" in raw or "undefined symbol" in raw
        if match:
            rest = match["rest"]
            if undefined:  # the linker's `kernel.cu:9: undefined reference to 'helper(float)'` (the call's line)
                rest = "error: " + rest[rest.index("undefined"):] + _DEFINE_IT
            entries.append((Path(match["file"]).name, int(match["line"]), rest))
        elif undefined:
            entries.append(("", 0, "error: " + raw.split(":", 2)[-1].strip() + _DEFINE_IT))
        elif driver := _DRIVER.match(raw.strip()):  # the compiler's driver, with no line: a limit it ran into
            too_large = _TOO_LARGE if "File size limit exceeded" in driver["text"] else ""
            entries.append(("", 0, f"error: {driver['text']}{too_large}"))
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


def _compile_error(log: str, source: KernelSource) -> CompileError:
    """The launcher names no kernel (the loader binds it: Stage.symbols), so every error is the student's."""
    messages = tuple(parse_diagnostics(log, source))
    errors = [m for m in messages if m.severity == "error"]
    if errors:
        first = errors[0]
        where = f" (line {first.line})" if first.line is not None else ""
        summary = f"the kernel did not compile{where}: {first.text}"
    else:
        summary = "the kernel did not compile"
    return CompileError(summary, messages, log)
