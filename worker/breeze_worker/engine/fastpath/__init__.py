"""The fast decode path: static KV caches, the whole frame in CUDA graphs, one host read per frame.

`FastFrameGenerator` (generator.py) has the eager generator's interface; `FrameStep` (step.py) is the
frame computation around rows; `FrameRunner` (graph.py) captures and replays it.
"""
