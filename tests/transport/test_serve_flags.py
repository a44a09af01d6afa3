"""`breeze-worker serve` flags come from the typed settings: environment first, flags over it."""

import argparse

import pytest

from breeze_worker.commands.serve import add_arguments, settings_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_override_the_environment_and_switches_default_to_it():
    env = {"BREEZE_ENGINE_FORCE_PRECISION": "true", "BREEZE_ENGINE_MAX_QUEUE": "5"}
    from_env = settings_from_args(parse(), env)
    assert from_env.engine.force_precision is True and from_env.engine.max_queue == 5
    flagged = settings_from_args(parse("--max-queue", "9", "--min-reference-seconds", "2.5",
                                       "--reference-cache-entries", "3", "--precision", "bf16"), {})
    assert flagged.engine.max_queue == 9 and flagged.engine.min_reference_seconds == 2.5
    assert flagged.engine.reference_cache_entries == 3 and flagged.engine.precision == "bf16"
    assert flagged.engine.force_precision is False
    assert settings_from_args(parse("--force-precision"), {}).engine.force_precision is True


def test_invalid_values_say_what_to_change():
    with pytest.raises(ValueError, match="min_reference_seconds"):
        settings_from_args(parse("--min-reference-seconds", "40"), {})
    with pytest.raises(ValueError, match="precision must be"):
        settings_from_args(parse("--precision", "fp8"), {})
