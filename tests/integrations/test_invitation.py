"""An external trainer started beside `cadence run` waits for the run's invitation: a
missing or half-written `external.json` is waited for (said once), a whole one is read,
and none within the timeout is one sentence, never a JSONDecodeError traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.integrations.trl.invitation import NoInvitation, wait_for_invitation

WHOLE = {
    "url": "http://127.0.0.1:9",
    "token_file": "/run/token",
    "model": "/run/model",
    "publish_dir": "/run/publish",
}


class FakeTime:
    """A clock that moves only when the code under test sleeps; each sleep may change the
    file, as the run writing it would."""

    def __init__(self, on_sleep: list[bytes | None], path: Path) -> None:
        self.now, self.on_sleep, self.path = 0.0, on_sleep, path

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.on_sleep:
            content = self.on_sleep.pop(0)
            if content is not None:
                self.path.write_bytes(content)


def test_a_missing_then_half_written_invitation_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "external.json"
    whole = json.dumps(WHOLE).encode()
    time = FakeTime([None, whole[:20], whole], path)  # nothing, half of it, then all
    said: list[str] = []
    found = wait_for_invitation(
        path, timeout_s=60, poll_s=1, said=said.append, clock=time.clock, sleep=time.sleep
    )
    assert found.url == WHOLE["url"] and found.publish_dir == Path("/run/publish")
    assert len(said) == 1 and "does not exist" in said[0]  # said once, not each poll


def test_no_whole_invitation_in_time_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "external.json"
    path.write_text('{"url": "http://127.0.0.1:9", "tok')  # truncated, and stays so
    time = FakeTime([], path)
    with pytest.raises(NoInvitation) as refused:
        wait_for_invitation(
            path, timeout_s=5, poll_s=1, said=lambda _: None, clock=time.clock, sleep=time.sleep
        )
    message = str(refused.value)
    assert "not a whole invitation" in message and "after 5 s" in message
    assert "\n" not in message
