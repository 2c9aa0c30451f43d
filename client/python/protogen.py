"""Generates ithaca_client's gRPC modules from the repository's proto/ with grpcio-tools' protoc.

Used by setup.py at build time (nothing generated is committed) and by the test wrapper
(tests/e2e/run_py.sh), which builds the package from the tree it tests:

    python protogen.py PROTO_DIR OUT_DIR    # OUT_DIR: ithaca_client/_generated
"""
import os
import re
import sys
import tempfile

# (include directory relative to proto/, file) -> module the generated code is imported as.
# The health proto goes in flat: a generated "grpc" package would shadow grpcio.
PROTOS = [("", "ithaca/v1/job.proto"), ("grpc/health/v1", "health.proto")]


def generate(proto_dir, out_dir):
    """Writes job_pb2(_grpc).py and health_pb2(_grpc).py into out_dir as one package whose
    modules import each other relatively, so nothing is installed at the top level but
    ithaca_client."""
    from grpc_tools import protoc  # build-time dependency (grpcio-tools)
    import grpc_tools

    job_proto = os.path.join(proto_dir, "ithaca", "v1", "job.proto")
    if not os.path.isfile(job_proto):
        raise SystemExit(f"protogen: {job_proto} not found: ithaca_client is built from the "
                         "Ithaca repository (pip install ./client/python from its root), or set "
                         "ITHACA_PROTO_DIR to its proto/ directory")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for include, name in PROTOS:
            args = ["protoc", "-I" + os.path.join(proto_dir, include), "-I" + well_known,
                    "--python_out=" + tmp, "--grpc_python_out=" + tmp,
                    os.path.join(proto_dir, include, name)]
            if protoc.main(args) != 0:
                raise SystemExit(f"protogen: protoc failed on {name}")
        for root, _, files in os.walk(tmp):
            for f in files:
                if not f.endswith(".py"):
                    continue
                with open(os.path.join(root, f)) as src:
                    text = src.read()
                # "from ithaca.v1 import job_pb2 as ..." / "import health_pb2 as ...".
                text = re.sub(r"^from ithaca\.v1 import (\w+_pb2)", r"from . import \1", text,
                              flags=re.M)
                text = re.sub(r"^import (health_pb2) as", r"from . import \1 as", text, flags=re.M)
                with open(os.path.join(out_dir, f), "w") as dst:
                    dst.write(text)
    with open(os.path.join(out_dir, "__init__.py"), "w") as f:
        f.write('"""Generated from proto/ at build time (client/python/protogen.py)."""\n')


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    generate(sys.argv[1], sys.argv[2])
