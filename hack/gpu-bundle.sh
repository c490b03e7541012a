#!/usr/bin/env bash
# Builds the real-GPU test bundle (docs/node-agent.md, "Testing on a real
# GPU"): the node agent and the compiled tests of e2e/realgpu, with a script
# that runs them, as one tarball for a machine with an NVIDIA driver and no Go.
#
#   hack/gpu-bundle.sh [OUT]     default _output/resclass-gpu-bundle.tar.gz
#
# The binaries link glibc dynamically (go-nvml loads libnvidia-ml.so.1 with
# dlopen, so cgo is on): they run on a glibc at least as new as the build
# machine's (Debian 12 and Ubuntu 22.04 or newer from this repository's CI).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/_output/resclass-gpu-bundle.tar.gz}
limit=$((60 * 1024 * 1024))

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dir=$work/resclass-gpu-bundle
mkdir -p "$dir"

cd "$root"
export CGO_ENABLED=1
# -s -w: no symbol tables or DWARF; the bundle is for running, not debugging.
go build -trimpath -tags grpcnotrace -ldflags '-s -w' -o "$dir/node-agent" ./cmd/node-agent
go test -c -trimpath -ldflags '-s -w' -o "$dir/realgpu.test" ./e2e/realgpu

cat >"$dir/run.sh" <<'SCRIPT'
#!/usr/bin/env bash
# Runs the real-GPU checks of resclass. Needs the NVIDIA driver (nvidia-smi
# on PATH); set RESCLASS_NVML_LIBRARY=/path/libnvidia-ml.so.1 when the
# dynamic linker does not find it. Prints the machine, the driver and each
# result; exits non-zero when a check fails.
set -uo pipefail
cd "$(dirname "$0")"
echo "== machine: $(uname -srm); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
# Where nvidia-smi sees GPUs, a test that cannot open NVML fails instead of
# skipping (RESCLASS_REQUIRE_GPU): a GPU machine must not pass them unrun.
if nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap,pci.bus_id --format=csv 2>&1; then
  export RESCLASS_REQUIRE_GPU=1
else
  echo "(no nvidia-smi: the tests skip, saying why)"
fi
echo "== node-agent discover"
./node-agent discover ${RESCLASS_NVML_LIBRARY:+--nvml-library "$RESCLASS_NVML_LIBRARY"}
echo "== tests"
# The kubelet tests run themselves again in a private mount namespace (the
# kubelet's device manager serves a fixed /var/lib/kubelet/device-plugins,
# which must not be the node's); the mock one also makes device nodes, which
# needs root. Not as root: the real-GPU one uses a user namespace, the mock
# one (which CI runs) is left out.
skip=()
if [ "$(id -u)" != 0 ]; then
  echo "(not root: TestKubeletHandsOutAMockGPU is left out; it needs mknod)"
  skip=(-test.skip '^TestKubeletHandsOutAMockGPU$')
fi
./realgpu.test -test.v -test.count=1 ${skip[@]+"${skip[@]}"} "$@"
SCRIPT
chmod +x "$dir/run.sh"

mkdir -p "$(dirname "$out")"
tar -C "$work" -czf "$out" resclass-gpu-bundle
size=$(stat -c %s "$out")
echo "gpu-bundle: $out $((size / 1024 / 1024)) MiB ($size bytes; limit 60 MiB)"
ls -l "$dir"
if [ "$size" -ge "$limit" ]; then
	echo "gpu-bundle: $size bytes is over the 60 MiB limit" >&2
	exit 1
fi
