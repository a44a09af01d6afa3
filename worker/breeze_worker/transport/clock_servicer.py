"""The Clock service (on both ports): one round trip that reports the worker's clock."""

from __future__ import annotations

import time

from breeze_tts_proto.v1 import clock_pb2, clock_pb2_grpc


class ClockServicer(clock_pb2_grpc.ClockServicer):
    async def Exchange(self, request: clock_pb2.ClockExchangeRequest, context) -> clock_pb2.ClockExchangeResponse:
        received = time.time_ns()
        return clock_pb2.ClockExchangeResponse(client_send_unix_ns=request.client_send_unix_ns,
                                               server_receive_unix_ns=received,
                                               server_send_unix_ns=time.time_ns())
