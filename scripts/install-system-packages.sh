#!/usr/bin/env bash
# Debian packages the project uses where they can be had: bubblewrap and util-linux's prlimit, the sandbox
# every compile and worker runs in and its limits (grading refuses student code without them, unless
# --no-sandbox), Boost.Context for the CPU backend's fast fibers (it falls back to ucontext without it) and
# Chromium for the browser tests.
set -u
packages="g++ bubblewrap util-linux libseccomp2 binutils libboost-context-dev chromium"
if ! command -v apt-get >/dev/null 2>&1; then
    echo "no apt-get here: install $packages by hand if you want them"
    exit 0
fi
missing=""
for package in $packages; do
    dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"
done
[ -z "$missing" ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo -n"
$sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends $missing >/dev/null \
    || echo "could not install$missing: the CPU backend falls back to ucontext and browser tests skip"
