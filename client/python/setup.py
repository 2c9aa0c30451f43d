"""Builds ithaca_client with its gRPC modules generated from proto/ (protogen.py): the proto
files of the repository this directory sits in (../../proto), or $ITHACA_PROTO_DIR."""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import protogen  # noqa: E402


class BuildWithProtos(build_py):
    def run(self):
        super().run()
        proto_dir = os.environ.get("ITHACA_PROTO_DIR") or os.path.join(HERE, "..", "..", "proto")
        protogen.generate(os.path.abspath(proto_dir),
                          os.path.join(self.build_lib, "ithaca_client", "_generated"))


setup(cmdclass={"build_py": BuildWithProtos})
