"""Count the full-size codec decoder's floating-point operations per streamed frame (CPU, seeded random
weights): the arithmetic side of the codec step's floor (results/batching/NOTES.md).
Usage: PYTHONPATH=worker:client:protos python3 scripts/codec_flops.py
"""

from __future__ import annotations

import collections

import torch
from torch.utils.flop_counter import FlopCounterMode

from breeze_worker.bench.models import decoder_only_codec


def main() -> None:
    decoder = decoder_only_codec(0, torch.device("cpu")).decoder
    print(f"parameters: {sum(p.numel() for p in decoder.parameters()) / 1e6:.1f} M")
    for batch in (1, 4):
        state = decoder.new_stream(batch)
        codes = torch.randint(0, 2048, (batch, 16, 1), generator=torch.Generator().manual_seed(batch))
        with torch.inference_mode():
            decoder.decode_stream(codes, state)  # past the first frame: the left contexts are filled
            with FlopCounterMode(display=False) as counter:
                decoder.decode_stream(codes, state)
        print(f"batch {batch}: {counter.get_total_flops() / batch / 1e9:.3f} GFLOP per frame per stream")
        if batch == 1:
            per_stage = collections.Counter()
            for module, counts in counter.get_flop_counts().items():
                if module.count(".") == 2:
                    per_stage[module] = sum(counts.values())
            for module, flops in per_stage.most_common(6):
                print(f"  {module:40s} {flops / 1e9:.3f}")


if __name__ == "__main__":
    main()
