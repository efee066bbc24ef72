#!/usr/bin/env bash
# Regenerate the Python code (*_pb2.py, *_pb2.pyi, *_pb2_grpc.py) for EVERY .proto under src/kubegpu/proto.
# Compiles from the src root so generated imports read `from kubegpu.proto... import api_pb2`, not `import api_pb2`.
# Usage: scripts/gen_protos.sh            (needs grpcio-tools, from the .[dev] extra)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/src"
python="${PYTHON:-python}"
mapfile -t protos < <(find kubegpu/proto -name '*.proto' | sort)
if [ "${#protos[@]}" -eq 0 ]; then
    echo "gen_protos: no .proto files under src/kubegpu/proto" >&2
    exit 1
fi
for proto in "${protos[@]}"; do
    "$python" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. "$proto"
    dir="$(dirname "$proto")"
    # every directory on the way must be a package for the generated absolute imports to resolve
    while [ "$dir" != "kubegpu" ]; do
        [ -f "$dir/__init__.py" ] || echo '"""Generated protocol code (scripts/gen_protos.sh)."""' > "$dir/__init__.py"
        dir="$(dirname "$dir")"
    done
    echo "generated $proto"
done
