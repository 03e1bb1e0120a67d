#!/usr/bin/env bash
# Fill .gpu-wheels/ with what the GPU machine lacks, so it can run the GPU tests without a network.
#
# Run it here, on a machine with network access. The GPU machine (Python 3.12, CUDA 13.0) already has numpy,
# pandas, pytest, jinja2, matplotlib, attrs, markupsafe, pygments and markdown-it-py; it has no PyCUDA and
# none of the notebook packages. PyCUDA has no binary wheels on the package index, so its source
# distribution travels and scripts/gpu-setup.sh builds it there. That build can be brought back as a wheel
# (gpu-setup.sh copies it to $OUT when it is set) and dropped into .gpu-wheels/: later runs then only install.
#
# Usage: bash scripts/gpu-wheels.sh [--notebooks] [destination]      (default .gpu-wheels, which git ignores)
#
# --notebooks adds what executing a notebook needs (nbclient, ipykernel and their dependencies, about 15 MB),
# for the gpu-marked notebook run. nbgrader itself (75 MB with its dependencies) does not fit the 64 MiB that
# travels, so tests that import it cannot be collected there: name the test files to run.
set -euo pipefail
cd "$(dirname "$0")/.."
notebooks=0
if [ "${1:-}" = "--notebooks" ]; then
    notebooks=1
    shift
fi
dest=${1:-.gpu-wheels}
mkdir -p "$dest"
pip=(python3 -m pip)
[ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)

# PyCUDA's own source, built on the GPU machine unless a built wheel is already here.
if ! compgen -G "$dest/pycuda-*.whl" >/dev/null; then
    "${pip[@]}" download -q --no-deps --no-binary=pycuda -d "$dest" pycuda
fi

target=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

# What PyCUDA needs at run time (siphash24 and rpds-py are compiled, hence the cp312 platform tags), then
# what `autograder` imports beyond the machine's packages: nbformat and its dependencies, click and rich, and
# Dask's distributed scheduler for class runs with --workers.
# Each with --no-deps: a second version of a package the machine has would stop the whole install.
packages=(
    pytools platformdirs siphash24 mako pyseccomp pyelftools
    nbformat fastjsonschema jsonschema jsonschema-specifications referencing rpds-py jupyter-core traitlets
    click rich
    dask distributed cloudpickle toolz zict tblib sortedcontainers locket partd fsspec msgpack tornado
)
"${pip[@]}" download -q --no-deps "${target[@]}" -d "$dest" "${packages[@]}"

# What the GPU machine lacks of the system: the sandbox's bubblewrap, and Boost.Context's static library for
# the CPU analysis's fast fibers (its headers are there). Debian's .debs, unpacked there by gpu-setup.sh.
if command -v apt-get >/dev/null 2>&1; then
    boost=$(apt-cache depends libboost-context-dev | awk '/Depends: libboost-context/ {print $2; exit}')
    for package in bubblewrap "$boost"; do
        if ! compgen -G "$dest/${package}_*.deb" >/dev/null; then
            (cd "$dest" && apt-get download -q "$package" >/dev/null 2>&1) || echo "could not download $package's .deb"
        fi
    done
fi

if [ "$notebooks" = 1 ]; then
    # Resolved with their dependencies, then only what is neither here already nor on the machine is kept.
    on_machine=" attrs packaging psutil pygments python_dateutil typing_extensions six setuptools jinja2 markupsafe \
numpy pandas matplotlib pyyaml requests certifi idna urllib3 charset_normalizer "
    resolved=$(mktemp -d)
    "${pip[@]}" download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$resolved" nbclient ipykernel
    for wheel in "$resolved"/*.whl; do
        name=$(basename "$wheel" | cut -d- -f1 | tr '[:upper:].-' '[:lower:]__')
        case "$on_machine" in *" $name "*) continue ;; esac
        compgen -G "$dest/${name}-*.whl" >/dev/null || cp "$wheel" "$dest"/
    done
    rm -rf "$resolved"
fi

ls -1 "$dest"
du -sh "$dest" | awk '{print "total " $1 " (the run tool carries at most 64 MiB with the working tree)"}'
