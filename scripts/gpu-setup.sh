# Install PyCUDA and the packages the GPU tests need on a GPU machine without network, from .gpu-wheels/.
#
# Source it from the repository root, so the PYTHONPATH it exports stays set:
#
#     source scripts/gpu-setup.sh && python3 -m pytest -m gpu -q
#
# .gpu-wheels/ comes from scripts/gpu-wheels.sh; it also holds the .debs of bubblewrap and Boost.Context,
# unpacked into /tmp/debs.
# When it holds a built pycuda-*.whl, that is installed as is;
# otherwise PyCUDA is built from its source distribution (about 70 s on 16 cores) and, when $OUT is set (the
# lent GPU machine's folder of files that come back), the built wheel is copied there, to be put into
# .gpu-wheels/ so that later runs skip the build.
#
# Settings: GPU_WHEELS (default .gpu-wheels), GPU_SITE (default /tmp/site-packages: the sandbox binds folders of that name), CUDA_ROOT (default
# /usr/local/cuda-13.0, else /usr/local/cuda).

gpu_setup() {
    local wheels=${GPU_WHEELS:-.gpu-wheels}
    local site=${GPU_SITE:-/tmp/site-packages}
    local cuda_root=${CUDA_ROOT:-}
    if [ -z "$cuda_root" ]; then
        cuda_root=/usr/local/cuda-13.0
        [ -d "$cuda_root" ] || cuda_root=/usr/local/cuda
    fi
    local pip=(python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target "$site")

    if ! compgen -G "$wheels/*.whl" >/dev/null; then
        echo "gpu-setup: no wheels in $wheels; run scripts/gpu-wheels.sh where there is network" >&2
        return 1
    fi
    mkdir -p "$site"
    "${pip[@]}" "$wheels"/*.whl || return 1

    if ! compgen -G "$wheels/pycuda-*.whl" >/dev/null; then
        local sdist
        sdist=$(compgen -G "$wheels/pycuda-*.tar.gz" | head -n 1)
        if [ -z "$sdist" ]; then
            echo "gpu-setup: neither a pycuda wheel nor its source distribution in $wheels" >&2
            return 1
        fi
        local built=/tmp/pycuda-wheel
        local started=$SECONDS
        echo "gpu-setup: building PyCUDA from $sdist with CUDA_ROOT=$cuda_root"
        CUDA_ROOT=$cuda_root PATH="$cuda_root/bin:$PATH" MAKEFLAGS="-j$(nproc)" \
            python3 -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$built" "$sdist" || return 1
        echo "gpu-setup: PyCUDA built in $((SECONDS - started)) s"
        "${pip[@]}" "$built"/pycuda-*.whl || return 1
        if [ -n "${OUT:-}" ]; then
            cp "$built"/pycuda-*.whl "$OUT"/ && echo "gpu-setup: copied the PyCUDA wheel to \$OUT; put it into $wheels"
        fi
    fi

    # Bytecode for everything installed, as pip writes it on any other machine: a sandboxed worker sees the
    # folder read-only, so without it every worker would compile the modules it imports from source.
    python3 -m compileall -q -j 0 "$site" >/dev/null || return 1
    # The same for numpy where it comes with the machine's Python (not from $wheels), and for the grader's own
    # package, whose folder a sandboxed worker also sees read-only (PYTHONDONTWRITEBYTECODE may be set here).
    local numpy_dir
    numpy_dir=$(PYTHONPATH="$site" python3 -c 'import numpy, os; print(os.path.dirname(numpy.__file__))')
    python3 -m compileall -q -j 0 ${numpy_dir:+"$numpy_dir"} autograder >/dev/null \
        || echo "gpu-setup: some bytecode not written (numpy: ${numpy_dir:-not found}; autograder/)" >&2

    # The sandbox (bubblewrap) from its carried Debian package, unpacked into a folder of its own.
    local deb
    deb=$(compgen -G "$wheels/bubblewrap_*.deb" | head -n 1)
    if ! command -v bwrap >/dev/null 2>&1 && [ -n "$deb" ]; then
        dpkg -x "$deb" /tmp/debs && export AUTOGRADER_BWRAP=/tmp/debs/usr/bin/bwrap
        echo "gpu-setup: bubblewrap from $deb"
    fi
    # Boost.Context's static library: the CPU analysis links it into its runtime (fast fibers, not ucontext).
    deb=$(compgen -G "$wheels/libboost-context*-dev_*.deb" | head -n 1)
    if [ -n "$deb" ]; then
        dpkg -x "$deb" /tmp/debs && export LIBRARY_PATH="/tmp/debs/usr/lib/$(uname -m)-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
        echo "gpu-setup: Boost.Context from $deb"
    fi

    export PATH="$cuda_root/bin:$PATH"
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "import pycuda, pycuda.driver as cuda; cuda.init(); \
print('gpu-setup: PyCUDA', pycuda.VERSION_TEXT, 'sees', cuda.Device.count(), 'device(s):', cuda.Device(0).name())"
}

gpu_setup
