"""docs/examples run as a user runs them, and the README's worker code is an excerpt of them (issue 29, finding 2).

The prompt and decoder workers are started as scripts (``python prompt_worker.py --listen ...``) through two
real daemons on loopback, and in embedded mode; the decoder must pull every byte right and push a block the
prompt sees arrive.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.harness import ROOT, Daemon, free_port

pytestmark = pytest.mark.integration

EXAMPLES = ROOT / "docs" / "examples"
SCRIPTS = ("prompt_worker.py", "decoder_worker.py")


class Script:
    """One example run as ``python <script> <args>`` in docs/examples; its output lines arrive in a queue."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], command: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen([*command, sys.executable, str(EXAMPLES / name), *args], cwd=EXAMPLES, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """The first output line containing ``text`` (AssertionError with the output after ``timeout``)."""
        try:
            while True:
                line = self.lines.get(timeout=timeout)   # each line within the deadline
                self.seen.append(line)
                if text in line:
                    return line
        except queue.Empty:
            raise AssertionError(f"no {text!r} within {timeout}s; output:\n{''.join(self.seen)}") from None

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        """Wait for the exit; the exit status and all output."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(10)   # the pipe is at its end once the process is gone
        while not self.lines.empty():
            self.seen.append(self.lines.get_nowait())
        return code, "".join(self.seen)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATADIST_", "DATADISTD_"))}
    return {**env, **extra}


def run_pair(prompt_env: dict[str, str], decoder_env: dict[str, str], listen: str, local_ip: str = "127.0.0.1",
             prompt_command: tuple[str, ...] = (), decoder_command: tuple[str, ...] = ()) -> tuple[str, str]:
    """The README's two-worker run: the prompt worker until it serves, then the decoder; both must exit 0."""
    prompt = Script("prompt_worker.py", ["--listen", listen, "--timeout", "60"], prompt_env, prompt_command)
    try:
        prompt.wait_for("serves")
        decoder = Script("decoder_worker.py", ["--prompt", listen, "--local-ip", local_ip], decoder_env,
                         decoder_command)
        try:
            d_code, d_out = decoder.finish()
        finally:
            decoder.kill()
        p_code, p_out = prompt.finish()
    finally:
        prompt.kill()
    assert d_code == 0, d_out
    assert re.search(r"pulled 32 blocks x 8 tensors \(4\.0 MiB\) in [\d.]+ ms; 0 bytes differ", d_out), d_out
    assert p_code == 0 and "arrived intact" in p_out, p_out
    return p_out, d_out


def full_log(daemon: Daemon) -> str:
    return Path(daemon.log_path).read_text(errors="replace")


def warnings_in(log: str) -> list[str]:
    return [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line or "Traceback" in line]


def test_the_examples_through_two_daemons() -> None:
    """A run as the README shows it leaves no warning in either daemon's log (issue 37, item 5: the alert queries
    of docs/operations.md watch them), and the prompt listens only once its cache is registered."""
    daemons = Daemon.start_all([Daemon("example-p"), Daemon("example-d")])
    try:
        run_pair(user_env(DATADIST_DAEMON=daemons[0].target), user_env(DATADIST_DAEMON=daemons[1].target),
                 f"127.0.0.1:{free_port()}")
        for d in daemons:
            assert not warnings_in(full_log(d)), (d.name, warnings_in(full_log(d)))
        prompt_log = full_log(daemons[0]).splitlines()
        registered = next(i for i, line in enumerate(prompt_log) if " registered " in line)
        listening = next(i for i, line in enumerate(prompt_log) if re.search(r"listen=\d", line))
        assert registered < listening, prompt_log
    finally:
        for d in daemons:
            d.discard()


def test_the_examples_started_together_pull_no_missing_cache() -> None:
    """The README starts the prompt in the background and the decoder at once: the decoder links as soon as the
    prompt listens, and finds its cache there (no LLM_KV_CACHE_NOT_EXIST in either daemon's log)."""
    daemons = Daemon.start_all([Daemon("together-p"), Daemon("together-d")])
    listen = f"127.0.0.1:{free_port()}"
    prompt = Script("prompt_worker.py", ["--listen", listen, "--timeout", "60"],
                    user_env(DATADIST_DAEMON=daemons[0].target))
    decoder = Script("decoder_worker.py", ["--prompt", listen], user_env(DATADIST_DAEMON=daemons[1].target))
    try:
        d_code, d_out = decoder.finish()
        p_code, p_out = prompt.finish()
        assert d_code == 0 and "0 bytes differ" in d_out, d_out
        assert p_code == 0 and "arrived intact" in p_out, p_out
        for d in daemons:
            assert "LLM_KV_CACHE_NOT_EXIST" not in full_log(d), full_log(d)[-3000:]
    finally:
        decoder.kill()
        prompt.kill()
        for d in daemons:
            d.discard()


def test_the_examples_embedded() -> None:
    """No DATADIST_DAEMON: each worker starts its own daemon, whose warnings would reach the worker's stderr."""
    for out in run_pair(user_env(), user_env(), f"127.0.0.1:{free_port()}"):
        assert "LLM_KV_CACHE_NOT_EXIST" not in out and "failed" not in out, out


def python_blocks(markdown: str) -> list[list[str]]:
    return [block.splitlines() for block in re.findall(r"```python\n(.*?)```", markdown, re.S)]


def assert_excerpt(page: Path, scripts: list[Path]) -> None:
    """Every code line of ``page``'s python blocks is a line of ``scripts`` (read in turn), in their order; comment
    lines are the page's own -- so the page cannot drift from code that make test runs."""
    blocks = python_blocks(page.read_text())
    assert blocks, f"{page.name} shows no python code"
    source = [line.strip() for script in scripts for line in script.read_text().splitlines()]
    for block in blocks:
        at = 0
        for line in block:
            code = line.strip()
            if not code or code.startswith("#"):
                continue
            try:
                at = source.index(code, at) + 1
            except ValueError:
                raise AssertionError(f"{page.name} line {code!r} is not (or not in this order) in "
                                     f"{', '.join(s.name for s in scripts)}") from None


def test_the_readme_worker_code_is_an_excerpt_of_the_examples() -> None:
    """Every code line of the README's python blocks is a line of the examples, in the examples' order (comment
    lines are the README's own), so the README cannot drift from code that make test runs."""
    assert_excerpt(ROOT / "README.md", [EXAMPLES / name for name in SCRIPTS])
