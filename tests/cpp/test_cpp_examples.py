"""The project's own C++ examples (docs/examples/cpp: a prompt and a decoder that pull and push caches and blocks,
then switch roles), built with CMake's find_package(llm_datadist) against the installed library (default libstdc++
ABI), run as two processes through two daemons."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from pathlib import Path

import pytest

from tests.cpp import ROOT, cmake_project
from tests.harness import free_port

pytestmark = pytest.mark.integration


class Program:
    """A running example: its stdout read line by line, each wait with a deadline."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env})
        self.lines: list[str] = []
        self._buf = b""

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """The first line (from the start) containing ``text``; AssertionError with the output after ``timeout``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                left = deadline - time.monotonic()
                assert left > 0, f"no {text!r} within {timeout}s:\n" + "\n".join(self.lines)
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 65536)
                    assert chunk, f"exited before {text!r}:\n" + "\n".join(self.lines)
                    self._buf += chunk
                    *done, self._buf = self._buf.split(b"\n")
                    self.lines += [d.decode(errors="replace") for d in done]
        finally:
            sel.close()

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def examples(cpp_install: Path, tmp_path_factory) -> Path:
    return cmake_project(ROOT / "docs" / "examples" / "cpp", tmp_path_factory.mktemp("cpp-examples"))


def test_prompt_and_decoder_pull_push_and_switch_roles(examples, daemon_factory) -> None:
    dp, dd = daemon_factory.many("p", "d")
    prompt_port, decoder_port = free_port(), free_port()
    prompt = Program([str(examples / "prompt"), f"127.0.0.1:{prompt_port}"], {"DATADIST_DAEMON": dp.target})
    decoder = None
    try:
        cache_id = prompt.wait_for("cache_id = ").split("= ")[1]
        prompt.wait_for("waiting: the decoder pulled and pushed")
        decoder = Program([str(examples / "decoder"), f"127.0.0.1:{prompt_port}", cache_id,
                           f"127.0.0.1:{decoder_port}"],   # a plain socket path, as a Python worker takes it
                          {"DATADIST_DAEMON": dd.target.removeprefix("unix://")})
        for step in ("PullKvCache success", "batch 0 holds the prompt's batch 1", "blocks 1, 2 hold the prompt's 2, 3",
                     "layer 1 of block 7 pulled, layer 0 untouched", "PushKvBlocks success", "PushKvCache success",
                     "UnlinkLlmClusters success", "SetRole(kPrompt) success"):
            decoder.wait_for(step)
        decoder_cache = decoder.wait_for("cache_id = ").split("= ")[1]
        prompt.say("pushed")
        prompt.wait_for("PushKvBlocks arrived")
        prompt.wait_for("PushKvCache arrived")
        prompt.say(f"switch 127.0.0.1:{decoder_port} {decoder_cache}")
        prompt.wait_for("block 0 holds the decoder's block 7")
        prompt.wait_for("Prompt end")
        decoder.say("done")
        decoder.wait_for("Decoder end")
        assert prompt.finish() == 0 and decoder.finish() == 0
        assert not [line for line in prompt.lines + decoder.lines if "[ERROR]" in line]
    finally:
        for p in (prompt, decoder):
            if p is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
