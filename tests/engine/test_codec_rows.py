"""CodecRows (engine/codec_rows.py) on the CPU: the slot-based codec step the engine replays from CUDA graphs
on a GPU gives every stream exactly the audio it gets decoded alone, whoever joins, leaves or shares the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from breeze_worker.engine.codec_graphs import SlotBatch, bucket_for, pool_for
from breeze_worker.engine.codec_rows import CodecRows, stack_frames
from breeze_worker.measure.syncaudit import SyncDetector
from breeze_worker.model.codec import DecoderStreamState, tiny_codec


@pytest.fixture(scope="module")
def codec():
    torch.set_num_threads(1)
    return tiny_codec(seed=0)


def codes_of(frames: int, seed: int) -> torch.Tensor:
    """One stream's frames: int64 [frames, 16]."""
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


def alone(codec, codes: torch.Tensor, layout: list[tuple[int, int]] | None = None) -> np.ndarray:
    """The stream decoded by itself, frame by frame, with plain decode_stream.

    `layout` (width, row) per frame places it in a batch of that width whose other rows are silent streams
    fed code 0. The audio of a row does not depend on the other rows, but on the CPU it does depend on the
    batch width in the last bits (oneDNN convolutions and BLAS GEMMs block differently per batch size), so
    a bit-exact comparison uses the widths the slots had; without `layout` the batch is the stream alone.
    """
    layout = layout or [(1, 0)] * len(codes)
    state, pieces = codec.new_stream(1), []
    with torch.inference_mode():
        for frame, (width, row) in zip(codes, layout, strict=True):
            parts = [codec.new_stream(row)] if row else []
            parts += [state] + ([codec.new_stream(width - row - 1)] if width - row - 1 else [])
            batch = DecoderStreamState.concat_all(parts)
            frames = torch.zeros(width, 16, 1, dtype=torch.long)
            frames[row, :, 0] = frame
            pieces.append(codec.decode_stream(frames, batch)[row])
            state = batch.select([row])
    return torch.cat(pieces).numpy()


def run_schedule(codec, streams: dict[str, tuple[int, torch.Tensor]], on_step=None):
    """Each stream (name -> (first step, codes)) joins at its first step and leaves after its last frame.
    Returns each stream's audio and its (batch width, slot) per frame."""
    rows = CodecRows(codec)
    audio: dict[str, list[np.ndarray]] = {name: [] for name in streams}
    layout: dict[str, list[tuple[int, int]]] = {name: [] for name in streams}
    step = 0
    while any(len(audio[n]) < len(c) for n, (_, c) in streams.items()):
        for name, (start, _) in streams.items():
            if start == step:
                rows.add(name)
        frames = {name: codes[len(audio[name])] for name, (start, codes) in streams.items()
                  if start <= step and len(audio[name]) < len(codes)}
        for name in frames:
            layout[name].append((rows.capacity, rows.slot_of(name)))
        for name, pcm in rows.decode(frames).items():
            audio[name].append(pcm)
        if on_step is not None:
            on_step(step, rows)
        for name, (_, codes) in streams.items():
            if name in rows.keys and len(audio[name]) == len(codes):
                rows.remove(name)
        step += 1
    assert len(rows) == 0 and rows.capacity == 0  # the last stream out returns the batch to the pool
    return {name: np.concatenate(parts) for name, parts in audio.items()}, layout


def check_against_alone(codec, streams, out, layout) -> None:
    for name, (_, codes) in streams.items():
        expected = alone(codec, codes, layout[name])
        assert out[name].shape == (len(codes) * 1920,) and np.abs(expected).mean() > 0.01
        np.testing.assert_array_equal(out[name], expected, err_msg=name)
        # and against the stream in a batch of one: the widths change only the last bits
        np.testing.assert_allclose(out[name], alone(codec, codes), atol=2e-5, rtol=0, err_msg=name)


def test_bucket_sizes():
    assert [bucket_for(n) for n in (1, 2, 3, 4, 5, 8, 9, 33, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 64, 64, 128]


def test_streams_joining_and_leaving_equal_each_alone(codec):
    """Six streams join and leave at different frames (up to five at once: buckets 1 -> 2 -> 4 -> 8, and
    back down to 2 once the late ones sit in low slots); each one's audio is bit-identical to it alone."""
    streams = {"a": (0, codes_of(9, 1)), "b": (1, codes_of(3, 2)), "c": (2, codes_of(6, 3)),
               "d": (2, codes_of(2, 4)), "e": (3, codes_of(7, 5)), "f": (6, codes_of(5, 6))}
    capacities = []
    out, layout = run_schedule(codec, streams, on_step=lambda step, rows: capacities.append(rows.capacity))
    assert capacities[:4] == [1, 2, 4, 8] and 2 in capacities[4:]  # grew past three buckets, shrank once
    check_against_alone(codec, streams, out, layout)


def test_growing_past_a_bucket_keeps_every_stream(codec):
    """Streams mid-flight when the batch grows (2 -> 4 -> 8 slots) continue exactly, in the same slots."""
    streams = {"p": (0, codes_of(6, 10)), "q": (1, codes_of(6, 11)), "r": (2, codes_of(6, 12)),
               "s": (3, codes_of(6, 13)), "t": (4, codes_of(6, 14))}
    capacities = []
    out, layout = run_schedule(codec, streams, on_step=lambda step, rows: capacities.append(rows.capacity))
    assert capacities[:5] == [1, 2, 4, 4, 8]
    assert [slot for _, slot in layout["p"]] == [0] * 6 and layout["t"][0] == (8, 4)
    check_against_alone(codec, streams, out, layout)


def test_joining_together_moves_the_batch_once_to_the_same_slots(codec, monkeypatch):
    """`add_all` gives the slots one-by-one `add` gives (free slots filled lowest first), but acquires one
    batch: the bucket that holds them all, not each bucket between."""
    one_by_one = CodecRows(codec)
    for key in "abc":
        one_by_one.add(key)
    one_by_one.remove("b")  # a hole at slot 1
    together = CodecRows(codec)
    together.add_all("abc")
    together.remove("b")
    pool = pool_for(codec)
    acquired = []
    real = pool.acquire
    monkeypatch.setattr(pool, "acquire", lambda rows: acquired.append(rows) or real(rows))
    for key in "defgh":
        one_by_one.add(key)
    assert acquired == [8]  # 2 streams in 4 slots, then the 6th needs 8
    acquired.clear()
    together.add_all("defgh")
    assert acquired == [8]
    assert {k: together.slot_of(k) for k in "acdefgh"} == {k: one_by_one.slot_of(k) for k in "acdefgh"}
    acquired.clear()
    fresh = CodecRows(codec)
    fresh.add_all(range(5))
    assert acquired == [8] and fresh.capacity == 8  # one by one: 1, 2, 4, 8
    acquired.clear()
    fresh.add_all([])
    assert acquired == [] and len(fresh) == 5
    # leaving together: one move, after all have left (one by one, 4, 3, 2, 1 would stop at 2 slots on the way)
    fresh.remove_all([4, 3, 2, 1])
    assert acquired == [1] and fresh.keys == [0] and fresh.slot_of(0) == 0 and fresh.capacity == 1
    acquired.clear()
    fresh.remove_all([0, "never added"])
    assert acquired == [] and len(fresh) == 0 and fresh.capacity == 0


def test_a_freed_slot_reused_starts_from_silence(codec):
    rows = CodecRows(codec)
    first, second, late = codes_of(4, 20), codes_of(6, 21), codes_of(3, 22)
    rows.add("first")
    rows.add("second")
    got = {"second": [], "late": []}
    for i in range(4):
        got["second"].append(rows.decode({"first": first[i], "second": second[i]})["second"])
    freed = rows.slot_of("first")
    rows.remove("first")  # its slot keeps the first stream's context until someone takes it
    rows.add("late")
    assert rows.slot_of("late") == freed and rows.capacity == 2
    for i in range(4, 6):
        out = rows.decode({"second": second[i], "late": late[i - 4]})
        got["second"].append(out["second"])
        got["late"].append(out["late"])
    np.testing.assert_array_equal(np.concatenate(got["late"]), alone(codec, late[:2], [(2, freed)] * 2))
    np.testing.assert_array_equal(np.concatenate(got["second"]), alone(codec, second, [(2, 1 - freed)] * 6))


def test_the_captured_step_equals_decode_stream(codec):
    """SlotBatch.advance is what a CUDA graph captures: decode_stream on an alias of the static state, then a
    copy back into the static tensors. Run eagerly twice it must equal plain decode_stream, and the static
    tensors (the graph's addresses) must be the ones that moved forward."""
    batch = SlotBatch(codec.decoder, rows=2, use_graphs=False)
    assert not batch.graphed
    static = [t for t in (*batch.state.contexts, *batch.state.keys, *batch.state.values, batch.state.position)]
    addresses = [t.data_ptr() for t in static]
    reference = codec.new_stream(2)
    codes = torch.stack([codes_of(2, 30), codes_of(2, 31)])  # [2 streams, 2 frames, 16]
    with torch.inference_mode():
        for i in range(2):
            batch.codes.copy_(codes[:, i].unsqueeze(-1))
            got = batch.advance()
            want = codec.decode_stream(codes[:, i].unsqueeze(-1), reference)
            assert torch.equal(got, want)
    after = [t for t in (*batch.state.contexts, *batch.state.keys, *batch.state.values, batch.state.position)]
    assert all(a is b for a, b in zip(after, static)) and [t.data_ptr() for t in after] == addresses
    for mine, theirs in zip(after, (*reference.contexts, *reference.keys, *reference.values, reference.position)):
        assert torch.equal(mine, theirs)
    assert batch.state.position.tolist() == [2, 2]


def test_one_host_read_per_step(codec):
    """Joining (a slot zero-filled, the batch grown), a step and leaving: the audio read is the only sync."""
    rows = CodecRows(codec)
    rows.add("w")
    with SyncDetector(torch.device("cpu")) as detector:  # the CPU emulates a device: counts what would sync
        rows.add("x")
        rows.add("y")
        frames = {k: codes_of(1, 40 + i)[0] for i, k in enumerate("wxy")}  # host frames, as the LM hands them
        rows.decode(frames)
        rows.remove("x")
    # the one read: the audio turned into numpy by the wait (on CUDA an event wait for the queued copy)
    assert rows.capacity == 4 and [e.op for e in detector.events] == ["numpy"]


def test_batches_are_pooled_per_codec(codec):
    """A batch built (on CUDA: captured) once serves later CodecRows: the warm-up's graphs serve the engine."""
    rows = CodecRows(codec)
    rows.add("k")
    held = rows._held[0]
    rows.remove("k")
    again = CodecRows(codec)
    again.add("m")
    assert again._held[0] is held and pool_for(codec) is again._pool
    del again  # dropped while a stream is in it: the batch still goes back to the pool
    third = CodecRows(codec)
    third.add("n")
    assert third._held[0] is held
    with pytest.raises(ValueError, match="already"):
        third.add("n")
    with pytest.raises(RuntimeError, match="one frame per active stream"):
        third.decode({})


def test_frames_stack_to_the_same_codes_whatever_form_they_come_in():
    """The stepper's rows of one readout stack as they are; lists, arrays, other integer types and [1, 16]
    tensors are converted: every form gives the int64 [n, 16] codes numpy reads from the same numbers."""
    readout = torch.randint(0, 2048, (5, 18), generator=torch.Generator().manual_seed(3))
    rows = list(readout[:, :16])  # views into one tensor, as BatchedStepper.step returns them
    expected = readout[:, :16].clone().numpy()
    forms = [rows, [r.tolist() for r in rows], [r.numpy().astype(np.int32) for r in rows],
             [r.to(torch.int32) for r in rows], [r.reshape(1, 16) for r in rows],
             rows[:2] + [rows[2].tolist()] + rows[3:]]
    for frames in forms:
        stacked = stack_frames(frames)
        assert stacked.dtype == torch.long and stacked.shape == (5, 16)
        assert np.array_equal(stacked.numpy(), expected)
    stacked = stack_frames(iter(rows))  # any iterable, in its order
    assert np.array_equal(stacked.numpy(), expected)
    readout[0, 0] = -7  # a copy: the readout's next step does not change frames already stacked
    assert stacked[0, 0].item() == expected[0, 0] != -7
