"""The Mimi encoder's tensors map to the checkpoint's names in both layouts transformers has used
(flat up to 5.17, the GPU image's version; nested after), so the codec loads on either."""

import pytest

from breeze_worker.model.codec.encoder import ReferenceEncoder


@pytest.mark.parametrize(
    "module_name, checkpoint_name",
    [
        # nested layout (transformers > 5.17)
        ("mimi.encoder.encoder_seanet.layers.0.conv.weight", "encoder.encoder.layers.0.conv.weight"),
        ("mimi.encoder.encoder_transformer.layers.1.mlp.fc1.weight",
         "encoder.encoder_transformer.layers.1.mlp.fc1.weight"),
        ("mimi.encoder.downsample.conv.weight", "encoder.downsample.conv.weight"),
        # flat layout (transformers <= 5.17): the checkpoint's own names
        ("mimi.encoder.layers.0.conv.weight", "encoder.encoder.layers.0.conv.weight"),
        ("mimi.encoder_transformer.layers.1.mlp.fc1.weight", "encoder.encoder_transformer.layers.1.mlp.fc1.weight"),
        ("mimi.downsample.conv.weight", "encoder.downsample.conv.weight"),
        # both
        ("mimi.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum",
         "encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum"),
    ],
)
def test_both_mimi_layouts_map_to_checkpoint_names(module_name, checkpoint_name):
    assert ReferenceEncoder.checkpoint_key(module_name) == checkpoint_name


def test_decoder_half_tensors_have_no_checkpoint_name():
    with pytest.raises(ValueError, match="no checkpoint name"):
        ReferenceEncoder.checkpoint_key("mimi.upsample.conv.weight")


def test_the_live_encoder_has_no_decoder_half(tiny_codec_for_layout):
    names = [n for n, _ in tiny_codec_for_layout.encoder.named_parameters()]
    assert names and not any(n.startswith(("mimi.upsample", "mimi.decoder")) for n in names)


@pytest.fixture(scope="module")
def tiny_codec_for_layout():
    from breeze_worker.model.codec import tiny_codec

    return tiny_codec(seed=3)


def test_building_the_encoder_reads_no_deprecated_mimi_attribute():
    """transformers 5.18+ warns once a process when MimiModel's old flat attributes are read (every worker
    start printed two such lines); the encoder is built without reading them."""
    import logging

    from transformers.utils import logging as hf_logging

    from breeze_worker.model.codec import tiny_codec

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = hf_logging.get_logger("transformers.models.mimi.modeling_mimi")
    logger.addHandler(handler)
    hf_logging.warning_once.cache_clear()  # a warning already given in this process would be given again
    try:
        tiny_codec(seed=4)
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records if "deprecated" in r.getMessage()] == []
