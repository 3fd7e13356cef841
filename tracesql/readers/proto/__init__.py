"""The XPlane and HLO protobuf messages (XSpace, HloProto, ...), as OpenXLA defines them.

`xla_protos.binpb` is a FileDescriptorSet of tsl/profiler/protobuf/xplane.proto, xla/service/hlo.proto,
xla/service/metrics.proto and xla/xla_data.proto, taken unchanged from the generated modules that the maintained
`tensorflow-cpu` 2.21.0 wheel ships (`tensorflow.tsl.profiler.protobuf.xplane_pb2`,
`tensorflow.compiler.xla.service.hlo_pb2` and their dependencies; Apache License 2.0, The TensorFlow / OpenXLA
Authors). No lighter package ships them for Python: xprof (32 MB) and jaxlib read XPlane in C++ only, and
TensorFlow itself is a 1.3 GB install that takes 1.7 s to import, so the descriptors travel here as data (23 KB)
and the protobuf runtime builds the message classes from them. `python -m tracesql.readers.proto` refreshes the
file from an installed TensorFlow.
"""

from __future__ import annotations

import functools
from pathlib import Path

DESCRIPTOR_SET = Path(__file__).with_name("xla_protos.binpb")
#: The messages the readers use, by full name.
MESSAGES = {"XSpace": "tensorflow.profiler.XSpace", "HloProto": "xla.HloProto",
            "HloModuleProto": "xla.HloModuleProto"}
SOURCES = ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "tensorflow.compiler.xla.service.hlo_pb2")


@functools.cache
def messages() -> dict:
    """Message classes by short name (MESSAGES), built in a private descriptor pool (no clash with a real
    xplane_pb2 / hlo_pb2 imported in the same process)."""
    from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, duration_pb2, message_factory, timestamp_pb2

    pool = descriptor_pool.DescriptorPool()
    for well_known in (any_pb2, duration_pb2, timestamp_pb2):  # what metrics.proto imports, from the runtime itself
        pool.AddSerializedFile(well_known.DESCRIPTOR.serialized_pb)
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    for file in files.file:  # in dependency order
        pool.Add(file)
    return {short: message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
            for short, full in MESSAGES.items()}


def export_from_tensorflow(path: Path = DESCRIPTOR_SET) -> list[str]:
    """Write the descriptor set from the generated modules of an installed TensorFlow; the files written."""
    import importlib

    from google.protobuf import descriptor_pb2

    files, seen = descriptor_pb2.FileDescriptorSet(), set()

    def add(file):
        if file.name in seen or file.name.startswith("google/protobuf/"):
            return
        for dependency in file.dependencies:
            add(dependency)
        seen.add(file.name)
        files.file.add().ParseFromString(file.serialized_pb)

    for module in SOURCES:
        add(importlib.import_module(module).DESCRIPTOR)
    path.write_bytes(files.SerializeToString())
    return [f.name for f in files.file]


if __name__ == "__main__":
    print("\n".join(export_from_tensorflow()))
