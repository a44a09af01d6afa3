"""A stock grpcio client as its own process, for a test to stop (SIGSTOP) from outside while it streams (its
HTTP/2 window is not grown, so a short job's audio does not all fit in it and the worker's writes wait): it
prints the job's artifact id once the job started, reads the stream to its end, then prints one JSON line with
the status and the audio it received (hex)."""

from __future__ import annotations

import json
import sys

import grpc

from breeze_tts_proto.v1 import synthesis_pb2, synthesis_pb2_grpc


def main(target: str, max_frames: int) -> None:
    channel = grpc.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])  # a 64 KiB window, not grown
    request = synthesis_pb2.SynthesizeRequest(text="A client that stops reading.", max_frames=max_frames, seed=5,
                                              sampling=synthesis_pb2.SamplingOverrides(temperature=0.0))
    audio = bytearray()
    code, details = "OK", ""
    try:
        for message in synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(request, timeout=600):
            if message.WhichOneof("event") == "started":
                print(message.started.artifact_id, flush=True)
            elif message.WhichOneof("event") == "chunk":
                audio += message.chunk.pcm
    except grpc.RpcError as exc:
        code, details = exc.code().name, exc.details()
    print(json.dumps({"code": code, "details": details, "audio": audio.hex()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
