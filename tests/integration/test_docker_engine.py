"""The private Docker engine (pykcm/testenv/docker.py): its own daemons, stopped by PID and start
time, including the ones a killed run left behind; nothing of it stays mounted."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pykcm.testenv import docker
from pykcm.testenv.processes import ManagedProcess
from tests.support import checkout_env

pytestmark = [pytest.mark.integration, pytest.mark.image]

START_AND_HANG = """
import sys, time
from pathlib import Path
from pykcm.testenv import docker
docker.start(Path(sys.argv[1]), log=print)
print("started", flush=True)
time.sleep(600)
"""


def mounts_below(directory: Path) -> list[str]:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return [m for m in mounts if m.startswith(f"{directory}/")]


def test_engine_left_by_a_killed_run_is_stopped_before_a_new_one(tmp_path):
    missing = docker.missing_prerequisites()
    if missing:
        pytest.skip("; ".join(missing))
    directory = tmp_path / "engine"
    starter = subprocess.Popen([sys.executable, "-c", START_AND_HANG, str(directory)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=checkout_env())
    try:
        assert starter.stdout is not None
        output = [starter.stdout.readline() for _ in range(2)]
        assert output[-1].strip() == "started", output
    finally:
        starter.kill()  # as a crash would: no cleanup, the daemons keep running in their own sessions
        starter.wait()
    state = json.loads((directory / "engine.json").read_text())
    left = [ManagedProcess.from_json(name, data) for name, data in state.items()]
    assert sorted(p.name for p in left) == ["containerd", "dockerd"] and all(p.alive() for p in left)

    messages: list[str] = []
    with docker.running(directory, log=messages.append) as engine:
        assert "left running" in messages[0] and not any(p.alive() for p in left), messages
        assert engine.docker("info", "--format", "{{.DockerRootDir}}").stdout.strip() == str(directory / "data")
        new = list(engine.processes)
    assert not any(p.alive() for p in new)
    assert not (directory / "engine.json").exists()
    assert mounts_below(directory) == []


def test_a_busy_directory_is_waited_for_then_refused_in_one_line(tmp_path):
    missing = docker.missing_prerequisites()
    if missing:
        pytest.skip("; ".join(missing))
    directory = tmp_path / "engine"
    directory.mkdir()
    messages: list[str] = []
    with open(directory / "engine.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as another run's engine holds it
        started = time.monotonic()
        with pytest.raises(docker.DockerError) as refused:
            docker.start(directory, log=messages.append, wait=1.5)
    assert time.monotonic() - started >= 1.5
    assert len(messages) == 1 and "waiting up to 1.5s" in messages[0], messages
    assert str(refused.value).startswith(f"another private Docker engine is running in {directory}")
    assert "\n" not in str(refused.value)
