"""Streaming decode equals one-shot decode; streams of several requests share a batch; FP32 is enforced."""

from __future__ import annotations

import pytest
import torch

from breeze_worker.model.codec import DecoderStreamState, load_codec, tiny_codec, write_codec_checkpoint

ATOL = 1e-5


def random_codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (batch, 16, frames), generator=generator)


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_streaming_equals_one_shot(codec, chunk):
    codes = random_codes(2, 10, seed=chunk)  # 10 frames > the tiny decoder's window (4)
    whole = codec.decode(codes)
    state = codec.new_stream(2)
    pieces = []
    for start in range(0, 10, chunk):
        piece = codec.decode_stream(codes[:, :, start : start + chunk], state)
        assert piece.dtype == torch.float32
        assert tuple(piece.shape) == (2, codes[:, :, start : start + chunk].shape[-1] * 1920)
        pieces.append(piece)
    streamed = torch.cat(pieces, dim=-1)
    assert whole.abs().mean() > 0.05
    torch.testing.assert_close(streamed, whole, atol=ATOL, rtol=0)
    assert state.position.tolist() == [10, 10]


def test_requests_side_by_side_equal_each_alone(codec):
    """Rows join (concat), leave (select), are reordered (select) and recycled (reset) mid-stream."""
    lengths = {"a": 7, "b": 5, "c": 4, "d": 3}
    requests = {name: random_codes(1, n, seed=len(name) + n)[0] for name, n in lengths.items()}
    alone = {name: codec.decode(codes.unsqueeze(0))[0] for name, codes in requests.items()}
    progress = {name: 0 for name in requests}
    audio: dict[str, list[torch.Tensor]] = {name: [] for name in requests}

    def step(state: DecoderStreamState, rows: list[str]) -> None:
        frame = torch.stack([requests[name][:, progress[name]] for name in rows]).unsqueeze(-1)
        out = codec.decode_stream(frame, state)
        for row, name in enumerate(rows):
            audio[name].append(out[row])
            progress[name] += 1

    state, rows = codec.new_stream(1), ["a"]
    for _ in range(2):
        step(state, rows)
    state, rows = state.concat(codec.new_stream(1)), rows + ["b"]  # b admitted beside a
    for _ in range(3):
        step(state, rows)
    state, rows = DecoderStreamState.concat_all([state, codec.new_stream(1)]), rows + ["c"]
    for _ in range(2):
        step(state, rows)
    assert progress == {"a": 7, "b": 5, "c": 2, "d": 0}  # a and b are done
    state.reset([0])  # a's row is recycled for d
    rows[0] = "d"
    state, rows = state.select([2, 0]), ["c", "d"]  # b leaves; the rows are reordered
    for _ in range(2):
        step(state, rows)
    state, rows = state.select([1]), ["d"]  # c leaves
    step(state, rows)

    assert progress == lengths
    for name in requests:
        torch.testing.assert_close(torch.cat(audio[name]), alone[name], atol=ATOL, rtol=0, msg=name)


def test_reset_by_mask_restarts_only_masked_rows(codec):
    first, second = random_codes(2, 3, seed=5), random_codes(2, 4, seed=6)
    state = codec.new_stream(2)
    with torch.inference_mode():  # as the engine runs it; the reset below happens outside
        codec.decode_stream(first, state)
    state.reset(torch.tensor([False, True]))
    assert state.position.tolist() == [3, 0]
    out = codec.decode_stream(second, state)
    continued = codec.decode(torch.cat([first[:1], second[:1]], dim=-1))[0, 3 * 1920 :]
    restarted = codec.decode(second[1:])[0]
    torch.testing.assert_close(out[0], continued, atol=ATOL, rtol=0)
    torch.testing.assert_close(out[1], restarted, atol=ATOL, rtol=0)


def test_state_select_copies(codec):
    state = codec.new_stream(2)
    codec.decode_stream(random_codes(2, 2, seed=7), state)
    picked = state.select([1])
    picked.reset([0])
    assert state.position.tolist() == [2, 2] and picked.position.tolist() == [0]
    assert picked.batch_size == 1 and len(picked.keys) == len(state.keys)


def test_decode_stream_checks_rows(codec):
    with pytest.raises(ValueError, match="rows"):
        codec.decode_stream(random_codes(3, 1, seed=8), codec.new_stream(2))


def test_decode_rejects_bad_codes(codec):
    with pytest.raises(ValueError, match="16"):
        codec.decode(torch.zeros(1, 8, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="2048"):
        codec.decode(torch.full((1, 16, 2), 2050, dtype=torch.int64))


def test_codec_stays_fp32_whatever_the_caller_asks(codec, tmp_path):
    half = tiny_codec(seed=0, dtype=torch.bfloat16)
    half.to("cpu", dtype=torch.float16)
    loaded = load_codec(write_codec_checkpoint(half, tmp_path / "audio_tokenizer"), dtype=torch.bfloat16)
    for model in (half, loaded):
        tensors = [*model.decoder.parameters(), *model.encoder.parameters()]
        assert tensors and all(t.dtype == torch.float32 for t in tensors)
    codes = random_codes(1, 3, seed=9)
    audio = loaded.decode(codes)
    assert audio.dtype == torch.float32 and torch.isfinite(audio).all()
    torch.testing.assert_close(audio, codec.decode(codes), atol=0, rtol=0)
    assert half.new_stream(1).keys[0].dtype == torch.float32
    wav = torch.sin(torch.arange(4800) * 0.05) * 0.3
    from_bf16 = loaded.encode(wav.to(torch.bfloat16))
    from_f64 = loaded.encode(wav.to(torch.bfloat16).to(torch.float64).numpy())
    assert from_bf16.dtype == torch.int64 and tuple(from_bf16.shape) == (3, 16)
    assert torch.equal(from_bf16, from_f64)
